"""What a loader produces: the model's shape and its weights, whatever the file format.

Matrices are float32 arrays or QuantizedTensors (kept in the file's encoding); vectors (norms,
biases) are float32.  ``convert_weights`` re-encodes them all to one format at load."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..config import LINEAR_WEIGHTS, DecoderConfig, LayerWeights
from ..quant import QuantizedTensor, dequantize, fallback_for, get_format, quantize
from .errors import ModelLoadError



@dataclass
class ModelWeights:
    """A decoder-only Llama-family model, ready to run.

    embed [vocab, hidden]; final_norm [hidden]; lm_head [vocab, hidden] (the same object as embed
    when the embeddings are tied); layers: one LayerWeights per decoder layer.  Matrices may be
    QuantizedTensors.
    """

    arch: str
    config: DecoderConfig  # the shape every layer shares
    embed: np.ndarray
    final_norm: np.ndarray
    lm_head: np.ndarray
    layers: list
    max_position: int = 0  # the model's context length (0: unknown)
    layer_configs: "list | None" = None  # per-layer DecoderConfigs where layers differ (Gemma 3)
    embed_scale: float = 1.0  # the embedding rows are multiplied by it (Gemma: sqrt(hidden))
    logit_softcap: float = 0.0  # > 0: logits -> logit_softcap * tanh(logits / logit_softcap)
    tied_embeddings: bool = False
    metadata: dict = field(default_factory=dict)  # format-specific extras (tokenizer, template)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    def nbytes(self) -> int:
        seen, total = set(), 0
        arrays = [self.embed, self.final_norm, self.lm_head]
        for lw in self.layers:
            arrays += [a for k, a in vars(lw).items() if a is not None and k != "experts"]
            if lw.experts is not None:
                arrays += [lw.experts.router, *lw.experts.matrices()]
        for a in arrays:
            if id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes
        return total


def head_shape_error(embed, final_norm, lm_head, hidden: int) -> "str | None":
    """What is wrong with the embedding [vocab, hidden], final norm [hidden] and LM head
    [vocab, hidden] shapes, or None (both loaders check them before anything runs)."""
    for name, a in (("the embedding", embed), ("the final norm", final_norm),
                    ("the LM head", lm_head)):
        if a is None:
            return f"{name} is missing"
    if len(embed.shape) != 2 or embed.shape[1] != hidden or embed.shape[0] < 1:
        return f"the embedding has shape {tuple(embed.shape)}, not [vocab, {hidden}]"
    if tuple(lm_head.shape) != tuple(embed.shape):
        return (f"the LM head has shape {tuple(lm_head.shape)}, the embedding "
                f"{tuple(embed.shape)}")
    if tuple(final_norm.shape) != (hidden,):
        return f"the final norm has shape {tuple(final_norm.shape)}, not ({hidden},)"
    return None


def weight_formats(mw: ModelWeights) -> dict:
    """Format name ("float32", "q4_k", ...) -> (number of matrices, bytes)."""
    seen, table = set(), {}
    mats = [mw.embed, mw.lm_head] + [getattr(lw, n) for lw in mw.layers for n in LINEAR_WEIGHTS]
    mats += [m for lw in mw.layers if lw.experts is not None for m in lw.experts.matrices()]
    for m in mats:
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        name = m.format.name if isinstance(m, QuantizedTensor) else "float32"
        count, nbytes = table.get(name, (0, 0))
        table[name] = (count + 1, nbytes + m.nbytes)
    return table


def convert_weights(mw: ModelWeights, target: "str | None") -> ModelWeights:
    """Every matrix in ``target`` ("float32", "float16", "bfloat16", "q8_0", "q4_0", "q4_1",
    "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"); None keeps each as it is.  Rows that do not split
    into the target's blocks use llama.cpp's fallback (q4_k -> q5_0, q6_k -> q8_0, ...)."""
    if target is None:
        return mw
    name = str(target).lower()
    if name not in ("float32", "f32", "fp32"):
        fmt = get_format(name)
    else:
        fmt = None
    done: dict = {}

    def conv(m):
        if id(m) in done:
            return done[id(m)]
        if fmt is None:
            new = dequantize(m)
        else:
            want = fallback_for(m.shape[1], fmt)
            if isinstance(m, QuantizedTensor) and m.format == want:
                new = m
            else:
                new = quantize(dequantize(m), want)
        done[id(m)] = new
        return new

    def conv_layer(lw):
        new = {n: conv(getattr(lw, n)) for n in LINEAR_WEIGHTS if getattr(lw, n) is not None}
        ex = lw.experts
        if ex is not None:
            new["experts"] = dataclasses.replace(ex, gate=[conv(m) for m in ex.gate],
                                                 up=[conv(m) for m in ex.up],
                                                 down=[conv(m) for m in ex.down])
        return dataclasses.replace(lw, **new)

    layers = [conv_layer(lw) for lw in mw.layers]
    return dataclasses.replace(mw, embed=conv(mw.embed), lm_head=conv(mw.lm_head), layers=layers)


def check_widths(path, widths: dict, widest: int, where: str) -> None:
    """Every width of a real model is some tensor's dimension: a metadata value (name -> value)
    wider than ``widest`` is corrupt, and sizing anything by it (RoPE tables, scratch) could
    allocate far more than the file holds.  Values that are not integers are left to the
    config's own checks."""
    for key, value in widths.items():
        if isinstance(value, int) and value > widest:
            raise ModelLoadError(path, f"{key} = {value} is wider than any tensor in {where} "
                                       f"(widest dimension {widest})")


