"""Inconsistent input raises a clear error, and nothing is lost: caches and caller arrays are
exactly as they were."""

import numpy as np
import pytest

import hybrid
from hybrid.testing import random_weights

HIDDEN = 128


@pytest.fixture
def layer(rng):
    cfg = hybrid.DecoderConfig(hidden_size=HIDDEN, num_heads=4, num_kv_heads=2, head_dim=32,
                               intermediate_size=160)
    return hybrid.DecoderLayer(cfg, random_weights(cfg, rng), index=0)


def _cache(layer, rng, n, block_size=16, dtype="float16"):
    c = hybrid.PagedKVCache(num_layers=1, num_kv_heads=2, head_dim=32, block_size=block_size,
                            dtype=dtype)
    if n:
        layer.forward(rng.standard_normal((n, HIDDEN), dtype=np.float32), np.arange(n), c)
        c.commit(n)
    return c


def _snapshot(c):
    k, v = c.dense(0)
    return c.seq_len, c.layer_len(0), c.num_blocks(0), k.copy(), v.copy()


def _assert_unchanged(c, snap):
    seq, held, blocks, k, v = snap
    assert (c.seq_len, c.layer_len(0), c.num_blocks(0)) == (seq, held, blocks)
    k2, v2 = c.dense(0)
    np.testing.assert_array_equal(k2, k)
    np.testing.assert_array_equal(v2, v)


def _batch(layer, rng, lengths=(16, 17, 32), block_size=16, dtype="float16"):
    """Caches over one pool with histories of ``lengths``, and one decode row each (rows at
    16 and 32 need new blocks: a failed step must give them back)."""
    pool = hybrid.KVBlockPool(1, 2, 32, block_size, dtype)
    caches = []
    for n in lengths:
        c = hybrid.PagedKVCache.on(pool)
        layer.forward(rng.standard_normal((n, HIDDEN), dtype=np.float32), np.arange(n), c)
        c.commit(n)
        caches.append(c)
    return caches, rng.standard_normal((len(lengths), HIDDEN), dtype=np.float32)


def _step(layer, x, caches):
    """A one-layer step as Model runs it: plan, the layer, commit; roll back on error."""
    batch = hybrid.StepBatch.plan([(c, 1) for c in caches])
    try:
        out = layer.forward_step(x, batch)
    except BaseException:
        batch.rollback()
        raise
    batch.commit()
    return out


def _expect_step_error(layer, x, caches, exc, match):
    snaps = [_snapshot(c) if isinstance(c, hybrid.PagedKVCache) else None for c in caches]
    pools = {id(c.pool): (c.pool, c.pool.num_used) for c in caches
             if isinstance(c, hybrid.PagedKVCache)}
    keep = x.copy()
    with pytest.raises(exc, match=match):
        _step(layer, x, caches)
    for c, s in zip(caches, snaps):
        if s is not None:
            _assert_unchanged(c, s)
    for pool, used in pools.values():  # every block the step took is back
        assert pool.num_used == used
    np.testing.assert_array_equal(x, keep)


def test_rows_differ_from_the_step(layer, rng):
    caches, x = _batch(layer, rng)
    _expect_step_error(layer, x[:2], caches, ValueError, r"hidden has 2 rows, the step describes 3")


def test_positions_length_differs_from_tokens(layer, rng):
    c = _cache(layer, rng, 4)
    snap = _snapshot(c)
    with pytest.raises(ValueError, match=r"positions has 3 entries for 2 tokens"):
        layer.forward(np.ones((2, HIDDEN), np.float32), [4, 5, 6], c)
    _assert_unchanged(c, snap)


def test_none_cache_in_step(layer, rng):
    caches, x = _batch(layer, rng)
    caches[1] = None
    _expect_step_error(layer, x, caches, TypeError, r"expected PagedKVCache, got NoneType")


def test_caches_of_another_pool(layer, rng):
    """Other block sizes or KV dtypes live in other pools: one step takes one pool."""
    for kw in (dict(block_size=8), dict(dtype="float32")):
        caches, x = _batch(layer, rng)
        caches[2] = _batch(layer, rng, (5,), **kw)[0][0]
        _expect_step_error(layer, x, caches, ValueError,
                           "the sequences of one step must share one KV pool")


def test_same_cache_twice(layer, rng):
    caches, x = _batch(layer, rng)
    caches[2] = caches[0]
    _expect_step_error(layer, x, caches, ValueError, "a sequence appears twice in one step")


def test_wrong_hidden_size(layer, rng):
    c = _cache(layer, rng, 6)
    snap = _snapshot(c)
    with pytest.raises(ValueError, match=r"hidden has 127 features; layer 0 expects hidden_size=128"):
        layer.forward(np.ones((1, 127), np.float32), [6], c)
    _assert_unchanged(c, snap)
    caches, x = _batch(layer, rng)
    _expect_step_error(layer, x[:, :100], caches, ValueError, "hidden_size=128")
    with pytest.raises(ValueError, match="2-dimensional"):
        layer.forward(np.ones(HIDDEN, np.float32), [6], c)
    _assert_unchanged(c, snap)


