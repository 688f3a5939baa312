/* gguf.c — a validating reader of GGUF files (llama.cpp's format; keng/gguf.h has the layout).
 *
 * GGUF readers have had many memory-safety bugs (counts and lengths trusted before they were
 * checked against the file, sizes that wrap, offsets out of the data section, overlapping
 * tensors). Here every read goes through one bounds-checked cursor; every count is bounded by
 * the bytes left before anything is allocated for it; sizes are multiplied with overflow checks;
 * each tensor's extent must lie in the data section, start on the alignment and overlap no
 * other. Only then are tensors made. docs/security.md lists the rules; tests/fuzz/fuzz_gguf.c
 * fuzzes this file.
 *
 * The dequantizers follow ggml's reference formulas (ggml-quants.c dequantize_row_*) in the same
 * order of f32 operations, so their values equal gguf-py's `quants.dequantize` bit for bit; that
 * needs floating-point contraction off (a fused d*q - m rounds once, not twice). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "../core/internal.h"
#include <keng/gguf.h>
#include <keng/scalar.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "keng's GGUF reader assumes a little-endian host"
#endif

#define OP "gguf"
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64             /* ggml's GGML_MAX_NAME: a tensor name has fewer bytes */
#define GGUF_MAX_DEPTH 8             /* nested metadata arrays */
#define GGUF_MAX_ALIGN ((uint64_t)1 << 20)
#define GGUF_DEFAULT_ALIGN 32

/* ggml's type table: block length and bytes per block (ggml.c type_traits; 0 = no such type) */
static const struct {
  const char *name;
  int blck, size;
} ggml_types[] = {
    [0] = {"F32", 1, 4},          [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},       [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},       [9] = {"Q8_1", 32, 40},      [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},    [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},    [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},   [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},    [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136},  [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},         [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},    [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},    [39] = {"MXFP4", 32, 17},
};
#define GGML_NTYPES ((int)(sizeof ggml_types / sizeof ggml_types[0]))
#define SUPPORTED "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K"

