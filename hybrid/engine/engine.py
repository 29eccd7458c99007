"""Engine: many requests over one model and one shared KV block pool, a step at a time.

    engine = hybrid.Engine(model, max_batch=16, max_batched_tokens=512, kv_memory="2GiB")
    outs = engine.generate([ids_a, ids_b], max_new_tokens=32)          # offline
    rid = engine.add_request(ids, GenerationParams(max_new_tokens=64))  # incremental
    while engine.has_unfinished(): for out in engine.step(): ...

A step runs what the scheduler planned (hybrid/engine/scheduler.py) as at most two ragged
batches through ``Model.forward_step`` (hybrid/step.py): every prompt chunk together with the
prompt kernels, then every generated token (decodes, and recomputes after a preemption) with the
decode kernels; it samples for each request whose pending tokens are all in and retires
finished ones (their blocks go back at once).  A failure inside a step fails only the requests
it concerns: a batch that raises is retried request by request, and a request that still fails
is finished with ``finish_reason="error"``.

With temperature 0 a request's tokens do not depend on what else runs (batch invariance): every
row's kernels are fixed by its role, and attention reduces each row in a fixed order.  This holds
for integer-quantized weights on the CPU; float weights served by BLAS may differ in the last bit.
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import kernel_role
from ..kvpool import KVBlockPool, default_kv_memory, parse_bytes
from .kv_manager import KVCacheManager
from .drafting import Drafting
from .speculative import DRAFT_VOCAB, step_cost
from .params import GenerationParams
from .request import Request, RequestOutput
from .sampling import token_logprob
from .scheduler import Scheduler, _TooLarge


class Engine:
    """Continuous batching over a ``Model`` (see the module docstring).

    Parameters
    ----------
    model : hybrid Model (its layers' placements and KV dtype are used)
    max_batch : requests running at once
    max_batched_tokens : tokens computed per step (decode tokens plus prompt chunks); bounds
        the time of a step, so long prompts are prefilled in chunks between decode steps
    kv_memory : bytes or "4GiB" for the shared KV pool; default: half of the available memory
        (num_blocks: the same in blocks)
    prefix_cache : reuse the K/V of prompt prefixes computed before
    speculative : "ngram" or "draft" to feed each decoding request up to
        ``num_speculative_tokens`` draft tokens per step (n-gram prompt lookup, or the greedy
        tokens of ``draft_model``, a Model sharing the tokenizer; hybrid/engine/speculative.py);
        the output is the same as without.  A request's GenerationParams.speculative overrides
        the method and num_speculative_tokens the number (0: none).  Requests with a constraint
        decode one token per step.
    adapt_drafts : feed only the drafts worth their cost (the default): each request's
        acceptance so far against what a row adds to a step (and a draft model's step), both
        measured as the engine runs, so that drafts that do not pay are not fed; False: every
        step feeds all the drafts the method finds, up to the number (vLLM's rule).
    draft_vocab : the draft model scores only this many of its lowest token ids, and each
        request's prompt tokens (DraftModelProposer); None: every token.
    """

    def __init__(self, model, *, max_batch: int = 16, max_batched_tokens: int = 512,
                 kv_memory=None, num_blocks: "int | None" = None, prefix_cache: bool = True,
                 poison_unused: bool = False, speculative: "str | None" = None,
                 num_speculative_tokens: int = 4, draft_model=None, adapt_drafts: bool = True,
                 draft_vocab: "int | None" = DRAFT_VOCAB):
        for name, v in (("max_batch", max_batch), ("max_batched_tokens", max_batched_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if kv_memory is None and num_blocks is None:
            kv_memory = default_kv_memory()
        elif kv_memory is not None:
            kv_memory = parse_bytes(kv_memory)
        self.model = model
        cfg = model.config
        self.pool = KVBlockPool(len(model.layers), cfg.num_kv_heads, cfg.head_dim,
                                model.block_size, model.kv_dtype, model.cache_placements,
                                num_blocks=num_blocks, kv_memory=kv_memory,
                                prefix_cache=prefix_cache, poison_unused=poison_unused)
        self.max_tokens = model.max_tokens or (1 << 30)
        salt = f"{id(model.weights)}:{model.kv_dtype}:{model.block_size}".encode()
        self.kv = KVCacheManager(self.pool, self.max_tokens, salt, window=model.kv_window)
        self.scheduler = Scheduler(self.kv, max_batch, max_batched_tokens)
        total = self.pool.num_total
        self.drafting = Drafting(model, self.kv, self.max_tokens, speculative=speculative,
                                 num_speculative_tokens=num_speculative_tokens,
                                 draft_model=draft_model, adapt_drafts=adapt_drafts,
                                 draft_vocab=draft_vocab,
                                 pool_tokens=None if total is None else total * model.block_size)
        self._requests: dict = {}
        self._arrivals = itertools.count()
        self.prompt_tokens = 0  # counters for monitoring
        self.prefill_tokens = 0  # prompt tokens computed (cached prefixes and recomputes not)
        self.generation_tokens = 0
        self.aborted = 0
        self.steps = 0
        self.draft_tokens = 0  # drafts fed (speculative decoding), and those the sampler kept
        self.accepted_tokens = 0
        self._mask_thread = None  # computes constraint masks while the model runs a step

    @property
    def draft_pool(self):
        """The draft model's KV pool (speculative="draft"), or None."""
        return self.drafting.pool

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, ids, params: "GenerationParams | None" = None,
                    request_id: "str | None" = None) -> str:
        """Queue a request (token ids + parameters); returns its id.  Raises ValueError for a bad
        request, which changes nothing."""
        req = self.prepare_request(ids, params, request_id)
        self.admit_request(req)
        return req.request_id

    def prepare_request(self, ids, params: "GenerationParams | None" = None,
                        request_id: "str | None" = None) -> Request:
        """Check a request and build it without queueing it (changes nothing; safe to call from
        another thread than the one stepping).  Raises ValueError for a bad request."""
        params = params if params is not None else GenerationParams()
        if not isinstance(params, GenerationParams):
            raise TypeError(f"params must be GenerationParams, got {type(params).__name__}")
        prompt = [int(t) for t in self.model.check_ids(ids)]
        if not prompt:
            raise ValueError("the prompt has no tokens")
        if len(prompt) >= self.max_tokens:
            raise ValueError(f"the prompt has {len(prompt)} tokens; the model's context holds "
                             f"{self.max_tokens} (at least one must be left to generate)")
        if self.pool.max_blocks is not None:
            need = -(-(len(prompt) + 1) // self.pool.block_size)
            if need > self.pool.max_blocks:
                raise ValueError(f"the prompt needs {need} KV blocks; the whole pool has "
                                 f"{self.pool.max_blocks}")
        if request_id is not None and request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        far = [t for t in params.logit_bias if t >= self.model.vocab_size]
        if far:
            raise ValueError(f"logit_bias names token {far[0]}; the vocabulary has "
                             f"{self.model.vocab_size} tokens")
        self.drafting.check(params)
        stops = self.model.stop_ids(params.stop_tokens)
        req = Request(prompt, params, stops, self.model.tokenizer, arrival=next(self._arrivals))
        if params.constraint is not None:
            req.matcher = params.constraint.matcher(self.model.tokenizer, self.model.vocab_size)
        if request_id is not None:
            req.request_id = str(request_id)
        return req

    def admit_request(self, req: Request) -> None:
        """Queue a request built by ``prepare_request``."""
        if req.request_id in self._requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self._requests[req.request_id] = req
        self.scheduler.add(req)
        self.prompt_tokens += len(req.prompt)

    def abort(self, request_id: str) -> RequestOutput:
        """Stop a request now; its blocks go back to the pool.  KeyError for an unknown id."""
        req = self._requests.get(request_id)
        if req is None:
            raise KeyError(f"no request {request_id!r} (unknown or already finished)")
        return self._finish(req, "abort")

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def has_request(self, request_id: str) -> bool:
        """Whether the request is queued or running (not finished)."""
        return request_id in self._requests

    def request_ids(self) -> list:
        """The ids of every unfinished request."""
        return list(self._requests)

    def _finish(self, req: Request, reason: str, error: "str | None" = None) -> RequestOutput:
        self.scheduler.remove(req)
        self.drafting.forget(req.request_id)
        self._requests.pop(req.request_id, None)
        req.finish_reason = reason
        if reason == "abort":
            self.aborted += 1
        return req.report([], True, reason, error)

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> list:
        """Run one step; returns a RequestOutput for every request that sampled a token,
        finished or failed in it."""
        outputs = []
        while True:
            try:
                plan = self.scheduler.plan()
                break
            except _TooLarge as exc:  # cannot fit even alone: fail it, plan again
                outputs.append(self._finish(exc.request, "error",
                                            "the request does not fit in the KV pool"))
        for req, error in plan.failed:
            outputs.append(self._finish(req, "error", error))
        for req in plan.exhausted:  # alone, and the pool cannot hold one more of its tokens
            outputs.append(self._finish(req, "length"))
        if plan.empty:
            return outputs
        self.steps += 1
        # prompt chunks in one ragged batch, generated tokens (decodes, recomputes) in another
        prompt = [(r, n) for r, n, role in plan.prefills if role == kernel_role.PROMPT]
        decode = [(r, n) for r, n, role in plan.prefills if role == kernel_role.DECODE]
        decode += [(r, 1) for r in plan.decodes]
        drafts = self.drafting.plan(plan.decodes)
        masks = self._start_masks([r for r, n in prompt + decode if r.pending == n])
        ready = []  # (request, logits row, or rows for one with drafts) ready to sample
        for items, role in ((prompt, kernel_role.PROMPT), (decode, kernel_role.DECODE)):
            if items:
                t0 = time.perf_counter()
                done = self._run(items, role, outputs, drafts if role == kernel_role.DECODE else {})
                if role == kernel_role.PROMPT:
                    self.drafting.prefill([r for r, _ in done])
                ready.extend(done)
                if role == kernel_role.DECODE:  # what a row costs (speculative decoding)
                    rows = sum(n for _, n in items) + sum(map(len, drafts.values()))
                    step_cost(self.model).observe(rows, time.perf_counter() - t0)
        if masks is not None:
            try:
                masks.result()
            except Exception:  # noqa: BLE001 - recomputed, and failed, per request below
                pass
        for req, logits in ready:
            try:
                outputs.append(self._verify(req, logits, drafts[req.request_id])
                               if req.request_id in drafts else self._sample(req, logits))
            except Exception as exc:  # noqa: BLE001 - this request's fault, not the batch's
                outputs.append(self._finish(req, "error", f"{type(exc).__name__}: {exc}"))
        return outputs

    def _run(self, items: list, role: str, outputs: list, drafts: dict) -> list:
        """Feed each request its next n tokens (and its drafts) in one ragged step; if the step
        fails, each request alone, so that only the failing ones finish with an error.  A
        request with drafts gets the logits of every row it fed."""
        chunks = [r.tokens[r.computed:r.computed + n] + drafts.get(r.request_id, [])
                  for r, n in items]
        kw = {"rows": "all"} if drafts else {}  # (the logits of every row)
        try:
            logits = self.model.forward_step([(r.cache, c) for (r, _), c in zip(items, chunks)],
                                             role=role, **kw)
            results = list(zip(items, logits))
        except Exception:  # noqa: BLE001 - find the request(s) at fault
            results = []
            for (r, n), c in zip(items, chunks):
                try:
                    results.append(((r, n), self.model.forward_step([(r.cache, c)], role=role,
                                                                    **kw)[0]))
                except Exception as exc:  # noqa: BLE001
                    outputs.append(self._finish(r, "error", f"{type(exc).__name__}: {exc}"))
        ready = []
        for (r, n), row in results:
            r.computed += n
            if role == kernel_role.PROMPT:
                self.prefill_tokens += n
                self.kv.cache_prompt_blocks(r)
            self.kv.release_out_of_window(r)
            if r.pending == 0:
                ready.append((r, row if r.request_id in drafts or not kw else row[-1]))
        return ready

    def _start_masks(self, sampling: list):
        """Compute the constraint masks of the requests that sample in this step, in a thread
        beside the model's step (None when none of them has a constraint)."""
        matchers = [r.matcher for r in sampling if r.matcher is not None]
        if not matchers:
            return None
        if self._mask_thread is None:
            self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="hybrid-masks")
        return self._mask_thread.submit(lambda: [m.fill_mask() for m in matchers])

    def _verify(self, req: Request, rows: np.ndarray, drafts: list) -> RequestOutput:
        """Sample each fed row in order (rows[i] follows draft i); keep the drafts up to the
        first the sampler did not pick, and drop the K/V of the rest."""
        toks, lps, reason = [], [], None
        kept = 0
        for i, row in enumerate(rows):
            tok, lp, reason = self._take(req, row)
            toks.append(tok)
            lps.append(lp)
            if i == len(drafts) or tok != drafts[i]:
                break
            kept += 1
            if reason is not None:
                break
        self.draft_tokens += len(drafts)
        self.accepted_tokens += kept
        req.draft_accept.update(req.draft_kind, kept, len(drafts))
        req.computed += kept
        req.cache.truncate(req.computed)
        return self._emit(req, toks, lps if req.params.logprobs is not None else None, reason)

    def _sample(self, req: Request, logits: np.ndarray) -> RequestOutput:
        tok, lp, reason = self._take(req, logits)
        return self._emit(req, [tok], None if lp is None else [lp], reason)

    def _emit(self, req: Request, toks: list, lps, reason) -> RequestOutput:
        """The RequestOutput of the tokens req took in this step (finishing it if reason)."""
        if reason is not None:
            out = self._finish(req, reason)
            out.new_tokens, out.logprobs = toks, lps
            return out
        return req.report(toks, logprobs=lps)

    def _take(self, req: Request, logits: np.ndarray):
        """Sample req's next token and append it: (token, its logprob entry or None, the
        finish reason or None)."""
        m = req.matcher
        tok = req.sampler(logits, req.tokens, None if m is None else m.allowed())
        if req.shadow_draft is not None:
            req.draft_accept.update(req.draft_kind, int(tok == req.shadow_draft), 1)
            req.shadow_draft = None
        if m is not None:
            m.accept(tok)
        k = req.params.logprobs
        lp = None if k is None else token_logprob(logits, tok, k)
        req.generated.append(tok)
        self.generation_tokens += 1
        if req.output is not None:
            req.output.add(tok)
        reason = None
        if tok in req.stops or (req.output is not None and req.output.stopped) \
                or (m is not None and m.done):
            reason = "stop"
        elif len(req.generated) >= req.params.max_new_tokens \
                or len(req.prompt) + len(req.generated) >= self.max_tokens:
            reason = "length"
        return tok, lp, reason

    # -- offline ----------------------------------------------------------------------------
    def generate(self, prompts, max_new_tokens: int = 32, *, seed=None, **kw) -> list:
        """The new ids of each prompt.  Keywords: the fields of GenerationParams; prompt i
        samples with seed + i."""
        prompts = list(prompts)
        if max_new_tokens == 0:
            for p in prompts:
                self.model.check_ids(p)
            return [[] for _ in prompts]
        kw.setdefault("detokenize", bool(kw.get("stop_strings")))
        params = [GenerationParams(max_new_tokens, seed=None if seed is None else seed + i, **kw)
                  for i in range(len(prompts))]
        ids = []
        try:
            for p, gp in zip(prompts, params):
                ids.append(self.add_request(p, gp))
        except BaseException:
            for rid in ids:
                self.abort(rid)
            raise
        results = {}
        while any(rid not in results for rid in ids):
            for out in self.step():
                if out.finished and out.request_id in ids:
                    if out.finish_reason == "error":
                        for rid in ids:
                            if rid in self._requests:
                                self.abort(rid)
                        raise RuntimeError(f"request {out.request_id} failed: {out.error}")
                    results[out.request_id] = list(out.tokens)
        return [results[rid] for rid in ids]

    # -- monitoring -------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters: requests running/waiting, KV blocks used/cached/total, prefix-cache hit
        tokens, prompt and generated tokens, preemptions, aborted requests, steps, draft tokens
        fed and kept (speculative decoding)."""
        return {"requests_running": len(self.scheduler.running),
                "requests_waiting": len(self.scheduler.waiting),
                "kv_blocks_used": self.pool.num_used,
                "kv_blocks_cached": self.pool.num_cached,
                "kv_blocks_total": self.pool.num_total,
                "prefix_cache_hit_tokens": self.pool.hit_tokens,
                "prompt_tokens": self.prompt_tokens,
                "prefill_tokens": self.prefill_tokens,
                "generation_tokens": self.generation_tokens,
                "preemptions": self.scheduler.preemptions,
                "requests_aborted": self.aborted,
                "steps": self.steps,
                "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens}
