"""A Qwen3-30B-A3B-shaped mixture of experts (hidden 2048, 32/4 heads of 128, 128 experts of
768, 8 per token, QK-norm), 6 layers with random weights and SmolLM2's vocabulary, 2 threads.

The file is made here: float16 written with the gguf package, then Q4_K_M by llama.cpp's own
quantizer where llama-cpp-python is installed (else Q4_K by hybrid's quantizer, whose bytes
equal llama.cpp's reference quantizer's).  Measured on the same file in the same run: decode
tokens/s (one stream, 64 tokens after a 32-token prompt) and prefill tokens/s (128 tokens, as
prompt rows, the kernels the engine gives a prompt), for
hybrid and llama.cpp; the ratios; and hybrid's resident memory against the file's size.
Targets: decode >= 1.1x llama.cpp, prefill >= 1.0x, resident memory <= file + 64 MB.
"""

import os

import numpy as np
import pytest

import hybrid
import gguf_models
from conftest import RESULTS, THREADS, record_ratio

gguf = pytest.importorskip("gguf")

# 6 layers: the experts and attention then carry most of a token's bytes, as in the real 48-layer
# model (with 2, SmolLM2's head was 55% of them); BENCH_MOE_LAYERS sets another count
LAYERS = int(os.environ.get("BENCH_MOE_LAYERS", 6))
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, TOP_K, EXPERT_FF = 128, 8, 768
PROMPT, NEW, PREFILL = 32, 64, 128


def _tokenizer_fields(writer):
    """SmolLM2's tokenizer metadata into ``writer``; returns the vocabulary size."""
    from gguf_models import copy_tokenizer
    from hybrid.models import default_model_path

    return copy_tokenizer(default_model_path(), writer)


def _write(path, quantize_here: bool):
    """The model as a GGUF: float16 matrices, or Q4_K ones quantized by hybrid."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "qwen3moe")
    vocab = _tokenizer_fields(w)
    w.add_block_count(LAYERS)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(6144)
    w.add_expert_feed_forward_length(EXPERT_FF)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    q4k = gguf.GGMLQuantizationType.Q4_K

    def mat(*shape):
        a = (rng.standard_normal(shape, dtype=np.float32) * 0.02)
        if not quantize_here:
            return a.astype(np.float16)
        rows = a.reshape(-1, shape[-1])
        q = hybrid.quantize(rows, "q4_k").data
        return q.reshape(*shape[:-1], q.shape[-1])

    def add(name, a):
        if quantize_here and a.dtype == np.uint8:
            w.add_tensor(name, a, raw_dtype=q4k)
        else:
            w.add_tensor(name, a)

    ones = np.ones(HIDDEN, np.float32)
    add("token_embd.weight", mat(vocab, HIDDEN))
    w.add_tensor("output_norm.weight", ones)
    add("output.weight", mat(vocab, HIDDEN))
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "attn_q_norm.weight", np.ones(HEAD_DIM, np.float32))
        w.add_tensor(p + "attn_k_norm.weight", np.ones(HEAD_DIM, np.float32))
        add(p + "attn_q.weight", mat(HEADS * HEAD_DIM, HIDDEN))
        add(p + "attn_k.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN))
        add(p + "attn_v.weight", mat(KV_HEADS * HEAD_DIM, HIDDEN))
        add(p + "attn_output.weight", mat(HIDDEN, HEADS * HEAD_DIM))
        w.add_tensor(p + "ffn_gate_inp.weight",
                     rng.standard_normal((EXPERTS, HIDDEN), dtype=np.float32) * 0.02)
        add(p + "ffn_gate_exps.weight", mat(EXPERTS, EXPERT_FF, HIDDEN))
        add(p + "ffn_up_exps.weight", mat(EXPERTS, EXPERT_FF, HIDDEN))
        add(p + "ffn_down_exps.weight", mat(EXPERTS, HIDDEN, EXPERT_FF))
    gguf_models.finish(w)
    return path


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    return gguf_models.q4_k_m_file(_write, str(tmp_path_factory.mktemp("moe")), "moe")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _decode_bytes(path) -> int:
    """Bytes a decode token reads from the file: every tensor but the experts' and the token
    embedding (one row of it), and top_k of every layer's EXPERTS experts."""
    reader = gguf.GGUFReader(path)
    dense = sum(int(t.n_bytes) for t in reader.tensors
                if "exps" not in t.name and t.name != "token_embd.weight")
    experts = sum(int(t.n_bytes) for t in reader.tensors if "exps" in t.name)
    return dense + experts * TOP_K // EXPERTS


def test_moe_against_llama_cpp(benchmark, moe_file, read_bandwidth):
    path, how = moe_file
    base = _rss()  # the process before the model (the file was written in this process)
    model = hybrid.load_model(path)
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(100, 20000, PROMPT)]
    long = [int(t) for t in rng.integers(100, 20000, PREFILL)]
    model.generate(prompt, 4, stop_tokens=[])  # warm
    gguf_models.hybrid_rounds(model, prompt, long, NEW, 1)  # every page a round touches
    rss, size = _rss() - base, os.path.getsize(path)  # (before llama.cpp maps the file too)
    try:
        import llama_cpp
        llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=THREADS, n_batch=512,
                              verbose=False)
        llm.eval(prompt[:4])
    except ImportError:  # llama-cpp-python is an optional peer: hybrid's side alone
        llm = None
    best = gguf_models.side_by_side(model, llm, prompt, long, NEW)
    benchmark.pedantic(lambda: None, rounds=1)
    RESULTS.append(("moe", f"hybrid decode ({how})", best["hybrid"][1], "tok/s", "best of 4"))
    RESULTS.append(("moe", "hybrid prefill 128", best["hybrid"][0], "tok/s", "best of 4"))
    per_token = _decode_bytes(path)
    for side in best:  # a decode token streams per_token bytes: the share of the read bandwidth
        RESULTS.append(("moe", f"{side} decode, share of read bw",
                        best[side][1] * per_token / read_bandwidth, "x",
                        f"{per_token / 1e6:.0f} MB per token"))
    RESULTS.append(("moe", "resident memory over the file size", (rss - size) / 2**20, "MiB",
                    f"file {size / 2**20:.0f} MiB, the model's resident growth "
                    f"{rss / 2**20:.0f} MiB (target <= +64)"))
    if llm is None:
        return
    RESULTS.append(("moe", "llama.cpp decode", best["llama.cpp"][1], "tok/s", "best of 4"))
    RESULTS.append(("moe", "llama.cpp prefill 128", best["llama.cpp"][0], "tok/s", "best of 4"))
    for k, (what, target) in enumerate((("prefill", 1.0), ("decode", 1.1))):
        record_ratio("moe", f"hybrid / llama.cpp {what}", best["hybrid"][k],
                     best["llama.cpp"][k], f"target >= {target}")
