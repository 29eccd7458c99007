"""Hostile GGUF files: thousands of seeded mutations of a small quantized model's header and
tensor table, and truncations.  Each load either raises ModelLoadError naming the file or loads
a model that runs; nothing crashes, hangs or allocates more than the file."""

import os
import time

import numpy as np
import pytest

import hybrid
from hybrid.models import ModelLoadError, read_weights
from hybrid.models.model import Model

gguf = pytest.importorskip("gguf")

MUTATIONS = int(os.environ.get("HYBRID_FUZZ_MUTATIONS", "2000"))
SEED = int(os.environ.get("HYBRID_FUZZ_SEED", "20261202"))  # CI's sanitized run uses another


def _small_model(path, extra=None):
    """One layer, hidden 256: Q8_0, Q4_K and Q6_K matrices (made by our quantizer), F32 norms.
    ``extra(writer)`` may add metadata."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "llama")
    if extra is not None:
        extra(w)
    w.add_block_count(1)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_context_length(64)
    mats = {"token_embd.weight": ((40, 256), "q8_0"), "blk.0.attn_q.weight": ((256, 256), "q4_k"),
            "blk.0.attn_k.weight": ((128, 256), "q6_k"), "blk.0.attn_v.weight": ((128, 256), "q8_0"),
            "blk.0.attn_output.weight": ((256, 256), "q4_k"),
            "blk.0.ffn_gate.weight": ((512, 256), "q4_0"), "blk.0.ffn_up.weight": ((512, 256), "q5_k"),
            "blk.0.ffn_down.weight": ((256, 512), "q6_k")}
    for name, (shape, fmt) in mats.items():
        qt = hybrid.quantize(rng.standard_normal(shape).astype(np.float32) * 0.05, fmt)
        w.add_tensor(name, qt.data, raw_shape=qt.data.shape,
                     raw_dtype=gguf.GGMLQuantizationType(qt.format.ggml_type))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        w.add_tensor(name, np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _header_end(path) -> int:
    reader = gguf.GGUFReader(str(path))
    return min(int(t.data_offset) for t in reader.tensors)


def _load_and_run(path):
    try:
        mw = read_weights(path)
    except ModelLoadError as exc:
        assert str(path) in str(exc)
        return False
    model = Model(mw, None, kv_dtype="float32")
    model.logits([1, 2, 3])  # kernels read every tensor: must stay inside the mapped file
    return True


def test_the_model_loads_and_runs(tmp_path):
    path = tmp_path / "m.gguf"
    _small_model(path)
    mw = read_weights(path)
    assert isinstance(mw.layers[0].wq, hybrid.QuantizedTensor) and mw.layers[0].wq.format.name == "q4_k"
    assert np.isfinite(Model(mw, None).logits([1, 2, 3])).all()


def test_mutated_headers_and_tensor_tables(tmp_path):
    src = tmp_path / "m.gguf"
    _small_model(src)
    data = src.read_bytes()
    end = _header_end(src)
    rng = np.random.default_rng(SEED)
    path = tmp_path / "x.gguf"
    loaded = failed = 0
    t0 = time.perf_counter()
    for i in range(MUTATIONS):
        buf = bytearray(data)
        kind = rng.integers(0, 4)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(4, end))
            if kind == 0:  # random bytes
                buf[at] = int(rng.integers(0, 256))
            elif kind == 1:  # a bit flip
                buf[at] ^= 1 << int(rng.integers(0, 8))
            elif kind == 2:  # a huge or negative 64-bit count / dimension / offset
                at -= at % 8
                value = [2**63 - 1, 2**64 - 1, 2**40, 2**32 + 1, 0][int(rng.integers(0, 5))]
                buf[at:at + 8] = value.to_bytes(8, "little")
            else:  # a small integer in a 32-bit field (types, dimension counts)
                at -= at % 4
                buf[at:at + 4] = int(rng.integers(0, 64)).to_bytes(4, "little")
        path.write_bytes(bytes(buf))
        if _load_and_run(path):
            loaded += 1
        else:
            failed += 1
    print(f"{MUTATIONS} mutations: {loaded} loaded and ran, {failed} refused "
          f"in {time.perf_counter() - t0:.1f} s")
    assert failed > MUTATIONS // 4  # most mutations must be caught, not silently loaded


def test_truncated_files(tmp_path):
    src = tmp_path / "m.gguf"
    _small_model(src)
    data = src.read_bytes()
    path = tmp_path / "t.gguf"
    for cut in list(range(0, 64, 7)) + list(np.linspace(64, len(data) - 1, 60).astype(int)):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError):
            read_weights(path)


def test_offset_past_the_end_names_the_tensor(tmp_path):
    src = tmp_path / "m.gguf"
    _small_model(src)
    reader = gguf.GGUFReader(str(src))
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    field_end = int(t.field.offset) + sum(int(p.nbytes) for p in t.field.parts)
    buf = bytearray(src.read_bytes())
    buf[field_end - 8:field_end] = (2**40).to_bytes(8, "little")  # its data offset
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(buf))
    with pytest.raises(ModelLoadError, match=r"tensor blk.0.ffn_down.weight .* needs bytes"):
        read_weights(bad)


@pytest.mark.parametrize("key,value", [("llama.embedding_length", 2**31 + 256),
                                       ("llama.feed_forward_length", 2**32 - 1),
                                       ("llama.context_length", 2**32 - 1)])
def test_metadata_wider_than_every_tensor_is_refused_at_once(tmp_path, key, value):
    """A corrupt width (here 2**31 + 256: head_dim 2**29 + 64) must be refused before anything is
    sized by it: the RoPE table alone would be 4 GiB.  A huge context length allocates nothing
    (the cache is paged) and loads."""
    src = tmp_path / "m.gguf"
    _small_model(src)
    field = gguf.GGUFReader(str(src)).fields[key]
    at = int(field.offset) + sum(int(p.nbytes) for p in field.parts[:-1])  # the uint32 value
    buf = bytearray(src.read_bytes())
    buf[at:at + 4] = value.to_bytes(4, "little")
    bad = tmp_path / "wide.gguf"
    bad.write_bytes(bytes(buf))
    t0 = time.perf_counter()
    if key == "llama.context_length":
        assert read_weights(bad).max_position == value
        return
    with pytest.raises(ModelLoadError, match=rf"{key} = {value} is wider than any tensor in the "
                                             rf"file \(widest dimension 512\)"):
        read_weights(bad)
    assert time.perf_counter() - t0 < 1


def _model_with_up_projection(tmp_path, qtype, block_bytes, scale_offsets, rng):
    """The small model with blk.0.ffn_up.weight [512, 256] as random blocks of ``qtype`` (the
    float16 scales at ``scale_offsets`` set to finite values); returns the path and the blocks."""
    src = tmp_path / "m.gguf"
    _small_model(src)
    reader = gguf.GGUFReader(str(src))
    out = tmp_path / f"{qtype.name}.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    for key, value in (("block_count", 1), ("embedding_length", 256), ("feed_forward_length", 512),
                       ("attention.head_count", 4), ("attention.head_count_kv", 2)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    values_per_block = gguf.GGML_QUANT_SIZES[qtype][0]
    blocks = rng.integers(0, 256, size=(512 * 256 // values_per_block, block_bytes), dtype=np.uint8)
    for off in scale_offsets:
        blocks[:, off:off + 2] = (rng.standard_normal((len(blocks), 1)) * 0.01).astype(np.float16).view(np.uint8)
    for t in reader.tensors:
        if t.name == "blk.0.ffn_up.weight":
            rows = blocks.reshape(512, -1)
            w.add_tensor(t.name, rows, raw_shape=rows.shape, raw_dtype=qtype)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape,
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out, blocks


def test_types_without_kernels_are_reencoded_once(tmp_path):
    """An IQ3_S tensor (no native kernel) loads re-encoded to Q4_K, with one warning."""
    iq3 = gguf.GGMLQuantizationType.IQ3_S
    path, blocks = _model_with_up_projection(tmp_path, iq3, 110, [0], np.random.default_rng(3))
    with pytest.warns(UserWarning, match=r"1 tensors have types without native kernels .*IQ3_S -> q4_k"):
        mw = read_weights(path)
    up = mw.layers[0].w_up
    assert up.format.name == "q4_k"
    want = gguf.quants.dequantize(blocks, iq3).reshape(512, 256)
    err = np.sqrt(((up.dequantize() - want) ** 2).mean()) / np.sqrt((want ** 2).mean())
    assert err < 0.1  # one more 4-bit rounding of 3-bit values
    assert np.isfinite(Model(mw, None).logits([1, 2, 3])).all()


@pytest.mark.parametrize("qtype, block_bytes, scales", [
    ("Q2_K", 84, [80, 82]), ("Q3_K", 110, [108]), ("IQ4_NL", 18, [0]), ("IQ4_XS", 136, [0])])
def test_low_bit_types_are_served_in_place(tmp_path, qtype, block_bytes, scales):
    """Q2_K, Q3_K, IQ4_NL and IQ4_XS tensors are multiplied in their own encoding: the weight is a
    view of the mapped file (no warning, no copy), and the model's logits match the same model
    with that weight decoded by gguf.quants to float32."""
    import warnings

    qt = gguf.GGMLQuantizationType[qtype]
    path, blocks = _model_with_up_projection(tmp_path, qt, block_bytes, scales,
                                             np.random.default_rng(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mw = read_weights(path)
    up = mw.layers[0].w_up
    assert up.format.name == qtype.lower() and up.format.ggml_type == int(qt)
    assert not up.data.flags.writeable  # the read-only mapping itself
    assert np.array_equal(np.asarray(up.data).reshape(-1, block_bytes), blocks)
    want = gguf.quants.dequantize(blocks, qt).reshape(512, 256)
    assert np.array_equal(up.dequantize(), want)
    tokens = [1, 2, 3, 5, 8]
    got = Model(mw, None).logits(tokens)
    mw.layers[0].w_up = want
    ref = Model(mw, None).logits(tokens)
    # the projection multiplies 8-bit activations (seen: 0.9% of the largest logit; without
    # the projection the logits move by more than 100%); its kernels are tested in test_quant
    assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max()


TOKENIZER_MUTATIONS = int(os.environ.get("HYBRID_FUZZ_TOKENIZER_MUTATIONS", "120"))


def test_mutated_tokenizer_metadata(tmp_path):
    """Seeded mutations of the embedded SmolLM2 file's tokenizer metadata (vocabulary, token
    types, merges, special ids, chat template): each load raises ModelLoadError or gives a model
    whose tokenizer encodes, decodes and generates; nothing else escapes (the tokenizers package
    raised its own errors on merges outside the vocabulary)."""
    pytest.importorskip("tokenizers")
    from hybrid.models import default_model_path

    try:
        src = default_model_path()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    reader = gguf.GGUFReader(src)
    names = [k for k in reader.fields if k.startswith("tokenizer.")]
    lo = min(int(reader.fields[k].offset) for k in names)
    hi = max(int(reader.fields[k].offset) + sum(int(p.nbytes) for p in reader.fields[k].parts)
             for k in names)
    ids_at = {k: int(reader.fields[k].offset)
              + sum(int(p.nbytes) for p in reader.fields[k].parts[:-1])
              for k in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")}
    path = tmp_path / "t.gguf"
    path.write_bytes(open(src, "rb").read())
    head = open(src, "rb").read(hi)
    with open(path, "r+b") as f:  # first a BOS id past the vocabulary, named at load
        f.seek(ids_at["tokenizer.ggml.bos_token_id"])
        f.write((2**32 - 1).to_bytes(4, "little"))
    with pytest.raises(ModelLoadError, match=r"tokenizer.ggml.bos_token_id 4294967295 is outside "
                                             r"the vocabulary of 49152 tokens"):
        hybrid.load_model(path)
    rng = np.random.default_rng(SEED)
    refused = 0
    for i in range(TOKENIZER_MUTATIONS):
        buf = bytearray(head)
        kind = int(rng.integers(0, 4))
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(lo, hi))
            if kind == 0:  # random bytes
                buf[at] = int(rng.integers(0, 256))
            elif kind == 1:  # a bit flip
                buf[at] ^= 1 << int(rng.integers(0, 8))
            elif kind == 2:  # a count, length or type id
                at -= at % 4
                buf[at:at + 4] = [2**32 - 1, 2**31, 49152, 0, 1, 9][int(rng.integers(0, 6))] \
                    .to_bytes(4, "little")
            else:  # a special token id past the vocabulary
                at = ids_at[sorted(ids_at)[int(rng.integers(0, 2))]]
                buf[at:at + 4] = [2**32 - 1, 49152, 10**6][int(rng.integers(0, 3))] \
                    .to_bytes(4, "little")
        with open(path, "r+b") as f:
            f.write(buf)
        try:
            model = hybrid.load_model(path)
        except ModelLoadError as exc:
            assert str(path) in str(exc)
            refused += 1
            continue
        ids = model.tokenizer.encode("Hello world, the sky is blue.")
        model.tokenizer.decode(ids)
        model.generate(ids, max_new_tokens=2)
    assert refused > TOKENIZER_MUTATIONS // 4


@pytest.mark.parametrize("key,value,needle", [
    ("llama.rope.freq_base", float("nan"), "rope_theta"),
    ("llama.rope.freq_base", float("inf"), "rope_theta"),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), "rms_norm_eps"),
    ("llama.rope.scaling.factor", 0.0, "factor"),
])
def test_non_finite_or_out_of_range_metadata_is_refused(tmp_path, key, value, needle):
    """Values that would make every logit NaN are refused at load, naming the value."""
    def extra(w):
        if key.endswith("scaling.factor"):
            w.add_string("llama.rope.scaling.type", "linear")
        w.add_float32(key, value)
    path = tmp_path / "m.gguf"
    if key.endswith("layer_norm_rms_epsilon"):  # _small_model sets it: write the file again
        _small_model(path)
        data = bytearray(path.read_bytes())
        i = data.index(key.encode()) + len(key) + 4  # after the name and the value type
        data[i:i + 4] = np.float32(value).tobytes()
        path.write_bytes(bytes(data))
    else:
        _small_model(path, extra)
    with pytest.raises(ModelLoadError, match=needle):
        read_weights(path)


def test_metadata_arrays_stay_numpy_arrays(tmp_path):
    """A scalar array in the header is one numpy array, not a list of Python numbers (about 30
    times the memory for a 150k-token vocabulary's types and scores)."""
    from hybrid.models.gguf_file import read_metadata

    def extra(w):
        w.add_array("tokenizer.ggml.scores", [0.5] * 1000)
        w.add_array("tokenizer.ggml.token_type", [1] * 1000)
    path = tmp_path / "m.gguf"
    _small_model(path, extra)
    md = read_metadata(path)
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        assert isinstance(md[key], np.ndarray) and md[key].shape == (1000,)
