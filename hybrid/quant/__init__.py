"""Weights kept in their encoding: formats, QuantizedTensor, quantize / dequantize."""

from .formats import FORMATS, TARGETS, WeightFormat, fallback_for, get_format
from .quantize import dequantize, quantize
from .tensor import QuantizedTensor, is_quantized

__all__ = ["FORMATS", "TARGETS", "QuantizedTensor", "WeightFormat", "dequantize",
           "fallback_for", "get_format", "is_quantized", "quantize"]
