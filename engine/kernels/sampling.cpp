// The distribution a sampled request draws from, and the draw, for one row of V logits: engine/sampling.py's
// `probabilities` and `inverse_cdf` on the CPU, in a few passes over the row where torch took a dozen kernels and a
// top-k (about 1 ms a token at the chat's default temperature 0.2 and top-p 0.9, 9% of a one-core step).
//
// sampling_probs: m = max x; s_i = (x_i - m) / T; e_i = exp(s_i) where s_i > -87, else 0 (a float32 exp below e^-87
// would be subnormal); p = e / sum e. Then, as engine.sampling.keep_top_k_top_p: top-k zeroes the tokens below the
// k-th largest p, top-p those outside the nucleus (a token stays where the tokens more probable than it hold less
// than top_p of the mass, summed from the largest down as torch sums it; tokens tied with a kept one stay), each
// renormalising. A row's result depends on the row alone (sums in a fixed order), so it is the same batched or not.
// It is not torch's bits (its exp and its sums' order differ by an ulp or so); every sampled path (AR's draws, the
// draft's q, the target's p in verification) takes this one function, which is what exactness needs.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "simd.h"

// The largest of x[0..V) (V >= 1), and whether no x is NaN or +inf (-inf is a masked token: no probability).
static float row_max(const float* x, long V, bool* finite) {
  v16 top = v_set1(-INFINITY), nan = v_zero();
  const v16 lowest = v_set1(-FLT_MAX);
  long i = 0;
  for (; i + 16 <= V; i += 16) {
    const v16 v = v_load(x + i);
    top = v_max(top, v);
    nan = v_add(nan, v_mul(v_max(lowest, v), v_zero()));  // NaN once a lane met NaN or +inf (max passes NaN on)
  }
  float t[16];
  v_store(t, top);
  float m = t[0], bad = v_sum(nan);
  for (int j = 1; j < 16; ++j) m = std::max(m, t[j]);
  for (; i < V; ++i) {
    m = std::max(m, x[i]);
    bad += std::max(-FLT_MAX, x[i]) * 0.0f + (x[i] != x[i] ? NAN : 0.0f);
  }
  *finite = bad == 0.0f && m > -INFINITY;  // (every token masked: no distribution)
  return m;
}

// Whether any of the 16 floats at p has a bit set (a prefilter for nonzero: -0.0 passes it, and is then skipped).
static inline bool any_bits(const float* p) {
  uint32_t bits[16];
  memcpy(bits, p, sizeof bits);
  uint32_t any = 0;
  for (int j = 0; j < 16; ++j) any |= bits[j];
  return any != 0;
}

// p[i] *= scale for the row; returns the new sum (16 lanes, then v_sum: a fixed order).
static float scale_row(float* p, long V, float scale) {
  v16 acc = v_zero();
  const v16 f = v_set1(scale);
  long i = 0;
  for (; i + 16 <= V; i += 16) {  // (whole blocks: AVX2's masked stores are slow on AMD)
    const v16 v = v_mul(v_load(p + i), f);
    v_store(p + i, v);
    acc = v_add(acc, v);
  }
  if (i < V) {
    const v16 v = v_mul(v_load_n(p + i, V - i), f);
    v_store_n(p + i, v, V - i);
    acc = v_add(acc, v);
  }
  return v_sum(acc);
}

// Zero p[i] < floor, renormalise (the kept mass summed in a fixed order).
static void keep_at_least(float* p, long V, float floor) {
  v16 acc = v_zero();
  const v16 f = v_set1(floor);
  long i = 0;
  for (; i + 16 <= V; i += 16) {
    const v16 v = v_load(p + i);
    const v16 kept = v_zero_where(v_below(v, f), v);
    v_store(p + i, kept);
    acc = v_add(acc, kept);
  }
  if (i < V) {
    const v16 v = v_load_n(p + i, V - i);
    const v16 kept = v_zero_where(v_below(v, f), v);
    v_store_n(p + i, kept, V - i);
    acc = v_add(acc, kept);
  }
  const float total = v_sum(acc);
  scale_row(p, V, 1.0f / total);
}

