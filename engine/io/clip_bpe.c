/* clip_bpe.c — the CLIP tokenizer (keng/clip_bpe.h). Reference: Hugging Face transformers'
 * CLIPTokenizer (a tokenizers pipeline) over CLIP's vocab.json / merges.txt:
 *   0. an exact "<|startoftext|>" / "<|endoftext|>" in the raw text is its id (added tokens)
 *   1. normalize each stretch between them: NFC, every \s+ run -> " ", lowercase (per character,
 *      full mappings, no final-sigma rule: what Rust's char::to_lowercase gives)
 *   2. split with <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|
 *      [^\s\p{L}\p{N}]+ keeping the matches; the byte-level pre-tokenizer's GPT-2 regex then splits
 *      a (lower-cased, so no longer special) "<|endoftext|>" into "<|", "endoftext", "|>"
 *   3. each word: UTF-8 bytes -> byte-to-unicode symbols, "</w>" glued to the last one; a symbol
 *      missing from the vocabulary is the unknown token <|endoftext|>
 *   4. BPE: merge the adjacent pair of lowest merges.txt rank (leftmost first) until none is left
 * Decoding maps symbols back to bytes, replaces invalid UTF-8 by U+FFFD (maximal subparts, as
 * Rust's from_utf8_lossy), turns each "</w>" into a space and strips the ends.
 * The Unicode facts (classes, lowercase, NFC) come from unicode.c. */
#include <keng/clip_bpe.h>

#include "json.h"
#include "unicode.h"
#include "vocab.h"

#include <stdlib.h>
#include <string.h>

#define OP "clip_tokenizer"

struct kg_clip_bpe {
  kg_vocab vocab;        /* vocab.json: ids 0..n-1 */
  uint64_t *mkeys;       /* merge hash table: (a << 32 | b), UINT64_MAX = empty */
  int32_t *mrank, *mout; /* rank and merged id per slot */
  size_t mslots;
  int32_t sym[256], sym_end[256]; /* byte -> id of its symbol / of symbol + "</w>", -1 = none */
  uint32_t byte_cp[256];          /* byte -> code point of its symbol */
  int16_t cp_byte[324];           /* the inverse (symbols are all below U+0144) */
  int64_t bos, eos;
};

/* ---- hashing -------------------------------------------------------------------------------- */

int64_t kg_clip_bpe_token_to_id(const kg_clip_bpe *t, const char *s, size_t n) {
  return kg_vocab_find(&t->vocab, s, n);
}

static uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}

/* the rank of merging ids (a, b) and [out] the merged id; -1 when there is no such merge */
static int32_t merge_rank(const kg_clip_bpe *t, int32_t a, int32_t b, int32_t *out) {
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  for (size_t i = mix(key) & (t->mslots - 1);; i = (i + 1) & (t->mslots - 1)) {
    if (t->mkeys[i] == UINT64_MAX) return -1;
    if (t->mkeys[i] == key) {
      *out = t->mout[i];
      return t->mrank[i];
    }
  }
}

int64_t kg_clip_bpe_vocab_size(const kg_clip_bpe *t) { return t->vocab.n; }
int64_t kg_clip_bpe_bos_id(const kg_clip_bpe *t) { return t->bos; }
int64_t kg_clip_bpe_eos_id(const kg_clip_bpe *t) { return t->eos; }

const char *kg_clip_bpe_id_to_token(const kg_clip_bpe *t, int64_t id, size_t *n) {
  if (id < 0 || id >= t->vocab.n) return NULL;
  if (n) *n = t->vocab.lens[id];
  return t->vocab.tokens[id];
}

void kg_clip_bpe_free(kg_clip_bpe *t) {
  if (!t) return;
  kg_vocab_free(&t->vocab);
  free(t->mkeys);
  free(t->mrank);
  free(t->mout);
  free(t);
}

/* ---- loading -------------------------------------------------------------------------------- */

static size_t pow2_above(size_t n) {
  size_t s = 16;
  while (s < 2 * n)
    s *= 2;
  return s;
}

