// Causal attention of a few query rows of one sequence whose keys lie in one run of KV-cache slots, each row
// computed by the same code in the same order whatever the row count: row r of an n-row step (a verify) gets the
// bits a one-row decode step of that token gets, as the panel GEMM and rms_norm.cpp give their rows. Built into
// the panel kernels' library (engine/layers/native.py), called by engine/attention/sdpa.py.
//
// Row r (of n) sees keys 0 .. t - n + r of the run; head h reads KV head h / (H / KVH). Per row and head:
// s_j = (q . k_j) * scale, p_j = exp(s_j - max s), o = (sum_j p_j v_j) / (sum_j p_j), sums in key order.
// Per layer, SmolLM2's 9 heads, one core, 5 rows over 200 / 700 keys: 60 / 212 us (torch's SDPA: 123 / 270).
#include <math.h>
#include <stdlib.h>

#include "simd.h"

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

// o = (sum_j p_j v_j) * inv for D = 16 C: the C column blocks accumulate side by side (independent FMA chains,
// each still summing over j in key order: the same bits as one block at a time).
template <int C>
static inline void weighted_sum(const float* __restrict p, const float* __restrict v, long keys, long D, float inv,
                                float* __restrict o) {
  v16 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = v_zero();
  for (long j = 0; j < keys; ++j) {
    const v16 pj = v_set1(p[j]);
    for (int c = 0; c < C; ++c) acc[c] = v_fmadd(pj, v_load(v + j * D + 16 * c), acc[c]);
  }
  for (int c = 0; c < C; ++c) v_store(o + 16 * c, v_mul(acc[c], v_set1(inv)));
}

// q: [n, H, D]; K, V: [KVH, S, D] (the cache), the run at slots first .. first + t - 1; out: [n, H * D].
extern "C" void causal_attention(const float* q, long n, long H, long D, const float* K, const float* V, long KVH,
                                 long S, long first, long t, float scale, float* out) {
  float* p = (float*)malloc(sizeof(float) * (t > 0 ? t : 1));
  const long group = H / KVH;
  for (long r = 0; r < n; ++r) {
    const long keys = t - n + r + 1;
    for (long h = 0; h < H; ++h) {
      const float* qv = q + (r * H + h) * D;
      const float* kr = K + ((h / group) * S + first) * D;
      const float* vr = V + ((h / group) * S + first) * D;
      float top = -INFINITY;
      for (long j = 0; j < keys; ++j) {
        p[j] = dot(qv, kr + j * D, D) * scale;
        top = p[j] > top ? p[j] : top;
      }
      float total = 0.0f;
      long j = 0;
      for (; j + 16 <= keys; j += 16) v_store(p + j, exp16(v_sub(v_load(p + j), v_set1(top))));
      for (; j < keys; ++j) p[j] = expf(p[j] - top);  // the last few keys: libm's
      for (j = 0; j < keys; ++j) total += p[j];        // in key order
      float* o = out + (r * H + h) * D;
      if (D == 64) {
        weighted_sum<4>(p, vr, keys, D, 1.0f / total, o);
      } else if (D == 128) {
        weighted_sum<8>(p, vr, keys, D, 1.0f / total, o);
      } else {
        for (long k = 0; k < D; k += 16) {  // any other head size: one 16-wide column block at a time
          v16 acc = v_zero();
          for (long j = 0; j < keys; ++j) acc = v_fmadd(v_set1(p[j]), v_load_n(vr + j * D + k, D - k), acc);
          v_store_n(o + k, v_mul(acc, v_set1(1.0f / total)), D - k);
        }
      }
    }
  }
  free(p);
}
