"""KVBlockPool: one pool of KV blocks per (layer, device), shared by every sequence of a model.

A block id names the same slot in every layer: block ``b`` of layer ``l`` holds ``block_size``
consecutive positions of K and V for that layer ([num_kv_heads, 2, block_size, head_dim], the
layout in hybrid/kvcache.py).  A sequence (``PagedKVCache`` built with ``pool=``) owns a list of
block ids in position order, the same list for all its layers, and the pool keeps:

- a reference count per block (a block used by several sequences is shared read-only),
- the prefix cache: a full block may be registered under a hash chained from the previous
  block's hash and the block's token ids (``prefix_hashes``); a new sequence whose prompt
  starts with registered blocks takes them (``match_prefix``) instead of computing them again,
- a free list of blocks holding nothing, and a least-recently-used queue of registered blocks
  that no sequence references: they stay cached until an allocation needs room.

Storage per layer is one ``LayerStorage``: ``HostLayerStorage`` below for the cpu, the CUDA
backend's ``DeviceLayerStorage`` (hybrid/_cuda/kv_blocks.py) for ``cuda:N``.  Both implement the
interface documented on ``HostLayerStorage``; blocks come from chunks that never move, so a
block's address is stable while the pool lives.

Capacity: ``num_blocks`` (a hard limit; chunks are still allocated only as blocks are first
used), or ``kv_memory`` in bytes (an int or "2GiB"), or neither (grow without limit; the private
pool of a stand-alone PagedKVCache).  ``default_kv_memory()`` is the documented default of the
engine: half of the memory available when it starts.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections import OrderedDict

import numpy as np

from .placement import Placement
from .scratch import aligned_empty

# What a block stores, by name: its numpy storage type, and the code the attention kernels take
# (attention_core.h's HY_KV_*).  q8_0 rows are ggml's Q8_0 blocks (34 bytes per 32 values), stored
# in a block by plane (hybrid/_cpu/kv_q8.h; q8_block_rows reads them back as rows).
KV_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
             "q8_0": np.dtype(np.uint8)}
KV_CODES = {"float32": 0, "float16": 1, "q8_0": 2}


def kv_row_bytes(kv_format: str, head_dim: int) -> int:
    """Bytes of one cached row (one token, one KV head)."""
    if kv_format == "q8_0":
        return head_dim // 32 * 34
    return head_dim * KV_DTYPES[kv_format].itemsize


class PoolExhaustedError(MemoryError):
    """The pool has fewer free (or evictable) blocks than asked for; nothing was taken."""


# ------------------------------------------------------------------ storage of one layer
class HostLayerStorage:
    """The blocks of one layer in host memory.

    The storage interface (also implemented by the CUDA backend's DeviceLayerStorage):
      grow(n)                 add n blocks; returns their ids' K and V base addresses (int64)
      new_table()             a per-sequence LayerTable (address tables for the kernels)
      write(table, start, k, v)  store rows k, v [n, KVH*D] at positions start.. of the blocks
                              listed in ``table`` (a LayerTable)
      poison(ids)             fill blocks with NaN (tests: reads of unused slots show up)
      copy_block(src, dst)    copy one block's K and V (copy-on-write)
      block_arrays(id)        (K, V) [KVH, block_size, D] views (host copies on a GPU; q8_0:
                              copies as ggml rows [KVH, block_size, D/32*34])
      nbytes()                bytes allocated
    """

    def __init__(self, placement: Placement, num_kv_heads: int, head_dim: int, block_size: int,
                 dtype):
        self.placement = placement
        self.shape = (num_kv_heads, block_size, head_dim)
        self.block_size = block_size
        self.q8 = isinstance(dtype, str) and dtype == "q8_0"  # rows of q8_0 blocks (bytes)
        self.dtype = KV_DTYPES["q8_0"] if self.q8 else np.dtype(dtype)
        self.row = kv_row_bytes("q8_0", head_dim) if self.q8 else head_dim  # elements per row
        self.chunks: list = []  # each [n, KVH, 2, bs, row]
        self.where: list = []  # block id -> (chunk index, index in chunk)

    def grow(self, n: int):
        kvh, bs, _ = self.shape
        chunk = aligned_empty((n, kvh, 2, bs, self.row), self.dtype)
        c = len(self.chunks)
        self.chunks.append(chunk)
        self.where.extend((c, i) for i in range(n))
        base = chunk.__array_interface__["data"][0] + chunk[0].nbytes * np.arange(n, dtype=np.int64)
        # V rows of head 0 follow its K rows
        return base, base + bs * self.row * self.dtype.itemsize

    def new_table(self) -> "LayerTable":
        return LayerTable(self)

    def block(self, block_id: int) -> np.ndarray:
        c, i = self.where[block_id]
        return self.chunks[c][i]  # [KVH, 2, bs, D]

    def block_arrays(self, block_id: int):
        blk = self.block(block_id)
        if self.q8:
            blk = q8_block_rows(blk)
        return blk[:, 0], blk[:, 1]

    def poison(self, block_ids) -> None:
        for b in block_ids:  # q8_0: every factor 0xFFFF, a float16 NaN, so every value is NaN
            self.block(b).fill(0xFF if self.q8 else np.nan)

    def copy_block(self, src: int, dst: int) -> None:
        np.copyto(self.block(dst), self.block(src))

    def write(self, table: "LayerTable", start: int, k: np.ndarray, v: np.ndarray) -> None:
        kvh, bs, d = self.shape
        n = k.shape[0]
        k3 = k.reshape(n, kvh, d)
        v3 = v.reshape(n, kvh, d)
        if self.q8:
            from ._cpu import attention
        p = start
        while p < start + n:
            b, slot = divmod(p, bs)
            take = min(bs - slot, start + n - p)
            rows = slice(p - start, p - start + take)
            if self.q8:  # the writer of a step (kv_q8.h)
                attention.store_rows_q8_0(
                    np.ascontiguousarray(k[rows], dtype=np.float32),
                    np.ascontiguousarray(v[rows], dtype=np.float32),
                    self.block(int(table.ids[b])), slot)
            else:
                kb, vb = self.block_arrays(int(table.ids[b]))
                kb[:, slot:slot + take, :] = k3[rows].transpose(1, 0, 2)
                vb[:, slot:slot + take, :] = v3[rows].transpose(1, 0, 2)
            p += take

    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)


class LayerTable:
    """One sequence's view of one layer: persistent block-id and address tables (int64/int32,
    capacity-doubled, so the kernels read them in place) and the tokens the layer holds."""

    def __init__(self, storage):
        self.storage = storage
        self.length = 0  # tokens appended to this layer
        self.n = 0  # blocks in the table
        self.ids = np.zeros(8, dtype=np.int32)
        self.k_ptrs = np.zeros(8, dtype=np.int64)
        self.v_ptrs = np.zeros(8, dtype=np.int64)

    def set_blocks(self, blocks: list, k_addr: np.ndarray, v_addr: np.ndarray) -> None:
        """Make the table list ``blocks`` (rewriting only entries that changed)."""
        nb = len(blocks)
        if nb > self.ids.shape[0]:
            cap = max(2 * self.ids.shape[0], nb)
            for name in ("ids", "k_ptrs", "v_ptrs"):
                old = getattr(self, name)
                grown = np.zeros(cap, dtype=old.dtype)
                grown[:self.n] = old[:self.n]
                setattr(self, name, grown)
        m = min(nb, self.n)
        first = m
        if m:
            diff = np.flatnonzero(self.ids[:m] != np.asarray(blocks[:m], dtype=np.int64))
            first = int(diff[0]) if diff.size else m
        if first < nb:
            ids = np.asarray(blocks[first:], dtype=np.int64)
            self.ids[first:nb] = ids
            self.k_ptrs[first:nb] = k_addr[ids]
            self.v_ptrs[first:nb] = v_addr[ids]
        self.n = nb
        self.changed(first)

    def changed(self, first: int) -> None:
        """Entries from ``first`` on were rewritten (device tables re-upload them)."""

    def dense(self, n_tokens: int):
        """K, V of the first n_tokens as [n_tokens, KVH*D] copies in the cache's dtype (q8_0:
        widened to float32, as the kernels widen them)."""
        kvh, bs, d = self.storage.shape
        nb = -(-n_tokens // bs)
        pairs = [self.storage.block_arrays(int(b)) for b in self.ids[:nb]]
        q8 = getattr(self.storage, "q8", False)
        if not pairs:
            empty = np.zeros((0, kvh * d), dtype=np.float32 if q8 else self.storage.dtype)
            return empty, empty.copy()
        k = np.concatenate([p[0].transpose(1, 0, 2) for p in pairs])[:n_tokens]
        v = np.concatenate([p[1].transpose(1, 0, 2) for p in pairs])[:n_tokens]
        if q8:
            k, v = (widen_q8_rows(a.reshape(n_tokens * kvh, -1), d) for a in (k, v))
        return k.reshape(n_tokens, kvh * d), v.reshape(n_tokens, kvh * d)


def q8_block_rows(block: np.ndarray) -> np.ndarray:
    """A q8_0 cache block [KVH, 2, bs, d/32*34] (K and V of each head by plane, kv_q8.h) as a copy
    holding ggml Q8_0 rows in the same shape."""
    kvh, _, bs, row = block.shape
    nb = row // 34
    d = 32 * nb
    flat = block.reshape(kvh, 2, bs * row)
    out = np.empty((kvh, 2, bs, nb, 34), dtype=np.uint8)
    out[..., :2] = flat[:, :, :2 * nb * bs].reshape(kvh, 2, nb, bs, 2).transpose(0, 1, 3, 2, 4)
    values = flat[:, :, 2 * nb * bs:]
    out[:, 0, :, :, 2:] = values[:, 0].reshape(kvh, d // 4, bs, 4).transpose(0, 2, 1, 3).reshape(
        kvh, bs, nb, 32)
    out[:, 1, :, :, 2:] = values[:, 1].reshape(kvh, bs, nb, 32)
    return out.reshape(kvh, 2, bs, row)


def widen_q8_rows(q: np.ndarray, d: int) -> np.ndarray:
    """q8_0 rows [n, d/32*34] as float32 [n, d]."""
    from ._cpu import attention

    out = np.empty((q.shape[0], d), dtype=np.float32)
    attention.dequantize_rows_q8_0(np.ascontiguousarray(q), out)
    return out


# ------------------------------------------------------------------ the pool
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_bytes(value) -> int:
    """An int, or a string such as "512MiB", "2GB", "1.5g": bytes."""
    if isinstance(value, bool):
        raise ValueError(f"a memory size must be bytes or a string like '2GiB', got {value!r}")
    if isinstance(value, (int, np.integer)):
        n = int(value)
    elif isinstance(value, str) and _SIZE.match(value):
        num, unit, _ = _SIZE.match(value).groups()
        n = int(float(num) * 1024 ** " kmgt".index(unit.lower() or " "))
    else:
        raise ValueError(f"a memory size must be bytes or a string like '2GiB', got {value!r}")
    if n <= 0:
        raise ValueError(f"a memory size must be positive, got {value!r}")
    return n


def default_kv_memory() -> int:
    """The engine's default KV budget: half of the memory available now (MemAvailable), or
    1 GiB where that cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 1 << 30


