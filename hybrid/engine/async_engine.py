"""AsyncEngine: the engine's step loop on its own thread, streams for asyncio consumers.

    engine = hybrid.AsyncEngine(model, max_batch=16)
    async for out in engine.stream(ids, GenerationParams(max_new_tokens=64)):
        print(out.new_tokens)          # RequestOutput per step; the last has finished=True

Requests from any number of coroutines join the running batch at the next step.  A consumer that
stops iterating (break, cancellation, a closed connection) aborts its request, whose blocks go
back to the pool at once.  ``close()`` stops the loop; streams still running end with
``EngineClosedError``.
"""

from __future__ import annotations

import asyncio
import collections
import threading

from .engine import Engine
from .params import GenerationParams
from .request import RequestOutput


class EngineClosedError(RuntimeError):
    """The engine was closed while the request was running."""


def _put_all(puts) -> None:
    for queue, item in puts:
        queue.put_nowait(item)


class AsyncEngine:
    def __init__(self, model, **engine_kw):
        self.engine = Engine(model, **engine_kw)
        self._lock = threading.Lock()  # one thread at a time inside the engine
        self._wake = threading.Event()
        self._streams: dict = {}  # request id -> (event loop, asyncio.Queue)
        # handed to the engine thread without waiting for its lock (held through a step)
        self._incoming: collections.deque = collections.deque()  # prepared requests
        self._aborts: collections.deque = collections.deque()  # request ids
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="hybrid-engine", daemon=True)
        self._thread.start()

    # -- the step loop (engine thread) ------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self._wake.wait()
            if self._closed:
                break
            with self._lock:
                while self._incoming:
                    self.engine.admit_request(self._incoming.popleft())
                while self._aborts:
                    rid = self._aborts.popleft()
                    if self.engine.has_request(rid):
                        self.engine.abort(rid)
                if not self.engine.has_unfinished():
                    self._wake.clear()
                    if self._incoming or self._aborts:
                        self._wake.set()
                    continue
                try:
                    outs = self.engine.step()
                except Exception as exc:  # noqa: BLE001 - an engine fault fails every stream
                    outs = []
                    for rid in list(self._streams):
                        if self.engine.has_request(rid):
                            self.engine.abort(rid)
                        self._deliver(rid, exc)
            self._deliver_many([(out.request_id, out) for out in outs])
        for rid in list(self._streams):
            self._deliver(rid, EngineClosedError("the engine was closed"))

    def _deliver_many(self, items) -> None:
        """Hand a step's outputs over with one wake-up per consumer event loop."""
        by_loop: dict = {}
        for rid, item in items:
            target = self._streams.get(rid)
            if target is not None:
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
        loop, queue = target
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is gone: nobody listens any more
            self._streams.pop(rid, None)

    # -- the consumer side ------------------------------------------------------------------
    async def stream(self, ids, params: "GenerationParams | None" = None):
        """Yield a RequestOutput per step of this request until it finishes.  Raises ValueError
        for a bad request (before anything runs)."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        req = self.engine.prepare_request(ids, params)  # checks; the engine thread admits it
        rid = req.request_id
        self._streams[rid] = (loop, queue)
        self._incoming.append(req)
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
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
