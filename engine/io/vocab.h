/* vocab.h — engine-private pieces the text tokenizers share (wordpiece.c, clip_bpe.c): reading a
 * whole file, a token table with a hash index (FNV-1a, open addressing), and a growable list of
 * ids. */
#ifndef KENG_IO_VOCAB_H
#define KENG_IO_VOCAB_H

#include <stdio.h>
#include <keng/keng.h>

typedef struct {
  int64_t n;      /* tokens: ids 0..n-1 */
  char **tokens;  /* [n] NUL-terminated */
  size_t *lens;   /* [n] */
  int64_t *slots; /* hash index of ids, -1 = empty */
  size_t nslots;  /* a power of two */
} kg_vocab;

/* Room for cap tokens, all NULL (v->n, the count set so far, is the caller's); false when out
 * of memory. */
bool kg_vocab_alloc(kg_vocab *v, int64_t cap);
/* Indexes tokens 0..n-1 in id order: of equal tokens the last one wins, as a Python dict built
 * line by line keeps; false when out of memory. */
bool kg_vocab_index(kg_vocab *v);
/* The id of the token s[0..n), or -1. */
int64_t kg_vocab_find(const kg_vocab *v, const char *s, size_t n);
/* Frees what v holds (not v itself). */
void kg_vocab_free(kg_vocab *v);

/* Text and model files keng reads whole (vocabularies, merges, SentencePiece models) are refused
 * beyond this size: a wrong path (a disk image, /dev/zero) must fail at once, not after eating
 * the memory. The largest real ones are tens of MB. */
#define KG_MAX_READ_FILE ((uint64_t)1 << 30)

/* path opened for reading when it is a regular file of at most max_bytes (*size set), else NULL
 * with *st naming op and `what`: a directory, device or FIFO is refused without blocking. */
FILE *kg_open_regular(const char *path, const char *op, const char *what, uint64_t max_bytes, uint64_t *size,
                      kg_status *st);

/* The whole file at path (malloc'd; a regular file of at most KG_MAX_READ_FILE bytes), or NULL
 * with *st set by an error that names op and calls the file `what` ("cannot open vocabulary
 * '...': ..."). */
char *kg_read_file(const char *path, const char *op, const char *what, size_t *len, kg_status *st);

typedef struct {
  int32_t *v;
  size_t n, cap;
} kg_ids;
/* Appends x; false when out of memory (a is unchanged). */
bool kg_ids_push(kg_ids *a, int32_t x);

#endif
