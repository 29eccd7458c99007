"""hybrid's CUDA backend end to end on an emulated GPU (tests/host_cuda.py): the shipped kernel
sources, launch layer, device arrays, arena and GPU KV cache, checked by the same checks that
``python -m hybrid.tools.gpucheck`` runs on a real GPU, on fewer shapes (each kernel variant is built
with g++ and runs on CPU threads)."""

import numpy as np
import pytest

import host_cuda
from conftest import cuda_kind_served_by, rel_err
from hybrid.tools import gpucheck
from hybrid._cuda import arena as arena_mod
from hybrid._cuda import arrays, kv_blocks, launch

if host_cuda.compiler_missing():
    pytest.skip(host_cuda.compiler_missing(), allow_module_level=True)


@pytest.fixture
def emulated_gpu(monkeypatch):
    devices = {}

    def device(index):
        return devices.setdefault(index, host_cuda.EmuDevice(index))

    monkeypatch.setattr("hybrid._cuda.backend.availability", lambda: (True, "host emulation"))
    monkeypatch.setattr(arrays, "device", device)
    monkeypatch.setattr(kv_blocks, "device", device)
    monkeypatch.setattr(arena_mod, "_arenas", {})
    monkeypatch.setattr(launch, "_inv_freq_cache", {})
    with cuda_kind_served_by(monkeypatch):
        yield device


def _passed(checks):
    failed = [r for r in checks.rows if not r[3]]
    assert checks.rows and not failed, "\n".join(f"{n}: {e:.2e} > {t:.0e}" for n, e, t, _ in failed)


def test_row_ops_and_linear(emulated_gpu):
    checks = gpucheck.Checks(np.random.default_rng(1))
    checks.row_ops()
    _passed(checks)


def test_kv_cache_on_the_device_equals_the_cpu_cache(emulated_gpu):
    checks = gpucheck.Checks(np.random.default_rng(2))
    checks.kv_cache()
    _passed(checks)


# (head_dim, GQA group, KV heads): rows read by 8/16/32 lanes, partly idle lanes (80), two
# 16-byte vectors per lane (256 float32)
@pytest.mark.parametrize("case", [(64, 3, 1), (128, 2, 2), (80, 1, 2), (256, 2, 1)])
def test_paged_attention(emulated_gpu, case):
    checks = gpucheck.Checks(np.random.default_rng(3))
    checks.attention(cases=[case], starts=((0, 20), (600, 2), (512, 1)), lengths=(1, 16, 17, 530))
    if case[0] in (80, 256):
        checks.attention(cases=[case], combos=(("float32", True), ("float16", True)), neox=False,
                         starts=((0, 9), (40, 2)), lengths=(1, 17, 40))
    _passed(checks)
    splits = [g[2] for name, g, _ in emulated_gpu(0).launches if name.startswith("hybrid_paged_attention_f")]
    assert max(splits) > 1 and min(splits) == 1  # split-K and the merge ran, and a single split
    splits = [g[2] for name, g, _ in emulated_gpu(0).launches if name.startswith("hybrid_paged_attention_f")]
    assert max(splits) > 1 and min(splits) == 1  # split-K and the merge ran, and a single split


def test_decoder_layer_in_every_placement(emulated_gpu):
    checks = gpucheck.Checks(np.random.default_rng(4))
    checks.layers(shapes=("llama",), dtypes=("float16",))
    checks.layers(shapes=("qwen2",), dtypes=("float32",))  # q/k/v biases through the fused QKV
    _passed(checks)
    names = {name for name, *_ in emulated_gpu(0).launches}
    assert {"hybrid_gemv_split3_f32", "hybrid_gemv_swiglu_f32", "hybrid_gemm_f32"} <= names


