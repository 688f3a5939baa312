/* tokenizer_json_regex.c — the regex subset that tokenizer.json's Split pre-tokenizer and
 * Replace normalizer / decoder patterns use (the reference runs them with Oniguruma, Ruby
 * syntax, UTF-8). A backtracking matcher over a parsed tree, enough for the GPT-2, Llama 3,
 * Qwen 2, CLIP, o200k and DeepSeek patterns:
 *   alternation, groups (...) (?:...) (?<name>...), atomic (?>...), lookahead (?=...) (?!...),
 *   scoped flags (?i:...) (?i) (case-insensitive by simple case folding), quantifiers ? * + {n}
 *   {n,} {n,m} with lazy (?) and possessive (+) forms, classes [...] with ranges and negation,
 *   . (not \n), ^ $ (line anchors, as Ruby), \A \z \Z, escapes \s \S \d \D \w \W \h \H (hex digit)
 *   \p{..} \P{..} \p{^..} (general categories and their one-letter groups, Any, Alnum, Alpha,
 *   Space, Digit, Word), \t \n \r \f \v \e \a \0 \xHH \x{H..} \uHHHH and escaped punctuation.
 * Anything else (lookbehind, backreferences, \b, POSIX brackets, class intersection, ...) is
 * refused naming it. Onig's classes over Unicode: \s White_Space, \d Nd, \w Alphabetic, marks, Nd, Pc
 * (as the reference behaves: U+2460 and ZWJ are no word characters, U+1F130 is, and ½ is one for a
 * bare \w but not inside a class).
 * A single-character item under a quantifier is matched in a loop (no recursion per
 * character); the whole search has a step budget, so no pattern can run away. */
#include "tokenizer_json_internal.h"

#include "unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { R_SET, R_SEQ, R_ALT, R_REPEAT, R_GROUP, R_ATOMIC, R_LOOK, R_BOL, R_EOL, R_BOS, R_EOS, R_EOS_NL };
/* class items */
enum { I_RANGE, I_CAT, I_SPACE, I_WORD, I_WORD_IN_CLASS, I_ANY_NOT_NL, I_HEX };

typedef struct {
  int kind;
  bool neg;
  uint32_t lo, hi;  /* I_RANGE */
  uint32_t catmask; /* I_CAT: a bit per KG_GC_* */
} item;

typedef struct node {
  int kind;
  struct node *kids; /* SEQ, ALT: kids[0..n); REPEAT, GROUP, ATOMIC, LOOK: kids[0] */
  int n;
  /* SET */
  item *items;
  int nitems;
  bool neg, icase;
  /* REPEAT */
  int min, max; /* max -1: unbounded */
  int mode;     /* 0 greedy, 1 lazy, 2 possessive */
  /* LOOK */
  bool look_neg;
} node;

struct tj_regex {
  node root;
};

/* ---- parsing ------------------------------------------------------------------------------ */

typedef struct {
  const char *p;
  size_t n, i;
  const char *where;
  char err[200];
  int depth;
} parser;

static bool perr(parser *ps, const char *msg) {
  if (!ps->err[0]) snprintf(ps->err, sizeof ps->err, "%s at pattern byte %zu", msg, ps->i + 1);
  return false;
}

static void node_free(node *nd) {
  if (!nd) return;
  for (int k = 0; k < nd->n; k++)
    node_free(&nd->kids[k]);
  free(nd->kids);
  free(nd->items);
}

static node *add_kid(node *parent) {
  node *k = realloc(parent->kids, (size_t)(parent->n + 1) * sizeof *k);
  if (!k) return NULL;
  parent->kids = k;
  memset(&k[parent->n], 0, sizeof *k);
  return &k[parent->n++];
}

static bool add_item(node *s, item it) {
  item *v = realloc(s->items, (size_t)(s->nitems + 1) * sizeof *v);
  if (!v) return false;
  s->items = v;
  v[s->nitems++] = it;
  return true;
}

