// y[m, n] = sum_k x[m, k] * W[n, k] for a few rows m, W stored as panels P[p][k][j] = W[32 p + j, k]
// (zero-padded to a multiple of 32 rows of W). Loaded by engine/layers/panel.py through ctypes.
//
// Every output element is one FMA chain over k = 0..K-1, in that order, whatever the row count M and the
// thread count: a row's products are the same bits in a 1-row step as in a 5-row verify, so a verify
// reproduces plain decoding exactly. The weights stream once per step (bandwidth-bound up to about 8 rows on
// one AVX-512 core); several panels are read at once for few rows (more memory streams in flight).
#include <immintrin.h>
#include <omp.h>

#define PREFETCH_AHEAD 32  // k steps (32 x 128 bytes) ahead of the loads

// G panels at once for M rows (2 G M accumulators). P: the first panel; x: [M, K] (row stride ldx); y: [M, .]
template <int M, int G>
static inline void panels(const float* __restrict x, long ldx, long K, const float* __restrict P,
                          float* __restrict y, long ldy, long width) {
  __m512 a0[G][M], a1[G][M];
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) { a0[g][m] = _mm512_setzero_ps(); a1[g][m] = _mm512_setzero_ps(); }
  const long stride = K * 32;
  for (long k = 0; k < K; ++k) {
    for (int g = 0; g < G; ++g) {
      const float* w = P + g * stride + k * 32;
      _mm_prefetch((const char*)(w + PREFETCH_AHEAD * 32), _MM_HINT_T0);
      _mm_prefetch((const char*)(w + PREFETCH_AHEAD * 32 + 16), _MM_HINT_T0);
      const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
      for (int m = 0; m < M; ++m) {
        const __m512 xb = _mm512_set1_ps(x[m * ldx + k]);
        a0[g][m] = _mm512_fmadd_ps(xb, w0, a0[g][m]);
        a1[g][m] = _mm512_fmadd_ps(xb, w1, a1[g][m]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    const long left = width - 32 * g;  // columns of this panel that exist (the last panel may be short)
    const __mmask16 k0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
    const __mmask16 k1 = left >= 32 ? 0xFFFF : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
    for (int m = 0; m < M; ++m) {
      _mm512_mask_storeu_ps(y + m * ldy + 32 * g, k0, a0[g][m]);
      _mm512_mask_storeu_ps(y + m * ldy + 32 * g + 16, k1, a1[g][m]);
    }
  }
}

typedef void (*kernel)(const float*, long, long, const float*, float*, long, long);
#define GROUP(m) ((m) <= 2 ? 4 : (m) <= 6 ? 2 : 1)  // panels per call: at most 24 accumulators
static const kernel ONE[9] = {0, panels<1, 1>, panels<2, 1>, panels<3, 1>, panels<4, 1>,
                              panels<5, 1>, panels<6, 1>, panels<7, 1>, panels<8, 1>};
static const kernel GROUPED[9] = {0, panels<1, GROUP(1)>, panels<2, GROUP(2)>, panels<3, GROUP(3)>,
                                  panels<4, GROUP(4)>, panels<5, GROUP(5)>, panels<6, GROUP(6)>,
                                  panels<7, GROUP(7)>, panels<8, GROUP(8)>};

// Panels p0..p1-1 for all M rows: 8 rows at a time through each group of panels (the group stays in cache for
// the next 8), `group` panels at once where a whole group is left, else one.
static void panel_range(const float* x, long M, long K, const float* P, float* y, long N, long p0, long p1,
                        long group) {
  for (long p = p0; p < p1;) {
    const long take = p + group <= p1 ? group : 1;
    for (long m0 = 0; m0 < M; m0 += 8) {
      const long rows = M - m0 < 8 ? M - m0 : 8;
      const kernel run = take > 1 ? GROUPED[rows] : ONE[rows];
      run(x + m0 * K, K, K, P + p * K * 32, y + m0 * N + 32 * p, N, N - 32 * p);
    }
    p += take;
  }
}

// run(p0, p1) over panels 0..n_panels-1: each of `threads` OpenMP threads takes an equal run of consecutive
// panels (give or take one).
template <class Range>
static void over_panels(long n_panels, int threads, Range run) {
  if (threads > n_panels) threads = (int)n_panels;
  if (threads <= 1) {
    run(0L, n_panels);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const long t = omp_get_thread_num(), n = omp_get_num_threads();
    run(n_panels * t / n, n_panels * (t + 1) / n);
  }
}

// x: [M, K] row-major; P: [ceil(N / 32), K, 32]; y: [M, N] row-major.
extern "C" void panel_gemm(const float* x, long M, long K, const float* P, float* y, long N, int threads) {
  const long group = M <= 8 ? GROUP(M) : 1;
  over_panels((N + 31) / 32, threads, [&](long p0, long p1) { panel_range(x, M, K, P, y, N, p0, p1, group); });
}

// The same products from 4-bit weights (engine.layers.panel4): W[n, k] = d * q + m per 32 k of each column, d and
// m float32 (float16 values in practice), q 4 bits. d * q is exact in float32 (an 11-bit mantissa times a 4-bit
// integer), so one FMA rebuilds each weight bit for bit, and the FMA chain over k is the float32 kernel's: the
// outputs are its bits. Q: [panels][K][16] bytes (low nibble column j, high nibble column j + 16); D, Mn:
// [panels][K / 32][32]. K and N multiples of 32.
// The low-bit kernels' shared pieces: zeroed accumulators, the float32 kernel's FMA chain step for one k (every
// row m: a += x[m, k] * w, the same order as `panels`), and the stores of whole panels. Forced inline: left to
// itself gcc 12 called `chain` out of line and the 8-bit kernel took twice as long for 5 rows.
#define INLINE __attribute__((always_inline)) static inline
template <int M, int G>
INLINE void zero(__m512 (&a0)[G][M], __m512 (&a1)[G][M]) {
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) { a0[g][m] = _mm512_setzero_ps(); a1[g][m] = _mm512_setzero_ps(); }
}

template <int M, int G>
INLINE void chain(const float* __restrict x, long K, long k, int g, __m512 w0, __m512 w1,
                         __m512 (&a0)[G][M], __m512 (&a1)[G][M]) {
  for (int m = 0; m < M; ++m) {
    const __m512 xb = _mm512_set1_ps(x[m * K + k]);
    a0[g][m] = _mm512_fmadd_ps(xb, w0, a0[g][m]);
    a1[g][m] = _mm512_fmadd_ps(xb, w1, a1[g][m]);
  }
}

template <int M, int G>
INLINE void store(float* __restrict y, long ldy, __m512 (&a0)[G][M], __m512 (&a1)[G][M]) {
  for (int g = 0; g < G; ++g)
    for (int m = 0; m < M; ++m) {
      _mm512_storeu_ps(y + m * ldy + 32 * g, a0[g][m]);
      _mm512_storeu_ps(y + m * ldy + 32 * g + 16, a1[g][m]);
    }
}

template <int M, int G>
static inline void q4panels(const float* __restrict x, long K, const unsigned char* __restrict Q,
                            const float* __restrict D, const float* __restrict Mn, float* __restrict y, long ldy) {
  __m512 a0[G][M], a1[G][M];
  zero<M, G>(a0, a1);
  const __m128i low = _mm_set1_epi8(0x0F);
  const long blocks = K / 32;
  for (long b = 0; b < blocks; ++b) {
    __m512 d0[G], d1[G], m0[G], m1[G];
    for (int g = 0; g < G; ++g) {
      const float* dp = D + (g * blocks + b) * 32;
      const float* mp = Mn + (g * blocks + b) * 32;
      d0[g] = _mm512_loadu_ps(dp); d1[g] = _mm512_loadu_ps(dp + 16);
      m0[g] = _mm512_loadu_ps(mp); m1[g] = _mm512_loadu_ps(mp + 16);
    }
    for (long k = b * 32; k < b * 32 + 32; ++k) {
      for (int g = 0; g < G; ++g) {
        const unsigned char* q = Q + (g * K + k) * 16;
        _mm_prefetch((const char*)(q + 64 * 16), _MM_HINT_T0);
        const __m128i v = _mm_loadu_si128((const __m128i*)q);
        const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, low)));
        const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), low)));
        chain<M, G>(x, K, k, g, _mm512_fmadd_ps(d0[g], q0, m0[g]), _mm512_fmadd_ps(d1[g], q1, m1[g]), a0, a1);
      }
    }
  }
  store<M, G>(y, ldy, a0, a1);
}

