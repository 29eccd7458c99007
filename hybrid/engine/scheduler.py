"""Which requests run in the next step, and with how many tokens (continuous batching).

Each step:
1. Every running request that is decoding (one token to feed) gets its token, oldest first, up
   to ``max_batch`` requests.  A decode that needs a new block when the pool is dry preempts
   the newest running request: its blocks go back to the pool (registered prompt blocks stay in
   the prefix cache) and it waits at the front of the queue to be recomputed later.
2. Running requests still prefilling (or recomputing after a preemption) get chunks of their
   pending tokens from what is left of ``max_batched_tokens``.
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

    def _preempt_newest(self, keep: Request) -> bool:
        """Preempt the newest running request other than ``keep``; False if none."""
        for victim in reversed(self.running):
            if victim is not keep and victim.arrival > keep.arrival:
                self.running.remove(victim)
                self._free(victim)
                self.waiting.appendleft(victim)
                self.preemptions += 1
                self._plan.preempted.append(victim)
                for item in list(self._plan.prefills):
                    if item[0] is victim:
                        self._plan.prefills.remove(item)
                if victim in self._plan.decodes:
                    self._plan.decodes.remove(victim)
                return True
        return False

    def _reserve(self, req: Request, n: int) -> bool:
        """Make sure the pool can give req blocks for n more tokens (preempting newer requests
        if needed); the blocks are taken once the plan is settled (``plan``)."""
        need = self.kv.blocks_needed(req, n) + self._reserved
        while not self.kv.can_allocate(need):
            if not self._preempt_newest(req):
                return False
        self._reserved = need
        return True

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
        budget = self.max_batched_tokens
        # 1. running decodes, oldest first
        for req in list(self.running):
            if req not in self.running or req.pending != 1 or req.computed < len(req.prompt):
                continue
            if len(plan.decodes) >= self.max_batch or budget < 1:
                break
            if self._reserve(req, 1):
                plan.decodes.append(req)
                budget -= 1
        # 2. running requests with several tokens pending (prefill, recompute)
        for req in list(self.running):
            if req not in self.running or req in plan.decodes or budget < 1:
                continue
            n, role = self._chunk(req, budget)
            if n > 0 and self._reserve(req, n):
                plan.prefills.append((req, n, role))
                budget -= n
        # 3. admit waiting requests
        while self.waiting and budget > 0 and len(self.running) < self.max_batch:
            req = self.waiting[0]
            if req.cache is None:
                self.kv.admit(req)
            n, role = self._chunk(req, budget)
            if not self._reserve(req, n):
                self._free(req)  # its prefix blocks go back; it waits for room
                if not self.running:  # nothing to wait for: it can never fit
                    raise _TooLarge(req)
                break
            self.waiting.popleft()
            self.running.append(req)
            plan.prefills.append((req, n, role))
            budget -= n
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
