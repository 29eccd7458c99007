"""Helpers shared by the model-family tests: llama.cpp's Q/K permutation for its "llama" GGUF
files, and a model's logits over a prefill chunk followed by single-token decode steps."""

import numpy as np


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rotate-half rows as adjacent pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def prefill_then_decode(model, ids, split: int) -> np.ndarray:
    """[len(ids) - split + 1, vocab]: the logits after ids[:split] in one step, then after each
    further token fed alone (a fresh cache)."""
    cache = model.new_cache()
    return np.stack([model.forward(ids[:split], cache)]
                    + [model.forward([t], cache) for t in ids[split:]])