def test_wrong_dtypes_rejected_or_converted(layer, rng):
    c = _cache(layer, rng, 6)
    snap = _snapshot(c)
    with pytest.raises(TypeError, match="hidden must be a floating-point array, got dtype int64"):
        layer.forward(np.ones((1, HIDDEN), np.int64), [6], c)
    with pytest.raises(TypeError, match="positions must be integers, got dtype float64"):
        layer.forward(np.ones((1, HIDDEN), np.float32), [6.0], c)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        layer.forward(np.ones((1, HIDDEN), np.float32), [-1], c)
    with pytest.raises(TypeError, match="out must be a writeable C-contiguous float32"):
        layer.forward(np.ones((1, HIDDEN), np.float32), [6], c,
                      out=np.empty((1, HIDDEN), np.float64))
    _assert_unchanged(c, snap)
    # float64 and a strided view are converted (copies); the caller's arrays are untouched
    x64 = rng.standard_normal((1, HIDDEN))
    keep = x64.copy()
    y = layer.forward(x64, [6], c)
    c.discard_uncommitted()
    y32 = layer.forward(x64.astype(np.float32), [6], c)
    np.testing.assert_array_equal(x64, keep)
    np.testing.assert_array_equal(y, y32)


def test_uncommitted_tokens_block_the_next_step(layer, rng):
    c = _cache(layer, rng, 6)
    layer.forward(np.ones((1, HIDDEN), np.float32), [6], c)  # not committed
    snap = _snapshot(c)
    with pytest.raises(ValueError, match="already holds 1 uncommitted tokens after seq_len=6"):
        layer.forward(np.ones((1, HIDDEN), np.float32), [7], c)
    _assert_unchanged(c, snap)


def test_cache_shape_mismatch(layer, rng):
    c = hybrid.PagedKVCache(num_layers=1, num_kv_heads=4, head_dim=32)
    with pytest.raises(ValueError, match="stores 4 KV heads x 32, layer 0 has 2 x 32"):
        layer.forward(np.ones((1, HIDDEN), np.float32), [0], c)
    assert c.layer_len(0) == 0


def test_capacity_error_mid_step_rolls_back_everything(layer, rng):
    caches, x = _batch(layer, rng)
    full = hybrid.PagedKVCache.on(caches[0].pool, max_tokens=4)
    layer.forward(rng.standard_normal((4, HIDDEN), dtype=np.float32), np.arange(4), full)
    full.commit(4)
    caches.append(full)
    x = np.vstack([x, x[:1]])
    _expect_step_error(layer, x, caches, hybrid.CacheCapacityError, "max_tokens=4")


def test_failure_inside_a_step_rolls_back_every_cache(layer, rng, monkeypatch):
    """A kernel failing in the middle of a step: every cache as before, blocks back."""
    from hybrid._cpu import backend

    caches, x = _batch(layer, rng)

    def boom(*a, **k):
        raise RuntimeError("injected kernel failure")

    monkeypatch.setattr(backend, "_step_plan", boom)  # the ragged attention of the step
    used = caches[0].pool.num_used
    _expect_step_error(layer, x, caches, RuntimeError, "injected")
    assert caches[0].pool.num_used == used


def test_failure_inside_attention_rolls_back_the_append(layer, rng, monkeypatch):
    c = _cache(layer, rng, 6)
    snap = _snapshot(c)

    def boom(*a, **k):
        raise RuntimeError("injected kernel failure")

    monkeypatch.setattr(hybrid.ops, "paged_attention", boom)
    with pytest.raises(RuntimeError, match="injected"):
        layer.forward(np.ones((2, HIDDEN), np.float32), [6, 7], c)
    _assert_unchanged(c, snap)


def test_paged_attention_needs_appended_rows(rng):
    c = hybrid.PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=32)
    c.append(0, np.ones((2, 32)), np.ones((2, 32)))
    with pytest.raises(ValueError, match="need 3 tokens in layer 0, which holds 2"):
        hybrid.ops.paged_attention(np.ones((3, 32), np.float32), c, 0)
    with pytest.raises(ValueError, match="num_heads\\*head_dim"):
        hybrid.ops.paged_attention(np.ones((2, 33), np.float32), c, 0)


def test_cache_append_errors_write_nothing():
    c = hybrid.PagedKVCache(num_layers=1, num_kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match=r"k must have shape \[n_tokens, num_kv_heads\*head_dim=16\]"):
        c.append(0, np.ones((2, 15)), np.ones((2, 16)))
    with pytest.raises(ValueError, match="k has 2 rows but v has 3"):
        c.append(0, np.ones((2, 16)), np.ones((3, 16)))
    with pytest.raises(TypeError, match="floating-point"):
        c.append(0, np.ones((2, 16), int), np.ones((2, 16)))
    with pytest.raises(IndexError, match="layer 1 out of range"):
        c.append(1, np.ones((2, 16)), np.ones((2, 16)))
    assert c.layer_len(0) == 0 and c.num_blocks(0) == 0
