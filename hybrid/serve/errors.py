"""Every error the server sends, as an OpenAI-style JSON body: ours (APIError), the framework's
own refusals, invalid bodies (400, not FastAPI's 422), a missing or wrong API key (401), a body
not sent as JSON (415) or too large (413), and any other failure (a JSON 500 naming the id it is
logged under).  The OpenAPI schema is patched to say so."""

from __future__ import annotations

import hmac
import logging
import uuid

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .protocol import APIError

log = logging.getLogger("hybrid.serve")


def replica_headers(replica: "str | None"):
    """The header naming the replica that answered (Ray Serve), or None."""
    return {"x-hybrid-replica": replica} if replica is not None else None


def install_error_handlers(app: FastAPI, replica: "str | None") -> None:
    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        headers = {**(exc.headers or {}), **(replica_headers(replica) or {})}
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers or None)

    @app.exception_handler(Exception)
    async def _internal(request, exc: Exception):
        """Our fault: a JSON 500, with the traceback logged under an id the client sees."""
        rid = "err-" + uuid.uuid4().hex[:16]
        log.error("%s %s %s failed", rid, request.method, request.url.path, exc_info=exc)
        err = APIError(500, f"the server failed this request ({type(exc).__name__}); it is "
                            f"logged as {rid}", "server_error", code="internal_error")
        return JSONResponse(err.body(), status_code=500, headers=replica_headers(replica))

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc: HTTPException):
        """The framework's own errors (unknown path, wrong method, a body it cannot decode) in
        the same OpenAI-style body as ours."""
        err = APIError(exc.status_code, str(exc.detail),
                       "invalid_request_error" if exc.status_code < 500 else "server_error")
        headers = {**(exc.headers or {}), **(replica_headers(replica) or {})}
        return JSONResponse(err.body(), status_code=exc.status_code, headers=headers or None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg = f"the body is not valid JSON: {first.get('ctx', {}).get('error', msg)}"
            loc = ""
        elif first.get("type") == "extra_forbidden":
            err = APIError(400, f"{loc}: this server does not implement the field "
                                f"{loc.rsplit('.', 1)[-1]!r}; leave it out", param=loc,
                           code="unsupported_field")
            return JSONResponse(err.body(), status_code=400, headers=replica_headers(replica))
        err = APIError(400, f"{loc}: {msg}" if loc else msg, param=loc or None,
                       code=first.get("type"))
        return JSONResponse(err.body(), status_code=400, headers=replica_headers(replica))


def install_auth(app: FastAPI, api_key: "str | None", replica: "str | None",
                 max_body_bytes: "int | None" = None, json_paths=()) -> None:
    """Every route answers 401 without ``Authorization: Bearer KEY`` (when a key is set; compared
    in constant time), a POST to ``json_paths`` must send its body as application/json (415: a
    web page's form or text/plain post cannot start a generation), a POST body must declare at
    most ``max_body_bytes`` (413; BodyLimit refuses one sent without a length); every answer
    names the replica (when there is one)."""
    if api_key is not None and not api_key:
        raise ValueError("the API key is empty; give a non-empty key or none")
    app.add_middleware(Gate, api_key=api_key, replica=replica, max_body_bytes=max_body_bytes,
                       json_paths=frozenset(json_paths))


class Gate:
    """ASGI middleware: the checks of ``install_auth`` before a request reaches a route (plain
    ASGI, so a route still sees its client disconnect)."""

    def __init__(self, app, api_key, replica, max_body_bytes, json_paths):
        self.app, self.replica, self.max_body_bytes = app, replica, max_body_bytes
        self.json_paths = json_paths
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            return await refusal(scope, receive, send)
        if self.replica is None:
            return await self.app(scope, receive, send)
        tag = (b"x-hybrid-replica", self.replica.encode())

        async def send_tagged(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), tag])
            await send(message)
        await self.app(scope, receive, send_tagged)

    def _refusal(self, scope, headers):
        """The error response for a request refused here, or None."""
        if self.expected is not None and not hmac.compare_digest(
                headers.get("authorization", b""), self.expected):
            return self._error(401, "missing or wrong API key (Authorization: Bearer KEY)",
                               "authentication_error", "invalid_api_key")
        if scope["method"] != "POST":
            return None
        kind = headers.get("content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if scope["path"] in self.json_paths and kind != "application/json":
            return self._error(415, f"the body must be sent as application/json, not "
                                    f"{kind or 'without a content type'}",
                               code="unsupported_media_type")
        length = headers.get("content-length", b"").decode("latin-1")
        if self.max_body_bytes is not None and length.isdigit() \
                and int(length) > self.max_body_bytes:
            return self._error(413, f"the body has {length} bytes; this server takes at most "
                                    f"{self.max_body_bytes}", code="body_too_large")
        return None

    def _error(self, status, message, type_="invalid_request_error", code=None):
        err = APIError(status, message, type_, code=code)
        return JSONResponse(err.body(), status_code=status, headers=replica_headers(self.replica))


def patch_openapi(app: FastAPI) -> None:
    """The schema as the server behaves: invalid bodies answer 400 with an OpenAI-style error,
    not FastAPI's 422."""
    def openapi():
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


class BodyLimit:
    """ASGI middleware: a request body past ``limit`` bytes, also one sent without a
    Content-Length, is refused with 413 as it arrives (nothing more of it is read)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        seen = 0

        async def receive_limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, f"the body has more than {self.limit} bytes; this "
                                             f"server takes at most {self.limit}")
            return message
        await self.app(scope, receive_limited, send)
