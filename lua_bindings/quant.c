/* quant.c — bindings of the int8 weight-only ops (docs/quantization.md):
 *   keng.linear_q8(x, wq, scale, b)   y = x · (wq · scale)ᵀ + b; wq i8 [O, I], scale f32 [O]
 *   keng.quantize_q8(w)               -> wq i8 [O, I], scale f32 [O] (absmax per row / 127)
 *   keng.quantize_q4(w) / keng.dequantize_q4(wq, scale, dtype="f32") / keng.linear_q4(x, wq, scale, b)
 *   keng.dequantize_q8(wq, scale, dtype="f32")   W of linear_q8's wq and scale (f32 [O] or f16 [O, I/32])
 *                                     int4 in blocks of 32 with an f16 scale (Q4_0 layout)
 *   keng.quantize(model, "int8")      require("keng.quantize").quantize (scripts/lib/keng) */
#include "keng_lua.h"

static int l_linear_q8(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *wq = kgl_check(L, 2), *scale = kgl_check(L, 3), *b = kgl_opt(L, 4), *r;
  KGL_CALL(L, kg_linear_q8(&r, x, wq, scale, b));
  kgl_push(L, r);
  return 1;
}

static int l_quantize_q8(lua_State *L) {
  kg_tensor *w = kgl_check(L, 1), *q, *s;
  KGL_CALL(L, kg_quantize_q8(&q, &s, w));
  kgl_push(L, q);
  kgl_push(L, s);
  return 2;
}

static int l_linear_q4(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *wq = kgl_check(L, 2), *scale = kgl_check(L, 3), *b = kgl_opt(L, 4), *r;
  KGL_CALL(L, kg_linear_q4(&r, x, wq, scale, b));
  kgl_push(L, r);
  return 1;
}

static int l_quantize_q4(lua_State *L) {
  kg_tensor *w = kgl_check(L, 1), *q, *s;
  KGL_CALL(L, kg_quantize_q4(&q, &s, w));
  kgl_push(L, q);
  kgl_push(L, s);
  return 2;
}

static int l_dequantize_q4(lua_State *L) {
  kg_tensor *wq = kgl_check(L, 1), *scale = kgl_check(L, 2), *r;
  kg_dtype dt = lua_isnoneornil(L, 3) ? KG_F32 : kgl_dtype(L, 3);
  KGL_CALL(L, kg_dequantize_q4(&r, wq, scale, dt));
  kgl_push(L, r);
  return 1;
}

static int l_dequantize_q8(lua_State *L) {
  kg_tensor *wq = kgl_check(L, 1), *scale = kgl_check(L, 2), *r;
  kg_dtype dt = lua_isnoneornil(L, 3) ? KG_F32 : kgl_dtype(L, 3);
  KGL_CALL(L, kg_dequantize_q8(&r, wq, scale, dt));
  kgl_push(L, r);
  return 1;
}

/* keng.quantize(...): forwards to the Lua module, so that it needs no require of its own */
static int l_quantize(lua_State *L) {
  int n = lua_gettop(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "keng.quantize");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "quantize_at");
  lua_insert(L, 1);
  lua_pop(L, 1); /* the module table */
  lua_pushinteger(L, 3); /* errors blame the user's line: quantize_at, this shim, the caller */
  lua_insert(L, 2);
  lua_call(L, n + 1, LUA_MULTRET);
  return lua_gettop(L);
}

void kgl_register_quant(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "linear_q8", l_linear_q8);
  kgl_set(L, methods, keng, "quantize_q8", l_quantize_q8);
  kgl_set(L, methods, keng, "linear_q4", l_linear_q4);
  kgl_set(L, methods, keng, "quantize_q4", l_quantize_q4);
  kgl_set(L, methods, keng, "dequantize_q4", l_dequantize_q4);
  kgl_set(L, methods, keng, "dequantize_q8", l_dequantize_q8);
  lua_pushcfunction(L, l_quantize);
  lua_setfield(L, keng, "quantize");
}
