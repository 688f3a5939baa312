/* tokenizer_json_text.c — the text stages of a tokenizer.json pipeline: normalizers,
 * pre-tokenizers and decoders, as the reference `tokenizers` (Rust) defines them. Only the
 * strings are computed (no offsets). Character facts come from unicode.c: White_Space for
 * Rust's char::is_whitespace, the general categories for is_numeric (N*), punctuation (P* or
 * ASCII punctuation) and the marks that StripAccents removes. */
#include "tokenizer_json_internal.h"

#include "json.h"
#include "unicode.h"

#include <stdlib.h>
#include <string.h>

/* ---- buffers --------------------------------------------------------------------------------- */

void tj_put(tj_buf *b, const void *s, size_t n) {
  if (b->oom || !n) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

void tj_put_cp(tj_buf *b, uint32_t cp) {
  char u[4];
  tj_put(b, u, (size_t)kg_utf8_put(u, cp));
}

void tj_buf_free(tj_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

void tj_pieces_add(tj_pieces *l, const char *s, size_t n, bool first) {
  if (l->oom) return;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    tj_piece *v = realloc(l->v, cap * sizeof *v);
    if (!v) {
      l->oom = true;
      return;
    }
    l->v = v;
    l->cap = cap;
  }
  char *c = malloc(n + 1);
  if (!c) {
    l->oom = true;
    return;
  }
  if (n) memcpy(c, s, n);
  c[n] = 0;
  l->v[l->n++] = (tj_piece){c, n, first};
}

void tj_pieces_free(tj_pieces *l) {
  for (size_t i = 0; i < l->n; i++)
    free(l->v[i].s);
  free(l->v);
  memset(l, 0, sizeof *l);
}

uint32_t tj_next(const char *s, size_t n, size_t *i) {
  int32_t cp = kg_utf8_next((const uint8_t *)s, n, i);
  if (cp < 0) { /* not reached on checked text; step one byte so loops end */
    (*i)++;
    return 0xFFFD;
  }
  return (uint32_t)cp;
}

static kg_status oom(void) { return kg_error(KG_ERR_OOM, TJ_OP, "out of memory"); }

/* ---- character predicates -------------------------------------------------------------------- */

static bool is_punct(uint32_t cp) { /* char::is_ascii_punctuation || P* */
  if (cp < 0x80)
    return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126);
  int g = kg_unicode_gc(cp);
  return g >= KG_GC_PC && g <= KG_GC_PO && !(kg_unicode_tok_unknown(cp) & KG_TOK_NEW_PUNCT);
}

static bool is_numeric(uint32_t cp) { /* char::is_numeric */
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  int g = kg_unicode_gc(cp);
  return g == KG_GC_ND || g == KG_GC_NL || g == KG_GC_NO;
}

static bool is_mark(uint32_t cp) {
  int g = kg_unicode_gc(cp);
  return g == KG_GC_MN || g == KG_GC_MC || g == KG_GC_ME;
}

/* what StripAccents removes: a mark the reference knows */
static bool strip_mark(uint32_t cp) { return is_mark(cp) && !(kg_unicode_tok_unknown(cp) & KG_TOK_NEW_MARK); }

bool tj_word_char(uint32_t cp) {
  if (cp < 0x80) return (cp | 32) - 'a' < 26 || cp - '0' < 10 || cp == '_';
  int g = kg_unicode_gc(cp);
  return kg_unicode_is_alpha(cp) || (g >= KG_GC_MN && g <= KG_GC_ND) || g == KG_GC_PC || cp == 0x200C || cp == 0x200D;
}

static bool is_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100.. */
static uint32_t byte_cp(uint8_t b) {
  if (b <= 32) return 256u + b;
  if (b >= 127 && b <= 160) return 256u + 33 + (b - 127u);
  if (b == 173) return 323;
  return b;
}

static int cp_byte(uint32_t cp) {
  if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
  if (cp >= 256 && cp <= 288) return (int)cp - 256;
  if (cp >= 289 && cp <= 322) return (int)cp - 289 + 127;
  if (cp == 323) return 173;
  return -1;
}

/* ---- normalizers ------------------------------------------------------------------------------ */

