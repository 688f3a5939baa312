/* wordpiece.h — the BERT tokenizer: basic tokenization (clean text, CJK split, optional
 * lowercase and accent stripping, whitespace and punctuation split) then greedy longest-match-first
 * WordPiece over a vocab.txt, as Hugging Face's BertTokenizer does (engine/io/wordpiece.c).
 * Ids are 0-based line numbers of vocab.txt. No special tokens are added here, but "[CLS]" etc.
 * written in the text map to their ids, as in transformers. */
#ifndef KENG_WORDPIECE_H
#define KENG_WORDPIECE_H

#include <keng/keng.h>

typedef struct kg_wordpiece kg_wordpiece;

typedef struct {
  bool lowercase;            /* lowercase the text (uncased models) */
  int strip_accents;         /* 1 strip, 0 keep, -1 (default) follow lowercase */
  bool no_chinese_split;     /* true: CJK ideographs are not split into single tokens */
  int max_chars_per_word;    /* longer words become the unknown token; 0 = 100 */
  const char *unk_token;     /* NULL = "[UNK]" */
  bool split_special_tokens; /* true: "[CLS]" etc. in the text are tokenized as text */
} kg_wordpiece_opts;

/* Reads a vocab.txt (one token per line, UTF-8). [out] *out; free with kg_wordpiece_free. */
kg_status kg_wordpiece_load(kg_wordpiece **out, const char *path, const kg_wordpiece_opts *o);
void kg_wordpiece_free(kg_wordpiece *wp);
int64_t kg_wordpiece_vocab_size(const kg_wordpiece *wp);
/* The id of token s[0..n), or -1. */
int64_t kg_wordpiece_token_to_id(const kg_wordpiece *wp, const char *s, size_t n);
/* The token of id (NUL-terminated, *n its length), or NULL when out of range. */
const char *kg_wordpiece_id_to_token(const kg_wordpiece *wp, int64_t id, size_t *n);
/* text[0..len) (UTF-8) -> [out] *ids (malloc'd, free()) of [out] *n ids. */
kg_status kg_wordpiece_encode(const kg_wordpiece *wp, const char *text, size_t len, int32_t **ids, int64_t *n);
/* ids -> [out] *text (malloc'd, NUL-terminated, free()): pieces joined by spaces, "##" pieces glued
 * to the previous one, then the usual clean-up (" ." -> "." and so on). */
kg_status kg_wordpiece_decode(const kg_wordpiece *wp, const int64_t *ids, int64_t n, char **text, size_t *len);

#endif
