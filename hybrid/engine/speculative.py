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

from .. import kernel_role
from ..kvcache import PagedKVCache
from ..kvpool import KVBlockPool

METHODS = ("ngram", "draft")
CATCH_UP_ROWS = 16  # a draft cache behind by more tokens catches up through a prompt step


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
        return t[best + 1:best + 1 + k] if best >= 0 else []


def ngram_drafts(tokens, k: int) -> list:
    """NgramIndex's drafts for a whole sequence at once."""
    index = NgramIndex()
    index.follow([int(x) for x in tokens], [])
    return index.drafts(k)


# before anything is measured: a draft's chance of being kept, and what one more row adds to a
# step over a row's share of it
PRIOR_ACCEPT = 0.6
PRIOR_ROW_SHARE = 0.25


class StepCost:
    """Decode-step seconds against rows fed, learnt from the steps the engine runs: the mean of
    recent steps per number of rows, and the weighted line through those means."""

    def __init__(self, memory: int = 16):
        self.memory = memory  # a mean follows about this many of its latest steps
        self._means: dict = {}  # rows fed -> [mean seconds, weight]

    def observe(self, rows: int, seconds: float) -> None:
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


def update_acceptance(accept: float, kept: int, fed: int, rate: float = 0.2) -> float:
    """A request's estimated chance that a draft is kept, after a step that kept `kept` of `fed`
    drafts: each draft the sampler reached (the kept ones, and the first rejected) moves it."""
    for i in range(min(fed, kept + 1)):
        accept += rate * ((1.0 if i < kept else 0.0) - accept)
    return accept


class DraftModelProposer:
    """Greedy drafts from a draft model that shares the target's tokenizer.  Each request keeps
    a cache of the draft model (over one pool of ``num_blocks`` blocks) that holds the tokens
    the draft model has seen; a step first brings it up to the request's tokens (after the
    longest prefix they share: rejected drafts are cut off), then feeds one draft at a time,
    all requests together (a cache far behind, as after the prompt, first catches up in a
    prompt step).  The drafts only decide how many tokens a verify step can keep: the target
    samples every token itself."""

    def __init__(self, model, target, num_blocks: "int | None"):
        if model.vocab_size != target.vocab_size:
            raise ValueError(f"the draft model's vocabulary has {model.vocab_size} tokens, the "
                             f"target's {target.vocab_size}: they must share the tokenizer")
        tok, ttok = getattr(model, "tokenizer", None), getattr(target, "tokenizer", None)
        if tok is not None and ttok is not None and tok.eos_ids != ttok.eos_ids:
            raise ValueError("the draft model's tokenizer differs from the target's "
                             f"(end-of-sequence ids {tok.eos_ids} and {ttok.eos_ids})")
        self.model = model
        cfg = model.config
        self.pool = KVBlockPool(len(model.layers), cfg.num_kv_heads, cfg.head_dim,
                                model.block_size, model.kv_dtype, model.cache_placements,
                                num_blocks=num_blocks, prefix_cache=False)
        self.max_tokens = model.max_tokens or (1 << 30)
        self._held: dict = {}  # request id -> (draft cache, the tokens it holds)

    def propose(self, wants: list) -> dict:
        """{request id: k draft tokens} for wants [(request id, tokens, k)]; a request whose
        cache the pool cannot grow, or that outgrows the draft model, gets none.  Each round's
        seconds go into the draft model's step_cost."""
        live = []  # (request id, cache, tokens to feed, drafts so far, k)
        catch_up = []  # (cache, tokens): long runs the draft model has not seen, fed as a prompt
        for rid, tokens, k in wants:
            if len(tokens) + k > self.max_tokens:
                continue
            cache, held = self._held.get(rid) or (PagedKVCache.on(self.pool), [])
            # the tokens the cache holds that are still the request's (at least the last one
            # is fed again, for its logits)
            same = min(_shared_prefix(held, tokens), cache.seq_len, len(tokens) - 1)
            cache.truncate(same)
            try:
                cache.allocate_slots(len(tokens) - same + k - 1)
            except MemoryError:
                self.forget(rid)
                continue
            self._held[rid] = (cache, list(tokens))
            fed = list(tokens[same:])
            if len(fed) > CATCH_UP_ROWS:
                catch_up.append((cache, fed[:-1]))
                fed = fed[-1:]
            live.append((rid, cache, fed, [], k))
        if catch_up:
            self.model.forward_step(catch_up, role=kernel_role.PROMPT)
        out, cost = {}, step_cost(self.model)
        while live:
            t0 = time.perf_counter()
            rows = self.model.forward_step([(c, fed) for _, c, fed, _, _ in live],
                                           role=kernel_role.DECODE)
            cost.observe(sum(len(fed) for _, _, fed, _, _ in live), time.perf_counter() - t0)
            going = []
            for (rid, cache, _, drafts, k), row in zip(live, rows):
                drafts.append(int(np.argmax(row)))
                if len(drafts) < k:
                    self._held[rid][1].append(drafts[-1])  # fed in the next round
                    going.append((rid, cache, [drafts[-1]], drafts, k))
                else:
                    out[rid] = drafts
            live = going
        return out

    def forget(self, request_id) -> None:
        """The request finished: its draft cache goes back to the pool."""
        held = self._held.pop(request_id, None)
        if held is not None:
            held[0].close()


def _shared_prefix(a: list, b: list) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
