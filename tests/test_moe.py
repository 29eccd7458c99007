"""Mixture-of-experts models: tiny random Mixtral, Qwen3-MoE and OLMoE built with transformers, saved
as safetensors and written as GGUF the way llama.cpp's converter does (experts stacked in
ffn_*_exps tensors), against transformers' float32 logits; every expert chosen at least once;
a batch against each row alone; a decode row reads only the experts it picked."""

import numpy as np
import pytest

from hybrid import Engine
from hybrid.models import Model, load_model, read_weights
from hybrid import ops
from hybrid.moe import ExpertWeights, moe_forward
from hybrid.quant import QuantizedTensor
from conftest import rel_err

torch = pytest.importorskip("torch", reason="torch is a test-only reference")
tf = pytest.importorskip("transformers", reason="transformers is a test-only reference")
gguf = pytest.importorskip("gguf", reason="pip install '.[models]'")
pytest.importorskip("safetensors", reason="pip install '.[models]'")

from hf_convert import permute, prefill_then_decode as _logits  # noqa: E402
from test_models_tiny import _write_tokenizer  # noqa: E402

VOCAB, HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 96, 4, 2, 16, 64


def _build(kind):
    torch.manual_seed(7)
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                  rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False)
    if kind == "mixtral":
        cfg = tf.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2,
                               intermediate_size=48)
        hf = tf.MixtralForCausalLM(cfg)
    elif kind == "olmoe":  # QK-norm over all heads; top-k weights not rescaled
        common.pop("head_dim")
        cfg = tf.OlmoeConfig(**common, num_experts=6, num_experts_per_tok=2, intermediate_size=32,
                             eos_token_id=2, pad_token_id=1,
                             norm_topk_prob=False)
        hf = tf.OlmoeForCausalLM(cfg)
    else:
        cfg = tf.Qwen3MoeConfig(**common, num_experts=6, num_experts_per_tok=2,
                                moe_intermediate_size=32, intermediate_size=48,
                                norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        hf = tf.Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in n else 0.2 * torch.randn_like(p))
    return hf.eval()




def _to_gguf(hf, kind, folder, path, q8_experts=False):
    """What convert_hf_to_gguf.py writes from the saved folder: Mixtral as arch "llama" with
    stacked experts and permuted Q/K; Qwen3-MoE as "qwen3moe", OLMoE as "olmoe"."""
    from safetensors.numpy import load_file

    cfg, sd = hf.config, load_file(str(folder / "model.safetensors"))
    arch = "llama" if kind == "mixtral" else kind
    n_exp = cfg.num_local_experts if kind == "mixtral" else cfg.num_experts
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if kind == "qwen3moe":
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    mlp = "block_sparse_moe" if kind == "mixtral" else "mlp"
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if kind == "mixtral":
            q, k = permute(q, HEADS), permute(k, KV_HEADS)
        else:
            w.add_tensor(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            w.add_tensor(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        for name, t in (("attn_norm", sd[p + "input_layernorm.weight"]), ("attn_q", q),
                        ("attn_k", k), ("attn_v", sd[p + "self_attn.v_proj.weight"]),
                        ("attn_output", sd[p + "self_attn.o_proj.weight"]),
                        ("ffn_norm", sd[p + "post_attention_layernorm.weight"]),
                        ("ffn_gate_inp", sd[p + mlp + ".gate.weight"])):
            w.add_tensor(b + name + ".weight", np.ascontiguousarray(t))
        names = ("w1", "w3", "w2") if kind == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        for gname, hname in zip(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), names):
            stack = np.stack([sd[f"{p}{mlp}.experts.{e}.{hname}.weight"] for e in range(n_exp)])
            if q8_experts and gname != "ffn_down_exps":  # rows of 64: Q8_0 blocks, by gguf
                q8 = gguf.GGMLQuantizationType.Q8_0
                w.add_tensor(b + gname + ".weight", gguf.quants.quantize(stack, q8),
                             raw_dtype=q8)
            else:
                w.add_tensor(b + gname + ".weight", stack)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=["mixtral", "qwen3moe", "olmoe"])
def moe(request, tmp_path_factory):
    kind = request.param
    hf = _build(kind)
    folder = tmp_path_factory.mktemp(kind)
    hf.save_pretrained(folder)
    _write_tokenizer(folder)
    _to_gguf(hf, kind, folder, folder / "model.gguf")
    return kind, hf, folder




