"""Load a Llama-family model (llama, qwen2, qwen3) from a GGUF file through the ``gguf`` package.

The header is parsed here, every count and length checked against the bytes left; the file is
memory-mapped read-only once and its tensors are used in place: F32 tensors as float32
views, F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS matrices as
QuantizedTensors over the mapped bytes (nothing is copied or decoded).  Other types (IQ2_*,
IQ3_*, IQ1_*, TQ*, ...) are decoded by ``gguf.quants`` and re-encoded once to the nearest native
format, with one warning.

Before any kernel reads a byte, every tensor's type, shape, block alignment and byte range is
checked against the file size and the model config: a truncated, corrupt or hostile file raises
ModelLoadError naming the file and the tensor.

llama.cpp's converter stores the Q and K rows of ``llama`` models permuted for adjacent-pair
RoPE.  Rather than copying them back, the layers rotate adjacent pairs (``rope_style="gptj"``),
as llama.cpp does: q.k is the same under the same permutation of q and k within a head.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import warnings

import numpy as np

from ..config import DecoderConfig, LayerWeights
from ..quant import FORMATS, QuantizedTensor, fallback_for, quantize
from ..quant.formats import BY_GGML_TYPE
from .errors import ModelLoadError
from .mapping import map_file
from .rope_scaling import rope_frequencies
from .architectures import GGUF_EXPERTS, GGUF_LAYER, by_gguf_name, gguf_names
from .weights import ModelWeights, check_widths, head_shape_error, layer_weights, split_fused

GGUF_MAGIC = b"GGUF"

def _gguf_quants(path):
    """gguf.quants, for the types without native kernels (decoded once, then re-encoded)."""
    try:
        from gguf import quants
    except ImportError as exc:
        raise ModelLoadError(path, f"this file has tensor types that need the 'gguf' package to "
                                   f"decode (pip install 'hybrid[models]'): {exc}") from None
    return quants


# ------------------------------------------------------------------ the header, bounds-checked
# GGUF value types: fixed-size scalars (NumPy dtype), string, array
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
            10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY, _BOOL = 8, 9, 7
MAX_DIMS = 4
# ggml tensor types: id -> (name, values per block, bytes per block); the natively served ones
# come from hybrid.quant.formats, the others are decoded by gguf.quants and re-encoded
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
}
_LOW_BIT = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0",
            "TQ2_0"}  # re-encoded to Q4_K (their size class)


class _Header:
    """A GGUF header read with every count and length checked against the bytes left, so a
    hostile header can neither read past the file nor make a loop longer than the file."""

    def __init__(self, path: str, buf):
        self.path, self.buf, self.pos = path, buf, 0
        self.metadata: dict = {}
        self.tensors: list = []  # (name, dims [ne0, ne1, ...], type id, offset in the data)

    def _take(self, n: int, what: str):
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelLoadError(self.path, f"truncated or corrupt GGUF header: {what} needs "
                                            f"{n} bytes at offset {self.pos}, the file has "
                                            f"{len(self.buf)}")
        lo = self.pos
        self.pos += n
        return self.buf[lo:self.pos]

    def _int(self, n: int, what: str) -> int:
        return int.from_bytes(self._take(n, what), "little")

    def _string(self, what: str) -> str:
        return bytes(self._take(self._int(8, what + " length"), what)).decode("utf-8", "replace")

    def _value(self, vtype: int, what: str):
        if vtype in _SCALARS:
            dt = np.dtype(_SCALARS[vtype])
            v = np.frombuffer(self._take(dt.itemsize, what), dt)[0].item()
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            return self._string(what)
        if vtype != _ARRAY:
            raise ModelLoadError(self.path, f"corrupt GGUF header: {what} has unknown value "
                                            f"type {vtype}")
        itype, count = self._int(4, what + " item type"), self._int(8, what + " count")
        if itype in _SCALARS:  # a numpy array: a list of Python numbers is ~30 times larger
            dt = np.dtype(_SCALARS[itype])
            arr = np.frombuffer(self._take(dt.itemsize * count, what), dt).copy()
            return arr.astype(bool) if itype == _BOOL else arr
        if itype != _STRING:
            raise ModelLoadError(self.path, f"corrupt GGUF header: {what} holds arrays of "
                                            f"type {itype}")
        if count * 8 > len(self.buf) - self.pos:
            raise ModelLoadError(self.path, f"corrupt GGUF header: {what} claims {count} "
                                            f"strings, more than the file can hold")
        return [self._string(what) for _ in range(count)]

    def read(self) -> "_Header":
        self._take(4, "magic")
        version = self._int(4, "version")
        if version not in (2, 3):
            raise ModelLoadError(self.path, f"unsupported GGUF version {version} (supported: 2, 3)")
        n_tensors, n_kv = self._int(8, "tensor count"), self._int(8, "metadata count")
        if n_tensors > len(self.buf) // 24 or n_kv > len(self.buf) // 12:
            raise ModelLoadError(self.path, f"corrupt GGUF header: {n_tensors} tensors / {n_kv} "
                                            f"metadata entries cannot fit in {len(self.buf)} bytes")
        for i in range(n_kv):
            key = self._string(f"metadata key {i}")
            self.metadata[key] = self._value(self._int(4, f"type of {key}"), key)
        for i in range(n_tensors):
            name = self._string(f"tensor name {i}")
            n_dims = self._int(4, f"dimension count of {name}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelLoadError(self.path, f"tensor {name} has {n_dims} dimensions "
                                                f"(1..{MAX_DIMS})")
            dims = [self._int(8, f"dimensions of {name}") for _ in range(n_dims)]
            self.tensors.append((name, dims, self._int(4, f"type of {name}"),
                                 self._int(8, f"offset of {name}")))
        return self


class _Tensors:
    """Tensor name -> its bytes in the read-only memory map, every range checked first."""

    def __init__(self, path: str, header: _Header, mm: np.ndarray):
        self.path, self.mm, self.where = path, mm, {}
        alignment = header.metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ModelLoadError(path, f"general.alignment {alignment!r} is not a power of two")
        data_start = -(-header.pos // alignment) * alignment
        for name, dims, ttype, offset in header.tensors:
            if ttype not in GGML_TYPES:
                raise ModelLoadError(path, f"tensor {name} has unknown type id {ttype}")
            tname, block, type_size = GGML_TYPES[ttype]
            if any(d <= 0 or d > mm.size * block for d in dims):
                raise ModelLoadError(path, f"tensor {name} has impossible dimensions {dims}")
            if dims[0] % block:
                raise ModelLoadError(path, f"tensor {name}: rows of {dims[0]} values do not "
                                           f"split into {tname} blocks of {block}")
            count = 1
            for d in dims:
                count *= d  # Python ints: no overflow
            nbytes = count // block * type_size
            start = data_start + offset
            if offset % alignment or start + nbytes > mm.size:
                raise ModelLoadError(path, f"tensor {name} ({tname}, {dims}) needs bytes "
                                           f"{start}..{start + nbytes} but the file has "
                                           f"{mm.size}{' (misaligned)' if offset % alignment else ''}"
                                           f"; is the file truncated?")
            if name in self.where:
                raise ModelLoadError(path, f"tensor {name} appears twice")
            self.where[name] = (dims, ttype, start, nbytes)

    def __contains__(self, name) -> bool:
        return name in self.where

    def widest(self) -> int:
        """The largest dimension of any tensor in the file (0 when it has none)."""
        return max((max(dims) for dims, _, _, _ in self.where.values() if dims), default=0)

    def __len__(self) -> int:
        return len(self.where)

    def get(self, name: str, expected=None, reencoded: "list | None" = None, shape=None):
        """float32 for vectors and F32 matrices; a QuantizedTensor over the mapped bytes for the
        native formats; decoded and re-encoded once for the other types.  ``shape``: read a
        tensor of more dimensions as this matrix (its rows in the file's order)."""
        if name not in self.where:
            raise ModelLoadError(self.path, f"missing tensor {name}")
        dims, ttype, start, nbytes = self.where[name]
        tname = GGML_TYPES[ttype][0]
        fmt = BY_GGML_TYPE.get(ttype)
        if fmt is None and tname != "F32":
            self._check_decodable(name, ttype, tname)
        if shape is None:
            shape = tuple(reversed(dims))  # [out, in] for matrices
        if expected is not None and shape != tuple(expected):
            raise ModelLoadError(self.path, f"tensor {name} has shape {shape}, the model config "
                                            f"needs {tuple(expected)}")
        raw = self.mm[start:start + nbytes]  # a read-only view: no copy
        if tname == "F32":
            return raw.view(np.float32).reshape(shape)
        if len(shape) == 1 and fmt is not None and fmt.block_values == 1:
            return QuantizedTensor(raw, fmt, (1, shape[0])).dequantize()[0]
        if fmt is not None and len(shape) == 2:
            return QuantizedTensor(raw, fmt, shape)
        quants = _gguf_quants(self.path)
        from gguf import GGMLQuantizationType

        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # (checked below)
            values = quants.dequantize(raw.reshape(count_rows(shape), -1),
                                       GGMLQuantizationType(ttype)).reshape(shape)
        values = np.ascontiguousarray(values, dtype=np.float32)
        if len(shape) == 1:
            return values
        target = fallback_for(shape[1], FORMATS["q4_k" if tname in _LOW_BIT else "q8_0"])
        if not np.isfinite(values).all():
            raise ModelLoadError(self.path, f"tensor {name} ({tname}) decodes to NaN or inf")
        if reencoded is not None:
            reencoded.append((name, tname, target.name))
        return quantize(values, target)


    def stacked(self, name: str, expected, reencoded: "list | None" = None) -> list:
        """A 3-D tensor [E, rows, cols] (experts stacked, as llama.cpp stores them) as E
        matrices [rows, cols], each a view of the file's rows (no copy for native formats)."""
        if name not in self.where:
            raise ModelLoadError(self.path, f"missing tensor {name}")
        dims = self.where[name][0]
        shape = tuple(reversed(dims))
        if shape != tuple(expected):
            raise ModelLoadError(self.path, f"tensor {name} has shape {shape}, the model config "
                                            f"needs {tuple(expected)}")
        e, rows, cols = shape
        flat = self.get(name, None, reencoded, shape=(e * rows, cols))
        if isinstance(flat, QuantizedTensor):
            return [QuantizedTensor(flat.data[i * rows:(i + 1) * rows], flat.format, (rows, cols))
                    for i in range(e)]
        return [flat[i * rows:(i + 1) * rows] for i in range(e)]

    def _check_decodable(self, name: str, ttype: int, tname: str) -> None:
        quants = _gguf_quants(self.path)
        traits = getattr(quants, "_type_traits", {})
        known = {t.value for t in traits} | {1, 30}
        if ttype not in known:
            names = sorted({GGML_TYPES[t][0] for t in known if t in GGML_TYPES} | {"F32"})
            raise ModelLoadError(self.path, f"tensor {name} has quantisation type {tname}, which "
                                            f"cannot be dequantised (supported: {', '.join(names)})")


def count_rows(shape) -> int:
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows


def _progress(total: int, desc: str):
    """tqdm on a terminal, silent otherwise (and when tqdm is not installed)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="tensor", disable=not sys.stderr.isatty(),
                leave=False)


def _open(path, huge_pages: bool = False):
    """(header, tensors) of ``path`` after the header walk and the tensor checks, over the file
    mapped by hybrid.models.mapping.map_file (without the huge-page advice unless asked: a
    metadata read touches only the header)."""
    if not os.path.isfile(path):
        raise ModelLoadError(path, "no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(path, f"not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    mm = map_file(path, huge_pages=huge_pages)
    header = _Header(path, memoryview(mm)).read()
    return header, _Tensors(path, header, mm)


def _rope_factors(path, tensors, head_dim: int) -> "np.ndarray | None":
    """``rope_freqs.weight``: per-pair divisors of the RoPE frequencies, as llama.cpp's
    converter writes Llama 3.1+'s scaling (None when the file has none)."""
    if "rope_freqs.weight" not in tensors:
        return None
    f = np.asarray(tensors.get("rope_freqs.weight", (head_dim // 2,)), dtype=np.float64)
    if f.ndim != 1 or not (np.isfinite(f).all() and (f > 0).all()):
        raise ModelLoadError(path, "tensor rope_freqs.weight must hold finite factors > 0")
    return f


def read_metadata(path) -> dict:
    """The metadata key/values of a GGUF file (bounds-checked; no tensor is touched)."""
    return _open(os.fspath(path))[0].metadata


def read_gguf(path, huge_pages: bool = True) -> ModelWeights:
    """Load ``path`` (a .gguf file) with its tensors in place (mapped in huge pages unless
    ``huge_pages=False``, see hybrid.models.mapping); ModelLoadError names any problem."""
    path = os.fspath(path)
    header, tensors = _open(path, huge_pages)
    md = header.metadata
    arch = md.get("general.architecture")
    spec = by_gguf_name(arch)
    if spec is None:
        raise ModelLoadError(path, f"unsupported architecture {arch!r} (supported: "
                                   f"{', '.join(gguf_names())})")

    def meta(key, default=None):
        return md.get(f"{arch}.{key}", default)

    n_layers = meta("block_count")
    hidden = meta("embedding_length")
    heads = meta("attention.head_count")
    if not (n_layers and hidden and heads):
        raise ModelLoadError(path, f"metadata lacks {arch}.block_count / embedding_length / "
                                   f"attention.head_count")
    try:
        kv_heads = meta("attention.head_count_kv", heads)
        head_dim = meta("attention.key_length", hidden // heads)
        check_widths(path, {f"{arch}.embedding_length": hidden,
                            f"{arch}.attention.head_count": heads,
                            f"{arch}.attention.head_count_kv": kv_heads,
                            f"{arch}.attention.key_length": head_dim,
                            f"{arch}.feed_forward_length": meta("feed_forward_length")},
                     tensors.widest(), "the file")
        n_experts = meta("expert_count", 0) or 0
        top_k = meta("expert_used_count", 0) or 0
        expert_ff = meta("expert_feed_forward_length") or meta("feed_forward_length")
        if n_experts:
            for key, v in (("expert_count", n_experts), ("expert_used_count", top_k),
                           ("expert_feed_forward_length", expert_ff)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"{arch}.{key} must be a positive integer, got {v!r}")
            if top_k > n_experts:
                raise ValueError(f"{arch}.expert_used_count {top_k} is more than the "
                                 f"{n_experts} experts")
            check_widths(path, {f"{arch}.expert_count": n_experts,
                                f"{arch}.expert_feed_forward_length": expert_ff},
                         tensors.widest(), "the file")
        elif spec.gguf_experts_required:
            raise ValueError(f"{arch}.expert_count is missing")
        theta = float(meta("rope.freq_base", 10000.0))
        max_pos = meta("context_length", 0) or 0
        if isinstance(max_pos, bool) or not isinstance(max_pos, int) or max_pos < 0:
            raise ValueError(f"{arch}.context_length must be a non-negative integer, got "
                             f"{max_pos!r}")
        window = meta("attention.sliding_window", 0) or 0
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"{arch}.attention.sliding_window must be a non-negative integer, "
                             f"got {window!r}")
        if max_pos and window >= max_pos:
            window = 0  # wider than the context: plain causal attention
        rope_dims = meta("rope.dimension_count", head_dim)
        scaling = None
        kind = meta("rope.scaling.type")
        if kind and kind != "none":
            scaling = {"rope_type": kind, "factor": meta("rope.scaling.factor", 1.0),
                       "original_max_position_embeddings":
                           meta("rope.scaling.original_context_length")}
        if "rope_factors_long.weight" in tensors:  # Phi-3's LongRoPE, as tensors
            half = (rope_dims // 2,)
            scaling = {"rope_type": "longrope",
                       "short_factor": tensors.get("rope_factors_short.weight", half),
                       "long_factor": tensors.get("rope_factors_long.weight", half),
                       "original_max_position_embeddings":
                           meta("rope.scaling.original_context_length"),
                       "attention_factor": meta("rope.scaling.attn_factor")}
        inv_freq, attn_factor = rope_frequencies(rope_dims, theta, scaling, max_pos)
        factors = _rope_factors(path, tensors, rope_dims)
        if factors is not None:  # Llama 3.1+: the converter stores the scaling as divisors
            inv_freq, scaling = inv_freq / factors, scaling or {"rope_type": "rope_freqs"}
        cfg = DecoderConfig(hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                            head_dim=head_dim,
                            intermediate_size=meta("feed_forward_length") or expert_ff,
                            rope_theta=theta,
                            rms_norm_eps=meta("attention.layer_norm_rms_epsilon", 1e-5),
                            rope_style=spec.gguf_rope_style,
                            rope_inv_freq=inv_freq if scaling else None, rope_dims=rope_dims,
                            rope_attn_factor=attn_factor,
                            sliding_window=0 if spec.gguf_global_every else window,
                            mlp_activation=spec.mlp_activation,
                            attn_softcap=meta("attn_logit_softcapping", 0.0) or 0.0)
        logit_softcap = float(meta("final_logit_softcapping", 0.0) or 0.0)
        if not (math.isfinite(logit_softcap) and logit_softcap >= 0):
            raise ValueError(f"{arch}.final_logit_softcapping must be a finite number >= 0")
        layer_configs = None
        if spec.gguf_global_every:  # Gemma 3: local layers with their own window and RoPE base
            base = spec.gguf_local_rope_base
            local = dataclasses.replace(cfg, sliding_window=window) if base is None else \
                dataclasses.replace(cfg, rope_theta=base, rope_inv_freq=None,
                                    rope_attn_factor=1.0, sliding_window=window)
            every = spec.gguf_global_every
            layer_configs = [cfg if (i + 1) % every == 0 else local for i in range(n_layers)]
    except ModelLoadError:
        raise
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise ModelLoadError(path, f"inconsistent model metadata: {exc}") from None
    if not isinstance(n_layers, int) or n_layers > len(tensors):
        raise ModelLoadError(path, f"{arch}.block_count {n_layers!r} does not match the "
                                   f"{len(tensors)} tensors")
    reencode: list = []
    shapes = None
    bar = _progress(len(tensors), "mapping")

    def get(name: str, expected=None):
        if bar is not None:
            bar.update(1)
        return tensors.get(name, expected, reencode)

    def get_layer_tensor(name: str):
        return get(name, shapes.get(name.split(".", 2)[2]))  # "attn_q.weight" -> its shape

    try:
        names = spec.gguf_layer
        read_layer = split_fused(get_layer_tensor, cfg, path, get_fused=get)
        qk_norm = names["q_norm"].format(i=0) in tensors
        qkv_bias = names["bq"].format(i=0) in tensors
        expected = LayerWeights.expected_shapes(None, cfg, spec.qk_norm_whole)
        shapes = {GGUF_LAYER[k].split(".", 2)[2]: v for k, v in expected.items()}
        experts = None
        if n_experts:
            from ..moe import ExpertWeights

            def experts(i):
                if bar is not None:
                    bar.update(4)
                router, gate, up, down = (n.format(i=i) for n in GGUF_EXPERTS)
                up_shape = (n_experts, expert_ff, hidden)
                r = tensors.get(router, (n_experts, hidden), reencode)
                return ExpertWeights(
                    r if isinstance(r, np.ndarray) else np.asarray(r, dtype=np.float32),
                    tensors.stacked(gate, up_shape, reencode),
                    tensors.stacked(up, up_shape, reencode),
                    tensors.stacked(down, (n_experts, hidden, expert_ff), reencode), top_k,
                    spec.gguf_experts_normalize)
        layers = [layer_weights(read_layer, i, cfg, qk_norm, qkv_bias, names, experts,
                                spec.sandwich_norms) for i in range(n_layers)]
        for i, lw in enumerate(layers):
            try:
                lw.validated(cfg)  # shape check only; nothing is converted
            except (ValueError, TypeError) as exc:
                raise ModelLoadError(path, f"layer {i}: {exc}") from None
        embed = get("token_embd.weight")
        final_norm = get("output_norm.weight", (hidden,))
        tied = "output.weight" not in tensors
        lm_head = embed if tied else get("output.weight", embed.shape)
    finally:
        if bar is not None:
            bar.close()
    wrong = head_shape_error(embed, final_norm, lm_head, hidden)
    if wrong is not None:
        raise ModelLoadError(path, wrong)
    if reencode:
        kinds = sorted({f"{src} -> {dst}" for _, src, dst in reencode})
        warnings.warn(f"{path}: {len(reencode)} tensors have types without native kernels and "
                      f"were re-encoded at load ({', '.join(kinds)}; e.g. {reencode[0][0]}); "
                      f"they are held in memory, not mapped from the file", stacklevel=3)

    metadata = {
        "format": "gguf",
        "tokenizer_model": md.get("tokenizer.ggml.model"),
        "tokenizer_pre": md.get("tokenizer.ggml.pre"),
        "tokens": md.get("tokenizer.ggml.tokens"),
        "token_types": md.get("tokenizer.ggml.token_type"),
        "merges": md.get("tokenizer.ggml.merges"),
        "scores": md.get("tokenizer.ggml.scores"),
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
        "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": md.get("tokenizer.chat_template"),
        "name": md.get("general.name"),
        "reencoded": reencode,
    }
    # the tensors are views of one read-only memory map of the file, which lives as long as they do
    return ModelWeights(arch=arch, config=cfg, embed=embed, final_norm=final_norm,
                        lm_head=lm_head, layers=layers, max_position=max_pos,
                        tied_embeddings=tied, metadata=metadata, layer_configs=layer_configs,
                        logit_softcap=logit_softcap,
                        embed_scale=float(np.float32(hidden ** 0.5))
                        if spec.embed_scale_sqrt_hidden else 1.0)
