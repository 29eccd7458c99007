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
        self._k = ops.bind(self.placement)  # kernels resolved once; arrays are checked on entry
        self._bufs = (None, None)  # (rows, activation buffers) of the last call

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
                                          out=self._buffers(n)["att"])
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
                                                out=self._buffers(B)["att"])
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
    def _buffers(self, n: int) -> dict:
        """Activation buffers for n rows, views into the shared scratch (kept for the next call
        with the same n, so a decode step allocates nothing)."""
        rows, bufs = self._bufs
        if rows == n:
            return bufs
        cfg, s = self.config, self.scratch
        shapes = {"h": (n, cfg.hidden_size), "q": (n, cfg.q_size), "k": (n, cfg.kv_size),
                  "v": (n, cfg.kv_size), "att": (n, cfg.q_size), "o": (n, cfg.hidden_size),
                  "x1": (n, cfg.hidden_size), "gate": (n, cfg.intermediate_size),
                  "up": (n, cfg.intermediate_size)}
        bufs = {name: s.get(name, shape) for name, shape in shapes.items()}
        self._bufs = (n, bufs)
        return bufs

    def _qkv(self, x: np.ndarray, pos: np.ndarray):
        """Attention-block prologue: norm, projections, QK-norm, RoPE (into scratch buffers)."""
        cfg, w, k_, b = self.config, self.weights, self._k, self._buffers(x.shape[0])
        n, H, KVH, D, eps = x.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
        with region("Block/AttnNorm"):
            h = k_.rmsnorm(x, w.attn_norm, eps, b["h"])  # [n, hidden]
        with region("Block/QProj"):
            q = k_.linear(h, w.wq, w.bq, b["q"])  # [n, H*D]
        with region("Block/KProj"):
            k = k_.linear(h, w.wk, w.bk, b["k"])  # [n, KVH*D]
        with region("Block/VProj"):
            v = k_.linear(h, w.wv, w.bv, b["v"])  # [n, KVH*D]
        if w.q_norm is not None:
            with region("Block/QNorm"):  # per head, over head_dim
                k_.rmsnorm(q.reshape(n * H, D), w.q_norm, eps, q.reshape(n * H, D))
        if w.k_norm is not None:
            with region("Block/KNorm"):
                k_.rmsnorm(k.reshape(n * KVH, D), w.k_norm, eps, k.reshape(n * KVH, D))
        if self._inv_freq is not None:
            neox = cfg.rope_style == "neox"
            with region("Block/RoPE_Q"):
                k_.rope(q, pos, self._inv_freq, H, D, neox)
            with region("Block/RoPE_K"):
                k_.rope(k, pos, self._inv_freq, KVH, D, neox)
        return q, k, v

    def _finish(self, x: np.ndarray, att: np.ndarray, out):
        """O projection and residual, then the MLP block and its residual."""
        cfg, w, k_, b = self.config, self.weights, self._k, self._buffers(x.shape[0])
        with region("Block/OProj"):
            o = k_.linear(att, w.wo, None, b["o"])  # [n, hidden]
        x1 = k_.add(x, o, b["x1"])  # residual 1
        with region("Block/MlpNorm"):
            h2 = k_.rmsnorm(x1, w.mlp_norm, cfg.rms_norm_eps, b["h"])
        with region("Block/GateProj"):
            gate = k_.linear(h2, w.w_gate, None, b["gate"])  # [n, intermediate]
        with region("Block/UpProj"):
            up = k_.linear(h2, w.w_up, None, b["up"])
        with region("Block/SwiGLU"):
            act = k_.swiglu(gate, up, gate)  # in place
        with region("Block/DownProj"):
            d = k_.linear(act, w.w_down, None, b["o"])  # [n, hidden]
        result = out if out is not None else np.empty(x.shape, dtype=np.float32)
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
