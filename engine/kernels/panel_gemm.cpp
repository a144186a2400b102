// y[m, n] = sum_k x[m, k] * W[n, k] for a few rows m, W stored as panels P[p][k][j] = W[32 p + j, k]
// (zero-padded to a multiple of 32 rows of W). Loaded by engine/layers/native.py through ctypes.
//
// Every output element is one FMA chain over k = 0..K-1, in that order, whatever the row count M and the
// thread count: a row's products are the same bits in a 1-row step as in a 5-row verify, so a verify
// reproduces plain decoding exactly. The weights stream once per step (bandwidth-bound up to about 8 rows on
// one AVX-512 core); several panels are read at once for few rows (more memory streams in flight). A pass
// computes a few rows of a few 16-column blocks of a panel (simd.h: fewer on AVX2 and NEON); a panel takes
// several passes where it needs more, each output still one chain over k.
#include <math.h>
#include <stdlib.h>

#include "q8.h"
#include "simd.h"
#include "threads.h"

#define PREFETCH_AHEAD 32  // k steps (32 x 128 bytes) ahead of the loads

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define LB(m) LOW_BIT_BLOCKS(m)  // column blocks a low-bit pass of m rows takes (simd.h)

// The kernels' shared pieces: zeroed accumulators (G panels x C column blocks x M rows), the FMA chain step for
// one k (every row m: a += x[m, k] * w, w the weights of k for the C blocks), and the stores. Forced inline: left
// to itself gcc 12 called the chain out of line and the 8-bit kernel took twice as long for 5 rows.
template <int M, int G, int C>
INLINE void zero(v16 (&a)[G][C][M]) {
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c)
      for (int m = 0; m < M; ++m) a[g][c][m] = v_zero();
}

template <int M, int G, int C>
INLINE void chain(const float* __restrict x, long ldx, long k, int g, const v16 (&w)[C], v16 (&a)[G][C][M]) {
  for (int m = 0; m < M; ++m) {
    const v16 xb = v_set1(x[m * ldx + k]);
    for (int c = 0; c < C; ++c) a[g][c][m] = v_fmadd(xb, w[c], a[g][c][m]);
  }
}

// y at the first panel's column 16 * c0; width: the columns that exist from the first panel's column 0 on.
template <int M, int G, int C>
INLINE void store(float* __restrict y, long ldy, int c0, long width, v16 (&a)[G][C][M]) {
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c)
      for (int m = 0; m < M; ++m) {
        const long column = 32 * g + 16 * (c0 + c);
        v_store_n(y + m * ldy + column, a[g][c][m], width - column);
      }
}

// Float32 panels: G panels at once, M rows. P: the first panel; x: [M, K] (row stride ldx); y: [M, .] at the first
// panel's column 0; width: the columns that exist from there on.
template <int M, int G>
static inline void panels(const float* __restrict x, long ldx, long K, const float* __restrict P,
                          float* __restrict y, long ldy, long width) {
  v16 a[G][2][M];
  zero<M, G, 2>(a);
  const long stride = K * 32;
  for (long k = 0; k < K; ++k) {
    for (int g = 0; g < G; ++g) {
      const float* w = P + g * stride + k * 32;
      v_prefetch(w + PREFETCH_AHEAD * 32);
      v_prefetch(w + PREFETCH_AHEAD * 32 + 16);
      const v16 wv[2] = {v_load(w), v_load(w + 16)};
      chain<M, G, 2>(x, ldx, k, g, wv, a);
    }
  }
  store<M, G, 2>(y, ldy, 0, width, a);
}

typedef void (*kernel)(const float*, long, long, const float*, float*, long, long);
static const kernel ONE[9] = {0, panels<1, 1>, panels<2, 1>, panels<3, 1>, panels<4, 1>,
                              panels<5, 1>, panels<6, 1>, panels<7, 1>, panels<8, 1>};
static const kernel GROUPED[9] = {0, panels<1, FP32_GROUP(1)>, panels<2, FP32_GROUP(2)>, panels<3, FP32_GROUP(3)>,
                                  panels<4, FP32_GROUP(4)>, panels<5, FP32_GROUP(5)>, panels<6, FP32_GROUP(6)>,
                                  panels<7, FP32_GROUP(7)>, panels<8, FP32_GROUP(8)>};

// Panels p0..p1-1 for all M rows: FP32_ROWS rows at a time through each group of panels (the group stays in cache
// for the next rows), `group` panels at once where a whole group is left, else one.
static void panel_range(const float* x, long M, long K, const float* P, float* y, long N, long p0, long p1,
                        long group) {
  for (long p = p0; p < p1;) {
    const long take = p + group <= p1 ? group : 1;
    for (long m0 = 0; m0 < M; m0 += FP32_ROWS) {
      const long rows = MIN(M - m0, FP32_ROWS);
      const kernel run = take > 1 ? GROUPED[rows] : ONE[rows];
      run(x + m0 * K, K, K, P + p * K * 32, y + m0 * N + 32 * p, N, N - 32 * p);
    }
    p += take;
  }
}

