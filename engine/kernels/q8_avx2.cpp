// q8_gemm.cpp's products on AVX2 (x86 CPUs without AVX-512 VNNI): the same rounded activations, the same integer
// dot products, and the same float32 steps per output (one cvt, mul and FMAs in the same order), so the same bits
// (tested against the AVX-512 code on a CPU that runs both). The integer products go through vpmaddubsw (unsigned
// by signed bytes, pairs summed in int16) and vpmaddwd (pairs of int16 summed in int32):
// - 4 bits: q (0..15) by xq; a pair is at most 2 * 15 * 127 = 3810, so a block's 16 pairs per int16 lane (30480) fit
//   and the int16 sums widen once a block;
// - 8 bits: |q| by xq with q's sign (vpsignb); a pair is at most 2 * 127 * 127 = 32258, widened every 4 k.
// The panels are regrouped to 4 consecutive k per 32-bit lane by byte and word unpacks (no vpermb on AVX2).
#include <float.h>
#include <math.h>
#include <string.h>

#include "q8.h"

#if Q8_X86
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))

// q8_gemm.cpp's quantize_row, 8 lanes at a time: xq [K], dx and sx [K / 32].
AVX2 void q8_quantize_row_avx2(const float* x, long K, signed char* xq, float* dx, float* sx) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // the packs' lane order back to k order
  for (long b = 0; b < K / 32; ++b) {
    __m256 v[4], top = _mm256_setzero_ps();
    int nan = 0;
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
      top = _mm256_max_ps(top, _mm256_and_ps(v[i], magnitude));
      nan |= _mm256_movemask_ps(_mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    }
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    const float amax = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
    const float scale = 127.0f / amax;
    const __m256 inv = _mm256_set1_ps(amax > 0 && scale <= FLT_MAX ? scale : 0.0f);
    __m256i q[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      sum = _mm256_add_epi32(sum, q[i]);
    }
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i*)(xq + 32 * b), _mm256_permutevar8x32_epi32(bytes, order));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    dx[b] = nan || !(amax <= FLT_MAX) ? NAN : amax / 127.0f;  // NaN or inf in the block: NaN products
    sx[b] = dx[b] * (float)_mm_cvtsi128_si32(s);  // exact sum: |sum| <= 32 * 127
  }
}

// 4 bytes as an int (memcpy: no aliasing; _mm_loadu_si32 needs gcc 11).
static inline int four_bytes(const signed char* p) {
  int v;
  memcpy(&v, p, 4);
  return v;
}

// 4 floats at lo, then 4 at hi (_mm256_loadu2_m128, which gcc 9 lacks).
AVX2 static inline __m256 halves(const float* lo, const float* hi) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1);
}

// fma(float(dot), d * dx, acc) for 8 outputs: q8_gemm.cpp's step per block (4 bits then add fma(m, sx, .)).
AVX2 static inline __m256 accumulate(__m256 acc, __m256i dot, __m256 d, float dx) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc);
}

// One 4-bit panel (32 columns), every row: Q [K][16], D and Mn [K / 32][32]; y at the panel's column 0 (zeroed
// here: every block adds to it, as q8_gemm.cpp's registers do). A block's weights are regrouped once into w (1 KB,
// in L1), then the rows take them ROWS4 at a time.
#define ROWS4 3
AVX2 static void panel4_rows(const signed char* xq, const float* dx, const float* sx, long K, const unsigned char* Q,
                             const float* D, const float* Mn, float* y, long ldy, long rows) {
  const long blocks = K / 32;
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (long m = 0; m < rows; ++m)
    for (int c = 0; c < 32; c += 8) _mm256_storeu_ps(y + m * ldy + c, _mm256_setzero_ps());
  for (long b = 0; b < blocks; ++b) {
    __m256i w[8][4];  // per 4 k: columns 0-7, 8-15, 16-23, 24-31, 4 bytes (k) a lane
    for (int t = 0; t < 8; ++t) {
      const unsigned char* q = Q + (32 * b + 4 * t) * 16;
      const __m128i k0 = _mm_loadu_si128((const __m128i*)q), k1 = _mm_loadu_si128((const __m128i*)(q + 16));
      const __m128i k2 = _mm_loadu_si128((const __m128i*)(q + 32)), k3 = _mm_loadu_si128((const __m128i*)(q + 48));
      const __m128i a = _mm_unpacklo_epi8(k0, k1), c = _mm_unpacklo_epi8(k2, k3);  // bytes 0-7: k pairs
      const __m128i e = _mm_unpackhi_epi8(k0, k1), f = _mm_unpackhi_epi8(k2, k3);  // bytes 8-15
      const __m256i lo = _mm256_set_m128i(_mm_unpackhi_epi16(a, c), _mm_unpacklo_epi16(a, c));  // bytes 0-7: 4 k
      const __m256i hi = _mm256_set_m128i(_mm_unpackhi_epi16(e, f), _mm_unpacklo_epi16(e, f));  // bytes 8-15
      w[t][0] = _mm256_and_si256(lo, nibble);
      w[t][1] = _mm256_and_si256(hi, nibble);
      w[t][2] = _mm256_and_si256(_mm256_srli_epi16(lo, 4), nibble);
      w[t][3] = _mm256_and_si256(_mm256_srli_epi16(hi, 4), nibble);
    }
    for (long m0 = 0; m0 < rows; m0 += ROWS4) {
      const int R = rows - m0 < ROWS4 ? (int)(rows - m0) : ROWS4;
      __m256i s[ROWS4][4];  // int16 pair sums
      for (int r = 0; r < ROWS4; ++r)
        for (int c4 = 0; c4 < 4; ++c4) s[r][c4] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t)
        for (int r = 0; r < R; ++r) {
          const __m256i xb = _mm256_set1_epi32(four_bytes(xq + (m0 + r) * K + 32 * b + 4 * t));
          for (int c4 = 0; c4 < 4; ++c4) s[r][c4] = _mm256_add_epi16(s[r][c4], _mm256_maddubs_epi16(w[t][c4], xb));
        }
      for (int r = 0; r < R; ++r)
        for (int c4 = 0; c4 < 4; ++c4) {
          float* out = y + (m0 + r) * ldy + 8 * c4;
          const long row_block = (m0 + r) * blocks + b;
          __m256 acc = accumulate(_mm256_loadu_ps(out), _mm256_madd_epi16(s[r][c4], ones),
                                  _mm256_loadu_ps(D + 32 * b + 8 * c4), dx[row_block]);
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(Mn + 32 * b + 8 * c4), _mm256_set1_ps(sx[row_block]), acc);
          _mm256_storeu_ps(out, acc);
        }
    }
  }
}

