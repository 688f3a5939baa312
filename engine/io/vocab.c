/* vocab.c — token tables, whole-file reads and id lists for the tokenizers (vocab.h). */
#include "vocab.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FNV-1a over the token's bytes */
static uint64_t hash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
  return h;
}

bool kg_vocab_alloc(kg_vocab *v, int64_t cap) {
  v->tokens = calloc(cap ? (size_t)cap : 1, sizeof *v->tokens);
  v->lens = calloc(cap ? (size_t)cap : 1, sizeof *v->lens);
  return v->tokens && v->lens;
}

bool kg_vocab_index(kg_vocab *v) {
  v->nslots = 16;
  while (v->nslots < (size_t)v->n * 2)
    v->nslots *= 2;
  v->slots = malloc(v->nslots * sizeof *v->slots);
  if (!v->slots) return false;
  for (size_t i = 0; i < v->nslots; i++)
    v->slots[i] = -1;
  size_t mask = v->nslots - 1;
  for (int64_t id = 0; id < v->n; id++) {
    for (size_t i = hash(v->tokens[id], v->lens[id]) & mask;; i = (i + 1) & mask) {
      int64_t old = v->slots[i];
      if (old < 0 || (v->lens[old] == v->lens[id] && memcmp(v->tokens[old], v->tokens[id], v->lens[id]) == 0)) {
        v->slots[i] = id;
        break;
      }
    }
  }
  return true;
}

int64_t kg_vocab_find(const kg_vocab *v, const char *s, size_t n) {
  size_t mask = v->nslots - 1;
  for (size_t i = hash(s, n) & mask;; i = (i + 1) & mask) {
    int64_t id = v->slots[i];
    if (id < 0) return -1;
    if (v->lens[id] == n && memcmp(v->tokens[id], s, n) == 0) return id;
  }
}

void kg_vocab_free(kg_vocab *v) {
  if (v->tokens)
    for (int64_t i = 0; i < v->n; i++)
      free(v->tokens[i]);
  free(v->tokens);
  free(v->lens);
  free(v->slots);
}

FILE *kg_open_regular(const char *path, const char *op, const char *what, uint64_t max_bytes, uint64_t *size,
                      kg_status *st) {
  /* messages: "cannot open vocabulary 'p': ..." with a `what`, "p: ..." without one */
  const char *w = what ? what : "file";
  char who[600]; /* "vocabulary 'p' " or "p: " */
  if (what) snprintf(who, sizeof who, "%s '%.500s' ", what, path);
  else snprintf(who, sizeof who, "%.500s: ", path);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
  if (fd < 0) {
    if (what) *st = kg_error(KG_ERR_IO, op, "cannot open %s '%s': %s", what, path, strerror(errno));
    else *st = kg_error(KG_ERR_IO, op, "%s: %s", path, strerror(errno));
    return NULL;
  }
  struct stat sb;
  if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
    close(fd);
    *st = kg_error(KG_ERR_IO, op, "%sis not a regular file (%s)", who,
                   S_ISDIR(sb.st_mode) ? "a directory" : "a device, FIFO or socket");
    return NULL;
  }
  if ((uint64_t)sb.st_size > max_bytes) {
    close(fd);
    *st = kg_error(KG_ERR_IO, op, "%sis %llu bytes, more than the %llu a %s can be", who, (unsigned long long)sb.st_size,
                   (unsigned long long)max_bytes, w);
    return NULL;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    *st = kg_error(KG_ERR_OOM, op, "out of memory opening '%s'", path);
    return NULL;
  }
  *size = (uint64_t)sb.st_size;
  *st = KG_OK;
  return f;
}

char *kg_read_file(const char *path, const char *op, const char *what, size_t *len, kg_status *st) {
  uint64_t size;
  FILE *f = kg_open_regular(path, op, what, KG_MAX_READ_FILE, &size, st);
  if (!f) return NULL;
  /* the size stat gave, plus one byte to notice a file that grows while it is read */
  char *buf = malloc((size_t)size + 1);
  if (!buf) {
    fclose(f);
    *st = kg_error(KG_ERR_OOM, op, "out of memory reading '%s' (%llu bytes)", path, (unsigned long long)size);
    return NULL;
  }
  size_t n = fread(buf, 1, (size_t)size + 1, f);
  bool bad = ferror(f);
  fclose(f);
  if (bad || n != size) {
    free(buf);
    *st = kg_error(KG_ERR_IO, op, "error reading %s '%s'%s", what, path, bad ? "" : ": its size changed while it was read");
    return NULL;
  }
  *len = n;
  *st = KG_OK;
  return buf;
}

bool kg_ids_push(kg_ids *a, int32_t x) {
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 64;
    int32_t *nv = realloc(a->v, cap * sizeof *nv);
    if (!nv) return false;
    a->v = nv;
    a->cap = cap;
  }
  a->v[a->n++] = x;
  return true;
}