// Append to c the p[i] >= t (and > 0), 16 at a time: a block with none is skipped after one compare.
static void gather(const float* p, long V, float t, std::vector<float>& c) {
  c.clear();
  const v16 vt = v_set1(t);
  float kept[16];
  for (long b = 0; b < V; b += 16) {
    const v16 v = b + 16 <= V ? v_load(p + b) : v_load_n(p + b, V - b);
    v_store(kept, v_zero_where(v_below(v, vt), v));
    if (!any_bits(kept)) continue;
    for (int j = 0; j < 16 && b + j < V; ++j)
      if (kept[j] > 0.0f) c.push_back(kept[j]);
  }
}

// The k-th largest p (1 <= k < V; pmax the largest): among the candidates p >= t, t falling until there are k.
static float kth_largest(const float* p, long V, float pmax, long k, std::vector<float>& c) {
  for (float t = pmax * 0x1p-12f;; t = t > 0x1p-100f ? t * 0x1p-24f : 0.0f) {
    gather(p, V, t, c);
    if ((long)c.size() >= k || t == 0.0f) break;
  }
  if ((long)c.size() < k) return 0.0f;  // fewer than k tokens with mass: all stay
  std::nth_element(c.begin(), c.begin() + (k - 1), c.end(), std::greater<float>());
  return c[k - 1];
}

// The least probability inside the top-p nucleus of p (pmax its largest): the candidates p >= t, largest first,
// summed until the mass before one reaches top_p, as torch's float32 cumulative sum does it (a float64 running sum,
// each prefix rounded to float32); t falls until the nucleus ends among them (or every token with mass is one).
static float nucleus_floor(const float* p, long V, float pmax, float top_p, std::vector<float>& c) {
  for (float t = pmax * 0x1p-12f;; t = t > 0x1p-100f ? t * 0x1p-24f : 0.0f) {
    gather(p, V, t, c);
    std::sort(c.begin(), c.end(), std::greater<float>());
    double before = 0.0;
    float floor = c.empty() ? 0.0f : c[0];
    for (float v : c) {
      if (!((float)before < top_p)) return floor;  // the nucleus ended before v
      floor = v;
      before += v;
    }
    if (t == 0.0f) return floor;
  }
}

static float row_largest(const float* p, long V) {
  v16 top = v_zero();
  for (long i = 0; i < V; i += 16) top = v_max(top, i + 16 <= V ? v_load(p + i) : v_load_n(p + i, V - i));
  float t[16];
  v_store(t, top);
  return *std::max_element(t, t + 16);
}

// p[0..V) from logits x (as above; a -inf logit gets no probability); returns 0, or -1 where the row has a NaN or a
// +inf logit, or no finite one (the caller then takes torch's path for the row, which says what is wrong).
extern "C" int sampling_probs(const float* x, long V, float temperature, long top_k, float top_p, float* p) {
  bool finite;
  const float m = row_max(x, V, &finite);
  if (!finite) return -1;
  const v16 vm = v_set1(m), vt = v_set1(temperature), cut = v_set1(-86.99999237f);  // s <= -87: s < this
  v16 acc = v_zero();
  long i = 0;
  for (; i + 16 <= V; i += 16) {
    const v16 s = v_div(v_sub(v_load(x + i), vm), vt);
    const v16 e = v_zero_where(v_below(s, cut), exp16(s));
    v_store(p + i, e);
    acc = v_add(acc, e);
  }
  if (i < V) {
    const v16 s = v_div(v_sub(v_load_n(x + i, V - i), vm), vt);
    v_store_n(p + i, v_zero_where(v_below(s, cut), exp16(s)), V - i);
    acc = v_add(acc, v_load_n(p + i, V - i));  // (the lanes past V read back as 0)
  }
  const float total = v_sum(acc);
  if (!(total > 0.0f) || !std::isfinite(total)) return -1;
  scale_row(p, V, 1.0f / total);
  std::vector<float> c;
  if (top_k > 0 && top_k < V) keep_at_least(p, V, kth_largest(p, V, row_largest(p, V), top_k, c));
  if (top_p < 1.0f) keep_at_least(p, V, nucleus_floor(p, V, row_largest(p, V), top_p, c));
  return 0;
}

