"""Paged attention (single sequence and batched decode) against the float64 reference.

Unused slots of partially filled blocks are NaN (the cache's poison_unused mode), so a kernel
that reads past a sequence's length, or a block it was not given, produces NaN and fails.
"""

import numpy as np
import pytest

import hybrid
from hybrid import ops
from hybrid import reference as ref
from conftest import rel_err

TOL = {"float32": 2e-5, "float16": 2e-5, "q8_0": 2e-5}  # against the reference on the *stored* values
Q8 = ["float32", "float16", "q8_0"]  # q8_0: ggml's 8-bit blocks, head_dim % 32 == 0


def _cache(kvh, d, bs, dtype, layers=1):
    if dtype == "q8_0" and d % 32:
        pytest.skip("q8_0 rows need head_dim % 32 == 0")
    return hybrid.PagedKVCache(num_layers=layers, num_kv_heads=kvh, head_dim=d, block_size=bs,
                               dtype=dtype, poison_unused=True)


def _fill(cache, rng, n, layer=0):
    k = rng.standard_normal((n, cache.kv_dim), dtype=np.float32)
    v = rng.standard_normal((n, cache.kv_dim), dtype=np.float32)
    cache.append(layer, k, v)
    return k, v


BS = 16
LENGTHS = [1, BS, BS + 1, 3 * BS + 5]


def _after_history(rng, dtype, kvh, group, d, past, n, q_scale=1.0):
    """A cache holding `past` committed tokens plus `n` appended ones, queries for those n rows,
    and (hybrid's attention, the float64 reference on the stored values)."""
    cache = _cache(kvh, d, BS, dtype)
    if past:
        _fill(cache, rng, past)
        cache.commit(past)
    _fill(cache, rng, n)
    q = rng.standard_normal((n, kvh * group * d), dtype=np.float32) * q_scale
    kb, vb = cache.blocks(0)
    return (cache, q, ops.paged_attention(q, cache, 0),
            ref.paged_attention(q, kb, vb, past, kvh * group, kvh, d, kv_dtype=dtype))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", LENGTHS)
def test_prefill_from_empty(rng, dtype, head_dim, group, n):
    kvh = 3 if group <= 2 else 1  # odd KV head counts too
    h = kvh * group
    cache = _cache(kvh, head_dim, BS, dtype)
    _fill(cache, rng, n)
    q = rng.standard_normal((n, h * head_dim), dtype=np.float32)
    got = ops.paged_attention(q, cache, 0)
    kb, vb = cache.blocks(0)
    assert rel_err(got, ref.paged_attention(q, kb, vb, 0, h, kvh, head_dim, kv_dtype=dtype)) < TOL[dtype]


@pytest.mark.parametrize("dtype", Q8)
@pytest.mark.parametrize("past,n", [(1, 1), (BS - 1, 1), (BS, BS + 1), (3 * BS + 5, 1),
                                    (3 * BS + 5, 7), (2 * BS, BS)])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_after_committed_history(rng, dtype, past, n, group):
    _, _, got, expect = _after_history(rng, dtype, 2, group, 64, past, n)
    assert rel_err(got, expect) < TOL[dtype]


@pytest.mark.parametrize("dtype", Q8)
@pytest.mark.parametrize("kvh,group,length", [(1, 8, 3000), (1, 1, 1111), (2, 4, 4097)])
@pytest.mark.parametrize("n", [1, 3])
def test_long_context_uses_splits(rng, dtype, kvh, group, length, n):
    """Few KV heads at long context: the key range is split across threads and merged."""
    hybrid.set_num_threads(2)
    cache, q, got, expect = _after_history(rng, dtype, kvh, group, 128, length - n, n, q_scale=2)
    assert rel_err(got, expect) < TOL[dtype]
    # the same answer on one thread (no splits)
    hybrid.set_num_threads(1)
    try:
        one = ops.paged_attention(q, cache, 0)
    finally:
        hybrid.set_num_threads(None)
    assert rel_err(one, expect) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("head_dim,group", [(24, 1), (40, 3), (72, 4), (8, 8)])
