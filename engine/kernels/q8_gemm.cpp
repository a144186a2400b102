// y[m, n] = sum_k x[m, k] * W[n, k] from the 4-bit panels (engine/layers/panel4.py's layout, W = d * q + m per 32 k
// of a column) or the 8-bit ones (panel8.py's, W = d * q) with the activations rounded to 8 bits: the integer dot
// products of llama.cpp's Q4_1 / Q8_0 x Q8 kernels, on AVX-512 VNNI (vpdpbusd: 64 byte products an instruction,
// where the float32 kernel does 16 FMAs). Opt-in (--cpu-matmul q8): faster, and not the float32 model's bits
// (a product is off by about 0.6% of its size).
//
// Per row m and block b of 32 inputs: dx = max |x| / 127, xq = round(x * (127 / max |x|)) in -127..127 (int8), the
// activations dx * xq (engine.layers.panel4.q8_activations), and sx = dx * sum xq. Per output column n: y = sum over
// blocks b, in order, of fma(float(sum_k q xq), d * dx, .) then fma(m, sx, .): the float32 products of those
// activations up to rounding (tested), and every row's arithmetic depends on its own x only, never on
// the row count or the thread count, so a verify's rows are one-row steps' bits (tested), as with the float32
// kernels. The weights need no copy: a 64-byte load holds 4 k of 32 columns (16 bytes a k), vpermb regroups it to
// 4 consecutive k per 32-bit lane, low nibbles for columns 0-15, high ones for 16-31.
//
// Built into the kernels' library for every instruction set; only x86 compilers get the code (target attributes,
// so the rest of the library keeps its flags). This file's code runs where the CPU has AVX-512 VNNI and VBMI,
// q8_avx2.cpp's (the same bits) on other x86 CPUs with AVX2 and FMA (q8_support; engine/layers/native.py).
// Elsewhere panel4q8_gemm and panel8q8_gemm are stubs that are never called.
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "q8.h"
#include "threads.h"

#if Q8_X86
#include <immintrin.h>
#define Q8 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,fma")))
#define Q8_INLINE Q8 __attribute__((always_inline)) static inline
#define Q8_ROWS 6                  // rows a pass (12 int32 and 12 float accumulators; 5-row verifies in one)
#define Q8_PREFETCH 1024           // bytes ahead of a panel's loads (16 groups of 4 k)

// Row m's blocks: xq [K] int8, dx and sx [K / 32]. A block whose largest |x| is too small for 127 / it to be finite
// (below 3.7e-37) counts as zeros; one holding a NaN or an inf gets dx = NaN, so the products it feeds are NaN.
Q8 static void quantize_row(const float* x, long K, signed char* xq, float* dx, float* sx) {
  for (long b = 0; b < K / 32; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float scale = 127.0f / amax;
    const __m512 inv = _mm512_set1_ps(amax > 0 && scale <= FLT_MAX ? scale : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
    _mm_storeu_si128((__m128i*)(xq + 32 * b), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(xq + 32 * b + 16), _mm512_cvtsepi32_epi8(q1));
    const bool nan = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
    dx[b] = nan || !(amax <= FLT_MAX) ? NAN : amax / 127.0f;  // NaN or inf in the block: NaN products
    sx[b] = dx[b] * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));  // exact sum: |sum| <= 32 * 127
  }
}

// 4 consecutive k of column j in lane j (bytes 4 j .. 4 j + 3). 4 bits: one 64-byte load holds 4 k of 16 bytes (low
// nibbles columns 0-15, high ones 16-31): byte 4 j + i <- byte 16 i + j. 8 bits: two loads hold 4 k of 32 bytes
// (column j at byte j): columns 0-15 from bytes 32 i + j of the pair, columns 16-31 from 32 i + 16 + j.
#define K4(j, step, base) base + j, base + step + j, base + 2 * step + j, base + 3 * step + j
#define LANES(step, base)                                                                                      \
  K4(0, step, base), K4(1, step, base), K4(2, step, base), K4(3, step, base), K4(4, step, base), K4(5, step, base), \
      K4(6, step, base), K4(7, step, base), K4(8, step, base), K4(9, step, base), K4(10, step, base),             \
      K4(11, step, base), K4(12, step, base), K4(13, step, base), K4(14, step, base), K4(15, step, base)
