/* fuzz_json.c — the JSON reader (engine/io/json.c) used for safetensors headers and
 * model.safetensors.index.json (strict) and, with KG_JSON_NONFINITE, for config.json: any bytes
 * give a tree or an error message in both modes. A parsed tree is walked and re-encoded with the
 * writer (strings must be valid UTF-8). */
#include "../../engine/io/json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void walk(const kg_json *v, kg_json_buf *b, int depth) {
  if (depth > KG_JSON_MAX_DEPTH + 1) __builtin_trap(); /* the nesting limit must hold */
  switch (v->type) {
  case KG_JSON_STRING:
    if (!kg_utf8_valid(v->str, v->len) || v->str[v->len] != 0) __builtin_trap();
    kg_jb_string(b, v->str, v->len);
    break;
  case KG_JSON_NUMBER: kg_jb_uint(b, v->is_uint ? v->uint : 0); break;
  case KG_JSON_ARRAY:
  case KG_JSON_OBJECT:
    kg_jb_puts(b, v->type == KG_JSON_ARRAY ? "[" : "{");
    for (int i = 0; i < v->n; i++) {
      if (v->type == KG_JSON_OBJECT) {
        if (!kg_utf8_valid(v->keys[i], v->key_lens[i])) __builtin_trap();
        kg_jb_string(b, v->keys[i], v->key_lens[i]);
        if (kg_json_get(v, v->keys[i]) == NULL && strlen(v->keys[i]) == v->key_lens[i]) __builtin_trap();
      }
      walk(&v->items[i], b, depth + 1);
    }
    kg_jb_puts(b, v->type == KG_JSON_ARRAY ? "]" : "}");
    break;
  default: kg_jb_puts(b, kg_json_type_name(v->type)); break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[256];
  err[0] = 0;
  /* config reading's mode (NaN / Infinity tokens, keng.json.decode) accepts all that the strict
   * mode (safetensors headers) accepts */
  kg_json *lax = kg_json_parse_ex((const char *)data, size, KG_JSON_NONFINITE, err, sizeof err);
  if (!lax && (!err[0] || !memchr(err, 0, sizeof err))) __builtin_trap();
  kg_json_buf b = {0};
  if (lax) walk(lax, &b, 0);
  kg_json_free(lax);
  err[0] = 0;
  kg_json *v = kg_json_parse((const char *)data, size, err, sizeof err);
  if (!v) {
    if (!err[0] || !memchr(err, 0, sizeof err)) __builtin_trap();
    kg_jb_free(&b);
    return 0;
  }
  if (!lax) __builtin_trap();
  walk(v, &b, 0);
  kg_jb_free(&b);
  kg_json_free(v);
  return 0;
}
