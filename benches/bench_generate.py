"""End to end on SmolLM2-135M-Instruct, 2 threads: prefill tokens/s for a 256-token prompt and decode
tokens/s for 128 new tokens, hybrid reading the shipped Q4_1 file in place.  Peers in the same
run: Hugging Face transformers (torch eager, float32) on the same GGUF, and llama.cpp through
llama-cpp-python where it is installed, on the same Q4_1 file and on a float32 re-encoding of it.
More files and formats against llama.cpp: bench_quant.py."""

import os
import time

import numpy as np
import pytest

import hybrid
import gguf_models
from conftest import RESULTS, THREADS, figure, paired_with_probe, rate, record, record_ratio

PROMPT_TOKENS, NEW_TOKENS = 256, 128
_tps: dict = {}

from hybrid.models import ModelLoadError, default_model_path  # noqa: E402

try:
    GGUF = default_model_path()
except ModelLoadError as exc:
    pytest.skip(f"the default model is not installed ({exc})", allow_module_level=True)


@pytest.fixture(scope="module")
def model():
    return hybrid.load_model(GGUF, kv_dtype="float16")


@pytest.fixture(scope="module")
def prompt(model):
    text = " ".join(["The history of astronomy is a long story of careful observation."] * 40)
    return model.tokenizer.encode(text)[:PROMPT_TOKENS]


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory):
    """The same model re-encoded with every tensor dequantised to float32, metadata copied."""
    pytest.importorskip("gguf")
    import gguf_models

    return gguf_models.float32_gguf(GGUF, str(tmp_path_factory.mktemp("f32") / "smollm2-f32.gguf"))


def _quote(name, tps, note=""):
    _tps[name] = tps
    RESULTS.append(("generate", name, tps, "tok/s", note))


def test_hybrid_prefill(benchmark, model, prompt, read_bandwidth):
    def run():
        model.forward(prompt, model.new_cache())
    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    record(benchmark, "generate", "hybrid prefill 256")
    _quote("hybrid prefill", PROMPT_TOKENS / benchmark.stats.stats.median)
    # the figure: prefills timed beside the read probe, round by round (conftest.paired)
    per_probe = paired_with_probe(lambda: rate(run, PROMPT_TOKENS))[0]
    figure("generate: hybrid prefill 256 | tok/s per GB/s of read bandwidth", per_probe * 1e9,
           "per_gbps")


def test_hybrid_decode(benchmark, model, prompt, read_bandwidth):
    def run():
        model.generate(prompt, max_new_tokens=NEW_TOKENS, stop_tokens=[])
    benchmark.pedantic(run, rounds=2, warmup_rounds=0)
    st = model.last_stats
    tps = st.decode_tps
    weights = model.weights.nbytes()
    _quote("hybrid decode", tps, f"weights streamed {weights * tps / 1e9:.1f} GB/s = "
                                 f"{weights * tps / read_bandwidth:.0%} of read bw")
    benchmark.extra_info.update(decode_tok_per_s=tps, prefill_tok_per_s=st.prefill_tps,
                                weight_GB_per_s=weights * tps / 1e9)
    # the figures: shorter generations timed beside the read probe, round by round (conftest.paired)

    def decode_rate():
        model.generate(prompt, max_new_tokens=32, stop_tokens=[])
        return model.last_stats.decode_tps
    per_probe = paired_with_probe(decode_rate)[0]
    figure("generate: hybrid decode | share of read bandwidth (weights per token)",
           weights * per_probe, "bandwidth_share")
    figure("generate: hybrid decode | tok/s per GB/s of read bandwidth", per_probe * 1e9,
           "per_gbps")


@pytest.mark.parametrize("batch", [4, 8])
def test_hybrid_batched_decode(benchmark, model, prompt, batch):
    """generate_batch: every prompt prefilled alone, then all decoded together in ragged steps."""
    prompts = [prompt[: 64 + 16 * i] for i in range(batch)]
    new = 64

    def run():
        model.generate_batch(prompts, max_new_tokens=new, stop_tokens=[])
    benchmark.pedantic(run, rounds=1, warmup_rounds=0)
    prefill = sum(len(p) for p in prompts) / _tps.get("hybrid prefill", float("inf"))
    decode_s = max(benchmark.stats.stats.median - prefill, 1e-9)
    _quote(f"hybrid batched decode x{batch}", batch * new / decode_s,
           "aggregate over the batch (prefill time subtracted at the single-prompt rate)")


