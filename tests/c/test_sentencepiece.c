/* test_sentencepiece.c — fuzz-style test of the SentencePiece loader (engine/io/sentencepiece.c):
 * the fixture models (tests/fixtures/sentencepiece: BPE with byte fallback, unigram with the
 * nmt_nfkc charsmap, Gemma-like BPE) are mutated a few thousand times (bit flips, random bytes,
 * varint-looking runs, truncation, deleted and duplicated ranges) and every mutant goes through
 * kg_sentencepiece_parse. Each must either fail with a "sentencepiece: ..." message or load into
 * a model that encodes text (including invalid UTF-8) to in-range ids and decodes them back.
 * The unmutated models must round-trip a sample text. Seeded PRNG: runs are repeatable.
 * Run under -DKENG_SANITIZE=address,undefined to turn silent corruption into failures. */
#include <keng/tokenizer.h>

#include "mutate.h"

#ifndef KENG_SOURCE_DIR
#define KENG_SOURCE_DIR ".."
#endif

static const char *SAMPLES[] = {
    "Hello, world! \xF0\x9F\x98\x80 Caf\xC3\xA9  spaces  ", /* emoji, accent, runs of spaces */
    "ab\xFF\xC3(\xE2\x82 cd\xF0\x9F",                       /* invalid UTF-8 */
    "<start_of_turn>user\nHi<end_of_turn>",
    "",
};

/* encodes and decodes the samples; checks ids are in range */
static void exercise(const kg_sentencepiece *sp, const char *what) {
  int V = kg_sentencepiece_vocab_size(sp);
  for (size_t k = 0; k < sizeof SAMPLES / sizeof *SAMPLES; k++) {
    int32_t *ids = NULL;
    size_t n = 0;
    kg_status s = kg_sentencepiece_encode(sp, SAMPLES[k], strlen(SAMPLES[k]), &ids, &n);
    CHECK(s == KG_OK, "%s: encode failed: %s", what, kg_last_error());
    if (s) continue;
    bool in_range = true;
    for (size_t i = 0; i < n; i++) in_range &= ids[i] >= 0 && ids[i] < V;
    CHECK(in_range, "%s: encode gave an id outside [0, %d)", what, V);
    char *text = NULL;
    size_t len = 0;
    if (in_range) {
      s = kg_sentencepiece_decode(sp, ids, n, &text, &len);
      CHECK(s == KG_OK && text && strlen(text) <= len, "%s: decode failed: %s", what, kg_last_error());
      free(text);
    }
    free(ids);
  }
  size_t plen;
  for (int id = 0; id < V; id += 1 + V / 7) {
    const char *p = kg_sentencepiece_id_to_piece(sp, id, &plen);
    CHECK(p && kg_sentencepiece_piece_to_id(sp, p, plen) == id, "%s: piece %d does not map back", what, id);
  }
}

static void roundtrip(const unsigned char *buf, size_t len, const char *name) {
  kg_sentencepiece *sp = NULL;
  kg_status s = kg_sentencepiece_parse(&sp, buf, len, name);
  CHECK(s == KG_OK, "%s: %s", name, kg_last_error());
  if (s) return;
  exercise(sp, name);
  const char *text = "Hello, world! \xF0\x9F\x98\x80 the quick brown fox";
  int32_t *ids;
  size_t n;
  char *back;
  size_t blen;
  if (!kg_sentencepiece_encode(sp, text, strlen(text), &ids, &n) && !kg_sentencepiece_decode(sp, ids, n, &back, &blen)) {
    kg_sentencepiece_info info = kg_sentencepiece_get_info(sp);
    if (info.byte_fallback) CHECK(strcmp(back, text) == 0, "%s: round trip gave '%s'", name, back);
    free(back);
    free(ids);
  }
  int32_t bad = kg_sentencepiece_vocab_size(sp);
  char *out;
  size_t olen;
  CHECK(kg_sentencepiece_decode(sp, &bad, 1, &out, &olen) == KG_ERR_VALUE && strstr(kg_last_error(), "outside"),
        "%s: out-of-range id accepted", name);
  kg_sentencepiece_free(sp);
}

static void mutate(unsigned char *m, size_t *len, const unsigned char *orig, size_t olen) {
  memcpy(m, orig, olen);
  *len = olen;
  int kinds = 1 + (int)below(3);
  for (int k = 0; k < kinds; k++) {
    switch (below(6)) {
    case 0: *len = mut_flip_bit(m, *len); break;
    case 1: m[below(*len)] = (unsigned char)next(); break;
    case 2: { /* a long varint-looking run */
      size_t at = below(*len), n = 1 + below(10);
      for (size_t i = 0; i < n && at + i < *len; i++) m[at + i] = (unsigned char)(0x80 | next());
      break;
    }
    case 3: *len = mut_truncate(*len); break;
    case 4: *len = mut_delete_span(m, *len, 64); break;
    case 5: *len = mut_copy_span(m, *len, 1, 32); break;
    }
    if (*len == 0) break;
  }
}

int main(void) {
  const char *names[] = {"bpe.model", "unigram.model", "bpe_gemma.model"};
  int loaded = 0, rejected = 0;
  for (int f = 0; f < 3; f++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/sentencepiece/%s", KENG_SOURCE_DIR, names[f]);
    size_t olen;
    unsigned char *orig = read_all(path, &olen);
    CHECK(orig != NULL, "cannot read %s", path);
    if (!orig) continue;
    roundtrip(orig, olen, names[f]);
    /* the charsmap model is large and mutations mostly land in the charsmap: fewer of them */
    int rounds = f == 1 ? 600 : 1500;
    unsigned char *m = malloc(olen + 1);
    for (int r = 0; r < rounds; r++) {
      size_t len;
      mutate(m, &len, orig, olen);
      kg_sentencepiece *sp = NULL;
      kg_status s = kg_sentencepiece_parse(&sp, m, len, "mutant");
      if (s == KG_OK) {
        loaded++;
        exercise(sp, "mutant");
        kg_sentencepiece_free(sp);
      } else {
        rejected++;
        CHECK(s == KG_ERR_IO && strncmp(kg_last_error(), "sentencepiece: mutant: ", 23) == 0,
              "unexpected error %d: %s", (int)s, kg_last_error());
      }
    }
    free(m);
    free(orig);
  }
  kg_sentencepiece *sp = NULL;
  CHECK(kg_sentencepiece_load(&sp, "/nonexistent/tokenizer.model") == KG_ERR_IO && !sp, "missing file loaded");
  printf("test_sentencepiece: %d mutants loaded, %d rejected; %d checks, %d failed\n", loaded, rejected, checks,
         failures);
  return failures ? 1 : 0;
}
