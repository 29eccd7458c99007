"""The CPU backend: registers the Cython/OpenMP kernels (and BLAS for float32 prompt rows where
the build has no AVX-512) with the registry.

Every function here receives arrays already validated by hybrid/ops.py (float32, C-contiguous,
consistent shapes) and reads the thread count from hybrid.threads, the one place that sets it.
"""

import os
import threading

import numpy as np

from .. import kernel_role
from ..quant.tensor import QuantizedTensor
from ..threads import get_num_threads

try:
    from . import attention, decode_step, elementwise, quant
except ImportError as exc:  # the extension was not built (source checkout without build_ext)
    from ..registry import BackendUnavailable

    raise BackendUnavailable(
        f"the compiled CPU kernels are missing ({exc}); install the package with "
        f"'pip install .' or build them with 'python setup.py build_ext --inplace'") from exc


def rmsnorm(x, weight, eps, out):
    elementwise.rmsnorm(x, weight, eps, out, get_num_threads())


# The cos/sin tables of the last positions rotated: every layer of a step, and Q and K, rotate the
# same positions by the same frequencies, and the angles' libm calls are most of RoPE's time.
# The key is the positions' and frequencies'
# bytes, so equal inputs share a table whoever passes them; a tuple swap keeps it thread-safe.
_rope_last = None  # ((positions bytes, inv_freq bytes), cs, sn)


def rope(x, positions, inv_freq, num_heads, head_dim, neox):
    global _rope_last
    key = (positions.tobytes(), inv_freq.tobytes())
    last = _rope_last
    if last is not None and last[0] == key:
        cs, sn = last[1], last[2]
    else:
        cs = np.empty((positions.shape[0], inv_freq.shape[0]), dtype=np.float32)
        sn = np.empty_like(cs)
        elementwise.rope_angles(positions, inv_freq, cs, sn, get_num_threads())
        _rope_last = (key, cs, sn)
    elementwise.rope_apply(x, cs, sn, num_heads, head_dim, neox, get_num_threads())


def swiglu(gate, up, out):
    elementwise.swiglu(gate, up, out, get_num_threads())


def add(a, b, out):
    elementwise.add(a, b, out, get_num_threads())


def linear(x, weight, bias, out, role=kernel_role.AUTO):
    """x [rows, in] @ W.T (+ bias) for float32 W [out, in]: decode rows (the role says so, or
    few rows under "auto") through our mat-vec (each weight row streamed once, prefetched; the same sums for a row
    whatever the batch), prompt rows through our GEMM where the build has it (also the same sums
    whatever the batch; _gemm_f32 says which), else BLAS sgemm."""
    if _matvec_rows(x.shape[0], role) and weight.flags.c_contiguous:
        quant.matvec_f32(weight, x, bias, out, get_num_threads())
        return
    _gemm_f32(x, weight, bias, out)


# On AVX2 builds BLAS's own AVX2 GEMM is faster on large matrices; small ones (a
# mixture-of-experts router between integer GEMMs) take ours, where handing the work to BLAS's
# threads costs more than it gains (bench_moe measures it).
SMALL_F32_GEMM = 1 << 20


def _gemm_f32(x, weight, bias, out):
    """out [rows, out] (rows contiguous) = x @ W.T (+ bias) for float32 W: our GEMM on AVX-512
    builds, and on AVX2 builds for matrices up to SMALL_F32_GEMM bytes; else BLAS sgemm."""
    if quant.GEMM_F32 and weight.flags.c_contiguous \
            and (quant.GEMM_F32_LANES >= 16 or weight.nbytes <= SMALL_F32_GEMM):
        quant.gemm_f32(weight, x, bias, out, get_num_threads())
        return
    np.matmul(x, weight.T, out=out)
    if bias is not None:
        out += bias


