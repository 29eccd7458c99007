"""Load a Llama-family model (llama, qwen2, qwen3) from a GGUF file through the ``gguf`` package.

Every tensor is dequantised to float32 on load (F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0 and the K
and IQ types that ``gguf.quants`` implements) and kept once.  llama.cpp's converter stores the Q
and K rows of ``llama`` models permuted for adjacent-pair RoPE; they are permuted back, so the
layers rotate halves exactly as transformers does.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from ..config import DecoderConfig
from .errors import ModelLoadError
from .rope_scaling import rope_frequencies
from .weights import ARCHITECTURES, ModelWeights, layer_weights, unpermute_rope_rows

GGUF_MAGIC = b"GGUF"

NAMES = {
    "attn_norm": "blk.{i}.attn_norm.weight", "wq": "blk.{i}.attn_q.weight",
    "wk": "blk.{i}.attn_k.weight", "wv": "blk.{i}.attn_v.weight",
    "wo": "blk.{i}.attn_output.weight", "mlp_norm": "blk.{i}.ffn_norm.weight",
    "w_gate": "blk.{i}.ffn_gate.weight", "w_up": "blk.{i}.ffn_up.weight",
    "w_down": "blk.{i}.ffn_down.weight", "q_norm": "blk.{i}.attn_q_norm.weight",
    "k_norm": "blk.{i}.attn_k_norm.weight", "bq": "blk.{i}.attn_q.bias",
    "bk": "blk.{i}.attn_k.bias", "bv": "blk.{i}.attn_v.bias",
}


def _import_gguf(path):
    try:
        from gguf import GGUFReader
        from gguf.quants import dequantize
    except ImportError as exc:
        raise ModelLoadError(path, f"reading GGUF files needs the 'gguf' package "
                                   f"(pip install 'hybrid[models]'): {exc}") from None
    return GGUFReader, dequantize


def _field(reader, key, default=None):
    """A metadata value as a Python scalar, string or list."""
    f = reader.fields.get(key)
    if f is None or not f.data:
        return default
    from gguf import GGUFValueType

    kind = f.types[0]
    if kind == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    if kind == GGUFValueType.ARRAY:
        if f.types[-1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    value = f.parts[f.data[0]].tolist()
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def supported_types() -> set:
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    return {T.F32, T.F16} | set(getattr(quants, "_type_traits", {}).keys())


def _progress(total: int, desc: str):
    """tqdm on a terminal, silent otherwise (and when tqdm is not installed)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="tensor", disable=not sys.stderr.isatty(),
                leave=False)


