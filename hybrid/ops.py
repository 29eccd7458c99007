"""The public operations of a decoder layer: validate arguments once, dispatch through the registry.

Every op takes float32 row-major arrays: NumPy arrays, or device arrays of a ``cuda:N`` backend
(then every array argument must be on that device, and the result is too).  NumPy input that is
another floating dtype or not C-contiguous is converted (a copy; the caller's array is never
written unless passed as ``out``); a non-floating dtype, a wrong shape or arrays on different
devices raise an error that names the argument.  The backend is chosen by where the arrays live;
ops that read a KV cache run where that cache layer lives.
"""

from __future__ import annotations

import math

import numpy as np

from . import kernel_role, registry
from .kvcache import PagedKVCache
from .placement import CPU, Placement, copy_between, is_device_array, placement_of
from .quant.tensor import QuantizedTensor

_F32 = np.dtype(np.float32)


def as_f32(name: str, x, ndim: "int | None" = None) -> np.ndarray:
    """``x`` as a C-contiguous float32 array (itself when it already is one, or when it is a
    float32 device array)."""
    if type(x) is np.ndarray and x.dtype == _F32 and x.flags.c_contiguous:
        arr = x
    elif is_device_array(x):
        if x.dtype != _F32:
            raise TypeError(f"{name} must be float32, got a {x.dtype} array on {x.placement}")
        arr = x
    else:
        arr = np.asarray(x)
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(f"{name} must be a floating-point array, got dtype {arr.dtype}")
        arr = np.ascontiguousarray(arr, dtype=_F32)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {arr.shape}")
    return arr


def out_array(name: str, out, shape: tuple, where: Placement = CPU):
    """``out`` checked (shape, dtype, device), or a new array on ``where``."""
    if not where.is_cpu:
        if out is None:
            return registry.lookup("empty", where)(where, shape, _F32)
        if placement_of(out, CPU) != where or out.dtype != _F32:
            raise TypeError(f"{name}: out must be a float32 array on {where}")
        if out.shape != shape:
            raise ValueError(f"{name}: out has shape {out.shape}, expected {shape}")
        return out
    if out is None:
        return np.empty(shape, dtype=_F32)
    if not isinstance(out, np.ndarray) or out.dtype != _F32 or not out.flags.c_contiguous \
            or not out.flags.writeable:
        raise TypeError(f"{name}: out must be a writeable C-contiguous float32 ndarray")
    if out.shape != shape:
        raise ValueError(f"{name}: out has shape {out.shape}, expected {shape}")
    return out


def _where(op: str, device, **arrays) -> Placement:
    """The one device all ``arrays`` live on (and ``device``, when given), or a clear error."""
    places = {name: placement_of(a) for name, a in arrays.items() if a is not None}
    where = Placement.parse(device) if device is not None else next(iter(places.values()), CPU)
    for name, p in places.items():
        if p != where:
            raise ValueError(f"{op}: {name} is on {p} but the op runs on {where}; move it with "
                             f"hybrid.to_device({name}, '{where}')")
    return where


def positions_array(positions, n: int) -> np.ndarray:
    """[n] int64 positions, validated."""
    pos = np.asarray(positions)
    if pos.ndim == 0:
        pos = pos.reshape(1)
    if pos.ndim != 1 or pos.shape[0] != n:
        raise ValueError(f"positions has {pos.size} entries for {n} tokens; one position per "
                         f"token is needed")
    if n and not np.issubdtype(pos.dtype, np.integer):
        raise TypeError(f"positions must be integers, got dtype {pos.dtype}")
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    if n and pos.min() < 0:
        raise ValueError(f"positions must be >= 0, got {int(pos.min())}")
    return pos


# ------------------------------------------------------------------------------- row ops


def rmsnorm(x, weight, eps: float, *, out=None, device=None) -> np.ndarray:
    """x [rows, dim] -> x / sqrt(mean(x**2) + eps) * weight [dim], normalised in fp32."""
    x = as_f32("x", x, 2)
    w = as_f32("weight", weight, 1)
    if w.shape[0] != x.shape[1]:
        raise ValueError(f"rmsnorm: weight has {w.shape[0]} entries but rows have {x.shape[1]}")
    where = _where("rmsnorm", device, x=x, weight=w)
    o = out_array("rmsnorm", out, x.shape, where)
    registry.lookup("rmsnorm", where)(x, w, float(eps), o)
    return o