def test_logits_match_transformers(moe):
    kind, hf, folder = moe
    # fixed ids, long enough that every expert of every layer is chosen (checked below)
    ids = [int(t) for t in np.random.default_rng(11).integers(3, VOCAB, 80)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()[11:]
    st = load_model(folder, kv_dtype="float32")
    assert rel_err(_logits(st, ids, 12), want) < 1e-4
    mw = read_weights(folder / "model.gguf")
    assert mw.arch == ("llama" if kind == "mixtral" else kind)
    gg = Model(mw, None, kv_dtype="float32")
    assert rel_err(_logits(gg, ids, 12), want) < 1e-4
    for layer in st.layers:  # several experts, each chosen at least once
        assert layer.expert_counts.min() > 0, layer.expert_counts


def test_quantized_experts_stay_in_the_file(moe, tmp_path):
    """Q8_0 stacked experts become one QuantizedTensor per expert over the file's bytes (no
    copy), each decoding as gguf.quants decodes that expert's slice."""
    kind, hf, folder = moe
    path = tmp_path / "q8.gguf"
    _to_gguf(hf, kind, folder, path, q8_experts=True)
    mw = read_weights(path)
    ex = mw.layers[1].experts
    for m in ex.gate + ex.up:
        assert isinstance(m, QuantizedTensor) and m.format.name == "q8_0"
        assert not m.data.flags.owndata and not m.data.flags.writeable  # the read-only map
    reader = gguf.GGUFReader(str(path))
    t = next(t for t in reader.tensors if t.name == "blk.1.ffn_up_exps.weight")
    want = gguf.quants.dequantize(t.data, t.tensor_type)
    for e, m in enumerate(ex.up):
        assert np.array_equal(m.dequantize(), want[e])
    model = Model(mw, None, kv_dtype="float32")
    ids = [5, 17, 33, 2, 90, 41]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1].numpy()
    assert rel_err(model.logits(ids), ref) < 5e-2  # Q8_0 experts: close, not exact


def test_batch_equals_each_row_alone(moe, rng):
    """Greedy tokens of 6 prompts in one engine equal each prompt alone (q8_0 weights: the
    integer kernels are batch invariant; the routing is per row)."""
    kind, hf, folder = moe
    model = load_model(folder, weights="q8_0")
    prompts = [[int(t) for t in rng.integers(3, VOCAB, int(n))] for n in rng.integers(3, 30, 6)]
    alone = [model.generate(p, 10, stop_tokens=[]) for p in prompts]
    batch = Engine(model, max_batch=6, kv_memory="32MiB").generate(prompts, 10, stop_tokens=[])
    assert batch == alone


@pytest.mark.parametrize("weights", [None, "q8_0"])
def test_a_row_alone_equals_its_row_in_a_batch(moe, rng, weights):
    """moe_forward of one row (decode's own path) gives the bits of that row among others, and
    counts the same experts."""
    kind, hf, folder = moe
    model = load_model(folder, weights=weights, kv_dtype="float32")
    layer = model.layers[1]
    ex = layer.weights.experts
    hidden = ex.router.shape[1]
    h = rng.standard_normal((5, hidden), dtype=np.float32)

    def run(x, counts):
        return moe_forward(x, ex, ops.bind("cpu"), "decode", counts)
    counts_batch, counts_alone = np.zeros(len(ex.gate), np.int64), np.zeros(len(ex.gate), np.int64)
    batch = run(h, counts_batch)
    alone = np.concatenate([run(h[i:i + 1], counts_alone) for i in range(len(h))])
    assert np.array_equal(alone, batch)
    assert np.array_equal(counts_alone, counts_batch) and counts_batch.sum() == 5 * ex.top_k


def test_routing_and_checks():
    rng = np.random.default_rng(3)
    e, h = 5, 8
    router = rng.standard_normal((e, h)).astype(np.float32)
    mats = [np.zeros((4, h), np.float32) for _ in range(e)]
    down = [np.zeros((h, 4), np.float32) for _ in range(e)]
    with pytest.raises(ValueError, match="top_k must be in"):
        ExpertWeights(router, mats, mats, down, top_k=6).validated(h)
    with pytest.raises(ValueError, match="router has shape"):
        ExpertWeights(router[:4], mats, mats, down, top_k=2).validated(h)
    with pytest.raises(ValueError, match=r"down\[0\] has shape"):
        ExpertWeights(router, mats, mats, mats, top_k=2).validated(h)


def test_moe_layers_refuse_a_gpu(moe):
    kind, hf, folder = moe
    mw = read_weights(folder)
    with pytest.raises(ValueError, match="mixture-of-experts layers run on the cpu"):
        from hybrid.layer import DecoderLayer
        DecoderLayer(mw.config, mw.layers[0], placement="cuda:0")


def _native_q8_model(folder):
    """The model with q8_0 weights (float16 where a width is not a multiple of 32), whose
    decode rows run the native decode step."""
    model = load_model(folder, weights="q8_0", kv_dtype="float32")
    assert all(layer.buffers.decode_step() is not None for layer in model.layers)
    return model


def test_backend_routing_against_float64():
    """moe_route (the routing of every step, native or op-by-op) picks each row's experts as
    the float64 reference does, ties to the lower id and NaN last, with its weights (a row
    with a NaN score gets NaN weights: its hidden state is broken, and that shows)."""
    from hybrid import reference as ref

    rng = np.random.default_rng()
    k_ = ops.bind("cpu")
    for n, e, top in ((7, 13, 3), (1, 128, 8), (4, 6, 6), (3, 5, 1)):
        s = rng.standard_normal((n, e), dtype=np.float32) * 3
        s[0, :3] = s[0, 3]  # a four-way tie
        s[-1, 1] = np.nan
        for normalize in (True, False):
            ids, w = k_.moe_route(s, top, normalize)
            want_ids, want_w = ref.moe_route(np.where(np.isnan(s), -np.inf, s), top, normalize)
            assert ids.dtype == np.int64 and w.dtype == np.float32
            np.testing.assert_array_equal(ids, want_ids)
            assert rel_err(w[:-1], want_w[:-1]) < 1e-6 and np.isnan(w[-1]).all()
    with pytest.raises(ValueError, match="top_k must be in"):
        k_.moe_route(s, 6, True)