#define GC(x) (1u << KG_GC_##x)
static const uint32_t M_L = GC(LU) | GC(LL) | GC(LT) | GC(LM) | GC(LO);
static const uint32_t M_M = GC(MN) | GC(MC) | GC(ME);
static const uint32_t M_N = GC(ND) | GC(NL) | GC(NO);
static const uint32_t M_P = GC(PC) | GC(PD) | GC(PS) | GC(PE) | GC(PI) | GC(PF) | GC(PO);
static const uint32_t M_S = GC(SM) | GC(SC) | GC(SK) | GC(SO);
static const uint32_t M_Z = GC(ZS) | GC(ZL) | GC(ZP);
static const uint32_t M_C = GC(CC) | GC(CF) | GC(CS) | GC(CO) | GC(CN);

/* \p{name}: the category mask, 0 when unknown */
static uint32_t prop_mask(const char *s, size_t n) {
  static const char *names[] = {"Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd",
                                "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm",
                                "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"};
  char b[32];
  if (n == 0 || n >= sizeof b) return 0;
  memcpy(b, s, n);
  b[n] = 0;
  for (int k = 0; k < 30; k++)
    if (!strcmp(b, names[k])) return 1u << k;
  struct {
    const char *name;
    uint32_t m;
  } groups[] = {{"L", M_L},
                {"Letter", M_L},
                {"M", M_M},
                {"Mark", M_M},
                {"N", M_N},
                {"Number", M_N},
                {"P", M_P},
                {"Punctuation", M_P},
                {"S", M_S},
                {"Symbol", M_S},
                {"Z", M_Z},
                {"Separator", M_Z},
                {"C", M_C},
                {"Other", M_C},
                {"Any", 0x3FFFFFFFu},
                {"Alnum", M_L | M_N},
                {"Alpha", M_L},
                {"Digit", GC(ND)},
                {"Lower", GC(LL)},
                {"Upper", GC(LU)},
                {"Punct", M_P},
                {"L&", GC(LU) | GC(LL) | GC(LT)},
                {"LC", GC(LU) | GC(LL) | GC(LT)}};
  for (size_t k = 0; k < sizeof groups / sizeof groups[0]; k++)
    if (!strcmp(b, groups[k].name)) return groups[k].m;
  return 0;
}

static bool at_end(parser *ps) { return ps->i >= ps->n; }

static uint32_t next_cp(parser *ps) { return tj_next(ps->p, ps->n, &ps->i); }

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if ((c | 32) >= 'a' && (c | 32) <= 'f') return (c | 32) - 'a' + 10;
  return -1;
}

/* hex digits: exactly `count` of them, or in braces when count is 0 */
static bool parse_hex(parser *ps, int count, uint32_t *out) {
  uint32_t v = 0;
  int got = 0;
  bool brace = count == 0 && !at_end(ps) && ps->p[ps->i] == '{';
  if (brace) ps->i++;
  while (!at_end(ps) && (brace ? got < 8 : got < count) && hexval(ps->p[ps->i]) >= 0) {
    v = v * 16 + (uint32_t)hexval(ps->p[ps->i++]);
    got++;
  }
  if (brace) {
    if (at_end(ps) || ps->p[ps->i] != '}' || !got) return perr(ps, "bad \\x{...} escape");
    ps->i++;
  } else if (got != count) {
    return perr(ps, "bad hex escape");
  }
  if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return perr(ps, "escape outside Unicode");
  *out = v;
  return true;
}

/* An escape after the backslash (ps->i past it). Either a class item (*is_item) or a code point.
 * in_class: inside [...]. Anchors are handled by the caller. */