static kg_status unicode_form(const char *s, size_t n, bool compat, bool compose, tj_buf *out) {
  uint32_t *cps = malloc((n + 1) * sizeof *cps);
  if (!cps) return oom();
  size_t k = 0;
  for (size_t i = 0; i < n;)
    cps[k++] = tj_next(s, n, &i);
  uint32_t *res;
  size_t rn;
  bool ok = kg_unicode_normalize(cps, k, compat, compose, &res, &rn);
  free(cps);
  if (!ok) return oom();
  for (size_t i = 0; i < rn; i++)
    tj_put_cp(out, res[i]);
  free(res);
  return KG_OK;
}

static kg_status replace_all(const tj_pattern *p, const char *content, size_t clen, const char *s, size_t n,
                             tj_buf *out) {
  size_t *sp, k;
  kg_status st = tj_pattern_matches(p, s, n, &sp, &k);
  if (st) return st;
  size_t prev = 0;
  for (size_t j = 0; j < k; j++) {
    tj_put(out, s + prev, sp[2 * j] - prev);
    tj_put(out, content, clen);
    prev = sp[2 * j + 1];
  }
  tj_put(out, s + prev, n - prev);
  free(sp);
  return KG_OK;
}

/* Extended grapheme clusters, as far as they matter for the < 6 byte clusters the Precompiled
 * normalizer looks up: CR LF; a non-control followed by marks (Extend, SpacingMark), ZWJ, ZWNJ,
 * the halfwidth voiced marks and the emoji modifiers. */
static bool extends(uint32_t cp) {
  return is_mark(cp) || cp == 0x200C || cp == 0x200D || cp == 0xFF9E || cp == 0xFF9F ||
         (cp >= 0x1F3FB && cp <= 0x1F3FF) || (cp >= 0xE0020 && cp <= 0xE007F);
}

static size_t grapheme_end(const char *s, size_t n, size_t i) {
  size_t j = i;
  uint32_t c = tj_next(s, n, &j);
  if (c == '\r' && j < n && s[j] == '\n') return j + 1;
  int g = kg_unicode_gc(c);
  if (c == '\r' || c == '\n' || g == KG_GC_CC || g == KG_GC_ZL || g == KG_GC_ZP ||
      (g == KG_GC_CF && c != 0x200D && c != 0x200C))
    return j;
  while (j < n) {
    size_t k = j;
    if (!extends(tj_next(s, n, &k))) break;
    j = k;
  }
  return j;
}

/* spm_precompiled's transform: the replacement of the first (shortest) key that prefixes
 * chunk, or NULL. Every index is checked against the arrays. */
static const char *charsmap_first(const tj_norm *z, const char *chunk, size_t n, size_t *rlen) {
  const uint32_t *a = z->trie;
  size_t units = z->trie_units;
  uint32_t unit = a[0];
  size_t pos = (unit >> 10) << ((unit & (1u << 9)) >> 6);
  for (size_t i = 0; i < n; i++) {
    uint8_t ch = (uint8_t)chunk[i];
    pos ^= ch;
    if (pos >= units) return NULL;
    unit = a[pos];
    if ((unit & ((1u << 31) | 0xFF)) != ch) return NULL;
    pos ^= (unit >> 10) << ((unit & (1u << 9)) >> 6);
    if (pos >= units) return NULL;
    if ((unit >> 8) & 1) {
      uint32_t v = a[pos] & ((1u << 31) - 1);
      if (v >= z->norm_len) return NULL;
      const char *r = z->norm + v;
      *rlen = strnlen(r, z->norm_len - v);
      return kg_utf8_valid(r, *rlen) ? r : NULL; /* a corrupt map must not make text that is not UTF-8 */
    }
  }
  return NULL;
}

static void precompiled(const tj_norm *z, const char *s, size_t n, tj_buf *out) {
  for (size_t i = 0; i < n;) {
    size_t e = grapheme_end(s, n, i), rl;
    const char *r;
    if (e - i < 6 && (r = charsmap_first(z, s + i, e - i, &rl))) {
      tj_put(out, r, rl);
      i = e;
      continue;
    }
    while (i < e) {
      size_t j = i;
      tj_next(s, n, &j);
      r = charsmap_first(z, s + i, j - i, &rl);
      if (r)
        tj_put(out, r, rl);
      else
        tj_put(out, s + i, j - i);
      i = j;
    }
  }
}

