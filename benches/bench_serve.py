"""`hybrid serve` over real HTTP beside the engine called directly, SmolLM2, 2 threads.

Concurrency 1, 4 and 16 streaming clients (plain HTTP/1.1 keep-alive connections reading the SSE
lines, one thread each: the client's own cost stays small on a 2-core machine), 16-token prompts
and 32 new tokens per request: requests/s and aggregate tokens/s through HTTP, the same load on an
AsyncEngine in this process, their ratio (the cost of HTTP; target: under 10% at 16 streams), and
time to first token p50/p99 through HTTP.
"""

import asyncio
import http.client
import json
import os
import sys
import threading
import time

import numpy as np
import pytest

import hybrid
from conftest import RESULTS, THREADS, record_ratio

pytest.importorskip("fastapi", reason="pip install '.[serve]'")
openai = pytest.importorskip("openai", reason="pip install openai")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_serve import NAME, Server  # noqa: E402

NEW, REQUESTS_PER_CLIENT = 32, 3


@pytest.fixture(scope="module")
def model(default_model):
    return default_model


@pytest.fixture(scope="module")
def direct(model):
    """The engine called directly, measured before the server process exists."""
    return {c: _direct_run(model, c)[0] for c in (1, 4, 16)}


@pytest.fixture(scope="module")
def server(direct):
    srv = Server("--max-batch", "16", "--threads", str(THREADS))
    yield srv
    srv.stop()


def _prompts(model, n):
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(100, 20000, 16)] for _ in range(n)]


def _direct_run(model, concurrency):
    prompts = _prompts(model, concurrency * REQUESTS_PER_CLIENT)
    params = hybrid.GenerationParams(max_new_tokens=NEW, stop_tokens=[])

    async def client(engine, mine):
        n = 0
        for p in mine:
            async for out in engine.stream(p, params):
                n += len(out.new_tokens)
        return n

    async def main(engine):
        parts = [prompts[i::concurrency] for i in range(concurrency)]
        return sum(await asyncio.gather(*[client(engine, m) for m in parts]))
    with hybrid.AsyncEngine(model, max_batch=16) as engine:
        asyncio.run(main(engine))  # warm
        t0 = time.perf_counter()
        tokens = asyncio.run(main(engine))
        return tokens / (time.perf_counter() - t0), len(prompts) / (time.perf_counter() - t0)


@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_http_against_engine(benchmark, model, direct, server, concurrency):
    direct_tps = direct[concurrency]
    prompts = _prompts(model, concurrency * REQUESTS_PER_CLIENT)
    ttft, tokens = [], [0] * concurrency

    def run(i):  # a light client (http.client, SSE lines) so the server's cost is what shows
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        for p in prompts[i::concurrency]:
            t0 = time.perf_counter()
            first = None
            conn.request("POST", "/v1/completions", json.dumps(
                {"model": NAME, "prompt": p, "max_tokens": NEW, "temperature": 0,
                 "stream": True, "stream_options": {"include_usage": True}}),
                {"content-type": "application/json"})
            resp = conn.getresponse()
            for line in resp:
                if not line.startswith(b"data: {"):
                    continue
                if first is None:
                    first = time.perf_counter() - t0
                if b'"usage": {' in line:
                    tokens[i] += json.loads(line[6:])["usage"]["completion_tokens"]
            ttft.append(first or 0.0)
        conn.close()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    benchmark.pedantic(lambda: None, rounds=1)
    tps, rps = sum(tokens) / wall, len(prompts) / wall
    p50, p99 = np.percentile(ttft, 50), np.percentile(ttft, 99)
    benchmark.extra_info.update(http_tps=tps, http_rps=rps, direct_tps=direct_tps,
                                ttft_p50_s=p50, ttft_p99_s=p99)
    RESULTS.append(("serve", f"HTTP {concurrency} streams", tps, "tok/s",
                    f"{rps:.2f} req/s, TTFT p50 {p50 * 1e3:.0f} ms p99 {p99 * 1e3:.0f} ms"))
    RESULTS.append(("serve", f"engine direct {concurrency} streams", direct_tps, "tok/s", ""))
    record_ratio("serve", f"HTTP / engine at {concurrency} streams", tps, direct_tps,
                 "target >= 0.9 at 16")
