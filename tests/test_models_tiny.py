"""Tiny random Llama and Qwen3 models saved by transformers as safetensors: loading, logits over a
prefill and decode steps, batched generation, sampling, stop strings, and load errors."""

import json
import os
import shutil

import numpy as np
import pytest

import hybrid
from hybrid.models import ModelLoadError, load_model
from conftest import rel_err

torch = pytest.importorskip("torch", reason="torch is a test-only reference")
tf = pytest.importorskip("transformers", reason="transformers is a test-only reference")
pytest.importorskip("safetensors", reason="pip install '.[models]'")
tokenizers = pytest.importorskip("tokenizers", reason="pip install '.[models]'")

VOCAB = 96


def _write_tokenizer(folder):
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="w0"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tk.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins with spaces
    tk.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "w1", "bos_token": "w2", "add_bos_token": False}, f)


def _make(kind, folder, seed):
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, eos_token_id=1, bos_token_id=2, tie_word_embeddings=False)
    if kind == "llama":
        cfg = tf.LlamaConfig(**common, head_dim=16, rope_theta=10000.0)
        model = tf.LlamaForCausalLM(cfg)
    elif kind == "qwen2":  # q/k/v biases, head_dim = hidden / heads
        cfg = tf.Qwen2Config(**common, rope_theta=1000000.0)
        model = tf.Qwen2ForCausalLM(cfg)
    else:
        cfg = tf.Qwen3Config(**common, head_dim=32, rope_theta=1000000.0)
        model = tf.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in n else 0.2 * torch.randn_like(p))
    model.eval().save_pretrained(folder, safe_serialization=True)
    _write_tokenizer(folder)
    return model


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen2"])
def tiny(request, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp(request.param))
    hf = _make(request.param, folder, seed=1234)
    return request.param, folder, hf


def test_logits_match_over_prefill_and_decode(tiny, rng):
    kind, folder, hf = tiny
    model = load_model(folder, kv_dtype="float32")
    assert model.weights.arch == kind
    assert (model.weights.layers[0].q_norm is not None) == (kind == "qwen3")
    assert (model.weights.layers[0].bq is not None) == (kind == "qwen2")
    ids = list(rng.integers(3, VOCAB, 17))
    steps = list(rng.integers(3, VOCAB, 10))
    with torch.no_grad():
        want = hf(torch.tensor([ids + steps])).logits[0].numpy()
    cache = model.new_cache()
    got = [model.forward(ids, cache)]
    for t in steps:
        got.append(model.forward([t], cache))
    assert rel_err(np.stack(got), want[len(ids) - 1:]) < 1e-4


def test_generate_batch_equals_one_by_one(tiny, rng):
    _, folder, _ = tiny
    model = load_model(folder)
    prompts = [list(rng.integers(3, VOCAB, n)) for n in (1, 5, 17, 9)]
    one = [model.generate(p, max_new_tokens=12, stop_tokens=[]) for p in prompts]
    assert model.generate_batch(prompts, max_new_tokens=12, stop_tokens=[]) == one
    # sequences that finish at different steps (stop tokens) still match
    stop = [one[0][3], one[2][6]]
    alone = [model.generate(p, max_new_tokens=12, stop_tokens=stop) for p in prompts]
    both = model.generate_batch(prompts, max_new_tokens=12, stop_tokens=stop)
    assert both == alone and len({len(x) for x in both}) > 1


def test_sampling_is_reproducible_and_varies(tiny):
    _, folder, _ = tiny
    model = load_model(folder)
    kw = dict(max_new_tokens=16, temperature=1.5, top_k=40, top_p=0.95, stop_tokens=[])
    a = model.generate([5, 6, 7], seed=7, **kw)
    assert a == model.generate([5, 6, 7], seed=7, **kw)
    others = {tuple(model.generate([5, 6, 7], seed=s, **kw)) for s in range(8, 14)}
    assert len(others | {tuple(a)}) > 1
    greedy = model.generate([5, 6, 7], max_new_tokens=8, stop_tokens=[])
    assert greedy == model.generate([5, 6, 7], max_new_tokens=8, stop_tokens=[], top_k=1,
                                    temperature=0.7, seed=3)


def test_repetition_penalty_changes_the_choice():
    from hybrid.engine import GenerationParams, Sampler

    logits = np.array([0.0, 2.0, 1.9, -1.0], np.float32)
    assert Sampler(GenerationParams())(logits, [1]) == 1
    assert Sampler(GenerationParams(repetition_penalty=1.2))(logits, [1]) == 2
    with pytest.raises(ValueError, match="top_p"):
        GenerationParams(top_p=0)


