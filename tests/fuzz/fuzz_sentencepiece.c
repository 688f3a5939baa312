/* fuzz_sentencepiece.c — kg_sentencepiece_parse over arbitrary bytes (the protobuf
 * ModelProto of a tokenizer.model); a model that loads must also encode and decode a fixed
 * text and every id without faults. */
#include <keng/keng.h>
#include <keng/tokenizer.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kg_sentencepiece *sp = NULL;
  if (kg_sentencepiece_parse(&sp, data, size, "fuzz") != KG_OK) {
    if (!kg_last_error()[0]) __builtin_trap();
    return 0;
  }
  static const char text[] = "Hello w\xc3\xb6rld  <s> \xff\xfe 123 \xe4\xb8\xad";
  int32_t *ids = NULL;
  size_t n = 0;
  if (kg_sentencepiece_encode(sp, text, sizeof text - 1, &ids, &n) == KG_OK) {
    char *out = NULL;
    size_t len = 0;
    if (kg_sentencepiece_decode(sp, ids, n, &out, &len) == KG_OK) free(out);
    free(ids);
  }
  int vs = kg_sentencepiece_vocab_size(sp);
  int32_t all[64];
  int m = vs < 64 ? vs : 64;
  for (int i = 0; i < m; i++) {
    size_t pl;
    const char *p = kg_sentencepiece_id_to_piece(sp, i, &pl);
    if (p && kg_sentencepiece_piece_to_id(sp, p, pl) < 0) __builtin_trap();
    all[i] = i;
  }
  char *out = NULL;
  size_t len = 0;
  if (m && kg_sentencepiece_decode(sp, all, (size_t)m, &out, &len) == KG_OK) free(out);
  kg_sentencepiece_free(sp);
  return 0;
}