static kg_status load_vocab(kg_clip_bpe *t, const char *path) {
  size_t len;
  kg_status st;
  char *buf = kg_read_file(path, OP, "vocabulary", &len, &st);
  if (!buf) return st;
  char err[256];
  kg_json *j = kg_json_parse(buf, len, err, sizeof err);
  free(buf);
  if (!j) return kg_error(KG_ERR_VALUE, OP, "'%s' is not valid JSON: %s", path, err);
  if (j->type != KG_JSON_OBJECT) {
    st = kg_error(KG_ERR_VALUE, OP, "'%s' must hold an object {token: id}, not a %s", path, kg_json_type_name(j->type));
    kg_json_free(j);
    return st;
  }
  kg_vocab *voc = &t->vocab;
  voc->n = j->n;
  if (!kg_vocab_alloc(voc, j->n)) {
    kg_json_free(j);
    return kg_error(KG_ERR_OOM, OP, "out of memory loading '%s' (%d tokens)", path, j->n);
  }
  for (int k = 0; k < j->n; k++) {
    const kg_json *v = &j->items[k];
    const char *key = j->keys[k];
    size_t kl = j->key_lens[k];
    if (v->type != KG_JSON_NUMBER || !v->is_uint || v->uint >= (uint64_t)j->n) {
      st = kg_error(KG_ERR_VALUE, OP, "'%s': token \"%.40s\" has id %s%.0f; ids must be the integers 0..%d", path, key,
                    v->type == KG_JSON_NUMBER ? "" : "of type ", v->type == KG_JSON_NUMBER ? v->number : 0.0, j->n - 1);
      kg_json_free(j);
      return st;
    }
    int64_t id = (int64_t)v->uint;
    if (voc->tokens[id]) {
      st = kg_error(KG_ERR_VALUE, OP, "'%s': tokens \"%.40s\" and \"%.40s\" share id %lld", path, voc->tokens[id], key,
                    (long long)id);
      kg_json_free(j);
      return st;
    }
    voc->tokens[id] = malloc(kl + 1);
    if (!voc->tokens[id]) {
      kg_json_free(j);
      return kg_error(KG_ERR_OOM, OP, "out of memory loading '%s'", path);
    }
    memcpy(voc->tokens[id], key, kl + 1);
    voc->lens[id] = kl;
  }
  kg_json_free(j); /* keys are unique (the reader refuses duplicates) and ids distinct, so all 0..n-1 are set */
  if (!kg_vocab_index(voc)) return kg_error(KG_ERR_OOM, OP, "out of memory indexing '%s'", path);
  t->bos = kg_clip_bpe_token_to_id(t, "<|startoftext|>", 15);
  t->eos = kg_clip_bpe_token_to_id(t, "<|endoftext|>", 13);
  if (t->bos < 0 || t->eos < 0)
    return kg_error(KG_ERR_VALUE, OP, "'%s' lacks the special token %s", path,
                    t->bos < 0 ? "<|startoftext|>" : "<|endoftext|>");
  /* GPT-2's byte-to-unicode table: printable bytes stand for themselves, the rest get 256+k */
  for (int i = 0; i < 324; i++)
    t->cp_byte[i] = -1;
  int extra = 0;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t->byte_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + extra++);
    t->cp_byte[t->byte_cp[b]] = (int16_t)b;
  }
  for (int b = 0; b < 256; b++) {
    char s[8];
    int n = kg_utf8_put(s, t->byte_cp[b]);
    t->sym[b] = (int32_t)kg_clip_bpe_token_to_id(t, s, (size_t)n);
    memcpy(s + n, "</w>", 4);
    t->sym_end[b] = (int32_t)kg_clip_bpe_token_to_id(t, s, (size_t)n + 4);
  }
  return KG_OK;
}

