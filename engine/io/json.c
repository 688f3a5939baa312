/* json.c — the strict JSON reader (<keng/json.h>) and the small writer used by safetensors.c.
 * Recursive descent over a byte buffer; every read is bounds-checked against the end pointer,
 * depth is capped, and duplicate keys are found by sorting each object's keys once. */
#include "json.h"
#include "unicode.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *start, *p, *end;
  char *err;
  size_t errlen;
  unsigned flags; /* KG_JSON_* */
  bool failed;
} parser;

/* Records the first failure, located at ps->p as a 1-based line, column (in bytes) and byte. */
static bool fail(parser *ps, const char *fmt, ...) {
  if (ps->failed) return false;
  ps->failed = true;
  size_t line = 1;
  const char *bol = ps->start;
  for (const char *c = ps->start; c < ps->p; c++)
    if (*c == '\n') line++, bol = c + 1;
  int n = snprintf(ps->err, ps->errlen, "invalid JSON at line %zu, column %zu (byte %zu): ", line,
                   (size_t)(ps->p - bol) + 1, (size_t)(ps->p - ps->start) + 1);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < ps->errlen) vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
  va_end(ap);
  return false;
}

static void skip_ws(parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

/* Length of the UTF-8 sequence at s (bytes available: n), or 0 if malformed. */
static int utf8_seq(const unsigned char *s, size_t n) {
  size_t i = 0;
  return kg_utf8_next(s, n, &i) < 0 ? 0 : (int)i;
}

bool kg_utf8_valid(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    int k = utf8_seq(u + i, n - i);
    if (!k) return false;
    i += (size_t)k;
  }
  return true;
}

static int hex4(parser *ps, unsigned *out) {
  if (ps->end - ps->p < 4) return fail(ps, "truncated \\u escape");
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = ps->p[i];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= (unsigned)(c - 'A' + 10);
    else
      return fail(ps, "bad hex digit in \\u escape");
  }
  ps->p += 4;
  *out = v;
  return true;
}

/* ps->p is just past the opening quote. The decoded string is never longer than the source. */
static bool parse_string(parser *ps, char **out, size_t *outlen) {
  const char *q = ps->p;
  while (q < ps->end && *q != '"')
    q += (*q == '\\' && q + 1 < ps->end) ? 2 : 1;
  if (q >= ps->end) return fail(ps, "unterminated string");
  char *s = malloc((size_t)(q - ps->p) + 1);
  if (!s) return fail(ps, "out of memory");
  size_t o = 0;
  while (ps->p < ps->end) {
    unsigned char c = (unsigned char)*ps->p;
    if (c == '"') {
      ps->p++;
      s[o] = 0;
      *out = s;
      *outlen = o;
      return true;
    }
    if (c < 0x20) {
      free(s);
      return fail(ps, "control character 0x%02x inside a string", c);
    }
    if (c == '\\') {
      const char *esc = ps->p; /* surrogate errors point at the escape */
      ps->p++;
      if (ps->p >= ps->end) break;
      char e = *ps->p++;
      switch (e) {
      case '"': s[o++] = '"'; break;
      case '\\': s[o++] = '\\'; break;
      case '/': s[o++] = '/'; break;
      case 'b': s[o++] = '\b'; break;
      case 'f': s[o++] = '\f'; break;
      case 'n': s[o++] = '\n'; break;
      case 'r': s[o++] = '\r'; break;
      case 't': s[o++] = '\t'; break;
      case 'u': {
        unsigned cp, lo;
        if (!hex4(ps, &cp)) return free(s), false;
        if (cp >= 0xDC00 && cp <= 0xDFFF)
          return free(s), ps->p = esc, fail(ps, "lone low surrogate in \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
            return free(s), ps->p = esc, fail(ps, "high surrogate not followed by a low one");
          ps->p += 2;
          if (!hex4(ps, &lo)) return free(s), false;
          if (lo < 0xDC00 || lo > 0xDFFF)
            return free(s), ps->p = esc, fail(ps, "high surrogate not followed by a low one");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        o += (size_t)kg_utf8_put(s + o, cp); /* at most 4 bytes out of 6 or 12 in */
        break;
      }
      default: free(s); return fail(ps, "bad escape '\\%c'", e);
      }
      continue;
    }
    int k = utf8_seq((const unsigned char *)ps->p, (size_t)(ps->end - ps->p));
    if (!k) {
      free(s);
      return fail(ps, "invalid UTF-8 in a string");
    }
    memcpy(s + o, ps->p, (size_t)k);
    o += (size_t)k;
    ps->p += k;
  }
  free(s);
  return fail(ps, "unterminated string");
}

/* Python's json writes float('nan') and float('inf') as these bare tokens (KG_JSON_NONFINITE). */
static bool nonfinite(parser *ps, kg_json *v) {
  static const struct {
    const char *word;
    double value;
  } tokens[] = {{"NaN", NAN}, {"Infinity", INFINITY}, {"-Infinity", -INFINITY}};
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(tokens[i].word);
    if ((size_t)(ps->end - ps->p) >= n && !memcmp(ps->p, tokens[i].word, n)) {
      ps->p += n;
      v->type = KG_JSON_NUMBER;
      v->number = tokens[i].value;
      return true;
    }
  }
  return false;
}

