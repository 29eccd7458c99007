"""Load a Llama-family model from a Hugging Face folder: ``config.json`` + ``*.safetensors`` (sharded
or not) through the ``safetensors`` package.  F16 and BF16 matrices stay in their encoding
(QuantizedTensors over a read-only memory map of the file); vectors are widened to float32."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os

import numpy as np

from ..config import DecoderConfig
from ..quant import QuantizedTensor
from .errors import ModelLoadError
from .architectures import by_hf_classes, hf_class_names
from .rope_scaling import rope_frequencies
from .mapping import map_file
from .weights import ModelWeights, check_widths, head_shape_error, layer_weights, split_fused

def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


class _Shards:
    """Tensor name -> float32 array across the folder's safetensors files."""

    def __init__(self, folder, huge_pages: bool = True):
        self.huge_pages = huge_pages
        try:
            from safetensors import safe_open
        except ImportError as exc:
            raise ModelLoadError(folder, "loading safetensors needs the 'safetensors' package "
                                         f"(pip install 'hybrid[models]'): {exc}") from None
        files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
        if not files:
            raise ModelLoadError(folder, "no *.safetensors files in the model folder")
        self.folder = folder
        self.where = {}
        self.handles = {}
        self.headers = {}  # file -> (header length, parsed JSON header), for the raw reads
        for f in files:
            try:
                h = safe_open(f, framework="numpy")
            except Exception as exc:
                raise ModelLoadError(f, f"not a readable safetensors file ({exc})") from None
            self.handles[f] = h
            for name in h.keys():
                self.where[name] = f

    def __contains__(self, name):
        return name in self.where

    def widest(self) -> int:
        """The largest dimension of any tensor in the folder (0 when it has none)."""
        n = 0
        for f, header in ((f, self._header(f)[1]) for f in self.handles):
            for name, entry in header.items():
                shape = entry.get("shape") if isinstance(entry, dict) and name != "__metadata__" \
                    else None
                if shape:
                    n = max(n, max(int(d) for d in shape))
        return n

    def get(self, name: str) -> np.ndarray:
        f = self.where.get(name)
        if f is None:
            raise ModelLoadError(self.folder, f"missing tensor {name}")
        h = self.handles[f]
        dtype = h.get_slice(name).get_dtype()
        if dtype in ("BF16", "F16"):
            raw = self._raw(f, name, np.uint16)
            if raw.ndim == 2:  # a matrix: kept as it is in the file
                return QuantizedTensor(raw.view(np.uint8), "bfloat16" if dtype == "BF16"
                                       else "float16", raw.shape)
            return _bf16_to_f32(raw) if dtype == "BF16" else raw.view(np.float16).astype(np.float32)
        try:
            arr = h.get_tensor(name)
        except Exception as exc:
            raise ModelLoadError(f, f"tensor {name} cannot be read ({exc})") from None
        return np.ascontiguousarray(arr, dtype=np.float32)

    def _header(self, f) -> tuple:
        """(header length, parsed header) of file f, read once."""
        cached = self.headers.get(f)
        if cached is None:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                cached = self.headers[f] = (n, json.loads(fh.read(n)))
        return cached

    def _raw(self, f, name, dtype):
        n, header = self._header(f)
        begin, end = header[name]["data_offsets"]
        shape = header[name]["shape"]
        size = os.path.getsize(f)
        if not (0 <= begin <= end and 8 + n + end <= size):
            raise ModelLoadError(f, f"tensor {name} claims bytes {begin}..{end} past the end of "
                                    f"the file")
        if end == begin:
            return np.zeros(shape, dtype=dtype)
        data = map_file(f, 8 + n + begin, end - begin, huge_pages=self.huge_pages)
        return data.view(dtype).reshape(shape)


