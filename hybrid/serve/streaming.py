"""One request's answer: its outputs from the engine as they come, as a JSON completion or as
Server-Sent Events (``data: {chunk}`` lines ending in ``data: [DONE]``), with usage, timings,
a deadline and a log line."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import aclosing

from .protocol import APIError

log = logging.getLogger("hybrid.serve")


class RequestFailed(RuntimeError):
    """The engine finished the request with an error (ours, not the client's)."""


class Run:
    """One request's stream: its outputs as they come (text from the engine), counts and
    timings.  Past ``timeout`` seconds (None: no deadline) the next wait raises TimeoutError and
    the request is aborted."""

    def __init__(self, engine, ids, params, metrics, rid, timeout: "float | None" = None,
                 tokenizer=None):
        self.engine, self.ids, self.params = engine, ids, params
        self.metrics, self.id = metrics, rid
        self.tokenizer = tokenizer  # for the tokens' text in logprobs
        self.logprobs: list = []  # a TokenLogprob per generated token (params.logprobs)
        self.text_offset = 0  # completions' logprobs: where the next token's text starts
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.tokens: list = []
        self.last = None  # the latest RequestOutput
        self.finish_reason = None
        self.t0 = time.perf_counter()
        self.t_first = None
        self.t_last = None
        self.created = int(time.time())

    async def start(self):
        self.gen = self.engine.stream(self.ids, self.params)
        self.first = await self._next()  # raises ValueError for a bad request
        self._take(self.first)

    async def _next(self):
        """The next output, within the deadline (a wait cut short aborts the request: the
        stream's generator is cancelled)."""
        if self.deadline is None:
            return await self.gen.__anext__()
        left = self.deadline - time.monotonic()
        if left <= 0:
            await self.gen.aclose()
            raise TimeoutError("the request ran past the server's deadline")
        try:
            return await asyncio.wait_for(self.gen.__anext__(), left)
        except asyncio.TimeoutError:
            raise TimeoutError("the request ran past the server's deadline") from None

    def _take(self, out):
        now = time.perf_counter()
        if out.new_tokens:
            if self.t_first is None:
                self.t_first = now
                self.metrics.ttft.observe(now - self.t0)
            elif self.t_last is not None:
                self.metrics.token_latency.observe((now - self.t_last) / len(out.new_tokens))
            self.t_last = now
        self.tokens = out.tokens
        self.last = out
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.finished:
            self.finish_reason = "stop" if out.finish_reason in ("stop", "abort") else out.finish_reason
            if out.finish_reason == "error":
                raise RequestFailed(out.error)
            self._log()

    async def outputs(self):
        """The first output, then the rest as they come."""
        yield self.first
        if self.first.finished:
            return
        async with aclosing(self.gen):
            while True:
                try:
                    out = await self._next()
                except StopAsyncIteration:
                    return
                self._take(out)
                yield out
                if out.finished:
                    return

    async def finish(self):
        async for _ in self.outputs():
            pass

    async def close(self):
        """Abort the request if it still runs (a sibling choice failed, or the response
        ended)."""
        gen = getattr(self, "gen", None)
        if gen is not None:
            try:
                await gen.aclose()
            except RuntimeError:  # its own task is being cancelled, which aborts it
                pass

    def text(self) -> str:
        """The generated text so far (end-of-sequence tokens add none; cut before a stop
        string)."""
        return self.last.text if self.last is not None else ""

    def _log(self):
        dt = time.perf_counter() - self.t0
        ttft = (self.t_first - self.t0) if self.t_first else float("nan")
        decode = (self.t_last - self.t_first) if self.t_first and self.t_last else 0.0
        tps = (len(self.tokens) - 1) / decode if decode > 0 else 0.0
        log.info("%s prompt=%d generated=%d ttft=%.3fs %.1f tok/s total=%.3fs finish=%s",
                 self.id, len(self.ids), len(self.tokens), ttft, tps, dt, self.finish_reason)


def _token_text(run: Run, tok: int) -> str:
    if run.tokenizer is None:
        return f"token_id:{tok}"
    return run.tokenizer.decode([tok], skip_special_tokens=False)


def logprobs_body(run: Run, chat: bool, entries) -> "dict | None":
    """OpenAI's logprobs object for these tokens (None when the request asked for none).  A
    token's text is its own decoding (a token holding part of a character shows U+FFFD)."""
    if run.params.logprobs is None:
        return None
    if chat:
        def item(tok, lp):
            text = _token_text(run, tok)
            return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}
        return {"content": [dict(item(e.token, e.logprob),
                                 top_logprobs=[item(t, lp) for t, lp in e.top])
                            for e in entries]}
    tokens = [_token_text(run, e.token) for e in entries]
    offsets = []
    for text in tokens:
        offsets.append(run.text_offset)
        run.text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{_token_text(run, t): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets}