static bool parse_escape(parser *ps, bool in_class, bool *is_item, item *it, uint32_t *cp) {
  if (at_end(ps)) return perr(ps, "trailing backslash");
  char c = ps->p[ps->i];
  *is_item = false;
  memset(it, 0, sizeof *it);
  switch (c) {
  case 's':
  case 'S':
    ps->i++;
    *is_item = true;
    it->kind = I_SPACE;
    it->neg = c == 'S';
    return true;
  case 'h':
  case 'H':
    ps->i++;
    *is_item = true;
    it->kind = I_HEX;
    it->neg = c == 'H';
    return true;
  case 'w':
  case 'W':
    ps->i++;
    *is_item = true;
    it->kind = in_class ? I_WORD_IN_CLASS : I_WORD;
    it->neg = c == 'W';
    return true;
  case 'd':
  case 'D':
    ps->i++;
    *is_item = true;
    it->kind = I_CAT;
    it->catmask = GC(ND);
    it->neg = c == 'D';
    return true;
  case 'p':
  case 'P': {
    ps->i++;
    if (at_end(ps) || ps->p[ps->i] != '{') return perr(ps, "\\p without {...}");
    ps->i++;
    bool neg = c == 'P';
    if (!at_end(ps) && ps->p[ps->i] == '^') neg = !neg, ps->i++;
    size_t s = ps->i;
    while (!at_end(ps) && ps->p[ps->i] != '}')
      ps->i++;
    if (at_end(ps)) return perr(ps, "unterminated \\p{");
    uint32_t m = prop_mask(ps->p + s, ps->i - s);
    if (!m) {
      char msg[96];
      snprintf(msg, sizeof msg, "the property \\p{%.*s} is not supported", (int)(ps->i - s < 40 ? ps->i - s : 40),
               ps->p + s);
      ps->i = s;
      return perr(ps, msg);
    }
    ps->i++;
    *is_item = true;
    it->kind = I_CAT;
    it->catmask = m;
    it->neg = neg;
    return true;
  }
  case 't':
    ps->i++;
    *cp = '\t';
    return true;
  case 'n':
    ps->i++;
    *cp = '\n';
    return true;
  case 'r':
    ps->i++;
    *cp = '\r';
    return true;
  case 'f':
    ps->i++;
    *cp = '\f';
    return true;
  case 'v':
    ps->i++;
    *cp = '\v';
    return true;
  case 'a':
    ps->i++;
    *cp = 7;
    return true;
  case 'e':
    ps->i++;
    *cp = 27;
    return true;
  case '0':
    ps->i++;
    *cp = 0;
    return true;
  case 'x':
    ps->i++;
    return parse_hex(ps, at_end(ps) || ps->p[ps->i] != '{' ? 2 : 0, cp);
  case 'u':
    ps->i++;
    return parse_hex(ps, 4, cp);
  default:
    break;
  }
  if ((unsigned char)c < 0x80 && !((c | 32) >= 'a' && (c | 32) <= 'z') && !(c >= '0' && c <= '9')) {
    ps->i++; /* escaped punctuation or space: itself */
    *cp = (uint32_t)c;
    return true;
  }
  char msg[64];
  snprintf(msg, sizeof msg, "the escape \\%c is not supported", c);
  return perr(ps, msg);
}

static bool parse_class(parser *ps, node *set) {
  /* ps->i is past '[' */
  set->kind = R_SET;
  if (!at_end(ps) && ps->p[ps->i] == '^') set->neg = true, ps->i++;
  bool first = true;
  for (;;) {
    if (at_end(ps)) return perr(ps, "unterminated [");
    char c = ps->p[ps->i];
    if (c == ']' && !first) {
      ps->i++;
      return true;
    }
    first = false;
    if (c == '[') return perr(ps, "nested classes and [:posix:] brackets are not supported");
    if (c == '&' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == '&')
      return perr(ps, "class intersection && is not supported");
    uint32_t lo;
    item it;
    if (c == '\\') {
      ps->i++;
      bool is_item;
      if (!parse_escape(ps, true, &is_item, &it, &lo)) return false;
      if (is_item) {
        if (!add_item(set, it)) return perr(ps, "out of memory");
        continue;
      }
    } else {
      lo = next_cp(ps);
    }
    uint32_t hi = lo;
    if (ps->i + 1 < ps->n && ps->p[ps->i] == '-' && ps->p[ps->i + 1] != ']') {
      ps->i++;
      if (ps->p[ps->i] == '\\') {
        ps->i++;
        bool is_item;
        if (!parse_escape(ps, true, &is_item, &it, &hi)) return false;
        if (is_item) return perr(ps, "a class escape cannot end a range");
      } else {
        hi = next_cp(ps);
      }
      if (hi < lo) return perr(ps, "empty range in class");
    }
    memset(&it, 0, sizeof it);
    it.kind = I_RANGE;
    it.lo = lo;
    it.hi = hi;
    if (!add_item(set, it)) return perr(ps, "out of memory");
  }
}

