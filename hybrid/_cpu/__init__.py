"""Cython/OpenMP kernels of the CPU backend.

How idle threads wait decides decode speed.  A decode step is many short parallel regions a few
microseconds apart; a thread that sleeps between them pays a futex wake-up each time, longer
than a small mat-vec.  Spinning has a price where OpenBLAS runs next: OpenMP's and OpenBLAS's
pools then take turns at the cores.  So, unless the user chose a policy, OpenMP threads spin
for a bounded count (GOMP_SPINCOUNT=3000, a few microseconds) and then sleep, and OpenBLAS
threads sleep almost at once after a call (OPENBLAS_THREAD_TIMEOUT, set in hybrid/__init__.py;
it only works when hybrid is imported before NumPy loads OpenBLAS).  Quantized models never call
BLAS (their prefill runs our int8 GEMM), so they only gain.
These must be set before libgomp is loaded, that is, before the first kernel module is imported.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")
