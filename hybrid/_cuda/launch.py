"""The CUDA backend's operations: the same calls as the CPU backend's, on DeviceArrays.

Every function receives arguments already validated by hybrid/ops.py or DecoderLayer (float32,
contiguous, consistent shapes, all on one GPU) and queues kernels on that GPU's stream; nothing
here waits for the GPU except copies back to the host.  Launch shapes:

  rmsnorm          one 256-thread block per row
  rope, swiglu,    grid-stride loops, 256 threads a block
  add, copy
  linear           GEMV (one warp per output feature, every row of x served by one read of the
                   weight row) for up to 8 rows; a 64x64-tiled GEMM above that; both can add
                   a residual in the same pass (linear_residual)
  linear_split3,   GPU-only fusions over stacked weights: Q/K/V in one GEMV, gate/up/SwiGLU in
  linear_swiglu    one GEMV (prefill falls back to GEMMs on views of the stack)
  paged attention  one 128-thread block per (query row, KV head, key split); split-K is planned
                   so that the GPU holds about 8 blocks per SM, partials merged in fp32
"""

from __future__ import annotations

import numpy as np

from . import variants
from .arena import arena
from .arrays import DeviceArray, empty, from_host

THREADS = 256
ATTENTION_THREADS = 128  # WARPS * 32 in paged_attention.cu
GEMV_MAX_ROWS = 8  # GEMV_MAX_ROWS in linear.cu
MIN_KEYS_PER_SPLIT = 256


