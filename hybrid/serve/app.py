"""The OpenAI-compatible HTTP app over an AsyncEngine (FastAPI).

    app = build_app(model, model_name="smollm2", max_batch=16, api_key=None, max_queue=256)
    uvicorn.run(app, host="127.0.0.1", port=8000)       # what ``hybrid serve`` does

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions
(streaming as Server-Sent Events ending in ``data: [DONE]``), GET /metrics (Prometheus text).
Every request joins the engine's running batch at its next step; a client that disconnects
mid-stream has its request aborted (its blocks go back to the pool).  Errors are OpenAI-style
JSON bodies with a 4xx status, and the server carries on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import aclosing, asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from ..engine import AsyncEngine, EngineClosedError, GenerationParams
from .metrics import Metrics
from .protocol import RESPONSES, UNAUTHORIZED, APIError, ChatRequest, CompletionRequest

log = logging.getLogger("hybrid.serve")


def build_app(model, *, model_name: str = "hybrid", api_key: "str | None" = None,
              max_queue: int = 256, replica: "str | None" = None, **engine_kw) -> FastAPI:
    """A FastAPI app serving ``model`` through its own AsyncEngine (engine_kw: max_batch,
    max_batched_tokens, kv_memory, prefix_cache)."""
    state = {"engine": None}
    metrics = Metrics()
    ctx_len = model.max_tokens or model.max_position or (1 << 30)

    def engine() -> AsyncEngine:
        if state["engine"] is None:
            state["engine"] = AsyncEngine(model, **engine_kw)
            metrics.bind(state["engine"])
        return state["engine"]

    @asynccontextmanager
    async def lifespan(app):
        engine()
        try:
            yield
        finally:
            state["engine"].close()  # running streams end with an error event

    # every route answers 401 without the key (the middleware below)
    app = FastAPI(title="hybrid", lifespan=lifespan,
                  responses=UNAUTHORIZED if api_key is not None else None)

    def openapi():
        """The schema as the server behaves: invalid bodies answer 400 with an OpenAI-style
        error, not FastAPI's 422."""
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for ops in doc["paths"].values():
                for op in ops.values():
                    op["responses"].pop("422", None)
            doc["components"]["schemas"].pop("HTTPValidationError", None)
            doc["components"]["schemas"].pop("ValidationError", None)
            app.openapi_schema = doc
        return app.openapi_schema
    app.openapi = openapi

    def end_streams():
        """Close the engine now: running streams end with an error event (a server that is
        shutting down calls this before it waits for connections)."""
        if state["engine"] is not None:
            state["engine"].close()
    app.state.end_streams = end_streams

    # -- errors -------------------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=_headers(replica))

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc: HTTPException):
        """The framework's own errors (unknown path, wrong method, a body it cannot decode) in
        the same OpenAI-style body as ours."""
        err = APIError(exc.status_code, str(exc.detail),
                       "invalid_request_error" if exc.status_code < 500 else "server_error")
        headers = {**(exc.headers or {}), **(_headers(replica) or {})}
        return JSONResponse(err.body(), status_code=exc.status_code, headers=headers or None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg = f"the body is not valid JSON: {first.get('ctx', {}).get('error', msg)}"
            loc = ""
        err = APIError(400, f"{loc}: {msg}" if loc else msg, param=loc or None,
                       code=first.get("type"))
        return JSONResponse(err.body(), status_code=400, headers=_headers(replica))

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            err = APIError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                           "authentication_error", code="invalid_api_key")
            return JSONResponse(err.body(), status_code=401, headers=_headers(replica))
        response = await call_next(request)
        if replica is not None:
            response.headers["x-hybrid-replica"] = replica
        return response

    # -- endpoints ----------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": 0, "owned_by": "hybrid"}]}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        engine()
        return metrics.response()

    @app.post("/v1/completions", responses=RESPONSES)
    async def completions(body: CompletionRequest, request: Request):
        _check_model(body.model, model_name)
        if isinstance(body.prompt, str):
            ids = _tokenizer(model).encode(body.prompt)
        else:
            ids = list(body.prompt)
        return await _respond(request, body, ids, body.max_tokens, chat=False)

    @app.post("/v1/chat/completions", responses=RESPONSES)
    async def chat(body: ChatRequest, request: Request):
        _check_model(body.model, model_name)
        tok = _tokenizer(model)
        try:
            msgs = [{"role": m.role, "content": m.text()} for m in body.messages]
            text = tok.apply_chat_template(msgs)
        except ValueError as exc:
            raise APIError(400, f"messages: {exc}", param="messages") from None
        ids = tok.encode(text, add_special_tokens=False)
        limit = body.max_completion_tokens or body.max_tokens
        return await _respond(request, body, ids, limit, chat=True)

    # -- the common path ----------------------------------------------------------------------
    async def _respond(request, body, ids, max_tokens, chat: bool):
        eng = engine()
        if not ids:
            raise APIError(400, "the prompt has no tokens", param="prompt")
        if len(ids) >= ctx_len:
            raise APIError(400, f"the prompt has {len(ids)} tokens; the model's context is "
                                f"{ctx_len}", param="prompt", code="context_length_exceeded")
        max_new = min(max_tokens or (ctx_len - len(ids)), ctx_len - len(ids))
        try:
            params = GenerationParams(max_new_tokens=max_new, temperature=body.temperature,
                                      top_k=body.top_k, top_p=body.top_p,
                                      repetition_penalty=body.repetition_penalty,
                                      seed=body.seed, stop_strings=tuple(body.stop_list()))
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        if eng.stats()["requests_waiting"] >= max_queue:
            raise APIError(429, f"the queue is full ({max_queue} waiting requests); retry later",
                           "rate_limit_error", code="queue_full")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        run = _Run(eng, ids, params, metrics, rid)
        try:
            await run.start()
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc)) from None
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_sse(run, chat, model_name, usage),
                                     media_type="text/event-stream", headers=_headers(replica))
        try:
            await run.finish()
        except EngineClosedError as exc:
            raise APIError(503, str(exc), "server_error") from None
        return JSONResponse(_final(run, chat, model_name), headers=_headers(replica))

    return app


