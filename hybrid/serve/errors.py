"""Every error the server sends, as an OpenAI-style JSON body: ours (APIError), the framework's
own refusals, invalid bodies (400, not FastAPI's 422), and a missing or wrong API key (401).
The OpenAPI schema is patched to say so."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .protocol import APIError


def replica_headers(replica: "str | None"):
    """The header naming the replica that answered (Ray Serve), or None."""
    return {"x-hybrid-replica": replica} if replica is not None else None


def install_error_handlers(app: FastAPI, replica: "str | None") -> None:
    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=replica_headers(replica))

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
        err = APIError(400, f"{loc}: {msg}" if loc else msg, param=loc or None,
                       code=first.get("type"))
        return JSONResponse(err.body(), status_code=400, headers=replica_headers(replica))


def install_auth(app: FastAPI, api_key: "str | None", replica: "str | None") -> None:
    """Every route answers 401 without ``Authorization: Bearer KEY`` (when a key is set); every
    answer names the replica (when there is one)."""
    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            err = APIError(401, "missing or wrong API key (Authorization: Bearer KEY)",
                           "authentication_error", code="invalid_api_key")
            return JSONResponse(err.body(), status_code=401, headers=replica_headers(replica))
        response = await call_next(request)
        if replica is not None:
            response.headers["x-hybrid-replica"] = replica
        return response


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