def row_range(t, lo: int, hi: int):
    """Rows lo..hi of a matrix as a view (a QuantizedTensor's rows are whole blocks)."""
    if isinstance(t, QuantizedTensor):
        return QuantizedTensor(t.data[lo:hi], t.format, (hi - lo, t.shape[1]))
    return t[lo:hi]


def split_fused(get, cfg: DecoderConfig, path, get_fused=None):
    """``get`` that also reads "NAME@part": a part of a fused matrix (Phi-3's qkv_proj and
    gate_up_proj) as a view of its rows, the matrix read by ``get_fused`` (default ``get``).
    Parts: q, k, v of [q_size + 2*kv_size, hidden]; gate, up of [2*intermediate, hidden]."""
    fused: dict = {}
    get_fused = get_fused or get

    def read(name):
        base, _, part = name.partition("@")
        if not part:
            return get(name)
        if base not in fused:
            fused[base] = get_fused(base)
        t = fused[base]
        q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
        total = q + 2 * kv if part in "qkv" else 2 * inter
        if len(t.shape) != 2 or t.shape[0] != total or t.shape[1] != cfg.hidden_size:
            raise ModelLoadError(path, f"tensor {base} has shape {tuple(t.shape)}, the model "
                                       f"config needs ({total}, {cfg.hidden_size})")
        lo, hi = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, total),
                  "gate": (0, inter), "up": (inter, total)}[part]
        return row_range(t, lo, hi)
    return read


def layer_weights(get, i: int, cfg: DecoderConfig, qk_norm: bool, qkv_bias: bool,
                  names: dict, experts=None, sandwich: bool = False) -> LayerWeights:
    """Assemble layer ``i`` from ``get(name)`` with format-specific ``names`` templates;
    ``experts(i)``, when given, reads a mixture-of-experts MLP in place of the dense one."""
    def need(key):
        return get(names[key].format(i=i))

    def opt(key, wanted):
        return get(names[key].format(i=i)) if wanted and key in names else None

    # read in the file's order: attention, MLP, then the optional tensors
    attn = dict(attn_norm=need("attn_norm"), wq=need("wq"), wk=need("wk"), wv=need("wv"),
                wo=need("wo"), mlp_norm=need("mlp_norm"))
    if experts is not None:
        mlp = dict(w_gate=None, w_up=None, w_down=None, experts=experts(i))
    else:
        mlp = dict(w_gate=need("w_gate"), w_up=need("w_up"), w_down=need("w_down"))
    return LayerWeights(
        **attn, **mlp, q_norm=opt("q_norm", qk_norm), k_norm=opt("k_norm", qk_norm),
        bq=opt("bq", qkv_bias), bk=opt("bk", qkv_bias), bv=opt("bv", qkv_bias),
        post_attn_norm=opt("post_attn_norm", sandwich), post_mlp_norm=opt("post_mlp_norm", sandwich))
