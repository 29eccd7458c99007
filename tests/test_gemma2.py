"""Gemma 2: a tiny random model built with transformers (attention-score and final-logit
softcapping, alternating sliding-window and global layers, GeGLU, sandwich norms), saved as
safetensors and written as GGUF the way llama.cpp's converter writes gemma2 files, against
transformers' float32 (eager) logits past the window."""

import numpy as np
import pytest

from hybrid.models import Model, load_model, read_weights
from conftest import rel_err

torch = pytest.importorskip("torch", reason="torch is a test-only reference")
tf = pytest.importorskip("transformers", reason="transformers is a test-only reference")
gguf = pytest.importorskip("gguf", reason="pip install '.[models]'")

from hf_convert import prefill_then_decode as _logits  # noqa: E402
from test_models_tiny import _write_tokenizer  # noqa: E402

VOCAB, WINDOW, LAYERS = 96, 8, 4


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    torch.manual_seed(17)
    cfg = tf.Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, max_position_embeddings=256, sliding_window=WINDOW,
                          query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                          final_logit_softcapping=5.0, attn_implementation="eager")
    hf = tf.Gemma2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.copy_(0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("gemma2")
    hf.save_pretrained(folder)
    _write_tokenizer(folder)
    _to_gguf(hf, folder, folder / "model.gguf")
    return hf, folder


def _to_gguf(hf, folder, path):
    from safetensors.numpy import load_file

    sd = load_file(str(folder / "model.safetensors"))
    cfg = hf.config
    w = gguf.GGUFWriter(str(path), "gemma2")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(WINDOW)
    w.add_attn_logit_softcapping(2.0)
    w.add_final_logit_softcapping(5.0)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"] + 1)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm",
             "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(LAYERS):
        for hf_name, name in names.items():
            t = sd[f"model.layers.{i}.{hf_name}.weight"]
            w.add_tensor(f"blk.{i}.{name}.weight",
                         np.ascontiguousarray(t + 1 if name.endswith("norm") else t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()




def test_logits_match_transformers(gemma2):
    hf, folder = gemma2
    ids = [int(t) for t in np.random.default_rng(6).integers(3, VOCAB, 32)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()[15:]
    st = load_model(folder, kv_dtype="float32")
    assert [layer.config.sliding_window for layer in st.layers] == [WINDOW, 0, WINDOW, 0]
    assert rel_err(_logits(st, ids, 16), want) < 1e-4
    assert np.abs(want).max() <= 5.0  # the final cap holds
    mw = read_weights(folder / "model.gguf")
    assert mw.logit_softcap == 5.0 and mw.config.attn_softcap == 2.0
    assert rel_err(_logits(Model(mw, None, kv_dtype="float32"), ids, 16), want) < 1e-4
