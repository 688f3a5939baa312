/* json.c — binding of the engine's JSON reader (engine/io/json.c, <keng/json.h>), the one reader
 * behind require("keng.json").decode (docs/lua_api.md):
 *   keng.json_decode(text, null, array_mt) -> value
 * Objects become tables; arrays become sequences with metatable array_mt (so an empty array and
 * an empty object stay distinguishable); a number written as an integer in [-2^63, 2^63) becomes
 * a Lua integer, any other number a float; JSON null becomes `null`, or when `null` is nil an
 * object member that is null is left out and an array closes up over its nulls. Python's bare
 * NaN, Infinity and -Infinity read as floats (KG_JSON_NONFINITE). Malformed input raises
 * "json: invalid JSON at line L, column C (byte B): what". */
#include "keng_lua.h"

#include <keng/json.h>

#define TREE_MT "keng.json.tree"

/* the parsed tree lives in a userdata box whose __gc frees it, so a Lua error raised while the
 * tables are built (out of memory) leaks nothing */
static int tree_gc(lua_State *L) {
  kg_json **box = luaL_checkudata(L, 1, TREE_MT);
  kg_json_free(*box);
  *box = NULL;
  return 0;
}

/* pushes v; null_idx / mt_idx are the stack slots of the null value and the array metatable */
static void push_value(lua_State *L, const kg_json *v, int null_idx, int mt_idx) {
  luaL_checkstack(L, 4, "json: nested too deeply");
  switch (v->type) {
  case KG_JSON_NULL: lua_pushvalue(L, null_idx); break;
  case KG_JSON_BOOL: lua_pushboolean(L, v->boolean); break;
  case KG_JSON_NUMBER:
    if (v->is_int)
      lua_pushinteger(L, (lua_Integer)v->i64);
    else
      lua_pushnumber(L, v->number);
    break;
  case KG_JSON_STRING: lua_pushlstring(L, v->str, v->len); break;
  case KG_JSON_ARRAY: {
    lua_createtable(L, v->n, 0);
    lua_Integer k = 0;
    for (int i = 0; i < v->n; i++) {
      if (v->items[i].type == KG_JSON_NULL && lua_isnil(L, null_idx)) continue; /* closes up */
      push_value(L, &v->items[i], null_idx, mt_idx);
      lua_rawseti(L, -2, ++k);
    }
    if (!lua_isnil(L, mt_idx)) {
      lua_pushvalue(L, mt_idx);
      lua_setmetatable(L, -2);
    }
    break;
  }
  case KG_JSON_OBJECT:
    lua_createtable(L, 0, v->n);
    for (int i = 0; i < v->n; i++) {
      if (v->items[i].type == KG_JSON_NULL && lua_isnil(L, null_idx)) continue; /* left out */
      lua_pushlstring(L, v->keys[i], v->key_lens[i]);
      push_value(L, &v->items[i], null_idx, mt_idx);
      lua_rawset(L, -3);
    }
    break;
  }
}

static int l_json_decode(lua_State *L) {
  size_t len;
  const char *text = luaL_checklstring(L, 1, &len);
  if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
  lua_settop(L, 3);
  kg_json **box = lua_newuserdatauv(L, sizeof *box, 0);
  *box = NULL;
  luaL_setmetatable(L, TREE_MT);
  char err[320];
  *box = kg_json_parse_ex(text, len, KG_JSON_NONFINITE, err, sizeof err);
  if (!*box) return luaL_error(L, "json: %s", err);
  push_value(L, *box, 2, 3);
  kg_json_free(*box); /* now, not at the next collection */
  *box = NULL;
  return 1;
}

void kgl_register_json(lua_State *L, int methods, int keng) {
  (void)methods;
  luaL_newmetatable(L, TREE_MT);
  lua_pushcfunction(L, tree_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lua_pushcfunction(L, l_json_decode);
  lua_setfield(L, keng, "json_decode");
}
