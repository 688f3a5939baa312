/* mutate.h — the kit of the fuzz-style C tests (test_safetensors.c, test_sentencepiece.c): a
 * CHECK that counts and reports, a seeded xorshift64* PRNG (runs repeat exactly), reading a
 * whole file, and the byte-level mutations both tests apply to a valid file before handing it
 * to a parser. Each test adds the mutations that know its format (JSON bytes, varints, ...).
 * Header-only: each test is one executable that includes it once. */
#ifndef KENG_TESTS_MUTATE_H
#define KENG_TESTS_MUTATE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks, failures;
#define CHECK(cond, ...)                                                                                               \
  do {                                                                                                                 \
    checks++;                                                                                                          \
    if (!(cond)) {                                                                                                     \
      failures++;                                                                                                      \
      fprintf(stderr, "%s:%d: FAILED: %s: ", __FILE__, __LINE__, #cond);                                               \
      fprintf(stderr, __VA_ARGS__);                                                                                    \
      fputc('\n', stderr);                                                                                             \
    }                                                                                                                  \
  } while (0)

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) { /* xorshift64* */
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  return rng * 0x2545F4914F6CDD1Dull;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

/* the whole file (one spare byte allocated), or NULL when it cannot be read */
static unsigned char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) free(buf), buf = NULL;
  fclose(f);
  *len = buf ? (size_t)n : 0;
  return buf;
}

/* ---- mutations of buf[0..len); each returns the new length -------------------------------- */

static size_t mut_flip_bit(unsigned char *buf, size_t len) {
  if (len) buf[below(len)] ^= (unsigned char)(1u << below(8));
  return len;
}

static size_t mut_truncate(size_t len) { return below(len + 1); }

/* copies a span of lo + below(span) bytes over another place (the length stays) */
static size_t mut_copy_span(unsigned char *buf, size_t len, size_t lo, size_t span) {
  if (len < 2) return len;
  size_t a = below(len), b = below(len), n = lo + below(span);
  if (a + n > len) n = len - a;
  if (b + n > len) n = len - b;
  memmove(buf + b, buf + a, n);
  return len;
}

/* deletes 1 to max bytes (fewer near the end) */
static size_t mut_delete_span(unsigned char *buf, size_t len, size_t max) {
  if (!len) return len;
  size_t at = below(len), n = 1 + below(max);
  if (at + n > len) n = len - at;
  memmove(buf + at, buf + at + n, len - at - n);
  return len - n;
}

#endif