static bool parse_alt(parser *ps, node *out, bool icase);
/* parse_seq's (?i) without a colon changes *icase for the rest of the enclosing group */

/* {n}, {n,}, {n,m}: true and the bounds when ps->p[i..] is one; otherwise ps->i is unchanged */
static bool parse_braces(parser *ps, int *mn, int *mx) {
  size_t i = ps->i + 1;
  long a = -1, b = -1;
  bool comma = false;
  while (i < ps->n && ps->p[i] >= '0' && ps->p[i] <= '9' && a < 100000)
    a = (a < 0 ? 0 : a * 10) + (ps->p[i++] - '0');
  if (i < ps->n && ps->p[i] == ',') {
    comma = true;
    i++;
    while (i < ps->n && ps->p[i] >= '0' && ps->p[i] <= '9' && b < 100000)
      b = (b < 0 ? 0 : b * 10) + (ps->p[i++] - '0');
  }
  if (i >= ps->n || ps->p[i] != '}' || (a < 0 && (!comma || b < 0))) return false;
  if (a < 0) a = 0;
  if (a > 1000 || b > 1000) return false;
  *mn = (int)a;
  *mx = comma ? (int)b : (int)a;
  if (*mx >= 0 && *mx < *mn) return false;
  ps->i = i + 1;
  return true;
}

