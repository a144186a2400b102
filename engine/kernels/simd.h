// 16 float lanes, on AVX-512 (one __m512), AVX2 + FMA (two __m256: lanes 0-7, then 8-15) or AArch64's NEON (four
// float32x4_t: lanes 0-3, 4-7, 8-11, 12-15), for the CPU kernels (engine/layers/native.py builds them for the best
// the CPU has).
//
// Every operation is lane-wise IEEE float32 (one rounding per lane, FMAs fused), and the one cross-lane operation,
// v_sum, adds in a fixed tree (gcc's _mm512_reduce_add_ps order), so a kernel written on v16 computes the same
// bits on any of them (tested: tests/engine/test_isa.py builds them all, NEON with a cross compiler and run under
// qemu, and compares every kernel). Only the register budget differs: AVX2 has 16 registers of 8 lanes and NEON 32
// of 4 (8 v16 values either way), AVX-512 32 of 16, so the GEMMs take fewer rows and columns per pass on AVX2 and
// NEON (FP32_* and LOW_BIT_* below), which changes their loop nests, never an output's FMA chain.
#pragma once

#include <stdint.h>
#include <string.h>

#define INLINE __attribute__((always_inline)) static inline
#define v_prefetch(p) __builtin_prefetch((const void*)(p), 0, 3)  // into every cache level (x86: prefetcht0)

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
typedef __m128i b16;  // 16 bytes
INLINE b16 b_load(const unsigned char* p) { return _mm_loadu_si128((const __m128i*)p); }
INLINE b16 b_low_nibbles(b16 b) { return _mm_and_si128(b, _mm_set1_epi8(0x0F)); }
INLINE b16 b_high_nibbles(b16 b) { return _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F)); }
#endif

#if defined(__AVX512F__)
#define ISA_NAME "avx512"
typedef __m512 v16;
typedef __mmask16 vmask;
INLINE v16 v_zero() { return _mm512_setzero_ps(); }
INLINE v16 v_set1(float f) { return _mm512_set1_ps(f); }
INLINE v16 v_load(const float* p) { return _mm512_loadu_ps(p); }
INLINE void v_store(float* p, v16 v) { _mm512_storeu_ps(p, v); }
INLINE __mmask16 tail_mask(long n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n > 0 ? n : 0)) - 1); }
INLINE v16 v_load_n(const float* p, long n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }  // lanes >= n: 0
INLINE void v_store_n(float* p, v16 v, long n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
INLINE v16 v_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
INLINE v16 v_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
INLINE v16 v_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
INLINE v16 v_div(v16 a, v16 b) { return _mm512_div_ps(a, b); }
INLINE v16 v_max(v16 a, v16 b) { return _mm512_max_ps(a, b); }
INLINE v16 v_fmadd(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }    // a * b + c
INLINE v16 v_fnmadd(v16 a, v16 b, v16 c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
INLINE v16 v_round(v16 a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
INLINE v16 v_pow2(v16 n) {  // 2^n for integral n in the normal range
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
INLINE vmask v_below(v16 a, v16 b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
INLINE v16 v_zero_where(vmask m, v16 a) { return _mm512_maskz_mov_ps(~m, a); }
INLINE v16 v_select(vmask m, v16 a, v16 b) { return _mm512_mask_mov_ps(b, m, a); }  // m ? a : b
INLINE v16 v_from_u8(b16 b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }  // 16 unsigned bytes
INLINE v16 v_from_i8(b16 b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }  // 16 signed bytes
INLINE v16 v_load_half(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
INLINE void v_store_half(uint16_t* p, v16 v) {  // to nearest, ties to even (torch's .half())
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
INLINE __m256 v_fold(v16 a) {  // lanes 8-15 plus lanes 0-7
  return _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)), _mm512_castps512_ps256(a));
}
// v_sum of 16 vectors at once, lane j <- v_sum(a[j]) (its pairs of additions: the same sums; a NaN's payload may
// differ, as the compiler may swap an addition's operands): per level two shuffles and one add for two registers,
// 15 adds and 30 shuffles in all, against about 7 operations a v_sum.
#define HAVE_V_SUM16 1
INLINE v16 v_sum16(const v16* a) {
  static const int first[8] = {0, 8, 1, 9, 2, 10, 3, 11};  // a[j] and a[j + 4] share a register at the first level
  v16 r[8], s[4], t[2];
  for (int i = 0; i < 8; ++i) {  // lanes 0-7: a[i] + a[i + 8] of one vector, 8-15 of the other (v_fold's pairs)
    const v16 x = a[first[i]], y = a[first[i] + 4];
    r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)), _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)));
  }
  for (int i = 0; i < 4; ++i)  // 128-bit lane c: lanes 0-3 + lanes 4-7 of each level-1 sum
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)),
                         _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)));
  for (int i = 0; i < 2; ++i)  // elements 0 + 2 and 1 + 3 of each 4
    t[i] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),  // then the two that are left
                       _mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));  // lanes: a[0] .. a[15], in order
}
// The GEMMs' passes (engine/kernels/panel_gemm.cpp): rows and 16-column blocks of a panel per pass, for the
// float32 panels (memory-bound: several panels at once for few rows, more streams in flight) and the low-bit ones
// (compute-bound: each weight rebuilt once per pass). Accumulators: a register per row and block.
#define FP32_ROWS 8
#define FP32_GROUP(m) ((m) <= 2 ? 4 : (m) <= 6 ? 2 : 1)  // panels at once
#define LOW_BIT_ROWS 8
#define LOW_BIT_BLOCKS(m) 2
#define LOW_BIT_GROUP(m) ((m) <= 4 ? 2 : 1)
#define LOW_BIT_REBUILD_ROWS (1L << 40)  // panel_gemm.cpp: not measured on AVX-512, so never
#define FP32_TALL_ROWS (1L << 40)  // panel_gemm.cpp: not measured here, so never
#define ATTN_ACCUMULATORS 16  // attention.cpp's value sums: v16 accumulators a pass (heads x D / 16)