static void nmt(const char *s, size_t n, tj_buf *out) {
  for (size_t i = 0; i < n;) {
    uint32_t c = tj_next(s, n, &i);
    if ((c >= 1 && c <= 8) || c == 0xB || (c >= 0xE && c <= 0x1F) || c == 0x7F || c == 0x8F || c == 0x9F) continue;
    if (c == 9 || c == 0xA || c == 0xC || c == 0xD || c == 0x1680 || (c >= 0x200B && c <= 0x200F) || c == 0x2028 ||
        c == 0x2029 || c == 0x2581 || c == 0xFEFF || c == 0xFFFD)
      c = ' ';
    tj_put_cp(out, c);
  }
}

static kg_status bert_norm(const tj_norm *z, const char *s, size_t n, tj_buf *out) {
  tj_buf a = {0};
  for (size_t i = 0; i < n;) {
    uint32_t c = tj_next(s, n, &i);
    if (z->clean_text) {
      if (c == 0 || c == 0xFFFD) continue;
      int k = kg_unicode_wp_class(c);
      if (k == KG_WP_CONTROL && !(kg_unicode_tok_unknown(c) & KG_TOK_NEW_CONTROL)) continue;
      if (c == '\t' || c == '\n' || c == '\r' || kg_unicode_is_space(c)) c = ' ';
    }
    if (z->chinese && is_cjk(c)) {
      tj_put(&a, " ", 1);
      tj_put_cp(&a, c);
      tj_put(&a, " ", 1);
    } else {
      tj_put_cp(&a, c);
    }
  }
  if (a.oom) return oom();
  tj_buf b = {0};
  const char *cur = a.p ? a.p : "";
  size_t cn = a.n;
  if (z->strip_accents) {
    kg_status st = unicode_form(cur, cn, false, false, &b);
    if (st) {
      tj_buf_free(&a);
      tj_buf_free(&b);
      return st;
    }
    tj_buf_free(&a);
    a = (tj_buf){0};
    for (size_t i = 0; i < b.n;) {
      size_t j = i;
      uint32_t c = tj_next(b.p, b.n, &j);
      if (kg_unicode_gc(c) != KG_GC_MN || (kg_unicode_tok_unknown(c) & KG_TOK_NEW_MN)) tj_put(&a, b.p + i, j - i);
      i = j;
    }
    tj_buf_free(&b);
    cur = a.p ? a.p : "";
    cn = a.n;
  }
  for (size_t i = 0; i < cn;) {
    size_t j = i;
    uint32_t c = tj_next(cur, cn, &j);
    if (z->lowercase) {
      uint32_t lo[3];
      int k = kg_unicode_lower(c, lo);
      for (int q = 0; q < k; q++)
        tj_put_cp(out, lo[q]);
    } else {
      tj_put(out, cur + i, j - i);
    }
    i = j;
  }
  bool bad = a.oom;
  tj_buf_free(&a);
  return bad ? oom() : KG_OK;
}

kg_status tj_normalize(const tj_norm *z, const char *s, size_t n, tj_buf *out) {
  kg_status st = KG_OK;
  switch (z->kind) {
  case TJ_N_SEQUENCE: {
    tj_buf cur = {0};
    tj_put(&cur, s, n);
    for (int k = 0; k < z->nkids && !st; k++) {
      tj_buf next = {0};
      st = tj_normalize(&z->kids[k], cur.p ? cur.p : "", cur.n, &next);
      if (!st && (next.oom || cur.oom)) st = oom();
      tj_buf_free(&cur);
      cur = next;
    }
    if (!st) tj_put(out, cur.p, cur.n);
    tj_buf_free(&cur);
    break;
  }
  case TJ_N_NFC:
    st = unicode_form(s, n, false, true, out);
    break;
  case TJ_N_NFD:
    st = unicode_form(s, n, false, false, out);
    break;
  case TJ_N_NFKC:
    st = unicode_form(s, n, true, true, out);
    break;
  case TJ_N_NFKD:
    st = unicode_form(s, n, true, false, out);
    break;
  case TJ_N_LOWERCASE:
    for (size_t i = 0; i < n;) {
      uint32_t lo[3];
      int k = kg_unicode_lower(tj_next(s, n, &i), lo);
      for (int q = 0; q < k; q++)
        tj_put_cp(out, lo[q]);
    }
    break;
  case TJ_N_STRIP_ACCENTS:
    for (size_t i = 0; i < n;) {
      size_t j = i;
      if (!strip_mark(tj_next(s, n, &j))) tj_put(out, s + i, j - i);
      i = j;
    }
    break;
  case TJ_N_STRIP: {
    size_t a = 0, b = n;
    if (z->left)
      while (a < b) {
        size_t j = a;
        if (!kg_unicode_is_space(tj_next(s, n, &j))) break;
        a = j;
      }
    if (z->right)
      while (b > a) {
        size_t j = b - 1;
        while (j > a && ((uint8_t)s[j] & 0xC0) == 0x80)
          j--;
        size_t q = j;
        if (!kg_unicode_is_space(tj_next(s, n, &q))) break;
        b = j;
      }
    tj_put(out, s + a, b - a);
    break;
  }
  case TJ_N_REPLACE:
    st = replace_all(&z->pat, z->content, z->content_len, s, n, out);
    break;
  case TJ_N_PREPEND:
    if (n) tj_put(out, z->content, z->content_len);
    tj_put(out, s, n);
    break;
  case TJ_N_BERT:
    st = bert_norm(z, s, n, out);
    break;
  case TJ_N_PRECOMPILED:
    precompiled(z, s, n, out);
    break;
  case TJ_N_NMT:
    nmt(s, n, out);
    break;
  case TJ_N_BYTELEVEL:
    for (size_t i = 0; i < n; i++)
      tj_put_cp(out, byte_cp((uint8_t)s[i]));
    break;
  }
  if (!st && out->oom) st = oom();
  return st;
}

