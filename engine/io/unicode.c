/* unicode.c — UTF-8 coding, the tokenizers' character classes, lowercase, canonical
 * decomposition and NFC (unicode.h), over the generated tables of unicode_tables.h.
 * References: the Unicode Standard ch. 3 (UTF-8 well-formedness, table 3-7; Hangul syllable
 * arithmetic, 3.12) and UAX #15 (canonical ordering and composition). */
#include "unicode.h"

#include "unicode_tables.h"

#include <stdint.h>
#include <stdlib.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

int32_t kg_utf8_next(const uint8_t *s, size_t n, size_t *i) {
  uint8_t c = s[*i];
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (!len || *i + len > n) return -1;
  int32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
  for (int k = 1; k < len; k++) {
    if ((s[*i + k] & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (s[*i + k] & 0x3F);
  }
  static const int32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  *i += len;
  return cp;
}

int kg_utf8_put(char *o, uint32_t cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xE0 | cp >> 12);
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (char)(0xF0 | cp >> 18);
  o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* ---- classes -------------------------------------------------------------------------------- */

/* the value of the last of runs[0..n) whose lo <= cp (runs[0].lo is 0) */
static int run_value(const kg_uni_run *runs, int n, uint32_t cp) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (runs[mid].lo <= cp)
      lo = mid;
    else
      hi = mid - 1;
  }
  return runs[lo].v;
}

int kg_unicode_clip_class(uint32_t cp) {
  if (cp < 0x80) { /* the common case, without the search */
    if (cp == ' ' || (cp >= 0x9 && cp <= 0xD)) return KG_CLIP_SPACE;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return KG_CLIP_LETTER;
    return cp >= '0' && cp <= '9' ? KG_CLIP_NUMBER : KG_CLIP_OTHER;
  }
  return run_value(kg_uni_clip_class_runs, (int)COUNT(kg_uni_clip_class_runs), cp);
}

int kg_unicode_wp_class(uint32_t cp) {
  return run_value(kg_uni_wp_class_runs, (int)COUNT(kg_uni_wp_class_runs), cp);
}

int kg_unicode_gc(uint32_t cp) { return run_value(kg_uni_gc_runs, (int)COUNT(kg_uni_gc_runs), cp) & 31; }

bool kg_unicode_is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x9 && cp <= 0xD);
  return run_value(kg_uni_gc_runs, (int)COUNT(kg_uni_gc_runs), cp) & 32;
}

bool kg_unicode_is_alpha(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  int v = run_value(kg_uni_gc_runs, (int)COUNT(kg_uni_gc_runs), cp), g = v & 31;
  return (g >= KG_GC_LU && g <= KG_GC_LO) || g == KG_GC_NL || (v & 64);
}

int kg_unicode_tok_unknown(uint32_t cp) {
  if (cp < 0x80) return 0;
  int lo = 0, hi = (int)COUNT(kg_uni_tok_unknown) - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (kg_uni_tok_unknown[mid][0] == cp) return (int)kg_uni_tok_unknown[mid][1];
    if (kg_uni_tok_unknown[mid][0] < cp)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return 0;
}

uint32_t kg_unicode_fold(uint32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  int lo = 0, hi = (int)COUNT(kg_uni_fold) - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (kg_uni_fold[mid][0] == cp) return kg_uni_fold[mid][1];
    if (kg_uni_fold[mid][0] < cp)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  uint32_t l[3];
  return kg_unicode_lower(cp, l) == 1 ? l[0] : cp;
}

static int ccc(uint32_t cp) {
  if (cp < 0x300) return 0;
  return run_value(kg_uni_ccc_runs, (int)COUNT(kg_uni_ccc_runs), cp);
}

/* ---- lowercase and decomposition ---------------------------------------------------------- */

int kg_unicode_lower(uint32_t cp, uint32_t *out) {
  out[0] = cp;
  if (cp < 0x80) {
    if (cp >= 'A' && cp <= 'Z') out[0] = cp + 32;
    return 1;
  }
  int lo = 0, hi = (int)COUNT(kg_uni_lower) - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (kg_uni_lower[mid][0] == cp) {
      int n = 0;
      for (int k = 1; k < 4 && kg_uni_lower[mid][k]; k++)
        out[n++] = kg_uni_lower[mid][k];
      return n;
    }
    if (kg_uni_lower[mid][0] < cp)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return 1;
}

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21, TCOUNT = 28 };

