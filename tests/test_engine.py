"""The serving engine: the same tokens alone or in a crowd (prefix caching on and off, chunked
prefills, preemption), agreement with Model.generate, aborts, bad requests, failures inside a
step, and a soak that ends with every block back in the pool."""

import os
import sys
import time

import numpy as np
import pytest

import hybrid
from hybrid import Engine, GenerationParams
from hybrid.engine import Sampler
from hybrid.models import load_model

sys.path.insert(0, os.path.dirname(__file__))
from test_models_tiny import VOCAB, _make  # noqa: E402

pytest.importorskip("torch", reason="torch builds the tiny reference models")


@pytest.fixture(scope="module")
def tiny_q8(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("llama"))
    _make("llama", folder, seed=99)
    return load_model(folder, weights="q8_0")


@pytest.fixture(scope="module")
def tiny_qwen3_q4(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("qwen3"))
    _make("qwen3", folder, seed=7)
    return load_model(folder, weights="q4_0")


def _prompts(rng, n, shared=20, vocab=VOCAB):
    """n prompts of random lengths, half of them starting with one shared prefix."""
    head = [int(t) for t in rng.integers(3, vocab, shared)]
    out = []
    for i in range(n):
        tail = [int(t) for t in rng.integers(3, vocab, int(rng.integers(1, 40)))]
        out.append(head + tail if i % 2 else tail)
    return out


@pytest.mark.parametrize("arch", ["llama q8_0", "qwen3 q4_0", "qwen3 q4_0, q8_0 KV"])
@pytest.mark.parametrize("setting", ["prefix cache", "no prefix cache", "preemption"])
def test_same_tokens_alone_and_in_a_crowd(tiny_q8, tiny_qwen3_q4, rng, setting, arch):
    model = tiny_q8 if arch.startswith("llama") else tiny_qwen3_q4
    kv = "q8_0" if arch.endswith("q8_0 KV") else "float16"
    if kv != "float16":  # the KV cache in ggml's 8-bit blocks
        model = hybrid.models.Model(model.weights, model.tokenizer, kv_dtype=kv)
    kw = dict(max_batch=8, max_batched_tokens=int(rng.integers(7, 40)), poison_unused=True)
    if setting == "no prefix cache":
        kw["prefix_cache"] = False
    if setting == "preemption":  # a tiny pool of small blocks: requests are preempted
        kw["num_blocks"] = 24  # (attention sums per block: alone runs with the same block size)
        model = hybrid.models.Model(model.weights, model.tokenizer, block_size=4, kv_dtype=kv)
    else:
        kw["num_blocks"] = 400
    prompts = _prompts(rng, 24)
    alone = [model.generate(p, 10, stop_tokens=[]) for p in prompts]
    engine = Engine(model, **kw)
    got = engine.generate(prompts, 10, stop_tokens=[])
    assert got == alone
    st = engine.stats()
    assert st["kv_blocks_used"] == 0 and st["requests_running"] == st["requests_waiting"] == 0
    if setting == "prefix cache":
        assert st["prefix_cache_hit_tokens"] > 0
        again = engine.generate(prompts, 10, stop_tokens=[])  # now mostly from the cache
        assert again == alone and engine.stats()["prefix_cache_hit_tokens"] > st["prefix_cache_hit_tokens"]
    if setting == "preemption":
        assert st["preemptions"] > 0


def test_engine_on_smollm2_matches_generate(rng):
    try:
        model = load_model()
    except hybrid.models.ModelLoadError as exc:
        pytest.skip(str(exc))
    prompts = _prompts(rng, 20, shared=40, vocab=20000)
    alone = [model.generate(p, 6, stop_tokens=[]) for p in prompts]
    engine = Engine(model, max_batch=6, max_batched_tokens=48, num_blocks=200)
    assert engine.generate(prompts, 6, stop_tokens=[]) == alone
    assert model.generate_batch(prompts[:5], 6, stop_tokens=[]) == alone[:5]


