"""Every supported architecture in one table: what selects it in a file, what its tensors are
called in each format, and the choices its layers make.  Both loaders read only this table for
what differs between architectures; adding one is one entry here (docs/architectures.md).

Tensor names are templates: ``{i}`` is the layer, ``{e}`` an expert; "NAME@part" reads a part
of a fused matrix (q/k/v of a fused Q/K/V projection, gate/up of a fused gate/up) as a view of
its rows (weights.split_fused).
"""

from __future__ import annotations

from dataclasses import dataclass, field

_HF = "model.layers.{i}."
HF_LAYER = {  # LayerWeights field -> safetensors name (Hugging Face Llama layout)
    "attn_norm": _HF + "input_layernorm.weight", "wq": _HF + "self_attn.q_proj.weight",
    "wk": _HF + "self_attn.k_proj.weight", "wv": _HF + "self_attn.v_proj.weight",
    "wo": _HF + "self_attn.o_proj.weight", "mlp_norm": _HF + "post_attention_layernorm.weight",
    "w_gate": _HF + "mlp.gate_proj.weight", "w_up": _HF + "mlp.up_proj.weight",
    "w_down": _HF + "mlp.down_proj.weight", "q_norm": _HF + "self_attn.q_norm.weight",
    "k_norm": _HF + "self_attn.k_norm.weight", "bq": _HF + "self_attn.q_proj.bias",
    "bk": _HF + "self_attn.k_proj.bias", "bv": _HF + "self_attn.v_proj.bias",
}
GGUF_LAYER = {  # LayerWeights field -> GGUF name (llama.cpp's)
    "attn_norm": "blk.{i}.attn_norm.weight", "wq": "blk.{i}.attn_q.weight",
    "wk": "blk.{i}.attn_k.weight", "wv": "blk.{i}.attn_v.weight",
    "wo": "blk.{i}.attn_output.weight", "mlp_norm": "blk.{i}.ffn_norm.weight",
    "w_gate": "blk.{i}.ffn_gate.weight", "w_up": "blk.{i}.ffn_up.weight",
    "w_down": "blk.{i}.ffn_down.weight", "q_norm": "blk.{i}.attn_q_norm.weight",
    "k_norm": "blk.{i}.attn_k_norm.weight", "bq": "blk.{i}.attn_q.bias",
    "bk": "blk.{i}.attn_k.bias", "bv": "blk.{i}.attn_v.bias",
    "post_attn_norm": "blk.{i}.post_attention_norm.weight",
    "post_mlp_norm": "blk.{i}.post_ffw_norm.weight",
}
# GGUF's stacked experts: router, then gate, up and down of every expert in one tensor each
GGUF_EXPERTS = ("blk.{i}.ffn_gate_inp.weight", "blk.{i}.ffn_gate_exps.weight",
                "blk.{i}.ffn_up_exps.weight", "blk.{i}.ffn_down_exps.weight")


@dataclass(frozen=True)
class Experts:
    """A safetensors mixture of experts: router, gate, up, down templates; which layers are
    sparse (``every`` n-th layer, none of ``dense_key``'s); whether the top-k weights are
    renormalised (``normalize_key`` in config.json, else ``normalize``)."""

    names: tuple
    sparse_step_key: "str | None" = None
    dense_key: "str | None" = None
    normalize_key: "str | None" = None
    normalize: bool = True


@dataclass(frozen=True)
class Architecture:
    name: str  # ModelWeights.arch
    hf_classes: tuple = ()  # config.json "architectures" that select it
    gguf_name: "str | None" = None  # GGUF general.architecture that selects it
    hf_layer: dict = field(default_factory=lambda: HF_LAYER)
    gguf_layer: dict = field(default_factory=lambda: GGUF_LAYER)
    # llama.cpp's converter permutes the Q/K rows of its "llama" files for adjacent-pair RoPE
    gguf_rope_style: str = "neox"
    hf_experts: "Experts | None" = None  # GGUF files say so in {arch}.expert_count
    gguf_experts_required: bool = False
    gguf_experts_normalize: bool = True  # GGUF: the top-k weights rescaled to sum to 1
    # QK-norm over all heads at once (weights [H*D], [KVH*D]) rather than per head ([D])
    qk_norm_whole: bool = False
    # Gemma: GeGLU, sandwich norms, RMSNorm weights stored as w for x * (1 + w) in safetensors
    # (llama.cpp's converter adds the 1), embeddings scaled by sqrt(hidden), a local sliding
    # window on all but every gguf_global_every-th layer (safetensors: config's layer_types)
    mlp_activation: str = "silu"
    sandwich_norms: bool = False
    hf_norm_offset: float = 0.0
    embed_scale_sqrt_hidden: bool = False
    gguf_global_every: int = 0
    gguf_local_rope_base: "float | None" = 10000.0  # None: the global base


