/* image.h — PNG files to and from u8 image tensors (engine/io/png.c, over libpng).
 * Shape letters: H rows, W columns, C channels (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA).
 * Images here are HWC (the layout of the file), not the NCHW of the model ops. */
#ifndef KENG_IMAGE_H
#define KENG_IMAGE_H

#include <keng/keng.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes img: u8 [H, W, C] (C in 1..4; a [H, W] tensor is gray) on the cpu, any strides, to
 * `path` as an 8-bit PNG. The file is written to path.tmp and renamed, so a failure leaves no
 * partial file. */
kg_status kg_png_write(const char *path, const kg_tensor *img);
/* [out] img: u8 [H, W, C] with the file's channels (1, 2, 3 or 4; palette -> 3 or 4, 16-bit ->
 * 8-bit). A missing, truncated or corrupt file returns KG_ERR_IO naming the path. */
kg_status kg_png_read(kg_tensor **img, const char *path);

#ifdef __cplusplus
}
#endif
#endif
