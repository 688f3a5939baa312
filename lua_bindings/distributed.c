/* distributed.c — the C half of keng.distributed (scripts/lib/keng/distributed.lua adds
 * data_parallel): processes and tensor collectives of engine/dist/.
 *
 *   keng._distributed.init() -> world_size      rank(), world_size(), local_rank(), barrier()
 *   all_reduce(t, {op = "sum"|"avg"|"max"|"min"}) -> t      broadcast(t, root) -> t (root 0-based)
 *   all_gather(t) -> [world_size, ...]          reduce_scatter(t, {op =}) -> [t.shape[1] / world, ...]
 *   available() -> {mpi = bool (a launcher started this process), mpi_built = bool (built with MPI),
 *                   nccl = bool (built with NCCL)}
 *   all_reduce_start(t, {op =}) -> work        work:test() -> done, work:wait() -> t (once)
 *   setup(device): the communicator of a cuda device now (before any CUDA graph capture)
 *   backward_hooked(t, gradient|nil, retain_graph, leaves, fn): t:backward that calls fn(i) as
 *     soon as leaves[i]'s grad is final (data_parallel starts its bucket all-reduces from there) */
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
static int l_setup(lua_State *L) {
  kg_device dev = kgl_device(L, 1);
  KGL_CALL(L, kg_dist_setup(dev));
  return 0;
}
static int l_available(lua_State *L) {
  lua_createtable(L, 0, 3);
  lua_pushboolean(L, kg_dist_using_mpi());
  lua_setfield(L, -2, "mpi");
  lua_pushboolean(L, kg_dist_mpi_built());
  lua_setfield(L, -2, "mpi_built");
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

/* ---- started all-reduces ----------------------------------------------------------------- */

#define WORK_MT "keng.distributed.Work"

typedef struct {
  kg_dist_work *w; /* NULL once waited */
} work_box;

static int l_all_reduce_start(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  kg_dist_op op = check_op(L, 2, "all_reduce_start");
  work_box *b = lua_newuserdatauv(L, sizeof *b, 1);
  b->w = NULL;
  luaL_setmetatable(L, WORK_MT);
  lua_pushvalue(L, 1); /* the work keeps its tensor for wait()'s result */
  lua_setiuservalue(L, -2, 1);
  KGL_CALL(L, kg_dist_all_reduce_start(t, op, &b->w));
  return 1;
}

static work_box *check_work(lua_State *L) {
  work_box *b = luaL_checkudata(L, 1, WORK_MT);
  if (!b->w) luaL_error(L, "all_reduce_start: this work was already waited for");
  return b;
}

static int l_work_test(lua_State *L) {
  work_box *b = check_work(L);
  bool done = false;
  KGL_CALL(L, kg_dist_test(b->w, &done));
  lua_pushboolean(L, done);
  return 1;
}

static int l_work_wait(lua_State *L) {
  work_box *b = check_work(L);
  kg_dist_work *w = b->w;
  b->w = NULL;
  KGL_CALL(L, kg_dist_wait(w));
  lua_getiuservalue(L, 1, 1);
  return 1;
}

static int l_work_gc(lua_State *L) { /* a dropped work still completes (MPI owns its buffer) */
  work_box *b = luaL_checkudata(L, 1, WORK_MT);
  if (b->w) kg_dist_wait(b->w);
  b->w = NULL;
  return 0;
}

/* ---- backward with a grad-ready hook --------------------------------------------------------- */

typedef struct {
  lua_State *L;
  int fn;             /* stack index of the Lua function */
  kg_tensor **leaves; /* leaves[i - 1]: the tensor fn(i) reports */
  int n;
} hook_ctx;

static kg_status on_ready(kg_tensor *leaf, void *ud) {
  hook_ctx *h = ud;
  int i = 0;
  while (i < h->n && h->leaves[i] != leaf) i++;
  if (i == h->n) return KG_OK; /* not one the caller watches */
  lua_pushvalue(h->L, h->fn);
  lua_pushinteger(h->L, i + 1);
  if (lua_pcall(h->L, 1, 0, 0) == LUA_OK) return KG_OK;
  kg_status s = kg_error(KG_ERR_VALUE, "backward", "%s", lua_tostring(h->L, -1));
  lua_pop(h->L, 1);
  return s;
}

static int l_backward_hooked(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  kg_tensor *g = lua_isnoneornil(L, 2) ? NULL : kgl_check(L, 2);
  bool retain = lua_toboolean(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  luaL_checktype(L, 5, LUA_TFUNCTION);
  int n = (int)luaL_len(L, 4);
  kg_tensor **leaves = lua_newuserdatauv(L, sizeof(kg_tensor *) * (size_t)(n ? n : 1), 0); /* freed by the GC */
  for (int i = 0; i < n; i++) {
    lua_geti(L, 4, i + 1);
    leaves[i] = kgl_check(L, -1);
    lua_pop(L, 1);
  }
  hook_ctx h = {L, 5, leaves, n};
  KGL_CALL(L, kg_backward_ex(t, g, retain, on_ready, &h));
  return 0;
}

void kgl_register_distributed(lua_State *L, int methods, int keng) {
  (void)methods;
  static const luaL_Reg fns[] = {{"init", l_init},
                                 {"rank", l_rank},
                                 {"world_size", l_world_size},
                                 {"local_rank", l_local_rank},
                                 {"barrier", l_barrier},
                                 {"available", l_available},
                                 {"setup", l_setup},
                                 {"all_reduce", l_all_reduce},
                                 {"broadcast", l_broadcast},
                                 {"all_gather", l_all_gather},
                                 {"reduce_scatter", l_reduce_scatter},
                                 {"all_reduce_start", l_all_reduce_start},
                                 {"backward_hooked", l_backward_hooked},
                                 {NULL, NULL}};
  static const luaL_Reg work_methods[] = {{"test", l_work_test}, {"wait", l_work_wait}, {NULL, NULL}};
  luaL_newmetatable(L, WORK_MT);
  luaL_newlib(L, work_methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, l_work_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  luaL_newlib(L, fns);
  lua_setfield(L, keng, "_distributed");
}