static bool parse_seq(parser *ps, node *seq, bool *icase_p) {
  bool icase = *icase_p;
  seq->kind = R_SEQ;
  while (!at_end(ps)) {
    char c = ps->p[ps->i];
    if (c == '|' || c == ')') return true;
    node *a = add_kid(seq);
    if (!a) return perr(ps, "out of memory");
    if (c == '(') {
      ps->i++;
      if (++ps->depth > 100) return perr(ps, "groups nested too deep");
      bool sub_icase = icase;
      a->kind = R_GROUP;
      if (!at_end(ps) && ps->p[ps->i] == '?') {
        ps->i++;
        char d = at_end(ps) ? 0 : ps->p[ps->i];
        if (d == ':')
          ps->i++;
        else if (d == '>')
          ps->i++, a->kind = R_ATOMIC;
        else if (d == '=' || d == '!')
          ps->i++, a->kind = R_LOOK, a->look_neg = d == '!';
        else if (d == '<' && ps->i + 1 < ps->n && (ps->p[ps->i + 1] == '=' || ps->p[ps->i + 1] == '!'))
          return perr(ps, "lookbehind (?<= (?<! is not supported");
        else if (d == '<') { /* named group: a plain group */
          while (!at_end(ps) && ps->p[ps->i] != '>')
            ps->i++;
          if (at_end(ps)) return perr(ps, "unterminated group name");
          ps->i++;
        } else if (d == 'i' || d == '-') {
          bool on = true;
          while (!at_end(ps) && (ps->p[ps->i] == 'i' || ps->p[ps->i] == '-')) {
            if (ps->p[ps->i] == '-')
              on = false;
            else
              sub_icase = on;
            ps->i++;
          }
          if (at_end(ps)) return perr(ps, "unterminated group");
          if (ps->p[ps->i] == ')') { /* (?i): the rest of the enclosing group */
            ps->i++;
            seq->n--;
            ps->depth--;
            icase = *icase_p = sub_icase;
            continue;
          }
          if (ps->p[ps->i] != ':') return perr(ps, "only the i flag is supported in (?flags)");
          ps->i++;
        } else {
          return perr(ps, "this (? group is not supported (flags other than i, conditionals, comments)");
        }
      }
      node *inner = add_kid(a);
      if (!inner) return perr(ps, "out of memory");
      if (!parse_alt(ps, inner, sub_icase)) return false;
      if (at_end(ps) || ps->p[ps->i] != ')') return perr(ps, "missing )");
      ps->i++;
      ps->depth--;
    } else if (c == '[') {
      ps->i++;
      if (!parse_class(ps, a)) return false;
      a->icase = icase;
    } else if (c == '.') {
      ps->i++;
      a->kind = R_SET;
      item it = {I_ANY_NOT_NL, false, 0, 0, 0};
      if (!add_item(a, it)) return perr(ps, "out of memory");
    } else if (c == '^' || c == '$') {
      ps->i++;
      a->kind = c == '^' ? R_BOL : R_EOL;
    } else if (c == '*' || c == '+' || c == '?') {
      return perr(ps, "a quantifier with nothing to repeat");
    } else if (c == '\\') {
      ps->i++;
      char d = at_end(ps) ? 0 : ps->p[ps->i];
      if (d == 'A' || d == 'z' || d == 'Z') {
        ps->i++;
        a->kind = d == 'A' ? R_BOS : d == 'z' ? R_EOS : R_EOS_NL;
      } else if (d == 'b' || d == 'B' || d == 'G' || d == 'K' || d == 'R' || d == 'X' || d == 'k' || d == 'g' ||
                 (d >= '1' && d <= '9')) {
        char msg[80];
        snprintf(msg, sizeof msg, "the escape \\%c (anchors, backreferences, \\R \\X \\K) is not supported", d);
        return perr(ps, msg);
      } else {
        bool is_item;
        item it;
        uint32_t cp;
        if (!parse_escape(ps, false, &is_item, &it, &cp)) return false;
        a->kind = R_SET;
        a->icase = icase;
        if (!is_item) memset(&it, 0, sizeof it), it.kind = I_RANGE, it.lo = it.hi = cp;
        if (!add_item(a, it)) return perr(ps, "out of memory");
      }
    } else {
      uint32_t cp = next_cp(ps);
      a->kind = R_SET;
      a->icase = icase;
      item it = {I_RANGE, false, cp, cp, 0};
      if (!add_item(a, it)) return perr(ps, "out of memory");
    }
    /* quantifiers */
    while (!at_end(ps)) {
      char q = ps->p[ps->i];
      int mn, mx;
      if (q == '*')
        mn = 0, mx = -1, ps->i++;
      else if (q == '+')
        mn = 1, mx = -1, ps->i++;
      else if (q == '?')
        mn = 0, mx = 1, ps->i++;
      else if (q == '{' && parse_braces(ps, &mn, &mx)) {
      } else
        break;
      if (a->kind == R_BOL || a->kind == R_EOL || a->kind == R_BOS || a->kind == R_EOS || a->kind == R_EOS_NL ||
          a->kind == R_LOOK)
        return perr(ps, "a quantifier after an anchor or lookahead is not supported");
      node child = *a;
      memset(a, 0, sizeof *a);
      a->kind = R_REPEAT;
      a->min = mn;
      a->max = mx;
      a->kids = malloc(sizeof *a->kids);
      if (!a->kids) {
        node_free(&child);
        return perr(ps, "out of memory");
      }
      a->kids[0] = child;
      a->n = 1;
      if (!at_end(ps) && ps->p[ps->i] == '?')
        a->mode = 1, ps->i++;
      else if (!at_end(ps) && ps->p[ps->i] == '+')
        a->mode = 2, ps->i++;
    }
  }
  return true;
}

static bool parse_alt(parser *ps, node *out, bool icase) {
  out->kind = R_ALT;
  for (;;) {
    node *s = add_kid(out);
    if (!s) return perr(ps, "out of memory");
    if (!parse_seq(ps, s, &icase)) return false;
    if (at_end(ps) || ps->p[ps->i] != '|') return true;
    ps->i++;
  }
}

