// y[m, :] = w * (x[m, :] * r_m), r_m = 1 / sqrt(mean_k x[m, k]^2 + eps): RMSNorm of M rows of D floats, built into
// the panel kernels' library (engine/layers/native.py) and called by engine/layers/norm.py.
//
// Each row is reduced by the same code in the same order whatever M is, so a row's output is the same bits in a
// one-row decode step as in a verify of k + 1 rows: with the panel GEMM's own row invariance, a verify then
// reproduces plain decoding's hidden states exactly. One call per norm also replaces three to eight torch kernels.
#include <math.h>

#include "simd.h"

static inline float sum_of_squares(const float* __restrict x, long D) {
  v16 a0 = v_zero(), a1 = v_zero();
  long k = 0;
  for (; k + 32 <= D; k += 32) {
    const v16 v0 = v_load(x + k), v1 = v_load(x + k + 16);
    a0 = v_fmadd(v0, v0, a0);
    a1 = v_fmadd(v1, v1, a1);
  }
  for (; k < D; k += 16) {  // the tail, 16 at a time (zeros past D)
    const v16 v = v_load_n(x + k, D - k);
    a0 = v_fmadd(v, v, a0);
  }
  return v_sum(v_add(a0, a1));
}

// x, y: [M, D] row-major (y may be x); w: [D].
extern "C" void rms_norm(const float* x, long M, long D, const float* w, float eps, float* y) {
  for (long m = 0; m < M; ++m) {
    const float* xr = x + m * D;
    float* yr = y + m * D;
    const v16 r = v_set1(1.0f / sqrtf(sum_of_squares(xr, D) / (float)D + eps));
    for (long k = 0; k < D; k += 16) {
      const v16 v = v_mul(v_load_n(xr + k, D - k), r);
      v_store_n(yr + k, v_mul(v_load_n(w + k, D - k), v), D - k);
    }
  }
}