#elif defined(__AVX2__) && defined(__FMA__)
#define ISA_NAME "avx2"
struct v16 {
  __m256 lo, hi;
};
struct vmask {
  __m256 lo, hi;
};
INLINE v16 v_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
INLINE v16 v_set1(float f) { return {_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
INLINE v16 v_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
INLINE void v_store(float* p, v16 v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
INLINE __m256i half_mask(long n, int first) {  // lanes first.. first+7 that are < n
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 16 ? n : 16)),
                            _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(first)));
}
INLINE v16 v_load_n(const float* p, long n) {
  return {_mm256_maskload_ps(p, half_mask(n, 0)), _mm256_maskload_ps(p + 8, half_mask(n, 8))};
}
INLINE void v_store_n(float* p, v16 v, long n) {
  _mm256_maskstore_ps(p, half_mask(n, 0), v.lo);
  _mm256_maskstore_ps(p + 8, half_mask(n, 8), v.hi);
}
#define LANEWISE2(name, op) \
  INLINE v16 name(v16 a, v16 b) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }
LANEWISE2(v_add, _mm256_add_ps)
LANEWISE2(v_sub, _mm256_sub_ps)
LANEWISE2(v_mul, _mm256_mul_ps)
LANEWISE2(v_div, _mm256_div_ps)
LANEWISE2(v_max, _mm256_max_ps)
INLINE v16 v_fmadd(v16 a, v16 b, v16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
INLINE v16 v_fnmadd(v16 a, v16 b, v16 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
INLINE __m256 round8(__m256 a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
INLINE v16 v_round(v16 a) { return {round8(a.lo), round8(a.hi)}; }
INLINE __m256 pow2_8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
INLINE v16 v_pow2(v16 n) { return {pow2_8(n.lo), pow2_8(n.hi)}; }
INLINE vmask v_below(v16 a, v16 b) {
  return {_mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ)};
}
INLINE v16 v_zero_where(vmask m, v16 a) { return {_mm256_andnot_ps(m.lo, a.lo), _mm256_andnot_ps(m.hi, a.hi)}; }
INLINE v16 v_select(vmask m, v16 a, v16 b) {  // m ? a : b
  return {_mm256_blendv_ps(b.lo, a.lo, m.lo), _mm256_blendv_ps(b.hi, a.hi, m.hi)};
}
// The low (high = 0) or high nibbles of the 16 bytes at p as floats, byte j's in lane j (the other builds'
// v_from_nibbles below: v_from_u8 of b_low_nibbles or b_high_nibbles of b_load(p)), in fewer vector operations: each
// 8 bytes widened to 32-bit lanes as they load (vpmovzxbd from memory), then masked or shifted there, instead of
// nibbles taken in 128 bits, the upper 8 bytes shifted down, and both widened from a register (vpmovzxbd from a
// register crosses the 128-bit halves: two operations on Zen 3). The low-bit GEMMs' one-row steps were bound by
// them: SmolLM2-135M's one-row matmuls on a Zen 3, a loop over them, took 16.3 ms, 12.7 with in-lane byte shuffles
// of a broadcast load, 11.1 so (README "AVX2 CPUs", scripts/matmul_rows.py: 18.8 -> 11.7 ms).
#define HAVE_V_FROM_NIBBLES 1  // (and v_from_i8_at)
INLINE v16 v_from_nibbles(const unsigned char* p, int high) {
  const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));  // bytes 0-7, one a lane
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));  // 8-15
  if (high) return {_mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4))};
  const __m256i nibble = _mm256_set1_epi32(0x0F);
  return {_mm256_cvtepi32_ps(_mm256_and_si256(lo, nibble)), _mm256_cvtepi32_ps(_mm256_and_si256(hi, nibble))};
}
// The 16 signed bytes at p as floats (the other builds': v_from_i8 of b_load(p)), each 8 widened as they load.
INLINE v16 v_from_i8_at(const unsigned char* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))))};
}
INLINE __m256 v_fold(v16 a) { return _mm256_add_ps(a.hi, a.lo); }
INLINE v16 v_load_half(const uint16_t* p) {  // F16C
  return {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
INLINE void v_store_half(uint16_t* p, v16 v) {  // to nearest, ties to even (torch's .half())
  _mm_storeu_si128((__m128i*)p, _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  _mm_storeu_si128((__m128i*)(p + 8), _mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// 16 registers: a float32 pass takes 2 rows of whole panels (the others stream from cache again), a low-bit pass
// 5 rows of half a panel (the low nibbles, then the high ones), or 1 or 2 rows of the whole panel (SmolLM2-135M's
// matmuls on a Zen 3, a loop over them, ms a step, whole / half: 1 row 11.2-11.4 / 14.2-14.6, 2 rows 14.6-15.1 /
// 15.6-15.8, 3 rows 22.3 / 18.6-19.2: spilled).
#define FP32_ROWS 2
#define FP32_GROUP(m) ((m) <= 1 ? 2 : 1)
#define LOW_BIT_ROWS 5
#define LOW_BIT_BLOCKS(m) ((m) <= 2 ? 2 : 1)
#define LOW_BIT_GROUP(m) 1
#define LOW_BIT_REBUILD_ROWS 11  // panel_gemm.cpp (measured on a Zen 3: from 11 rows on)
#define FP32_TALL_ROWS 24  // panel_gemm.cpp (measured on a Zen 1: from 24 rows on)
#define ATTN_ACCUMULATORS 4
// out[i] = v_sum(a[i]) * scale for 4 vectors: v_sum's tree (below), its first two levels a vector at a time as there,
// its last two on the 4 vectors at once (6 shuffles and 3 adds, where 4 v_sum take 8 shuffles and 8 adds, the
// last of each scalar): attention.cpp's scores, 4 keys a pass.
#define HAVE_V_SUM4 1
INLINE void v_sum4_scaled(const v16* a, float scale, float* out) {
  __m128 t6[4];
  for (int i = 0; i < 4; ++i) {  // lanes 8-15 onto 0-7, then 4-7 onto 0-3
    const __m256 t3 = v_fold(a[i]);
    t6[i] = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  }
  __m128 t8[2];
  for (int i = 0; i < 2; ++i)  // 2-3 onto 0-1: [a[2i]'s two sums, a[2i + 1]'s]
    t8[i] = _mm_add_ps(_mm_shuffle_ps(t6[2 * i], t6[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm_shuffle_ps(t6[2 * i], t6[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m128 sums = _mm_add_ps(_mm_shuffle_ps(t8[0], t8[1], _MM_SHUFFLE(2, 0, 2, 0)),  // 1 onto 0
                                 _mm_shuffle_ps(t8[0], t8[1], _MM_SHUFFLE(3, 1, 3, 1)));
  _mm_storeu_ps(out, _mm_mul_ps(sums, _mm_set1_ps(scale)));
}

#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#include <string.h>
#define ISA_NAME "neon"
struct v16 {
  float32x4_t q[4];
};
struct vmask {
  uint32x4_t q[4];
};
typedef uint8x16_t b16;
// Each op: its float32x4_t op on the four quarters.
#define QUARTERS(op) \
  v16 r;             \
  for (int i = 0; i < 4; ++i) r.q[i] = op;   \
  return r;
INLINE v16 v_zero() { QUARTERS(vdupq_n_f32(0.0f)) }
INLINE v16 v_set1(float f) { QUARTERS(vdupq_n_f32(f)) }
INLINE v16 v_load(const float* p) { QUARTERS(vld1q_f32(p + 4 * i)) }
INLINE void v_store(float* p, v16 v) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, v.q[i]);
}
INLINE long lanes(long n) { return n < 0 ? 0 : n > 16 ? 16 : n; }
INLINE v16 v_load_n(const float* p, long n) {  // lanes >= n: 0 (no masked loads: through a zeroed buffer)
  if (n >= 16) return v_load(p);
  float t[16] = {0};
  memcpy(t, p, sizeof(float) * lanes(n));
  return v_load(t);
}
INLINE void v_store_n(float* p, v16 v, long n) {
  if (n >= 16) return v_store(p, v);
  float t[16];
  v_store(t, v);
  memcpy(p, t, sizeof(float) * lanes(n));
}
INLINE v16 v_add(v16 a, v16 b) { QUARTERS(vaddq_f32(a.q[i], b.q[i])) }
INLINE v16 v_sub(v16 a, v16 b) { QUARTERS(vsubq_f32(a.q[i], b.q[i])) }
INLINE v16 v_mul(v16 a, v16 b) { QUARTERS(vmulq_f32(a.q[i], b.q[i])) }
INLINE v16 v_div(v16 a, v16 b) { QUARTERS(vdivq_f32(a.q[i], b.q[i])) }
// x86's max: a > b ? a : b (the second operand for NaNs and for +-0, where vmaxq_f32 differs)
INLINE v16 v_max(v16 a, v16 b) { QUARTERS(vbslq_f32(vcgtq_f32(a.q[i], b.q[i]), a.q[i], b.q[i])) }
INLINE v16 v_fmadd(v16 a, v16 b, v16 c) { QUARTERS(vfmaq_f32(c.q[i], a.q[i], b.q[i])) }  // a * b + c
INLINE v16 v_fnmadd(v16 a, v16 b, v16 c) { QUARTERS(vfmsq_f32(c.q[i], a.q[i], b.q[i])) }  // c - a * b
INLINE v16 v_round(v16 a) { QUARTERS(vrndnq_f32(a.q[i])) }  // to nearest, ties to even, as x86's
INLINE v16 v_pow2(v16 n) {  // 2^n for integral n in the normal range
  QUARTERS(vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n.q[i]), vdupq_n_s32(127)), 23)))
}
INLINE vmask v_below(v16 a, v16 b) {
  vmask m;
  for (int i = 0; i < 4; ++i) m.q[i] = vcltq_f32(a.q[i], b.q[i]);
  return m;
}
INLINE v16 v_zero_where(vmask m, v16 a) { QUARTERS(vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(a.q[i]), m.q[i]))) }
INLINE v16 v_select(vmask m, v16 a, v16 b) { QUARTERS(vbslq_f32(m.q[i], a.q[i], b.q[i])) }  // m ? a : b
INLINE b16 b_load(const unsigned char* p) { return vld1q_u8(p); }
INLINE b16 b_low_nibbles(b16 b) { return vandq_u8(b, vdupq_n_u8(0x0F)); }
INLINE b16 b_high_nibbles(b16 b) { return vshrq_n_u8(b, 4); }
INLINE v16 v_from_u8(b16 b) {  // 16 unsigned bytes
  const uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_high_u8(b);
  const uint32x4_t w[4] = {vmovl_u16(vget_low_u16(lo)), vmovl_high_u16(lo), vmovl_u16(vget_low_u16(hi)),
                           vmovl_high_u16(hi)};
  QUARTERS(vcvtq_f32_u32(w[i]))
}
INLINE v16 v_from_i8(b16 b) {  // 16 signed bytes
  const int8x16_t s = vreinterpretq_s8_u8(b);
  const int16x8_t lo = vmovl_s8(vget_low_s8(s)), hi = vmovl_high_s8(s);
  const int32x4_t w[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_high_s16(lo), vmovl_s16(vget_low_s16(hi)),
                          vmovl_high_s16(hi)};
  QUARTERS(vcvtq_f32_s32(w[i]))
}
INLINE v16 v_load_half(const uint16_t* p) { QUARTERS(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)))) }
INLINE void v_store_half(uint16_t* p, v16 v) {  // to nearest, ties to even (the FPCR's default; torch's .half())
  for (int i = 0; i < 4; ++i) vst1_u16(p + 4 * i, vreinterpret_u16_f16(vcvt_f16_f32(v.q[i])));
}
// The sum of the 16 lanes in v_sum's tree (below): lanes 8-15 onto 0-7, 4-7 onto 0-3, 2-3 onto 0-1, 1 onto 0.
INLINE float v_sum(v16 a) {
  const float32x4_t t = vaddq_f32(vaddq_f32(a.q[1], a.q[3]), vaddq_f32(a.q[0], a.q[2]));
  const float32x2_t u = vadd_f32(vget_high_f32(t), vget_low_f32(t));
  return vget_lane_f32(u, 0) + vget_lane_f32(u, 1);
}
#undef QUARTERS
// 8 v16 values in registers, as on AVX2: its passes.
#define FP32_ROWS 2
#define FP32_GROUP(m) ((m) <= 1 ? 2 : 1)
#define LOW_BIT_ROWS 5
#define LOW_BIT_BLOCKS(m) 1
#define LOW_BIT_GROUP(m) 1
#define LOW_BIT_REBUILD_ROWS (1L << 40)  // panel_gemm.cpp: not measured on NEON, so never
#define FP32_TALL_ROWS (1L << 40)  // panel_gemm.cpp: not measured here, so never
#define ATTN_ACCUMULATORS 4

