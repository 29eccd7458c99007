"""DecoderLayer against the float64 reference layer (no torch needed), and its calling conventions."""

import numpy as np
import pytest

import hybrid
from hybrid import reference as ref
from hybrid.testing import random_weights
from conftest import rel_err


def _setup(rng, qk_norm=False, heads=6, kv_heads=2, head_dim=64, hidden=256, style="neox"):
    cfg = hybrid.DecoderConfig(hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads,
                               head_dim=head_dim, intermediate_size=320, rope_theta=10000.0,
                               rms_norm_eps=1e-5, rope_style=style)
    w = random_weights(cfg, rng, qk_norm=qk_norm, std=0.08)
    return cfg, w


@pytest.mark.parametrize("qk_norm", [False, True, "whole"])
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("heads,kv_heads", [(5, 5), (6, 2), (8, 1)])
def test_layer_matches_reference(rng, qk_norm, style, heads, kv_heads):
    cfg, w = _setup(rng, qk_norm, heads, kv_heads, style=style)
    layer = hybrid.DecoderLayer(cfg, w, index=1)
    cache = hybrid.PagedKVCache(num_layers=2, num_kv_heads=kv_heads, head_dim=64, block_size=16,
                                dtype="float32", poison_unused=True)
    cache.append(0, np.zeros((21, cache.kv_dim)), np.zeros((21, cache.kv_dim)))  # layer 0 filler
    x = rng.standard_normal((21, cfg.hidden_size), dtype=np.float32)
    got = layer.forward(x[:17], np.arange(17), cache)
    cache.commit(17)
    exp, k_all, v_all = ref.decoder_layer(x[:17], np.arange(17), None, None, w, cfg)
    assert rel_err(got, exp) < 1e-5
    for t in range(17, 21):
        got_t = layer.forward(x[t:t + 1], [t], cache)
        cache.commit(1)
        exp_t, k_all, v_all = ref.decoder_layer(x[t:t + 1], [t], k_all, v_all, w, cfg)
        assert rel_err(got_t, exp_t) < 1e-5
    kd, vd = cache.dense(1)
    assert rel_err(kd, k_all) < 1e-5 and rel_err(vd, v_all) < 1e-5


def test_forward_without_cache_is_causal_attention_over_the_tokens(rng):
    cfg, w = _setup(rng)
    layer = hybrid.DecoderLayer(cfg, w)
    x = rng.standard_normal((9, cfg.hidden_size), dtype=np.float32)
    exp, _, _ = ref.decoder_layer(x, np.arange(9), None, None, w, cfg)
    assert rel_err(layer.forward(x, np.arange(9)), exp) < 1e-5


def test_input_untouched_unless_out(rng):
    cfg, w = _setup(rng)
    layer = hybrid.DecoderLayer(cfg, w)
    x = rng.standard_normal((4, cfg.hidden_size), dtype=np.float32)
    keep = x.copy()
    y = layer.forward(x, np.arange(4))
    np.testing.assert_array_equal(x, keep)
    assert not np.shares_memory(x, y)
    z = layer.forward(x, np.arange(4), out=x)
    assert z is x
    np.testing.assert_allclose(x, y, rtol=0, atol=0)
    # outputs are fresh arrays, not views of scratch that the next call overwrites
    a = layer.forward(keep, np.arange(4))
    b = layer.forward(keep * 2, np.arange(4))
    assert not np.shares_memory(a, b)


def test_other_float_dtypes_and_strided_inputs_are_converted(rng):
    cfg, w = _setup(rng)
    layer = hybrid.DecoderLayer(cfg, w)
    x = rng.standard_normal((3, cfg.hidden_size))
    exp, _, _ = ref.decoder_layer(x.astype(np.float32), np.arange(3), None, None, w, cfg)
    assert rel_err(layer.forward(x, np.arange(3)), exp) < 1e-5
    wide = np.zeros((3, 2 * cfg.hidden_size), np.float32)
    wide[:, ::2] = x
    assert rel_err(layer.forward(wide[:, ::2], np.arange(3)), exp) < 1e-5


def test_config_normalisation_as_in_the_seed():
    cfg = hybrid.DecoderConfig(hidden_size=128, num_heads=4)
    assert (cfg.num_kv_heads, cfg.intermediate_size, cfg.head_dim) == (4, 512, 32)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        hybrid.DecoderConfig(hidden_size=128, num_heads=4, num_kv_heads=3)


