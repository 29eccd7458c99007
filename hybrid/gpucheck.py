"""``python -m hybrid.gpucheck``: check every CUDA kernel against the CPU, then time paged decode
attention, printing a short table last.  Without a usable GPU it prints why and exits with 2.

Checks (each against hybrid.reference / the CPU kernels on the same random inputs): RMSNorm, RoPE
(both styles), SwiGLU, add, GEMV and GEMM, KV append (float32 and float16 blocks), paged
attention for a prefill (many rows, one sequence) and a decode batch (sequences of different
lengths), float32 and float16 KV, fused RoPE on and off, one and several key splits.
Timing: decode attention at batch 1 and 64, contexts 4k and 32k, float16 and float32 KV, fused
RoPE on and off, as GB/s of KV read against the device's measured copy bandwidth.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from . import reference as ref
from ._cuda import driver as drv
from ._cuda import variants
from ._cuda.device import Arg, Device

THREADS = 256


def _blocks(n):
    return (max(1, min(4096, (n + THREADS - 1) // THREADS)),)


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


class Checks:
    def __init__(self, dev: Device, rng):
        self.dev, self.rng, self.rows = dev, rng, []

    def record(self, name, err, tol):
        ok = err <= tol
        self.rows.append((name, err, tol, ok))
        print(f"  {'ok  ' if ok else 'FAIL'} {name:<58} rel err {err:.2e} (bound {tol:.0e})",
              flush=True)

    def f32(self, *shape, scale=1.0):
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    # -- row kernels ----------------------------------------------------------------------------
    def elementwise(self):
        dev, k = self.dev, variants.elementwise(True)
        x, w = self.f32(7, 576), self.f32(576)
        out = dev.alloc(x.nbytes)
        dev.launch(dev.kernel(k, "hybrid_rmsnorm_f32"), (7,), (THREADS,),
                   [dev.to_device(x), dev.to_device(w), out, Arg.i32(576), Arg.f32(1e-5)])
        self.record("rmsnorm", rel_err(dev.to_host(out, np.empty_like(x)), ref.rmsnorm(x, w, 1e-5)), 1e-5)
        for neox in (True, False):
            q, pos = self.f32(5, 3 * 64), np.array([0, 1, 17, 300, 4095], np.int64)
            inv = ref.rope_inv_freq(64, 10000.0).astype(np.float32)
            buf = dev.to_device(q)
            dev.launch(dev.kernel(variants.elementwise(neox), "hybrid_rope_f32"), _blocks(5 * 3 * 32),
                       (THREADS,), [buf, dev.to_device(pos), dev.to_device(inv), Arg.i32(5),
                                    Arg.i32(3), Arg.i32(64)])
            want = ref.rope(q, pos, inv, 3, 64, "neox" if neox else "gptj")
            self.record(f"rope {'neox' if neox else 'gptj'}", rel_err(dev.to_host(buf, np.empty_like(q)), want), 1e-4)
        g, u = self.f32(3000, scale=4), self.f32(3000)
        out = dev.alloc(g.nbytes)
        dev.launch(dev.kernel(k, "hybrid_swiglu_f32"), _blocks(3000), (THREADS,),
                   [dev.to_device(g), dev.to_device(u), out, Arg.i64(3000)])
        self.record("swiglu", rel_err(dev.to_host(out, np.empty_like(g)), ref.swiglu(g, u)), 1e-5)
        dev.launch(dev.kernel(k, "hybrid_add_f32"), _blocks(3000), (THREADS,),
                   [dev.to_device(g), dev.to_device(u), out, Arg.i64(3000)])
        self.record("add", rel_err(dev.to_host(out, np.empty_like(g)), g + u), 1e-7)

    def linear(self):
        dev, k = self.dev, variants.linear()
        for rows, fin, fout in ((1, 576, 1536), (3, 4096, 1000), (37, 576, 193)):
            x, w, b = self.f32(rows, fin), self.f32(fout, fin), self.f32(fout)
            out = dev.alloc(rows * fout * 4)
            if rows <= 8:
                dev.launch(dev.kernel(k, "hybrid_gemv_f32"), ((fout + 7) // 8,), (THREADS,),
                           [dev.to_device(x), dev.to_device(w), dev.to_device(b), out,
                            Arg.i32(rows), Arg.i32(fin), Arg.i32(fout)])
                name = "gemv"
            else:
                dev.launch(dev.kernel(k, "hybrid_gemm_f32"), ((fout + 63) // 64, (rows + 63) // 64),
                           (THREADS,), [dev.to_device(x), dev.to_device(w), dev.to_device(b), out,
                                        Arg.i32(rows), Arg.i32(fout), Arg.i32(fin)])
                name = "gemm"
            got = dev.to_host(out, np.empty((rows, fout), np.float32))
            self.record(f"{name} {rows}x{fin} -> {fout}", rel_err(got, ref.linear(x, w, b)), 1e-5)

    # -- paged cache and attention --------------------------------------------------------------
    def cache(self, lengths, kvh, d, bs, f16):
        """Device blocks for sequences of `lengths`, filled through the append kernel."""
        dev, dt = self.dev, np.float16 if f16 else np.float32
        esize = np.dtype(dt).itemsize
        tables, kv = [], []
        for n in lengths:
            nb = -(-n // bs)
            pool = dev.alloc(nb * kvh * 2 * bs * d * esize)
            base = pool.ptr + np.arange(nb, dtype=np.uint64) * (kvh * 2 * bs * d * esize)
            kp, vp = base, base + bs * d * esize
            k, v = self.f32(n, kvh * d), self.f32(n, kvh * d)
            dev.launch(dev.kernel(variants.kv_append(f16), f"hybrid_kv_append_{'f16' if f16 else 'f32'}"),
                       _blocks(n * kvh * d), (THREADS,),
                       [dev.to_device(k), dev.to_device(v), dev.to_device(kp), dev.to_device(vp),
                        Arg.i32(n), Arg.i64(0), Arg.i32(kvh), Arg.i32(d), Arg.i32(bs),
                        Arg.i64(2 * bs * d)])
            tables.append((kp, vp, pool))
            kv.append((k.astype(dt).astype(np.float32), v.astype(dt).astype(np.float32)))
        return tables, kv

    def attention(self, rows_seq, rows_pos, tables, q, kvh, d, bs, group, f16, fused, splits,
                  inv_freq):
        dev = self.dev
        n_rows, heads = q.shape[0], kvh * group
        offsets, kflat, vflat = [], [], []
        for kp, vp, _ in tables:
            offsets.append(len(kflat))
            kflat.extend(kp.tolist())
            vflat.extend(vp.tolist())
        row_table = np.array([offsets[s] for s in rows_seq], np.int32)
        max_keys = int(max(rows_pos)) + 1
        split_len = -(-(-(-max_keys // splits)) // bs) * bs
        splits = -(-max_keys // split_len)
        spec = variants.paged_attention(d, group, f16, fused)
        out = dev.alloc(q.nbytes)
        pm, pl = dev.alloc(n_rows * heads * splits * 4), dev.alloc(n_rows * heads * splits * 4)
        pacc = dev.alloc(n_rows * heads * splits * d * 4)
        dev.launch(dev.kernel(spec, "hybrid_paged_attention"), (n_rows, kvh, splits), (128,),
                   [dev.to_device(q), out, dev.to_device(np.array(kflat, np.uint64)),
                    dev.to_device(np.array(vflat, np.uint64)), dev.to_device(row_table),
                    dev.to_device(np.asarray(rows_pos, np.int32)), dev.to_device(inv_freq),
                    pm, pl, pacc, Arg.i32(heads), Arg.i32(bs), Arg.i64(2 * bs * d),
                    Arg.i32(split_len), Arg.f32(1.0 / math.sqrt(d))])
        if splits > 1:
            dev.launch(dev.kernel(spec, "hybrid_paged_attention_merge"), (n_rows, heads), (128,),
                       [pm, pl, pacc, out, Arg.i32(heads), Arg.i32(splits)])
        return dev.to_host(out, np.empty_like(q))

    def paged(self):
        kvh, bs = 2, 16
        for d, group in ((128, 4), (64, 3), (80, 1)):
            inv = ref.rope_inv_freq(d, 10000.0)
            for f16 in (False, True):
                tol = 2e-3 if f16 else 1e-4
                for fused in (False, True):
                    # prefill: 37 rows after 0 history, one sequence
                    tables, kv = self.cache([37], kvh, d, bs, f16)
                    q = self.f32(37, kvh * group * d)
                    for splits in (1, 3):
                        got = self.attention([0] * 37, list(range(37)), tables, q, kvh, d, bs,
                                             group, f16, fused, splits, inv.astype(np.float32))
                        k, v = kv[0]
                        qq, kk = q, k
                        if fused:
                            qq = ref.rope(q, np.arange(37), inv, kvh * group, d)
                            kk = ref.rope(k, np.arange(37), inv, kvh, d)
                        want = ref.attention(qq, kk, v, np.arange(37), kvh * group, kvh, d)
                        self.record(f"attention prefill d={d} g={group} {'f16' if f16 else 'f32'}"
                                    f"{' rope' if fused else ''} splits={splits}", rel_err(got, want), tol)
                    # decode batch of sequences with different lengths
                    lengths = [1, 16, 17, 300, 1025]
                    tables, kv = self.cache(lengths, kvh, d, bs, f16)
                    q = self.f32(len(lengths), kvh * group * d)
                    got = self.attention(list(range(len(lengths))), [n - 1 for n in lengths], tables,
                                         q, kvh, d, bs, group, f16, fused, 4, inv.astype(np.float32))
                    wants = []
                    for b, (n, (k, v)) in enumerate(zip(lengths, kv)):
                        qq, kk = q[b:b + 1], k
                        if fused:
                            qq = ref.rope(qq, [n - 1], inv, kvh * group, d)
                            kk = ref.rope(k, np.arange(n), inv, kvh, d)
                        wants.append(ref.attention(qq, kk, v, [n - 1], kvh * group, kvh, d))
                    self.record(f"attention decode batch d={d} g={group} {'f16' if f16 else 'f32'}"
                                f"{' rope' if fused else ''}", rel_err(got, np.concatenate(wants)), tol)


def copy_bandwidth(dev: Device, nbytes: int = 1 << 30) -> float:
    d = drv._driver()
    a, b = dev.alloc(nbytes), dev.alloc(nbytes)
    begin, end = dev.event_timer()
    drv.check(d.cuMemcpyDtoDAsync(b.ptr, a.ptr, nbytes, dev.stream))
    best = float("inf")
    for _ in range(5):
        begin()
        drv.check(d.cuMemcpyDtoDAsync(b.ptr, a.ptr, nbytes, dev.stream))
        best = min(best, end())
    a.free()
    b.free()
    return 2 * nbytes / (best / 1e3)  # read + write


def time_decode(dev: Device, batch, ctx, f16, fused, bw, sms):
    """GB/s of KV read by one decode step (head_dim 128, 8 KV heads, 32 query heads)."""
    kvh, d, bs, group = 8, 128, 16, 4
    esize = 2 if f16 else 4
    nb = ctx // bs
    block_bytes = kvh * 2 * bs * d * esize
    pool = dev.alloc(batch * nb * block_bytes)
    drv.check(drv._driver().cuMemsetD8Async(pool.ptr, 0, batch * nb * block_bytes, dev.stream))
    base = pool.ptr + np.arange(batch * nb, dtype=np.uint64) * block_bytes
    kp, vp = base, base + bs * d * esize
    row_table = (np.arange(batch) * nb).astype(np.int32)
    pos = np.full(batch, ctx - 1, np.int32)
    splits = max(1, min(ctx // 512, -(-2 * sms // (batch * kvh))))
    split_len = -(-(-(-ctx // splits)) // bs) * bs
    splits = -(-ctx // split_len)
    heads = kvh * group
    q = dev.alloc(batch * heads * d * 4)
    out = dev.alloc(batch * heads * d * 4)
    pm, pl = dev.alloc(batch * heads * splits * 4), dev.alloc(batch * heads * splits * 4)
    pacc = dev.alloc(batch * heads * splits * d * 4)
    spec = variants.paged_attention(d, group, f16, fused)
    fn, merge = dev.kernel(spec, "hybrid_paged_attention"), dev.kernel(spec, "hybrid_paged_attention_merge")
    inv = dev.to_device(ref.rope_inv_freq(d, 10000.0).astype(np.float32))
    args = [q, out, dev.to_device(kp), dev.to_device(vp), dev.to_device(row_table),
            dev.to_device(pos), inv, pm, pl, pacc, Arg.i32(heads), Arg.i32(bs),
            Arg.i64(2 * bs * d), Arg.i32(split_len), Arg.f32(1.0 / math.sqrt(d))]

    def step():
        dev.launch(fn, (batch, kvh, splits), (128,), args)
        if splits > 1:
            dev.launch(merge, (batch, heads), (128,), [pm, pl, pacc, out, Arg.i32(heads), Arg.i32(splits)])

    step()
    begin, end = dev.event_timer()
    begin()
    reps = 20
    for _ in range(reps):
        step()
    ms = end() / reps
    pool.free()
    kv_bytes = batch * ctx * kvh * d * 2 * esize
    gbs = kv_bytes / (ms / 1e3) / 1e9
    return ms, gbs, gbs * 1e9 / bw


def main(argv=None) -> int:
    ok, reason = drv.availability()
    if not ok:
        print(f"hybrid.gpucheck: CUDA unavailable: {reason}")
        return 2
    t0 = time.time()
    dev = Device(0)
    d = drv._driver()
    sms = drv.check(d.cuDeviceGetAttribute(
        d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev.handle))
    print(f"device cuda:0 {dev.arch}, {sms} SMs")
    checks = Checks(dev, np.random.default_rng(0))
    checks.elementwise()
    checks.linear()
    checks.paged()
    failed = [r for r in checks.rows if not r[3]]
    bw = copy_bandwidth(dev)
    rows = []
    for batch in (1, 64):
        for ctx in (4096, 32768):
            for f16 in (True, False):
                for fused in (False, True):
                    ms, gbs, share = time_decode(dev, batch, ctx, f16, fused, bw, sms)
                    rows.append((batch, ctx, "f16" if f16 else "f32", fused, ms, gbs, share))
    print(f"\nchecks: {len(checks.rows) - len(failed)} ok, {len(failed)} failed; "
          f"copy bandwidth {bw / 1e9:.0f} GB/s; {time.time() - t0:.0f} s")
    print(f"{'batch':>5} {'ctx':>6} {'kv':>4} {'rope':>5} {'ms':>8} {'GB/s':>7} {'of bw':>6}")
    for batch, ctx, kv, fused, ms, gbs, share in rows:
        print(f"{batch:>5} {ctx:>6} {kv:>4} {'fused' if fused else '-':>5} {ms:>8.3f} {gbs:>7.0f} {share:>6.0%}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
