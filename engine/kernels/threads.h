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

// first(t) on each of `threads` threads (t = 0 .. threads - 1); then, once every thread's first is done, second(t),
// each thread the same t (where its first left its work in its caches). Without OpenMP: every first, then every
// second, in order.
template <class First, class Second>
static void each_thread_then(int threads, First first, Second second) {
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    {
      // (fewer threads than asked: each takes a run of the parts, as over_panels does)
      const int t = omp_get_thread_num(), n = omp_get_num_threads(), p0 = threads * t / n, p1 = threads * (t + 1) / n;
      for (int part = p0; part < p1; ++part) first(part);
#pragma omp barrier
      for (int part = p0; part < p1; ++part) second(part);
    }
    return;
  }
#endif
  for (int part = 0; part < threads; ++part) first(part);
  for (int part = 0; part < threads; ++part) second(part);
}
