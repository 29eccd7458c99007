"""Every CUDA kernel variant compiles with NVRTC for sm_80 and sm_90, without a warning.

NVRTC and cuda-python work without a GPU or a driver, so this runs in CI; it skips, saying why,
only where cuda-python or the NVRTC library is not installed."""

import os

import pytest

nvrtc = pytest.importorskip("cuda.bindings.nvrtc",
                            reason="cuda-python is not installed (pip install '.[cuda]')")

from hybrid._cuda import compiler, variants  # noqa: E402

try:
    NVRTC_VERSION = compiler.nvrtc_version()
except Exception as exc:  # the NVRTC shared library is missing
    pytest.skip(f"the NVRTC library cannot be loaded ({exc}); pip install nvidia-cuda-nvrtc",
                allow_module_level=True)

SPECS = variants.all_variants()


@pytest.mark.parametrize("arch", variants.ARCHS_CHECKED)
def test_every_variant_compiles_cleanly(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path))
    failures = []
    for spec in SPECS:
        try:
            cubin, log = compiler.compile_spec(spec, arch, use_disk=False)
        except compiler.HybridCudaError as exc:
            failures.append(f"{spec.key}: {exc}")
            continue
        if log:
            failures.append(f"{spec.key}: warnings:\n{log}")
        for name in spec.kernels:
            if name.encode() not in cubin:
                failures.append(f"{spec.key}: kernel {name} missing from the cubin")
    assert not failures, "\n\n".join(failures[:5])
    assert len(SPECS) > 200  # every head size x GQA group x KV dtype x RoPE mode


def test_disk_cache_is_keyed_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRID_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "_memory_cache", {})
    spec = variants.kv_append(True)
    cubin, _ = compiler.compile_spec(spec, "sm_80")
    files = [f for f in os.listdir(tmp_path) if f.endswith(".cubin")]
    assert len(files) == 1 and files[0].startswith("kv_append-KV_F161-sm_80-nvrtc")
    monkeypatch.setattr(compiler, "_memory_cache", {})
    calls = []

    class Recording:
        def __getattr__(self, name):
            if name == "nvrtcCompileProgram":
                calls.append(name)
            return getattr(nvrtc, name)

    monkeypatch.setattr(compiler, "_nvrtc", Recording)
    again, _ = compiler.compile_spec(spec, "sm_80")
    assert again == cubin and not calls  # read back from disk, NVRTC not asked to compile
    compiler.compile_spec(spec, "sm_90")
    assert calls  # another architecture is another key


def test_compile_error_carries_the_full_log(tmp_path, monkeypatch):
    monkeypatch.setattr(compiler, "KERNEL_DIR", str(tmp_path))
    (tmp_path / "broken.cu").write_text('extern "C" __global__ void hybrid_broken() { int x = ; }\n')
    with pytest.raises(compiler.HybridCudaError, match=r"NVRTC_ERROR_COMPILATION(.|\n)*broken.cu"):
        compiler.compile_spec(compiler.KernelSpec("broken.cu"), "sm_90", use_disk=False)


def test_unsupported_head_size_is_rejected():
    with pytest.raises(ValueError, match="head_dim in"):
        variants.paged_attention(72, 4, True, False)
    with pytest.raises(ValueError, match="GQA groups of 1..8"):
        variants.paged_attention(128, 16, True, False)
