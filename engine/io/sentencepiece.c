/* sentencepiece.c — a SentencePiece tokenizer (tokenizer.model) that gives the same ids and the
 * same decoded text as the reference library (google/sentencepiece: normalizer.cc, bpe_model.cc,
 * unigram_model.cc EncodeOptimized, sentencepiece_processor.cc Decode). docs/tokenizers.md.
 *
 * The file is a protobuf ModelProto read by the small wire-format reader below: varints and
 * length-delimited fields, unknown fields skipped, every length checked against what is left,
 * so any byte string either loads or fails with "sentencepiece: <label>: ...".
 *
 * Encoding = normalize (precompiled charsmap if present, U+FFFD for bad UTF-8, whitespace
 * handling, " " -> U+2581) then the model (BPE merges by score, or unigram Viterbi), then unknown
 * pieces become <0xNN> byte pieces when byte_fallback is on. Piece lookups go through one
 * open-addressing hash table keyed by the piece bytes. */
#include <keng/tokenizer.h>

#include "unicode.h"
#include "vocab.h"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OP "sentencepiece"

enum { T_NORMAL = 1, T_UNKNOWN = 2, T_CONTROL = 3, T_USER = 4, T_UNUSED = 5, T_BYTE = 6 };
enum { M_UNIGRAM = 1, M_BPE = 2, M_WORD = 3, M_CHAR = 4 };

static const char SPACE[] = "\xE2\x96\x81"; /* U+2581, the visible space */
static const char REPLACEMENT[] = "\xEF\xBF\xBD";

struct kg_sentencepiece {
  int n;              /* vocab size */
  char *arena;        /* all piece bytes */
  size_t *off, *len;  /* [n] piece i = arena[off[i] .. +len[i]) */
  float *score;       /* [n] */
  uint8_t *type;      /* [n] */
  int32_t *slots;     /* hash table of piece -> id, -1 empty */
  uint32_t mask;      /* slots - 1 */
  int model_type;
  bool byte_fallback, add_dummy_prefix, remove_extra_ws, escape_ws;
  int unk;            /* the UNKNOWN piece (model_interface's unk_id_) */
  int bos, eos, pad;  /* control pieces named by trainer_spec, else -1 */
  int byte_id[256];   /* <0xNN> -> id, -1 when absent */
  size_t max_len;      /* longest normal/user piece in bytes */
  size_t max_user_len; /* longest USER_DEFINED piece, 0 when none */
  bool has_unused;
  float min_score, max_score; /* over NORMAL pieces (unigram) */
  char *unk_surface;
  size_t unk_surface_len;
  /* precompiled charsmap: a darts-clone double array + NUL-separated replacement strings */
  uint8_t *charsmap;
  const uint32_t *trie; /* points into charsmap (copied aligned) */
  size_t trie_units;
  const char *norm;
  size_t norm_len;
};

/* ---- protobuf wire format ------------------------------------------------------------- */

typedef struct {
  const uint8_t *p, *end;
} pb;

static bool pb_varint(pb *r, uint64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (r->p >= r->end) return false;
    uint8_t b = *r->p++;
    x |= (uint64_t)(b & 0x7F) << shift;
    if (!(b & 0x80)) {
      *v = x;
      return true;
    }
  }
  return false; /* more than 10 bytes */
}

/* Reads one field: its number, wire type, and either its scalar (varint, fixed32/64 in *v) or
 * its length-delimited body (*sub). Returns false on a truncated or malformed field. */
static bool pb_field(pb *r, uint32_t *field, int *wire, uint64_t *v, pb *sub) {
  uint64_t key;
  if (!pb_varint(r, &key)) return false;
  *field = (uint32_t)(key >> 3);
  *wire = (int)(key & 7);
  if (*field == 0 || key >> 32) return false;
  switch (*wire) {
  case 0: return pb_varint(r, v);
  case 1:
    if (r->end - r->p < 8) return false;
    *v = 0;
    for (int i = 7; i >= 0; i--) *v = *v << 8 | r->p[i];
    r->p += 8;
    return true;
  case 5:
    if (r->end - r->p < 4) return false;
    *v = (uint64_t)r->p[0] | (uint64_t)r->p[1] << 8 | (uint64_t)r->p[2] << 16 | (uint64_t)r->p[3] << 24;
    r->p += 4;
    return true;
  case 2: {
    uint64_t n;
    if (!pb_varint(r, &n) || n > (uint64_t)(r->end - r->p)) return false;
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return true;
  }
  default: return false; /* groups (3, 4) are not used by this schema */
  }
}

static float f32_bits(uint64_t v) {
  uint32_t u = (uint32_t)v;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* ---- hash table ----------------------------------------------------------------------- */

static uint32_t hash_bytes(const char *s, size_t n) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
  return h;
}

static const char *piece_of(const kg_sentencepiece *sp, int id) { return sp->arena + sp->off[id]; }

