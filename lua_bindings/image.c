/* image.c — bindings of PNG image files (engine/io/png.c):
 *   keng.image.write_png(path, img)   img: u8 [H, W, C] (C 1..4) or [H, W], on the cpu
 *   keng.image.read_png(path) -> u8 [H, W, C]   (a corrupt file raises "png_read: <path>: ...")
 * and JPEG files (engine/io/jpeg.c):
 *   keng.image.write_jpeg(path, img, quality)   img: u8 [H, W, 3] or [H, W] / [H, W, 1]; quality 1..100
 *   keng.image.read_jpeg(path) -> u8 [H, W, 3]  (a corrupt file raises "jpeg_read: <path>: ...") */
#include "keng_lua.h"

#include <keng/image.h>

static int l_write_png(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  kg_tensor *img = kgl_check(L, 2);
  KGL_CALL(L, kg_png_write(path, img));
  return 0;
}

static int l_read_png(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  kg_tensor *img = NULL;
  KGL_CALL(L, kg_png_read(&img, path));
  kgl_push(L, img);
  return 1;
}

static int l_write_jpeg(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  kg_tensor *img = kgl_check(L, 2);
  lua_Integer q = luaL_checkinteger(L, 3);
  if (q < 1 || q > 100) return luaL_error(L, "jpeg_write: quality %I must be in 1..100", (LUAI_UACINT)q);
  KGL_CALL(L, kg_jpeg_write(path, img, (int)q));
  return 0;
}

static int l_read_jpeg(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  kg_tensor *img = NULL;
  KGL_CALL(L, kg_jpeg_read(&img, path));
  kgl_push(L, img);
  return 1;
}

void kgl_register_image(lua_State *L, int methods, int keng) {
  (void)methods;
  lua_createtable(L, 0, 4); /* keng.image */
  lua_pushcfunction(L, l_write_png);
  lua_setfield(L, -2, "write_png");
  lua_pushcfunction(L, l_read_png);
  lua_setfield(L, -2, "read_png");
  lua_pushcfunction(L, l_write_jpeg);
  lua_setfield(L, -2, "write_jpeg");
  lua_pushcfunction(L, l_read_jpeg);
  lua_setfield(L, -2, "read_jpeg");
  lua_setfield(L, keng, "image");
}
