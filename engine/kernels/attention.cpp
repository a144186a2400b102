// Causal attention of a few query rows of one sequence whose keys lie in one run of KV-cache slots, each row
// computed by the same code in the same order whatever the row count: row r of an n-row step (a verify) gets the
// bits a one-row decode step of that token gets, as the panel GEMM and rms_norm.cpp give their rows. Built into
// the panel kernels' library (engine/layers/native.py), called by engine/attention/sdpa.py.
//
// Row r (of n) sees keys 0 .. t - n + r of the run; head h reads KV head h / (H / KVH). Per row and head:
// s_j = (q . k_j) * scale, p_j = exp(s_j - max s), o = (sum_j p_j v_j) / (sum_j p_j), the sums in key order over
// each chunk of ATTN_CHUNK keys and then over the chunks (since 2026-12-08; before, over all the keys at once).
// Per layer, SmolLM2's 9 heads over 3 KV heads, one core, 300 keys in cache, 1 / 5 rows: 13 / 56-64 us (README).
// A half cache (causal_attention_half, --kv-dtype float16): each tile of keys or values converted exactly to float32
// once for all the rows and heads that read it, then the float32 code: the float32 kernel's bits on those values.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tile.h"
#include "simd.h"
#include "threads.h"

// Keys a chunk: a row's value sums start again from zero every ATTN_CHUNK keys of its sequence (from key 0), and
// the chunks' sums are then added in key order. So the chunks of a few rows' keys can go to different threads with
// the bits one thread gives them: a decode's 3 KV heads (SmolLM2) were 3 units of work for 2 threads, one of which
// read 2/3 of the cache. A multiple of every tile's 16-key blocks (where the tiles do not divide it, D = 48 or 40,
// each chunk ends in a shorter tile); a row of at most ATTN_CHUNK keys adds nothing.
#define ATTN_CHUNK 256

// Rows r0 .. r1 - 1 of a span (n rows over t keys: row r sees keys 0 .. t - n + r) and the `group` query heads of
// one KV head: a block of the work (its chunks units of their own where a call splits them). Its floats (its slab):
// scores p [heads, most]; per chunk the maxima of each lane of its 16-key blocks [chunks, heads, 16] and of its
// other keys [chunks, heads]; `slots` value sums [slots, heads, ldacc] and their totals [slots, heads]. Row r's
// head h is head (r - r0) * group + h.
template <typename T>
struct Block {
  const float* q;
  const T *kr, *vr;    // the KV head's keys and values (a run of slots, or gathered by `slot`)
  const long* slot;
  float* out;
  long n, H, D, kv, group, r0, r1, t;
  float scale;
  long heads() const { return (r1 - r0) * group; }
  long most() const { return t - n + r1 > 0 ? t - n + r1 : 0; }  // the last row's keys
  long keys(long r) const { return t - n + r + 1; }
  long chunks() const { return most() > ATTN_CHUNK ? (most() + ATTN_CHUNK - 1) / ATTN_CHUNK : 1; }
  long chunk_end(long c) const { return (c + 1) * ATTN_CHUNK < most() ? (c + 1) * ATTN_CHUNK : most(); }
  bool sees(long r, long c) const { return keys(r) > c * ATTN_CHUNK; }  // whether row r has keys in chunk c
  long cost(long c) const { return heads() * (chunk_end(c) - c * ATTN_CHUNK); }  // about (a block's: heads() * most())
  long ldacc() const { return (D + 15) / 16 * 16; }
  long slab_floats(long slots) const { return heads() * (most() + chunks() * 17 + slots * (ldacc() + 1)); }
  template <typename F> F* lanes(F* slab) const { return slab + heads() * most(); }  // the slab's parts, in order
  template <typename F> F* tails(F* slab) const { return lanes(slab) + chunks() * heads() * 16; }
  float* sums(float* slab) const { return tails(slab) + chunks() * heads(); }
  float* totals(float* slab, long slots) const { return sums(slab) + slots * heads() * ldacc(); }
};