static kg_status load_merges(kg_clip_bpe *t, const char *path) {
  size_t len;
  kg_status st;
  char *buf = kg_read_file(path, OP, "merges", &len, &st);
  if (!buf) return st;
  size_t lines = 1;
  for (size_t i = 0; i < len; i++)
    lines += buf[i] == '\n';
  t->mslots = pow2_above(lines);
  t->mkeys = malloc(t->mslots * sizeof *t->mkeys);
  t->mrank = malloc(t->mslots * sizeof *t->mrank);
  t->mout = malloc(t->mslots * sizeof *t->mout);
  if (!t->mkeys || !t->mrank || !t->mout) {
    free(buf);
    return kg_error(KG_ERR_OOM, OP, "out of memory loading '%s'", path);
  }
  for (size_t i = 0; i < t->mslots; i++)
    t->mkeys[i] = UINT64_MAX;
  int32_t rank = 0;
  char *tmp = NULL;
  size_t start = 0;
  for (long long line = 1; start < len; line++) {
    size_t end = start;
    while (end < len && buf[end] != '\n')
      end++;
    size_t e = end > start && buf[end - 1] == '\r' ? end - 1 : end;
    const char *s = buf + start;
    size_t n = e - start;
    start = end + 1;
    if (n >= 8 && memcmp(s, "#version", 8) == 0) continue;
    const char *sp = memchr(s, ' ', n);
    if (!sp || sp == s || sp == s + n - 1 || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1)) || memchr(s, 0, n)) {
      st = kg_error(KG_ERR_VALUE, OP, "'%s' line %lld: \"%.*s\" is not a merge \"a b\"", path, line,
                    (int)(n > 60 ? 60 : n), s);
      free(buf);
      free(tmp);
      return st;
    }
    size_t na = (size_t)(sp - s), nb = n - na - 1;
    int64_t a = kg_clip_bpe_token_to_id(t, s, na), b = kg_clip_bpe_token_to_id(t, sp + 1, nb);
    char *nt = realloc(tmp, n);
    if (!nt) {
      free(buf);
      free(tmp);
      return kg_error(KG_ERR_OOM, OP, "out of memory loading '%s'", path);
    }
    tmp = nt;
    memcpy(tmp, s, na);
    memcpy(tmp + na, sp + 1, nb);
    int64_t ab = kg_clip_bpe_token_to_id(t, tmp, na + nb);
    if (a < 0 || b < 0 || ab < 0) {
      st = kg_error(KG_ERR_VALUE, OP, "'%s' line %lld: merge \"%.*s\": \"%.*s\" is not in the vocabulary", path, line,
                    (int)(n > 60 ? 60 : n), s,
                    (int)(a < 0   ? na
                          : b < 0 ? nb
                                  : na + nb),
                    a < 0   ? s
                    : b < 0 ? sp + 1
                            : tmp);
      free(buf);
      free(tmp);
      return st;
    }
    uint64_t key = (uint64_t)a << 32 | (uint64_t)b;
    for (size_t i = mix(key) & (t->mslots - 1);; i = (i + 1) & (t->mslots - 1)) {
      if (t->mkeys[i] == key) break; /* a repeated merge keeps its first (better) rank */
      if (t->mkeys[i] == UINT64_MAX) {
        t->mkeys[i] = key;
        t->mrank[i] = rank;
        t->mout[i] = (int32_t)ab;
        break;
      }
    }
    rank++;
  }
  free(buf);
  free(tmp);
  return KG_OK;
}

kg_status kg_clip_bpe_load(kg_clip_bpe **out, const char *vocab_path, const char *merges_path) {
  *out = NULL;
  kg_clip_bpe *t = calloc(1, sizeof *t);
  if (!t) return kg_error(KG_ERR_OOM, OP, "out of memory");
  kg_status st = load_vocab(t, vocab_path);
  if (st == KG_OK) st = load_merges(t, merges_path);
  if (st != KG_OK) {
    kg_clip_bpe_free(t);
    return st;
  }
  *out = t;
  return KG_OK;
}

/* ---- encoding ------------------------------------------------------------------------------- */

typedef struct {
  int32_t rank, pos, a, b; /* merge (a, b) of rank `rank` at symbol pos and the one after it */
} pair;

static bool pair_less(pair x, pair y) { return x.rank < y.rank || (x.rank == y.rank && x.pos < y.pos); }