// One 8-bit panel, every row: Q [K][32] signed bytes, D [K / 32][32]. The unpacks work within 128-bit halves, so
// vector c holds columns 4c..4c+3 and 16+4c..16+4c+3: D and y are read and written in that order. A block's
// weights are regrouped once (|q| and q, 2 KB), then the rows take them ROWS8 at a time.
#define ROWS8 2
AVX2 static void panel8_rows(const signed char* xq, const float* dx, long K, const unsigned char* Q, const float* D,
                             float* y, long ldy, long rows) {
  const long blocks = K / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  for (long m = 0; m < rows; ++m)
    for (int c = 0; c < 32; c += 8) _mm256_storeu_ps(y + m * ldy + c, _mm256_setzero_ps());
  for (long b = 0; b < blocks; ++b) {
    __m256i w[8][4], size[8][4];  // q and |q| per 4 k, 4 bytes (k) a lane
    for (int t = 0; t < 8; ++t) {
      const __m256i* q = (const __m256i*)(Q + (32 * b + 4 * t) * 32);
      const __m256i k0 = _mm256_loadu_si256(q), k1 = _mm256_loadu_si256(q + 1);
      const __m256i k2 = _mm256_loadu_si256(q + 2), k3 = _mm256_loadu_si256(q + 3);
      const __m256i a = _mm256_unpacklo_epi8(k0, k1), c = _mm256_unpacklo_epi8(k2, k3);
      const __m256i e = _mm256_unpackhi_epi8(k0, k1), f = _mm256_unpackhi_epi8(k2, k3);
      w[t][0] = _mm256_unpacklo_epi16(a, c);
      w[t][1] = _mm256_unpackhi_epi16(a, c);
      w[t][2] = _mm256_unpacklo_epi16(e, f);
      w[t][3] = _mm256_unpackhi_epi16(e, f);
      for (int c4 = 0; c4 < 4; ++c4) size[t][c4] = _mm256_abs_epi8(w[t][c4]);
    }
    for (long m0 = 0; m0 < rows; m0 += ROWS8) {
      const int R = rows - m0 < ROWS8 ? (int)(rows - m0) : ROWS8;
      __m256i s[ROWS8][4];
      for (int r = 0; r < ROWS8; ++r)
        for (int c4 = 0; c4 < 4; ++c4) s[r][c4] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t)
        for (int r = 0; r < R; ++r) {
          const __m256i xb = _mm256_set1_epi32(four_bytes(xq + (m0 + r) * K + 32 * b + 4 * t));
          for (int c4 = 0; c4 < 4; ++c4) {
            const __m256i pairs = _mm256_maddubs_epi16(size[t][c4], _mm256_sign_epi8(xb, w[t][c4]));
            s[r][c4] = _mm256_add_epi32(s[r][c4], _mm256_madd_epi16(pairs, ones));
          }
        }
      for (int r = 0; r < R; ++r) {
        float* out = y + (m0 + r) * ldy;
        for (int c4 = 0; c4 < 4; ++c4) {
          const float* d = D + 32 * b;
          const __m256 acc = accumulate(halves(out + 4 * c4, out + 16 + 4 * c4), s[r][c4],
                                        halves(d + 4 * c4, d + 16 + 4 * c4), dx[(m0 + r) * blocks + b]);
          _mm_storeu_ps(out + 4 * c4, _mm256_castps256_ps128(acc));
          _mm_storeu_ps(out + 16 + 4 * c4, _mm256_extractf128_ps(acc, 1));
        }
      }
    }
  }
}

// Panels p0..p1-1, every row: q8_gemm.cpp's q8_panels for AVX2 (BITS 4 or 8).
AVX2 void q8_panels_avx2(int bits, const signed char* xq, const float* dx, const float* sx, long M, long K,
                         const unsigned char* Q, const float* D, const float* Mn, float* y, long N, long p0, long p1) {
  const long blocks = K / 32;
  for (long p = p0; p < p1; ++p)
    if (bits == 4)
      panel4_rows(xq, dx, sx, K, Q + p * K * 16, D + p * blocks * 32, Mn + p * blocks * 32, y + 32 * p, N, M);
    else
      panel8_rows(xq, dx, K, Q + p * K * 32, D + p * blocks * 32, y + 32 * p, N, M);
}
#endif
