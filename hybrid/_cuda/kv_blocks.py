"""The blocks of one PagedKVCache layer in GPU memory (the cache's ``cuda:N`` layers).

Same layout and bookkeeping as the CPU pool in hybrid/kvcache.py: blocks of
[num_kv_heads, 2, block_size, head_dim] float32 or float16 carved from chunks that never move,
a block table in position order, blocks returned to a free list on truncate.  In addition the
layer keeps persistent device copies of its K and V block-address tables: attention and the
append kernel read them in place, and they are uploaded again only for entries that changed
since the last upload (new blocks), reallocated only when their capacity is outgrown.
"""

from __future__ import annotations

import numpy as np

from .arena import arena
from .arrays import DeviceArray, empty
from .device import device
from .launch import kv_append

_NAN_BITS = {4: 0x7FC00000, 2: 0x7E00}  # quiet NaN of float32 / float16


class DeviceLayerBlocks:
    def __init__(self, placement, num_kv_heads: int, head_dim: int, block_size: int, dtype,
                 poison: bool):
        self.placement = placement
        self.dev = device(placement.index)
        self.shape = (num_kv_heads, block_size, head_dim)
        self.block_size = block_size
        self.dtype = np.dtype(dtype)
        self.poison = poison
        self.block_bytes = num_kv_heads * 2 * block_size * head_dim * self.dtype.itemsize
        self.chunks: list = []  # DeviceBuffers
        self.k_addr = np.zeros(0, dtype=np.int64)  # block id -> K address of head 0
        self.v_addr = np.zeros(0, dtype=np.int64)
        self.free: list = []
        self.table: list = []
        self.k_ptrs = np.zeros(8, dtype=np.int64)  # host copies of the address tables
        self.v_ptrs = np.zeros(8, dtype=np.int64)
        self.ids = np.zeros(8, dtype=np.int32)
        self.length = 0
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

    def ensure_blocks(self, n_blocks: int, max_blocks: "int | None") -> None:
        need = n_blocks - len(self.table)
        if need <= 0:
            return
        if len(self.free) < need:
            self._grow_pool(need - len(self.free), max_blocks)
        new = [self.free.pop() for _ in range(need)]
        if self.poison:
            isz = self.dtype.itemsize
            for b in new:
                fill = self.dev.fill32 if isz == 4 else self.dev.fill16
                fill(int(self.k_addr[b]), _NAN_BITS[isz], self.block_bytes // isz)
        start = len(self.table)
        self.table.extend(new)
        if len(self.table) > self.k_ptrs.shape[0]:
            cap = max(2 * self.k_ptrs.shape[0], len(self.table))
            for name in ("k_ptrs", "v_ptrs", "ids"):
                old = getattr(self, name)
                grown = np.zeros(cap, dtype=old.dtype)
                grown[:start] = old[:start]
                setattr(self, name, grown)
        ids = np.asarray(new, dtype=np.int64)
        self.ids[start:len(self.table)] = ids
        self.k_ptrs[start:len(self.table)] = self.k_addr[ids]
        self.v_ptrs[start:len(self.table)] = self.v_addr[ids]
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
        keep = -(-n_tokens // self.block_size)
        while len(self.table) > keep:
            self.free.append(self.table.pop())
        self.synced = min(self.synced, len(self.table))
        self.length = min(self.length, n_tokens)

    def device_tables(self):
        """(k_table, v_table): the persistent device tables [n_blocks] uint64."""
        nb = len(self.table)
        return self.k_table[:nb], self.v_table[:nb]

    def table_addresses(self) -> tuple:
        """Device addresses of the K and V tables (for batched attention)."""
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

    def dense(self, n_tokens: int):
        kvh, bs, d = self.shape
        nb = -(-n_tokens // bs)
        pairs = [self.block_arrays(b) for b in self.table[:nb]]
        if not pairs:
            empty_rows = np.zeros((0, kvh * d), dtype=self.dtype)
            return empty_rows, empty_rows.copy()
        k = np.concatenate([p[0].transpose(1, 0, 2) for p in pairs])[:n_tokens]
        v = np.concatenate([p[1].transpose(1, 0, 2) for p in pairs])[:n_tokens]
        return k.reshape(n_tokens, kvh * d), v.reshape(n_tokens, kvh * d)

    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)


def _host(a) -> np.ndarray:
    return a.to_host() if isinstance(a, DeviceArray) else np.asarray(a)