// A tall pass: M rows of a float32 panel's 16-column block c0 (w: [K][32]); width: the columns that exist.
#define TALL_ROWS 6
template <int M>
static void tall_pass(const float* __restrict x, long K, const float* __restrict w, int c0, float* __restrict y,
                      long ldy, long width) {
  v16 a[1][1][M];
  zero<M, 1, 1>(a);
  for (long k = 0; k < K; ++k) {
    const v16 wv[1] = {v_load(w + k * 32 + 16 * c0)};
    chain<M, 1, 1>(x, K, k, 0, wv, a);
  }
  store<M, 1, 1>(y, ldy, c0, width, a);
}
typedef void (*tall_kernel)(const float*, long, const float*, int, float*, long, long);
static const tall_kernel TALL[7] = {0, tall_pass<1>, tall_pass<2>, tall_pass<3>, tall_pass<4>, tall_pass<5>,
                                    tall_pass<6>};

// One float32 panel (w: [K][32]) for all M rows by tall passes: y at its column 0, width: the columns that exist.
static void tall_panel(const float* x, long M, long K, const float* w, float* y, long N, long width) {
  for (int c0 = 0; c0 < 2 && 16 * c0 < width; ++c0)
    for (long m0 = 0; m0 < M; m0 += TALL_ROWS)
      TALL[MIN(M - m0, TALL_ROWS)](x + m0 * K, K, w, c0, y + m0 * N, N, width);
}

// Rows from which a low-bit GEMM rebuilds each panel once into float32 and runs tall passes over it (each output
// the same FMA chain over k: the same bits), instead of rebuilding every weight once per pass of LOW_BIT_ROWS rows
// (a prefill's dozens of rows). On AVX2, 6 rows of one block a pass (12 accumulators) ran a prefill's matmuls
// faster than the float32 kernel's 2 rows of two blocks over the rebuilt panel (Zen 1, 64 rows: 413 against 552
// ms; oneDNN 427; README "AVX2 CPUs"). AVX2 rebuilds from 11 rows on: with the weights widened as they load
// (simd.h, v_from_nibbles) the passes over the 4-bit panel were faster up to 10 rows on a Zen 3 (SmolLM2-135M's
// matmuls, one core: 41.7 against 43.4 ms at 10 rows, 51.0 against 46.7 at 11; Zen 1's 6 rows were measured with
// the weights widened in registers). low_bit_rebuild_rows sets it (0: the default; tests).
static long rebuild_from = LOW_BIT_REBUILD_ROWS;
// A row threshold's setter: rows > 0 that many, 0 the build's default, < 0 unchanged; returns the threshold.
static long set_rows(long& threshold, long rows, long build_default) {
  if (rows >= 0) threshold = rows > 0 ? rows : build_default;
  return threshold;
}
extern "C" long low_bit_rebuild_rows(long rows) { return set_rows(rebuild_from, rows, LOW_BIT_REBUILD_ROWS); }

// Rows from which the float32 GEMM runs tall passes over its panels instead of its own (the same bits). Its weights
// stream from memory, each 64-byte block of a k read in a pass of its own: on AVX2 (Zen 1, SmolLM2-135M's matmuls,
// one core) tall passes were slower up to 16 rows (85.0 against 71.9 ms at 6, 160.1 against 157.7 at 16) and faster
// from 24 (217.3 against 226.6; 32 rows 274.8 against 298.5, 48 377.8 against 429.7). fp32_tall_rows sets it.
static long fp32_tall_from = FP32_TALL_ROWS;
extern "C" long fp32_tall_rows(long rows) { return set_rows(fp32_tall_from, rows, FP32_TALL_ROWS); }

// x: [M, K] row-major; P: [ceil(N / 32), K, 32]; y: [M, N] row-major.
extern "C" void panel_gemm(const float* x, long M, long K, const float* P, float* y, long N, int threads) {
  if (M >= fp32_tall_from) {
    over_panels((N + 31) / 32, threads, [&](long p0, long p1) {
      for (long p = p0; p < p1; ++p) tall_panel(x, M, K, P + p * K * 32, y + 32 * p, N, MIN(N - 32 * p, 32L));
    });
    return;
  }
  const long group = M <= FP32_ROWS ? FP32_GROUP(M) : 1;
  over_panels((N + 31) / 32, threads, [&](long p0, long p1) { panel_range(x, M, K, P, y, N, p0, p1, group); });
}

