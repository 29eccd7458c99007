"""Shared set-up for the benchmarks: fixed threads, this machine's read bandwidth measured in the
same run, named shape presets, and a closing table of throughput and ratios to the peers.

Run:  pytest benches --benchmark-only            (HYBRID_BENCH_THREADS, default 2)

Every benchmark also records machine-normalised figures (FIGURES): the share of the read
bandwidth measured in the same run, ratios to a peer measured in the same run, and tokens/s per
GB/s of read bandwidth.  `--hybrid-json=FILE` writes them with the CPU they ran on; that file is
what benches/regress.py saves as a baseline and compares against (`-m quick`: the <3 minute
subset).
"""

import json
import os
import platform
import time

import numpy as np
import pytest

import hybrid

THREADS = int(os.environ.get("HYBRID_BENCH_THREADS", "2"))
RESULTS: list = []  # (group, name, value, unit, note)
# name -> {"value", "kind", "higher_is_better"}; kind: bandwidth_share | peer_ratio | per_gbps
FIGURES: dict = {}
_MACHINE: dict = {}


def pytest_addoption(parser):
    parser.addoption("--hybrid-json", default=None, metavar="FILE",
                     help="write the machine-normalised figures of this run to FILE "
                          "(read by benches/regress.py)")


def pytest_configure(config):
    hybrid.set_num_threads(THREADS)
    _slow_down_attention(int(os.environ.get("HYBRID_TEST_SLOWDOWN", "1") or 1))
    config.addinivalue_line("markers", "quick: part of the quick regression subset "
                                       "(pytest benches -m quick, under 3 minutes)")


def _slow_down_attention(times: int) -> None:
    """HYBRID_TEST_SLOWDOWN=N (N > 1): the single-sequence attention kernel runs N times per
    call, a deliberately slowed kernel with which tests/test_bench_regress.py proves that
    `regress.py compare` catches a slowdown.  Unset in every real run."""
    if times <= 1:
        return
    from hybrid._cpu import attention

    kernel = attention.paged_attention

    def slowed(*args):
        for _ in range(times):
            kernel(*args)
    attention.paged_attention = slowed


# The quick regression subset (pytest benches -m quick): one or two shapes per kernel family
# and the end-to-end decode, with their peers; under 3 minutes on 2 threads.  Shapes whose data
# sit in the last-level cache are left out: their figures swing by half between equal runs.
QUICK = ["bench_attention.py::test_decode_attention_hybrid[1024-*",
         "bench_attention.py::test_decode_attention_hybrid[16384-*",
         "bench_attention.py::test_decode_attention_torch_sdpa[16384-*",
         "bench_attention.py::test_short_context_attention*",
         "bench_quant.py::test_matvec[q8_0-llama3-8b qo]",
         "bench_quant.py::test_matvec[q4_0-llama3-8b qo]",
         "bench_quant.py::test_matvec[q4_k-llama3-8b qo]",
         "bench_layer.py::test_layer_hybrid[decode-llama3-8b]",
         "bench_layer.py::test_layer_transformers[decode-llama3-8b]",
         "bench_generate.py::test_hybrid_prefill",
         "bench_generate.py::test_hybrid_decode"]


def pytest_collection_modifyitems(config, items):
    for item in items:  # QUICK entries: a node id's file::name[params], or a prefix ending in *
        tail = item.nodeid.split("/")[-1]
        if any(tail == p or (p.endswith("*") and tail.startswith(p[:-1])) for p in QUICK):
            item.add_marker(pytest.mark.quick)


_CURRENT: dict = {}  # the running benchmark's file (which file to re-run for a figure)


@pytest.fixture(autouse=True)
def _current_benchmark_file(request):
    _CURRENT["file"] = os.path.basename(str(request.node.path))
    yield


def figure(name: str, value: float, kind: str, higher_is_better: bool = True):
    """Record one machine-normalised figure for the regression comparison."""
    if value is not None and value == value:  # skip missing / NaN
        FIGURES[name] = {"value": float(value), "kind": kind,
                         "higher_is_better": bool(higher_is_better),
                         "file": _CURRENT.get("file")}


