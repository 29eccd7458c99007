"""More replicas than one process: the same server as a Ray Serve application.

    hybrid serve --ray --replicas 4          # a local Ray cluster, or the one RAY_ADDRESS names

or from Python (any Ray cluster ``ray.init`` finds)::

    from ray import serve
    from hybrid.serve.ray_app import application
    serve.run(application("model.gguf", replicas=4, threads=2), route_prefix="/")

Each replica is a Ray actor that loads its own model, runs its own engine and threads, and
serves the app of hybrid/serve/app.py behind Ray's HTTP proxy (same endpoints).  Responses carry
``x-hybrid-replica`` naming the replica that served them.  Needs the ``ray`` extra.
"""

from __future__ import annotations

import os


def _replica_name() -> str:
    from ray import serve

    ctx = serve.get_replica_context()
    rid = getattr(ctx, "replica_id", None)
    if rid is not None:
        return str(getattr(rid, "unique_id", rid))
    return str(getattr(ctx, "replica_tag", "replica"))


def _build_on_replica(model_path, model_name, api_key, max_queue, threads, load_kw, engine_kw):
    """Runs on each replica when it starts: load the model (load_model's load_kw), build the
    app."""
    from .. import set_num_threads
    from ..models import load_model
    from .app import build_app

    if threads:
        set_num_threads(threads)
    model = load_model(model_path, **load_kw)
    return build_app(model, model_name=model_name, api_key=api_key, max_queue=max_queue,
                     replica=_replica_name(), **engine_kw)


def application(model_path=None, *, replicas: int = 1, threads: int = 1,
                model_name: "str | None" = None, api_key=None, max_queue: int = 256,
                kv_dtype: str = "float16", max_model_len: "int | None" = None,
                huge_pages: bool = True, **engine_kw):
    """A Ray Serve application of ``replicas`` copies of the server (for ``serve.run``)."""
    from ray import serve

    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    name = model_name or _default_name(model_path)
    load_kw = {"kv_dtype": kv_dtype, "max_tokens": max_model_len, "huge_pages": huge_pages}

    def builder():  # a plain function: Ray calls it on each replica to get the ASGI app
        return _build_on_replica(model_path, name, api_key, max_queue, threads, load_kw,
                                 engine_kw)
    deployment = serve.deployment(serve.ingress(builder)(), name="hybrid",
                                  num_replicas=replicas,
                                  ray_actor_options={"num_cpus": max(1, threads)})
    return deployment.bind()


def _default_name(model_path) -> str:
    if not model_path:
        return "smollm2-135m-instruct"
    return os.path.basename(str(model_path).rstrip("/")).rsplit(".gguf", 1)[0]


def serve_on_ray(model_path=None, *, host: str = "127.0.0.1", port: int = 8000,
                 replicas: int = 1, **kw) -> None:
    """Deploy on the Ray cluster ``ray.init`` finds (RAY_ADDRESS, else a new local one) and
    block until interrupted."""
    import ray
    from ray import serve

    import signal

    def interrupt(sig, frame):  # SIGTERM ends the deployment like Ctrl-C
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)
    ray.init(address=os.environ.get("RAY_ADDRESS") or None, ignore_reinit_error=True)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(model_path, replicas=replicas, **kw), name="hybrid",
                  route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