alignas(64) static const unsigned char REGROUP4[64] = {LANES(16, 0)};
alignas(64) static const unsigned char REGROUP8[2][64] = {{LANES(32, 0)}, {LANES(32, 16)}};
#undef LANES
#undef K4

// The weights of 4 k (k = 32 b + 4 t) of one panel as two vectors of 16 lanes (columns 0-15, 16-31), 4 bytes each:
// 4 bits unsigned q (0..15), 8 bits signed q. Q: the panel's first byte.
template <int BITS>
Q8_INLINE void weights(const unsigned char* Q, long k, __m512i (&w)[2]) {
  if constexpr (BITS == 4) {
    const unsigned char* q = Q + k * 16;
    _mm_prefetch((const char*)q + Q8_PREFETCH, _MM_HINT_T0);
    const __m512i lanes = _mm512_permutexvar_epi8(_mm512_load_si512(REGROUP4), _mm512_loadu_si512(q));
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    w[0] = _mm512_and_si512(lanes, nibble);
    w[1] = _mm512_and_si512(_mm512_srli_epi16(lanes, 4), nibble);
  } else {
    const unsigned char* q = Q + k * 32;
    _mm_prefetch((const char*)q + 2 * Q8_PREFETCH, _MM_HINT_T0);
    _mm_prefetch((const char*)q + 2 * Q8_PREFETCH + 64, _MM_HINT_T0);
    const __m512i a = _mm512_loadu_si512(q), b = _mm512_loadu_si512(q + 64);
    w[0] = _mm512_permutex2var_epi8(a, _mm512_load_si512(REGROUP8[0]), b);
    w[1] = _mm512_permutex2var_epi8(a, _mm512_load_si512(REGROUP8[1]), b);
  }
}

