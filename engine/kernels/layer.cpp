// A model's decoder layers in one call, for the few rows of one sequence (a decode step, a verify): each layer's
// residual add and input norm, qkv product, rotary, cache write, attention, o product, residual add, norm, gate/up
// product, silu times up and down product, with the eager forward's own kernels (panel GEMMs, RMSNorm, row
// attention) in its order and its element-wise steps (residual adds, rotary, torch's silu) with torch's roundings,
// so the outputs are the eager forward's bits (tested). Called by engine/layers/fused.py: it replaces about twenty
// Python-level torch calls per layer. layer_front alone is a layer's front half, up to the gate/up product.
#include <stdlib.h>
#include <string.h>

#include "simd.h"

extern "C" void panel_gemm(const float* x, long M, long K, const float* P, float* y, long N, int threads);
extern "C" void panel4_gemm(const float* x, long M, long K, const unsigned char* Q, const float* D, const float* Mn,
                            float* y, long N, int threads);
extern "C" void panel4q8_gemm(const float* x, long M, long K, const unsigned char* Q, const float* D,
                              const float* Mn, float* y, long N, int threads);
extern "C" void panel8_gemm(const float* x, long M, long K, const signed char* Q, const float* D, float* y, long N,
                            int threads);
extern "C" void panel8q8_gemm(const float* x, long M, long K, const signed char* Q, const float* D, float* y, long N,
                              int threads);
extern "C" void rms_norm(const float* x, long M, long D, const float* w, float eps, float* y);
extern "C" void causal_attention(const float* q, long n, long H, long D, const float* K, const float* V, long KVH,
                                 long S, long first, long num_keys, float scale, float* out, int threads);
extern "C" void causal_attention_half(const float* q, long n, long H, long D, const uint16_t* K, const uint16_t* V,
                                      long KVH, long S, long first, long num_keys, float scale, float* out,
                                      int threads);

// A weight in one of the panel kernels' layouts: kind 0 float32 panels (a), 4 the 4-bit panels (a = Q, b = D,
// c = M), 8 the 8-bit ones (a = Q, b = D); 5 and 9 those with 8-bit activations (q8_gemm.cpp). n outputs, k inputs.
struct Weight {
  long kind, n, k;
  const void *a, *b, *c;
};

// The layer's weights and cache (fused.py's ctypes mirror: the same field order). layer_front reads no `down`.
struct Layer {
  Weight qkv, o, gate_up;
  const float *norm1, *norm2;
  float eps;
  float *k_cache, *v_cache;  // [KVH, S, D]: float32, or IEEE half bits where kv_half
  Weight down;
  long kv_half;
};

static void matmul(const Weight& w, const float* x, long M, float* y, int threads) {
  if (w.kind == 4)
    panel4_gemm(x, M, w.k, (const unsigned char*)w.a, (const float*)w.b, (const float*)w.c, y, w.n, threads);
  else if (w.kind == 5)
    panel4q8_gemm(x, M, w.k, (const unsigned char*)w.a, (const float*)w.b, (const float*)w.c, y, w.n, threads);
  else if (w.kind == 9)
    panel8q8_gemm(x, M, w.k, (const signed char*)w.a, (const float*)w.b, y, w.n, threads);
  else if (w.kind == 8)
    panel8_gemm(x, M, w.k, (const signed char*)w.a, (const float*)w.b, y, w.n, threads);
  else
    panel_gemm(x, M, w.k, (const float*)w.a, y, w.n, threads);
}

// y = a + b, 16 at a time (torch's float32 add: one rounding per element). n a multiple of 16.
static void add(const float* a, const float* b, float* y, long n) {
  for (long i = 0; i < n; i += 16) v_store(y + i, v_add(v_load(a + i), v_load(b + i)));
}