/* id of s[0..n), any type, or -1 */
static int lookup(const kg_sentencepiece *sp, const char *s, size_t n) {
  for (uint32_t h = hash_bytes(s, n) & sp->mask;; h = (h + 1) & sp->mask) {
    int id = sp->slots[h];
    if (id < 0) return -1;
    if (sp->len[id] == n && memcmp(piece_of(sp, id), s, n) == 0) return id;
  }
}

/* model_interface's pieces_: NORMAL, USER_DEFINED and UNUSED pieces */
static int lookup_normal(const kg_sentencepiece *sp, const char *s, size_t n) {
  int id = lookup(sp, s, n);
  if (id < 0) return -1;
  int t = sp->type[id];
  return (t == T_NORMAL || t == T_USER || t == T_UNUSED) ? id : -1;
}

static int piece_to_id(const kg_sentencepiece *sp, const char *s, size_t n) {
  int id = lookup(sp, s, n);
  return id < 0 ? sp->unk : id;
}

/* ---- loading -------------------------------------------------------------------------- */

typedef struct {
  char *bos_piece, *eos_piece, *pad_piece, *unk_piece; /* NULL = default */
  size_t bos_n, eos_n, pad_n, unk_n;
} names;

static kg_status bad(const char *label, const char *msg) {
  return kg_error(KG_ERR_IO, OP, "%s: %s", label, msg);
}

static char *dup_bytes(const uint8_t *p, size_t n) {
  char *s = malloc(n + 1);
  if (s) memcpy(s, p, n), s[n] = 0;
  return s;
}

