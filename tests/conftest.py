"""Shared fixtures: fresh random inputs every run (the seed is printed, so a failure can be replayed
with HYBRID_TEST_SEED=<seed>), and the error measure every numeric test uses."""

import contextlib
import os

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("HYBRID_TEST_SEED", "0")) or int(np.random.SeedSequence().entropy % 2**63)
    print(f"[{request.node.nodeid}] HYBRID_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref|: a scale-free bound that a wrong element cannot hide under.
    NaN anywhere in got counts as an infinite error."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"shape {got.shape} != reference shape {ref.shape}"
    if not np.all(np.isfinite(got)):
        return float("inf")
    scale = np.max(np.abs(ref)) if ref.size else 1.0
    return float(np.max(np.abs(got - ref)) / max(scale, 1e-30)) if ref.size else 0.0


@contextlib.contextmanager
def cuda_kind_served_by(monkeypatch, module: "str | None" = None):
    """For one test, serve device kind "cuda" from ``module`` (default: hybrid's own backend,
    loaded afresh), and forget everything it registered afterwards."""
    from hybrid import registry

    if module is not None:
        monkeypatch.setitem(registry.BACKEND_MODULES, "cuda", module)
    monkeypatch.delitem(registry._loaded, "cuda", raising=False)
    for key in [k for k in registry._table if k[1] == "cuda"]:
        monkeypatch.delitem(registry._table, key)
    try:
        yield
    finally:
        registry._loaded.pop("cuda", None)
        for key in [k for k in registry._table if k[1] == "cuda"]:
            del registry._table[key]
