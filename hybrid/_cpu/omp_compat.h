/* Thread-count helpers that compile with or without OpenMP (HYBRID_NO_OPENMP=1 builds). */
#ifndef HYBRID_OMP_COMPAT_H
#define HYBRID_OMP_COMPAT_H

#ifdef _OPENMP
#include <omp.h>
static inline int hy_have_openmp(void) { return 1; }
static inline int hy_thread_id(void) { return omp_get_thread_num(); }
static inline int hy_omp_max_threads(void) { return omp_get_max_threads(); }
static inline void hy_omp_set_threads(int n) { omp_set_num_threads(n); }
#else
static inline int hy_have_openmp(void) { return 0; }
static inline int hy_thread_id(void) { return 0; }
static inline int hy_omp_max_threads(void) { return 1; }
static inline void hy_omp_set_threads(int n) { (void)n; }
#endif

/* A shared work counter: returns its value before adding n (relaxed order is enough: what a
 * claimed chunk reads and writes is ordered by the parallel region's own barriers). */
static inline long hy_claim(long *counter, long n) {
    return __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

#endif