typedef void (*q4kernel)(const float*, long, const unsigned char*, const float*, const float*, float*, long);
static const q4kernel Q4_ONE[9] = {0, q4panels<1, 1>, q4panels<2, 1>, q4panels<3, 1>, q4panels<4, 1>,
                                   q4panels<5, 1>, q4panels<6, 1>, q4panels<7, 1>, q4panels<8, 1>};
static const q4kernel Q4_TWO[5] = {0, q4panels<1, 2>, q4panels<2, 2>, q4panels<3, 2>, q4panels<4, 2>};

// Panels p0..p1-1 for all M rows, 8 rows at a time; up to 4 rows two panels at once where two are left.
static void q4_range(const float* x, long M, long K, const unsigned char* Q, const float* D, const float* Mn,
                     float* y, long N, long p0, long p1) {
  const long blocks = K / 32;
  for (long p = p0; p < p1;) {
    const long take = M <= 4 && p + 2 <= p1 ? 2 : 1;
    for (long m0 = 0; m0 < M; m0 += 8) {
      const long rows = M - m0 < 8 ? M - m0 : 8;
      (take == 2 ? Q4_TWO[rows] : Q4_ONE[rows])(x + m0 * K, K, Q + p * K * 16, D + p * blocks * 32,
                                                  Mn + p * blocks * 32, y + m0 * N + 32 * p, N);
    }
    p += take;
  }
}

