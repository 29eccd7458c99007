"""Speculative decoding with n-gram drafts on input-grounded prompts (repeat, edit or continue a
given text or code), single stream, 2 threads: hybrid's decode tokens/s with drafts against
without, and against llama.cpp's plain decode on the same file (llama-cpp-python), with the
acceptance rate.  Files: SmolLM2-135M as shipped (Q4_1) and, where llama-cpp-python is installed,
at Q8_0 and float32 (more bytes per token: the weight reads drafts save weigh more).  Targets:
>= 1.8x without drafts, >= 2x llama.cpp.

Draft model: the Q8_0 file as the target, its Q4_0 copy (both by llama.cpp's quantizer) as the
draft, on the same prompts: decode tokens/s with drafts against without.  Target: >= 1.3x."""

import time

import numpy as np
import pytest

import hybrid
import gguf_models
from conftest import RESULTS, THREADS, record_ratio

NEW, K = 96, 4
PARA = ("The history of astronomy is a long story of careful observation. Early astronomers "
        "tracked the motions of the planets and the stars, and built calendars on them. Later, "
        "telescopes revealed moons, rings and distant galaxies, and physics explained why the "
        "planets move as they do.")
CODE = ("def area(width, height):\n    return width * height\n\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")
TASKS = [f"Repeat this paragraph word for word:\n\n{PARA}",
         f"Rename the parameter width to w in this code and show the whole code:\n\n{CODE}",
         f"Continue the list in the same style:\n\n{PARA}\n\n1. Mercury\n2. Venus\n3. Earth\n"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from hybrid.models import ModelLoadError, default_model_path

    try:
        src = default_model_path()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    out = {"smollm2 Q4_1": src}
    try:
        import llama_cpp  # noqa: F401
        import gguf_models
    except ImportError:
        return out
    folder = tmp_path_factory.mktemp("spec")
    f32 = gguf_models.float32_gguf(src, str(folder / "smollm2-f32.gguf"))
    out["smollm2 Q8_0"] = gguf_models.llama_quantize(f32, str(folder / "smollm2-q8_0.gguf"), "Q8_0")
    out["smollm2 F32"] = f32
    out["smollm2 Q4_0"] = gguf_models.llama_quantize(f32, str(folder / "smollm2-q4_0.gguf"), "Q4_0")
    return out


def _prompts(model):
    tok = model.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in TASKS]


def _alternating(model, prompts, spec: dict) -> dict:
    """{"drafts": best tok/s with the generate arguments spec, "plain": best without}, four
    rounds alternating which goes first."""
    best = {"plain": 0.0, "drafts": 0.0}
    for i in range(4):
        for with_drafts in ((False, True) if i % 2 == 0 else (True, False)):
            key = "drafts" if with_drafts else "plain"
            best[key] = max(best[key], _hybrid(model, prompts, spec if with_drafts else {}))
    return best


def _hybrid(model, prompts, kw: dict):
    """Decode tokens/s summed over the prompts (prefill not counted) with generate arguments
    kw."""
    tokens = seconds = 0.0
    for ids in prompts:
        model.generate(ids, NEW, stop_tokens=[], **kw)
        st = model.last_stats
        tokens += st.new_tokens - 1
        seconds += st.decode_s
    return tokens / seconds


def _llama_cpp(path, prompts):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=THREADS, n_batch=512,
                          verbose=False)
    tokens = seconds = 0.0
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        tok = gguf_models.llama_cpp_next(llm)
        t0 = time.perf_counter()
        for _ in range(NEW - 1):
            llm.eval([tok])
            tok = gguf_models.llama_cpp_next(llm)
        seconds += time.perf_counter() - t0
        tokens += NEW - 1
    return tokens / seconds


@pytest.mark.parametrize("which", ["smollm2 Q4_1", "smollm2 Q8_0", "smollm2 F32"])
def test_ngram_speculation(benchmark, files, which):
    if which not in files:
        pytest.skip("llama-cpp-python makes this file (not installed)")
    path = files[which]
    model = hybrid.load_model(path)
    prompts = _prompts(model)
    eng = hybrid.Engine(model, speculative="ngram", num_speculative_tokens=K)
    same = eng.generate(prompts, NEW, stop_tokens=[]) == \
        hybrid.Engine(model).generate(prompts, NEW, stop_tokens=[])
    rate = eng.accepted_tokens / max(1, eng.draft_tokens)
    best = _alternating(model, prompts, {"speculative": "ngram", "num_speculative_tokens": K})
    peer = None
    try:
        import llama_cpp  # noqa: F401
        del model
        peer = max(_llama_cpp(path, prompts) for _ in range(2))
    except ImportError:
        pass
    benchmark.pedantic(lambda: None, rounds=1)
    RESULTS.append(("speculative", f"{which} decode, n-gram drafts (k={K})", best["drafts"],
                    "tok/s", f"acceptance {rate:.0%}; output equal to without: {same}"))
    RESULTS.append(("speculative", f"{which} decode, without drafts", best["plain"], "tok/s", ""))
    record_ratio("speculative", f"{which} n-gram drafts vs without", best["drafts"], best["plain"],
                 "target >= 1.8")
    if peer:
        RESULTS.append(("speculative", f"{which} llama.cpp decode", peer, "tok/s", ""))
        record_ratio("speculative", f"{which} n-gram drafts vs llama.cpp", best["drafts"], peer,
                     "target >= 2")
    assert same


def test_draft_model_speculation(benchmark, files):
    if "smollm2 Q4_0" not in files:
        pytest.skip("llama-cpp-python makes the files (not installed)")
    model = hybrid.load_model(files["smollm2 Q8_0"])
    draft = hybrid.load_model(files["smollm2 Q4_0"])
    prompts = _prompts(model)
    kw = {"speculative": "draft", "draft_model": draft, "num_speculative_tokens": K}
    eng = hybrid.Engine(model, **kw)
    same = eng.generate(prompts, NEW, stop_tokens=[]) == \
        hybrid.Engine(model).generate(prompts, NEW, stop_tokens=[])
    rate = eng.accepted_tokens / max(1, eng.draft_tokens)
    best = _alternating(model, prompts, kw)
    benchmark.pedantic(lambda: None, rounds=1)
    RESULTS.append(("speculative", f"smollm2 Q8_0 decode, Q4_0 draft model (k={K})",
                    best["drafts"], "tok/s", f"acceptance {rate:.0%}; output equal to without: "
                                            f"{same}"))
    RESULTS.append(("speculative", "smollm2 Q8_0 decode, without drafts", best["plain"], "tok/s",
                    ""))
    record_ratio("speculative", "smollm2 Q8_0 Q4_0-draft vs without", best["drafts"],
                 best["plain"], "target >= 1.3")
    assert same
