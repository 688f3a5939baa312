/* jpeg.c — JPEG read/write for u8 image tensors [H, W, C] (include/keng/image.h), over
 * libjpeg-turbo. libjpeg reports a fatal error by calling error_exit, which by default prints
 * and exits; here it formats the message and longjmps back to the caller, so a corrupt file is a
 * KG_ERR_IO status and never ends the process. Warnings (a truncated file that libjpeg would
 * pad with grey, a bad marker it would skip) are errors too: a damaged photo raises instead of
 * returning made-up pixels. Everything a longjmp could skip is owned by the one `jctx`. */
#include <keng/image.h>

#include <setjmp.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "vocab.h"

/* progressive and multi-scan files can hold thousands of tiny scans that each cost a full pass
 * over the coefficients (a known CPU bomb); real encoders write at most a few dozen */
#define KG_JPEG_MAX_SCANS 500

typedef struct {
  struct jpeg_error_mgr mgr;
  struct jpeg_progress_mgr progress;
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
} jctx;

static void on_error(j_common_ptr ci) {
  jctx *c = (jctx *)ci->err;
  ci->err->format_message(ci, c->msg);
  longjmp(c->jump, 1);
}

static void on_message(j_common_ptr ci, int level) {
  if (level < 0) on_error(ci); /* a warning: corrupt data libjpeg would work around */
}

static void on_progress(j_common_ptr ci) {
  if (ci->is_decompressor && ((j_decompress_ptr)ci)->input_scan_number > KG_JPEG_MAX_SCANS) {
    jctx *c = (jctx *)ci->err;
    snprintf(c->msg, sizeof c->msg, "more than %d scans", KG_JPEG_MAX_SCANS);
    longjmp(c->jump, 1);
  }
}

static void ctx_init(jctx *c, j_common_ptr ci) {
  ci->err = jpeg_std_error(&c->mgr);
  c->mgr.error_exit = on_error;
  c->mgr.emit_message = on_message;
  c->progress.progress_monitor = on_progress;
  c->msg[0] = 0;
}

static const char *color_name(J_COLOR_SPACE cs) {
  switch (cs) {
  case JCS_CMYK:
    return "CMYK";
  case JCS_YCCK:
    return "YCCK";
  default:
    return "unknown-colour-space";
  }
}

kg_status kg_jpeg_read(kg_tensor **out, const char *path) {
  *out = NULL;
  if (!path) return kg_error(KG_ERR_VALUE, "jpeg_read", "path is required");
  uint64_t size;
  kg_status os;
  FILE *f = kg_open_regular(path, "jpeg_read", NULL, KG_MAX_READ_FILE, &size, &os); /* no FIFO, no device */
  if (!f) return os;
  struct jpeg_decompress_struct ci;
  jctx c;
  kg_tensor *volatile t = NULL;
  memset(&ci, 0, sizeof ci);
  ctx_init(&c, (j_common_ptr)&ci);
  if (setjmp(c.jump)) {
    kg_status s = kg_error(KG_ERR_IO, "jpeg_read", "%s: %s", path, c.msg[0] ? c.msg : "corrupt data");
    jpeg_destroy_decompress(&ci);
    if (t) kg_tensor_release(t);
    fclose(f);
    return s;
  }
  jpeg_create_decompress(&ci);
  ci.progress = &c.progress;
  jpeg_stdio_src(&ci, f);
  jpeg_read_header(&ci, TRUE);
  if (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK) {
    snprintf(c.msg, sizeof c.msg, "%s JPEGs are not supported (only greyscale and YCbCr/RGB)",
             color_name(ci.jpeg_color_space));
    longjmp(c.jump, 1);
  }
  /* a decompression bomb: as the PNG reader, no more than 2^16 output bytes per file byte */
  uint64_t want = (uint64_t)ci.image_height * ci.image_width * 3u;
  if (want > (size << 16) + (1u << 20)) {
    snprintf(c.msg, sizeof c.msg, "header claims %ux%u pixels, more than the %llu-byte file can hold",
             (unsigned)ci.image_width, (unsigned)ci.image_height, (unsigned long long)size);
    longjmp(c.jump, 1);
  }
  ci.out_color_space = JCS_RGB; /* greyscale is replicated into the three channels */
  jpeg_start_decompress(&ci);
  int64_t shape[3] = {ci.output_height, ci.output_width, 3};
  kg_tensor *nt = NULL;
  kg_status st = kg_tensor_empty(&nt, 3, shape, KG_U8, KG_CPU);
  if (st != KG_OK) {
    jpeg_destroy_decompress(&ci);
    fclose(f);
    return st;
  }
  t = nt;
  uint8_t *base = kg_data(t);
  while (ci.output_scanline < ci.output_height) {
    JSAMPROW row = base + (size_t)ci.output_scanline * ci.output_width * 3;
    jpeg_read_scanlines(&ci, &row, 1);
  }
  jpeg_finish_decompress(&ci);
  jpeg_destroy_decompress(&ci);
  fclose(f);
  *out = t;
  return KG_OK;
}