def test_min_p_keeps_the_tokens_near_the_most_likely():
    """min_p 0.3 over probabilities (0.5, 0.3, 0.14, 0.06): the last two (under 0.15) are never
    drawn, and the first two keep their ratio 5:3 (a binomial count within 5 sigma)."""
    from hybrid.engine import GenerationParams, Sampler

    logits = np.log(np.array([0.5, 0.3, 0.14, 0.06])).astype(np.float32)
    s = Sampler(GenerationParams(temperature=1.0, min_p=0.3, seed=11))
    draws = np.array([s(logits, []) for _ in range(4000)])
    assert set(draws.tolist()) == {0, 1}
    n0, mean, sd = (draws == 0).sum(), 4000 * 5 / 8, np.sqrt(4000 * 5 / 8 * 3 / 8)
    assert abs(n0 - mean) < 5 * sd
    wide = Sampler(GenerationParams(temperature=1.0, min_p=0.0, seed=11))
    assert {wide(logits, []) for _ in range(400)} == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="min_p"):
        GenerationParams(min_p=1.5)


def test_stop_strings_and_streaming(tiny):
    _, folder, _ = tiny
    model = load_model(folder)
    full = model.generate([4, 9], max_new_tokens=10, stop_tokens=[])
    word = model.tokenizer.decode([full[2]])
    out = model.generate([4, 9], max_new_tokens=10, stop_tokens=[], stop_strings=[word])
    first = next(i for i, t in enumerate(full) if word in model.tokenizer.decode(full[:i + 1]))
    assert out == full[:first + 1]
    text = "".join(model.stream([4, 9], max_new_tokens=10, stop_tokens=[]))
    assert text == model.tokenizer.decode(full)


def test_context_limits_raise_before_any_work(tiny):
    _, folder, _ = tiny
    model = load_model(folder)
    with pytest.raises(ValueError, match="exceed the model's context length 256"):
        model.generate([3] * 250, max_new_tokens=10)
    small = load_model(folder, max_tokens=20)
    with pytest.raises(ValueError, match="exceed the KV cache capacity 20"):
        small.generate([3] * 15, max_new_tokens=10)
    with pytest.raises(ValueError, match="the prompt has no tokens"):
        model.generate(model.tokenizer.encode(""), max_new_tokens=4)


def test_gpu_layers_explain_why_they_cannot_run(tiny):
    _, folder, _ = tiny
    with pytest.raises(hybrid.NoBackendError, match="cuda: unavailable"):
        load_model(folder, gpu_layers=1)


# ------------------------------------------------------------------ load errors

def test_missing_and_non_gguf_files(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(ModelLoadError, match=r"bad.gguf: not a GGUF file"):
        load_model(bad)


def test_truncated_gguf(tmp_path):
    from hybrid.models import default_model_path

    try:
        src = default_model_path()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    cut = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        cut.write_bytes(f.read(3_000_000))
    with pytest.raises(ModelLoadError, match=r"cut.gguf: (truncated or corrupt|tensor .* is the file truncated)"):
        load_model(cut)


def _copy_of(tiny, tmp_path):
    """A copy of the tiny model's folder to break: (folder, config.json path, its config)."""
    work = tmp_path / "m"
    shutil.copytree(tiny[1], work)
    cfg_path = work / "config.json"
    return work, cfg_path, json.loads(cfg_path.read_text())


def test_folder_errors(tiny, tmp_path):
    work, cfg_path, cfg = _copy_of(tiny, tmp_path)
    # config/weights shape mismatch
    cfg_path.write_text(json.dumps({**cfg, "intermediate_size": 80}))
    with pytest.raises(ModelLoadError, match=r"layer 0: weight w_gate has shape"):
        load_model(work)
    # unsupported architecture
    cfg_path.write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        load_model(work)
    # a missing tensor
    cfg_path.write_text(json.dumps({**cfg, "num_hidden_layers": cfg["num_hidden_layers"] + 1}))
    with pytest.raises(ModelLoadError, match=r"missing tensor model.layers.3.input_layernorm.weight"):
        load_model(work)
    # no weights at all
    cfg_path.write_text(json.dumps(cfg))
    for f in work.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors files"):
        load_model(work)


HOSTILE_VALUES = [0, -1, 1, 3, 2**31, 2**40, 2**63, -2**63, 1.5, float("nan"), "64", "", None,
                  True, [], [64], {}, {"a": 1}]
CONFIG_KEYS = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "num_hidden_layers", "rope_theta", "rms_norm_eps",
               "max_position_embeddings", "rope_scaling", "architectures", "tie_word_embeddings"]