void tj_norm_free(tj_norm *z) {
  if (!z) return;
  for (int k = 0; k < z->nkids; k++)
    tj_norm_free(&z->kids[k]);
  free(z->kids);
  tj_pattern_free(&z->pat);
  free(z->content);
  free(z->charsmap);
}

/* ---- pre-tokenizers ---------------------------------------------------------------------------- */

const char tj_gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* spans: k triples (start, end, is_match) covering s in order; behaviour as the reference's
 * NormalizedString::split; non-empty pieces are appended to out */
static void split_by(const tj_piece *pc, const size_t *sp, size_t k, int behavior, tj_pieces *out) {
  size_t i = 0;
  while (i < k) {
    size_t a = sp[3 * i], b = sp[3 * i + 1];
    bool match = sp[3 * i + 2];
    size_t j = i + 1;
    switch (behavior) {
    case TJ_B_REMOVED:
      if (match) {
        i = j;
        continue;
      }
      break;
    case TJ_B_ISOLATED:
      break;
    case TJ_B_MERGED_PREV: /* a match joins the piece before it */
      if (j < k && !match && sp[3 * j + 2]) b = sp[3 * j + 1], j++;
      break;
    case TJ_B_MERGED_NEXT: /* a match starts the piece after it */
      if (match && j < k && !sp[3 * j + 2]) b = sp[3 * j + 1], j++;
      break;
    case TJ_B_CONTIGUOUS:
      while (j < k && (bool)sp[3 * j + 2] == match)
        b = sp[3 * j + 1], j++;
      break;
    }
    if (b > a) tj_pieces_add(out, pc->s + a, b - a, pc->first && a == 0);
    i = j;
  }
}

/* spans from a list of matches (pairs) over s[0..n) */
static size_t *spans_of_matches(const size_t *m, size_t k, size_t n, bool invert, size_t *count) {
  size_t *sp = malloc((2 * k + 2) * 3 * sizeof *sp), c = 0, prev = 0;
  if (!sp) return NULL;
  for (size_t i = 0; i < k; i++) {
    if (m[2 * i] > prev) sp[3 * c] = prev, sp[3 * c + 1] = m[2 * i], sp[3 * c + 2] = invert, c++;
    sp[3 * c] = m[2 * i], sp[3 * c + 1] = m[2 * i + 1], sp[3 * c + 2] = !invert, c++;
    prev = m[2 * i + 1];
  }
  if (prev < n || c == 0) sp[3 * c] = prev, sp[3 * c + 1] = n, sp[3 * c + 2] = invert, c++;
  *count = c;
  return sp;
}