static const char *vtype_names[KG_GGUF_NTYPES] = {"u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                  "bool", "string", "array", "u64", "i64", "f64"};
static const int vtype_size[KG_GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *kg_gguf_type_name(int type) {
  static __thread char buf[24];
  if (type >= 0 && type < GGML_NTYPES && ggml_types[type].name) return ggml_types[type].name;
  snprintf(buf, sizeof buf, "type %d", type);
  return buf;
}

/* ---- the file ------------------------------------------------------------------------------ */

typedef struct {
  int refcount;
  void *base; /* mmap'd (len > 0) or malloc'd (len == 0) */
  size_t len;
} gguf_map;

static void map_unref(gguf_map *m) {
  if (m && __atomic_sub_fetch(&m->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    if (m->len)
      munmap(m->base, m->len);
    else
      free(m->base);
    free(m);
  }
}
static void map_release(kg_storage *s) { map_unref(s->owner); }

struct kg_gguf {
  char *label;
  gguf_map *map;
  const uint8_t *bytes;
  uint64_t size;
  uint32_t version;
  uint64_t alignment;
  int64_t n_kv;
  char **keys;
  kg_gguf_value *values;
  int64_t n_tensors;
  kg_gguf_tensor_info *tensors;
  uint64_t data_start, data_len;
};

static kg_status fail(const kg_gguf *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static kg_status fail(const kg_gguf *g, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return kg_error(KG_ERR_IO, OP, "%s: %s", g->label, msg);
}
#define OOM(g) kg_error(KG_ERR_OOM, OP, "%s: out of memory", (g)->label)

/* a bounds-checked cursor over the file */
typedef struct {
  const kg_gguf *g;
  uint64_t at;
} cur;

static uint64_t left(const cur *c) { return c->g->size - c->at; }

static kg_status need(cur *c, uint64_t n, const char *what) {
  if (n > left(c))
    return fail(c->g, "truncated: %s at byte %llu needs %llu bytes, the file has %llu left", what,
                (unsigned long long)c->at, (unsigned long long)n, (unsigned long long)left(c));
  return KG_OK;
}

static uint64_t le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

static kg_status rd(cur *c, int n, uint64_t *v, const char *what) {
  KG_TRY(need(c, (uint64_t)n, what));
  *v = le(c->g->bytes + c->at, n);
  c->at += (uint64_t)n;
  return KG_OK;
}

/* a string: u64 length then that many bytes (checked against the bytes left) */
static kg_status rd_str(cur *c, const char **s, uint64_t *len, const char *what) {
  uint64_t at = c->at;
  KG_TRY(rd(c, 8, len, what));
  if (*len > left(c))
    return fail(c->g, "%s at byte %llu has length %llu, past the end of the file (%llu bytes left)", what,
                (unsigned long long)at, (unsigned long long)*len, (unsigned long long)left(c));
  *s = (const char *)c->g->bytes + c->at;
  c->at += *len;
  return KG_OK;
}

/* the fewest bytes one value of type t takes in the file */
static uint64_t min_bytes(int t) { return t == KG_GGUF_STRING ? 8 : t == KG_GGUF_ARRAY ? 12 : (uint64_t)vtype_size[t]; }

static void value_free(kg_gguf_value *v) {
  if (v->type == KG_GGUF_ARRAY && v->items) {
    for (uint64_t k = 0; k < v->n; k++)
      value_free(&v->items[k]);
    free(v->items);
  }
  v->items = NULL;
}

static kg_status rd_value(cur *c, int type, kg_gguf_value *v, const char *key, int depth) {
  memset(v, 0, sizeof *v);
  v->type = type;
  uint64_t x;
  char what[96];
  snprintf(what, sizeof what, "metadata '%.60s'", key);
  switch (type) {
  case KG_GGUF_U8: case KG_GGUF_U16: case KG_GGUF_U32: case KG_GGUF_U64:
    KG_TRY(rd(c, vtype_size[type], &v->u, what));
    v->i = (int64_t)v->u;
    v->f = (double)v->u;
    return KG_OK;
  case KG_GGUF_I8: case KG_GGUF_I16: case KG_GGUF_I32: case KG_GGUF_I64: {
    int n = vtype_size[type];
    KG_TRY(rd(c, n, &x, what));
    if (n < 8 && (x >> (8 * n - 1)) & 1) x |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    memcpy(&v->i, &x, 8);
    v->u = x;
    v->f = (double)v->i;
    return KG_OK;
  }
  case KG_GGUF_F32: {
    KG_TRY(rd(c, 4, &x, what));
    uint32_t b = (uint32_t)x;
    float f;
    memcpy(&f, &b, 4);
    v->f = f;
    return KG_OK;
  }
  case KG_GGUF_F64:
    KG_TRY(rd(c, 8, &x, what));
    memcpy(&v->f, &x, 8);
    return KG_OK;
  case KG_GGUF_BOOL:
    KG_TRY(rd(c, 1, &v->u, what));
    if (v->u > 1) return fail(c->g, "metadata '%.200s': a bool must be 0 or 1, got %llu", key, (unsigned long long)v->u);
    v->i = (int64_t)v->u;
    return KG_OK;
  case KG_GGUF_STRING:
    return rd_str(c, &v->str, &v->len, what);
  case KG_GGUF_ARRAY: {
    if (depth >= GGUF_MAX_DEPTH) return fail(c->g, "metadata '%.200s': arrays nest deeper than %d", key, GGUF_MAX_DEPTH);
    uint64_t et, n, at = c->at;
    KG_TRY(rd(c, 4, &et, what));
    if (et >= KG_GGUF_NTYPES)
      return fail(c->g, "metadata '%.200s': unknown array element type %llu at byte %llu", key, (unsigned long long)et,
                  (unsigned long long)at);
    KG_TRY(rd(c, 8, &n, what));
    v->elem_type = (int)et;
    /* each element takes at least min_bytes: a count the file cannot hold is refused before allocating */
    if (n > left(c) / min_bytes((int)et))
      return fail(c->g, "metadata '%.200s': array of %llu %s elements cannot fit in the %llu bytes left", key,
                  (unsigned long long)n, vtype_names[et], (unsigned long long)left(c));
    v->items = calloc(n ? n : 1, sizeof *v->items);
    if (!v->items) return OOM(c->g);
    for (uint64_t k = 0; k < n; k++) {
      v->n = k + 1;
      KG_TRY(rd_value(c, (int)et, &v->items[k], key, depth + 1));
    }
    v->n = n;
    return KG_OK;
  }
  }
  return fail(c->g, "metadata '%.200s': unknown value type %d", key, type);
}

void kg_gguf_free(kg_gguf *g) {
  if (!g) return;
  for (int64_t i = 0; i < g->n_kv; i++) {
    free(g->keys[i]);
    value_free(&g->values[i]);
  }
  for (int64_t i = 0; i < g->n_tensors; i++)
    free(g->tensors[i].name);
  free(g->keys);
  free(g->values);
  free(g->tensors);
  free(g->label);
  map_unref(g->map);
  free(g);
}

static int by_offset(const void *a, const void *b) {
  const kg_gguf_tensor_info *x = *(kg_gguf_tensor_info *const *)a, *y = *(kg_gguf_tensor_info *const *)b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}
static int by_name(const void *a, const void *b) {
  return strcmp((*(kg_gguf_tensor_info *const *)a)->name, (*(kg_gguf_tensor_info *const *)b)->name);
}
static int by_key(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static kg_status check_tensor(kg_gguf *g, kg_gguf_tensor_info *t) {
  const char *nm = t->name;
  if (t->type < 0 || t->type >= GGML_NTYPES || !ggml_types[t->type].name)
    return fail(g, "tensor '%s' has unknown ggml type %d (keng reads " SUPPORTED ")", nm, t->type);
  uint64_t blck = (uint64_t)ggml_types[t->type].blck, tsize = (uint64_t)ggml_types[t->type].size;
  if ((uint64_t)t->ne[0] % blck)
    return fail(g, "tensor '%s': its row length %lld is not a multiple of %s's block of %llu", nm, (long long)t->ne[0],
                ggml_types[t->type].name, (unsigned long long)blck);
  /* bytes = ne0 / blck * tsize * ne1 * ne2 * ne3; elements past 2^59 are refused as keng's shapes are */
  uint64_t bytes = (uint64_t)t->ne[0] / blck * tsize, numel = (uint64_t)t->ne[0];
  bool over = false;
  for (int d = 1; d < t->ndim; d++) {
    uint64_t n = (uint64_t)t->ne[d];
    if (bytes > UINT64_MAX / n || numel > ((uint64_t)1 << 59) / n)
      over = true;
    else
      bytes *= n, numel *= n;
  }
  if (over || numel > ((uint64_t)1 << 59))
    return fail(g, "tensor '%s': dims [%lld, %lld, %lld, %lld] multiply past 2^59 elements", nm, (long long)t->ne[0],
                (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
  t->nbytes = bytes;
  if (t->offset % g->alignment)
    return fail(g, "tensor '%s': offset %llu is not a multiple of the alignment %llu", nm, (unsigned long long)t->offset,
                (unsigned long long)g->alignment);
  if (t->offset > g->data_len || bytes > g->data_len - t->offset)
    return fail(g, "tensor '%s': bytes [%llu, +%llu) run past the data section (%llu bytes)", nm,
                (unsigned long long)t->offset, (unsigned long long)bytes, (unsigned long long)g->data_len);
  return KG_OK;
}

static kg_status parse(kg_gguf *g) {
  cur c = {g, 0};
  uint64_t version, nt, nkv;
  if (g->size < 4 || memcmp(g->bytes, "GGUF", 4))
    return fail(g, "not a GGUF file (it does not start with the bytes \"GGUF\")");
  c.at = 4;
  KG_TRY(rd(&c, 4, &version, "the version"));
  if (version == 0x02000000 || version == 0x03000000)
    return fail(g, "big-endian GGUF files are not supported");
  if (version != 2 && version != 3)
    return fail(g, "GGUF version %llu is not supported (keng reads versions 2 and 3)", (unsigned long long)version);
  g->version = (uint32_t)version;
  KG_TRY(rd(&c, 8, &nt, "the tensor count"));
  KG_TRY(rd(&c, 8, &nkv, "the metadata count"));
  /* a metadata entry takes at least 8 + 1 + 4 + 1 bytes, a tensor entry 8 + 1 + 4 + 8 + 4 + 8 */
  if (nkv > left(&c) / 14)
    return fail(g, "metadata count %llu cannot fit in a file of %llu bytes", (unsigned long long)nkv,
                (unsigned long long)g->size);
  if (nt > left(&c) / 33)
    return fail(g, "tensor count %llu cannot fit in a file of %llu bytes", (unsigned long long)nt,
                (unsigned long long)g->size);
  g->keys = calloc(nkv + 1, sizeof *g->keys);
  g->values = calloc(nkv + 1, sizeof *g->values);
  g->tensors = calloc(nt + 1, sizeof *g->tensors);
  if (!g->keys || !g->values || !g->tensors) return OOM(g);
  g->alignment = GGUF_DEFAULT_ALIGN;
  for (uint64_t i = 0; i < nkv; i++) {
    const char *k;
    uint64_t klen, type;
    KG_TRY(rd_str(&c, &k, &klen, "a metadata key"));
    if (klen == 0 || memchr(k, 0, klen))
      return fail(g, "metadata key %llu is %s", (unsigned long long)i + 1, klen ? "holds a NUL byte" : "empty");
    if (!(g->keys[i] = strndup(k, klen))) return OOM(g);
    g->n_kv = (int64_t)i + 1;
    uint64_t at = c.at;
    char what[96];
    snprintf(what, sizeof what, "metadata '%.60s'", g->keys[i]);
    KG_TRY(rd(&c, 4, &type, what));
    if (type >= KG_GGUF_NTYPES)
      return fail(g, "metadata '%.200s' has unknown value type %llu (at byte %llu)", g->keys[i],
                  (unsigned long long)type, (unsigned long long)at);
    KG_TRY(rd_value(&c, (int)type, &g->values[i], g->keys[i], 0));
    if (!strcmp(g->keys[i], "general.alignment")) {
      const kg_gguf_value *v = &g->values[i];
      if (v->type != KG_GGUF_U32)
        return fail(g, "general.alignment must be a u32, got a %s", vtype_names[v->type]);
      if (v->u == 0 || (v->u & (v->u - 1)) || v->u > GGUF_MAX_ALIGN)
        return fail(g, "general.alignment %llu must be a power of two from 1 to %llu", (unsigned long long)v->u,
                    (unsigned long long)GGUF_MAX_ALIGN);
      g->alignment = v->u;
    }
  }
  { /* duplicate keys are refused (which one would count?) */
    char **sorted = malloc(sizeof *sorted * (nkv + 1));
    if (!sorted) return OOM(g);
    memcpy(sorted, g->keys, sizeof *sorted * nkv);
    qsort(sorted, nkv, sizeof *sorted, by_key);
    for (uint64_t i = 1; i < nkv; i++)
      if (!strcmp(sorted[i - 1], sorted[i])) {
        kg_status s = fail(g, "metadata key '%.200s' appears twice", sorted[i]);
        free(sorted);
        return s;
      }
    free(sorted);
  }
  for (uint64_t i = 0; i < nt; i++) {
    kg_gguf_tensor_info *t = &g->tensors[i];
    const char *nm;
    uint64_t nlen, nd, ty;
    KG_TRY(rd_str(&c, &nm, &nlen, "a tensor name"));
    if (nlen == 0 || nlen >= GGUF_MAX_NAME || memchr(nm, 0, nlen))
      return fail(g, "tensor %llu: its name %s", (unsigned long long)i + 1,
                  nlen == 0 ? "is empty" : nlen >= GGUF_MAX_NAME ? "has 64 bytes or more (ggml's limit is 63)"
                                                                : "holds a NUL byte");
    if (!(t->name = strndup(nm, nlen))) return OOM(g);
    g->n_tensors = (int64_t)i + 1;
    char what[96];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    KG_TRY(rd(&c, 4, &nd, what));
    if (nd < 1 || nd > GGUF_MAX_DIMS)
      return fail(g, "tensor '%s' has %llu dims (1 to %d allowed)", t->name, (unsigned long long)nd, GGUF_MAX_DIMS);
    t->ndim = (int)nd;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
      uint64_t ne = 1;
      if (d < t->ndim) KG_TRY(rd(&c, 8, &ne, what));
      if (ne == 0 || ne > ((uint64_t)1 << 59))
        return fail(g, "tensor '%s': dim %d is %llu (each must be from 1 to 2^59)", t->name, d + 1,
                    (unsigned long long)ne);
      t->ne[d] = (int64_t)ne;
    }
    KG_TRY(rd(&c, 4, &ty, what));
    t->type = ty > INT32_MAX ? -1 : (int)ty;
    if (t->type < 0) return fail(g, "tensor '%s' has unknown ggml type %llu", t->name, (unsigned long long)ty);
    KG_TRY(rd(&c, 8, &t->offset, what));
  }
  /* the data section starts at the next multiple of the alignment */
  uint64_t pad = (g->alignment - c.at % g->alignment) % g->alignment;
  if (nt && pad > left(&c))
    return fail(g, "truncated: the data section would start at byte %llu, past the end of the file (%llu bytes)",
                (unsigned long long)(c.at + pad), (unsigned long long)g->size);
  g->data_start = pad > left(&c) ? g->size : c.at + pad;
  g->data_len = g->size - g->data_start;
  kg_gguf_tensor_info **order = malloc(sizeof *order * (nt + 1));
  if (!order) return OOM(g);
  kg_status s = KG_OK;
  for (uint64_t i = 0; i < nt && !s; i++) {
    order[i] = &g->tensors[i];
    s = check_tensor(g, &g->tensors[i]);
  }
  if (!s && nt > 1) {
    qsort(order, nt, sizeof *order, by_name);
    for (uint64_t i = 1; i < nt && !s; i++)
      if (!strcmp(order[i - 1]->name, order[i]->name)) s = fail(g, "tensor name '%s' appears twice", order[i]->name);
    qsort(order, nt, sizeof *order, by_offset);
    for (uint64_t i = 1; i < nt && !s; i++) {
      const kg_gguf_tensor_info *a = order[i - 1], *b = order[i];
      if (b->offset < a->offset + a->nbytes) /* no overflow: a's extent was checked against data_len */
        s = fail(g, "tensors '%s' [%llu, +%llu) and '%s' [%llu, +%llu) overlap", a->name, (unsigned long long)a->offset,
                 (unsigned long long)a->nbytes, b->name, (unsigned long long)b->offset, (unsigned long long)b->nbytes);
    }
  }
  free(order);
  return s;
}

static kg_status make(kg_gguf **out, const char *label, gguf_map *m, const uint8_t *bytes, uint64_t size) {
  *out = NULL;
  kg_gguf *g = calloc(1, sizeof *g);
  if (!g || !(g->label = strdup(label))) {
    free(g);
    map_unref(m);
    return kg_error(KG_ERR_OOM, OP, "%s: out of memory", label);
  }
  g->map = m;
  g->bytes = bytes;
  g->size = size;
  kg_status s = parse(g);
  if (s) {
    kg_gguf_free(g);
    return s;
  }
  *out = g;
  return KG_OK;
}

kg_status kg_gguf_parse(kg_gguf **out, const void *bytes, size_t len, const char *label) {
  *out = NULL;
  label = label ? label : "<memory>";
  gguf_map *m = malloc(sizeof *m);
  void *copy = malloc(len ? len : 1);
  if (!m || !copy) {
    free(m);
    free(copy);
    return kg_error(KG_ERR_OOM, OP, "%s: out of memory", label);
  }
  if (len) memcpy(copy, bytes, len);
  *m = (gguf_map){1, copy, 0};
  return make(out, label, m, copy, len);
}

kg_status kg_gguf_open(kg_gguf **out, const char *path) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
  if (fd < 0) return kg_error(KG_ERR_IO, OP, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    return kg_error(KG_ERR_IO, OP, "%s: not a regular file", path);
  }
  if (st.st_size < 24) { /* too small to map usefully (mmap refuses length 0): parse a copy */
    unsigned char small[24];
    ssize_t got = pread(fd, small, (size_t)st.st_size, 0);
    close(fd);
    if (got != (ssize_t)st.st_size) return kg_error(KG_ERR_IO, OP, "%s: read failed", path);
    return kg_gguf_parse(out, small, (size_t)got, path);
  }
  void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  close(fd);
  if (base == MAP_FAILED) return kg_error(KG_ERR_IO, OP, "%s: mmap failed: %s", path, strerror(map_errno));
  gguf_map *m = malloc(sizeof *m);
  if (!m) {
    munmap(base, (size_t)st.st_size);
    return kg_error(KG_ERR_OOM, OP, "%s: out of memory", path);
  }
  *m = (gguf_map){1, base, (size_t)st.st_size};
  return make(out, path, m, base, (uint64_t)st.st_size);
}

uint32_t kg_gguf_version(const kg_gguf *g) { return g->version; }
int64_t kg_gguf_n_kv(const kg_gguf *g) { return g->n_kv; }
const char *kg_gguf_key(const kg_gguf *g, int64_t i) { return i >= 0 && i < g->n_kv ? g->keys[i] : NULL; }
const kg_gguf_value *kg_gguf_value_at(const kg_gguf *g, int64_t i) {
  return i >= 0 && i < g->n_kv ? &g->values[i] : NULL;
}
const kg_gguf_value *kg_gguf_get(const kg_gguf *g, const char *key) {
  for (int64_t i = 0; i < g->n_kv; i++)
    if (!strcmp(g->keys[i], key)) return &g->values[i];
  return NULL;
}
int64_t kg_gguf_n_tensors(const kg_gguf *g) { return g->n_tensors; }
const kg_gguf_tensor_info *kg_gguf_tensor_info_at(const kg_gguf *g, int64_t i) {
  return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* ---- dequantization (ggml-quants.c's reference formulas, the same f32 operation order) ------- */

static float h2f(const uint8_t *p) { return kg_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static void deq_q8_0(const uint8_t *b, float *y) { /* {f16 d; i8 qs[32]} */
  float d = h2f(b);
  for (int j = 0; j < 32; j++)
    y[j] = (float)(int8_t)b[2 + j] * d;
}

static void deq_q4_0(const uint8_t *b, float *y) { /* {f16 d; u8 qs[16]}: j low nibble, j+16 high */
  float d = h2f(b);
  for (int j = 0; j < 16; j++) {
    y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
    y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
  }
}

static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

static void deq_q4_k(const uint8_t *b, float *y) { /* {f16 d, dmin; u8 scales[12]; u8 qs[128]} */
  float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t *scales = b + 4, *q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    int sc, m;
    scale_min_k4(is, scales, &sc, &m);
    float d1 = d * (float)sc, m1 = dmin * (float)m;
    scale_min_k4(is + 1, scales, &sc, &m);
    float d2 = d * (float)sc, m2 = dmin * (float)m;
    for (int l = 0; l < 32; l++)
      *y++ = d1 * (float)(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; l++)
      *y++ = d2 * (float)(q[l] >> 4) - m2;
  }
}

static void deq_q6_k(const uint8_t *b, float *y) { /* {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d} */
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(b + 192);
  float d = h2f(b + 208);
  for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
    for (int l = 0; l < 32; l++) {
      int is = l / 16;
      int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * (float)sc[is] * (float)q1;
      y[l + 32] = d * (float)sc[is + 2] * (float)q2;
      y[l + 64] = d * (float)sc[is + 4] * (float)q3;
      y[l + 96] = d * (float)sc[is + 6] * (float)q4;
    }
}

/* a converted tensor's bytes are not read again: give their pages of the private mapping back
 * (the whole pages inside [p, p + n) only, so no neighbouring tensor's view loses a page), so
 * that the resident size of a loaded quantized model is its keng tensors, not the file too */
static void drop_pages(const kg_gguf *g, const uint8_t *p, uint64_t n) {
  if (!g->map->len) return;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + n) / page * page;
  if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

kg_status kg_gguf_tensor(const kg_gguf *g, int64_t i, kg_dtype dt, unsigned keep, kg_tensor **out, kg_tensor **scale) {
  *out = NULL;
  if (scale) *scale = NULL;
  if (i < 0 || i >= g->n_tensors)
    return kg_error(KG_ERR_VALUE, OP, "%s: tensor index %lld is out of range (%lld tensors)", g->label, (long long)i,
                    (long long)g->n_tensors);
  const kg_gguf_tensor_info *t = &g->tensors[i];
  int64_t shape[GGUF_MAX_DIMS];
  for (int d = 0; d < t->ndim; d++)
    shape[d] = t->ne[t->ndim - 1 - d];
  const uint8_t *p = g->bytes + g->data_start + t->offset;
  if (t->type == KG_GGML_F32 || t->type == KG_GGML_F16 || t->type == KG_GGML_BF16) {
    kg_dtype fd = t->type == KG_GGML_F32 ? KG_F32 : t->type == KG_GGML_F16 ? KG_F16 : KG_BF16;
    size_t es = (size_t)kg_dtype_info[fd].size;
    if (g->map->len && (uintptr_t)p % es == 0) { /* a view of the private mapping */
      __atomic_add_fetch(&g->map->refcount, 1, __ATOMIC_RELAXED);
      kg_status s = kg_tensor_from_blob(out, (void *)p, t->ndim, shape, fd, KG_CPU, g->map, map_release);
      if (s) map_unref(g->map);
      return s;
    }
    KG_TRY(kg_tensor_empty(out, t->ndim, shape, fd, KG_CPU));
    memcpy(kg_data(*out), p, (size_t)t->nbytes);
    return KG_OK;
  }
  int64_t rows = (int64_t)(t->nbytes / ((uint64_t)t->ne[0] / (uint64_t)ggml_types[t->type].blck *
                                        (uint64_t)ggml_types[t->type].size));
  bool q4 = t->type == KG_GGML_Q4_0 && (keep & KG_GGUF_KEEP_Q4_0), q8 = t->type == KG_GGML_Q8_0 && (keep & KG_GGUF_KEEP_Q8_0);
  if (q4 || q8) { /* keng's Q4_0 / Q8_0 layouts (engine/ops/quant_format.h): the block's f16 d moved out */
    if (!scale) return kg_error(KG_ERR_VALUE, OP, "%s: keeping %s needs a scale output", g->label, q4 ? "Q4_0" : "Q8_0");
    int64_t nb = t->ne[0] / 32, code_bytes = q4 ? 16 : 32, bsize = 2 + code_bytes;
    shape[t->ndim - 1] = nb * code_bytes;
    KG_TRY(kg_tensor_empty(out, t->ndim, shape, q4 ? KG_U8 : KG_I8, KG_CPU));
    shape[t->ndim - 1] = nb;
    kg_status s = kg_tensor_empty(scale, t->ndim, shape, KG_F16, KG_CPU);
    if (s) {
      kg_tensor_release(*out);
      *out = NULL;
      return s;
    }
    uint8_t *codes = kg_data(*out);
    uint8_t *sc = kg_data(*scale);
    for (int64_t b = 0; b < rows * nb; b++) { /* block b: 2 bytes of f16 d, then its code bytes */
      memcpy(sc + 2 * b, p + bsize * b, 2);
      memcpy(codes + code_bytes * b, p + bsize * b + 2, (size_t)code_bytes);
    }
    drop_pages(g, p, t->nbytes);
    return KG_OK;
  }
  void (*deq)(const uint8_t *, float *) = t->type == KG_GGML_Q8_0   ? deq_q8_0
                                          : t->type == KG_GGML_Q4_0 ? deq_q4_0
                                          : t->type == KG_GGML_Q4_K ? deq_q4_k
                                          : t->type == KG_GGML_Q6_K ? deq_q6_k
                                                                    : NULL;
  if (!deq)
    return kg_error(KG_ERR_IO, OP, "%s: tensor '%s' has type %s, which keng does not read (supported: " SUPPORTED ")",
                    g->label, t->name, kg_gguf_type_name(t->type));
  if (dt != KG_F32 && dt != KG_BF16 && dt != KG_F16)
    return kg_error(KG_ERR_VALUE, OP, "%s: quantized tensors dequantize to f32, bf16 or f16, not %s", g->label,
                    kg_dtype_info[dt].name);
  KG_TRY(kg_tensor_empty(out, t->ndim, shape, dt, KG_CPU));
  int blck = ggml_types[t->type].blck, bsize = ggml_types[t->type].size;
  int64_t nblocks = rows * (t->ne[0] / blck);
  float buf[256];
  for (int64_t b = 0; b < nblocks; b++) {
    deq(p + (size_t)b * (size_t)bsize, buf);
    if (dt == KG_F32)
      memcpy((float *)kg_data(*out) + b * blck, buf, sizeof(float) * (size_t)blck);
    else {
      uint16_t *o = (uint16_t *)kg_data(*out) + b * blck;
      for (int k = 0; k < blck; k++)
        o[k] = dt == KG_BF16 ? kg_f32_to_bf16(buf[k]) : kg_f32_to_f16(buf[k]);
    }
  }
  drop_pages(g, p, t->nbytes);
  return KG_OK;
}
