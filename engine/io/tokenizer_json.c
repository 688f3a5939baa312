/* tokenizer_json.c — a Hugging Face tokenizer.json (the `tokenizers` library's format) read
 * into a pipeline and run as the reference's Tokenizer.encode / decode do (keng/tokenizer_json.h,
 * docs/tokenizers.md):
 *   1. added tokens: the non-normalized ones are cut out of the raw text (leftmost-longest, as
 *      the reference's Aho-Corasick; single_word, lstrip and rstrip as it applies them), each
 *      remaining stretch is normalized, then the normalized added tokens are cut out of that;
 *   2. the pre-tokenizer splits each remaining stretch; 3. the model turns each piece into ids;
 *   4. the post-processor (TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel,
 *      Sequence) adds special tokens;
 *   decode: ids -> tokens (added first, then the model; special ones dropped on request) ->
 *   the decoder chain -> joined (with spaces when there is no decoder).
 * The stages live in tokenizer_json_text.c (normalizers, pre-tokenizers, decoders),
 * tokenizer_json_model.c (BPE, WordPiece, Unigram, WordLevel) and tokenizer_json_regex.c. A component,
 * type or key that keng does not implement fails the load, naming it. The "truncation" and
 * "padding" members are not applied: transformers sets both per call (keng's batch helpers
 * take max_length and padding). */
#include "tokenizer_json_internal.h"

#include "unicode.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *content;
  size_t len;
  char *norm; /* the content normalized (normalized tokens) */
  size_t norm_len;
  int32_t id;
  bool single_word, lstrip, rstrip, normalized, special;
} added;

/* post-processor */
enum { TJ_PP_TEMPLATE, TJ_PP_BERT, TJ_PP_ROBERTA, TJ_PP_BYTELEVEL, TJ_PP_SEQUENCE };
typedef struct {
  int seq;     /* 0 A, 1 B, -1 special */
  int special; /* index into specials */
  int32_t type_id;
} titem;
typedef struct {
  char *name;
  int32_t *ids;
  int n;
} tspecial;
typedef struct tj_post {
  int kind;
  struct tj_post *kids;
  int nkids;
  titem *single, *pair;
  int nsingle, npair;
  tspecial *specials;
  int nspecials;
  int32_t cls, sep; /* Bert, Roberta */
} tj_post;

struct kg_tokenizer_json {
  char label[160];
  tj_model model;
  added *added;
  int nadded;
  kg_vocab added_vocab;      /* content -> index into added (ids 0..nadded-1 of this table) */
  uint8_t first_byte[2][32]; /* [normalized] bit set of the bytes an added token starts with */
  kg_vocab match[2];         /* [normalized] the forms matched in text (raw / normalized content) */
  int *match_added[2];       /* [normalized][id in match] -> index into added */
  size_t *match_lens[2];     /* [normalized] their distinct lengths, longest first */
  int nmatch_lens[2];
  int32_t *added_of_id; /* [vocab_size] index into added, or -1 */
  int64_t vocab_size;
  tj_norm *norm;
  tj_pre *pre;
  tj_post *post;
  tj_dec *dec;
};

kg_status tj_bad(const char *label, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return kg_error(KG_ERR_VALUE, TJ_OP, "%s: %s", label, msg);
}

static kg_status oom(void) { return kg_error(KG_ERR_OOM, TJ_OP, "out of memory"); }

static char *dup(const char *s, size_t n) {
  char *c = malloc(n + 1);
  if (c) {
    if (n) memcpy(c, s, n);
    c[n] = 0;
  }
  return c;
}

/* ---- JSON helpers ------------------------------------------------------------------------------ */

static kg_status keys_ok(const kg_json *j, const char *what, const char *const *known, const char *label) {
  for (int i = 0; i < j->n; i++) {
    bool ok = false;
    for (int k = 0; known[k] && !ok; k++)
      ok = !strcmp(j->keys[i], known[k]);
    if (!ok) {
      char list[300] = "";
      for (int k = 0; known[k]; k++) {
        strncat(list, known[k], sizeof list - strlen(list) - 1);
        if (known[k + 1]) strncat(list, ", ", sizeof list - strlen(list) - 1);
      }
      return tj_bad(label, "%s: the key '%.60s' is not supported (known: %s)", what, j->keys[i], list);
    }
  }
  return KG_OK;
}

static kg_status get_bool(const kg_json *j, const char *key, bool def, bool *out, const char *what, const char *label) {
  const kg_json *v = kg_json_get(j, key);
  *out = def;
  if (!v || v->type == KG_JSON_NULL) return KG_OK;
  if (v->type != KG_JSON_BOOL) return tj_bad(label, "%s: %s must be a boolean", what, key);
  *out = v->boolean;
  return KG_OK;
}

static kg_status get_str(const kg_json *j, const char *key, const char *def, char **out, size_t *len, const char *what,
                         const char *label) {
  const kg_json *v = kg_json_get(j, key);
  const char *s = def;
  size_t n = def ? strlen(def) : 0;
  if (v && v->type != KG_JSON_NULL) {
    if (v->type != KG_JSON_STRING) return tj_bad(label, "%s: %s must be a string", what, key);
    s = v->str, n = v->len;
  }
  if (!s) return tj_bad(label, "%s: %s is missing", what, key);
  *out = dup(s, n);
  if (!*out) return oom();
  *len = n;
  return KG_OK;
}

/* one character (Metaspace replacement, Strip content) */
static kg_status get_char(const kg_json *j, const char *key, uint32_t def, uint32_t *out, const char *what,
                          const char *label) {
  const kg_json *v = kg_json_get(j, key);
  *out = def;
  if (!v || v->type == KG_JSON_NULL) return KG_OK;
  size_t i = 0;
  if (v->type != KG_JSON_STRING || v->len == 0) return tj_bad(label, "%s: %s must be one character", what, key);
  *out = tj_next(v->str, v->len, &i);
  if (i != v->len) return tj_bad(label, "%s: %s must be one character", what, key);
  return KG_OK;
}

static kg_status get_uint(const kg_json *j, const char *key, size_t def, size_t *out, const char *what,
                          const char *label) {
  const kg_json *v = kg_json_get(j, key);
  *out = def;
  if (!v || v->type == KG_JSON_NULL) return KG_OK;
  if (v->type != KG_JSON_NUMBER || !v->is_uint || v->uint > 1u << 30)
    return tj_bad(label, "%s: %s must be a small non-negative integer", what, key);
  *out = (size_t)v->uint;
  return KG_OK;
}

static const char *type_of(const kg_json *j) {
  const kg_json *t = kg_json_get(j, "type");
  return t && t->type == KG_JSON_STRING ? t->str : NULL;
}