// The token whose CDF interval [cdf_{i-1}, cdf_i) holds u * total (float64 sums in index order, as a cumulative sum
// of the row in float64 gives them: a token without mass adds nothing and is never picked); -1 where the total is not
// positive and finite. p: [V] >= 0, u in [0, 1).
extern "C" long sampling_inverse_cdf(const float* p, long V, double u) {
  double total = 0.0;
  long last = -1;
  for (long b = 0; b < V; b += 16) {
    if (b + 16 <= V && !any_bits(p + b)) continue;  // 16 zeros: nothing to add
    for (long i = b; i < std::min(b + 16, V); ++i)
      if (p[i] != 0.0f) {
        total += (double)p[i];
        last = i;
      }
  }
  if (!(total > 0.0) || !std::isfinite(total)) return -1;
  const double v = u * total;
  double cdf = 0.0;
  for (long b = 0; b <= last; b += 16) {
    if (b + 16 <= V && !any_bits(p + b)) continue;
    for (long i = b; i < std::min(b + 16, last + 1); ++i)
      if (p[i] != 0.0f) {
        cdf += (double)p[i];
        if (cdf > v) return i;
      }
  }
  return last;  // u * total rounded up to total: the last token with mass
}

// SplitMix64's output function (engine/coupling.py's noise_bits).
static inline uint64_t splitmix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The first n finishers of engine/coupling.py's race over p[0..V) >= 0 at `position`, the winner first: the indices of
// the largest p_i / E_i over the p_i > 0, E_i = -log u, u = (the top 52 bits of splitmix(key + golden * (position * 2^32
// + token)) + 1/2) / 2^52 (exact, in (0, 1)), token = ids[i] (ids null: i). Of equal scores the lower index ranks first. Writes them to
// out[0..) and returns how many (fewer than n where fewer have mass), or -1 where a p is NaN.
// The log is skipped where the runner cannot place: E = -log u >= 1 - u, so p_i <= floor * (1 - u) (less a margin for
// the log's rounding) gives p_i / E <= floor, the n-th best score so far. Unfiltered rows (every token with mass) cost
// a third of the logs' time.
extern "C" long sampling_race(const float* p, long V, const int64_t* ids, uint64_t key, long position, long n,
                              int64_t* out) {
  std::vector<double> top;  // the kept scores, descending (out holds their indices)
  top.reserve(n);
  double floor = 0.0;  // the n-th best score once n are kept; 0 before
  for (long b = 0; b < V; b += 16) {
    if (b + 16 <= V && !any_bits(p + b)) continue;  // 16 zeros: no runner
    for (long i = b; i < std::min(b + 16, V); ++i) {
      if (p[i] != p[i]) return -1;
      if (!(p[i] > 0.0f)) continue;
      const uint64_t token = ids ? (uint64_t)ids[i] : (uint64_t)i;
      const uint64_t h = splitmix(key + 0x9E3779B97F4A7C15ULL * (((uint64_t)position << 32) | token));
      const double u = ((double)(h >> 12) + 0.5) * 0x1p-52;
      if ((double)p[i] <= floor * (1.0 - u) * (1.0 - 0x1p-30)) continue;
      const double score = (double)p[i] / -log(u);
      long kept = (long)top.size();
      if (kept == n && !(score > top[n - 1])) continue;
      if (kept < n) {
        top.push_back(0.0);
        ++kept;
      }
      long j = kept - 1;  // shift the lower scores down (a tie stays ahead: it has the lower index)
      for (; j > 0 && score > top[j - 1]; --j) {
        top[j] = top[j - 1];
        out[j] = out[j - 1];
      }
      top[j] = score;
      out[j] = i;
      if (kept == n) floor = top[n - 1];
    }
  }
  return (long)top.size();
}
