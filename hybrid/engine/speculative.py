"""Draft tokens for speculative decoding: n-gram prompt lookup (vLLM's "ngram", llama.cpp's
lookup decoding), or a draft model sharing the target's tokenizer (a smaller sibling, or a
lower-bit copy; llama.cpp's and vLLM's draft model).  The engine feeds a request's pending
token and its drafts in one step, samples each row in order with the request's own sampler,
and keeps the drafts up to the first one the sampler did not pick (hybrid/engine/engine.py).
Each sampled token comes from the same logits (decode rows are batch-invariant) and the same
sampler state as without speculation, so the output is identical, greedy or seeded; for a
draft that is a single token this is the standard rejection rule (accept with probability
p(draft), else a sample of p without it)."""

from __future__ import annotations

import time
import weakref

import numpy as np

from .. import kernel_role, ops
from ..kvcache import PagedKVCache
from ..kvpool import KVBlockPool

METHODS = ("ngram", "draft")
CATCH_UP_ROWS = 16  # a draft cache behind by more tokens catches up through a prompt step
DRAFT_VOCAB = 16384  # token ids a draft model scores by default, besides each prompt's own


def parse_speculative(spec: "str | None"):
    """(method, draft model path or None) of a command line's ``--speculative``: "ngram", or
    "draft:PATH"; ValueError names what is wrong."""
    if spec is None:
        return None, None
    if spec == "ngram":
        return "ngram", None
    if spec.startswith("draft:") and len(spec) > len("draft:"):
        return "draft", spec[len("draft:"):]
    raise ValueError(f"--speculative must be 'ngram' or 'draft:PATH', got {spec!r}")


class NgramIndex:
    """Where each pair of consecutive tokens of a growing sequence ends, kept up to date as the
    sequence grows, so that an n-gram draft (prompt lookup) is found without scanning the whole
    sequence each step."""

    def __init__(self):
        self.tokens: list = []
        self._ends: dict = {}  # (a, b) -> the positions i where tokens[i-1:i+1] == [a, b]

    def follow(self, prompt: list, generated: list) -> None:
        """Bring the index up to prompt + generated (the sequence it follows, grown since)."""
        n, t = len(self.tokens), self.tokens
        t.extend(prompt[n:])
        t.extend(generated[max(0, n - len(prompt)):])
        for i in range(max(1, n), len(t)):
            self._ends.setdefault((t[i - 1], t[i]), []).append(i)

    def drafts(self, k: int, reach: int = 16, latest: int = 64) -> list:
        """Up to k tokens that followed an earlier occurrence of the sequence's last two tokens,
        or [] when they never occurred before.  Of several occurrences (the latest `latest`),
        the one whose match with the sequence's end runs furthest back (up to `reach` tokens;
        the latest among equals): the likeliest to continue the same way."""
        return self.match(k, reach, latest)[0]

    def match(self, k: int, reach: int = 16, latest: int = 64) -> tuple:
        """(drafts, matched): ``drafts``' tokens, and how many tokens of the sequence's end the
        occurrence they follow matched (2 .. reach; 0 without drafts)."""
        t, length = self.tokens, len(self.tokens)
        ends = self._ends.get(tuple(t[-2:])) if k > 0 and length >= 3 else None
        best, longest = -1, 0
        for i in reversed((ends or [])[-latest - 1:]):
            if i == length - 1:  # the sequence's own end
                continue
            m = 2  # tokens matched, ending at i and at the sequence's end
            while m < reach and i - m >= 0 and t[i - m] == t[length - 1 - m]:
                m += 1
            if m > longest:
                best, longest = i, m
        return (t[best + 1:best + 1 + k], longest) if best >= 0 else ([], 0)


def ngram_drafts(tokens, k: int) -> list:
    """NgramIndex's drafts for a whole sequence at once."""
    index = NgramIndex()
    index.follow([int(x) for x in tokens], [])
    return index.drafts(k)


# before anything is measured: a draft's chance of being kept, and what one more row adds to a
# step over a row's share of it
PRIOR_ACCEPT = 0.6
PRIOR_ROW_SHARE = 0.25
# A request keeps one acceptance estimate per kind of draft: a draft model's (DRAFT_MODEL), and
# n-gram drafts after a match of exactly two tokens (NGRAM_SHORT) or of three or more
# (NGRAM_LONG): the longer the text they follow matched, the likelier drafts are kept.
DRAFT_MODEL, NGRAM_SHORT, NGRAM_LONG = "model", "ngram-2", "ngram-3+"


