/* tokenizer_json_model.c — the models of a tokenizer.json, as the reference `tokenizers`
 * (models/bpe, models/wordpiece, models/unigram) runs them on one pre-tokenized piece:
 *   BPE: characters (with continuing_subword_prefix on all but the first and end_of_word_suffix
 *     on the last) looked up in the vocabulary; a missing one becomes its <0xNN> byte pieces
 *     (byte_fallback) or the unk token (runs fused with fuse_unk) or nothing; then the adjacent
 *     pair of lowest merge rank merges (leftmost on ties, a queue entry is stale when the pair
 *     at its position no longer merges into the same id) until none is left. ignore_merges: a
 *     piece that is a vocabulary token is that token.
 *   WordPiece: greedy longest match first, "##" before non-initial sub-words; a word longer than
 *     max_input_chars_per_word characters, or with an unmatched rest, is the unk token.
 *   Unigram: the Viterbi best segmentation by piece log-probabilities (sentencepiece's optimized
 *     encoder), a character no piece covers scored min_score - 10 as unk; unk runs fused; a
 *     segment that is no piece becomes its byte pieces (byte_fallback) or unk.
 *   WordLevel: the piece's id, else the unk token's.
 * dropout must be null (or 0): encoding is deterministic. */
#include "tokenizer_json_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the merge table ------------------------------------------------------------------------ */

static uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}

static void merge_put(tj_model *m, int32_t a, int32_t b, int32_t rank, int32_t out) {
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  for (size_t i = mix(key) & (m->mslots - 1);; i = (i + 1) & (m->mslots - 1)) {
    if (m->mkeys[i] == UINT64_MAX || m->mkeys[i] == key) { /* a later duplicate wins, as a HashMap collect */
      m->mkeys[i] = key;
      m->mrank[i] = rank;
      m->mout[i] = out;
      return;
    }
  }
}

static int32_t merge_get(const tj_model *m, int32_t a, int32_t b, int32_t *out) {
  if (!m->mslots) return -1;
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  for (size_t i = mix(key) & (m->mslots - 1);; i = (i + 1) & (m->mslots - 1)) {
    if (m->mkeys[i] == UINT64_MAX) return -1;
    if (m->mkeys[i] == key) {
      *out = m->mout[i];
      return m->mrank[i];
    }
  }
}

static kg_status oom(void) { return kg_error(KG_ERR_OOM, TJ_OP, "out of memory"); }

/* ---- the Unigram prefix table ------------------------------------------------------------------ */

/* A prefix of a piece, keyed by the FNV-1a hash of its bytes and its length: id is the piece it
 * completes (the last one, as the reference's token map), or -1. Scanning the text byte by byte
 * with a running hash then finds every piece that starts at a position, stopping as soon as no
 * piece continues the prefix (the reference walks a trie). */
struct tj_prefix {
  uint64_t h;
  uint32_t len; /* 0: empty slot */
  int32_t id;
};

#define FNV0 1469598103934665603ull
#define FNV(h, b) (((h) ^ (uint8_t)(b)) * 1099511628211ull)

static struct tj_prefix *pfx_slot(struct tj_prefix *t, size_t slots, uint64_t h, uint32_t len) {
  for (size_t i = mix(h ^ len) & (slots - 1);; i = (i + 1) & (slots - 1))
    if (t[i].len == 0 || (t[i].h == h && t[i].len == len)) return &t[i];
}