// The same products from 4- and 8-bit weights (engine.layers.panel4 / panel8). BITS 4: W[n, k] = d * q + m per 32
// k of each column, d and m float32 (float16 values in practice), q 4 bits; Q: [panels][K][16] bytes (low nibble
// column j, high nibble column j + 16); D, Mn: [panels][K / 32][32]. BITS 8: W[n, k] = d * q, q a signed byte;
// Q: [panels][K][32] (column j at byte j), D as for 4 bits, no Mn. K and N multiples of 32. d * q is exact in
// float32 (an 11-bit mantissa times a 4- or 8-bit integer), so one FMA (4 bits) or the product (8 bits) rebuilds
// each weight bit for bit, and the FMA chain over k is the float32 kernel's: the outputs are its bits.
// A pass: G panels, the C column blocks from block c0 of each (block 0: the low nibbles or bytes 0-15), M rows.
template <int BITS, int M, int G, int C>
static inline void low_bit_panels(const float* __restrict x, long K, const unsigned char* __restrict Q,
                                  const float* __restrict D, const float* __restrict Mn, int c0, float* __restrict y,
                                  long ldy) {
  v16 a[G][C][M];
  zero<M, G, C>(a);
  const long blocks = K / 32, bytes = 4 * BITS;  // a panel's bytes per k
  for (long b = 0; b < blocks; ++b) {
    v16 d[G][C], mn[G][C];
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c) {
        d[g][c] = v_load(D + (g * blocks + b) * 32 + 16 * (c0 + c));
        if constexpr (BITS == 4) mn[g][c] = v_load(Mn + (g * blocks + b) * 32 + 16 * (c0 + c));
      }
    for (long k = b * 32; k < b * 32 + 32; ++k) {
      for (int g = 0; g < G; ++g) {
        const unsigned char* q = Q + (g * K + k) * bytes;
        v_prefetch(q + 1024);  // 64 (4 bits) or 32 (8 bits) k steps ahead
        v16 w[C];
        for (int c = 0; c < C; ++c) {
          if constexpr (BITS == 4) {
            w[c] = v_fmadd(d[g][c], v_from_nibbles(q, c0 + c), mn[g][c]);
          } else {
            w[c] = v_mul(d[g][c], v_from_i8_at(q + 16 * (c0 + c)));
          }
        }
        chain<M, G, C>(x, K, k, g, w, a);
      }
    }
  }
  store<M, G, C>(y, ldy, c0, 32 * G, a);
}

typedef void (*low_bit_kernel)(const float*, long, const unsigned char*, const float*, const float*, int, float*,
                               long);

// One panel's weights rebuilt into float32, out [K][32]: each weight by low_bit_panels' own operation (the same bits).
template <int BITS>
static void rebuild_panel(long K, const unsigned char* __restrict Q, const float* __restrict D,
                          const float* __restrict Mn, float* __restrict out) {
  const long bytes = 4 * BITS;
  for (long b = 0; b < K / 32; ++b)
    for (int c = 0; c < 2; ++c) {
      const v16 d = v_load(D + b * 32 + 16 * c), mn = BITS == 4 ? v_load(Mn + b * 32 + 16 * c) : v_zero();
      for (long k = b * 32; k < b * 32 + 32; ++k) {
        const unsigned char* q = Q + k * bytes;
        v16 w;
        if constexpr (BITS == 4) {
          w = v_fmadd(d, v_from_nibbles(q, c), mn);
        } else {
          w = v_mul(d, v_from_i8_at(q + 16 * c));
        }
        v_store(out + k * 32 + 16 * c, w);
      }
    }
}