def _grid(n: int) -> tuple:
    return (max(1, min(65535, -(-n // THREADS))),)


# ------------------------------------------------------------------------------- row ops


def rmsnorm(x: DeviceArray, weight: DeviceArray, eps: float, out: DeviceArray) -> None:
    dev = x.device
    rows, dim = x.shape
    dev.launch(dev.kernel(variants.elementwise(), "hybrid_rmsnorm_f32"), (rows,), (THREADS,),
               [x, weight, out, dim, float(eps)])


_inv_freq_cache: dict = {}


def device_inv_freq(index: int, inv_freq: np.ndarray) -> DeviceArray:
    """[D/2] float64 copy of a RoPE frequency table on GPU ``index`` (uploaded once)."""
    key = (index, inv_freq.tobytes())
    arr = _inv_freq_cache.get(key)
    if arr is None:
        arr = from_host(index, inv_freq, np.float64)
        _inv_freq_cache[key] = arr
    return arr


def _positions(x: DeviceArray, positions, name: str = "positions") -> DeviceArray:
    if isinstance(positions, DeviceArray):
        return positions
    return arena(x.device.index).upload(name, positions, np.int64)


def rope(x: DeviceArray, positions, inv_freq, num_heads: int, head_dim: int, neox: bool) -> None:
    """Rotate x [rows, num_heads*head_dim] in place; positions [rows] int64 (host or device)."""
    dev = x.device
    rows = x.shape[0]
    pos = _positions(x, positions)
    inv = inv_freq if isinstance(inv_freq, DeviceArray) else device_inv_freq(dev.index, inv_freq)
    dev.launch(dev.kernel(variants.elementwise(neox), "hybrid_rope_f32"),
               _grid(rows * num_heads * (head_dim // 2)), (THREADS,),
               [x, pos, inv, rows, num_heads, head_dim])


def swiglu(gate: DeviceArray, up: DeviceArray, out: DeviceArray) -> None:
    dev, n = gate.device, gate.size
    dev.launch(dev.kernel(variants.elementwise(), "hybrid_swiglu_f32"), _grid(n), (THREADS,),
               [gate, up, out, n])


def add(a: DeviceArray, b: DeviceArray, out: DeviceArray) -> None:
    dev, n = a.device, a.size
    dev.launch(dev.kernel(variants.elementwise(), "hybrid_add_f32"), _grid(n), (THREADS,),
               [a, b, out, n])


def copy(a: DeviceArray, out: DeviceArray) -> None:
    dev, n = a.device, a.size
    dev.launch(dev.kernel(variants.elementwise(), "hybrid_copy_f32"), _grid(n), (THREADS,),
               [a, out, n])


def linear(x: DeviceArray, weight: DeviceArray, bias, out: DeviceArray, residual=None) -> None:
    """out [rows, out_f] = x [rows, in_f] @ weight[out_f, in_f].T (+ bias [out_f]) (+ residual
    [rows, out_f], which may be ``out``: the residual connection in the same pass)."""
    dev = x.device
    rows, in_f = x.shape
    out_f = weight.shape[0]
    if rows <= GEMV_MAX_ROWS:
        warps = THREADS // 32  # one output feature per warp
        dev.launch(dev.kernel(variants.linear(), "hybrid_gemv_f32"), (-(-out_f // warps),),
                   (THREADS,), [x, weight, bias, residual, out, rows, in_f, out_f])
    else:
        dev.launch(dev.kernel(variants.linear(), "hybrid_gemm_f32"),
                   (-(-out_f // 64), -(-rows // 64)), (THREADS,),
                   [x, weight, bias, residual, out, rows, out_f, in_f])


def linear_residual(x, weight, bias, residual, out) -> None:
    """out = x @ weight.T (+ bias) + residual, one pass (``residual`` may be ``out``)."""
    linear(x, weight, bias, out, residual)


def linear_split3(x: DeviceArray, weight: DeviceArray, bias, outs) -> None:
    """outs[i] = x @ weight[rows of part i].T (+ bias): weight stacks the three projections
    [n0 + n1 + n2, in] (Q, K, V).  One pass over the weights for decode-sized x."""
    dev = x.device
    rows, in_f = x.shape
    n = [o.shape[1] for o in outs]
    if rows <= GEMV_MAX_ROWS:
        warps = THREADS // 32
        dev.launch(dev.kernel(variants.linear(), "hybrid_gemv_split3_f32"), (-(-sum(n) // warps),),
                   (THREADS,), [x, weight, bias, *outs, rows, in_f, *n])
        return
    start = 0
    for o, k in zip(outs, n):
        linear(x, weight[start:start + k], None if bias is None else bias[start:start + k], o)
        start += k


def linear_swiglu(x: DeviceArray, weight: DeviceArray, gate: DeviceArray, up: DeviceArray) -> None:
    """gate = silu(x @ W_gate.T) * (x @ W_up.T), weight stacking [W_gate; W_up] [2*inter, in];
    ``up`` is scratch for the prefill path."""
    dev = x.device
    rows, in_f = x.shape
    inter = gate.shape[1]
    if rows <= GEMV_MAX_ROWS:
        warps = THREADS // 32
        dev.launch(dev.kernel(variants.linear(), "hybrid_gemv_swiglu_f32"), (-(-inter // warps),),
                   (THREADS,), [x, weight, gate, rows, in_f, inter])
        return
    linear(x, weight[0:inter], None, gate)
    linear(x, weight[inter:2 * inter], None, up)
    swiglu(gate, up, gate)


# ------------------------------------------------------------------------------- KV cache


def kv_append(k: DeviceArray, v: DeviceArray, k_table: DeviceArray, v_table: DeviceArray,
              start: int, num_kv_heads: int, head_dim: int, block_size: int, head_stride: int,
              kv_f16: bool) -> None:
    """Write rows k, v [n, num_kv_heads*head_dim] at positions start.. of a paged layer whose
    device block tables are k_table / v_table (converted to float16 when kv_f16)."""
    dev, n = k.device, k.shape[0]
    name = "hybrid_kv_append_f16" if kv_f16 else "hybrid_kv_append_f32"
    dev.launch(dev.kernel(variants.kv_append(kv_f16), name), _grid(n * num_kv_heads * head_dim),
               (THREADS,), [k, v, k_table, v_table, n, int(start), num_kv_heads, head_dim,
                            block_size, head_stride])


def kv_append_batch(k: DeviceArray, v: DeviceArray, layers, positions, num_kv_heads: int,
                    head_dim: int, block_size: int, head_stride: int, kv_f16: bool) -> None:
    """Write row b of k, v [B, num_kv_heads*head_dim] at positions[b] of cache layer layers[b]
    (device KV blocks whose blocks exist): one launch and one upload of [3, B] int64."""
    dev, B = k.device, k.shape[0]
    meta = np.empty((3, B), dtype=np.int64)
    for b, lb in enumerate(layers):
        meta[0, b], meta[1, b] = lb.table_addresses()
    meta[2] = positions
    m = arena(dev.index).upload("kv_append_meta", meta)
    t = "f16" if kv_f16 else "f32"
    dev.launch(dev.kernel(variants.kv_append(kv_f16), f"hybrid_kv_append_batch_{t}"),
               _grid(B * num_kv_heads * head_dim), (THREADS,),
               [k, v, m[0:1].reshape(B), m[1:2].reshape(B), m[2:3].reshape(B), B, num_kv_heads,
                head_dim, block_size, head_stride])


# ------------------------------------------------------------------------------- attention


def plan_splits(rows: int, num_kv_heads: int, max_keys: int, sm_count: int,
                min_keys: int = MIN_KEYS_PER_SPLIT) -> tuple:
    """(splits, split_len): cut the key range so rows x KV heads x splits fills the GPU with
    about 8 blocks per SM, each split keeping at least ``min_keys`` keys (a multiple of 16)."""
    items = max(1, rows * num_kv_heads)
    want = -(-8 * sm_count // items)
    splits = max(1, min(want, max_keys // min_keys))
    split_len = -(-max_keys // splits)
    split_len = -(-split_len // 16) * 16
    splits = max(1, -(-max_keys // split_len))
    return splits, split_len


def _attention(q, out, k_table, v_table, k_tables, v_tables, seq_pos, start_pos, rows_per_seq,
               max_keys, num_heads, num_kv_heads, head_dim, block_size, head_stride, kv_f16,
               scale, rope):
    dev = q.device
    rows = q.shape[0]
    if rows == 0:
        return
    group = num_heads // num_kv_heads
    inv, neox = (None, True) if rope is None else rope
    spec = variants.paged_attention(head_dim, group, kv_f16, rope is not None, neox)
    if inv is not None and not isinstance(inv, DeviceArray):
        inv = device_inv_freq(dev.index, inv)
    splits, split_len = plan_splits(rows, num_kv_heads, max_keys, dev.sm_count)
    pm = pl = pacc = None
    if splits > 1:
        ar = arena(dev.index)
        pm = ar.get("attn_part_m", (rows, num_heads, splits))
        pl = ar.get("attn_part_l", (rows, num_heads, splits))
        pacc = ar.get("attn_part_acc", (rows, num_heads, splits, head_dim))
    dev.launch(dev.kernel(spec, variants.attention_kernel(kv_f16)), (rows, num_kv_heads, splits),
               (ATTENTION_THREADS,),
               [q, out, k_table, v_table, k_tables, v_tables, seq_pos, int(start_pos),
                rows_per_seq, inv, pm, pl, pacc, num_heads, block_size, head_stride, split_len,
                float(scale)])
    if splits > 1:
        dev.launch(dev.kernel(spec, "hybrid_paged_attention_merge_f32"), (rows, num_heads),
                   (ATTENTION_THREADS,), [pm, pl, pacc, out, num_heads, splits])


def paged_attention(q, start_pos, k_table, v_table, num_heads, num_kv_heads, head_dim,
                    block_size, head_stride, kv_f16, scale, out, rope=None) -> None:
    """One sequence: row i of q [n, num_heads*head_dim] sits at position start_pos + i and sees
    keys 0..start_pos+i through the layer's device block tables (no upload: they persist).
    ``rope`` = (inv_freq, neox) rotates q and each key on the fly (K is cached unrotated)."""
    n = q.shape[0]
    _attention(q, out, k_table, v_table, None, None, None, start_pos, max(n, 1), start_pos + n,
               num_heads, num_kv_heads, head_dim, block_size, head_stride, kv_f16, scale, rope)


def paged_attention_batch(q, positions, k_table_addrs, v_table_addrs, num_heads, num_kv_heads,
                          head_dim, block_size, head_stride, kv_f16, scale, out,
                          rope=None) -> None:
    """Batched decode: row b of q [B, num_heads*head_dim] sits at positions[b] of sequence b,
    whose block tables live at k_table_addrs[b] / v_table_addrs[b] (device addresses).  One
    upload of [3, B] int64 per call."""
    B = q.shape[0]
    if B == 0:
        return
    meta = np.empty((3, B), dtype=np.int64)
    meta[0] = k_table_addrs
    meta[1] = v_table_addrs
    meta[2] = positions
    m = arena(q.device.index).upload("attn_batch_meta", meta)
    _attention(q, out, None, None, m[0:1].reshape(B), m[1:2].reshape(B), m[2:3].reshape(B), 0,
               1, int(np.max(positions)) + 1, num_heads, num_kv_heads, head_dim, block_size,
               head_stride, kv_f16, scale, rope)


# ------------------------------------------------------------------------------- memory


def to_device(array, placement):
    """Move a host array or DeviceArray to ``placement`` (host <-> GPU, GPU -> other GPU)."""
    if placement.is_cpu:
        return array.to_host()
    if isinstance(array, DeviceArray):
        return empty(placement.index, array.shape, array.dtype).copy_from(array)
    return from_host(placement.index, np.asarray(array))


def empty_array(placement, shape, dtype=np.float32) -> DeviceArray:
    return empty(placement.index, shape, dtype)