// Chunks c0 .. c1 - 1 of the block's scores (scores() on each tile: its 16-key blocks start at multiples of 16, where
// a whole-row call's do, so a key takes the block or the tail code by the row's own key count, as there) and each
// chunk's maxima, tile by tile of keys, so that a tile is read from memory once for all the rows and heads.
template <typename T>
static void block_scores(const Block<T>& b, long c0, long c1, float* slab, float* converted) {
  const long heads = b.heads(), most = b.most(), tile = tile_keys(b.D);
  float* p = slab;
  for (long c = c0; c < c1; ++c) {
    float *lanes_c = b.lanes(slab) + c * heads * 16, *top_c = b.tails(slab) + c * heads;
    for (long i = 0; i < heads; ++i) top_c[i] = -INFINITY, v_store(lanes_c + 16 * i, v_set1(-INFINITY));
    const long end = b.chunk_end(c);
    for (long j0 = c * ATTN_CHUNK; j0 < end; j0 += tile) {
      const long count = end - j0 < tile ? end - j0 : tile;
      const float* keys_tile = tile_rows(b.kr, b.slot, j0, count, b.D, converted);
      for (long r = b.r0; r < b.r1; ++r) {
        const long m = b.keys(r) - j0 < count ? b.keys(r) - j0 : count;
        for (long h = 0, i = (r - b.r0) * b.group; m > 0 && h < b.group; ++h, ++i) {
          float* ph = p + i * most + j0;
          scores(b.q + (r * b.H + b.kv * b.group + h) * b.D, keys_tile, m, b.D, b.scale, ph);
          v16 lanes = v_load(lanes_c + 16 * i);
          long j = 0;
          for (; j + 16 <= m; j += 16) lanes = v_max(v_load(ph + j), lanes);
          v_store(lanes_c + 16 * i, lanes);
          for (; j < m; ++j) top_c[i] = ph[j] > top_c[i] ? ph[j] : top_c[i];
        }
      }
    }
  }
}

// Adds value-sum slot `from` (of `slots`) into slot 0 for the rows with keys in chunk c, lane by lane, and the totals.
template <typename T>
static void fold_chunk(const Block<T>& b, float* slab, long slots, long c, long from) {
  const long heads = b.heads(), ldacc = b.ldacc();
  float *acc = b.sums(slab), *total = b.totals(slab, slots);
  for (long r = b.r0; r < b.r1; ++r)
    for (long h = 0, i = (r - b.r0) * b.group; b.sees(r, c) && h < b.group; ++h, ++i) {
      for (long k = 0; k < ldacc; k += 16)
        v_store(acc + i * ldacc + k, v_add(v_load(acc + i * ldacc + k), v_load(acc + (from * heads + i) * ldacc + k)));
      total[i] += total[from * heads + i];
    }
}

// top [heads]: each row and head's max score over all its chunks (their lanes and other keys): max in any order (a
// NaN score taken by none; +-0 give the same exps).
template <typename T>
static void block_max(const Block<T>& b, const float* slab, float* top) {
  const long heads = b.heads(), chunks = b.chunks();
  const float *lanes = b.lanes(slab), *tails = b.tails(slab);
  for (long i = 0; i < heads; ++i) {
    top[i] = -INFINITY;
    for (long c = 0; c < chunks; ++c) {
      const float* lane = lanes + (c * heads + i) * 16;
      for (long l = 0; l < 16; ++l) top[i] = lane[l] > top[i] ? lane[l] : top[i];
      top[i] = tails[c * heads + i] > top[i] ? tails[c * heads + i] : top[i];
    }
  }
}

// Chunks c0 .. c1 - 1 of the block's exps (exp16 on the 16-key blocks, libm's expf on the last keys % 16, by the
// row's own key count; top from block_max) and weighted sums, tile by tile. Chunk c's sums go to slot c of the slab
// (`folds` false: finish_block adds them up), or, with `folds`, chunk 0's to slot 0 and each later chunk's to slot 1,
// then added into slot 0: the same additions in the same order.
template <typename T>
static void block_sums(const Block<T>& b, long c0, long c1, float* slab, bool folds, const float* top,
                       float* converted) {
  const long heads = b.heads(), most = b.most(), ldacc = b.ldacc(), tile = tile_keys(b.D);
  const long slots = folds ? 2 : b.chunks();
  float* p = slab;
  float *acc = b.sums(slab), *total = b.totals(slab, slots);
  for (long c = c0; c < c1; ++c) {
    const long slot = folds ? (c > 0) : c;
    float *acc_c = acc + slot * heads * ldacc, *total_c = total + slot * heads;
    for (long r = b.r0; r < b.r1; ++r)
      for (long h = 0, i = (r - b.r0) * b.group; (c == 0 || b.sees(r, c)) && h < b.group; ++h, ++i) {
        total_c[i] = 0.0f;
        for (long k = 0; k < ldacc; k += 16) v_store(acc_c + i * ldacc + k, v_zero());
      }
    const long end = b.chunk_end(c);
    for (long j0 = c * ATTN_CHUNK; j0 < end; j0 += tile) {
      const long count = end - j0 < tile ? end - j0 : tile;
      const float* values_tile = tile_rows(b.vr, b.slot, j0, count, b.D, converted);
      for (long r = b.r0; r < b.r1; ++r) {
        const long keys = b.keys(r), m = keys - j0 < count ? keys - j0 : count, i0 = (r - b.r0) * b.group;
        if (m <= 0) continue;
        for (long h = 0, i = i0; h < b.group; ++h, ++i) {
          float* ph = p + i * most;
          long j = j0;
          for (; j + 16 <= keys && j < j0 + m; j += 16) v_store(ph + j, exp16(v_sub(v_load(ph + j), v_set1(top[i]))));
          for (; j < j0 + m; ++j) ph[j] = expf(ph[j] - top[i]);  // the last few keys: libm's
        }
        weighted_sums_any(p + i0 * most + j0, most, values_tile, m, b.D, b.group, acc_c + i0 * ldacc, ldacc,
                          total_c + i0);
      }
    }
    if (folds && c > 0) fold_chunk(b, slab, 2, c, 1);
  }
}

