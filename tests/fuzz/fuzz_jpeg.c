/* fuzz_jpeg.c — kg_jpeg_read (libjpeg-turbo, error_exit longjmps back) on a file made of the
 * input: truncated scans, bad markers and tables, huge or zero dimensions, CMYK, progressive
 * files with many scans. */
#include <keng/image.h>
#include <keng/keng.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(0, "in.jpg", data, size);
  kg_tensor *t = NULL;
  if (kg_jpeg_read(&t, path) != KG_OK) {
    if (!kg_last_error()[0]) __builtin_trap();
    return 0;
  }
  volatile uint8_t sink = 0;
  const uint8_t *p = kg_data(t);
  for (int64_t i = 0; i < kg_numel(t); i++)
    sink ^= p[i];
  (void)sink;
  kg_tensor_release(t);
  return 0;
}
