/* json.h — the one JSON reader of keng (engine/io/json.c): safetensors headers and index files,
 * tokenizer.json, vocab.json, and (through the Lua binding behind keng.json) every config.json.
 *
 * The reader builds a tree from a byte buffer that need not be NUL-terminated. It enforces
 * RFC 8259 strictly: UTF-8 validated inside strings (no overlong forms, no surrogates),
 * escapes checked (\u pairs joined, lone surrogates refused), control characters refused,
 * duplicate object keys refused naming the key, numbers that overflow a double refused (never
 * read as infinity), nesting limited (KG_JSON_MAX_DEPTH) so no input can exhaust the stack.
 * Any byte sequence yields a tree or an error message naming the line, column and byte (all
 * 1-based), never a crash. */
#ifndef KENG_JSON_H
#define KENG_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KG_JSON_MAX_DEPTH 64

/* Flags of kg_json_parse_ex. KG_JSON_NONFINITE also accepts the bare tokens NaN, Infinity and
 * -Infinity as numbers: not JSON, but Python's json module writes them for float('nan') and
 * float('inf') (diffusers scheduler configs hold -Infinity) and reads them back. */
#define KG_JSON_NONFINITE 1u

typedef enum { KG_JSON_NULL, KG_JSON_BOOL, KG_JSON_NUMBER, KG_JSON_STRING, KG_JSON_ARRAY, KG_JSON_OBJECT } kg_json_type;

typedef struct kg_json {
  kg_json_type type;
  bool boolean;
  /* numbers: is_uint when written as digits only (no sign, fraction or exponent) and < 2^64;
   * is_int when written without fraction or exponent and in [-2^63, 2^63) (then i64 is exact) */
  bool is_uint, is_int;
  uint64_t uint;
  int64_t i64;
  double number;
  char *str;             /* strings: decoded UTF-8, NUL-terminated (may hold inner NULs: see len) */
  size_t len;            /* strings: byte length */
  int n;                 /* arrays and objects: element count */
  struct kg_json *items; /* [n] values */
  char **keys;           /* objects: [n] decoded keys, NUL-terminated */
  size_t *key_lens;      /* objects: [n] key byte lengths */
} kg_json;

/* Parses src[0..len) as one JSON value (surrounded by optional whitespace). On failure returns
 * NULL and writes "invalid JSON at line L, column C (byte B): what" into err. */
kg_json *kg_json_parse(const char *src, size_t len, char *err, size_t errlen);
/* The same with KG_JSON_* flags (0: kg_json_parse). */
kg_json *kg_json_parse_ex(const char *src, size_t len, unsigned flags, char *err, size_t errlen);
void kg_json_free(kg_json *v);
/* The member `key` of an object, or NULL. */
const kg_json *kg_json_get(const kg_json *obj, const char *key);
const char *kg_json_type_name(kg_json_type t);
/* True when s[0..n) is well-formed UTF-8 (no overlong forms, surrogates or values > U+10FFFF). */
bool kg_utf8_valid(const char *s, size_t n);

#ifdef __cplusplus
}
#endif

#endif
