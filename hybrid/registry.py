"""Backends registered per (operation, device kind), imported lazily, that explain why they can't serve.

A backend is a module with a ``register(registrar)`` function.  Importing it may fail (a missing
optional package, no driver, no device): the failure is recorded as the backend's reason instead
of crashing, and every lookup that needs it reports that reason.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, field

from .placement import Placement

# device kind -> module that registers its operations (imported on first use)
BACKEND_MODULES = {
    "cpu": "hybrid._cpu.backend",
    "cuda": "hybrid._cuda.backend",
}


class BackendUnavailable(RuntimeError):
    """Raised by a backend module's ``register`` when it cannot serve on this machine."""


class NoBackendError(LookupError):
    """No backend serves the requested (operation, device)."""


@dataclass
class BackendStatus:
    kind: str
    module: str
    available: bool
    reason: str = ""
    ops: list = field(default_factory=list)

    def __str__(self) -> str:
        if self.available:
            return f"{self.kind}: available ({len(self.ops)} ops: {', '.join(sorted(self.ops))})"
        return f"{self.kind}: unavailable: {self.reason}"


class _Registrar:
    """Handed to a backend's register(): it records that backend's operations."""

    def __init__(self, kind: str):
        self.kind = kind
        self.ops: dict = {}

    def op(self, name: str, fn) -> None:
        self.ops[name] = fn


_lock = threading.Lock()
_loaded: dict = {}  # kind -> BackendStatus
_table: dict = {}  # (op, kind) -> callable


def _load(kind: str) -> BackendStatus:
    status = _loaded.get(kind)
    if status is not None:
        return status
    with _lock:
        status = _loaded.get(kind)
        if status is not None:
            return status
        module = BACKEND_MODULES[kind]
        try:
            mod = importlib.import_module(module)
            reg = _Registrar(kind)
            mod.register(reg)
        except BackendUnavailable as exc:
            status = BackendStatus(kind, module, False, str(exc))
        except ImportError as exc:
            status = BackendStatus(kind, module, False, f"import failed: {exc}")
        except Exception as exc:  # a broken backend must not take the others down
            status = BackendStatus(kind, module, False, f"{type(exc).__name__}: {exc}")
        else:
            for name, fn in reg.ops.items():
                _table[(name, kind)] = fn
            status = BackendStatus(kind, module, True, "", sorted(reg.ops))
        _loaded[kind] = status
        return status


def lookup(op: str, placement: "str | Placement"):
    """The implementation of ``op`` for ``placement``, or NoBackendError saying why there is none."""
    kind = Placement.parse(placement).kind
    fn = _table.get((op, kind))
    if fn is not None:
        return fn
    status = _load(kind)
    fn = _table.get((op, kind))
    if fn is not None:
        return fn
    raise NoBackendError(_explain(op, kind, status))


def optional(op: str, placement: "str | Placement"):
    """The implementation of ``op`` for ``placement``, or None where its backend has none."""
    try:
        return lookup(op, placement)
    except NoBackendError:
        return None


def require(placement: "str | Placement") -> BackendStatus:
    """Ensure the backend for ``placement`` is usable, else raise NoBackendError with its reason."""
    kind = Placement.parse(placement).kind
    status = _load(kind)
    if not status.available:
        raise NoBackendError(f"no backend can serve {placement}: {status}")
    return status


def _explain(op: str, kind: str, status: BackendStatus) -> str:
    lines = [f"no backend serves operation {op!r} on device kind {kind!r}."]
    if status.available:
        lines.append(f"The {kind} backend is available but does not implement {op!r}.")
    lines.append("Backends:")
    for st in backend_status():
        lines.append(f"  - {st}")
    return "\n".join(lines)


def backend_status() -> list:
    """Every known backend with whether it is available and, if not, why (loads each lazily)."""
    return [_load(kind) for kind in BACKEND_MODULES]
