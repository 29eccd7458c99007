"""Shared set-up for the benchmarks: fixed threads, this machine's read bandwidth measured in the
same run, named shape presets, and a closing table of throughput and ratios to the peers.

Run:  pytest benches --benchmark-only            (HYBRID_BENCH_THREADS, default 2)
"""

import os
import time

import numpy as np
import pytest

import hybrid

THREADS = int(os.environ.get("HYBRID_BENCH_THREADS", "2"))
RESULTS: list = []  # (group, name, value, unit, note)


def pytest_configure(config):
    hybrid.set_num_threads(THREADS)


@pytest.fixture(scope="session")
def read_bandwidth():
    """Bytes/s this machine streams from memory with THREADS threads (best of several passes over
    512 MiB, the better of hybrid's OpenMP reader and NumPy/BLAS dot)."""
    from hybrid._cpu import runtime

    x = np.ones(128 * 1024 * 1024, dtype=np.float32)  # 512 MiB
    best = 0.0
    for _ in range(4):
        t0 = time.perf_counter()
        runtime.read_sum(x, THREADS)
        best = max(best, x.nbytes / (time.perf_counter() - t0))
    half = x.size // 2
    a, b = x[:half], x[half:]
    for _ in range(3):
        t0 = time.perf_counter()
        np.dot(a, b)
        best = max(best, x.nbytes / (time.perf_counter() - t0))
    RESULTS.append(("machine", f"read bandwidth, {THREADS} threads", best / 1e9, "GB/s", ""))
    return best


def record(benchmark, group, name, *, bytes_moved=None, flops=None, bandwidth=None, note=""):
    """Put throughput in benchmark.extra_info and in the closing table; returns the median time."""
    t = benchmark.stats.stats.median
    info = benchmark.extra_info
    info["threads"] = THREADS
    if bytes_moved is not None:
        info["bytes"] = bytes_moved
        info["GB_per_s"] = bytes_moved / t / 1e9
        if bandwidth:
            info["share_of_read_bandwidth"] = bytes_moved / t / bandwidth
        RESULTS.append((group, name, info["GB_per_s"], "GB/s",
                        f"{info.get('share_of_read_bandwidth', 0):.0%} of read bw; {note}"))
    if flops is not None:
        info["GFLOP_per_s"] = flops / t / 1e9
        RESULTS.append((group, name, info["GFLOP_per_s"], "GFLOP/s", note))
    info["median_ms"] = t * 1e3
    RESULTS.append((group, name, t * 1e3, "ms", ""))
    return t


def record_ratio(group: str, name: str, numerator, denominator, note: str = "", _seen=set()):
    """Add numerator/denominator to the closing table once both exist (each ratio once)."""
    if numerator and denominator and (group, name) not in _seen:
        _seen.add((group, name))
        RESULTS.append((group, name, numerator / denominator, "x", note))


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
