"""DecoderLayer against Hugging Face transformers' own decoder layers on the same random weights.

For each family (Llama; Qwen3 with QK-norm; Qwen2 with q/k/v biases) and each KV dtype: a prefill of
37 tokens, 20 incremental decode steps, then batched decode of 5 sequences of different lengths.
The transformers side runs each whole sequence at once under an explicit causal mask (eager
attention); row t of that is what token t must produce incrementally.
"""

import numpy as np
import pytest

import hybrid
from conftest import rel_err

torch = pytest.importorskip("torch", reason="torch is a test-only reference (pip install '.[test]')")
transformers = pytest.importorskip("transformers", reason="transformers is a test-only reference")

TOL = {"float32": 1e-4, "float16": 5e-3}
SHAPE = dict(hidden_size=384, num_attention_heads=6, num_key_value_heads=2, head_dim=64,
             intermediate_size=512, rms_norm_eps=1e-6)


def _family(name):
    if name == "llama":
        from transformers import LlamaConfig as C
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer as L, LlamaRotaryEmbedding as R
        cfg = C(**SHAPE, rope_theta=10000.0)
    elif name == "qwen3":
        from transformers import Qwen3Config as C
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer as L, Qwen3RotaryEmbedding as R
        cfg = C(**SHAPE, rope_theta=1000000.0)
    else:
        from transformers import Qwen2Config as C
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer as L, Qwen2RotaryEmbedding as R
        cfg = C(**{k: v for k, v in SHAPE.items() if k != "head_dim"}, rope_theta=1000000.0)
    cfg._attn_implementation = "eager"
    return cfg, L, R


def _np(t):
    return None if t is None else t.detach().numpy().astype(np.float32)


def _build(name, rng):
    cfg, Layer, Rotary = _family(name)
    torch.manual_seed(int(rng.integers(2**31)))
    hf = Layer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():  # random everything, norms around 1
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.05 * torch.randn_like(p))
    att = hf.self_attn
    w = hybrid.LayerWeights(
        attn_norm=_np(hf.input_layernorm.weight), mlp_norm=_np(hf.post_attention_layernorm.weight),
        wq=_np(att.q_proj.weight), wk=_np(att.k_proj.weight), wv=_np(att.v_proj.weight),
        wo=_np(att.o_proj.weight), w_gate=_np(hf.mlp.gate_proj.weight),
        w_up=_np(hf.mlp.up_proj.weight), w_down=_np(hf.mlp.down_proj.weight),
        q_norm=_np(getattr(att, "q_norm", None) and att.q_norm.weight),
        k_norm=_np(getattr(att, "k_norm", None) and att.k_norm.weight),
        bq=_np(att.q_proj.bias), bk=_np(att.k_proj.bias), bv=_np(att.v_proj.bias))
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    ours = hybrid.DecoderConfig(hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads,
                                num_kv_heads=cfg.num_key_value_heads, head_dim=hd,
                                intermediate_size=cfg.intermediate_size,
                                rope_theta=cfg.rope_parameters["rope_theta"]
                                if hasattr(cfg, "rope_parameters") and cfg.rope_parameters
                                else cfg.rope_theta,
                                rms_norm_eps=cfg.rms_norm_eps)
    return hf, Rotary(cfg), ours, w


def _hf_sequence(hf, rotary, x):
    """transformers' output for every row of sequence x [n, hidden] (causal)."""
    n = x.shape[0]
    xt = torch.from_numpy(x)[None]
    pos = torch.arange(n)[None]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out = hf(xt, attention_mask=mask, position_ids=pos, position_embeddings=rotary(xt, pos))
    if isinstance(out, tuple):
        out = out[0]
    return out[0].numpy()


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen2"])
def test_prefill_decode_and_batch_match_transformers(rng, family, kv_dtype):
    hf, rotary, cfg, w = _build(family, rng)
    layer = hybrid.DecoderLayer(cfg, w, index=0)
    if family == "qwen3":
        assert layer.weights.q_norm is not None
    if family == "qwen2":
        assert layer.weights.bq is not None

    def new_cache():
        return hybrid.PagedKVCache(num_layers=1, num_kv_heads=cfg.num_kv_heads,
                                   head_dim=cfg.head_dim, block_size=16, dtype=kv_dtype,
                                   poison_unused=True)

    # prefill of 37 tokens then 20 decode steps
    x = rng.standard_normal((57, cfg.hidden_size), dtype=np.float32)
    expect = _hf_sequence(hf, rotary, x)
    cache = new_cache()
    got = [layer.forward(x[:37], np.arange(37), cache)]
    cache.commit(37)
    for t in range(37, 57):
        got.append(layer.forward(x[t:t + 1], [t], cache))
        cache.commit(1)
    got = np.concatenate(got)
    assert rel_err(got[:37], expect[:37]) < TOL[kv_dtype]
    assert rel_err(got[37:], expect[37:]) < TOL[kv_dtype]

    # 5 sequences of different lengths over one pool, 3 decode steps of one row each
    lengths = [1, 16, 17, 29, 5]
    seqs = [rng.standard_normal((n + 3, cfg.hidden_size), dtype=np.float32) for n in lengths]
    pool = hybrid.KVBlockPool(1, cfg.num_kv_heads, cfg.head_dim, 16, kv_dtype,
                              poison_unused=True)
    caches = []
    for n, s in zip(lengths, seqs):
        c = hybrid.PagedKVCache.on(pool)
        layer.forward(s[:n], np.arange(n), c)
        c.commit(n)
        caches.append(c)
    expects = [_hf_sequence(hf, rotary, s) for s in seqs]
    for step in range(3):
        rows = np.stack([s[n + step] for n, s in zip(lengths, seqs)])
        batch = hybrid.StepBatch.plan([(c, 1) for c in caches])
        out = layer.forward_step(rows, batch)
        batch.commit()
        want = np.stack([e[n + step] for n, e in zip(lengths, expects)])
        assert rel_err(out, want) < TOL[kv_dtype], f"batched step {step}"
