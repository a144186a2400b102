// Causal attention of a few query rows of one sequence whose keys lie in one run of KV-cache slots, each row
// computed by the same code in the same order whatever the row count: row r of an n-row step (a verify) gets the
// bits a one-row decode step of that token gets, as the panel GEMM and rms_norm.cpp give their rows. Built into
// the panel kernels' library (engine/layers/native.py), called by engine/attention/sdpa.py.
//
// Row r (of n) sees keys 0 .. t - n + r of the run; head h reads KV head h / (H / KVH). Per row and head:
// s_j = (q . k_j) * scale, p_j = exp(s_j - max s), o = (sum_j p_j v_j) / (sum_j p_j), sums in key order.
// Per layer, SmolLM2's 9 heads over 3 KV heads, one core, 300 keys in cache, 1 / 5 rows: 13 / 56-64 us (README).
// A half cache (causal_attention_half, --kv-dtype float16): each tile of keys or values converted exactly to float32
// once for all the rows and heads that read it, then the float32 code: the float32 kernel's bits on those values.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "threads.h"

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

// Query rows r0 .. r1 - 1 of the call and the `group` query heads of one KV head (keys at kr, values at vr), tile by
// tile of keys, so that a tile is read from memory once for all of them and then from L1: first every row's scores
// (scores() on the tile: its 16-key blocks start at multiples of 16, where a whole-row call's do, so a key takes
// the block or the tail code by the row's own key count, as there) and their maxima, in key order; then per tile
// and row its exps (exp16 on the blocks, libm's expf on the last keys % 16, by the row's own key count) and its
// weighted sums, carried over the tiles in memory. Every row and head: the operations of one row alone, in order.
template <typename T>
static void attend_rows(const float* q, long n, long H, long D, const T* kr, const T* vr, const long* slot, long kv,
                        long group, long r0, long r1, long t, float scale, float* out, float* work, float* converted) {
  const long heads = (r1 - r0) * group, most = t - n + r1, ldacc = (D + 15) / 16 * 16;  // most: the last row's keys
  const long tile = tile_keys(D);
  float* p = work;                        // [heads, most]: row r's head h at (r - r0) * group + h
  float* acc = p + heads * most;          // [heads, ldacc]
  float* total = acc + heads * ldacc;     // [heads]
  float* top = total + heads;             // [heads]
  float* tops = top + heads;              // [heads, 16]: the maxima of each lane of the 16-key blocks
  // `converted` [tile, D] (a half cache's tile as float32) lies outside `work`: inside it, its stores aliased the
  // score rows' loads 4 KiB apart, and a block of 16 rows took 1.35x the float32 kernel's time
  for (long i = 0; i < heads; ++i) {
    total[i] = 0.0f, top[i] = -INFINITY;
    v_store(tops + 16 * i, v_set1(-INFINITY));
    for (long k = 0; k < ldacc; k += 16) v_store(acc + i * ldacc + k, v_zero());
  }
  for (long j0 = 0; j0 < most; j0 += tile) {
    const float* keys_tile = tile_rows(kr, slot, j0, most - j0 < tile ? most - j0 : tile, D, converted);
    for (long r = r0; r < r1; ++r) {
      const long keys = t - n + r + 1, m = keys - j0 < tile ? keys - j0 : tile;
      for (long h = 0, i = (r - r0) * group; m > 0 && h < group; ++h, ++i) {
        float* ph = p + i * most + j0;
        scores(q + (r * H + kv * group + h) * D, keys_tile, m, D, scale, ph);
        v16 lanes = v_load(tops + 16 * i);
        long j = 0;
        for (; j + 16 <= m; j += 16) lanes = v_max(v_load(ph + j), lanes);
        v_store(tops + 16 * i, lanes);
        for (; j < m; ++j) top[i] = ph[j] > top[i] ? ph[j] : top[i];
      }
    }
  }
  for (long i = 0; i < heads; ++i)  // max is max in any order (a NaN score taken by none; +-0 give the same exps)
    for (long l = 0; l < 16; ++l) top[i] = tops[16 * i + l] > top[i] ? tops[16 * i + l] : top[i];
  for (long j0 = 0; j0 < most; j0 += tile) {
    const float* values_tile = tile_rows(vr, slot, j0, most - j0 < tile ? most - j0 : tile, D, converted);
    for (long r = r0; r < r1; ++r) {
      const long keys = t - n + r + 1, m = keys - j0 < tile ? keys - j0 : tile, i0 = (r - r0) * group;
      if (m <= 0) continue;
      for (long h = 0, i = i0; h < group; ++h, ++i) {
        float* ph = p + i * most;
        const long end = j0 + m;
        long j = j0;
        for (; j + 16 <= keys && j < end; j += 16) v_store(ph + j, exp16(v_sub(v_load(ph + j), v_set1(top[i]))));
        for (; j < end; ++j) ph[j] = expf(ph[j] - top[i]);  // the last few keys: libm's
      }
      weighted_sums_any(p + i0 * most + j0, most, values_tile, m, D, group, acc + i0 * ldacc, ldacc, total + i0);
    }
  }
  for (long r = r0; r < r1; ++r)
    for (long h = 0, i = (r - r0) * group; h < group; ++h, ++i) {
      const v16 inv = v_set1(1.0f / total[i]);
      float* o = out + (r * H + kv * group + h) * D;
      for (long k = 0; k < D; k += 16) v_store_n(o + k, v_mul(v_load(acc + i * ldacc + k), inv), D - k);
    }
}

