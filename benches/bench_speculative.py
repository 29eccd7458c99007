"""Speculative decoding on input-grounded prompts (repeat, correct, edit or summarise a given
text or code), single stream, 2 threads, each answer up to its end of turn (at most 128
tokens): hybrid's decode tokens/s with drafts against without, and against llama.cpp's plain
decode on the same file (llama-cpp-python), with the acceptance rate.  The engine feeds the
drafts worth their measured cost (Engine's adapt_drafts).

n-gram drafts: SmolLM2-135M as shipped (Q4_1) and, where llama-cpp-python is installed, at
Q8_0 and float32 (more bytes per token: the weight reads drafts save weigh more).  Targets:
>= 1.8x without drafts, >= 2x llama.cpp.

Draft model: its Q4_0 copy (both by llama.cpp's quantizer) drafting for the Q8_0 file, and for
the float32 file (the bandwidth-bound target): decode tokens/s with drafts against without.
Target: >= 1.3x."""

import time

import numpy as np
import pytest

import hybrid
import gguf_models
from conftest import RESULTS, THREADS, record_ratio

NEW, K = 128, 4
PARA = ("The history of astronomy is a long story of careful observation. Early astronomers "
        "tracked the motions of the planets and the stars, and built calendars on them. Later, "
        "telescopes revealed moons, rings and distant galaxies, and physics explained why the "
        "planets move as they do.")
PARA2 = PARA + (" Today, space telescopes measure the light of stars that formed billions of "
                "years ago, and spacecraft have visited every planet of the solar system. Each "
                "new instrument has answered old questions and raised new ones.")
TYPOS = PARA.replace("careful", "carefull").replace("planets", "planetts", 1) \
    .replace("revealed", "revaeled")
CODE = ("def area(width, height):\n    return width * height\n\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n\n\n"
        "def volume(width, height, depth):\n    return width * height * depth\n\n\n"
        "def describe(width, height):\n    return f\"{width} by {height}\"\n")
TASKS = [f"Repeat this paragraph word for word:\n\n{PARA}",
         f"Fix the spelling mistakes in this paragraph and write out the corrected paragraph:"
         f"\n\n{TYPOS}",
         f"Rename the parameter width to w in this code and show the whole code:\n\n{CODE}",
         f"Here is some Python code:\n\n{CODE}\nWrite the same code again, with a docstring "
         f"in each function.",
         f"Summarise this text in two sentences:\n\n{PARA2}"]


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
    """{"drafts": best tok/s with the Engine arguments spec, "plain": best without,
    "acceptance": drafts kept / fed over the rounds with drafts}, four rounds alternating which
    goes first (gguf_models.alternating)."""
    engines = []

    def run(kw):
        tps, used = _hybrid(model, prompts, kw)
        engines.extend(used)
        return (tps,)
    (plain,), (drafts,) = gguf_models.alternating([lambda: run({}), lambda: run(spec)], 4)
    fed = sum(e.draft_tokens for e in engines)
    return {"plain": plain, "drafts": drafts,
            "acceptance": sum(e.accepted_tokens for e in engines) / max(1, fed)}


def _draft_bound(model, draft, prompts, kw: dict) -> dict:
    """What any engine could gain from this draft model: one pass feeding k = K drafts every
    step gives the chance that a draft is kept (solved from the share kept, drafts being kept
    in order until the first miss) and the engine's learnt step times give a draft step's
    cost c in target steps.  With verify rows free, k drafts give (1 - a^(k+1)) / (1 - a)
    tokens for 1 + k*c steps' time; "best" is the largest over k = 1..K, "best_measured" the
    same with the target's learnt time of a step of k + 1 rows in place of the 1."""
    from hybrid.engine.speculative import step_cost

    _, engines = _hybrid(model, prompts, {**kw, "adapt_drafts": False})
    share = sum(e.accepted_tokens for e in engines) / max(1, sum(e.draft_tokens for e in engines))

    def kept_share(a):  # expected share of K fed drafts kept
        return a * (1 - a ** K) / ((1 - a) * K) if a < 1 else 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if kept_share(mid) < share else (lo, mid)
    a = lo
    target = step_cost(model)
    draft_s, target_s = step_cost(draft).seconds(1), target.seconds(1)
    if not (draft_s and target_s):
        return {"accept": a, "cost": float("nan"), "best": float("nan"),
                "best_measured": float("nan")}
    cost = draft_s / target_s

    def gain(k, verify):  # tokens per target step's time, k drafts, a verify step of `verify`
        return (1 - a ** (k + 1)) / (1 - a) / (verify + k * cost)
    best = max(gain(k, 1.0) for k in range(1, K + 1))
    measured = max(gain(k, target.seconds(k + 1) / target_s) for k in range(1, K + 1))
    return {"accept": a, "cost": cost, "best": best, "best_measured": measured}