def test_hostile_config_values_raise_model_load_error(tiny, tmp_path):
    """Seeded mutations of config.json (hostile values in the size keys, missing keys, a config
    that is not an object): each load raises ModelLoadError naming config.json, or loads a model
    that runs; never another exception, a hang, or an allocation sized by a corrupt width."""
    import time

    work, cfg_path, cfg = _copy_of(tiny, tmp_path)
    rng = np.random.default_rng(20261203)
    cases = [[], "[]", "{" * 100000]  # not an object, a list, too deep for the parser
    for key in CONFIG_KEYS:
        cases += [{**cfg, key: v} for v in HOSTILE_VALUES]
        cases.append({k: v for k, v in cfg.items() if k != key})
    for _ in range(200):  # two or three keys at once
        mutated = dict(cfg)
        for key in rng.choice(CONFIG_KEYS, int(rng.integers(2, 4)), replace=False):
            mutated[str(key)] = HOSTILE_VALUES[int(rng.integers(len(HOSTILE_VALUES)))]
        cases.append(mutated)
    refused = 0
    for case in cases:
        cfg_path.write_text(case if isinstance(case, str) else json.dumps(case))
        t0 = time.perf_counter()
        try:
            model = load_model(work, kv_dtype="float32")
        except ModelLoadError as exc:
            assert "config.json" in str(exc) or str(work) in str(exc)
            refused += 1
        else:
            assert np.isfinite(model.logits([3])).all()  # one token fits any context length
        assert time.perf_counter() - t0 < 5, f"config {case!r:.200} took too long"
    assert refused > len(cases) // 2


def test_width_wider_than_every_tensor_is_refused(tiny, tmp_path):
    work, cfg_path, cfg = _copy_of(tiny, tmp_path)
    cfg_path.write_text(json.dumps({**cfg, "hidden_size": 2**31, "head_dim": None}))
    with pytest.raises(ModelLoadError, match=r"config.json: hidden_size = 2147483648 is wider "
                                             r"than any tensor in the folder"):
        load_model(work)


def test_hostile_tokenizer_files(tiny, tmp_path):
    """A corrupt tokenizer.json or tokenizer_config.json raises ModelLoadError naming the file;
    odd but valid entries (a numeric bos_token, named chat templates) load."""
    work, _, _ = _copy_of(tiny, tmp_path)
    tok, conf = work / "tokenizer.json", work / "tokenizer_config.json"
    good_tok, good_conf = tok.read_text(), json.loads(conf.read_text())
    for bad in ("", "{", '{"model": {"type": "BPE", "vocab": 5}}', "[" * 100000):
        tok.write_text(bad)
        with pytest.raises(ModelLoadError, match=r"tokenizer.json: not a readable tokenizer"):
            load_model(work)
    tok.write_text(good_tok)
    for bad, why in (("{", "invalid JSON"), ("[1, 2]", "not a JSON object"),
                     (json.dumps({**good_conf, "chat_template": 7}), "chat_template is neither")):
        conf.write_text(bad)
        with pytest.raises(ModelLoadError, match=rf"tokenizer_config.json: {why}"):
            load_model(work)
    named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{{ 'ok' }}"}]
    conf.write_text(json.dumps({**good_conf, "bos_token": 5, "eos_token": ["w1"],
                                "chat_template": named}))
    model = load_model(work)
    assert model.tokenizer.apply_chat_template([{"role": "user", "content": "w3"}]) == "ok"


