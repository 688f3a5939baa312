/* attention.c — Lua bindings of the attention op family (see docs/lua_api.md):
 *   keng.scaled_dot_product_attention(q, k, v, {mask=, causal=false, scale=, window=, rel_h=, rel_w=})
 *       q [B,H,T,D], k/v [B,Hkv,S,D] -> [B,H,T,D]; rel_h [B,H,T,kh], rel_w [B,H,T,kw] (kh*kw = S):
 *       SAM's decomposed relative-position bias; layout = "bthd": the output as [B,T,H,D]
 *   keng.rope(x, positions, {base=10000, inv_freq=, scale=1})
 *       x [..., T, D], positions [T] or [B,T] (0-based), inv_freq [D/2] (scaled RoPE) */
#include "keng_lua.h"

#include <stdint.h>
#include <string.h>

static int l_sdpa(lua_State *L) {
  kg_tensor *q = kgl_check(L, 1), *k = kgl_check(L, 2), *v = kgl_check(L, 3), *mask = NULL, *rh = NULL, *rw = NULL, *r;
  kgl_check_options(L, 4, "scaled_dot_product_attention",
                    (const char *const[]){"mask", "causal", "scale", "window", "rel_h", "rel_w", "layout", NULL});
  if (!lua_isnoneornil(L, 4)) { /* the tensors stay referenced by the options table */
    lua_getfield(L, 4, "mask");
    mask = kgl_opt(L, -1);
    lua_getfield(L, 4, "rel_h");
    rh = kgl_opt(L, -1);
    lua_getfield(L, 4, "rel_w");
    rw = kgl_opt(L, -1);
    lua_pop(L, 3);
  }
  kg_sdpa_params p = {kgl_field_number(L, 4, "scale", 0), kgl_field_bool(L, 4, "causal", false),
                      kgl_field_integer(L, 4, "window", 0, 0, INT64_MAX)}; /* 0: no window */
  if (!lua_isnoneornil(L, 4)) {
    lua_getfield(L, 4, "layout");
    const char *lay = lua_isnil(L, -1) ? "bhtd" : lua_tostring(L, -1);
    if (!lay || (strcmp(lay, "bhtd") && strcmp(lay, "bthd")))
      return luaL_error(L, "scaled_dot_product_attention: layout '%s' unknown (valid: bhtd, bthd)",
                        lay ? lay : luaL_typename(L, -1));
    p.out_bthd = strcmp(lay, "bthd") == 0;
    lua_pop(L, 1);
  }
  KGL_CALL(L, kg_sdpa_rel(&r, q, k, v, mask, rh, rw, &p));
  kgl_push(L, r);
  return 1;
}

static int l_rope(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *pos = kgl_check(L, 2), *freq = NULL, *r;
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    for (lua_pushnil(L); lua_next(L, 3); lua_pop(L, 1)) { /* a misspelt option must not pass silently */
      const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
      if (!k || (strcmp(k, "base") && strcmp(k, "inv_freq") && strcmp(k, "scale")))
        return luaL_error(L, "rope: unknown option '%s' (valid: base, inv_freq, scale)",
                          k ? k : luaL_typename(L, -2));
    }
    lua_getfield(L, 3, "inv_freq");
    freq = kgl_opt(L, -1); /* stays referenced by the options table */
    lua_pop(L, 1);
  }
  kg_rope_params p = {kgl_field_number(L, 3, "base", 10000), kgl_field_number(L, 3, "scale", 1)};
  KGL_CALL(L, kg_rope_freq(&r, x, pos, freq, &p));
  kgl_push(L, r);
  return 1;
}

void kgl_register_attention(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "scaled_dot_product_attention", l_sdpa);
  kgl_set(L, methods, keng, "rope", l_rope);
}