def rope(x, positions, inv_freq, *, num_heads: int, head_dim: int, style: str = "neox",
         out=None, device=None) -> np.ndarray:
    """Rotary embedding of x [rows, num_heads*head_dim] at per-row positions.

    ``inv_freq`` [head_dim/2] float64 holds the angle per position of each pair
    (``1/theta**(2i/head_dim)`` for plain RoPE); ``style`` is "neox" (pairs i, i+head_dim/2) or
    "gptj" (pairs 2i, 2i+1).  Rotates ``out`` in place (``out`` may be ``x``).
    """
    if style not in ("neox", "gptj"):
        raise ValueError(f"rope style must be 'neox' or 'gptj', got {style!r}")
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope needs an even head_dim, got {head_dim}")
    x = as_f32("x", x, 2)
    if x.shape[1] != num_heads * head_dim:
        raise ValueError(f"rope: rows have {x.shape[1]} values, expected num_heads*head_dim = "
                         f"{num_heads}*{head_dim}")
    pos = positions_array(positions, x.shape[0])
    f = np.ascontiguousarray(inv_freq, dtype=np.float64)
    if f.shape != (head_dim // 2,):
        raise ValueError(f"rope: inv_freq must have shape ({head_dim // 2},), got {f.shape}")
    where = _where("rope", device, x=x)
    o = out_array("rope", out, x.shape, where)
    if o is not x:
        copy_between(x, o)
    registry.lookup("rope", where)(o, pos, f, num_heads, head_dim, style == "neox")
    return o


def swiglu(gate, up, *, out=None, device=None) -> np.ndarray:
    """silu(gate) * up, elementwise; gate and up of one shape."""
    g = as_f32("gate", gate)
    u = as_f32("up", up)
    if g.shape != u.shape:
        raise ValueError(f"swiglu: gate {g.shape} and up {u.shape} differ in shape")
    where = _where("swiglu", device, gate=g, up=u)
    o = out_array("swiglu", out, g.shape, where)
    registry.lookup("swiglu", where)(g.reshape(-1), u.reshape(-1), o.reshape(-1))
    return o


def add(a, b, *, out=None, device=None) -> np.ndarray:
    """a + b (the residual connection); ``out`` may be ``a``."""
    a = as_f32("a", a)
    b = as_f32("b", b)
    if a.shape != b.shape:
        raise ValueError(f"add: shapes {a.shape} and {b.shape} differ")
    where = _where("add", device, a=a, b=b)
    o = out_array("add", out, a.shape, where)
    registry.lookup("add", where)(a.reshape(-1), b.reshape(-1), o.reshape(-1))
    return o


def linear(x, weight, bias=None, *, out=None, device=None, role: str = "auto") -> np.ndarray:
    """x [rows, in] @ weight[out, in].T (+ bias [out]) -> [rows, out].

    ``weight`` is a float array or a ``QuantizedTensor``, multiplied in its encoding by the
    backend's ``linear.<format>`` kernel (a backend without one says so).  ``role`` says what
    the rows are ("prompt", "decode" or "auto"), which picks the kernel (hybrid/kernel_role.py)."""
    kernel_role.check(role)
    x = as_f32("x", x, 2)
    quantized = isinstance(weight, QuantizedTensor)
    w = weight if quantized else as_f32("weight", weight, 2)
    if w.shape[1] != x.shape[1]:
        kind = f", {w.format.name}" if quantized else ""
        raise ValueError(f"linear: x has {x.shape[1]} features but weight is {w.shape} "
                         f"([out_features, in_features]{kind})")
    b = None
    if bias is not None:
        b = as_f32("bias", bias, 1)
        if b.shape[0] != w.shape[0]:
            raise ValueError(f"linear: bias has {b.shape[0]} entries for {w.shape[0]} outputs")
    # a quantized weight is read where x is (the CPU backend's kernels for its format)
    where = _where("linear", device, x=x, bias=b, **({} if quantized else {"weight": w}))
    o = out_array("linear", out, (x.shape[0], w.shape[0]), where)
    op = f"linear.{w.format.name}" if quantized else "linear"
    registry.lookup(op, where)(x, w, b, o, role)
    return o


# ------------------------------------------------------------------------------- attention


def _attention_shape(q: np.ndarray, cache: PagedKVCache) -> int:
    d, kvh = cache.head_dim, cache.num_kv_heads
    if q.shape[1] % d or (q.shape[1] // d) % kvh or q.shape[1] == 0:
        raise ValueError(f"q has {q.shape[1]} columns: it must be num_heads*head_dim with "
                         f"head_dim={d} and num_heads a multiple of num_kv_heads={kvh}")
    return q.shape[1] // d


def paged_attention(q, cache: PagedKVCache, layer: int, *, scale: "float | None" = None,
                    out=None, rope=None, window: int = 0, softcap: float = 0.0):
    """Causal attention of q [n_tokens, num_heads*head_dim] over one layer of ``cache``.

    Row i is the token at position ``cache.seq_len + i`` and attends to positions
    ``0 .. cache.seq_len + i`` of the layer (committed plus appended), so the layer must already
    hold ``seq_len + n_tokens`` tokens.  ``scale`` defaults to ``1/sqrt(head_dim)``.
    Runs on the backend of the device where that cache layer lives; q (and out) must be there.
    ``rope`` = (inv_freq [head_dim/2], neox) rotates q and every key by its position inside the
    kernel (CUDA only; the layer's K must then be cached unrotated, as DecoderLayer does).
    ``window`` > 0: each row sees only the last ``window`` positions (sliding-window attention;
    CPU only).  ``softcap`` > 0 caps every score s at softcap * tanh(s / softcap) (Gemma 2;
    CPU only).
    """
    q = as_f32("q", q, 2)
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"paged_attention: window must be an integer >= 0, got {window!r}")
    where = _where("paged_attention", cache.placement(layer), q=q)
    num_heads = _attention_shape(q, cache)
    n = q.shape[0]
    start = cache.seq_len
    held = cache.layer_len(layer)
    if start + n > held:
        raise ValueError(f"paged_attention: {n} query rows from position {start} need "
                         f"{start + n} tokens in layer {layer}, which holds {held}; append k/v "
                         f"first")
    o = out_array("paged_attention", out, q.shape, where)
    k_ptrs, v_ptrs = cache.block_pointers(layer)
    s = 1.0 / math.sqrt(cache.head_dim) if scale is None else float(scale)
    extra = {} if rope is None else {"rope": _rope_arg(rope, cache.head_dim, where)}
    if window:
        if not where.is_cpu:
            raise ValueError("paged_attention: sliding-window attention runs on the cpu only")
        extra["window"] = int(window)
    if softcap:
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"paged_attention: softcap must be a finite number >= 0, got "
                             f"{softcap!r}")
        if not where.is_cpu:
            raise ValueError("paged_attention: score softcapping runs on the cpu only")
        extra["softcap"] = float(softcap)
    registry.lookup("paged_attention", where)(
        q, start, k_ptrs, v_ptrs, num_heads, cache.num_kv_heads, cache.head_dim,
        cache.block_size, cache.head_stride, cache.kv_code, s, o, **extra)
    return o


