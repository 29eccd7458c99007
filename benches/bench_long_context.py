"""Decode at 16k context with a q8_0 KV cache: the Llama-3.2-1B-shaped random model (4 layers,
32/8 heads of 64; Q4_K_M by llama.cpp's quantizer), a 16383-token prompt, then 32 greedy
tokens, 2 threads.  hybrid with its q8_0 cache and with float16, and llama.cpp with its q8_0
cache (type_k = type_v = Q8_0, flash attention, which its quantized V needs), on the same file.
At this length the cache's bytes per token rival the weights'.  Target: hybrid's q8_0 decode
>= 1.2x llama.cpp's.  One round per side: the prefills take about a minute each."""

import os
import time

import numpy as np
import pytest

import hybrid
import gguf_models
from conftest import RESULTS, THREADS, record_ratio

CTX, NEW = 16384, 32
_tps: dict = {}


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama.cpp's quantizer makes the file")
    from hybrid.models import ModelLoadError, default_model_path

    try:
        src = default_model_path()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    folder = str(tmp_path_factory.mktemp("long"))
    f32 = gguf_models.random_llama_gguf(src, os.path.join(folder, "l1b-32k-f32.gguf"),
                                        context=2 * CTX)
    out = gguf_models.llama_quantize(f32, os.path.join(folder, "l1b-32k-q4_k_m.gguf"), "Q4_K_M")
    os.remove(f32)
    return out


def _prompt():
    rng = np.random.default_rng(3)
    return [int(t) for t in rng.integers(100, 20000, CTX - 1)]


@pytest.mark.parametrize("kv", ["q8_0", "float16"])
def test_hybrid_decode_at_16k(benchmark, long_file, kv):
    model = hybrid.load_model(long_file, kv_dtype=kv)
    model.generate(_prompt(), NEW, stop_tokens=[])
    st = model.last_stats
    benchmark.pedantic(lambda: None, rounds=1)
    _tps[f"hybrid {kv}"] = st.decode_tps
    RESULTS.append(("long context", f"hybrid decode at {CTX}, {kv} KV", st.decode_tps, "tok/s",
                    f"prefill {st.prefill_tps:.0f} tok/s"))
    _ratios()


def test_llama_cpp_decode_at_16k_q8_0(benchmark, long_file):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=long_file, n_ctx=CTX + NEW + 16, n_threads=THREADS,
                          n_batch=512, flash_attn=True, type_k=llama_cpp.GGML_TYPE_Q8_0,
                          type_v=llama_cpp.GGML_TYPE_Q8_0, verbose=False)
    prompt = _prompt()
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t0)
    tok = gguf_models.llama_cpp_next(llm)
    t0 = time.perf_counter()
    for _ in range(NEW - 1):
        llm.eval([tok])
        tok = gguf_models.llama_cpp_next(llm)
    decode = (NEW - 1) / (time.perf_counter() - t0)
    benchmark.pedantic(lambda: None, rounds=1)
    _tps["llama.cpp q8_0"] = decode
    RESULTS.append(("long context", f"llama.cpp decode at {CTX}, q8_0 KV", decode, "tok/s",
                    f"prefill {prefill:.0f} tok/s"))
    _ratios()


def _ratios():
    record_ratio("long context", "hybrid q8_0 / llama.cpp q8_0 decode", _tps.get("hybrid q8_0"),
                 _tps.get("llama.cpp q8_0"), "target >= 1.2")
    record_ratio("long context", "hybrid q8_0 / float16 KV decode", _tps.get("hybrid q8_0"),
                 _tps.get("hybrid float16"))
