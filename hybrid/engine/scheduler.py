"""Which requests run in the next step, and with how many tokens (continuous batching).

Each step:
1. Every running request that is decoding (one token to feed) gets its token, oldest first, up
   to ``max_batch`` requests.  A decode that needs a new block when the pool is dry preempts
   the newest running request: its blocks go back to the pool (registered prompt blocks stay in
   the prefix cache) and it waits at the front of the queue to be recomputed later.
2. Running requests still prefilling (or recomputing after a preemption) get chunks of their
   pending tokens from what is left of ``max_batched_tokens`` (a smaller chunk where the pool
   holds no more).
A request that cannot grow when every newer one is preempted already is preempted itself if an
older one runs (it resumes when blocks come back); if it runs alone, the pool cannot hold it and
it finishes with "length".  So the oldest request always progresses or finishes: every step does
something, and every request finishes.
3. Waiting requests are admitted in arrival order while there is room in the batch, tokens
   in the budget and blocks in the pool: their prompt's longest cached prefix of full blocks is
   taken from the prefix cache and only the rest is computed.

Once the plan is settled the scheduler allocates every slot the step writes through the KV
manager (hybrid/engine/kv_manager.py); the step's description (hybrid/step.py) only reads them.

A chunk never mixes prompt tokens with generated ones (recomputed after a preemption): they take
different kernels (hybrid/kernel_role.py), which keeps every request's result independent of
how it was batched and chunked.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .. import kernel_role
from .kv_manager import KVCacheManager
from .request import Request


@dataclass
class StepPlan:
    prefills: list = field(default_factory=list)  # (request, n_tokens, role)
    decodes: list = field(default_factory=list)  # requests feeding their one pending token
    preempted: list = field(default_factory=list)
    failed: list = field(default_factory=list)  # (request, error): its slots could not be taken
    exhausted: list = field(default_factory=list)  # alone, and the pool cannot hold one more token

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_batch: int, max_batched_tokens: int):
        self.kv = kv
        self.max_batch = max_batch
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque = deque()
        self.running: list = []  # admitted, in admission order
        self.preemptions = 0

    # -- bookkeeping ------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Take a request out (finished, aborted or failed) and give its blocks back."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._free(req)

    def _free(self, req: Request) -> None:
        self.kv.free(req)

    def _preempt(self, victim: Request) -> None:
        """Its blocks go back; it waits at the front of the queue to be recomputed."""
        self.running.remove(victim)
        self._free(victim)
        self.waiting.appendleft(victim)
        self.preemptions += 1
        self._plan.preempted.append(victim)
        for item in list(self._plan.prefills):
            if item[0] is victim:
                self._plan.prefills.remove(item)
                self._reserved -= item[3]
        if victim in self._plan.decodes:
            self._plan.decodes.remove(victim)
            self._reserved -= self._decode_blocks.pop(id(victim), 0)

    def _preempt_newest(self, keep: Request) -> bool:
        """Preempt the newest running request other than ``keep``; False if none."""
        for victim in reversed(self.running):
            if victim is not keep and victim.arrival > keep.arrival:
                self._preempt(victim)
                return True
        return False

    def _reserve(self, req: Request, n: int) -> int:
        """Make sure the pool can give req blocks for n more tokens (preempting newer requests
        if needed); returns the blocks reserved, or -1.  The blocks are taken once the plan is
        settled (``plan``)."""
        blocks = self.kv.blocks_needed(req, n)
        while not self.kv.can_allocate(blocks + self._reserved):
            if not self._preempt_newest(req):
                return -1
        self._reserved += blocks
        return blocks

    def _fit(self, req: Request, n: int):
        """(tokens, blocks) of req's next n tokens reserved: all n, or as many as the pool
        holds once every newer request is preempted; (0, 0) when not one fits."""
        blocks = self._reserve(req, n)
        if blocks >= 0:
            return n, blocks
        free = self.kv.blocks_available()
        m = min(n, self.kv.tokens_that_fit(req, free - self._reserved)) if free is not None else 0
        if m > 0:
            blocks = self._reserve(req, m)
            if blocks >= 0:
                return m, blocks
        return 0, 0

    def _cannot_grow(self, req: Request) -> None:
        """req cannot take one more token though every newer request is preempted: it waits for
        an older one to finish, or, running alone, finishes (the pool cannot hold it)."""
        if any(r is not req for r in self.running):
            self._preempt(req)
        else:
            self.running.remove(req)
            self._free(req)
            self._plan.exhausted.append(req)

    # -- planning ---------------------------------------------------------------------------
    def _chunk(self, req: Request, budget: int):
        """(n_tokens, role) of req's next chunk within budget: prompt and generated tokens are
        never mixed."""
        n_prompt = len(req.prompt)
        if req.computed < n_prompt:
            return min(budget, n_prompt - req.computed), kernel_role.PROMPT
        return min(budget, req.pending), kernel_role.DECODE

    def plan(self) -> StepPlan:
        plan = self._plan = StepPlan()
        self._reserved = 0
        self._decode_blocks: dict = {}  # id(request) -> blocks reserved for its decode
        budget = self.max_batched_tokens
        # 1. running decodes, oldest first
        for req in list(self.running):
            if req not in self.running or req.pending != 1 or req.computed < len(req.prompt):
                continue
            if len(plan.decodes) >= self.max_batch or budget < 1:
                break
            n, blocks = self._fit(req, 1)
            if n:
                plan.decodes.append(req)
                self._decode_blocks[id(req)] = blocks
                budget -= 1
            else:
                self._cannot_grow(req)
        # 2. running requests with several tokens pending (prefill, recompute)
        for req in list(self.running):
            if req not in self.running or req in plan.decodes or budget < 1:
                continue
            n, role = self._chunk(req, budget)
            if n <= 0:
                continue
            n, blocks = self._fit(req, n)
            if n:
                plan.prefills.append((req, n, role, blocks))
                budget -= n
            else:
                self._cannot_grow(req)
        # 3. admit waiting requests (not one preempted in this step: it waits for blocks back)
        while self.waiting and budget > 0 and len(self.running) < self.max_batch \
                and self.waiting[0] not in plan.preempted:
            req = self.waiting[0]
            if req.cache is None:
                self.kv.admit(req)
            n, role = self._chunk(req, budget)
            blocks = self._reserve(req, n)
            if blocks < 0:
                self._free(req)  # its prefix blocks go back; it waits for room
                if not self.running:  # nothing to wait for: it can never fit
                    raise _TooLarge(req)
                break
            self.waiting.popleft()
            self.running.append(req)
            plan.prefills.append((req, n, role, blocks))
            budget -= n
        plan.prefills = [(r, n, role) for r, n, role, _ in plan.prefills]
        # the plan is settled: take every slot it writes (reserved above, so they are there; a
        # request whose allocation still fails leaves the plan and fails alone)
        for item in [(r, 1, None) for r in plan.decodes] + list(plan.prefills):
            try:
                self.kv.allocate_slots(item[0], item[1])
            except Exception as exc:  # noqa: BLE001 - this request's, not the step's
                if item[2] is None:
                    plan.decodes.remove(item[0])
                else:
                    plan.prefills.remove(item)
                plan.failed.append((item[0], f"{type(exc).__name__}: {exc}"))
        return plan


class _TooLarge(Exception):
    def __init__(self, req: Request):
        super().__init__(req.request_id)
        self.request = req