static kg_status get_pattern(const kg_json *j, tj_pattern *p, const char *what, const char *label) {
  const kg_json *v = kg_json_get(j, "pattern");
  if (!v || v->type != KG_JSON_OBJECT || v->n != 1 || v->items[0].type != KG_JSON_STRING)
    return tj_bad(label, "%s: pattern must be {\"String\": s} or {\"Regex\": r}", what);
  const kg_json *s = &v->items[0];
  if (!strcmp(v->keys[0], "String")) {
    p->str = dup(s->str, s->len);
    p->len = s->len;
    return p->str ? KG_OK : oom();
  }
  if (!strcmp(v->keys[0], "Regex")) {
    char where[200];
    snprintf(where, sizeof where, "%s: %s", label, what);
    return tj_regex_compile(&p->re, s->str, s->len, where);
  }
  return tj_bad(label, "%s: pattern must be {\"String\": s} or {\"Regex\": r}, not '%.40s'", what, v->keys[0]);
}

static kg_status get_behavior(const kg_json *j, int def, int *out, const char *what, const char *label) {
  const kg_json *v = kg_json_get(j, "behavior");
  *out = def;
  if (!v || v->type == KG_JSON_NULL) return KG_OK;
  static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
  if (v->type == KG_JSON_STRING)
    for (int k = 0; k < 5; k++)
      if (!strcmp(v->str, names[k])) return *out = k, KG_OK;
  return tj_bad(label, "%s: behavior must be one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous",
                what);
}

static kg_status get_prepend(const kg_json *j, int *out, const char *what, const char *label) {
  const kg_json *v = kg_json_get(j, "prepend_scheme"), *a = kg_json_get(j, "add_prefix_space");
  *out = TJ_PREPEND_ALWAYS;
  if (v && v->type != KG_JSON_NULL) {
    if (v->type == KG_JSON_STRING && !strcmp(v->str, "always"))
      *out = TJ_PREPEND_ALWAYS;
    else if (v->type == KG_JSON_STRING && !strcmp(v->str, "first"))
      *out = TJ_PREPEND_FIRST;
    else if (v->type == KG_JSON_STRING && !strcmp(v->str, "never"))
      *out = TJ_PREPEND_NEVER;
    else
      return tj_bad(label, "%s: prepend_scheme must be always, first or never", what);
  } else if (a && a->type == KG_JSON_BOOL) { /* older files */
    *out = a->boolean ? TJ_PREPEND_ALWAYS : TJ_PREPEND_NEVER;
  }
  return KG_OK;
}

/* base64 (the Precompiled charsmap) */
static uint8_t *base64(const char *s, size_t n, size_t *out_len) {
  uint8_t *o = malloc(n / 4 * 3 + 3);
  if (!o) return NULL;
  size_t k = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int v = c >= 'A' && c <= 'Z'   ? c - 'A'
            : c >= 'a' && c <= 'z' ? c - 'a' + 26
            : c >= '0' && c <= '9' ? c - '0' + 52
            : c == '+'             ? 62
            : c == '/'             ? 63
            : c == '='             ? -2
                                   : -1;
    if (v == -2) break;
    if (v < 0) {
      free(o);
      return NULL;
    }
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      o[k++] = (uint8_t)(acc >> bits);
    }
  }
  *out_len = k;
  return o;
}

/* ---- components ----------------------------------------------------------------------------------- */

