// y[m, :] = w * (x[m, :] * r_m), r_m = 1 / sqrt(mean_k x[m, k]^2 + eps): RMSNorm of M rows of D floats, built into
// the panel kernels' library (engine/layers/panel.py) and called by engine/layers/norm.py.
//
// Each row is reduced by the same code in the same order whatever M is, so a row's output is the same bits in a
// one-row decode step as in a verify of k + 1 rows: with the panel GEMM's own row invariance, a verify then
// reproduces plain decoding's hidden states exactly. One call per norm also replaces three to eight torch kernels.
#include <immintrin.h>
#include <math.h>

static inline float sum_of_squares(const float* __restrict x, long D) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  long k = 0;
  for (; k + 32 <= D; k += 32) {
    const __m512 v0 = _mm512_loadu_ps(x + k), v1 = _mm512_loadu_ps(x + k + 16);
    a0 = _mm512_fmadd_ps(v0, v0, a0);
    a1 = _mm512_fmadd_ps(v1, v1, a1);
  }
  for (; k < D; k += 16) {  // the tail, 16 at a time (masked past D)
    const __mmask16 m = D - k >= 16 ? 0xFFFF : (__mmask16)((1u << (D - k)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + k);
    a0 = _mm512_fmadd_ps(v, v, a0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// x, y: [M, D] row-major (y may be x); w: [D].
extern "C" void rms_norm(const float* x, long M, long D, const float* w, float eps, float* y) {
  for (long m = 0; m < M; ++m) {
    const float* xr = x + m * D;
    float* yr = y + m * D;
    const __m512 r = _mm512_set1_ps(1.0f / sqrtf(sum_of_squares(xr, D) / (float)D + eps));
    for (long k = 0; k < D; k += 16) {
      const __mmask16 mk = D - k >= 16 ? 0xFFFF : (__mmask16)((1u << (D - k)) - 1);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, xr + k), r);
      _mm512_mask_storeu_ps(yr + k, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, w + k), v));
    }
  }
}
