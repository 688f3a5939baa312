/* fuzz_wordpiece.c — kg_wordpiece_load on a vocab.txt made of the input (bad UTF-8, empty
 * lines, duplicates, no [UNK], CRLF), then encode/decode of a fixed text. */
#include <keng/keng.h>
#include <keng/wordpiece.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(0, "vocab.txt", data, size);
  kg_wordpiece_opts o = {0};
  o.lowercase = size && (data[0] & 1);
  o.strip_accents = -1;
  kg_wordpiece *wp = NULL;
  if (kg_wordpiece_load(&wp, path, &o) != KG_OK) {
    if (!kg_last_error()[0]) __builtin_trap();
    return 0;
  }
  static const char text[] = "[CLS] Hello, W\xc3\xb6rld! unaffable \xe4\xb8\xad\xe6\x96\x87 \xff [SEP] x";
  int32_t *ids = NULL;
  int64_t n = 0;
  if (kg_wordpiece_encode(wp, text, sizeof text - 1, &ids, &n) == KG_OK) {
    int64_t *ids64 = malloc(sizeof *ids64 * (size_t)(n + 2));
    for (int64_t i = 0; i < n; i++) ids64[i] = ids[i];
    ids64[n] = kg_wordpiece_vocab_size(wp) - 1;
    char *out = NULL;
    size_t len = 0;
    if (kg_wordpiece_decode(wp, ids64, n + 1, &out, &len) == KG_OK) free(out);
    free(ids64);
    free(ids);
  }
  kg_wordpiece_free(wp);
  return 0;
}
