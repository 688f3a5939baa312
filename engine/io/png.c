/* png.c — PNG read/write for u8 image tensors [H, W, C] (include/keng/image.h).
 * Uses libpng's simplified API (png_image_*), which reports errors through image.message
 * instead of longjmp, so a corrupt file becomes a KG_ERR_IO status and never aborts. */
#include <keng/image.h>

#include <png.h>

#include "vocab.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static png_uint_32 format_of(int64_t c) {
  switch (c) {
  case 1: return PNG_FORMAT_GRAY;
  case 2: return PNG_FORMAT_GA;
  case 3: return PNG_FORMAT_RGB;
  default: return PNG_FORMAT_RGBA;
  }
}

kg_status kg_png_write(const char *path, const kg_tensor *img) {
  char sb[KG_SHAPE_STR_MAX];
  if (!path || !img) return kg_error(KG_ERR_VALUE, "png_write", "path and image are required");
  if (img->dtype != KG_U8)
    return kg_error(KG_ERR_TYPE, "png_write", "image %s has dtype %s, expected u8",
                    kg_shape_str(sb, img->ndim, img->shape), kg_dtype_info[img->dtype].name);
  if (img->device.type != KG_DEV_CPU)
    return kg_error(KG_ERR_DEVICE, "png_write", "image must be on the cpu (move it with :to(\"cpu\"))");
  int64_t h = img->ndim >= 2 ? img->shape[0] : 0, w = img->ndim >= 2 ? img->shape[1] : 0;
  int64_t c = img->ndim == 3 ? img->shape[2] : 1;
  if ((img->ndim != 2 && img->ndim != 3) || c < 1 || c > 4 || h < 1 || w < 1 || h > 0x7fffffff || w > 0x7fffffff)
    return kg_error(KG_ERR_SHAPE, "png_write", "image %s: expected [H, W] or [H, W, C] with C in 1..4 and H, W >= 1",
                    kg_shape_str(sb, img->ndim, img->shape));
  /* gather the view into a packed HWC buffer (any strides) */
  uint8_t *buf = malloc((size_t)(h * w * c));
  if (!buf) return kg_error(KG_ERR_OOM, "png_write", "out of memory for a %lld-byte image", (long long)(h * w * c));
  const uint8_t *src = kg_data(img);
  int64_t sh = img->stride[0], sw = img->stride[1], sc = img->ndim == 3 ? img->stride[2] : 0;
  for (int64_t y = 0; y < h; y++)
    for (int64_t x = 0; x < w; x++)
      for (int64_t k = 0; k < c; k++) buf[(y * w + x) * c + k] = src[y * sh + x * sw + k * sc];

  size_t n = strlen(path);
  char *tmp = malloc(n + 5);
  if (!tmp) {
    free(buf);
    return kg_error(KG_ERR_OOM, "png_write", "out of memory");
  }
  memcpy(tmp, path, n);
  memcpy(tmp + n, ".tmp", 5);
  png_image im;
  memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  im.width = (png_uint_32)w;
  im.height = (png_uint_32)h;
  im.format = format_of(c);
  int ok = png_image_write_to_file(&im, tmp, 0, buf, (png_int_32)(w * c), NULL);
  free(buf);
  if (!ok) {
    kg_status s = kg_error(KG_ERR_IO, "png_write", "%s: %s", path, im.message[0] ? im.message : "write failed");
    png_image_free(&im);
    remove(tmp);
    free(tmp);
    return s;
  }
  if (rename(tmp, path) != 0) {
    remove(tmp);
    free(tmp);
    return kg_error(KG_ERR_IO, "png_write", "%s: cannot rename the temporary file into place", path);
  }
  free(tmp);
  return KG_OK;
}

kg_status kg_png_read(kg_tensor **out, const char *path) {
  *out = NULL;
  if (!path) return kg_error(KG_ERR_VALUE, "png_read", "path is required");
  png_image im;
  memset(&im, 0, sizeof im);
  im.version = PNG_IMAGE_VERSION;
  uint64_t size;
  kg_status os;
  FILE *f = kg_open_regular(path, "png_read", NULL, KG_MAX_READ_FILE, &size, &os); /* no FIFO, no device */
  if (!f) return os;
  if (!png_image_begin_read_from_stdio(&im, f)) {
    fclose(f);
    return kg_error(KG_ERR_IO, "png_read", "%s: %s", path, im.message[0] ? im.message : "cannot read");
  }
  /* keep the file's channels; drop 16-bit to 8-bit and expand palettes */
  int c = (im.format & PNG_FORMAT_FLAG_COLOR ? 3 : 1) + (im.format & PNG_FORMAT_FLAG_ALPHA ? 1 : 0);
  im.format = format_of(c);
  /* a decompression bomb: deflate expands at most ~1032x, and palette / sub-byte pixels at
   * most 32x more, so a file cannot describe more than 2^16 output bytes per file byte */
  uint64_t want = (uint64_t)im.height * im.width * (uint64_t)c;
  if (want > (size << 16) + (1u << 20)) {
    kg_status e = kg_error(KG_ERR_IO, "png_read", "%s: header claims %ux%u pixels, more than the %lld-byte file can hold",
                           path, (unsigned)im.width, (unsigned)im.height, (long long)size);
    png_image_free(&im);
    fclose(f);
    return e;
  }
  int64_t shape[3] = {im.height, im.width, c};
  kg_tensor *t = NULL;
  kg_status st = kg_tensor_empty(&t, 3, shape, KG_U8, KG_CPU);
  if (st != KG_OK) {
    png_image_free(&im);
    fclose(f);
    return st;
  }
  if (!png_image_finish_read(&im, NULL, kg_data(t), (png_int_32)(im.width * c), NULL)) {
    kg_status s = kg_error(KG_ERR_IO, "png_read", "%s: %s", path, im.message[0] ? im.message : "corrupt data");
    png_image_free(&im);
    kg_tensor_release(t);
    fclose(f);
    return s;
  }
  fclose(f);
  *out = t;
  return KG_OK;
}