kg_status tj_regex_compile(tj_regex **out, const char *pat, size_t n, const char *where) {
  *out = NULL;
  if (!kg_utf8_valid(pat, n)) return kg_error(KG_ERR_VALUE, TJ_OP, "%s: the regex is not UTF-8", where);
  tj_regex *re = calloc(1, sizeof *re);
  if (!re) return kg_error(KG_ERR_OOM, TJ_OP, "out of memory");
  parser ps = {pat, n, 0, where, {0}, 0};
  bool ok = parse_alt(&ps, &re->root, false);
  if (ok && !at_end(&ps)) ok = perr(&ps, "unbalanced )");
  if (!ok) {
    tj_regex_free(re);
    return kg_error(KG_ERR_VALUE, TJ_OP, "%s: regex '%.*s': %s", where, (int)(n < 120 ? n : 120), pat, ps.err);
  }
  *out = re;
  return KG_OK;
}

void tj_regex_free(tj_regex *re) {
  if (!re) return;
  node_free(&re->root);
  free(re);
}

/* ---- matching ----------------------------------------------------------------------------- */

typedef struct cont {
  const node *nd; /* NULL: accept (record the end) */
  int i;          /* SEQ: the next kid; REPEAT: iterations done */
  size_t start;   /* REPEAT: where this iteration began */
  const struct cont *next;
} cont;

typedef struct {
  const char *s;
  size_t n;
  size_t end;
  long steps;
  int depth;
} ctx;

#define STEP_BUDGET 20000000L
#define MAX_DEPTH 4000 /* frames: a group repeated more often than this fails rather than exhausting the stack */

/* Oniguruma's \w: Rust's \w without Join_Control; a bare \w or \W (not inside [...]) also
 * counts the Latin-1 No characters ² ³ ¹ ¼ ½ ¾ as word characters (its Latin-1 table; measured
 * against the reference) */
static bool onig_word(uint32_t cp, bool bare) {
  if (bare && (cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || (cp >= 0xBC && cp <= 0xBE))) return true;
  return cp != 0x200C && cp != 0x200D && tj_word_char(cp);
}

static bool item_has(const item *it, uint32_t cp) {
  bool r;
  switch (it->kind) {
  case I_RANGE:
    r = cp >= it->lo && cp <= it->hi;
    break;
  case I_CAT:
    r = (it->catmask >> kg_unicode_gc(cp)) & 1;
    break;
  case I_SPACE:
    r = kg_unicode_is_space(cp);
    break;
  case I_HEX:
    r = cp < 0x80 && hexval((char)cp) >= 0;
    break;
  case I_WORD:
    r = onig_word(cp, true);
    break;
  case I_WORD_IN_CLASS:
    r = onig_word(cp, false);
    break;
  default:
    r = cp != '\n';
    break; /* I_ANY_NOT_NL */
  }
  return r != it->neg;
}

static bool set_has(const node *nd, uint32_t cp) {
  bool in = false;
  for (int k = 0; k < nd->nitems && !in; k++)
    in = item_has(&nd->items[k], cp);
  if (!in && nd->icase) {
    uint32_t f = kg_unicode_fold(cp);
    for (int k = 0; k < nd->nitems && !in; k++) {
      const item *it = &nd->items[k];
      if (it->kind == I_RANGE && it->lo == it->hi)
        in = kg_unicode_fold(it->lo) == f;
      else if (f != cp)
        in = item_has(it, f);
    }
  }
  return in != nd->neg;
}

/* the code point at s[*i] (well-formed UTF-8), advancing *i */
static uint32_t at(const ctx *c, size_t *i) { return tj_next(c->s, c->n, i); }

static size_t prev_boundary(const ctx *c, size_t i) {
  do
    i--;
  while (i > 0 && ((uint8_t)c->s[i] & 0xC0) == 0x80);
  return i;
}

static int m(ctx *c, const node *nd, size_t pos, const cont *k);