def test_chunked_prefill_equals_one_shot(tmp_path, rng):
    folder = str(tmp_path / "m")
    _make("qwen3", folder, seed=5)
    model = load_model(folder, kv_dtype="float32")
    ids = [int(t) for t in rng.integers(3, VOCAB, 70)]
    one = model.forward(ids, model.new_cache())
    cache = model.new_cache()
    for a, b in ((0, 1), (1, 17), (17, 50), (50, 70)):
        chunked = model.forward(ids[a:b], cache)
    assert np.max(np.abs(chunked - one)) <= 1e-5 * np.max(np.abs(one))


def test_abort_frees_blocks_and_others_continue(tiny_q8, rng):
    prompts = _prompts(rng, 3)
    alone = [tiny_q8.generate(p, 8, stop_tokens=[]) for p in prompts]
    engine = Engine(tiny_q8, num_blocks=100, prefix_cache=False)
    ids = [engine.add_request(p, GenerationParams(max_new_tokens=8, stop_tokens=[]))
           for p in prompts]
    for _ in range(3):
        engine.step()
    used = engine.pool.num_used
    out = engine.abort(ids[1])
    assert out.finished and out.finish_reason == "abort"
    assert engine.pool.num_used < used
    with pytest.raises(KeyError, match="no request"):
        engine.abort(ids[1])
    results = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                results[o.request_id] = o.tokens
    assert results[ids[0]] == alone[0] and results[ids[2]] == alone[2]
    assert engine.pool.num_used == 0


def test_bad_requests_fail_alone(tiny_q8, rng):
    engine = Engine(tiny_q8, num_blocks=5)
    good = engine.add_request([5, 6, 7], GenerationParams(max_new_tokens=5, stop_tokens=[]))
    with pytest.raises(ValueError, match="no tokens"):
        engine.add_request([])
    with pytest.raises(ValueError, match="context holds 256"):
        engine.add_request([4] * 256)
    with pytest.raises(ValueError, match="whole pool has 5"):
        engine.add_request([4] * 200)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 96\)"):
        engine.add_request([4, 500])
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(max_new_tokens=0),
                dict(repetition_penalty=0), dict(temperature=float("nan"))):
        with pytest.raises(ValueError):
            GenerationParams(**bad)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([3], request_id=good)
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [o.tokens for o in outs if o.finished] == [tiny_q8.generate([5, 6, 7], 5,
                                                                       stop_tokens=[])]


def test_a_failure_inside_a_step_fails_only_its_request(tiny_q8, rng, monkeypatch):
    prompts = _prompts(rng, 4)
    alone = [tiny_q8.generate(p, 6, stop_tokens=[]) for p in prompts]
    engine = Engine(tiny_q8, num_blocks=100)
    ids = [engine.add_request(p, GenerationParams(max_new_tokens=6, stop_tokens=[]))
           for p in prompts]
    victim = engine._requests[ids[2]]
    real = type(tiny_q8).forward_step

    def flaky(self, items, role="auto"):
        if any(c is victim.cache for c, _ in items) and len(victim.generated) == 3:
            raise RuntimeError("injected fault")
        return real(self, items, role)
    monkeypatch.setattr(type(tiny_q8), "forward_step", flaky)
    results = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                results[o.request_id] = o
    assert results[ids[2]].finish_reason == "error" and "injected" in results[ids[2]].error
    for i in (0, 1, 3):
        assert results[ids[i]].tokens == alone[i]
    assert engine.pool.num_used == 0


def test_the_scheduler_allocates_every_slot_it_plans(tiny_q8, rng):
    """Blocks belong to the scheduler: once a step is planned, every row it feeds has its slot,
    so the step's description only reads them."""
    engine = Engine(tiny_q8, num_blocks=100, max_batched_tokens=24)
    for p in _prompts(rng, 5):
        engine.add_request(p, GenerationParams(max_new_tokens=4, stop_tokens=[]))
    for _ in range(6):
        plan = engine.scheduler.plan()
        rows = [(r, 1) for r in plan.decodes] + [(r, n) for r, n, _ in plan.prefills]
        assert rows
        for r, n in rows:
            assert r.cache.allocated_tokens() >= r.computed + n
        hybrid.StepBatch.describe([(r.cache, n) for r, n in rows[:1]])  # takes nothing
        for r in list(engine.scheduler.running):  # give everything back for the next round
            engine.abort(r.request_id)
        for p in _prompts(rng, 5):
            engine.add_request(p, GenerationParams(max_new_tokens=4, stop_tokens=[]))


