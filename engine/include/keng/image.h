/* image.h — PNG and JPEG files to and from u8 image tensors (engine/io/png.c over libpng,
 * engine/io/jpeg.c over libjpeg-turbo).
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
/* Writes img: u8 [H, W, 3] (RGB) or [H, W] / [H, W, 1] (greyscale) on the cpu, any strides, to
 * `path` as a baseline JPEG of the given quality (1..100), through path.tmp and a rename. */
kg_status kg_jpeg_write(const char *path, const kg_tensor *img, int quality);
/* [out] img: u8 [H, W, 3] RGB (greyscale replicated; baseline, progressive and arithmetic-coded
 * files). CMYK/YCCK files, a corrupt or truncated file, more than 500 scans or a header claiming
 * more pixels than the file can hold return KG_ERR_IO naming the path. */
kg_status kg_jpeg_read(kg_tensor **img, const char *path);

#ifdef __cplusplus
}
#endif
#endif
