"""Gemma 3 (text): a tiny random model built with transformers (GeGLU, sandwich norms, RMSNorm
as x * (1 + w), embeddings scaled by sqrt(hidden), QK-norm, query_pre_attn_scalar, local
sliding-window layers with their own RoPE base between global ones), saved as safetensors and
written as GGUF the way llama.cpp's converter writes gemma3 files (norm weights + 1, every
sixth layer global), against transformers' float32 logits past the window; with Q8_0 weights a
batch equals each prompt alone."""

import numpy as np
import pytest

from hybrid import Engine
from hybrid.models import Model, load_model, read_weights
from conftest import rel_err

torch = pytest.importorskip("torch", reason="torch is a test-only reference")
tf = pytest.importorskip("transformers", reason="transformers is a test-only reference")
gguf = pytest.importorskip("gguf", reason="pip install '.[models]'")

from hf_convert import prefill_then_decode as _logits  # noqa: E402
from test_models_tiny import _write_tokenizer  # noqa: E402

VOCAB, WINDOW, LAYERS = 96, 8, 6
TYPES = ["sliding_attention"] * 5 + ["full_attention"]  # llama.cpp's pattern: every 6th global


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    torch.manual_seed(13)
    cfg = tf.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                              num_hidden_layers=LAYERS, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                              sliding_window=WINDOW, query_pre_attn_scalar=16,
                              layer_types=TYPES, attn_implementation="eager")
    hf = tf.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.copy_(0.2 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("gemma3")
    hf.save_pretrained(folder)
    _write_tokenizer(folder)
    _to_gguf(hf, folder, folder / "model.gguf")
    return hf, folder


def _to_gguf(hf, folder, path):
    from safetensors.numpy import load_file

    sd = load_file(str(folder / "model.safetensors"))
    cfg = hf.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(WINDOW)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"] + 1)
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm",
             "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(LAYERS):
        for hf_name, name in names.items():
            t = sd[f"model.layers.{i}.{hf_name}.weight"]
            if name.endswith("norm"):
                t = t + 1  # convert_hf_to_gguf.py stores Gemma's norms as 1 + w
            w.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()




def test_logits_match_transformers(gemma):
    hf, folder = gemma
    ids = [int(t) for t in np.random.default_rng(4).integers(3, VOCAB, 36)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()[19:]
    st = load_model(folder, kv_dtype="float32")
    assert [layer.config.sliding_window for layer in st.layers] == [WINDOW] * 5 + [0]
    assert rel_err(_logits(st, ids, 20), want) < 1e-4
    mw = read_weights(folder / "model.gguf")
    assert mw.arch == "gemma3" and mw.embed_scale == 8.0
    assert rel_err(_logits(Model(mw, None, kv_dtype="float32"), ids, 20), want) < 1e-4


def test_batch_equals_each_prompt_alone(gemma, rng):
    hf, folder = gemma
    model = load_model(folder, weights="q8_0")
    prompts = [[int(t) for t in rng.integers(3, VOCAB, int(n))] for n in rng.integers(3, 30, 5)]
    alone = [model.generate(p, 20, stop_tokens=[]) for p in prompts]
    batch = Engine(model, max_batch=5, kv_memory="32MiB").generate(prompts, 20, stop_tokens=[])
    assert batch == alone


def test_a_bad_softcap_is_refused(gemma, tmp_path):
    import json
    import shutil

    hf, folder = gemma
    dst = tmp_path / "capped"
    shutil.copytree(folder, dst)
    conf = json.loads((dst / "config.json").read_text())
    conf["final_logit_softcapping"] = -30.0
    (dst / "config.json").write_text(json.dumps(conf))
    from hybrid.models import ModelLoadError
    with pytest.raises(ModelLoadError, match="final_logit_softcapping must be a finite number"):
        load_model(dst)