static bool parse_number(parser *ps, kg_json *v) {
  const char *b = ps->p;
  bool neg = false, frac = false, expo = false;
  if ((ps->flags & KG_JSON_NONFINITE) && nonfinite(ps, v)) return true;
  if (ps->p < ps->end && *ps->p == '-') neg = true, ps->p++;
  if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad number");
  if (*ps->p == '0') {
    ps->p++;
    if (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') return fail(ps, "leading zero in a number");
  } else
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
      ps->p++;
  const char *int_end = ps->p;
  if (ps->p < ps->end && *ps->p == '.') {
    frac = true;
    ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad fraction");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
      ps->p++;
  }
  if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
    expo = true;
    ps->p++;
    if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad exponent");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
      ps->p++;
  }
  v->type = KG_JSON_NUMBER;
  if (!neg && !frac && !expo) {
    uint64_t u = 0;
    bool fits = true;
    for (const char *c = b; c < int_end; c++) {
      unsigned d = (unsigned)(*c - '0');
      if (u > (UINT64_MAX - d) / 10)
        fits = false;
      else
        u = u * 10 + d;
    }
    v->is_uint = fits;
    v->uint = fits ? u : 0;
  }
  if (!frac && !expo) { /* an integer in [-2^63, 2^63) is kept exactly as well */
    uint64_t m = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    bool fits = true;
    for (const char *c = b + neg; c < int_end && fits; c++) {
      unsigned d = (unsigned)(*c - '0');
      if (m > (lim - d) / 10)
        fits = false;
      else
        m = m * 10 + d;
    }
    v->is_int = fits;
    v->i64 = !fits ? 0 : neg ? (m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m) : (int64_t)m;
  }
  size_t n = (size_t)(ps->p - b);
  char *tmp = malloc(n + 1); /* src is not NUL-terminated; strtod needs a terminated copy */
  if (!tmp) return fail(ps, "out of memory");
  memcpy(tmp, b, n);
  tmp[n] = 0;
  v->number = strtod(tmp, NULL);
  free(tmp);
  if (isinf(v->number)) { /* 1e400: an error, not a silent infinity */
    ps->p = b;
    return fail(ps, "number %.*s is out of the range of a double", (int)(n < 40 ? n : 40), b);
  }
  return true;
}

static bool parse_value(parser *ps, kg_json *v, int depth);

typedef struct {
  const char *key;
  size_t len;
  size_t at; /* byte offset of the key in the source */
} keyref;
static int keyref_cmp(const void *a, const void *b) {
  const keyref *x = a, *y = b;
  size_t n = x->len < y->len ? x->len : y->len;
  int c = memcmp(x->key, y->key, n);
  if (c) return c;
  if (x->len != y->len) return (x->len > y->len) - (x->len < y->len);
  return (x->at > y->at) - (x->at < y->at); /* equal keys in source order: report the later one */
}

