/* random.c — bindings of the random ops used inside models (docs/lua_api.md):
 *   keng.dropout(x, p=0.5, training=true)         inverted dropout; x itself when not training
 *   keng.multinomial(probs, n=1, {replacement=false})  probs [V] or [B, V] -> i64 0-based ids
 * (keng.rand / randn / randint / manual_seed are bound with the tensor constructors.) */
#include "keng_lua.h"

#include <string.h>

static int l_dropout(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  double p = luaL_optnumber(L, 2, 0.5);
  bool training = lua_isnoneornil(L, 3) ? true : lua_toboolean(L, 3);
  KGL_CALL(L, kg_dropout(&r, x, p, training));
  kgl_push(L, r);
  return 1;
}

static int l_multinomial(lua_State *L) {
  kg_tensor *probs = kgl_check(L, 1), *r;
  lua_Integer n = luaL_optinteger(L, 2, 1);
  static const char *const valid[] = {"replacement", NULL};
  kgl_check_options(L, 3, "multinomial", valid);
  bool replacement = kgl_field_bool(L, 3, "replacement", false);
  KGL_CALL(L, kg_multinomial(&r, probs, n, replacement));
  kgl_push(L, r);
  return 1;
}

/* keng.get_rng_state() -> {seed =, offset =}: the process-wide Philox position (cpu and cuda
 * draw from the same stream). The 64-bit seed keeps its bits in a Lua integer (it may print
 * negative). */
static int l_get_rng_state(lua_State *L) {
  kg_philox_state s = kg_get_rng_state();
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, (lua_Integer)s.seed);
  lua_setfield(L, -2, "seed");
  lua_pushinteger(L, (lua_Integer)s.offset);
  lua_setfield(L, -2, "offset");
  return 1;
}

/* integer field k of the state table at index 1, or an error naming it */
static uint64_t state_field(lua_State *L, const char *k) {
  lua_getfield(L, 1, k);
  int ok = 0;
  lua_Integer v = lua_tointegerx(L, -1, &ok);
  if (!ok) luaL_error(L, "set_rng_state: state.%s must be an integer (from keng.get_rng_state), got %s", k, luaL_typename(L, -1));
  lua_pop(L, 1);
  return (uint64_t)v;
}

/* keng.set_rng_state(state): back to a position from keng.get_rng_state */
static int l_set_rng_state(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    lua_pop(L, 1);
    const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (!k || (strcmp(k, "seed") && strcmp(k, "offset")))
      return luaL_error(L, "set_rng_state: unknown key '%s' (valid: offset, seed)", k ? k : luaL_typename(L, -1));
  }
  kg_philox_state s = {state_field(L, "seed"), state_field(L, "offset")};
  if (s.offset & 3) return luaL_error(L, "set_rng_state: offset %I is not a multiple of 4 (not from keng.get_rng_state)",
                                      (lua_Integer)s.offset);
  kg_set_rng_state(s);
  return 0;
}

void kgl_register_random(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "dropout", l_dropout);
  kgl_set(L, methods, keng, "multinomial", l_multinomial);
  kgl_set(L, 0, keng, "get_rng_state", l_get_rng_state);
  kgl_set(L, 0, keng, "set_rng_state", l_set_rng_state);
}
