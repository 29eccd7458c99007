"""One decoder layer: a decode step (1 token after a 128-token prompt) and a 128-token prefill, for a
SmolLM2-135M-shaped and a Llama-3-8B-shaped layer.  The peer is Hugging Face transformers'
LlamaDecoderLayer (torch eager, float32) on the same weights."""

import numpy as np
import pytest

import hybrid
from hybrid.testing import PRESETS, random_weights
from conftest import paired_time_ratio, record, record_ratio

PROMPT = 128
_fns: dict = {}  # (who, preset, step) -> what its benchmark timed


def _layer(preset):
    cfg = hybrid.DecoderConfig(**PRESETS[preset])
    w = random_weights(cfg, np.random.default_rng(0))
    return cfg, w, hybrid.DecoderLayer(cfg, w)


def _weight_bytes(w):
    return sum(getattr(w, n).nbytes for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"))


def _flops_per_token(cfg, ctx):
    h, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    proj = 2 * h * (2 * q + 2 * kv) + 2 * 3 * h * i
    return proj + 4 * cfg.num_heads * cfg.head_dim * ctx


@pytest.mark.parametrize("preset", ["smollm2-135m", "llama3-8b"])
@pytest.mark.parametrize("step", ["decode", "prefill"])
def test_layer_hybrid(benchmark, read_bandwidth, preset, step):
    cfg, w, layer = _layer(preset)
    rng = np.random.default_rng(1)
    cache = hybrid.PagedKVCache(num_layers=1, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                                dtype="float16")
    x = rng.standard_normal((PROMPT, cfg.hidden_size), dtype=np.float32)
    if step == "decode":
        layer.forward(x, np.arange(PROMPT), cache)
        cache.commit(PROMPT)
        tok = x[:1]

        def run():
            layer.forward(tok, [PROMPT], cache)
            cache.discard_uncommitted()
        flops = _flops_per_token(cfg, PROMPT)
    else:
        def run():
            layer.forward(x, np.arange(PROMPT), cache)
            cache.reset()
        flops = PROMPT * _flops_per_token(cfg, PROMPT / 2)
    benchmark(run)
    record(benchmark, "layer", f"hybrid {preset} {step}", flops=flops,
           bytes_moved=_weight_bytes(w) if step == "decode" else None,
           bandwidth=read_bandwidth, note="weights streamed", fn=run)
    _fns[("hybrid", preset, step)] = run
    _ratio(preset, step)


@pytest.mark.parametrize("preset", ["smollm2-135m", "llama3-8b"])
@pytest.mark.parametrize("step", ["decode", "prefill"])
def test_layer_transformers(benchmark, preset, step):
    torch = pytest.importorskip("torch", reason="torch is the peer's runtime (pip install '.[test]')")
    tf = pytest.importorskip("transformers", reason="transformers is the layer peer")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    from transformers import DynamicCache

    torch.set_num_threads(hybrid.get_num_threads())
    cfg, w, _ = _layer(preset)
    hc = tf.LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads,
                        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                        intermediate_size=cfg.intermediate_size, rms_norm_eps=cfg.rms_norm_eps,
                        rope_theta=cfg.rope_theta)
    hc._attn_implementation = "sdpa"
    hf = LlamaDecoderLayer(hc, layer_idx=0).eval()
    sd = {"input_layernorm.weight": w.attn_norm, "post_attention_layernorm.weight": w.mlp_norm,
          "self_attn.q_proj.weight": w.wq, "self_attn.k_proj.weight": w.wk,
          "self_attn.v_proj.weight": w.wv, "self_attn.o_proj.weight": w.wo,
          "mlp.gate_proj.weight": w.w_gate, "mlp.up_proj.weight": w.w_up,
          "mlp.down_proj.weight": w.w_down}
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    rot = LlamaRotaryEmbedding(hc)
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((1, PROMPT, cfg.hidden_size), dtype=np.float32))
    pos = torch.arange(PROMPT)[None]
    pe = rot(x, pos)
    if step == "decode":
        dc = DynamicCache(config=hc)
        with torch.no_grad():
            hf(x, position_ids=pos, cache=dc, use_cache=True, position_embeddings=pe)
        tok = x[:, :1]
        tpos = torch.tensor([[PROMPT]])
        tpe = rot(tok, tpos)

        def run():
            with torch.no_grad():
                hf(tok, position_ids=tpos, cache=dc, use_cache=True, position_embeddings=tpe)
            dc.crop(-1)  # drop the decoded token again
    else:
        def run():
            with torch.no_grad():
                hf(x, position_ids=pos, position_embeddings=pe)
    benchmark(run)
    record(benchmark, "layer", f"transformers {preset} {step}")
    _fns[("hf", preset, step)] = run
    _ratio(preset, step)


def _ratio(preset, step):
    """Once both sides are benchmarked: the two timed again back to back (paired_time_ratio)."""
    hf, ours = _fns.get(("hf", preset, step)), _fns.get(("hybrid", preset, step))
    if hf and ours:
        del _fns[("hf", preset, step)], _fns[("hybrid", preset, step)]  # (their layers' memory)
        record_ratio("layer", f"speed-up over transformers {preset} {step}",
                     paired_time_ratio(hf, ours), 1.0)