static kg_status build_prefixes(tj_model *m) {
  size_t total = 0;
  for (int64_t i = 0; i < m->vocab.n; i++)
    total += m->vocab.lens[i];
  m->pfx_slots = 16;
  while (m->pfx_slots < total * 2)
    m->pfx_slots *= 2;
  m->pfx = calloc(m->pfx_slots, sizeof *m->pfx);
  if (!m->pfx) return oom();
  for (int64_t id = 0; id < m->vocab.n; id++) {
    const char *s = m->vocab.tokens[id];
    size_t n = m->vocab.lens[id];
    uint64_t h = FNV0;
    for (size_t i = 0; i < n; i++) {
      h = FNV(h, s[i]);
      if (i + 1 < n && ((uint8_t)s[i + 1] & 0xC0) == 0x80) continue; /* not a character boundary */
      struct tj_prefix *e = pfx_slot(m->pfx, m->pfx_slots, h, (uint32_t)(i + 1));
      if (e->len == 0) *e = (struct tj_prefix){h, (uint32_t)(i + 1), -1};
      if (i + 1 == n) e->id = (int32_t)id;
    }
  }
  return KG_OK;
}

/* ---- loading ------------------------------------------------------------------------------- */

static char *dup(const char *s, size_t n) {
  char *c = malloc(n + 1);
  if (c) {
    memcpy(c, s, n);
    c[n] = 0;
  }
  return c;
}

/* a string or null member: *s NULL when null or absent */
static kg_status opt_str(const kg_json *j, const char *key, char **s, size_t *n, const char *label) {
  const kg_json *v = kg_json_get(j, key);
  *s = NULL;
  *n = 0;
  if (!v || v->type == KG_JSON_NULL) return KG_OK;
  if (v->type != KG_JSON_STRING) return tj_bad(label, "model.%s must be a string or null", key);
  *s = dup(v->str, v->len);
  if (!*s) return oom();
  *n = v->len;
  return KG_OK;
}

static kg_status opt_bool(const kg_json *j, const char *key, bool def, bool *out, const char *label) {
  const kg_json *v = kg_json_get(j, key);
  *out = def;
  if (!v || v->type == KG_JSON_NULL) return KG_OK;
  if (v->type != KG_JSON_BOOL) return tj_bad(label, "model.%s must be a boolean", key);
  *out = v->boolean;
  return KG_OK;
}

static kg_status check_keys(const kg_json *j, const char *const *known, const char *what, const char *label) {
  for (int i = 0; i < j->n; i++) {
    bool ok = false;
    for (int k = 0; known[k] && !ok; k++)
      ok = !strcmp(j->keys[i], known[k]);
    if (!ok) {
      char list[256] = "";
      for (int k = 0; known[k]; k++) {
        strncat(list, known[k], sizeof list - strlen(list) - 1);
        if (known[k + 1]) strncat(list, ", ", sizeof list - strlen(list) - 1);
      }
      return tj_bad(label, "%s: the key '%.60s' is not supported (known: %s)", what, j->keys[i], list);
    }
  }
  return KG_OK;
}

/* the token -> id object of BPE / WordPiece: ids must be 0..n-1, each once */
static kg_status load_vocab_object(tj_model *m, const kg_json *v, const char *label) {
  if (!v || v->type != KG_JSON_OBJECT) return tj_bad(label, "model.vocab must be an object of token: id");
  int64_t n = v->n;
  if (!kg_vocab_alloc(&m->vocab, n)) return oom();
  m->vocab.n = n; /* all NULL until filled: freed whatever the exit */
  for (int i = 0; i < v->n; i++) {
    const kg_json *id = &v->items[i];
    if (id->type != KG_JSON_NUMBER || !id->is_uint || id->uint >= (uint64_t)n)
      return tj_bad(label, "model.vocab: the id of '%.60s' must be an integer in [0, %lld)", v->keys[i], (long long)n);
    if (m->vocab.tokens[id->uint])
      return tj_bad(label, "model.vocab: id %llu is given twice ('%.60s')", (unsigned long long)id->uint, v->keys[i]);
    m->vocab.tokens[id->uint] = dup(v->keys[i], v->key_lens[i]);
    if (!m->vocab.tokens[id->uint]) return oom();
    m->vocab.lens[id->uint] = v->key_lens[i];
  }
  if (!kg_vocab_index(&m->vocab)) return oom();
  return KG_OK;
}