#else
#error "the CPU kernels need AVX-512, AVX2 with FMA, or AArch64 (NEON)"
#endif

#ifndef HAVE_V_FROM_NIBBLES
// The low (high = 0) or high nibbles of the 16 bytes at p as floats, byte j's in lane j.
INLINE v16 v_from_nibbles(const unsigned char* p, int high) {
  const b16 b = b_load(p);
  return v_from_u8(high ? b_high_nibbles(b) : b_low_nibbles(b));
}
// The 16 signed bytes at p as floats.
INLINE v16 v_from_i8_at(const unsigned char* p) { return v_from_i8(b_load(p)); }
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// The sum of the 16 lanes: lanes 8-15 onto 0-7, then 4-7 onto 0-3, then 2-3 onto 0-1, then lane 1 onto 0.
INLINE float v_sum(v16 a) {
  const __m256 t3 = v_fold(a);
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}
#endif

#if !defined(HAVE_V_SUM4)
INLINE void v_sum4_scaled(const v16* a, float scale, float* out) {
  for (int i = 0; i < 4; ++i) out[i] = v_sum(a[i]) * scale;
}
#endif

// IEEE half (binary16) keys and values, as uint16_t bits: 16 lanes converted exactly to float32 on load, and
// float32 rounded to nearest (ties to even) on store, as torch converts. The n-lane forms go through a buffer.
INLINE v16 v_load_half_n(const uint16_t* p, long n) {  // lanes >= n: 0
  if (n >= 16) return v_load_half(p);
  uint16_t t[16] = {0};
  memcpy(t, p, sizeof(uint16_t) * (n > 0 ? n : 0));
  return v_load_half(t);
}
INLINE void v_store_half_n(uint16_t* p, v16 v, long n) {
  if (n >= 16) return v_store_half(p, v);
  uint16_t t[16];
  v_store_half(t, v);
  memcpy(p, t, sizeof(uint16_t) * (n > 0 ? n : 0));
}

