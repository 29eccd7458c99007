"""Real GGUF files for the benchmarks and quantization checks, made on this machine.

``float32_gguf`` writes a model's float32 weights as a GGUF (metadata, tokenizer and tensor names
copied from a source GGUF, so llama.cpp loads it); ``random_llama_gguf`` writes a Llama-3.2-1B-
shaped model with random weights (hidden 2048, 32/8 heads of 64, intermediate 8192, a few
layers, SmolLM2's tokenizer); ``llama_quantize`` runs llama.cpp's own quantizer
(llama_cpp.llama_model_quantize) on such a file, so real Q4_K/Q6_K/Q8_0/... tensors are made by
the peer, not by us.
"""

from __future__ import annotations

import os
import time

import numpy as np

# llama.cpp's file types (llama_ftype)
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12,
          "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30}


def _copy_metadata(reader, writer, arch: str, overrides: dict) -> None:
    from gguf import GGUFValueType

    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment",
                                              "general.file_type") or key in overrides:
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.STRING:
                value = [bytes(field.parts[i]) for i in field.data]
            else:
                value = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_key_value(key, value, kind, sub_type=sub)
        elif kind == GGUFValueType.STRING:
            writer.add_key_value(key, bytes(field.parts[field.data[0]]), kind)
        else:
            writer.add_key_value(key, field.parts[field.data[0]].tolist()[0], kind)
    for key, (value, kind) in overrides.items():
        writer.add_key_value(key, value, kind)


def float32_gguf(src: str, dst: str) -> str:
    """``src`` with every tensor decoded to float32 (norms stay float32), written to ``dst``."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(src, "r")
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(dst, arch)
    _copy_metadata(reader, writer, arch, {})
    for t in reader.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        writer.add_tensor(t.name, np.ascontiguousarray(
            dequantize(t.data, t.tensor_type).reshape(shape), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def copy_tokenizer(src: str, writer) -> int:
    """Copy the tokenizer.* metadata of the GGUF ``src`` into ``writer``; returns its vocabulary
    size."""
    import gguf

    reader = gguf.GGUFReader(src, "r")
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            value = ([bytes(field.parts[i]) for i in field.data] if sub == gguf.GGUFValueType.STRING
                     else [field.parts[i].tolist()[0] for i in field.data])
            writer.add_key_value(key, value, kind, sub_type=sub)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_key_value(key, bytes(field.parts[field.data[0]]), kind)
        else:
            writer.add_key_value(key, field.parts[field.data[0]].tolist()[0], kind)
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def random_llama_gguf(tokenizer_src: str, dst: str, *, layers: int = 4, hidden: int = 2048,
                      heads: int = 32, kv_heads: int = 8, head_dim: int = 64,
                      intermediate: int = 8192, seed: int = 0, context: int = 4096) -> str:
    """A Llama-3.2-1B-shaped float32 GGUF with random weights (std 0.02, unit norms) and the
    tokenizer of ``tokenizer_src``, declaring ``context`` tokens."""
    import gguf

    writer = gguf.GGUFWriter(dst, "llama")
    vocab = copy_tokenizer(tokenizer_src, writer)
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0)
    writer.add_context_length(context)
    writer.add_rope_dimension_count(head_dim)
    rng = np.random.default_rng(seed)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)

    writer.add_tensor("token_embd.weight", mat(vocab, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(p + "attn_q.weight", mat(heads * head_dim, hidden))
        writer.add_tensor(p + "attn_k.weight", mat(kv_heads * head_dim, hidden))
        writer.add_tensor(p + "attn_v.weight", mat(kv_heads * head_dim, hidden))
        writer.add_tensor(p + "attn_output.weight", mat(hidden, heads * head_dim))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(p + "ffn_gate.weight", mat(intermediate, hidden))
        writer.add_tensor(p + "ffn_up.weight", mat(intermediate, hidden))
        writer.add_tensor(p + "ffn_down.weight", mat(hidden, intermediate))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def llama_quantize(src: str, dst: str, ftype: str) -> str:
    """llama.cpp's quantizer: ``src`` (float32 GGUF) -> ``dst`` in ``ftype`` (Q4_K_M, Q8_0, ...)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
    if rc != 0 or not os.path.isfile(dst):
        raise RuntimeError(f"llama_model_quantize({src} -> {ftype}) failed with {rc}")
    return dst