/* value of "<0xNN>" (uppercase hex as the reference writes it), else -1 */
static int byte_of_piece(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; i++) {
    char c = s[i];
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

void kg_sentencepiece_free(kg_sentencepiece *sp) {
  if (!sp) return;
  free(sp->arena);
  free(sp->off);
  free(sp->len);
  free(sp->score);
  free(sp->type);
  free(sp->slots);
  free(sp->unk_surface);
  free(sp->charsmap);
  free(sp);
}

/* First pass over ModelProto: count pieces and their bytes. */
static kg_status count_pieces(pb r, const char *label, int *n, size_t *bytes) {
  uint32_t f;
  int w;
  uint64_t v;
  pb sub;
  *n = 0;
  *bytes = 0;
  while (r.p < r.end) {
    if (!pb_field(&r, &f, &w, &v, &sub)) return bad(label, "truncated or malformed protobuf field");
    if (f == 1) {
      if (w != 2) return bad(label, "pieces: wrong wire type");
      if (*n >= (1 << 30)) return bad(label, "too many pieces");
      (*n)++;
      *bytes += (size_t)(sub.end - sub.p);
    }
  }
  if (*n == 0) return bad(label, "no pieces (not a sentencepiece model?)");
  return KG_OK;
}

static kg_status read_piece(kg_sentencepiece *sp, int i, pb r, size_t *used, const char *label) {
  uint32_t f;
  int w;
  uint64_t v;
  pb sub;
  sp->type[i] = T_NORMAL;
  sp->score[i] = 0;
  bool has_piece = false;
  while (r.p < r.end) {
    if (!pb_field(&r, &f, &w, &v, &sub)) return bad(label, "truncated or malformed piece");
    if (f == 1 && w == 2) {
      size_t n = (size_t)(sub.end - sub.p);
      memcpy(sp->arena + *used, sub.p, n);
      sp->off[i] = *used;
      sp->len[i] = n;
      *used += n;
      has_piece = true;
    } else if (f == 2 && w == 5) {
      sp->score[i] = f32_bits(v);
    } else if (f == 3 && w == 0) {
      if (v < T_NORMAL || v > T_BYTE) return kg_error(KG_ERR_IO, OP, "%s: piece %d: bad type %llu", label, i, (unsigned long long)v);
      sp->type[i] = (uint8_t)v;
    } else if (f <= 3) {
      return kg_error(KG_ERR_IO, OP, "%s: piece %d: field %u has wire type %d", label, i, f, w);
    }
  }
  if (!has_piece || sp->len[i] == 0) return kg_error(KG_ERR_IO, OP, "%s: piece %d is empty", label, i);
  return KG_OK;
}

static kg_status read_trainer(kg_sentencepiece *sp, pb r, names *nm, const char *label) {
  uint32_t f;
  int w;
  uint64_t v;
  pb sub;
  while (r.p < r.end) {
    if (!pb_field(&r, &f, &w, &v, &sub)) return bad(label, "truncated or malformed trainer_spec");
    if (w == 0 && f == 3) sp->model_type = (int)v;
    else if (w == 0 && f == 35) sp->byte_fallback = v != 0;
    else if (w == 0 && f == 24 && v) return bad(label, "treat_whitespace_as_suffix is not supported");
    else if (w == 2 && (f == 44 || f == 45 || f == 46 || f == 47 || f == 48)) {
      size_t n = (size_t)(sub.end - sub.p);
      char *s = dup_bytes(sub.p, n);
      if (!s) return kg_error(KG_ERR_OOM, OP, "%s: out of memory", label);
      char **dst = f == 44 ? &sp->unk_surface : f == 45 ? &nm->unk_piece : f == 46 ? &nm->bos_piece
                 : f == 47 ? &nm->eos_piece : &nm->pad_piece;
      size_t *dn = f == 44 ? &sp->unk_surface_len : f == 45 ? &nm->unk_n : f == 46 ? &nm->bos_n
                 : f == 47 ? &nm->eos_n : &nm->pad_n;
      free(*dst);
      *dst = s;
      *dn = n;
    }
  }
  return KG_OK;
}

static kg_status read_charsmap(kg_sentencepiece *sp, pb blob, const char *label) {
  size_t n = (size_t)(blob.end - blob.p);
  if (n == 0) return KG_OK; /* identity */
  if (n < 4) return bad(label, "precompiled_charsmap is truncated");
  uint32_t trie_bytes = (uint32_t)blob.p[0] | (uint32_t)blob.p[1] << 8 | (uint32_t)blob.p[2] << 16 |
                        (uint32_t)blob.p[3] << 24;
  if (trie_bytes >= n - 4 + 1 || trie_bytes % 4 || trie_bytes == 0)
    return bad(label, "precompiled_charsmap: bad trie size");
  sp->charsmap = malloc(n);
  if (!sp->charsmap) return kg_error(KG_ERR_OOM, OP, "%s: out of memory", label);
  memcpy(sp->charsmap, blob.p + 4, n - 4); /* malloc'd: the units are aligned */
  sp->trie = (const uint32_t *)sp->charsmap;
  sp->trie_units = trie_bytes / 4;
  sp->norm = (const char *)sp->charsmap + trie_bytes;
  sp->norm_len = n - 4 - trie_bytes;
  return KG_OK;
}

static kg_status read_normalizer(kg_sentencepiece *sp, pb r, const char *label) {
  uint32_t f;
  int w;
  uint64_t v;
  pb sub;
  while (r.p < r.end) {
    if (!pb_field(&r, &f, &w, &v, &sub)) return bad(label, "truncated or malformed normalizer_spec");
    if (w == 0 && f == 3) sp->add_dummy_prefix = v != 0;
    else if (w == 0 && f == 4) sp->remove_extra_ws = v != 0;
    else if (w == 0 && f == 5) sp->escape_ws = v != 0;
    else if (w == 2 && f == 2) {
      free(sp->charsmap);
      sp->charsmap = NULL;
      sp->trie = NULL;
      kg_status s = read_charsmap(sp, sub, label);
      if (s) return s;
    }
  }
  return KG_OK;
}

static int control_id(const kg_sentencepiece *sp, const char *name, size_t n, const char *def) {
  if (!name) name = def, n = strlen(def);
  int id = piece_to_id(sp, name, n);
  return (id >= 0 && sp->type[id] == T_CONTROL) ? id : -1;
}

static kg_status build(kg_sentencepiece *sp, pb all, const char *label, names *nm) {
  int n;
  size_t bytes;
  kg_status s = count_pieces(all, label, &n, &bytes);
  if (s) return s;
  sp->n = n;
  sp->arena = malloc(bytes + 1);
  sp->off = malloc(sizeof(size_t) * (size_t)n);
  sp->len = calloc((size_t)n, sizeof(size_t));
  sp->score = malloc(sizeof(float) * (size_t)n);
  sp->type = malloc((size_t)n);
  uint32_t cap = 16;
  while (cap < (uint32_t)n * 2u) cap <<= 1;
  sp->slots = malloc(sizeof(int32_t) * cap);
  sp->mask = cap - 1;
  if (!sp->arena || !sp->off || !sp->len || !sp->score || !sp->type || !sp->slots)
    return kg_error(KG_ERR_OOM, OP, "%s: out of memory for %d pieces", label, n);
  memset(sp->slots, 0xFF, sizeof(int32_t) * cap);

  sp->model_type = M_UNIGRAM;
  sp->add_dummy_prefix = sp->remove_extra_ws = sp->escape_ws = true;
  uint32_t f;
  int w;
  uint64_t v;
  pb sub, r = all;
  size_t used = 0;
  int i = 0;
  while (r.p < r.end) {
    if (!pb_field(&r, &f, &w, &v, &sub)) return bad(label, "truncated or malformed protobuf field");
    if (f == 1) {
      if ((s = read_piece(sp, i++, sub, &used, label))) return s;
    } else if (f == 2 && w == 2) {
      if ((s = read_trainer(sp, sub, nm, label))) return s;
    } else if (f == 3 && w == 2) {
      if ((s = read_normalizer(sp, sub, label))) return s;
    } else if (f <= 3) {
      return kg_error(KG_ERR_IO, OP, "%s: field %u has wire type %d", label, f, w);
    }
  }
  if (sp->model_type != M_UNIGRAM && sp->model_type != M_BPE)
    return kg_error(KG_ERR_IO, OP, "%s: model_type %d is not supported (only UNIGRAM=1 and BPE=2)", label,
                    sp->model_type);

  /* index the pieces and check them as model_interface.cc does */
  sp->unk = -1;
  for (int b = 0; b < 256; b++) sp->byte_id[b] = -1;
  sp->min_score = FLT_MAX;
  sp->max_score = FLT_MIN;
  int n_bytes = 0;
  for (int id = 0; id < n; id++) {
    const char *p = piece_of(sp, id);
    size_t len = sp->len[id];
    if (lookup(sp, p, len) >= 0)
      return kg_error(KG_ERR_IO, OP, "%s: piece %d '%.*s' is already defined", label, id, (int)(len > 64 ? 64 : len), p);
    uint32_t h = hash_bytes(p, len) & sp->mask;
    while (sp->slots[h] >= 0) h = (h + 1) & sp->mask;
    sp->slots[h] = id;
    int t = sp->type[id];
    if (t == T_UNKNOWN) {
      if (sp->unk >= 0) return bad(label, "unk is already defined");
      sp->unk = id;
    } else if (t == T_BYTE) {
      if (!sp->byte_fallback)
        return kg_error(KG_ERR_IO, OP, "%s: byte piece %d is found although byte_fallback is false", label, id);
      int b = byte_of_piece(p, len);
      if (b < 0) return kg_error(KG_ERR_IO, OP, "%s: byte piece %d is not of the form <0xNN>", label, id);
      sp->byte_id[b] = id;
      n_bytes++;
    } else if (t == T_NORMAL || t == T_USER || t == T_UNUSED) {
      if (len > sp->max_len) sp->max_len = len;
      if (t == T_USER && len > sp->max_user_len) sp->max_user_len = len;
      if (t == T_UNUSED) sp->has_unused = true;
      if (t == T_NORMAL) {
        if (sp->score[id] < sp->min_score) sp->min_score = sp->score[id];
        if (sp->score[id] > sp->max_score) sp->max_score = sp->score[id];
      }
    }
  }
  if (sp->unk < 0) return bad(label, "unk is not defined");
  if (sp->byte_fallback && n_bytes != 256)
    return kg_error(KG_ERR_IO, OP, "%s: byte_fallback is on but there are %d byte pieces, not 256", label, n_bytes);
  sp->bos = control_id(sp, nm->bos_piece, nm->bos_n, "<s>");
  sp->eos = control_id(sp, nm->eos_piece, nm->eos_n, "</s>");
  sp->pad = control_id(sp, nm->pad_piece, nm->pad_n, "<pad>");
  if (nm->unk_piece) {
    int id = piece_to_id(sp, nm->unk_piece, nm->unk_n);
    if (sp->type[id] != T_UNKNOWN) return bad(label, "trainer_spec.unk_piece is not the UNKNOWN piece");
  }
  if (!sp->unk_surface) {
    sp->unk_surface = dup_bytes((const uint8_t *)" \xE2\x81\x87 ", 5);
    sp->unk_surface_len = 5;
    if (!sp->unk_surface) return kg_error(KG_ERR_OOM, OP, "%s: out of memory", label);
  }
  return KG_OK;
}

kg_status kg_sentencepiece_parse(kg_sentencepiece **out, const void *data, size_t len, const char *label) {
  *out = NULL;
  if (!label) label = "<memory>";
  kg_sentencepiece *sp = calloc(1, sizeof *sp);
  if (!sp) return kg_error(KG_ERR_OOM, OP, "%s: out of memory", label);
  names nm = {0};
  pb all = {(const uint8_t *)data, (const uint8_t *)data + len};
  kg_status s = build(sp, all, label, &nm);
  free(nm.bos_piece), free(nm.eos_piece), free(nm.pad_piece), free(nm.unk_piece);
  if (s) {
    kg_sentencepiece_free(sp);
    return s;
  }
  *out = sp;
  return KG_OK;
}

kg_status kg_sentencepiece_load(kg_sentencepiece **out, const char *path) {
  *out = NULL;
  size_t n;
  kg_status s;
  uint8_t *buf = (uint8_t *)kg_read_file(path, OP, "SentencePiece model", &n, &s);
  if (!buf) return s;
  s = kg_sentencepiece_parse(out, buf, n, path);
  free(buf);
  return s;
}

/* ---- growable buffers ----------------------------------------------------------------- */

typedef struct {
  char *p;
  size_t n, cap;
  bool failed;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->failed = true;
      return;
    }
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

typedef struct {
  int32_t *p;
  size_t n, cap;
  bool failed;
} ibuf;

static void ib_add(ibuf *b, int32_t v) {
  if (b->failed) return;
  if (b->n == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    int32_t *p = realloc(b->p, cap * sizeof *p);
    if (!p) {
      b->failed = true;
      return;
    }
    b->p = p, b->cap = cap;
  }
  b->p[b->n++] = v;
}

/* ---- UTF-8 ---------------------------------------------------------------------------- */

/* string_util::OneCharLen: the length the lead byte announces */
static size_t one_char_len(uint8_t c) { return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[c >> 4]; }

/* string_util::IsValidDecodeUTF8: *mblen is the well-formed character's length, or 1 */
static bool valid_utf8_char(const uint8_t *s, size_t n, size_t *mblen) {
  size_t i = 0;
  bool ok = n > 0 && kg_utf8_next(s, n, &i) >= 0;
  *mblen = ok ? i : 1;
  return ok;
}

/* ---- normalizer (normalizer.cc) ------------------------------------------------------- */

/* darts-clone commonPrefixSearch over the charsmap: the longest rule matching a prefix of
 * s[0..n), as (replacement, its length, bytes consumed); false when none. Every index is
 * checked against the array, so a corrupt map cannot read outside it. */
static bool charsmap_match(const kg_sentencepiece *sp, const uint8_t *s, size_t n, const char **rep, size_t *rep_len,
                           size_t *consumed) {
  const uint32_t *a = sp->trie;
  size_t units = sp->trie_units;
  size_t best = 0;
  uint32_t best_value = 0;
  uint32_t unit = a[0];
  size_t pos = (unit >> 10) << ((unit & (1u << 9)) >> 6);
  for (size_t i = 0; i < n; i++) {
    pos ^= s[i];
    if (pos >= units) break;
    unit = a[pos];
    if ((unit & ((1u << 31) | 0xFF)) != s[i]) break;
    pos ^= (unit >> 10) << ((unit & (1u << 9)) >> 6);
    if (pos >= units) break;
    if ((unit >> 8) & 1) {
      best = i + 1;
      best_value = a[pos] & ((1u << 31) - 1);
    }
  }
  if (!best || best_value >= sp->norm_len) return false;
  *rep = sp->norm + best_value;
  *rep_len = strnlen(*rep, sp->norm_len - best_value);
  *consumed = best;
  return true;
}

/* NormalizePrefix: the normalized form of the next unit of s and how many bytes it consumes */
static void normalize_prefix(const kg_sentencepiece *sp, const uint8_t *s, size_t n, const char **out, size_t *out_len,
                             size_t *consumed) {
  if (sp->max_user_len) { /* user-defined symbols are kept as they are */
    size_t L = sp->max_user_len < n ? sp->max_user_len : n;
    for (; L > 0; L--) {
      int id = lookup(sp, (const char *)s, L);
      if (id >= 0 && sp->type[id] == T_USER) {
        *out = (const char *)s, *out_len = L, *consumed = L;
        return;
      }
    }
  }
  if (sp->trie && charsmap_match(sp, s, n, out, out_len, consumed)) return;
  size_t mblen;
  if (!valid_utf8_char(s, n, &mblen)) {
    *out = REPLACEMENT, *out_len = 3, *consumed = 1;
  } else {
    *out = (const char *)s, *out_len = mblen, *consumed = mblen;
  }
}

static bool ends_with(const sbuf *b, const char *s, size_t n) {
  return b->n >= n && memcmp(b->p + b->n - n, s, n) == 0;
}

static void normalize(const kg_sentencepiece *sp, const uint8_t *s, size_t n, sbuf *out) {
  const char *p;
  size_t plen, used;
  if (sp->remove_extra_ws) { /* drop leading spaces */
    while (n) {
      normalize_prefix(sp, s, n, &p, &plen, &used);
      if (!(plen == 1 && p[0] == ' ')) break;
      s += used, n -= used;
    }
  }
  if (!n) return;
  if (sp->add_dummy_prefix) {
    if (sp->escape_ws) sb_add(out, SPACE, 3);
    else sb_add(out, " ", 1);
  }
  bool prev_space = sp->remove_extra_ws;
  while (n) {
    normalize_prefix(sp, s, n, &p, &plen, &used);
    if (prev_space)
      while (plen && p[0] == ' ') p++, plen--;
    if (plen) {
      for (size_t k = 0; k < plen; k++) {
        if (sp->escape_ws && p[k] == ' ') sb_add(out, SPACE, 3);
        else sb_add(out, p + k, 1);
      }
      prev_space = p[plen - 1] == ' ';
    }
    s += used, n -= used;
    if (!sp->remove_extra_ws) prev_space = false;
  }
  if (sp->remove_extra_ws) {
    const char *ws = sp->escape_ws ? SPACE : " ";
    size_t wn = sp->escape_ws ? 3 : 1;
    while (ends_with(out, ws, wn)) out->n -= wn;
    if (out->p) out->p[out->n] = 0;
  }
}

/* ---- models --------------------------------------------------------------------------- */

typedef struct {
  size_t off, len; /* into the normalized string */
  int id;
} tok;

typedef struct {
  tok *p;
  size_t n, cap;
  bool failed;
} tbuf;

static void tb_add(tbuf *b, size_t off, size_t len, int id) {
  if (b->failed) return;
  if (b->n == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 64;
    tok *p = realloc(b->p, cap * sizeof *p);
    if (!p) {
      b->failed = true;
      return;
    }
    b->p = p, b->cap = cap;
  }
  b->p[b->n++] = (tok){off, len, id};
}

/* unigram_model.cc EncodeOptimized: Viterbi over all vocabulary matches, one unknown node per
 * character that no single-character piece covers. Ties keep the earlier (shorter) candidate. */
static kg_status encode_unigram(const kg_sentencepiece *sp, const char *s, size_t n, tbuf *out) {
  typedef struct {
    int id;
    float score;
    long long starts_at;
  } best;
  best *b = malloc((n + 1) * sizeof *b);
  if (!b) return kg_error(KG_ERR_OOM, OP, "encode: out of memory for %zu bytes", n);
  for (size_t i = 0; i <= n; i++) b[i] = (best){-1, 0.0f, -1};
  const float unk_score = sp->min_score - 10.0f;
  size_t start = 0;
  while (start < n) {
    const float till_here = b[start].score;
    bool has_single = false;
    size_t mblen = one_char_len((uint8_t)s[start]);
    if (mblen > n - start) mblen = n - start;
    size_t maxl = sp->max_len < n - start ? sp->max_len : n - start;
    for (size_t L = 1; L <= maxl; L++) {
      int id = lookup_normal(sp, s + start, L);
      if (id < 0 || sp->type[id] == T_UNUSED) continue;
      best *t = &b[start + L];
      if (sp->type[id] == T_USER) { /* computed in double as the reference does */
        double cand = (double)((float)L * sp->max_score) - 0.1 + (double)till_here;
        if (t->starts_at == -1 || cand > (double)t->score) *t = (best){id, (float)cand, (long long)start};
      } else {
        float cand = sp->score[id] + till_here;
        if (t->starts_at == -1 || cand > t->score) *t = (best){id, cand, (long long)start};
      }
      if (L == mblen) has_single = true;
    }
    if (!has_single) {
      best *t = &b[start + mblen];
      float cand = unk_score + till_here;
      if (t->starts_at == -1 || cand > t->score) *t = (best){sp->unk, cand, (long long)start};
    }
    start += mblen;
  }
  /* backtrack, then reverse */
  size_t first = out->n;
  for (size_t end = n; end > 0;) {
    const best *node = &b[end];
    if (node->starts_at < 0 || (size_t)node->starts_at >= end) break; /* unreachable for valid input */
    tb_add(out, (size_t)node->starts_at, end - (size_t)node->starts_at, node->id);
    end = (size_t)node->starts_at;
  }
  free(b);
  if (out->failed) return kg_error(KG_ERR_OOM, OP, "encode: out of memory");
  for (size_t i = first, j = out->n ? out->n - 1 : 0; i < j; i++, j--) {
    tok t = out->p[i];
    out->p[i] = out->p[j];
    out->p[j] = t;
  }
  return KG_OK;
}

typedef struct {
  float score;
  int left, right;
  size_t size;
} pair;

/* std::priority_queue order of bpe_model.cc: higher score first, then the leftmost pair */
static bool pair_less(const pair *a, const pair *b) {
  return a->score < b->score || (a->score == b->score && a->left > b->left);
}

typedef struct {
  pair *p;
  size_t n, cap;
  bool failed;
} heap;

static void heap_push(heap *h, pair v) {
  if (h->failed) return;
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 64;
    pair *p = realloc(h->p, cap * sizeof *p);
    if (!p) {
      h->failed = true;
      return;
    }
    h->p = p, h->cap = cap;
  }
  size_t i = h->n++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!pair_less(&h->p[parent], &v)) break;
    h->p[i] = h->p[parent];
    i = parent;
  }
  h->p[i] = v;
}