# Up to this many rows a quantized projection runs the mat-vec kernel (each weight row streamed
# once for all rows); above it, the integer formats run the int8 GEMM on decoded panels, and F16/BF16
# decode panels into a float32 tile for the float32 GEMM (HYBRID_INT8_GEMM=0: that path for all).
MATVEC_MAX_ROWS = 16
INT8_GEMM = os.environ.get("HYBRID_INT8_GEMM", "1") != "0"
# floats in one decoded panel (16 MiB): big enough for the GEMM to run at speed, small enough to stay
# in the last-level cache between decoding and multiplying
PANEL_FLOATS = 1 << 22
_panels = threading.local()


def _matvec_rows(rows: int, role: str) -> bool:
    """Whether rows take the mat-vec kernel: by their role (hybrid/kernel_role.py), or by their
    count under "auto"."""
    return role == kernel_role.DECODE or (role == kernel_role.AUTO and rows <= MATVEC_MAX_ROWS)


def _panel(rows: int, cols: int) -> np.ndarray:
    buf = getattr(_panels, "buf", None)
    if buf is None or buf.size < rows * cols:
        buf = _panels.buf = np.empty(rows * cols, dtype=np.float32)
    return buf[:rows * cols].reshape(rows, cols)


def linear_quantized(x, weight, bias, out, role=kernel_role.AUTO):
    """x [rows, in] @ W.T (+ bias) for a QuantizedTensor W, read in its encoding; ``role``
    picks the kernel (hybrid/kernel_role.py)."""
    code, n_out, n_in = weight.format.kernel_code, weight.shape[0], weight.shape[1]
    if _matvec_rows(x.shape[0], role):
        quant.matvec(code, weight.data, x, bias, out, get_num_threads())
        return
    if weight.format.integer and INT8_GEMM:  # our int8 GEMM
        quant.gemm(code, weight.data, x, bias, out, get_num_threads())
        return
    step = max(1, min(n_out, PANEL_FLOATS // n_in))
    for r0 in range(0, n_out, step):
        r1 = min(n_out, r0 + step)
        panel = _panel(r1 - r0, n_in)  # [r1 - r0, in] float32
        quant.decode_rows(code, weight.data, n_in, r0, r1, panel, get_num_threads())
        _gemm_f32(x, panel, None, out[:, r0:r1])
    if bias is not None:
        out += bias


def linear_sets(sets, role=kernel_role.AUTO):
    """x @ W.T into out for sets (x, [(W, out), ...]) whose weights each read the set's x
    (mixture-of-experts: each expert's rows).  Quantized weights go to the native kernels in
    one call per kind: the mat-vec sets (each x quantized once, one parallel region over all
    their rows) and the integer GEMM sets (one parallel region over all their panels); the rest
    one linear at a time.  The bits are each linear's."""
    matvec, gemm = [], []
    for x, pairs in sets:
        if all(type(w) is QuantizedTensor for w, _ in pairs):
            args = [(w.format.kernel_code, w.data, None, o) for w, o in pairs]
            if _matvec_rows(x.shape[0], role):
                matvec.append((x, args))
                continue
            if INT8_GEMM and all(w.format.integer for w, _ in pairs):
                gemm.append((x, args))
                continue
        for w, o in pairs:
            (linear_quantized if type(w) is QuantizedTensor else linear)(x, w, None, o, role)
    if matvec:
        quant.matvec_sets(matvec, get_num_threads())
    if gemm:
        quant.gemm_sets(gemm, get_num_threads())


def bind_linear_many(triples):
    """Several projections of the same x (Q/K/V, gate/up) for fixed (weight, bias, out) triples,
    as a function of (x, role).  Quantized weights at decode share one quantization of x and one parallel
    region, with the kernel arguments built here once (a layer binds them per row count)."""
    args = None
    if all(type(w) is QuantizedTensor for w, _, _ in triples):
        args = [(w.format.kernel_code, w.data, b, o) for w, b, o in triples]

    def run(x, role):
        if args is not None and _matvec_rows(x.shape[0], role):
            quant.matvec_many(args, x, get_num_threads())
            return
        for w, b, o in triples:
            (linear_quantized if type(w) is QuantizedTensor else linear)(x, w, b, o, role)
    return run


class DecodeStep:
    """A quantized CPU layer's decode row in two native calls around the attention (prologue:
    norm, Q/K/V, QK-norm, RoPE; epilogue: O, residual, norm, gate/up, SwiGLU, down, residual),
    bound to the layer's weights and scratch buffers once (decode_step.DecodeLayer holds the
    pointers).  Same kernels and order as the op-by-op path."""

    def __init__(self, cfg, w, bufs, inv_freq, max_rows: int = 1):
        def arg(weight, bias, out):
            return (weight.format.kernel_code, weight.data, bias, out)

        mats = [arg(w.wq, w.bq, bufs["q"]), arg(w.wk, w.bk, bufs["k"]), arg(w.wv, w.bv, bufs["v"]),
                arg(w.wo, None, bufs["o"])]
        moe = None
        if w.experts is None:
            mats += [arg(w.w_gate, None, bufs["gate"]), arg(w.w_up, None, bufs["up"]),
                     arg(w.w_down, None, bufs["o"])]
        else:  # the experts' matrices and the layer's routing counts (bufs["expert_counts"])
            ex = w.experts
            enc = [[(m.format.kernel_code, m.data) for m in mats_]
                   for mats_ in (ex.gate, ex.up, ex.down)]
            moe = decode_step.MoeBlock(ex.router, *enc, ex.top_k, ex.normalize,
                                       bufs["expert_counts"], bufs["moe_scores"], bufs["moe_x"],
                                       bufs["moe_gate"], bufs["moe_up"], bufs["moe_down"],
                                       max_rows)
        self.native = decode_step.DecodeLayer(mats, w.attn_norm, w.mlp_norm, w.q_norm, w.k_norm,
                                        inv_freq, bufs["h"], bufs["o"], bufs["x1"],
                                        cfg.rms_norm_eps, cfg.rope_style == "neox",
                                        cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, max_rows,
                                        moe)
        self.qkv = (bufs["q"], bufs["k"], bufs["v"])
        self.att = bufs["att"]  # [max_rows, H*D]: what decode_stack reads attention into

    def prologue(self, x, position: int):
        self.native.prologue(x, position, get_num_threads())
        return self.qkv

    def epilogue(self, att, x, out):
        self.native.epilogue(att, x, out, get_num_threads())
        return out


def bind_decode_step(cfg, weights, bufs, inv_freq, max_rows: int = 1):
    """A DecodeStep for up to max_rows rows (bufs: [max_rows, ...]) when every projection, and
    every expert's matrix of a mixture of experts, is a QuantizedTensor (else None)."""
    ex = weights.experts
    mats = [getattr(weights, n) for n in ("wq", "wk", "wv", "wo")]
    mats += [weights.w_gate, weights.w_up, weights.w_down] if ex is None else ex.matrices()
    if all(type(m) is QuantizedTensor for m in mats):
        return DecodeStep(cfg, weights, bufs, inv_freq, max_rows)
    return None


def moe_route(scores, top_k: int, normalize: bool):
    """(ids [n, top_k] int64, weights [n, top_k] float32): each row's experts, best first
    (ties: the lower id), and their weights, from its router scores [n, E] (float32); the
    routing the native decode step uses too."""
    return decode_step.moe_route(np.ascontiguousarray(scores, dtype=np.float32), top_k,
                                 normalize)


def paged_attention(q, start_pos, k_ptrs, v_ptrs, num_heads, num_kv_heads, head_dim,
                    block_size, head_stride, kv_code, scale, out, window=0, softcap=0.0):
    attention.paged_attention(q, start_pos, k_ptrs, v_ptrs, num_heads, num_kv_heads, head_dim,
                              block_size, head_stride, kv_code, scale, out, get_num_threads(),
                              window, softcap)


def _step_plan(batch, num_heads, scale, window=0, softcap=0.0):
    """The step's attention plan (attention.RaggedStep), made by its first layer and reused."""
    nt = get_num_threads()
    key = (num_heads, scale, nt, window, softcap)
    plan = batch.attention_plans.get(key)
    if plan is None:
        plan = batch.attention_plans[key] = attention.RaggedStep(
            batch.positions, batch.seg_rows, batch.seg_table, batch.table_ids, batch.row_block,
            batch.row_slot, num_heads, batch.num_kv_heads, batch.head_dim, batch.block_size,
            batch.head_stride, batch.kv_code, scale, nt, window, softcap)
    return plan


def attend_step(batch, layer, q, k, v, num_heads, scale, out, window=0, softcap=0.0):
    """One layer of a ragged step: write every row's K/V (float32 [T, KVH*D]) into its slot and
    attend (hybrid/step.py's StepBatch).  The attention plan is made on the step's first layer
    and reused by the others (attention.RaggedStep)."""
    _step_plan(batch, num_heads, scale, window, softcap).layer(q, k, v, batch.pool.k_addr[layer],
                                              batch.pool.v_addr[layer], out)


def step_layers(layers, batch, x, memo):
    """Run one step (a StepBatch) through consecutive CPU layers; returns their output.  Up to
    NATIVE_ROWS generated rows (a decode or verify step, not profiled) whose layers all hold
    a bound native decode step run the whole stack in one native call (decode_step.
    decode_stack, x overwritten): the same kernels in the same order as layer by layer.  Any
    other step runs layer by layer.  ``memo``: the caller's dict, where the layers' bound steps
    are kept until one of the layers rebuilds its buffers."""
    rows = batch.num_rows
    if rows <= NATIVE_ROWS and batch.role != kernel_role.PROMPT and not batch.profiled \
            and type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous:
        steps = _bound_steps(layers, memo, 1 if rows == 1 else NATIVE_ROWS)
        if steps is not None and (batch.pool.on_cpu or all(
                batch.pool.placements[layer.index].is_cpu for layer in layers)):
            first = layers[0]
            lo, n = first.index, len(layers)
            att = (first.buffers.rows(1)["att"] if rows == 1
                   else memo[("att", NATIVE_ROWS)][:rows])
            decode_step.decode_stack(
                steps, _step_plan(batch, first.config.num_heads, first.config.softmax_scale,
                                  first.config.sliding_window, first.config.attn_softcap),
                batch.pool.k_addr[lo:lo + n], batch.pool.v_addr[lo:lo + n], x, att,
                np.ascontiguousarray(batch.positions, dtype=np.int64), get_num_threads())
            batch.wrote_layers(range(lo, lo + n))
            return x
    from ..layer import forward_layers

    return forward_layers(layers, batch, x)


# rows a native stack call carries at most (a decode step of that many sequences, or a sequence's
# verify rows); more take the layer-by-layer path
NATIVE_ROWS = 16


def _bound_steps(layers, memo, max_rows: int):
    """The layers' native decode steps (decode_step.DecodeLayer) for up to max_rows rows when
    every layer has one and the layers are consecutive; else None.  The multi-row steps'
    attention output buffer is memo[("att", max_rows)]."""
    key = tuple([layer.buffers.version for layer in layers])
    if memo.get(("key", max_rows)) != key:
        lo = layers[0].index
        # may rebuild buffers: the key after
        steps = [layer.buffers.decode_step() if max_rows == 1
                 else layer.buffers.decode_rows(max_rows) for layer in layers]
        ok = all(s is not None for s in steps) \
            and [layer.index for layer in layers] == list(range(lo, lo + len(layers)))
        memo[("steps", max_rows)] = [s.native for s in steps] if ok else None
        if ok and max_rows > 1:
            memo[("att", max_rows)] = steps[0].att
        memo[("key", max_rows)] = tuple([layer.buffers.version for layer in layers])
    return memo[("steps", max_rows)]


def to_device(array, placement):
    if placement.is_cpu:
        return array
    from ..registry import NoBackendError

    raise NoBackendError(f"the cpu backend cannot move arrays to {placement}")


def register(registrar):
    for name in ("rmsnorm", "rope", "swiglu", "add", "linear", "linear_sets", "moe_route",
                 "bind_linear_many", "bind_decode_step", "paged_attention", "attend_step",
                 "step_layers", "to_device"):
        registrar.op(name, globals()[name])
    from ..quant.formats import FORMATS

    for fmt in FORMATS:  # every weight format has a native CPU kernel
        registrar.op(f"linear.{fmt}", linear_quantized)