static void byte_ids(tj_model *m) {
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    m->byte_ids[b] = (int32_t)kg_vocab_find(&m->vocab, name, 6);
  }
}

static kg_status load_bpe(tj_model *m, const kg_json *j, const char *label) {
  static const char *const known[] = {"type",
                                      "dropout",
                                      "unk_token",
                                      "continuing_subword_prefix",
                                      "end_of_word_suffix",
                                      "fuse_unk",
                                      "byte_fallback",
                                      "ignore_merges",
                                      "vocab",
                                      "merges",
                                      NULL};
  kg_status st = check_keys(j, known, "model BPE", label);
  if (st) return st;
  const kg_json *d = kg_json_get(j, "dropout");
  if (d && d->type != KG_JSON_NULL && !(d->type == KG_JSON_NUMBER && d->number == 0))
    return tj_bad(
        label, "model BPE: dropout must be null (BPE dropout samples segmentations; keng encodes deterministically)");
  if ((st = opt_str(j, "unk_token", &m->unk, &m->unk_len, label)) ||
      (st = opt_str(j, "continuing_subword_prefix", &m->prefix, &m->prefix_len, label)) ||
      (st = opt_str(j, "end_of_word_suffix", &m->suffix, &m->suffix_len, label)) ||
      (st = opt_bool(j, "fuse_unk", false, &m->fuse_unk, label)) ||
      (st = opt_bool(j, "byte_fallback", false, &m->byte_fallback, label)) ||
      (st = opt_bool(j, "ignore_merges", false, &m->ignore_merges, label)) ||
      (st = load_vocab_object(m, kg_json_get(j, "vocab"), label)))
    return st;
  byte_ids(m);
  const kg_json *mg = kg_json_get(j, "merges");
  if (!mg || mg->type != KG_JSON_ARRAY) return tj_bad(label, "model BPE: merges must be an array");
  m->mslots = 16;
  while (m->mslots < (size_t)mg->n * 2)
    m->mslots *= 2;
  m->mkeys = malloc(m->mslots * sizeof *m->mkeys);
  m->mrank = malloc(m->mslots * sizeof *m->mrank);
  m->mout = malloc(m->mslots * sizeof *m->mout);
  if (!m->mkeys || !m->mrank || !m->mout) return oom();
  for (size_t i = 0; i < m->mslots; i++)
    m->mkeys[i] = UINT64_MAX;
  tj_buf cat = {0};
  for (int r = 0; r < mg->n; r++) {
    const kg_json *e = &mg->items[r];
    const char *a, *b;
    size_t al, bl;
    if (e->type == KG_JSON_STRING) { /* "a b" */
      const char *sp = memchr(e->str, ' ', e->len);
      if (!sp || memchr(sp + 1, ' ', e->len - (size_t)(sp + 1 - e->str))) {
        tj_buf_free(&cat);
        return tj_bad(label, "model BPE: merge %d ('%.60s') is not two tokens separated by one space", r + 1, e->str);
      }
      a = e->str, al = (size_t)(sp - e->str), b = sp + 1, bl = e->len - al - 1;
    } else if (e->type == KG_JSON_ARRAY && e->n == 2 && e->items[0].type == KG_JSON_STRING &&
               e->items[1].type == KG_JSON_STRING) {
      a = e->items[0].str, al = e->items[0].len, b = e->items[1].str, bl = e->items[1].len;
    } else {
      tj_buf_free(&cat);
      return tj_bad(label, "model BPE: merge %d must be \"a b\" or [a, b]", r + 1);
    }
    int64_t ia = kg_vocab_find(&m->vocab, a, al), ib = kg_vocab_find(&m->vocab, b, bl);
    if (ia < 0 || ib < 0) {
      tj_buf_free(&cat);
      return tj_bad(label, "model BPE: merge %d: '%.*s' is not in the vocabulary", r + 1, (int)(ia < 0 ? al : bl) % 100,
                    ia < 0 ? a : b);
    }
    if (bl < m->prefix_len) {
      tj_buf_free(&cat);
      return tj_bad(label, "model BPE: merge %d: '%.*s' is shorter than continuing_subword_prefix", r + 1,
                    (int)bl % 100, b);
    }
    cat.n = 0;
    tj_put(&cat, a, al);
    tj_put(&cat, b + m->prefix_len, bl - m->prefix_len);
    if (cat.oom) {
      tj_buf_free(&cat);
      return oom();
    }
    int64_t io = kg_vocab_find(&m->vocab, cat.p ? cat.p : "", cat.n);
    if (io < 0) {
      kg_status e2 = tj_bad(label, "model BPE: merge %d: the merged token '%.*s' is not in the vocabulary", r + 1,
                            (int)(cat.n % 100), cat.p ? cat.p : "");
      tj_buf_free(&cat);
      return e2;
    }
    merge_put(m, (int32_t)ia, (int32_t)ib, r, (int32_t)io);
  }
  tj_buf_free(&cat);
  return KG_OK;
}