def ngram_kind(matched: int) -> str:
    """The estimate an n-gram draft after a match of `matched` tokens moves."""
    return NGRAM_SHORT if matched <= 2 else NGRAM_LONG


# a request that feeds no drafts and has no free check of its guess (a draft model's drafts
# cost a step) moves its estimate RETRY_DRIFT of the way up to 1 each step, and after
# RETRY_STEPS such steps feeds one draft whatever the cost: a chance or a cost measured wrong
# is measured again
RETRY_DRIFT = 0.05
RETRY_STEPS = 16


class StepCost:
    """Decode-step seconds against rows fed, learnt from the steps the engine runs: the mean of
    recent steps per number of rows, and the weighted line through those means."""

    def __init__(self, memory: int = 16):
        self.memory = memory  # a mean follows about this many of its latest steps
        self._means: dict = {}  # rows fed -> [mean seconds, weight]
        self._seen: set = set()  # row counts stepped at least once

    def observe(self, rows: int, seconds: float) -> None:
        if rows not in self._seen:  # the first step of a size allocates its buffers: not its cost
            self._seen.add(rows)
            return
        mean = self._means.setdefault(rows, [seconds, 0.0])
        mean[1] = min(mean[1] + 1.0, float(self.memory))
        mean[0] += (seconds - mean[0]) / mean[1]

    def _line(self):
        """(weighted mean rows, mean seconds, seconds per row or None while every step had the
        same rows) of the steps seen, or None before the first; a few points, plain Python."""
        if not self._means:
            return None
        total = sum(w for _, w in self._means.values())
        xm = sum(x * w for x, (_, w) in self._means.items()) / total
        ym = sum(y * w for y, w in self._means.values()) / total
        spread = sum(w * (x - xm) ** 2 for x, (_, w) in self._means.items())
        if spread <= 0:
            return xm, ym, None
        cov = sum(w * (x - xm) * (y - ym) for x, (y, w) in self._means.items())
        return xm, ym, max(0.0, cov / spread)

    def seconds(self, rows: int) -> "float | None":
        """A step's predicted seconds with `rows` rows (None before the first step)."""
        line = self._line()
        if line is None:
            return None
        xm, ym, slope = line
        return ym if slope is None else ym + slope * (rows - xm)

    def row_share(self, rows: int) -> float:
        """The seconds one more row adds to a step of `rows` rows, over one row's share of that
        step (PRIOR_ROW_SHARE until steps of two sizes have run)."""
        line = self._line()
        if line is None or line[2] is None:
            return PRIOR_ROW_SHARE
        xm, ym, slope = line
        step = ym + slope * (rows - xm)
        return slope * rows / step if step > 0 else PRIOR_ROW_SHARE


_costs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def step_cost(model) -> StepCost:
    """The decode-step costs learnt for `model` (kept as long as the model, across engines)."""
    cost = _costs.get(model)
    if cost is None:
        cost = _costs[model] = StepCost()
    return cost


def drafts_worth(accept: float, cost: float, most: int) -> int:
    """How many drafts to feed: draft i is kept with chance accept**i (only after every draft
    before it) and costs `cost` tokens' worth of time; feed those whose chance exceeds it."""
    k, chance = 0, accept
    while k < most and chance > cost:
        k += 1
        chance *= accept
    return k


def drift_acceptance(accept: float) -> float:
    """A request's estimate after a step in which it fed no drafts and had no free check of its
    guess: RETRY_DRIFT of the way up to 1."""
    return accept + RETRY_DRIFT * (1.0 - accept)


def update_acceptance(accept: float, kept: int, fed: int, rate: float = 0.2) -> float:
    """A request's estimated chance that a draft is kept, after a step that kept `kept` of `fed`
    drafts: each draft the sampler reached (the kept ones, and the first rejected) moves it."""
    for i in range(min(fed, kept + 1)):
        accept += rate * ((1.0 if i < kept else 0.0) - accept)
    return accept


