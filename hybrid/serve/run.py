"""``hybrid serve``: load a model, build the app, run uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import ipaddress
import logging
import os

from ..engine.speculative import DRAFT_VOCAB, check_draft_vocab
from .app import MAX_BODY_BYTES

log = logging.getLogger("hybrid.serve")


def resolve_api_key(api_key=None, api_key_file=None) -> "str | None":
    """The API key: ``api_key``, else the first line of ``api_key_file``, else HYBRID_API_KEY
    (a key on the command line is visible to every user's ``ps``).  An empty key is refused."""
    if api_key is None and api_key_file is not None:
        with open(api_key_file, encoding="utf-8") as f:
            api_key = f.readline().strip()
    if api_key is None:
        api_key = os.environ.get("HYBRID_API_KEY")
    if api_key is not None and not api_key.strip():
        raise ValueError("the API key is empty; give a non-empty key, or none to serve without")
    return api_key


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(model_path=None, *, host: str = "127.0.0.1", port: int = 8000, threads: int = 0,
          max_batch: int = 16, max_batched_tokens: int = 512, kv_memory=None,
          kv_dtype: str = "float16", gpu_layers: int = 0, api_key=None, api_key_file=None,
          max_queue: int = 256, model_name=None, log_level: str = "info", ray: bool = False,
          replicas: int = 1, max_model_len: "int | None" = None,
          max_body_bytes: int = MAX_BODY_BYTES, max_concurrency: "int | None" = None,
          request_timeout: "float | None" = None, speculative: "str | None" = None,
          num_speculative_tokens: int = 4, adapt_drafts: bool = True,
          draft_vocab: "int | None" = DRAFT_VOCAB, huge_pages: bool = True) -> None:
    if max_model_len is not None and (isinstance(max_model_len, bool)
                                      or not isinstance(max_model_len, int) or max_model_len < 2):
        raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
    for name, v in (("max_body_bytes", max_body_bytes), ("max_concurrency", max_concurrency)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if request_timeout is not None and not request_timeout > 0:
        raise ValueError(f"request_timeout must be > 0 seconds, got {request_timeout!r}")
    check_draft_vocab(draft_vocab)
    api_key = resolve_api_key(api_key, api_key_file)
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(name)s %(message)s")
    if api_key is None and not _is_loopback(host):
        log.warning("serving on %s without an API key: anyone who can reach this address can "
                    "use the model (set --api-key-file or HYBRID_API_KEY)", host)
    if ray and speculative is not None:
        raise ValueError("--speculative is not supported with --ray (each replica's engine "
                         "decodes one token per step)")
    if ray:
        from .ray_app import serve_on_ray

        serve_on_ray(model_path, host=host, port=port, replicas=replicas, threads=threads or 1,
                     model_name=model_name, api_key=api_key, max_queue=max_queue,
                     kv_dtype=kv_dtype, max_batch=max_batch,
                     max_batched_tokens=max_batched_tokens, kv_memory=kv_memory,
                     max_model_len=max_model_len, huge_pages=huge_pages)
        return
    import uvicorn

    from .. import set_num_threads
    from ..engine.speculative import parse_speculative
    from ..models import load_model
    from .app import build_app

    if threads:
        set_num_threads(threads)
    method, draft_path = parse_speculative(speculative)
    model = load_model(model_path, gpu_layers=gpu_layers, kv_dtype=kv_dtype,
                       max_tokens=max_model_len, huge_pages=huge_pages)
    draft = {} if draft_path is None else \
        {"draft_model": load_model(draft_path, kv_dtype=kv_dtype, max_tokens=max_model_len,
                                   huge_pages=huge_pages), "draft_vocab": draft_vocab}
    name = model_name or (os.path.basename(str(model_path)).rsplit(".gguf", 1)[0]
                          if model_path else "smollm2-135m-instruct")
    app = build_app(model, model_name=name, api_key=api_key, max_queue=max_queue,
                    max_batch=max_batch, max_batched_tokens=max_batched_tokens,
                    kv_memory=kv_memory, max_body_bytes=max_body_bytes,
                    max_concurrency=max_concurrency, request_timeout=request_timeout,
                    speculative=method, num_speculative_tokens=num_speculative_tokens,
                    adapt_drafts=adapt_drafts, **draft)
    # On SIGINT/SIGTERM: close the engine first (running streams end with an error event and
    # [DONE]), then uvicorn stops accepting and gives open connections 5 s before dropping them.
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=5))
    stop = server.handle_exit

    def handle_exit(sig, frame):
        app.state.end_streams()
        stop(sig, frame)
    server.handle_exit = handle_exit
    server.run()
