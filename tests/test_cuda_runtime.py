"""The CUDA launch layer without a GPU: argument packing, the declared kernel signatures against
the PTX NVRTC emits, split-K planning, availability as a reason.  With a GPU (marker ``gpu``)
the check command runs every GPU path against the CPU."""

import subprocess
import sys

import numpy as np
import pytest

from hybrid._cuda import driver, signatures, variants


class FakeArray:
    def __init__(self, ptr):
        self.ptr = ptr


def test_arguments_are_packed_by_the_declared_signature():
    params, values = signatures.pack("hybrid_rmsnorm_f32",
                                     [FakeArray(0xABC0), None, FakeArray(1 << 40), 576, 1e-5])
    assert params.dtype == np.uint64 and len(params) == 5
    assert [int(p) for p in params] == [values.ctypes.data + 8 * i for i in range(5)]
    assert values[0] == 0xABC0 and values[1] == 0 and values[2] == 1 << 40
    assert values.view(np.int32)[6] == 576  # the low 4 bytes of slot 3
    assert values.view(np.float32)[8] == np.float32(1e-5)
    _, values = signatures.pack("hybrid_add_f32", [None, None, None, (1 << 40) + 3])
    assert values.view(np.int64)[3] == (1 << 40) + 3
    _, values = signatures.pack("hybrid_kv_append_f32",
                                [None] * 4 + [-7, 1 << 33, 2, 128, 16, 4096])
    assert values.view(np.int32)[8] == -7 and values.view(np.int64)[5] == 1 << 33


@pytest.mark.parametrize("args,error,match", [
    ([None, None, None, 1], TypeError, "takes 5 arguments"),
    ([None, None, None, 5, 1e-5, 3], TypeError, "takes 5 arguments"),
    ([0x1000, None, None, 5, 1e-5], TypeError, "argument 0 is a pointer"),
    ([None, None, None, 5.0, 1e-5], TypeError, "argument 3 .i32. must be an integer"),
    ([None, None, None, 1 << 31, 1e-5], OverflowError, "does not fit a C int"),
    ([None, None, None, True, 1e-5], TypeError, "must be a number"),
    ([None, None, None, 5, "x"], TypeError, "must be a number"),
])
def test_bad_launch_arguments_are_refused(args, error, match):
    with pytest.raises(error, match=match):
        signatures.pack("hybrid_rmsnorm_f32", args)
    with pytest.raises(KeyError, match="no declared signature"):
        signatures.pack("hybrid_no_such_kernel", [])


def test_every_kernel_has_a_signature_that_matches_its_ptx():
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python is not installed (pip install '.[cuda]')")
    from hybrid._cuda import compiler

    try:
        compiler.nvrtc_version()
    except Exception as exc:
        pytest.skip(f"the NVRTC library cannot be loaded ({exc})")
    names = {n for spec in variants.all_variants() for n in spec.kernels}
    assert names == set(signatures.SIGNATURES), "declared signatures and compiled kernels differ"
    specs = [variants.elementwise(True), variants.kv_append(False), variants.kv_append(True),
             variants.linear(), variants.paged_attention(128, 4, True, True, True),
             variants.paged_attention(64, 1, False, False), variants.paged_attention(80, 2, True, False)]
    seen = set()
    for spec in specs:
        for name, ptx_types in compiler.ptx_parameters(spec).items():
            declared = [signatures.PTX_TYPES[k] for k in signatures.SIGNATURES[name]]
            assert ptx_types == declared, f"{name}: PTX {ptx_types} vs declared {declared}"
            seen.add(name)
    assert seen == names
    # NVRTC wrote its logs (one byte: empty) into buffers the interpreter shares: the one-byte
    # bytes objects of the whole process must still hold what they hold
    assert bytes([32]).decode() == chr(32) and bytes([0]).decode() == chr(0)


@pytest.mark.parametrize("rows,kvh,keys,sms", [(1, 8, 32768, 132), (64, 8, 4096, 132),
                                                (1, 1, 1, 108), (37, 2, 37, 132),
                                                (1, 8, 300, 132), (512, 8, 512, 16)])
def test_split_planning_covers_every_key(rows, kvh, keys, sms):
    from hybrid._cuda.launch import MIN_KEYS_PER_SPLIT, plan_splits

    splits, split_len = plan_splits(rows, kvh, keys, sms)
    assert splits >= 1 and split_len % 16 == 0
    assert (splits - 1) * split_len < keys <= splits * split_len  # no empty split, none missing
    if splits > 1:
        assert split_len >= MIN_KEYS_PER_SPLIT - 16
        assert rows * kvh * (splits - 1) < 8 * sms  # not more splits than needed to fill the GPU
    if rows == 1 and keys == 32768:
        assert splits * kvh >= 2 * sms  # a single long sequence spreads over the whole GPU


def test_availability_is_a_reason_not_a_crash():
    ok, reason = driver.availability()
    assert isinstance(ok, bool) and reason
    if not ok:
        out = subprocess.run([sys.executable, "-m", "hybrid.tools.gpucheck"], capture_output=True,
                             text=True)
        assert out.returncode == 2 and "CUDA unavailable:" in out.stdout


@pytest.mark.gpu
def test_gpucheck_passes_on_a_gpu():
    ok, reason = driver.availability()
    if not ok:
        pytest.skip(f"no usable GPU: {reason}")
    from hybrid.tools import gpucheck

    assert gpucheck.main(["--quick"]) == 0


def test_gpucheck_reads_the_targets_off_the_timing_rows():
    from hybrid.tools.gpucheck import target_lines

    rows = [(64, 4096, "f16", False, 1.0, 0, 0.85), (64, 4096, "f32", False, 2.0, 0, 0.8),
            (64, 4096, "f16", True, 1.1, 0, 0.7), (1, 32768, "f16", False, 0.5, 0, 0.55)]
    lines = target_lines(rows)
    assert "target met  batch 64 ctx 4096 f16 >= 80% of bandwidth: 85%" in lines
    assert "target MISSED batch 1 ctx 32768 f16 >= 60% of bandwidth: 55%" in lines
    assert "target met  batch 64 ctx 4096 f16 time <= 0.6 x f32: 0.50" in lines
    assert "target MISSED batch 64 ctx 4096 f16 fused RoPE costs <= 5%: +10.0%" in lines
