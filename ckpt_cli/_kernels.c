/* Compiled kernels of ckpt, loaded with ctypes (ckpt_cli/core/digest/ld1_kernel.py): plain C,
 * no Python API, so a call holds no GIL and threads hash at once. Where this file could not be
 * compiled (no compiler at install), ckpt runs the same arithmetic in numpy: the results are
 * the same bits (tests/core/digest/test_ld1_kernel.py). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The two ld1 sums of each of `nblocks` whole blocks of `block_words` little-endian 64-bit
 * words at `words` (any alignment): s0[b] = sum_j mix(w[b][j] + a[j]) and
 * s1[b] = sum_j mix(w[b][j] + a[j]) * c[j], mod 2^64, where mix is two rounds of
 * `y *= m; y ^= y >> 32` (m1, then m2). The caller weighs them by the blocks' keys. */
static void ckpt_ld1_scalar(const unsigned char *words, size_t nblocks, size_t block_words,
                            const uint64_t *a, const uint64_t *c, uint64_t m1, uint64_t m2,
                            uint64_t *s0, uint64_t *s1) {
  for (size_t b = 0; b < nblocks; b++) {
    const unsigned char *row = words + b * block_words * 8;
    uint64_t x0 = 0, x1 = 0;
    for (size_t j = 0; j < block_words; j++) {
      uint64_t y;
      memcpy(&y, row + 8 * j, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
      y = __builtin_bswap64(y);
#endif
      y += a[j];
      y *= m1;
      y ^= y >> 32;
      y *= m2;
      y ^= y >> 32;
      x0 += y;
      x1 += y * c[j];
    }
    s0[b] = x0;
    s1[b] = x1;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CKPT_HAVE_LD1_SIMD 1

/* Eight words a step with AVX-512's 64-bit multiply (AVX512DQ). */
__attribute__((target("avx512f,avx512dq"))) static void
ckpt_ld1_avx512(const unsigned char *words, size_t nblocks, size_t block_words,
                const uint64_t *a, const uint64_t *c, uint64_t m1, uint64_t m2, uint64_t *s0,
                uint64_t *s1) {
  const __m512i vm1 = _mm512_set1_epi64((long long)m1), vm2 = _mm512_set1_epi64((long long)m2);
  size_t vec = block_words & ~(size_t)7;
  for (size_t b = 0; b < nblocks; b++) {
    const unsigned char *row = words + b * block_words * 8;
    __m512i x0 = _mm512_setzero_si512(), x1 = _mm512_setzero_si512();
    for (size_t j = 0; j < vec; j += 8) {
      __m512i y = _mm512_loadu_si512((const void *)(row + 8 * j));
      y = _mm512_add_epi64(y, _mm512_loadu_si512((const void *)(a + j)));
      y = _mm512_mullo_epi64(y, vm1);
      y = _mm512_xor_si512(y, _mm512_srli_epi64(y, 32));
      y = _mm512_mullo_epi64(y, vm2);
      y = _mm512_xor_si512(y, _mm512_srli_epi64(y, 32));
      x0 = _mm512_add_epi64(x0, y);
      x1 = _mm512_add_epi64(x1, _mm512_mullo_epi64(y, _mm512_loadu_si512((const void *)(c + j))));
    }
    uint64_t t0 = (uint64_t)_mm512_reduce_add_epi64(x0);
    uint64_t t1 = (uint64_t)_mm512_reduce_add_epi64(x1);
    if (vec < block_words) {
      uint64_t r0, r1;
      ckpt_ld1_scalar(row + 8 * vec, 1, block_words - vec, a + vec, c + vec, m1, m2, &r0, &r1);
      t0 += r0;
      t1 += r1;
    }
    s0[b] = t0;
    s1[b] = t1;
  }
}
#endif

/* `path`: 0 the fastest this CPU runs (AVX-512 where it has AVX512F and AVX512DQ, else plain
 * C), 1 plain C, 2 AVX-512 (plain C where the CPU lacks it): the tests compare every path the
 * host runs with numpy. Returns the path taken. AVX2 has no 64-bit multiply: built from 32-bit
 * products it ran slower than plain C here (0.65-0.95 against 0.98-1.27 GB/s a core), so it
 * has no path; AVX-512's ran 2.45-3.50. */
int ckpt_ld1_block_sums(const unsigned char *words, size_t nblocks, size_t block_words,
                        const uint64_t *a, const uint64_t *c, uint64_t m1, uint64_t m2,
                        uint64_t *s0, uint64_t *s1, int path) {
#ifdef CKPT_HAVE_LD1_SIMD
  __builtin_cpu_init();
  if (path != 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) {
    ckpt_ld1_avx512(words, nblocks, block_words, a, c, m1, m2, s0, s1);
    return 2;
  }
#endif
  (void)path;
  ckpt_ld1_scalar(words, nblocks, block_words, a, c, m1, m2, s0, s1);
  return 1;
}

/* SplitMix64's output function: the keys of word blocks (ld1_fold.splitmix). */
static inline uint64_t ckpt_splitmix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/* Both ld1 sums of `nwords` whole words at `words` (any alignment) that are words u0, u0+1...
 * of a leaf's stream, weighed by their blocks' keys: out[0] = sum_b r1_b * s0(b) and
 * out[1] = sum_b r2_b * s1(b), mod 2^64, with r_b = splitmix(b + seed) | 1 and s0/s1 the
 * block sums above over the words of block b in range (ld1_fold.fold_words in one call: its
 * numpy steps each take the GIL). Returns the path taken, as ckpt_ld1_block_sums. */
int ckpt_ld1_words(const unsigned char *words, size_t nwords, uint64_t u0, size_t block_words,
                   const uint64_t *a, const uint64_t *c, uint64_t m1, uint64_t m2,
                   uint64_t seed1, uint64_t seed2, uint64_t *out, int path) {
  uint64_t l1 = 0, l2 = 0;
  int taken = 1;
  size_t done = 0;
  while (done < nwords) {
    uint64_t u = u0 + done;
    uint64_t b = u / block_words;
    size_t j = (size_t)(u % block_words);
    size_t n = block_words - j;
    if (n > nwords - done) n = nwords - done;
    uint64_t s0, s1;
    taken = ckpt_ld1_block_sums(words + 8 * done, 1, n, a + j, c + j, m1, m2, &s0, &s1, path);
    l1 += (ckpt_splitmix(b + seed1) | 1) * s0;
    l2 += (ckpt_splitmix(b + seed2) | 1) * s1;
    done += n;
  }
  out[0] = l1;
  out[1] = l2;
  return taken;
}

/* ckpt_ld1_words over `nruns` runs of `run_words` whole words each: run r at byte
 * `offsets[r]` of `base`, words u0s[r], u0s[r]+1... of the stream; out[0], out[1] are the
 * sums of all runs (a box of a leaf cut on a later axis is such runs, one a row: in numpy
 * each chunk of rows took nine calls, every one taking the GIL). Returns the path taken. */
int ckpt_ld1_runs(const unsigned char *base, size_t nruns, const int64_t *offsets,
                  const uint64_t *u0s, size_t run_words, size_t block_words, const uint64_t *a,
                  const uint64_t *c, uint64_t m1, uint64_t m2, uint64_t seed1, uint64_t seed2,
                  uint64_t *out, int path) {
  uint64_t l1 = 0, l2 = 0, one[2];
  int taken = 1;
  for (size_t r = 0; r < nruns; r++) {
    taken = ckpt_ld1_words(base + offsets[r], run_words, u0s[r], block_words, a, c, m1, m2,
                           seed1, seed2, one, path);
    l1 += one[0];
    l2 += one[1];
  }
  out[0] = l1;
  out[1] = l2;
  return taken;
}

/* ---- trend's statistics of a block (ckpt_cli/core/trend/kernel.py) ---------------------- */
#include <float.h>
#include <math.h>

enum { CKPT_F32 = 0, CKPT_F64 = 1, CKPT_BF16 = 2, CKPT_F16 = 3 };

static inline double ckpt_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  if (e == 0x1f) {
    bits = sign | 0x7f800000u | (m << 13); /* Inf, NaN */
  } else if (e) {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  } else { /* 0 or subnormal: m * 2^-24, exact in float32 */
    float f = (float)m * 5.9604644775390625e-08f;
    return sign ? -(double)f : (double)f;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Values i0 <= i < i1 of `p` (of `kind`) as doubles into `out`. */
static inline void ckpt_widen(const unsigned char *p, size_t i0, size_t i1, int kind,
                              double *out) {
  size_t m = i1 - i0;
  if (kind == CKPT_F32) {
    const unsigned char *q = p + 4 * i0;
    for (size_t i = 0; i < m; i++) {
      float f;
      memcpy(&f, q + 4 * i, 4);
      out[i] = f;
    }
  } else if (kind == CKPT_F64) {
    memcpy(out, p + 8 * i0, 8 * m);
  } else {
    const unsigned char *q = p + 2 * i0;
    for (size_t i = 0; i < m; i++) {
      uint16_t h;
      memcpy(&h, q + 2 * i, 2);
      if (kind == CKPT_BF16) { /* bfloat16: the upper half of a float32 */
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, 4);
        out[i] = f;
      } else {
        out[i] = ckpt_f16(h);
      }
    }
  }
}

/* Neumaier's compensated sum: `s + c` is the running total. */
static inline void ckpt_nadd(double *s, double *c, double v) {
  double t = *s + v;
  *c += fabs(*s) >= fabs(v) ? (*s - t) + v : (v - t) + *s;
  *s = t;
}

#define CKPT_STRIP 1024

/* One strip's figures: sums over its finite values (`update`: over its finite differences). */
struct ckpt_strip {
  double total, squares, update, max_abs;
  int64_t finite, zeros;
};

#if defined(__has_builtin)
#if __has_builtin(__builtin_convertvector)
#define CKPT_CONVERT 1
#endif
#endif

/* The figures of values i0 <= i < i1 (at most CKPT_STRIP), summed in 2 x LANES lanes, vectors
 * of LANES doubles (VD, and VL: 64-bit integers as wide; VF: as many floats). A whole strip of
 * float32 is widened as it is loaded; any other is widened into a buffer first. */
#define CKPT_STRIP_FN(NAME, VD, VL, VF, LANES, ATTR)                                            \
  typedef double VD __attribute__((vector_size(8 * LANES)));                                  \
  typedef int64_t VL __attribute__((vector_size(8 * LANES)));                                 \
  typedef float VF __attribute__((vector_size(4 * LANES)));                                   \
  ATTR static void NAME(const unsigned char *x, const unsigned char *prev, size_t i0, size_t i1, \
                        int kind, struct ckpt_strip *r) {                                      \
    double v[CKPT_STRIP + 2 * LANES], d[CKPT_STRIP + 2 * LANES];                               \
    size_t m = i1 - i0, padded = (m + 2 * LANES - 1) / (2 * LANES) * (2 * LANES);              \
    int direct = CKPT_DIRECT && kind == CKPT_F32 && m == padded;                               \
    const unsigned char *xs = x + 4 * i0, *ps = prev ? prev + 4 * i0 : NULL;                   \
    if (!direct) {                                                                             \
      ckpt_widen(x, i0, i1, kind, v);                                                          \
      for (size_t i = m; i < padded; i++)                                                      \
        v[i] = 0.0; /* counted as zeros, then taken off */                                     \
      if (prev) {                                                                              \
        ckpt_widen(prev, i0, i1, kind, d);                                                     \
        for (size_t i = m; i < padded; i++)                                                    \
          d[i] = 0.0;                                                                          \
      }                                                                                        \
    }                                                                                          \
    VD zero = {0}, big = zero + DBL_MAX, s[2] = {zero, zero}, q[2] = {zero, zero};             \
    VD u[2] = {zero, zero}, mx[2] = {zero, zero};                                              \
    VL none = {0}, sign = none + INT64_MIN, fins[2] = {none, none}, zs[2] = {none, none};      \
    for (size_t i = 0; i < padded; i += 2 * LANES) {                                           \
      for (int k = 0; k < 2; k++) {                                                            \
        size_t at = i + LANES * k;                                                             \
        VD w, a, e = zero;                                                                     \
        CKPT_LOAD(VD, VF, w, xs, v, at);                                                       \
        if (prev) {                                                                            \
          CKPT_LOAD(VD, VF, e, ps, d, at);                                                     \
          e = w - e;                                                                           \
        }                                                                                      \
        a = (VD)((VL)w & ~sign);                                                               \
        VL fin = a <= big; /* -1 where finite, 0 for NaN and Inf */                            \
        fins[k] -= fin;                                                                        \
        zs[k] -= w == zero;                                                                    \
        w = (VD)((VL)w & fin);                                                                 \
        s[k] += w;                                                                             \
        q[k] += w * w;                                                                         \
        VL more = (a > mx[k]) & fin;                                                           \
        mx[k] = (VD)(((VL)a & more) | ((VL)mx[k] & ~more));                                    \
        VL ok = (VD)((VL)e & ~sign) <= big;                                                    \
        e = (VD)((VL)e & ok);                                                                  \
        u[k] += e * e;                                                                         \
      }                                                                                        \
    }                                                                                          \
    VD st = s[0] + s[1], sq = q[0] + q[1], su = u[0] + u[1];                                   \
    VL sf = fins[0] + fins[1], sz = zs[0] + zs[1];                                             \
    *r = (struct ckpt_strip){0, 0, 0, 0, 0, -(int64_t)(padded - m)};                           \
    for (int k = 0; k < LANES; k++) {                                                          \
      r->total += st[k];                                                                       \
      r->squares += sq[k];                                                                     \
      r->update += su[k];                                                                      \
      r->finite += sf[k];                                                                      \
      r->zeros += sz[k];                                                                       \
      r->max_abs = mx[0][k] > r->max_abs ? mx[0][k] : r->max_abs;                              \
      r->max_abs = mx[1][k] > r->max_abs ? mx[1][k] : r->max_abs;                              \
    }                                                                                          \
    r->finite -= (int64_t)(padded - m);                                                        \
  }

/* LANES doubles at `at`: float32 from `raw` widened as loaded (`direct`), else from `buf`. */
#ifdef CKPT_CONVERT
#define CKPT_DIRECT 1
#define CKPT_LOAD(VD, VF, dst, raw, buf, at)                                                   \
  do {                                                                                         \
    if (direct) {                                                                              \
      VF f_;                                                                                   \
      memcpy(&f_, (raw) + 4 * (at), sizeof f_);                                                \
      dst = __builtin_convertvector(f_, VD);                                                   \
    } else {                                                                                   \
      memcpy(&dst, (buf) + (at), sizeof dst);                                                  \
    }                                                                                          \
  } while (0)
#else
#define CKPT_DIRECT 0
#define CKPT_LOAD(VD, VF, dst, raw, buf, at) memcpy(&dst, (buf) + (at), sizeof dst)
#endif

/* Two doubles a vector: what every x86-64 (SSE2) and arm64 (NEON) target has. */
CKPT_STRIP_FN(ckpt_strip_2, ckpt_v2d, ckpt_v2l, ckpt_v2f, 2, )
#if defined(__x86_64__) && defined(__GNUC__)
#define CKPT_HAVE_AVX2 1
/* Four a vector on x86-64 hosts with AVX2, chosen at run time. */
CKPT_STRIP_FN(ckpt_strip_4, ckpt_v4d, ckpt_v4l, ckpt_v4f, 4, __attribute__((target("avx2"))))
#endif

/* Statistics of the `n` values at `x` (of `kind`), in one pass, in float64: out[0] the sum of
 * the finite values, out[1] the sum of their squares, out[2] the largest |value| among them
 * (0 if none), out[3] the sum of (x - prev)^2 over the elements where that difference is
 * finite (0 when `prev` is NULL; `prev`: n values of the same kind); counts[0] the values
 * equal to 0 (-0.0 included), counts[1] the NaN and Inf. A strip of CKPT_STRIP values is
 * widened to doubles and summed in lanes, the strips' sums compensated (Neumaier): as close
 * to the exact sums as numpy's pairwise float64 sums, or closer (the last bits may differ
 * between hosts with and without AVX2). When `alive` is not NULL, the values are rows of
 * `width` and alive[j] |= (value j of any row != 0) (NaN is not 0). `narrow`: two lanes a
 * vector even where AVX2 would give four (for the tests). */
void ckpt_trend_stats(const unsigned char *x, const unsigned char *prev, size_t n, int kind,
                      unsigned char *alive, size_t width, double *out, int64_t *counts,
                      int narrow) {
  double tot[3] = {0}, cmp[3] = {0}, maxabs = 0.0;
  int64_t zeros = 0, finite = 0;
  (void)narrow;
  void (*strip)(const unsigned char *, const unsigned char *, size_t, size_t, int,
                struct ckpt_strip *) = ckpt_strip_2;
#ifdef CKPT_HAVE_AVX2
  __builtin_cpu_init(); /* idempotent; what cpu_supports reads */
  if (!narrow && __builtin_cpu_supports("avx2"))
    strip = ckpt_strip_4;
#endif
  for (size_t start = 0; start < n; start += CKPT_STRIP) {
    struct ckpt_strip r;
    strip(x, prev, start, n - start < CKPT_STRIP ? n : start + CKPT_STRIP, kind, &r);
    ckpt_nadd(&tot[0], &cmp[0], r.total);
    ckpt_nadd(&tot[1], &cmp[1], r.squares);
    ckpt_nadd(&tot[2], &cmp[2], r.update);
    maxabs = r.max_abs > maxabs ? r.max_abs : maxabs;
    zeros += r.zeros;
    finite += r.finite;
  }
  out[0] = tot[0] + cmp[0];
  out[1] = tot[1] + cmp[1];
  out[2] = maxabs;
  out[3] = tot[2] + cmp[2];
  counts[0] = zeros;
  counts[1] = (int64_t)n - finite;
  if (alive == NULL || width == 0)
    return;
  size_t size = kind == CKPT_F64 ? 8 : kind == CKPT_F32 ? 4 : 2;
  for (size_t r = 0; r + width <= n; r += width) {
    const unsigned char *row = x + r * size;
    for (size_t j = 0; j < width; j++) { /* any bit but the sign's set: not 0 */
      if (size == 8) {
        uint64_t b;
        memcpy(&b, row + 8 * j, 8);
        alive[j] |= (b << 1) != 0;
      } else if (size == 4) {
        uint32_t b;
        memcpy(&b, row + 4 * j, 4);
        alive[j] |= (uint32_t)(b << 1) != 0;
      } else {
        uint16_t b;
        memcpy(&b, row + 2 * j, 2);
        alive[j] |= (uint16_t)(b << 1) != 0;
      }
    }
  }
}