// One panel (32 columns), M rows: Q the panel's bytes (4 bits: [K][16], 8 bits: [K][32]), D and Mn [K / 32][32]
// (Mn: 4 bits only); xq [M][K], dx and sx [M][K / 32]. vpdpbusd multiplies unsigned by signed bytes: 4 bits,
// q (unsigned) by xq; 8 bits, xq + 128 (unsigned) by q, less 128 * sum q (from the same instruction on bytes of 1).
template <int BITS, int M>
Q8 static void q8_panel(const signed char* xq, const float* dx, const float* sx, long K, const unsigned char* Q,
                        const float* D, const float* Mn, float* y, long ldy) {
  const long blocks = K / 32;
  __m512 acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (long b = 0; b < blocks; ++b) {
    const float *d = D + 32 * b, *mn = BITS == 4 ? Mn + 32 * b : nullptr;
    _mm_prefetch((const char*)d + Q8_PREFETCH, _MM_HINT_T0);
    _mm_prefetch((const char*)d + Q8_PREFETCH + 64, _MM_HINT_T0);
    if constexpr (BITS == 4) {
      _mm_prefetch((const char*)mn + Q8_PREFETCH, _MM_HINT_T0);
      _mm_prefetch((const char*)mn + Q8_PREFETCH + 64, _MM_HINT_T0);
    }
    __m512i s[M][2], sum_q[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int m = 0; m < M; ++m) s[m][0] = s[m][1] = _mm512_setzero_si512();
    for (int t = 0; t < 8; ++t) {  // 4 k a step
      __m512i w[2];
      weights<BITS>(Q, 32 * b + 4 * t, w);
      if constexpr (BITS == 8)
        for (int c = 0; c < 2; ++c) sum_q[c] = _mm512_dpbusd_epi32(sum_q[c], _mm512_set1_epi8(1), w[c]);
      for (int m = 0; m < M; ++m) {
        int four;  // xq's 4 bytes for these k (memcpy: no aliasing; _mm_loadu_si32 needs gcc 11)
        memcpy(&four, xq + m * K + 32 * b + 4 * t, 4);
        const __m512i xb = _mm512_set1_epi32(four);
        for (int c = 0; c < 2; ++c)
          s[m][c] = BITS == 4 ? _mm512_dpbusd_epi32(s[m][c], w[c], xb)
                              : _mm512_dpbusd_epi32(s[m][c], _mm512_xor_si512(xb, _mm512_set1_epi8((char)0x80)), w[c]);
      }
    }
    for (int c = 0; c < 2; ++c) {
      const __m512 dc = _mm512_loadu_ps(d + 16 * c);
      for (int m = 0; m < M; ++m) {
        const __m512 scale = _mm512_mul_ps(dc, _mm512_set1_ps(dx[m * blocks + b]));
        if constexpr (BITS == 4) {
          acc[m][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[m][c]), scale, acc[m][c]);
          acc[m][c] = _mm512_fmadd_ps(_mm512_loadu_ps(mn + 16 * c), _mm512_set1_ps(sx[m * blocks + b]), acc[m][c]);
        } else {
          const __m512i dot = _mm512_sub_epi32(s[m][c], _mm512_slli_epi32(sum_q[c], 7));
          acc[m][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[m][c]);
        }
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < 2; ++c) _mm512_storeu_ps(y + m * ldy + 16 * c, acc[m][c]);
}

typedef void (*q8_kernel)(const signed char*, const float*, const float*, long, const unsigned char*, const float*,
                          const float*, float*, long);

// Panels p0..p1-1, every row, Q8_ROWS rows a pass (the panel stays in L1 for the next rows).
template <int BITS>
Q8 static void q8_panels(const signed char* xq, const float* dx, const float* sx, long M, long K,
                         const unsigned char* Q, const float* D, const float* Mn, float* y, long N, long p0, long p1) {
  static const q8_kernel PASS[Q8_ROWS + 1] = {0, q8_panel<BITS, 1>, q8_panel<BITS, 2>, q8_panel<BITS, 3>,
                                              q8_panel<BITS, 4>, q8_panel<BITS, 5>, q8_panel<BITS, 6>};
  const long blocks = K / 32;
  for (long p = p0; p < p1; ++p)
    for (long m0 = 0; m0 < M; m0 += Q8_ROWS) {
      const long rows = M - m0 < Q8_ROWS ? M - m0 : Q8_ROWS;
      PASS[rows](xq + m0 * K, dx + m0 * blocks, sx + m0 * blocks, K, Q + p * K * 4 * BITS, D + p * blocks * 32,
                 BITS == 4 ? Mn + p * blocks * 32 : nullptr, y + m0 * N + 32 * p, N);
    }
}

// The CPU's best code: 2 AVX-512 VNNI (this file's), 1 AVX2 (q8_avx2.cpp's: the same bits), 0 none. Asked once.
static int detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    return 2;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
}
static const int SUPPORT = detect();
static int forced = -1;  // q8_path's choice: -1 the CPU's best, 0 AVX2, 1 AVX-512 VNNI

extern "C" int q8_support() { return SUPPORT; }

// Which code runs: choice -1 the CPU's best, 0 AVX2, 1 AVX-512 (tests compare them; a CPU without AVX-512 VNNI
// keeps its best); returns 1 for AVX-512.
extern "C" int q8_path(int choice) {
  forced = choice == 0 || (choice == 1 && SUPPORT == 2) ? choice : -1;
  return forced >= 0 ? forced : SUPPORT == 2;
}

// Whether the AVX-512 VNNI code runs (q8_path's choice, else the CPU's best).
static bool wide_path() { return forced >= 0 ? forced == 1 : SUPPORT == 2; }

