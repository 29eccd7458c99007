"""Which kernel serves a projection's rows: chosen by what the rows are, not by how many arrive.

A quantized projection has two CPU kernels: the mat-vec (each row's dot products on their own)
and the int8 GEMM (panels of weight rows against many activation rows).  Each gives every row a
result that does not depend on the other rows, but the two round differently.  With role
``auto`` the row count picks one (up to 16 rows mat-vec, more GEMM), so a prompt prefilled in one
piece and the same prompt prefilled in chunks, or a decode row alone and in a batch of 40, could
differ in the last bits.  A step therefore says what its rows are (``StepBatch.role``), and every
projection of the step receives that role as an argument:

    "prompt"   prompt tokens: always the GEMM
    "decode"   generated tokens, the LM head: always the mat-vec

so a request's tokens are the same alone or in any batch, however its prompt is chunked (batch
invariance).  Attention already reduces each row in a fixed order.  Float32 weights: decode rows
take our mat-vec and prompt rows our GEMM, each summing in a fixed order; on builds without
AVX-512 prompt rows of matrices over 1 MiB go to BLAS, which may block rows differently by batch
size, so there float32 prompts are not covered.
"""

from __future__ import annotations

AUTO, PROMPT, DECODE = "auto", "prompt", "decode"
ROLES = (AUTO, PROMPT, DECODE)


def check(role: str) -> str:
    """``role`` if it is one of ROLES, else ValueError naming the choices."""
    if role not in ROLES:
        raise ValueError(f"row role must be one of {ROLES}, got {role!r}")
    return role
