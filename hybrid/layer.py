"""DecoderLayer: the seed's hybrid decoder block, one step per line.

    x ─ RMSNorm ─ Q,K,V proj ─ [QK-norm] ─ RoPE ─ append K,V ─ paged attention ─ O proj ─ + ─┐
    └──────────────────────────────────────────────────────────────────────────────────────┘
    x1 ─ RMSNorm ─ gate, up proj ─ SwiGLU ─ down proj ─ + x1 ─ out

This module knows the public ops, the KV cache and the profiler; it knows no backend.
"""

from __future__ import annotations

import numpy as np

from . import ops, registry
from .config import DecoderConfig, LayerWeights
from .kvcache import PagedKVCache
from .placement import Placement
from .profile import region
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
    """

    def __init__(self, config: DecoderConfig, weights: LayerWeights, index: int = 0,
                 placement="cpu", scratch: "Scratch | None" = None):
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
        if not isinstance(weights, LayerWeights):
            raise TypeError(f"weights must be LayerWeights, got {type(weights).__name__}")
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise ValueError(f"index must be an integer >= 0, got {index!r}")
        self.config = config
        self.weights = weights.validated(config)
        self.index = int(index)
        self.placement = Placement.parse(placement)
        registry.require(self.placement)  # e.g. cuda:0 without a CUDA backend: says why
        self.scratch = scratch if scratch is not None else Scratch()
        self._inv_freq = config.inv_freq() if config.rope_enabled else None

    # ------------------------------------------------------------------ validation
    def _input(self, hidden, out, n_expected: "int | None" = None):
        x = ops.as_f32("hidden", hidden, 2)  # [n, hidden_size] float32, a copy if converted
        if x.shape[1] != self.config.hidden_size:
            raise ValueError(f"hidden has {x.shape[1]} features; layer {self.index} expects "
                             f"hidden_size={self.config.hidden_size}")
        if n_expected is not None and x.shape[0] != n_expected:
            raise ValueError(f"hidden has {x.shape[0]} rows for {n_expected} sequences")
        if out is not None:
            ops._out("forward", out, x.shape)
        return x

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
        held = cache.layer_len(self.index)
        if held != cache.seq_len:
            raise ValueError(f"{name} layer {self.index} already holds {held - cache.seq_len} "
                             f"uncommitted tokens after seq_len={cache.seq_len}; commit or "
                             f"truncate before the next step")

    # ------------------------------------------------------------------ forward
    def forward(self, hidden, positions, cache: "PagedKVCache | None" = None, *, out=None):
        """Run the layer on one sequence (prefill or decode).

        hidden [n_tokens, hidden_size] float32 (other float dtypes are converted); positions
        [n_tokens] RoPE positions; cache: the sequence's PagedKVCache (the new K/V are appended
        to layer ``index``; the caller commits), or None for attention over these tokens alone.
        Returns [n_tokens, hidden_size] float32 (``out`` if given; it may be ``hidden``).
        On error the cache and ``hidden`` are left exactly as they were.
        """
        x = self._input(hidden, out)  # [n, hidden]
        n = x.shape[0]
        pos = ops.positions_array(positions, n)  # [n] int64
        if cache is None:
            cache, layer = self._private_cache(), 0
        else:
            self._check_cache(cache)
            layer = self.index
        q, k, v = self._qkv(x, pos)  # [n, H*D], [n, KVH*D], [n, KVH*D]
        start = cache.layer_len(layer)
        with region("Block/Attention"):
            cache.append(layer, k, v)
            try:
                att = ops.paged_attention(q, cache, layer, scale=self.config.softmax_scale,
                                          out=self.scratch.get("att", q.shape))
            except BaseException:
                cache._rollback_layer(layer, start)
                raise
        try:
            return self._finish(x, att, out)
        except BaseException:
            cache._rollback_layer(layer, start)
            raise

    def forward_batch(self, hidden, positions, caches, *, out=None):
        """Decode one token for each of B sequences, each with its own cache and position.

        hidden [B, hidden_size]; positions [B]; caches: list of B PagedKVCache (distinct, same
        block size and KV dtype).  Returns [B, hidden_size].  On error no cache is changed.
        """
        x = self._input(hidden, out)  # [B, hidden]
        B = x.shape[0]
        if not isinstance(caches, (list, tuple)):
            raise TypeError(f"caches must be a list of PagedKVCache, got {type(caches).__name__}")
        if len(caches) != B:
            raise ValueError(f"caches has {len(caches)} entries for a batch of {B} tokens")
        pos = ops.positions_array(positions, B)  # [B] int64
        ops.check_batch_caches(caches, self.index, B)
        for i, c in enumerate(caches):
            self._check_cache(c, f"caches[{i}]")
        q, k, v = self._qkv(x, pos)
        starts = [c.layer_len(self.index) for c in caches]
        with region("Block/Attention"):
            try:
                for b, c in enumerate(caches):
                    c.append(self.index, k[b:b + 1], v[b:b + 1])
                att = ops.paged_attention_batch(q, caches, self.index,
                                                scale=self.config.softmax_scale,
                                                out=self.scratch.get("att", q.shape))
            except BaseException:
                self._rollback_all(caches, starts)
                raise
        try:
            return self._finish(x, att, out)
        except BaseException:
            self._rollback_all(caches, starts)
            raise

    def _rollback_all(self, caches, starts) -> None:
        for c, s in zip(caches, starts):
            c._rollback_layer(self.index, s)

    __call__ = forward

    # ------------------------------------------------------------------ steps
    def _qkv(self, x: np.ndarray, pos: np.ndarray):
        """Attention-block prologue: norm, projections, QK-norm, RoPE (into scratch buffers)."""
        cfg, w, s, dev = self.config, self.weights, self.scratch, self.placement
        n, H, KVH, D, eps = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
        with region("Block/AttnNorm"):
            h = ops.rmsnorm(x, w.attn_norm, eps, out=s.get("h", x.shape), device=dev)
        with region("Block/QProj"):
            q = ops.linear(h, w.wq, w.bq, out=s.get("q", (n, H * D)), device=dev)
        with region("Block/KProj"):
            k = ops.linear(h, w.wk, w.bk, out=s.get("k", (n, KVH * D)), device=dev)
        with region("Block/VProj"):
            v = ops.linear(h, w.wv, w.bv, out=s.get("v", (n, KVH * D)), device=dev)
        if w.q_norm is not None:
            with region("Block/QNorm"):  # per head, over head_dim
                ops.rmsnorm(q.reshape(n * H, D), w.q_norm, eps, out=q.reshape(n * H, D), device=dev)
        if w.k_norm is not None:
            with region("Block/KNorm"):
                ops.rmsnorm(k.reshape(n * KVH, D), w.k_norm, eps, out=k.reshape(n * KVH, D),
                            device=dev)
        if self._inv_freq is not None:
            with region("Block/RoPE_Q"):
                ops.rope(q, pos, self._inv_freq, num_heads=H, head_dim=D, style=cfg.rope_style,
                         out=q, device=dev)
            with region("Block/RoPE_K"):
                ops.rope(k, pos, self._inv_freq, num_heads=KVH, head_dim=D, style=cfg.rope_style,
                         out=k, device=dev)
        return q, k, v

    def _finish(self, x: np.ndarray, att: np.ndarray, out):
        """O projection and residual, then the MLP block and its residual."""
        cfg, w, s, dev = self.config, self.weights, self.scratch, self.placement
        n, hid, inter = x.shape[0], cfg.hidden_size, cfg.intermediate_size
        with region("Block/OProj"):
            o = ops.linear(att, w.wo, out=s.get("o", (n, hid)), device=dev)
        x1 = ops.add(x, o, out=s.get("x1", (n, hid)), device=dev)  # residual 1
        with region("Block/MlpNorm"):
            h2 = ops.rmsnorm(x1, w.mlp_norm, cfg.rms_norm_eps, out=s.get("h", (n, hid)), device=dev)
        with region("Block/GateProj"):
            gate = ops.linear(h2, w.w_gate, out=s.get("gate", (n, inter)), device=dev)
        with region("Block/UpProj"):
            up = ops.linear(h2, w.w_up, out=s.get("up", (n, inter)), device=dev)
        with region("Block/SwiGLU"):
            act = ops.swiglu(gate, up, out=gate, device=dev)
        with region("Block/DownProj"):
            d = ops.linear(act, w.w_down, out=s.get("o", (n, hid)), device=dev)
        result = out if out is not None else np.empty((n, hid), dtype=np.float32)
        return ops.add(x1, d, out=result, device=dev)  # residual 2

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
