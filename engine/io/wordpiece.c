/* wordpiece.c — the BERT tokenizer (keng/wordpiece.h). Reference: Hugging Face tokenizers'
 * BertNormalizer + BertPreTokenizer + WordPiece model (what transformers' BertTokenizer runs):
 *   1. clean text: drop NUL, U+FFFD and controls (Cc Cf Co except \t \n \r; unassigned code
 *      points stay); whitespace -> ' '
 *   2. put spaces around CJK ideographs
 *   3. strip accents (NFD, drop Mn) when asked or when lowercasing; then lowercase
 *   4. split on spaces; every punctuation character is a word of its own
 *   0. the special tokens [PAD] [UNK] [CLS] [SEP] [MASK], found verbatim in the raw text, are
 *      their own ids (unless split_special_tokens); the text between them goes through 1-5
 *   5. each word: greedy longest match from the left, later pieces prefixed "##"; a word with
 *      no full cover, or over max_chars_per_word characters, becomes [UNK]
 * The Unicode facts come from unicode.c (generated tables). Known gap: NFD here does not
 * reorder combining marks by combining class; only non-Mn marks survive stripping, so this
 * can only matter for rare spacing marks with a nonzero class. The older pure-Python tokenizer
 * (transformers' BertTokenizerLegacy) also applies NFC before splitting; that differs from this
 * (and from BertTokenizer) only on decomposed input to a cased vocabulary ("e\u0301"). */
#include <keng/wordpiece.h>

#include "unicode.h"
#include "vocab.h"

#include <stdlib.h>
#include <string.h>

struct kg_wordpiece {
  kg_vocab vocab; /* the lines of vocab.txt, ids 0..n-1 */
  int64_t unk;
  bool lowercase, strip, chinese;
  int max_chars;
  int64_t special[5]; /* ids of [PAD] [UNK] [CLS] [SEP] [MASK] matched whole in raw text */
  int nspecial;
};

int64_t kg_wordpiece_token_to_id(const kg_wordpiece *wp, const char *s, size_t n) {
  return kg_vocab_find(&wp->vocab, s, n);
}

int64_t kg_wordpiece_vocab_size(const kg_wordpiece *wp) { return wp->vocab.n; }

const char *kg_wordpiece_id_to_token(const kg_wordpiece *wp, int64_t id, size_t *n) {
  if (id < 0 || id >= wp->vocab.n) return NULL;
  if (n) *n = wp->vocab.lens[id];
  return wp->vocab.tokens[id];
}

void kg_wordpiece_free(kg_wordpiece *wp) {
  if (!wp) return;
  kg_vocab_free(&wp->vocab);
  free(wp);
}

/* ---- CJK ideographs (the blocks BERT spaces out) -------------------------------------------- */

