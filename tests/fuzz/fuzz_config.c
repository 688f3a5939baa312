/* fuzz_config.c — the Lua readers of a model's config.json: keng.json.decode (bert, clip,
 * unet, vae) and models.causal_lm.json_decode (gemma, mistral, sam), run in an embedded Lua
 * state. Each input must decode or raise a string error (the loaders wrap it with the file
 * name); a hang is a timeout. Coverage comes from a Lua line hook feeding libFuzzer's extra
 * counters (the interpreter itself is not instrumented). */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KENG_SOURCE_DIR
#define KENG_SOURCE_DIR "."
#endif

__attribute__((section("__libfuzzer_extra_counters"))) static uint8_t counters[8192];
static uint32_t prev_line;

static void on_line(lua_State *L, lua_Debug *ar) {
  uint32_t cur = (uint32_t)ar->currentline * 2654435761u;
  counters[(cur ^ (prev_line >> 1)) % sizeof counters]++;
  prev_line = cur;
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "fuzz_config: cannot read %s\n", path);
    abort();
  }
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)len + 1);
  if (fread(s, 1, (size_t)len, f) != (size_t)len) abort();
  s[len] = 0;
  fclose(f);
  *n = (size_t)len;
  return s;
}

static lua_State *L;
static int ref_bench, ref_lm;

static void setup(void) {
  L = luaL_newstate();
  luaL_openlibs(L);
  /* keng.json (formerly bench.json): a plain module */
  const char *json_path = KENG_SOURCE_DIR "/scripts/lib/keng/json.lua";
  FILE *probe = fopen(json_path, "rb");
  if (probe) fclose(probe);
  else json_path = KENG_SOURCE_DIR "/scripts/bench/json.lua";
  if (luaL_loadfilex(L, json_path, "t") || lua_pcall(L, 0, 1, 0)) {
    fprintf(stderr, "fuzz_config: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_getfield(L, -1, "decode");
  ref_bench = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  /* causal_lm.json_decode: cut out of the module (which needs the engine) from its
   * "function M.json_decode(s)" line to the next "end" at column 0 */
  size_t n;
  char *src = slurp(KENG_SOURCE_DIR "/scripts/models/causal_lm.lua", &n);
  char *a = strstr(src, "\nfunction M.json_decode(s)\n");
  char *b = a ? strstr(a, "\nend\n") : NULL;
  if (!a || !b) {
    fprintf(stderr, "fuzz_config: causal_lm.lua has no json_decode\n");
    abort();
  }
  luaL_Buffer lb;
  luaL_buffinit(L, &lb);
  luaL_addstring(&lb, "local M = {}");
  luaL_addlstring(&lb, a, (size_t)(b - a) + 5);
  luaL_addstring(&lb, "return M.json_decode");
  luaL_pushresult(&lb);
  free(src);
  size_t cl;
  const char *code = lua_tolstring(L, -1, &cl);
  if (luaL_loadbufferx(L, code, cl, "=causal_lm.json_decode", "t") || lua_pcall(L, 0, 1, 0)) {
    fprintf(stderr, "fuzz_config: %s\n", lua_tostring(L, -1));
    abort();
  }
  ref_lm = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  lua_sethook(L, on_line, LUA_MASKLINE, 0);
}

static void run(int ref, const uint8_t *data, size_t size) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 1, 1, 0) != LUA_OK && lua_type(L, -1) != LUA_TSTRING) {
    fprintf(stderr, "fuzz_config: error object is a %s\n", luaL_typename(L, -1));
    __builtin_trap();
  }
  lua_settop(L, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) setup();
  prev_line = 0;
  run(ref_bench, data, size);
  run(ref_lm, data, size);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
