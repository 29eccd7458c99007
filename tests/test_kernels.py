"""Row kernels (RMSNorm, RoPE, SwiGLU, add, linear) against the float64 reference."""

import numpy as np
import pytest

import hybrid
from hybrid import ops
from hybrid import reference as ref
from conftest import rel_err


@pytest.mark.parametrize("rows,dim", [(1, 64), (1, 576), (7, 80), (33, 4096), (300, 128)])
def test_rmsnorm(rng, rows, dim):
    x = rng.standard_normal((rows, dim), dtype=np.float32) * 3
    w = rng.standard_normal(dim, dtype=np.float32)
    eps = 1e-5
    assert rel_err(ops.rmsnorm(x, w, eps), ref.rmsnorm(x, w, eps)) < 2e-6


def test_rmsnorm_in_place_zero_and_tiny_rows(rng):
    x = np.zeros((3, 64), np.float32)
    x[1] = rng.standard_normal(64, dtype=np.float32) * 1e-3
    x[2] = rng.standard_normal(64, dtype=np.float32) * 1e3
    w = rng.standard_normal(64, dtype=np.float32)
    expect = ref.rmsnorm(x, w, 1e-6)
    out = ops.rmsnorm(x, w, 1e-6, out=x)
    assert out is x
    assert np.all(x[0] == 0)
    assert rel_err(x, expect) < 2e-6


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("rows,heads,head_dim", [(1, 1, 64), (5, 3, 80), (17, 8, 128), (2, 9, 2)])
def test_rope(rng, style, rows, heads, head_dim):
    x = rng.standard_normal((rows, heads * head_dim), dtype=np.float32)
    pos = rng.integers(0, 40000, rows)
    f = ref.rope_inv_freq(head_dim, 500000.0)
    got = ops.rope(x, pos, f, num_heads=heads, head_dim=head_dim, style=style)
    assert rel_err(got, ref.rope(x, pos, f, heads, head_dim, style)) < 2e-6
    # position 0 is the identity, and the two styles differ elsewhere
    zero = ops.rope(x, np.zeros(rows, int), f, num_heads=heads, head_dim=head_dim, style=style)
    np.testing.assert_array_equal(zero, x)


def test_rope_angle_table_is_shared_only_for_equal_inputs(rng):
    """The CPU backend keeps the last positions' cos/sin table for the next call (the other
    layers of a step, K after Q): the same bits as a table formed afresh, and never reused for
    other positions, other frequencies or another row count."""
    from hybrid._cpu import backend

    def direct(x, pos, f, heads, d):
        backend._rope_last = None  # nothing to reuse: the angles are formed for this call
        return ops.rope(x, pos, f, num_heads=heads, head_dim=d)

    x = rng.standard_normal((7, 3 * 64), dtype=np.float32)
    f1, f2 = ref.rope_inv_freq(64, 10000.0), ref.rope_inv_freq(64, 500000.0)
    p1 = rng.integers(0, 9000, 7)
    p2 = p1.copy()
    p2[3] += 1  # one position differs
    for pos, f, rows in [(p1, f1, 7), (p1, f1, 7), (p2, f1, 7), (p2, f2, 7), (p2[:5], f2, 5),
                         (p1, f1, 7)]:
        got = ops.rope(x[:rows], pos, f, num_heads=3, head_dim=64)
        np.testing.assert_array_equal(got, direct(x[:rows], pos, f, 3, 64))
    k = rng.standard_normal((7, 64), dtype=np.float32)  # K after Q: one head, same positions
    np.testing.assert_array_equal(ops.rope(k, p1, f1, num_heads=1, head_dim=64),
                                  direct(k, p1, f1, 1, 64))


def test_rope_styles_are_different_rotations(rng):
    x = rng.standard_normal((1, 64), dtype=np.float32)
    f = ref.rope_inv_freq(64, 10000.0)
    a = ops.rope(x, [5], f, num_heads=1, head_dim=64, style="neox")
    b = ops.rope(x, [5], f, num_heads=1, head_dim=64, style="gptj")
    assert rel_err(a, b) > 1e-2


