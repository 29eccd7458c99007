"""Many sequences decoded together, 2 threads: 16 prompts of 32 tokens, then 64 greedy tokens
each, prefill included, on files made by llama.cpp's own quantizer.  hybrid's engine (one ragged
step carries a token of every sequence) against llama.cpp's batched decode (one llama_decode per
step with one token of each sequence, a unified KV cache) through llama-cpp-python, on the same
file, alternating rounds.  Also 16 concurrent requests against one in hybrid.  Targets: >= 1.2x
llama.cpp's batched decode, 16 sequences >= 3x one.  Skipped where llama-cpp-python is not
installed (pip install llama-cpp-python builds it for this CPU)."""

import ctypes
import time

import numpy as np
import pytest

import hybrid
import gguf_models
from conftest import RESULTS, THREADS, record_ratio

SEQS, PROMPT, NEW = 16, 32, 64
FILES = ["smollm2 Q4_K_M", "llama1b-shaped Q4_K_M", "llama1b-shaped Q4_0", "llama1b-shaped Q8_0"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the peer)")
    from hybrid.models import ModelLoadError

    try:
        return gguf_models.peer_files(str(tmp_path_factory.mktemp("batched")), FILES)
    except ModelLoadError as exc:
        pytest.skip(str(exc))


def _prompts():
    rng = np.random.default_rng(3)
    return [[int(t) for t in rng.integers(100, 30000, PROMPT)] for _ in range(SEQS)]


def _hybrid(path, seqs=SEQS):
    """tokens/s of hybrid's engine generating NEW tokens for each of ``seqs`` prompts (prefill
    included), and the tokens."""
    model = hybrid.load_model(path)
    prompts = _prompts()[:seqs]
    model.generate(prompts[0][:8], 2)  # weights paged in
    engine = hybrid.Engine(model, max_batch=SEQS, max_batched_tokens=SEQS * PROMPT)
    t0 = time.perf_counter()
    out = engine.generate(prompts, NEW, stop_tokens=[])
    return seqs * NEW / (time.perf_counter() - t0), out


def _llama_cpp(path):
    """tokens/s of llama.cpp's batched decode: every prompt in one llama_decode, then one
    llama_decode per step carrying the next token of each sequence (greedy), and the tokens."""
    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(path.encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx = SEQS * (PROMPT + NEW + 8)
    cp.n_batch = cp.n_ubatch = SEQS * PROMPT
    cp.n_seq_max = SEQS
    cp.n_threads = cp.n_threads_batch = THREADS
    cp.kv_unified = True
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(SEQS * PROMPT, 0, SEQS)
    prompts = _prompts()

    def put(i, tok, pos, seq, logits):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, logits

    def argmax(i):
        row = np.ctypeslib.as_array(ctypes.cast(L.llama_get_logits_ith(ctx, i),
                                                ctypes.POINTER(ctypes.c_float)), (n_vocab,))
        return int(np.argmax(row))

    try:
        # warm: the weights paged in, then the cache emptied
        put(0, prompts[0][0], 0, 0, True)
        batch.n_tokens = 1
        L.llama_decode(ctx, batch)
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        i = 0
        for s, p in enumerate(prompts):
            for j, tok in enumerate(p):
                put(i, tok, j, s, j == len(p) - 1)
                i += 1
        batch.n_tokens = i
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed on the prompts")
        nxt = [argmax(PROMPT * s + PROMPT - 1) for s in range(SEQS)]
        out = [[t] for t in nxt]
        for step in range(1, NEW):
            for s in range(SEQS):
                put(s, nxt[s], PROMPT + step - 1, s, True)
            batch.n_tokens = SEQS
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed in a step")
            nxt = [argmax(s) for s in range(SEQS)]
            for s in range(SEQS):
                out[s].append(nxt[s])
        tps = SEQS * NEW / (time.perf_counter() - t0)
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return tps, out


@pytest.mark.parametrize("which", FILES)
def test_batched_decode_against_llama_cpp(benchmark, files, which):
    path = files[which]
    (best_h,), (best_l,) = gguf_models.alternating(
        [lambda: _hybrid(path)[:1], lambda: _llama_cpp(path)[:1]], rounds=4)
    one, _ = _hybrid(path, 1)
    benchmark.pedantic(lambda: None, rounds=1)
    RESULTS.append(("batched", f"{which} hybrid, {SEQS} sequences", best_h, "tok/s",
                    "prefill included"))
    RESULTS.append(("batched", f"{which} llama.cpp batched decode", best_l, "tok/s", ""))
    RESULTS.append(("batched", f"{which} hybrid, one sequence", one, "tok/s", ""))
    record_ratio("batched", f"{which} {SEQS} sequences vs llama.cpp", best_h, best_l,
                 "target >= 1.2")
    record_ratio("batched", f"{which} {SEQS} sequences vs one", best_h, one, "target >= 3")
