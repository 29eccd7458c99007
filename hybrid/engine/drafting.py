"""Drafting: the engine's speculative-decoding policy.  In each step it picks the decoding
requests that feed drafts and finds their drafts (n-gram prompt lookup, or a draft model's greedy
tokens: hybrid/engine/speculative.py), taking their KV slots; the engine feeds them, samples each
row and keeps the drafts up to the first miss (Engine._verify)."""

from __future__ import annotations

from .request import Request
from .speculative import (DRAFT_MODEL, DRAFT_VOCAB, METHODS, PRIOR_ROW_SHARE, RETRY_STEPS,
                          DraftModelProposer, NgramIndex, drafts_worth, ngram_kind, step_cost)


class Drafting:
    """Which decoding requests speculate in a step, and with which drafts (Engine's arguments
    speculative, num_speculative_tokens, draft_model, adapt_drafts and draft_vocab; a request's
    GenerationParams override the method and the number)."""

    def __init__(self, model, kv, max_tokens: int, *, speculative: "str | None" = None,
                 num_speculative_tokens: int = 4, draft_model=None, adapt_drafts: bool = True,
                 draft_vocab: "int | None" = DRAFT_VOCAB, pool_tokens: "int | None" = None):
        if speculative is not None and speculative not in METHODS:
            raise ValueError(f"speculative must be one of {', '.join(METHODS)} or None, got "
                             f"{speculative!r}")
        if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
                or not 1 <= num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be an integer in [1, 16], got "
                             f"{num_speculative_tokens!r}")
        if (speculative == "draft") != (draft_model is not None):
            raise ValueError('a draft_model goes with speculative="draft", and only with it')
        self.model, self.kv, self.max_tokens = model, kv, max_tokens
        self.speculative, self.num_speculative_tokens = speculative, num_speculative_tokens
        self.adapt_drafts = bool(adapt_drafts)
        self.proposer = None
        if draft_model is not None:  # its pool holds as many tokens as the target's
            self.proposer = DraftModelProposer(
                draft_model, model,
                None if pool_tokens is None else -(-pool_tokens // draft_model.block_size),
                vocab=draft_vocab)

    @property
    def pool(self):
        """The draft model's KV pool (speculative="draft"), or None."""
        return None if self.proposer is None else self.proposer.pool

    def check(self, params) -> None:
        """ValueError where a request asks for what this engine cannot draft."""
        if params.speculative == "draft" and self.proposer is None:
            raise ValueError('speculative="draft" needs an engine with a draft model '
                             '(Engine(speculative="draft", draft_model=...))')

    def method(self, req: Request) -> "str | None":
        """How req drafts: its own method or the engine's; None for no drafts (none asked for,
        or a constraint, whose requests decode one token per step)."""
        if req.matcher is not None or req.params.num_speculative_tokens == 0:
            return None
        return req.params.speculative or self.speculative

    def plan(self, decodes: list) -> dict:
        """{request id: draft tokens} for the decoding requests that speculate in this step (by
        their own method, or the engine's), their slots taken (a request whose slots the pool
        cannot give decodes one token).  Each feeds the drafts worth their cost: their chance of
        being kept (the request's acceptance so far for their kind: a draft model's, or n-gram
        drafts after a match of two tokens or of more) against what a row adds to the step (and
        a draft model's step), both measured as the engine runs."""
        wants = {"ngram": [], "draft": []}  # method -> [(request, drafts to feed)]
        found = {}  # request id -> its n-gram drafts
        row_cost = step_cost(self.model).row_share(len(decodes))
        draft_cost = row_cost + (self._draft_share(len(decodes)) if self.proposer else 0.0)
        for r in decodes:
            r.shadow_draft = r.draft_kind = None
            method = self.method(r)
            if method is None:
                continue
            most = r.params.num_speculative_tokens
            most = self.num_speculative_tokens if most is None else most
            room = min(most, r.params.max_new_tokens - len(r.generated) - 1,
                       self.max_tokens - len(r.prompt) - len(r.generated) - 1)
            if room < 1:
                continue
            if method == "ngram":  # the drafts first: how far their match runs picks the estimate
                drafts, matched = self._ngram_match(r, room)
                if not drafts:
                    continue
                kind, cost = ngram_kind(matched), row_cost
            else:
                kind, cost = DRAFT_MODEL, draft_cost
            k = drafts_worth(r.draft_accept[kind], cost, room) if self.adapt_drafts else room
            r.draft_kind = kind
            if k == 0 and method == "ngram" and cost < 1.0:  # (at a cost >= 1 no draft pays)
                r.shadow_draft = drafts[0]  # what it would have fed, checked for free when sampled
            elif k == 0:  # no free check: the estimate drifts up, and after RETRY_STEPS steps
                r.draft_accept.drift(kind)  # one draft is fed
                r.draft_idle += 1
                k = int(r.draft_idle >= RETRY_STEPS)
            if k > 0:
                r.draft_idle = 0
                wants[method].append((r, k))
                if method == "ngram":
                    found[r.request_id] = drafts[:k]
        if wants["draft"]:
            found.update(self.proposer.propose([(r.request_id, r.tokens, k)
                                                for r, k in wants["draft"]]))
        out = {}
        for r, _ in wants["ngram"] + wants["draft"]:
            d = found.get(r.request_id)
            if not d:
                continue
            try:
                self.kv.allocate_slots(r, 1 + len(d))
            except MemoryError:
                continue
            out[r.request_id] = d
        return out

    def prefill(self, finished: list) -> None:
        """The draft model reads the prompts finished in this step (their first drafts then
        need no catch-up, and the prompt's time counts as the prompt's); a request with fewer
        than 3 tokens to generate never drafts (one after the first and one to verify)."""
        if self.proposer is not None:
            self.proposer.prefill([(r.request_id, r.tokens[:r.computed]) for r in finished
                                   if self.method(r) == "draft"
                                   and r.params.max_new_tokens - len(r.generated) >= 3])

    def forget(self, request_id: str) -> None:
        """A request finished: the draft model drops its state."""
        if self.proposer is not None:
            self.proposer.forget(request_id)

    @staticmethod
    def _ngram_match(req: Request, k: int) -> tuple:
        """NgramIndex.match over req's tokens: (up to k drafts, tokens their occurrence matched)."""
        if req.ngrams is None:
            req.ngrams = NgramIndex()
        req.ngrams.follow(req.prompt, req.generated)
        return req.ngrams.match(k)

    def _draft_share(self, rows: int) -> float:
        """One round of the draft model's steps over a step of the target's with `rows` rows."""
        step = step_cost(self.model).seconds(rows)
        draft = step_cost(self.proposer.model).seconds(rows)
        return draft / step if draft is not None and step else PRIOR_ROW_SHARE