/* each character where pred holds is a match of its own */
static size_t *spans_of_chars(const char *s, size_t n, bool (*pred)(uint32_t, const tj_pre *), const tj_pre *p,
                              size_t *count) {
  size_t *sp = malloc((2 * n + 2) * 3 * sizeof *sp), c = 0, prev = 0;
  if (!sp) return NULL;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    uint32_t cp = tj_next(s, n, &j);
    if (pred(cp, p)) {
      if (i > prev) sp[3 * c] = prev, sp[3 * c + 1] = i, sp[3 * c + 2] = 0, c++;
      sp[3 * c] = i, sp[3 * c + 1] = j, sp[3 * c + 2] = 1, c++;
      prev = j;
    }
    i = j;
  }
  if (prev < n) sp[3 * c] = prev, sp[3 * c + 1] = n, sp[3 * c + 2] = 0, c++;
  *count = c;
  return sp;
}

static bool pred_space(uint32_t c, const tj_pre *p) { return (void)p, kg_unicode_is_space(c); }
static bool pred_punct(uint32_t c, const tj_pre *p) { return (void)p, is_punct(c); }
static bool pred_digit(uint32_t c, const tj_pre *p) { return (void)p, is_numeric(c); }
static bool pred_char(uint32_t c, const tj_pre *p) { return c == p->ch; }

static kg_status split_chars(const tj_piece *pc, bool (*pred)(uint32_t, const tj_pre *), const tj_pre *p, int behavior,
                             tj_pieces *out) {
  size_t k, *sp = spans_of_chars(pc->s, pc->n, pred, p, &k);
  if (!sp) return oom();
  split_by(pc, sp, k, behavior, out);
  free(sp);
  return KG_OK;
}

static kg_status split_pattern(const tj_piece *pc, const tj_pattern *pat, bool invert, int behavior, tj_pieces *out) {
  size_t *m, k;
  kg_status st = tj_pattern_matches(pat, pc->s, pc->n, &m, &k);
  if (st) return st;
  size_t c, *sp = spans_of_matches(m, k, pc->n, invert, &c);
  free(m);
  if (!sp) return oom();
  split_by(pc, sp, c, behavior, out);
  free(sp);
  return KG_OK;
}

/* Whitespace: the matches of \w+|[^\w\s]+ (Rust regex classes) are kept, the rest removed */
static void whitespace_split(const tj_piece *pc, tj_pieces *out) {
  const char *s = pc->s;
  size_t n = pc->n;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    uint32_t c = tj_next(s, n, &j);
    int cls = tj_word_char(c) ? 1 : kg_unicode_is_space(c) ? 0 : 2;
    if (!cls) {
      i = j;
      continue;
    }
    size_t e = j;
    while (e < n) {
      size_t q = e;
      uint32_t d = tj_next(s, n, &q);
      int dc = tj_word_char(d) ? 1 : kg_unicode_is_space(d) ? 0 : 2;
      if (dc != cls) break;
      e = q;
    }
    tj_pieces_add(out, s + i, e - i, pc->first && i == 0);
    i = e;
  }
}

static kg_status bytelevel(const tj_pre *p, const tj_piece *pc, tj_pieces *out) {
  tj_buf pre = {0};
  if (p->add_prefix_space && (pc->n == 0 || pc->s[0] != ' ')) tj_put(&pre, " ", 1);
  tj_put(&pre, pc->s, pc->n);
  if (pre.oom) return oom();
  tj_piece whole = {pre.p ? pre.p : "", pre.n, pc->first};
  tj_pieces parts = {0};
  kg_status st = KG_OK;
  if (p->use_regex) {
    st = split_pattern(&whole, &p->pat, false, TJ_B_ISOLATED, &parts);
  } else if (whole.n) {
    tj_pieces_add(&parts, whole.s, whole.n, whole.first);
  }
  for (size_t i = 0; i < parts.n && !st; i++) {
    tj_buf b = {0};
    for (size_t q = 0; q < parts.v[i].n; q++)
      tj_put_cp(&b, byte_cp((uint8_t)parts.v[i].s[q]));
    if (b.oom)
      st = oom();
    else
      tj_pieces_add(out, b.p, b.n, parts.v[i].first);
    tj_buf_free(&b);
  }
  if (parts.oom && !st) st = oom();
  tj_pieces_free(&parts);
  tj_buf_free(&pre);
  return st;
}

