/* json.h — the engine's JSON reader (public: <keng/json.h>) and the small writer used by the
 * checkpoint code (engine/io). The writer appends to a growable buffer and escapes strings.
 * The writer is engine-private. */
#ifndef KENG_IO_JSON_H
#define KENG_IO_JSON_H

#include <keng/json.h>

/* Growable output buffer; `failed` latches when an allocation fails. */
typedef struct {
  char *data;
  size_t len, cap;
  bool failed;
} kg_json_buf;
void kg_jb_raw(kg_json_buf *b, const char *s, size_t n);
void kg_jb_puts(kg_json_buf *b, const char *s);
void kg_jb_string(kg_json_buf *b, const char *s, size_t n); /* quoted and escaped */
void kg_jb_uint(kg_json_buf *b, uint64_t v);
void kg_jb_free(kg_json_buf *b);

#endif