// Rotary on `heads` heads of D floats (D a multiple of 32) at x with row stride ldx, into y (row stride ldy), for
// n rows: y = x * cos + roll(x, D / 2) * signed_sin, rounded as torch.addcmul(x * cos, roll, signed_sin) rounds it
// on this CPU (x * cos rounded, then one FMA: tested against it). cos, ssin: [n, D].
extern "C" void rotary_rows(const float* x, long n, long heads, long D, long ldx, const float* cos,
                            const float* ssin, float* y, long ldy) {
  const long half = D / 2;
  for (long r = 0; r < n; ++r)
    for (long h = 0; h < heads; ++h) {
      const float* xr = x + r * ldx + h * D;
      float* yr = y + r * ldy + h * D;
      for (long e = 0; e < D; e += 16) {
        const long src = e < half ? e + half : e - half;  // roll by D / 2: element e takes x[(e + D / 2) % D]
        const v16 a = v_mul(v_load(xr + e), v_load(cos + r * D + e));
        v_store(yr + e, v_fmadd(v_load(xr + src), v_load(ssin + r * D + e), a));
      }
    }
}

// The scratch floats `front` needs for n rows.
static long front_scratch(long n, long Dm, long H, long KVH, long D) {
  return n * (2 * Dm + (3 * H + 2 * KVH) * D);  // normed input and o, qkv, q, attention
}

// layer_front's work, in `h` (front_scratch floats).
static void front(const Layer* L, long n, const float* x, float* residual, int has_residual, long Dm, long H, long KVH,
                  long D, const float* cos, const float* ssin, long S, long write_first, long key_first,
                  long num_keys, float scale, float* gate_up, int threads, float* h) {
  const long width = (H + 2 * KVH) * D;
  float *qkv = h + n * Dm, *q = qkv + n * width, *att = q + n * H * D, *o = att + n * H * D;
  if (has_residual)
    add(x, residual, residual, n * Dm);
  else
    memcpy(residual, x, sizeof(float) * n * Dm);
  rms_norm(residual, n, Dm, L->norm1, L->eps, h);
  matmul(L->qkv, h, n, qkv, threads);
  rotary_rows(qkv, n, H, D, width, cos, ssin, q, H * D);  // the queries, contiguous for the attention
  for (long r = 0; r < n; ++r)
    for (long g = 0; g < KVH; ++g) {  // rotated keys and plain values into the cache: [KVH, S, D]
      const long slot = (g * S + write_first + r) * D;
      const float* value = qkv + r * width + (H + KVH + g) * D;
      if (L->kv_half) {  // rounded to half as torch's copy_ rounds (the rotated key through `o`, free until below)
        rotary_rows(qkv + r * width + (H + g) * D, 1, 1, D, width, cos + r * D, ssin + r * D, o, D);
        for (long e = 0; e < D; e += 16) {
          v_store_half_n((uint16_t*)L->k_cache + slot + e, v_load_n(o + e, D - e), D - e);
          v_store_half_n((uint16_t*)L->v_cache + slot + e, v_load_n(value + e, D - e), D - e);
        }
      } else {
        rotary_rows(qkv + r * width + (H + g) * D, 1, 1, D, width, cos + r * D, ssin + r * D, L->k_cache + slot, D);
        memcpy(L->v_cache + slot, value, sizeof(float) * D);
      }
    }
  if (L->kv_half)
    causal_attention_half(q, n, H, D, (const uint16_t*)L->k_cache, (const uint16_t*)L->v_cache, KVH, S, key_first,
                          num_keys, scale, att, threads);
  else
    causal_attention(q, n, H, D, L->k_cache, L->v_cache, KVH, S, key_first, num_keys, scale, att, threads);
  matmul(L->o, att, n, o, threads);
  add(o, residual, residual, n * Dm);
  rms_norm(residual, n, Dm, L->norm2, L->eps, h);
  matmul(L->gate_up, h, n, gate_up, threads);
}

// x [n, Dm]: the layer's input (the previous MLP's output; with has_residual 0, the embeddings). residual [n, Dm]
// <- the residual stream after attention (x + residual + attention's output, as the eager forward adds them).
// gate_up [n, 2 I] <- the MLP's gate and up products of its normed input. The n new rows' keys and values are
// written at slots write_first.. of the cache; the rows attend to num_keys keys from slot key_first (causally).
// cos, ssin: [n, D] (rotary's tables at the rows' positions). H, KVH: query and key heads; D: head size.
// Returns 0, or 1 when the scratch buffers could not be allocated (nothing written then).
extern "C" int layer_front(const Layer* L, long n, const float* x, float* residual, int has_residual, long Dm,
                           long H, long KVH, long D, const float* cos, const float* ssin, long S, long write_first,
                           long key_first, long num_keys, float scale, float* gate_up, int threads) {
  float* h = (float*)malloc(sizeof(float) * front_scratch(n, Dm, H, KVH, D));
  if (h == 0) return 1;
  front(L, n, x, residual, has_residual, Dm, H, KVH, D, cos, ssin, S, write_first, key_first, num_keys, scale,
        gate_up, threads, h);
  free(h);
  return 0;
}

