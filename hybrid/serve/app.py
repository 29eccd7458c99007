"""The OpenAI-compatible HTTP app over an AsyncEngine (FastAPI).

    app = build_app(model, model_name="smollm2", max_batch=16, api_key=None, max_queue=256)
    uvicorn.run(app, host="127.0.0.1", port=8000)       # what ``hybrid serve`` does

The routes live here; errors and the API key in errors.py, one request's answer (JSON or
Server-Sent Events) in streaming.py, the request bodies in protocol.py.

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions
(streaming as Server-Sent Events ending in ``data: [DONE]``), GET /metrics (Prometheus text).
Every request joins the engine's running batch at its next step; a client that disconnects
mid-stream has its request aborted (its blocks go back to the pool).  Errors are OpenAI-style
JSON bodies with a 4xx status, and the server carries on.
"""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..engine import AsyncEngine, EngineClosedError, GenerationParams
from .errors import install_auth, install_error_handlers, patch_openapi, replica_headers
from .metrics import Metrics
from .protocol import RESPONSES, UNAUTHORIZED, APIError, ChatRequest, CompletionRequest
from .streaming import Run, final_body, sse


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

    # every route answers 401 without the key (errors.install_auth)
    app = FastAPI(title="hybrid", lifespan=lifespan,
                  responses=UNAUTHORIZED if api_key is not None else None)

    patch_openapi(app)

    def end_streams():
        """Close the engine now: running streams end with an error event (a server that is
        shutting down calls this before it waits for connections)."""
        if state["engine"] is not None:
            state["engine"].close()
    app.state.end_streams = end_streams

    install_error_handlers(app, replica)
    install_auth(app, api_key, replica)

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
        run = Run(eng, ids, params, metrics, rid)
        try:
            await run.start()
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc)) from None
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(sse(run, chat, model_name, usage),
                                     media_type="text/event-stream", headers=replica_headers(replica))
        try:
            await run.finish()
        except EngineClosedError as exc:
            raise APIError(503, str(exc), "server_error") from None
        return JSONResponse(final_body(run, chat, model_name), headers=replica_headers(replica))

    return app


def _check_model(name, served):
    if name is not None and name != served:
        raise APIError(404, f"the model {name!r} does not exist; this server serves {served!r}",
                       param="model", code="model_not_found")


def _tokenizer(model):
    if model.tokenizer is None:
        raise APIError(400, "this model has no tokenizer; send prompt as a list of token ids")
    return model.tokenizer
