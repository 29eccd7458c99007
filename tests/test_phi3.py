"""Phi-3 and Phi-4-mini: tiny random models built with transformers (fused qkv_proj and
gate_up_proj, LongRoPE with short and long factors, full and partial rotary), saved as
safetensors and written as GGUF the way llama.cpp's converter writes phi3 files (attn_qkv,
fused ffn_up, rope_factors_short/long tensors), against transformers' float32 logits."""

import math

import numpy as np
import pytest

from hybrid.models import Model, load_model, read_weights
from conftest import rel_err

torch = pytest.importorskip("torch", reason="torch is a test-only reference")
tf = pytest.importorskip("transformers", reason="transformers is a test-only reference")
gguf = pytest.importorskip("gguf", reason="pip install '.[models]'")
pytest.importorskip("safetensors", reason="pip install '.[models]'")

from hf_convert import prefill_then_decode as _logits  # noqa: E402
from test_models_tiny import _write_tokenizer  # noqa: E402

VOCAB, HIDDEN, HEADS, KV_HEADS, ORIGINAL, MAX_POS = 96, 64, 4, 2, 64, 256


def _build(partial):
    torch.manual_seed(3)
    pairs = int(HIDDEN // HEADS * partial) // 2
    cfg = tf.Phi3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96,
                        num_hidden_layers=2, num_attention_heads=HEADS,
                        num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_POS,
                        original_max_position_embeddings=ORIGINAL,
                        partial_rotary_factor=partial, pad_token_id=0, eos_token_id=1,
                        bos_token_id=2, tie_word_embeddings=False,
                        rope_scaling={"type": "longrope",
                                      "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
                                      "long_factor": [2.0 + 0.5 * i for i in range(pairs)]})
    hf = tf.Phi3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in n else 0.2 * torch.randn_like(p))
    return hf


def _to_gguf(hf, folder, path, partial):
    """convert_hf_to_gguf.py's Phi3 layout: no Q/K permutation (NeoX RoPE), fused tensors kept,
    the LongRoPE factors as tensors, the attention factor as metadata."""
    from safetensors.numpy import load_file

    sd = load_file(str(folder / "model.safetensors"))
    cfg = hf.config
    head_dim = HIDDEN // HEADS
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(MAX_POS)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(int(head_dim * partial))
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_scaling_orig_ctx_len(ORIGINAL)
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(MAX_POS / ORIGINAL)
                                              / math.log(ORIGINAL)))
    rope = cfg.rope_parameters
    w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
    w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for name, hf_name in (("attn_norm", "input_layernorm"), ("attn_qkv", "self_attn.qkv_proj"),
                              ("attn_output", "self_attn.o_proj"),
                              ("ffn_norm", "post_attention_layernorm"),
                              ("ffn_up", "mlp.gate_up_proj"), ("ffn_down", "mlp.down_proj")):
            w.add_tensor(b + name + ".weight", sd[p + hf_name + ".weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=[1.0, 0.5], ids=["phi3", "phi4-partial"])
def phi(request, tmp_path_factory):
    partial = request.param
    hf = _build(partial)
    folder = tmp_path_factory.mktemp("phi")
    hf.save_pretrained(folder)
    _write_tokenizer(folder)
    _to_gguf(hf, folder, folder / "model.gguf", partial)
    return partial, hf, folder




def test_logits_match_transformers(phi):
    """Past the original context transformers takes the long factors, as hybrid does for a
    model whose context exceeds the original one."""
    partial, hf, folder = phi
    ids = [int(t) for t in np.random.default_rng(5).integers(3, VOCAB, ORIGINAL + 16)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()[ORIGINAL + 3:]
    st = load_model(folder, kv_dtype="float32")
    assert st.config.rope_dims == int(HIDDEN // HEADS * partial)
    assert rel_err(_logits(st, ids, ORIGINAL + 4), want) < 1e-4
    mw = read_weights(folder / "model.gguf")
    assert mw.arch == "phi3"
    assert rel_err(_logits(Model(mw, None, kv_dtype="float32"), ids, ORIGINAL + 4), want) < 1e-4


def test_fused_tensors_are_views(phi):
    partial, hf, folder = phi
    mw = read_weights(folder / "model.gguf")
    lw = mw.layers[0]
    for a, b in ((lw.wq, lw.wk), (lw.wk, lw.wv), (lw.w_gate, lw.w_up)):
        assert np.shares_memory(a, a.base) and a.base is b.base  # rows of one mapped tensor


def test_partial_rotary_leaves_the_other_dimensions(rng):
    """rope_dims < head_dim: the dimensions past rope_dims pass through RoPE unchanged, the
    rotated ones match the reference RoPE over the first rope_dims."""
    from hybrid import DecoderConfig, reference
    from hybrid.layer import DecoderLayer
    from hybrid.testing import random_weights

    cfg = DecoderConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                        intermediate_size=32, rope_dims=6, rope_attn_factor=1.3)
    layer = DecoderLayer(cfg, random_weights(cfg, rng))
    x = rng.standard_normal((5, 64)).astype(np.float32)
    pos = np.arange(3, 8)
    before = x.copy()
    layer._rope_part(x, pos, 4, 1.3 ** 2)
    v, b = x.reshape(5, 4, 16), before.reshape(5, 4, 16)
    assert np.array_equal(v[:, :, 6:], b[:, :, 6:])
    want = reference.rope(b[:, :, :6].reshape(5, 24).astype(np.float64), pos, cfg.inv_freq(),
                          4, 6) * 1.3 ** 2
    assert rel_err(v[:, :, :6].reshape(5, 24), want) < 1e-6
    with pytest.raises(ValueError, match="rope_dims must be even"):
        DecoderConfig(hidden_size=64, num_heads=4, head_dim=16, rope_dims=7)