extern "C" void panel4_gemm(const float* x, long M, long K, const unsigned char* Q, const float* D,
                            const float* Mn, float* y, long N, int threads) {
  over_panels(N / 32, threads, [&](long p0, long p1) { q4_range(x, M, K, Q, D, Mn, y, N, p0, p1); });
}

// The same products from 8-bit weights (engine.layers.panel8): W[n, k] = d * q per 32 k of each column, d float32
// (a float16 value in practice), q a signed byte. d * q is exact in float32 (an 11-bit mantissa times an 8-bit
// integer), so the product rebuilds each weight bit for bit and the FMA chain is the float32 kernel's.
// Q: [panels][K][32] signed bytes (column j at byte j); D: [panels][K / 32][32]. K and N multiples of 32.
template <int M, int G>
static inline void q8panels(const float* __restrict x, long K, const signed char* __restrict Q,
                            const float* __restrict D, float* __restrict y, long ldy) {
  __m512 a0[G][M], a1[G][M];
  zero<M, G>(a0, a1);
  const long blocks = K / 32;
  for (long b = 0; b < blocks; ++b) {
    __m512 d0[G], d1[G];
    for (int g = 0; g < G; ++g) {
      const float* dp = D + (g * blocks + b) * 32;
      d0[g] = _mm512_loadu_ps(dp); d1[g] = _mm512_loadu_ps(dp + 16);
    }
    for (long k = b * 32; k < b * 32 + 32; ++k) {
      for (int g = 0; g < G; ++g) {
        const signed char* q = Q + (g * K + k) * 32;
        _mm_prefetch((const char*)(q + 32 * 32), _MM_HINT_T0);
        const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)q)));
        const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(q + 16))));
        chain<M, G>(x, K, k, g, _mm512_mul_ps(d0[g], q0), _mm512_mul_ps(d1[g], q1), a0, a1);  // d * q: exact
      }
    }
  }
  store<M, G>(y, ldy, a0, a1);
}

typedef void (*q8kernel)(const float*, long, const signed char*, const float*, float*, long);
static const q8kernel Q8_ONE[9] = {0, q8panels<1, 1>, q8panels<2, 1>, q8panels<3, 1>, q8panels<4, 1>,
                                   q8panels<5, 1>, q8panels<6, 1>, q8panels<7, 1>, q8panels<8, 1>};
static const q8kernel Q8_TWO[5] = {0, q8panels<1, 2>, q8panels<2, 2>, q8panels<3, 2>, q8panels<4, 2>};

extern "C" void panel8_gemm(const float* x, long M, long K, const signed char* Q, const float* D, float* y, long N,
                            int threads) {
  const long blocks = K / 32;
  over_panels(N / 32, threads, [&](long p0, long p1) {
    for (long p = p0; p < p1;) {  // as q4_range: 8 rows at a time, up to 4 rows two panels at once
      const long take = M <= 4 && p + 2 <= p1 ? 2 : 1;
      for (long m0 = 0; m0 < M; m0 += 8) {
        const long rows = M - m0 < 8 ? M - m0 : 8;
        (take == 2 ? Q8_TWO[rows] : Q8_ONE[rows])(x + m0 * K, K, Q + p * K * 32, D + p * blocks * 32,
                                                    y + m0 * N + 32 * p, N);
      }
      p += take;
    }
  });
}