static kg_status load_wordpiece(tj_model *m, const kg_json *j, const char *label) {
  static const char *const known[] = {"type",  "unk_token", "continuing_subword_prefix", "max_input_chars_per_word",
                                      "vocab", NULL};
  kg_status st = check_keys(j, known, "model WordPiece", label);
  if (st) return st;
  if ((st = opt_str(j, "unk_token", &m->unk, &m->unk_len, label)) ||
      (st = opt_str(j, "continuing_subword_prefix", &m->prefix, &m->prefix_len, label)) ||
      (st = load_vocab_object(m, kg_json_get(j, "vocab"), label)))
    return st;
  if (!m->unk) {
    m->unk = dup("[UNK]", 5);
    m->unk_len = 5;
  }
  if (!m->prefix) {
    m->prefix = dup("##", 2);
    m->prefix_len = 2;
  }
  if (!m->unk || !m->prefix) return oom();
  for (int64_t i = 0; i < m->vocab.n; i++)
    if (m->vocab.lens[i] > m->max_token_len) m->max_token_len = m->vocab.lens[i];
  const kg_json *mx = kg_json_get(j, "max_input_chars_per_word");
  m->max_chars = 100;
  if (mx && mx->type != KG_JSON_NULL) {
    if (mx->type != KG_JSON_NUMBER || !mx->is_uint)
      return tj_bad(label, "model WordPiece: max_input_chars_per_word must be a non-negative integer");
    m->max_chars = mx->uint > SIZE_MAX / 2 ? SIZE_MAX / 2 : (size_t)mx->uint;
  }
  return KG_OK;
}

static kg_status load_wordlevel(tj_model *m, const kg_json *j, const char *label) {
  static const char *const known[] = {"type", "vocab", "unk_token", NULL};
  kg_status st = check_keys(j, known, "model WordLevel", label);
  if (st || (st = opt_str(j, "unk_token", &m->unk, &m->unk_len, label)) ||
      (st = load_vocab_object(m, kg_json_get(j, "vocab"), label)))
    return st;
  if (!m->unk) {
    if (!(m->unk = dup("<unk>", 5))) return oom();
    m->unk_len = 5;
  }
  return KG_OK;
}