static kg_status metaspace(const tj_pre *p, const tj_piece *pc, tj_pieces *out) {
  tj_buf b = {0};
  for (size_t i = 0; i < pc->n; i++) {
    if (pc->s[i] == ' ')
      tj_put(&b, p->ch_utf8, (size_t)p->ch_len);
    else
      tj_put(&b, pc->s + i, 1);
  }
  bool starts = b.n >= (size_t)p->ch_len && !memcmp(b.p, p->ch_utf8, (size_t)p->ch_len);
  tj_buf c = {0};
  if (!starts && (p->prepend == TJ_PREPEND_ALWAYS || (p->prepend == TJ_PREPEND_FIRST && pc->first)))
    tj_put(&c, p->ch_utf8, (size_t)p->ch_len);
  tj_put(&c, b.p, b.n);
  tj_buf_free(&b);
  if (c.oom) {
    tj_buf_free(&c);
    return oom();
  }
  tj_piece whole = {c.p ? c.p : "", c.n, pc->first};
  kg_status st = KG_OK;
  if (p->split)
    st = split_chars(&whole, pred_char, p, TJ_B_MERGED_NEXT, out);
  else if (whole.n)
    tj_pieces_add(out, whole.s, whole.n, whole.first);
  tj_buf_free(&c);
  return st;
}

static kg_status pre_one(const tj_pre *p, const tj_piece *pc, tj_pieces *out) {
  switch (p->kind) {
  case TJ_P_BYTELEVEL:
    return bytelevel(p, pc, out);
  case TJ_P_METASPACE:
    return metaspace(p, pc, out);
  case TJ_P_WHITESPACE:
    whitespace_split(pc, out);
    return KG_OK;
  case TJ_P_WHITESPACE_SPLIT:
    return split_chars(pc, pred_space, p, TJ_B_REMOVED, out);
  case TJ_P_SPLIT:
    return split_pattern(pc, &p->pat, p->invert, p->behavior, out);
  case TJ_P_PUNCTUATION:
    return split_chars(pc, pred_punct, p, p->behavior, out);
  case TJ_P_DIGITS:
    return split_chars(pc, pred_digit, p, p->individual ? TJ_B_ISOLATED : TJ_B_CONTIGUOUS, out);
  case TJ_P_CHAR_DELIMITER:
    return split_chars(pc, pred_char, p, TJ_B_REMOVED, out);
  case TJ_P_BERT: {
    tj_pieces mid = {0};
    kg_status st = split_chars(pc, pred_space, p, TJ_B_REMOVED, &mid);
    for (size_t i = 0; i < mid.n && !st; i++)
      st = split_chars(&mid.v[i], pred_punct, p, TJ_B_ISOLATED, out);
    if (!st && mid.oom) st = oom();
    tj_pieces_free(&mid);
    return st;
  }
  default:
    return KG_OK;
  }
}

kg_status tj_pre_tokenize(const tj_pre *p, tj_pieces *l) {
  if (p->kind == TJ_P_SEQUENCE) {
    for (int k = 0; k < p->nkids; k++) {
      kg_status st = tj_pre_tokenize(&p->kids[k], l);
      if (st) return st;
    }
    return KG_OK;
  }
  tj_pieces out = {0};
  kg_status st = KG_OK;
  for (size_t i = 0; i < l->n && !st; i++)
    st = pre_one(p, &l->v[i], &out);
  if (!st && out.oom) st = oom();
  if (st) {
    tj_pieces_free(&out);
    return st;
  }
  tj_pieces_free(l);
  *l = out;
  return KG_OK;
}

void tj_pre_free(tj_pre *p) {
  if (!p) return;
  for (int k = 0; k < p->nkids; k++)
    tj_pre_free(&p->kids[k]);
  free(p->kids);
  tj_pattern_free(&p->pat);
}

/* ---- decoders ----------------------------------------------------------------------------------- */

/* replaces l's tokens by out's */
static kg_status swap(tj_pieces *l, tj_pieces *out) {
  if (out->oom) {
    tj_pieces_free(out);
    return oom();
  }
  tj_pieces_free(l);
  *l = *out;
  return KG_OK;
}

/* String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD */
static void lossy(const uint8_t *s, size_t n, tj_buf *out) {
  for (size_t i = 0; i < n;) {
    size_t j = i;
    if (kg_utf8_next(s, n, &j) >= 0) {
      tj_put(out, s + i, j - i);
      i = j;
      continue;
    }
    /* the longest prefix of a valid sequence, at least one byte */
    uint8_t c = s[i];
    size_t need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
    size_t k = 1;
    while (k < need && i + k < n) {
      uint8_t d = s[i + k];
      uint8_t lo = 0x80, hi = 0xBF;
      if (k == 1) {
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      }
      if (d < lo || d > hi) break;
      k++;
    }
    tj_put(out, "\xEF\xBF\xBD", 3);
    i += k;
  }
}

