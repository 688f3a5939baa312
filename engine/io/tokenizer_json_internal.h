/* tokenizer_json_internal.h — what the files of the tokenizer.json reader share (engine-private):
 *   tokenizer_json.c        loading, added tokens, the encode / decode pipeline, post-processors
 *   tokenizer_json_regex.c  the Oniguruma-flavoured regex subset of Split / Replace patterns
 *   tokenizer_json_text.c   normalizers, pre-tokenizers, decoders
 *   tokenizer_json_model.c  the models: BPE, WordPiece, Unigram, WordLevel
 * Strings are UTF-8 byte runs with lengths; the text reaching them is well-formed UTF-8. */
#ifndef KENG_IO_TOKENIZER_JSON_INTERNAL_H
#define KENG_IO_TOKENIZER_JSON_INTERNAL_H

#include <keng/tokenizer_json.h>

#include "json.h"
#include "vocab.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TJ_OP "tokenizer_json"

/* ---- growable byte buffer and piece lists ----------------------------------------------- */

typedef struct {
  char *p;
  size_t n, cap;
  bool oom; /* latched when an allocation failed */
} tj_buf;
void tj_put(tj_buf *b, const void *s, size_t n);
void tj_put_cp(tj_buf *b, uint32_t cp);
void tj_buf_free(tj_buf *b);

/* one piece of text between the pipeline's stages; first: it starts at offset 0 of the
 * original text (Metaspace's prepend_scheme "first") */
typedef struct {
  char *s;
  size_t n;
  bool first;
} tj_piece;
typedef struct {
  tj_piece *v;
  size_t n, cap;
  bool oom;
} tj_pieces;
/* Appends a copy of s[0..n). */
void tj_pieces_add(tj_pieces *l, const char *s, size_t n, bool first);
void tj_pieces_free(tj_pieces *l);
/* Decodes the code point at s[*i] of well-formed UTF-8 and advances *i. */
uint32_t tj_next(const char *s, size_t n, size_t *i);

/* ---- regex (tokenizer_json_regex.c) ------------------------------------------------------ */

typedef struct tj_regex tj_regex;
/* Compiles pat[0..n); on syntax keng does not implement fails with KG_ERR_VALUE naming it,
 * prefixed by where ("pre_tokenizer Split"). */
kg_status tj_regex_compile(tj_regex **out, const char *pat, size_t n, const char *where);
void tj_regex_free(tj_regex *re);
/* The leftmost match at or after from in s[0..n): 1 and [ms, me), 0 for none, -1 when the
 * backtracking budget ran out (the error is set). */
int tj_regex_search(const tj_regex *re, const char *s, size_t n, size_t from, size_t *ms, size_t *me);

/* a Split / Replace pattern: {"String": s} or {"Regex": r} */
typedef struct {
  char *str;
  size_t len;
  tj_regex *re; /* NULL for a string */
} tj_pattern;
/* The non-overlapping matches of p in s[0..n) as [out] *spans (malloc'd pairs start, end) and
 * *count, as the reference's find_iter gives them. */
kg_status tj_pattern_matches(const tj_pattern *p, const char *s, size_t n, size_t **spans, size_t *count);
void tj_pattern_free(tj_pattern *p);

/* ---- normalizers, pre-tokenizers, decoders (tokenizer_json_text.c) ------------------------ */

enum {
  TJ_N_SEQUENCE,
  TJ_N_NFC,
  TJ_N_NFD,
  TJ_N_NFKC,
  TJ_N_NFKD,
  TJ_N_LOWERCASE,
  TJ_N_STRIP_ACCENTS,
  TJ_N_STRIP,
  TJ_N_REPLACE,
  TJ_N_PREPEND,
  TJ_N_BERT,
  TJ_N_PRECOMPILED,
  TJ_N_NMT,
  TJ_N_BYTELEVEL
};
typedef struct tj_norm {
  int kind;
  struct tj_norm *kids; /* Sequence */
  int nkids;
  bool left, right; /* Strip */
  tj_pattern pat;   /* Replace */
  char *content;    /* Replace, Prepend */
  size_t content_len;
  bool clean_text, chinese, strip_accents, lowercase; /* BertNormalizer */
  uint8_t *charsmap;                                  /* Precompiled: the decoded blob */
  const uint32_t *trie;
  size_t trie_units;
  const char *norm;
  size_t norm_len;
} tj_norm;
/* s[0..n) -> out (appended) */
kg_status tj_normalize(const tj_norm *z, const char *s, size_t n, tj_buf *out);
void tj_norm_free(tj_norm *z);

