/* decode.c — Lua binding of the decode-step op (engine/ops/decode.c):
 *   keng.decode_qkv(qkv, positions, cache_k, cache_v, col, {heads =, kv_heads =, base = 10000,
 *                   inv_freq =, scale = 1})
 *       qkv [B, T, (heads + 2·kv_heads)·D], positions [B, T] or [T], caches [B, kv_heads, L, D]
 *       (written in place at columns col [T] mod L, 0-based) -> q [B, heads, T, D]; inv_freq [D/2]
 *       and scale: a scaled RoPE's frequencies and cos/sin factor, as keng.rope takes them */
#include "keng_lua.h"

#include <string.h>

static int l_decode_qkv(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *pos = kgl_check(L, 2), *ck = kgl_check(L, 3), *cv = kgl_check(L, 4);
  kg_tensor *col = kgl_check(L, 5), *r;
  luaL_checktype(L, 6, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, 6)) { /* unknown keys change nothing silently: refuse them */
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
    if (strcmp(k, "heads") && strcmp(k, "kv_heads") && strcmp(k, "base") && strcmp(k, "inv_freq") && strcmp(k, "scale"))
      return luaL_error(L, "decode_qkv: unknown option '%s' (valid: base, heads, inv_freq, kv_heads, scale)", k);
    lua_pop(L, 1);
  }
  lua_getfield(L, 6, "heads");
  lua_getfield(L, 6, "kv_heads");
  if (!lua_isinteger(L, -2) || !lua_isinteger(L, -1))
    return luaL_error(L, "decode_qkv: heads and kv_heads must be integers");
  int64_t H = (int64_t)lua_tointeger(L, -2), Hkv = (int64_t)lua_tointeger(L, -1);
  lua_pop(L, 2);
  double base = kgl_field_number(L, 6, "base", 10000), scale = kgl_field_number(L, 6, "scale", 1);
  lua_getfield(L, 6, "inv_freq");
  if (!lua_isnil(L, -1) && !luaL_testudata(L, -1, KGL_TENSOR_MT))
    return luaL_error(L, "decode_qkv: inv_freq must be a tensor, got %s", luaL_typename(L, -1));
  kg_tensor *freq = lua_isnil(L, -1) ? NULL : kgl_check(L, -1);
  KGL_CALL(L, kg_decode_qkv(&r, x, pos, ck, cv, col, freq, H, Hkv, base, scale));
  lua_pop(L, 1);
  kgl_push(L, r);
  return 1;
}

void kgl_register_decode(lua_State *L, int methods, int keng) { kgl_set(L, methods, keng, "decode_qkv", l_decode_qkv); }
