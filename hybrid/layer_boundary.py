"""LayerBoundary: how a decoder layer's arrays cross to and from its device.

A layer takes NumPy arrays or device arrays and answers in kind: a cuda layer given host arrays
copies the input to the GPU and the result back into the caller's ``out`` (or a new host
array); input on another GPU moves over first.  Attention runs where the cache layer lives, so
when that is not the layer's device, q, k and v go there and the output comes back.
"""

from __future__ import annotations

import numpy as np

from . import ops
from .placement import Placement, copy_between, is_device_array


class LayerBoundary:
    """The device boundary of layer ``index`` (hidden_size features) on ``placement``, with its
    staging buffers in ``scratch``."""

    def __init__(self, placement: Placement, scratch, hidden_size: int, index: int):
        self.placement, self.scratch = placement, scratch
        self.hidden_size, self.index = hidden_size, index

    def enter(self, hidden, out):
        """(x, host_out): the input on the layer's device, and the host array to return the
        result in when the caller passed host arrays to a cuda layer (else None)."""
        if self.placement.is_cpu:
            if type(hidden) is not np.ndarray and is_device_array(hidden):
                hidden = hidden.to_host()
            return self.checked(hidden, out), None
        if is_device_array(hidden):
            x = self.checked(hidden, None)
            if out is not None and (not is_device_array(out) or out.placement != self.placement
                                    or out.shape != x.shape or out.dtype != np.float32):
                raise TypeError(f"out must be a float32 device array {x.shape} on {self.placement}")
            if x.placement != self.placement:  # from another GPU
                moved = self.scratch.get("x_in", x.shape, placement=self.placement)
                copy_between(x, moved)
                x = moved
            return x, None
        xh = self.checked(hidden, out)
        x = self.scratch.get("x_in", xh.shape, placement=self.placement)
        copy_between(xh, x)
        return x, (out if out is not None else np.empty(xh.shape, dtype=np.float32))

    def checked(self, hidden, out):
        """hidden as [n, hidden_size] float32 (a copy if converted), ``out`` checked against it."""
        x = ops.as_f32("hidden", hidden, 2)
        if x.shape[1] != self.hidden_size:
            raise ValueError(f"hidden has {x.shape[1]} features; layer {self.index} expects "
                             f"hidden_size={self.hidden_size}")
        if out is not None:
            ops.out_array("forward", out, x.shape)
        return x

    def result(self, x, out, host_out):
        """Where the layer output goes: the caller's ``out``, a device scratch buffer when the
        result is copied to ``host_out``, or a new array on the layer's device."""
        if host_out is not None:
            return self.scratch.get("y", x.shape, placement=self.placement)
        if out is not None:
            return out
        return ops.out_array("forward", None, x.shape, self.placement)

    @staticmethod
    def leave(y, host_out):
        """The layer's answer: y, or y copied into the caller's host array."""
        if host_out is None:
            return y
        copy_between(y, host_out)
        return host_out

    def attend_at(self, where: Placement, q, k, v, append, attention, att):
        """Append k, v to a cache layer on ``where`` (not the layer's device) and attend there:
        q, k, v are copied over, the output back into ``att`` on the layer's device."""
        moved = {}
        for name, a in (("q", q), ("k", k), ("v", v)):
            moved[name] = self.scratch.get(f"{name}_at_cache", a.shape, placement=where)
            copy_between(a, moved[name])
        append(moved["k"], moved["v"])
        out = self.scratch.get("att_at_cache", q.shape, placement=where)
        attention(moved["q"], out, None)
        copy_between(out, att)
        return att