def read_probe(x, passes_reader=1, passes_dot=1) -> float:
    """Bytes/s of the best pass over x (far larger than the caches) by hybrid's OpenMP reader and
    by NumPy/BLAS dot on its two halves, THREADS threads."""
    from hybrid._cpu import runtime

    best = 0.0
    for _ in range(passes_reader):
        t0 = time.perf_counter()
        runtime.read_sum(x, THREADS)
        best = max(best, x.nbytes / (time.perf_counter() - t0))
    half = x.size // 2
    a, b = x[:half], x[half:]
    for _ in range(passes_dot):
        t0 = time.perf_counter()
        np.dot(a, b)
        best = max(best, x.nbytes / (time.perf_counter() - t0))
    return best


_PROBE_DATA: list = []  # the probe's 512 MiB, allocated once


def _probe_data():
    if not _PROBE_DATA:
        _PROBE_DATA.append(np.ones(128 * 1024 * 1024, dtype=np.float32))
    return _PROBE_DATA[0]


def rate(fn, amount: float, min_time: float = 0.01) -> float:
    """amount per second of fn: fn called back to back until min_time has passed (at least once)."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            return amount * n / elapsed


# Rounds of a paired measurement.  Why pairs and medians: on a shared machine the read probe
# bursts (32 -> 50+ GB/s for a few seconds) and other load comes and goes, so a share against the
# session's probe, or the best round of each side, moved by 20-60% between equal runs.  The
# median of per-round ratios, each round measuring both sides back to back, moved by about 3%
# over three runs a minute apart (Zen 4, 2 threads: a Q4_K / Q8_0 4096x4096 mat-vec's share,
# 0.80 0.84 0.83 / 0.83 0.84 0.86, where the best of each side gave 0.86 0.90 0.88 / 0.60 0.85
# 0.73).  Load on the cores that a read probe cannot see still moves figures by up to about 20%
# over minutes (README, "Catching slowdowns").
PAIRED_ROUNDS = 9


def paired(measure_a, measure_b, rounds: int = PAIRED_ROUNDS):
    """measure_a() / measure_b() (each returns a rate) in alternation, round by round: returns
    (median of the per-round ratios, median of a, median of b)."""
    a, b = np.empty(rounds), np.empty(rounds)
    for r in range(rounds):
        a[r] = measure_a()
        b[r] = measure_b()
    return float(np.median(a / b)), float(np.median(a)), float(np.median(b))


def paired_with_probe(measure, rounds: int = PAIRED_ROUNDS):
    """measure() (a rate) against the read probe's bytes/s, in alternation: (median of per-round
    rate / probe, median rate, median probe)."""
    x = _probe_data()
    return paired(measure, lambda: read_probe(x), rounds)


def paired_share(fn, bytes_moved: int, rounds: int = PAIRED_ROUNDS):
    """fn's share of the read bandwidth: fn's bytes/s over the read probe's, measured back to back
    in each round (both see the same phase of a shared machine); the median over the rounds.
    Returns (share, fn bytes/s, probe bytes/s), the last two medians."""
    return paired_with_probe(lambda: rate(fn, bytes_moved), rounds)


def paired_time_ratio(fn_a, fn_b, rounds: int = PAIRED_ROUNDS) -> float:
    """time(fn_a) / time(fn_b), the two timed back to back in each round; the median."""
    return paired(lambda: rate(fn_b, 1.0), lambda: rate(fn_a, 1.0), rounds)[0]


@pytest.fixture(scope="session")
def read_bandwidth():
    """Bytes/s this machine streams from memory with THREADS threads (best of several passes over
    512 MiB, the better of hybrid's OpenMP reader and NumPy/BLAS dot)."""
    best = read_probe(_probe_data(), passes_reader=4, passes_dot=3)
    RESULTS.append(("machine", f"read bandwidth, {THREADS} threads", best / 1e9, "GB/s", ""))
    _MACHINE["read_bandwidth_GBps"] = best / 1e9
    return best


def record(benchmark, group, name, *, bytes_moved=None, flops=None, bandwidth=None, note="",
           fn=None):
    """Put throughput in benchmark.extra_info and in the closing table; returns the median time.
    With fn (what the benchmark timed) the regression figures are measured again beside the read
    probe (paired_with_probe); without it they use the best round against the session's probe."""
    t = benchmark.stats.stats.median
    best = benchmark.stats.stats.min  # the figures use the best round: least moved by other load
    info = benchmark.extra_info
    info["threads"] = THREADS
    per_probe = None  # calls per second of fn over the probe's bytes per second, paired
    if fn is not None and bandwidth and (bytes_moved is not None or flops is not None):
        per_probe, calls, probe = paired_with_probe(lambda: rate(fn, 1.0))
        info["probe_GB_per_s_paired"] = probe / 1e9  # (medians of the rounds)
        if bytes_moved is not None:
            info["GB_per_s_paired"] = bytes_moved * calls / 1e9
            info["share_paired"] = bytes_moved * per_probe
    if bytes_moved is not None:
        info["bytes"] = bytes_moved
        info["GB_per_s"] = bytes_moved / t / 1e9
        if bandwidth:
            info["share_of_read_bandwidth"] = bytes_moved / t / bandwidth
            share = bytes_moved * per_probe if per_probe else bytes_moved / best / bandwidth
            figure(f"{group}: {name} | share of read bandwidth", share, "bandwidth_share")
        paired_note = f" ({bytes_moved * per_probe:.0%} beside the probe)" if per_probe else ""
        RESULTS.append((group, name, info["GB_per_s"], "GB/s",
                        f"{info.get('share_of_read_bandwidth', 0):.0%} of read bw{paired_note}; "
                        f"{note}"))
    if flops is not None:
        info["GFLOP_per_s"] = flops / t / 1e9
        if bandwidth:
            per_gbps = flops * per_probe if per_probe else flops / best / bandwidth
            figure(f"{group}: {name} | GFLOP/s per GB/s of read bandwidth", per_gbps, "per_gbps")
        RESULTS.append((group, name, info["GFLOP_per_s"], "GFLOP/s", note))
    info["median_ms"] = t * 1e3
    RESULTS.append((group, name, t * 1e3, "ms", ""))
    return t


def record_ratio(group: str, name: str, numerator, denominator, note: str = "", _seen=set(),
                 higher_is_better: bool = True):
    """Add numerator/denominator to the closing table once both exist (each ratio once); it is
    also a peer-ratio figure for the regression comparison."""
    if numerator and denominator and (group, name) not in _seen:
        _seen.add((group, name))
        RESULTS.append((group, name, numerator / denominator, "x", note))
        figure(f"{group}: {name}", numerator / denominator, "peer_ratio", higher_is_better)


def record_rate(group: str, name: str, tokens_per_s: float, bandwidth: float, note: str = ""):
    """Tokens/s into the closing table, and tokens/s per GB/s of read bandwidth as a figure."""
    RESULTS.append((group, name, tokens_per_s, "tok/s", note))
    if bandwidth:
        figure(f"{group}: {name} | tok/s per GB/s of read bandwidth",
               tokens_per_s / (bandwidth / 1e9), "per_gbps")


def cpu_identity() -> dict:
    """What a baseline is keyed on: CPU vendor/family/model/name and the kernels' code paths."""
    from hybrid._cpu import runtime

    info = {"machine": platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, val = line.partition(":")
                key = key.strip().replace(" ", "_")
                if key in ("vendor_id", "cpu_family", "model", "model_name"):
                    info[key] = val.strip()
    except OSError:
        pass
    info.setdefault("model_name", platform.processor() or "unknown")
    info["simd"] = runtime.simd_level()
    info["kernel_paths"] = runtime.kernel_paths()
    return info


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--hybrid-json")
    if not path:
        return
    doc = {"cpu": cpu_identity(), "threads": THREADS, **_MACHINE,
           "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "figures": FIGURES}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)


def pytest_terminal_summary(terminalreporter):
    if not RESULTS:
        return
    tr = terminalreporter
    tr.section("hybrid throughput (ratios are what to quote; absolute times are noisy)")
    width = max(len(r[1]) for r in RESULTS)
    for group, name, value, unit, note in RESULTS:
        tr.write_line(f"{group:<10} {name:<{width}}  {value:>10.3f} {unit:<8} {note}")


@pytest.fixture(scope="session")
def default_model():
    """The embedded SmolLM2 (skips with the reason where it is not installed)."""
    from hybrid.models import ModelLoadError

    try:
        return hybrid.load_model()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