def test_head_dims_on_the_avx2_path(rng, dtype, head_dim, group):
    """head_dim a multiple of 8 but not of 16: the AVX2 micro-kernels even on AVX-512 builds."""
    kvh = 2
    for past, n in [(0, 2 * BS + 3), (3 * BS + 5, 1)]:
        _, _, got, expect = _after_history(rng, dtype, kvh, group, head_dim, past, n)
        assert rel_err(got, expect) < TOL[dtype]


def _each_row_alone(cache, q, past, dtype):
    """The attention of each of q's rows (positions past, past+1, ...) as a decode step alone:
    a fresh cache holding the same stored keys and values up to the row (float16 and q8_0
    round-trip exactly)."""
    k, v = cache.dense(0)
    alone = np.empty((q.shape[0], q.shape[1]), np.float32)
    for i in range(q.shape[0]):
        single = _cache(cache.num_kv_heads, cache.head_dim, BS, dtype)
        single.append(0, k[:past + i + 1].astype(np.float32), v[:past + i + 1].astype(np.float32))
        single.commit(past + i)
        alone[i] = ops.paged_attention(q[i:i + 1], single, 0)[0]
    return alone


@pytest.mark.parametrize("dtype", Q8)
@pytest.mark.parametrize("group,head_dim", [(1, 64), (3, 64), (4, 128), (6, 80)])
def test_a_row_does_not_depend_on_its_neighbours(rng, dtype, group, head_dim):
    """Each query row's output is bit-identical whether the row is computed inside a prefill
    chunk (where the kernels group query vectors of several rows per pass) or alone as a decode
    step: the batch invariance the engine promises starts here."""
    kvh, past, n = 2, 2 * BS + 3, 2 * BS + 7
    hybrid.set_num_threads(1)  # no split of the key range: one reduction order per row
    try:
        cache, q, together, _ = _after_history(rng, dtype, kvh, group, head_dim, past, n)
        alone = _each_row_alone(cache, q, past, dtype)
    finally:
        hybrid.set_num_threads(None)
    np.testing.assert_array_equal(alone, together)


@pytest.mark.parametrize("dtype", Q8)
def test_a_sequences_few_verify_rows_spread_over_the_threads(rng, dtype):
    """A few rows of one sequence at short context (a speculative verify step) would be one
    task over every KV head, leaving the other threads idle: each task then takes one head and,
    where three heads would split 2:1 over two threads, part of the rows; every (row, head) is
    one task's, and every row keeps the bits it gets alone as a decode step."""
    from hybrid._cpu import attention

    kvh, group, d, past, n = 3, 3, 64, 197, 3
    tasks, threads = attention.plan(n, past, num_kv_heads=kvh, group=group, block_size=BS,
                                    num_threads=2)
    assert threads == 2 and len(tasks) > kvh
    assert all(t[4] - t[3] == 1 for t in tasks)
    cover = sorted((r, g) for t in tasks for r in range(t[0], t[1]) for g in range(t[3], t[4]))
    assert cover == [(r, g) for r in range(n) for g in range(kvh)]
    hybrid.set_num_threads(2)
    try:
        cache, q, together, expect = _after_history(rng, dtype, kvh, group, d, past, n)
        alone = _each_row_alone(cache, q, past, dtype)
    finally:
        hybrid.set_num_threads(None)
    np.testing.assert_array_equal(alone, together)
    assert rel_err(together, expect) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("head_dim,group", [(4, 1), (36, 4), (100, 3), (2, 8)])
def test_head_dims_off_the_simd_path(rng, dtype, head_dim, group):
    """head_dim not a multiple of 8 runs the portable C path (what HYBRID_PORTABLE builds run)."""
    kvh = 2
    for past, n in [(0, BS + 1), (3 * BS + 5, 1)]:
        _, _, got, expect = _after_history(rng, dtype, kvh, group, head_dim, past, n)
        assert rel_err(got, expect) < TOL[dtype]


