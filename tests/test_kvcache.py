"""PagedKVCache: lengths, commit/truncate/reset, block reuse, pointer tables, capacity."""

import numpy as np
import pytest

import hybrid
from hybrid import PagedKVCache


def _rows(rng, n, dim=2 * 8):
    return rng.standard_normal((n, dim), dtype=np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("n", [1, 4, 5, 13])
def test_append_layout_and_dense_roundtrip(rng, dtype, n):
    c = PagedKVCache(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype=dtype)
    k, v = _rows(rng, n), _rows(rng, n)
    res = c.append(1, k, v)
    assert (res.start, res.length, res.kv_len) == (0, n, n)
    assert len(res.k_ptrs) == len(res.block_table) == -(-n // 4)
    assert c.seq_len == 0 and c.layer_len(1) == n and c.layer_len(0) == 0
    kd, vd = c.dense(1)
    np.testing.assert_array_equal(kd, k.astype(dtype))
    np.testing.assert_array_equal(vd, v.astype(dtype))
    # documented block layout: block[head, slot, :] holds token (b*bs + slot), head `head`
    kb, _ = c.blocks(1)
    tok = n - 1
    np.testing.assert_array_equal(kb[tok // 4][1, tok % 4], k[tok, 8:16].astype(dtype))
    # pointer tables hold the blocks' addresses
    for ptr, blk in zip(res.k_ptrs, kb):
        assert ptr == blk.__array_interface__["data"][0]


def test_commit_requires_every_layer(rng):
    c = PagedKVCache(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4)
    c.append(0, _rows(rng, 3), _rows(rng, 3))
    with pytest.raises(ValueError, match="layer 1 holds 0 tokens"):
        c.commit(3)
    assert c.seq_len == 0
    c.append(1, _rows(rng, 3), _rows(rng, 3))
    c.commit(3)
    assert c.seq_len == 3
    # appends after seq_len land at position 3
    res = c.append(0, _rows(rng, 2), _rows(rng, 2))
    assert res.start == 3 and c.seq_len == 3


def test_truncate_and_reset_return_blocks_for_reuse(rng):
    c = PagedKVCache(num_layers=1, num_kv_heads=2, head_dim=8, block_size=4, dtype="float32")
    k, v = _rows(rng, 10), _rows(rng, 10)
    c.append(0, k, v)
    c.commit(10)
    before = c.nbytes()
    c.truncate(5)
    assert c.seq_len == 5 and c.layer_len(0) == 5 and c.num_blocks(0) == 2
    np.testing.assert_array_equal(c.dense(0)[0], k[:5])
    c.append(0, _rows(rng, 5), _rows(rng, 5))
    c.commit(5)
    assert c.nbytes() == before  # freed blocks were reused, nothing new allocated
    c.reset()
    assert c.seq_len == 0 and c.num_blocks(0) == 0
    c.append(0, k, v)
    assert c.nbytes() == before
    with pytest.raises(ValueError, match="truncate"):
        c.truncate(11)


def test_discard_uncommitted(rng):
    c = PagedKVCache(num_layers=1, num_kv_heads=2, head_dim=8, block_size=4)
    c.append(0, _rows(rng, 6), _rows(rng, 6))
    c.commit(6)
    c.append(0, _rows(rng, 3), _rows(rng, 3))
    c.discard_uncommitted()
    assert c.layer_len(0) == 6 and c.num_blocks(0) == 2


def test_pointer_tables_are_persistent(rng):
    c = PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=2)
    c.append(0, _rows(rng, 2, 8), _rows(rng, 2, 8))
    k1, _ = c.block_pointers(0)
    c.append(0, _rows(rng, 1, 8), _rows(rng, 1, 8))
    k2, _ = c.block_pointers(0)
    assert k2[0] == k1[0]  # an existing block keeps its address
    assert np.shares_memory(k1, k2)  # the table is not rebuilt unless it must grow


def test_capacity_limit_writes_nothing(rng):
    c = PagedKVCache(num_layers=1, num_kv_heads=2, head_dim=8, block_size=4, max_tokens=6,
                     dtype="float32")
    k = _rows(rng, 5)
    c.append(0, k, k)
    with pytest.raises(hybrid.CacheCapacityError, match="max_tokens=6"):
        c.append(0, _rows(rng, 2), _rows(rng, 2))
    assert c.layer_len(0) == 5 and c.num_blocks(0) == 2
    np.testing.assert_array_equal(c.dense(0)[0], k)
    c.append(0, _rows(rng, 1), _rows(rng, 1))
    assert c.layer_len(0) == 6


def test_poison_marks_unused_slots(rng):
    c = PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=4, poison_unused=True)
    c.append(0, _rows(rng, 5, 8), _rows(rng, 5, 8))
    kb, vb = c.blocks(0)
    assert np.all(np.isnan(kb[1][:, 1:])) and np.all(np.isfinite(kb[1][:, :1]))


@pytest.mark.parametrize("kwargs,match", [
    (dict(dtype="bfloat16"), "KV dtype"),
    (dict(block_size=0), "block_size"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(placement=["cpu"]), "placement list has 1 entries for 2 layers"),
    (dict(placement="gpu"), "accepted forms"),
])
def test_bad_construction(kwargs, match):
    base = dict(num_layers=2, num_kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match=match):
        PagedKVCache(**{**base, **kwargs})


def test_cuda_cache_layer_reports_backend_reason():
    with pytest.raises(hybrid.NoBackendError, match="cuda"):
        PagedKVCache(num_layers=2, num_kv_heads=2, head_dim=8, placement=["cpu", "cuda:0"])
