/* fuzz_gguf.c — kg_gguf_parse over arbitrary bytes: the header, metadata (nested arrays,
 * strings, counts), tensor infos (dims, types, offsets, alignment) and the data section. A file
 * either parses, and then every tensor converts (views, int4 repacking, dequantization) and lies
 * inside the buffer, or fails with an error; never a crash. */
#include <keng/keng.h>
#include <keng/gguf.h>

#include <stdint.h>
#include <string.h>

static volatile uint8_t sink;

static void touch(const kg_tensor *t) { /* a tensor pointing outside its storage shows up under ASan */
  if (!t) return;
  const uint8_t *p = kg_data(t);
  size_t nb = (size_t)kg_numel(t) * kg_elem_size(t);
  for (size_t k = 0; k < nb; k++) sink ^= p[k];
}

static void walk(const kg_gguf_value *v) {
  if (v->type == KG_GGUF_STRING)
    for (uint64_t k = 0; k < v->len; k++) sink ^= (uint8_t)v->str[k];
  if (v->type == KG_GGUF_ARRAY)
    for (uint64_t k = 0; k < v->n; k++) walk(&v->items[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kg_gguf *g = NULL;
  if (kg_gguf_parse(&g, data, size, "fuzz") != KG_OK) {
    if (!kg_last_error()[0]) __builtin_trap(); /* a failure must say why */
    return 0;
  }
  for (int64_t i = 0; i < kg_gguf_n_kv(g); i++) walk(kg_gguf_value_at(g, i));
  for (int64_t i = 0; i < kg_gguf_n_tensors(g); i++)
    for (int keep = 0; keep < 2; keep++) {
      kg_tensor *t = NULL, *s = NULL;
      if (kg_gguf_tensor(g, i, keep ? KG_BF16 : KG_F32, keep ? KG_GGUF_KEEP_Q4_0 | KG_GGUF_KEEP_Q8_0 : 0, &t, &s) == KG_OK) {
        touch(t);
        touch(s);
      } else if (!kg_last_error()[0]) {
        __builtin_trap();
      }
      kg_tensor_release(t);
      kg_tensor_release(s);
    }
  kg_gguf_free(g);
  return 0;
}
