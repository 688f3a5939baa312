/* loadmode.c — the `keng` executable loads Lua source only: binary chunks (precompiled
 * bytecode, which the Lua VM does not verify and which can corrupt memory) are refused by
 * load, loadfile, dofile and require's Lua searcher, as they are for scripts, -e and the REPL.
 * C modules (package.cpath) still load as in plain Lua. Installed by main.c (not by the plain
 * `require "keng"` module, which leaves the host's Lua alone). See docs/security.md. */
#include "keng_lua.h"

#include <string.h>

/* load and loadfile are written here over the C API rather than wrapped: a wrapper would keep
 * the base library's functions as upvalues, and debug.getupvalue(load, 1) would hand the
 * unrestricted (bytecode-loading) load back. */

/* the loaded chunk with env as its first upvalue (when given), or fail plus the message */
static int loaded(lua_State *L, int status, int env) {
  if (status != LUA_OK) {
    luaL_pushfail(L);
    lua_insert(L, -2);
    return 2;
  }
  if (env) {
    lua_pushvalue(L, env);
    if (!lua_setupvalue(L, -2, 1)) lua_pop(L, 1);
  }
  return 1;
}

#define READER_SLOT 5 /* load's reader keeps the piece it returned here, alive while it is parsed */

static const char *read_piece(lua_State *L, void *ud, size_t *size) {
  (void)ud;
  luaL_checkstack(L, 2, "too many nested functions");
  lua_pushvalue(L, 1);
  lua_call(L, 0, 1);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    *size = 0;
    return NULL;
  }
  if (!lua_isstring(L, -1)) luaL_error(L, "reader function must return a string");
  lua_replace(L, READER_SLOT);
  return lua_tolstring(L, READER_SLOT, size);
}

/* load(chunk [, chunkname [, mode [, env]]]): chunk a string or a reader function; the mode is
 * always "t" whatever is passed; an explicit nil env stays an explicit nil */
static int load_text(lua_State *L) {
  int env = lua_isnone(L, 4) ? 0 : 4;
  size_t len;
  const char *s = lua_tolstring(L, 1, &len);
  int status;
  if (s) {
    status = luaL_loadbufferx(L, s, len, luaL_optstring(L, 2, s), "t");
  } else {
    const char *name = luaL_optstring(L, 2, "=(load)");
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_settop(L, READER_SLOT);
    status = lua_load(L, read_piece, NULL, name, "t");
  }
  return loaded(L, status, env);
}

/* loadfile([filename [, mode [, env]]]) */
static int loadfile_text(lua_State *L) {
  const char *fname = luaL_optstring(L, 1, NULL);
  int env = lua_isnone(L, 3) ? 0 : 3;
  return loaded(L, luaL_loadfilex(L, fname, "t"), env);
}

/* dofile([filename]) */
static int dofile_text(lua_State *L) {
  const char *fname = luaL_optstring(L, 1, NULL);
  lua_settop(L, 1);
  if (luaL_loadfilex(L, fname, "t") != LUA_OK) return lua_error(L);
  lua_call(L, 0, LUA_MULTRET);
  return lua_gettop(L) - 1;
}

/* package.searchers[2]: a module file found on package.path, loaded as text. keng's own
 * namespaces (keng.*, models.*) are looked up on package.keng_path only (main.c sets it to
 * keng's roots), so no file in the working directory can shadow part of the library. */
static int searcher_text(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  lua_settop(L, 1);
  lua_getfield(L, lua_upvalueindex(1), "searchpath");
  lua_pushstring(L, name);
  bool own = !strncmp(name, "keng.", 5) || !strncmp(name, "models.", 7);
  if (!own || lua_getfield(L, lua_upvalueindex(1), "keng_path") != LUA_TSTRING || !lua_rawlen(L, -1)) {
    if (own) lua_pop(L, 1);
    lua_getfield(L, lua_upvalueindex(1), "path");
  }
  if (!lua_isstring(L, -1)) return luaL_error(L, "'package.path' must be a string");
  lua_call(L, 2, 2); /* filename | nil, message */
  if (lua_isnil(L, -2)) return 1;
  const char *filename = lua_tostring(L, -2);
  if (luaL_loadfilex(L, filename, "t") != LUA_OK)
    return luaL_error(L, "error loading module '%s' from file '%s':\n\t%s", name, filename, lua_tostring(L, -1));
  lua_pushvalue(L, -3);
  return 2;
}

/* package.searchers[3] and [4] (C modules) for names outside keng's namespaces only: a stray
 * ./keng/x.so must not load as part of keng either */
static int searcher_c_outside(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  if (!strncmp(name, "keng.", 5) || !strncmp(name, "models.", 7)) {
    lua_pushfstring(L, "no C module for '%s': keng's namespaces load from package.keng_path only", name);
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

void kgl_text_only(lua_State *L) {
  lua_pushcfunction(L, load_text);
  lua_setglobal(L, "load");
  lua_pushcfunction(L, loadfile_text);
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
      for (int i = 3; i <= 4; i++) {
        if (lua_rawgeti(L, -1, i) != LUA_TFUNCTION) {
          lua_pop(L, 1);
          continue;
        }
        lua_pushcclosure(L, searcher_c_outside, 1);
        lua_rawseti(L, -2, i);
      }
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}
