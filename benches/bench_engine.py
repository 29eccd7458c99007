"""The serving engine on the embedded SmolLM2, 2 threads.

- Aggregate decode tokens/s with 1, 4, 16 and 64 concurrent requests (16-token prompts, 64 new
  tokens each; only steps where every request decodes are timed; the best of three rounds, so
  that a moment of the machine's noise does not decide a ratio), and the share of a step that
  is not model computation (scheduling, sampling, bookkeeping).  Targets: 16 requests >= 3x the
  single-request tokens/s; engine overhead < 10% of a step at 16 requests.
- Time to first token for a 1000-token prompt, cold and with its first 900 tokens in the prefix
  cache.  Target: the cached prefix cuts it at least 5x.
"""

import time

import numpy as np
import pytest

import hybrid
from conftest import RESULTS, record_ratio

NEW_TOKENS = 64
ROUNDS = 3
_single = {}


@pytest.fixture(scope="module")
def model(default_model):
    return default_model


class _Timed:
    """Wraps the model's forward calls to add up the time spent computing."""

    def __init__(self, model):
        self.model, self.seconds = model, 0.0
        model.forward_step = self._wrap(model.forward_step)

    def _wrap(self, fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
        return run

    def restore(self):
        del self.model.forward_step


def _decode_round(model, concurrent: int) -> tuple:
    """(decode tokens/s, share of the time outside the model's steps) of one engine serving
    `concurrent` requests, timed after every request has its first token."""
    rng = np.random.default_rng(0)
    engine = hybrid.Engine(model, max_batch=concurrent, max_batched_tokens=2048)
    params = hybrid.GenerationParams(max_new_tokens=NEW_TOKENS, stop_tokens=[])
    waiting = {engine.add_request([int(t) for t in rng.integers(100, 20000, 16)], params)
               for _ in range(concurrent)}
    while waiting:  # prefill everyone first: until each request has its first token
        waiting -= {o.request_id for o in engine.step() if o.new_tokens}
    timed = _Timed(model)
    tokens, t0 = 0, time.perf_counter()
    try:
        while engine.has_unfinished():
            tokens += sum(len(o.new_tokens) for o in engine.step())
    finally:
        timed.restore()
    wall = time.perf_counter() - t0
    return tokens / wall, 1 - timed.seconds / wall


@pytest.mark.parametrize("concurrent", [1, 4, 16, 64])
def test_decode_throughput(benchmark, model, concurrent):
    tps, overhead = max(_decode_round(model, concurrent) for _ in range(ROUNDS))
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.extra_info.update(decode_tps=tps, engine_overhead=overhead)
    _single.setdefault(concurrent, tps)
    RESULTS.append(("engine", f"decode {concurrent} concurrent", tps, "tok/s",
                    f"engine overhead {overhead:.1%} of step time"))
    if concurrent > 1 and 1 in _single:
        record_ratio("engine", f"{concurrent} concurrent vs 1", tps, _single[1],
                     "target >= 3 at 16")


def test_time_to_first_token_with_cached_prefix(benchmark, model):
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(100, 20000, 1000)]
    other = prompt[:900] + [int(t) for t in rng.integers(100, 20000, 100)]
    engine = hybrid.Engine(model, max_batched_tokens=1024)
    params = hybrid.GenerationParams(max_new_tokens=1, stop_tokens=[])

    def ttft(ids):
        t0 = time.perf_counter()
        engine.add_request(ids, params)
        while engine.has_unfinished():
            engine.step()
        return time.perf_counter() - t0
    cold = ttft(prompt)
    warm = ttft(other)
    benchmark.pedantic(lambda: None, rounds=1)
    benchmark.extra_info.update(ttft_cold_s=cold, ttft_cached_s=warm)
    RESULTS.append(("engine", "TTFT 1000-token prompt, cold", cold * 1e3, "ms", ""))
    RESULTS.append(("engine", "TTFT, first 900 tokens cached", warm * 1e3, "ms",
                    f"{engine.stats()['prefix_cache_hit_tokens']} tokens from the cache"))
    record_ratio("engine", "TTFT cold / cached 900-token prefix", cold, warm, "target >= 5")