static kg_status load_unigram(tj_model *m, const kg_json *j, const char *label) {
  static const char *const known[] = {"type", "unk_id", "vocab", "byte_fallback", NULL};
  kg_status st = check_keys(j, known, "model Unigram", label);
  if (st) return st;
  if ((st = opt_bool(j, "byte_fallback", false, &m->byte_fallback, label))) return st;
  const kg_json *v = kg_json_get(j, "vocab");
  if (!v || v->type != KG_JSON_ARRAY) return tj_bad(label, "model Unigram: vocab must be an array of [piece, score]");
  if (v->n == 0) return tj_bad(label, "model Unigram: the vocabulary is empty");
  if (!kg_vocab_alloc(&m->vocab, v->n)) return oom();
  m->scores = malloc((size_t)v->n * sizeof *m->scores);
  if (!m->scores) return oom();
  m->min_score = INFINITY;
  for (int i = 0; i < v->n; i++) {
    const kg_json *e = &v->items[i];
    if (e->type != KG_JSON_ARRAY || e->n != 2 || e->items[0].type != KG_JSON_STRING ||
        e->items[1].type != KG_JSON_NUMBER || !isfinite(e->items[1].number))
      return tj_bad(label, "model Unigram: vocab entry %d must be [piece, finite score]", i + 1);
    m->vocab.tokens[i] = dup(e->items[0].str, e->items[0].len);
    if (!m->vocab.tokens[i]) return oom();
    m->vocab.lens[i] = e->items[0].len;
    m->vocab.n = i + 1;
    m->scores[i] = e->items[1].number;
    if (m->scores[i] < m->min_score) m->min_score = m->scores[i];
    if (e->items[0].len > UINT32_MAX / 2) return tj_bad(label, "model Unigram: piece %d is too long", i + 1);
  }
  if (!kg_vocab_index(&m->vocab)) return oom();
  if ((st = build_prefixes(m))) return st;
  const kg_json *u = kg_json_get(j, "unk_id");
  m->unk_id = -1;
  if (u && u->type != KG_JSON_NULL) {
    if (u->type != KG_JSON_NUMBER || !u->is_uint || u->uint >= (uint64_t)v->n)
      return tj_bad(label, "model Unigram: unk_id must be an id in [0, %d)", v->n);
    m->unk_id = (int64_t)u->uint;
  }
  byte_ids(m);
  return KG_OK;
}

kg_status tj_model_load(tj_model *m, const kg_json *j, const char *label) {
  memset(m, 0, sizeof *m);
  m->unk_id = -1;
  if (!j || j->type != KG_JSON_OBJECT) return tj_bad(label, "model must be an object");
  const kg_json *t = kg_json_get(j, "type");
  const char *type = t && t->type == KG_JSON_STRING ? t->str : NULL;
  if (!type) { /* older files: the type is implied by the keys */
    if (kg_json_get(j, "merges"))
      type = "BPE";
    else if (kg_json_get(j, "unk_id") || (kg_json_get(j, "vocab") && kg_json_get(j, "vocab")->type == KG_JSON_ARRAY))
      type = "Unigram";
    else if (kg_json_get(j, "max_input_chars_per_word"))
      type = "WordPiece";
    else
      return tj_bad(label, "model: no type");
  }
  if (!strcmp(type, "BPE")) return m->kind = TJ_M_BPE, load_bpe(m, j, label);
  if (!strcmp(type, "WordPiece")) return m->kind = TJ_M_WORDPIECE, load_wordpiece(m, j, label);
  if (!strcmp(type, "Unigram")) return m->kind = TJ_M_UNIGRAM, load_unigram(m, j, label);
  if (!strcmp(type, "WordLevel")) return m->kind = TJ_M_WORDLEVEL, load_wordlevel(m, j, label);
  return tj_bad(label, "model: the type '%.40s' is not supported (BPE, WordPiece, Unigram, WordLevel)", type);
}

void tj_model_free(tj_model *m) {
  kg_vocab_free(&m->vocab);
  free(m->mkeys);
  free(m->mrank);
  free(m->mout);
  free(m->unk);
  free(m->prefix);
  free(m->suffix);
  free(m->scores);
  free(m->pfx);
  memset(m, 0, sizeof *m);
}

/* ---- BPE ------------------------------------------------------------------------------------- */

typedef struct {
  int32_t id;
  int prev, next; /* -1 none */
  bool gone;
} sym;

typedef struct {
  int32_t rank, new_id;
  int pos;
} qent;

static bool q_less(const qent *a, const qent *b) { return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos; }