static pair heap_pop(heap *h) {
  pair top = h->p[0], last = h->p[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && pair_less(&h->p[c], &h->p[c + 1])) c++;
    if (!pair_less(&last, &h->p[c])) break;
    h->p[i] = h->p[c];
    i = c;
  }
  if (h->n) h->p[i] = last;
  return top;
}

typedef struct {
  size_t off, len; /* piece = s[off .. off+len); len 0 once merged away */
  int prev, next;
  bool freeze;
} sym;

typedef struct {
  int id;
  size_t loff, llen, roff, rlen;
} rev;

typedef struct {
  const kg_sentencepiece *sp;
  const char *s;
  sym *syms;
  heap *agenda;
  rev *revs;
  size_t n_revs, cap_revs;
  bool failed;
} bpe_ctx;

static void maybe_add_pair(bpe_ctx *c, int left, int right) {
  if (left == -1 || right == -1 || c->syms[left].freeze || c->syms[right].freeze) return;
  size_t len = c->syms[left].len + c->syms[right].len;
  int id = lookup_normal(c->sp, c->s + c->syms[left].off, len);
  if (id < 0) return;
  heap_push(c->agenda, (pair){c->sp->score[id], left, right, len});
  if (c->sp->type[id] == T_UNUSED) { /* remember how to split it again */
    if (c->n_revs == c->cap_revs) {
      size_t cap = c->cap_revs ? c->cap_revs * 2 : 16;
      rev *p = realloc(c->revs, cap * sizeof *p);
      if (!p) {
        c->failed = true;
        return;
      }
      c->revs = p, c->cap_revs = cap;
    }
    c->revs[c->n_revs++] = (rev){id, c->syms[left].off, c->syms[left].len, c->syms[right].off, c->syms[right].len};
  }
}

