"""A Gemma-3-1B-shaped model (hidden 1152, 4/1 heads of 256, MLP 6912, GeGLU, sandwich norms,
local layers with a 512-token window and every sixth layer global), 6 layers with random
weights and SmolLM2's vocabulary, 2 threads.

The file is written as float16 with the gguf package and quantized to Q4_K_M by llama.cpp's
own quantizer where llama-cpp-python is installed (else Q4_K by hybrid's quantizer).  Measured
on the same file in the same run: decode tokens/s (64 tokens after a 32-token prompt) and
prefill tokens/s (600 tokens: past the window), hybrid and llama.cpp, and their ratios.
Targets: decode >= 1.1x llama.cpp, prefill >= 1.0x.
"""


import numpy as np
import pytest

import hybrid
import gguf_models
from conftest import RESULTS, THREADS, record_ratio

gguf = pytest.importorskip("gguf")
from bench_moe import _tokenizer_fields  # noqa: E402

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FF, WINDOW = 6, 1152, 4, 1, 256, 6912, 512
PROMPT, NEW, PREFILL = 32, 64, 600


def _write(path, quantize_here: bool):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "gemma3")
    vocab = _tokenizer_fields(w)
    w.add_block_count(LAYERS)
    w.add_context_length(32768)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(WINDOW)
    q4k = gguf.GGMLQuantizationType.Q4_K

    def add(name, *shape):
        a = rng.standard_normal(shape, dtype=np.float32) * 0.02
        if quantize_here:
            w.add_tensor(name, hybrid.quantize(a, "q4_k").data, raw_dtype=q4k)
        else:
            w.add_tensor(name, a.astype(np.float16))

    def norm(name, n):
        w.add_tensor(name, np.ones(n, np.float32))

    add("token_embd.weight", vocab, HIDDEN)
    norm("output_norm.weight", HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}."
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            norm(p + n + ".weight", HIDDEN)
        norm(p + "attn_q_norm.weight", HEAD_DIM)
        norm(p + "attn_k_norm.weight", HEAD_DIM)
        add(p + "attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        add(p + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        add(p + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        add(p + "attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        add(p + "ffn_gate.weight", FF, HIDDEN)
        add(p + "ffn_up.weight", FF, HIDDEN)
        add(p + "ffn_down.weight", HIDDEN, FF)
    gguf_models.finish(w)
    return path


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    return gguf_models.q4_k_m_file(_write, str(tmp_path_factory.mktemp("gemma")), "gemma")


def _prompts():
    rng = np.random.default_rng(1)
    return ([int(t) for t in rng.integers(100, 20000, PROMPT)],
            [int(t) for t in rng.integers(100, 20000, PREFILL)])


def test_gemma_against_llama_cpp(benchmark, gemma_file):
    path, how = gemma_file
    model = hybrid.load_model(path)
    prompt, long = _prompts()
    model.generate(prompt, 4, stop_tokens=[])
    try:
        import llama_cpp
        llm = llama_cpp.Llama(model_path=path, n_ctx=2048, n_threads=THREADS, n_batch=512,
                              verbose=False)
    except ImportError:  # llama-cpp-python is an optional peer: hybrid's side alone
        llm = None
    best = gguf_models.side_by_side(model, llm, prompt, long, NEW)
    benchmark.pedantic(lambda: None, rounds=1)
    RESULTS.append(("gemma", f"hybrid decode ({how})", best["hybrid"][1], "tok/s", "best of 4"))
    RESULTS.append(("gemma", f"hybrid prefill {PREFILL}", best["hybrid"][0], "tok/s", "best of 4"))
    if llm is None:
        return
    RESULTS.append(("gemma", "llama.cpp decode", best["llama.cpp"][1], "tok/s", "best of 4"))
    RESULTS.append(("gemma", f"llama.cpp prefill {PREFILL}", best["llama.cpp"][0], "tok/s",
                    "best of 4"))
    for k, (what, target) in enumerate((("prefill", 1.0), ("decode", 1.1))):
        record_ratio("gemma", f"hybrid / llama.cpp {what}", best["hybrid"][k],
                     best["llama.cpp"][k], f"target >= {target}")
