/* distributed.c — the C half of keng.distributed (scripts/lib/keng/distributed.lua adds
 * data_parallel): processes and tensor collectives of engine/dist/.
 *
 *   keng._distributed.init() -> world_size      rank(), world_size(), local_rank(), barrier()
 *   all_reduce(t, {op = "sum"|"avg"|"max"|"min"}) -> t      broadcast(t, root) -> t (root 0-based)
 *   all_gather(t) -> [world_size, ...]          reduce_scatter(t, {op =}) -> [t.shape[1] / world, ...]
 *   available() -> {mpi = bool (a launcher started this process), nccl = bool (built with NCCL)} */
#include "keng_lua.h"

#include <keng/dist.h>

#include <string.h>

static const char *const op_names[] = {"sum", "avg", "max", "min", NULL};

/* {op = name} at idx (nil: sum) */
static kg_dist_op check_op(lua_State *L, int idx, const char *who) {
  static const char *const valid[] = {"op", NULL};
  kgl_check_options(L, idx, who, valid);
  if (lua_isnoneornil(L, idx)) return KG_DIST_SUM;
  lua_getfield(L, idx, "op");
  kg_dist_op op = KG_DIST_SUM;
  if (!lua_isnil(L, -1)) {
    const char *name = lua_tostring(L, -1);
    int i = 0;
    while (op_names[i] && !(name && lua_type(L, -1) == LUA_TSTRING && strcmp(op_names[i], name) == 0)) i++;
    if (!op_names[i])
      luaL_error(L, "%s: unknown op '%s' (valid: avg, max, min, sum)", who, luaL_tolstring(L, -1, NULL));
    op = (kg_dist_op)i;
  }
  lua_pop(L, 1);
  return op;
}

static int l_init(lua_State *L) {
  KGL_CALL(L, kg_dist_init());
  lua_pushinteger(L, kg_dist_world_size());
  return 1;
}
static int l_rank(lua_State *L) {
  lua_pushinteger(L, kg_dist_rank());
  return 1;
}
static int l_world_size(lua_State *L) {
  lua_pushinteger(L, kg_dist_world_size());
  return 1;
}
static int l_local_rank(lua_State *L) {
  lua_pushinteger(L, kg_dist_local_rank());
  return 1;
}
static int l_barrier(lua_State *L) {
  KGL_CALL(L, kg_dist_barrier());
  return 0;
}
static int l_available(lua_State *L) {
  lua_createtable(L, 0, 2);
  lua_pushboolean(L, kg_dist_using_mpi());
  lua_setfield(L, -2, "mpi");
  lua_pushboolean(L, kg_nccl_available());
  lua_setfield(L, -2, "nccl");
  return 1;
}

static int l_all_reduce(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  kg_dist_op op = check_op(L, 2, "all_reduce");
  KGL_CALL(L, kg_dist_all_reduce(t, op));
  lua_settop(L, 1);
  return 1;
}

static int l_broadcast(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  lua_Integer root = luaL_optinteger(L, 2, 0);
  KGL_CALL(L, kg_dist_broadcast(t, (int)root));
  lua_settop(L, 1);
  return 1;
}

static int l_all_gather(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *out = NULL;
  KGL_CALL(L, kg_dist_all_gather(&out, t));
  kgl_push(L, out);
  return 1;
}

static int l_reduce_scatter(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *out = NULL;
  kg_dist_op op = check_op(L, 2, "reduce_scatter");
  KGL_CALL(L, kg_dist_reduce_scatter(&out, t, op));
  kgl_push(L, out);
  return 1;
}

void kgl_register_distributed(lua_State *L, int methods, int keng) {
  (void)methods;
  static const luaL_Reg fns[] = {{"init", l_init},
                                 {"rank", l_rank},
                                 {"world_size", l_world_size},
                                 {"local_rank", l_local_rank},
                                 {"barrier", l_barrier},
                                 {"available", l_available},
                                 {"all_reduce", l_all_reduce},
                                 {"broadcast", l_broadcast},
                                 {"all_gather", l_all_gather},
                                 {"reduce_scatter", l_reduce_scatter},
                                 {NULL, NULL}};
  luaL_newlib(L, fns);
  lua_setfield(L, keng, "_distributed");
}
