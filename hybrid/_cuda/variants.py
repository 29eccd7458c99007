"""Every kernel variant hybrid compiles, in one table (the CI compile test walks it all)."""

from __future__ import annotations

import functools

from .compiler import KernelSpec

# head sizes the attention kernels are built for; others are rejected with a clear error
ATTENTION_HEAD_DIMS = (64, 80, 96, 128, 256)
ATTENTION_GROUPS = (1, 2, 3, 4, 5, 6, 7, 8)
ARCHS_CHECKED = ("sm_80", "sm_90")

# The builders are cached: every launch of a variant gets the same KernelSpec object, so the
# device's compiled-function lookup costs one hash, not a new spec.


@functools.cache
def elementwise(neox: bool = True) -> KernelSpec:
    return KernelSpec("elementwise.cu", (("ROPE_NEOX", int(neox)),),
                      ("hybrid_rmsnorm_f32", "hybrid_rope_f32", "hybrid_swiglu_f32",
                       "hybrid_add_f32", "hybrid_copy_f32"))


@functools.cache
def kv_append(f16: bool) -> KernelSpec:
    t = "f16" if f16 else "f32"
    return KernelSpec("kv_append.cu", (("KV_F16", int(f16)),),
                      (f"hybrid_kv_append_{t}", f"hybrid_kv_append_batch_{t}"))


@functools.cache
def linear() -> KernelSpec:
    return KernelSpec("linear.cu", (), ("hybrid_gemv_f32", "hybrid_gemv_split3_f32",
                                        "hybrid_gemv_swiglu_f32", "hybrid_gemm_f32"))


@functools.cache
def paged_attention(head_dim: int, group: int, f16: bool, fused_rope: bool,
                    neox: bool = True) -> KernelSpec:
    if head_dim not in ATTENTION_HEAD_DIMS:
        raise ValueError(f"CUDA paged attention supports head_dim in {ATTENTION_HEAD_DIMS}, "
                         f"got {head_dim}")
    if group not in ATTENTION_GROUPS:
        raise ValueError(f"CUDA paged attention supports GQA groups of 1..8 query heads per "
                         f"KV head, got {group}")
    defines = (("HEAD_DIM", head_dim), ("GROUP", group), ("KV_F16", int(f16)),
               ("FUSED_ROPE", int(fused_rope)), ("ROPE_NEOX", int(neox)))
    return KernelSpec("paged_attention.cu", defines,
                      (attention_kernel(f16), "hybrid_paged_attention_merge_f32"))


def attention_kernel(f16: bool) -> str:
    """The name of the paged-attention kernel for a KV dtype."""
    return "hybrid_paged_attention_f16" if f16 else "hybrid_paged_attention_f32"


def all_variants() -> list:
    """Every variant: what the compile check covers."""
    specs = [elementwise(True), elementwise(False), kv_append(False), kv_append(True), linear()]
    for d in ATTENTION_HEAD_DIMS:
        for g in ATTENTION_GROUPS:
            for f16 in (False, True):
                for fused in (False, True):
                    for neox in ((True, False) if fused else (True,)):
                        specs.append(paged_attention(d, g, f16, fused, neox))
    return specs