def read_gguf(path) -> ModelWeights:
    """Load ``path`` (a .gguf file) into float32 ModelWeights; ModelLoadError names any problem."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelLoadError(path, "no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(path, f"not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    GGUFReader, dequantize = _import_gguf(path)
    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:  # the reader raises bare ValueError/IndexError on short files
        raise ModelLoadError(path, f"truncated or corrupt GGUF file ({type(exc).__name__}: "
                                   f"{exc})") from None

    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(path, f"unsupported architecture {arch!r} (supported: "
                                   f"{', '.join(ARCHITECTURES)})")

    def meta(key, default=None):
        return _field(reader, f"{arch}.{key}", default)

    n_layers = meta("block_count")
    hidden = meta("embedding_length")
    heads = meta("attention.head_count")
    if not (n_layers and hidden and heads):
        raise ModelLoadError(path, f"metadata lacks {arch}.block_count / embedding_length / "
                                   f"attention.head_count")
    kv_heads = meta("attention.head_count_kv", heads)
    head_dim = meta("attention.key_length", hidden // heads)
    theta = float(meta("rope.freq_base", 10000.0))
    max_pos = int(meta("context_length", 0) or 0)
    scaling = None
    kind = meta("rope.scaling.type")
    if kind and kind != "none":
        scaling = {"rope_type": kind, "factor": meta("rope.scaling.factor", 1.0),
                   "original_max_position_embeddings": meta("rope.scaling.original_context_length")}
    inv_freq, attn_factor = rope_frequencies(head_dim, theta, scaling, max_pos)
    cfg = DecoderConfig(hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                        head_dim=head_dim, intermediate_size=meta("feed_forward_length"),
                        rope_theta=theta, rms_norm_eps=meta("attention.layer_norm_rms_epsilon", 1e-5),
                        rope_inv_freq=inv_freq if scaling else None,
                        attn_scale=attn_factor ** 2 / np.sqrt(head_dim) if attn_factor != 1.0 else None)

    tensors = {t.name: t for t in reader.tensors}
    ok_types = supported_types()
    for t in reader.tensors:
        if t.tensor_type not in ok_types:
            raise ModelLoadError(path, f"tensor {t.name} has quantisation type "
                                       f"{t.tensor_type.name}, which cannot be dequantised "
                                       f"(supported: {', '.join(sorted(x.name for x in ok_types))})")
    bar = _progress(len(tensors), "dequantising")

    def get(name: str) -> np.ndarray:
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(path, f"missing tensor {name}")
        try:
            w = dequantize(t.data, t.tensor_type)
        except Exception as exc:
            raise ModelLoadError(path, f"tensor {name} cannot be read ({type(exc).__name__}: "
                                       f"{exc}); is the file truncated?") from None
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if w.size != int(np.prod(shape)):
            raise ModelLoadError(path, f"tensor {name} holds {w.size} values, its shape "
                                       f"{shape} needs {int(np.prod(shape))}")
        if bar is not None:
            bar.update(1)
        return np.array(w.reshape(shape), dtype=np.float32, order="C", copy=True)

    def get_layer_tensor(name: str) -> np.ndarray:
        w = get(name)
        if arch == "llama" and name.endswith("attn_q.weight"):
            w = unpermute_rope_rows(w, heads)
        elif arch == "llama" and name.endswith("attn_k.weight"):
            w = unpermute_rope_rows(w, kv_heads)
        return w

    try:
        qk_norm = "blk.0.attn_q_norm.weight" in tensors
        qkv_bias = "blk.0.attn_q.bias" in tensors
        layers = [layer_weights(get_layer_tensor, i, cfg, qk_norm, qkv_bias, NAMES)
                  for i in range(n_layers)]
        for i, lw in enumerate(layers):
            try:
                lw.validated(cfg)  # shape check only; the arrays are already float32
            except (ValueError, TypeError) as exc:
                raise ModelLoadError(path, f"layer {i}: {exc}") from None
        embed = get("token_embd.weight")
        final_norm = get("output_norm.weight")
        tied = "output.weight" not in tensors
        lm_head = embed if tied else get("output.weight")
    finally:
        if bar is not None:
            bar.close()
    if embed.shape[1] != hidden or lm_head.shape != embed.shape:
        raise ModelLoadError(path, f"embedding {embed.shape} / output {lm_head.shape} do not "
                                   f"match hidden size {hidden}")

    metadata = {
        "format": "gguf",
        "tokenizer_model": _field(reader, "tokenizer.ggml.model"),
        "tokenizer_pre": _field(reader, "tokenizer.ggml.pre"),
        "tokens": _field(reader, "tokenizer.ggml.tokens"),
        "token_types": _field(reader, "tokenizer.ggml.token_type"),
        "merges": _field(reader, "tokenizer.ggml.merges"),
        "scores": _field(reader, "tokenizer.ggml.scores"),
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "name": _field(reader, "general.name"),
    }
    # the reader, its memory map and the quantised tensors go with this frame: only the float32
    # copies stay
    return ModelWeights(arch=arch, config=cfg, embed=embed, final_norm=final_norm,
                        lm_head=lm_head, layers=layers, max_position=max_pos,
                        tied_embeddings=tied, metadata=metadata)
