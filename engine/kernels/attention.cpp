// Causal attention of a few query rows of one sequence whose keys lie in one run of KV-cache slots, each row
// computed by the same code in the same order whatever the row count: row r of an n-row step (a verify) gets the
// bits a one-row decode step of that token gets, as the panel GEMM and rms_norm.cpp give their rows. Built into
// the panel kernels' library (engine/layers/panel.py), called by engine/attention/sdpa.py.
//
// Row r (of n) sees keys 0 .. t - n + r of the run; head h reads KV head h / (H / KVH). Per row and head:
// s_j = (q . k_j) * scale, p_j = exp(s_j - max s), o = (sum_j p_j v_j) / (sum_j p_j), sums in key order.
// Per layer, SmolLM2's 9 heads, one core, 5 rows over 200 / 700 keys: 60 / 212 us (torch's SDPA: 123 / 270).
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

static inline float dot(const float* __restrict a, const float* __restrict b, long D) {
  __m512 acc = _mm512_setzero_ps();
  long k = 0;
  for (; k + 16 <= D; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), acc);
  if (k < D) {
    const __mmask16 m = (__mmask16)((1u << (D - k)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// exp(x) for 16 x <= 0 at once (Cephes' expf: x = n ln 2 + r, |r| <= ln 2 / 2, a degree-6 polynomial in r, times
// 2^n; within a few ulp of libm's), 0 below -87. Which of a row's keys take it (all but the last keys % 16, which
// take libm's expf) depends only on the row's own key count: the same in a one-row step and in a verify.
static inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __mmask16 zero = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(~zero, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

// o = (sum_j p_j v_j) * inv for D = 16 C: the C column blocks accumulate side by side (independent FMA chains,
// each still summing over j in key order: the same bits as one block at a time).
template <int C>
static inline void weighted_sum(const float* __restrict p, const float* __restrict v, long keys, long D, float inv,
                                float* __restrict o) {
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (long j = 0; j < keys; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
    for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + j * D + 16 * c), acc[c]);
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(acc[c], _mm512_set1_ps(inv)));
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
      for (; j + 16 <= keys; j += 16) _mm512_storeu_ps(p + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(p + j),
                                                                                 _mm512_set1_ps(top))));
      for (; j < keys; ++j) p[j] = expf(p[j] - top);  // the last few keys: libm's
      for (j = 0; j < keys; ++j) total += p[j];        // in key order
      float* o = out + (r * H + h) * D;
      if (D == 64) {
        weighted_sum<4>(p, vr, keys, D, 1.0f / total, o);
      } else if (D == 128) {
        weighted_sum<8>(p, vr, keys, D, 1.0f / total, o);
      } else {
        for (long k = 0; k < D; k += 16) {  // any other head size: one 16-wide column block at a time
          const __mmask16 m = D - k >= 16 ? 0xFFFF : (__mmask16)((1u << (D - k)) - 1);
          __m512 acc = _mm512_setzero_ps();
          for (long j = 0; j < keys; ++j)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(m, vr + j * D + k), acc);
          _mm512_mask_storeu_ps(o + k, m, _mm512_mul_ps(acc, _mm512_set1_ps(1.0f / total)));
        }
      }
    }
  }
  free(p);
}
