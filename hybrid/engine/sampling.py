"""Choosing the next token from logits: logit bias, repetition, presence and frequency penalties,
then greedy, or temperature, top-k, top-p and min-p."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class TokenLogprob(NamedTuple):
    """A generated token's log-probability and the most likely tokens' (id, logprob), most
    likely first (ties: the lower id first)."""
    token: int
    logprob: float
    top: tuple


def token_logprob(logits: np.ndarray, token: int, k: int) -> TokenLogprob:
    """The log-softmax of the raw logits, in float64, at ``token`` and at the k most likely."""
    x = np.asarray(logits, dtype=np.float64)
    top = np.max(x)
    lse = top + np.log(np.sum(np.exp(x - top)))
    if k:
        ids = np.lexsort((np.arange(x.shape[0]), -x))[:k]  # by logit, then by id
        alts = tuple((int(i), float(x[i] - lse)) for i in ids)
    else:
        alts = ()
    return TokenLogprob(int(token), float(x[token] - lse), alts)


class Sampler:
    """Stateful sampler for one request's GenerationParams: its random generator advances with
    each draw, and it counts the tokens it has drawn (presence and frequency penalties)."""

    def __init__(self, params):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.drawn: dict = {}  # token id -> times drawn
        self._adjusts = bool(params.logit_bias) or params.presence_penalty != 0.0 \
            or params.frequency_penalty != 0.0

    def __call__(self, logits: np.ndarray, history, allowed: "np.ndarray | None" = None) -> int:
        """The next token; ``allowed`` (bool [vocab], a constraint's mask) bans the others."""
        if allowed is not None:
            logits = np.where(allowed, logits, -np.inf)
        tok = self._choose(logits, history)
        self.drawn[tok] = self.drawn.get(tok, 0) + 1
        return tok

    def _choose(self, logits: np.ndarray, history) -> int:
        p = self.params
        if p.temperature == 0.0 and not self._adjusts \
                and (p.repetition_penalty == 1.0 or not len(history)):
            return int(np.argmax(logits))  # greedy: the float32 order is the float64 order
        x = np.asarray(logits, dtype=np.float64)
        if self._adjusts:
            x = self._adjusted(x)
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
        if p.min_p > 0.0:  # at least min_p times as likely as the most likely token
            probs = np.where(probs >= p.min_p * probs.max(), probs, 0.0)
            probs /= probs.sum()
        return int(self.rng.choice(probs.shape[0], p=probs))

    def _adjusted(self, x: np.ndarray) -> np.ndarray:
        """x (a copy) with the logit bias added and the presence and frequency penalties of
        the tokens drawn so far subtracted (OpenAI's definitions)."""
        p = self.params
        x = x.copy()
        n = x.shape[0]
        for tok, b in p.logit_bias.items():
            if tok < n:
                x[tok] += b
        if self.drawn and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.drawn.keys(), dtype=np.int64)
            counts = np.fromiter(self.drawn.values(), dtype=np.float64)
            keep = ids < n
            x[ids[keep]] -= counts[keep] * p.frequency_penalty + p.presence_penalty
        return x