/* bpe_model.cc Encode: symbols are characters (or whole user-defined pieces, frozen); the
 * adjacent pair whose concatenation is the best-scoring piece merges first; pieces of type
 * UNUSED are split back into the pair that made them. */
static kg_status encode_bpe(const kg_sentencepiece *sp, const char *s, size_t n, tbuf *out) {
  if (!n) return KG_OK;
  sym *syms = malloc(n * sizeof *syms);
  heap agenda = {0};
  bpe_ctx c = {sp, s, syms, &agenda, NULL, 0, 0, false};
  if (!syms) return kg_error(KG_ERR_OOM, OP, "encode: out of memory for %zu bytes", n);
  int count = 0;
  for (size_t pos = 0; pos < n;) {
    size_t L = 0;
    bool freeze = false;
    if (sp->max_user_len) {
      for (L = sp->max_user_len < n - pos ? sp->max_user_len : n - pos; L > 0; L--) {
        int id = lookup(sp, s + pos, L);
        if (id >= 0 && sp->type[id] == T_USER) break;
      }
      freeze = L > 0;
    }
    if (!freeze) {
      L = one_char_len((uint8_t)s[pos]);
      if (L > n - pos) L = n - pos;
    }
    syms[count] = (sym){pos, L, count - 1, pos + L < n ? count + 1 : -1, freeze};
    count++;
    pos += L;
  }
  for (int i = 1; i < count; i++) maybe_add_pair(&c, i - 1, i);
  while (agenda.n && !agenda.failed && !c.failed) {
    pair top = heap_pop(&agenda);
    sym *l = &syms[top.left], *r = &syms[top.right];
    if (l->len == 0 || r->len == 0 || l->len + r->len != top.size) continue;
    l->len += r->len;
    l->next = r->next;
    if (r->next >= 0) syms[r->next].prev = top.left;
    r->len = 0;
    maybe_add_pair(&c, l->prev, top.left);
    maybe_add_pair(&c, top.left, l->next);
  }
  kg_status st = KG_OK;
  if (agenda.failed || c.failed) st = kg_error(KG_ERR_OOM, OP, "encode: out of memory");
  /* resegment with an explicit stack (pieces are split into strictly shorter parts) */
  size_t *stack = NULL, sn = 0, scap = 0;
  for (int i = 0; i != -1 && !st; i = syms[i].next) {
    sn = 0;
    size_t item[2] = {syms[i].off, syms[i].len};
    for (;;) {
      int id = piece_to_id(sp, s + item[0], item[1]);
      const rev *rv = NULL;
      if (sp->type[id] == T_UNUSED)
        for (size_t k = c.n_revs; k-- > 0;)
          if (c.revs[k].id == id) {
            rv = &c.revs[k];
            break;
          }
      if (!rv) {
        tb_add(out, item[0], item[1], id);
        if (!sn) break;
        sn -= 2;
        item[0] = stack[sn], item[1] = stack[sn + 1];
        continue;
      }
      if (sn + 2 > scap) {
        size_t cap = scap ? scap * 2 : 32;
        size_t *p = realloc(stack, cap * sizeof *p);
        if (!p) {
          st = kg_error(KG_ERR_OOM, OP, "encode: out of memory");
          break;
        }
        stack = p, scap = cap;
      }
      stack[sn] = rv->roff, stack[sn + 1] = rv->rlen; /* right half waits */
      sn += 2;
      item[0] = rv->loff, item[1] = rv->llen;
    }
  }
  if (!st && out->failed) st = kg_error(KG_ERR_OOM, OP, "encode: out of memory");
  free(stack);
  free(syms);
  free(agenda.p);
  free(c.revs);
  return st;
}

