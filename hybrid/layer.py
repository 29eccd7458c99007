"""DecoderLayer: the seed's hybrid decoder block, one step per line.

    x ─ RMSNorm ─ Q,K,V proj ─ [QK-norm] ─ RoPE ─ append K,V ─ paged attention ─ O proj ─ + ─┐
    └──────────────────────────────────────────────────────────────────────────────────────┘
    x1 ─ RMSNorm ─ gate, up proj ─ SwiGLU ─ down proj ─ + x1 ─ out

Placement, as in the seed: the layer's weights and activations live on its device ("cpu" or
"cuda:N"); input arriving from elsewhere moves there on entry.  Attention runs where the cache
layer lives: a cuda layer whose cache layer is on the cpu sends q, k, v to the host and takes the
attention output back.  A cuda layer with its cache on the same GPU rotates q and k inside the
paged-attention kernel (fused RoPE, K cached unrotated), as the seed does.

This module knows the public ops, the KV cache and the profiler; it knows no backend.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import kernel_role, ops, registry
from .config import DecoderConfig, LayerWeights
from .kvcache import PagedKVCache
from .moe import moe_forward
from .layer_boundary import LayerBoundary
from .layer_buffers import LayerBuffers
from .placement import Placement, is_device_array, to_device
from .profile import enabled as profiling_enabled
from .profile import region
from .quant import QuantizedTensor, dequantize
from .scratch import Scratch


class DecoderLayer:
    """One Llama/Qwen-style decoder layer placed on a device.

    Parameters
    ----------
    config : DecoderConfig
    weights : LayerWeights, validated (shapes, dtypes) and converted to float32 here
    index : this layer's index in the KV cache
    placement : "cpu" or "cuda:N"; the backend serving it is resolved now and fails loudly
    scratch : buffers for intermediate activations; layers that run one after another may share one
    fused_rope : on a GPU with the cache layer on the same GPU, rotate q and k inside the
        attention kernel (the seed's choice; K is then cached unrotated, so one cache layer must
        always be used the same way).  Positions must then be the cache positions.
    """

    def __init__(self, config: DecoderConfig, weights: LayerWeights, index: int = 0,
                 placement="cpu", scratch: "Scratch | None" = None, fused_rope: bool = True):
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
        if not isinstance(weights, LayerWeights):
            raise TypeError(f"weights must be LayerWeights, got {type(weights).__name__}")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise ValueError(f"index must be an integer >= 0, got {index!r}")
        self.config = config
        self._scale = config.softmax_scale  # attention's softmax scale
        self.weights = weights.validated(config)
        self.index = int(index)
        self.placement = Placement.parse(placement)
        self._experts = self.weights.experts  # a mixture-of-experts MLP (CPU only)
        for what, used in (("mixture-of-experts", self._experts is not None),
                           ("partial-rotary", config.partial_rotary),
                           ("sliding-window", config.sliding_window > 0),
                           ("GeGLU", config.mlp_activation != "silu"),
                           ("sandwich-norm", weights.post_attn_norm is not None),
                           ("score-softcapping", config.attn_softcap > 0)):
            if used and not self.placement.is_cpu:
                raise ValueError(f"layer {self.index}: {what} layers run on the cpu, not "
                                 f"{self.placement}")
        registry.require(self.placement)  # e.g. cuda:0 without a CUDA backend: says why
        self.scratch = scratch if scratch is not None else Scratch()
        self._inv_freq = config.inv_freq() if config.rope_enabled else None
        self._gpu = not self.placement.is_cpu
        self.expert_counts = None if self._experts is None else \
            np.zeros(self._experts.num_experts, dtype=np.int64)  # rows routed to each expert
        # the weights on the layer's device (the same arrays on the cpu); on a GPU the Q/K/V and
        # gate/up weights are stacked, so one fused kernel reads each group in one pass
        self._w, self._stacked = self.weights, None
        if self._gpu:
            self._w, self._stacked = _weights_on(self.weights, self.placement)
            self._split3 = registry.optional("linear_split3", self.placement)
            self._linear_swiglu = registry.optional("linear_swiglu", self.placement)
            self._linear_residual = registry.optional("linear_residual", self.placement)
            if None in (self._split3, self._linear_swiglu, self._linear_residual):
                self._stacked = None  # a backend without the fused projections
        # CPU layers with quantized projections: Q/K/V and gate/up each in one kernel call that
        # quantizes the activations once (decode)
        many = bind_decode = None
        if not self._gpu and any(isinstance(getattr(self.weights, n), QuantizedTensor)
                                 for n in ("wq", "wk", "wv", "w_gate", "w_up")):
            many = registry.optional("bind_linear_many", self.placement)
            # a decode row in two native calls around the attention (when not profiling; the
            # native epilogue knows the SwiGLU MLP and the mixture of experts)
            if not config.partial_rotary \
                    and config.mlp_activation == "silu" and self.weights.post_attn_norm is None:
                bind_decode = registry.optional("bind_decode_step", self.placement)
        # activation buffers and the native calls bound to them; the device boundary
        self.buffers = LayerBuffers(config, self._w, self.placement, self.scratch, self._inv_freq,
                                    many=many, bind_decode=bind_decode,
                                    expert_counts=self.expert_counts)
        self._io = LayerBoundary(self.placement, self.scratch, config.hidden_size, self.index)
        self.fused_rope = bool(fused_rope) and self._gpu and self._inv_freq is not None
        self._k = ops.bind(self.placement)  # kernels resolved once; arrays are checked on entry

    # ------------------------------------------------------------------ validation
    def _check_cache(self, cache: PagedKVCache, name: str = "cache") -> None:
        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"{name} must be a PagedKVCache, got {type(cache).__name__}")
        cfg = self.config
        if (cache.num_kv_heads, cache.head_dim) != (cfg.num_kv_heads, cfg.head_dim):
            raise ValueError(f"{name} stores {cache.num_kv_heads} KV heads x {cache.head_dim}, "
                             f"layer {self.index} has {cfg.num_kv_heads} x {cfg.head_dim}")
        if self.index >= cache.num_layers:
            raise ValueError(f"{name} has {cache.num_layers} layers; layer index {self.index} "
                             f"is out of range")
        where = cache.placement(self.index)
        if not where.is_cpu:
            if self._gpu and where != self.placement:
                raise ValueError(f"{name} layer {self.index} is on {where} but the layer runs on "
                                 f"{self.placement}; a cuda layer's KV cache must be on the same "
                                 f"GPU or on the cpu")
            registry.lookup("check_attention", where)(cfg.head_dim, cfg.num_heads // cfg.num_kv_heads)
        held = cache.layer_len(self.index)
        if held != cache.seq_len:
            raise ValueError(f"{name} layer {self.index} already holds {held - cache.seq_len} "
                             f"uncommitted tokens after seq_len={cache.seq_len}; commit or "
                             f"truncate before the next step")

    # ------------------------------------------------------------------ forward
    def forward(self, hidden, positions, cache: "PagedKVCache | None" = None, *, out=None,
                role: str = kernel_role.AUTO):
        """Run the layer on one sequence (prefill or decode).

        hidden [n_tokens, hidden_size] float32 (other float dtypes are converted); positions
        [n_tokens] RoPE positions; cache: the sequence's PagedKVCache (the new K/V are appended
        to layer ``index``; the caller commits), or None for attention over these tokens alone.
        ``role`` says what the rows are and picks the projection kernels (hybrid/kernel_role.py).
        Returns [n_tokens, hidden_size] float32 (``out`` if given; it may be ``hidden``).
        On error the cache and ``hidden`` are left exactly as they were.
        """
        kernel_role.check(role)
        native = role != kernel_role.PROMPT and not profiling_enabled()
        x, host_out = self._io.enter(hidden, out)  # [n, hidden] on this layer's device
        n = x.shape[0]
        pos = ops.positions_array(positions, n)  # [n] int64
        private = cache is None
        if private:
            cache, layer = self._private_cache(), 0
        else:
            self._check_cache(cache)
            layer = self.index
        start, where = cache.layer_len(layer), cache.placement(layer)
        fused = not private and self._use_fused_rope(
            where, pos, lambda: np.arange(start, start + n, dtype=np.int64))
        q, k, v = self._qkv(x, pos, role, native, rotate=not fused)  # [n, H*D], [n, KVH*D] x 2

        def append(kk, vv):  # the new K, V rows after what the layer holds
            cache.append(layer, kk, vv)

        def attention(qq, o, rope):  # rows at positions start.. over the cache layer
            return ops.paged_attention(qq, cache, layer, scale=self.config.softmax_scale, out=o,
                                       rope=rope, window=self.config.sliding_window,
                                       softcap=self.config.attn_softcap)

        with region("Block/Attention"):
            try:
                att = self._attend(q, k, v, fused, append, attention, where)
            except BaseException:
                cache.rollback_layer(layer, start)
                raise
        try:
            return self._io.leave(
                self._finish(x, att, self._io.result(x, out, host_out), role, native), host_out)
        except BaseException:
            cache.rollback_layer(layer, start)
            raise

    def forward_step(self, hidden, batch, *, out=None):
        """Run the layer on one ragged step: the rows of many sequences (prefill chunks, decode
        rows, any mix) described once by ``batch`` (a hybrid.step.StepBatch over one pool,
        whose ``role`` picks the kernels).  hidden [T, hidden_size] in the batch's row order.
        Writes each row's K/V into its slot and attends over each sequence's blocks in one call;
        the caller commits the batch after the last layer, or rolls it back on error.
        Returns [T, hidden_size]."""
        if not (self.placement.is_cpu and batch.pool.placements[self.index].is_cpu):
            return self._step_by_sequence(hidden, batch, out)
        x, host_out = self._io.enter(hidden, out)  # [T, hidden]
        T = x.shape[0]
        if T != batch.num_rows:
            raise ValueError(f"hidden has {T} rows, the step describes {batch.num_rows}")
        role, native = batch.role, batch.role != kernel_role.PROMPT and not batch.profiled
        q, k, v = self._qkv(x, batch.positions, role, native)  # [T, H*D], [T, KVH*D] x 2
        with region("Block/Attention"):  # K/V rows into their slots, then attention
            att = self.buffers.rows(T)["att"]  # [T, H*D]
            self._k.attend_step(batch, self.index, q, k, v, self.config.num_heads, self._scale,
                                att, self.config.sliding_window, self.config.attn_softcap)
            batch.wrote_layer(self.index)
        return self._io.leave(self._finish(x, att, self._io.result(x, out, host_out), role, native),
                              host_out)

    def _step_by_sequence(self, hidden, batch, out):
        """A step on a GPU layer, or with the cache layer off the CPU: each sequence's rows
        through ``forward`` (their blocks are already taken by the step's plan)."""
        x, host_out = self._io.enter(hidden, out)  # [T, hidden] on this layer's device
        if x.shape[0] != batch.num_rows:
            raise ValueError(f"hidden has {x.shape[0]} rows, the step describes "
                             f"{batch.num_rows}")
        result = self._io.result(x, out, host_out)
        rows = batch.seg_rows
        for s, cache in enumerate(batch.caches):
            lo, hi = int(rows[s]), int(rows[s + 1])
            self.forward(x[lo:hi], batch.positions[lo:hi], cache, out=result[lo:hi],
                         role=batch.role)
        batch.wrote_layer(self.index)
        return self._io.leave(result, host_out)

    __call__ = forward

    # ------------------------------------------------------------------ placement
    def _use_fused_rope(self, where: Placement, pos: np.ndarray, cache_positions) -> bool:
        """Whether RoPE runs inside the attention kernel: on a GPU, cache layer on the same GPU
        (the seed's rule).  The kernel rotates by cache position, so positions must match it
        (``cache_positions()`` gives them)."""
        if not self.fused_rope or where != self.placement:
            return False
        cache_pos = cache_positions()
        if not np.array_equal(pos, cache_pos):
            raise ValueError(f"layer {self.index} rotates q and k inside the CUDA attention "
                             f"kernel by cache position, so positions must be the cache "
                             f"positions {cache_pos[:4].tolist()}..., got {pos[:4].tolist()}...; "
                             f"build the layer with fused_rope=False to use other positions")
        return True

    def _attend(self, q, k, v, fused: bool, append, attention, where: Placement):
        """Append k, v to the cache and attend, on the device of the cache layer (``where``);
        returns the attention output on this layer's device."""
        n = q.shape[0]
        att = self.buffers.rows(n)["att"]  # [n, H*D] on this layer's device
        rope = (self._inv_freq, self.config.rope_style == "neox") if fused else None
        if where == self.placement:
            append(k, v)
            return attention(q, att, rope)
        # the cache layer lives elsewhere (a cuda layer with its KV on the cpu, or the reverse)
        return self._io.attend_at(where, q, k, v, append, attention, att)

    # ------------------------------------------------------------------ steps
    def _qkv(self, x, pos: np.ndarray, role: str, native: bool, rotate: bool = True):
        """Attention-block prologue: norm, projections, QK-norm, RoPE unless fused into
        attention (into scratch buffers on the layer's device).  ``role`` picks the projection
        kernels; ``native``: a bound decode step may run the whole prologue in one call."""
        cfg, w, k_, b = self.config, self._w, self._k, self.buffers.rows(x.shape[0])
        step = b.get("decode_step")
        if step is not None and rotate and native:
            return step.prologue(x, int(pos[0]))  # the steps below in one native call
        H, KVH, D, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
        with region("Block/AttnNorm"):
            h = k_.rmsnorm(x, w.attn_norm, eps, b["h"])  # [n, hidden]
        if self._stacked is not None:  # GPU: one pass over the stacked Q/K/V weights
            q, k, v = b["q"], b["k"], b["v"]
            with region("Block/QKVProj"):
                self._split3(h, self._stacked.w_qkv, self._stacked.b_qkv, (q, k, v))
        elif "qkv_proj" in b:  # CPU, quantized: one call for the three projections
            q, k, v = b["q"], b["k"], b["v"]
            with region("Block/QKVProj"):
                b["qkv_proj"](h, role)
        else:
            with region("Block/QProj"):
                q = k_.linear(h, w.wq, w.bq, b["q"], role)  # [n, H*D]
            with region("Block/KProj"):
                k = k_.linear(h, w.wk, w.bk, b["k"], role)  # [n, KVH*D]
            with region("Block/VProj"):
                v = k_.linear(h, w.wv, w.bv, b["v"], role)  # [n, KVH*D]
        if w.q_norm is not None:
            with region("Block/QNorm"):  # per head (its weight [D]) or over all heads ([H*D])
                span = w.q_norm.shape[0]
                k_.rmsnorm(q.reshape(-1, span), w.q_norm, eps, q.reshape(-1, span))
        if w.k_norm is not None:
            with region("Block/KNorm"):
                span = w.k_norm.shape[0]
                k_.rmsnorm(k.reshape(-1, span), w.k_norm, eps, k.reshape(-1, span))
        if self._inv_freq is not None and rotate:
            neox = cfg.rope_style == "neox"
            if cfg.partial_rotary:
                with region("Block/RoPE_QK"):
                    self._rope_part(q, pos, H, cfg.rope_attn_factor ** 2)
                    self._rope_part(k, pos, KVH, 1.0)
                return q, k, v
            with region("Block/RoPE_Q"):
                k_.rope(q, pos, self._inv_freq, H, D, neox)
            with region("Block/RoPE_K"):
                k_.rope(k, pos, self._inv_freq, KVH, D, neox)
        return q, k, v

    def _rope_part(self, x, pos, heads: int, scale: float) -> None:
        """Rotate the first rope_dims dimensions of each head of x [n, heads*head_dim] in place
        (the rest pass through), those dimensions then multiplied by ``scale`` (a query's share
        of the rotated part's attention factor)."""
        cfg = self.config
        n, D, R = x.shape[0], cfg.head_dim, cfg.rope_dims
        view = x.reshape(n, heads, D)
        part = np.ascontiguousarray(view[:, :, :R]).reshape(n, heads * R)
        self._k.rope(part, pos, self._inv_freq, heads, R, cfg.rope_style == "neox")
        if scale != 1.0:
            part *= np.float32(scale)
        view[:, :, :R] = part.reshape(n, heads, R)

    def _finish(self, x, att, result, role: str, native: bool):
        """O projection and residual, then the MLP block and its residual (into ``result``);
        ``role`` and ``native`` as for ``_qkv``."""
        cfg, w, k_, b = self.config, self._w, self._k, self.buffers.rows(x.shape[0])
        step = b.get("decode_step")
        if step is not None and native:
            return step.epilogue(att, x, result)  # the steps below in one native call
        fused = self._stacked is not None  # GPU: residual adds inside the projections
        with region("Block/OProj"):
            if fused:
                x1 = b["x1"]
                self._linear_residual(att, w.wo, None, x, x1)  # x + att @ wo.T
            else:
                o = k_.linear(att, w.wo, None, b["o"], role)  # [n, hidden]
                if w.post_attn_norm is not None:  # Gemma's sandwich norm
                    o = k_.rmsnorm(o, w.post_attn_norm, cfg.rms_norm_eps, b["h"])
                x1 = k_.add(x, o, b["x1"])  # residual 1
        with region("Block/MlpNorm"):
            h2 = k_.rmsnorm(x1, w.mlp_norm, cfg.rms_norm_eps, b["h"])
        if self._experts is not None:
            with region("Block/Experts"):
                d = moe_forward(h2, self._experts, k_, role, self.expert_counts)
            return k_.add(x1, d, result)
        if fused:  # GPU: gate, up and SwiGLU in one pass
            act = b["gate"]
            with region("Block/GateUpSwiGLU"):
                self._linear_swiglu(h2, self._stacked.w_gate_up, act, b["up"])
        else:
            if "gate_up_proj" in b:  # CPU, quantized: gate and up in one call
                with region("Block/GateUpProj"):
                    b["gate_up_proj"](h2, role)
                gate, up = b["gate"], b["up"]
            else:
                with region("Block/GateProj"):
                    gate = k_.linear(h2, w.w_gate, None, b["gate"], role)  # [n, intermediate]
                with region("Block/UpProj"):
                    up = k_.linear(h2, w.w_up, None, b["up"], role)
            with region("Block/SwiGLU"):
                if cfg.mlp_activation == "silu":
                    act = k_.swiglu(gate, up, gate)  # in place
                else:
                    act = np.multiply(gelu_tanh(gate), up, out=gate)
        with region("Block/DownProj"):
            if fused:
                self._linear_residual(act, w.w_down, None, x1, result)  # residual 2 in the pass
                return result
            d = k_.linear(act, w.w_down, None, b["o"], role)  # [n, hidden]
            if w.post_mlp_norm is not None:
                d = k_.rmsnorm(d, w.post_mlp_norm, cfg.rms_norm_eps, b["h"])
        return k_.add(x1, d, result)  # residual 2

    def _private_cache(self) -> PagedKVCache:
        """A throwaway float32 cache for ``forward(..., cache=None)``."""
        return PagedKVCache(num_layers=1, num_kv_heads=self.config.num_kv_heads,
                            head_dim=self.config.head_dim, dtype="float32",
                            placement=self.placement)

    def __repr__(self) -> str:
        c = self.config
        return (f"DecoderLayer(index={self.index}, placement={self.placement}, hidden={c.hidden_size}, "
                f"heads={c.num_heads}/{c.num_kv_heads}x{c.head_dim}, mlp={c.intermediate_size}, "
                f"qk_norm={self.weights.q_norm is not None})")


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh form in float32 (Gemma's gelu_pytorch_tanh)."""
    inner = np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


@dataclasses.dataclass
class _Stacked:
    w_qkv: object  # [q_size + 2*kv_size, hidden] on the device
    b_qkv: object  # [q_size + 2*kv_size] or None
    w_gate_up: object  # [2*intermediate, hidden]


def _weights_on(weights: LayerWeights, placement: Placement):
    """(LayerWeights on ``placement``, the stacked Q/K/V and gate/up weights).  The separate
    projection weights are views of the stacks, so each weight is on the device once.
    Quantized weights are decoded to float32 on the way (no GPU kernels for them yet)."""
    w = dataclasses.replace(weights, **{f.name: dequantize(getattr(weights, f.name))
                                        for f in dataclasses.fields(weights)
                                        if isinstance(getattr(weights, f.name), QuantizedTensor)})
    moved = {f.name: (None if getattr(w, f.name) is None else to_device(getattr(w, f.name), placement))
             for f in dataclasses.fields(w)
             if f.name not in ("wq", "wk", "wv", "bq", "bk", "bv", "w_gate", "w_up")}
    q, kv, inter = w.wq.shape[0], w.wk.shape[0], w.w_gate.shape[0]
    w_qkv = to_device(np.concatenate([w.wq, w.wk, w.wv]), placement)
    moved.update(wq=w_qkv[0:q], wk=w_qkv[q:q + kv], wv=w_qkv[q + kv:q + 2 * kv])
    b_qkv = None
    if any(b is not None for b in (w.bq, w.bk, w.bv)):
        parts = [b if b is not None else np.zeros(n, np.float32)
                 for b, n in ((w.bq, q), (w.bk, kv), (w.bv, kv))]
        b_qkv = to_device(np.concatenate(parts), placement)
        for name, b, lo, hi in (("bq", w.bq, 0, q), ("bk", w.bk, q, q + kv),
                                ("bv", w.bv, q + kv, q + 2 * kv)):
            moved[name] = None if b is None else b_qkv[lo:hi]
    else:
        moved.update(bq=None, bk=None, bv=None)
    w_gate_up = to_device(np.concatenate([w.w_gate, w.w_up]), placement)
    moved.update(w_gate=w_gate_up[0:inter], w_up=w_gate_up[inter:2 * inter])
    return dataclasses.replace(w, **moved), _Stacked(w_qkv, b_qkv, w_gate_up)


def forward_layers(layers, batch, x):
    """Run one step (``batch``) through consecutive layers of one placement, layer by layer:
    what a backend without a whole-stack call does.  A GPU layer writes its output over its
    input."""
    for layer in layers:
        x = layer.forward_step(x, batch, out=x if is_device_array(x) else None)
    return x
