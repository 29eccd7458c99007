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

import numpy as np

from .. import kernel_role
from ..kvcache import PagedKVCache
from ..kvpool import KVBlockPool

METHODS = ("ngram", "draft")


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


class DraftModelProposer:
    """Greedy drafts from a draft model that shares the target's tokenizer.  Each request keeps
    a cache of the draft model (over one pool of ``num_blocks`` blocks) that holds the tokens
    the draft model has seen; a step first brings it up to the request's tokens (after the
    longest prefix they share: rejected drafts are cut off), then feeds one draft at a time,
    all requests together.  Every row is a decode row, so the drafts are the draft model's own
    greedy tokens after the request's tokens, whatever was fed and cut before.  The drafts only
    decide how many tokens a verify step can keep: the target samples every token itself."""

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
        cache the pool cannot grow, or that outgrows the draft model, gets none."""
        live = []  # (request id, cache, tokens to feed, drafts so far, k)
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
            live.append((rid, cache, list(tokens[same:]), [], k))
        out = {}
        while live:
            rows = self.model.forward_step([(c, fed) for _, c, fed, _, _ in live],
                                           role=kernel_role.DECODE)
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