def _headers(replica):
    return {"x-hybrid-replica": replica} if replica is not None else None


def _check_model(name, served):
    if name is not None and name != served:
        raise APIError(404, f"the model {name!r} does not exist; this server serves {served!r}",
                       param="model", code="model_not_found")


def _tokenizer(model):
    if model.tokenizer is None:
        raise APIError(400, "this model has no tokenizer; send prompt as a list of token ids")
    return model.tokenizer


class _Run:
    """One request's stream: its outputs as they come (text from the engine), counts and
    timings."""

    def __init__(self, engine, ids, params, metrics, rid):
        self.engine, self.ids, self.params = engine, ids, params
        self.metrics, self.id = metrics, rid
        self.tokens: list = []
        self.last = None  # the latest RequestOutput
        self.finish_reason = None
        self.t0 = time.perf_counter()
        self.t_first = None
        self.t_last = None
        self.created = int(time.time())

    async def start(self):
        self.gen = self.engine.stream(self.ids, self.params)
        self.first = await self.gen.__anext__()  # raises ValueError for a bad request
        self._take(self.first)

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
        if out.finished:
            self.finish_reason = "stop" if out.finish_reason in ("stop", "abort") else out.finish_reason
            if out.finish_reason == "error":
                raise RuntimeError(out.error)
            self._log()

    async def outputs(self):
        """The first output, then the rest as they come."""
        yield self.first
        if self.first.finished:
            return
        async with aclosing(self.gen) as gen:
            async for out in gen:
                self._take(out)
                yield out

    async def finish(self):
        async for _ in self.outputs():
            pass

    def text(self) -> str:
        """The generated text so far (end-of-sequence tokens add none; cut before a stop
        string)."""
        return self.last.text if self.last is not None else ""

    def usage(self) -> dict:
        return {"prompt_tokens": len(self.ids), "completion_tokens": len(self.tokens),
                "total_tokens": len(self.ids) + len(self.tokens)}

    def _log(self):
        dt = time.perf_counter() - self.t0
        ttft = (self.t_first - self.t0) if self.t_first else float("nan")
        decode = (self.t_last - self.t_first) if self.t_first and self.t_last else 0.0
        tps = (len(self.tokens) - 1) / decode if decode > 0 else 0.0
        log.info("%s prompt=%d generated=%d ttft=%.3fs %.1f tok/s total=%.3fs finish=%s",
                 self.id, len(self.ids), len(self.tokens), ttft, tps, dt, self.finish_reason)


def _choice(run: _Run, chat: bool, text: str, finish, delta: bool) -> dict:
    if chat:
        key = "delta" if delta else "message"
        return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish,
                "logprobs": None}
    return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}


def _final(run: _Run, chat: bool, model_name: str) -> dict:
    return {"id": run.id, "object": "chat.completion" if chat else "text_completion",
            "created": run.created, "model": model_name,
            "choices": [_choice(run, chat, run.text(), run.finish_reason, False)],
            "usage": run.usage()}


async def _sse(run: _Run, chat: bool, model_name: str, include_usage: bool):
    obj = "chat.completion.chunk" if chat else "text_completion"

    def event(choices, usage=None) -> str:
        body = {"id": run.id, "object": obj, "created": run.created, "model": model_name,
                "choices": choices}
        if include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"
    try:
        async for out in run.outputs():
            if out.delta or out.finished:
                yield event([_choice(run, chat, out.delta,
                                     run.finish_reason if out.finished else None, True)])
        if include_usage:
            yield event([], run.usage())
    except (EngineClosedError, RuntimeError, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError):
            raise
        err = APIError(503, f"the request ended early: {exc}", "server_error")
        yield f"data: {json.dumps(err.body())}\n\n"
    yield "data: [DONE]\n\n"