def _steps(model, cache, ids):
    """The logits after ids[:6] as a prompt, then after each further token alone."""
    return np.stack([model.forward(ids[:6], cache)] + [model.forward([t], cache) for t in ids[6:]])


def test_the_native_step_equals_the_op_by_op_path(moe, rng):
    """Decode rows through the native decode step (DecodeLayer with a MoeBlock) give the logits
    and routing counts of the layer-by-layer path (moe_forward, taken while profiling)."""
    import hybrid

    kind, hf, folder = moe
    model = _native_q8_model(folder)
    ids = [int(t) for t in rng.integers(3, VOCAB, 14)]

    def run(profiled):
        cache = model.new_cache()
        before = [layer.expert_counts.copy() for layer in model.layers]
        if profiled:
            with hybrid.profiling():
                got = _steps(model, cache, ids)
        else:
            got = _steps(model, cache, ids)
        return got, [layer.expert_counts - b for layer, b in zip(model.layers, before)]

    native, counts = run(False)
    op_by_op, op_counts = run(True)
    assert np.array_equal(native, op_by_op)
    for a, b in zip(counts, op_counts):
        assert np.array_equal(a, b) and a.sum() > 0


@pytest.mark.parametrize("top_k", [None, 3])
def test_the_native_block_groups_rows_by_expert(moe, rng, top_k):
    """MoeBlock on several rows (pairs grouped by expert) gives each row the bits it gets
    alone and the bits of moe_forward on the same rows, and counts the same experts (also with
    3 experts a row, where the order of a row's sum shows in its bits)."""
    from hybrid._cpu.decode_step import MoeBlock

    kind, hf, folder = moe
    model = _native_q8_model(folder)
    ex = model.layers[1].weights.experts
    if top_k is not None:
        ex = ExpertWeights(ex.router, ex.gate, ex.up, ex.down, top_k, ex.normalize)
    hidden, inter, rows, k = ex.router.shape[1], ex.intermediate_size, 5, ex.top_k
    scratch = [np.full(shape, np.nan, np.float32) for shape in
               ((rows, len(ex.gate)), (rows * k, hidden), (rows * k, inter), (rows * k, inter),
                (rows * k, hidden))]
    counts = np.zeros(len(ex.gate), np.int64)
    enc = [[(m.format.kernel_code, m.data) for m in mats] for mats in (ex.gate, ex.up, ex.down)]
    block = MoeBlock(ex.router, *enc, k, ex.normalize, counts, *scratch, rows)
    h = rng.standard_normal((rows, hidden), dtype=np.float32)
    together = np.full((rows, hidden), np.nan, np.float32)
    block.forward(h, together, 1)
    alone = np.full((rows, hidden), np.nan, np.float32)
    for r in range(rows):
        block.forward(h[r:r + 1], alone[r:r + 1], 2)
    op_counts = np.zeros_like(counts)
    want = moe_forward(h, ex, ops.bind("cpu"), "decode", op_counts)
    assert np.array_equal(together, want) and np.array_equal(alone, want)
    assert np.array_equal(counts, 2 * op_counts) and op_counts.sum() == rows * k
    assert (op_counts > 0).sum() < rows * k  # some expert served several rows


@pytest.mark.parametrize("weights", [None, "q8_0"])
def test_a_decode_row_reads_only_its_experts(moe, rng, weights):
    """Every expert the row did not pick is poisoned with NaN: float32 experts replaced (the
    op-by-op path), q8_0 ones' factors (float16 values where a width is not a multiple of 32)
    overwritten in place (the native decode step).  The row's logits do not change."""
    kind, hf, folder = moe
    model = load_model(folder, kv_dtype="float32") if weights is None \
        else _native_q8_model(folder)
    ids = [int(t) for t in rng.integers(3, VOCAB, 9)]
    cache = model.new_cache()
    model.forward(ids[:8], cache)
    before = [layer.expert_counts.copy() for layer in model.layers]
    want = model.forward(ids[8:], cache)
    cache.truncate(8)
    for layer, b in zip(model.layers, before):
        picked = layer.expert_counts - b
        assert picked.sum() == layer.weights.experts.top_k
        ex = layer.weights.experts
        for e in np.flatnonzero(picked == 0):
            for mats in (ex.gate, ex.up, ex.down):
                m = mats[e]
                if weights is None:
                    mats[e] = np.full_like(m, np.nan)
                elif m.format.name == "q8_0":
                    m.data.reshape(m.shape[0], -1, 34)[:, :, :2] = 0xFF
                else:
                    m.data[...] = 0xFF
    got = model.forward(ids[8:], cache)
    assert np.array_equal(got, want)