typedef struct {
  qent *v;
  size_t n, cap;
} heap;

static bool heap_push(heap *h, qent e) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 32;
    qent *v = realloc(h->v, cap * sizeof *v);
    if (!v) return false;
    h->v = v;
    h->cap = cap;
  }
  size_t i = h->n++;
  while (i > 0 && q_less(&e, &h->v[(i - 1) / 2])) {
    h->v[i] = h->v[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->v[i] = e;
  return true;
}

static qent heap_pop(heap *h) {
  qent top = h->v[0], last = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && q_less(&h->v[c + 1], &h->v[c])) c++;
    if (!q_less(&h->v[c], &last)) break;
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n) h->v[i] = last;
  return top;
}

typedef struct {
  sym *v;
  int n, cap;
} word;

static bool word_add(word *w, int32_t id) {
  if (w->n == w->cap) {
    int cap = w->cap ? w->cap * 2 : 16;
    sym *v = realloc(w->v, (size_t)cap * sizeof *v);
    if (!v) return false;
    w->v = v;
    w->cap = cap;
  }
  w->v[w->n] = (sym){id, w->n - 1, -1, false};
  if (w->n) w->v[w->n - 1].next = w->n;
  w->n++;
  return true;
}

static kg_status bpe(const tj_model *m, const char *s, size_t n, kg_ids *out) {
  if (n == 0) return KG_OK;
  if (m->ignore_merges) {
    int64_t id = kg_vocab_find(&m->vocab, s, n);
    if (id >= 0) return kg_ids_push(out, (int32_t)id) ? KG_OK : oom();
  }
  word w = {0};
  tj_buf t = {0};
  int64_t unk = -1;
  bool have_unk = false, ok = true;
  kg_status st = KG_OK;
  for (size_t i = 0; i < n && ok;) {
    size_t j = i;
    tj_next(s, n, &j);
    t.n = 0;
    if (i > 0) tj_put(&t, m->prefix, m->prefix_len);
    tj_put(&t, s + i, j - i);
    if (j == n) tj_put(&t, m->suffix, m->suffix_len);
    if (t.oom) {
      ok = false;
      break;
    }
    int64_t id = kg_vocab_find(&m->vocab, t.p, t.n);
    if (id >= 0) {
      if (have_unk) ok = word_add(&w, (int32_t)unk), have_unk = false;
      if (ok) ok = word_add(&w, (int32_t)id);
    } else {
      bool done = false;
      if (m->byte_fallback) {
        bool all = true;
        for (size_t q = 0; q < t.n && all; q++)
          all = m->byte_ids[(uint8_t)t.p[q]] >= 0;
        if (all) {
          /* the reference adds these without flushing a pending unk */
          for (size_t q = 0; q < t.n && ok; q++)
            ok = word_add(&w, m->byte_ids[(uint8_t)t.p[q]]);
          done = true;
        }
      }
      if (!done && m->unk) {
        int64_t uid = kg_vocab_find(&m->vocab, m->unk, m->unk_len);
        if (uid < 0) {
          st = kg_error(KG_ERR_VALUE, TJ_OP, "BPE: the unk token '%.60s' is not in the vocabulary", m->unk);
          ok = false;
        } else if (have_unk && m->fuse_unk) {
        } else {
          if (have_unk) ok = word_add(&w, (int32_t)unk);
          unk = uid;
          have_unk = true;
        }
      }
    }
    i = j;
  }
  if (ok && have_unk) ok = word_add(&w, (int32_t)unk);
  tj_buf_free(&t);
  /* merge */
  heap h = {0};
  for (int i = 0; ok && i + 1 < w.n; i++) {
    int32_t nid, r = merge_get(m, w.v[i].id, w.v[i + 1].id, &nid);
    if (r >= 0) ok = heap_push(&h, (qent){r, nid, i});
  }
  while (ok && h.n) {
    qent top = heap_pop(&h);
    sym *a = &w.v[top.pos];
    if (a->gone || a->next < 0) continue;
    sym *b = &w.v[a->next];
    int32_t nid;
    if (merge_get(m, a->id, b->id, &nid) < 0 || nid != top.new_id) continue; /* stale */
    a->id = top.new_id;
    b->gone = true;
    int bn = b->next;
    a->next = bn;
    if (bn >= 0) w.v[bn].prev = top.pos;
    if (a->prev >= 0) {
      int32_t r = merge_get(m, w.v[a->prev].id, a->id, &nid);
      if (r >= 0) ok = heap_push(&h, (qent){r, nid, a->prev});
    }
    if (ok && bn >= 0) {
      int32_t r = merge_get(m, a->id, w.v[bn].id, &nid);
      if (r >= 0) ok = heap_push(&h, (qent){r, nid, top.pos});
    }
  }
  free(h.v);
  for (int i = 0; ok && i < w.n; i++)
    if (!w.v[i].gone) ok = kg_ids_push(out, w.v[i].id);
  free(w.v);
  if (st) return st;
  return ok ? KG_OK : oom();
}

