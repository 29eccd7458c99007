"""Placement parsing, the backend registry and its explanations, threads, and import hygiene."""

import subprocess
import sys

import numpy as np
import pytest

import hybrid
from hybrid import registry
from hybrid.placement import Placement


@pytest.mark.parametrize("text,kind,index", [("cpu", "cpu", -1), ("CPU", "cpu", -1),
                                             ("cuda", "cuda", 0), ("cuda:3", "cuda", 3)])
def test_placement_parse(text, kind, index):
    p = Placement.parse(text)
    assert (p.kind, p.index) == (kind, index)
    assert Placement.parse(str(p)) == p


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:0", "", 3, None])
def test_placement_rejects_with_accepted_forms(bad):
    with pytest.raises(ValueError, match="accepted forms: 'cpu', 'cuda'"):
        Placement.parse(bad)


def test_arrays_carry_placement_and_move_through_one_function():
    a = np.ones(3, np.float32)
    assert hybrid.placement_of(a) == Placement("cpu")
    assert hybrid.to_device(a, "cpu") is a
    with pytest.raises(hybrid.NoBackendError, match="cuda"):
        hybrid.to_device(a, "cuda:0")


def test_registry_lookup_and_status():
    assert callable(registry.lookup("paged_attention", "cpu"))
    status = {s.kind: s for s in hybrid.backend_status()}
    assert status["cpu"].available and "paged_attention" in status["cpu"].ops
    assert not status["cuda"].available and status["cuda"].reason
    with pytest.raises(registry.NoBackendError) as err:
        registry.lookup("no_such_op", "cpu")
    msg = str(err.value)
    assert "'no_such_op'" in msg and "cpu: available" in msg and "cuda: unavailable: " in msg
    with pytest.raises(registry.NoBackendError, match="cuda: unavailable"):
        registry.lookup("rmsnorm", "cuda:1")


def test_failing_backend_is_recorded_not_raised(monkeypatch):
    monkeypatch.setitem(registry.BACKEND_MODULES, "cuda", "hybrid._no_such_backend_module")
    monkeypatch.delitem(registry._loaded, "cuda", raising=False)
    st = {s.kind: s for s in hybrid.backend_status()}["cuda"]
    assert not st.available and "import failed" in st.reason
    registry._loaded.pop("cuda", None)


def test_import_touches_no_cuda_and_no_optional_package():
    code = ("import sys, hybrid; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('cuda', 'torch', 'transformers', 'hybrid._cuda')]; print(bad); sys.exit(bool(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_set_num_threads_sets_openmp_and_blas():
    from threadpoolctl import threadpool_info

    try:
        assert hybrid.set_num_threads(1) == 1
        assert hybrid.get_num_threads() == 1
        blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
        assert blas and all(p["num_threads"] == 1 for p in blas)
        with pytest.raises(ValueError, match="positive integer"):
            hybrid.set_num_threads(0)
    finally:
        hybrid.set_num_threads(None)
    assert hybrid.get_num_threads() == hybrid.threads.usable_cores()


def test_info_command_reports_backends_and_features(tmp_path):
    import os

    # run the package this test imported (installed or built in place), not a bare source tree
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(hybrid.__file__))}
    out = subprocess.run([sys.executable, "-m", "hybrid", "info"], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "CPU features:" in out.stdout and "cpu: available" in out.stdout
    assert "cuda: unavailable: " in out.stdout or "cuda: available" in out.stdout
    assert "CUDA kernels" in out.stdout
