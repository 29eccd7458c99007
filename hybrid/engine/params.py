"""GenerationParams: how one request generates, the one parameters type of the Python API, the
engine and the server (sampling, limits, stop conditions)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..structured import Constraint


MAX_LOGPROBS = 20  # alternatives per token at most (OpenAI's top_logprobs limit)


@dataclass
class GenerationParams:
    """How one request generates.

    temperature 0 is greedy (argmax).  top_k 0, top_p 1 and min_p 0 turn those filters off
    (min_p keeps the tokens at least min_p times as likely as the most likely one).
    repetition_penalty > 1 discourages tokens already in the sequence (as transformers applies
    it: positive logits divided, negative multiplied).  presence_penalty and frequency_penalty
    (-2..2, OpenAI's) subtract from the logit of each token generated so far: the first once,
    the second once per occurrence.  logit_bias {token id: -100..100} is added to those logits
    (-100 in effect bans a token).  ``seed`` makes sampling reproducible.  logprobs k (0..20)
    reports, for each generated token, its log-probability under the model and the k most
    likely tokens' (the raw logits' log-softmax, before any penalty or temperature); None: none.
    stop_tokens None means the tokenizer's end-of-sequence ids; stop_strings end the request when
    the generated text contains one of them (the completing token is kept in the ids, the text
    is cut before the stop string).  detokenize False skips the text (token ids only) where no
    stop string needs it.  ``constraint`` (hybrid.structured.Constraint: a JSON schema, regex,
    choice or grammar) masks the logits so that the output matches it; it ends the request
    ("stop") once nothing more can follow.  speculative ("ngram" or "draft"; None: the
    engine's) picks this request's drafts, and num_speculative_tokens (0..16) caps them per step
    (0: none; None: the engine's number); "draft" needs an engine with a draft model.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict = field(default_factory=dict)
    logprobs: "int | None" = None
    seed: "int | None" = None
    stop_tokens: "list | None" = None
    stop_strings: tuple = ()
    detokenize: bool = True
    constraint: "Constraint | None" = None
    num_speculative_tokens: "int | None" = None
    speculative: "str | None" = None

    def __post_init__(self):
        if self.speculative not in (None, "ngram", "draft"):
            raise ValueError(f"speculative must be 'ngram', 'draft' or None, got "
                             f"{self.speculative!r}")
        n = self.num_speculative_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 16):
            raise ValueError(f"num_speculative_tokens must be an integer in [0, 16] or None, got "
                             f"{n!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        for name in ("temperature", "top_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty", "min_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
            setattr(self, name, float(v))
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not isinstance(self.logit_bias, dict):
            raise ValueError(f"logit_bias must be a dict of token id -> bias, got "
                             f"{type(self.logit_bias).__name__}")
        bias = {}
        for k, v in self.logit_bias.items():
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {k!r}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {v!r} "
                                 f"for token {k}")
            bias[k] = float(v)
        self.logit_bias = bias
        if self.logprobs is not None and (isinstance(self.logprobs, bool)
                                          or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (the "
                             f"alternatives reported per token), got {self.logprobs!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if isinstance(self.stop_strings, str):
            self.stop_strings = (self.stop_strings,)
        self.stop_strings = tuple(self.stop_strings)
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ValueError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")
        if self.stop_tokens is not None:
            self.stop_tokens = [int(t) for t in self.stop_tokens]
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ValueError(f"constraint must be a hybrid.structured.Constraint, got "
                             f"{type(self.constraint).__name__}")