static int resume(ctx *c, const cont *k, size_t pos) {
  if (!k) return 1;
  if (!k->nd) {
    c->end = pos;
    return 1;
  }
  const node *nd = k->nd;
  if (nd->kind == R_SEQ) {
    if (k->i >= nd->n) return resume(c, k->next, pos);
    cont nk = {nd, k->i + 1, 0, k->next};
    return m(c, &nd->kids[k->i], pos, &nk);
  }
  /* R_REPEAT: one more iteration done */
  int done = k->i;
  if (pos == k->start) return done >= nd->min ? resume(c, k->next, pos) : 0; /* empty iteration: stop */
  if (nd->max >= 0 && done >= nd->max) return resume(c, k->next, pos);
  cont nk = {nd, done + 1, pos, k->next};
  if (nd->mode == 1) { /* lazy */
    if (done >= nd->min) {
      int r = resume(c, k->next, pos);
      if (r) return r;
    }
    return m(c, &nd->kids[0], pos, &nk);
  }
  int r = m(c, &nd->kids[0], pos, &nk);
  if (r) return r;
  return done >= nd->min ? resume(c, k->next, pos) : 0;
}

/* the end of the first match of nd at pos on its own (atomic), or -1 none, -2 error */
static long sub_match(ctx *c, const node *nd, size_t pos) {
  cont accept = {NULL, 0, 0, NULL};
  size_t saved = c->end;
  int r = m(c, nd, pos, &accept);
  long e = r == 1 ? (long)c->end : r == 0 ? -1 : -2;
  c->end = saved;
  return e;
}

static int m(ctx *c, const node *nd, size_t pos, const cont *k) {
  if (++c->steps > STEP_BUDGET || c->depth > MAX_DEPTH) return -1;
  c->depth++;
  int r = 0;
  switch (nd->kind) {
  case R_SET:
    if (pos < c->n) {
      size_t i = pos;
      uint32_t cp = at(c, &i);
      if (set_has(nd, cp)) r = resume(c, k, i);
    }
    break;
  case R_SEQ: {
    cont nk = {nd, 0, 0, k};
    r = resume(c, &nk, pos);
    break;
  }
  case R_ALT:
    for (int j = 0; j < nd->n && !r; j++)
      r = m(c, &nd->kids[j], pos, k);
    break;
  case R_GROUP:
    r = m(c, &nd->kids[0], pos, k);
    break;
  case R_ATOMIC: {
    long e = sub_match(c, &nd->kids[0], pos);
    r = e == -2 ? -1 : e < 0 ? 0 : resume(c, k, (size_t)e);
    break;
  }
  case R_LOOK: {
    long e = sub_match(c, &nd->kids[0], pos);
    if (e == -2)
      r = -1;
    else if ((e >= 0) != nd->look_neg)
      r = resume(c, k, pos);
    break;
  }
  case R_BOL:
    if (pos == 0 || c->s[pos - 1] == '\n') r = resume(c, k, pos);
    break;
  case R_EOL:
    if (pos == c->n || c->s[pos] == '\n') r = resume(c, k, pos);
    break;
  case R_BOS:
    if (pos == 0) r = resume(c, k, pos);
    break;
  case R_EOS:
    if (pos == c->n) r = resume(c, k, pos);
    break;
  case R_EOS_NL:
    if (pos == c->n || (pos + 1 == c->n && c->s[pos] == '\n')) r = resume(c, k, pos);
    break;
  case R_REPEAT: {
    const node *ch = &nd->kids[0];
    if (ch->kind == R_SET) { /* one character per iteration: a loop, then back off */
      size_t i = pos, count = 0, lim = nd->max < 0 ? SIZE_MAX : (size_t)nd->max;
      if (nd->mode == 1) { /* lazy: shortest first */
        for (;;) {
          if (count >= (size_t)nd->min) {
            r = resume(c, k, i);
            if (r) break;
          }
          if (count >= lim || i >= c->n) break;
          size_t j = i;
          if (!set_has(ch, at(c, &j))) break;
          i = j;
          count++;
          if (++c->steps > STEP_BUDGET) {
            r = -1;
            break;
          }
        }
        break;
      }
      while (count < lim && i < c->n) {
        size_t j = i;
        if (!set_has(ch, at(c, &j))) break;
        i = j;
        count++;
      }
      c->steps += (long)count;
      if (count < (size_t)nd->min) break;
      if (nd->mode == 2) {
        r = resume(c, k, i);
        break;
      }
      for (;;) {
        r = resume(c, k, i);
        if (r || count == (size_t)nd->min) break;
        i = prev_boundary(c, i);
        count--;
        if (++c->steps > STEP_BUDGET) {
          r = -1;
          break;
        }
      }
      break;
    }
    if (nd->mode == 2) { /* possessive: each iteration atomic, no giving back */
      size_t i = pos;
      int count = 0;
      while (nd->max < 0 || count < nd->max) {
        long e = sub_match(c, ch, i);
        if (e == -2) {
          r = -1;
          break;
        }
        if (e < 0 || (size_t)e == i) break;
        i = (size_t)e;
        count++;
      }
      if (r == 0 && count >= nd->min) r = resume(c, k, i);
      break;
    }
    if (nd->max == 0)
      r = resume(c, k, pos);
    else if (nd->mode == 1 && nd->min == 0) {
      r = resume(c, k, pos);
      if (!r) {
        cont nk = {nd, 1, pos, k};
        r = m(c, ch, pos, &nk);
      }
    } else {
      cont nk = {nd, 1, pos, k};
      r = m(c, ch, pos, &nk);
      if (!r && nd->min == 0 && nd->mode == 0) r = resume(c, k, pos);
    }
    break;
  }
  }
  c->depth--;
  return r;
}

