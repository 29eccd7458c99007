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
import base64
import json
import uuid
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..chat import plan_chat, response_format_constraint
from ..engine import AsyncEngine, EngineClosedError, GenerationParams
from ..structured import Constraint
from .errors import BodyLimit, install_auth, install_error_handlers, patch_openapi, replica_headers
from .metrics import Metrics
from .protocol import (ERROR_ONLY, RESPONSES, UNAUTHORIZED, APIError, ChatRequest, CompletionRequest,
                       DetokenizeRequest, EmbeddingRequest, ErrorResponse, TokenizeRequest)
from .streaming import Answer, RequestFailed, Run, final_body, sse

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
                 json_paths=("/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                             "/tokenize", "/detokenize"))

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
            echo = body.prompt
        else:
            ids = list(body.prompt)
            echo = model.tokenizer.decode(ids) if body.echo and model.tokenizer else ""
        constraint = await _constraint(body)
        return await _respond(request, body, ids, body.max_tokens, False, constraint,
                              echo=echo if body.echo else "")

    @app.post("/v1/chat/completions", responses=RESPONSES)
    async def chat(body: ChatRequest, request: Request):
        _check_model(body.model, model_name)
        tok = _tokenizer(model)
        msgs = [m.as_dict() for m in body.messages]
        rf = body.response_format.as_dict() if body.response_format is not None else None
        try:  # user text never becomes control tokens: only the template's markup does
            plan = await asyncio.to_thread(
                plan_chat, tok, msgs, tools=body.tool_list(), tool_choice=body.tool_choice_value(),
                parallel_tool_calls=body.parallel_tool_calls, response_format=rf)
        except ValueError as exc:
            raise APIError(400, str(exc), param=_param_of(str(exc), "messages")) from None
        constraint = plan.constraint
        if body.structured_outputs is not None:
            if constraint is not None:
                raise APIError(400, "structured_outputs cannot be combined with a required or "
                                    "named tool_choice", param="structured_outputs")
            constraint = await _constraint(body)
        elif constraint is not None:
            await _compiled(constraint, "tool_choice" if plan.tools else "response_format")
        limit = body.max_completion_tokens or body.max_tokens
        return await _respond(request, body, plan.ids, limit, True, constraint, plan=plan)

    @app.post("/tokenize", responses=ERROR_ONLY)
    async def tokenize(body: TokenizeRequest):
        _check_model(body.model, model_name)
        tok = _tokenizer(model)
        try:
            if body.messages is not None:
                ids = await asyncio.to_thread(
                    tok.encode_chat, [m.as_dict() for m in body.messages],
                    body.add_generation_prompt)
            else:
                ids = await asyncio.to_thread(tok.encode, body.prompt, body.add_special_tokens)
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from None
        return {"count": len(ids), "max_model_len": ctx_len, "tokens": ids}

    @app.post("/detokenize", responses=ERROR_ONLY)
    async def detokenize(body: DetokenizeRequest):
        _check_model(body.model, model_name)
        tok = _tokenizer(model)
        if body.tokens and max(body.tokens) >= model.vocab_size:
            raise APIError(400, f"token {max(body.tokens)} is outside the vocabulary of "
                                f"{model.vocab_size}", param="tokens")
        return {"prompt": await asyncio.to_thread(tok.decode, body.tokens)}

    @app.post("/v1/embeddings", responses=ERROR_ONLY)
    async def embeddings(body: EmbeddingRequest):
        _check_model(body.model, model_name)
        why = unavailable()
        if why is not None:
            raise APIError(503, why, "server_error", code="unavailable")
        inputs = body.inputs()
        batches = []
        for x in inputs:
            ids = await asyncio.to_thread(_tokenizer(model).encode, x) if isinstance(x, str) \
                else list(x)
            if not ids:
                raise APIError(400, "an input has no tokens", param="input")
            if len(ids) > ctx_len:
                raise APIError(400, f"an input has {len(ids)} tokens; the model's context is "
                                    f"{ctx_len}", param="input", code="context_length_exceeded")
            if max(ids) >= model.vocab_size:
                raise APIError(400, f"token {max(ids)} is outside the vocabulary of "
                                    f"{model.vocab_size}", param="input")
            batches.append(ids)
        data, used = [], 0
        async with embed_lock:  # the model runs outside the engine: one input at a time
            for i, ids in enumerate(batches):
                vec = await asyncio.to_thread(model.embedding, ids, body.pooling)
                used += len(ids)
                data.append({"object": "embedding", "index": i,
                             "embedding": _encoded(vec, body.encoding_format)})
        return {"object": "list", "data": data, "model": model_name,
                "usage": {"prompt_tokens": used, "total_tokens": used}}

    embed_lock = asyncio.Lock()

    # -- the common path ----------------------------------------------------------------------
    async def _compiled(constraint: Constraint, param: str) -> Constraint:
        """The constraint compiled (off the event loop); 400 naming the problem if it cannot
        be."""
        try:
            await asyncio.to_thread(constraint.check)
        except ValueError as exc:
            raise APIError(400, str(exc), param=param, code="invalid_constraint") from None
        except ImportError as exc:
            raise APIError(400, str(exc), param=param, code="unsupported_field") from None
        return constraint

    async def _constraint(body) -> "Constraint | None":
        """The constraint a request's response_format or structured_outputs asks for."""
        so = body.structured_outputs
        try:
            if so is not None:
                param = "structured_outputs"
                if so.json_ is not None:
                    schema = so.json_
                    if isinstance(schema, str):
                        try:
                            schema = json.loads(schema)
                        except ValueError:
                            raise ValueError("structured_outputs.json is not a JSON schema") \
                                from None
                    c = Constraint("json_schema", schema)
                elif so.regex is not None:
                    c = Constraint("regex", so.regex)
                elif so.choice is not None:
                    c = Constraint("choice", so.choice)
                else:
                    c = Constraint("grammar", so.grammar)
            else:
                param = "response_format"
                rf = body.response_format
                c = response_format_constraint(rf.as_dict() if rf is not None else None)
        except ValueError as exc:
            raise APIError(400, str(exc), param=param, code="invalid_constraint") from None
        return None if c is None else await _compiled(c, param)

    async def _respond(request, body, ids, max_tokens, chat: bool, constraint, plan=None,
                       echo: str = ""):
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
            params = [GenerationParams(
                max_new_tokens=max_new, temperature=body.temperature, top_k=body.top_k,
                top_p=body.top_p, min_p=body.min_p, repetition_penalty=body.repetition_penalty,
                presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                logit_bias=body.bias(), logprobs=body.logprobs_k(),
                seed=None if body.seed is None else body.seed + i,
                stop_strings=tuple(body.stop_list()), constraint=constraint)
                for i in range(body.n)]
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        if eng.stats()["requests_waiting"] + body.n > max_queue:
            raise APIError(429, f"the queue is full ({max_queue} waiting requests); retry later",
                           "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
        if state["in_flight"] >= max_concurrency:
            raise APIError(429, f"{max_concurrency} requests are in flight, the most this server "
                                f"takes; retry later", "rate_limit_error", code="too_many_requests",
                           headers={"Retry-After": "1"})
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        runs = [Run(eng, ids, p, metrics, rid, request_timeout, model.tokenizer) for p in params]
        answers = [Answer(r, i, chat, plan, echo) for i, r in enumerate(runs)]
        state["in_flight"] += 1
        handed_over = False
        try:
            try:  # waiting in the queue and the prompt's prefill: aborted if the client leaves;
                # the first choice's prefill is done before the others start, so that they take
                # the prompt's KV from the prefix cache
                await _unless_disconnected(request, runs[0].start())
                if len(runs) > 1:
                    await _unless_disconnected(request, _together(r.start() for r in runs[1:]))
            except (ValueError, TypeError) as exc:
                raise APIError(400, str(exc)) from None
            if body.stream:
                usage = bool(body.stream_options and body.stream_options.include_usage)
                handed_over = True
                return StreamingResponse(_counted(sse(answers, chat, model_name, usage), runs),
                                         media_type="text/event-stream",
                                         headers=replica_headers(replica))
            await _unless_disconnected(request, _together(r.finish() for r in runs))
            return JSONResponse(final_body(answers, chat, model_name),
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
                for r in runs:
                    await r.close()

    async def _counted(events, runs):
        """A stream's events; the request leaves the in-flight count when the stream ends."""
        try:
            async for event in events:
                yield event
        finally:
            state["in_flight"] -= 1
            for r in runs:
                await r.close()

    return app


async def _together(coros):
    """Await every coroutine; if one fails, the others are cancelled (their requests
    aborted) before the error goes on."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()


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


_PARAMS = ("tool_choice", "tools", "response_format", "messages", "parallel_tool_calls")


def _param_of(message: str, default: str) -> str:
    """The request field an error message starts with (hybrid.chat names them first)."""
    first = message.split(" ", 1)[0].split(".", 1)[0].split("[", 1)[0]
    return first if first in _PARAMS else default


def _encoded(vec, fmt: str):
    if fmt == "base64":
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()
    return [float(v) for v in vec]


def _tokenizer(model):
    if model.tokenizer is None:
        raise APIError(400, "this model has no tokenizer; send prompt as a list of token ids")
    return model.tokenizer