def _hybrid(model, prompts, kw: dict):
    """(decode tokens/s summed over the prompts, prefill not counted, each answer to its end of
    turn; the engines that ran them) with Engine arguments kw."""
    tokens = seconds = 0.0
    engines = []
    for ids in prompts:
        eng = hybrid.Engine(model, max_batch=1, **kw)
        rid = eng.add_request(ids, hybrid.GenerationParams(NEW))
        t0 = t1 = None
        n = 0
        while eng.has_unfinished():
            for out in eng.step():
                if out.request_id == rid and out.new_tokens:
                    if t0 is None:
                        t0 = time.perf_counter()  # the first token: the prompt is done
                    n += len(out.new_tokens)
                    t1 = time.perf_counter()
        tokens += n - 1
        seconds += t1 - t0
        engines.append(eng)
    return tokens / seconds, engines


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
    spec = {"speculative": "ngram", "num_speculative_tokens": K}
    same = hybrid.Engine(model, **spec).generate(prompts, NEW) == \
        hybrid.Engine(model).generate(prompts, NEW)
    best = _alternating(model, prompts, spec)
    peer = None
    try:
        import llama_cpp  # noqa: F401
        del model
        peer = max(_llama_cpp(path, prompts) for _ in range(2))
    except ImportError:
        pass
    benchmark.pedantic(lambda: None, rounds=1)
    RESULTS.append(("speculative", f"{which} decode, n-gram drafts (k <= {K})", best["drafts"],
                    "tok/s", f"acceptance {best['acceptance']:.0%}; output equal to without: "
                             f"{same}"))
    RESULTS.append(("speculative", f"{which} decode, without drafts", best["plain"], "tok/s", ""))
    record_ratio("speculative", f"{which} n-gram drafts vs without", best["drafts"], best["plain"],
                 "target >= 1.8")
    if peer:
        RESULTS.append(("speculative", f"{which} llama.cpp decode", peer, "tok/s", ""))
        record_ratio("speculative", f"{which} n-gram drafts vs llama.cpp", best["drafts"], peer,
                     "target >= 2")
    assert same


@pytest.mark.parametrize("target", ["smollm2 Q8_0", "smollm2 F32"])
def test_draft_model_speculation(benchmark, files, target):
    if "smollm2 Q4_0" not in files:
        pytest.skip("llama-cpp-python makes the files (not installed)")
    model = hybrid.load_model(files[target])
    draft = hybrid.load_model(files["smollm2 Q4_0"])
    prompts = _prompts(model)
    kw = {"speculative": "draft", "draft_model": draft, "num_speculative_tokens": K}
    same = hybrid.Engine(model, **kw).generate(prompts, NEW) == \
        hybrid.Engine(model).generate(prompts, NEW)
    best = _alternating(model, prompts, kw)
    bound = _draft_bound(model, draft, prompts, kw)
    benchmark.pedantic(lambda: None, rounds=1)
    RESULTS.append(("speculative", f"{target} Q4_0 draft: the most drafting could give",
                    bound["best"], "x", f"with verify rows free: a draft kept with chance "
                    f"{bound['accept']:.2f} (k = {K} fed every step), a draft step "
                    f"{bound['cost']:.2f} of a target step"))
    RESULTS.append(("speculative", f"{target} Q4_0 draft: the most with the measured verify "
                    "steps", bound["best_measured"], "x", "the target's learnt step times for "
                    "k + 1 rows in place of one row's"))
    RESULTS.append(("speculative", f"{target} decode, Q4_0 draft model (k <= {K})",
                    best["drafts"], "tok/s", f"acceptance {best['acceptance']:.0%}; output equal "
                                             f"to without: {same}"))
    RESULTS.append(("speculative", f"{target} decode, without drafts", best["plain"], "tok/s",
                    ""))
    record_ratio("speculative", f"{target} Q4_0-draft vs without", best["drafts"], best["plain"],
                 "target >= 1.3")
    assert same