int tj_regex_search(const tj_regex *re, const char *s, size_t n, size_t from, size_t *ms, size_t *me) {
  ctx c = {s, n, 0, 0, 0};
  for (size_t pos = from; pos <= n;) {
    int r = m(&c, &re->root, pos, &(cont){NULL, 0, 0, NULL});
    if (r < 0) {
      kg_error(KG_ERR_VALUE, TJ_OP, "regex: the match ran out of its step budget (%ld steps) at text byte %zu",
               STEP_BUDGET, pos + 1);
      return -1;
    }
    if (r) {
      *ms = pos;
      *me = c.end;
      return 1;
    }
    if (pos == n) break;
    tj_next(s, n, &pos);
  }
  return 0;
}

/* ---- patterns ------------------------------------------------------------------------------ */

kg_status tj_pattern_matches(const tj_pattern *p, const char *s, size_t n, size_t **spans, size_t *count) {
  size_t cap = 16, k = 0;
  size_t *v = malloc(cap * 2 * sizeof *v);
  if (!v) return kg_error(KG_ERR_OOM, TJ_OP, "out of memory");
  size_t from = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (from <= n) {
    size_t a, b;
    if (p->re) {
      int r = tj_regex_search(p->re, s, n, from, &a, &b);
      if (r < 0) {
        free(v);
        return KG_ERR_VALUE;
      }
      if (!r) break;
    } else {
      if (p->len == 0) break;
      const char *f = NULL;
      for (size_t i = from; i + p->len <= n; i++)
        if (!memcmp(s + i, p->str, p->len)) {
          f = s + i;
          break;
        }
      if (!f) break;
      a = (size_t)(f - s);
      b = a + p->len;
    }
    if (a == b && have_last && last_end == b) { /* no empty match right after a match */
      if (from >= n) break;
      tj_next(s, n, &from);
      continue;
    }
    if (k == cap) {
      size_t *nv = realloc(v, cap * 4 * sizeof *v);
      if (!nv) {
        free(v);
        return kg_error(KG_ERR_OOM, TJ_OP, "out of memory");
      }
      v = nv;
      cap *= 2;
    }
    v[2 * k] = a;
    v[2 * k + 1] = b;
    k++;
    have_last = true;
    last_end = b;
    from = b;
  }
  *spans = v;
  *count = k;
  return KG_OK;
}

void tj_pattern_free(tj_pattern *p) {
  free(p->str);
  tj_regex_free(p->re);
  p->str = NULL;
  p->re = NULL;
}
