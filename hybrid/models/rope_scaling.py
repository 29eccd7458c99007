"""RoPE frequencies with the scaling schemes found in real configs (default, linear, llama3, yarn,
longrope).

Each function returns ``(inv_freq [head_dim/2] float64, attention_factor)``; ``attention_factor``
multiplies cos and sin (yarn), which scales every score by its square.  The formulas follow
Hugging Face transformers' ``modeling_rope_utils``, computed in float64.
"""

from __future__ import annotations

import math

import numpy as np


def default_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def rope_frequencies(head_dim: int, theta: float, scaling: "dict | None",
                     max_position: "int | None" = None):
    """(inv_freq, attention_factor) for ``scaling`` (a HF ``rope_scaling`` dict, or None).
    ValueError names a parameter that is not a finite number in its range."""
    if not (math.isfinite(theta) and theta > 0):
        raise ValueError(f"rope_theta must be a finite number > 0, got {theta}")
    if scaling:
        for key in ("factor", "low_freq_factor", "high_freq_factor", "attention_factor",
                    "beta_fast", "beta_slow", "original_max_position_embeddings"):
            v = scaling.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or v <= 0):
                raise ValueError(f"rope_scaling {key} must be a finite number > 0, got {v!r}")
    inv, attn = _frequencies(head_dim, theta, scaling, max_position)
    if not (np.isfinite(inv).all() and (inv > 0).all() and math.isfinite(attn) and attn > 0):
        raise ValueError(f"rope_scaling {scaling!r} gives frequencies that are not finite and "
                         f"positive")
    return inv, attn


def _frequencies(head_dim: int, theta: float, scaling: "dict | None",
                 max_position: "int | None" = None):
    inv = default_inv_freq(head_dim, theta)
    if not scaling:
        return inv, 1.0
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(scaling["factor"]), 1.0
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        factor = float(scaling["factor"])
        old_ctx = float(scaling.get("original_max_position_embeddings") or max_position or 4096)
        beta_fast = float(scaling.get("beta_fast") or 32)
        beta_slow = float(scaling.get("beta_slow") or 1)
        def mscale(scale, m=1.0):
            return 0.1 * m * math.log(scale) + 1.0 if scale > 1 else 1.0

        attn = scaling.get("attention_factor")
        if attn is None:
            m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
            attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

        def dim_for(rotations):
            return (head_dim * math.log(old_ctx / (rotations * 2 * math.pi))) / (2 * math.log(theta))

        lo, hi = dim_for(beta_fast), dim_for(beta_slow)
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, head_dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extrapolation = 1 - ramp
        out = (inv / factor) * (1 - extrapolation) + inv * extrapolation
        return out, float(attn)
    if kind == "longrope":
        # Phi-3/4: per-pair divisors, the long ones where the context exceeds the original (the
        # choice llama.cpp makes once for the context; transformers makes it per call)
        old_ctx = float(scaling["original_max_position_embeddings"])
        long = bool(max_position) and max_position > old_ctx
        factors = np.asarray(scaling["long_factor" if long else "short_factor"], dtype=np.float64)
        if factors.shape != inv.shape or not (np.isfinite(factors).all() and (factors > 0).all()):
            raise ValueError(f"rope_scaling {'long' if long else 'short'}_factor must hold "
                             f"{inv.shape[0]} finite numbers > 0")
        attn = scaling.get("attention_factor")
        if attn is None:
            factor = float(scaling.get("factor") or (max_position / old_ctx if max_position
                                                     else 1.0))
            attn = math.sqrt(1 + math.log(factor) / math.log(old_ctx)) if factor > 1 else 1.0
        return inv / factors, float(attn)
    raise ValueError(f"unsupported RoPE scaling type {kind!r} (supported: default, linear, "
                     f"llama3, yarn, longrope)")