@pytest.mark.parametrize("bs", [1, 3, 16, 32, 64])
def test_block_sizes(rng, bs):
    kvh, group, d, n = 2, 2, 64, 2 * 32 + 3
    cache = _cache(kvh, d, bs, "float32")
    _fill(cache, rng, n)
    q = rng.standard_normal((n, kvh * group * d), dtype=np.float32)
    kb, vb = cache.blocks(0)
    got = ops.paged_attention(q, cache, 0)
    assert rel_err(got, ref.paged_attention(q, kb, vb, 0, kvh * group, kvh, d)) < 2e-5


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_scores_with_large_dynamic_range(rng, dtype, group):
    """Online softmax must rescale correctly when a later block holds a much larger score.  Each
    query head of the GQA group has its own dominant key (score near 320, far past the 88 where
    float32's exp overflows, so exp overflows unless every head's running max is its own), in
    different blocks; the other keys score about +-1.  The dominant keys are orthogonal, so no
    head sees another head's dominant key: with random ones, two of them could score 490.5 and
    490.1 for a third head, where float32's rounding of such scores (1e-4) moves the softmax
    weights by more than the bound (seen in the portable build, 3.6e-5)."""
    kvh, d, n = 1, 64, 200
    cache = _cache(kvh, d, BS, dtype)
    k = rng.standard_normal((n, d), dtype=np.float32)
    dominant = [70 + 17 * h for h in range(group)]
    basis = np.linalg.qr(rng.standard_normal((d, group)))[0]  # [d, group] orthonormal columns
    k[dominant] = (320 * basis.T).astype(np.float32)  # norm 320: 40x a typical key's
    v = rng.standard_normal((n, d), dtype=np.float32)
    cache.append(0, k, v)
    kb, vb = cache.blocks(0)
    stored = ref.gather_blocks(kb, n).reshape(n, d).astype(np.float32)  # the keys as the cache holds them
    q = np.concatenate([np.tile(stored[p] / 40, (n, 1)) for p in dominant], axis=1)
    got = ops.paged_attention(q.astype(np.float32), cache, 0)
    assert np.isfinite(got).all()
    # worst seen over 150 seeds x every case, in the AVX-512, AVX2 and portable builds: 4.7e-7
    assert rel_err(got, ref.paged_attention(q, kb, vb, 0, group, kvh, d)) < 5e-6


def test_scale_argument(rng):
    cache = _cache(1, 64, BS, "float32")
    _fill(cache, rng, 20)
    q = rng.standard_normal((20, 64), dtype=np.float32)
    kb, vb = cache.blocks(0)
    got = ops.paged_attention(q, cache, 0, scale=0.3)
    assert rel_err(got, ref.paged_attention(q, kb, vb, 0, 1, 1, 64, scale=0.3)) < 2e-5


def _decode_rows(rng, caches, num_heads):
    """q, k, v for one decode row per cache."""
    c0 = caches[0]
    return (rng.standard_normal((len(caches), num_heads * c0.head_dim), dtype=np.float32),
            rng.standard_normal((len(caches), c0.kv_dim), dtype=np.float32),
            rng.standard_normal((len(caches), c0.kv_dim), dtype=np.float32))


def _decode_step(caches, q, k, v):
    """One decode row per cache (caches over one pool) through the ragged step: row b's K/V are
    written after cache b's history and its query attends over them.  Commits; returns out."""
    from hybrid.registry import lookup
    from hybrid.step import StepBatch

    batch = StepBatch.plan([(c, 1) for c in caches])
    out = np.empty_like(q)
    num_heads = q.shape[1] // caches[0].head_dim
    lookup("attend_step", hybrid.Placement.parse("cpu"))(
        batch, 0, q, k, v, num_heads, 1.0 / np.sqrt(caches[0].head_dim), out)
    batch.wrote_layer(0)
    batch.commit()
    return out