/* a binary min-heap by (rank, pos); the storage is the caller's, sized for every push */
static void heap_push(pair *h, size_t *n, pair p) {
  size_t i = (*n)++;
  while (i > 0 && pair_less(p, h[(i - 1) / 2])) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = p;
}

static pair heap_pop(pair *h, size_t *n) {
  pair top = h[0], last = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && pair_less(h[c + 1], h[c])) c++;
    if (!pair_less(h[c], last)) break;
    h[i] = h[c];
    i = c;
  }
  if (*n) h[i] = last;
  return top;
}

/* pushes the merge of the symbols at i and next[i], if there is one */
static void push_pair(const kg_clip_bpe *t, const int32_t *sym, const int32_t *next, pair *h, size_t *hn, int32_t i) {
  if (i < 0 || next[i] < 0) return;
  int32_t id, r = merge_rank(t, sym[i], sym[next[i]], &id);
  if (r >= 0) heap_push(h, hn, (pair){r, i, sym[i], sym[next[i]]});
}

/* BPE over the word cp[0..n) (lower-cased code points); appends its ids to out. The lowest-rank
 * adjacent pair merges first, the leftmost among equals (a heap keyed by rank then position, with
 * stale entries skipped), so a long word costs O(m log m) for m bytes. */
static bool bpe_word(const kg_clip_bpe *t, const uint32_t *cp, size_t n, kg_ids *work, kg_ids *out) {
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    m += cp[i] < 0x80 ? 1 : cp[i] < 0x800 ? 2 : cp[i] < 0x10000 ? 3 : 4;
  if (m > INT32_MAX / 8) return false;
  /* work holds sym[m], prev[m], next[m] and a heap of at most 3m pairs (4 ints each) */
  size_t need = 15 * m;
  if (work->cap < need) {
    int32_t *nv = realloc(work->v, need * sizeof *nv);
    if (!nv) return false;
    work->v = nv;
    work->cap = need;
  }
  int32_t *sym = work->v, *prev = sym + m, *next = prev + m;
  pair *h = (pair *)(next + m);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    char s[4];
    int nb = kg_utf8_put(s, cp[i]);
    for (int j = 0; j < nb; j++, k++) {
      uint8_t b = (uint8_t)s[j];
      int32_t id = k + 1 == m ? t->sym_end[b] : t->sym[b];
      sym[k] = id < 0 ? (int32_t)t->eos : id;
      prev[k] = (int32_t)k - 1;
      next[k] = k + 1 < m ? (int32_t)k + 1 : -1;
    }
  }
  size_t hn = 0;
  for (size_t i = 0; i + 1 < m; i++)
    push_pair(t, sym, next, h, &hn, (int32_t)i);
  while (hn) {
    pair p = heap_pop(h, &hn);
    int32_t i = p.pos, j = next[i];
    if (sym[i] < 0 || j < 0 || sym[i] != p.a || sym[j] != p.b) continue; /* stale */
    int32_t id = 0;
    merge_rank(t, p.a, p.b, &id);
    sym[i] = id;
    sym[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push_pair(t, sym, next, h, &hn, prev[i]);
    push_pair(t, sym, next, h, &hn, i);
  }
  for (int32_t i = m ? 0 : -1; i >= 0; i = next[i])
    if (!kg_ids_push(out, sym[i])) return false;
  return true;
}

static bool match_ascii(const uint32_t *cp, size_t n, size_t i, const char *lit) {
  for (size_t k = 0; lit[k]; k++)
    if (i + k >= n || cp[i + k] != (uint8_t)lit[k]) return false;
  return true;
}