// exp(d) as SLEEF's expf_u10 computes it, which is torch's float32 exp on AVX-512 and AVX2 (checked here against
// F.silu for every float32 input; fused.py checks it again at run time): q = round(d / ln 2), s = d - q ln 2 in two
// parts, a degree-6 polynomial in s, times 2^q as 2^h * 2^(q - h), h = q / 2 rounded (two normal factors, so
// q = 128 still gives SLEEF's finite values; it splits at floor(q / 2), the same products); 0 below -104, inf above 100.
static inline v16 exp_sleef(v16 d) {
  const v16 q = v_round(v_mul(d, v_set1(1.442695040888963407359924681001892137426645954152985934135449406931f)));
  v16 s = v_fnmadd(q, v_set1(0.693145751953125f), d);
  s = v_fnmadd(q, v_set1(1.428606765330187045e-06f), s);
  v16 u = v_set1(0.000198527617612853646278381f);
  u = v_fmadd(u, s, v_set1(0.00139304355252534151077271f));
  u = v_fmadd(u, s, v_set1(0.00833336077630519866943359f));
  u = v_fmadd(u, s, v_set1(0.0416664853692054748535156f));
  u = v_fmadd(u, s, v_set1(0.166666671633720397949219f));
  u = v_fmadd(u, s, v_set1(0.5f));
  u = v_add(v_set1(1.0f), v_fmadd(v_mul(s, s), u, s));
  const v16 half = v_round(v_mul(q, v_set1(0.5f)));
  u = v_mul(v_mul(u, v_pow2(half)), v_pow2(v_sub(q, half)));
  u = v_zero_where(v_below(d, v_set1(-104.0f)), u);
  return v_select(v_below(v_set1(100.0f), d), v_set1(__builtin_inff()), u);
}

// y [n, I] = silu(gate) * up for gate_up [n, 2 I] (gate, then up, per row), rounded as F.silu(gate).mul_(up)
// rounds it: x / (1 + exp(-x)), then the product. I a multiple of 16.
extern "C" void silu_mul(const float* gate_up, long n, long I, float* y) {
  for (long r = 0; r < n; ++r)
    for (long i = 0; i < I; i += 16) {
      const v16 x = v_load(gate_up + r * 2 * I + i);
      const v16 silu = v_div(x, v_add(v_set1(1.0f), exp_sleef(v_sub(v_zero(), x))));
      v_store(y + r * I + i, v_mul(silu, v_load(gate_up + r * 2 * I + I + i)));
    }
}

// The num_layers layers L[0..] on x [n, Dm] (the embeddings), layer_front's arguments for the rest: out [n, Dm] <-
// the last layer's MLP output, residual [n, Dm] <- its residual stream (the model's final add and norm follow).
// Returns 0, 1 when the scratch buffers could not be allocated, or 2 when a layer has no down product (fused.py fills
// them all or none).
extern "C" int decoder_layers(const Layer* L, long num_layers, long n, const float* x, float* residual, float* out,
                              long Dm, long H, long KVH, long D, const float* cos, const float* ssin, long S,
                              long write_first, long key_first, long num_keys, float scale, int threads) {
  for (long i = 0; i < num_layers; ++i)
    if (L[i].down.a == 0) return 2;
  if (num_layers < 1) return 0;
  const long I = L[0].gate_up.n / 2;
  float* gate_up = (float*)malloc(sizeof(float) * (n * 3 * I + front_scratch(n, Dm, H, KVH, D)));  // one for all
  if (gate_up == 0) return 1;
  float *act = gate_up + n * 2 * I, *scratch = act + n * I;
  for (long i = 0; i < num_layers; ++i) {
    front(L + i, n, i > 0 ? out : x, residual, i > 0, Dm, H, KVH, D, cos, ssin, S, write_first, key_first, num_keys,
          scale, gate_up, threads, scratch);
    silu_mul(gate_up, n, I, act);
    matmul(L[i].down, act, n, out, threads);
  }
  free(gate_up);
  return 0;
}
