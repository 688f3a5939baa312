/* json.h — a small strict JSON reader and writer for the checkpoint code (engine/io).
 *
 * The reader builds a tree from a byte buffer that need not be NUL-terminated. It enforces
 * RFC 8259 strictly: UTF-8 validated inside strings (no overlong forms, no surrogates),
 * escapes checked (\u pairs joined, lone surrogates refused), control characters refused,
 * duplicate object keys refused, nesting limited (KG_JSON_MAX_DEPTH) so no input can exhaust
 * the stack. Any byte sequence yields a tree or an error message, never a crash.
 * The writer appends to a growable buffer and escapes strings. Engine-private. */
#ifndef KENG_IO_JSON_H
#define KENG_IO_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KG_JSON_MAX_DEPTH 64

typedef enum { KG_JSON_NULL, KG_JSON_BOOL, KG_JSON_NUMBER, KG_JSON_STRING, KG_JSON_ARRAY, KG_JSON_OBJECT } kg_json_type;

typedef struct kg_json {
  kg_json_type type;
  bool boolean;
  /* numbers: is_uint when written as digits only (no sign, fraction or exponent) and < 2^64 */
  bool is_uint;
  uint64_t uint;
  double number;
  char *str;             /* strings: decoded UTF-8, NUL-terminated (may hold inner NULs: see len) */
  size_t len;            /* strings: byte length */
  int n;                 /* arrays and objects: element count */
  struct kg_json *items; /* [n] values */
  char **keys;           /* objects: [n] decoded keys, NUL-terminated */
  size_t *key_lens;      /* objects: [n] key byte lengths */
} kg_json;

/* Parses src[0..len) as one JSON value (surrounded by optional whitespace). On failure returns
 * NULL and writes a message with the byte offset into err. */
kg_json *kg_json_parse(const char *src, size_t len, char *err, size_t errlen);
void kg_json_free(kg_json *v);
/* The member `key` of an object, or NULL. */
const kg_json *kg_json_get(const kg_json *obj, const char *key);
const char *kg_json_type_name(kg_json_type t);
/* True when s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or values > U+10FFFF). */
bool kg_utf8_valid(const char *s, size_t n);

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
