/* clip_bpe.h — the CLIP tokenizer: byte-level BPE over a vocab.json + merges.txt pair, as Hugging
 * Face's CLIPTokenizer does (engine/io/clip_bpe.c): NFC, whitespace runs -> one space, lowercase,
 * CLIP's regex split, byte-to-unicode symbols, BPE by merge rank with "</w>" ending each word.
 * Ids are the vocab.json values (0-based). No special tokens are added here; an exact
 * "<|startoftext|>" or "<|endoftext|>" in the text encodes to its id. */
#ifndef KENG_CLIP_BPE_H
#define KENG_CLIP_BPE_H

#include <keng/keng.h>

typedef struct kg_clip_bpe kg_clip_bpe;

/* Reads vocab.json ({"token": id}) and merges.txt (a "#version" line, then "a b" per line, rank =
 * line order). Both "<|startoftext|>" and "<|endoftext|>" must be in the vocabulary.
 * [out] *out; free with kg_clip_bpe_free. A malformed file fails with a message naming it. */
kg_status kg_clip_bpe_load(kg_clip_bpe **out, const char *vocab_path, const char *merges_path);
void kg_clip_bpe_free(kg_clip_bpe *t);
/* One past the largest id. */
int64_t kg_clip_bpe_vocab_size(const kg_clip_bpe *t);
int64_t kg_clip_bpe_bos_id(const kg_clip_bpe *t); /* <|startoftext|> */
int64_t kg_clip_bpe_eos_id(const kg_clip_bpe *t); /* <|endoftext|>, also the unknown token */
/* The id of token s[0..n), or -1. */
int64_t kg_clip_bpe_token_to_id(const kg_clip_bpe *t, const char *s, size_t n);
/* The token of id (NUL-terminated, *n its length), or NULL when there is none. */
const char *kg_clip_bpe_id_to_token(const kg_clip_bpe *t, int64_t id, size_t *n);
/* text[0..len) (UTF-8) -> [out] *ids (malloc'd, free()) of [out] *n ids. */
kg_status kg_clip_bpe_encode(const kg_clip_bpe *t, const char *text, size_t len, int32_t **ids, int64_t *n);
/* ids -> [out] *text (malloc'd, NUL-terminated, free()): symbols back to bytes (invalid UTF-8
 * becomes U+FFFD), each "</w>" a space, outer whitespace stripped. */
kg_status kg_clip_bpe_decode(const kg_clip_bpe *t, const int64_t *ids, int64_t n, char **text, size_t *len);

#endif