/* normalizes and splits the stretch cp[0..n) of raw text, appending its ids to out */
static bool encode_stretch(const kg_clip_bpe *t, const uint32_t *raw, size_t n, kg_ids *sym, kg_ids *out) {
  if (!n) return true;
  uint32_t *d;
  size_t m;
  bool ascii = true;
  for (size_t i = 0; i < n && ascii; i++)
    ascii = raw[i] < 0x300;
  if (ascii) {
    d = malloc(n * sizeof *d);
    if (!d) return false;
    memcpy(d, raw, n * sizeof *d);
    m = n;
  } else if (!kg_unicode_nfc(raw, n, &d, &m)) {
    return false;
  }
  /* whitespace runs -> one space, then lowercase (may grow: at most 3 code points each) */
  uint32_t *c = malloc((3 * m + 1) * sizeof *c);
  if (!c) {
    free(d);
    return false;
  }
  size_t cn = 0;
  for (size_t i = 0; i < m; i++) {
    if (kg_unicode_clip_class(d[i]) == KG_CLIP_SPACE) {
      if (i == 0 || kg_unicode_clip_class(d[i - 1]) != KG_CLIP_SPACE) c[cn++] = ' ';
      continue;
    }
    cn += (size_t)kg_unicode_lower(d[i], c + cn);
  }
  free(d);
  bool ok = true;
  for (size_t i = 0; i < cn && ok;) {
    int k = kg_unicode_clip_class(c[i]);
    if (k == KG_CLIP_SPACE) {
      i++;
      continue;
    }
    size_t j = i + 1;
    if (match_ascii(c, cn, i, "<|startoftext|>") || match_ascii(c, cn, i, "<|endoftext|>")) {
      size_t L = c[i + 2] == 's' ? 15 : 13; /* GPT-2's split in the byte-level step: "<|" word "|>" */
      ok = bpe_word(t, c + i, 2, sym, out) && bpe_word(t, c + i + 2, L - 4, sym, out) &&
           bpe_word(t, c + i + L - 2, 2, sym, out);
      i += L;
      continue;
    } else if (c[i] == '\'' && i + 1 < cn &&
               (c[i + 1] == 's' || c[i + 1] == 't' || c[i + 1] == 'm' || c[i + 1] == 'd')) {
      j = i + 2;
    } else if (c[i] == '\'' &&
               (match_ascii(c, cn, i, "'re") || match_ascii(c, cn, i, "'ve") || match_ascii(c, cn, i, "'ll"))) {
      j = i + 3;
    } else if (k == KG_CLIP_LETTER) {
      while (j < cn && kg_unicode_clip_class(c[j]) == KG_CLIP_LETTER)
        j++;
    } else if (k == KG_CLIP_OTHER) {
      while (j < cn && kg_unicode_clip_class(c[j]) == KG_CLIP_OTHER)
        j++;
    }
    ok = ok && bpe_word(t, c + i, j - i, sym, out);
    i = j;
  }
  free(c);
  return ok;
}

kg_status kg_clip_bpe_encode(const kg_clip_bpe *t, const char *text, size_t len, int32_t **ids, int64_t *n) {
  *ids = NULL;
  *n = 0;
  uint32_t *cp = malloc((len + 1) * sizeof *cp);
  if (!cp) return kg_error(KG_ERR_OOM, OP, "encode: out of memory for %zu bytes of text", len);
  size_t m = 0;
  for (size_t i = 0; i < len;) {
    size_t at = i;
    int32_t c = kg_utf8_next((const uint8_t *)text, len, &i);
    if (c < 0) {
      free(cp);
      return kg_error(KG_ERR_VALUE, OP, "encode: the text is not valid UTF-8 at byte %zu", at);
    }
    cp[m++] = (uint32_t)c;
  }
  kg_ids out = {0}, sym = {0};
  bool ok = true;
  size_t from = 0;
  for (size_t i = 0; i <= m && ok; i++) { /* added tokens are matched on the raw text first */
    bool bos = i < m && match_ascii(cp, m, i, "<|startoftext|>");
    bool eos = !bos && i < m && match_ascii(cp, m, i, "<|endoftext|>");
    if (!bos && !eos && i < m) continue;
    ok = encode_stretch(t, cp + from, i - from, &sym, &out);
    if (bos || eos) {
      ok = ok && kg_ids_push(&out, (int32_t)(bos ? t->bos : t->eos));
      i += bos ? 14 : 12;
      from = i + 1;
    }
  }
  free(cp);
  free(sym.v);
  if (!ok) {
    free(out.v);
    return kg_error(KG_ERR_OOM, OP, "encode: out of memory for %zu bytes of text", len);
  }
  *ids = out.v;
  *n = (int64_t)out.n;
  return KG_OK;
}

