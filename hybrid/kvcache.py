"""PagedKVCache: the keys and values of one sequence, per layer, in fixed-size blocks.

Layout (the contract with the attention kernels)
------------------------------------------------
Each layer owns a pool of blocks.  One block holds ``block_size`` consecutive token positions of
both K and V, interleaved per KV head::

    block: [num_kv_heads, 2, block_size, head_dim]   float32 or float16, C order
           [h, 0] = K rows of head h, [h, 1] = V rows of head h

so the rows of one KV head are contiguous, and a kernel that reads K then V of head 0, then of
head 1, ... walks the block as one forward stream (measured: two separate K and V pools, read
head by head, stream at less than half the rate).  The kernels see this through block base
addresses and ``head_stride`` = 2*block_size*head_dim elements between heads: the K address of a
block is its base, the V address is base + block_size*head_dim elements.  Token position ``p``
of a layer lives in block ``table[p // block_size]`` at slot ``p % block_size``.  Blocks come
from chunks that are never moved or resized, so a block's address is stable while the block is
in use.  Each layer keeps persistent tables of its blocks' K and V addresses (int64), grown only
when the number of blocks grows; the kernels walk them directly and never see a gathered copy.

Lengths
-------
``seq_len`` counts committed tokens and advances only on ``commit(n)``, so every layer of one step
appends at, and attends from, the same start position.  A layer's ``layer_len`` counts what was
appended to it (committed plus not yet committed); appended tokens are visible to attention at
once.  ``truncate(n)`` and ``reset()`` roll back and return blocks to the pool for reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .placement import Placement, is_device_array

KV_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16)}


class CacheCapacityError(ValueError):
    """Appending would exceed the cache's ``max_tokens``; nothing was written."""


@dataclass(frozen=True)
class AppendResult:
    """What the attention kernels need after an append to one layer."""

    start: int  # position of the first appended token
    length: int  # tokens appended
    kv_len: int  # tokens now held by the layer
    k_ptrs: np.ndarray  # [n_blocks] int64 K block addresses (valid until the next append)
    v_ptrs: np.ndarray  # [n_blocks] int64 V block addresses
    block_table: np.ndarray  # [n_blocks] int32 block ids in the layer's pool