// q: [n, H, D]; K, V: [KVH, S, D] (the cache), the run at slots first .. first + t - 1; out: [n, H * D]. The work
// goes in blocks of ATTN_ROWS rows and one KV head (attend_rows: the block's rows and query heads over each tile of
// keys while it sits in L1), split over `threads` threads (threads.h), which changes no output's arithmetic. Row by
// row, each streamed all its keys and values from memory: a prefill's 32 rows, SmolLM2's 9 heads over 3 KV heads,
// one core, 3000 / 6000 keys: 10.7 / 28.9 ms a call, now 5.0 / 10.4 (a decode's one row: 356 -> 304 us at 3000).
#define ATTN_ROWS 16  // rows a block: their scores [rows, group, keys] stay in L2 (16 x 3 x 6000: 1.1 MB)

// Several sequences' causal spans in one call (a batched verify or decode, SSD's branches): one call a layer where
// a call a span cost each span 20-35 us of Python and ctypes, most of a small model's batched step. spans [n, 5]:
// q_start, q_len, num_keys, first, offset. Span s's q_len rows, q + q_start H D, see its num_keys keys: with
// offset -1 the run at slots first .., else at slots[offset ..] (gathered a tile at a time, tile_rows). Each row
// the arithmetic of causal_attention's, the work in its blocks of ATTN_ROWS rows and one KV head, every span's
// blocks split over `threads` threads together.
template <typename T>
static void causal_spans_of(const float* q, long H, long D, const T* K, const T* V, long KVH, long S, long n_spans,
                            const long* spans, const long* slots, float scale, float* out, int threads) {
  const long group = H / KVH, ldacc = (D + 15) / 16 * 16;
  long units = 0, work_floats = 0;
  bool gathers = sizeof(T) == 2;
  for (long s = 0; s < n_spans; ++s) {
    const long* sp = spans + 5 * s;
    const long n = sp[1], most = sp[2] > 0 ? sp[2] : 1, rows = n < ATTN_ROWS ? n : ATTN_ROWS;
    units += KVH * ((n + ATTN_ROWS - 1) / ATTN_ROWS);
    const long need = rows * group * (most + ldacc + 18);
    work_floats = need > work_floats ? need : work_floats;
    gathers = gathers || sp[4] >= 0;
  }
  over_panels(units, threads, [&](long u0, long u1) {
    float* work = (float*)malloc(sizeof(float) * (work_floats > 0 ? work_floats : 1));
    void* tile = nullptr;  // a gathered or half tile as float32 (see attend_rows)
    if (gathers && posix_memalign(&tile, 64, sizeof(float) * tile_keys(D) * D) != 0) tile = nullptr;
    long s = 0, first_unit = 0;  // the span of unit u0, and its first unit
    for (long u = u0; u < u1; ++u) {
      long blocks = (spans[5 * s + 1] + ATTN_ROWS - 1) / ATTN_ROWS;
      while (u >= first_unit + KVH * blocks) {
        first_unit += KVH * blocks, ++s;
        blocks = (spans[5 * s + 1] + ATTN_ROWS - 1) / ATTN_ROWS;
      }
      const long* sp = spans + 5 * s;
      const long n = sp[1], t = sp[2], kv = (u - first_unit) / blocks, r0 = (u - first_unit) % blocks * ATTN_ROWS;
      const long r1 = r0 + ATTN_ROWS < n ? r0 + ATTN_ROWS : n, first = sp[4] >= 0 ? 0 : sp[3];
      const long* slot = sp[4] >= 0 ? slots + sp[4] : nullptr;
      attend_rows(q + sp[0] * H * D, n, H, D, K + (kv * S + first) * D, V + (kv * S + first) * D, slot, kv, group, r0,
                  r1, t, scale, out + sp[0] * H * D, work, (float*)tile);
    }
    free(tile);
    free(work);
  });
}

extern "C" void causal_attention_spans(const float* q, long H, long D, const float* K, const float* V, long KVH,
                                       long S, long n_spans, const long* spans, const long* slots, float scale,
                                       float* out, int threads) {
  causal_spans_of(q, H, D, K, V, KVH, S, n_spans, spans, slots, scale, out, threads);
}

extern "C" void causal_attention_spans_half(const float* q, long H, long D, const uint16_t* K, const uint16_t* V,
                                            long KVH, long S, long n_spans, const long* spans, const long* slots,
                                            float scale, float* out, int threads) {
  causal_spans_of(q, H, D, K, V, KVH, S, n_spans, spans, slots, scale, out, threads);
}

// One sequence's rows: its one span, the run at slots first .. first + t - 1 (causal_spans_of's work and bits).
template <typename T>
static void causal_attention_of(const float* q, long n, long H, long D, const T* K, const T* V, long KVH, long S,
                                long first, long t, float scale, float* out, int threads) {
  const long span[5] = {0, n, t, first, -1};
  causal_spans_of(q, H, D, K, V, KVH, S, 1, span, (const long*)nullptr, scale, out, threads);
}

extern "C" void causal_attention(const float* q, long n, long H, long D, const float* K, const float* V, long KVH,
                                 long S, long first, long t, float scale, float* out, int threads) {
  causal_attention_of(q, n, H, D, K, V, KVH, S, first, t, scale, out, threads);
}

// The same over a half-precision cache (K, V: [KVH, S, D] IEEE half bits): half the bytes a key, where a decode at
// a long context is bound by reading them (SmolLM2 at 6,000 tokens: 276 MB a token in float32).
extern "C" void causal_attention_half(const float* q, long n, long H, long D, const uint16_t* K, const uint16_t* V,
                                      long KVH, long S, long first, long t, float scale, float* out, int threads) {
  causal_attention_of(q, n, H, D, K, V, KVH, S, first, t, scale, out, threads);
}
