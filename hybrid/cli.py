"""The ``hybrid`` command.

    hybrid generate PROMPT      stream a model's answer (default: the embedded SmolLM2-135M-Instruct)
    hybrid info [MODEL]         CPU features, threads, BLAS, and every backend's status; with MODEL
                                (a .gguf file or safetensors folder) its tensor formats, bytes and
                                the kernel serving each
    hybrid demo [--layers N]    run a SmolLM2-135M-shaped stack of decoder layers (random weights,
                                nothing downloaded): prefill, decode and batched decode, timed
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from . import (DecoderConfig, DecoderLayer, KVBlockPool, NoBackendError, PagedKVCache, Scratch,
               StepBatch, backend_status)
from . import profiling, set_num_threads, get_num_threads
from .engine.speculative import DRAFT_VOCAB
from .quant import TARGETS
from .testing import PRESETS, random_weights

def cpu_features() -> list:
    """SIMD features of this CPU that matter to the kernels (from /proc/cpuinfo where present)."""
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi",
              "avx512_bitalg", "avx512_bf16", "amx_tile", "asimd", "sve")
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in have]
    except OSError:
        pass
    return []


def _generate(args) -> int:
    from .engine.speculative import parse_speculative
    from .models import ModelLoadError, load_model

    if args.threads:
        set_num_threads(args.threads)
    try:
        model = load_model(args.model, weights=args.weights, gpu_layers=args.gpu_layers,
                           kv_dtype=args.kv_dtype, kv_on_cpu=args.kv_on_cpu,
                           huge_pages=args.huge_pages)
    except ModelLoadError as exc:
        print(f"hybrid: cannot load the model: {exc}", file=sys.stderr)
        return 2
    except NoBackendError as exc:  # --gpu-layers without a usable GPU: say why
        print(f"hybrid: {exc}", file=sys.stderr)
        return 2
    tok = model.tokenizer
    use_chat = args.chat if args.chat is not None else bool(tok.chat_template)
    prompt = args.prompt
    if use_chat:
        if not tok.chat_template:
            print("hybrid: --chat: this model has no chat template", file=sys.stderr)
            return 2
        prompt = tok.apply_chat_template([{"role": "user", "content": prompt}])
    ids = tok.encode(prompt)
    if not ids:
        print("hybrid: the prompt tokenises to nothing", file=sys.stderr)
        return 2
    try:
        method, draft_path = parse_speculative(args.speculative)
        spec = {} if method is None else {"speculative": method}
        if draft_path is not None:
            spec["draft_model"] = load_model(draft_path, kv_dtype=args.kv_dtype,
                                             huge_pages=args.huge_pages)
            spec["draft_vocab"] = args.draft_vocab or None
        for piece in model.stream(ids, max_new_tokens=args.max_tokens, temperature=args.temperature,
                                  top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                  num_speculative_tokens=args.num_speculative_tokens,
                                  adapt_drafts=not args.fixed_drafts, **spec):
            sys.stdout.write(piece)
            sys.stdout.flush()
    except ValueError as exc:
        print(f"\nhybrid: {exc}", file=sys.stderr)
        return 2
    print()
    print(f"[{model.last_stats}, {get_num_threads()} threads]", file=sys.stderr)
    return 0


def _model_info(path) -> None:
    """A model's architecture, tokenizer, weight formats and the kernel serving each (loaded,
    not run), and what in the file hybrid cannot serve."""
    from .models import ModelLoadError, Tokenizer, read_weights, weight_formats
    from .quant import get_format

    print(f"model: {path}")
    t0 = time.perf_counter()
    try:
        mw = read_weights(path)
    except ModelLoadError as exc:
        if str(path).endswith(".gguf") and os.path.isfile(path):
            from .models.gguf_file import read_metadata
            try:
                arch = read_metadata(path).get("general.architecture")
                print(f"  architecture {arch!r}")
            except ModelLoadError:
                pass
        print(f"  cannot serve: {exc}")
        return
    took = time.perf_counter() - t0
    cfg = mw.config
    print(f"  {mw.arch}, {mw.num_layers} layers, hidden {cfg.hidden_size}, heads "
          f"{cfg.num_heads}/{cfg.num_kv_heads}x{cfg.head_dim}, mlp {cfg.intermediate_size}, "
          f"vocab {mw.vocab_size}, tied embeddings {mw.tied_embeddings}, scaled RoPE "
          f"{cfg.rope_inv_freq is not None}; loaded in {took:.2f} s")
    if mw.metadata.get("format") == "gguf":
        md = mw.metadata
        try:
            Tokenizer.from_gguf_metadata(md, path)
            print(f"  tokenizer {md.get('tokenizer_model')!r}, pre-tokenizer "
                  f"{md.get('tokenizer_pre') or 'default'!r}")
        except ModelLoadError as exc:
            print(f"  cannot serve the tokenizer: {exc}")
    print(f"  {'format':10s} {'matrices':>8s} {'MiB':>9s}  cpu kernel (cuda layers)")
    for name, (count, nbytes) in sorted(weight_formats(mw).items(), key=lambda kv: -kv[1][1]):
        if name == "float32":
            kernel = "BLAS sgemm/sgemv"
        else:
            fmt = get_format(name)
            if fmt.integer:
                from ._cpu.backend import INT8_GEMM

                kernel = ("decode: 8-bit activations, integer dot products; prefill: "
                          + ("int8 GEMM on interleaved panels" if INT8_GEMM
                             else "decoded panels + BLAS (HYBRID_INT8_GEMM=0)"))
            else:
                kernel = "decode: widen to float32 + FMA; prefill: decoded panels + BLAS"
        print(f"  {name:10s} {count:8d} {nbytes / 2**20:9.1f}  {kernel} (decoded to float32 on "
              f"upload)")
    for name, src, dst in mw.metadata.get("reencoded", []):
        print(f"  re-encoded at load: {name} {src} -> {dst}")


def _info(args) -> int:
    from threadpoolctl import threadpool_info

    print("hybrid", __import__("hybrid").__version__)
    print(f"CPU features: {' '.join(cpu_features()) or '(unknown)'}")
    try:
        from ._cpu import runtime

        print(f"CPU kernels: simd={runtime.simd_level()} openmp={runtime.have_openmp()} "
              f"(omp max threads {runtime.omp_max_threads()})")
        print("kernel paths:")
        for family, path in runtime.kernel_paths().items():
            print(f"  {family}: {path}")
    except ImportError as exc:
        print(f"CPU kernels: not built ({exc})")
    print(f"threads: {get_num_threads()}")
    for pool in threadpool_info():
        print(f"BLAS/OpenMP pool: {pool.get('internal_api')} {pool.get('version')} "
              f"threads={pool.get('num_threads')} ({pool.get('user_api')})")
    print("backends:")
    for st in backend_status():
        print(f"  {st}")
    try:
        from ._cuda.compiler import nvrtc_version

        major, minor = nvrtc_version()
        print(f"CUDA kernels compile with NVRTC {major}.{minor}")
    except Exception as exc:  # cuda-python or the NVRTC library is missing
        print(f"CUDA kernels cannot compile here: {exc}")
    if getattr(args, "model", None):
        _model_info(args.model)
    return 0


def _demo(args) -> int:
    if args.threads:
        set_num_threads(args.threads)
    cfg = DecoderConfig(**PRESETS[args.preset])
    rng = np.random.default_rng(args.seed)
    scratch = Scratch()
    layers = [DecoderLayer(cfg, random_weights(cfg, rng), index=i, scratch=scratch)
              for i in range(args.layers)]
    cache = PagedKVCache(num_layers=args.layers, num_kv_heads=cfg.num_kv_heads,
                         head_dim=cfg.head_dim, dtype=args.kv_dtype)
    print(f"{args.layers} x {layers[0]!r}, KV {args.kv_dtype}, {get_num_threads()} threads")

    def run(x, positions, c):
        for layer in layers:
            x = layer.forward(x, positions, c)
        c.commit(len(positions))
        return x

    # prefill
    x = rng.standard_normal((args.prompt, cfg.hidden_size), dtype=np.float32)
    t0 = time.perf_counter()
    y = run(x, np.arange(args.prompt), cache)
    t_prefill = time.perf_counter() - t0
    # decode, with the named profiling regions on
    with profiling() as prof:
        t0 = time.perf_counter()
        for step in range(args.decode):
            y = run(y[-1:], [cache.seq_len], cache)
        t_decode = time.perf_counter() - t0
    if not np.all(np.isfinite(y)):
        print("non-finite output", file=sys.stderr)
        return 1
    # batched decode of 4 sequences of different lengths over one pool: one step per token
    pool = KVBlockPool(args.layers, cfg.num_kv_heads, cfg.head_dim, dtype=args.kv_dtype)
    caches = []
    for i, n in enumerate((5, 17, 33, 64)):
        c = PagedKVCache.on(pool)
        run(rng.standard_normal((n, cfg.hidden_size), dtype=np.float32), np.arange(n), c)
        caches.append(c)
    xb = rng.standard_normal((len(caches), cfg.hidden_size), dtype=np.float32)
    t0 = time.perf_counter()
    for step in range(args.decode):
        batch = StepBatch.plan([(c, 1) for c in caches])
        for layer in layers:
            xb = layer.forward_step(xb, batch)
        batch.commit()
    t_batch = time.perf_counter() - t0

    print(f"prefill {args.prompt} tokens: {args.prompt / t_prefill:9.1f} tokens/s")
    print(f"decode  {args.decode} steps:  {args.decode / t_decode:9.1f} steps/s")
    print(f"batched decode x{len(caches)}:   {len(caches) * args.decode / t_batch:9.1f} tokens/s")
    print(prof.table())
    return 0


def _serve(args) -> int:
    try:
        from .serve import serve
        import fastapi, uvicorn  # noqa: F401,E401 - say what is missing before loading
    except ImportError as exc:
        print(f"hybrid serve needs the serve extra (pip install 'hybrid[serve]'): {exc}",
              file=sys.stderr)
        return 2
    from .models import ModelLoadError

    try:
        serve(args.model, host=args.host, port=args.port, threads=args.threads,
              max_batch=args.max_batch, max_batched_tokens=args.max_batched_tokens,
              kv_memory=args.kv_memory, kv_dtype=args.kv_dtype, gpu_layers=args.gpu_layers,
              api_key=args.api_key, api_key_file=args.api_key_file, max_queue=args.max_queue,
              model_name=args.model_name, ray=args.ray, replicas=args.replicas,
              max_model_len=args.max_model_len, max_body_bytes=args.max_body_bytes,
              max_concurrency=args.max_concurrency, request_timeout=args.request_timeout,
              speculative=args.speculative, num_speculative_tokens=args.num_speculative_tokens,
              adapt_drafts=not args.fixed_drafts, draft_vocab=args.draft_vocab or None,
              huge_pages=args.huge_pages)
    except (ModelLoadError, NoBackendError, ValueError, OSError) as exc:
        print(f"hybrid serve: {exc}", file=sys.stderr)
        return 2
    return 0


NO_HUGE_PAGES_HELP = ("map the model file in 4 KiB pages (default: 2 MiB pages where the kernel "
                      "reads it from disk)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hybrid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="stream a model's answer to PROMPT")
    gen.add_argument("prompt")
    gen.add_argument("--model", default=None,
                     help="a .gguf file or a safetensors folder (default: SmolLM2-135M-Instruct)")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--threads", type=int, default=0)
    gen.add_argument("--gpu-layers", type=int, default=0,
                     help="run the last N layers on cuda:0")
    gen.add_argument("--kv-on-cpu", action="store_true",
                     help="keep the KV cache of GPU layers in host memory")
    gen.add_argument("--kv-dtype", choices=["float16", "float32", "q8_0"], default="float16",
                     help="KV cache type (q8_0: 8-bit blocks, half of float16's bytes)")
    gen.add_argument("--speculative", default=None, metavar="ngram|draft:PATH",
                     help="draft tokens by n-gram prompt lookup, or from a draft model sharing "
                          "the tokenizer (the output is the same)")
    gen.add_argument("--num-speculative-tokens", type=int, default=4,
                     help="most draft tokens per step with --speculative")
    gen.add_argument("--fixed-drafts", action="store_true",
                     help="feed every draft found, up to --num-speculative-tokens (default: "
                          "only those worth their measured cost)")
    gen.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB, metavar="N",
                     help="with --speculative draft:PATH: the draft model scores only its N "
                          "lowest token ids (the frequent ones) and the prompt's (default "
                          f"{DRAFT_VOCAB}; 0: every token)")
    gen.add_argument("--weights", default=None, choices=list(TARGETS),
                     help="convert every matrix to this format at load (default: keep the "
                          "file's encodings, memory-mapped)")
    gen.add_argument("--no-huge-pages", dest="huge_pages", action="store_false",
                     help=NO_HUGE_PAGES_HELP)
    chat = gen.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="wrap PROMPT in the model's chat template (the default when it has one)")
    chat.add_argument("--raw", dest="chat", action="store_false",
                      help="send PROMPT as it is, without the chat template")
    gen.set_defaults(fn=_generate)
    info = sub.add_parser("info", help="CPU features, threads, backends; a model's weight formats")
    info.add_argument("model", nargs="?", default=None,
                      help="a .gguf file or a safetensors folder to describe")
    info.set_defaults(fn=_info)
    demo = sub.add_parser("demo", help="run a random-weight decoder stack")
    demo.add_argument("--preset", choices=sorted(PRESETS), default="smollm2-135m")
    demo.add_argument("--layers", type=int, default=30)
    demo.add_argument("--prompt", type=int, default=128)
    demo.add_argument("--decode", type=int, default=32)
    demo.add_argument("--kv-dtype", choices=["float16", "float32", "q8_0"], default="float16",
                     help="KV cache type (q8_0: 8-bit blocks, half of float16's bytes)")
    demo.add_argument("--threads", type=int, default=0)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(fn=_demo)
    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs hybrid[serve])")
    srv.add_argument("--model", default=None,
                     help="a .gguf file or a safetensors folder (default: SmolLM2-135M-Instruct)")
    srv.add_argument("--model-name", default=None, help="the name /v1/models reports")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--threads", type=int, default=0)
    srv.add_argument("--max-batch", type=int, default=16, help="requests running at once")
    srv.add_argument("--max-batched-tokens", type=int, default=512,
                     help="tokens computed per engine step (prompts are prefilled in chunks)")
    srv.add_argument("--kv-memory", default=None,
                     help="KV pool size, e.g. 2GiB (default: half of the available memory)")
    srv.add_argument("--kv-dtype", choices=["float16", "float32", "q8_0"], default="float16",
                     help="KV cache type (q8_0: 8-bit blocks, half of float16's bytes)")
    srv.add_argument("--speculative", default=None, metavar="ngram|draft:PATH",
                     help="draft tokens by n-gram prompt lookup, or from a draft model sharing "
                          "the tokenizer (the output is the same)")
    srv.add_argument("--num-speculative-tokens", type=int, default=4,
                     help="most draft tokens per step with --speculative")
    srv.add_argument("--fixed-drafts", action="store_true",
                     help="feed every draft found, up to --num-speculative-tokens (default: "
                          "only those worth their measured cost)")
    srv.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB, metavar="N",
                     help="with --speculative draft:PATH: the draft model scores only its N "
                          "lowest token ids (the frequent ones) and the prompt's (default "
                          f"{DRAFT_VOCAB}; 0: every token)")
    srv.add_argument("--gpu-layers", type=int, default=0)
    srv.add_argument("--no-huge-pages", dest="huge_pages", action="store_false",
                     help=NO_HUGE_PAGES_HELP)
    srv.add_argument("--api-key", default=None,
                     help="require Authorization: Bearer KEY on every request (visible in ps: "
                          "prefer --api-key-file or the HYBRID_API_KEY variable)")
    srv.add_argument("--api-key-file", default=None,
                     help="read the API key from the first line of this file")
    srv.add_argument("--max-model-len", type=int, default=None,
                     help="tokens a request may hold, prompt and completion together (default: "
                          "the model's context length)")
    srv.add_argument("--max-queue", type=int, default=256,
                     help="waiting requests beyond which new ones get 429")
    srv.add_argument("--max-concurrency", type=int, default=None,
                     help="requests in flight beyond which new ones get 429 (default: "
                          "max-batch + max-queue)")
    srv.add_argument("--max-body-bytes", type=int, default=4 << 20,
                     help="the largest request body accepted, in bytes (default: 4 MiB)")
    srv.add_argument("--request-timeout", type=float, default=None,
                     help="seconds a request may take before it is aborted (default: none)")
    srv.add_argument("--ray", action="store_true",
                     help="serve replicas as a Ray Serve application (needs hybrid[ray]) on the "
                          "cluster RAY_ADDRESS names, else a local one")
    srv.add_argument("--replicas", type=int, default=1, help="with --ray: replicas to run")
    srv.set_defaults(fn=_serve)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
