"""Sliding-window attention end to end: a tiny random Mistral (window 8) built with
transformers, against transformers' float32 logits well past the window, from safetensors and
from a GGUF written as llama.cpp's converter writes it; with Q8_0 weights, a batch equals each
prompt alone (the ragged step and the one-call decode stack both take the window)."""

import numpy as np
import pytest

from hybrid import Engine
from hybrid.models import Model, load_model, read_weights
from conftest import rel_err

torch = pytest.importorskip("torch", reason="torch is a test-only reference")
tf = pytest.importorskip("transformers", reason="transformers is a test-only reference")
gguf = pytest.importorskip("gguf", reason="pip install '.[models]'")

from hf_convert import permute, prefill_then_decode as _logits  # noqa: E402
from test_models_tiny import _write_tokenizer  # noqa: E402

VOCAB, WINDOW = 96, 8


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    torch.manual_seed(9)
    cfg = tf.MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, max_position_embeddings=256, sliding_window=WINDOW,
                           rms_norm_eps=1e-6, tie_word_embeddings=False,
                           attn_implementation="eager")
    hf = tf.MistralForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in n else 0.2 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("mistral")
    hf.save_pretrained(folder)
    _write_tokenizer(folder)
    _to_gguf(folder, folder / "model.gguf")
    return hf, folder


def _to_gguf(folder, path):
    """Mistral as convert_hf_to_gguf.py writes it: arch llama, Q/K permuted, the window in
    llama.attention.sliding_window."""
    from safetensors.numpy import load_file

    sd = load_file(str(folder / "model.safetensors"))
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(WINDOW)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(2):
        for hf_name, name in names.items():
            t = sd[f"model.layers.{i}.{hf_name}.weight"]
            if name in ("attn_q", "attn_k"):
                t = permute(t, 4 if name == "attn_q" else 2)
            w.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()




def test_logits_past_the_window_match_transformers(mistral):
    hf, folder = mistral
    ids = [int(t) for t in np.random.default_rng(2).integers(3, VOCAB, 40)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()[19:]
    st = load_model(folder, kv_dtype="float32")
    assert st.config.sliding_window == WINDOW
    assert rel_err(_logits(st, ids, 20), want) < 1e-4
    mw = read_weights(folder / "model.gguf")
    assert mw.config.sliding_window == WINDOW
    assert rel_err(_logits(Model(mw, None, kv_dtype="float32"), ids, 20), want) < 1e-4
    # the window matters: the same weights without it give other logits
    full = Model(read_weights(folder / "model.gguf"), None, kv_dtype="float32")
    full.config.sliding_window = 0
    for layer in full.layers:
        layer.config.sliding_window = 0
    assert rel_err(_logits(full, ids, 20), want) > 1e-3


def test_batch_equals_each_prompt_alone(mistral, rng):
    hf, folder = mistral
    model = load_model(folder, weights="q8_0")
    prompts = [[int(t) for t in rng.integers(3, VOCAB, int(n))] for n in rng.integers(3, 30, 5)]
    alone = [model.generate(p, 24, stop_tokens=[]) for p in prompts]
    batch = Engine(model, max_batch=5, kv_memory="32MiB").generate(prompts, 24, stop_tokens=[])
    assert batch == alone


def test_blocks_outside_every_window_go_back_to_the_pool(mistral, rng):
    """Every layer of this model has a window of 8: once a block's tokens are outside it, the
    engine gives the block back to the pool.  A pool of 5 blocks (80 tokens, one of them the
    released blocks' stand-in) then serves 130 tokens, blocks handed out are filled with NaN (a kernel that read a released block's stand-in
    would give NaN), the tokens equal those of an engine that keeps every block, and a second
    request with the same long prompt, served partly from the prefix cache, gives them again."""
    hf, folder = mistral
    model = load_model(folder)
    assert model.kv_window == WINDOW
    prompt = [int(t) for t in rng.integers(3, VOCAB, 50)]
    keep_all = Engine(model, num_blocks=64)
    keep_all.kv.window = None  # the reference: nothing released
    want = keep_all.generate([prompt], 80, stop_tokens=[])[0]
    assert keep_all.pool.num_allocated >= 130 // model.block_size  # it needed more than 5
    small = Engine(model, num_blocks=5, poison_unused=True)
    assert small.generate([prompt], 80, stop_tokens=[]) == [want]
    again = small.generate([prompt], 80, stop_tokens=[])
    assert again == [want]
    assert small.pool.num_used <= 1  # the released blocks' stand-in, nothing leaked
    # a model with a layer that reads everything keeps every block
    model.layers[0].config.sliding_window = 0
    try:
        assert model.kv_window is None
    finally:
        model.layers[0].config.sliding_window = WINDOW
