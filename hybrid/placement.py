"""Where a layer, a cache layer or an array lives: "cpu" or "cuda:N"."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

_ACCEPTED = "'cpu', 'cuda' (the same as 'cuda:0') or 'cuda:N' with N >= 0"
_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")


@dataclass(frozen=True)
class Placement:
    """A device: ``kind`` is ``"cpu"`` or ``"cuda"``; ``index`` is the GPU ordinal (-1 for CPU)."""

    kind: str
    index: int = -1

    def __post_init__(self):
        if self.kind == "cpu":
            if self.index != -1:
                raise ValueError(f"a cpu placement has no device index (got {self.index})")
        elif self.kind == "cuda":
            if not isinstance(self.index, int) or self.index < 0:
                raise ValueError(f"a cuda placement needs a device index >= 0 (got {self.index!r})")
        else:
            raise ValueError(f"unknown device kind {self.kind!r}; accepted forms: {_ACCEPTED}")

    @classmethod
    def parse(cls, spec: "str | Placement") -> "Placement":
        """Parse ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (a ``Placement`` is returned as is)."""
        if isinstance(spec, Placement):
            return spec
        if not isinstance(spec, str):
            raise ValueError(f"placement must be a string, got {type(spec).__name__}; "
                             f"accepted forms: {_ACCEPTED}")
        text = spec.strip().lower()
        if text == "cpu":
            return cls("cpu")
        m = _CUDA_RE.match(text)
        if m is None:
            raise ValueError(f"invalid placement {spec!r}; accepted forms: {_ACCEPTED}")
        return cls("cuda", int(m.group(1) or 0))

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


CPU = Placement("cpu")


_RAISE = object()


def placement_of(array, default=_RAISE) -> Placement:
    """Where ``array`` lives: NumPy arrays (and lists, scalars) are on the CPU; device arrays
    carry ``.placement``.  Other objects raise TypeError unless a ``default`` is given."""
    if isinstance(array, np.ndarray):
        return CPU
    p = getattr(array, "placement", None)
    if isinstance(p, Placement):
        return p
    if default is not _RAISE:
        return default
    raise TypeError(f"cannot tell where an object of type {type(array).__name__} lives")


def is_device_array(array) -> bool:
    """True for an array in accelerator memory (anything not on the CPU that says where it is)."""
    return not isinstance(array, np.ndarray) and not placement_of(array, CPU).is_cpu


def to_device(array, placement: "str | Placement"):
    """Move ``array`` to ``placement``; the one way arrays cross devices.

    CPU to CPU returns the array itself.  Any other move asks the backend of the destination
    (or source) device for its ``to_device`` operation and raises the registry's error, with
    the reason, when that backend is unavailable.
    """
    dst = Placement.parse(placement)
    src = placement_of(array)
    if src == dst:
        return array
    from . import registry

    device = dst if not dst.is_cpu else src
    return registry.lookup("to_device", device)(array, dst)


def copy_between(src, dst) -> None:
    """Copy ``src`` into ``dst`` (same shape and dtype), wherever each of them lives."""
    if isinstance(dst, np.ndarray):
        if isinstance(src, np.ndarray):
            np.copyto(dst, src)
        else:
            src.to_host(out=dst)
    elif isinstance(src, np.ndarray):
        dst.copy_from_host(src)
    else:
        dst.copy_from(src)
