"""GPU benches (skipped, with the reason, where CUDA is unavailable): paged decode attention at
batch 1 and 64, contexts 4k and 32k, float16/float32 KV, fused RoPE on and off, in GB/s and as a
share of the device's measured copy bandwidth, beside torch's SDPA on the same shapes (where
torch has CUDA); a SmolLM2-shaped decode step, GPU against CPU."""

import numpy as np
import pytest

from conftest import RESULTS, record, record_ratio

backend = pytest.importorskip("hybrid._cuda.backend")
OK, REASON = backend.availability()
if not OK:
    pytest.skip(f"CUDA unavailable: {REASON}", allow_module_level=True)

from hybrid.tools import gpucheck  # noqa: E402
from hybrid._cuda.device import device  # noqa: E402

_ms: dict = {}


@pytest.fixture(scope="session")
def gpu():
    dev = device(0)
    bw = gpucheck.copy_bandwidth(dev)
    RESULTS.append(("machine", f"{dev.name} copy bandwidth", bw / 1e9, "GB/s", ""))
    return dev, bw


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("ctx", [4096, 32768])
@pytest.mark.parametrize("batch", [1, 64])
def test_gpu_decode_attention(benchmark, gpu, batch, ctx, dtype, fused):
    dev, bw = gpu
    step, kv_bytes = gpucheck.decode_step(dev, batch, ctx, dtype == "float16", fused)

    def run():
        step()
        dev.synchronize()

    benchmark.pedantic(run, rounds=20, warmup_rounds=2)
    name = f"B={batch} ctx={ctx} {dtype}{' fused-rope' if fused else ''}"
    _ms[(batch, ctx, dtype, fused)] = record(benchmark, "gpu attention", name,
                                             bytes_moved=kv_bytes, bandwidth=bw)
    key = (batch, ctx)
    record_ratio("gpu attention", f"B={batch} ctx={ctx} f16/f32 time",
                 _ms.get(key + ("float16", False)), _ms.get(key + ("float32", False)), "target <= 0.6",
                 higher_is_better=False)
    record_ratio("gpu attention", f"B={batch} ctx={ctx} {dtype} fused/unfused time",
                 _ms.get(key + (dtype, True)), _ms.get(key + (dtype, False)), "target <= 1.05",
                 higher_is_better=False)
    step.keep[0].free()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("ctx", [4096, 32768])
@pytest.mark.parametrize("batch", [1, 64])
def test_gpu_decode_attention_torch_peer(benchmark, gpu, batch, ctx, dtype):
    """The peer: torch's scaled_dot_product_attention on contiguous K/V of the same shape."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    dev, bw = gpu
    dt = getattr(torch, dtype)
    q = torch.zeros(batch, 32, 1, 128, device="cuda", dtype=dt)
    k = torch.zeros(batch, 8, ctx, 128, device="cuda", dtype=dt)
    v = torch.zeros_like(k)

    def run():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=20, warmup_rounds=2)
    kv_bytes = 2 * k.numel() * k.element_size()
    t = record(benchmark, "gpu attention", f"torch-sdpa B={batch} ctx={ctx} {dtype}",
               bytes_moved=kv_bytes, bandwidth=bw)
    record_ratio("gpu attention", f"B={batch} ctx={ctx} {dtype}: torch time / hybrid time", t,
                 _ms.get((batch, ctx, dtype, False)))


@pytest.mark.parametrize("where", ["cpu", "cuda:0"])
def test_smollm2_shaped_decode_step(benchmark, where):
    from hybrid.testing import PRESETS, random_weights
    from hybrid.config import DecoderConfig
    from hybrid.kvcache import PagedKVCache
    from hybrid.layer import DecoderLayer
    from hybrid.placement import to_device

    cfg = DecoderConfig(**PRESETS["smollm2-135m"])
    rng = np.random.default_rng(0)
    layer = DecoderLayer(cfg, random_weights(cfg, rng), placement=where)
    cache = PagedKVCache(1, cfg.num_kv_heads, cfg.head_dim, placement=where)
    ctx = rng.standard_normal((512, cfg.hidden_size)).astype(np.float32)
    layer.forward(ctx, np.arange(512), cache)
    cache.commit(512)
    h = to_device(rng.standard_normal((1, cfg.hidden_size)).astype(np.float32), where)

    def run():
        layer.forward(h, [512], cache, out=h if where != "cpu" else None)
        cache.discard_uncommitted()
        if where != "cpu":
            device(0).synchronize()

    benchmark(run)
    _ms[("layer", where)] = record(benchmark, "gpu layer", f"SmolLM2 layer decode at 512 on {where}")
    record_ratio("gpu layer", "SmolLM2 layer decode: cpu time / gpu time", _ms.get(("layer", "cpu")),
                 _ms.get(("layer", "cuda:0")))