// x [M, K]'s 8-bit rounding in one allocation (free() the returned xq): xq [M][K], then dx, sx and `extra` more
// arrays of [M][K / 32] floats for the caller.
static signed char* quantize_rows(const float* x, long M, long K, bool wide, int extra, float** dx, float** sx) {
  const long blocks = K / 32;
  signed char* xq = (signed char*)malloc(M * K + (2 + extra) * M * blocks * sizeof(float));
  if (xq == 0) abort();  // a few KB for a step's rows: nothing sensible is left to do without them
  *dx = (float*)(xq + M * K), *sx = *dx + M * blocks;  // M * K is a multiple of 32: aligned floats
  for (long m = 0; m < M; ++m)
    (wide ? quantize_row : q8_quantize_row_avx2)(x + m * K, K, xq + m * K, *dx + m * blocks, *sx + m * blocks);
  return xq;
}

// x [M, K] row-major, its 8-bit rounding here; the panels split over `threads` threads (threads.h).
template <int BITS>
static void q8_gemm(const float* x, long M, long K, const unsigned char* Q, const float* D, const float* Mn, float* y,
                    long N, int threads) {
  const bool wide = wide_path();
  float *dx, *sx;
  signed char* xq = quantize_rows(x, M, K, wide, 0, &dx, &sx);
  over_panels(N / 32, threads, [&](long p0, long p1) {
    if (wide)
      q8_panels<BITS>(xq, dx, sx, M, K, Q, D, Mn, y, N, p0, p1);
    else
      q8_panels_avx2(BITS, xq, dx, sx, M, K, Q, D, Mn, y, N, p0, p1);
  });
  free(xq);
}

#pragma GCC diagnostic ignored "-Wpsabi"  // (the AVX2 build's note on 64-byte vectors: these never cross calls)
typedef float vf16 __attribute__((vector_size(64)));  // the library's flags pick the registers (AVX-512: one)
typedef int vi16 __attribute__((vector_size(64)));

static inline vf16 load16(const float* p) {
  vf16 v;
  memcpy(&v, p, sizeof v);
  return v;
}

// Folds 16 columns into the running maxima of A + E (hi) and A - E (lo), E = the bound's sum widened as q8_screen8
// says; a column whose A + E or A - E is not finite (or NaN) makes hi +inf (a candidate) and leaves lo alone.
static inline void fold16(vf16 A, float sum, vf16& hi, vf16& lo) {
  const vf16 absA = A < 0 ? -A : A;
  const vf16 E = sum * 1.00001f + 2.384185791015625e-07f * absA + 1e-30f;  // 2^-22 |A|
  const vf16 up = A + E, down = A - E;
  const vi16 good = (up <= FLT_MAX) & (down >= -FLT_MAX);
  hi = good ? (up > hi ? up : hi) : vf16{} + INFINITY;
  lo = (good & (down > lo)) ? down : lo;
}