static kg_status dec_bytelevel(tj_pieces *l) {
  tj_buf bytes = {0};
  for (size_t i = 0; i < l->n; i++) {
    const tj_piece *t = &l->v[i];
    size_t start = bytes.n;
    bool all = true;
    for (size_t q = 0; q < t->n && all;) {
      int b = cp_byte(tj_next(t->s, t->n, &q));
      if (b < 0)
        all = false;
      else {
        uint8_t c = (uint8_t)b;
        tj_put(&bytes, &c, 1);
      }
    }
    if (!all) {
      bytes.n = start;
      tj_put(&bytes, t->s, t->n);
    }
  }
  tj_buf text = {0};
  lossy((const uint8_t *)(bytes.p ? bytes.p : ""), bytes.n, &text);
  tj_pieces out = {0};
  tj_pieces_add(&out, text.p ? text.p : "", text.n, false);
  bool bad = bytes.oom || text.oom;
  tj_buf_free(&bytes);
  tj_buf_free(&text);
  if (bad) out.oom = true;
  return swap(l, &out);
}

static int hex2(const char *s) { /* u8::from_str_radix(s[0..2], 16), -1 when invalid */
  int a = s[0] == '+' ? 0 : -2, b;
  if (a == -2) {
    int h = s[0] >= '0' && s[0] <= '9'                 ? s[0] - '0'
            : (s[0] | 32) >= 'a' && (s[0] | 32) <= 'f' ? (s[0] | 32) - 'a' + 10
                                                       : -1;
    if (h < 0) return -1;
    a = h;
  }
  b = s[1] >= '0' && s[1] <= '9' ? s[1] - '0' : (s[1] | 32) >= 'a' && (s[1] | 32) <= 'f' ? (s[1] | 32) - 'a' + 10 : -1;
  if (b < 0) return -1;
  return a * 16 + b;
}

static void flush_bytes(tj_pieces *out, tj_buf *bytes) {
  if (!bytes->n) return;
  if (kg_utf8_valid(bytes->p, bytes->n))
    tj_pieces_add(out, bytes->p, bytes->n, false);
  else
    for (size_t k = 0; k < bytes->n; k++)
      tj_pieces_add(out, "\xEF\xBF\xBD", 3, false);
  bytes->n = 0;
}

static kg_status dec_bytefallback(tj_pieces *l) {
  tj_pieces out = {0};
  tj_buf bytes = {0};
  for (size_t i = 0; i < l->n; i++) {
    const tj_piece *t = &l->v[i];
    int b = t->n == 6 && !memcmp(t->s, "<0x", 3) && t->s[5] == '>' ? hex2(t->s + 3) : -1;
    if (b >= 0) {
      uint8_t c = (uint8_t)b;
      tj_put(&bytes, &c, 1);
      continue;
    }
    flush_bytes(&out, &bytes);
    tj_pieces_add(&out, t->s, t->n, false);
  }
  flush_bytes(&out, &bytes);
  if (bytes.oom) out.oom = true;
  tj_buf_free(&bytes);
  return swap(l, &out);
}

static void replace_str(const char *s, size_t n, const char *from, size_t fl, const char *to, size_t tl, tj_buf *out) {
  size_t i = 0;
  while (i < n) {
    if (fl && i + fl <= n && !memcmp(s + i, from, fl)) {
      tj_put(out, to, tl);
      i += fl;
    } else {
      tj_put(out, s + i, 1);
      i++;
    }
  }
}

