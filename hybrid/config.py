"""DecoderConfig and LayerWeights: shapes, defaults as in the seed, and validation."""

from __future__ import annotations

import math

from dataclasses import dataclass, fields

import numpy as np

from .quant.tensor import QuantizedTensor

ROPE_STYLES = ("neox", "gptj")
# the projection weights: float arrays or QuantizedTensors (kept in their encoding)
LINEAR_WEIGHTS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass
class DecoderConfig:
    """Shape and constants of one Llama/Qwen-style decoder layer.

    Defaults follow the seed: ``num_kv_heads`` 0 -> ``num_heads``; ``intermediate_size`` 0 ->
    ``4 * hidden_size``; ``head_dim`` 0 -> ``hidden_size // num_heads``.  ``rope_theta`` 0 turns
    rotary embedding off.  ``rope_style`` is ``"neox"`` (rotate-half: Llama, Qwen; default) or
    ``"gptj"`` (adjacent pairs).  ``rope_inv_freq`` overrides the per-pair frequencies (scaled RoPE);
    ``attn_scale`` overrides the softmax scale 1/sqrt(head_dim) (YaRN's attention factor).
    ``rope_dims`` < head_dim rotates only each head's first rope_dims dimensions (partial rotary,
    Phi-4); ``rope_attn_factor`` then multiplies the rotated part's cos and sin (LongRoPE's
    attention factor), which scales that part of every score by its square.
    ``sliding_window`` > 0: each token attends to itself and the window - 1 tokens before it
    (Mistral, Phi-3-mini), on the CPU.  ``mlp_activation`` "gelu_tanh" gates with GELU's tanh
    form instead of SiLU (Gemma's GeGLU).
    """

    hidden_size: int
    num_heads: int
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    rope_style: str = "neox"
    rope_inv_freq: "np.ndarray | None" = None
    attn_scale: "float | None" = None  # softmax scale; None: 1/sqrt(head_dim)
    rope_dims: int = 0  # rotated dimensions of a head; 0: all
    rope_attn_factor: float = 1.0
    sliding_window: int = 0  # > 0: a token attends to the last sliding_window positions only
    mlp_activation: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
    attn_softcap: float = 0.0  # > 0: attention scores s -> attn_softcap * tanh(s / attn_softcap)

    def __post_init__(self):
        self.hidden_size = _positive_int("hidden_size", self.hidden_size)
        self.num_heads = _positive_int("num_heads", self.num_heads)
        if not self.num_kv_heads:
            self.num_kv_heads = self.num_heads
        self.num_kv_heads = _positive_int("num_kv_heads", self.num_kv_heads)
        if not self.intermediate_size:
            self.intermediate_size = 4 * self.hidden_size
        self.intermediate_size = _positive_int("intermediate_size", self.intermediate_size)
        if not self.head_dim:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"head_dim not given and hidden_size ({self.hidden_size}) is not "
                                 f"a multiple of num_heads ({self.num_heads})")
            self.head_dim = self.hidden_size // self.num_heads
        self.head_dim = _positive_int("head_dim", self.head_dim)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")
        if self.rope_style not in ROPE_STYLES:
            raise ValueError(f"rope_style must be one of {ROPE_STYLES}, got {self.rope_style!r}")
        self.rope_theta = float(self.rope_theta)
        if not (math.isfinite(self.rope_theta) and self.rope_theta >= 0):
            raise ValueError(f"rope_theta must be a finite number >= 0 (0 disables RoPE), got "
                             f"{self.rope_theta}")
        if self.rope_enabled and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if not self.rope_dims:
            self.rope_dims = self.head_dim
        self.rope_dims = _positive_int("rope_dims", self.rope_dims)
        if self.rope_dims > self.head_dim or self.rope_dims % 2:
            raise ValueError(f"rope_dims must be even and at most head_dim ({self.head_dim}), "
                             f"got {self.rope_dims}")
        if isinstance(self.sliding_window, bool) or not isinstance(
                self.sliding_window, (int, np.integer)) or self.sliding_window < 0:
            raise ValueError(f"sliding_window must be an integer >= 0 (0: none), got "
                             f"{self.sliding_window!r}")
        self.sliding_window = int(self.sliding_window)
        if self.mlp_activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"mlp_activation must be 'silu' or 'gelu_tanh', got "
                             f"{self.mlp_activation!r}")
        self.attn_softcap = float(self.attn_softcap)
        if not (math.isfinite(self.attn_softcap) and self.attn_softcap >= 0):
            raise ValueError(f"attn_softcap must be a finite number >= 0 (0: none), got "
                             f"{self.attn_softcap}")
        self.rope_attn_factor = float(self.rope_attn_factor)
        if not (math.isfinite(self.rope_attn_factor) and self.rope_attn_factor > 0):
            raise ValueError(f"rope_attn_factor must be a finite number > 0, got "
                             f"{self.rope_attn_factor}")
        if self.rope_dims == self.head_dim and self.rope_attn_factor != 1.0:
            # every dimension rotated: the factor scales whole scores, i.e. the softmax scale
            if self.attn_scale is None:
                self.attn_scale = self.rope_attn_factor ** 2 / math.sqrt(self.head_dim)
            self.rope_attn_factor = 1.0
        self.rms_norm_eps = float(self.rms_norm_eps)
        if not (math.isfinite(self.rms_norm_eps) and 0 < self.rms_norm_eps < 1):
            raise ValueError(f"rms_norm_eps must be a finite number in (0, 1), got "
                             f"{self.rms_norm_eps}")
        if self.attn_scale is not None:
            self.attn_scale = float(self.attn_scale)
            if not (math.isfinite(self.attn_scale) and self.attn_scale > 0):
                raise ValueError(f"attn_scale must be a finite number > 0, got {self.attn_scale}")
        if self.rope_inv_freq is not None:
            f = np.ascontiguousarray(self.rope_inv_freq, dtype=np.float64)
            if f.shape != (self.rope_dims // 2,):
                raise ValueError(f"rope_inv_freq must have shape ({self.rope_dims // 2},), "
                                 f"got {f.shape}")
            if not (np.isfinite(f).all() and (f > 0).all()):
                raise ValueError("rope_inv_freq must hold finite frequencies > 0 (the RoPE "
                                 "scaling parameters give others)")
            self.rope_inv_freq = f

    @property
    def partial_rotary(self) -> bool:
        return self.rope_dims < self.head_dim

    @property
    def rope_enabled(self) -> bool:
        return self.rope_theta != 0 or self.rope_inv_freq is not None

    @property
    def softmax_scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else 1.0 / float(np.sqrt(self.head_dim))

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def inv_freq(self) -> np.ndarray:
        """[rope_dims/2] float64 angle per position of each rotated pair."""
        if self.attn_scale is not None:
            self.attn_scale = float(self.attn_scale)
            if not self.attn_scale > 0:
                raise ValueError(f"attn_scale must be > 0, got {self.attn_scale}")
        if self.rope_inv_freq is not None:
            return self.rope_inv_freq
        d = self.rope_dims
        return 1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))