// panel8_screened's first pass (panel_gemm.cpp): for each row m and panel p of the 8-bit head, the largest lower and
// upper bounds over the panel's 32 columns, lo[m][p] = max (A - E) and hi[m][p] = max (A + E), where A is
// panel8q8_gemm's product (x rounded to 8 bits) and E bounds |A - the float32 kernel's product F| (panel8_gemm):
//   F - A = (F - x.w) + (x - x8).w + (x8.w - A), x8 = dx * xq the rounded activations, so per block b of 32 inputs
//   |F - A| <= sum_b (r_b + slack * max |x_b|) * S_b, r_b = max |x_b - x8_b| (computed, not assumed: any rounding
//   rule, zeroed tiny blocks included), S_b = the panel's largest sum |w_b| over its 32 columns (exact in float32;
//   one number a panel and block: 110 KB for SmolLM2's head, where a sum a column read 3.5 MB a step and saved only
//   about 6 exact panels a row of 1536), slack covering F's FMA chain over K
//   (gamma_K), A's float steps (gamma_{K/32+2}) and r_b's own rounding. E is that sum times 1 + 1e-5 (its own
//   rounding), plus 2^-22 |A| (so that float32's A + E and A - E round outward) and 1e-30 (underflow).
// A lane whose A or E is not finite counts as +inf in hi (the caller computes it exactly); full[m] = 1 where row m
// holds a NaN or an inf (no bound: the caller computes the whole row exactly).
extern "C" void q8_screen8(const float* x, long M, long K, const unsigned char* Q, const float* D,
                           const float* S, float* hi, float* lo, int* full, long N, int threads) {
  const long blocks = K / 32, P = N / 32;
  const bool wide = wide_path();
  float *dx, *sx;
  signed char* xq = quantize_rows(x, M, K, wide, 1, &dx, &sx);
  float* t = sx + M * blocks;  // the bound's terms per row and block
  const float slack = 1.01f * (float)(K + K / 32 + 8) / 16777216.0f;  // (K + K / 32 + 8) u, u = 2^-24
  for (long m = 0; m < M; ++m) {
    const float* xm = x + m * K;
    full[m] = 0;
    for (long b = 0; b < blocks; ++b) {
      float amax = 0.0f, r = 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float v = xm[32 * b + j];
        amax = fmaxf(amax, fabsf(v));
        r = fmaxf(r, fabsf(v - dx[m * blocks + b] * (float)xq[m * K + 32 * b + j]));
      }
      if (!(dx[m * blocks + b] <= FLT_MAX) || !(amax <= FLT_MAX)) full[m] = 1;  // a NaN or an inf
      t[m * blocks + b] = r + slack * amax;
    }
  }
  over_panels(P, threads, [&](long p0, long p1) {
    float* a = (float*)malloc(M * 32 * sizeof(float));  // one panel's A, every row
    if (a == 0) abort();
    for (long p = p0; p < p1; ++p) {
      const unsigned char* q = Q + p * K * 32;
      const float* d = D + p * blocks * 32;
      if (wide)
        q8_panels<8>(xq, dx, sx, M, K, q, d, nullptr, a, 32, 0, 1);
      else
        q8_panels_avx2(8, xq, dx, sx, M, K, q, d, nullptr, a, 32, 0, 1);
      for (long m = 0; m < M; ++m) {
        float sum = 0.0f;  // the bound's sum, for every column of the panel
        for (long b = 0; b < blocks; ++b) sum += t[m * blocks + b] * S[p * blocks + b];
        vf16 h = vf16{} - INFINITY, l = h;
        fold16(load16(a + m * 32), sum, h, l);
        fold16(load16(a + m * 32 + 16), sum, h, l);
        float hmax = h[0], lmax = l[0];
        for (int j = 1; j < 16; ++j) {
          hmax = h[j] > hmax ? h[j] : hmax;
          lmax = l[j] > lmax ? l[j] : lmax;
        }
        hi[m * P + p] = hmax;
        lo[m * P + p] = lmax;
      }
    }
    free(a);
  });
  free(xq);
}

// x: [M, K] row-major; Q, D, Mn: engine/layers/panel4.py's Panel4 (K and N multiples of 32); y: [M, N].
extern "C" void panel4q8_gemm(const float* x, long M, long K, const unsigned char* Q, const float* D,
                              const float* Mn, float* y, long N, int threads) {
  q8_gemm<4>(x, M, K, Q, D, Mn, y, N, threads);
}

// Q, D: engine/layers/panel8.py's Panel8.
extern "C" void panel8q8_gemm(const float* x, long M, long K, const signed char* Q, const float* D, float* y, long N,
                              int threads) {
  q8_gemm<8>(x, M, K, (const unsigned char*)Q, D, nullptr, y, N, threads);
}

#else  // no x86 (or too old a compiler): never called (q8_support says 0)
// no bounds here: every row is computed exactly (panel8_screened then equals panel8_gemm)
extern "C" void q8_screen8(const float*, long M, long, const unsigned char*, const float*, const float*, float*,
                           float*, int* full, long, int) {
  for (long m = 0; m < M; ++m) full[m] = 1;
}
extern "C" int q8_support() { return 0; }
extern "C" int q8_path(int) { return 0; }
extern "C" void panel4q8_gemm(const float*, long, long, const unsigned char*, const float*, const float*, float*,
                              long, int) {}
extern "C" void panel8q8_gemm(const float*, long, long, const signed char*, const float*, float*, long, int) {}
#endif