@pytest.mark.parametrize("head_dim", [63, 1, 0])
def test_rope_rejects_odd_head_dim(rng, head_dim):
    x = np.zeros((1, 2 * max(head_dim, 1)), np.float32)
    with pytest.raises(ValueError, match="even head_dim"):
        ops.rope(x, [0], np.ones(max(head_dim // 2, 1)), num_heads=2, head_dim=head_dim)
    with pytest.raises(ValueError, match="even head_dim"):
        hybrid.DecoderConfig(hidden_size=2 * 63, num_heads=2, head_dim=63)


@pytest.mark.parametrize("n", [1, 7, 1536, 16384 * 3 + 5])
def test_swiglu(rng, n):
    g = rng.standard_normal(n, dtype=np.float32) * 6
    u = rng.standard_normal(n, dtype=np.float32)
    g[:1] = -100.0  # deep negative: silu -> 0 without overflow trouble
    assert rel_err(ops.swiglu(g, u), ref.swiglu(g, u)) < 2e-6


@pytest.mark.parametrize("shape", [(1, 5), (3, 576), (70, 1000)])
def test_add(rng, shape):
    a = rng.standard_normal(shape, dtype=np.float32)
    b = rng.standard_normal(shape, dtype=np.float32)
    np.testing.assert_array_equal(ops.add(a, b), a + b)


@pytest.mark.parametrize("rows,fin,fout", [(1, 64, 96), (5, 576, 192), (37, 80, 33)])
def test_linear(rng, rows, fin, fout):
    x = rng.standard_normal((rows, fin), dtype=np.float32)
    w = rng.standard_normal((fout, fin), dtype=np.float32)
    b = rng.standard_normal(fout, dtype=np.float32)
    assert rel_err(ops.linear(x, w), ref.linear(x, w)) < 1e-5
    assert rel_err(ops.linear(x, w, b), ref.linear(x, w, b)) < 1e-5


def test_ops_convert_without_touching_inputs(rng):
    x64 = rng.standard_normal((4, 128))
    strided = rng.standard_normal((4, 256), dtype=np.float32)[:, ::2]
    keep64, keep_s = x64.copy(), strided.copy()
    w = np.ones(128, np.float32)
    assert rel_err(ops.rmsnorm(x64, w, 1e-6), ref.rmsnorm(x64, w, 1e-6)) < 2e-6
    assert rel_err(ops.rmsnorm(strided, w, 1e-6), ref.rmsnorm(strided, w, 1e-6)) < 2e-6
    np.testing.assert_array_equal(x64, keep64)
    np.testing.assert_array_equal(strided, keep_s)
    with pytest.raises(TypeError, match="floating-point"):
        ops.rmsnorm(np.ones((2, 128), np.int32), w, 1e-6)
    with pytest.raises(TypeError, match="out must be"):
        ops.rmsnorm(keep_s, w, 1e-6, out=np.empty((4, 128), np.float64))


# ------------------------------------------------------------------ float32 prefill GEMM
from hybrid._cpu import quant as _qk  # noqa: E402

needs_gemm_f32 = pytest.mark.skipif(not _qk.GEMM_F32, reason="this build has no float32 GEMM "
                                                          "(BLAS serves float32 prompts)")


def _f32_linear_case(rng, rows, fin, fout):
    """Random x [rows, fin], w [fout, fin], bias [fout] and a NaN-filled out [rows, fout]."""
    return (rng.standard_normal((rows, fin), dtype=np.float32),
            rng.standard_normal((fout, fin), dtype=np.float32),
            rng.standard_normal(fout, dtype=np.float32),
            np.full((rows, fout), np.nan, np.float32))


def _f32_err(got, x, w, b=None):
    """max over outputs of |got - float64 product| / (|x| @ |w|.T + |b|): each output's error
    against the scale of its own sum, which cancellation cannot make small (max |ref| can: one
    output of 1.05 * -1.67 + 1.77 is 0.008, and a correct 1x1 product failed a bound on it)."""
    scale = ref.linear(np.abs(x), np.abs(w), None if b is None else np.abs(b))
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref.linear(x, w, b)) / scale))


# float32 sums, against the scale of each sum: ten float32 ulps.  The mat-vec and the GEMM at
# every size below measured at most 1.9e-7 over 200 seeds; a term dropped, or weights rounded to
# float16 on the way, is 1e-5 or more.
F32_SUM_BOUND = 6e-7