def _shared(kvh, d, dtype, lengths, rng):
    """Caches over one pool (NaN in every unused slot), holding ``lengths`` committed tokens."""
    pool = hybrid.KVBlockPool(1, kvh, d, BS, dtype, poison_unused=True)
    caches = []
    for length in lengths:
        c = hybrid.PagedKVCache.on(pool)
        if length:
            _fill(c, rng, length)
            c.commit(length)
        caches.append(c)
    return caches


@pytest.mark.parametrize("dtype", Q8)
@pytest.mark.parametrize("group", [1, 3, 8])
def test_batched_decode(rng, dtype, group):
    """One decode row for each of six sequences of awkward lengths in one ragged step, against
    the float64 reference walking each sequence's blocks, and each row against the
    single-sequence kernel on the same cache."""
    kvh, d = 2, 96 if dtype == "q8_0" else 80
    h = kvh * group
    lengths = [1, BS, BS + 1, 3 * BS + 5, 200, 7]
    caches = _shared(kvh, d, dtype, [n - 1 for n in lengths], rng)
    q, k, v = _decode_rows(rng, caches, h)
    got = _decode_step(caches, q, k, v)
    blocks = [c.blocks(0) for c in caches]
    expect = ref.paged_attention_batch(q, [b[0] for b in blocks], [b[1] for b in blocks],
                                       lengths, h, kvh, d, kv_dtype=dtype)
    assert rel_err(got, expect) < TOL[dtype]
    for b, c in enumerate(caches):  # the single-sequence kernel on the same cache
        c.truncate(lengths[b] - 1)
        c.append(0, k[b:b + 1], v[b:b + 1])
        assert rel_err(got[b:b + 1], ops.paged_attention(q[b:b + 1], c, 0)) < 1e-6


def test_batched_decode_long_and_short_mixed(rng):
    kvh, group, d = 1, 4, 128
    caches = _shared(kvh, d, "float16", [2499, 2], rng)
    q, k, v = _decode_rows(rng, caches, kvh * group)
    got = _decode_step(caches, q, k, v)
    blocks = [c.blocks(0) for c in caches]
    expect = ref.paged_attention_batch(q, [b[0] for b in blocks], [b[1] for b in blocks],
                                       [2500, 3], kvh * group, kvh, d)
    assert rel_err(got, expect) < TOL["float16"]


def test_float16_cache_stores_rounded_values(rng):
    """The f16 path reads exactly what was stored: compare against float64 on the f32 inputs with
    a bound that f16 rounding (2^-11 relative) respects, and that a wrong conversion would not."""
    kvh, d, n = 2, 64, 40
    c16 = _cache(kvh, d, BS, "float16")
    k, v = _fill(c16, rng, n)
    q = rng.standard_normal((n, 4 * d), dtype=np.float32)
    got = ops.paged_attention(q, c16, 0)
    expect = ref.attention(q, k, v, np.arange(n), 4, kvh, d)
    err = rel_err(got, expect)
    assert 0 < err < 5e-3


def test_long_context_single_kv_head_is_split_across_threads():
    """2+ threads stay busy with one KV head at long context: the key range is split."""
    from hybrid._cpu import attention

    tasks, threads = attention.plan(1, 4095, num_kv_heads=1, group=8, block_size=16,
                                    num_threads=2)
    assert threads == 2 and len(tasks) >= 4
    assert tasks[0, 5] == 0 and tasks[-1, 6] == 4096  # the splits cover every key
    assert np.all(tasks[1:, 5] == tasks[:-1, 6]) and np.all(tasks[:, 5] % 16 == 0)
    # decode over many KV heads: one task per split covers all heads (whole blocks stream)
    tasks, _ = attention.plan(1, 16383, num_kv_heads=8, group=4, block_size=16, num_threads=2)
    assert np.all(tasks[:, 3] == 0) and np.all(tasks[:, 4] == 8)
    # a tiny problem runs on the calling thread
    _, threads = attention.plan(1, 10, num_kv_heads=2, group=2, block_size=16, num_threads=2)
    assert threads == 1


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("length", [1, 300, 700, 3001])
def test_a_sequence_does_not_depend_on_the_others_in_its_batch(rng, dtype, length):
    """A sequence's decode row is bit-identical alone and in a step with 15 others on two
    threads: how its key range is split across threads depends on its own length only."""
    kvh, group, d = 2, 4, 64
    lengths = [length - 1] + [int(x) for x in rng.integers(5, 60, 15)]
    seed = int(rng.integers(1 << 30))
    hybrid.set_num_threads(2)
    try:
        outs = []
        for n in (1, len(lengths)):  # the same data alone, then in the crowd
            data = np.random.default_rng(seed)
            caches = _shared(kvh, d, dtype, lengths, data)
            q, k, v = _decode_rows(data, caches, kvh * group)
            outs.append(_decode_step(caches[:n], q[:n], k[:n], v[:n]))
    finally:
        hybrid.set_num_threads(None)
    np.testing.assert_array_equal(outs[0][0], outs[1][0])