class Acceptance:
    """A request's estimated chance that a draft is kept, one estimate per kind of draft
    (DRAFT_MODEL, NGRAM_SHORT, NGRAM_LONG), each PRIOR_ACCEPT until its first draft."""

    def __init__(self):
        self._by_kind: dict = {}

    def __getitem__(self, kind: str) -> float:
        return self._by_kind.get(kind, PRIOR_ACCEPT)

    def update(self, kind: str, kept: int, fed: int) -> None:
        """A step kept `kept` of `fed` drafts of this kind (update_acceptance)."""
        self._by_kind[kind] = update_acceptance(self[kind], kept, fed)

    def drift(self, kind: str) -> None:
        """A step fed none of this kind and had no free check (drift_acceptance)."""
        self._by_kind[kind] = drift_acceptance(self[kind])

    def __repr__(self) -> str:
        return f"Acceptance({self._by_kind})"


def check_draft_vocab(vocab) -> None:
    """Raise ValueError unless vocab is a positive integer or None (a draft_vocab setting)."""
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1):
        raise ValueError(f"draft_vocab must be a positive integer or None, got {vocab!r}")


class _DraftState:
    """One request's draft cache, the tokens it holds, and the LM head rows of the request's
    prompt tokens outside the scored vocabulary (ids ascending)."""

    __slots__ = ("cache", "tokens", "extra_ids", "extra_head")

    def __init__(self, cache, extra_ids, extra_head):
        self.cache, self.tokens = cache, []
        self.extra_ids, self.extra_head = extra_ids, extra_head


