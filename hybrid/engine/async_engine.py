"""AsyncEngine: the engine's step loop on its own thread, streams for asyncio consumers.

    engine = hybrid.AsyncEngine(model, max_batch=16)
    async for out in engine.stream(ids, GenerationParams(max_new_tokens=64)):
        print(out.new_tokens)          # RequestOutput per step; the last has finished=True

Requests from any number of coroutines join the running batch at the next step.  A consumer that
stops iterating (break, cancellation, a closed connection) aborts its request, whose blocks go
back to the pool at once, whether it was running or still queued.  A consumer that falls more
than ``max_pending`` outputs behind has its request aborted and gets ``SlowConsumerError``, so
a reader that stops reading costs bounded memory.  ``close()`` stops the loop; streams still
running end with ``EngineClosedError``.  A fault of the loop itself (not of a request) stops it
too: ``failure`` says why, and every stream and every new request get ``EngineClosedError``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading

from .engine import Engine
from .params import GenerationParams
from .request import RequestOutput


log = logging.getLogger("hybrid.engine")


class EngineClosedError(RuntimeError):
    """The engine was closed (or stopped by a fault) while the request was running."""


class SlowConsumerError(RuntimeError):
    """The request's reader fell too far behind its outputs; the request was aborted."""


def _put_all(puts) -> None:
    for queue, item in puts:
        queue.put_nowait(item)


class AsyncEngine:
    def __init__(self, model, *, max_pending: int = 1024, **engine_kw):
        self.engine = Engine(model, **engine_kw)
        self.max_pending = max_pending  # outputs a stream may have waiting for its reader
        self.failure: "BaseException | None" = None  # what stopped the loop, if a fault did
        self._lock = threading.Lock()  # one thread at a time inside the engine
        self._wake = threading.Event()
        # request id -> (event loop, asyncio.Queue, [outputs sent, outputs taken]): the engine
        # thread alone counts what it sends and the consumer alone what it takes, so their
        # difference is what waits for the reader (in the queue or still on its way there)
        self._streams: dict = {}
        # handed to the engine thread without waiting for its lock (held through a step)
        self._incoming: collections.deque = collections.deque()  # prepared requests
        self._aborts: collections.deque = collections.deque()  # request ids
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="hybrid-engine", daemon=True)
        self._thread.start()

    # -- the step loop (engine thread) ------------------------------------------------------
    def _loop(self) -> None:
        try:
            while True:
                self._wake.wait()
                if self._closed:
                    break
                with self._lock:
                    self._take_handovers()
                    if not self.engine.has_unfinished():
                        self._wake.clear()
                        if self._incoming or self._aborts:
                            self._wake.set()
                        continue
                    try:
                        outs = self.engine.step()
                    except Exception as exc:  # noqa: BLE001 - a step fault fails every stream
                        outs = []
                        for rid in list(self._streams):
                            if self.engine.has_request(rid):
                                self.engine.abort(rid)
                            self._deliver(rid, exc)
                self._deliver_many([(out.request_id, out) for out in outs])
        except BaseException as exc:  # noqa: BLE001 - a fault of the loop itself: say so
            self.failure = exc
            log.exception("the engine loop stopped")
        why = f"the engine stopped: {self.failure!r}" if self.failure else "the engine was closed"
        for rid in list(self._streams):
            self._deliver(rid, EngineClosedError(why))

    def _take_handovers(self) -> None:
        """Admit the requests handed over and apply the aborts; a request whose abort came
        before it was admitted is dropped (its consumer has left).  One request's failure to be
        admitted or aborted is that request's, not the loop's."""
        incoming = []
        while self._incoming:
            incoming.append(self._incoming.popleft())
        aborted = set()
        while self._aborts:
            aborted.add(self._aborts.popleft())
        for req in incoming:
            if req.request_id in aborted:
                aborted.discard(req.request_id)
                self.engine.aborted += 1
                continue
            try:
                self.engine.admit_request(req)
            except Exception as exc:  # noqa: BLE001
                self._deliver(req.request_id, exc)
        for rid in aborted:
            try:
                if self.engine.has_request(rid):
                    self.engine.abort(rid)
            except Exception:  # noqa: BLE001
                log.exception("aborting request %s failed", rid)

    @property
    def healthy(self) -> bool:
        """Whether the loop runs (not closed, not stopped by a fault)."""
        return not self._closed and self.failure is None and self._thread.is_alive()

    def _deliver_many(self, items) -> None:
        """Hand a step's outputs over with one wake-up per consumer event loop.  A stream whose
        reader has ``max_pending`` outputs waiting gets SlowConsumerError instead, and its
        request is aborted."""
        by_loop: dict = {}
        for rid, item in items:
            target = self._streams.get(rid)
            if target is None:
                continue
            counts = target[2]
            if counts[0] - counts[1] >= self.max_pending and not item.finished:
                self._streams.pop(rid, None)
                self.abort(rid)
                item = SlowConsumerError(f"the client read too slowly ({self.max_pending} "
                                         f"outputs waiting); the request was aborted")
            counts[0] += 1
            by_loop.setdefault(target[0], []).append((target[1], item))
        for loop, puts in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, puts)
            except RuntimeError:  # that loop is gone: nobody listens there any more
                pass

    def _deliver(self, rid: str, item) -> None:
        target = self._streams.get(rid)
        if target is None:
            return
        loop, queue, counts = target
        counts[0] += 1
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is gone: nobody listens any more
            self._streams.pop(rid, None)

    # -- the consumer side ------------------------------------------------------------------
    async def stream(self, ids, params: "GenerationParams | None" = None):
        """Yield a RequestOutput per step of this request until it finishes.  Raises ValueError
        for a bad request (before anything runs)."""
        if not self.healthy:
            raise EngineClosedError(f"the engine stopped: {self.failure!r}" if self.failure
                                    else "the engine is closed")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        req = self.engine.prepare_request(ids, params)  # checks; the engine thread admits it
        rid = req.request_id
        counts = [0, 0]
        self._streams[rid] = (loop, queue, counts)
        self._incoming.append(req)
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                counts[1] += 1
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self.abort(rid)

    async def generate(self, ids, params: "GenerationParams | None" = None) -> RequestOutput:
        """The last output of a request (its tokens and finish reason)."""
        last = None
        async for last in self.stream(ids, params):
            pass
        return last

    def abort(self, rid: str) -> None:
        """Abort a request if it is still running (no error if it is not), at the engine's
        next step."""
        self._aborts.append(rid)
        self._wake.set()

    def stats(self) -> dict:
        """The engine's counters (read without waiting for a step to end; requests handed over
        but not yet admitted count as waiting)."""
        st = self.engine.stats()
        st["requests_waiting"] += len(self._incoming)
        return st

    def close(self) -> None:
        """Stop the step loop; running streams end with EngineClosedError."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        with self._lock:
            for rid in self.engine.request_ids():
                self.engine.abort(rid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
