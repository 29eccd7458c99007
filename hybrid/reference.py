"""Float64 NumPy twin of every kernel: the specification and the test oracle.

Only NumPy is imported here, so the math can be read and checked without building anything.
Shapes use H query heads, KVH KV heads, D head_dim, G = H // KVH (the GQA group size).
"""

from __future__ import annotations

import numpy as np


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def rmsnorm(x, weight, eps: float) -> np.ndarray:
    """x [rows, dim] / sqrt(mean(x**2, row) + eps) * weight [dim]."""
    x = _f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * _f64(weight)


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """[head_dim/2] angle per position of pair i: theta ** (-2i / head_dim)."""
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def rope(x, positions, inv_freq, num_heads: int, head_dim: int, style: str = "neox") -> np.ndarray:
    """Rotate each head of x [rows, H*D] by angle positions[row] * inv_freq[i] per pair i.

    neox: pairs (i, i + D/2) ("rotate_half", Llama/Qwen); gptj: pairs (2i, 2i+1).
    """
    x = _f64(x).reshape(-1, num_heads, head_dim)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * _f64(inv_freq)[None, :]  # [rows, D/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    half = head_dim // 2
    if style == "neox":
        a, b = x[..., :half], x[..., half:]
        out = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    elif style == "gptj":
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
    else:
        raise ValueError(f"unknown rope style {style!r}")
    return out.reshape(-1, num_heads * head_dim)


def silu(x) -> np.ndarray:
    x = _f64(x)
    return x / (1.0 + np.exp(-x))


def swiglu(gate, up) -> np.ndarray:
    """silu(gate) * up."""
    return silu(gate) * _f64(up)


def add(a, b) -> np.ndarray:
    return _f64(a) + _f64(b)


def linear(x, weight, bias=None) -> np.ndarray:
    """x [rows, in] @ weight [out, in].T (+ bias [out])."""
    y = _f64(x) @ _f64(weight).T
    return y if bias is None else y + _f64(bias)


def attention(q, k, v, q_positions, num_heads: int, num_kv_heads: int, head_dim: int,
              scale: "float | None" = None, window: int = 0, softcap: float = 0.0,
              kv_dtype: str = "float32") -> np.ndarray:
    """Causal GQA attention over dense keys.

    q [n, H*D]; k, v [kv_len, KVH*D]; query row i sees key positions 0 .. q_positions[i] (with a
    sliding ``window`` > 0, the last ``window`` of them).  Query head h reads KV head h // G.
    kv_dtype "q8_0": the keys came from a q8_0 cache, which is scored with 8-bit queries (as
    llama.cpp scores a q8_0 K cache): each float32 scaled query head quantized exactly as
    quantize_activations quantizes an activation row, then dequantized.
    Returns [n, H*D].
    """
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    if kv_dtype == "q8_0":
        qs = np.asarray(q, np.float32).reshape(-1, head_dim) * np.float32(scale)
        qa, qd, _ = quantize_activations(qs)
        q = qa.reshape(-1, head_dim // 32, 32) * _f64(qd)[..., None]
        scale = 1.0
    q = _f64(q).reshape(-1, num_heads, head_dim)
    k = _f64(k).reshape(-1, num_kv_heads, head_dim)
    v = _f64(v).reshape(-1, num_kv_heads, head_dim)
    g = num_heads // num_kv_heads
    out = np.zeros_like(q)
    for i, p in enumerate(np.asarray(q_positions)):
        lo = max(0, p + 1 - window) if window > 0 else 0
        for h in range(num_heads):
            kh = h // g
            s = (k[lo: p + 1, kh] @ q[i, h]) * scale  # [p+1-lo]
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            w = np.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ v[lo: p + 1, kh]
    return out.reshape(-1, num_heads * head_dim)


def moe_route(scores, top_k: int, normalize: bool):
    """(ids [n, top_k], weights [n, top_k] float64): each row's top_k experts by router score
    [n, E], best first (ties: the lower id), and their softmax probabilities, rescaled to sum
    to 1 when ``normalize``."""
    s = _f64(scores)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-s, axis=1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, ids, 1)
    return ids, (w / w.sum(axis=1, keepdims=True) if normalize else w)


def gather_blocks(blocks, kv_len: int) -> np.ndarray:
    """Walk a block table: blocks is the list of [KVH, block_size, D] arrays in position order;
    returns the first kv_len positions as [kv_len, KVH*D] float64."""
    if kv_len == 0:
        return np.zeros((0, 0))
    kvh, bs, d = blocks[0].shape
    rows = []
    for p in range(kv_len):
        b, slot = divmod(p, bs)
        rows.append(_f64(blocks[b][:, slot, :]).reshape(kvh * d))
    return np.stack(rows)