def _rope_arg(rope, head_dim: int, where: Placement) -> tuple:
    if where.is_cpu:
        raise ValueError("fused RoPE runs inside the CUDA paged-attention kernel only; on the cpu "
                         "rotate q and k with ops.rope before appending")
    inv_freq, neox = rope
    f = np.ascontiguousarray(inv_freq, dtype=np.float64)
    if f.shape != (head_dim // 2,):
        raise ValueError(f"fused RoPE: inv_freq must have shape ({head_dim // 2},), got {f.shape}")
    return f, bool(neox)


class BoundOps:
    """The kernels of one device resolved once, called without argument checks (FlashInfer's
    plan-once, run-many).  For callers that validated their arrays already, such as DecoderLayer:
    every array must be C-contiguous float32 with consistent shapes; ``out`` is required."""

    def __init__(self, device):
        self.device = Placement.parse(device)
        for name in ("rmsnorm", "rope", "swiglu", "add", "linear"):
            setattr(self, "_" + name, registry.lookup(name, self.device))
        self._quantized = {}  # format name -> that format's linear kernel

    def __getattr__(self, name):
        """Kernels only some devices have (the ragged step's, the experts'), resolved on first
        use."""
        if name in ("attend_step", "linear_sets", "moe_route"):
            fn = registry.lookup(name, self.device)
            setattr(self, name, fn)
            return fn
        raise AttributeError(name)

    def rmsnorm(self, x, weight, eps, out):  # x, out [rows, dim]
        self._rmsnorm(x, weight, eps, out)
        return out

    def rope(self, x, positions, inv_freq, num_heads, head_dim, neox):  # in place
        self._rope(x, positions, inv_freq, num_heads, head_dim, neox)
        return x

    def swiglu(self, gate, up, out):
        self._swiglu(gate.reshape(-1), up.reshape(-1), out.reshape(-1))
        return out

    def add(self, a, b, out):
        self._add(a.reshape(-1), b.reshape(-1), out.reshape(-1))
        return out

    def linear(self, x, weight, bias, out, role):  # [rows, in] @ [out, in].T (+ bias) -> out
        if type(weight) is QuantizedTensor:
            fn = self._quantized.get(weight.format.name)
            if fn is None:
                fn = self._quantized[weight.format.name] = registry.lookup(
                    f"linear.{weight.format.name}", self.device)
            fn(x, weight, bias, out, role)
            return out
        self._linear(x, weight, bias, out, role)
        return out


def bind(device) -> BoundOps:
    """Resolve the kernels for ``device`` once (see BoundOps)."""
    return BoundOps(device)


__all__ = ["bind", "BoundOps", "rmsnorm", "rope", "swiglu", "add", "linear", "paged_attention", "as_f32", "positions_array", "Placement"]