class KVBlockPool:
    """KV blocks of ``num_layers`` layers shared by many sequences (see the module docstring).

    Parameters
    ----------
    num_layers, num_kv_heads, head_dim, block_size : the cache geometry
    dtype : "float16" (default), "float32", or "q8_0" (ggml's 8-bit blocks: 34 bytes per 32
        values, about half of float16's; cpu layers, head_dim % 32 == 0)
    placement : "cpu", "cuda:N", or one placement per layer
    num_blocks : hard limit on blocks; or kv_memory : bytes (int or "2GiB") over all layers;
        neither: no limit
    prefix_cache : keep full registered blocks for reuse (False: blocks are freed at once)
    poison_unused : fill every block handed out with NaN
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int = 16,
                 dtype="float16", placement="cpu", *, num_blocks: "int | None" = None,
                 kv_memory=None, prefix_cache: bool = True, poison_unused: bool = False):
        for name, val in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                          ("head_dim", head_dim), ("block_size", block_size)):
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val <= 0:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        key = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
        if key not in KV_DTYPES or key == "uint8":
            raise ValueError(f"KV dtype must be one of {sorted(KV_DTYPES)}, got {dtype!r}")
        self.num_layers, self.num_kv_heads = int(num_layers), int(num_kv_heads)
        self.head_dim, self.block_size = int(head_dim), int(block_size)
        self.kv_format, self.kv_code, self.dtype = key, KV_CODES[key], KV_DTYPES[key]
        if key == "q8_0" and self.head_dim % 32:
            raise ValueError(f"a q8_0 KV cache needs head_dim % 32 == 0, got {self.head_dim}")
        self.placements = self._parse_placements(placement)
        self.on_cpu = all(p.is_cpu for p in self.placements)  # every layer's blocks in host memory
        if key == "q8_0" and not self.on_cpu:
            raise ValueError("a q8_0 KV cache is kept in host memory: its layers run on the cpu "
                             "(use --kv-on-cpu, or float16 for GPU layers)")
        self.block_bytes = (self.num_kv_heads * 2 * self.block_size
                            * kv_row_bytes(key, self.head_dim) * self.num_layers)  # every layer
        if num_blocks is not None and kv_memory is not None:
            raise ValueError("give num_blocks or kv_memory, not both")
        if kv_memory is not None:
            num_blocks = parse_bytes(kv_memory) // self.block_bytes
            if num_blocks < 1:
                raise ValueError(f"kv_memory={kv_memory!r} holds no block of "
                                 f"{self.block_bytes} bytes")
        if num_blocks is not None and (isinstance(num_blocks, bool) or num_blocks <= 0
                                       or not isinstance(num_blocks, (int, np.integer))):
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        self.max_blocks = None if num_blocks is None else int(num_blocks)
        self.prefix_cache = bool(prefix_cache)
        self.poison = bool(poison_unused)
        self._void = None  # void_block()
        self.storages = [self._new_storage(p) for p in self.placements]
        self.k_addr = [np.zeros(0, dtype=np.int64) for _ in self.placements]
        self.v_addr = [np.zeros(0, dtype=np.int64) for _ in self.placements]
        self.refs = np.zeros(0, dtype=np.int32)  # block id -> sequences holding it
        self._free: list = []  # ids holding nothing, popped from the end
        self._evictable: "OrderedDict[int, None]" = OrderedDict()  # cached, unreferenced (LRU)
        self._hash_of: dict = {}  # block id -> its prefix hash
        self._by_hash: dict = {}  # prefix hash -> block id
        self.hit_tokens = 0  # prompt tokens served from the prefix cache

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

    def _new_storage(self, placement: Placement):
        args = (placement, self.num_kv_heads, self.head_dim, self.block_size,
                self.kv_format if self.kv_format == "q8_0" else self.dtype)
        if placement.is_cpu:
            return HostLayerStorage(*args)
        from . import registry

        return registry.lookup("kv_layer_storage", placement)(*args)

    # -- counters ---------------------------------------------------------------------------
    @property
    def num_allocated(self) -> int:
        """Blocks whose memory exists (used, cached or free)."""
        return int(self.refs.shape[0])

    @property
    def num_total(self) -> "int | None":
        """The capacity in blocks (None: unlimited)."""
        return self.max_blocks

    @property
    def num_used(self) -> int:
        """Blocks referenced by live sequences (cached but unreferenced blocks are not used)."""
        return int(np.count_nonzero(self.refs))

    @property
    def num_cached(self) -> int:
        """Registered blocks no sequence references, kept for prefix reuse."""
        return len(self._evictable)

    @property
    def num_available(self) -> "int | None":
        """Blocks an allocation can take now (free, evictable, not yet allocated)."""
        if self.max_blocks is None:
            return None
        return self.max_blocks - self.num_used

    def can_allocate(self, n: int) -> bool:
        return self.max_blocks is None or n <= self.max_blocks - self.num_used

    # -- allocation -------------------------------------------------------------------------
    def _grow(self, at_least: int) -> None:
        have = self.num_allocated
        n = max(at_least, 4, have)  # chunks double the pool
        n = min(n, 4096) if n > at_least else n
        if self.max_blocks is not None:
            n = max(at_least, min(n, self.max_blocks - have))
        for li, st in enumerate(self.storages):
            k, v = st.grow(n)
            self.k_addr[li] = np.concatenate([self.k_addr[li], k])
            self.v_addr[li] = np.concatenate([self.v_addr[li], v])
        self.refs = np.concatenate([self.refs, np.zeros(n, dtype=np.int32)])
        self._free.extend(range(have + n - 1, have - 1, -1))

    def allocate(self, n: int) -> list:
        """Take n blocks (reference count 1): free ones first, then new memory, then the least
        recently used cached blocks.  Raises PoolExhaustedError with nothing taken."""
        if n <= 0:
            return []
        if not self.can_allocate(n):
            raise PoolExhaustedError(
                f"the KV pool has {self.max_blocks - self.num_used} free blocks, {n} needed "
                f"({self.num_used} of {self.max_blocks} in use)")
        short = n - len(self._free)
        if short > 0:
            room = None if self.max_blocks is None else self.max_blocks - self.num_allocated
            grow = short if room is None else min(short, room)
            if grow > 0:
                self._grow(grow)
        while len(self._free) < n:  # evict cached blocks, oldest first
            b, _ = self._evictable.popitem(last=False)
            del self._by_hash[self._hash_of.pop(b)]
            self._free.append(b)
        ids = [self._free.pop() for _ in range(n)]
        self.refs[ids] = 1
        if self.poison:
            for st in self.storages:
                st.poison(ids)
        return ids

    def void_block(self) -> int:
        """A block id that stands for released tokens in a sequence's table (tokens outside every
        layer's sliding window): taken once, never released, filled with NaN so that a kernel
        which read it would give NaN.  Raises PoolExhaustedError when the pool has no block."""
        if self._void is None:
            (self._void,) = self.allocate(1)
            for st in self.storages:
                st.poison([self._void])
        return self._void

    def release(self, ids) -> None:
        """Drop one reference to each block; an unreferenced block is cached (if registered and
        caching is on) or freed."""
        for b in ids:
            b = int(b)
            if self.refs[b] <= 0:
                raise RuntimeError(f"KV block {b} released more often than taken")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self._hash_of and self.prefix_cache:
                    self._evictable[b] = None
                else:
                    self._forget(b)
                    self._free.append(b)

    def _forget(self, b: int) -> None:
        h = self._hash_of.pop(b, None)
        if h is not None:
            del self._by_hash[h]

    def writable(self, b: int) -> bool:
        """Whether a sequence holding block b may write into it (sole owner, not registered)."""
        return self.refs[b] == 1 and b not in self._hash_of

    def unregister(self, b: int) -> None:
        """Forget block b's prefix hash (its sole owner is about to change it)."""
        self._forget(int(b))

    def copy_block(self, src: int, dst: int) -> None:
        for st in self.storages:
            st.copy_block(src, dst)

    # -- prefix cache -----------------------------------------------------------------------
    def register(self, b: int, h: bytes) -> None:
        """Register full block b under prefix hash h (a block of that hash already cached
        keeps its place; b then stays private)."""
        if not self.prefix_cache or h in self._by_hash or int(b) in self._hash_of:
            return
        self._by_hash[h] = int(b)
        self._hash_of[int(b)] = h

    def match_prefix(self, hashes) -> list:
        """The blocks registered under hashes[0], hashes[1], ... (the longest such run), each
        with one more reference."""
        found = []
        if not self.prefix_cache:
            return found
        for h in hashes:
            b = self._by_hash.get(h)
            if b is None:
                break
            found.append(b)
        for b in found:
            if self.refs[b] == 0:
                self._evictable.pop(b, None)
            self.refs[b] += 1
        self.hit_tokens += len(found) * self.block_size
        return found

    def clear_prefix_cache(self) -> None:
        """Free every cached unreferenced block and forget every hash."""
        for b in list(self._evictable):
            self._forget(b)
            self._free.append(b)
        self._evictable.clear()
        for b in list(self._hash_of):
            self._forget(b)

    def nbytes(self) -> int:
        return sum(st.nbytes() for st in self.storages)

    def __repr__(self) -> str:
        cap = "unlimited" if self.max_blocks is None else self.max_blocks
        return (f"KVBlockPool(layers={self.num_layers}, block_size={self.block_size}, "
                f"dtype={self.kv_format}, blocks used={self.num_used} cached={self.num_cached} "
                f"of {cap})")


def prefix_hashes(tokens, block_size: int, salt: bytes = b"", n_blocks: "int | None" = None) -> list:
    """Hashes of the full blocks of ``tokens``: block i's hash covers the previous block's hash
    and block i's token ids, so equal hashes mean equal prefixes.  ``salt`` names whatever else
    changes K/V (model, KV dtype)."""
    out = []
    prev = hashlib.blake2b(salt, digest_size=16).digest()
    full = len(tokens) // block_size if n_blocks is None else min(n_blocks, len(tokens) // block_size)
    for i in range(full):
        chunk = tokens[i * block_size:(i + 1) * block_size]
        prev = hashlib.blake2b(prev + struct.pack(f"<{block_size}q", *[int(t) for t in chunk]),
                               digest_size=16).digest()
        out.append(prev)
    return out


__all__ = ["KVBlockPool", "HostLayerStorage", "KV_CODES", "kv_row_bytes", "q8_block_rows",
           "widen_q8_rows", "LayerTable", "PoolExhaustedError", "prefix_hashes", "parse_bytes",
           "default_kv_memory"]