def test_a_request_whose_slots_cannot_be_taken_fails_alone(tiny_q8, rng, monkeypatch):
    prompts = _prompts(rng, 3)
    alone = [tiny_q8.generate(p, 5, stop_tokens=[]) for p in prompts]
    engine = Engine(tiny_q8, num_blocks=100)
    ids = [engine.add_request(p, GenerationParams(max_new_tokens=5, stop_tokens=[]))
           for p in prompts]
    real = engine.kv.allocate_slots

    def refuse_one(req, n):
        if req.request_id == ids[1] and req.generated:
            raise hybrid.PoolExhaustedError("injected: no block")
        return real(req, n)
    monkeypatch.setattr(engine.kv, "allocate_slots", refuse_one)
    results = {}
    for _ in range(100):  # bounded: a request left without its slots must not stall the rest
        for o in engine.step():
            if o.finished:
                results[o.request_id] = o
        if not engine.has_unfinished():
            break
    assert not engine.has_unfinished()
    assert results[ids[1]].finish_reason == "error" and "injected" in results[ids[1]].error
    assert [results[ids[i]].tokens for i in (0, 2)] == [alone[0], alone[2]]
    assert engine.pool.num_used == 0


def test_extreme_sampling_parameters_sample_and_leave_the_others_alone(tiny_q8, rng):
    """A penalty or temperature so small that logits overflow to inf (valid values: > 0) still
    samples a token; a request whose sampler fails anyway finishes alone with an error."""
    prompts = _prompts(rng, 3)
    alone = [tiny_q8.generate(p, 6, stop_tokens=[]) for p in prompts]
    engine = Engine(tiny_q8, num_blocks=100)
    ids = [engine.add_request(p, GenerationParams(max_new_tokens=6, stop_tokens=[]))
           for p in prompts]
    extreme = [engine.add_request(prompts[0], GenerationParams(max_new_tokens=6, stop_tokens=[],
                                                                **kw))
               for kw in (dict(repetition_penalty=5e-324, temperature=1.0),
                          dict(temperature=5e-324), dict(temperature=1e-300, top_p=0.5),
                          dict(repetition_penalty=1e308, temperature=1.0, top_k=3))]
    victim = engine.add_request(prompts[1], GenerationParams(max_new_tokens=6, stop_tokens=[]))

    def broken(logits, history, allowed=None):
        raise FloatingPointError("injected sampler fault")
    engine._requests[victim].sampler = broken
    results = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                results[o.request_id] = o
    assert results[victim].finish_reason == "error" and "injected" in results[victim].error
    for rid in extreme:
        assert results[rid].finish_reason == "length" and len(results[rid].tokens) == 6
        assert all(0 <= t < VOCAB for t in results[rid].tokens)
    for rid, want in zip(ids, alone):
        assert results[rid].tokens == want
    assert engine.pool.num_used == 0


def test_soak_returns_every_block(tiny_q8, rng):
    model = hybrid.models.Model(tiny_q8.weights, tiny_q8.tokenizer, block_size=4)
    engine = Engine(model, max_batch=12, max_batched_tokens=64, num_blocks=30)
    live = []
    for i in range(300):
        if rng.random() < 0.6:
            n = int(rng.integers(1, 60))
            live.append(engine.add_request(
                [int(t) for t in rng.integers(3, VOCAB, n)],
                GenerationParams(max_new_tokens=int(rng.integers(1, 12)),
                                 temperature=float(rng.choice([0.0, 0.8])), seed=i)))
        if live and rng.random() < 0.1:
            rid = live.pop(int(rng.integers(0, len(live))))
            if rid in engine._requests:
                engine.abort(rid)
        for o in engine.step():
            if o.finished and o.request_id in live:
                live.remove(o.request_id)
    while engine.has_unfinished():
        engine.step()
    st = engine.stats()
    assert st["kv_blocks_used"] == 0 and st["preemptions"] > 0
    assert engine.pool.num_allocated <= 30


