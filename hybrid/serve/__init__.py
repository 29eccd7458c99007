"""``hybrid serve``: an OpenAI-compatible HTTP server on the serving engine (needs the ``serve``
extra: FastAPI, uvicorn, prometheus-client).  Importing hybrid never imports this package."""

__all__ = ["build_app", "serve"]


def __getattr__(name):
    if name == "build_app":
        from .app import build_app
        return build_app
    if name == "serve":
        from .run import serve
        return serve
    raise AttributeError(name)
