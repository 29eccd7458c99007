"""Constrained decoding on the embedded SmolLM2, 2 threads.

- 8 concurrent requests, the same 8 prompts and sampling parameters, with and without a JSON
  schema constraint: decode tokens/s over the steps where all 8 decode, in alternating rounds.
  Target: constrained >= 0.9x unconstrained.
- Per token: the time llguidance takes to compute a mask (in the mask thread, beside the model's
  step) and the time to apply it in the sampler (on the step's critical path).
"""

import time

import numpy as np
import pytest

import hybrid
from conftest import RESULTS, record_ratio

pytest.importorskip("llguidance", reason="pip install '.[structured]'")
from hybrid.structured import Constraint, TokenMatcher  # noqa: E402

CONCURRENT, NEW_TOKENS, ROUNDS = 8, 48, 3
# long enough that no request completes its JSON inside NEW_TOKENS: every step decodes all 8
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "story": {"type": "string", "minLength": 400},
    "year": {"type": "integer"}}, "required": ["title", "story", "year"],
    "additionalProperties": False}


@pytest.fixture(scope="module")
def model(default_model):
    return default_model


class _MaskClock:
    """Adds up the time TokenMatcher spends computing masks and applying them."""

    def __init__(self):
        self.fill = self.apply = 0.0
        self.fills = self.applies = 0
        self._fill, self._allowed = TokenMatcher.fill_mask, TokenMatcher.allowed
        clock = self

        def fill(m):
            t0 = time.perf_counter()
            fresh = m.fresh
            clock._fill(m)
            if not fresh:
                clock.fill += time.perf_counter() - t0
                clock.fills += 1

        def allowed(m):
            t0 = time.perf_counter()
            out = clock._allowed(m)
            clock.apply += time.perf_counter() - t0
            clock.applies += 1
            return out
        TokenMatcher.fill_mask, TokenMatcher.allowed = fill, allowed

    def restore(self):
        TokenMatcher.fill_mask, TokenMatcher.allowed = self._fill, self._allowed


def _decode_tps(model, prompts, constraint) -> float:
    engine = hybrid.Engine(model, max_batch=CONCURRENT, max_batched_tokens=2048,
                           kv_memory="256MiB")
    ids = [engine.add_request(p, hybrid.GenerationParams(
        NEW_TOKENS, temperature=0.7, seed=i, stop_tokens=[], constraint=constraint,
        detokenize=False)) for i, p in enumerate(prompts)]
    waiting = set(ids)
    while waiting:  # prefill everyone first
        waiting -= {o.request_id for o in engine.step() if o.new_tokens}
    tokens, t0 = 0, time.perf_counter()
    while engine.has_unfinished():
        outs = engine.step()
        if any(o.finished for o in outs):
            break  # from here on fewer than 8 decode
        tokens += sum(len(o.new_tokens) for o in outs)
    return tokens / (time.perf_counter() - t0)


def test_json_schema_vs_unconstrained(benchmark, model):
    tok = model.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": f"Write story {i} as JSON."}])
               for i in range(CONCURRENT)]
    c = Constraint("json_schema", SCHEMA)
    c.check()
    _decode_tps(model, prompts[:2], c)  # warm: llguidance's tokenizer, the kernels
    free, held = [], []
    clock = _MaskClock()
    try:
        for _ in range(ROUNDS):
            free.append(_decode_tps(model, prompts, None))
            held.append(_decode_tps(model, prompts, c))
    finally:
        clock.restore()
    benchmark.pedantic(lambda: None, rounds=1)
    f, h = float(np.median(free)), float(np.median(held))
    fill_us = clock.fill / max(clock.fills, 1) * 1e6
    apply_us = clock.apply / max(clock.applies, 1) * 1e6
    benchmark.extra_info.update(unconstrained_tps=f, constrained_tps=h, mask_us=fill_us,
                                apply_us=apply_us)
    RESULTS.append(("structured", f"decode {CONCURRENT} concurrent, unconstrained", f, "tok/s",
                    f"rounds {', '.join(f'{x:.0f}' for x in free)}"))
    RESULTS.append(("structured", f"decode {CONCURRENT} concurrent, JSON schema", h, "tok/s",
                    f"rounds {', '.join(f'{x:.0f}' for x in held)}"))
    RESULTS.append(("structured", "mask per token (llguidance, beside the step)", fill_us, "us",
                    f"{clock.fills} masks"))
    RESULTS.append(("structured", "mask applied per token (sampler)", apply_us, "us", ""))
    record_ratio("structured", f"JSON schema vs unconstrained, {CONCURRENT} concurrent", h, f,
                 "target >= 0.9")
