"""The shared KV block pool: reference counts, prefix sharing, copy-on-write, eviction, and
sequences over one pool under random schedules (seeded; the seed is printed)."""

import numpy as np
import pytest

import hybrid
from hybrid import KVBlockPool, PagedKVCache, PoolExhaustedError
from hybrid.kvpool import parse_bytes, prefix_hashes

KVH, D, BS = 2, 8, 4


def _rows(tokens, start, n):
    """K, V rows for positions start..start+n of a token sequence: each a function of the whole
    prefix up to its position (as real K/V are), so reused prefix blocks can be checked."""
    out = np.empty((n, KVH * D), np.float32)
    for i in range(n):
        p = start + i
        h = sum((t + 1) * (j + 7) for j, t in enumerate(tokens[:p + 1])) % 1009
        out[i] = h + np.arange(KVH * D, dtype=np.float32) / 64
    return out, -out


def _check_invariants(pool, seqs):
    held = np.zeros(pool.num_allocated, np.int32)
    for c in seqs:
        for b in c.block_ids:
            held[b] += 1
    assert np.array_equal(held, pool.refs), "reference counts differ from the blocks held"
    assert (pool.refs >= 0).all()
    for b in np.nonzero(held > 1)[0]:
        assert not pool.writable(int(b)), f"block {b} is shared but writable"
        assert int(b) in pool._hash_of, f"block {b} is shared without being a cached prefix"


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_random_schedules_keep_counts_and_contents(rng, prefix_cache):
    pool = KVBlockPool(2, KVH, D, BS, "float32", num_blocks=40, prefix_cache=prefix_cache,
                       poison_unused=True)
    prompts = [list(rng.integers(0, 3, 24)) for _ in range(3)]  # few prompts: prefixes repeat
    live = []  # (cache, tokens)
    for _ in range(400):
        op = rng.integers(0, 4)
        if op == 0 and len(live) < 6:  # a new sequence, starting from the prefix cache
            toks = list(prompts[rng.integers(0, 3)][:rng.integers(1, 24)])
            c = PagedKVCache.on(pool)
            n_full = (len(toks) - 1) // BS
            hit = pool.match_prefix(prefix_hashes(toks, BS, b"t", n_full))
            if hit:
                c.adopt_prefix(hit)
            live.append((c, toks))
        elif op == 1 and live:  # compute the rest (or part of it) and register full blocks
            c, toks = live[rng.integers(0, len(live))]
            n = int(rng.integers(1, 9))
            toks.extend(int(t) for t in rng.integers(0, 3, max(0, c.seq_len + n - len(toks))))
            if c.seq_len == 0:
                toks[0] = int(rng.integers(0, 3))
            k, v = _rows(toks, c.seq_len, n)
            try:
                for layer in range(2):
                    c.append(layer, k, v)
            except PoolExhaustedError:
                c.discard_uncommitted()
                continue
            c.commit(n)
            hashes = prefix_hashes(toks, BS, b"t", c.seq_len // BS)
            for i, h in enumerate(hashes):
                pool.register(c.block_ids[i], h)
        elif op == 2 and live:  # roll back
            c, toks = live[rng.integers(0, len(live))]
            keep = int(rng.integers(0, c.seq_len + 1))
            c.truncate(keep)
            del toks[max(keep, 1):]  # what follows is computed from new tokens
        elif op == 3 and live:  # finish
            c, _ = live.pop(rng.integers(0, len(live)))
            c.close()
        _check_invariants(pool, [c for c, _ in live])
        for c, toks in live:  # every sequence reads exactly what it computed
            k, v = c.dense(1)
            want_k, want_v = _rows(toks, 0, c.seq_len)
            assert np.array_equal(k, want_k) and np.array_equal(v, want_v)
    for c, _ in live:
        c.close()
    assert pool.num_used == 0 and (pool.refs == 0).all()
    assert pool.num_cached + len(pool._free) == pool.num_allocated
    if prefix_cache:
        assert pool.hit_tokens > 0


def test_exhaustion_takes_nothing_and_eviction_is_lru():
    pool = KVBlockPool(1, KVH, D, BS, "float32", num_blocks=3)
    a = PagedKVCache.on(pool)
    rows = np.ones((8, KVH * D), np.float32)
    a.append(0, rows, rows)
    a.commit(8)
    b = PagedKVCache.on(pool)
    with pytest.raises(PoolExhaustedError, match="1 free blocks, 2 needed"):
        b.append(0, rows, rows)
    assert pool.num_used == 2 and b.layer_len(0) == 0 and b.block_ids == []
    h = prefix_hashes(list(range(8)), BS)
    pool.register(a.block_ids[0], h[0])
    pool.register(a.block_ids[1], h[1])
    a.close()
    assert pool.num_used == 0 and pool.num_cached == 2
    blocks = pool.match_prefix(h)  # both cached blocks, referenced again
    assert pool.num_used == 2 and pool.num_cached == 0
    pool.release(blocks)  # cached again, the first released is the least recently used
    c = PagedKVCache.on(pool)
    c.append(0, rows, rows)  # two blocks: the free one, then the oldest cached one evicted
    assert pool.num_cached == 1 and pool.match_prefix(h) == []  # the chain starts with a miss
    c.close()
    assert pool.num_used == 0


def test_copy_on_write_of_a_shared_block():
    pool = KVBlockPool(1, KVH, D, BS, "float32")
    a = PagedKVCache.on(pool)
    k = np.arange(8 * KVH * D, dtype=np.float32).reshape(8, -1)
    a.append(0, k, k)
    a.commit(8)
    hs = prefix_hashes(list(range(8)), BS)
    for i, h in enumerate(hs):
        pool.register(a.block_ids[i], h)
    b = PagedKVCache.on(pool)
    b.adopt_prefix(pool.match_prefix(hs))
    assert b.block_ids == a.block_ids
    b.truncate(6)
    b.append(0, -k[:1], -k[:1])  # writes into the shared second block: copied first
    b.commit(1)
    assert b.block_ids[0] == a.block_ids[0] and b.block_ids[1] != a.block_ids[1]
    assert np.array_equal(a.dense(0)[0], k)
    assert np.array_equal(b.dense(0)[0], np.concatenate([k[:6], -k[:1]]))


def test_pool_arguments_are_checked():
    with pytest.raises(ValueError, match="num_blocks or kv_memory"):
        KVBlockPool(1, 2, 8, num_blocks=4, kv_memory=1 << 20)
    with pytest.raises(ValueError, match="holds no block"):
        KVBlockPool(1, 2, 8, kv_memory=10)
    with pytest.raises(ValueError, match="memory size"):
        KVBlockPool(1, 2, 8, kv_memory="lots")
    assert parse_bytes("2GiB") == 2 << 30 and parse_bytes("512m") == 512 << 20
    pool = KVBlockPool(2, 2, 8, 16, "float16", kv_memory="1MiB")
    assert pool.max_blocks == (1 << 20) // (2 * 2 * 2 * 16 * 8 * 2)
    with pytest.raises(ValueError, match="the pool holds"):
        PagedKVCache(3, 2, 8, pool=pool)
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release(pool.allocate(1) * 2)
    assert isinstance(hybrid.PoolExhaustedError("x"), MemoryError)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_blocks_and_scratch_start_on_cache_lines(rng, dtype):
    """The kernels read K/V rows and activation rows with 64-byte vector loads: a block or buffer
    16 bytes past a cache line (numpy's own alignment) splits every one of them in two, which
    cost float32 attention about a third of its speed from memory."""
    from hybrid.scratch import Scratch

    # a block here is 3 heads x (K, V) x 8 rows x 40 values: a whole number of cache lines, so
    # every block starts on one when its chunk does
    cache = PagedKVCache(num_layers=2, num_kv_heads=3, head_dim=40, block_size=8, dtype=dtype)
    for n in (1, 7, 30, 200):  # the pool grows in chunks of several sizes
        cache.append(0, rng.standard_normal((n, 120), dtype=np.float32),
                     rng.standard_normal((n, 120), dtype=np.float32))
        for layer in (0, 1):
            k, v = cache.block_pointers(layer)
            assert len(k) and not (k % 64).any(), (layer, k % 64)
    scratch = Scratch()
    for name, shape in (("a", (3,)), ("b", (7, 5)), ("a", (1000,)), ("c", (1, 577))):
        assert scratch.get(name, shape, dtype).ctypes.data % 64 == 0, (name, shape)
