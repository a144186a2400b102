// The CPU kernels' one way of splitting work over threads (panel_gemm.cpp, q8_gemm.cpp, attention.cpp).
#pragma once
#ifdef _OPENMP
#include <omp.h>
#endif

// Whether the work runs on several threads at all (built with OpenMP).
static inline bool runs_parallel() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

// run(p0, p1) over panels 0..n_panels-1: each of `threads` OpenMP threads takes an equal run of consecutive
// panels (give or take one). Built without OpenMP (a compiler without it, as Apple's clang): one thread.
template <class Range>
static void over_panels(long n_panels, int threads, Range run) {
  if (threads > n_panels) threads = (int)n_panels;
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    {
      const long t = omp_get_thread_num(), n = omp_get_num_threads();
      run(n_panels * t / n, n_panels * (t + 1) / n);
    }
    return;
  }
#endif
  run(0L, n_panels);
}

// first(p0, p1) over the panels as over_panels splits them; then, once every thread's first is done, second(p0, p1)
// over the same runs, each thread its own (where its first left them in its caches).
template <class First, class Second>
static void over_panels_then(long n_panels, int threads, First first, Second second) {
  if (threads > n_panels) threads = (int)n_panels;
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    {
      const long t = omp_get_thread_num(), n = omp_get_num_threads();
      const long p0 = n_panels * t / n, p1 = n_panels * (t + 1) / n;
      first(p0, p1);
#pragma omp barrier
      second(p0, p1);
    }
    return;
  }
#endif
  first(0L, n_panels);
  second(0L, n_panels);
}
