/* fuzz_clip_bpe.c — kg_clip_bpe_load on a vocab.json + merges.txt pair split from the input
 * at the first NUL byte (no NUL: the input is vocab.json with a fixed merges.txt, and the
 * input is also tried as merges.txt with a fixed vocab.json), then encode/decode. */
#include <keng/clip_bpe.h>
#include <keng/keng.h>

#include "fuzz_util.h"

static const char vocab[] = "{\"a\": 0, \"b\": 1, \"ab\": 2, \"a</w>\": 3, \"b</w>\": 4, \"ab</w>\": 5,"
                            " \"<|startoftext|>\": 6, \"<|endoftext|>\": 7}";
static const char merges[] = "#version: 0.2\na b\na b</w>\n";

static void try_pair(const uint8_t *v, size_t nv, const uint8_t *m, size_t nm) {
  const char *vp = fuzz_file(0, "vocab.json", v, nv);
  const char *mp = fuzz_file(1, "merges.txt", m, nm);
  kg_clip_bpe *t = NULL;
  if (kg_clip_bpe_load(&t, vp, mp) != KG_OK) {
    if (!kg_last_error()[0]) __builtin_trap();
    return;
  }
  static const char text[] = "a photo of ab ba,  \xc3\xa9t\xc3\xa9 \xff 12 ab!";
  int32_t *ids = NULL;
  int64_t n = 0;
  if (kg_clip_bpe_encode(t, text, sizeof text - 1, &ids, &n) == KG_OK) {
    int64_t *ids64 = malloc(sizeof *ids64 * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) ids64[i] = ids[i];
    char *out = NULL;
    size_t len = 0;
    if (kg_clip_bpe_decode(t, ids64, n, &out, &len) == KG_OK) free(out);
    free(ids64);
    free(ids);
  }
  kg_clip_bpe_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  if (nul) {
    try_pair(data, (size_t)(nul - data), nul + 1, size - (size_t)(nul - data) - 1);
  } else {
    try_pair(data, size, (const uint8_t *)merges, sizeof merges - 1);
    try_pair((const uint8_t *)vocab, sizeof vocab - 1, data, size);
  }
  return 0;
}