/* Room for one more item (and key, and key offset at[]) in v. */
static bool grow(parser *ps, kg_json *v, int *cap, bool object, size_t **at) {
  if (v->n < *cap) return true;
  int nc = *cap ? *cap * 2 : 4;
  kg_json *items = realloc(v->items, sizeof *items * (size_t)nc);
  if (!items) return fail(ps, "out of memory");
  v->items = items;
  if (object) {
    char **keys = realloc(v->keys, sizeof *keys * (size_t)nc);
    if (!keys) return fail(ps, "out of memory");
    v->keys = keys;
    size_t *kl = realloc(v->key_lens, sizeof *kl * (size_t)nc);
    if (!kl) return fail(ps, "out of memory");
    v->key_lens = kl;
    size_t *na = realloc(*at, sizeof *na * (size_t)nc);
    if (!na) return fail(ps, "out of memory");
    *at = na;
  }
  *cap = nc;
  return true;
}

/* Refuses an object with two equal keys, naming the key at its second occurrence. */
static bool check_duplicates(parser *ps, kg_json *v, const size_t *at) {
  if (v->n < 2) return true;
  keyref *r = malloc(sizeof *r * (size_t)v->n);
  if (!r) return fail(ps, "out of memory");
  for (int i = 0; i < v->n; i++)
    r[i] = (keyref){v->keys[i], v->key_lens[i], at[i]};
  qsort(r, (size_t)v->n, sizeof *r, keyref_cmp);
  for (int i = 1; i < v->n; i++)
    if (r[i - 1].len == r[i].len && !memcmp(r[i - 1].key, r[i].key, r[i].len)) {
      ps->p = ps->start + r[i].at;
      fail(ps, "duplicate key \"%.200s\"", r[i].key);
      free(r);
      return false;
    }
  free(r);
  return true;
}

static bool parse_items(parser *ps, kg_json *v, int depth, bool object, size_t **at);

static bool parse_container(parser *ps, kg_json *v, int depth, bool object) {
  size_t *at = NULL; /* objects: each key's byte offset, for the duplicate-key message */
  bool ok = parse_items(ps, v, depth, object, &at);
  free(at);
  return ok;
}

static bool parse_items(parser *ps, kg_json *v, int depth, bool object, size_t **at) {
  if (depth >= KG_JSON_MAX_DEPTH) return fail(ps, "arrays and objects nested deeper than %d levels", KG_JSON_MAX_DEPTH);
  char close = object ? '}' : ']';
  v->type = object ? KG_JSON_OBJECT : KG_JSON_ARRAY;
  int cap = 0;
  ps->p++;
  skip_ws(ps);
  if (ps->p < ps->end && *ps->p == close) {
    ps->p++;
    return true;
  }
  for (;;) {
    if (!grow(ps, v, &cap, object, at)) return false;
    kg_json *item = &v->items[v->n];
    memset(item, 0, sizeof *item);
    if (object) {
      skip_ws(ps);
      if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a string key");
      (*at)[v->n] = (size_t)(ps->p - ps->start);
      ps->p++;
      char *key;
      size_t klen;
      if (!parse_string(ps, &key, &klen)) return false;
      v->keys[v->n] = key;
      v->key_lens[v->n] = klen;
      v->n++; /* counted now so kg_json_free releases the key on any later failure */
      skip_ws(ps);
      if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "expected ':' after a key");
      ps->p++;
    } else
      v->n++;
    if (!parse_value(ps, item, depth + 1)) return false;
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "unterminated %s", object ? "object" : "array");
    if (*ps->p == ',') {
      ps->p++;
      continue;
    }
    if (*ps->p == close) {
      ps->p++;
      return object ? check_duplicates(ps, v, *at) : true;
    }
    return fail(ps, "expected ',' or '%c'", close);
  }
}

static bool literal(parser *ps, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) return fail(ps, "unexpected character");
  ps->p += n;
  return true;
}