/* ---- decoding ------------------------------------------------------------------------------- */

/* length of the valid UTF-8 sequence at s[0..n), or -(bytes of its maximal invalid prefix) */
static int utf8_check(const uint8_t *s, size_t n) {
  uint8_t c = s[0];
  if (c < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    need = 1;
  else if (c >= 0xE0 && c <= 0xEF)
    need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else
    return -1;
  for (int k = 1; k <= need; k++) {
    if ((size_t)k >= n || s[k] < lo || s[k] > hi) return -k;
    lo = 0x80, hi = 0xBF;
  }
  return need + 1;
}

kg_status kg_clip_bpe_decode(const kg_clip_bpe *t, const int64_t *ids, int64_t n, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  size_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->vocab.n)
      return kg_error(KG_ERR_VALUE, OP, "decode: id %lld (element %lld) is outside the vocabulary [0, %lld)",
                      (long long)ids[i], (long long)i + 1, (long long)t->vocab.n);
    total += t->vocab.lens[ids[i]];
  }
  uint8_t *bytes = malloc(total + 1);
  char *o = malloc(3 * total + 1); /* each byte at worst one U+FFFD */
  if (!bytes || !o) {
    free(bytes);
    free(o);
    return kg_error(KG_ERR_OOM, OP, "decode: out of memory for %lld ids", (long long)n);
  }
  size_t nb = 0;
  for (int64_t i = 0; i < n; i++) {
    const char *s = t->vocab.tokens[ids[i]];
    size_t sl = t->vocab.lens[ids[i]], at = nb;
    bool mapped = true;
    for (size_t k = 0; k < sl && mapped;) {
      int32_t c = kg_utf8_next((const uint8_t *)s, sl, &k);
      if (c < 0 || c >= 324 || t->cp_byte[c] < 0)
        mapped = false;
      else
        bytes[nb++] = (uint8_t)t->cp_byte[c];
    }
    if (!mapped) { /* a token outside the byte alphabet stands for its own UTF-8 */
      memcpy(bytes + at, s, sl);
      nb = at + sl;
    }
  }
  size_t on = 0;
  for (size_t i = 0; i < nb;) {
    if (i + 4 <= nb && memcmp(bytes + i, "</w>", 4) == 0) {
      o[on++] = ' ';
      i += 4;
      continue;
    }
    int k = utf8_check(bytes + i, nb - i);
    if (k > 0) {
      memcpy(o + on, bytes + i, (size_t)k);
      on += (size_t)k;
      i += (size_t)k;
    } else {
      on += (size_t)kg_utf8_put(o + on, 0xFFFD);
      i += (size_t)-k;
    }
  }
  free(bytes);
  /* strip whitespace at both ends (the text is valid UTF-8 now) */
  size_t a = 0, b = on;
  while (a < b) {
    size_t k = a;
    int32_t c = kg_utf8_next((const uint8_t *)o, b, &k);
    if (kg_unicode_clip_class((uint32_t)c) != KG_CLIP_SPACE && c != 0x1C && c != 0x1D && c != 0x1E && c != 0x1F) break;
    a = k;
  }
  while (b > a) {
    size_t k = b - 1;
    while (k > a && ((uint8_t)o[k] & 0xC0) == 0x80)
      k--;
    size_t q = k;
    int32_t c = kg_utf8_next((const uint8_t *)o, b, &q);
    if (kg_unicode_clip_class((uint32_t)c) != KG_CLIP_SPACE && c != 0x1C && c != 0x1D && c != 0x1E && c != 0x1F) break;
    b = k;
  }
  memmove(o, o + a, b - a);
  o[b - a] = 0;
  *text = o;
  *len = b - a;
  return KG_OK;
}
