/* random.c — bindings of the random ops used inside models (LUA_API.md):
 *   keng.dropout(x, p=0.5, training=true)         inverted dropout; x itself when not training
 *   keng.multinomial(probs, n=1, {replacement=false})  probs [V] or [B, V] -> i64 0-based ids
 * (keng.rand / randn / randint / manual_seed are bound with the tensor constructors.) */
#include "keng_lua.h"

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

void kgl_register_random(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "dropout", l_dropout);
  kgl_set(L, methods, keng, "multinomial", l_multinomial);
}