kg_status kg_jpeg_write(const char *path, const kg_tensor *img, int quality) {
  char sb[KG_SHAPE_STR_MAX];
  if (!path || !img) return kg_error(KG_ERR_VALUE, "jpeg_write", "path and image are required");
  if (img->dtype != KG_U8)
    return kg_error(KG_ERR_TYPE, "jpeg_write", "image %s has dtype %s, expected u8",
                    kg_shape_str(sb, img->ndim, img->shape), kg_dtype_info[img->dtype].name);
  if (img->device.type != KG_DEV_CPU)
    return kg_error(KG_ERR_DEVICE, "jpeg_write", "image must be on the cpu (move it with :to(\"cpu\"))");
  if (quality < 1 || quality > 100)
    return kg_error(KG_ERR_VALUE, "jpeg_write", "quality %d must be in 1..100", quality);
  int64_t h = img->ndim >= 2 ? img->shape[0] : 0, w = img->ndim >= 2 ? img->shape[1] : 0;
  int64_t ch = img->ndim == 3 ? img->shape[2] : 1;
  if ((img->ndim != 2 && img->ndim != 3) || (ch != 1 && ch != 3) || h < 1 || w < 1 || h > JPEG_MAX_DIMENSION ||
      w > JPEG_MAX_DIMENSION)
    return kg_error(KG_ERR_SHAPE, "jpeg_write",
                    "image %s: expected [H, W] or [H, W, C] with C 1 or 3 and H, W in 1..%d",
                    kg_shape_str(sb, img->ndim, img->shape), (int)JPEG_MAX_DIMENSION);
  size_t n = strlen(path);
  char *tmp = malloc(n + 5);
  uint8_t *row = malloc((size_t)(w * ch));
  if (!tmp || !row) {
    free(tmp), free(row);
    return kg_error(KG_ERR_OOM, "jpeg_write", "out of memory");
  }
  memcpy(tmp, path, n);
  memcpy(tmp + n, ".tmp", 5);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    kg_status s = kg_error(KG_ERR_IO, "jpeg_write", "%s: cannot open for writing", path);
    free(tmp), free(row);
    return s;
  }
  struct jpeg_compress_struct ci;
  jctx c;
  memset(&ci, 0, sizeof ci);
  ctx_init(&c, (j_common_ptr)&ci);
  if (setjmp(c.jump)) {
    kg_status s = kg_error(KG_ERR_IO, "jpeg_write", "%s: %s", path, c.msg[0] ? c.msg : "write failed");
    jpeg_destroy_compress(&ci);
    fclose(f);
    remove(tmp);
    free(tmp), free(row);
    return s;
  }
  jpeg_create_compress(&ci);
  jpeg_stdio_dest(&ci, f);
  ci.image_width = (JDIMENSION)w;
  ci.image_height = (JDIMENSION)h;
  ci.input_components = (int)ch;
  ci.in_color_space = ch == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&ci);
  jpeg_set_quality(&ci, quality, TRUE);
  jpeg_start_compress(&ci, TRUE);
  const uint8_t *src = kg_data(img);
  int64_t sh = img->stride[0], sw = img->stride[1], sc = img->ndim == 3 ? img->stride[2] : 0;
  while (ci.next_scanline < ci.image_height) {
    int64_t y = ci.next_scanline;
    for (int64_t x = 0; x < w; x++)
      for (int64_t k = 0; k < ch; k++)
        row[x * ch + k] = src[y * sh + x * sw + k * sc];
    JSAMPROW r = row;
    jpeg_write_scanlines(&ci, &r, 1);
  }
  jpeg_finish_compress(&ci);
  jpeg_destroy_compress(&ci);
  int bad = ferror(f) | fclose(f);
  free(row);
  if (bad || rename(tmp, path) != 0) {
    remove(tmp);
    free(tmp);
    return kg_error(KG_ERR_IO, "jpeg_write", "%s: write failed", path);
  }
  free(tmp);
  return KG_OK;
}
