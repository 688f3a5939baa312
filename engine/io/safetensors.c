/* safetensors.c — checkpoints in the safetensors format (https://github.com/huggingface/safetensors):
 *
 *   [8 bytes: N, little-endian u64][N bytes: JSON header][data section]
 *   header: {"__metadata__": {str: str}, "<name>": {"dtype": "F32", "shape": [..],
 *            "data_offsets": [begin, end]}, ...}; offsets are relative to the data section.
 *
 * Loading checks every rule (docs/checkpoints.md lists them) before any tensor is made, then
 * maps the file privately (copy-on-write) and hands out tensors over the mapping; the mapping
 * is reference-counted by the storages and unmapped when the last tensor goes. Saving writes a
 * temp file next to the target, fsyncs it, renames it over the target and fsyncs the directory.
 * The writer holds a flock on its temp file; a save first removes the temp files of the same
 * target that nobody holds (left by a killed save), so they do not pile up.
 * Sharded checkpoints (model.safetensors.index.json) are merged here too. */
#include "../core/internal.h"
#include <keng/io.h>

#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; keng's reader assumes a little-endian host"
#endif

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* the spec's 100 MB limit on N */

/* ---- dicts -------------------------------------------------------------------------------- */

static bool needs_growth(int n) { return n == 0 || (n >= 4 && (n & (n - 1)) == 0); }
static int grown(int n) { return n == 0 ? 4 : 2 * n; }

kg_status kg_tensor_dict_add(kg_tensor_dict *d, const char *name, kg_tensor *t) {
  if (needs_growth(d->n)) {
    int cap = grown(d->n);
    char **names = realloc(d->names, sizeof *names * (size_t)cap);
    if (names) d->names = names;
    kg_tensor **ts = realloc(d->tensors, sizeof *ts * (size_t)cap);
    if (ts) d->tensors = ts;
    if (!names || !ts) return kg_error(KG_ERR_OOM, "tensor_dict", "out of memory growing a tensor dict");
  }
  char *copy = strdup(name);
  if (!copy) return kg_error(KG_ERR_OOM, "tensor_dict", "out of memory copying a tensor name");
  d->names[d->n] = copy;
  d->tensors[d->n] = kg_tensor_retain(t);
  d->n++;
  return KG_OK;
}

kg_status kg_tensor_dict_add_meta(kg_tensor_dict *d, const char *key, const char *value) {
  if (needs_growth(d->nmeta)) {
    int cap = grown(d->nmeta);
    char **k = realloc(d->meta_keys, sizeof *k * (size_t)cap);
    if (k) d->meta_keys = k;
    char **v = realloc(d->meta_values, sizeof *v * (size_t)cap);
    if (v) d->meta_values = v;
    if (!k || !v) return kg_error(KG_ERR_OOM, "tensor_dict", "out of memory growing metadata");
  }
  char *kc = strdup(key), *vc = strdup(value);
  if (!kc || !vc) {
    free(kc);
    free(vc);
    return kg_error(KG_ERR_OOM, "tensor_dict", "out of memory copying metadata");
  }
  d->meta_keys[d->nmeta] = kc;
  d->meta_values[d->nmeta] = vc;
  d->nmeta++;
  return KG_OK;
}

void kg_tensor_dict_free(kg_tensor_dict *d) {
  for (int i = 0; i < d->n; i++) {
    free(d->names[i]);
    kg_tensor_release(d->tensors[i]);
  }
  for (int i = 0; i < d->nmeta; i++) {
    free(d->meta_keys[i]);
    free(d->meta_values[i]);
  }
  free(d->names);
  free(d->tensors);
  free(d->meta_keys);
  free(d->meta_values);
  memset(d, 0, sizeof *d);
}

static bool meta_has(const kg_tensor_dict *d, const char *key) {
  for (int i = 0; i < d->nmeta; i++)
    if (!strcmp(d->meta_keys[i], key)) return true;
  return false;
}

/* ---- dtypes -------------------------------------------------------------------------------- */

static const struct {
  const char *name;
  kg_dtype dt;
} st_dtypes[] = {{"F64", KG_F64}, {"F32", KG_F32}, {"F16", KG_F16}, {"BF16", KG_BF16},
                 {"I64", KG_I64}, {"I32", KG_I32}, {"U8", KG_U8},   {"I8", KG_I8},   {"BOOL", KG_BOOL}};