def test_weights_validated_at_construction(rng):
    cfg, w = _setup(rng)
    bad = hybrid.LayerWeights(**{**w.__dict__, "wk": w.wk[:-1]})
    with pytest.raises(ValueError, match=r"weight wk has shape \(127, 256\), expected \(128, 256\)"):
        hybrid.DecoderLayer(cfg, bad)
    bad = hybrid.LayerWeights(**{**w.__dict__, "w_up": w.w_up.astype(np.int32)})
    with pytest.raises(TypeError, match="weight w_up must be a floating-point array"):
        hybrid.DecoderLayer(cfg, bad)
    f64 = hybrid.LayerWeights(**{k: (None if v is None else v.astype(np.float64))
                                 for k, v in w.__dict__.items()})
    layer = hybrid.DecoderLayer(cfg, f64)
    assert layer.weights.wq.dtype == np.float32


def test_gpu_placement_explains_itself(rng):
    cfg, w = _setup(rng)
    with pytest.raises(hybrid.NoBackendError, match="cuda: unavailable: "):
        hybrid.DecoderLayer(cfg, w, placement="cuda:0")


def test_profiler_regions(rng):
    cfg, w = _setup(rng, qk_norm=True)
    layer = hybrid.DecoderLayer(cfg, w)
    x = rng.standard_normal((3, cfg.hidden_size), dtype=np.float32)
    layer.forward(x, np.arange(3))  # off: nothing recorded anywhere
    with hybrid.profiling() as prof:
        layer.forward(x, np.arange(3))
        layer.forward(x, np.arange(3))
    names = {"Block/AttnNorm", "Block/QProj", "Block/KProj", "Block/VProj", "Block/QNorm",
             "Block/KNorm", "Block/RoPE_Q", "Block/RoPE_K", "Block/Attention", "Block/OProj",
             "Block/MlpNorm", "Block/GateProj", "Block/UpProj", "Block/SwiGLU", "Block/DownProj"}
    assert set(prof.totals) == names
    assert all(prof.counts[n] == 2 for n in names)
    assert all(prof.totals[n] > 0 for n in names)
    table = prof.table()
    assert "Block/Attention" in table and "calls" in table
    assert not hybrid.profile.enabled()


@pytest.mark.parametrize("rows", [1, 3])
def test_the_step_role_picks_the_kernels(rng, rows):
    """A step's role (StepBatch.role) decides which projection kernels its rows take, with no
    thread-local set by the caller: "prompt" rows give the bits of the GEMM path, "decode" rows
    those of the mat-vec path, each the same as the layer's own forward under that role."""
    cfg, w = _setup(rng)
    for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
        setattr(w, name, hybrid.quantize(getattr(w, name), "q8_0"))
    layer = hybrid.DecoderLayer(cfg, w)
    x = rng.standard_normal((rows, cfg.hidden_size), dtype=np.float32)
    got = {}
    for role in ("prompt", "decode"):
        cache = hybrid.PagedKVCache(1, cfg.num_kv_heads, cfg.head_dim, dtype="float32")
        batch = hybrid.StepBatch.plan([(cache, rows)], role)
        got[role] = layer.forward_step(x, batch)
        batch.commit()
        alone = hybrid.PagedKVCache(1, cfg.num_kv_heads, cfg.head_dim, dtype="float32")
        np.testing.assert_array_equal(got[role], layer.forward(x, np.arange(rows), alone,
                                                              role=role))
    assert not np.array_equal(got["prompt"], got["decode"])  # the two kernels round apart
    with pytest.raises(ValueError, match="row role must be one of"):
        hybrid.StepBatch.plan([(hybrid.PagedKVCache(1, cfg.num_kv_heads, cfg.head_dim), 1)],
                              "prefill")


def test_a_bad_role_takes_no_block():
    cache = hybrid.PagedKVCache(1, 2, 64, dtype="float32")
    with pytest.raises(ValueError, match="row role must be one of"):
        hybrid.StepBatch.plan([(cache, 20)], "prefill")
    assert cache.allocated_tokens() == 0 and cache.pool.num_used == 0
