/* conv.c — Lua bindings of the convolution and resampling family (NCHW, see docs/lua_api.md):
 *   keng.conv2d(x, w, b, {stride=1, padding=0, dilation=1, groups=1})
 *   keng.conv_transpose2d(x, w, b, {stride, padding, output_padding, dilation, groups})
 *   keng.interpolate(x, {scale=2 | size={h, w}, mode="nearest"|"bilinear"|"bicubic", align_corners, antialias})
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

/* a boolean option: absent is false; anything but a boolean is refused */
static bool bool_field(lua_State *L, int idx, const char *key, bool *present) {
  lua_getfield(L, idx, key);
  *present = !lua_isnil(L, -1);
  if (*present && !lua_isboolean(L, -1))
    luaL_error(L, "interpolate: %s must be a boolean, got %s", key, luaL_typename(L, -1));
  bool v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* keng.interpolate(x, {scale=s | size={h, w}, mode="nearest"|"bilinear"|"bicubic", align_corners=,
 * antialias=}); scale may be a {sh, sw} pair, the output is floor(H * sh) x floor(W * sw) and the
 * scale itself (not the size ratio) places the source pixels, as torch's scale_factor does */
static int l_interpolate(lua_State *L) {
  static const char *const valid[] = {"size", "scale", "mode", "align_corners", "antialias", NULL};
  static const char *const modes[] = {"nearest", "bilinear", "bicubic", NULL};
  kg_tensor *x = kgl_check(L, 1), *r;
  luaL_checktype(L, 2, LUA_TTABLE);
  kgl_check_options(L, 2, "interpolate", valid);
  kg_interpolate_params p;
  memset(&p, 0, sizeof p); /* padding too: params are copied bytewise into the graph */
  lua_getfield(L, 2, "mode");
  const char *mode = luaL_optstring(L, -1, "nearest");
  p.mode = -1;
  for (int i = 0; modes[i]; i++)
    if (!strcmp(mode, modes[i])) p.mode = i;
  if (p.mode < 0) return luaL_error(L, "interpolate: unknown mode '%s' (valid: nearest, bilinear, bicubic)", mode);
  lua_pop(L, 1);
  bool has_align, has_aa;
  p.align_corners = bool_field(L, 2, "align_corners", &has_align);
  p.antialias = bool_field(L, 2, "antialias", &has_aa);
  if (p.mode == KG_INTERP_NEAREST && has_align)
    return luaL_error(L, "interpolate: align_corners applies to the bilinear and bicubic modes, not nearest");
  if (p.mode == KG_INTERP_NEAREST && p.antialias)
    return luaL_error(L, "interpolate: antialias applies to the bilinear and bicubic modes, not nearest");
  if (x->ndim != 4) {
    char s[KG_SHAPE_STR_MAX];
    return luaL_error(L, "interpolate: input x %s must be 4-D [B, C, H, W]", kg_shape_str(s, x->ndim, x->shape));
  }
  int64_t size[2];
  lua_getfield(L, 2, "size");
  lua_getfield(L, 2, "scale");
  if (!lua_isnil(L, -2) && !lua_isnil(L, -1)) return luaL_error(L, "interpolate: give scale= or size=, not both");
  if (!lua_isnil(L, -2)) {
    if (lua_isnumber(L, -2)) {
      lua_pushvalue(L, -2);
      size[0] = size[1] = int_value(L, "interpolate", "size");
      lua_pop(L, 1);
    } else {
      if (!lua_istable(L, -2)) return luaL_error(L, "interpolate: size must be a number or a {h, w} pair");
      for (int i = 0; i < 2; i++) {
        lua_rawgeti(L, -2, i + 1);
        if (!lua_isnumber(L, -1)) return luaL_error(L, "interpolate: size must be a number or a {h, w} pair");
        size[i] = int_value(L, "interpolate", "size");
        lua_pop(L, 1);
      }
    }
  } else if (!lua_isnil(L, -1)) {
    double sc[2];
    for (int i = 0; i < 2; i++) {
      if (lua_isnumber(L, -1)) lua_pushvalue(L, -1);
      else if (lua_istable(L, -1)) lua_rawgeti(L, -1, i + 1);
      else return luaL_error(L, "interpolate: scale must be a number or a {h, w} pair");
      if (!lua_isnumber(L, -1)) return luaL_error(L, "interpolate: scale must be a number or a {h, w} pair");
      sc[i] = lua_tonumber(L, -1);
      if (!(sc[i] > 0) || !isfinite(sc[i]))
        return luaL_error(L, "interpolate: scale must be positive and finite, got %s", luaL_tolstring(L, -1, NULL));
      double v = floor((double)x->shape[2 + i] * sc[i]);
      if (!(v < 0x1p59)) /* huge: a C cast of it would be undefined */
        return luaL_error(L, "interpolate: scale %f gives output size %f, out of range", sc[i], v);
      size[i] = (int64_t)v;
      lua_pop(L, 1);
    }
    p.scale_h = sc[0], p.scale_w = sc[1];
  } else {
    return luaL_error(L, "interpolate: give scale= or size=");
  }
  lua_pop(L, 2);
  p.out_h = size[0], p.out_w = size[1];
  KGL_CALL(L, kg_interpolate(&r, x, &p));
  kgl_push(L, r);
  return 1;
}

void kgl_register_conv(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "conv2d", l_conv2d);
  kgl_set(L, methods, keng, "conv_transpose2d", l_conv_transpose2d);
  kgl_set(L, methods, keng, "interpolate", l_interpolate);
}