static bool is_cjk(int32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* ---- loading -------------------------------------------------------------------------------- */

static kg_status load_fail(kg_wordpiece *wp, kg_status code, const char *fmt, const char *path, int64_t line) {
  kg_wordpiece_free(wp);
  return kg_error(code, "wordpiece", fmt, path, (long long)line);
}

kg_status kg_wordpiece_load(kg_wordpiece **out, const char *path, const kg_wordpiece_opts *o) {
  *out = NULL;
  kg_wordpiece_opts def = {0};
  def.strip_accents = -1;
  if (!o) o = &def;
  size_t len;
  kg_status rs;
  char *buf = kg_read_file(path, "wordpiece", "vocabulary", &len, &rs);
  if (!buf) return rs;

  kg_wordpiece *wp = calloc(1, sizeof *wp);
  if (!wp) {
    free(buf);
    return kg_error(KG_ERR_OOM, "wordpiece", "out of memory");
  }
  int64_t lines = 0;
  for (size_t i = 0; i < len; i++)
    lines += buf[i] == '\n';
  if (len && buf[len - 1] != '\n') lines++;
  kg_vocab *v = &wp->vocab;
  if (!kg_vocab_alloc(v, lines)) { /* v->n counts the lines read so far */
    free(buf);
    return load_fail(wp, KG_ERR_OOM, "out of memory loading '%s' (%lld lines)", path, lines);
  }
  size_t start = 0;
  for (int64_t line = 0; line < lines; line++) {
    size_t end = start;
    while (end < len && buf[end] != '\n')
      end++;
    size_t next = end + 1, e = end;
    while (e > start && (buf[e - 1] == '\r' || buf[e - 1] == ' ' || buf[e - 1] == '\t'))
      e--;
    size_t n = e - start;
    kg_status st = KG_OK;
    const char *why = NULL;
    if (n == 0)
      why = "'%s' line %lld is empty (one token per line expected)";
    else if (memchr(buf + start, 0, n))
      why = "'%s' line %lld holds a NUL byte (not a text vocabulary)";
    else {
      for (size_t i = start; i < e && !why;) {
        if (kg_utf8_next((const uint8_t *)buf, e, &i) < 0) why = "'%s' line %lld is not valid UTF-8";
      }
    }
    if (why) {
      free(buf);
      return load_fail(wp, KG_ERR_VALUE, why, path, line + 1);
    }
    v->tokens[line] = malloc(n + 1);
    if (!v->tokens[line]) st = KG_ERR_OOM;
    if (st) {
      free(buf);
      return load_fail(wp, st, "out of memory loading '%s' at line %lld", path, line + 1);
    }
    memcpy(v->tokens[line], buf + start, n);
    v->tokens[line][n] = 0;
    v->lens[line] = n;
    v->n = line + 1;
    start = next;
  }
  free(buf);
  if (v->n == 0) return load_fail(wp, KG_ERR_VALUE, "vocabulary '%s' is empty%.0lld", path, 0);
  if (!kg_vocab_index(v)) return load_fail(wp, KG_ERR_OOM, "out of memory indexing '%s'%.0lld", path, 0);
  const char *unk = o->unk_token ? o->unk_token : "[UNK]";
  wp->unk = kg_wordpiece_token_to_id(wp, unk, strlen(unk));
  if (wp->unk < 0) {
    kg_wordpiece_free(wp);
    return kg_error(KG_ERR_VALUE, "wordpiece", "vocabulary '%s' has no unknown token '%s'", path, unk);
  }
  wp->lowercase = o->lowercase;
  wp->strip = o->strip_accents < 0 ? o->lowercase : o->strip_accents != 0;
  wp->chinese = !o->no_chinese_split;
  wp->max_chars = o->max_chars_per_word > 0 ? o->max_chars_per_word : 100;
  static const char *specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (int k = 0; k < 5 && !o->split_special_tokens; k++) {
    int64_t id = kg_wordpiece_token_to_id(wp, specials[k], strlen(specials[k]));
    if (id >= 0) wp->special[wp->nspecial++] = id;
  }
  *out = wp;
  return KG_OK;
}

/* ---- encoding ------------------------------------------------------------------------------- */

/* one word of nc code points cps[0..nc) -> pieces; scratch holds 4*nc+3 bytes, off nc+1 ints */
static bool wordpiece(const kg_wordpiece *wp, const uint32_t *cps, int nc, char *scratch, int *off, kg_ids *b) {
  if (nc > wp->max_chars) return kg_ids_push(b, (int32_t)wp->unk);
  /* utf-8 of the word, after a "##" slot, with char offsets */
  char *w = scratch + 2;
  off[0] = 0;
  for (int i = 0; i < nc; i++)
    off[i + 1] = off[i] + kg_utf8_put(w + off[i], cps[i]);
  size_t first = b->n;
  for (int start = 0; start < nc;) {
    int64_t id = -1;
    int end = nc;
    for (; end > start; end--) {
      const char *s = w + off[start];
      size_t n = (size_t)(off[end] - off[start]);
      if (start > 0) { /* "##" written just before the piece (the previous char is already matched) */
        char save0 = s[-2], save1 = s[-1];
        ((char *)s)[-2] = '#', ((char *)s)[-1] = '#';
        id = kg_wordpiece_token_to_id(wp, s - 2, n + 2);
        ((char *)s)[-2] = save0, ((char *)s)[-1] = save1;
      } else {
        id = kg_wordpiece_token_to_id(wp, s, n);
      }
      if (id >= 0) break;
    }
    if (id < 0) {
      b->n = first;
      return kg_ids_push(b, (int32_t)wp->unk);
    }
    if (!kg_ids_push(b, (int32_t)id)) return false;
    start = end;
  }
  return true;
}

/* the pieces of text[0..len) (no special tokens inside) appended to b; at is the span's byte
 * offset in the whole text, for messages */
static kg_status encode_span(const kg_wordpiece *wp, const char *text, size_t len, size_t at, kg_ids *b) {
  /* normalised code points: at most 4 per input byte (CJK spacing, decompositions) */
  uint32_t *cps = malloc((len * 4 + 1) * sizeof *cps);
  if (!cps) return kg_error(KG_ERR_OOM, "wordpiece", "out of memory encoding %zu bytes", len);
  size_t nc = 0;
  for (size_t i = 0; i < len;) {
    size_t start = i;
    int32_t cp = kg_utf8_next((const uint8_t *)text, len, &i);
    if (cp < 0) {
      free(cps);
      return kg_error(KG_ERR_VALUE, "wordpiece", "text is not valid UTF-8 at byte %zu", at + start + 1);
    }
    int cls = kg_unicode_wp_class(cp);
    if (cp == 0 || cp == 0xFFFD || cls == KG_WP_CONTROL) continue;
    if (cls == KG_WP_SPACE) {
      cps[nc++] = ' ';
      continue;
    }
    if (wp->chinese && is_cjk(cp)) {
      cps[nc++] = ' ';
      cps[nc++] = (uint32_t)cp;
      cps[nc++] = ' ';
      continue;
    }
    uint32_t d[4];
    int nd = wp->strip ? kg_unicode_decompose((uint32_t)cp, d) : (d[0] = (uint32_t)cp, 1);
    for (int k = 0; k < nd; k++) {
      if (wp->strip && kg_unicode_wp_class(d[k]) == KG_WP_MARK) continue;
      if (wp->lowercase) /* full mappings: U+0130 becomes "i" U+0307, as Rust's to_lowercase */
        nc += (size_t)kg_unicode_lower(d[k], cps + nc);
      else
        cps[nc++] = d[k];
    }
  }
  char *scratch = malloc(nc * 4 + 8);
  int *off = malloc((nc + 1) * sizeof *off);
  bool ok = scratch && off;
  for (size_t i = 0; ok && i < nc;) {
    if (cps[i] == ' ') {
      i++;
      continue;
    }
    size_t j = i;
    if (kg_unicode_wp_class(cps[i]) == KG_WP_PUNCT)
      j = i + 1;
    else
      while (j < nc && cps[j] != ' ' && kg_unicode_wp_class(cps[j]) != KG_WP_PUNCT)
        j++;
    ok = wordpiece(wp, cps + i, (int)(j - i), scratch, off, b);
    i = j;
  }
  free(cps);
  free(scratch);
  free(off);
  return ok ? KG_OK : kg_error(KG_ERR_OOM, "wordpiece", "out of memory encoding %zu bytes", len);
}

/* the special token starting at text[i], longest first, or -1 */
static int special_at(const kg_wordpiece *wp, const char *text, size_t len, size_t i) {
  int best = -1;
  for (int k = 0; k < wp->nspecial; k++) {
    size_t n = wp->vocab.lens[wp->special[k]];
    if (i + n <= len && memcmp(text + i, wp->vocab.tokens[wp->special[k]], n) == 0 &&
        (best < 0 || n > wp->vocab.lens[wp->special[best]]))
      best = k;
  }
  return best;
}

kg_status kg_wordpiece_encode(const kg_wordpiece *wp, const char *text, size_t len, int32_t **ids, int64_t *n) {
  *ids = NULL, *n = 0;
  kg_ids b = {0};
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    int k = i < len && text[i] == '[' ? special_at(wp, text, len, i) : -1;
    if (k < 0 && i < len) continue;
    kg_status st = encode_span(wp, text + start, i - start, start, &b);
    if (st == KG_OK && k >= 0 && !kg_ids_push(&b, (int32_t)wp->special[k]))
      st = kg_error(KG_ERR_OOM, "wordpiece", "out of memory encoding %zu bytes", len);
    if (st != KG_OK) {
      free(b.v);
      return st;
    }
    if (k >= 0) {
      i += wp->vocab.lens[wp->special[k]] - 1;
      start = i + 1;
    }
  }
  *ids = b.v, *n = (int64_t)b.n;
  return KG_OK;
}