def test_async_engine_streams_and_cancels(tiny_q8, rng):
    import asyncio

    prompts = _prompts(rng, 6)
    alone = [tiny_q8.generate(p, 8, stop_tokens=[]) for p in prompts]
    params = GenerationParams(max_new_tokens=8, stop_tokens=[])

    async def consume(engine, p):
        toks = []
        async for out in engine.stream(p, params):
            toks += out.new_tokens
        return toks

    async def leave_early(engine, p):
        async for out in engine.stream(p, GenerationParams(max_new_tokens=200, stop_tokens=[])):
            if len(out.tokens) >= 2:
                break  # the request is aborted here

    async def main(engine):
        results = await asyncio.gather(*[consume(engine, p) for p in prompts],
                                       leave_early(engine, prompts[0]))
        with pytest.raises(ValueError, match="no tokens"):
            await consume(engine, [])
        return results[:-1]

    with hybrid.AsyncEngine(tiny_q8, max_batch=4, max_batched_tokens=32, num_blocks=100) as engine:
        assert asyncio.run(main(engine)) == alone
        deadline = time.time() + 2  # an abort takes effect at the engine's next step
        while time.time() < deadline and engine.stats()["kv_blocks_used"]:
            time.sleep(0.01)
        st = engine.stats()
        assert st["kv_blocks_used"] == 0 and st["requests_running"] == 0
        # the request left early was aborted, not run to its 200 tokens
        assert st["generation_tokens"] < sum(map(len, alone)) + 100


def _pool_for(model, blocks=200):
    cfg = model.config
    return hybrid.KVBlockPool(len(model.layers), cfg.num_kv_heads, cfg.head_dim,
                              model.block_size, model.kv_dtype, num_blocks=blocks,
                              poison_unused=True)


def test_ragged_step_equals_each_sequence_alone(tiny_q8, rng):
    """One ragged step (prefill chunks of several sequences, then decode rows and a multi-row
    segment together) gives each sequence the bits it gets alone."""
    model = tiny_q8
    prompts = [[int(t) for t in rng.integers(3, VOCAB, n)] for n in (1, 9, 23, 40)]
    nxt = [[int(t) for t in rng.integers(3, VOCAB, n)] for n in (1, 3, 1, 2)]
    pool = _pool_for(model)
    crowd = [hybrid.PagedKVCache.on(pool) for _ in prompts]
    got1 = model.forward_step(list(zip(crowd, prompts)), role="prompt")
    got2 = model.forward_step(list(zip(crowd, nxt)), role="decode")
    for i, (p, n) in enumerate(zip(prompts, nxt)):
        alone = hybrid.PagedKVCache.on(_pool_for(model))
        assert np.array_equal(model.forward_step([(alone, p)], role="prompt")[0], got1[i])
        assert np.array_equal(model.forward_step([(alone, n)], role="decode")[0], got2[i])
        assert crowd[i].seq_len == alone.seq_len == len(p) + len(n)


def test_hidden_step_gives_the_heads_input(tiny_q8, rng):
    """hidden_step runs a step as forward_step does and returns each sequence's last row as the
    LM head reads it: the model's head on it gives forward_step's logits, bit for bit."""
    model = tiny_q8
    prompts = [[int(t) for t in rng.integers(3, VOCAB, n)] for n in (1, 7, 20)]
    a, b = _pool_for(model), _pool_for(model)
    mine, theirs = ([hybrid.PagedKVCache.on(p) for _ in prompts] for p in (a, b))
    for role, rows in (("prompt", prompts), ("decode", [[5], [6, 7], [8]])):
        h = model.hidden_step(list(zip(mine, rows)), role=role)
        want = model.forward_step(list(zip(theirs, rows)), role=role)
        assert h.shape == (len(rows), model.config.hidden_size) and h.dtype == np.float32
        assert np.array_equal(hybrid.ops.linear(h, model.lm_head, role="decode"), want)
        assert [c.seq_len for c in mine] == [c.seq_len for c in theirs]
    with pytest.raises(ValueError, match="hidden_step needs the caches of one pool"):
        model.hidden_step([(mine[0], [5]), (theirs[0], [5])])
    assert [c.seq_len for c in mine] == [c.seq_len for c in theirs]  # nothing run