def test_steady_decode_allocates_and_uploads_nothing(emulated_gpu, monkeypatch, rng):
    from hybrid.testing import random_weights
    from hybrid.config import DecoderConfig
    from hybrid.kvcache import PagedKVCache
    from hybrid.layer import DecoderLayer
    from hybrid.scratch import Scratch

    cfg = DecoderConfig(hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=64,
                        intermediate_size=192)
    scratch = Scratch()
    # layer 2 rotates q and k with the RoPE kernel: its positions go through the device arena
    layers = [DecoderLayer(cfg, random_weights(cfg, rng), index=i, placement="cuda:0",
                           scratch=scratch, fused_rope=i < 2) for i in range(3)]
    cache = PagedKVCache(3, 2, 64, block_size=16, placement="cuda:0")
    h = arrays.from_host(0, rng.standard_normal((1, 128)).astype(np.float32))
    dev = emulated_gpu(0)
    allocs = []
    real_alloc = dev.alloc
    monkeypatch.setattr(dev, "alloc", lambda n: allocs.append(n) or real_alloc(n))

    def step():
        for layer in layers:
            layer.forward(h, [cache.seq_len], cache, out=h)
        cache.commit(1)

    uploads = []
    real_h2d = dev.copy_h2d
    monkeypatch.setattr(dev, "copy_h2d", lambda ptr, host: uploads.append(host.nbytes)
                        or real_h2d(ptr, host))
    for _ in range(3):  # warm-up: buffers and the first block
        step()
    allocs.clear()
    uploads.clear()
    dev.launches.clear()
    for _ in range(10):  # positions 3..12 stay inside the first 16-token block
        step()
    assert allocs == [] and np.all(np.isfinite(h.to_host()))
    # single-sequence decode reads the persistent block tables: nothing is uploaded per step
    # but the unfused layer's positions (8 bytes, once for q and once for k), into the arena
    assert uploads == [8, 8] * 10
    # per layer: norm, fused QKV, KV append, attention, O (+residual), norm, gate/up/SwiGLU,
    # down (+residual); RoPE is fused into attention (the third layer: two RoPE launches more)
    names = [name for name, *_ in dev.launches]
    assert len(names) == 10 * (2 * 8 + 10), names[:8]
    assert names[:8] == ["hybrid_rmsnorm_f32", "hybrid_gemv_split3_f32", "hybrid_kv_append_f16",
                         "hybrid_paged_attention_f16", "hybrid_gemv_f32", "hybrid_rmsnorm_f32",
                         "hybrid_gemv_swiglu_f32", "hybrid_gemv_f32"]
    assert names[16:26].count("hybrid_rope_f32") == 2


@pytest.mark.parametrize("kw", [dict(gpu_layers=2), dict(gpu_layers=1, kv_on_cpu=True)])
def test_model_on_the_emulated_gpu_matches_the_cpu(emulated_gpu, rng, kw):
    from hybrid.testing import random_weights
    from hybrid.config import DecoderConfig
    from hybrid.models import Model, ModelWeights

    cfg = DecoderConfig(hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=64,
                        intermediate_size=160)
    vocab = 64
    weights = ModelWeights(arch="llama", config=cfg,
                           embed=rng.standard_normal((vocab, 128)).astype(np.float32),
                           final_norm=np.ones(128, np.float32),
                           lm_head=(rng.standard_normal((vocab, 128)) * 0.2).astype(np.float32),
                           layers=[random_weights(cfg, rng, std=0.05) for _ in range(2)],
                           max_position=256)
    cpu, gpu = Model(weights, kv_dtype="float32"), Model(weights, kv_dtype="float32", **kw)
    prompt = list(rng.integers(0, vocab, 5))
    assert rel_err(gpu.logits(prompt), cpu.logits(prompt)) < 1e-4
    assert gpu.generate(prompt, 4) == cpu.generate(prompt, 4)
    if "kv_on_cpu" not in kw:  # the LM head ran on the device
        assert any(g[0] == -(-vocab // 8) for name, g, _ in emulated_gpu(0).launches
                   if name == "hybrid_gemv_f32")


def test_batched_append_is_one_launch_and_all_or_nothing(emulated_gpu, rng):
    from hybrid.kvcache import CacheCapacityError, PagedKVCache, append_batch

    caches = [PagedKVCache(1, 2, 64, block_size=16, placement="cuda:0", max_tokens=m)
              for m in (64, 64, 17)]
    for c, n in zip(caches, (16, 3, 17)):  # the first needs a new block, the last is full
        c.append(0, rng.standard_normal((n, 128)).astype(np.float32),
                 rng.standard_normal((n, 128)).astype(np.float32))
        c.commit(n)
    before = [(c.layer_len(0), c.num_blocks(0), c.dense(0)) for c in caches]
    k = arrays.from_host(0, rng.standard_normal((3, 128)).astype(np.float32))
    v = arrays.from_host(0, rng.standard_normal((3, 128)).astype(np.float32))
    with pytest.raises(CacheCapacityError, match="max_tokens=17"):
        append_batch(caches, 0, k, v)
    for c, (n, nb, (kk, vv)) in zip(caches, before):
        assert (c.layer_len(0), c.num_blocks(0)) == (n, nb)
        assert np.array_equal(c.dense(0)[0], kk) and np.array_equal(c.dense(0)[1], vv)
    dev = emulated_gpu(0)
    dev.launches.clear()
    append_batch(caches[:2], 0, k[0:2], v[0:2])
    assert [name for name, *_ in dev.launches] == ["hybrid_kv_append_batch_f16"]
    for b, c in enumerate(caches[:2]):
        got_k, got_v = c.dense(0)
        assert c.layer_len(0) == before[b][0] + 1
        assert np.array_equal(got_k[-1], k.to_host()[b].astype(np.float16))
        assert np.array_equal(got_v[-1], v.to_host()[b].astype(np.float16))
        assert np.array_equal(got_k[:-1], before[b][2][0])