kg_status kg_sentencepiece_encode(const kg_sentencepiece *sp, const char *text, size_t len, int32_t **ids,
                                  size_t *n_ids) {
  *ids = NULL;
  *n_ids = 0;
  sbuf norm = {0};
  normalize(sp, (const uint8_t *)text, len, &norm);
  if (norm.failed) return free(norm.p), kg_error(KG_ERR_OOM, OP, "encode: out of memory normalizing %zu bytes", len);
  tbuf toks = {0};
  kg_status s = sp->model_type == M_BPE ? encode_bpe(sp, norm.p, norm.n, &toks) : encode_unigram(sp, norm.p, norm.n, &toks);
  /* the reference (0.2.x) joins runs of unknown pieces into one before byte fallback */
  size_t m = 0;
  for (size_t i = 0; i < toks.n && !s; i++) {
    if (m && sp->type[toks.p[i].id] == T_UNKNOWN && sp->type[toks.p[m - 1].id] == T_UNKNOWN &&
        toks.p[m - 1].off + toks.p[m - 1].len == toks.p[i].off)
      toks.p[m - 1].len += toks.p[i].len;
    else
      toks.p[m++] = toks.p[i];
  }
  toks.n = m;
  ibuf out = {0};
  for (size_t i = 0; i < toks.n && !s; i++) {
    const tok *t = &toks.p[i];
    if (sp->byte_fallback && sp->type[t->id] == T_UNKNOWN) {
      for (size_t k = 0; k < t->len; k++) {
        int b = sp->byte_id[(uint8_t)norm.p[t->off + k]];
        ib_add(&out, b >= 0 ? b : sp->unk);
      }
    } else {
      ib_add(&out, t->id);
    }
  }
  free(norm.p);
  free(toks.p);
  if (!s && out.failed) s = kg_error(KG_ERR_OOM, OP, "encode: out of memory");
  if (s) return free(out.p), s;
  *ids = out.p;
  *n_ids = out.n;
  return KG_OK;
}