static bool parse_value(parser *ps, kg_json *v, int depth) {
  skip_ws(ps);
  if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
  switch (*ps->p) {
  case '{': return parse_container(ps, v, depth, true);
  case '[': return parse_container(ps, v, depth, false);
  case '"':
    ps->p++;
    v->type = KG_JSON_STRING;
    return parse_string(ps, &v->str, &v->len);
  case 't': v->type = KG_JSON_BOOL, v->boolean = true; return literal(ps, "true");
  case 'f': v->type = KG_JSON_BOOL; return literal(ps, "false");
  case 'n': v->type = KG_JSON_NULL; return literal(ps, "null");
  default:
    if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9') ||
        ((ps->flags & KG_JSON_NONFINITE) && (*ps->p == 'N' || *ps->p == 'I')))
      return parse_number(ps, v);
    unsigned char c = (unsigned char)*ps->p;
    return c >= 0x20 && c < 0x7f ? fail(ps, "unexpected character '%c'", c) : fail(ps, "unexpected byte 0x%02x", c);
  }
}

static void free_inner(kg_json *v) {
  free(v->str);
  for (int i = 0; i < v->n; i++) {
    free_inner(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->key_lens);
}

void kg_json_free(kg_json *v) {
  if (!v) return;
  free_inner(v);
  free(v);
}

kg_json *kg_json_parse(const char *src, size_t len, char *err, size_t errlen) {
  return kg_json_parse_ex(src, len, 0, err, errlen);
}

kg_json *kg_json_parse_ex(const char *src, size_t len, unsigned flags, char *err, size_t errlen) {
  parser ps = {src, src, src + len, err, errlen, flags, false};
  kg_json *v = calloc(1, sizeof *v);
  if (!v) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  if (parse_value(&ps, v, 0)) {
    skip_ws(&ps);
    if (ps.p != ps.end) fail(&ps, "trailing characters after the value");
  }
  if (ps.failed) {
    kg_json_free(v);
    return NULL;
  }
  return v;
}

const kg_json *kg_json_get(const kg_json *obj, const char *key) {
  if (!obj || obj->type != KG_JSON_OBJECT) return NULL;
  size_t n = strlen(key);
  for (int i = 0; i < obj->n; i++)
    if (obj->key_lens[i] == n && !memcmp(obj->keys[i], key, n)) return &obj->items[i];
  return NULL;
}

const char *kg_json_type_name(kg_json_type t) {
  static const char *names[] = {"null", "boolean", "number", "string", "array", "object"};
  return (unsigned)t < 6 ? names[t] : "?";
}

/* ---- writer --------------------------------------------------------------------------------- */

void kg_jb_raw(kg_json_buf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->len + n + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->len + n + 1)
      nc *= 2;
    char *d = realloc(b->data, nc);
    if (!d) {
      b->failed = true;
      return;
    }
    b->data = d;
    b->cap = nc;
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = 0;
}

void kg_jb_puts(kg_json_buf *b, const char *s) { kg_jb_raw(b, s, strlen(s)); }

void kg_jb_string(kg_json_buf *b, const char *s, size_t n) {
  kg_jb_raw(b, "\"", 1);
  size_t run = 0; /* bytes copied verbatim in one go */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    kg_jb_raw(b, s + run, i - run);
    run = i + 1;
    char esc[8];
    switch (c) {
    case '"': kg_jb_raw(b, "\\\"", 2); break;
    case '\\': kg_jb_raw(b, "\\\\", 2); break;
    case '\n': kg_jb_raw(b, "\\n", 2); break;
    case '\r': kg_jb_raw(b, "\\r", 2); break;
    case '\t': kg_jb_raw(b, "\\t", 2); break;
    default: snprintf(esc, sizeof esc, "\\u%04x", c); kg_jb_raw(b, esc, 6);
    }
  }
  kg_jb_raw(b, s + run, n - run);
  kg_jb_raw(b, "\"", 1);
}

void kg_jb_uint(kg_json_buf *b, uint64_t v) {
  char tmp[24];
  int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
  kg_jb_raw(b, tmp, (size_t)n);
}

void kg_jb_free(kg_json_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}
