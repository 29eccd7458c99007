"""Random weights and named shape presets for tests, benchmarks, the demo and the GPU check (no
model files needed)."""

from __future__ import annotations

import numpy as np

from .config import DecoderConfig, LayerWeights

PRESETS = {
    "smollm2-135m": dict(hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64,
                         intermediate_size=1536, rope_theta=100000.0, rms_norm_eps=1e-5),
    "llama3-8b": dict(hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                      intermediate_size=14336, rope_theta=500000.0, rms_norm_eps=1e-5),
}


def random_weights(cfg: DecoderConfig, rng: np.random.Generator, qk_norm: "bool | str" = False,
                   std: float = 0.02) -> LayerWeights:
    """Random float32 weights with the shapes ``cfg`` asks for (norm weights near 1); qk_norm
    True: QK-norms per head (Qwen3), "whole": over all heads (OLMoE)."""
    def mat(o, i):
        return (rng.standard_normal((o, i), dtype=np.float32) * std)

    def norm(d):
        return (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)

    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return LayerWeights(
        attn_norm=norm(h), wq=mat(q, h), wk=mat(kv, h), wv=mat(kv, h), wo=mat(h, q),
        mlp_norm=norm(h), w_gate=mat(inter, h), w_up=mat(inter, h), w_down=mat(h, inter),
        q_norm=(norm(q) if qk_norm == "whole" else norm(cfg.head_dim)) if qk_norm else None,
        k_norm=(norm(kv) if qk_norm == "whole" else norm(cfg.head_dim)) if qk_norm else None)