class Answer:
    """One choice of a response: its Run read as OpenAI's choice objects, whole (``final``) or
    as stream deltas (``deltas``).  ``plan`` (hybrid.chat.ChatPlan) reads tool calls out of a
    chat answer; ``echo`` is the prompt's text put before a completion's."""

    def __init__(self, run: Run, index: int, chat: bool, plan=None, echo: str = ""):
        self.run, self.index, self.chat, self.plan, self.echo = run, index, chat, plan, echo
        self.tools = plan.stream() if plan is not None else None
        self.called = False  # the stream handed out a tool call

    def final(self) -> dict:
        run = self.run
        lp = logprobs_body(run, self.chat, run.logprobs)
        if not self.chat:
            return {"index": self.index, "text": self.echo + run.text(),
                    "finish_reason": run.finish_reason, "logprobs": lp}
        message, finish = (self.plan.message(run.text(), run.finish_reason) if self.plan
                           else ({"role": "assistant", "content": run.text()},
                                 run.finish_reason))
        return {"index": self.index, "message": message, "finish_reason": finish,
                "logprobs": lp}

    def deltas(self, out) -> list:
        """The stream's choice objects for one engine output (none when it adds nothing)."""
        run = self.run
        finish = run.finish_reason if out.finished else None
        if not (out.delta or out.finished or out.logprobs or self.echo):
            return []
        lp = logprobs_body(run, self.chat, out.logprobs or [])
        if not self.chat:
            text, self.echo = self.echo + out.delta, ""
            return [{"index": self.index, "text": text, "finish_reason": finish, "logprobs": lp}]
        delta = {"role": "assistant", "content": out.delta}
        if self.tools is not None:
            content, calls = self.tools.add(out.delta, out.finished)
            delta["content"] = content or (None if calls else "")
            if calls:
                delta["tool_calls"] = [dict(c, index=self.tools.calls_sent - len(calls) + i)
                                       for i, c in enumerate(calls)]
                self.called = True
            if out.finished and self.called:
                finish = "tool_calls"
            if not (content or calls or out.finished or out.logprobs):
                return []
        return [{"index": self.index, "delta": delta, "finish_reason": finish, "logprobs": lp}]


def usage(answers) -> dict:
    prompt = len(answers[0].run.ids)
    done = sum(len(a.run.tokens) for a in answers)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def final_body(answers, chat: bool, model_name: str) -> dict:
    run = answers[0].run
    return {"id": run.id, "object": "chat.completion" if chat else "text_completion",
            "created": run.created, "model": model_name,
            "choices": [a.final() for a in answers], "usage": usage(answers)}


async def _merged(answers):
    """(answer, output) from every answer's run as they come."""
    if len(answers) == 1:
        async for out in answers[0].run.outputs():
            yield answers[0], out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(a):
        try:
            async for out in a.run.outputs():
                await queue.put((a, out, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the reader
            await queue.put((a, None, exc))
        finally:
            await queue.put((a, None, None))
    tasks = [asyncio.ensure_future(pump(a)) for a in answers]
    try:
        left = len(answers)
        while left:
            a, out, exc = await queue.get()
            if exc is not None:
                raise exc
            if out is None:
                left -= 1
            else:
                yield a, out
    finally:
        for t in tasks:
            t.cancel()


async def sse(answers, chat: bool, model_name: str, include_usage: bool):
    run = answers[0].run
    obj = "chat.completion.chunk" if chat else "text_completion"

    def event(choices, usage_=None) -> str:
        body = {"id": run.id, "object": obj, "created": run.created, "model": model_name,
                "choices": choices}
        if include_usage:
            body["usage"] = usage_
        return f"data: {json.dumps(body)}\n\n"
    try:
        async for a, out in _merged(answers):
            choices = a.deltas(out)
            if choices:
                yield event(choices)
        if include_usage:
            yield event([], usage(answers))
    except (RuntimeError, TimeoutError) as exc:  # closed, failed, too slow a reader, deadline
        status = 408 if isinstance(exc, TimeoutError) else \
            500 if isinstance(exc, RequestFailed) else 503
        err = APIError(status, f"the request ended early: {exc}",
                       "timeout" if status == 408 else "server_error")
        yield f"data: {json.dumps(err.body())}\n\n"
    yield "data: [DONE]\n\n"
