// attention.cpp's arithmetic on one tile of keys: a row's scores over it (dot, or passes of several keys with
// each key's bits dot's), the weighted sums of its values for a KV head's query heads, and a tile of a float32 or
// half cache (a run of slots, or gathered) as float32 rows.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

static inline float dot(const float* __restrict a, const float* __restrict b, long D) {
  v16 acc = v_zero();
  long k = 0;
  for (; k + 16 <= D; k += 16) acc = v_fmadd(v_load(a + k), v_load(b + k), acc);
  if (k < D) acc = v_fmadd(v_load_n(a + k, D - k), v_load_n(b + k, D - k), acc);
  return v_sum(acc);
}

#if !defined(ATTN_ONE_KEY_SCORES) && !defined(HAVE_V_SUM16)  // (scores' passes where AVX-512's 16-key one is not)
// x and y carried over 4 blocks of dot's chain for two keys (a and b, from the same block on), q's blocks in registers.
INLINE void two_keys(const v16 (&q)[4], const float* __restrict a, const float* __restrict b, v16& x, v16& y) {
  for (int c = 0; c < 4; ++c) {
    x = v_fmadd(q[c], v_load(a + 16 * c), x);
    y = v_fmadd(q[c], v_load(b + 16 * c), y);
  }
}

// p_j = (q . k_j) * scale for keys j .. of a head of 64 (k_j at k + 64 j), 4 keys a pass: q's 4 blocks held in
// registers (dot loads q again for every key: half of AVX2's loads), each key's FMA chain dot's, then v_sum4_scaled
// (on AVX2 the last levels of v_sum's tree for the 4 keys at once; elsewhere 4 v_sum). Returns the first key left.
static inline long scores_64(const float* __restrict q, const float* __restrict k, long j, long keys, float scale,
                             float* __restrict p) {
  const v16 qs[4] = {v_load(q), v_load(q + 16), v_load(q + 32), v_load(q + 48)};
  for (; j + 4 <= keys; j += 4) {
    v16 acc[4] = {v_zero(), v_zero(), v_zero(), v_zero()};
    for (int i = 0; i < 4; i += 2) two_keys(qs, k + (j + i) * 64, k + (j + i + 1) * 64, acc[i], acc[i + 1]);
    v_sum4_scaled(acc, scale, p + j);
  }
  return j;
}

// The same for a head of 128, 2 keys a pass: q's 8 blocks do not fit in AVX2's registers beside the sums, so they
// are held 4 at a time, each key's chain still dot's (blocks 0-3, then 4-7). Returns the first key left.
static inline long scores_128(const float* __restrict q, const float* __restrict k, long j, long keys, float scale,
                              float* __restrict p) {
  for (; j + 2 <= keys; j += 2) {
    v16 x = v_zero(), y = v_zero();
    for (int half = 0; half < 128; half += 64) {
      const v16 qs[4] = {v_load(q + half), v_load(q + half + 16), v_load(q + half + 32), v_load(q + half + 48)};
      two_keys(qs, k + j * 128 + half, k + (j + 1) * 128 + half, x, y);
    }
    p[j] = v_sum(x) * scale;
    p[j + 1] = v_sum(y) * scale;
  }
  return j;
}
#endif

// p_j = (q . k_j) * scale for keys 0 .. keys - 1 (k_j at k + j D), each key the bits of dot. With AVX-512, 16 keys
// at a time where D is a multiple of 16: each key's products summed as dot sums them, the 16 sums then reduced
// together by v_sum16, which adds v_sum's pairs. Elsewhere (AVX2, NEON) scores_64 and scores_128 at those head
// sizes: a Zen 1, one core, SmolLM2's 32-row call over 3000 keys 9.6 -> 7.9 ms, a decode's one row 342 -> 290 us;
// 16 heads of 128 over 8 KV heads (Qwen3-0.6B's), 32 rows 35.4 -> 31.5 ms. ATTN_ONE_KEY_SCORES takes every key
// through dot (tests/engine/test_attention_scores.py builds it so, for the passes' bits to be checked against it).
static inline void scores(const float* __restrict q, const float* __restrict k, long keys, long D, float scale,
                          float* __restrict p) {
  long j = 0;
#if defined(ATTN_ONE_KEY_SCORES)
#elif defined(HAVE_V_SUM16)
  if (D % 16 == 0)
    for (; j + 16 <= keys; j += 16) {
      v16 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = v_zero();
      for (long c = 0; c < D; c += 16) {
        const v16 qc = v_load(q + c);
        for (int i = 0; i < 16; ++i) acc[i] = v_fmadd(qc, v_load(k + (j + i) * D + c), acc[i]);
      }
      v_store(p + j, v_mul(v_sum16(acc), v_set1(scale)));
    }
#else
  if (D == 64) j = scores_64(q, k, j, keys, scale, p);
  if (D == 128) j = scores_128(q, k, j, keys, scale, p);
#endif
  for (; j < keys; ++j) p[j] = dot(q, k + j * D, D) * scale;
}