/* ---- decoding (SentencePieceProcessor::Decode) ---------------------------------------- */

static void flush_bytes(sbuf *text, const uint8_t *bytes, size_t n) {
  for (size_t off = 0; off < n;) {
    size_t used;
    if (valid_utf8_char(bytes + off, n - off, &used)) sb_add(text, (const char *)bytes + off, used);
    else sb_add(text, REPLACEMENT, 3);
    off += used;
  }
}

kg_status kg_sentencepiece_decode(const kg_sentencepiece *sp, const int32_t *ids, size_t n, char **out, size_t *len) {
  *out = NULL;
  *len = 0;
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= sp->n)
      return kg_error(KG_ERR_VALUE, OP, "decode: id %ld at position %zu is outside [0, %d)", (long)ids[i], i + 1, sp->n);
  sbuf text = {0};
  sb_add(&text, "", 0);
  uint8_t *bytes = malloc(n ? n : 1);
  if (!bytes) return free(text.p), kg_error(KG_ERR_OOM, OP, "decode: out of memory");
  size_t nb = 0;
  bool is_bos_ws = true, bos_ws_seen = false;
  for (size_t i = 0; i < n; i++) {
    int id = ids[i];
    int t = sp->type[id];
    if (t == T_BYTE) {
      bytes[nb++] = (uint8_t)byte_of_piece(piece_of(sp, id), sp->len[id]);
      continue;
    }
    flush_bytes(&text, bytes, nb);
    nb = 0;
    if (bos_ws_seen || text.n) is_bos_ws = false;
    bos_ws_seen = false;
    if (t == T_CONTROL) continue;
    if (t == T_UNKNOWN) {
      sb_add(&text, sp->unk_surface, sp->unk_surface_len);
      continue;
    }
    const char *p = piece_of(sp, id);
    size_t pl = sp->len[id];
    if (is_bos_ws && (sp->add_dummy_prefix || sp->remove_extra_ws)) {
      if (pl >= 3 && memcmp(p, SPACE, 3) == 0) {
        p += 3, pl -= 3;
        bos_ws_seen = !sp->remove_extra_ws;
      }
    }
    for (size_t k = 0; k < pl;) {
      if (pl - k >= 3 && memcmp(p + k, SPACE, 3) == 0) {
        sb_add(&text, " ", 1);
        k += 3;
      } else {
        sb_add(&text, p + k, 1);
        k++;
      }
    }
  }
  flush_bytes(&text, bytes, nb);
  free(bytes);
  if (text.failed) return free(text.p), kg_error(KG_ERR_OOM, OP, "decode: out of memory");
  *out = text.p;
  *len = text.n;
  return KG_OK;
}

/* ---- lookups -------------------------------------------------------------------------- */

int kg_sentencepiece_vocab_size(const kg_sentencepiece *sp) { return sp->n; }

const char *kg_sentencepiece_id_to_piece(const kg_sentencepiece *sp, int id, size_t *len) {
  if (id < 0 || id >= sp->n) return NULL;
  *len = sp->len[id];
  return piece_of(sp, id);
}

int kg_sentencepiece_piece_to_id(const kg_sentencepiece *sp, const char *piece, size_t len) {
  return piece_to_id(sp, piece, len);
}

kg_sentencepiece_info kg_sentencepiece_get_info(const kg_sentencepiece *sp) {
  return (kg_sentencepiece_info){sp->n,
                                 sp->unk,
                                 sp->bos,
                                 sp->eos,
                                 sp->pad,
                                 sp->model_type,
                                 sp->byte_fallback,
                                 sp->add_dummy_prefix,
                                 sp->remove_extra_ws,
                                 sp->escape_ws,
                                 sp->trie != NULL};
}
