"""The OpenAI-compatible HTTP app over an AsyncEngine (FastAPI).

    app = build_app(model, model_name="smollm2", max_batch=16, api_key=None, max_queue=256)
    uvicorn.run(app, host="127.0.0.1", port=8000)       # what ``hybrid serve`` does

The routes live here; errors and the API key in errors.py, one request's answer (JSON or
Server-Sent Events) in streaming.py, the request bodies in protocol.py.

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions
(streaming as Server-Sent Events ending in ``data: [DONE]``), GET /metrics (Prometheus text).
Every request joins the engine's running batch at its next step; a client that disconnects,
while its request waits, runs or streams, has it aborted (its blocks go back to the pool).
Tokenization and chat templates run off the event loop.  Limits: the body size, the requests in
flight and waiting (429 with Retry-After), a deadline per request.  Errors are OpenAI-style JSON
bodies (4xx for the client's fault, a logged 500 for ours, 503 while shutting down or when the
engine has stopped), and the server carries on.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..engine import AsyncEngine, EngineClosedError, GenerationParams
from .errors import BodyLimit, install_auth, install_error_handlers, patch_openapi, replica_headers
from .metrics import Metrics
from .protocol import (RESPONSES, UNAUTHORIZED, APIError, ChatRequest, CompletionRequest,
                       ErrorResponse)
from .streaming import RequestFailed, Run, final_body, sse

MAX_BODY_BYTES = 4 << 20  # the default body-size limit (--max-body-bytes)
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def build_app(model, *, model_name: str = "hybrid", api_key: "str | None" = None,
              max_queue: int = 256, replica: "str | None" = None,
              max_body_bytes: int = MAX_BODY_BYTES, max_concurrency: "int | None" = None,
              request_timeout: "float | None" = None, **engine_kw) -> FastAPI:
    """A FastAPI app serving ``model`` through its own AsyncEngine (engine_kw: max_batch,
    max_batched_tokens, kv_memory, prefix_cache, max_pending).  ``max_concurrency``: requests in
    flight at once (default: max_batch + max_queue); ``request_timeout``: seconds a request may
    take (None: no deadline)."""
    state = {"engine": None, "closing": False, "in_flight": 0}
    if max_concurrency is None:
        max_concurrency = engine_kw.get("max_batch", 16) + max_queue
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

    # every route answers 401 without the key (errors.install_auth)
    app = FastAPI(title="hybrid", lifespan=lifespan,
                  responses=UNAUTHORIZED if api_key is not None else None)

    patch_openapi(app)

    def end_streams():
        """Close the engine now: running streams end with an error event and new requests get
        503 (a server that is shutting down calls this before it waits for connections)."""
        state["closing"] = True
        if state["engine"] is not None:
            state["engine"].close()
    app.state.end_streams = end_streams

    install_error_handlers(app, replica)
    # (inside the auth middleware, so that its 413 reaches the route's error handling as is)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    install_auth(app, api_key, replica, max_body_bytes,
                 json_paths=("/v1/completions", "/v1/chat/completions"))

    def unavailable() -> "str | None":
        """Why the server takes no requests now, or None."""
        if state["closing"]:
            return "the server is shutting down"
        eng = state["engine"]
        if eng is not None and not eng.healthy:
            return f"the engine has stopped ({eng.failure!r}); restart the server"
        return None

    # -- endpoints ----------------------------------------------------------------------------
    @app.get("/health", responses={503: {"model": ErrorResponse,
                                         "description": "Shutting down, or the engine stopped"}})
    async def health():
        why = unavailable()
        if why is not None:
            raise APIError(503, why, "server_error", code="unavailable")
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
            ids = await asyncio.to_thread(_tokenizer(model).encode, body.prompt)
        else:
            ids = list(body.prompt)
        return await _respond(request, body, ids, body.max_tokens, chat=False)

    @app.post("/v1/chat/completions", responses=RESPONSES)
    async def chat(body: ChatRequest, request: Request):
        _check_model(body.model, model_name)
        tok = _tokenizer(model)
        msgs = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:  # user text never becomes control tokens: only the template's markup does
            ids = await asyncio.to_thread(tok.encode_chat, msgs)
        except ValueError as exc:
            raise APIError(400, f"messages: {exc}", param="messages") from None
        limit = body.max_completion_tokens or body.max_tokens
        return await _respond(request, body, ids, limit, chat=True)

    # -- the common path ----------------------------------------------------------------------
    async def _respond(request, body, ids, max_tokens, chat: bool):
        why = unavailable()
        if why is not None:
            raise APIError(503, why, "server_error", code="unavailable")
        eng = engine()
        if not ids:
            raise APIError(400, "the prompt has no tokens", param="prompt")
        if len(ids) >= ctx_len:
            raise APIError(400, f"the prompt has {len(ids)} tokens; the model's context is "
                                f"{ctx_len}", param="prompt", code="context_length_exceeded")
        if max_tokens is not None and len(ids) + max_tokens > ctx_len:
            raise APIError(400, f"the model's context is {ctx_len} tokens; this request asks for "
                                f"{len(ids) + max_tokens} ({len(ids)} in the prompt, {max_tokens} "
                                f"to generate): ask for at most {ctx_len - len(ids)}",
                           param="max_tokens", code="context_length_exceeded")
        max_new = max_tokens or (ctx_len - len(ids))
        try:
            params = GenerationParams(max_new_tokens=max_new, temperature=body.temperature,
                                      top_k=body.top_k, top_p=body.top_p, min_p=body.min_p,
                                      repetition_penalty=body.repetition_penalty,
                                      presence_penalty=body.presence_penalty,
                                      frequency_penalty=body.frequency_penalty,
                                      logit_bias=body.bias(), logprobs=body.logprobs_k(),
                                      seed=body.seed, stop_strings=tuple(body.stop_list()))
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        if eng.stats()["requests_waiting"] >= max_queue:
            raise APIError(429, f"the queue is full ({max_queue} waiting requests); retry later",
                           "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
        if state["in_flight"] >= max_concurrency:
            raise APIError(429, f"{max_concurrency} requests are in flight, the most this server "
                                f"takes; retry later", "rate_limit_error", code="too_many_requests",
                           headers={"Retry-After": "1"})
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        run = Run(eng, ids, params, metrics, rid, request_timeout, model.tokenizer)
        state["in_flight"] += 1
        handed_over = False
        try:
            try:  # waiting in the queue and the prompt's prefill: aborted if the client leaves
                await _unless_disconnected(request, run.start())
            except (ValueError, TypeError) as exc:
                raise APIError(400, str(exc)) from None
            if body.stream:
                usage = bool(body.stream_options and body.stream_options.include_usage)
                handed_over = True
                return StreamingResponse(_counted(sse(run, chat, model_name, usage)),
                                         media_type="text/event-stream",
                                         headers=replica_headers(replica))
            await _unless_disconnected(request, run.finish())
            return JSONResponse(final_body(run, chat, model_name),
                                headers=replica_headers(replica))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it (nginx's "client closed")
        except EngineClosedError as exc:
            raise APIError(503, str(exc), "server_error", code="unavailable") from None
        except TimeoutError as exc:
            raise APIError(408, f"{exc} ({request_timeout:g} s)", "timeout",
                           code="request_timeout") from None
        except RequestFailed as exc:
            raise APIError(500, f"the request failed: {exc}", "server_error") from None
        finally:
            if not handed_over:
                state["in_flight"] -= 1

    async def _counted(events):
        """A stream's events; the request leaves the in-flight count when the stream ends."""
        try:
            async for event in events:
                yield event
        finally:
            state["in_flight"] -= 1

    return app


async def _unless_disconnected(request: Request, coro):
    """Await ``coro``; if the client disconnects first, cancel it (the request it waits on is
    aborted) and raise ClientGone."""
    task = asyncio.ensure_future(coro)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                try:
                    await task
                except BaseException:  # noqa: BLE001 - its cancellation
                    pass
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()


def _check_model(name, served):
    if name is not None and name != served:
        raise APIError(404, f"the model {name!r} does not exist; this server serves {served!r}",
                       param="model", code="model_not_found")


def _tokenizer(model):
    if model.tokenizer is None:
        raise APIError(400, "this model has no tokenizer; send prompt as a list of token ids")
    return model.tokenizer