def test_a_failed_step_leaves_every_cache_as_it_was(tiny_q8, rng, monkeypatch):
    model = tiny_q8
    pool = _pool_for(model, blocks=12)
    caches = [hybrid.PagedKVCache.on(pool) for _ in range(3)]
    model.forward_step([(c, [5, 6, 7, 8, 9]) for c in caches], role="prompt")
    before = [(c.seq_len, c.block_ids, [c.layer_len(i) for i in range(c.num_layers)])
              for c in caches]
    used = pool.num_used
    real = type(model.layers[2]).forward_step
    calls = []

    def broken(self, h, batch, out=None):
        calls.append(self.index)
        if self.index == 2:
            raise RuntimeError("injected fault")
        return real(self, h, batch, out=out)
    monkeypatch.setattr(type(model.layers[2]), "forward_step", broken)
    with pytest.raises(RuntimeError, match="injected"):
        model.forward_step([(c, [int(t) for t in rng.integers(3, VOCAB, 30)]) for c in caches])
    assert calls == [0, 1, 2]
    after = [(c.seq_len, c.block_ids, [c.layer_len(i) for i in range(c.num_layers)])
             for c in caches]
    assert after == before and pool.num_used == used
    with pytest.raises(hybrid.PoolExhaustedError):  # more than the pool holds: nothing taken
        model.forward_step([(c, [4] * 60) for c in caches])
    assert pool.num_used == used


@pytest.mark.parametrize("arch", ["llama q8_0", "qwen3 q4_0"])
def test_one_call_decode_stack_equals_layer_by_layer(tiny_q8, tiny_qwen3_q4, rng, arch):
    """A generated row runs the whole quantized CPU stack in one native call (Model's
    decode stack); the same step layer by layer (profiling forces it) gives the same bits."""
    model = tiny_q8 if arch.startswith("llama") else tiny_qwen3_q4
    prompt = [int(t) for t in rng.integers(3, VOCAB, 21)]
    fast, slow = model.new_cache(), model.new_cache()
    model.forward(prompt, fast, role="prompt")
    model.forward(prompt, slow, role="prompt")
    for tok in [int(t) for t in rng.integers(3, VOCAB, 5)]:
        a = model.forward([tok], fast, role="decode")
        with hybrid.profiling() as prof:
            b = model.forward([tok], slow, role="decode")
        assert "Block/Attention" in str(prof)  # layer by layer (the remembered stack is not used)
        np.testing.assert_array_equal(a, b)
    assert all(layer.buffers.decode_step() is not None for layer in model.layers)


def _drain(engine, limit):
    """Step until nothing is unfinished; the finished outputs.  Fails if that takes more than
    ``limit`` steps (a scheduler that stops making progress would spin for ever)."""
    done = {}
    for _ in range(limit):
        if not engine.has_unfinished():
            return done
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
    raise AssertionError(f"still unfinished after {limit} steps: {engine.stats()}")


def test_a_request_the_pool_cannot_grow_finishes_with_length(tiny_q8):
    """A 4-block pool (64 tokens) and a 20-token prompt asking for 100: once the pool is full
    the request finishes with "length" (it used to step without progress for ever)."""
    engine = Engine(tiny_q8, num_blocks=4)
    rid = engine.add_request([5] * 20, GenerationParams(max_new_tokens=100, stop_tokens=[]))
    out = _drain(engine, 200)[rid]
    assert out.finish_reason == "length"
    # every slot holds a token, and the last token sampled needs none
    assert len(out.tokens) == 64 - 20 + 1
    assert out.tokens == tiny_q8.generate([5] * 20, 45, stop_tokens=[])
    assert engine.pool.num_used == 0