int kg_unicode_decompose(uint32_t cp, uint32_t *out) {
  if (cp >= SBASE && cp < SBASE + LCOUNT * VCOUNT * TCOUNT) { /* Hangul syllables: L V (T) */
    uint32_t s = cp - SBASE;
    out[0] = LBASE + s / (VCOUNT * TCOUNT);
    out[1] = VBASE + (s % (VCOUNT * TCOUNT)) / TCOUNT;
    if (s % TCOUNT) {
      out[2] = TBASE + s % TCOUNT;
      return 3;
    }
    return 2;
  }
  int lo = 0, hi = (int)COUNT(kg_uni_decomp) - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (kg_uni_decomp[mid].cp == cp) {
      int n = kg_uni_decomp[mid].len;
      for (int k = 0; k < n; k++)
        out[k] = kg_uni_decomp_pool[kg_uni_decomp[mid].off + k];
      return n;
    }
    if (kg_uni_decomp[mid].cp < cp)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  out[0] = cp;
  return 1;
}

/* ---- NFC ------------------------------------------------------------------------------------ */

/* the primary composite of (a, b), or 0 */
static uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
    return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
  if (a >= SBASE && a < SBASE + LCOUNT * VCOUNT * TCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE &&
      b < TBASE + TCOUNT)
    return a + (b - TBASE);
  int lo = 0, hi = (int)COUNT(kg_uni_comp) - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    const uint32_t *e = kg_uni_comp[mid];
    if (e[0] == a && e[1] == b) return e[2];
    if (e[0] < a || (e[0] == a && e[1] < b))
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return 0;
}

int kg_unicode_decompose_compat(uint32_t cp, uint32_t *out) {
  int lo = 0, hi = (int)COUNT(kg_uni_kdecomp) - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (kg_uni_kdecomp[mid].cp == cp) {
      int n = kg_uni_kdecomp[mid].len;
      for (int k = 0; k < n; k++)
        out[k] = kg_uni_kdecomp_pool[kg_uni_kdecomp[mid].off + k];
      return n;
    }
    if (kg_uni_kdecomp[mid].cp < cp)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return kg_unicode_decompose(cp, out);
}

bool kg_unicode_nfc(const uint32_t *cp, size_t n, uint32_t **res, size_t *rn) {
  return kg_unicode_normalize(cp, n, false, true, res, rn);
}

bool kg_unicode_normalize(const uint32_t *cp, size_t n, bool compat, bool recompose, uint32_t **res, size_t *rn) {
  size_t per = compat ? KG_UNICODE_MAX_KDECOMP : 4;
  if (n > (SIZE_MAX / sizeof(uint32_t) - 1) / per) return false;
  uint32_t *d = malloc((per * n + 1) * sizeof *d);
  if (!d) return false;
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    m += (size_t)(compat ? kg_unicode_decompose_compat(cp[i], d + m) : kg_unicode_decompose(cp[i], d + m));
  /* canonical ordering: a stable sort of each run of non-starters by combining class */
  for (size_t i = 1; i < m; i++) {
    int c = ccc(d[i]);
    if (!c) continue;
    for (size_t j = i; j > 0 && ccc(d[j - 1]) > c; j--) {
      uint32_t x = d[j];
      d[j] = d[j - 1];
      d[j - 1] = x;
    }
  }
  if (!recompose) {
    *res = d;
    *rn = m;
    return true;
  }
  /* canonical composition (UAX #15): a mark joins the last starter unless blocked */
  size_t out = m ? 1 : 0, starter = 0;
  bool have_starter = m && ccc(d[0]) == 0;
  int last = m ? (ccc(d[0]) ? 256 : 0) : 0;
  for (size_t i = 1; i < m; i++) {
    uint32_t c = d[i];
    int cc = ccc(c);
    if (have_starter && (last < cc || last == 0)) {
      uint32_t comp = compose(d[starter], c);
      if (comp) {
        d[starter] = comp;
        continue;
      }
    }
    if (cc == 0) {
      starter = out;
      have_starter = true;
    }
    last = cc;
    d[out++] = c;
  }
  *res = d;
  *rn = out;
  return true;
}