def _ragged(rng, dtype, n, d=64, kvh=2, group=2):
    from hybrid.step import StepBatch

    cache = _cache(kvh, d, BS, dtype)
    batch = StepBatch.plan([(cache, n)])
    q = rng.standard_normal((n, kvh * group * d), dtype=np.float32)
    return cache, batch, q


def test_step_writes_float16_rows_rounded_as_numpy_does(rng):
    """K/V rows are converted to float16 in C when a step writes them: the same bits as
    NumPy's astype (round to nearest even, subnormals, overflow to inf, signed zeros)."""
    from hybrid.registry import lookup

    n, d = 37, 64
    cache, batch, q = _ragged(rng, "float16", n, d)
    special = np.array([0.0, -0.0, 65504.0, 65520.0, 65519.99, -1e9, np.inf, -np.inf, 6e-8,
                        3e-8, 2.98e-8, 1e-5, -6.1e-5, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11,
                        0.1, 2 ** -24, 2 ** -25, 3 * 2 ** -25], dtype=np.float32)
    k = (rng.standard_normal((n, cache.kv_dim)) * np.float32(10.0) ** rng.integers(
        -9, 5, (n, cache.kv_dim))).astype(np.float32)
    k.flat[:special.size] = special
    v = -k[::-1].copy()
    out = np.empty_like(q)
    lookup("attend_step", hybrid.Placement.parse("cpu"))(batch, 0, q, k, v, 4, 0.125, out)
    batch.wrote_layer(0)
    batch.commit()
    ks, vs = cache.dense(0)
    with np.errstate(over="ignore"):  # the values past 65504 are meant to become inf
        k16, v16 = k.astype(np.float16), v.astype(np.float16)
    np.testing.assert_array_equal(ks.view(np.uint16), k16.view(np.uint16))
    np.testing.assert_array_equal(vs.view(np.uint16), v16.view(np.uint16))


def test_ragged_step_rejects_bad_descriptions(rng):
    from hybrid._cpu import attention

    cache, batch, q = _ragged(rng, "float32", 5)
    args = [batch.positions, batch.seg_rows, batch.seg_table, batch.table_ids, batch.row_block,
            batch.row_slot, 4, 2, 64, BS, cache.head_stride, False, 0.125, 1]
    plan = attention.RaggedStep(*args)
    bad = list(args)
    bad[4] = batch.row_block + 1  # a row stored in a block its position does not name
    with pytest.raises(ValueError, match="not stored where its position puts it"):
        attention.RaggedStep(*bad)
    bad = list(args)
    bad[3] = batch.table_ids[:0]  # no blocks for the rows
    with pytest.raises(ValueError, match="blocks from table offset"):
        attention.RaggedStep(*bad)
    bad = list(args)
    bad[6], bad[7] = 3, 2  # heads not a multiple of the KV heads
    with pytest.raises(ValueError, match="inconsistent heads"):
        attention.RaggedStep(*bad)
    k = np.zeros((5, cache.kv_dim), np.float32)
    out = np.zeros_like(q)
    short = np.zeros(int(batch.table_ids.max()), np.int64)  # misses the step's last block
    with pytest.raises(ValueError, match="address tables hold"):
        plan.layer(q, k, k, short, short, out)
    with pytest.raises(ValueError, match="planned T"):
        plan.layer(q[:4], k[:4], k[:4], cache.pool.k_addr[0], cache.pool.v_addr[0], out[:4])
    assert not out.any()  # nothing was written


