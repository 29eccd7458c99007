"""Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition penalty."""

from __future__ import annotations

import numpy as np


class Sampler:
    """Stateful sampler (its random generator advances with each draw) for one request's
    GenerationParams (temperature, top_k, top_p, repetition_penalty, seed)."""

    def __init__(self, params):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history) -> int:
        p = self.params
        if p.temperature == 0.0 and (p.repetition_penalty == 1.0 or not len(history)):
            return int(np.argmax(logits))  # greedy: the float32 order is the float64 order
        x = np.asarray(logits, dtype=np.float64)
        if p.repetition_penalty != 1.0 and len(history):
            seen = np.unique(np.asarray(history, dtype=np.int64))
            seen = seen[(seen >= 0) & (seen < x.shape[0])]
            v = x[seen]
            x = x.copy()
            with np.errstate(over="ignore"):
                x[seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if p.temperature == 0.0:
            return int(np.argmax(x))
        with np.errstate(over="ignore"):  # a tiny penalty or temperature overflows to +inf
            x = x / p.temperature
        if p.top_k and p.top_k < x.shape[0]:
            kth = np.partition(x, -p.top_k)[-p.top_k]
            x = np.where(x < kth, -np.inf, x)
        top = np.max(x)
        if np.isposinf(top):  # the limit of the softmax: the infinite logits share all the mass
            probs = np.isposinf(x).astype(np.float64)
        else:
            probs = np.exp(x - top)
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            keep = order[: int(np.searchsorted(cum, p.top_p) + 1)]
            mask = np.zeros_like(probs)
            mask[keep] = probs[keep]
            probs = mask / mask.sum()
        return int(self.rng.choice(probs.shape[0], p=probs))
