"""A request to the engine: its parameters, its state between steps, and what a step reports."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..models.sampling import Sampler, SamplingParams

_ids = itertools.count()


@dataclass
class GenerationParams:
    """How one request generates: the sampling of ``Model.generate`` plus its stop conditions.

    stop_tokens None means the tokenizer's end-of-sequence ids; stop_strings end the request when
    the decoded new text contains one of them (the completing token included)."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: "int | None" = None
    stop_tokens: "list | None" = None
    stop_strings: tuple = ()

    def __post_init__(self):
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        for name in ("temperature", "top_p", "repetition_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise ValueError(f"{name} must be a number, got {v!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
        self.sampling()  # range checks
        if isinstance(self.stop_strings, str):
            self.stop_strings = (self.stop_strings,)
        self.stop_strings = tuple(self.stop_strings)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=float(self.temperature), top_k=self.top_k,
                              top_p=float(self.top_p),
                              repetition_penalty=float(self.repetition_penalty), seed=self.seed)


@dataclass
class RequestOutput:
    """What one step did for one request."""

    request_id: str
    new_tokens: list  # sampled in this step (empty while the prompt is prefilling)
    tokens: list  # every token generated so far
    finished: bool = False
    finish_reason: "str | None" = None  # "stop", "length", "abort" or "error"
    error: "str | None" = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


@dataclass
class Request:
    """A request's state.  ``tokens`` = prompt + generated; the cache holds ``computed`` of them
    (its K/V), and a step feeds ``tokens[computed:]`` or part of it."""

    prompt: list
    params: GenerationParams
    stops: set
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    generated: list = field(default_factory=list)
    cache: object = None  # PagedKVCache over the engine's pool while admitted
    computed: int = 0
    registered: int = 0  # full prompt blocks registered in the prefix cache
    cached_tokens: int = 0
    arrival: int = 0
    sampler: "Sampler | None" = None
    finish_reason: "str | None" = None

    def __post_init__(self):
        self.sampler = Sampler(self.params.sampling())

    @property
    def tokens(self) -> list:
        return self.prompt + self.generated

    @property
    def pending(self) -> int:
        """Tokens to feed before the next sample."""
        return len(self.prompt) + len(self.generated) - self.computed