@pytest.mark.parametrize("dtype", Q8)
@pytest.mark.parametrize("head_dim,group", [(64, 4), (40, 3), (8, 1), (128, 8)])
@pytest.mark.parametrize("window", [1, 7, BS, BS + 3, 10_000])
def test_sliding_window(rng, dtype, head_dim, group, window):
    """Each row sees only the last `window` positions: prefill rows, rows after a history, and
    long-context decode rows whose key range is split across threads."""
    kvh = 2
    h = kvh * group
    for past, n in [(0, 3 * BS + 5), (2 * BS + 3, 9), (3000, 1)]:
        cache = _cache(kvh, head_dim, BS, dtype)
        if past:
            _fill(cache, rng, past)
            cache.commit(past)
        _fill(cache, rng, n)
        q = rng.standard_normal((n, h * head_dim), dtype=np.float32) * 2
        kb, vb = cache.blocks(0)
        want = ref.paged_attention(q, kb, vb, past, h, kvh, head_dim, window=window, kv_dtype=dtype)
        got = ops.paged_attention(q, cache, 0, window=window)
        assert rel_err(got, want) < TOL[dtype], (past, n)
        hybrid.set_num_threads(1)
        try:
            assert np.array_equal(ops.paged_attention(q, cache, 0, window=window), got) \
                or rel_err(ops.paged_attention(q, cache, 0, window=window), want) < TOL[dtype]
        finally:
            hybrid.set_num_threads(None)
    with pytest.raises(ValueError, match="window must be an integer >= 0"):
        ops.paged_attention(q, cache, 0, window=-1)


@pytest.mark.parametrize("dtype", Q8)
@pytest.mark.parametrize("head_dim,group", [(64, 2), (40, 1), (128, 8)])
@pytest.mark.parametrize("window", [0, 5])
def test_score_softcapping(rng, dtype, head_dim, group, window):
    """Gemma 2's capped scores (softcap * tanh(s / softcap)), alone and with a window, for
    prefill rows, rows after a history and split long-context decode rows."""
    kvh, cap = 2, 3.0
    h = kvh * group
    for past, n in [(0, 2 * BS + 5), (BS + 3, 6), (2500, 1)]:
        cache = _cache(kvh, head_dim, BS, dtype)
        if past:
            _fill(cache, rng, past)
            cache.commit(past)
        _fill(cache, rng, n)
        q = rng.standard_normal((n, h * head_dim), dtype=np.float32) * 3  # scores past the cap
        kb, vb = cache.blocks(0)
        want = ref.paged_attention(q, kb, vb, past, h, kvh, head_dim, window=window, softcap=cap,
                                   kv_dtype=dtype)
        got = ops.paged_attention(q, cache, 0, window=window, softcap=cap)
        assert rel_err(got, want) < TOL[dtype], (past, n)
        uncapped = ref.paged_attention(q, kb, vb, past, h, kvh, head_dim, window=window,
                                       kv_dtype=dtype)
        assert rel_err(uncapped, want) > 1e-2  # the cap matters at these scores