static kg_status load_norm(tj_norm *z, const kg_json *j, const char *label, int depth) {
  memset(z, 0, sizeof *z);
  if (depth > 16) return tj_bad(label, "normalizer: Sequences nested too deep");
  if (!j || j->type != KG_JSON_OBJECT) return tj_bad(label, "normalizer must be an object");
  const char *t = type_of(j);
  if (!t) return tj_bad(label, "normalizer: no type");
  char what[80];
  snprintf(what, sizeof what, "normalizer %.40s", t);
  static const char *const only_type[] = {"type", NULL};
  kg_status st;
  if (!strcmp(t, "Sequence")) {
    static const char *const k[] = {"type", "normalizers", NULL};
    if ((st = keys_ok(j, what, k, label))) return st;
    const kg_json *a = kg_json_get(j, "normalizers");
    if (!a || a->type != KG_JSON_ARRAY) return tj_bad(label, "%s: normalizers must be an array", what);
    z->kind = TJ_N_SEQUENCE;
    z->kids = calloc((size_t)a->n + 1, sizeof *z->kids);
    if (!z->kids) return oom();
    for (int i = 0; i < a->n; i++) {
      z->nkids = i + 1;
      if ((st = load_norm(&z->kids[i], &a->items[i], label, depth + 1))) return st;
    }
    return KG_OK;
  }
  struct {
    const char *name;
    int kind;
  } simple[] = {{"NFC", TJ_N_NFC},
                {"NFD", TJ_N_NFD},
                {"NFKC", TJ_N_NFKC},
                {"NFKD", TJ_N_NFKD},
                {"Lowercase", TJ_N_LOWERCASE},
                {"StripAccents", TJ_N_STRIP_ACCENTS},
                {"Nmt", TJ_N_NMT},
                {"ByteLevel", TJ_N_BYTELEVEL}};
  for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
    if (!strcmp(t, simple[i].name)) {
      z->kind = simple[i].kind;
      return keys_ok(j, what, only_type, label);
    }
  if (!strcmp(t, "Strip")) {
    static const char *const k[] = {"type", "strip_left", "strip_right", NULL};
    z->kind = TJ_N_STRIP;
    if ((st = keys_ok(j, what, k, label)) || (st = get_bool(j, "strip_left", true, &z->left, what, label)) ||
        (st = get_bool(j, "strip_right", true, &z->right, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "Replace")) {
    static const char *const k[] = {"type", "pattern", "content", NULL};
    z->kind = TJ_N_REPLACE;
    if ((st = keys_ok(j, what, k, label)) || (st = get_pattern(j, &z->pat, what, label)) ||
        (st = get_str(j, "content", NULL, &z->content, &z->content_len, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "Prepend")) {
    static const char *const k[] = {"type", "prepend", NULL};
    z->kind = TJ_N_PREPEND;
    if ((st = keys_ok(j, what, k, label)) ||
        (st = get_str(j, "prepend", NULL, &z->content, &z->content_len, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "BertNormalizer")) {
    static const char *const k[] = {"type", "clean_text", "handle_chinese_chars", "strip_accents", "lowercase", NULL};
    z->kind = TJ_N_BERT;
    if ((st = keys_ok(j, what, k, label)) || (st = get_bool(j, "clean_text", true, &z->clean_text, what, label)) ||
        (st = get_bool(j, "handle_chinese_chars", true, &z->chinese, what, label)) ||
        (st = get_bool(j, "lowercase", true, &z->lowercase, what, label)) ||
        (st = get_bool(j, "strip_accents", z->lowercase, &z->strip_accents, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "Precompiled")) {
    static const char *const k[] = {"type", "precompiled_charsmap", NULL};
    z->kind = TJ_N_PRECOMPILED;
    if ((st = keys_ok(j, what, k, label))) return st;
    const kg_json *c = kg_json_get(j, "precompiled_charsmap");
    if (!c || c->type != KG_JSON_STRING) return tj_bad(label, "%s: precompiled_charsmap must be a base64 string", what);
    size_t n;
    uint8_t *blob = base64(c->str, c->len, &n);
    if (!blob) return tj_bad(label, "%s: precompiled_charsmap is not base64", what);
    if (n < 4) {
      free(blob);
      return tj_bad(label, "%s: precompiled_charsmap is truncated", what);
    }
    uint32_t trie_bytes =
        (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 | (uint32_t)blob[3] << 24;
    if (trie_bytes == 0 || trie_bytes % 4 || trie_bytes > n - 4) {
      free(blob);
      return tj_bad(label, "%s: precompiled_charsmap: bad trie size", what);
    }
    z->charsmap = malloc(n - 4 + 1); /* malloc'd: the 32-bit units are aligned */
    if (!z->charsmap) {
      free(blob);
      return oom();
    }
    memcpy(z->charsmap, blob + 4, n - 4);
    free(blob);
    z->trie = (const uint32_t *)z->charsmap;
    z->trie_units = trie_bytes / 4;
    z->norm = (const char *)z->charsmap + trie_bytes;
    z->norm_len = n - 4 - trie_bytes;
    return KG_OK;
  }
  return tj_bad(label,
                "normalizer: the type '%.40s' is not supported (Sequence, NFC, NFD, NFKC, NFKD, Lowercase, "
                "StripAccents, Strip, Replace, Prepend, BertNormalizer, Precompiled, Nmt, ByteLevel)",
                t);
}

static kg_status load_pre(tj_pre *p, const kg_json *j, const char *label, int depth) {
  memset(p, 0, sizeof *p);
  if (depth > 16) return tj_bad(label, "pre_tokenizer: Sequences nested too deep");
  if (!j || j->type != KG_JSON_OBJECT) return tj_bad(label, "pre_tokenizer must be an object");
  const char *t = type_of(j);
  if (!t) return tj_bad(label, "pre_tokenizer: no type");
  char what[80];
  snprintf(what, sizeof what, "pre_tokenizer %.40s", t);
  static const char *const only_type[] = {"type", NULL};
  kg_status st;
  if (!strcmp(t, "Sequence")) {
    static const char *const k[] = {"type", "pretokenizers", NULL};
    if ((st = keys_ok(j, what, k, label))) return st;
    const kg_json *a = kg_json_get(j, "pretokenizers");
    if (!a || a->type != KG_JSON_ARRAY) return tj_bad(label, "%s: pretokenizers must be an array", what);
    p->kind = TJ_P_SEQUENCE;
    p->kids = calloc((size_t)a->n + 1, sizeof *p->kids);
    if (!p->kids) return oom();
    for (int i = 0; i < a->n; i++) {
      p->nkids = i + 1;
      if ((st = load_pre(&p->kids[i], &a->items[i], label, depth + 1))) return st;
    }
    return KG_OK;
  }
  if (!strcmp(t, "ByteLevel")) {
    static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
    p->kind = TJ_P_BYTELEVEL;
    bool trim;
    if ((st = keys_ok(j, what, k, label)) ||
        (st = get_bool(j, "add_prefix_space", true, &p->add_prefix_space, what, label)) ||
        (st = get_bool(j, "trim_offsets", true, &trim, what, label)) ||
        (st = get_bool(j, "use_regex", true, &p->use_regex, what, label)))
      return st;
    if (p->use_regex) return tj_regex_compile(&p->pat.re, tj_gpt2_pattern, strlen(tj_gpt2_pattern), "ByteLevel");
    return KG_OK;
  }
  if (!strcmp(t, "Metaspace")) {
    static const char *const k[] = {"type",    "replacement", "prepend_scheme", "split", "add_prefix_space",
                                    "str_rep", NULL};
    p->kind = TJ_P_METASPACE;
    if ((st = keys_ok(j, what, k, label)) || (st = get_char(j, "replacement", 0x2581, &p->ch, what, label)) ||
        (st = get_prepend(j, &p->prepend, what, label)) || (st = get_bool(j, "split", true, &p->split, what, label)))
      return st;
    p->ch_len = kg_utf8_put(p->ch_utf8, p->ch);
    return KG_OK;
  }
  struct {
    const char *name;
    int kind;
  } simple[] = {
      {"Whitespace", TJ_P_WHITESPACE}, {"WhitespaceSplit", TJ_P_WHITESPACE_SPLIT}, {"BertPreTokenizer", TJ_P_BERT}};
  for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
    if (!strcmp(t, simple[i].name)) {
      p->kind = simple[i].kind;
      return keys_ok(j, what, only_type, label);
    }
  if (!strcmp(t, "Split")) {
    static const char *const k[] = {"type", "pattern", "behavior", "invert", NULL};
    p->kind = TJ_P_SPLIT;
    if ((st = keys_ok(j, what, k, label)) || (st = get_pattern(j, &p->pat, what, label)) ||
        (st = get_behavior(j, -1, &p->behavior, what, label)) ||
        (st = get_bool(j, "invert", false, &p->invert, what, label)))
      return st;
    if (p->behavior < 0) return tj_bad(label, "%s: behavior is missing", what);
    return KG_OK;
  }
  if (!strcmp(t, "Punctuation")) {
    static const char *const k[] = {"type", "behavior", NULL};
    p->kind = TJ_P_PUNCTUATION;
    if ((st = keys_ok(j, what, k, label)) || (st = get_behavior(j, TJ_B_ISOLATED, &p->behavior, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "Digits")) {
    static const char *const k[] = {"type", "individual_digits", NULL};
    p->kind = TJ_P_DIGITS;
    if ((st = keys_ok(j, what, k, label)) ||
        (st = get_bool(j, "individual_digits", false, &p->individual, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "CharDelimiterSplit")) {
    static const char *const k[] = {"type", "delimiter", NULL};
    p->kind = TJ_P_CHAR_DELIMITER;
    if ((st = keys_ok(j, what, k, label)) || (st = get_char(j, "delimiter", ' ', &p->ch, what, label))) return st;
    return KG_OK;
  }
  return tj_bad(label,
                "pre_tokenizer: the type '%.40s' is not supported (Sequence, ByteLevel, Metaspace, Whitespace, "
                "WhitespaceSplit, Split, Punctuation, Digits, BertPreTokenizer, CharDelimiterSplit)",
                t);
}

static kg_status load_dec(tj_dec *d, const kg_json *j, const char *label, int depth) {
  memset(d, 0, sizeof *d);
  if (depth > 16) return tj_bad(label, "decoder: Sequences nested too deep");
  if (!j || j->type != KG_JSON_OBJECT) return tj_bad(label, "decoder must be an object");
  const char *t = type_of(j);
  if (!t) return tj_bad(label, "decoder: no type");
  char what[80];
  snprintf(what, sizeof what, "decoder %.40s", t);
  static const char *const only_type[] = {"type", NULL};
  kg_status st;
  if (!strcmp(t, "Sequence")) {
    static const char *const k[] = {"type", "decoders", NULL};
    if ((st = keys_ok(j, what, k, label))) return st;
    const kg_json *a = kg_json_get(j, "decoders");
    if (!a || a->type != KG_JSON_ARRAY) return tj_bad(label, "%s: decoders must be an array", what);
    d->kind = TJ_D_SEQUENCE;
    d->kids = calloc((size_t)a->n + 1, sizeof *d->kids);
    if (!d->kids) return oom();
    for (int i = 0; i < a->n; i++) {
      d->nkids = i + 1;
      if ((st = load_dec(&d->kids[i], &a->items[i], label, depth + 1))) return st;
    }
    return KG_OK;
  }
  if (!strcmp(t, "ByteLevel")) {
    static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
    d->kind = TJ_D_BYTELEVEL;
    return keys_ok(j, what, k, label);
  }
  if (!strcmp(t, "ByteFallback") || !strcmp(t, "Fuse")) {
    d->kind = !strcmp(t, "Fuse") ? TJ_D_FUSE : TJ_D_BYTEFALLBACK;
    return keys_ok(j, what, only_type, label);
  }
  if (!strcmp(t, "Metaspace")) {
    static const char *const k[] = {"type",    "replacement", "prepend_scheme", "split", "add_prefix_space",
                                    "str_rep", NULL};
    d->kind = TJ_D_METASPACE;
    if ((st = keys_ok(j, what, k, label)) || (st = get_char(j, "replacement", 0x2581, &d->ch, what, label)) ||
        (st = get_prepend(j, &d->prepend, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "WordPiece")) {
    static const char *const k[] = {"type", "prefix", "cleanup", NULL};
    d->kind = TJ_D_WORDPIECE;
    if ((st = keys_ok(j, what, k, label)) ||
        (st = get_str(j, "prefix", "##", &d->prefix, &d->prefix_len, what, label)) ||
        (st = get_bool(j, "cleanup", true, &d->cleanup, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "BPEDecoder")) {
    static const char *const k[] = {"type", "suffix", NULL};
    d->kind = TJ_D_BPE;
    if ((st = keys_ok(j, what, k, label)) ||
        (st = get_str(j, "suffix", "</w>", &d->prefix, &d->prefix_len, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "Strip")) {
    static const char *const k[] = {"type", "content", "start", "stop", NULL};
    d->kind = TJ_D_STRIP;
    if ((st = keys_ok(j, what, k, label)) || (st = get_char(j, "content", ' ', &d->ch, what, label)) ||
        (st = get_uint(j, "start", 0, &d->start, what, label)) || (st = get_uint(j, "stop", 0, &d->stop, what, label)))
      return st;
    return KG_OK;
  }
  if (!strcmp(t, "Replace")) {
    static const char *const k[] = {"type", "pattern", "content", NULL};
    d->kind = TJ_D_REPLACE;
    if ((st = keys_ok(j, what, k, label)) || (st = get_pattern(j, &d->pat, what, label)) ||
        (st = get_str(j, "content", NULL, &d->content, &d->content_len, what, label)))
      return st;
    return KG_OK;
  }
  return tj_bad(label,
                "decoder: the type '%.40s' is not supported (Sequence, ByteLevel, Metaspace, WordPiece, "
                "ByteFallback, Fuse, Strip, Replace, BPEDecoder)",
                t);
}

static void post_free(tj_post *p) {
  if (!p) return;
  for (int k = 0; k < p->nkids; k++)
    post_free(&p->kids[k]);
  free(p->kids);
  free(p->single);
  free(p->pair);
  for (int k = 0; k < p->nspecials; k++) {
    free(p->specials[k].name);
    free(p->specials[k].ids);
  }
  free(p->specials);
}

/* [name, id] of BertProcessing / RobertaProcessing */
static kg_status get_named_id(const kg_json *j, const char *key, int32_t *id, const char *what, const char *label) {
  const kg_json *v = kg_json_get(j, key);
  if (!v || v->type != KG_JSON_ARRAY || v->n != 2 || v->items[0].type != KG_JSON_STRING ||
      v->items[1].type != KG_JSON_NUMBER || !v->items[1].is_uint || v->items[1].uint > INT32_MAX)
    return tj_bad(label, "%s: %s must be [token, id]", what, key);
  *id = (int32_t)v->items[1].uint;
  return KG_OK;
}

static kg_status load_template(tj_post *p, const kg_json *j, const char *label) {
  const char *what = "post_processor TemplateProcessing";
  const kg_json *sp = kg_json_get(j, "special_tokens");
  if (sp && sp->type != KG_JSON_NULL) {
    if (sp->type != KG_JSON_OBJECT) return tj_bad(label, "%s: special_tokens must be an object", what);
    p->specials = calloc((size_t)sp->n + 1, sizeof *p->specials);
    if (!p->specials) return oom();
    for (int i = 0; i < sp->n; i++) {
      const kg_json *e = &sp->items[i], *ids = kg_json_get(e, "ids");
      p->nspecials = i + 1;
      p->specials[i].name = dup(sp->keys[i], sp->key_lens[i]);
      if (!p->specials[i].name) return oom();
      if (e->type != KG_JSON_OBJECT || !ids || ids->type != KG_JSON_ARRAY)
        return tj_bad(label, "%s: special token '%.40s' must have ids", what, sp->keys[i]);
      p->specials[i].ids = malloc(((size_t)ids->n + 1) * sizeof(int32_t));
      if (!p->specials[i].ids) return oom();
      for (int k = 0; k < ids->n; k++) {
        if (ids->items[k].type != KG_JSON_NUMBER || !ids->items[k].is_uint || ids->items[k].uint > INT32_MAX)
          return tj_bad(label, "%s: special token '%.40s': ids must be integers", what, sp->keys[i]);
        p->specials[i].ids[k] = (int32_t)ids->items[k].uint;
      }
      p->specials[i].n = ids->n;
    }
  }
  for (int w = 0; w < 2; w++) {
    const char *key = w ? "pair" : "single";
    const kg_json *a = kg_json_get(j, key);
    if (!a || a->type != KG_JSON_ARRAY) return tj_bad(label, "%s: %s must be an array", what, key);
    titem *items = calloc((size_t)a->n + 1, sizeof *items);
    if (!items) return oom();
    if (w)
      p->pair = items, p->npair = a->n;
    else
      p->single = items, p->nsingle = a->n;
    for (int i = 0; i < a->n; i++) {
      const kg_json *e = &a->items[i];
      if (e->type != KG_JSON_OBJECT || e->n != 1 || e->items[0].type != KG_JSON_OBJECT)
        return tj_bad(label, "%s: %s item %d must be {\"Sequence\": ...} or {\"SpecialToken\": ...}", what, key, i + 1);
      const kg_json *body = &e->items[0], *id = kg_json_get(body, "id"), *ty = kg_json_get(body, "type_id");
      if (!id || id->type != KG_JSON_STRING || !ty || ty->type != KG_JSON_NUMBER || !ty->is_uint ||
          ty->uint > INT32_MAX)
        return tj_bad(label, "%s: %s item %d needs an id and a type_id", what, key, i + 1);
      items[i].type_id = (int32_t)ty->uint;
      if (!strcmp(e->keys[0], "Sequence")) {
        if (strcmp(id->str, "A") && strcmp(id->str, "B")) return tj_bad(label, "%s: sequence id must be A or B", what);
        items[i].seq = id->str[0] == 'A' ? 0 : 1;
      } else if (!strcmp(e->keys[0], "SpecialToken")) {
        items[i].seq = -1;
        items[i].special = -1;
        for (int k = 0; k < p->nspecials; k++)
          if (!strcmp(p->specials[k].name, id->str)) items[i].special = k;
        if (items[i].special < 0) return tj_bad(label, "%s: '%.40s' is not among special_tokens", what, id->str);
      } else {
        return tj_bad(label, "%s: %s item %d: '%.40s' is not Sequence or SpecialToken", what, key, i + 1, e->keys[0]);
      }
    }
  }
  return KG_OK;
}

static kg_status load_post(tj_post *p, const kg_json *j, const char *label, int depth) {
  memset(p, 0, sizeof *p);
  if (depth > 16) return tj_bad(label, "post_processor: Sequences nested too deep");
  if (!j || j->type != KG_JSON_OBJECT) return tj_bad(label, "post_processor must be an object");
  const char *t = type_of(j);
  if (!t) return tj_bad(label, "post_processor: no type");
  char what[80];
  snprintf(what, sizeof what, "post_processor %.40s", t);
  kg_status st;
  if (!strcmp(t, "Sequence")) {
    static const char *const k[] = {"type", "processors", NULL};
    if ((st = keys_ok(j, what, k, label))) return st;
    const kg_json *a = kg_json_get(j, "processors");
    if (!a || a->type != KG_JSON_ARRAY) return tj_bad(label, "%s: processors must be an array", what);
    p->kind = TJ_PP_SEQUENCE;
    p->kids = calloc((size_t)a->n + 1, sizeof *p->kids);
    if (!p->kids) return oom();
    for (int i = 0; i < a->n; i++) {
      p->nkids = i + 1;
      if ((st = load_post(&p->kids[i], &a->items[i], label, depth + 1))) return st;
    }
    return KG_OK;
  }
  if (!strcmp(t, "ByteLevel")) {
    static const char *const k[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
    p->kind = TJ_PP_BYTELEVEL;
    return keys_ok(j, what, k, label);
  }
  if (!strcmp(t, "TemplateProcessing")) {
    static const char *const k[] = {"type", "single", "pair", "special_tokens", NULL};
    p->kind = TJ_PP_TEMPLATE;
    if ((st = keys_ok(j, what, k, label))) return st;
    return load_template(p, j, label);
  }
  if (!strcmp(t, "BertProcessing") || !strcmp(t, "RobertaProcessing")) {
    static const char *const kb[] = {"type", "sep", "cls", NULL};
    static const char *const kr[] = {"type", "sep", "cls", "trim_offsets", "add_prefix_space", NULL};
    p->kind = t[0] == 'B' ? TJ_PP_BERT : TJ_PP_ROBERTA;
    if ((st = keys_ok(j, what, p->kind == TJ_PP_BERT ? kb : kr, label)) ||
        (st = get_named_id(j, "sep", &p->sep, what, label)) || (st = get_named_id(j, "cls", &p->cls, what, label)))
      return st;
    return KG_OK;
  }
  return tj_bad(label,
                "post_processor: the type '%.40s' is not supported (TemplateProcessing, BertProcessing, "
                "RobertaProcessing, ByteLevel, Sequence)",
                t);
}

/* ---- added tokens ----------------------------------------------------------------------------- */

static kg_status load_added(kg_tokenizer_json *t, const kg_json *a, const char *label) {
  if (!a || a->type == KG_JSON_NULL) return KG_OK;
  if (a->type != KG_JSON_ARRAY) return tj_bad(label, "added_tokens must be an array");
  t->added = calloc((size_t)a->n + 1, sizeof *t->added);
  if (!t->added || !kg_vocab_alloc(&t->added_vocab, a->n)) return oom();
  int64_t next = t->model.vocab.n; /* ids of tokens the model lacks, as the reference assigns them */
  for (int i = 0; i < a->n; i++) {
    const kg_json *e = &a->items[i];
    static const char *const k[] = {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special", NULL};
    char what[48];
    snprintf(what, sizeof what, "added_tokens[%d]", i + 1);
    if (e->type != KG_JSON_OBJECT) return tj_bad(label, "%s must be an object", what);
    kg_status st = keys_ok(e, what, k, label);
    if (st) return st;
    const kg_json *c = kg_json_get(e, "content");
    if (!c || c->type != KG_JSON_STRING) return tj_bad(label, "%s: content must be a string", what);
    if (c->len == 0) continue; /* the reference skips empty tokens */
    bool repeat = false;       /* a repeat adds nothing */
    for (int q = 0; q < t->nadded && !repeat; q++)
      repeat = t->added[q].len == c->len && !memcmp(t->added[q].content, c->str, c->len);
    if (repeat) continue;
    added *ad = &t->added[t->nadded];
    bool special;
    if ((st = get_bool(e, "single_word", false, &ad->single_word, what, label)) ||
        (st = get_bool(e, "lstrip", false, &ad->lstrip, what, label)) ||
        (st = get_bool(e, "rstrip", false, &ad->rstrip, what, label)) ||
        (st = get_bool(e, "special", false, &special, what, label)) ||
        (st = get_bool(e, "normalized", !special, &ad->normalized, what, label)))
      return st;
    ad->special = special;
    ad->content = dup(c->str, c->len);
    if (!ad->content) return oom();
    ad->len = c->len;
    int64_t id = kg_vocab_find(&t->model.vocab, c->str, c->len);
    if (id < 0) {
      if (next > INT32_MAX) return tj_bad(label, "too many added tokens");
      id = next++;
    }
    ad->id = (int32_t)id;
    t->added_vocab.tokens[t->nadded] = dup(c->str, c->len);
    if (!t->added_vocab.tokens[t->nadded]) return oom();
    t->added_vocab.lens[t->nadded] = c->len;
    t->nadded++;
    t->added_vocab.n = t->nadded;
  }
  if (!kg_vocab_index(&t->added_vocab)) return oom();
  t->vocab_size = next;
  return KG_OK;
}

/* the normalized forms of the normalized added tokens */
static kg_status normalize_added(kg_tokenizer_json *t) {
  for (int i = 0; i < t->nadded; i++) {
    added *ad = &t->added[i];
    if (!ad->normalized) continue;
    tj_buf b = {0};
    if (t->norm) {
      kg_status st = tj_normalize(t->norm, ad->content, ad->len, &b);
      if (st) {
        tj_buf_free(&b);
        return st;
      }
    } else {
      tj_put(&b, ad->content, ad->len);
    }
    if (b.oom) return oom();
    ad->norm = b.p ? b.p : dup("", 0);
    ad->norm_len = b.n;
    if (!ad->norm) return oom();
  }
  t->added_of_id = malloc(((size_t)t->vocab_size + 1) * sizeof *t->added_of_id);
  if (!t->added_of_id) return oom();
  for (int64_t i = 0; i < t->vocab_size; i++)
    t->added_of_id[i] = -1;
  for (int i = 0; i < t->nadded; i++)
    t->added_of_id[t->added[i].id] = i;
  for (int mode = 0; mode < 2; mode++) { /* the match tables: a hash of the forms, their lengths */
    kg_vocab *v = &t->match[mode];
    if (!kg_vocab_alloc(v, t->nadded) || !(t->match_added[mode] = malloc(((size_t)t->nadded + 1) * sizeof(int))) ||
        !(t->match_lens[mode] = malloc(((size_t)t->nadded + 1) * sizeof(size_t))))
      return oom();
    for (int i = t->nadded - 1; i >= 0; i--) { /* backwards: of equal forms the index keeps the first */
      const added *ad = &t->added[i];
      size_t n = ad->normalized ? ad->norm_len : ad->len;
      const char *c = ad->normalized ? ad->norm : ad->content;
      if (ad->normalized != mode || !n) continue;
      if (!(v->tokens[v->n] = dup(c, n))) return oom();
      v->lens[v->n] = n;
      t->match_added[mode][v->n++] = i;
      t->first_byte[mode][(uint8_t)c[0] >> 3] |= (uint8_t)(1u << ((uint8_t)c[0] & 7));
      int k = 0;
      while (k < t->nmatch_lens[mode] && t->match_lens[mode][k] > n)
        k++;
      if (k == t->nmatch_lens[mode] || t->match_lens[mode][k] != n) {
        memmove(&t->match_lens[mode][k + 1], &t->match_lens[mode][k],
                (size_t)(t->nmatch_lens[mode] - k) * sizeof(size_t));
        t->match_lens[mode][k] = n;
        t->nmatch_lens[mode]++;
      }
    }
    if (!kg_vocab_index(v)) return oom();
  }
  return KG_OK;
}

/* ---- loading ---------------------------------------------------------------------------------- */

void kg_tokenizer_json_free(kg_tokenizer_json *t) {
  if (!t) return;
  tj_model_free(&t->model);
  for (int i = 0; i < t->nadded; i++) {
    free(t->added[i].content);
    free(t->added[i].norm);
  }
  free(t->added);
  free(t->added_of_id);
  kg_vocab_free(&t->added_vocab);
  for (int mode = 0; mode < 2; mode++) {
    kg_vocab_free(&t->match[mode]);
    free(t->match_added[mode]);
    free(t->match_lens[mode]);
  }
  if (t->norm) tj_norm_free(t->norm);
  if (t->pre) tj_pre_free(t->pre);
  if (t->post) post_free(t->post);
  if (t->dec) tj_dec_free(t->dec);
  free(t->norm);
  free(t->pre);
  free(t->post);
  free(t->dec);
  free(t);
}

kg_status kg_tokenizer_json_parse(kg_tokenizer_json **out, const char *json, size_t len, const char *label) {
  *out = NULL;
  char err[200];
  kg_json *root = kg_json_parse(json, len, err, sizeof err);
  if (!root) return kg_error(KG_ERR_IO, TJ_OP, "%s: not JSON: %s", label, err);
  kg_tokenizer_json *t = calloc(1, sizeof *t);
  kg_status st = KG_OK;
  if (!t) {
    kg_json_free(root);
    return oom();
  }
  snprintf(t->label, sizeof t->label, "%s", label);
  static const char *const known[] = {"version",       "truncation", "padding",        "added_tokens", "normalizer",
                                      "pre_tokenizer", "model",      "post_processor", "decoder",      NULL};
  const kg_json *v;
  if (root->type != KG_JSON_OBJECT)
    st = kg_error(KG_ERR_IO, TJ_OP, "%s: not a tokenizer.json (the top level is not an object)", label);
  else if (!kg_json_get(root, "model"))
    st = kg_error(KG_ERR_IO, TJ_OP, "%s: not a tokenizer.json (no model)", label);
  else if ((st = keys_ok(root, "tokenizer.json", known, label))) {
  } else if ((v = kg_json_get(root, "version")) && !(v->type == KG_JSON_STRING && !strcmp(v->str, "1.0")))
    st = tj_bad(label, "version must be \"1.0\"");
  if (!st) st = tj_model_load(&t->model, kg_json_get(root, "model"), label);
  if (!st) t->vocab_size = t->model.vocab.n;
#define COMPONENT(field, key, loader)                                                                                  \
  if (!st && (v = kg_json_get(root, key)) && v->type != KG_JSON_NULL) {                                                \
    t->field = calloc(1, sizeof *t->field);                                                                            \
    st = t->field ? loader(t->field, v, label, 0) : oom();                                                             \
  }
  COMPONENT(norm, "normalizer", load_norm)
  COMPONENT(pre, "pre_tokenizer", load_pre)
  COMPONENT(post, "post_processor", load_post)
  COMPONENT(dec, "decoder", load_dec)
#undef COMPONENT
  if (!st) st = load_added(t, kg_json_get(root, "added_tokens"), label);
  if (!st) st = normalize_added(t);
  kg_json_free(root);
  if (st) {
    kg_tokenizer_json_free(t);
    return st;
  }
  *out = t;
  return KG_OK;
}

kg_status kg_tokenizer_json_load(kg_tokenizer_json **out, const char *path) {
  *out = NULL;
  size_t len;
  kg_status st;
  char *buf = kg_read_file(path, TJ_OP, "tokenizer file", &len, &st);
  if (!buf) return st;
  st = kg_tokenizer_json_parse(out, buf, len, path);
  free(buf);
  return st;
}

/* ---- encoding --------------------------------------------------------------------------------- */

static uint32_t last_cp(const char *s, size_t n) {
  size_t j = n - 1;
  while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80)
    j--;
  return tj_next(s, n, &j);
}

/* one stretch of text with its added-token id, or -1 */
typedef struct {
  size_t a, b;
  int32_t id;
} cut;

/* leftmost-longest matches of the added tokens with normalized == want in s[0..n), with the
 * reference's single_word / lstrip / rstrip handling; [out] the stretches in order */
static kg_status split_added(const kg_tokenizer_json *t, bool want_normalized, const char *s, size_t n, cut **out,
                             size_t *count) {
  size_t cap = 8, k = 0, start = 0;
  cut *v = malloc(cap * sizeof *v);
  if (!v) return oom();
  size_t pos = 0;
  while (pos < n) {
    /* the leftmost position where a token matches, and its longest token */
    int best = -1;
    size_t at = pos, best_len = 0;
    const uint8_t *fb = t->first_byte[want_normalized];
    for (; at < n && best < 0; at++) {
      uint8_t c0 = (uint8_t)s[at];
      if (!(fb[c0 >> 3] >> (c0 & 7) & 1)) continue;
      for (int k = 0; k < t->nmatch_lens[want_normalized]; k++) { /* the longest form that matches here */
        size_t cl = t->match_lens[want_normalized][k];
        int64_t id = cl <= n - at ? kg_vocab_find(&t->match[want_normalized], s + at, cl) : -1;
        if (id >= 0) {
          best = t->match_added[want_normalized][id], best_len = cl;
          break;
        }
      }
      if (best >= 0) break;
    }
    if (best < 0) break;
    const added *ad = &t->added[best];
    size_t ms = at, me = at + best_len;
    pos = me; /* the next search starts after this match, whether it is used or not */
    if (ad->single_word) {
      bool start_ok = ms == 0 || !tj_word_char(last_cp(s, ms));
      size_t q = me;
      bool stop_ok = me == n || !tj_word_char(tj_next(s, n, &q));
      if (!start_ok || !stop_ok) continue;
    }
    if (ad->lstrip) {
      size_t ns = ms;
      while (ns > 0) {
        size_t j = ns - 1;
        while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80)
          j--;
        size_t q = j;
        if (!kg_unicode_is_space(tj_next(s, n, &q))) break;
        ns = j;
      }
      ms = ns > start ? ns : start;
    }
    if (ad->rstrip) /* the search goes on from the match's own end, as the reference's iterator */
      while (me < n) {
        size_t q = me;
        if (!kg_unicode_is_space(tj_next(s, n, &q))) break;
        me = q;
      }

    if (k + 2 > cap) {
      cut *nv = realloc(v, cap * 2 * sizeof *v);
      if (!nv) {
        free(v);
        return oom();
      }
      v = nv;
      cap *= 2;
    }
    if (start < ms) v[k++] = (cut){start, ms, -1};
    v[k++] = (cut){ms, me, ad->id};
    /* a token inside the spaces an rstrip token took (one that starts with spaces) still counts,
     * as in the reference, whose later matches may overlap the stretch it already cut */
    if (me > start) start = me;
  }
  if (k + 1 > cap) {
    cut *nv = realloc(v, (cap + 1) * sizeof *v);
    if (!nv) {
      free(v);
      return oom();
    }
    v = nv;
  }
  if (start < n) v[k++] = (cut){start, n, -1};
  *out = v;
  *count = k;
  return KG_OK;
}

/* normalized text of one stretch -> pre-tokenizer -> model */
static kg_status encode_normalized(const kg_tokenizer_json *t, const char *s, size_t n, bool first, kg_ids *ids) {
  cut *cs = NULL;
  size_t nc = 0;
  kg_status st = split_added(t, true, s, n, &cs, &nc);
  if (st) return st;
  for (size_t i = 0; i < nc && !st; i++) {
    if (cs[i].id >= 0) {
      if (!kg_ids_push(ids, cs[i].id)) st = oom();
      continue;
    }
    tj_pieces l = {0};
    tj_pieces_add(&l, s + cs[i].a, cs[i].b - cs[i].a, first && cs[i].a == 0);
    if (l.oom) st = oom();
    if (!st && t->pre) st = tj_pre_tokenize(t->pre, &l);
    for (size_t k = 0; k < l.n && !st; k++)
      if (l.v[k].n) st = tj_model_tokenize(&t->model, l.v[k].s, l.v[k].n, ids);
    tj_pieces_free(&l);
  }
  free(cs);
  return st;
}

kg_status kg_tokenizer_json_encode(const kg_tokenizer_json *t, const char *text, size_t len, int32_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  if (!kg_utf8_valid(text, len)) {
    size_t i = 0;
    while (i < len && kg_utf8_next((const uint8_t *)text, len, &i) >= 0) {
    }
    return kg_error(KG_ERR_VALUE, TJ_OP, "encode: the text is not UTF-8 (byte %zu)", i + 1);
  }
  cut *cs = NULL;
  size_t nc = 0;
  kg_status st = split_added(t, false, text, len, &cs, &nc);
  if (st) return st;
  kg_ids ids = {0};
  for (size_t i = 0; i < nc && !st; i++) {
    if (cs[i].id >= 0) {
      if (!kg_ids_push(&ids, cs[i].id)) st = oom();
      continue;
    }
    tj_buf b = {0};
    if (t->norm)
      st = tj_normalize(t->norm, text + cs[i].a, cs[i].b - cs[i].a, &b);
    else
      tj_put(&b, text + cs[i].a, cs[i].b - cs[i].a);
    if (!st && b.oom) st = oom();
    if (!st && b.n) st = encode_normalized(t, b.p, b.n, cs[i].a == 0, &ids);
    tj_buf_free(&b);
  }
  free(cs);
  if (st) {
    free(ids.v);
    return st;
  }
  *out = ids.v;
  *n = ids.n;
  if (!ids.n) {
    free(ids.v);
    *out = NULL;
  }
  return KG_OK;
}

/* ---- post-processing -------------------------------------------------------------------------- */

typedef struct {
  kg_ids ids, types;
} seqbuf;

static bool push2(seqbuf *s, int32_t id, int32_t type) {
  return kg_ids_push(&s->ids, id) && kg_ids_push(&s->types, type);
}

static bool push_seq(seqbuf *o, const seqbuf *in, int32_t type, bool keep_types) {
  for (size_t i = 0; i < in->ids.n; i++)
    if (!push2(o, in->ids.v[i], keep_types ? in->types.v[i] : type)) return false;
  return true;
}

/* one processor over nseq sequences (1 or 2) in seqs, merging them into seqs[0] */
static bool post_one(const tj_post *p, seqbuf *seqs, int *nseq, bool add) {
  if (p->kind == TJ_PP_SEQUENCE) {
    for (int k = 0; k < p->nkids; k++)
      if (!post_one(&p->kids[k], seqs, nseq, add)) return false;
    return true;
  }
  if (p->kind == TJ_PP_BYTELEVEL) return true;
  seqbuf o = {{0}, {0}};
  bool ok = true, pair = *nseq == 2;
  if (p->kind == TJ_PP_TEMPLATE) {
    const titem *it = pair ? p->pair : p->single;
    int n = pair ? p->npair : p->nsingle;
    for (int i = 0; i < n && ok; i++) {
      if (it[i].seq >= 0) {
        if (it[i].seq < *nseq) ok = push_seq(&o, &seqs[it[i].seq], it[i].type_id, false);
      } else if (add) {
        const tspecial *sp = &p->specials[it[i].special];
        for (int k = 0; k < sp->n && ok; k++)
          ok = push2(&o, sp->ids[k], it[i].type_id);
      }
    }
  } else { /* Bert: [CLS] A [SEP] (B [SEP]); Roberta: <s> A </s> (</s> B </s>) */
    bool bert = p->kind == TJ_PP_BERT;
    if (add) ok = push2(&o, p->cls, 0);
    ok = ok && push_seq(&o, &seqs[0], 0, false);
    if (add) ok = ok && push2(&o, p->sep, 0);
    if (pair) {
      int32_t ty = bert ? 1 : 0;
      if (add && !bert) ok = ok && push2(&o, p->sep, ty);
      ok = ok && push_seq(&o, &seqs[1], ty, false);
      if (add) ok = ok && push2(&o, p->sep, ty);
    }
  }
  for (int i = 0; i < *nseq; i++) {
    free(seqs[i].ids.v);
    free(seqs[i].types.v);
  }
  seqs[0] = o;
  memset(&seqs[1], 0, sizeof seqs[1]);
  *nseq = 1;
  return ok;
}

kg_status kg_tokenizer_json_post_process(const kg_tokenizer_json *t, const int32_t *a, size_t na, const int32_t *b,
                                         size_t nb, bool pair, bool add_special, int32_t **ids, int32_t **type_ids,
                                         size_t *n) {
  seqbuf seqs[2];
  memset(seqs, 0, sizeof seqs);
  int nseq = pair ? 2 : 1;
  bool ok = true;
  for (size_t i = 0; i < na && ok; i++)
    ok = push2(&seqs[0], a[i], 0);
  for (size_t i = 0; pair && i < nb && ok; i++)
    ok = push2(&seqs[1], b[i], 1);
  if (ok && t->post) ok = post_one(t->post, seqs, &nseq, add_special);
  if (ok && nseq == 2) { /* no post-processor: the pair joined */
    ok = push_seq(&seqs[0], &seqs[1], 1, true);
    free(seqs[1].ids.v);
    free(seqs[1].types.v);
    nseq = 1;
  }
  if (!ok) {
    for (int i = 0; i < 2; i++) {
      free(seqs[i].ids.v);
      free(seqs[i].types.v);
    }
    return oom();
  }
  *ids = seqs[0].ids.v;
  *type_ids = seqs[0].types.v;
  *n = seqs[0].ids.n;
  return KG_OK;
}

size_t kg_tokenizer_json_num_special(const kg_tokenizer_json *t, bool pair) {
  int32_t *ids = NULL, *types = NULL;
  size_t n = 0;
  if (kg_tokenizer_json_post_process(t, NULL, 0, NULL, 0, pair, true, &ids, &types, &n)) n = 0;
  free(ids);
  free(types);
  return n;
}

/* ---- decoding and lookups ---------------------------------------------------------------------- */

static const added *added_by_id(const kg_tokenizer_json *t, int64_t id) {
  if (id < 0 || id >= t->vocab_size || t->added_of_id[id] < 0) return NULL;
  return &t->added[t->added_of_id[id]];
}

/* the reference gives a normalized added token's normalized content back */
static const char *added_text(const added *ad, size_t *n) {
  *n = ad->normalized ? ad->norm_len : ad->len;
  return ad->normalized ? ad->norm : ad->content;
}

const char *kg_tokenizer_json_id_to_token(const kg_tokenizer_json *t, int64_t id, size_t *n) {
  const added *ad = added_by_id(t, id);
  size_t len;
  if (ad) {
    const char *s = added_text(ad, &len);
    if (n) *n = len;
    return s;
  }
  if (id < 0 || id >= t->model.vocab.n) return NULL;
  if (n) *n = t->model.vocab.lens[id];
  return t->model.vocab.tokens[id];
}

int64_t kg_tokenizer_json_token_to_id(const kg_tokenizer_json *t, const char *s, size_t n) {
  int64_t i = t->nadded ? kg_vocab_find(&t->added_vocab, s, n) : -1;
  if (i >= 0) return t->added[i].id;
  return kg_vocab_find(&t->model.vocab, s, n);
}

bool kg_tokenizer_json_is_special(const kg_tokenizer_json *t, int64_t id) {
  const added *ad = added_by_id(t, id);
  return ad && ad->special;
}

int64_t kg_tokenizer_json_vocab_size(const kg_tokenizer_json *t) { return t->vocab_size; }

const char *kg_tokenizer_json_model_type(const kg_tokenizer_json *t) {
  static const char *names[] = {"BPE", "WordPiece", "Unigram", "WordLevel"};
  return names[t->model.kind];
}

kg_status kg_tokenizer_json_decode(const kg_tokenizer_json *t, const int32_t *ids, size_t n, bool skip_special,
                                   char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  tj_pieces l = {0};
  for (size_t i = 0; i < n; i++) {
    const added *ad = added_by_id(t, ids[i]);
    size_t tl;
    const char *tok = kg_tokenizer_json_id_to_token(t, ids[i], &tl);
    if (!tok) {
      tj_pieces_free(&l);
      return kg_error(KG_ERR_VALUE, TJ_OP, "decode: id %d (element %zu) is outside [0, %lld)", ids[i], i + 1,
                      (long long)t->vocab_size);
    }
    if (skip_special && ad && ad->special) continue;
    tj_pieces_add(&l, tok, tl, false);
  }
  if (l.oom) {
    tj_pieces_free(&l);
    return oom();
  }
  kg_status st = t->dec ? tj_decode_chain(t->dec, &l) : KG_OK;
  tj_buf b = {0};
  for (size_t i = 0; i < l.n && !st; i++) {
    if (i && !t->dec) tj_put(&b, " ", 1);
    tj_put(&b, l.v[i].s, l.v[i].n);
  }
  tj_pieces_free(&l);
  if (!st && b.oom) st = oom();
  if (st) {
    tj_buf_free(&b);
    return st;
  }
  *text = b.p ? b.p : dup("", 0);
  *len = b.n;
  return *text ? KG_OK : oom();
}