#define ST_NDTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))
/* in the format but without a keng dtype */
static const char *st_unsupported[] = {"I16",     "U16",     "U32",     "U64", "F8_E4M3",
                                       "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "C64"};

static const char *st_dtype_name(kg_dtype dt) {
  for (int i = 0; i < ST_NDTYPES; i++)
    if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
  return NULL;
}

/* ---- validation ------------------------------------------------------------------------------ */

typedef struct {
  const char *name; /* points into the parsed header */
  kg_dtype dt;
  int ndim;
  int64_t shape[KG_MAX_DIMS];
  uint64_t begin, end;
} st_entry;

typedef struct {
  kg_json *root;
  st_entry *e;
  int n;
  const kg_json *meta; /* "__metadata__" or NULL */
} st_header;

static void header_free(st_header *h) {
  kg_json_free(h->root);
  free(h->e);
  memset(h, 0, sizeof *h);
}

#define IOERR(label, ...) kg_io_error(label, __VA_ARGS__)
static kg_status kg_io_error(const char *label, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static kg_status kg_io_error(const char *label, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return kg_error(KG_ERR_IO, "load", "%s: %s", label, msg);
}

static int entry_by_offset(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return (x->end > y->end) - (x->end < y->end);
}

static kg_status check_entry(const char *label, const char *name, size_t name_len, const kg_json *v, uint64_t data_len,
                             st_entry *e) {
  if (strlen(name) != name_len) return IOERR(label, "tensor name \"%.200s...\" contains a NUL byte", name);
  if (v->type != KG_JSON_OBJECT)
    return IOERR(label, "entry '%.200s' must be an object, got %s", name, kg_json_type_name(v->type));
  const kg_json *dt = kg_json_get(v, "dtype"), *shape = kg_json_get(v, "shape"), *off = kg_json_get(v, "data_offsets");
  if (!dt || !shape || !off)
    return IOERR(label, "tensor '%.200s' lacks \"%s\"", name, !dt ? "dtype" : !shape ? "shape" : "data_offsets");
  if (dt->type != KG_JSON_STRING) return IOERR(label, "tensor '%.200s': \"dtype\" must be a string", name);
  e->name = name;
  int k = 0;
  while (k < ST_NDTYPES && strcmp(dt->str, st_dtypes[k].name))
    k++;
  if (k == ST_NDTYPES) {
    for (size_t u = 0; u < sizeof st_unsupported / sizeof *st_unsupported; u++)
      if (!strcmp(dt->str, st_unsupported[u]))
        return IOERR(label,
                     "tensor '%.200s' has dtype %s, which keng does not support "
                     "(supported: F64, F32, F16, BF16, I64, I32, U8, BOOL)",
                     name, dt->str);
    return IOERR(label,
                 "tensor '%.200s' has unknown dtype '%.40s' "
                 "(supported: F64, F32, F16, BF16, I64, I32, U8, BOOL)",
                 name, dt->str);
  }
  e->dt = st_dtypes[k].dt;
  if (shape->type != KG_JSON_ARRAY) return IOERR(label, "tensor '%.200s': \"shape\" must be an array", name);
  if (shape->n > KG_MAX_DIMS)
    return IOERR(label, "tensor '%.200s' has %d dims; keng supports at most %d", name, shape->n, KG_MAX_DIMS);
  e->ndim = shape->n;
  /* element count in u64 with overflow checks: a hostile shape must not wrap to the byte count */
  uint64_t numel = 1, span = 1; /* span: the product of the non-zero sizes (bounds the strides) */
  bool overflow = false, too_wide = false;
  for (int i = 0; i < shape->n; i++) {
    const kg_json *s = &shape->items[i];
    if (s->type != KG_JSON_NUMBER || !s->is_uint || s->uint > (uint64_t)INT64_MAX)
      return IOERR(label, "tensor '%.200s': shape entries must be non-negative integers (entry %d is not)", name,
                   i + 1);
    e->shape[i] = (int64_t)s->uint;
    if (s->uint && numel > UINT64_MAX / s->uint)
      overflow = true;
    else
      numel *= s->uint;
    if (s->uint && span > (uint64_t)INT64_MAX / 16 / s->uint)
      too_wide = true;
    else if (s->uint)
      span *= s->uint;
  }
  if (off->type != KG_JSON_ARRAY || off->n != 2 || off->items[0].type != KG_JSON_NUMBER ||
      off->items[1].type != KG_JSON_NUMBER || !off->items[0].is_uint || !off->items[1].is_uint)
    return IOERR(label, "tensor '%.200s': \"data_offsets\" must be [begin, end], two non-negative integers", name);
  e->begin = off->items[0].uint;
  e->end = off->items[1].uint;
  if (e->begin > e->end)
    return IOERR(label, "tensor '%.200s': data_offsets [%llu, %llu] end before they begin", name,
                 (unsigned long long)e->begin, (unsigned long long)e->end);
  if (e->end > data_len)
    return IOERR(label, "tensor '%.200s': data_offsets [%llu, %llu] run past the data section (%llu bytes)", name,
                 (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data_len);
  uint64_t es = (uint64_t)kg_dtype_info[e->dt].size;
  if (overflow || numel > UINT64_MAX / es || numel * es != e->end - e->begin) {
    char sb[KG_SHAPE_STR_MAX];
    return IOERR(label, "tensor '%.200s': shape %s of %s needs %s bytes but data_offsets [%llu, %llu] hold %llu", name,
                 kg_shape_str(sb, e->ndim, e->shape), dt->str,
                 overflow || numel > UINT64_MAX / es ? "more than 2^64" : "a different number of",
                 (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)(e->end - e->begin));
  }
  if (too_wide) { /* e.g. [0, 2^32, 2^32]: empty, but no tensor can hold its strides */
    char sb[KG_SHAPE_STR_MAX];
    return IOERR(label, "tensor '%.200s': shape %s is too large (its non-zero sizes multiply past 2^59)", name,
                 kg_shape_str(sb, e->ndim, e->shape));
  }
  return KG_OK;
}

/* Parses and validates the header bytes against a data section of data_len bytes. */
static kg_status parse_header(st_header *h, const char *label, const char *hdr, uint64_t hlen, uint64_t data_len) {
  memset(h, 0, sizeof *h);
  if (hlen == 0 || hdr[0] != '{')
    return IOERR(label, "header must be a JSON object starting with '{' (it starts with %s)",
                 hlen == 0 ? "nothing: N is 0" : "another byte");
  char jerr[256];
  h->root = kg_json_parse(hdr, (size_t)hlen, jerr, sizeof jerr);
  if (!h->root) return IOERR(label, "header is not valid JSON: %s", jerr);
  const kg_json *r = h->root;
  if (r->type != KG_JSON_OBJECT) return header_free(h), IOERR(label, "header must be a JSON object");
  h->e = calloc((size_t)r->n + 1, sizeof *h->e);
  if (!h->e) return header_free(h), kg_error(KG_ERR_OOM, "load", "%s: out of memory reading the header", label);
  for (int i = 0; i < r->n; i++) {
    const kg_json *v = &r->items[i];
    if (!strcmp(r->keys[i], "__metadata__") && r->key_lens[i] == 12) {
      if (v->type != KG_JSON_OBJECT) return header_free(h), IOERR(label, "__metadata__ must be an object of strings");
      for (int j = 0; j < v->n; j++)
        if (v->items[j].type != KG_JSON_STRING || strlen(v->items[j].str) != v->items[j].len ||
            strlen(v->keys[j]) != v->key_lens[j]) {
          kg_status s = IOERR(label, "__metadata__ must map strings to strings; '%.200s' holds a %s", v->keys[j],
                              v->items[j].type == KG_JSON_STRING ? "string with a NUL byte"
                                                                 : kg_json_type_name(v->items[j].type));
          header_free(h);
          return s;
        }
      h->meta = v;
      continue;
    }
    kg_status s = check_entry(label, r->keys[i], r->key_lens[i], v, data_len, &h->e[h->n]);
    if (s) return header_free(h), s;
    h->n++;
  }
  /* offsets must tile the data section: sorted by begin, each starts where the previous ended */
  st_entry *byoff = malloc(sizeof *byoff * ((size_t)h->n + 1));
  if (!byoff) return header_free(h), kg_error(KG_ERR_OOM, "load", "%s: out of memory", label);
  memcpy(byoff, h->e, sizeof *byoff * (size_t)h->n);
  qsort(byoff, (size_t)h->n, sizeof *byoff, entry_by_offset);
  uint64_t at = 0;
  kg_status s = KG_OK;
  for (int i = 0; i < h->n && !s; i++) {
    const st_entry *e = &byoff[i];
    if (e->begin < at)
      s = IOERR(label, "tensors '%.200s' [%llu, %llu) and '%.200s' [%llu, %llu) overlap", byoff[i - 1].name,
                (unsigned long long)byoff[i - 1].begin, (unsigned long long)byoff[i - 1].end, e->name,
                (unsigned long long)e->begin, (unsigned long long)e->end);
    else if (e->begin > at)
      s = IOERR(label,
                "gap of %llu bytes in the data section before tensor '%.200s' (it begins at %llu, the "
                "previous tensor ends at %llu); data_offsets must cover the data section contiguously",
                (unsigned long long)(e->begin - at), e->name, (unsigned long long)e->begin, (unsigned long long)at);
    at = e->end;
  }
  free(byoff);
  if (!s && at != data_len)
    s = IOERR(label, "data section has %llu bytes but the tensors cover only %llu; data_offsets must cover it exactly",
              (unsigned long long)data_len, (unsigned long long)at);
  if (s) header_free(h);
  return s;
}

/* ---- the mapping -------------------------------------------------------------------------- */

typedef struct {
  int refcount;
  void *base;
  size_t len;
} st_map;

static void map_unref(st_map *m) {
  if (m && __atomic_sub_fetch(&m->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
    munmap(m->base, m->len);
    free(m);
  }
}
static void map_release(kg_storage *s) { map_unref(s->owner); }

static bool pickle_name(const char *path) {
  static const char *ext[] = {".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"};
  size_t n = strlen(path);
  for (size_t i = 0; i < sizeof ext / sizeof *ext; i++) {
    size_t k = strlen(ext[i]);
    if (n >= k && !strcmp(path + n - k, ext[i])) return true;
  }
  return false;
}

static kg_status pickle_error(const char *label) {
  return IOERR(label, "this is a pickle checkpoint (PyTorch .bin/.pt/.pth/.ckpt); keng does not load "
                      "pickles, which can run arbitrary code. Convert it to safetensors first, e.g. in Python: "
                      "safetensors.torch.save_file(torch.load(path), \"model.safetensors\")");
}

/* Pickle (protocol 2-5: 0x80 then the protocol) or zip (torch.save since 1.6) content. Only
 * consulted when the bytes do not read as safetensors, since a real header length can start
 * with 0x80 0x02 (N = 640). */
static bool pickle_magic(const unsigned char *b, size_t n) {
  if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) return true;
  if (n >= 4 && b[0] == 'P' && b[1] == 'K' && b[2] == 3 && b[3] == 4) return true;
  return false;
}

/* Validates bytes[0..len) as a whole file and appends its tensors to d: views of `map` when
 * given and aligned, copies otherwise. */
static kg_status parse_file_bytes(kg_tensor_dict *d, const char *label, const unsigned char *bytes, uint64_t len,
                                  st_map *map) {
  if (len < 8) {
    if (pickle_magic(bytes, (size_t)len)) return pickle_error(label);
    return IOERR(label, "file is %llu bytes, too short for the 8-byte header length", (unsigned long long)len);
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = (hlen << 8) | bytes[i];
  bool looks_safetensors = len > 8 && bytes[8] == '{';
  if (!looks_safetensors && pickle_magic(bytes, (size_t)len)) return pickle_error(label);
  if (hlen > ST_MAX_HEADER)
    return IOERR(label, "header length %llu exceeds the 100 MB limit of the format", (unsigned long long)hlen);
  if (hlen > len - 8)
    return IOERR(label, "header length %llu runs past the end of the file (%llu bytes)", (unsigned long long)hlen,
                 (unsigned long long)len);
  const unsigned char *data = bytes + 8 + hlen;
  uint64_t data_len = len - 8 - hlen;
  st_header h;
  KG_TRY(parse_header(&h, label, (const char *)bytes + 8, hlen, data_len));
  kg_status s = KG_OK;
  int first = d->n;
  for (int i = 0; i < h.n && !s; i++) {
    const st_entry *e = &h.e[i];
    unsigned char *p = (unsigned char *)data + e->begin;
    size_t es = (size_t)kg_dtype_info[e->dt].size, nbytes = (size_t)(e->end - e->begin);
    kg_tensor *t = NULL;
    if (map && (uintptr_t)p % es == 0) {
      __atomic_add_fetch(&map->refcount, 1, __ATOMIC_RELAXED);
      s = kg_tensor_from_blob(&t, p, e->ndim, e->shape, e->dt, KG_CPU, map, map_release);
      if (s) map_unref(map);
    } else {
      s = kg_tensor_empty(&t, e->ndim, e->shape, e->dt, KG_CPU);
      if (!s && nbytes) memcpy(kg_data(t), p, nbytes);
    }
    if (!s) s = kg_tensor_dict_add(d, e->name, t);
    kg_tensor_release(t);
  }
  if (h.meta)
    for (int j = 0; j < h.meta->n && !s; j++)
      s = kg_tensor_dict_add_meta(d, h.meta->keys[j], h.meta->items[j].str);
  header_free(&h);
  if (s) { /* drop what this file added */
    for (int i = first; i < d->n; i++) {
      free(d->names[i]);
      kg_tensor_release(d->tensors[i]);
    }
    d->n = first;
  }
  return s;
}

kg_status kg_safetensors_parse(kg_tensor_dict *d, const void *bytes, size_t len, const char *label) {
  memset(d, 0, sizeof *d);
  kg_status s = parse_file_bytes(d, label ? label : "<memory>", bytes, len, NULL);
  if (s) kg_tensor_dict_free(d);
  return s;
}

static kg_status load_file(kg_tensor_dict *d, const char *path) {
  if (pickle_name(path)) return pickle_error(path);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
  if (fd < 0) return IOERR(path, "%s", strerror(errno));
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    close(fd);
    return IOERR(path, "not a regular file");
  }
  uint64_t size = (uint64_t)st.st_size;
  if (size < 16) { /* too small to map usefully, and mmap refuses length 0 */
    unsigned char small[16];
    ssize_t got = pread(fd, small, (size_t)size, 0);
    close(fd);
    if (got != (ssize_t)size) return IOERR(path, "read failed: %s", strerror(errno));
    return parse_file_bytes(d, path, small, size, NULL);
  }
  void *base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  close(fd);
  if (base == MAP_FAILED) return IOERR(path, "mmap failed: %s", strerror(map_errno));
  st_map *m = malloc(sizeof *m);
  if (!m) {
    munmap(base, (size_t)size);
    return kg_error(KG_ERR_OOM, "load", "%s: out of memory", path);
  }
  *m = (st_map){1, base, (size_t)size};
  kg_status s = parse_file_bytes(d, path, base, size, m);
  map_unref(m); /* the loader's reference; tensors hold the rest */
  return s;
}

/* ---- sharded checkpoints -------------------------------------------------------------------- */

static char *path_join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = malloc(a + b + 2);
  if (!p) return NULL;
  memcpy(p, dir, a);
  p[a] = '/';
  memcpy(p + a + 1, name, b + 1);
  return p;
}

static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

static kg_status read_small_file(const char *path, char **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return IOERR(path, "%s", strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > ST_MAX_HEADER) {
    fclose(f);
    return IOERR(path, "not a regular file under 100 MB");
  }
  char *buf = malloc((size_t)st.st_size + 1);
  if (!buf) return fclose(f), kg_error(KG_ERR_OOM, "load", "%s: out of memory", path);
  size_t got = fread(buf, 1, (size_t)st.st_size, f);
  fclose(f);
  if (got != (size_t)st.st_size) return free(buf), IOERR(path, "short read");
  *out = buf;
  *len = got;
  return KG_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The directory an index's shards (and a model directory's other files) must resolve into
 * (symlinks followed): the directory's own, or, for a Hugging Face cache snapshot
 * (<repo>/snapshots/<rev>/, whose files are symlinks into <repo>/blobs/) or a subfolder of one
 * (a diffusers pipeline's <rev>/unet/), that repository's cache folder. NULL when dir cannot be
 * resolved. */
static char *shard_root(const char *dir) {
  char *real = realpath(dir, NULL);
  if (!real) return NULL;
  for (int up = 0; up < 2; up++) { /* dir = <rev> or <rev>/<subfolder> */
    char *cut[3] = {NULL, NULL, NULL};
    char *p = real + strlen(real);
    for (int k = 0; k < up + 2; k++) { /* the last up + 2 separators */
      while (p > real && *--p != '/') {
      }
      if (p == real) break;
      cut[k] = p;
    }
    char *snaps = cut[up + 1];
    if (snaps && !strncmp(snaps + 1, "snapshots/", 10) && snaps + 10 == cut[up]) {
      *snaps = 0;
      return real;
    }
  }
  return real;
}

/* whether the resolved path lies under root */
static bool path_under(const char *root, const char *path) {
  size_t n = strlen(root);
  if (n == 1) return true; /* root is "/" */
  return !strncmp(path, root, n) && path[n] == '/';
}

static kg_status load_index(kg_tensor_dict *d, const char *path) {
  char *text = NULL;
  size_t len = 0;
  KG_TRY(read_small_file(path, &text, &len));
  char jerr[256];
  kg_json *root = kg_json_parse(text, len, jerr, sizeof jerr);
  free(text);
  if (!root) return IOERR(path, "index is not valid JSON: %s", jerr);
  const kg_json *wm = kg_json_get(root, "weight_map");
  if (!wm || wm->type != KG_JSON_OBJECT)
    return kg_json_free(root), IOERR(path, "index has no \"weight_map\" object (name -> shard file)");
  kg_status s = KG_OK;
  /* the distinct shard files, in first-seen order */
  const char **files = calloc((size_t)wm->n + 1, sizeof *files);
  int nfiles = 0;
  if (!files) s = kg_error(KG_ERR_OOM, "load", "%s: out of memory", path);
  for (int i = 0; i < wm->n && !s; i++) {
    const kg_json *f = &wm->items[i];
    if (f->type != KG_JSON_STRING || !f->len || strlen(f->str) != f->len)
      s = IOERR(path, "weight_map['%.200s'] must be a file name", wm->keys[i]);
    else if (f->str[0] == '/' || strstr(f->str, "..") || strchr(f->str, '\\'))
      s = IOERR(path, "weight_map['%.200s'] = '%.200s' leaves the index's directory", wm->keys[i], f->str);
    int k = 0;
    while (!s && k < nfiles && strcmp(files[k], f->str))
      k++;
    if (!s && k == nfiles) files[nfiles++] = f->str;
  }
  /* names sorted "name\0file" for lookups */
  char **sorted = s ? NULL : calloc((size_t)wm->n + 1, sizeof *sorted);
  if (!s && !sorted) s = kg_error(KG_ERR_OOM, "load", "%s: out of memory", path);
  for (int i = 0; i < wm->n && !s; i++)
    sorted[i] = wm->keys[i];
  if (!s) qsort(sorted, (size_t)wm->n, sizeof *sorted, cmp_str);
  char *dir = dir_of(path);
  char *allowed = dir ? shard_root(dir) : NULL;
  int found = 0;
  for (int k = 0; k < nfiles && !s; k++) {
    char *shard = dir ? path_join(dir, files[k]) : NULL;
    if (!shard) {
      s = kg_error(KG_ERR_OOM, "load", "%s: out of memory", path);
      break;
    }
    /* a shard that is a symlink must not lead out of the model directory */
    char *real = allowed ? realpath(shard, NULL) : NULL;
    if (real && !path_under(allowed, real))
      s = IOERR(path, "shard '%.200s' resolves to '%.300s', outside the model directory '%.300s' (a symlink "
                      "leaving it is refused)", files[k], real, allowed);
    free(real);
    kg_tensor_dict part = {0};
    if (!s) s = load_file(&part, shard);
    for (int i = 0; i < part.n && !s; i++) {
      char **hit = bsearch(&part.names[i], sorted, (size_t)wm->n, sizeof *sorted, cmp_str);
      const kg_json *want = hit ? kg_json_get(wm, *hit) : NULL;
      if (!want)
        s = IOERR(path, "shard '%.200s' holds '%.200s', which the weight_map does not list", files[k], part.names[i]);
      else if (strcmp(want->str, files[k]))
        s = IOERR(path, "shard '%.200s' holds '%.200s', but the weight_map puts it in '%.200s'", files[k],
                  part.names[i], want->str);
      else {
        s = kg_tensor_dict_add(d, part.names[i], part.tensors[i]);
        found++;
      }
    }
    for (int j = 0; j < part.nmeta && !s; j++)
      if (!meta_has(d, part.meta_keys[j])) s = kg_tensor_dict_add_meta(d, part.meta_keys[j], part.meta_values[j]);
    kg_tensor_dict_free(&part);
    free(shard);
  }
  if (!s && found != wm->n) {
    /* name the first listed tensor that no shard held */
    for (int i = 0; i < wm->n; i++) {
      bool have = false;
      for (int j = 0; j < d->n && !have; j++)
        have = !strcmp(d->names[j], wm->keys[i]);
      if (!have) {
        s = IOERR(path, "weight_map lists '%.200s' in '%.200s', but that shard has no such tensor", wm->keys[i],
                  wm->items[i].str);
        break;
      }
    }
  }
  /* the index's own "metadata" (e.g. total_size) comes first, scalars as their JSON text */
  const kg_json *meta = kg_json_get(root, "metadata");
  if (!s && meta && meta->type == KG_JSON_OBJECT) {
    kg_tensor_dict idx_meta = {0};
    for (int j = 0; j < meta->n && !s; j++) {
      const kg_json *v = &meta->items[j];
      char num[64];
      if (v->type == KG_JSON_STRING)
        s = kg_tensor_dict_add_meta(&idx_meta, meta->keys[j], v->str);
      else if (v->type == KG_JSON_NUMBER) {
        if (v->is_uint)
          snprintf(num, sizeof num, "%llu", (unsigned long long)v->uint);
        else
          snprintf(num, sizeof num, "%.17g", v->number);
        s = kg_tensor_dict_add_meta(&idx_meta, meta->keys[j], num);
      }
    }
    for (int j = 0; j < d->nmeta && !s; j++)
      if (!meta_has(&idx_meta, d->meta_keys[j]))
        s = kg_tensor_dict_add_meta(&idx_meta, d->meta_keys[j], d->meta_values[j]);
    if (!s) { /* swap the merged metadata in */
      for (int j = 0; j < d->nmeta; j++)
        free(d->meta_keys[j]), free(d->meta_values[j]);
      free(d->meta_keys), free(d->meta_values);
      d->meta_keys = idx_meta.meta_keys, d->meta_values = idx_meta.meta_values, d->nmeta = idx_meta.nmeta;
    } else
      kg_tensor_dict_free(&idx_meta);
  }
  free(dir);
  free(allowed);
  free(sorted);
  free(files);
  kg_json_free(root);
  return s;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

static bool is_file(const char *path) {
  struct stat st;
  return !stat(path, &st) && S_ISREG(st.st_mode);
}

bool kg_path_escapes(const char *dir, const char *path, char **real, char **root) {
  *real = *root = NULL;
  char *r = realpath(path, NULL);
  char *top = r ? shard_root(dir) : NULL;
  if (!r || !top || path_under(top, r)) {
    free(r);
    free(top);
    return false;
  }
  *real = r;
  *root = top;
  return true;
}

kg_status kg_safetensors_load(kg_tensor_dict *d, const char *path) {
  memset(d, 0, sizeof *d);
  struct stat st;
  if (stat(path, &st)) return IOERR(path, "%s", strerror(errno));
  kg_status s;
  if (S_ISDIR(st.st_mode)) {
    char *single = path_join(path, "model.safetensors"), *index = path_join(path, "model.safetensors.index.json");
    char *pickle = path_join(path, "pytorch_model.bin");
    if (!single || !index || !pickle)
      s = kg_error(KG_ERR_OOM, "load", "%s: out of memory", path);
    else if (is_file(single))
      s = load_file(d, single);
    else if (is_file(index))
      s = load_index(d, index);
    else if (is_file(pickle))
      s = IOERR(path, "directory holds no model.safetensors or model.safetensors.index.json, only "
                      "pytorch_model.bin, a pickle checkpoint keng does not load: convert it to safetensors first");
    else
      s = IOERR(path, "directory holds neither model.safetensors nor model.safetensors.index.json");
    free(single);
    free(index);
    free(pickle);
  } else if (!S_ISREG(st.st_mode))
    s = IOERR(path, "not a regular file or directory");
  else if (ends_with(path, ".json"))
    s = load_index(d, path);
  else
    s = load_file(d, path);
  if (s) kg_tensor_dict_free(d);
  return s;
}

/* ---- saving ----------------------------------------------------------------------------------- */

#define SAVEERR(path, ...) kg_save_error(path, __VA_ARGS__)
static kg_status kg_save_error(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static kg_status kg_save_error(const char *path, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return kg_error(KG_ERR_IO, "save", "%s: %s", path, msg);
}

typedef struct {
  int fd;
  uint64_t written, limit; /* limit: KENG_IO_FAIL_AFTER_BYTES, or UINT64_MAX */
  const char *path;
} st_writer;

static kg_status write_all(st_writer *w, const void *buf, size_t n) {
  const char *p = buf;
  bool injected = false;
  if (w->written + n > w->limit) { /* fault injection: write up to the limit, then fail */
    n = (size_t)(w->limit - w->written);
    injected = true;
  }
  while (n) {
    size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    ssize_t k = write(w->fd, p, chunk);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return SAVEERR(w->path, "write failed: %s", k < 0 ? strerror(errno) : "no progress");
    p += k;
    n -= (size_t)k;
    w->written += (uint64_t)k;
  }
  if (injected)
    return SAVEERR(w->path, "write failed: injected failure after %llu bytes (KENG_IO_FAIL_AFTER_BYTES)",
                   (unsigned long long)w->limit);
  return KG_OK;
}

typedef struct {
  const char *name;
  kg_tensor *t; /* cpu, contiguous */
  uint64_t begin, end;
} save_item;

static int item_by_name(const void *a, const void *b) {
  return strcmp(((const save_item *)a)->name, ((const save_item *)b)->name);
}
/* data order: widest elements first, then by name, so every tensor is naturally aligned */
static int item_by_layout(const void *a, const void *b) {
  const save_item *x = a, *y = b;
  int sx = kg_dtype_info[x->t->dtype].size, sy = kg_dtype_info[y->t->dtype].size;
  if (sx != sy) return sy - sx;
  return strcmp(x->name, y->name);
}

static kg_status prepare_items(const char *path, const kg_tensor_dict *d, save_item *items) {
  for (int i = 0; i < d->n; i++) {
    const kg_tensor *t = d->tensors[i];
    const char *name = d->names[i];
    items[i].name = name;
    if (!strcmp(name, "__metadata__")) return SAVEERR(path, "'__metadata__' is reserved and cannot name a tensor");
    if (!kg_utf8_valid(name, strlen(name))) return SAVEERR(path, "tensor name '%.200s' is not valid UTF-8", name);
    if (!st_dtype_name(t->dtype))
      return SAVEERR(path, "tensor '%.200s' has dtype %s, which safetensors cannot hold", name,
                     kg_dtype_info[t->dtype].name);
    if (t->device.type == KG_DEV_META)
      return SAVEERR(path, "tensor '%.200s' is on the meta device and has no values to save", name);
    if (t->device.type == KG_DEV_CPU && kg_is_contiguous(t)) {
      items[i].t = kg_tensor_retain((kg_tensor *)t);
      continue;
    }
    KG_TRY(kg_tensor_empty(&items[i].t, t->ndim, t->shape, t->dtype, KG_CPU));
    KG_TRY(kg_copy_(items[i].t, t)); /* same dtype: moves bits exactly; gathers views and device memory */
  }
  for (int i = 0; i < d->nmeta; i++)
    if (!kg_utf8_valid(d->meta_keys[i], strlen(d->meta_keys[i])) ||
        !kg_utf8_valid(d->meta_values[i], strlen(d->meta_values[i])))
      return SAVEERR(path, "metadata '%.200s' is not valid UTF-8", d->meta_keys[i]);
  return KG_OK;
}

static kg_status build_header(const char *path, const kg_tensor_dict *d, save_item *items, kg_json_buf *b) {
  int n = d->n;
  qsort(items, (size_t)n, sizeof *items, item_by_layout);
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    items[i].begin = at;
    at += (uint64_t)kg_numel(items[i].t) * (uint64_t)kg_elem_size(items[i].t);
    items[i].end = at;
  }
  qsort(items, (size_t)n, sizeof *items, item_by_name);
  for (int i = 1; i < n; i++)
    if (!strcmp(items[i - 1].name, items[i].name))
      return SAVEERR(path, "tensor name '%.200s' appears twice", items[i].name);
  for (int i = 0; i < d->nmeta; i++)
    for (int j = 0; j < i; j++)
      if (!strcmp(d->meta_keys[i], d->meta_keys[j]))
        return SAVEERR(path, "metadata key '%.200s' appears twice", d->meta_keys[i]);
  kg_jb_puts(b, "{");
  if (d->nmeta) { /* keys sorted too, so equal inputs give byte-identical files */
    char **keys = malloc(sizeof *keys * (size_t)d->nmeta);
    if (!keys) return kg_error(KG_ERR_OOM, "save", "%s: out of memory", path);
    memcpy(keys, d->meta_keys, sizeof *keys * (size_t)d->nmeta);
    qsort(keys, (size_t)d->nmeta, sizeof *keys, cmp_str);
    kg_jb_puts(b, "\"__metadata__\":{");
    for (int i = 0; i < d->nmeta; i++) {
      int j = 0;
      while (d->meta_keys[j] != keys[i])
        j++;
      if (i) kg_jb_puts(b, ",");
      kg_jb_string(b, keys[i], strlen(keys[i]));
      kg_jb_puts(b, ":");
      kg_jb_string(b, d->meta_values[j], strlen(d->meta_values[j]));
    }
    free(keys);
    kg_jb_puts(b, n ? "}," : "}");
  }
  for (int i = 0; i < n; i++) {
    const kg_tensor *t = items[i].t;
    if (i) kg_jb_puts(b, ",");
    kg_jb_string(b, items[i].name, strlen(items[i].name));
    kg_jb_puts(b, ":{\"dtype\":\"");
    kg_jb_puts(b, st_dtype_name(t->dtype));
    kg_jb_puts(b, "\",\"shape\":[");
    for (int k = 0; k < t->ndim; k++) {
      if (k) kg_jb_puts(b, ",");
      kg_jb_uint(b, (uint64_t)t->shape[k]);
    }
    kg_jb_puts(b, "],\"data_offsets\":[");
    kg_jb_uint(b, items[i].begin);
    kg_jb_puts(b, ",");
    kg_jb_uint(b, items[i].end);
    kg_jb_puts(b, "]}");
  }
  kg_jb_puts(b, "}");
  while (b->len % 8)
    kg_jb_puts(b, " "); /* data starts 8-aligned */
  if (b->failed) return kg_error(KG_ERR_OOM, "save", "%s: out of memory building the header", path);
  if ((uint64_t)b->len > ST_MAX_HEADER) return SAVEERR(path, "header would exceed the format's 100 MB limit");
  qsort(items, (size_t)n, sizeof *items, item_by_layout); /* back to data order for writing */
  return KG_OK;
}

static kg_status write_temp(st_writer *w, const kg_json_buf *hdr, const save_item *items, int n) {
  unsigned char len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (unsigned char)((uint64_t)hdr->len >> (8 * i));
  KG_TRY(write_all(w, len8, 8));
  KG_TRY(write_all(w, hdr->data, hdr->len));
  for (int i = 0; i < n; i++)
    if (items[i].end > items[i].begin)
      KG_TRY(write_all(w, kg_data(items[i].t), (size_t)(items[i].end - items[i].begin)));
  if (fsync(w->fd)) return SAVEERR(w->path, "fsync failed: %s", strerror(errno));
  return KG_OK;
}

/* removes `.BASE.tmp-XXXXXX` files in dir that no live save holds locked: a save killed between
 * mkstemp and rename leaves one, as large as the checkpoint. Only our own regular files that
 * match the pattern exactly are touched; failures are ignored (this is housekeeping). */
static void remove_stale_temps(const char *dir, const char *base) {
  DIR *dh = opendir(dir);
  if (!dh) return;
  size_t bl = strlen(base);
  struct dirent *e;
  while ((e = readdir(dh))) {
    const char *n = e->d_name;
    if (n[0] != '.' || strncmp(n + 1, base, bl) || strncmp(n + 1 + bl, ".tmp-", 5) || strlen(n + bl + 6) != 6) continue;
    int fd = openat(dirfd(dh), n, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st;
    if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_uid == geteuid() && !flock(fd, LOCK_EX | LOCK_NB))
      unlinkat(dirfd(dh), n, 0);
    close(fd); /* drops the lock */
  }
  closedir(dh);
}

kg_status kg_safetensors_save(const char *path, const kg_tensor_dict *d) {
  save_item *items = calloc((size_t)d->n + 1, sizeof *items);
  if (!items) return kg_error(KG_ERR_OOM, "save", "%s: out of memory", path);
  kg_json_buf hdr = {0};
  kg_status s = prepare_items(path, d, items);
  if (!s) s = build_header(path, d, items, &hdr);
  char *dir = dir_of(path), *tmp = NULL;
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if (!s && (!dir || !(tmp = malloc(strlen(dir) + strlen(base) + 16))))
    s = kg_error(KG_ERR_OOM, "save", "%s: out of memory", path);
  int fd = -1;
  if (!s) {
    remove_stale_temps(dir, base);
    sprintf(tmp, "%s/.%s.tmp-XXXXXX", dir, base); /* same directory: rename stays atomic */
    fd = mkstemp(tmp);
    if (fd < 0) s = SAVEERR(path, "cannot create a temp file in %s: %s", dir, strerror(errno));
    else flock(fd, LOCK_EX); /* marks it live for another save's remove_stale_temps */
  }
  if (!s) {
    mode_t mask = umask(0);
    umask(mask);
    struct stat old;
    fchmod(fd, !stat(path, &old) ? (old.st_mode & 07777) : (0666 & ~mask)); /* like a plain create */
    st_writer w = {fd, 0, UINT64_MAX, path};
    if (kg_env_is_set(KG_ENV_KENG_IO_FAIL_AFTER_BYTES)) w.limit = (uint64_t)kg_env_int(KG_ENV_KENG_IO_FAIL_AFTER_BYTES);
    s = write_temp(&w, &hdr, items, d->n);
    if (close(fd) && !s) s = SAVEERR(path, "close failed: %s", strerror(errno));
    if (!s && rename(tmp, path)) s = SAVEERR(path, "rename of the temp file failed: %s", strerror(errno));
    if (s)
      unlink(tmp); /* the old file, if any, was never touched */
    else {
      int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) { /* makes the rename itself durable */
        if (fsync(dfd) && errno != EINVAL) s = SAVEERR(path, "fsync of directory %s failed: %s", dir, strerror(errno));
        close(dfd);
      }
    }
  }
  for (int i = 0; i < d->n; i++)
    kg_tensor_release(items[i].t);
  free(items);
  free(tmp);
  free(dir);
  kg_jb_free(&hdr);
  return s;
}