def test_many_requests_on_a_few_blocks_all_finish(tiny_q8, rng):
    """The scheduler always makes progress: 24 requests on a 6-block pool of 4-token blocks all
    finish within a bounded number of steps, each either with its tokens alone or cut short
    with "length" when even the pool alone could not hold it."""
    model = hybrid.models.Model(tiny_q8.weights, tiny_q8.tokenizer, block_size=4)
    engine = Engine(model, num_blocks=6, max_batch=8, max_batched_tokens=16)
    prompts = [[int(t) for t in rng.integers(3, VOCAB, int(rng.integers(1, 20)))]
               for _ in range(24)]
    wants = [int(rng.integers(1, 12)) for _ in prompts]
    ids = [engine.add_request(p, GenerationParams(max_new_tokens=n, stop_tokens=[]))
           for p, n in zip(prompts, wants)]
    done = _drain(engine, 3000)
    for rid, p, n in zip(ids, prompts, wants):
        out = done[rid]
        alone = model.generate(p, n, stop_tokens=[])
        if len(p) + n - 1 <= 24:  # (the last token sampled takes no slot)
            assert (out.finish_reason, out.tokens) == ("length", alone)
        else:  # the pool holds 24 tokens: cut short, the same tokens as far as they go
            assert out.finish_reason == "length" and out.tokens == alone[:len(out.tokens)]
            assert len(p) + len(out.tokens) - 1 == 24
    assert engine.pool.num_used == 0


def test_a_reader_that_falls_behind_is_cut_off(tiny_q8):
    """A stream whose reader lets max_pending outputs pile up gets SlowConsumerError after
    those, and its request is aborted: memory stays bounded and every block goes back."""
    import asyncio

    from hybrid.engine import SlowConsumerError

    async def main(engine):
        gen = engine.stream([5, 6, 7], GenerationParams(max_new_tokens=200, stop_tokens=[]))
        await gen.__anext__()
        await asyncio.sleep(1.0)  # not reading: the engine runs on
        got = 0
        with pytest.raises(SlowConsumerError):
            async for _ in gen:
                got += 1
        return got

    with hybrid.AsyncEngine(tiny_q8, max_pending=4, num_blocks=50) as engine:
        assert asyncio.run(main(engine)) <= 4
        deadline = time.time() + 5
        while time.time() < deadline and engine.stats()["kv_blocks_used"]:
            time.sleep(0.05)
        assert engine.stats()["kv_blocks_used"] == 0 and engine.stats()["requests_aborted"] == 1


def test_the_engine_loop_survives_a_failing_admit_and_reports_its_own_fault(tiny_q8,
                                                                           monkeypatch):
    import asyncio

    from hybrid.engine import EngineClosedError

    class Boom(BaseException):
        pass

    async def last(engine, ids):
        return await engine.generate(ids, GenerationParams(max_new_tokens=3, stop_tokens=[]))

    with hybrid.AsyncEngine(tiny_q8, num_blocks=50) as engine:
        admit = engine.engine.admit_request

        def failing_admit(req):
            if req.prompt == [9, 9]:
                raise RuntimeError("admit failed")
            return admit(req)
        monkeypatch.setattr(engine.engine, "admit_request", failing_admit)
        with pytest.raises(RuntimeError, match="admit failed"):
            asyncio.run(last(engine, [9, 9]))
        out = asyncio.run(last(engine, [5, 6, 7]))  # the loop carries on
        assert out.finished and len(out.tokens) == 3 and engine.healthy

        def fault():
            raise Boom()
        monkeypatch.setattr(engine.engine, "step", fault)
        with pytest.raises(EngineClosedError, match="Boom"):
            asyncio.run(last(engine, [5, 6, 7]))
        assert not engine.healthy and isinstance(engine.failure, Boom)
        with pytest.raises(EngineClosedError, match="Boom"):  # and every new request too
            asyncio.run(last(engine, [5, 6, 7]))


