"""Build the Cython/OpenMP extension of hybrid.

Environment switches (read at build time):
  HYBRID_NO_OPENMP=1   build serial kernels (a loud warning is printed) instead of failing
                       when the compiler has no usable OpenMP.
  HYBRID_PORTABLE=1    do not tune for the build machine (no -march=native): the wheel runs
                       on any x86-64 / aarch64 CPU, with the scalar fallbacks of simd.h.
  HYBRID_NO_VNNI=1     build the quantized kernels without AVX-512 VNNI / AVX-VNNI (vpdpbusd),
                       to test the plain AVX2 path on a machine that has them.
  HYBRID_NO_AVX512=1   native build without any AVX-512 (AVX2+FMA+F16C at most): the path an
                       AMD Zen 3 runs, testable on a Zen 4 (CI builds it with HYBRID_NO_VNNI=1).
  HYBRID_DEBUG=1       turn Cython's bounds and wraparound checks back on, build with -O0 -g.
"""

import os
from pathlib import Path
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

CPU_MODULES = ["elementwise", "attention", "runtime", "quant", "decode_step"]
HEADERS = sorted(str(p) for p in Path("hybrid/_cpu").glob("*.h"))  # a header change rebuilds
# Row decoding must reproduce gguf.quants bit for bit: no fused multiply-adds from contraction
# (the dot products use explicit FMA intrinsics and are unaffected).  The row kernels of
# rowops.h are compiled the same way in every module that uses them, so a quantized layer's fused
# decode step and its op-by-op path give the same bits (8-bit activations would turn a last-bit
# difference into a whole quantization step).
MODULE_FLAGS = {"quant": ["-ffp-contract=off"], "elementwise": ["-ffp-contract=off"],
                "decode_step": ["-ffp-contract=off"]}

_OMP_PROBE = textwrap.dedent(
    """
    #include <omp.h>
    #include <stdio.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        printf("%d\\n", n);
        return n > 0 ? 0 : 1;
    }
    """
)


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _compiler() -> str:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return cc.split()[0]


def _probe(cflags, ldflags, source: str) -> bool:
    """Compile and run `source`; True when both succeed."""
    cc = _compiler()
    if shutil.which(cc) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        exe = os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(source)
        try:
            subprocess.run([cc, *cflags, src, "-o", exe, *ldflags], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
            subprocess.run([exe], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return False
    return True


def _openmp_flags():
    if _flag("HYBRID_NO_OPENMP"):
        _warn("HYBRID_NO_OPENMP=1: building SERIAL kernels; every kernel will use one core.")
        return [], []
    candidates = [(["-fopenmp"], ["-fopenmp"]), (["-Xpreprocessor", "-fopenmp"], ["-lomp"])]
    for cflags, ldflags in candidates:
        if _probe(cflags, ldflags, _OMP_PROBE):
            return cflags, ldflags
    raise SystemExit(
        "hybrid: the C compiler has no working OpenMP (compile-and-run probe failed).\n"
        "Install OpenMP support (gcc's libgomp, or libomp for clang), or set HYBRID_NO_OPENMP=1 "
        "to build serial kernels."
    )


def _arch_flags():
    if _flag("HYBRID_PORTABLE"):
        return []
    if _probe(["-march=native"], [], "int main(void){return 0;}\n"):
        flags = ["-march=native"]
        if _flag("HYBRID_NO_AVX512"):  # the AVX2 paths on an AVX-512 machine (CI tests both)
            flags += ["-mno-avx512f"]
        if _flag("HYBRID_NO_VNNI"):  # the AVX2 integer kernels on a VNNI machine
            flags += ["-mno-avx512vnni", "-mno-avxvnni"]
        return flags
    if _probe(["-mcpu=native"], [], "int main(void){return 0;}\n"):
        return ["-mcpu=native"]
    _warn("the compiler accepts neither -march=native nor -mcpu=native; building portable kernels.")
    return []


def _warn(message: str) -> None:
    bar = "!" * 78
    print(f"\n{bar}\nWARNING hybrid: {message}\n{bar}\n", file=sys.stderr)


def _extensions():
    debug = _flag("HYBRID_DEBUG")
    omp_c, omp_l = _openmp_flags()
    opt = ["-O0", "-g"] if debug else ["-O3"]
    # -fno-wrapv undoes the -fwrapv that Python's own CFLAGS pass to every extension: with
    # wrapping signed arithmetic the compiler cannot simplify the kernels' index arithmetic;
    # the kernels never rely on signed overflow.
    cflags = [*opt, *omp_c, *_arch_flags(), "-fno-math-errno", "-fno-wrapv",
              "-Wno-unused-function"]
    macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
    exts = [
        Extension(
            f"hybrid._cpu.{name}",
            [f"hybrid/_cpu/{name}.pyx"],
            include_dirs=[np.get_include(), "hybrid/_cpu"],
            depends=HEADERS,
            define_macros=macros,
            extra_compile_args=[*cflags, *MODULE_FLAGS.get(name, [])],
            extra_link_args=[*omp_l],
        )
        for name in CPU_MODULES
    ]
    directives = {
        "language_level": "3",
        "boundscheck": debug,
        "wraparound": debug,
        "cdivision": True,
        "initializedcheck": debug,
        "embedsignature": True,
    }
    return cythonize(exts, compiler_directives=directives, include_path=["hybrid/_cpu"])


setup(ext_modules=_extensions())