class DraftModelProposer:
    """Greedy drafts from a draft model that shares the target's tokenizer.  Each request keeps
    a cache of the draft model (over one pool of ``num_blocks`` blocks) that holds the tokens
    the draft model has seen; a step first brings it up to the request's tokens (after the
    longest prefix they share: rejected drafts are cut off), then feeds one draft at a time,
    all requests together (a cache far behind catches up in a prompt step; the engine brings
    a new request's cache up to its prompt in the step that finishes the prompt, ``prefill``).
    The drafts only decide how many tokens a verify step can keep: the target samples every
    token itself.

    ``vocab``: the draft model's head scores only its ``vocab`` lowest token ids (BPE and
    SentencePiece vocabularies list the frequent tokens first) and each request's prompt
    tokens, as FR-Spec prunes a draft's vocabulary: its largest matrix is then read in part
    each round.  None, or a vocab at least the model's, scores every token.  (A head on a GPU
    scores every token.)"""

    def __init__(self, model, target, num_blocks: "int | None",
                 vocab: "int | None" = DRAFT_VOCAB):
        if model.vocab_size != target.vocab_size:
            raise ValueError(f"the draft model's vocabulary has {model.vocab_size} tokens, the "
                             f"target's {target.vocab_size}: they must share the tokenizer")
        tok, ttok = getattr(model, "tokenizer", None), getattr(target, "tokenizer", None)
        if tok is not None and ttok is not None and tok.eos_ids != ttok.eos_ids:
            raise ValueError("the draft model's tokenizer differs from the target's "
                             f"(end-of-sequence ids {tok.eos_ids} and {ttok.eos_ids})")
        check_draft_vocab(vocab)
        self.model = model
        cfg = model.config
        self.pool = KVBlockPool(len(model.layers), cfg.num_kv_heads, cfg.head_dim,
                                model.block_size, model.kv_dtype, model.cache_placements,
                                num_blocks=num_blocks, prefix_cache=False)
        self.max_tokens = model.max_tokens or (1 << 30)
        # the head the drafts come from: None, the model's own logits (a head on a GPU)
        self.vocab = model.vocab_size if vocab is None else min(vocab, model.vocab_size)
        self._head = None
        if model.head_on_cpu:
            self._head = (model.lm_head if self.vocab == model.vocab_size
                          else _head_rows(model.lm_head, np.arange(self.vocab)))
        self._held: dict = {}  # request id -> _DraftState

    def prefill(self, items: list) -> None:
        """Bring the draft caches of requests [(request id, tokens)] up to all their tokens in
        one prompt step (a request whose cache the pool cannot grow is left without one)."""
        fed = [got for rid, tokens in items
               if (got := self._follow(rid, tokens, len(tokens), 0)) and got[1]]
        if fed:
            self.model.hidden_step([(st.cache, f) for st, f in fed], role=kernel_role.PROMPT)

    def propose(self, wants: list) -> dict:
        """{request id: k draft tokens} for wants [(request id, tokens, k)]; a request whose
        cache the pool cannot grow, or that outgrows the draft model, gets none.  Each round's
        seconds go into the draft model's step_cost."""
        live = []  # (request id, state, tokens to feed, drafts so far, k)
        catch_up = []  # (cache, tokens): long runs the draft model has not seen, fed as a prompt
        for rid, tokens, k in wants:
            if len(tokens) + k > self.max_tokens:
                continue
            # (at least the last token is fed again, for its logits)
            got = self._follow(rid, tokens, len(tokens) - 1, k - 1)
            if got is None:
                continue
            st, fed = got
            if len(fed) > CATCH_UP_ROWS:
                catch_up.append((st.cache, fed[:-1]))
                fed = fed[-1:]
            live.append((rid, st, fed, [], k))
        if catch_up:
            self.model.hidden_step(catch_up, role=kernel_role.PROMPT)
        out, cost = {}, step_cost(self.model)
        while live:
            t0 = time.perf_counter()
            picks = self._greedy([(st, fed) for _, st, fed, _, _ in live])
            cost.observe(sum(len(fed) for _, _, fed, _, _ in live), time.perf_counter() - t0)
            going = []
            for (rid, st, _, drafts, k), tok in zip(live, picks):
                drafts.append(tok)
                if len(drafts) < k:
                    st.tokens.append(tok)  # fed in the next round
                    going.append((rid, st, [tok], drafts, k))
                else:
                    out[rid] = drafts
            live = going
        return out

    def _follow(self, rid, tokens: list, upto: int, extra: int):
        """(the request's state, the tokens its cache still needs) after cutting its cache back
        to the longest prefix (at most ``upto`` tokens) it shares with ``tokens`` and growing it
        for those and ``extra`` more; None (the state dropped) where the pool cannot."""
        st = self._held.get(rid)
        if st is None:
            st = self._new_state(tokens)
        same = min(_shared_prefix(st.tokens, tokens), st.cache.seq_len, upto)
        st.cache.truncate(same)
        try:
            st.cache.allocate_slots(len(tokens) - same + extra)
        except MemoryError:
            st.cache.close()
            self._held.pop(rid, None)
            return None
        self._held[rid] = st
        st.tokens = list(tokens)
        return st, list(tokens[same:])

    def _new_state(self, tokens: list) -> _DraftState:
        """A fresh cache, and the head rows of the tokens past the scored vocabulary."""
        extra = np.unique(np.asarray(tokens, dtype=np.int64))
        extra = extra[extra >= self.vocab] if self._head is not None else extra[:0]
        head = _head_rows(self.model.lm_head, extra) if extra.size else None
        return _DraftState(PagedKVCache.on(self.pool), extra, head)

    def _greedy(self, batch: list) -> list:
        """One decode step of the draft model over batch [(state, tokens)]: each sequence's
        greedy next token, the argmax over the scored tokens (the lowest id among equals)."""
        items = [(st.cache, fed) for st, fed in batch]
        if self._head is None:
            rows = self.model.forward_step(items, role=kernel_role.DECODE)
            return [int(np.argmax(r)) for r in rows]
        h = self.model.hidden_step(items, role=kernel_role.DECODE)
        logits = ops.linear(h, self._head, role=kernel_role.DECODE)
        picks = []
        for i, (st, _) in enumerate(batch):
            best = int(np.argmax(logits[i]))
            if st.extra_head is not None:  # its prompt's tokens past the scored vocabulary
                more = ops.linear(h[i:i + 1], st.extra_head, role=kernel_role.DECODE)[0]
                j = int(np.argmax(more))
                if more[j] > logits[i, best]:
                    best = int(st.extra_ids[j])
            picks.append(best)
        return picks

    def forget(self, request_id) -> None:
        """The request finished: its draft cache goes back to the pool."""
        st = self._held.pop(request_id, None)
        if st is not None:
            st.cache.close()


def _head_rows(head, ids: np.ndarray):
    """The LM head's rows ``ids`` (in their encoding), a copy."""
    if hasattr(head, "take_rows"):
        return head.take_rows(ids)
    return np.ascontiguousarray(np.asarray(head)[ids])


def _shared_prefix(a: list, b: list) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
