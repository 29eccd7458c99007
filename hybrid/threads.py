"""The one place that decides how many threads the OpenMP kernels and BLAS use."""

from __future__ import annotations

import os

_num_threads: "int | None" = None
_blas_limiter = None


def usable_cores() -> int:
    """CPUs this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _default() -> int:
    env = os.environ.get("HYBRID_NUM_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"HYBRID_NUM_THREADS must be a positive integer, got {env!r}") from None
        if n >= 1:
            return n
        raise ValueError(f"HYBRID_NUM_THREADS must be a positive integer, got {env!r}")
    return usable_cores()


def get_num_threads() -> int:
    """Threads the kernels run on (set_num_threads, else HYBRID_NUM_THREADS, else usable cores)."""
    global _num_threads
    if _num_threads is None:
        _num_threads = _default()
    return _num_threads


def set_num_threads(n: "int | None" = None) -> int:
    """Set the threads of hybrid's OpenMP kernels and of NumPy's BLAS together.

    ``None`` restores the default (HYBRID_NUM_THREADS, else the usable cores).  Returns the count.
    """
    global _num_threads, _blas_limiter
    if n is None:
        n = _default()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"number of threads must be a positive integer, got {n!r}")
    _num_threads = n
    from threadpoolctl import threadpool_limits

    _blas_limiter = threadpool_limits(limits=n, user_api="blas")
    try:
        from ._cpu import runtime

        runtime.omp_set_threads(n)
    except ImportError:
        pass
    return n
