/* module.c — `require "keng"` from a plain lua5.4 interpreter. */
#include "keng_lua.h"

LUALIB_API int luaopen_keng(lua_State *L) { return kgl_open(L); }
