/* conv.c — Lua bindings of the convolution and resampling family (NCHW, see LUA_API.md):
 *   keng.conv2d(x, w, b, {stride=1, padding=0, dilation=1, groups=1})
 *   keng.conv_transpose2d(x, w, b, {stride, padding, output_padding, dilation, groups})
 *   keng.interpolate(x, {scale=2 | size={h, w}, mode="nearest"})
 * stride, padding, dilation and output_padding are a number or a {h, w} pair. */
#include "keng_lua.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* the integer at the top of the stack as an int: a fraction or a value past 32 bits is refused
 * (a C cast would silently turn stride 2^32 + 1 into 1) */
static int int_value(lua_State *L, const char *op, const char *key) {
  int isnum;
  lua_Integer v = lua_tointegerx(L, -1, &isnum);
  if (!isnum) luaL_error(L, "%s: %s must be an integer, got %s", op, key, lua_tostring(L, -1));
  if (v < INT_MIN || v > INT_MAX)
    luaL_error(L, "%s: %s %I is out of range (at most %d)", op, key, (LUAI_UACINT)v, INT_MAX);
  return (int)v;
}

/* field `key` of the options table at idx: a number n (-> {n, n}) or a pair {h, w} */
static void pair_field(lua_State *L, int idx, const char *op, const char *key, int def, int out[2]) {
  out[0] = out[1] = def;
  if (!lua_istable(L, idx)) return;
  lua_getfield(L, idx, key);
  if (lua_isnumber(L, -1)) {
    out[0] = out[1] = int_value(L, op, key);
  } else if (lua_istable(L, -1)) {
    for (int i = 0; i < 2; i++) {
      lua_rawgeti(L, -1, i + 1);
      if (!lua_isnumber(L, -1)) luaL_error(L, "%s: %s must be a number or a {h, w} pair", op, key);
      out[i] = int_value(L, op, key);
      lua_pop(L, 1);
    }
  } else if (!lua_isnil(L, -1)) {
    luaL_error(L, "%s: %s must be a number or a {h, w} pair", op, key);
  }
  lua_pop(L, 1);
}

static kg_conv2d_params conv_params(lua_State *L, int idx, const char *op) {
  kg_conv2d_params p;
  pair_field(L, idx, op, "stride", 1, p.stride);
  pair_field(L, idx, op, "padding", 0, p.padding);
  pair_field(L, idx, op, "dilation", 1, p.dilation);
  pair_field(L, idx, op, "output_padding", 0, p.output_padding);
  p.groups = 1;
  if (lua_istable(L, idx)) {
    lua_getfield(L, idx, "groups");
    if (!lua_isnil(L, -1)) p.groups = int_value(L, op, "groups");
    lua_pop(L, 1);
  }
  return p;
}

static int l_conv2d(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *w = kgl_check(L, 2), *b = kgl_opt(L, 3), *r;
  kg_conv2d_params p = conv_params(L, 4, "conv2d");
  KGL_CALL(L, kg_conv2d(&r, x, w, b, &p));
  kgl_push(L, r);
  return 1;
}

static int l_conv_transpose2d(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *w = kgl_check(L, 2), *b = kgl_opt(L, 3), *r;
  kg_conv2d_params p = conv_params(L, 4, "conv_transpose2d");
  KGL_CALL(L, kg_conv_transpose2d(&r, x, w, b, &p));
  kgl_push(L, r);
  return 1;
}

/* keng.interpolate(x, {scale=s | size={h, w}, mode="nearest"}); scale may be a {sh, sw} pair,
 * the output is floor(H * sh) x floor(W * sw) */
static int l_interpolate(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_getfield(L, 2, "mode");
  const char *mode = luaL_optstring(L, -1, "nearest");
  if (strcmp(mode, "nearest") != 0) return luaL_error(L, "interpolate: mode '%s' is not supported yet", mode);
  lua_pop(L, 1);
  if (x->ndim != 4) {
    char s[KG_SHAPE_STR_MAX];
    return luaL_error(L, "interpolate: input x %s must be 4-D [B, C, H, W]", kg_shape_str(s, x->ndim, x->shape));
  }
  int64_t size[2];
  lua_getfield(L, 2, "size");
  lua_getfield(L, 2, "scale");
  if (!lua_isnil(L, -2)) {
    if (lua_isnumber(L, -2)) {
      lua_pushvalue(L, -2);
      size[0] = size[1] = int_value(L, "interpolate", "size");
      lua_pop(L, 1);
    } else {
      luaL_checktype(L, -2, LUA_TTABLE);
      for (int i = 0; i < 2; i++) {
        lua_rawgeti(L, -2, i + 1);
        if (!lua_isnumber(L, -1)) return luaL_error(L, "interpolate: size must be a number or a {h, w} pair");
        size[i] = int_value(L, "interpolate", "size");
        lua_pop(L, 1);
      }
    }
  } else if (!lua_isnil(L, -1)) {
    double sc[2];
    if (lua_isnumber(L, -1)) {
      sc[0] = sc[1] = lua_tonumber(L, -1);
    } else {
      if (!lua_istable(L, -1)) return luaL_error(L, "interpolate: scale must be a number or a {h, w} pair");
      for (int i = 0; i < 2; i++) {
        lua_rawgeti(L, -1, i + 1);
        if (!lua_isnumber(L, -1)) return luaL_error(L, "interpolate: scale must be a number or a {h, w} pair");
        sc[i] = lua_tonumber(L, -1);
        lua_pop(L, 1);
      }
    }
    for (int i = 0; i < 2; i++) {
      double v = floor((double)x->shape[2 + i] * sc[i]);
      if (!(v >= 0 && v < 0x1p59)) /* NaN, negative or huge: a C cast of it would be undefined */
        return luaL_error(L, "interpolate: scale %f gives output size %f, out of range", sc[i], v);
      size[i] = (int64_t)v;
    }
  } else {
    return luaL_error(L, "interpolate: give scale= or size=");
  }
  lua_pop(L, 2);
  KGL_CALL(L, kg_interpolate_nearest(&r, x, size[0], size[1]));
  kgl_push(L, r);
  return 1;
}

void kgl_register_conv(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "conv2d", l_conv2d);
  kgl_set(L, methods, keng, "conv_transpose2d", l_conv_transpose2d);
  kgl_set(L, methods, keng, "interpolate", l_interpolate);
}