// exp(x) for 16 x <= 0 at once (Cephes' expf: x = n ln 2 + r, |r| <= ln 2 / 2, a degree-6 polynomial in r, times
// 2^n; within a few ulp of libm's), 0 below -87: attention.cpp's softmax and sampling.cpp's. Which of a row's keys
// take it in attention (all but the last keys % 16, which take libm's expf) depends only on the row's own key count:
// the same in a one-row step and in a verify.
static inline v16 exp16(v16 x) {
  const v16 lo = v_set1(-87.33654f);
  const vmask zero = v_below(x, lo);
  x = v_max(x, lo);
  const v16 n = v_round(v_mul(x, v_set1(1.44269504088896341f)));
  v16 r = v_fnmadd(n, v_set1(0.693359375f), x);
  r = v_fnmadd(n, v_set1(-2.12194440e-4f), r);
  v16 y = v_set1(1.9875691500e-4f);
  y = v_fmadd(y, r, v_set1(1.3981999507e-3f));
  y = v_fmadd(y, r, v_set1(8.3334519073e-3f));
  y = v_fmadd(y, r, v_set1(4.1665795894e-2f));
  y = v_fmadd(y, r, v_set1(1.6666665459e-1f));
  y = v_fmadd(y, r, v_set1(5.0000001201e-1f));
  y = v_fmadd(y, v_mul(r, r), v_add(r, v_set1(1.0f)));
  return v_zero_where(zero, v_mul(y, v_pow2(n)));
}