def peer_files(folder: str, names) -> dict:
    """{name: path} for names "smollm2 FT" / "llama1b-shaped FT" (FT one of FTYPES): SmolLM2 (the
    default model, decoded to float32) and the Llama-3.2-1B-shaped random model, quantized by
    llama.cpp's own quantizer into ``folder``; the float32 sources are removed.  Raises
    ModelLoadError when the default model is not installed."""
    from hybrid.models import default_model_path

    src = default_model_path()
    names = list(names)
    sources = {}
    if any(n.split()[0] == "smollm2" for n in names):
        sources["smollm2"] = float32_gguf(src, os.path.join(folder, "smollm2-f32.gguf"))
    if any(n.split()[0] == "llama1b-shaped" for n in names):
        sources["llama1b-shaped"] = random_llama_gguf(src, os.path.join(folder, "llama1b-shaped-f32.gguf"))
    out = {}
    for name in names:
        base, ft = name.split()
        out[name] = llama_quantize(sources[base], os.path.join(folder, f"{base}-{ft}.gguf"), ft)
    for f32 in sources.values():
        os.remove(f32)
    return out


def finish(writer) -> None:
    """Write a GGUFWriter's header, metadata and tensors, and close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def q4_k_m_file(write, folder: str, name: str):
    """(path, how) of a model that ``write(path, quantize_here)`` writes: as float16, then
    quantized to Q4_K_M by llama.cpp's quantizer where llama-cpp-python is installed, else
    written as Q4_K by hybrid's quantizer."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return write(os.path.join(folder, f"{name}-q4_k.gguf"), True), "Q4_K (hybrid's quantizer)"
    src = write(os.path.join(folder, f"{name}-f16.gguf"), False)
    dst = llama_quantize(src, os.path.join(folder, f"{name}-q4_k_m.gguf"), "Q4_K_M")
    os.remove(src)
    return dst, "Q4_K_M (llama.cpp's quantizer)"


def hybrid_rounds(model, prompt, long, new: int, rounds: int = 3):
    """(best prefill tok/s of ``long`` as prompt rows, best decode tok/s of ``new`` tokens after
    ``prompt``) over ``rounds`` rounds of a hybrid Model."""
    prefill, decode = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        model.forward(long, model.new_cache(), role="prompt")  # the engine's prompt rows
        prefill.append(len(long) / (time.perf_counter() - t0))
        model.generate(prompt, new, stop_tokens=[])
        decode.append(model.last_stats.decode_tps)
    return max(prefill), max(decode)


def llama_cpp_rounds(llm, prompt, long, new: int, rounds: int = 3):
    """The same for a llama_cpp.Llama: greedy decode by llm.eval, one token per call."""
    prefill, decode = [], []
    for _ in range(rounds):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(long)
        prefill.append(len(long) / (time.perf_counter() - t0))
        llm.reset()
        llm.eval(prompt)
        tok = prompt[-1]
        t0 = time.perf_counter()
        for _ in range(new):
            llm.eval([tok])
            tok = llama_cpp_next(llm)
        decode.append(new / (time.perf_counter() - t0))
    return max(prefill), max(decode)


def alternating(runners, rounds: int = 3):
    """Call each runner once per round, the order reversed every other round, and keep the best
    of each figure it returns.  This machine's speed drifts by 10-50% over seconds (shared
    cores), so every runner gets a turn in every phase.  Returns one tuple of best figures per
    runner."""
    best = [None] * len(runners)
    for i in range(rounds):
        for k in (range(len(runners)) if i % 2 == 0 else reversed(range(len(runners)))):
            got = runners[k]()
            best[k] = got if best[k] is None else tuple(map(max, best[k], got))
    return best


def side_by_side(model, llm, prompt, long, new: int, rounds: int = 4) -> dict:
    """{"hybrid": (prefill, decode), "llama.cpp": (prefill, decode)}: the best tok/s of a loaded
    hybrid Model and llama_cpp.Llama (None: hybrid only) over ``rounds`` alternating rounds of
    one prefill and one decode each."""
    runners = [lambda: hybrid_rounds(model, prompt, long, new, 1)]
    if llm is not None:
        runners.append(lambda: llama_cpp_rounds(llm, prompt, long, new, 1))
    return dict(zip(("hybrid", "llama.cpp"), alternating(runners, rounds)))


def llama_cpp_next(llm) -> int:
    """llama.cpp's greedy next token, from its context's logits of the last evaluated token
    (Llama.scores holds them only with logits_all)."""
    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
