// Probe (scripts/q4_panel_probe.py): y[m, n] = sum_k x[m, k] * W[n, k] with W = d * q + mn (Q4_1: per 32-k block
// of each column n, d and mn (float16 values, held as fp32), 4-bit q), then one FMA chain over k in order as in the
// float32 panel kernel. gguf dequantises as (d * q) + mn in fp32; d * q is exact there (an 11-bit mantissa times
// a 4-bit integer), so one FMA gives the same weight, and the outputs are the float32 kernel's bits.
// Q: [panels][K][16] bytes (low nibble column j, high nibble column j + 16); D, Mn: [panels][K / 32][32].
#include <immintrin.h>
template <int M, int G>
static inline void q4panels(const float* __restrict x, long K, const unsigned char* __restrict Q,
                            const float* __restrict D, const float* __restrict Mn, float* __restrict y, long ldy) {
  __m512 a0[G][M], a1[G][M];
  for (int g = 0; g < G; ++g) for (int m = 0; m < M; ++m) { a0[g][m] = _mm512_setzero_ps(); a1[g][m] = _mm512_setzero_ps(); }
  const __m128i low = _mm_set1_epi8(0x0F);
  for (long b = 0; b < K / 32; ++b) {
    __m512 d0[G], d1[G], m0[G], m1[G];
    for (int g = 0; g < G; ++g) {
      const float* dp = D + (g * (K / 32) + b) * 32; const float* mp = Mn + (g * (K / 32) + b) * 32;
      d0[g] = _mm512_loadu_ps(dp); d1[g] = _mm512_loadu_ps(dp + 16); m0[g] = _mm512_loadu_ps(mp); m1[g] = _mm512_loadu_ps(mp + 16);
    }
    for (long kk = 0; kk < 32; ++kk) {
      const long k = b * 32 + kk;
      for (int g = 0; g < G; ++g) {
        const unsigned char* q = Q + (g * K + k) * 16;
        _mm_prefetch((const char*)(q + 64 * 16), _MM_HINT_T0);
        const __m128i v = _mm_loadu_si128((const __m128i*)q);
        const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, low)));
        const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), low)));
        const __m512 w0 = _mm512_fmadd_ps(d0[g], q0, m0[g]);
        const __m512 w1 = _mm512_fmadd_ps(d1[g], q1, m1[g]);
        for (int m = 0; m < M; ++m) {
          const __m512 xb = _mm512_set1_ps(x[m * K + k]);
          a0[g][m] = _mm512_fmadd_ps(xb, w0, a0[g][m]);
          a1[g][m] = _mm512_fmadd_ps(xb, w1, a1[g][m]);
        }
      }
    }
  }
  for (int g = 0; g < G; ++g) for (int m = 0; m < M; ++m) {
    _mm512_storeu_ps(y + m * ldy + 32 * g, a0[g][m]); _mm512_storeu_ps(y + m * ldy + 32 * g + 16, a1[g][m]);
  }
}
typedef void (*kern)(const float*, long, const unsigned char*, const float*, const float*, float*, long);
static const kern K1[9] = {0, q4panels<1, 2>, q4panels<2, 2>, q4panels<3, 1>, q4panels<4, 1>, q4panels<5, 1>,
                           q4panels<6, 1>, q4panels<7, 1>, q4panels<8, 1>};
static const int GR[9] = {0, 2, 2, 1, 1, 1, 1, 1, 1};
extern "C" void q4_gemm(const float* x, long M, long K, const unsigned char* Q, const float* D, const float* Mn,
                        float* y, long N) {  // N a multiple of 64, M <= 8
  const long np = N / 32; const int g = GR[M];
  for (long p = 0; p < np; p += g)
    K1[M](x, K, Q + p * K * 16, D + p * (K / 32) * 32, Mn + p * (K / 32) * 32, y + 32 * p, N);
}
