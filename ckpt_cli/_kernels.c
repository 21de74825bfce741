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
void ckpt_ld1_block_sums(const unsigned char *words, size_t nblocks, size_t block_words,
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
