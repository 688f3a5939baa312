/* runtime.c — the runtime's readings that the benchmarks report.
 *   keng.flop_count_performed() -> n   FLOPs the CPU executed: keng.flop_count() (the direct
 *                                      formula of each matmul, conv and attention, as peers count
 *                                      them) less what a cheaper algorithm skipped (Winograd)
 *   keng.thread_policy() -> {current = 2, max = 2, adaptive = true, others = 0.1 (nil before the
 *                           first reading), source = "adaptive"}
 * source is "adaptive" (no count given: the count follows the load, engine/core/threads.c),
 * "KENG_NUM_THREADS", "OMP_NUM_THREADS" or "set_num_threads" (a fixed count). */
#include "keng_lua.h"

static int l_thread_policy(lua_State *L) {
  kg_thread_policy p = kg_get_thread_policy();
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, p.current);
  lua_setfield(L, -2, "current");
  lua_pushinteger(L, p.max);
  lua_setfield(L, -2, "max");
  lua_pushboolean(L, p.adaptive);
  lua_setfield(L, -2, "adaptive");
  if (p.others >= 0) {
    lua_pushnumber(L, p.others);
    lua_setfield(L, -2, "others");
    lua_pushnumber(L, p.waiting);
    lua_setfield(L, -2, "waiting");
  }
  lua_pushstring(L, p.source);
  lua_setfield(L, -2, "source");
  return 1;
}

static int l_flop_count_performed(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)kg_flop_count_performed());
  return 1;
}

void kgl_register_runtime(lua_State *L, int methods, int keng) {
  (void)methods;
  lua_pushcfunction(L, l_flop_count_performed);
  lua_setfield(L, keng, "flop_count_performed");
  lua_pushcfunction(L, l_thread_policy);
  lua_setfield(L, keng, "thread_policy");
}
