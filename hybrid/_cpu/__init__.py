"""Cython/OpenMP kernels of the CPU backend.

How idle threads wait decides decode speed.  A decode step is hundreds of short parallel regions
(a SmolLM2 mat-vec takes ~20 us); a thread that sleeps between them costs a futex wake-up of
~50-80 us each time (measured on 2 cores: a 1536x576 Q8_0 mat-vec took 98 us on 2 sleeping
threads, 29 us on one thread, 23 us on 2 threads that spin).  Spinning has a price where OpenBLAS
runs next: OpenMP's and OpenBLAS's pools then take turns at the cores.  So, unless the user chose
a policy: OpenMP threads spin for a bounded count (GOMP_SPINCOUNT=3000, a few microseconds) and
then sleep, and OpenBLAS threads sleep almost at once after a call (OPENBLAS_THREAD_TIMEOUT, set in
hybrid/__init__.py; it only works when hybrid is imported before NumPy loads OpenBLAS).
Quantized models never call BLAS (their prefill runs our int8 GEMM), so they only gain.
Measured on 2 cores (AMD EPYC, AVX2), tokens/s for PASSIVE / spin 20000 / 100000 / 300000:
Llama-1B-shaped Q4_K_M decode -/101/127/138, SmolLM2 Q4_0 decode 44 (Q4_1)/165/171/171; the
float32 SmolLM2 prefill (OpenBLAS) pays: 550/601/464/394.  Since a quantized layer's decode row
is three native calls (quant.DecodeLayer, attention.RaggedStep), the gaps between parallel regions
are a few microseconds and a short spin is enough.  Measured on 2 cores (AMD EPYC family 26,
AVX-512), spin 100000 / 10000 / 3000: float32 SmolLM2 256-token prefill 405-516 / 830 / 860-923
tokens/s; decode unchanged within noise (Llama-1B-shaped Q4_K_M 168/173/170, Q8_0 103/106/126,
SmolLM2 Q4_0 232/243/226).
These must be set before libgomp is loaded, that is, before the first kernel module is imported.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")
