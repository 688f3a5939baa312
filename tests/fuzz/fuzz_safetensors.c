/* fuzz_safetensors.c — kg_safetensors_parse over arbitrary bytes: the 8-byte length, the JSON
 * header (dtypes, shapes, data_offsets, __metadata__) and the data section. A file either
 * parses into tensors that lie inside the buffer or fails with an error; never a crash. */
#include <keng/keng.h>

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kg_tensor_dict d;
  memset(&d, 0, sizeof d);
  if (kg_safetensors_parse(&d, data, size, "fuzz") == KG_OK) {
    /* touch every loaded byte: a tensor pointing outside its storage shows up under ASan */
    volatile uint8_t sink = 0;
    for (int i = 0; i < d.n; i++) {
      const uint8_t *p = kg_data(d.tensors[i]);
      size_t nb = (size_t)kg_numel(d.tensors[i]) * kg_elem_size(d.tensors[i]);
      for (size_t k = 0; k < nb; k++) sink ^= p[k];
    }
    (void)sink;
  } else if (!kg_last_error()[0]) {
    __builtin_trap(); /* a failure must say why */
  }
  kg_tensor_dict_free(&d);
  return 0;
}