# sizes at and around the 4-row x 6-weight tile, the 16-lane vector and the 768-value pass
@needs_gemm_f32
@pytest.mark.parametrize("rows,fin,fout", [(1, 1, 1), (3, 15, 5), (4, 16, 6), (5, 17, 7),
                                           (7, 767, 13), (9, 768, 49), (17, 769, 96),
                                           (100, 1537, 53), (256, 576, 97)])
def test_gemm_f32_against_float64(rng, rows, fin, fout):
    x, w, b, out = _f32_linear_case(rng, rows, fin, fout)
    _qk.gemm_f32(w, x, b, out, 2)
    assert _f32_err(out, x, w, b) < F32_SUM_BOUND
    _qk.gemm_f32(w, x, None, out, 2)
    assert _f32_err(out, x, w) < F32_SUM_BOUND


@needs_gemm_f32
def test_gemm_f32_rows_do_not_depend_on_the_batch_or_threads(rng):
    """Each output is summed in one fixed order: a row alone, in any batch and on any number
    of threads gives the same bits (the prompt-side half of batch invariance for float32)."""
    fin, fout = 1541, 203
    x = rng.standard_normal((29, fin), dtype=np.float32)
    w = rng.standard_normal((fout, fin), dtype=np.float32)
    full = np.empty((29, fout), np.float32)
    _qk.gemm_f32(w, x, None, full, 2)
    for lo, hi, threads in [(0, 1, 1), (3, 4, 2), (5, 12, 1), (13, 29, 2), (28, 29, 2)]:
        part = np.empty((hi - lo, fout), np.float32)
        _qk.gemm_f32(w, np.ascontiguousarray(x[lo:hi]), None, part, threads)
        np.testing.assert_array_equal(part, full[lo:hi])


@pytest.mark.parametrize("rows,fin,fout", [(1, 1, 1), (1, 2049, 1031), (3, 576, 2000),
                                           (16, 17, 300)])
def test_matvec_f32_against_float64_and_across_threads(rng, rows, fin, fout):
    """The float32 decode mat-vec: within float32 rounding of the float64 product, and the same
    bits on 1, 2, 3 and 5 threads, run after run (its rows are claimed in pieces by the threads,
    as the quantized formats' are: which thread serves a row changes, its sums never do), for a
    row alone and whichever weight rows share a pass."""
    x, w, b, want = _f32_linear_case(rng, rows, fin, fout)
    _qk.matvec_f32(w, x, b, want, 1)
    assert _f32_err(want, x, w, b) < F32_SUM_BOUND
    for threads in (2, 3, 5, 2, 3, 5):
        got = np.full((rows, fout), np.nan, np.float32)
        _qk.matvec_f32(w, x, b, got, threads)
        np.testing.assert_array_equal(got, want)
    _qk.matvec_f32(w, x, None, got, 2)
    assert _f32_err(got, x, w) < F32_SUM_BOUND
    # a row alone, and weight rows taken in other groups (passes of four, then one by one)
    one = np.full((1, fout - 1), np.nan, np.float32)
    _qk.matvec_f32(w[1:], x[rows - 1:], b[1:], one, 2)
    np.testing.assert_array_equal(one[0], want[rows - 1, 1:])


@needs_gemm_f32
def test_gemm_f32_writes_a_column_slice_and_rejects_bad_shapes(rng):
    x = rng.standard_normal((6, 40), dtype=np.float32)
    w = rng.standard_normal((10, 40), dtype=np.float32)
    big = np.full((6, 30), 7.0, np.float32)
    _qk.gemm_f32(w, x, None, big[:, 5:15], 2)
    assert rel_err(big[:, 5:15], ref.linear(x, w)) < 4e-6
    assert np.all(big[:, :5] == 7.0) and np.all(big[:, 15:] == 7.0)
    with pytest.raises(ValueError, match="do not fit"):
        _qk.gemm_f32(w, x, None, np.empty((6, 11), np.float32), 2)
    with pytest.raises(ValueError, match="bias has 3 entries"):
        _qk.gemm_f32(w, x, np.ones(3, np.float32), np.empty((6, 10), np.float32), 2)
    with pytest.raises(ValueError, match="contiguous"):
        _qk.gemm_f32(w, x, None, np.empty((6, 20), np.float32)[:, ::2], 2)