// y [M, N] = x [M, K] @ the BITS-bit panels: LOW_BIT_ROWS rows and LOW_BIT_BLOCKS(rows) column blocks a pass,
// LOW_BIT_GROUP(M) panels at once where that many are left.
template <int BITS>
static void low_bit_gemm(const float* x, long M, long K, const unsigned char* Q, const float* D, const float* Mn,
                         float* y, long N, int threads) {
  static const low_bit_kernel ONE[9] = {
      0, low_bit_panels<BITS, 1, 1, LB(1)>, low_bit_panels<BITS, 2, 1, LB(2)>, low_bit_panels<BITS, 3, 1, LB(3)>,
      low_bit_panels<BITS, 4, 1, LB(4)>, low_bit_panels<BITS, 5, 1, LB(5)>, low_bit_panels<BITS, 6, 1, LB(6)>,
      low_bit_panels<BITS, 7, 1, LB(7)>, low_bit_panels<BITS, 8, 1, LB(8)>};
  static const low_bit_kernel TWO[5] = {0, low_bit_panels<BITS, 1, 2, LB(1)>, low_bit_panels<BITS, 2, 2, LB(2)>,
                                        low_bit_panels<BITS, 3, 2, LB(3)>, low_bit_panels<BITS, 4, 2, LB(4)>};
  const long blocks = K / 32;
  if (M >= rebuild_from) {
    over_panels(N / 32, threads, [&](long p0, long p1) {
      float* w = (float*)aligned_alloc(64, K * 32 * sizeof(float));  // a panel: 73 KB (K = 576) to 196 KB (1536)
      if (w == 0) abort();
      for (long p = p0; p < p1; ++p) {
        rebuild_panel<BITS>(K, Q + p * K * 4 * BITS, D + p * blocks * 32, BITS == 4 ? Mn + p * blocks * 32 : nullptr,
                            w);
        tall_panel(x, M, K, w, y + 32 * p, N, 32);
      }
      free(w);
    });
    return;
  }
  over_panels(N / 32, threads, [&](long p0, long p1) {
    for (long p = p0; p < p1;) {
      const long take = p + LOW_BIT_GROUP(M) <= p1 ? LOW_BIT_GROUP(M) : 1;
      for (long m0 = 0; m0 < M; m0 += LOW_BIT_ROWS) {
        const long rows = MIN(M - m0, LOW_BIT_ROWS);
        for (int c0 = 0; c0 < 2; c0 += LB(rows))
          (take == 2 ? TWO[rows] : ONE[rows])(x + m0 * K, K, Q + p * K * 4 * BITS, D + p * blocks * 32,
                                              BITS == 4 ? Mn + p * blocks * 32 : nullptr, c0, y + m0 * N + 32 * p, N);
      }
      p += take;
    }
  });
}

extern "C" void panel4_gemm(const float* x, long M, long K, const unsigned char* Q, const float* D,
                            const float* Mn, float* y, long N, int threads) {
  low_bit_gemm<4>(x, M, K, Q, D, Mn, y, N, threads);
}

extern "C" void panel8_gemm(const float* x, long M, long K, const signed char* Q, const float* D, float* y, long N,
                            int threads) {
  low_bit_gemm<8>(x, M, K, (const unsigned char*)Q, D, nullptr, y, N, threads);
}

// panel8_gemm's products for a greedy step, screened: y [M, N] holds panel8_gemm's bits in every panel that may hold
// a row's largest product and -inf in every other, so y's argmax per row is panel8_gemm's (first index on ties).
// q8_screen8 bounds each product from the 8-bit activations' one (x rounded to 8 bits: about a third of the float
// kernel's time at 5 rows); lower = max over the row of (A - E) <= the largest F, so a panel whose every column has
// A + E < lower holds no product as large as that one, and only the others run the float32 kernel (one row, one
// panel at a time: each output is its one FMA chain over k, the same bits as in panel8_gemm). About 10 of the
// head's 1536 panels a row on SmolLM2-135M. S: [panels][K / 32], the largest sum |d * q| over a block's 32
// columns (engine/layers/panel8.py's bound_sums). Rows with a NaN or an inf, and CPUs without q8's code, get
// every panel exactly. Returns the number of (row, panel) pairs computed exactly.
extern "C" long panel8_screened(const float* x, long M, long K, const signed char* Q, const float* D,
                                const float* S, float* y, long N, int threads) {
  const long P = N / 32, blocks = K / 32;
  float* hi = (float*)malloc((2 * M * P + M) * sizeof(float));
  int* full = (int*)malloc(M * sizeof(int));
  if (hi == 0 || full == 0) abort();
  float *lo = hi + M * P, *lower = lo + M * P;
  q8_screen8(x, M, K, (const unsigned char*)Q, D, S, hi, lo, full, N, threads);
  for (long m = 0; m < M; ++m) {
    lower[m] = -INFINITY;
    for (long p = 0; p < P; ++p) lower[m] = fmaxf(lower[m], lo[m * P + p]);
  }
  auto exact_here = [&](long m, long p) { return full[m] || hi[m * P + p] >= lower[m]; };  // may hold the argmax
  over_panels(P, threads, [&](long p0, long p1) {
    for (long p = p0; p < p1; ++p)
      for (long m = 0; m < M; ++m) {
        float* out = y + m * N + 32 * p;
        if (exact_here(m, p)) {
          for (int c0 = 0; c0 < 2; c0 += LB(1))
            low_bit_panels<8, 1, 1, LB(1)>(x + m * K, K, (const unsigned char*)Q + p * K * 32, D + p * blocks * 32,
                                        nullptr, c0, out, N);
        } else {
          for (int j = 0; j < 32; ++j) out[j] = -INFINITY;
        }
      }
  });
  long exact = 0;
  for (long m = 0; m < M; ++m)
    for (long p = 0; p < P; ++p) exact += exact_here(m, p);
  free(hi);
  free(full);
  return exact;
}
