"""The C parameter list of every kernel, and the packing of launch arguments by it.

``cuLaunchKernel`` receives ``void **kernelParams``: one address per parameter, from which the
driver copies as many bytes as the parameter's C type has.  A wrong count or width silently
corrupts a launch, so each kernel's parameters are declared here once, launches are packed from
this table (and refused with a clear error when they do not fit), and a CI test compares the
table with the PTX that NVRTC emits for every kernel.

Kinds: ``ptr`` (a device array or buffer, or None for a null pointer), ``i32`` (C int),
``i64`` (C long / long long), ``f32`` (C float).
"""

from __future__ import annotations

import numpy as np

_ATT = ("ptr", "ptr",                       # q, out
        "ptr", "ptr", "ptr", "ptr", "ptr",  # k_table, v_table, k_tables, v_tables, seq_pos
        "i64", "i32",                       # start_pos, rows_per_seq
        "ptr", "ptr", "ptr", "ptr",         # inv_freq, part_m, part_l, part_acc
        "i32", "i32", "i64", "i32", "f32")  # num_heads, block_size, head_stride, split_len, scale
_KV_APPEND = ("ptr", "ptr", "ptr", "ptr", "i32", "i64", "i32", "i32", "i32", "i64")
_KV_APPEND_BATCH = ("ptr",) * 5 + ("i32", "i32", "i32", "i32", "i64")

SIGNATURES = {
    "hybrid_rmsnorm_f32": ("ptr", "ptr", "ptr", "i32", "f32"),
    "hybrid_rope_f32": ("ptr", "ptr", "ptr", "i32", "i32", "i32"),
    "hybrid_swiglu_f32": ("ptr", "ptr", "ptr", "i64"),
    "hybrid_add_f32": ("ptr", "ptr", "ptr", "i64"),
    "hybrid_copy_f32": ("ptr", "ptr", "i64"),
    "hybrid_kv_append_f32": _KV_APPEND,
    "hybrid_kv_append_f16": _KV_APPEND,
    "hybrid_kv_append_batch_f32": _KV_APPEND_BATCH,
    "hybrid_kv_append_batch_f16": _KV_APPEND_BATCH,
    "hybrid_gemv_f32": ("ptr", "ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32"),
    "hybrid_gemv_split3_f32": ("ptr",) * 6 + ("i32",) * 5,
    "hybrid_gemv_swiglu_f32": ("ptr", "ptr", "ptr", "i32", "i32", "i32"),
    "hybrid_gemm_f32": ("ptr", "ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32"),
    "hybrid_paged_attention_f32": _ATT,
    "hybrid_paged_attention_f16": _ATT,
    "hybrid_paged_attention_merge_f32": ("ptr", "ptr", "ptr", "ptr", "i32", "i32"),
}

# the PTX parameter type NVRTC emits for each kind (64-bit pointers and integers are both .u64)
PTX_TYPES = {"ptr": "u64", "i64": "u64", "i32": "u32", "f32": "f32"}

_I32 = (-(1 << 31), (1 << 31) - 1)
_I64 = (-(1 << 63), (1 << 63) - 1)


def pack(name: str, args) -> tuple:
    """(params, storage): ``params`` is the uint64 array of argument addresses for
    ``cuLaunchKernel``; ``storage`` holds the values and must live until the launch returns."""
    sig = SIGNATURES.get(name)
    if sig is None:
        raise KeyError(f"kernel {name!r} has no declared signature in hybrid/_cuda/signatures.py")
    if len(args) != len(sig):
        raise TypeError(f"{name} takes {len(sig)} arguments ({', '.join(sig)}), got {len(args)}")
    values = np.zeros(len(sig), dtype=np.uint64)  # one 8-byte slot per argument
    as_i32, as_i64, as_f32 = values.view(np.int32), values.view(np.int64), values.view(np.float32)
    for i, (kind, a) in enumerate(zip(sig, args)):
        if kind == "ptr":
            if a is None:
                continue
            ptr = getattr(a, "ptr", None)
            if not isinstance(ptr, int):
                raise TypeError(f"{name} argument {i} is a pointer: pass a device array or buffer "
                                f"(or None), not {type(a).__name__}")
            values[i] = ptr
        elif isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer, float, np.floating)):
            raise TypeError(f"{name} argument {i} ({kind}) must be a number, got {type(a).__name__}")
        elif kind == "f32":
            as_f32[2 * i] = a  # the low 4 bytes of the slot (little-endian)
        elif not isinstance(a, (int, np.integer)):
            raise TypeError(f"{name} argument {i} ({kind}) must be an integer, got {a!r}")
        elif kind == "i32":
            if not _I32[0] <= a <= _I32[1]:
                raise OverflowError(f"{name} argument {i} = {a} does not fit a C int")
            as_i32[2 * i] = a
        else:
            if not _I64[0] <= a <= _I64[1]:
                raise OverflowError(f"{name} argument {i} = {a} does not fit a 64-bit integer")
            as_i64[i] = a
    params = values.ctypes.data + 8 * np.arange(len(sig), dtype=np.uint64)
    return params, values
