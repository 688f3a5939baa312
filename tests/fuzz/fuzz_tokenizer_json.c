/* fuzz_tokenizer_json.c — kg_tokenizer_json_parse over the input up to its first NUL (a
 * tokenizer.json: the JSON reader, every component loader, the regex compiler); a tokenizer that
 * loads must encode the rest of the input (or a fixed text when there is none: regexes,
 * normalizers, added tokens and the model on hostile text), post-process, decode its ids with and
 * without special tokens, and look every id up, without faults. */
#include <keng/keng.h>
#include <keng/tokenizer_json.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  size_t jlen = nul ? (size_t)(nul - data) : size;
  kg_tokenizer_json *t = NULL;
  if (kg_tokenizer_json_parse(&t, (const char *)data, jlen, "fuzz") != KG_OK) {
    if (!kg_last_error()[0]) __builtin_trap();
    return 0;
  }
  static const char fixed[] =
      "Hello w\xc3\xb6rld  <s> 123 'll \xe4\xb8\xad\xe6\x96\x87 e\xcc\x81 \xf0\x9f\x98\x80\r\n\t x";
  const char *text = nul ? (const char *)nul + 1 : fixed;
  size_t tlen = nul ? size - jlen - 1 : sizeof fixed - 1;
  int32_t *ids = NULL;
  size_t n = 0;
  if (kg_tokenizer_json_encode(t, text, tlen, &ids, &n) == KG_OK) {
    int32_t *pp = NULL, *types = NULL;
    size_t pn = 0;
    if (kg_tokenizer_json_post_process(t, ids, n, ids, n, true, true, &pp, &types, &pn) == KG_OK) {
      for (int skip = 0; skip < 2; skip++) {
        char *out = NULL;
        size_t len = 0;
        if (kg_tokenizer_json_decode(t, pp, pn, skip, &out, &len) == KG_OK) free(out);
      }
      free(pp);
      free(types);
    }
    free(ids);
  }
  (void)kg_tokenizer_json_num_special(t, false);
  int64_t vs = kg_tokenizer_json_vocab_size(t);
  int32_t all[64];
  int m = vs < 64 ? (int)vs : 64;
  for (int i = 0; i < m; i++) {
    size_t tl;
    const char *tok = kg_tokenizer_json_id_to_token(t, i, &tl);
    if (tok && kg_tokenizer_json_token_to_id(t, tok, tl) < 0) __builtin_trap();
    all[i] = i;
  }
  char *out = NULL;
  size_t len = 0;
  if (m && kg_tokenizer_json_decode(t, all, (size_t)m, false, &out, &len) == KG_OK) free(out);
  kg_tokenizer_json_free(t);
  return 0;
}
