"""Draft tokens for speculative decoding: n-gram prompt lookup (vLLM's "ngram", llama.cpp's
lookup decoding).  The engine feeds a request's pending token and its drafts in one step, samples
each row in order with the request's own sampler, and keeps the drafts up to the first one the
sampler did not pick (hybrid/engine/engine.py).  Each sampled token comes from the same logits
(decode rows are batch-invariant) and the same sampler state as without speculation, so the
output is identical, greedy or seeded; for a draft that is a single token this is the standard
rejection rule (accept with probability p(draft), else a sample of p without it)."""

from __future__ import annotations

import numpy as np

METHODS = ("ngram",)


def ngram_drafts(tokens, k: int, max_n: int = 3, min_n: int = 1) -> list:
    """Up to k tokens that followed the latest earlier occurrence of the sequence's last n
    tokens (the longest n in [min_n, max_n] that occurs before), or [] when none does."""
    if k <= 0 or len(tokens) < min_n + 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    length = arr.shape[0]
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = arr[length - n:]
        windows = np.lib.stride_tricks.sliding_window_view(arr[:length - 1], n)
        hits = np.nonzero((windows == suffix).all(axis=1))[0]
        if hits.size:
            start = int(hits[-1]) + n
            return [int(t) for t in arr[start:start + k]]
    return []