// o_g += sum_j p_gj v_j, t_g += sum_j p_gj over one tile of keys for G heads that share the values v (a KV head's
// query heads), D = 16 C: each head's C column blocks accumulate side by side (independent FMA chains, each still
// summing over j in key order: the same bits as one head and one block at a time), each v_j is loaded once for the
// G heads, and the scalar sums of the p_gj (in key order) run beside them, where their chains of dependent adds
// cost no time. The sums live in memory between tiles (acc_g at acc + g * ldacc, t_g at total[g]): stored and
// loaded back exactly, so the tiles of a row's keys, in key order, give the bits of one pass over them all.
template <int C, int G>
static inline void weighted_sums(const float* __restrict p, long ldp, const float* __restrict v, long keys, long D,
                                 float* __restrict acc_mem, long ldacc, float* __restrict totals) {
  v16 acc[G][C];
  float total[G];
  for (int g = 0; g < G; ++g) {
    total[g] = totals[g];
    for (int c = 0; c < C; ++c) acc[g][c] = v_load(acc_mem + g * ldacc + 16 * c);
  }
  for (long j = 0; j < keys; ++j)
    for (int c = 0; c < C; ++c) {
      const v16 vj = v_load(v + j * D + 16 * c);
      for (int g = 0; g < G; ++g) {
        if (c == 0) total[g] += p[g * ldp + j];
        acc[g][c] = v_fmadd(v_set1(p[g * ldp + j]), vj, acc[g][c]);
      }
    }
  for (int g = 0; g < G; ++g) {
    totals[g] = total[g];
    for (int c = 0; c < C; ++c) v_store(acc_mem + g * ldacc + 16 * c, acc[g][c]);
  }
}

// The G = heads sums of weighted_sums, at most ATTN_ACCUMULATORS (simd.h) accumulators a pass where it can (AVX-512
// at D = 64: 4 heads; AVX2 and NEON: 1), or for another head size one head and one 16-wide block at a time.
static void weighted_sums_any(const float* p, long ldp, const float* v, long keys, long D, long heads, float* acc,
                              long ldacc, float* totals) {
  const long most = D == 64 || D == 128 ? ATTN_ACCUMULATORS / (D / 16) : 1;  // heads a pass
  for (long g = 0; g < heads;) {
    const long take = most <= 1 ? 1 : heads - g < most ? heads - g : most;
    const float* pg = p + g * ldp;
    float* ag = acc + g * ldacc;
    float* tg = totals + g;
    if (D == 64 && take >= 4) {
      weighted_sums<4, 4>(pg, ldp, v, keys, D, ag, ldacc, tg);
    } else if (D == 64 && take == 3) {
      weighted_sums<4, 3>(pg, ldp, v, keys, D, ag, ldacc, tg);
    } else if (D == 64 && take == 2) {
      weighted_sums<4, 2>(pg, ldp, v, keys, D, ag, ldacc, tg);
    } else if (D == 64) {
      weighted_sums<4, 1>(pg, ldp, v, keys, D, ag, ldacc, tg);
    } else if (D == 128 && take >= 2) {
      weighted_sums<8, 2>(pg, ldp, v, keys, D, ag, ldacc, tg);
    } else if (D == 128) {
      weighted_sums<8, 1>(pg, ldp, v, keys, D, ag, ldacc, tg);
    } else {
      for (long j = 0; j < keys; ++j) *tg += pg[j];  // in key order
      for (long k = 0; k < D; k += 16) {
        v16 a = v_load(ag + k);  // ldacc: D rounded up to 16 (lanes past D stay 0)
        for (long j = 0; j < keys; ++j) a = v_fmadd(v_set1(pg[j]), v_load_n(v + j * D + k, D - k), a);
        v_store(ag + k, a);
      }
    }
    g += take;
  }
}

// Keys a tile: 16 KB of float32 keys (D = 64: 64).
static inline long tile_keys(long D) { return D <= 256 ? 4096 / D / 16 * 16 : 16; }

// `count` values of the cache as float32: in place for a float32 cache; for a half one (IEEE half bits) converted,
// exactly, into `buf`, once a tile for all the rows and heads that read it.
INLINE const float* as_float(const float* x, long, float*) { return x; }
INLINE const float* as_float(const uint16_t* x, long count, float* buf) {
  long i = 0;
  for (; i + 16 <= count; i += 16) v_store(buf + i, v_load_half(x + i));
  if (i < count) v_store_n(buf + i, v_load_half_n(x + i, count - i), count - i);
  return buf;
}
INLINE void copy_float(const float* x, long count, float* buf) { memcpy(buf, x, sizeof(float) * count); }
INLINE void copy_float(const uint16_t* x, long count, float* buf) { as_float(x, count, buf); }

// Keys (or values) j0 .. j0 + count - 1 of a sequence as float32 rows [count, D]: with `slot` null they lie in one
// run from `base` (as_float); else key j lies at base + slot[j] D, and the tile is gathered into `buf` row by row
// (converted, for a half cache): the same values in the same order, so the same bits as a gathered copy's.
template <typename T>
INLINE const float* tile_rows(const T* base, const long* slot, long j0, long count, long D, float* buf) {
  if (slot == nullptr) return as_float(base + j0 * D, count * D, buf);
  for (long i = 0; i < count; ++i) copy_float(base + slot[j0 + i] * D, D, buf + i * D);
  return buf;
}
