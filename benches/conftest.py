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
    config.addinivalue_line("markers", "quick: part of the quick regression subset "
                                       "(pytest benches -m quick, under 3 minutes)")


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


def figure(name: str, value: float, kind: str, higher_is_better: bool = True):
    """Record one machine-normalised figure for the regression comparison."""
    if value is not None and value == value:  # skip missing / NaN
        FIGURES[name] = {"value": float(value), "kind": kind,
                         "higher_is_better": bool(higher_is_better)}


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


def paired_share(fn, bytes_moved: int, rounds: int = 8):
    """fn's best bytes/s and the read probe's, measured in alternation round by round, so both
    see the same phases of a shared machine (the session's probe may have caught a faster or
    slower moment).  Returns (fn bytes/s, probe bytes/s)."""
    x = np.ones(128 * 1024 * 1024, dtype=np.float32)  # 512 MiB
    best_fn = best_probe = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best_fn = max(best_fn, bytes_moved / (time.perf_counter() - t0))
        best_probe = max(best_probe, read_probe(x))
    return best_fn, best_probe


@pytest.fixture(scope="session")
def read_bandwidth():
    """Bytes/s this machine streams from memory with THREADS threads (best of several passes over
    512 MiB, the better of hybrid's OpenMP reader and NumPy/BLAS dot)."""
    x = np.ones(128 * 1024 * 1024, dtype=np.float32)  # 512 MiB
    best = read_probe(x, passes_reader=4, passes_dot=3)
    RESULTS.append(("machine", f"read bandwidth, {THREADS} threads", best / 1e9, "GB/s", ""))
    _MACHINE["read_bandwidth_GBps"] = best / 1e9
    return best


def record(benchmark, group, name, *, bytes_moved=None, flops=None, bandwidth=None, note=""):
    """Put throughput in benchmark.extra_info and in the closing table; returns the median time."""
    t = benchmark.stats.stats.median
    best = benchmark.stats.stats.min  # the figures use the best round: least moved by other load
    info = benchmark.extra_info
    info["threads"] = THREADS
    if bytes_moved is not None:
        info["bytes"] = bytes_moved
        info["GB_per_s"] = bytes_moved / t / 1e9
        if bandwidth:
            info["share_of_read_bandwidth"] = bytes_moved / t / bandwidth
            figure(f"{group}: {name} | share of read bandwidth", bytes_moved / best / bandwidth,
                   "bandwidth_share")
        RESULTS.append((group, name, info["GB_per_s"], "GB/s",
                        f"{info.get('share_of_read_bandwidth', 0):.0%} of read bw; {note}"))
    if flops is not None:
        info["GFLOP_per_s"] = flops / t / 1e9
        if bandwidth:
            figure(f"{group}: {name} | GFLOP/s per GB/s of read bandwidth",
                   flops / best / bandwidth, "per_gbps")
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
