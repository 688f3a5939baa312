/* tokenizer_util.c — helpers of the tokenizer bindings (tokenizer_util.h). */
#include "tokenizer_util.h"

#include <stdlib.h>

int kgl_push_ids(lua_State *L, int32_t *ids, int64_t n) {
  lua_createtable(L, (int)n, 0);
  for (int64_t i = 0; i < n; i++) {
    lua_pushinteger(L, ids[i]);
    lua_rawseti(L, -2, i + 1);
  }
  free(ids);
  return 1;
}

int64_t *kgl_check_ids(lua_State *L, int idx, const char *who, lua_Integer *n) {
  if (kgl_test(L, idx)) { /* a tensor: through its tolist */
    lua_getfield(L, idx, "tolist");
    lua_pushvalue(L, idx);
    lua_call(L, 1, 1);
    lua_replace(L, idx);
  }
  luaL_checktype(L, idx, LUA_TTABLE);
  *n = luaL_len(L, idx);
  int64_t *ids = lua_newuserdatauv(L, (*n ? *n : 1) * sizeof *ids, 0); /* freed by the GC on error */
  for (lua_Integer i = 0; i < *n; i++) {
    lua_geti(L, idx, i + 1);
    int ok;
    ids[i] = lua_tointegerx(L, -1, &ok);
    if (!ok)
      luaL_error(L, "%s: element %d is a %s, not an integer id", who, (int)i + 1, luaL_typename(L, -1));
    lua_pop(L, 1);
  }
  return ids;
}

int kgl_push_id_or_nil(lua_State *L, int64_t id) {
  if (id < 0)
    lua_pushnil(L);
  else
    lua_pushinteger(L, id);
  return 1;
}

int kgl_push_lstring_or_nil(lua_State *L, const char *s, size_t n) {
  if (s)
    lua_pushlstring(L, s, n);
  else
    lua_pushnil(L);
  return 1;
}