static kg_status dec_wordpiece(const tj_dec *d, tj_pieces *l) {
  static const char *pairs[][2] = {{" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
                                   {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
                                   {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  tj_pieces out = {0};
  for (size_t i = 0; i < l->n; i++) {
    tj_buf b = {0};
    const tj_piece *t = &l->v[i];
    if (i == 0)
      tj_put(&b, t->s, t->n);
    else if (t->n >= d->prefix_len && !memcmp(t->s, d->prefix, d->prefix_len))
      tj_put(&b, t->s + d->prefix_len, t->n - d->prefix_len);
    else if (d->prefix_len == 0)
      tj_put(&b, t->s, t->n); /* replacen of "" removes nothing */
    else {
      tj_put(&b, " ", 1);
      tj_put(&b, t->s, t->n);
    }
    if (d->cleanup)
      for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        tj_buf c = {0};
        replace_str(b.p ? b.p : "", b.n, pairs[k][0], strlen(pairs[k][0]), pairs[k][1], strlen(pairs[k][1]), &c);
        if (b.oom) c.oom = true;
        tj_buf_free(&b);
        b = c;
      }
    if (b.oom) out.oom = true;
    tj_pieces_add(&out, b.p ? b.p : "", b.n, false);
    tj_buf_free(&b);
  }
  return swap(l, &out);
}

kg_status tj_decode_chain(const tj_dec *d, tj_pieces *l) {
  tj_pieces out = {0};
  switch (d->kind) {
  case TJ_D_SEQUENCE:
    for (int k = 0; k < d->nkids; k++) {
      kg_status st = tj_decode_chain(&d->kids[k], l);
      if (st) return st;
    }
    return KG_OK;
  case TJ_D_BYTELEVEL:
    return dec_bytelevel(l);
  case TJ_D_BYTEFALLBACK:
    return dec_bytefallback(l);
  case TJ_D_WORDPIECE:
    return dec_wordpiece(d, l);
  case TJ_D_FUSE: {
    tj_buf b = {0};
    for (size_t i = 0; i < l->n; i++)
      tj_put(&b, l->v[i].s, l->v[i].n);
    if (b.oom) out.oom = true;
    tj_pieces_add(&out, b.p ? b.p : "", b.n, false);
    tj_buf_free(&b);
    return swap(l, &out);
  }
  case TJ_D_METASPACE:
    for (size_t i = 0; i < l->n; i++) {
      tj_buf b = {0};
      const tj_piece *t = &l->v[i];
      for (size_t q = 0; q < t->n;) {
        size_t j = q;
        uint32_t c = tj_next(t->s, t->n, &j);
        if (c == d->ch) {
          if (!(i == 0 && d->prepend != TJ_PREPEND_NEVER)) tj_put(&b, " ", 1);
        } else {
          tj_put(&b, t->s + q, j - q);
        }
        q = j;
      }
      if (b.oom) out.oom = true;
      tj_pieces_add(&out, b.p ? b.p : "", b.n, false);
      tj_buf_free(&b);
    }
    return swap(l, &out);
  case TJ_D_STRIP:
    for (size_t i = 0; i < l->n; i++) {
      const tj_piece *t = &l->v[i];
      size_t a = 0, b = t->n;
      for (size_t k = 0; k < d->start && a < b; k++) {
        size_t j = a;
        if (tj_next(t->s, t->n, &j) != d->ch) break;
        a = j;
      }
      for (size_t k = 0; k < d->stop && b > a; k++) {
        size_t j = b - 1;
        while (j > a && ((uint8_t)t->s[j] & 0xC0) == 0x80)
          j--;
        size_t q = j;
        if (tj_next(t->s, t->n, &q) != d->ch) break;
        b = j;
      }
      tj_pieces_add(&out, t->s + a, b - a, false);
    }
    return swap(l, &out);
  case TJ_D_REPLACE:
    for (size_t i = 0; i < l->n; i++) {
      tj_buf b = {0};
      kg_status st = replace_all(&d->pat, d->content, d->content_len, l->v[i].s, l->v[i].n, &b);
      if (st) {
        tj_buf_free(&b);
        tj_pieces_free(&out);
        return st;
      }
      if (b.oom) out.oom = true;
      tj_pieces_add(&out, b.p ? b.p : "", b.n, false);
      tj_buf_free(&b);
    }
    return swap(l, &out);
  case TJ_D_BPE:
    for (size_t i = 0; i < l->n; i++) {
      tj_buf b = {0};
      bool last = i + 1 == l->n;
      replace_str(l->v[i].s, l->v[i].n, d->prefix, d->prefix_len, last ? "" : " ", last ? 0 : 1, &b);
      if (b.oom) out.oom = true;
      tj_pieces_add(&out, b.p ? b.p : "", b.n, false);
      tj_buf_free(&b);
    }
    return swap(l, &out);
  }
  return KG_OK;
}

void tj_dec_free(tj_dec *d) {
  if (!d) return;
  for (int k = 0; k < d->nkids; k++)
    tj_dec_free(&d->kids[k]);
  free(d->kids);
  free(d->prefix);
  tj_pattern_free(&d->pat);
  free(d->content);
}
