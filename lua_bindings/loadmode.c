/* loadmode.c — the `keng` executable loads Lua source only: binary chunks (precompiled
 * bytecode, which the Lua VM does not verify and which can corrupt memory) are refused by
 * load, loadfile, dofile and require's Lua searcher, as they are for scripts, -e and the REPL.
 * C modules (package.cpath) still load as in plain Lua. Installed by main.c (not by the plain
 * `require "keng"` module, which leaves the host's Lua alone). See docs/security.md. */
#include "keng_lua.h"

/* load(chunk [, name [, mode [, env]]]): mode forced to "t", the other arguments kept as given
 * (an explicit nil env must stay an explicit nil) */
static int load_text(lua_State *L) {
  if (lua_gettop(L) < 3) lua_settop(L, 3);
  lua_pushliteral(L, "t");
  lua_replace(L, 3);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* loadfile([filename [, mode [, env]]]) */
static int loadfile_text(lua_State *L) {
  if (lua_gettop(L) < 2) lua_settop(L, 2);
  lua_pushliteral(L, "t");
  lua_replace(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* dofile([filename]) */
static int dofile_text(lua_State *L) {
  const char *fname = luaL_optstring(L, 1, NULL);
  lua_settop(L, 1);
  if (luaL_loadfilex(L, fname, "t") != LUA_OK) return lua_error(L);
  lua_call(L, 0, LUA_MULTRET);
  return lua_gettop(L) - 1;
}

/* package.searchers[2]: a module file found on package.path, loaded as text */
static int searcher_text(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  lua_settop(L, 1);
  lua_getfield(L, lua_upvalueindex(1), "searchpath");
  lua_pushstring(L, name);
  lua_getfield(L, lua_upvalueindex(1), "path");
  if (!lua_isstring(L, -1)) return luaL_error(L, "'package.path' must be a string");
  lua_call(L, 2, 2); /* filename | nil, message */
  if (lua_isnil(L, -2)) return 1;
  const char *filename = lua_tostring(L, -2);
  if (luaL_loadfilex(L, filename, "t") != LUA_OK)
    return luaL_error(L, "error loading module '%s' from file '%s':\n\t%s", name, filename, lua_tostring(L, -1));
  lua_pushvalue(L, -3);
  return 2;
}

void kgl_text_only(lua_State *L) {
  lua_getglobal(L, "load");
  lua_pushcclosure(L, load_text, 1);
  lua_setglobal(L, "load");
  lua_getglobal(L, "loadfile");
  lua_pushcclosure(L, loadfile_text, 1);
  lua_setglobal(L, "loadfile");
  lua_pushcfunction(L, dofile_text);
  lua_setglobal(L, "dofile");
  lua_getglobal(L, "package");
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "searchers");
    if (lua_istable(L, -1)) {
      lua_pushvalue(L, -2);
      lua_pushcclosure(L, searcher_text, 1);
      lua_rawseti(L, -2, 2);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}
