/* fuzz_safetensors_index.c — kg_safetensors_load on a model.safetensors.index.json made of
 * the input, next to one valid shard (shard.safetensors, tensors "a" and "b"). Checks the
 * weight_map rules: file names that leave the directory, unknown or missing tensors, names
 * that appear in two shards. */
#include <keng/keng.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  if (!ready) { /* one valid shard: a f32[2] and b u8[3] */
    static const char hdr[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                              "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}";
    uint8_t buf[256] = {0};
    size_t h = sizeof hdr - 1;
    buf[0] = (uint8_t)h;
    memcpy(buf + 8, hdr, h);
    memset(buf + 8 + h, 7, 11);
    fuzz_file(1, "shard.safetensors", buf, 8 + h + 11);
    ready = 1;
  }
  const char *path = fuzz_file(0, "model.safetensors.index.json", data, size);
  kg_tensor_dict d;
  memset(&d, 0, sizeof d);
  kg_status s = kg_safetensors_load(&d, path);
  if (s != KG_OK && !kg_last_error()[0]) __builtin_trap();
  kg_tensor_dict_free(&d);
  return 0;
}
