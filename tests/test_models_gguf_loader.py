"""GGUF files as llama.cpp writes them.  A tiny random Llama 3.1 (llama3 RoPE scaling) built
with transformers, written the way llama.cpp's converter (convert_hf_to_gguf.py) writes it: Q/K
rows permuted for adjacent-pair RoPE, the scaling stored as per-pair divisors in
``rope_freqs.weight``.  hybrid's logits must match transformers' float32 logits.  `hybrid info`
names what a file holds that hybrid cannot serve."""

import math
import subprocess
import sys

import numpy as np
import pytest

from hybrid.models import Model, ModelLoadError, read_weights
from conftest import rel_err
from hf_convert import permute, prefill_then_decode

torch = pytest.importorskip("torch", reason="torch is a test-only reference")
tf = pytest.importorskip("transformers", reason="transformers is a test-only reference")
gguf = pytest.importorskip("gguf", reason="pip install '.[models]'")

VOCAB, HEADS, KV_HEADS, HEAD_DIM = 80, 4, 2, 16
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 32}




def _rope_factors(theta: float) -> np.ndarray:
    """What convert_hf_to_gguf.py writes for rope_type llama3 (its generate_extra_tensors)."""
    freqs = 1.0 / (theta ** (np.arange(0, HEAD_DIM, 2, dtype=np.float32) / HEAD_DIM))
    s = SCALING
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / \
                (s["high_freq_factor"] - s["low_freq_factor"])
            out.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def _to_gguf(hf, path, theta, with_factors=True):
    cfg = hf.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    sd = {k: v.detach().float().numpy() for k, v in hf.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    if with_factors:
        w.add_tensor("rope_freqs.weight", _rope_factors(theta))
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf_name, name in names.items():
            t = sd[f"model.layers.{i}.{hf_name}.weight"]
            if name == "attn_q":
                t = permute(t, HEADS)
            elif name == "attn_k":
                t = permute(t, KV_HEADS)
            w.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def llama31(tmp_path_factory):
    torch.manual_seed(31)
    theta = 10000.0
    cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=HEADS,
                         num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=256, rms_norm_eps=1e-6,
                         tie_word_embeddings=False,
                         rope_parameters={"rope_theta": theta, **SCALING})
    hf = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in n else 0.2 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("llama31")
    _to_gguf(hf, folder / "model.gguf", theta)
    _to_gguf(hf, folder / "no_factors.gguf", theta, with_factors=False)
    return hf, folder


def _logits(weights, ids):
    return prefill_then_decode(Model(weights, None, kv_dtype="float32"), ids, 40)


def test_rope_freqs_are_read_and_used(llama31, rng):
    hf, folder = llama31
    ids = [int(t) for t in rng.integers(0, VOCAB, 60)]  # positions well past the original 32
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()[39:]
    assert rel_err(_logits(read_weights(folder / "model.gguf"), ids), want) < 1e-4
    # without the factors the same weights give other logits: the test can tell
    assert rel_err(_logits(read_weights(folder / "no_factors.gguf"), ids), want) > 1e-2


def _small_gguf(path, arch="llama", extra=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_context_length(64)
    for name, shape in {"token_embd.weight": (32, 8), "output_norm.weight": (8,),
                        "blk.0.attn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8),
                        "blk.0.attn_k.weight": (4, 8), "blk.0.attn_v.weight": (4, 8),
                        "blk.0.attn_output.weight": (8, 8), "blk.0.ffn_norm.weight": (8,),
                        "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8),
                        "blk.0.ffn_down.weight": (8, 16)}.items():
        w.add_tensor(name, np.full(shape, 0.1, np.float32))
    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_bad_rope_freqs_are_refused(tmp_path):
    path = _small_gguf(tmp_path / "bad.gguf",
                       extra={"rope_freqs.weight": np.array([1.0, -2.0], np.float32)})
    with pytest.raises(ModelLoadError, match="rope_freqs.weight must hold finite factors"):
        read_weights(path)


def test_info_names_the_architecture_and_what_it_cannot_serve(tmp_path):
    path = _small_gguf(tmp_path / "rwkv.gguf", arch="rwkv6")
    out = subprocess.run([sys.executable, "-m", "hybrid", "info", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "architecture 'rwkv6'" in out.stdout
    assert "cannot serve:" in out.stdout and "unsupported architecture 'rwkv6'" in out.stdout
