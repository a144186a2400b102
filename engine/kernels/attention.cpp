// Causal attention of a few query rows of one sequence whose keys lie in one run of KV-cache slots, each row
// computed by the same code in the same order whatever the row count: row r of an n-row step (a verify) gets the
// bits a one-row decode step of that token gets, as the panel GEMM and rms_norm.cpp give their rows. Built into
// the panel kernels' library (engine/layers/native.py), called by engine/attention/sdpa.py.
//
// Row r (of n) sees keys 0 .. t - n + r of the run; head h reads KV head h / (H / KVH). Per row and head:
// s_j = (q . k_j) * scale, p_j = exp(s_j - max s), o = (sum_j p_j v_j) / (sum_j p_j), sums in key order.
// Per layer, SmolLM2's 9 heads over 3 KV heads, one core, 300 keys in cache, 1 / 5 rows: 13 / 56-64 us (README).
#include <math.h>
#include <stdlib.h>

#include "simd.h"
#include "threads.h"

static inline float dot(const float* __restrict a, const float* __restrict b, long D) {
  v16 acc = v_zero();
  long k = 0;
  for (; k + 16 <= D; k += 16) acc = v_fmadd(v_load(a + k), v_load(b + k), acc);
  if (k < D) acc = v_fmadd(v_load_n(a + k, D - k), v_load_n(b + k, D - k), acc);
  return v_sum(acc);
}

// exp(x) for 16 x <= 0 at once (Cephes' expf: x = n ln 2 + r, |r| <= ln 2 / 2, a degree-6 polynomial in r, times
// 2^n; within a few ulp of libm's), 0 below -87. Which of a row's keys take it (all but the last keys % 16, which
// take libm's expf) depends only on the row's own key count: the same in a one-row step and in a verify.
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

// p_j = (q . k_j) * scale for keys 0 .. keys - 1 (k_j at k + j D). With AVX-512, 16 keys at a time where D is a
// multiple of 16: each key's products summed as dot sums them, the 16 sums then reduced together by v_sum16,
// which adds v_sum's pairs: the same bits as dot, key by key.
static inline void scores(const float* __restrict q, const float* __restrict k, long keys, long D, float scale,
                          float* __restrict p) {
  long j = 0;
#if defined(HAVE_V_SUM16)
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
#endif
  for (; j < keys; ++j) p[j] = dot(q, k + j * D, D) * scale;
}

// o_g = (sum_j p_gj v_j) / (sum_j p_gj) for G heads that share the values v (a KV head's query heads), D = 16 C:
// each head's C column blocks accumulate side by side (independent FMA chains, each still summing over j in key
// order: the same bits as one head and one block at a time), each v_j is loaded once for the G heads, and the
// scalar sums of the p_gj (in key order) run beside them, where their chains of dependent adds cost no time.
// p_g at p + g * ldp, o_g at o + g * D.
template <int C, int G>
static inline void weighted_sums(const float* __restrict p, long ldp, const float* __restrict v, long keys, long D,
                                 float* __restrict o) {
  v16 acc[G][C];
  float total[G];
  for (int g = 0; g < G; ++g) {
    total[g] = 0.0f;
    for (int c = 0; c < C; ++c) acc[g][c] = v_zero();
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
    const v16 inv = v_set1(1.0f / total[g]);
    for (int c = 0; c < C; ++c) v_store(o + g * D + 16 * c, v_mul(acc[g][c], inv));
  }
}

// The G = heads sums of weighted_sums, at most ATTN_ACCUMULATORS (simd.h) accumulators a pass where it can (AVX-512
// at D = 64: 4 heads; AVX2 and NEON: 1), or for another head size one head and one 16-wide block at a time.
static void weighted_sums_any(const float* p, long ldp, const float* v, long keys, long D, long heads, float* o) {
  const long most = D == 64 || D == 128 ? ATTN_ACCUMULATORS / (D / 16) : 1;  // heads a pass
  for (long g = 0; g < heads;) {
    const long take = most <= 1 ? 1 : heads - g < most ? heads - g : most;
    const float* pg = p + g * ldp;
    float* og = o + g * D;
    if (D == 64 && take >= 4) {
      weighted_sums<4, 4>(pg, ldp, v, keys, D, og);
    } else if (D == 64 && take == 3) {
      weighted_sums<4, 3>(pg, ldp, v, keys, D, og);
    } else if (D == 64 && take == 2) {
      weighted_sums<4, 2>(pg, ldp, v, keys, D, og);
    } else if (D == 64) {
      weighted_sums<4, 1>(pg, ldp, v, keys, D, og);
    } else if (D == 128 && take >= 2) {
      weighted_sums<8, 2>(pg, ldp, v, keys, D, og);
    } else if (D == 128) {
      weighted_sums<8, 1>(pg, ldp, v, keys, D, og);
    } else {
      float total = 0.0f;
      for (long j = 0; j < keys; ++j) total += pg[j];  // in key order
      for (long k = 0; k < D; k += 16) {
        v16 acc = v_zero();
        for (long j = 0; j < keys; ++j) acc = v_fmadd(v_set1(pg[j]), v_load_n(v + j * D + k, D - k), acc);
        v_store_n(og + k, v_mul(acc, v_set1(1.0f / total)), D - k);
      }
    }
    g += take;
  }
}

// q: [n, H, D]; K, V: [KVH, S, D] (the cache), the run at slots first .. first + t - 1; out: [n, H * D]. The query
// heads of one KV head go together: their scores one after the other (the keys in L2 after the first), then one pass
// over the values for all of them; every head's arithmetic is its own, in the order above. (Scoring blocks of keys
// for every head while they sat in L1 was faster from cache and 10% slower where the keys came from memory.) The
// n x KVH (row, KV head) pairs are split over `threads` threads (threads.h), which changes no output's arithmetic.
extern "C" void causal_attention(const float* q, long n, long H, long D, const float* K, const float* V, long KVH,
                                 long S, long first, long t, float scale, float* out, int threads) {
  const long group = H / KVH;
  over_panels(n * KVH, threads, [&](long i0, long i1) {
    float* p = (float*)malloc(sizeof(float) * group * (t > 0 ? t : 1));  // [group, keys]
    for (long i = i0; i < i1; ++i) {
      const long r = i / KVH, kv = i % KVH, keys = t - n + r + 1;
      const float* qv = q + (r * H + kv * group) * D;
      const float* kr = K + (kv * S + first) * D;
      const float* vr = V + (kv * S + first) * D;
      for (long h = 0; h < group; ++h) {
        float* ph = p + h * keys;
        scores(qv + h * D, kr, keys, D, scale, ph);
        float top = -INFINITY;
        for (long j = 0; j < keys; ++j) top = ph[j] > top ? ph[j] : top;
        long j = 0;
        for (; j + 16 <= keys; j += 16) v_store(ph + j, exp16(v_sub(v_load(ph + j), v_set1(top))));
        for (; j < keys; ++j) ph[j] = expf(ph[j] - top);  // the last few keys: libm's
      }
      weighted_sums_any(p, keys, vr, keys, D, group, out + (r * H + kv * group) * D);
    }
    free(p);
  });
}
