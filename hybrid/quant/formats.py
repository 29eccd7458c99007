"""Weight formats: one entry per encoding (ggml's type traits, vLLM's linear methods).

A format says how a row of ``in_features`` values is stored (blocks of ``block_values`` values in
``block_bytes`` bytes, GGUF's layouts), which GGUF type id it is, which code the CPU kernels know
it by, and how to quantize float32 rows into it.  Adding a format is one entry here plus its
kernels in ``hybrid/_cpu/quant.h`` (decode, dot product) and a quantizer in ``quantize.py``.
Which backend serves a format is the registry's business: the CPU backend registers
``linear.<name>`` for every format below; a backend without that op says so when asked.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightFormat:
    name: str  # "q4_k": what users write in quantize(..., "q4_k") and load_model(weights=...)
    ggml_type: int  # GGMLQuantizationType id in GGUF files
    kernel_code: int  # HY_Q_* in quant.h
    block_values: int  # values per block
    block_bytes: int  # bytes per block
    integer: bool  # dot products on 8-bit activations (else widen and FMA)
    quantizable: bool = True  # False: served from llama.cpp's files, never written by hybrid

    def row_bytes(self, in_features: int) -> int:
        if in_features % self.block_values:
            raise ValueError(f"{self.name} stores rows in blocks of {self.block_values} values; "
                             f"rows of {in_features} do not split into whole blocks")
        return in_features // self.block_values * self.block_bytes

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.block_bytes / self.block_values

    def __str__(self) -> str:
        return self.name


FORMATS = {f.name: f for f in (
    WeightFormat("float16", 1, 1, 1, 2, False),
    WeightFormat("bfloat16", 30, 2, 1, 2, False),
    WeightFormat("q8_0", 8, 3, 32, 34, True),
    WeightFormat("q4_0", 2, 4, 32, 18, True),
    WeightFormat("q4_1", 3, 5, 32, 20, True),
    WeightFormat("q5_0", 6, 6, 32, 22, True),
    WeightFormat("q5_1", 7, 7, 32, 24, True),
    WeightFormat("q4_k", 12, 8, 256, 144, True),
    WeightFormat("q5_k", 13, 9, 256, 176, True),
    WeightFormat("q6_k", 14, 10, 256, 210, True),
    # llama.cpp's low-bit formats, whose quantizers search scales against an importance matrix:
    # read from files and multiplied in their encoding, not written
    WeightFormat("q2_k", 10, 12, 256, 84, True, quantizable=False),
    WeightFormat("q3_k", 11, 13, 256, 110, True, quantizable=False),
    WeightFormat("iq4_nl", 20, 14, 32, 18, True, quantizable=False),
    WeightFormat("iq4_xs", 23, 15, 256, 136, True, quantizable=False),
)}
ALIASES = {"f16": "float16", "fp16": "float16", "bf16": "bfloat16", "f32": "float32",
           "fp32": "float32"}
BY_GGML_TYPE = {f.ggml_type: f for f in FORMATS.values()}
GGML_F32 = 0
# the formats `load_model(weights=...)` and `quantize` accept ("float32": plain arrays)
TARGETS = ("float32", *(name for name, f in FORMATS.items() if f.quantizable))


def get_format(name) -> WeightFormat:
    """The WeightFormat called ``name`` (case-insensitive; f16/bf16 aliases), or ValueError."""
    if isinstance(name, WeightFormat):
        return name
    key = ALIASES.get(str(name).lower(), str(name).lower())
    fmt = FORMATS.get(key)
    if fmt is None:
        raise ValueError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}")
    return fmt


def fallback_for(in_features: int, preferred: WeightFormat) -> WeightFormat:
    """``preferred``, or the format llama.cpp falls back to when rows do not split into its
    blocks (K formats need multiples of 256: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0)."""
    if in_features % preferred.block_values == 0:
        return preferred
    fallback = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}.get(preferred.name, "q8_0")
    fmt = FORMATS[fallback]
    if in_features % fmt.block_values:
        return FORMATS["float16"]
    return fmt