class _LayerBlocks:
    """The block pool, block table and address tables of one layer."""

    def __init__(self, num_kv_heads, head_dim, block_size, dtype, poison):
        self.shape = (num_kv_heads, block_size, head_dim)
        self.block_size = block_size
        self.dtype = dtype
        self.poison = poison
        self.chunks: list = []  # each [n, KVH, 2, bs, D]
        self.where: list = []  # block id -> (chunk index, index in chunk)
        self.k_addr = np.zeros(0, dtype=np.int64)  # block id -> K address
        self.v_addr = np.zeros(0, dtype=np.int64)
        self.free: list = []  # block ids ready for reuse
        self.table: list = []  # this sequence's block ids, in position order
        self.k_ptrs = np.zeros(8, dtype=np.int64)  # persistent address tables, capacity-doubled
        self.v_ptrs = np.zeros(8, dtype=np.int64)
        self.ids = np.zeros(8, dtype=np.int32)
        self.length = 0

    # -- pool -------------------------------------------------------------------------------
    def _grow_pool(self, at_least: int, max_blocks: "int | None") -> None:
        n = max(at_least, 4, len(self.where))  # chunks double the pool, at least 4 blocks
        n = min(n, 4096)
        if max_blocks is not None:
            n = max(at_least, min(n, max_blocks - len(self.where)))
        kvh, bs, d = self.shape
        chunk = np.empty((n, kvh, 2, bs, d), dtype=self.dtype)
        c = len(self.chunks)
        self.chunks.append(chunk)
        first = len(self.where)
        self.where.extend((c, i) for i in range(n))
        base = chunk.__array_interface__["data"][0] + chunk[0].nbytes * np.arange(n, dtype=np.int64)
        v_offset = bs * d * self.dtype.itemsize  # V rows of head 0 follow its K rows
        self.k_addr = np.concatenate([self.k_addr, base])
        self.v_addr = np.concatenate([self.v_addr, base + v_offset])
        self.free.extend(range(first + n - 1, first - 1, -1))

    def block_arrays(self, block_id: int):
        """(K, V) views [num_kv_heads, block_size, head_dim] of one block."""
        c, i = self.where[block_id]
        block = self.chunks[c][i]
        return block[:, 0], block[:, 1]

    def ensure_blocks(self, n_blocks: int, max_blocks: "int | None") -> None:
        """Grow the table to ``n_blocks`` blocks (taking from the pool)."""
        need = n_blocks - len(self.table)
        if need <= 0:
            return
        if len(self.free) < need:
            self._grow_pool(need - len(self.free), max_blocks)
        new = [self.free.pop() for _ in range(need)]
        if self.poison:
            self._poison(new)
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

    def _poison(self, block_ids) -> None:
        for b in block_ids:
            c, i = self.where[b]
            self.chunks[c][i].fill(np.nan)

    def release_after(self, n_tokens: int) -> None:
        """Keep the blocks holding the first ``n_tokens`` tokens; return the rest to the pool."""
        keep = -(-n_tokens // self.block_size)
        while len(self.table) > keep:
            self.free.append(self.table.pop())
        self.length = min(self.length, n_tokens)

    # -- data -------------------------------------------------------------------------------
    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store rows k, v [n, KVH*D] at positions start..start+n-1 (blocks must exist)."""
        kvh, bs, d = self.shape
        n = k.shape[0]
        k3 = k.reshape(n, kvh, d)
        v3 = v.reshape(n, kvh, d)
        p = start
        while p < start + n:
            b, slot = divmod(p, bs)
            take = min(bs - slot, start + n - p)
            kb, vb = self.block_arrays(self.table[b])
            rows = slice(p - start, p - start + take)
            kb[:, slot:slot + take, :] = k3[rows].transpose(1, 0, 2)
            vb[:, slot:slot + take, :] = v3[rows].transpose(1, 0, 2)
            p += take

    def dense(self, n_tokens: int):
        """K, V of the first n_tokens as [n_tokens, KVH*D] copies in the cache's dtype."""
        kvh, bs, d = self.shape
        nb = -(-n_tokens // bs)
        ks = [self.block_arrays(b)[0] for b in self.table[:nb]]
        vs = [self.block_arrays(b)[1] for b in self.table[:nb]]
        if not ks:
            empty = np.zeros((0, kvh * d), dtype=self.dtype)
            return empty, empty.copy()
        k = np.concatenate([x.transpose(1, 0, 2) for x in ks])[:n_tokens].reshape(n_tokens, kvh * d)
        v = np.concatenate([x.transpose(1, 0, 2) for x in vs])[:n_tokens].reshape(n_tokens, kvh * d)
        return k, v

    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)


class PagedKVCache:
    """Paged KV cache of one sequence across ``num_layers`` layers.

    Parameters
    ----------
    num_layers, num_kv_heads, head_dim : int
    block_size : int, tokens per block (default 16)
    dtype : "float16" (default) or "float32", how K and V are stored
    placement : "cpu", "cuda:N", or a list with one placement per layer.  Blocks of a ``cuda:N``
        layer live in that GPU's memory, with persistent device copies of the layer's block
        address tables (hybrid/_cuda/kv_blocks.py); everything else here is the same.
    max_tokens : optional capacity; an append past it raises CacheCapacityError, writing nothing
    poison_unused : fill every newly handed-out block with NaN (debugging and tests: a kernel that
        reads a slot it should not turns the result into NaN)

    Example
    -------
    >>> cache = PagedKVCache(num_layers=1, num_kv_heads=2, head_dim=64, dtype="float32")
    >>> k = np.ones((3, 128), np.float32)
    >>> cache.append(0, k, k).kv_len
    3
    >>> cache.commit(3); cache.seq_len
    3
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int = 16,
                 dtype="float16", placement="cpu", max_tokens: "int | None" = None,
                 poison_unused: bool = False):
        for name, val in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                          ("head_dim", head_dim), ("block_size", block_size)):
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val <= 0:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        key = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
        if key not in KV_DTYPES:
            raise ValueError(f"KV dtype must be one of {sorted(KV_DTYPES)}, got {dtype!r}")
        if max_tokens is not None and (not isinstance(max_tokens, (int, np.integer))
                                       or max_tokens <= 0):
            raise ValueError(f"max_tokens must be a positive integer or None, got {max_tokens!r}")
        self.num_layers = int(num_layers)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        self.block_size = int(block_size)
        self.dtype = KV_DTYPES[key]
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        self._placements = self._parse_placements(placement)
        self._layers = [self._new_layer(p, poison_unused) for p in self._placements]
        self._seq_len = 0

    def _parse_placements(self, placement) -> list:
        if isinstance(placement, (list, tuple)):
            if len(placement) != self.num_layers:
                raise ValueError(f"placement list has {len(placement)} entries for "
                                 f"{self.num_layers} layers")
            places = [Placement.parse(p) for p in placement]
        else:
            places = [Placement.parse(placement)] * self.num_layers
        for p in places:
            if not p.is_cpu:
                from . import registry

                registry.require(p)  # raises with the backend's reason
        return places

    def _new_layer(self, placement: Placement, poison: bool):
        if placement.is_cpu:
            return _LayerBlocks(self.num_kv_heads, self.head_dim, self.block_size, self.dtype,
                                poison)
        from . import registry

        return registry.lookup("kv_layer_blocks", placement)(
            placement, self.num_kv_heads, self.head_dim, self.block_size, self.dtype, poison)

    # -- shape and state --------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        """Committed tokens (advances only on commit)."""
        return self._seq_len

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def head_stride(self) -> int:
        """Elements from one KV head's rows to the next head's inside a K (or V) block."""
        return 2 * self.block_size * self.head_dim

    def placement(self, layer: int) -> Placement:
        return self._placements[self._check_layer(layer)]

    def layer_len(self, layer: int) -> int:
        """Tokens stored in ``layer``: committed plus appended but not yet committed."""
        return self._layers[self._check_layer(layer)].length

    def num_blocks(self, layer: int) -> int:
        return len(self._layers[self._check_layer(layer)].table)

    def _check_layer(self, layer) -> int:
        if type(layer) is int and 0 <= layer < self.num_layers:
            return layer  # the common case, checked cheaply
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) \
                or not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer!r} out of range for a cache of {self.num_layers} layers")
        return int(layer)

    def _as_rows(self, name: str, a, layer: int):
        if (type(a) is np.ndarray and a.dtype == np.float32 and a.ndim == 2
                and a.shape[1] == self.kv_dim):
            return a  # the common case, checked cheaply
        if is_device_array(a):
            if a.dtype != np.float32 or a.ndim != 2 or a.shape[1] != self.kv_dim:
                raise ValueError(f"{name} must be float32 [n_tokens, num_kv_heads*head_dim="
                                 f"{self.kv_dim}], got {a.dtype} {a.shape} on {a.placement}")
            return a if not self._placements[layer].is_cpu else a.to_host()
        arr = np.asarray(a)
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(f"{name} must be a floating-point array, got dtype {arr.dtype}")
        if arr.ndim != 2 or arr.shape[1] != self.kv_dim:
            raise ValueError(f"{name} must have shape [n_tokens, num_kv_heads*head_dim="
                             f"{self.kv_dim}], got {arr.shape}")
        return arr

    # -- writing ----------------------------------------------------------------------------
    def append(self, layer: int, k, v) -> AppendResult:
        """Store k, v [n_tokens, num_kv_heads*head_dim] after the tokens ``layer`` already holds.

        Visible to attention at once; ``seq_len`` is unchanged until ``commit``.  On any error
        nothing is written and no block is taken.
        """
        layer = self._check_layer(layer)
        k = self._as_rows("k", k, layer)
        v = self._as_rows("v", v, layer)
        if k.shape[0] != v.shape[0]:
            raise ValueError(f"k has {k.shape[0]} rows but v has {v.shape[0]}")
        lb = self._layers[layer]
        n = k.shape[0]
        start = self._reserve(layer, n)
        if n:
            try:
                lb.write(start, k, v)
            except BaseException:
                lb.release_after(start)  # give back the blocks this append took
                raise
            lb.length = start + n
        nb = len(lb.table)
        return AppendResult(start, n, lb.length, lb.k_ptrs[:nb], lb.v_ptrs[:nb], lb.ids[:nb])

    def _reserve(self, layer: int, n: int) -> int:
        """Check capacity and take the blocks for n more tokens of ``layer``; returns where they
        start.  Raises with nothing taken."""
        lb = self._layers[layer]
        start = lb.length
        if self.max_tokens is not None and start + n > self.max_tokens:
            raise CacheCapacityError(
                f"KV cache capacity exceeded on layer {layer}: it holds {start} tokens, appending "
                f"{n} would make {start + n} > max_tokens={self.max_tokens}")
        if n:
            max_blocks = None if self.max_tokens is None else -(-self.max_tokens // self.block_size)
            try:
                lb.ensure_blocks(-(-(start + n) // self.block_size), max_blocks)
            except BaseException:
                lb.release_after(start)
                raise
        return start

    def commit(self, n: int) -> None:
        """Advance ``seq_len`` by ``n`` tokens, which every layer must already hold."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"commit(n) needs an integer n >= 0, got {n!r}")
        target = self._seq_len + int(n)
        for i, lb in enumerate(self._layers):
            if lb.length < target:
                raise ValueError(f"commit({n}): layer {i} holds {lb.length} tokens, fewer than "
                                 f"seq_len {self._seq_len} + {n}; append to every layer first")
        self._seq_len = target

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` committed tokens (0 <= n <= seq_len); drop the rest everywhere."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self._seq_len:
            raise ValueError(f"truncate(n) needs 0 <= n <= seq_len={self._seq_len}, got {n!r}")
        for lb in self._layers:
            lb.release_after(int(n))
        self._seq_len = int(n)

    def discard_uncommitted(self) -> None:
        """Drop every appended but uncommitted token of every layer."""
        self.truncate(self._seq_len)

    def reset(self) -> None:
        """Empty the cache; every block returns to its layer's pool."""
        for lb in self._layers:
            lb.release_after(0)
        self._seq_len = 0

    def _rollback_layer(self, layer: int, length: int) -> None:
        """Undo appends to one layer back to ``length`` tokens (used when a step fails)."""
        lb = self._layers[layer]
        if length < lb.length:
            lb.release_after(length)

    # -- reading (kernels, tests) -----------------------------------------------------------
    def block_table(self, layer: int) -> np.ndarray:
        """[n_blocks] int32 ids of the layer's blocks in position order."""
        lb = self._layers[self._check_layer(layer)]
        return lb.ids[:len(lb.table)].copy()

    def block_pointers(self, layer: int):
        """(k_ptrs, v_ptrs): [n_blocks] base addresses of the layer's K and V blocks, int64 host
        arrays for a CPU layer, the persistent uint64 device tables for a ``cuda:N`` layer.

        Views of persistent tables: valid until the layer's next append, truncate or reset.
        """
        lb = self._layers[self._check_layer(layer)]
        nb = len(lb.table)
        if not self._placements[layer].is_cpu:
            return lb.device_tables()
        return lb.k_ptrs[:nb], lb.v_ptrs[:nb]

    def table_addresses(self, layer: int) -> tuple:
        """Device addresses of a ``cuda:N`` layer's K and V block tables (batched attention)."""
        layer = self._check_layer(layer)
        if self._placements[layer].is_cpu:
            raise ValueError(f"cache layer {layer} is on the cpu; its block tables are "
                             f"block_pointers({layer})")
        return self._layers[layer].table_addresses()

    def blocks(self, layer: int):
        """(k_blocks, v_blocks): lists of the layer's K and V views [num_kv_heads, block_size,
        head_dim], in position order (views into the pool, for reference checks and debugging)."""
        lb = self._layers[self._check_layer(layer)]
        pairs = [lb.block_arrays(b) for b in lb.table]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def dense(self, layer: int, n_tokens: "int | None" = None):
        """Copies of K and V [n_tokens, kv_dim] (default: all the layer holds).  Debug only."""
        lb = self._layers[self._check_layer(layer)]
        return lb.dense(lb.length if n_tokens is None else n_tokens)

    def nbytes(self) -> int:
        """Bytes of block memory allocated by the pools (in use or free)."""
        return sum(lb.nbytes() for lb in self._layers)

    def __repr__(self) -> str:
        return (f"PagedKVCache(layers={self.num_layers}, kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, block_size={self.block_size}, dtype={self.dtype.name}, "
                f"seq_len={self._seq_len})")


def append_batch(caches, layer: int, k, v) -> None:
    """Append row b of k, v [B, kv_dim] to ``caches[b]`` (one decode token per sequence).

    The caches' layer must share one placement, as a batch does.  Rows already on that GPU are
    written by one kernel launch; otherwise each cache appends its row.  On any error nothing is
    written to any cache.
    """
    if not caches:
        return
    c0 = caches[0]
    where = c0.placement(layer)
    batched = None
    if not where.is_cpu and is_device_array(k) and k.placement == where:
        from . import registry

        try:
            batched = registry.lookup("kv_append_batch", where)
        except registry.NoBackendError:
            pass
    starts = [c.layer_len(layer) for c in caches]
    try:
        if batched is None:
            for b, c in enumerate(caches):
                c.append(layer, k[b:b + 1], v[b:b + 1])
        else:
            k, v = c0._as_rows("k", k, layer), c0._as_rows("v", v, layer)
            for c in caches:
                c._reserve(layer, 1)
            batched(k, v, [c._layers[layer] for c in caches], np.asarray(starts, dtype=np.int64),
                    c0.num_kv_heads, c0.head_dim, c0.block_size, c0.head_stride,
                    c0.dtype == np.float16)
            for c, start in zip(caches, starts):
                c._layers[layer].length = start + 1
    except BaseException:
        for c, start in zip(caches, starts):
            c._layers[layer].release_after(start)  # blocks taken and rows appended go back
        raise
