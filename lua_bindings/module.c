/* module.c — `require "keng"` from a plain lua5.4 interpreter. */
#include "keng_lua.h"

LUALIB_API int luaopen_keng(lua_State *L) {
  kg_env_init(); /* as the keng binary: warns about unknown KENG_* variables */
  return kgl_open(L);
}