/* ---- WordPiece -------------------------------------------------------------------------------- */

static kg_status wordpiece(const tj_model *m, const char *s, size_t n, kg_ids *out) {
  size_t chars = 0;
  for (size_t i = 0; i < n; chars++)
    tj_next(s, n, &i);
  int64_t unk = kg_vocab_find(&m->vocab, m->unk, m->unk_len);
  size_t first = out->n;
  bool bad = chars > m->max_chars;
  tj_buf t = {0};
  for (size_t start = 0; start < n && !bad;) {
    size_t end = n, room = m->max_token_len - (start > 0 ? m->prefix_len : 0);
    if (m->max_token_len < (start > 0 ? m->prefix_len : 0)) room = 0;
    if (end - start > room) { /* longer than any token: start at a character boundary within reach */
      end = start + room;
      while (end > start && ((uint8_t)s[end] & 0xC0) == 0x80)
        end--;
    }
    int64_t found = -1;
    while (start < end) {
      t.n = 0;
      if (start > 0) tj_put(&t, m->prefix, m->prefix_len);
      tj_put(&t, s + start, end - start);
      if (t.oom) break;
      found = kg_vocab_find(&m->vocab, t.p, t.n);
      if (found >= 0) break;
      do
        end--;
      while (end > start && ((uint8_t)s[end] & 0xC0) == 0x80);
    }
    if (t.oom) {
      tj_buf_free(&t);
      return oom();
    }
    if (found < 0) {
      bad = true;
      break;
    }
    if (!kg_ids_push(out, (int32_t)found)) {
      tj_buf_free(&t);
      return oom();
    }
    start = end;
  }
  tj_buf_free(&t);
  if (bad) {
    out->n = first;
    if (unk < 0)
      return kg_error(KG_ERR_VALUE, TJ_OP, "WordPiece: the unk token '%.60s' is not in the vocabulary", m->unk);
    if (!kg_ids_push(out, (int32_t)unk)) return oom();
  }
  return KG_OK;
}

/* ---- Unigram --------------------------------------------------------------------------------- */

typedef struct {
  int64_t id;
  double score;
  long start; /* -1: unreached */
} node;

static kg_status push_piece(const tj_model *m, const char *s, size_t n, kg_ids *out) {
  int64_t id = kg_vocab_find(&m->vocab, s, n);
  if (id < 0 && m->byte_fallback) {
    bool all = true;
    for (size_t q = 0; q < n && all; q++)
      all = m->byte_ids[(uint8_t)s[q]] >= 0;
    if (all) {
      for (size_t q = 0; q < n; q++)
        if (!kg_ids_push(out, m->byte_ids[(uint8_t)s[q]])) return oom();
      return KG_OK;
    }
  }
  if (id < 0) id = m->unk_id;
  if (id < 0)
    return kg_error(KG_ERR_VALUE, TJ_OP, "Unigram: a piece is not in the vocabulary and the model has no unk_id");
  return kg_ids_push(out, (int32_t)id) ? KG_OK : oom();
}