// The block's rows out: (with `folds` false, each chunk's sums first added into chunk 0's, in key order) o / total.
template <typename T>
static void finish_block(const Block<T>& b, float* slab, bool folds) {
  const long ldacc = b.ldacc(), slots = folds ? 2 : b.chunks();
  if (!folds)
    for (long c = 1; c < slots; ++c) fold_chunk(b, slab, slots, c, c);
  const float *acc = b.sums(slab), *total = b.totals(slab, slots);
  for (long r = b.r0; r < b.r1; ++r)
    for (long h = 0, i = (r - b.r0) * b.group; h < b.group; ++h, ++i) {
      const v16 inv = v_set1(1.0f / total[i]);
      float* o = b.out + (r * b.H + b.kv * b.group + h) * b.D;
      for (long k = 0; k < b.D; k += 16) v_store_n(o + k, v_mul(v_load(acc + i * ldacc + k), inv), b.D - k);
    }
}

// q: [n, H, D]; K, V: [KVH, S, D] (the cache), the run at slots first .. first + t - 1; out: [n, H * D]. The work
// goes in blocks of ATTN_ROWS rows and one KV head (the block's rows and query heads over each tile of keys while it
// sits in L1), split over `threads` threads (threads.h), which changes no output's arithmetic. Row by row, each
// streamed all its keys and values from memory: a prefill's 32 rows, SmolLM2's 9 heads over 3 KV heads, one core,
// 3000 / 6000 keys: 10.7 / 28.9 ms a call, now 5.0 / 10.4 (a decode's one row: 356 -> 304 us at 3000).
#define ATTN_ROWS 16  // rows a block: their scores [rows, group, keys] stay in L2 (16 x 3 x 6000: 1.1 MB)
#define ATTN_SPLIT_FLOATS (1L << 24)  // the most slab floats a call splits its blocks' chunks over threads for
#define ATTN_SPLIT_UNEVEN 1.1  // ... where runs of whole blocks would give a thread over this many times its share

// `count` floats, 64-byte aligned (out of memory: abort, as the GEMMs' panels do).
static float* floats(long count) {
  void* buf = nullptr;
  if (posix_memalign(&buf, 64, sizeof(float) * (count > 0 ? count : 1)) != 0) abort();
  return (float*)buf;
}

