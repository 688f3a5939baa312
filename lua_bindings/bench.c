/* bench.c — binding of the memory bandwidth micro-benchmark (engine/cpu/bandwidth.c):
 *   keng.memory_bandwidth{threads = keng.num_threads(), mib = 1024, reps = 5}
 *       -> {read = GB/s, triad = GB/s, threads = n, bytes = b}
 * The roofline of memory-bound rows (batch-1 decode); scripts/bench/stream.lua prints it. */
#include "keng_lua.h"

static int l_memory_bandwidth(lua_State *L) {
  static const char *const valid[] = {"threads", "mib", "reps", NULL};
  kgl_check_options(L, 1, "memory_bandwidth", valid);
  bool t = lua_istable(L, 1);
  lua_Integer threads = t ? kgl_field_integer(L, 1, "threads", 0, 1, 4096) : 0;
  lua_Integer mib = t ? kgl_field_integer(L, 1, "mib", 1024, 1, 1 << 20) : 1024;
  lua_Integer reps = t ? kgl_field_integer(L, 1, "reps", 5, 1, 1000) : 5;
  kg_bandwidth r;
  KGL_CALL(L, kg_cpu_bandwidth(&r, (size_t)mib << 20, (int)threads, (int)reps));
  lua_createtable(L, 0, 4);
  lua_pushnumber(L, r.read);
  lua_setfield(L, -2, "read");
  lua_pushnumber(L, r.triad);
  lua_setfield(L, -2, "triad");
  lua_pushinteger(L, r.threads);
  lua_setfield(L, -2, "threads");
  lua_pushinteger(L, mib << 20);
  lua_setfield(L, -2, "bytes");
  return 1;
}

void kgl_register_bench(lua_State *L, int methods, int keng) {
  (void)methods;
  lua_pushcfunction(L, l_memory_bandwidth);
  lua_setfield(L, keng, "memory_bandwidth");
}
