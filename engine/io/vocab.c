/* vocab.c — token tables, whole-file reads and id lists for the tokenizers (vocab.h). */
#include "vocab.h"

#include <errno.h>
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

char *kg_read_file(const char *path, const char *op, const char *what, size_t *len, kg_status *st) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    *st = kg_error(KG_ERR_IO, op, "cannot open %s '%s': %s", what, path, strerror(errno));
    return NULL;
  }
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 65536 > cap) {
      cap = cap ? cap * 2 : 1 << 20;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        *st = kg_error(KG_ERR_OOM, op, "out of memory reading '%s'", path);
        return NULL;
      }
      buf = nb;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) break;
  }
  bool bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    *st = kg_error(KG_ERR_IO, op, "error reading %s '%s'", what, path);
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
