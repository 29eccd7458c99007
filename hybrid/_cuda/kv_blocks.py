"""KV blocks in GPU memory: the pool storage of a ``cuda:N`` layer and a sequence's device tables.

``DeviceLayerStorage`` implements the storage interface documented on
hybrid.kvpool.HostLayerStorage over chunks of GPU memory that never move: blocks of
[num_kv_heads, 2, block_size, head_dim] float32 or float16.  ``DeviceLayerTable`` is one
sequence's view of one layer: besides the host address tables it keeps persistent device copies
of its K and V block-address tables; attention and the append kernel read them in place, and they
are uploaded again only for entries that changed since the last upload, reallocated only when
their capacity is outgrown.
"""

from __future__ import annotations

import numpy as np

from ..kvpool import LayerTable
from .arena import arena
from .arrays import DeviceArray, empty
from .device import device
from .launch import kv_append

_NAN_BITS = {4: 0x7FC00000, 2: 0x7E00}  # quiet NaN of float32 / float16


class DeviceLayerStorage:
    """The blocks of one layer in the memory of GPU ``placement.index``."""

    def __init__(self, placement, num_kv_heads: int, head_dim: int, block_size: int, dtype):
        self.placement = placement
        self.shape = (num_kv_heads, block_size, head_dim)
        self.block_size = block_size
        self.dtype = np.dtype(dtype)
        self.dev = device(placement.index)
        self.block_bytes = num_kv_heads * 2 * block_size * head_dim * self.dtype.itemsize
        self.chunks: list = []
        self.k_addr = np.zeros(0, dtype=np.int64)

    def grow(self, n: int):
        chunk = self.dev.alloc(n * self.block_bytes)
        self.chunks.append(chunk)
        base = chunk.ptr + self.block_bytes * np.arange(n, dtype=np.int64)
        self.k_addr = np.concatenate([self.k_addr, base])
        return base, base + self.block_size * self.shape[2] * self.dtype.itemsize

    def new_table(self) -> "DeviceLayerTable":
        return DeviceLayerTable(self)

    def poison(self, block_ids) -> None:
        isz = self.dtype.itemsize
        fill = self.dev.fill32 if isz == 4 else self.dev.fill16
        for b in block_ids:
            fill(int(self.k_addr[b]), _NAN_BITS[isz], self.block_bytes // isz)

    def copy_block(self, src: int, dst: int) -> None:
        self.dev.copy_d2d(int(self.k_addr[dst]), int(self.k_addr[src]), self.block_bytes)

    def write(self, table: "DeviceLayerTable", start: int, k, v) -> None:
        """Store rows k, v [n, KVH*D] (device arrays on this GPU, or host arrays) at positions
        start.. of the table's blocks; converted to the cache dtype by the append kernel."""
        kvh, bs, d = self.shape
        if not isinstance(k, DeviceArray) or k.device is not self.dev:
            k = arena(self.dev.index).upload("kv_append_k", _host(k), np.float32)
        if not isinstance(v, DeviceArray) or v.device is not self.dev:
            v = arena(self.dev.index).upload("kv_append_v", _host(v), np.float32)
        table.sync()
        kv_append(k, v, table.k_table, table.v_table, start, kvh, d, bs, 2 * bs * d,
                  self.dtype == np.float16)

    def block_arrays(self, block_id: int):
        """(K, V) host copies [num_kv_heads, block_size, head_dim] of one block."""
        kvh, bs, d = self.shape
        host = np.empty((kvh, 2, bs, d), dtype=self.dtype)
        self.dev.copy_d2h(host, int(self.k_addr[block_id]))
        return host[:, 0], host[:, 1]

    def nbytes(self) -> int:
        return len(self.k_addr) * self.block_bytes


class DeviceLayerTable(LayerTable):
    """A sequence's tables for one GPU layer: host tables plus persistent device copies."""

    def __init__(self, storage: DeviceLayerStorage):
        super().__init__(storage)
        self.k_table: "DeviceArray | None" = None  # device tables [capacity] uint64
        self.v_table: "DeviceArray | None" = None
        self.synced = 0  # leading entries whose device copy is current

    def changed(self, first: int) -> None:
        self.synced = min(self.synced, first)

    def sync(self) -> None:
        """Bring the device address tables up to date with the host tables."""
        nb, where = self.n, self.storage.placement
        if self.k_table is None or self.k_table.shape[0] < nb:
            cap = max(64, nb, 0 if self.k_table is None else 2 * self.k_table.shape[0])
            self.k_table = empty(where.index, cap, np.uint64)
            self.v_table = empty(where.index, cap, np.uint64)
            self.synced = 0
        if self.synced < nb:
            s = self.synced
            self.k_table[s:nb].copy_from_host(self.k_ptrs[s:nb].view(np.uint64))
            self.v_table[s:nb].copy_from_host(self.v_ptrs[s:nb].view(np.uint64))
            self.synced = nb

    def device_tables(self):
        """(k_table, v_table): the persistent device tables [n_blocks] uint64."""
        self.sync()
        return self.k_table[:self.n], self.v_table[:self.n]

    def table_addresses(self) -> tuple:
        """Device addresses of the K and V tables (for batched attention)."""
        self.sync()
        return self.k_table.ptr, self.v_table.ptr


def _host(a) -> np.ndarray:
    return a.to_host() if isinstance(a, DeviceArray) else np.asarray(a)