def _tiny_gguf(path, arch="llama", bad_type=None):
    """A tiny GGUF written with the gguf package (llama.cpp's own writer)."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_context_length(64)
    shapes = {"token_embd.weight": (32, 8), "output_norm.weight": (8,),
              "blk.0.attn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8),
              "blk.0.attn_k.weight": (4, 8), "blk.0.attn_v.weight": (4, 8),
              "blk.0.attn_output.weight": (8, 8), "blk.0.ffn_norm.weight": (8,),
              "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8),
              "blk.0.ffn_down.weight": (8, 16)}
    for name, shape in shapes.items():
        if bad_type is not None and name == "blk.0.ffn_up.weight":
            # one Q8_1 block (32 values in 40 bytes) per row
            w.add_tensor(name, np.zeros((16, 40), np.uint8), raw_dtype=bad_type)
        else:
            w.add_tensor(name, np.full(shape, 0.1, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_unsupported_architecture_and_quantisation(tmp_path):
    gguf = pytest.importorskip("gguf")
    ok = tmp_path / "ok.gguf"
    _tiny_gguf(ok)
    weights = hybrid.models.read_weights(ok)
    assert weights.num_layers == 1 and weights.tied_embeddings
    arch = tmp_path / "arch.gguf"
    _tiny_gguf(arch, arch="gpt2")
    with pytest.raises(ModelLoadError, match=r"arch.gguf: unsupported architecture 'gpt2'"):
        hybrid.models.read_weights(arch)
    quant = tmp_path / "quant.gguf"
    _tiny_gguf(quant, bad_type=gguf.GGMLQuantizationType.Q8_1)
    with pytest.raises(ModelLoadError, match=r"tensor blk.0.ffn_up.weight has quantisation type Q8_1"):
        hybrid.models.read_weights(quant)


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 2048,
     "beta_fast": 16, "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0},
])
def test_rope_scaling_matches_transformers(scaling):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hybrid.models.rope_scaling import rope_frequencies

    theta, head_dim = 500000.0, 128
    cfg = tf.LlamaConfig(hidden_size=1024, num_attention_heads=8, head_dim=head_dim,
                         max_position_embeddings=32768,
                         rope_parameters={"rope_theta": theta, **scaling})
    want, want_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu")
    got, factor = rope_frequencies(head_dim, theta, scaling, 32768)
    assert rel_err(got, want.double().numpy()) < 1e-6
    assert factor == pytest.approx(want_factor, rel=1e-6)


def _spm_gguf(path):
    """A tiny Llama GGUF whose tokenizer is a SentencePiece vocabulary with scores, no merges."""
    gguf = pytest.importorskip("gguf")
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = ["\u2581the", "\u2581cat", "\u2581sat", "\u2581on", "\u2581mat", "he", "at", "th",
              "\u2581t", "\u2581c", "\u2581s", "\u2581o", "\u2581m", "on", "\u2581"]
    pieces += list(letters) + ["\u2581" + c for c in letters if "\u2581" + c not in pieces]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


def test_sentencepiece_gguf_tokenizer_matches_transformers(tmp_path):
    from hybrid.models import Tokenizer
    from hybrid.models.gguf_file import read_metadata

    gguf = pytest.importorskip("gguf")
    path = tmp_path / "spm.gguf"
    _spm_gguf(path)
    md = read_metadata(path)
    meta = {"tokenizer_model": "llama", "tokens": md["tokenizer.ggml.tokens"],
            "scores": md["tokenizer.ggml.scores"],
            "token_types": md["tokenizer.ggml.token_type"],
            "bos_token_id": 1, "eos_token_id": 2, "add_bos_token": True}
    ours = Tokenizer.from_gguf_metadata(meta, path)
    theirs = tf.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    for text in ["the cat sat on the mat", "a cat", "zebra! ok?", "  two  spaces", "caf\u00e9"]:
        ids = ours.encode(text)
        assert ids == theirs(text)["input_ids"], text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    assert ours.decode(ours.encode("the cat sat")) == "the cat sat"
    assert ours.encode("the cat")[0] == 1  # BOS


_HF_PROJECTIONS = {"self_attn.q_proj": "wq", "self_attn.k_proj": "wk", "self_attn.v_proj": "wv",
                   "self_attn.o_proj": "wo", "mlp.gate_proj": "w_gate", "mlp.up_proj": "w_up",
                   "mlp.down_proj": "w_down"}


def _held_values(weights, hf_name):
    """The float32 values hybrid holds for the HF matrix `hf_name`
    (model.embed_tokens.weight, lm_head.weight or model.layers.<i>.<block>.<proj>.weight)."""
    if hf_name == "model.embed_tokens.weight":
        t = weights.embed
    elif hf_name == "lm_head.weight":
        t = weights.lm_head
    else:
        parts = hf_name.split(".")
        t = getattr(weights.layers[int(parts[2])], _HF_PROJECTIONS[".".join(parts[3:5])])
    t = hybrid.dequantize(t) if isinstance(t, hybrid.QuantizedTensor) else np.asarray(t)
    return t.astype(np.float32)


def test_half_precision_safetensors_stay_half_and_convert_at_load(tmp_path, rng):
    import copy

    folder = str(tmp_path / "bf16")
    hf = _make("llama", str(tmp_path / "f32"), seed=7)
    with torch.no_grad():  # the reference: float32 weights that bfloat16 holds exactly
        for p in hf.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    copy.deepcopy(hf).to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    _write_tokenizer(folder)
    model = load_model(folder, kv_dtype="float32")
    wq = model.weights.layers[0].wq
    assert isinstance(wq, hybrid.QuantizedTensor) and wq.format.name == "bfloat16"
    ids = list(rng.integers(3, VOCAB, 9))
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0, -1].numpy()
    assert rel_err(model.logits(ids), want) < 1e-4  # the same bf16 values, multiplied in f32
    q8 = load_model(folder, weights="q8_0", kv_dtype="float32")
    assert q8.weights.layers[0].w_down.format.name == "q8_0"
    # Converted at load exactly as hybrid.quantize converts the bf16 values, and every matrix is
    # its own HF matrix within q8_0's rounding: half a step of amax/127 per 32-value block, plus
    # the scale's float16 rounding (127 * 2^-11 steps) and the float32 products.
    w_down = hf.model.layers[0].mlp.down_proj.weight.detach().numpy()
    assert np.array_equal(hybrid.dequantize(q8.weights.layers[0].w_down),
                          hybrid.dequantize(hybrid.quantize(w_down, "q8_0")))
    # The reference for the logits: HF with the weights q8 holds, so what is left is the 8-bit
    # activations of the integer kernels. On these random 3-layer weights that error has a heavy
    # tail (median 3.4%, 1 in 1000 prompts 18%), so bound the mean over 8 prompts (about 4%).
    held = copy.deepcopy(hf)
    with torch.no_grad():
        for p_name, p in held.named_parameters():
            if p.dim() == 2:
                want_w = p.numpy().reshape(p.shape[0], -1, 32)
                got_w = _held_values(q8.weights, p_name)
                step = np.abs(want_w).max(axis=2, keepdims=True) / 127
                bound = step * (0.5 + 127 * 2.0 ** -11 + 1e-3)
                assert np.all(np.abs(got_w.reshape(want_w.shape) - want_w) <= bound), p_name
                p.copy_(torch.from_numpy(got_w))
    errs = []
    for _ in range(8):
        prompt = list(rng.integers(3, VOCAB, 9))
        with torch.no_grad():
            ref = held(torch.tensor([prompt])).logits[0, -1].numpy()
        errs.append(rel_err(q8.logits(prompt), ref))
    assert np.mean(errs) < 0.1 and max(errs) < 0.5, errs
    f32 = load_model(folder, weights="float32", kv_dtype="float32")
    assert isinstance(f32.weights.layers[0].wq, np.ndarray)
    with pytest.raises(ValueError, match="weights='q3_x' is not a known format"):
        load_model(folder, weights="q3_x")


@pytest.mark.parametrize("change,needle", [
    ({"rope_theta": float("nan")}, "rope_theta"),
    ({"rope_theta": float("inf")}, "rope_theta"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": -8.0}}, "factor"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": float("inf")}},
     "beta_fast"),
])
def test_config_values_that_make_nan_logits_are_refused(tiny, tmp_path, change, needle):
    work, cfg_path, cfg = _copy_of(tiny, tmp_path)
    cfg.pop("rope_parameters", None)  # (newer configs keep rope_theta there)
    cfg_path.write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ModelLoadError, match=needle):
        load_model(work)


@pytest.mark.parametrize("name,shape", [("model.norm.weight", (7,)),
                                        ("model.embed_tokens.weight", (96, 7)),
                                        ("lm_head.weight", (95, None))])
def test_head_tensor_shapes_are_checked(tiny, tmp_path, name, shape):
    """The embedding, final norm and LM head shapes are checked at load, as GGUF's are."""
    from safetensors.numpy import load_file, save_file

    work, cfg_path, cfg = _copy_of(tiny, tmp_path)
    cfg_path.write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    (f,) = list(work.glob("*.safetensors"))
    tensors = load_file(str(f))
    hidden = cfg["hidden_size"]
    if "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    tensors[name] = np.zeros(tuple(hidden if d is None else d for d in shape),
                             tensors[name].dtype)
    save_file(tensors, str(f))
    with pytest.raises(ModelLoadError, match="shape"):
        load_model(work)


def test_a_context_past_the_models_is_refused(tiny):
    model = load_model(tiny[1])
    with pytest.raises(ValueError, match="more than the model's context length 256"):
        hybrid.models.Model(model.weights, model.tokenizer, max_tokens=300)
