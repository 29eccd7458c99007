"""PagedKVCache: the keys and values of one sequence, per layer, in fixed-size blocks.

Layout (the contract with the attention kernels)
------------------------------------------------
Blocks come from a ``KVBlockPool`` (hybrid/kvpool.py): a private one per cache by default, or one
pool shared by many sequences (``pool=``, the serving engine's case).  A block id names the same
slot in every layer, and a sequence holds one list of block ids for all its layers.  One block
holds ``block_size`` consecutive token positions of
both K and V, interleaved per KV head::

    block: [num_kv_heads, 2, block_size, head_dim]   float32 or float16, C order
           [h, 0] = K rows of head h, [h, 1] = V rows of head h

(q8_0: bytes, head_dim/32*34 per row, each head's K and V rows stored by plane as
hybrid/_cpu/kv_q8.h describes)

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

Sharing
-------
Blocks taken from the pool's prefix cache (``adopt_prefix``) are shared read-only.  A write into
a block that is shared or registered in the prefix cache copies it first (copy-on-write), so a
sequence never changes what another one reads.  ``close()`` returns every block to the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kvpool import KV_DTYPES, KVBlockPool, PoolExhaustedError, widen_q8_rows, kv_row_bytes
from .placement import Placement, is_device_array


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
    block_table: np.ndarray  # [n_blocks] int32 block ids in the pool


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
    pool : a shared KVBlockPool to take blocks from (its geometry must match; ``PagedKVCache.on
        (pool)`` takes it from the pool).  Default: a private pool.  When a shared pool runs dry an
        append raises PoolExhaustedError (a MemoryError), writing nothing.

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
                 poison_unused: bool = False, pool: "KVBlockPool | None" = None):
        if max_tokens is not None and (isinstance(max_tokens, bool)
                                       or not isinstance(max_tokens, (int, np.integer))
                                       or max_tokens <= 0):
            raise ValueError(f"max_tokens must be a positive integer or None, got {max_tokens!r}")
        if pool is None:  # a private pool, as large as max_tokens needs
            nb = None
            if max_tokens is not None and isinstance(block_size, (int, np.integer)) \
                    and block_size > 0:
                nb = -(-int(max_tokens) // int(block_size))
            pool = KVBlockPool(num_layers, num_kv_heads, head_dim, block_size, dtype, placement,
                               num_blocks=nb, prefix_cache=False, poison_unused=poison_unused)
        elif not isinstance(pool, KVBlockPool):
            raise TypeError(f"pool must be a KVBlockPool, got {type(pool).__name__}")
        else:
            want = (num_layers, num_kv_heads, head_dim, block_size)
            have = (pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.block_size)
            if want != have:
                raise ValueError(f"the pool holds (layers, kv heads, head_dim, block size) "
                                 f"{have}, the cache asks for {want}")
        self.pool = pool
        self.num_layers, self.num_kv_heads = pool.num_layers, pool.num_kv_heads
        self.head_dim, self.block_size = pool.head_dim, pool.block_size
        self.dtype, self.kv_format, self.kv_code = pool.dtype, pool.kv_format, pool.kv_code
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        self._placements = pool.placements
        self._blocks: list = []  # block ids in position order, shared by every layer
        self._tables = [st.new_table() for st in pool.storages]  # per layer: lengths, addresses
        self._version = 0  # bumped when _blocks changes; a table at another version is stale
        self._seq_len = 0
        self._released = 0  # leading blocks given back (void_block in their place)

    @classmethod
    def on(cls, pool: KVBlockPool, max_tokens: "int | None" = None) -> "PagedKVCache":
        """A sequence's cache over a shared pool."""
        return cls(pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.block_size,
                   pool.kv_format, pool.placements, max_tokens, pool=pool)

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
        """Elements (bytes for q8_0) from one KV head's rows to the next head's inside a K (or
        V) block."""
        return 2 * self.block_size * (kv_row_bytes("q8_0", self.head_dim)
                                      if self.kv_format == "q8_0" else self.head_dim)

    @property
    def block_ids(self) -> list:
        """The sequence's block ids in position order (the same for every layer)."""
        return list(self._blocks)

    def placement(self, layer: int) -> Placement:
        return self._placements[self._check_layer(layer)]

    def layer_len(self, layer: int) -> int:
        """Tokens stored in ``layer``: committed plus appended but not yet committed."""
        return self._tables[self._check_layer(layer)].length

    def num_blocks(self, layer: int) -> int:
        """Blocks holding the layer's tokens."""
        return -(-self._tables[self._check_layer(layer)].length // self.block_size)

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

    # -- blocks -----------------------------------------------------------------------------
    def _refresh(self, layer: int) -> None:
        """Point the layer's address tables at the current block list (if they are stale)."""
        t = self._tables[layer]
        if getattr(t, "version", -1) != self._version:
            t.set_blocks(self._blocks, self.pool.k_addr[layer], self.pool.v_addr[layer])
            t.version = self._version

    def _take_blocks(self, start: int, n: int, where: str = "") -> None:
        """Take the blocks for n tokens from position ``start`` (copying a shared block about to
        be written); the layers' tables follow lazily.  Raises with nothing taken."""
        if self.max_tokens is not None and start + n > self.max_tokens:
            raise CacheCapacityError(
                f"KV cache capacity exceeded{where}: it holds {start} tokens, appending {n} would "
                f"make {start + n} > max_tokens={self.max_tokens}")
        if not n:
            return
        need = -(-(start + n) // self.block_size)
        try:
            if need > len(self._blocks):
                self._blocks.extend(self.pool.allocate(need - len(self._blocks)))
                self._version += 1
            if start % self.block_size:
                self._make_writable(start // self.block_size)
        except BaseException:
            self._trim()
            raise

    def release_before(self, position: int) -> int:
        """Give back to the pool the blocks whose every token lies before ``position`` (tokens
        no layer reads again once every layer's sliding window has passed them); their table
        entries point at the pool's void block.  Returns how many blocks went back."""
        n = min(int(position) // self.block_size, len(self._blocks))
        if n <= self._released:
            return 0
        gone = self._blocks[self._released:n]
        self.pool.release(gone)  # first, so that the void block can be taken the first time
        self._blocks[self._released:n] = [self.pool.void_block()] * (n - self._released)
        self._released = n
        self._version += 1
        return len(gone)

    @property
    def released_tokens(self) -> int:
        """Tokens at the start whose blocks went back to the pool (release_before)."""
        return self._released * self.block_size

    def _held(self) -> int:
        """Tokens some layer holds (blocks past them can go back to the pool)."""
        return max([self._seq_len] + [t.length for t in self._tables])

    def _trim(self) -> None:
        """Give back the blocks past what any layer holds."""
        keep = -(-self._held() // self.block_size)
        if len(self._blocks) > keep:
            extra = self._blocks[max(keep, self._released):]
            del self._blocks[keep:]
            self._released = min(self._released, keep)
            self._version += 1
            self.pool.release(extra)

    def _make_writable(self, index: int) -> None:
        """Block ``index`` is about to be written: copy it first if another sequence shares it
        or the prefix cache holds it (copy-on-write)."""
        b = self._blocks[index]
        if self.pool.writable(b):
            return
        if self.pool.refs[b] == 1:  # ours alone, but registered: forget its hash
            self.pool.unregister(b)
            return
        (fresh,) = self.pool.allocate(1)
        self.pool.copy_block(b, fresh)
        self._blocks[index] = fresh
        self._version += 1
        self.pool.release([b])

    def allocate_slots(self, n: int) -> None:
        """Make sure blocks hold the slots of n more tokens after ``seq_len`` in every layer (a
        shared block about to be written is copied first).  Takes only what is missing, so a
        second call for the same tokens takes nothing.  Raises CacheCapacityError or
        PoolExhaustedError with nothing taken."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"allocate_slots(n) needs an integer n >= 0, got {n!r}")
        self._take_blocks(self._seq_len, int(n))

    def holds_uncommitted(self) -> bool:
        """Whether some layer holds tokens appended after ``seq_len`` (not yet committed)."""
        return any(t.length != self._seq_len for t in self._tables)

    def allocated_tokens(self) -> int:
        """Token slots the allocated blocks hold (committed, appended and reserved)."""
        return len(self._blocks) * self.block_size

    def mark_written(self, n: int, layers) -> None:
        """``layers`` (indices) now hold the n tokens after ``seq_len``, written into their
        allocated slots by a step's kernels; commit follows after the last layer."""
        length = self._seq_len + int(n)
        if length > len(self._blocks) * self.block_size:
            raise ValueError(f"{n} tokens after seq_len={self._seq_len} need slots that were "
                             f"not allocated")
        for layer in layers:
            self._tables[layer].length = length

    def adopt_prefix(self, block_ids) -> None:
        """Start this empty sequence with full blocks taken from the pool's prefix cache (each
        already referenced for this sequence by ``pool.match_prefix``): they count as committed
        tokens of every layer."""
        if self._blocks or self._seq_len:
            raise ValueError("adopt_prefix needs an empty cache")
        self._blocks = [int(b) for b in block_ids]
        self._version += 1
        n = len(self._blocks) * self.block_size
        if self.max_tokens is not None and n > self.max_tokens:
            self.pool.release(self._blocks)
            self._blocks = []
            raise CacheCapacityError(f"a prefix of {n} tokens exceeds max_tokens={self.max_tokens}")
        for layer, t in enumerate(self._tables):
            t.length = n
            self._refresh(layer)
        self._seq_len = n

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
        t = self._tables[layer]
        n = k.shape[0]
        start = self._reserve(layer, n)
        if n:
            try:
                self.pool.storages[layer].write(t, start, k, v)
            except BaseException:
                self._trim()  # give back the blocks this append took
                raise
            t.length = start + n
        nb = t.n
        return AppendResult(start, n, t.length, t.k_ptrs[:nb], t.v_ptrs[:nb], t.ids[:nb])

    def _reserve(self, layer: int, n: int) -> int:
        """Check capacity, take the blocks for n more tokens of ``layer`` (copying a shared block
        about to be written) and point the layer's tables at them; returns where the tokens
        start.  Raises with nothing taken."""
        start = self._tables[layer].length
        self._take_blocks(start, n, f" on layer {layer}")
        self._refresh(layer)
        return start

    def commit(self, n: int) -> None:
        """Advance ``seq_len`` by ``n`` tokens, which every layer must already hold."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"commit(n) needs an integer n >= 0, got {n!r}")
        target = self._seq_len + int(n)
        for i, t in enumerate(self._tables):
            if t.length < target:
                raise ValueError(f"commit({n}): layer {i} holds {t.length} tokens, fewer than "
                                 f"seq_len {self._seq_len} + {n}; append to every layer first")
        self._seq_len = target

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` committed tokens (0 <= n <= seq_len); drop the rest everywhere."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self._seq_len:
            raise ValueError(f"truncate(n) needs 0 <= n <= seq_len={self._seq_len}, got {n!r}")
        if 0 < n < self.released_tokens:
            raise ValueError(f"truncate({n}): the first {self.released_tokens} tokens went back to "
                             f"the pool (outside every sliding window); truncate to 0 or to at "
                             f"least {self.released_tokens}")
        for t in self._tables:
            t.length = min(t.length, int(n))
        self._seq_len = int(n)
        self._trim()

    def discard_uncommitted(self) -> None:
        """Drop every appended but uncommitted token of every layer."""
        self.truncate(self._seq_len)

    def reset(self) -> None:
        """Empty the cache; every block returns to the pool."""
        for t in self._tables:
            t.length = 0
        self._seq_len = 0
        self._trim()

    close = reset  # a finished sequence gives its blocks back

    def rollback_layer(self, layer: int, length: int) -> None:
        """Undo appends to one layer back to ``length`` tokens (when a step fails there); blocks
        no layer needs any more go back to the pool."""
        t = self._tables[layer]
        if length < t.length:
            t.length = length
            self._trim()

    # -- reading (kernels, tests) -----------------------------------------------------------
    def block_table(self, layer: int) -> np.ndarray:
        """[n_blocks] int32 ids of the layer's blocks in position order."""
        layer = self._check_layer(layer)
        self._refresh(layer)
        return self._tables[layer].ids[:self.num_blocks(layer)].copy()

    def block_pointers(self, layer: int):
        """(k_ptrs, v_ptrs): [n_blocks] base addresses of the layer's K and V blocks, int64 host
        arrays for a CPU layer, the persistent uint64 device tables for a ``cuda:N`` layer.

        Views of persistent tables: valid until the layer's next append, truncate or reset.
        """
        layer = self._check_layer(layer)
        self._refresh(layer)
        t = self._tables[layer]
        if not self._placements[layer].is_cpu:
            return t.device_tables()
        return t.k_ptrs[:t.n], t.v_ptrs[:t.n]

    def table_addresses(self, layer: int) -> tuple:
        """Device addresses of a ``cuda:N`` layer's K and V block tables (batched attention)."""
        layer = self._check_layer(layer)
        if self._placements[layer].is_cpu:
            raise ValueError(f"cache layer {layer} is on the cpu; its block tables are "
                             f"block_pointers({layer})")
        self._refresh(layer)
        return self._tables[layer].table_addresses()

    def blocks(self, layer: int):
        """(k_blocks, v_blocks): lists of the layer's K and V views [num_kv_heads, block_size,
        head_dim], in position order (views into the pool, for reference checks and debugging;
        q8_0 blocks as float32 copies, widened as the kernels widen them)."""
        layer = self._check_layer(layer)
        st = self.pool.storages[layer]
        pairs = [st.block_arrays(b) for b in self._blocks[:self.num_blocks(layer)]]
        if self.kv_format == "q8_0":
            d = self.head_dim
            pairs = [tuple(widen_q8_rows(a.reshape(-1, a.shape[-1]), d).reshape(*a.shape[:-1], d)
                           for a in p) for p in pairs]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def dense(self, layer: int, n_tokens: "int | None" = None):
        """Copies of K and V [n_tokens, kv_dim] (default: all the layer holds).  Debug only."""
        layer = self._check_layer(layer)
        t = self._tables[layer]
        self._refresh(layer)
        return t.dense(t.length if n_tokens is None else n_tokens)

    def nbytes(self) -> int:
        """Bytes of block memory allocated by the pool (in use, cached or free)."""
        return self.pool.nbytes()

    def __repr__(self) -> str:
        return (f"PagedKVCache(layers={self.num_layers}, kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, block_size={self.block_size}, dtype={self.kv_format}, "
                f"seq_len={self._seq_len})")

    @staticmethod
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
                batched(k, v, [c._tables[layer] for c in caches], np.asarray(starts, dtype=np.int64),
                        c0.num_kv_heads, c0.head_dim, c0.block_size, c0.head_stride,
                        c0.dtype == np.float16)
                for c, start in zip(caches, starts):
                    c._tables[layer].length = start + 1
        except BaseException:
            for c, start in zip(caches, starts):
                c.rollback_layer(layer, start)  # blocks taken and rows appended go back
            raise


append_batch = PagedKVCache.append_batch

__all__ = ["PagedKVCache", "AppendResult", "CacheCapacityError", "PoolExhaustedError",
           "KVBlockPool", "KV_DTYPES", "append_batch"]
