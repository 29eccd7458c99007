"""The CUDA launch helpers and the GPU check command: without a GPU they say why; with one (marker
``gpu``) every kernel is checked against the CPU."""

import subprocess
import sys

import numpy as np
import pytest

from hybrid._cuda import driver


def test_kernel_arguments_are_packed_with_explicit_types():
    pytest.importorskip("cuda.bindings", reason="cuda-python is not installed (pip install '.[cuda]')")
    from hybrid._cuda.device import Arg, pack_args

    addrs, keep = pack_args([None, Arg.i32(-3), Arg.i64(1 << 40), Arg.f32(0.5), Arg.ptr(0xABC)])
    assert addrs.dtype == np.uint64 and len(addrs) == 5
    assert [k.dtype for k in keep] == [np.uint64, np.int32, np.int64, np.float32, np.uint64]
    assert keep[1][0] == -3 and keep[2][0] == 1 << 40 and keep[4][0] == 0xABC
    assert all(int(a) == k.ctypes.data for a, k in zip(addrs, keep))
    with pytest.raises(TypeError, match="wrap scalars in Arg"):
        pack_args([3])


def test_availability_is_a_reason_not_a_crash():
    ok, reason = driver.availability()
    assert isinstance(ok, bool) and reason
    if not ok:
        out = subprocess.run([sys.executable, "-m", "hybrid.gpucheck"], capture_output=True,
                             text=True)
        assert out.returncode == 2 and "CUDA unavailable:" in out.stdout


@pytest.mark.gpu
def test_gpucheck_passes_on_a_gpu():
    ok, reason = driver.availability()
    if not ok:
        pytest.skip(f"no usable GPU: {reason}")
    from hybrid import gpucheck

    assert gpucheck.main() == 0
