"""Cython/OpenMP kernels of the CPU backend.

How idle threads wait decides small-model decode speed.  A decode step is hundreds of short
parallel regions (a SmolLM2 mat-vec takes ~20 us); a thread that sleeps between them costs a
futex wake-up of ~50-80 us each time (measured on 2 cores: a 1536x576 Q8_0 mat-vec took 98 us on
2 sleeping threads, 29 us on one thread, 23 us on 2 threads that spin briefly).  Spinning without
bound is worse: OpenMP's and OpenBLAS's pools then take turns at the cores and a prefill slows
down 5x.  So, unless the user chose otherwise: OpenMP threads spin for a bounded count
(GOMP_SPINCOUNT, ~10-20 us) and then sleep, and OpenBLAS threads sleep almost at once after a call
(OPENBLAS_THREAD_TIMEOUT, set in hybrid/__init__.py, which only works when hybrid is imported
before NumPy loads OpenBLAS).  Measured on 2 cores, SmolLM2 Q4_1, 256-token prompt: passive
waiting gave 44 decode tok/s and 550 prefill tok/s; this setting 143 and 525-616.
These must be set before libgomp is loaded, that is, before the first kernel module is imported.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "20000")
