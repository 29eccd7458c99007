"""Named profiling regions (the seed's ``Block/...`` names), off by default.

    with hybrid.profiling() as prof:
        layer.forward(x, positions, cache)
    print(prof)        # a table of total time, calls and mean time per region

When no profiling block is active, ``region(name)`` returns a shared no-op context manager, so an
instrumented step costs one function call and one ``with``.
"""

from __future__ import annotations

import contextlib
import threading
import time

_active: "Profile | None" = None
_null = contextlib.nullcontext()


class Profile:
    """Per-region totals (seconds) and call counts collected inside ``profiling()``."""

    def __init__(self):
        self.totals: dict = {}
        self.counts: dict = {}
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.totals[name] = self.totals.get(name, 0.0) + seconds
            self.counts[name] = self.counts.get(name, 0) + 1

    def table(self) -> str:
        if not self.totals:
            return "(no regions recorded)"
        width = max(len(n) for n in self.totals)
        total = sum(self.totals.values())
        lines = [f"{'region':<{width}}  {'total ms':>10}  {'calls':>7}  {'mean us':>9}  {'share':>6}"]
        for name, secs in sorted(self.totals.items(), key=lambda kv: -kv[1]):
            calls = self.counts[name]
            lines.append(f"{name:<{width}}  {secs * 1e3:>10.3f}  {calls:>7d}  "
                         f"{secs / calls * 1e6:>9.1f}  {secs / total:>6.1%}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


class _Region:
    __slots__ = ("prof", "name", "t0")

    def __init__(self, prof: Profile, name: str):
        self.prof = prof
        self.name = name

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.prof.add(self.name, time.perf_counter() - self.t0)
        return False


def region(name: str):
    """Context manager timing ``name`` while profiling is on; a no-op otherwise."""
    prof = _active
    if prof is None:
        return _null
    return _Region(prof, name)


def enabled() -> bool:
    return _active is not None


@contextlib.contextmanager
def profiling():
    """Turn profiling on for the block and yield the ``Profile`` that collects it."""
    global _active
    previous = _active
    prof = Profile()
    _active = prof
    try:
        yield prof
    finally:
        _active = previous