def test_q8_0_cache_stores_ggml_blocks(rng):
    """A q8_0 cache holds each row as gguf.quants quantizes it to Q8_0 (bit for bit), whether the
    rows arrive by append or by a step's native write; unused slots stay poisoned."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    from hybrid.registry import lookup

    n, d, kvh = 37, 64, 2
    k = (rng.standard_normal((n, kvh * d)) * np.float32(10.0) ** rng.integers(
        -3, 3, (n, 1))).astype(np.float32)
    k[3] = 0  # an all-zero block
    k[4, :32] = [127.0] + [i + 0.5 for i in range(-15, 16)]  # factor 1, halves: away from 0
    v = -k[::-1].copy()
    want_k = quants.quantize(k.reshape(n * kvh, d), gguf.GGMLQuantizationType.Q8_0)
    want_v = quants.quantize(v.reshape(n * kvh, d), gguf.GGMLQuantizationType.Q8_0)
    appended = _cache(kvh, d, BS, "q8_0")
    appended.append(0, k, v)
    cache, batch, q = _ragged(rng, "q8_0", n, d)
    out = np.empty_like(q)
    lookup("attend_step", hybrid.Placement.parse("cpu"))(batch, 0, q, k, v, 4, 0.125, out)
    batch.wrote_layer(0)
    batch.commit()
    for c in (appended, cache):
        st = c.pool.storages[0]
        raw_k = np.concatenate([st.block_arrays(b)[0].transpose(1, 0, 2)
                                for b in c.block_ids]).reshape(-1, kvh, d // 32 * 34)
        raw_v = np.concatenate([st.block_arrays(b)[1].transpose(1, 0, 2)
                                for b in c.block_ids]).reshape(-1, kvh, d // 32 * 34)
        np.testing.assert_array_equal(raw_k[:n].reshape(n * kvh, -1), want_k)
        np.testing.assert_array_equal(raw_v[:n].reshape(n * kvh, -1), want_v)
        assert (raw_k[n:] == 0xFF).all()  # poisoned: every factor a float16 NaN
        ks, vs = c.dense(0)
        np.testing.assert_array_equal(ks, quants.dequantize(
            want_k, gguf.GGMLQuantizationType.Q8_0).reshape(n, kvh * d))


@pytest.mark.parametrize("bs", [5, 8, 32])
@pytest.mark.parametrize("head_dim,group", [(32, 4), (96, 3), (160, 1)])
def test_q8_0_block_sizes(rng, bs, head_dim, group):
    """A q8_0 block stores each head's factors and values by plane, with strides of block_size
    (kv_q8.h): block sizes that are not the default 16, with rows that see part of a block, a
    prompt, one decode row and a sliding window, unused slots poisoned."""
    kvh, past = 2, 3 * bs + 2
    cache = _cache(kvh, head_dim, bs, "q8_0")
    _fill(cache, rng, past)
    cache.commit(past)
    for n, window in [(2 * bs + 3, 0), (1, 0), (bs + 1, bs - 2)]:
        _fill(cache, rng, n)
        q = rng.standard_normal((n, kvh * group * head_dim), dtype=np.float32)
        kb, vb = cache.blocks(0)
        expect = ref.paged_attention(q, kb, vb, cache.seq_len, kvh * group, kvh, head_dim,
                                     window=window, kv_dtype="q8_0")
        got = ops.paged_attention(q, cache, 0, window=window)
        assert rel_err(got, expect) < TOL["q8_0"], (n, window)
        cache.commit(n)


def test_q8_0_cache_against_float64_on_the_inputs(rng):
    """Against float64 attention on the float32 inputs, q8_0 keys and values cost little more than
    ggml's own Q8_0 rounding of the keys, the values and the 8-bit queries does (gguf.quants
    rounds them; the bound comes from these inputs), which a wrong factor or row offset would
    exceed many times over."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    def q8(x):
        t = gguf.GGMLQuantizationType.Q8_0
        return quants.dequantize(quants.quantize(np.ascontiguousarray(x, np.float32), t), t)

    kvh, d, n = 2, 64, 70
    c8 = _cache(kvh, d, BS, "q8_0")
    k, v = _fill(c8, rng, n)
    q = rng.standard_normal((n, 4 * d), dtype=np.float32)
    got = ops.paged_attention(q, c8, 0)
    expect = ref.attention(q, k, v, np.arange(n), 4, kvh, d)
    scaled_q = q * np.float32(1 / np.sqrt(d))
    ggml_rounded = ref.attention(q8(scaled_q), q8(k), q8(v), np.arange(n), 4, kvh, d, scale=1.0)
    rounding = rel_err(ggml_rounded, expect)
    err = rel_err(got, expect)
    assert 0 < err < 1.25 * rounding + TOL["q8_0"], (err, rounding)
