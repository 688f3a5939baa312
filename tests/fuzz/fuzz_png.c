/* fuzz_png.c — kg_png_read (libpng's simplified API) on a file made of the input: bad CRCs,
 * truncated IDAT, huge dimensions, palettes, 16-bit, interlacing. */
#include <keng/image.h>
#include <keng/keng.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(0, "in.png", data, size);
  kg_tensor *t = NULL;
  if (kg_png_read(&t, path) != KG_OK) {
    if (!kg_last_error()[0]) __builtin_trap();
    return 0;
  }
  volatile uint8_t sink = 0;
  const uint8_t *p = kg_data(t);
  for (int64_t i = 0; i < kg_numel(t); i++) sink ^= p[i];
  (void)sink;
  kg_tensor_release(t);
  return 0;
}