_NORMS = ("attn_norm", "mlp_norm", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")


def _typed_rope(params: dict):
    """(scaling or None, theta) of one layer type's rope_parameters."""
    if not isinstance(params, dict):
        raise ValueError("rope_parameters per layer type must be objects")
    theta = float(params.get("rope_theta", 10000.0))
    return (params if params.get("rope_type", "default") != "default" else None), theta


def _layer_configs(c: dict, rope: dict, cfg: DecoderConfig, window: int, rope_dims: int,
                   max_pos: int, n_layers: int) -> "list | None":
    """Per-layer configs from config.json's layer_types (Gemma 3: sliding layers with their
    own RoPE, full layers with the global one); None when every layer is alike."""
    types = c.get("layer_types")
    if not isinstance(types, list) or "sliding_attention" not in types or not window:
        return None  # every layer alike (Qwen's configs list "full_attention" throughout)
    if len(types) != n_layers:
        raise ValueError(f"layer_types must list {n_layers} layer types")
    configs = {"full_attention": cfg}
    params = rope.get("sliding_attention") or {"rope_theta": c.get("rope_local_base_freq",
                                                                   cfg.rope_theta)}
    scaling, theta = _typed_rope(params)
    inv, factor = rope_frequencies(rope_dims, theta, scaling, max_pos)
    configs["sliding_attention"] = dataclasses.replace(
        cfg, rope_theta=theta, rope_inv_freq=inv if scaling else None, rope_attn_factor=factor,
        sliding_window=window)
    unknown = sorted(set(types) - set(configs))
    if unknown:
        raise ValueError(f"layer_types holds {unknown[0]!r} (known: full_attention, "
                         f"sliding_attention)")
    return [configs[t] for t in types]


def _moe_layers(c: dict, arch, n_layers: int):
    """(indices of the mixture-of-experts layers, experts, experts per token, normalize)."""
    ex = arch.hf_experts
    if ex is None:
        return set(), 0, 0, True
    experts = c.get("num_experts", c.get("num_local_experts"))  # (transformers writes either)
    every = c.get(ex.sparse_step_key, 1) if ex.sparse_step_key else 1
    dense = (c.get(ex.dense_key) or []) if ex.dense_key else []
    normalize = bool(c.get(ex.normalize_key, ex.normalize)) if ex.normalize_key else ex.normalize
    top_k = c.get("num_experts_per_tok")
    for name, v in (("the expert count", experts), ("num_experts_per_tok", top_k),
                    (ex.sparse_step_key or "the sparse step", every)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if top_k > experts:
        raise ValueError(f"num_experts_per_tok {top_k} is more than the {experts} experts")
    layers = {i for i in range(n_layers) if i not in dense and (i + 1) % every == 0}
    return layers, experts, top_k, normalize


def _experts(shards, arch, i: int, count: int, top_k: int, normalize: bool):
    from ..moe import ExpertWeights

    router, gate, up, down = (n.format(i=i, e="{e}") for n in arch.hf_experts.names)
    return ExpertWeights(shards.get(router), [shards.get(gate.format(e=e)) for e in range(count)],
                         [shards.get(up.format(e=e)) for e in range(count)],
                         [shards.get(down.format(e=e)) for e in range(count)], top_k, normalize)


def read_safetensors_folder(folder, huge_pages: bool = True) -> ModelWeights:
    """The model in a Hugging Face folder; float16 and bfloat16 matrices stay in their file's
    mapping (in huge pages unless ``huge_pages=False``, see hybrid.models.mapping)."""
    folder = os.fspath(folder)
    cpath = os.path.join(folder, "config.json")
    if not os.path.isfile(cpath):
        raise ModelLoadError(folder, "no config.json in the model folder")
    with open(cpath, encoding="utf-8") as f:
        try:
            c = json.load(f)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ModelLoadError(cpath, f"invalid JSON ({exc})") from None
    if not isinstance(c, dict):
        raise ModelLoadError(cpath, "not a JSON object")
    archs = c.get("architectures") or []
    archs = archs if isinstance(archs, list) else [archs]
    arch = by_hf_classes(archs)
    if arch is None:
        raise ModelLoadError(cpath, f"unsupported architecture {archs or c.get('model_type')!r} "
                                    f"(supported: {', '.join(hf_class_names())})")
    missing = [k for k in ("hidden_size", "num_attention_heads", "num_hidden_layers",
                           "intermediate_size") if k not in c]
    if missing:
        raise ModelLoadError(cpath, f"lacks {', '.join(missing)}")
    shards = _Shards(folder, huge_pages)
    try:
        heads = c["num_attention_heads"]
        hidden = c["hidden_size"]
        head_dim = c.get("head_dim") or hidden // heads
        kv_heads = c.get("num_key_value_heads") or heads
        check_widths(cpath, {"hidden_size": hidden, "num_attention_heads": heads,
                             "num_key_value_heads": kv_heads, "head_dim": head_dim,
                             "intermediate_size": c["intermediate_size"]},
                     shards.widest(), "the folder")
        rope = c.get("rope_parameters") or {}
        theta = float(rope.get("rope_theta", c.get("rope_theta", 10000.0)))
        scaling = c.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default"
                                            else None)
        if scaling and "original_max_position_embeddings" in c:  # (older Phi-3 configs)
            scaling = dict(scaling, original_max_position_embeddings=scaling.get(
                "original_max_position_embeddings") or c["original_max_position_embeddings"])
        partial = rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
        if isinstance(partial, bool) or not isinstance(partial, (int, float)) \
                or not 0 < partial <= 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial!r}")
        rope_dims = int(head_dim * partial)
        max_pos = c.get("max_position_embeddings") or 0
        if isinstance(max_pos, bool) or not isinstance(max_pos, int) or max_pos < 0:
            raise ValueError(f"max_position_embeddings must be a non-negative integer, got "
                             f"{max_pos!r}")
        window = c.get("sliding_window")
        if c.get("use_sliding_window", True) is False or window is None:
            window = 0  # (Qwen2 configs name a window they do not use)
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"sliding_window must be a non-negative integer, got {window!r}")
        if max_pos and window >= max_pos:
            window = 0  # wider than the context: plain causal attention
        caps = {}
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            v = c.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or v <= 0):
                raise ValueError(f"{key} must be a finite number > 0, got {v!r}")
            caps[key] = float(v or 0.0)
        scalar = c.get("query_pre_attn_scalar")  # Gemma: the softmax scale is its -1/2 power
        if "full_attention" in rope:  # per layer type (Gemma 3): the global layers' RoPE here
            scaling, theta = _typed_rope(rope["full_attention"])
        inv_freq, attn_factor = rope_frequencies(rope_dims, theta, scaling, max_pos)
        cfg = DecoderConfig(hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                            head_dim=head_dim, intermediate_size=c["intermediate_size"],
                            rope_theta=theta, rms_norm_eps=c.get("rms_norm_eps", 1e-6),
                            rope_inv_freq=inv_freq if scaling else None, rope_dims=rope_dims,
                            rope_attn_factor=attn_factor,
                            sliding_window=0 if "sliding_attention" in (c.get("layer_types") or ())
                            else window,
                            mlp_activation=arch.mlp_activation,
                            attn_scale=float(scalar) ** -0.5 if scalar else None,
                            attn_softcap=caps["attn_logit_softcapping"])
        n_layers = c["num_hidden_layers"]
        if not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"num_hidden_layers must be a positive integer, got {n_layers!r}")
        layer_configs = _layer_configs(c, rope, cfg, window, rope_dims, max_pos, n_layers)
    except ModelLoadError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as exc:
        raise ModelLoadError(cpath, f"inconsistent config: {exc}") from None
    names = arch.hf_layer
    qk_norm = names["q_norm"].format(i=0) in shards
    qkv_bias = names["bq"].format(i=0) in shards
    get = split_fused(shards.get, cfg, folder)
    try:
        moe_layers = _moe_layers(c, arch, n_layers)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(cpath, f"inconsistent config: {exc}") from None
    layers = []
    for i in range(n_layers):
        experts = (lambda j: _experts(shards, arch, j, *moe_layers[1:])) \
            if i in moe_layers[0] else None
        lw = layer_weights(get, i, cfg, qk_norm, qkv_bias, names, experts, arch.sandwich_norms)
        if arch.hf_norm_offset:  # stored as w for x * (offset + w)
            lw = dataclasses.replace(lw, **{n: getattr(lw, n) + np.float32(arch.hf_norm_offset)
                                            for n in _NORMS if getattr(lw, n) is not None})
        try:
            lw.validated(cfg)
        except (ValueError, TypeError) as exc:
            raise ModelLoadError(folder, f"layer {i}: {exc} (config.json and the weights disagree)") from None
        layers.append(lw)
    embed = shards.get("model.embed_tokens.weight")
    tied = bool(c.get("tie_word_embeddings", False)) or "lm_head.weight" not in shards
    lm_head = embed if tied else shards.get("lm_head.weight")
    final_norm = shards.get("model.norm.weight") + np.float32(arch.hf_norm_offset)
    wrong = head_shape_error(embed, final_norm, lm_head, cfg.hidden_size)
    if wrong is not None:
        raise ModelLoadError(folder, f"{wrong} (model.embed_tokens.weight, model.norm.weight, "
                                     f"lm_head.weight)")
    eos = c.get("eos_token_id")
    return ModelWeights(arch=arch.name, config=cfg, embed=embed, final_norm=final_norm,
                        lm_head=lm_head, layers=layers, max_position=max_pos, tied_embeddings=tied,
                        layer_configs=layer_configs, logit_softcap=caps["final_logit_softcapping"],
                        embed_scale=float(np.float32(hidden ** 0.5))
                        if arch.embed_scale_sqrt_hidden else 1.0,
                        metadata={"format": "safetensors", "folder": folder, "eos_token_id": eos,
                                  "bos_token_id": c.get("bos_token_id")})