enum { TJ_B_REMOVED, TJ_B_ISOLATED, TJ_B_MERGED_PREV, TJ_B_MERGED_NEXT, TJ_B_CONTIGUOUS };
enum { TJ_PREPEND_ALWAYS, TJ_PREPEND_FIRST, TJ_PREPEND_NEVER };
enum {
  TJ_P_SEQUENCE,
  TJ_P_BYTELEVEL,
  TJ_P_METASPACE,
  TJ_P_WHITESPACE,
  TJ_P_WHITESPACE_SPLIT,
  TJ_P_SPLIT,
  TJ_P_PUNCTUATION,
  TJ_P_DIGITS,
  TJ_P_BERT,
  TJ_P_CHAR_DELIMITER
};
typedef struct tj_pre {
  int kind;
  struct tj_pre *kids; /* Sequence */
  int nkids;
  bool add_prefix_space, use_regex; /* ByteLevel */
  uint32_t ch;                      /* Metaspace replacement, CharDelimiterSplit delimiter */
  char ch_utf8[4];
  int ch_len;
  int prepend;     /* Metaspace TJ_PREPEND_* */
  bool split;      /* Metaspace */
  tj_pattern pat;  /* Split; ByteLevel with use_regex: GPT-2's pattern */
  int behavior;    /* Split, Punctuation: TJ_B_* */
  bool invert;     /* Split */
  bool individual; /* Digits */
} tj_pre;
/* Splits (and rewrites) every piece of l in place. */
kg_status tj_pre_tokenize(const tj_pre *p, tj_pieces *l);
void tj_pre_free(tj_pre *p);
/* Rust regex's \w (Alphabetic, marks, Nd, Pc, Join_Control): the Whitespace pre-tokenizer's
 * classes and single_word's word test. */
bool tj_word_char(uint32_t cp);
/* The regex of GPT-2 that ByteLevel's use_regex applies. */
extern const char tj_gpt2_pattern[];

enum {
  TJ_D_SEQUENCE,
  TJ_D_BYTELEVEL,
  TJ_D_METASPACE,
  TJ_D_WORDPIECE,
  TJ_D_BYTEFALLBACK,
  TJ_D_FUSE,
  TJ_D_STRIP,
  TJ_D_REPLACE,
  TJ_D_BPE
};
typedef struct tj_dec {
  int kind;
  struct tj_dec *kids;
  int nkids;
  uint32_t ch;  /* Metaspace replacement, Strip content */
  int prepend;  /* Metaspace */
  char *prefix; /* WordPiece prefix, BPEDecoder suffix */
  size_t prefix_len;
  bool cleanup;       /* WordPiece */
  size_t start, stop; /* Strip */
  tj_pattern pat;     /* Replace */
  char *content;
  size_t content_len;
} tj_dec;
/* Rewrites the token strings of l (one decoder of the chain). */
kg_status tj_decode_chain(const tj_dec *d, tj_pieces *l);
void tj_dec_free(tj_dec *d);

/* ---- models (tokenizer_json_model.c) ------------------------------------------------------ */

enum { TJ_M_BPE, TJ_M_WORDPIECE, TJ_M_UNIGRAM, TJ_M_WORDLEVEL };
typedef struct {
  int kind;
  kg_vocab vocab; /* ids 0..n-1 */
  /* BPE */
  uint64_t *mkeys; /* merge hash: (a << 32 | b), UINT64_MAX empty */
  int32_t *mrank, *mout;
  size_t mslots;
  char *unk;
  size_t unk_len;
  char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (BPE); WordPiece's prefix */
  size_t prefix_len, suffix_len;
  bool fuse_unk, byte_fallback, ignore_merges;
  int32_t byte_ids[256]; /* <0xNN> ids, -1 when absent */
  /* WordPiece */
  size_t max_chars;
  size_t max_token_len; /* the longest vocabulary entry in bytes: no longer candidate can match */
  /* Unigram */
  struct tj_prefix *pfx; /* every piece prefix (at character boundaries) by hash: the lattice's trie */
  size_t pfx_slots;
  double *scores;
  double min_score;
  int64_t unk_id; /* -1 when none */
} tj_model;
/* Appends the ids of one pre-tokenized piece s[0..n) to out. */
kg_status tj_model_tokenize(const tj_model *m, const char *s, size_t n, kg_ids *out);
/* Builds the model from the "model" object; label names the file in errors. */
kg_status tj_model_load(tj_model *m, const kg_json *j, const char *label);
void tj_model_free(tj_model *m);

/* A message for a key of component what that keng does not implement / has the wrong type. */
kg_status tj_bad(const char *label, const char *fmt, ...);

#endif