def _fused(layer: dict, qkv: str, gate_up: str) -> dict:
    return dict(layer, wq=qkv + "@q", wk=qkv + "@k", wv=qkv + "@v", w_gate=gate_up + "@gate",
                w_up=gate_up + "@up")


ARCHITECTURES = {a.name: a for a in (
    Architecture("llama", ("LlamaForCausalLM", "MistralForCausalLM"), "llama",
                 gguf_rope_style="gptj"),
    Architecture("qwen2", ("Qwen2ForCausalLM",), "qwen2"),
    Architecture("qwen3", ("Qwen3ForCausalLM",), "qwen3"),
    Architecture("mixtral", ("MixtralForCausalLM",), None,  # GGUF: "llama" with experts
                 hf_experts=Experts((_HF + "block_sparse_moe.gate.weight",
                                     _HF + "block_sparse_moe.experts.{e}.w1.weight",
                                     _HF + "block_sparse_moe.experts.{e}.w3.weight",
                                     _HF + "block_sparse_moe.experts.{e}.w2.weight"))),
    Architecture("qwen3moe", ("Qwen3MoeForCausalLM",), "qwen3moe", gguf_experts_required=True,
                 hf_experts=Experts((_HF + "mlp.gate.weight",
                                     _HF + "mlp.experts.{e}.gate_proj.weight",
                                     _HF + "mlp.experts.{e}.up_proj.weight",
                                     _HF + "mlp.experts.{e}.down_proj.weight"),
                                    sparse_step_key="decoder_sparse_step",
                                    dense_key="mlp_only_layers", normalize_key="norm_topk_prob")),
    # OLMoE: Qwen3-MoE's expert layout, QK-norm over all heads, top-k weights not rescaled
    Architecture("olmoe", ("OlmoeForCausalLM",), "olmoe", gguf_experts_required=True,
                 gguf_experts_normalize=False, qk_norm_whole=True,
                 hf_experts=Experts((_HF + "mlp.gate.weight",
                                     _HF + "mlp.experts.{e}.gate_proj.weight",
                                     _HF + "mlp.experts.{e}.up_proj.weight",
                                     _HF + "mlp.experts.{e}.down_proj.weight"),
                                    normalize_key="norm_topk_prob", normalize=False)),
    Architecture("gemma2", ("Gemma2ForCausalLM",), "gemma2",
                 hf_layer=dict(HF_LAYER, mlp_norm=_HF + "pre_feedforward_layernorm.weight",
                               post_attn_norm=_HF + "post_attention_layernorm.weight",
                               post_mlp_norm=_HF + "post_feedforward_layernorm.weight"),
                 mlp_activation="gelu_tanh", sandwich_norms=True, hf_norm_offset=1.0,
                 embed_scale_sqrt_hidden=True, gguf_global_every=2, gguf_local_rope_base=None),
    Architecture("gemma3", ("Gemma3ForCausalLM",), "gemma3",
                 hf_layer=dict(HF_LAYER, mlp_norm=_HF + "pre_feedforward_layernorm.weight",
                               post_attn_norm=_HF + "post_attention_layernorm.weight",
                               post_mlp_norm=_HF + "post_feedforward_layernorm.weight"),
                 mlp_activation="gelu_tanh", sandwich_norms=True, hf_norm_offset=1.0,
                 embed_scale_sqrt_hidden=True, gguf_global_every=6),
    Architecture("phi3", ("Phi3ForCausalLM",), "phi3",
                 hf_layer=_fused(HF_LAYER, _HF + "self_attn.qkv_proj.weight",
                                 _HF + "mlp.gate_up_proj.weight"),
                 gguf_layer=_fused(GGUF_LAYER, "blk.{i}.attn_qkv.weight",
                                   "blk.{i}.ffn_up.weight")),
)}


def by_hf_classes(names) -> "Architecture | None":
    """The architecture of a config.json's "architectures" list (None: not supported)."""
    return next((a for n in names for a in ARCHITECTURES.values()
                 if isinstance(n, str) and n in a.hf_classes), None)


def by_gguf_name(name) -> "Architecture | None":
    """The architecture of a GGUF general.architecture (None: not supported)."""
    return next((a for a in ARCHITECTURES.values() if a.gguf_name == name), None)


def hf_class_names() -> list:
    return sorted(n for a in ARCHITECTURES.values() for n in a.hf_classes)


def gguf_names() -> list:
    return [a.gguf_name for a in ARCHITECTURES.values() if a.gguf_name]