/* ---- decoding ------------------------------------------------------------------------------- */

kg_status kg_wordpiece_decode(const kg_wordpiece *wp, const int64_t *ids, int64_t n, char **text, size_t *len) {
  *text = NULL;
  size_t cap = 1;
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= wp->vocab.n)
      return kg_error(KG_ERR_VALUE, "wordpiece", "decode: id %lld at position %lld is outside the vocabulary [0, %lld)",
                      (long long)ids[i], (long long)i + 1, (long long)wp->vocab.n);
    cap += wp->vocab.lens[ids[i]] + 1;
  }
  char *s = malloc(cap);
  if (!s) return kg_error(KG_ERR_OOM, "wordpiece", "out of memory decoding %lld ids", (long long)n);
  size_t m = 0;
  for (int64_t i = 0; i < n; i++) {
    const char *t = wp->vocab.tokens[ids[i]];
    size_t tl = wp->vocab.lens[ids[i]];
    if (i > 0 && tl > 2 && t[0] == '#' && t[1] == '#')
      t += 2, tl -= 2;
    else if (i > 0)
      s[m++] = ' ';
    memcpy(s + m, t, tl);
    m += tl;
  }
  s[m] = 0;
  /* clean-up as tokenizers' WordPiece decoder: each replacement only shortens the text */
  static const char *from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " do not", " 's", " 've", " 're"};
  static const char *to[] = {".", "?", "!", ",", "'", "n't", "'m", " don't", "'s", "'ve", "'re"};
  for (size_t r = 0; r < sizeof from / sizeof from[0]; r++) {
    size_t fl = strlen(from[r]), tl = strlen(to[r]), w = 0;
    for (size_t i = 0; i < m;) {
      if (i + fl <= m && memcmp(s + i, from[r], fl) == 0) {
        memcpy(s + w, to[r], tl), w += tl, i += fl;
      } else {
        s[w++] = s[i++];
      }
    }
    m = w;
    s[m] = 0;
  }
  *text = s;
  if (len) *len = m;
  return KG_OK;
}