static kg_status unigram(const tj_model *m, const char *s, size_t n, kg_ids *out) {
  if (n == 0) return KG_OK;
  node *best = malloc((n + 1) * sizeof *best);
  if (!best) return oom();
  for (size_t i = 0; i <= n; i++)
    best[i] = (node){0, 0, -1};
  best[0].start = 0;
  double unk_score = m->min_score - 10.0;
  for (size_t at = 0; at < n;) {
    double here = best[at].score;
    size_t mb = at;
    tj_next(s, n, &mb);
    bool single = false;
    uint64_t h = FNV0;
    for (size_t e = at; e < n;) {
      h = FNV(h, s[e]);
      e++;
      if (e < n && ((uint8_t)s[e] & 0xC0) == 0x80) continue; /* inside a character */
      const struct tj_prefix *p = pfx_slot(m->pfx, m->pfx_slots, h, (uint32_t)(e - at));
      if (p->len == 0) break; /* no piece goes on like this */
      int32_t id = p->id;
      if (id >= 0 && m->vocab.lens[id] == e - at && !memcmp(m->vocab.tokens[id], s + at, e - at)) {
        double cand = m->scores[id] + here;
        if (best[e].start < 0 || cand > best[e].score) best[e] = (node){id, cand, (long)at};
        if (e == mb) single = true;
      }
    }
    if (!single) {
      if (m->unk_id < 0) {
        free(best);
        return kg_error(KG_ERR_VALUE, TJ_OP,
                        "Unigram: a character is not in the vocabulary and the model has no unk_id");
      }
      double cand = unk_score + here;
      if (best[mb].start < 0 || cand > best[mb].score) best[mb] = (node){m->unk_id, cand, (long)at};
    }
    at = mb;
  }
  /* back from the end: segments, unk runs fused */
  size_t cap = 16, k = 0;
  size_t *seg = malloc(cap * 2 * sizeof *seg);
  if (!seg) {
    free(best);
    return oom();
  }
  bool in_unk = false;
  for (size_t e = n; e > 0;) {
    size_t st = (size_t)best[e].start;
    bool is_unk = best[e].id == m->unk_id;
    if (is_unk && in_unk) {
      seg[2 * (k - 1)] = st; /* extend the fused run leftwards */
    } else {
      if (k == cap) {
        size_t *ns = realloc(seg, cap * 4 * sizeof *seg);
        if (!ns) {
          free(seg);
          free(best);
          return oom();
        }
        seg = ns;
        cap *= 2;
      }
      seg[2 * k] = st;
      seg[2 * k + 1] = e;
      k++;
    }
    in_unk = is_unk;
    e = st;
  }
  free(best);
  kg_status r = KG_OK;
  for (size_t i = k; i-- > 0 && !r;)
    r = push_piece(m, s + seg[2 * i], seg[2 * i + 1] - seg[2 * i], out);
  free(seg);
  return r;
}

kg_status tj_model_tokenize(const tj_model *m, const char *s, size_t n, kg_ids *out) {
  switch (m->kind) {
  case TJ_M_BPE:
    return bpe(m, s, n, out);
  case TJ_M_WORDPIECE:
    return wordpiece(m, s, n, out);
  case TJ_M_WORDLEVEL: {
    int64_t id = kg_vocab_find(&m->vocab, s, n);
    if (id < 0) id = kg_vocab_find(&m->vocab, m->unk, m->unk_len);
    if (id < 0)
      return kg_error(KG_ERR_VALUE, TJ_OP, "WordLevel: the unk token '%.60s' is not in the vocabulary", m->unk);
    return kg_ids_push(out, (int32_t)id) ? KG_OK : oom();
  }
  default:
    return unigram(m, s, n, out);
  }
}