def paged_attention(q, k_blocks, v_blocks, start_pos: int, num_heads: int, num_kv_heads: int,
                    head_dim: int, scale: "float | None" = None, window: int = 0,
                    softcap: float = 0.0, kv_dtype: str = "float32") -> np.ndarray:
    """Causal attention of q [n, H*D] whose row i sits at position start_pos + i, over the keys and
    values found by walking the block lists (only positions < start_pos + n are read)."""
    n = np.asarray(q).shape[0]
    kv_len = start_pos + n
    k = gather_blocks(k_blocks, kv_len)
    v = gather_blocks(v_blocks, kv_len)
    return attention(q, k, v, np.arange(start_pos, kv_len), num_heads, num_kv_heads, head_dim, scale,
                     window, softcap, kv_dtype)


def paged_attention_batch(q, k_blocks_per_seq, v_blocks_per_seq, kv_lens, num_heads: int,
                          num_kv_heads: int, head_dim: int, scale: "float | None" = None,
                          kv_dtype: str = "float32"):
    """Decode attention: row b of q [B, H*D] sees positions 0 .. kv_lens[b]-1 of sequence b."""
    rows = []
    for b, kv_len in enumerate(kv_lens):
        k = gather_blocks(k_blocks_per_seq[b], kv_len)
        v = gather_blocks(v_blocks_per_seq[b], kv_len)
        rows.append(attention(np.asarray(q)[b:b + 1], k, v, [kv_len - 1], num_heads,
                              num_kv_heads, head_dim, scale, kv_dtype=kv_dtype))
    return np.concatenate(rows)


def decoder_layer(x, positions, past_k, past_v, w, cfg):
    """One decoder layer over dense float64 history.

    x [n, hidden]; positions [n] (RoPE angles); past_k, past_v [start, KVH*D] (already rotated);
    w: LayerWeights; cfg: DecoderConfig.  The n new tokens sit at positions start .. start+n-1
    of the sequence.  Returns (out [n, hidden], k_all, v_all [start+n, KVH*D]).
    """
    H, KVH, D, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    x = _f64(x)
    n = x.shape[0]
    start = 0 if past_k is None else np.asarray(past_k).shape[0]
    # attention block: norm, projections, QK-norm, RoPE, causal attention, o_proj
    h = rmsnorm(x, w.attn_norm, eps)
    q = linear(h, w.wq, w.bq)
    k = linear(h, w.wk, w.bk)
    v = linear(h, w.wv, w.bv)
    if w.q_norm is not None:  # per head ([D]) or over all heads ([H*D], OLMoE)
        q = rmsnorm(q.reshape(-1, len(w.q_norm)), w.q_norm, eps).reshape(n, H * D)
    if w.k_norm is not None:
        k = rmsnorm(k.reshape(-1, len(w.k_norm)), w.k_norm, eps).reshape(n, KVH * D)
    if cfg.rope_enabled:
        q = rope(q, positions, cfg.inv_freq(), H, D, cfg.rope_style)
        k = rope(k, positions, cfg.inv_freq(), KVH, D, cfg.rope_style)
    k_all = k if start == 0 else np.concatenate([_f64(past_k), k])
    v_all = v if start == 0 else np.concatenate([_f64(past_v), v])
    att = attention(q, k_all, v_all, np.arange(start, start + n), H, KVH, D, cfg.softmax_scale)
    x1 = x + linear(att, w.wo)
    # MLP block: norm, SwiGLU, down projection, residual
    h2 = rmsnorm(x1, w.mlp_norm, eps)
    out = x1 + linear(swiglu(linear(h2, w.w_gate), linear(h2, w.w_up)), w.w_down)
    return out, k_all, v_all


def quantize_activations(x, group=32):
    """The 8-bit activations the integer mat-vec and GEMM kernels read, bit for bit (float32
    steps, as llama.cpp's Q8_0 and Q8_K with symmetric rounding to nearest even): for each group
    of `group` values of a row (32, or 256 for the formats with 256-value super-blocks), amax =
    the largest |x| that is not NaN, d = amax / 127, q = round(x * (127 / amax)) clamped to
    [-127, 127] (a NaN or infinite product gives -127; d = 0 gives zeros); per block of 32 its
    group's d and s = d * sum(q).  Returns (q int8 [rows, n], d float32 [rows, n/32],
    s float32 [rows, n/32])."""
    x = np.asarray(x, np.float32)
    rows, n = x.shape
    groups = x.reshape(rows, n // group, group)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.where(np.isnan(groups), np.float32(0), np.abs(groups)).max(axis=2)
        d = amax / np.float32(127)
        inv = np.where(d > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        prod = np.rint(groups * inv[..., None])
        q = np.where(np.isfinite(prod), np.clip(prod, -127, 127), -127).astype(np.int8)
    d = np.repeat(d, group // 32, axis=1)
    q = q.reshape(rows, n)
    s = (d * q.reshape(rows, n // 32, 32).astype(np.int32).sum(axis=2).astype(np.float32))
    return q, d, s.astype(np.float32)
