"""``hybrid serve``: load a model, build the app, run uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import os


def serve(model_path=None, *, host: str = "127.0.0.1", port: int = 8000, threads: int = 0,
          max_batch: int = 16, max_batched_tokens: int = 512, kv_memory=None,
          kv_dtype: str = "float16", gpu_layers: int = 0, api_key=None, max_queue: int = 256,
          model_name=None, log_level: str = "info", ray: bool = False, replicas: int = 1,
          max_model_len: "int | None" = None) -> None:
    if max_model_len is not None and (isinstance(max_model_len, bool)
                                      or not isinstance(max_model_len, int) or max_model_len < 2):
        raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
    if ray:
        from .ray_app import serve_on_ray

        serve_on_ray(model_path, host=host, port=port, replicas=replicas, threads=threads or 1,
                     model_name=model_name, api_key=api_key, max_queue=max_queue,
                     kv_dtype=kv_dtype, max_batch=max_batch,
                     max_batched_tokens=max_batched_tokens, kv_memory=kv_memory,
                     max_model_len=max_model_len)
        return
    import uvicorn

    from .. import set_num_threads
    from ..models import load_model
    from .app import build_app

    if threads:
        set_num_threads(threads)
    model = load_model(model_path, gpu_layers=gpu_layers, kv_dtype=kv_dtype,
                       max_tokens=max_model_len)
    name = model_name or (os.path.basename(str(model_path)).rsplit(".gguf", 1)[0]
                          if model_path else "smollm2-135m-instruct")
    app = build_app(model, model_name=name, api_key=api_key, max_queue=max_queue,
                    max_batch=max_batch, max_batched_tokens=max_batched_tokens,
                    kv_memory=kv_memory)
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(name)s %(message)s")
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
