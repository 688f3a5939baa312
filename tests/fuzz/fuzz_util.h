/* fuzz_util.h — helpers shared by the libFuzzer targets (tests/fuzz/fuzz_*.c).
 * Parsers that take a path get the input written to a file in a per-process temp directory. */
#ifndef KENG_FUZZ_UTIL_H
#define KENG_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The per-process scratch directory (created once, under $TMPDIR or /tmp). */
static const char *fuzz_dir(void) {
  static char dir[512];
  if (!dir[0]) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kengfuzz.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(dir)) abort();
  }
  return dir;
}

/* Writes data[0..n) to <fuzz_dir>/name; returns the path (static buffer per slot 0..3). */
static const char *fuzz_file(int slot, const char *name, const uint8_t *data, size_t n) {
  static char paths[4][600];
  snprintf(paths[slot], sizeof paths[slot], "%s/%s", fuzz_dir(), name);
  FILE *f = fopen(paths[slot], "wb");
  if (!f) abort();
  if (n && fwrite(data, 1, n, f) != n) abort();
  fclose(f);
  return paths[slot];
}

#endif