@dataclass
class LayerWeights:
    """Weights of one decoder layer, linear weights stored ``[out_features, in_features]``.

    attn_norm [hidden]; wq [H*D, hidden]; wk, wv [KVH*D, hidden]; wo [hidden, H*D];
    mlp_norm [hidden]; w_gate, w_up [intermediate, hidden]; w_down [hidden, intermediate];
    optional q_norm, k_norm [D] (Qwen3, per head) or [H*D], [KVH*D] (OLMoE, over all heads)
    and bq [H*D], bk, bv [KVH*D] (Qwen2);
    optional post_attn_norm, post_mlp_norm [hidden]: Gemma's sandwich norms on the attention
    and MLP outputs before each residual add.
    ``experts`` (hybrid.moe.ExpertWeights) replaces w_gate/w_up/w_down with a mixture of
    experts (Mixtral, Qwen3-MoE, OLMoE); those three are then None.  The projection weights may be ``hybrid.QuantizedTensor`` (F16, BF16, Q8_0, Q4_K, ...): they
    stay in their encoding and the backend's kernels for that format multiply them.
    """

    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    mlp_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray
    q_norm: "np.ndarray | None" = None
    k_norm: "np.ndarray | None" = None
    bq: "np.ndarray | None" = None
    bk: "np.ndarray | None" = None
    bv: "np.ndarray | None" = None
    post_attn_norm: "np.ndarray | None" = None
    post_mlp_norm: "np.ndarray | None" = None
    experts: object = None  # hybrid.moe.ExpertWeights

    def expected_shapes(self, cfg: DecoderConfig, qk_norm_whole: "bool | None" = None) -> dict:
        """Each weight's shape; the QK-norms cover one head, or all heads where
        ``qk_norm_whole`` (None: as this layer's q_norm does)."""
        h, q, kv, i, d = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size, cfg.head_dim
        if qk_norm_whole is None:
            qk_norm_whole = self is not None and self.q_norm is not None \
                and np.shape(self.q_norm) == (q,) and q != d
        return {
            "attn_norm": (h,), "wq": (q, h), "wk": (kv, h), "wv": (kv, h), "wo": (h, q),
            "mlp_norm": (h,), "w_gate": (i, h), "w_up": (i, h), "w_down": (h, i),
            "q_norm": (q,) if qk_norm_whole else (d,), "k_norm": (kv,) if qk_norm_whole else (d,),
            "bq": (q,), "bk": (kv,), "bv": (kv,), "post_attn_norm": (h,), "post_mlp_norm": (h,),
        }

    def validated(self, cfg: DecoderConfig) -> "LayerWeights":
        """A copy whose arrays are float32 C-contiguous with the shapes ``cfg`` asks for.

        Arrays that already are float32 C-contiguous are shared, not copied; QuantizedTensors
        are kept as they are (shape-checked).  Raises ValueError
        naming the weight for a wrong shape, TypeError for a non-floating dtype.
        """
        shapes = self.expected_shapes(cfg)
        out = {}
        moe = self.experts is not None
        for f in fields(self):
            a = getattr(self, f.name)
            if f.name == "experts":
                out[f.name] = None if a is None else a.validated(cfg.hidden_size)
                continue
            if moe and f.name in ("w_gate", "w_up", "w_down"):
                if a is not None:
                    raise ValueError(f"weight {f.name} must be None in a mixture-of-experts "
                                     f"layer (the experts hold the MLP)")
                out[f.name] = None
                continue
            if a is None:
                if f.name in ("q_norm", "k_norm", "bq", "bk", "bv", "post_attn_norm",
                              "post_mlp_norm"):
                    out[f.name] = None
                    continue
                raise ValueError(f"weight {f.name} is required")
            if f.name in LINEAR_WEIGHTS and isinstance(a, QuantizedTensor):
                if a.shape != shapes[f.name]:
                    raise ValueError(f"weight {f.name} ({a.format.name}) has shape {a.shape}, "
                                     f"expected {shapes[f.name]} for {cfg}")
                out[f.name] = a
                continue
            arr = np.asarray(a)
            if not np.issubdtype(arr.dtype, np.floating):
                raise TypeError(f"weight {f.name} must be a floating-point array, got {arr.dtype}")
            if arr.shape != shapes[f.name]:
                raise ValueError(f"weight {f.name} has shape {arr.shape}, expected "
                                 f"{shapes[f.name]} for {cfg}")
            out[f.name] = np.ascontiguousarray(arr, dtype=np.float32)
        return LayerWeights(**out)