def test_hybrid_python_overhead(benchmark, model):
    """Fixed costs of a decode step: the same 30-layer stack, Q8_0 weights and sampling at toy
    width (hidden 32: every kernel is nearly free, so what remains is Python, argument checks,
    OpenMP fork/join and scratch handling), through the same Model.generate path as a real
    SmolLM2 step, at context 1..64.  Its step time over SmolLM2's is the non-kernel share of a
    SmolLM2 decode step (an upper bound).  Target < 5%."""
    import dataclasses

    from hybrid.testing import random_weights
    from hybrid.models.weights import ModelWeights

    cfg = dataclasses.replace(model.config, hidden_size=32, num_heads=2, num_kv_heads=1,
                              head_dim=16, intermediate_size=32)
    rng = np.random.default_rng(0)
    layers = []
    for _ in range(model.weights.num_layers):
        lw = random_weights(cfg, rng)
        for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            setattr(lw, name, hybrid.quantize(getattr(lw, name), "q8_0"))
        layers.append(lw)
    embed = hybrid.quantize(rng.standard_normal((256, 32)).astype(np.float32), "q8_0")
    toy = hybrid.models.Model(ModelWeights(arch="llama", config=cfg, embed=embed,
                                           final_norm=np.ones(32, np.float32), lm_head=embed,
                                           layers=layers, tied_embeddings=True),
                              kv_dtype="float16")
    new = 64

    def run():
        toy.generate([1], max_new_tokens=new, stop_tokens=[])
    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    step = 1.0 / toy.last_stats.decode_tps
    RESULTS.append(("generate", "toy 30-layer Q8_0 stack: decode step", step * 1e6, "us",
                    "fixed costs only"))
    real = 1.0 / _tps["hybrid decode"] if "hybrid decode" in _tps else None
    if real:
        RESULTS.append(("generate", "non-kernel share of a SmolLM2 decode step", step / real, "x",
                        "target < 0.05"))


def test_transformers_peer(benchmark, prompt):
    torch = pytest.importorskip("torch", reason="torch is the peer's runtime")
    tf = pytest.importorskip("transformers", reason="transformers is the peer")
    pytest.importorskip("accelerate", reason="transformers' GGUF loading needs accelerate")
    torch.set_num_threads(THREADS)
    folder, name = os.path.split(GGUF)
    hf = tf.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        t0 = time.perf_counter()
        hf(ids)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)
        total = time.perf_counter() - t0
    decode_tps = 31 / max(total - prefill, 1e-9)
    benchmark.pedantic(lambda: None, rounds=1)
    _quote("transformers prefill", PROMPT_TOKENS / prefill)
    _quote("transformers decode", decode_tps)
    if "hybrid decode" in _tps:
        RESULTS.append(("generate", "decode speed-up over transformers",
                        _tps["hybrid decode"] / decode_tps, "x", "target >= 3"))
        RESULTS.append(("generate", "prefill speed-up over transformers",
                        _tps["hybrid prefill"] / (PROMPT_TOKENS / prefill), "x", ""))


@pytest.mark.parametrize("which", ["q4_1", "f32"])
def test_llama_cpp_peer(benchmark, prompt, which, request):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed "
                                                        "(an optional peer)")
    path = GGUF if which == "q4_1" else request.getfixturevalue("f32_gguf")
    llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=THREADS, n_batch=512,
                          verbose=False)
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - t0
    tok = prompt[-1]
    t0 = time.perf_counter()
    for _ in range(NEW_TOKENS):
        llm.eval([tok])
        tok = gguf_models.llama_cpp_next(llm)
    decode = time.perf_counter() - t0
    benchmark.pedantic(lambda: None, rounds=1)
    _quote(f"llama.cpp {which} prefill", PROMPT_TOKENS / prefill)
    _quote(f"llama.cpp {which} decode", NEW_TOKENS / decode)
    if which == "f32":  # hybrid on the same float32 file, measured as bench_quant measures files
        from bench_quant import side_by_side

        del llm
        hp, hd, _, lp, _ = side_by_side(path)
        _quote("hybrid f32 prefill (same file)", hp)
        _quote("hybrid f32 decode (same file)", hd)
        record_ratio("generate", "float32 prefill vs llama.cpp (the same float32 file)",
                     hp, lp, "target >= 1.1")
    if which == "q4_1" and "hybrid decode" in _tps:  # hybrid reads the Q4_1 file in place too
        record_ratio("generate", "decode vs llama.cpp (the same Q4_1 file)",
                     _tps["hybrid decode"], NEW_TOKENS / decode, "target >= 1.2")
        record_ratio("generate", "prefill vs llama.cpp (the same Q4_1 file)",
                     _tps.get("hybrid prefill"), PROMPT_TOKENS / prefill, "target >= 1.0")