@pytest.mark.parametrize("presence,frequency", [(2.0, 0.0), (0.0, 2.0), (0.7, -1.3), (0.3, 0.9)])
def test_presence_frequency_penalties_and_logit_bias_against_a_reference(tiny_q8, rng, presence,
                                                                         frequency):
    """Greedy generation with OpenAI's presence and frequency penalties and a logit bias equals
    a loop written here from the definitions over the model's own logits."""
    prompt = [int(t) for t in rng.integers(3, VOCAB, 9)]
    bias = {int(rng.integers(3, VOCAB)): 2.5, int(rng.integers(3, VOCAB)): -100.0}
    kw = dict(presence_penalty=presence, frequency_penalty=frequency, logit_bias=bias,
              stop_tokens=[])
    got = tiny_q8.generate(prompt, 12, **kw)
    want, counts = [], {}
    cache = tiny_q8.new_cache()
    logits = tiny_q8.forward(prompt, cache, role="prompt")
    for _ in range(12):
        x = logits.astype(np.float64)
        for t, b in bias.items():
            x[t] += b
        for t, c in counts.items():
            x[t] -= c * frequency + presence
        tok = int(np.argmax(x))
        want.append(tok)
        counts[tok] = counts.get(tok, 0) + 1
        logits = tiny_q8.forward([tok], cache, role="decode")
    assert got == want
    # (whether the penalties change this random model's choice depends on the draw; here on
    # purpose: after token 0 once, the penalty puts token 1 above it)
    logits = np.array([3.0, 2.0, -1.0], np.float32)
    s = Sampler(GenerationParams(presence_penalty=presence, frequency_penalty=frequency))
    first, second = s(logits, []), s(logits, [])
    assert first == 0 and second == (1 if presence + frequency > 1.0 else 0)
    forced = tiny_q8.generate(prompt, 5, logit_bias={7: 100}, stop_tokens=[])
    assert forced == [7] * 5
    for bad in (dict(presence_penalty=2.5), dict(frequency_penalty=float("inf")),
                dict(logit_bias={3: 101}), dict(logit_bias={-1: 1}),
                dict(repetition_penalty=float("inf"))):
        with pytest.raises(ValueError):
            GenerationParams(**bad)
    with pytest.raises(ValueError, match="logit_bias names token 500"):
        tiny_q8.generate(prompt, 2, logit_bias={500: 1.0})


def test_logprobs_against_the_models_logits(tiny_q8, rng):
    """Each generated token's logprob and its top alternatives are the float64 log-softmax of
    the model's logits at that position (the logits of Model.forward, here the reference)."""
    prompt = [int(t) for t in rng.integers(3, VOCAB, 7)]
    engine = Engine(tiny_q8, num_blocks=50)
    engine.add_request(prompt, GenerationParams(max_new_tokens=6, temperature=0.8, seed=3,
                                                logprobs=4, stop_tokens=[]))
    entries, tokens = [], []
    while engine.has_unfinished():
        for out in engine.step():
            entries += out.logprobs or []
            tokens += out.new_tokens
    assert [e.token for e in entries] == tokens and len(tokens) == 6
    cache = tiny_q8.new_cache()
    logits = tiny_q8.forward(prompt, cache, role="prompt")
    for e, tok in zip(entries, tokens):
        x = logits.astype(np.float64)
        lsm = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
        assert abs(e.logprob - lsm[tok]) < 1e-9
        want = np.argsort(-lsm, kind="stable")[:4]
        assert [t for t, _ in e.top] == want.tolist()
        np.testing.assert_allclose([lp for _, lp in e.top], lsm[want], atol=1e-9)
        logits = tiny_q8.forward([tok], cache, role="decode")
    with pytest.raises(ValueError, match="logprobs must be an integer in"):
        GenerationParams(logprobs=21)
