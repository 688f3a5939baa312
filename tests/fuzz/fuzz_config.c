/* fuzz_config.c — how every model reads its config.json: models.common.read_json (the input
 * written to a file, decoded by keng.json with nulls read as absent), beside plain
 * keng.json.decode, both run in an embedded Lua state. keng.json.decode is the engine's reader
 * (engine/io/json.c) through its Lua binding (lua_bindings/json.c, compiled into this target;
 * `require "keng"` here gives a table holding only that binding). A Lua checker asserts, per input:
 *  - each reader returns or raises a string error; read_json's error names who and the file;
 *  - read_json succeeds exactly when decode gives an object (or array), never for a top-level null;
 *  - read_json's table equals decode's with every null member left out and every null array
 *    element closed up, and holds no json.null.
 * A broken property traps; a hang is a timeout. Coverage comes from a Lua line hook feeding
 * libFuzzer's extra counters (the interpreter itself is not instrumented). */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_util.h"

void kgl_register_json(lua_State *L, int methods, int keng); /* lua_bindings/json.c */

/* package.preload.keng: a `keng` table with the JSON binding alone (no engine start-up) */
static int open_keng(lua_State *L) {
  lua_newtable(L); /* keng */
  lua_newtable(L); /* methods (unused by the binding) */
  kgl_register_json(L, lua_gettop(L), lua_gettop(L) - 1);
  lua_pop(L, 1);
  return 1;
}

#ifndef KENG_SOURCE_DIR
#define KENG_SOURCE_DIR "."
#endif

__attribute__((section("__libfuzzer_extra_counters"))) static uint8_t counters[8192];
static uint32_t prev_line;

static void on_line(lua_State *L, lua_Debug *ar) {
  (void)L;
  uint32_t cur = (uint32_t)ar->currentline * 2654435761u;
  counters[(cur ^ (prev_line >> 1)) % sizeof counters]++;
  prev_line = cur;
}

/* A chunk that takes the two modules (json, common) and returns check(path, text) -> nil, or
 * what went wrong; path holds text. */
static const char checker[] =
    "local json, common = ...\n"
    "local null = json.null\n"
    "local function has_null(v)\n"
    "  if v == null then return true end\n"
    "  if type(v) ~= 'table' then return false end\n"
    "  for _, x in pairs(v) do if has_null(x) then return true end end\n"
    "  return false\n"
    "end\n"
    "-- same(a, b): a (nulls kept) with its nulls dropped equals b\n"
    "local function same(a, b)\n"
    "  if type(a) ~= 'table' then return a == b end\n"
    "  if type(b) ~= 'table' then return false end\n"
    "  local n = 0\n"
    "  if getmetatable(a) == json.array_mt then\n"
    "    if getmetatable(b) ~= json.array_mt then return false end\n"
    "    for i = 1, #a do\n"
    "      if a[i] ~= null then n = n + 1; if not same(a[i], b[n]) then return false end end\n"
    "    end\n"
    "    return #b == n\n"
    "  end\n"
    "  for k, v in pairs(a) do\n"
    "    if v ~= null then n = n + 1; if not same(v, b[k]) then return false end end\n"
    "  end\n"
    "  for _ in pairs(b) do n = n - 1 end\n"
    "  return n == 0\n"
    "end\n"
    "return function(path, text)\n"
    "  local ok1, v1 = pcall(json.decode, text)\n"
    "  if not ok1 and type(v1) ~= 'string' then return 'decode raised a ' .. type(v1) end\n"
    "  local ok2, v2 = pcall(common.read_json, path, 'fuzz', 1)\n"
    "  if not ok2 then\n"
    "    if type(v2) ~= 'string' then return 'read_json raised a ' .. type(v2) end\n"
    "    if v2:sub(1, #path + 8) ~= 'fuzz: ' .. path .. ': ' then return 'unnamed error: ' .. v2 end\n"
    "  end\n"
    "  local object = ok1 and type(v1) == 'table' and v1 ~= null\n"
    "  if ok2 ~= object then return 'read_json and decode disagree' end\n"
    "  if ok2 and has_null(v2) then return 'read_json kept a null' end\n"
    "  if ok2 and not same(v1, v2) then return 'read_json differs from decode without nulls' end\n"
    "end\n";

static lua_State *L;
static int ref_check;

static void require_module(const char *name) {
  lua_getglobal(L, "require");
  lua_pushstring(L, name);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    fprintf(stderr, "fuzz_config: %s\n", lua_tostring(L, -1));
    abort();
  }
}

static void setup(void) {
  L = luaL_newstate();
  luaL_openlibs(L);
  /* keng.json and models.common are Lua over the JSON binding (common needs no more) */
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, open_keng);
  lua_setfield(L, -2, "keng");
  lua_pop(L, 1);
  lua_getglobal(L, "package");
  lua_pushstring(L, KENG_SOURCE_DIR "/scripts/lib/?.lua;" KENG_SOURCE_DIR "/scripts/?.lua");
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
  if (luaL_loadbufferx(L, checker, sizeof checker - 1, "=fuzz_config.checker", "t") != LUA_OK) {
    fprintf(stderr, "fuzz_config: %s\n", lua_tostring(L, -1));
    abort();
  }
  require_module("keng.json");
  require_module("models.common");
  if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
    fprintf(stderr, "fuzz_config: %s\n", lua_tostring(L, -1));
    abort();
  }
  ref_check = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_sethook(L, on_line, LUA_MASKLINE, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) setup();
  prev_line = 0;
  const char *path = fuzz_file(0, "config.json", data, size);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref_check);
  lua_pushstring(L, path);
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 2, 1, 0) != LUA_OK || !lua_isnil(L, -1)) {
    fprintf(stderr, "fuzz_config: %s\n", lua_tostring(L, -1) ? lua_tostring(L, -1) : luaL_typename(L, -1));
    __builtin_trap();
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