// Several sequences' causal spans in one call (a batched verify or decode, SSD's branches): one call a layer where
// a call a span cost each span 20-35 us of Python and ctypes, most of a small model's batched step. spans [n, 5]:
// q_start, q_len, num_keys, first, offset. Span s's q_len rows, q + q_start H D, see its num_keys keys: with
// offset -1 the run at slots first .., else at slots[offset ..] (gathered a tile at a time, tile_rows). Each row
// the arithmetic of causal_attention's. Where threads taking runs of whole blocks would share the work unevenly
// (SmolLM2's decode or verify: 3 blocks, one a KV head, for 2 threads), the blocks are fewer than 4 a thread and
// some have several chunks, the blocks' chunks are the units, each thread a run of them of about equal work (rows
// times keys): every thread's scores, then every thread's sums (the max needs all of a row's scores), then the
// chunks' sums added in key order. (Runs of equally many chunks left 16 + 1 rows, 2 blocks a KV head, as uneven as
// whole blocks.) Without OpenMP, one thread does all the blocks whole.
template <typename T>
static void causal_spans_of(const float* q, long H, long D, const T* K, const T* V, long KVH, long S, long n_spans,
                            const long* spans, const long* slots, float scale, float* out, int threads) {
  const long group = H / KVH;
  long n_blocks = 0;
  for (long s = 0; s < n_spans; ++s) n_blocks += KVH * ((spans[5 * s + 1] + ATTN_ROWS - 1) / ATTN_ROWS);
  Block<T>* blocks = (Block<T>*)malloc(sizeof(Block<T>) * (n_blocks > 0 ? n_blocks : 1));
  if (blocks == nullptr) abort();
  long n_units = 0, work_floats = 1, all_floats = 0, most_heads = 1, total = 0;
  bool gathers = sizeof(T) == 2;
  for (long s = 0, u = 0; s < n_spans; ++s) {
    const long* sp = spans + 5 * s;
    const long first = sp[4] >= 0 ? 0 : sp[3];
    gathers = gathers || sp[4] >= 0;
    for (long kv = 0; kv < KVH; ++kv)
      for (long r0 = 0; r0 < sp[1]; r0 += ATTN_ROWS, ++u) {
        Block<T>& b = blocks[u];
        const long* slot = sp[4] >= 0 ? slots + sp[4] : nullptr;
        b = {q + sp[0] * H * D, K + (kv * S + first) * D, V + (kv * S + first) * D, slot, out + sp[0] * H * D,
             sp[1], H, D, kv, group, r0, r0 + ATTN_ROWS < sp[1] ? r0 + ATTN_ROWS : sp[1], sp[2], scale};
        n_units += b.chunks();
        total += b.heads() * b.most();
        work_floats = b.slab_floats(2) > work_floats ? b.slab_floats(2) : work_floats;
        all_floats += b.slab_floats(b.chunks());
        most_heads = b.heads() > most_heads ? b.heads() : most_heads;
      }
  }
  long most_run = 0;  // the most work over_panels' runs of whole blocks would give a thread
  for (long t = 0, n = threads < n_blocks ? threads : n_blocks; t < n; ++t) {
    long run = 0;
    for (long u = n_blocks * t / n; u < n_blocks * (t + 1) / n; ++u) run += blocks[u].heads() * blocks[u].most();
    most_run = run > most_run ? run : most_run;
  }
  const bool split = runs_parallel() && threads > 1 && n_units > n_blocks && n_blocks < 4L * threads &&
                     most_run > ATTN_SPLIT_UNEVEN * total / threads && all_floats <= ATTN_SPLIT_FLOATS;
  // `converted` (a gathered or half tile as float32) is an allocation of its own: inside the slab, its stores aliased
  // the score rows' loads 4 KiB apart, and a block of 16 rows took 1.35x the float32 kernel's time
  const long tile_floats = gathers ? tile_keys(D) * D : 1;
  if (!split) {
    over_panels(n_blocks, threads, [&](long u0, long u1) {
      float *work = floats(work_floats + most_heads), *converted = floats(tile_floats), *top = work + work_floats;
      for (long u = u0; u < u1; ++u) {
        block_scores(blocks[u], 0, blocks[u].chunks(), work, converted);
        block_max(blocks[u], work, top);
        block_sums(blocks[u], 0, blocks[u].chunks(), work, true, top, converted);
        finish_block(blocks[u], work, true);
      }
      free(converted);
      free(work);
    });
  } else {
    long* unit_block = (long*)malloc(sizeof(long) * 2 * n_units);
    long* slab_at = (long*)malloc(sizeof(long) * n_blocks);
    const int parts = threads < n_units ? threads : (int)n_units;
    long* starts = (long*)malloc(sizeof(long) * (parts + 1));  // thread t's units: starts[t] .. starts[t + 1] - 1
    float* slabs = floats(all_floats);
    if (unit_block == nullptr || slab_at == nullptr || starts == nullptr) abort();
    long unit = 0, done = 0, t = 0;  // done: the work of the units before `unit`; a unit goes by its middle
    for (long u = 0, at = 0; u < n_blocks; at += blocks[u].slab_floats(blocks[u].chunks()), ++u) {
      slab_at[u] = at;
      for (long c = 0; c < blocks[u].chunks(); done += blocks[u].cost(c), ++c, ++unit) {
        for (; t < parts && done + blocks[u].cost(c) / 2 >= total * t / parts; ++t) starts[t] = unit;
        unit_block[2 * unit] = u, unit_block[2 * unit + 1] = c;
      }
    }
    for (; t <= parts; ++t) starts[t] = n_units;
    each_thread_then(
        parts,
        [&](int part) {
          float* converted = floats(tile_floats);
          for (long i = starts[part]; i < starts[part + 1]; ++i) {
            const long u = unit_block[2 * i], c = unit_block[2 * i + 1];
            block_scores(blocks[u], c, c + 1, slabs + slab_at[u], converted);
          }
          free(converted);
        },
        [&](int part) {
          float *top = floats(most_heads), *converted = floats(tile_floats);
          for (long i = starts[part], last = -1; i < starts[part + 1]; ++i) {
            const long u = unit_block[2 * i], c = unit_block[2 * i + 1];
            if (u != last) block_max(blocks[u], slabs + slab_at[u], top), last = u;
            block_sums(blocks[u], c, c + 1, slabs + slab_at[u], false, top, converted);
          }
          free(converted);
          free(top);
        });
    for (long u = 0; u < n_blocks; ++u) finish_block(blocks[u], slabs + slab_at[u], false);
    free(slabs);
    free(starts);
    free(slab_at);
    free(unit_block);
  }
  free(blocks);
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
