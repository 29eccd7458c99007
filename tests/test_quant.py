"""Weight formats kept in their encoding: decoding bit for bit against gguf.quants (an oracle
written by others), every kernel against the float64 product of the decoded weights, the
quantizers against llama.cpp's reference error, and layers built on quantized weights."""

import os

import numpy as np
import pytest

import hybrid
from hybrid import ops, registry
from hybrid.quant import FORMATS, QuantizedTensor, dequantize, quantize
from hybrid._cpu import quant as kernels

gguf = pytest.importorskip("gguf", reason="gguf.quants is the independent oracle")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

NAMES = list(FORMATS)
INTEGER = [n for n, f in FORMATS.items() if f.integer]
QUANTIZABLE = [n for n, f in FORMATS.items() if f.quantizable]
# byte offsets of the float16 scale fields in each block (set to finite values; every other
# byte pattern is a valid block)
SCALE_FIELDS = {"q8_0": [0], "q4_0": [0], "q5_0": [0], "q4_1": [0, 2], "q5_1": [0, 2],
                "q4_k": [0, 2], "q5_k": [0, 2], "q6_k": [208], "q2_k": [80, 82], "q3_k": [108],
                "iq4_nl": [0], "iq4_xs": [0]}


def random_blocks(name: str, rows: int, n: int, rng) -> QuantizedTensor:
    fmt = FORMATS[name]
    if name == "float16":
        raw = rng.standard_normal((rows, n)).astype(np.float16).view(np.uint8)
    elif name == "bfloat16":
        bits = (rng.standard_normal((rows, n)).astype(np.float32).view(np.uint32) >> 16)
        raw = bits.astype(np.uint16).view(np.uint8)
    else:
        nb = n // fmt.block_values
        raw = rng.integers(0, 256, size=(rows, nb, fmt.block_bytes), dtype=np.uint8)
        for off in SCALE_FIELDS[name]:
            scale = (rng.standard_normal((rows, nb)) * 0.05).astype(np.float16)
            raw[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    return QuantizedTensor(np.ascontiguousarray(raw.reshape(rows, -1)), name, (rows, n))


def oracle(qt: QuantizedTensor) -> np.ndarray:
    if qt.format.name == "float16":
        return qt.data.view(np.float16).astype(np.float32)
    return gguf_dequantize(qt.data, T(qt.format.ggml_type)).reshape(qt.shape)


def widths(name):
    # 32 to 224: 1, 2, 3, 5 and 7 blocks of 32, so that the kernels stepping 4 blocks at a time
    # end on a partial step of each length, alone or after whole steps; 17 and 100 (formats of
    # single values only) end inside a 16-value half of the 32-value steps of the half kernels
    return [w for w in (256, 576, 1536, 4096, 32, 64, 96, 160, 224, 17, 100)
            if w % FORMATS[name].block_values == 0]


@pytest.mark.parametrize("name", NAMES)
def test_decoding_equals_gguf_bit_for_bit(name, rng):
    for n in widths(name):
        qt = random_blocks(name, 13, n, rng)
        want = oracle(qt)
        got = qt.dequantize()
        assert got.view(np.uint32).tobytes() == want.astype(np.float32).view(np.uint32).tobytes()
        assert np.array_equal(qt.dequantize(slice(3, 9)), want[3:9])
        ids = rng.integers(0, 13, size=5)
        assert np.array_equal(qt.rows(ids), want[ids])  # the embedding lookup


def _act_quantized(x, group=32):
    """What the integer kernels see of x, one scale per `group` values (a format's block): the
    8-bit values decoded (checked against x here) and the scale of each block of 32."""
    rows, n = x.shape
    qa = np.empty((rows, n), np.int8)
    da = np.empty((rows, n // 32), np.float32)
    sa = np.empty((rows, n // 32), np.float32)
    kernels.quantize_activations(x, qa, da, sa, group)
    amax = np.abs(x.reshape(rows, -1, group)).max(axis=2).repeat(group // 32, axis=1)
    assert np.allclose(da, amax / 127, rtol=1e-6)
    deq = qa.reshape(rows, -1, 32) * da[..., None].astype(np.float64)
    assert np.all(np.abs(deq - x.reshape(rows, -1, 32)) <= da[..., None] * 0.5 * (1 + 1e-4))
    assert np.allclose(sa, da * qa.reshape(rows, -1, 32).sum(axis=2), rtol=1e-6, atol=0)
    return deq.reshape(rows, n), da


@pytest.mark.parametrize("group", [32, 256])
def test_activation_blocks_equal_the_reference_bit_for_bit(group, rng):
    """The 8-bit activations, one scale per 32 or 256 values (vector paths where the build has
    them, the scalar loop in the portable build), equal hybrid.reference.quantize_activations
    byte for byte, with blocks of zeros, NaN, infinities, -0.0, tiny and huge values, and ties of
    the rounding."""
    from hybrid import reference

    rows, n = 9, 32 * 41 if group == 32 else 256 * 7
    x = (rng.standard_normal((rows, n)) * np.exp(rng.uniform(-8, 8, (rows, 1)))).astype(np.float32)
    blocks = x.reshape(rows, -1, 32)
    g = group // 32  # each special block in a group of its own
    blocks[0, 0] = 0.0
    blocks[0, 1 * g, 5] = np.nan
    blocks[0, 2 * g, 7] = np.inf
    blocks[0, 3 * g, :] = -0.0
    blocks[0, 4 * g, :] = np.nan
    blocks[1, 0] *= np.float32(1e-41)  # subnormal: the scale rounds to zero or its inverse overflows
    blocks[1, 1 * g] = np.float32(1e-38) * rng.standard_normal(32).astype(np.float32)
    blocks[1, 2 * g] = np.float32(3e38) * np.sign(rng.standard_normal(32)).astype(np.float32)
    blocks[1, 3 * g] = np.arange(32, dtype=np.float32) - 15.5  # halves: ties to even
    blocks[1, 4 * g] = np.float32(127)
    blocks[1, 4 * g, ::3] = np.float32(-0.5) - np.arange(11, dtype=np.float32)
    if group > 32:  # whole groups of the special values too
        blocks[2, :g] = 0.0
        blocks[2, g:2 * g] = np.float32(1e-41) * rng.standard_normal((g, 32)).astype(np.float32)
    qa = np.empty((rows, n), np.int8)
    da = np.empty((rows, n // 32), np.float32)
    sa = np.empty((rows, n // 32), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # the huge blocks' sums overflow to inf
        kernels.quantize_activations(x, qa, da, sa, group)
        want_q, want_d, want_s = reference.quantize_activations(x, group)
    assert np.array_equal(qa, want_q)
    assert da.view(np.uint32).tobytes() == want_d.view(np.uint32).tobytes()
    assert sa.view(np.uint32).tobytes() == want_s.view(np.uint32).tobytes()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 100])
def test_linear_against_float64(name, rows, rng):
    for n in widths(name)[:3] if rows > 16 else widths(name):
        out_features = int(rng.choice([37, 61, 130]))
        qt = random_blocks(name, out_features, n, rng)
        w = oracle(qt).astype(np.float64)
        x = rng.standard_normal((rows, n)).astype(np.float32)
        x[:, :32] *= 30  # blocks of very different scales
        bias = rng.standard_normal(out_features).astype(np.float32) \
            if rows % 2 or rows > 16 else None  # the GEMM's rows always with a bias
        got = ops.linear(x, qt, bias)
        b = 0 if bias is None else bias.astype(np.float64)
        exact = x.astype(np.float64) @ w.T + b
        mag = np.abs(x).astype(np.float64) @ np.abs(w).T + np.abs(b)
        if FORMATS[name].integer:
            # the mat-vec (rows <= 16) and the prefill GEMM multiply 8-bit activations: exact up
            # to float32 rounding against them, and within half an activation step per value
            # against x itself
            xq, da = _act_quantized(x, FORMATS[name].block_values)
            tight = xq @ w.T + b
            assert np.all(np.abs(got - tight) <= 2e-6 * (np.abs(xq) @ np.abs(w).T + np.abs(b)) + 1e-30)
            step = (da[:, :, None] * 0.5).repeat(32, axis=2).reshape(rows, n)  # [rows, n]
            bound = step.astype(np.float64) @ np.abs(w).T
            assert np.all(np.abs(got - exact) <= bound * (1 + 1e-4) + 2e-6 * mag)
        else:
            assert np.all(np.abs(got - exact) <= 2e-6 * mag * np.sqrt(n / 256) + 1e-30)


def test_kernel_refuses_inconsistent_arguments(rng):
    qt = random_blocks("q4_k", 8, 256, rng)
    x = np.ones((1, 256), np.float32)
    out = np.empty((1, 8), np.float32)
    with pytest.raises(ValueError, match="do not split into blocks of 256"):
        kernels.matvec(qt.format.kernel_code, qt.data, np.ones((1, 200), np.float32), None,
                       out, 1)
    with pytest.raises(ValueError, match="weight rows hold 144 bytes; 512 values need 288"):
        kernels.matvec(qt.format.kernel_code, qt.data, np.ones((1, 512), np.float32), None,
                       out, 1)
    with pytest.raises(ValueError, match="x has 255 features but weight is"):
        ops.linear(np.ones((1, 255), np.float32), qt)
    with pytest.raises(ValueError, match="bias has 3 entries for 8 outputs"):
        ops.linear(x, qt, np.ones(3, np.float32))
    with pytest.raises(IndexError):
        qt.rows([8])


# llama.cpp's reference quantizers, relative RMS error (rms(err) / rms(w)) on Gaussian weights
# (std 0.02, rows of 2048), measured with llama-cpp-python 0.3.36's llama_model_quantize
# (Q4_K_M / Q5_K_M files of the random Llama-3.2-1B-shaped bench model): Q4_K 0.0713,
# Q5_K 0.0361, Q6_K 0.0178.  The 32-value formats are compared with gguf.quants' port of the
# same reference quantizers directly.
LLAMA_CPP_REL_RMSE = {"q4_k": 0.0713, "q5_k": 0.0361, "q6_k": 0.0178}


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_quantize_error_within_the_reference(name, rng):
    w = (rng.standard_normal((64, 2048)) * 0.02).astype(np.float32)
    qt = quantize(w, name)
    assert qt.shape == w.shape and qt.nbytes == 64 * FORMATS[name].row_bytes(2048)
    back = dequantize(qt)
    assert np.array_equal(back, oracle(qt))  # what we write, gguf reads the same
    rel = float(np.sqrt(((back - w) ** 2).mean()) / np.sqrt((w ** 2).mean()))
    if name in LLAMA_CPP_REL_RMSE:
        assert rel <= LLAMA_CPP_REL_RMSE[name] * 1.01, rel  # measured: 0.0710, 0.0357, 0.0173
    else:
        ref = gguf_dequantize(gguf_quantize(w, T(FORMATS[name].ggml_type)),
                              T(FORMATS[name].ggml_type)).reshape(w.shape)
        rel_ref = float(np.sqrt(((ref - w) ** 2).mean()) / np.sqrt((w ** 2).mean()))
        assert rel <= rel_ref * 1.001 + 1e-9, (rel, rel_ref)


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown weight format 'q3_x'"):
        quantize(np.ones((2, 32), np.float32), "q3_x")
    with pytest.raises(ValueError, match="blocks of 256 values; rows of 576"):
        quantize(np.ones((2, 576), np.float32), "q4_k")
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize(np.full((2, 32), np.nan, np.float32), "q8_0")
    with pytest.raises(ValueError, match="2-D"):
        quantize(np.ones(32, np.float32), "q8_0")
    with pytest.raises(ValueError, match=r"needs 68 bytes as \[2, 34\]"):
        QuantizedTensor(np.zeros(60, np.uint8), "q8_0", (2, 32))
    for name in set(NAMES) - set(QUANTIZABLE):  # served from llama.cpp's files, not written
        with pytest.raises(ValueError, match=f"does not quantize to {name}; make such a file "
                                             f"with llama.cpp's llama-quantize"):
            quantize(np.ones((2, 256), np.float32), name)


def _layer_weights(cfg, rng):
    shapes = hybrid.LayerWeights.expected_shapes(None, cfg)
    return {k: (rng.standard_normal(v).astype(np.float32) * 0.05 if len(v) == 2
                else 1 + 0.1 * rng.standard_normal(v).astype(np.float32))
            for k, v in shapes.items() if k not in ("q_norm", "k_norm", "bq", "bk", "bv",
                                                    "post_attn_norm", "post_mlp_norm")}


MIXED = {"wq": "q4_k", "wk": "q6_k", "wv": "q8_0", "wo": "q5_0", "w_gate": "q4_k",
         "w_up": "q5_k", "w_down": "q6_k"}  # as in a Q4_K_M file: one kernel call, many formats


@pytest.mark.parametrize("name", ["q8_0", "q4_k", "bfloat16", "mixed"])
def test_layer_with_quantized_weights(name, rng):
    cfg = hybrid.DecoderConfig(hidden_size=512, num_heads=8, num_kv_heads=2, head_dim=64,
                               intermediate_size=768)
    w = _layer_weights(cfg, rng)
    lq = hybrid.LayerWeights(**{k: quantize(v, MIXED[k] if name == "mixed" else name)
                                if v.ndim == 2 else v for k, v in w.items()})
    ld = hybrid.LayerWeights(**{k: dequantize(v) for k, v in vars(lq).items() if v is not None})
    layer_q, layer_d = hybrid.DecoderLayer(cfg, lq), hybrid.DecoderLayer(cfg, ld)
    assert layer_q.weights.wq is lq.wq  # kept in its encoding, not converted
    x = rng.standard_normal((40, 512)).astype(np.float32)
    cq = hybrid.PagedKVCache(1, 2, 64, dtype="float32")
    cd = hybrid.PagedKVCache(1, 2, 64, dtype="float32")
    # integer formats multiply 8-bit activations (prefill GEMM and decode mat-vec), the K
    # formats' with one scale per 256 values (a coarser step); the float formats give the
    # float32 layer's numbers
    tol = 3e-2 if name in ("mixed", "q4_k") else 2e-2 if FORMATS[name].integer else 1e-5
    yq, yd = layer_q.forward(x[:37], np.arange(37), cq), layer_d.forward(x[:37], np.arange(37), cd)
    assert np.abs(yq - yd).max() <= tol * np.abs(yd).max()
    cq.commit(37)
    cd.commit(37)
    for i in range(3):
        yq = layer_q.forward(x[37 + i:38 + i], [37 + i], cq)
        yd = layer_d.forward(x[37 + i:38 + i], [37 + i], cd)
        cq.commit(1)
        cd.commit(1)
        assert np.abs(yq - yd).max() <= tol * np.abs(yd).max()
    with pytest.raises(ValueError, match=r"weight wk \(q8_0\) has shape \(64, 512\)"):
        hybrid.LayerWeights(**{**vars(lq), "wk": quantize(w["wk"][:64], "q8_0")}).validated(cfg)


def test_a_backend_without_the_format_says_why():
    with pytest.raises(registry.NoBackendError, match=r"linear\.q4_k"):
        registry.lookup("linear.q4_k", "cuda:0")
    for name in NAMES:
        assert registry.lookup(f"linear.{name}", "cpu") is not None


@pytest.mark.parametrize("variant", ["llama", "qwen3", "olmoe-norms", "qwen2", "gptj", "no-rope"])
def test_fused_decode_step_equals_the_op_by_op_path(variant, rng):
    """A quantized CPU layer decodes a row in two native calls around the attention; with the
    profiler on it runs op by op (every region timed).  Both give the same numbers."""
    cfg = hybrid.DecoderConfig(hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                               intermediate_size=512, rms_norm_eps=1e-5,
                               rope_style="gptj" if variant == "gptj" else "neox",
                               rope_theta=0.0 if variant == "no-rope" else 10000.0)
    w = _layer_weights(cfg, rng)
    extra = {}
    if variant == "qwen3":
        extra = dict(q_norm=1 + 0.1 * rng.standard_normal(64).astype(np.float32),
                     k_norm=1 + 0.1 * rng.standard_normal(64).astype(np.float32))
    if variant == "olmoe-norms":  # QK-norms over all heads
        extra = dict(q_norm=1 + 0.1 * rng.standard_normal(256).astype(np.float32),
                     k_norm=1 + 0.1 * rng.standard_normal(128).astype(np.float32))
    if variant == "qwen2":
        extra = {n: rng.standard_normal(s).astype(np.float32)
                 for n, s in (("bq", 256), ("bk", 128), ("bv", 128))}
    lw = hybrid.LayerWeights(**{k: quantize(v, MIXED[k]) if v.ndim == 2 else v
                                for k, v in w.items()}, **extra)
    fused, plain = hybrid.DecoderLayer(cfg, lw), hybrid.DecoderLayer(cfg, lw)
    cf, cp = (hybrid.PagedKVCache(1, 2, 64, dtype="float32") for _ in range(2))
    x = rng.standard_normal((9, 256)).astype(np.float32)
    fused.forward(x[:5], np.arange(5), cf)
    plain.forward(x[:5], np.arange(5), cp)
    cf.commit(5)
    cp.commit(5)
    for i in range(5, 9):
        yf = fused.forward(x[i:i + 1], [i], cf)
        with hybrid.profiling() as prof:
            yp = plain.forward(x[i:i + 1], [i], cp)
        cf.commit(1)
        cp.commit(1)
        assert "Block/QKVProj" in str(prof)  # the op-by-op path ran
        assert np.array_equal(yf, yp), (i, np.abs(yf - yp).max())  # the same kernels, bit for bit
    assert fused.buffers.decode_step() is not None  # a bound native step served the rows


@pytest.mark.parametrize("name", INTEGER)
def test_each_row_is_independent_of_the_batch(rng, name):
    """Batch invariance: a row's result from the mat-vec or the GEMM is the same bits whatever
    other rows share the call (how many, and where the row falls in the tiles)."""
    from hybrid._cpu import quant as kernels

    # 224: 7 blocks, a kernel stepping 4 at a time ends on a partial step; Q8_0 rows of 1024
    # take the prepared-activation passes (up to 8 rows each, rows shared out evenly)
    widths = (512, 224) if FORMATS[name].block_values == 32 else (512,)
    for n in widths + ((1024,) if name == "q8_0" else ()):
        w = random_blocks(name, 37, n, rng)
        x = rng.standard_normal((29, n)).astype(np.float32)
        code = w.format.kernel_code
        for kernel in (kernels.matvec, kernels.gemm):
            full = np.empty((29, 37), np.float32)
            kernel(code, w.data, x, None, full, 2)
            # 1-8 rows and more take different kernels where the build has the stream kernel
            for rows in (slice(0, 1), slice(3, 4), slice(12, 14), slice(14, 17), slice(17, 21),
                         slice(5, 12), slice(20, 29)):
                part = np.empty((rows.stop - rows.start, 37), np.float32)
                kernel(code, w.data, np.ascontiguousarray(x[rows]), None, part, 2)
                assert np.array_equal(part, full[rows]), (kernel.__name__, n, rows)


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q5_0", "q5_1"])
def test_stream_arrangements_give_the_same_bits(rng, name):
    """The AVX-512 stream kernel's two arrangements (quant_stream.h: which one a call takes
    depends on the core) give every row the bits it gets alone, for any number of rows: up to 8
    rows in one pass, more around the 16-row kernel (37 weight rows: 5 past its groups)."""
    from hybrid._cpu import quant as kernels

    if not kernels.stream_arrangement(3):
        pytest.skip("this build has no stream kernel (AVX-512 with VBMI)")
    n = 224  # 7 blocks: the last step of 4 is partial
    w = random_blocks(name, 37, n, rng)
    x = rng.standard_normal((21, n)).astype(np.float32)
    outs = {}
    try:
        for many in (False, True):
            kernels._force_stream_arrangement(many)
            assert kernels.stream_arrangement(3) == ("many" if many else "few")
            for rows in (1, 2, 3, 5, 8, 9, 21):
                out = np.full((rows, 37), np.nan, np.float32)
                kernels.matvec(w.format.kernel_code, w.data, x[:rows], None, out, 2)
                outs[many, rows] = out
    finally:
        kernels._force_stream_arrangement(None)
    for rows in (1, 2, 3, 5, 8, 9, 21):
        for many in (False, True):
            assert np.array_equal(outs[many, rows], outs[False, 21][:rows]), (many, rows)
    # and right: float64 products of the 8-bit activations with gguf's decoding of the weights
    wd = oracle(w).astype(np.float64)
    xq, _ = _act_quantized(x, 32)
    assert np.all(np.abs(outs[True, 21] - xq @ wd.T) <= 2e-6 * (np.abs(xq) @ np.abs(wd).T))


@pytest.mark.parametrize("name", [n for n in NAMES if not FORMATS[n].integer] + ["float32"])
def test_each_float_row_is_independent_of_the_batch(rng, name):
    """The float formats' mat-vec serves one, two, three to six, and more activation rows with
    different groupings of weight and activation rows per pass; each activation row keeps the
    bits it gets alone, wherever it falls (a pass of six, a pass of the rows left over)."""
    n, out, rows = 200, 38, 14  # 200: a partial last step; 38: weight rows left after the groups
    x = rng.standard_normal((rows, n)).astype(np.float32)
    bias = rng.standard_normal(out).astype(np.float32)
    if name == "float32":
        w = rng.standard_normal((out, n)).astype(np.float32)

        def run(xs, y):
            kernels.matvec_f32(w, xs, bias, y, 2)
    else:
        q = random_blocks(name, out, n, rng)

        def run(xs, y):
            kernels.matvec(q.format.kernel_code, q.data, xs, bias, y, 2)
    full = np.full((rows, out), np.nan, np.float32)
    run(x, full)
    for lo, hi in [(i, i + 1) for i in range(rows)] + [(0, 2), (1, 3), (2, 7), (3, 9), (0, 13)]:
        part = np.full((hi - lo, out), np.nan, np.float32)
        run(np.ascontiguousarray(x[lo:hi]), part)
        assert np.array_equal(part, full[lo:hi]), (name, lo, hi)


def test_sets_of_matrices_give_each_matrix_its_own_bits(rng):
    """matvec_sets and gemm_sets (mixture-of-experts: every expert's rows in one call) give
    every output the bits of its own matvec or gemm call: sets of different widths, row counts,
    formats and biases, with full and partial panels, in one parallel region."""
    from hybrid._cpu import quant as kernels

    names = ["q4_k", "q6_k", "q8_0", "q4_0", "q5_k", "iq4_xs"]
    sets, want = [], []
    for i, (n, rows) in enumerate([(512, 1), (256, 3), (512, 8), (256, 17), (768, 2)]):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        mats = []
        for j in range(2):
            name = names[(i + j) % len(names)]
            if n % FORMATS[name].block_values:
                name = "q8_0"
            out = int(rng.choice([32, 37, 70]))
            w = random_blocks(name, out, n, rng)
            bias = rng.standard_normal(out).astype(np.float32) if j else None
            mats.append((w.format.kernel_code, w.data, bias, out))
        sets.append((x, mats))
    for kernel, many in ((kernels.matvec, kernels.matvec_sets), (kernels.gemm, kernels.gemm_sets)):
        want = [[np.empty((x.shape[0], out), np.float32) for *_, out in mats] for x, mats in sets]
        for (x, mats), outs in zip(sets, want):
            for (code, data, bias, _), y in zip(mats, outs):
                kernel(code, data, x, bias, y, 2)
        got = [[np.full_like(y, np.nan) for y in outs] for outs in want]
        many([(x, [(code, data, bias, y) for (code, data, bias, _), y in zip(mats, outs)])
              for (x, mats), outs in zip(sets, got)], 2)
        for outs_w, outs_g in zip(want, got):
            for y_w, y_g in zip(outs_w, outs_g):
                assert np.array_equal(y_g, y_w), kernel.__name__


@pytest.mark.parametrize("name", NAMES)
def test_each_weight_row_is_independent_of_its_neighbours(rng, name):
    """Kernels that serve two, four or sixteen weight rows per pass give each row the bits it
    gets alone: a matrix's mat-vec equals, row for row, the mat-vec of each row by itself (and of
    odd slices, which leave a row over after the pairs).  Q8_0 is checked where its rows are
    wide enough to be served one at a time: on narrow matrices (16 rows within 12 KiB) groups of
    16 rows take a kernel with another order of sums, chosen by the matrix's shape alone; so
    do Q4_0/Q4_1/Q5_0/Q5_1 on AVX-512 builds without VBMI (no streaming kernel), checked there on
    matrices of 15 rows."""
    n = 2048 if name == "q8_0" else 512
    sixteen = kernels.simd() == "avx512+vnni" and name in ("q4_0", "q4_1", "q5_0", "q5_1")
    out = 15 if sixteen else 23
    w = random_blocks(name, out, n, rng)
    code = w.format.kernel_code
    for rows in (1, 3):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        full = np.empty((rows, out), np.float32)
        kernels.matvec(code, w.data, x, None, full, 2)
        for lo, hi in [(i, i + 1) for i in range(out)] + [(0, 3), (5, 12), (6, out)]:
            part = np.empty((rows, hi - lo), np.float32)
            kernels.matvec(code, np.ascontiguousarray(w.data[lo:hi]), x, None, part, 1)
            assert np.array_equal(part, full[:, lo:hi]), (rows, lo, hi)


@pytest.mark.parametrize("name", NAMES)
def test_rows_shared_between_threads_in_claimed_pieces_keep_their_bits(name, rng):
    """A mat-vec's threads claim pieces of their shares of the rows and then of each other's
    (hybrid/_cpu/quant.pyx, _matvec_claimed), so which thread serves a row, and in which call,
    changes from run to run.  Four matrices of a few MB (many pieces, pieces spanning two
    matrices, row counts that are not multiples of 16) give the bits of one thread serving each
    matrix whole, on 2, 3 and 5 threads (more threads than cores: a slowed thread whose pieces
    the others take), run after run, with biases."""
    n = 1024
    shapes = [1000, 333, 2000, 517]
    mats = [random_blocks(name, o, n, rng) for o in shapes]
    biases = [rng.standard_normal(o).astype(np.float32) for o in shapes]
    for rows in (1, 3):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        want = [np.empty((rows, o), np.float32) for o in shapes]
        kernels.matvec_many([(w.format.kernel_code, w.data, b, y)
                             for w, b, y in zip(mats, biases, want)], x, 1)
        for threads in (2, 3, 5, 2, 3, 5):
            got = [np.full((rows, o), np.nan, np.float32) for o in shapes]
            kernels.matvec_many([(w.format.kernel_code, w.data, b, y)
                                 for w, b, y in zip(mats, biases, got)], x, threads)
            for k in range(len(shapes)):
                assert np.array_equal(got[k], want[k]), (rows, threads, k)


@pytest.mark.parametrize("name", ["q4_k", "q5_k"])
def test_wide_k_quant_rows_against_float64_and_row_by_row(name, rng):
    """Rows of 16384 values, whose activations crowd the L1D: the Q4_K / Q5_K two-row kernel
    prefetches into L2 there (hy_q_kquant_pf_l2). Its sums equal, bit for bit, those of each row
    served alone (the one-row path), and stay within the activation-rounding bound of the float64
    product, with 1 and 3 activation rows."""
    n, out = 16384, 7
    w = random_blocks(name, out, n, rng)
    wd = oracle(w).astype(np.float64)
    code = w.format.kernel_code
    for rows in (1, 3):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        full = np.full((rows, out), np.nan, np.float32)
        kernels.matvec(code, w.data, x, None, full, 2)
        for i in range(out):
            one = np.empty((rows, 1), np.float32)
            kernels.matvec(code, np.ascontiguousarray(w.data[i:i + 1]), x, None, one, 1)
            assert np.array_equal(one[:, 0], full[:, i]), (rows, i)
        xq, da = _act_quantized(x, 256)
        tight = xq @ wd.T
        assert np.all(np.abs(full - tight) <= 2e-6 * (np.abs(xq) @ np.abs(wd).T) + 1e-30)


@pytest.mark.skipif(os.name != "posix", reason="needs mmap and mprotect")
@pytest.mark.parametrize("name", NAMES)
def test_kernels_read_nothing_past_the_weights(name, rng):
    """A matrix whose last byte is the last readable byte (the next page made unreadable), as the
    last tensor of a memory-mapped file can be: the mat-vec (1 and 3 activation rows, every
    kernel including partial 4-block steps) and the GEMM read only the matrix's bytes, so they
    give the same bits as on ordinary memory instead of a crash."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    n = 224 if FORMATS[name].block_values == 32 else 256  # 7 blocks of 32: a partial last step
    for out_features in (5, 37):  # fewer rows than one pass of 4 / 16, and several passes
        qt = random_blocks(name, out_features, n, rng)
        raw = qt.data.tobytes()
        pages = len(raw) // page + 2
        buf = mmap.mmap(-1, pages * page)
        end = (pages - 1) * page
        buf[end - len(raw):end] = raw
        anchor = ctypes.c_char.from_buffer(buf)
        w = None
        assert libc.mprotect(ctypes.addressof(anchor) + end, page, 0) == 0, ctypes.get_errno()
        try:
            w = np.frombuffer(buf, np.uint8, count=len(raw), offset=end - len(raw))
            w = w.reshape(qt.data.shape)
            for rows in (1, 3):
                x = rng.standard_normal((rows, n)).astype(np.float32)
                kinds = (kernels.matvec, kernels.gemm) if FORMATS[name].integer else (kernels.matvec,)
                for kernel in kinds:
                    got = np.empty((rows, out_features), np.float32)
                    want = np.empty((rows, out_features), np.float32)
                    kernel(qt.format.kernel_code, w, x, None, got, 2)
                    kernel(qt.format.kernel_code, qt.data, x, None, want, 2)
                    assert np.array_equal(got, want), (kernel.__name__, rows)
        finally:
            assert libc.mprotect(ctypes.addressof(anchor), pages * page, 3) == 0  # read | write
            del w, anchor
            buf.close()


def test_the_kernel_traits_table_matches_the_formats():
    """The C traits table (quant_traits.h) and hybrid/quant/formats.py describe every format
    alike, and the weight rows per mat-vec pass are the ones this build's kernels read."""
    table = kernels.kernel_traits()
    assert sorted(t["name"] for t in table.values()) == sorted(FORMATS)
    for code, t in table.items():
        f = FORMATS[t["name"]]
        assert (f.kernel_code, f.block_values, f.block_bytes, f.integer) == \
            (code, t["block_values"], t["block_bytes"], t["integer"])
    rows = {t["name"]: t["rows_per_pass"] for t in table.values()}
    simd = kernels.simd()
    q45 = ("q4_0", "q4_1", "q5_0", "q5_1")
    if simd.startswith("avx512"):
        assert {rows[n] for n in ("q4_0", "q4_1", "q8_0")} == {16}
        assert {rows[n] for n in ("q4_k", "q5_k", "q6_k")} == {2}
    elif simd.startswith("avx2"):
        assert {rows[n] for n in q45} == {8}
        assert rows["q8_0"] == 1
        assert {rows[n] for n in ("q4_k", "q5_k", "q6_k")} == {2}
    else:
        assert set(rows.values()) == {1}
