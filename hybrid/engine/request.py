"""A request to the engine: its state between steps, and what a step reports."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from .output import TextOutput
from .params import GenerationParams
from .sampling import Sampler
from .speculative import Acceptance

_ids = itertools.count()


class TokenList(Sequence):
    """The first ``n`` tokens of a request's generated list, without a copy: outputs waiting for
    a slow reader then hold O(1) each, not the whole list again.  The list only grows, so the
    view never changes.  Compares equal to a list or tuple of the same ids."""

    __slots__ = ("_ids", "_n")

    def __init__(self, ids: list, n: int):
        self._ids, self._n = ids, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._ids[:self._n][i]
        if i < -self._n or i >= self._n:
            raise IndexError("token index out of range")
        return self._ids[i % self._n]

    def __iter__(self):
        return iter(self._ids[:self._n])

    def __eq__(self, other) -> bool:
        if isinstance(other, (TokenList, list, tuple)):
            return len(other) == self._n and list(self) == list(other)
        return NotImplemented

    def __add__(self, other) -> list:
        return list(self) + list(other)

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass
class RequestOutput:
    """What one step did for one request."""

    request_id: str
    new_tokens: list  # sampled in this step (empty while the prompt is prefilling)
    tokens: TokenList  # every token generated so far (a list-like view)
    finished: bool = False
    finish_reason: "str | None" = None  # "stop", "length", "abort" or "error"
    error: "str | None" = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    text: str = ""  # the generated text so far, cut before a stop string (stop tokens add none)
    delta: str = ""  # text not reported before, held back where a stop string could begin
    logprobs: "list | None" = None  # a sampling.TokenLogprob per new token (params.logprobs)


@dataclass
class Request:
    """A request's state.  ``tokens`` = prompt + generated; the cache holds ``computed`` of them
    (its K/V), and a step feeds ``tokens[computed:]`` or part of it."""

    prompt: list
    params: GenerationParams
    stops: set  # stop token ids
    tokenizer: object = None  # for the text (None: token ids only)
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    generated: list = field(default_factory=list)
    cache: object = None  # PagedKVCache over the engine's pool while admitted
    computed: int = 0
    registered: int = 0  # full prompt blocks registered in the prefix cache
    cached_tokens: int = 0
    arrival: int = 0
    sampler: "Sampler | None" = None
    output: "TextOutput | None" = None
    finish_reason: "str | None" = None
    matcher: object = None  # hybrid.structured.TokenMatcher when params.constraint is set
    # speculative decoding: the chance a draft is kept, per kind of draft; the kind of this
    # step's drafts, or of the n-gram draft it did not feed (shadow_draft, checked when sampled)
    draft_accept: Acceptance = field(default_factory=Acceptance)
    draft_kind: "str | None" = None
    shadow_draft: "int | None" = None
    draft_idle: int = 0  # steps since it last fed a draft (speculative decoding)
    ngrams: object = None  # speculative.NgramIndex of its tokens, once it drafts by n-grams

    def __post_init__(self):
        self.sampler = Sampler(self.params)
        p = self.params
        if self.tokenizer is not None and (p.detokenize or p.stop_strings):
            self.output = TextOutput(self.tokenizer, p.stop_strings, self.stops)

    @property
    def tokens(self) -> list:
        return self.prompt + self.generated

    @property
    def pending(self) -> int:
        """Tokens to feed before the next sample."""
        return len(self.prompt) + len(self.generated) - self.computed

    def report(self, new_tokens: list, finished: bool = False, reason: "str | None" = None,
               error: "str | None" = None, logprobs: "list | None" = None) -> RequestOutput:
        """This step's RequestOutput (the text's new part handed out with it)."""
        text = delta = ""
        if self.output is not None:
            if finished:
                self.output.finish()
            text, delta = self.output.text, self.output.delta(finished)
        return RequestOutput(self.request_id, new_tokens,
                             TokenList(self.generated, len(self.generated)), finished, reason,
                             error, len(self.prompt), self.cached_tokens, text, delta, logprobs)
