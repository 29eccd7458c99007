"""Cython/OpenMP kernels of the CPU backend.

OpenMP's default wait policy keeps idle team threads spinning after every parallel region, and
OpenBLAS does the same with its own threads; on a machine with few cores the two pools then take
turns at the cores and a layer step slows down by 5-50x (measured on 2 cores: a 128-token prefill
of 30 SmolLM2-sized layers ran at 99 tokens/s with spinning, 583 with passive waiting).  Unless the
user chose a policy, the kernels' OpenMP threads therefore sleep when idle.  This must be set
before libgomp is loaded, that is, before the first kernel module is imported.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
