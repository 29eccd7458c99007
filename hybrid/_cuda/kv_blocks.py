"""The blocks of one PagedKVCache layer in GPU memory (the cache's ``cuda:N`` layers).

The same layout and bookkeeping as the CPU pool in hybrid/kvcache.py (a subclass of it): blocks of
[num_kv_heads, 2, block_size, head_dim] float32 or float16 carved from chunks that never move,
a block table in position order, blocks returned to a free list on truncate.  In addition the
layer keeps persistent device copies of its K and V block-address tables: attention and the
append kernel read them in place, and they are uploaded again only for entries that changed
since the last upload (new blocks), reallocated only when their capacity is outgrown.
"""

from __future__ import annotations

import numpy as np

from ..kvcache import _LayerBlocks
from .arena import arena
from .arrays import DeviceArray, empty
from .device import device
from .launch import kv_append

_NAN_BITS = {4: 0x7FC00000, 2: 0x7E00}  # quiet NaN of float32 / float16


class DeviceLayerBlocks(_LayerBlocks):
    """The CPU pool's bookkeeping (free list, block table, host address tables) over chunks of
    GPU memory, plus the persistent device copies of the address tables."""

    def __init__(self, placement, num_kv_heads: int, head_dim: int, block_size: int, dtype,
                 poison: bool):
        super().__init__(num_kv_heads, head_dim, block_size, np.dtype(dtype), poison)
        self.placement = placement
        self.dev = device(placement.index)
        self.block_bytes = num_kv_heads * 2 * block_size * head_dim * self.dtype.itemsize
        self.k_table: "DeviceArray | None" = None  # device tables [capacity] uint64
        self.v_table: "DeviceArray | None" = None
        self.synced = 0  # leading table entries whose device copy is current

    # -- pool -------------------------------------------------------------------------------
    def _grow_pool(self, at_least: int, max_blocks: "int | None") -> None:
        n = min(max(at_least, 4, len(self.k_addr)), 4096)
        if max_blocks is not None:
            n = max(at_least, min(n, max_blocks - len(self.k_addr)))
        chunk = self.dev.alloc(n * self.block_bytes)
        self.chunks.append(chunk)
        first = len(self.k_addr)
        base = chunk.ptr + self.block_bytes * np.arange(n, dtype=np.int64)
        v_offset = self.block_size * self.shape[2] * self.dtype.itemsize
        self.k_addr = np.concatenate([self.k_addr, base])
        self.v_addr = np.concatenate([self.v_addr, base + v_offset])
        self.free.extend(range(first + n - 1, first - 1, -1))

    def _poison(self, block_ids) -> None:
        isz = self.dtype.itemsize
        fill = self.dev.fill32 if isz == 4 else self.dev.fill16
        for b in block_ids:
            fill(int(self.k_addr[b]), _NAN_BITS[isz], self.block_bytes // isz)

    def ensure_blocks(self, n_blocks: int, max_blocks: "int | None") -> None:
        super().ensure_blocks(n_blocks, max_blocks)
        self._sync_tables()

    def _sync_tables(self) -> None:
        """Bring the device address tables up to date with the host tables."""
        nb = len(self.table)
        if self.k_table is None or self.k_table.shape[0] < nb:
            cap = max(64, nb, 0 if self.k_table is None else 2 * self.k_table.shape[0])
            self.k_table = empty(self.placement.index, cap, np.uint64)
            self.v_table = empty(self.placement.index, cap, np.uint64)
            self.synced = 0
        if self.synced < nb:
            s = self.synced
            self.k_table[s:nb].copy_from_host(self.k_ptrs[s:nb].view(np.uint64))
            self.v_table[s:nb].copy_from_host(self.v_ptrs[s:nb].view(np.uint64))
            self.synced = nb

    def release_after(self, n_tokens: int) -> None:
        super().release_after(n_tokens)
        self.synced = min(self.synced, len(self.table))

    def device_tables(self):
        """(k_table, v_table): the persistent device tables [n_blocks] uint64."""
        if self.k_table is None:
            self._sync_tables()
        nb = len(self.table)
        return self.k_table[:nb], self.v_table[:nb]

    def table_addresses(self) -> tuple:
        """Device addresses of the K and V tables (for batched attention)."""
        if self.k_table is None:
            self._sync_tables()
        return self.k_table.ptr, self.v_table.ptr

    # -- data -------------------------------------------------------------------------------
    def write(self, start: int, k, v) -> None:
        """Store rows k, v [n, KVH*D] (device arrays on this GPU, or host arrays) at positions
        start.. (the blocks exist); converted to the cache dtype by the append kernel."""
        kvh, bs, d = self.shape
        if not isinstance(k, DeviceArray) or k.device is not self.dev:
            k = arena(self.dev.index).upload("kv_append_k", _host(k), np.float32)
        if not isinstance(v, DeviceArray) or v.device is not self.dev:
            v = arena(self.dev.index).upload("kv_append_v", _host(v), np.float32)
        kv_append(k, v, self.k_table, self.v_table, start, kvh, d, bs, 2 * bs * d,
                  self.dtype == np.float16)

    def block_arrays(self, block_id: int):
        """(K, V) host copies [num_kv_heads, block_size, head_dim] of one block."""
        kvh, bs, d = self.shape
        host = np.empty((kvh, 2, bs, d), dtype=self.dtype)
        self.dev.copy_d2h(host, int(self.k_addr[block_id]))
        return host[:, 0], host[:, 1]


def _host(a) -> np.ndarray:
    return a.to_host() if isinstance(a, DeviceArray) else np.asarray(a)
