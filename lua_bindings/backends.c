/* backends.c — keng.backends (process-wide kernel switches) and keng.cuda.graph (CUDA Graph
 * capture and replay of a whole step).
 *
 *   keng.backends.allow_tf32 = true      -- TF32 for f32 matmul / conv on cuda (default false)
 *   keng.backends.cudnn_sdpa = false     -- attention always on keng's flash kernel (default true:
 *                                        -- cuDNN's fused attention where it applies)
 *   keng.backends.cudnn_sdpa_stats       -- read-only counters of that path and of every route (a fresh table)
 *   keng.backends.sdpa_math = true       -- every attention call through the math route (default false)
 *   keng.backends.quant_activations = "f32"  -- the CPU's int8 / int4 GEMV with f32 x (default "int8":
 *                                        -- x quantized per block of 32, docs/quantization.md)
 *
 *   local g = keng.cuda.graph(fn, {warmup = 2, device = "cuda:0"})
 *   local loss = g(x, y)   -- calls 1..warmup: fn(x, y) eagerly; the next call captures fn into a
 *                          -- CUDA Graph and launches it; later calls replay it
 *
 * After capture, g returns the tensors that the captured call returned (the same objects each
 * time; a replay refills them). Tensor arguments are static inputs: a replay reads the storage
 * of the tensors passed to the capturing call. Passing other tensors of the same shape and dtype
 * (any device) copies them into those first (x_captured:copy_(x_new), asynchronous); any other
 * argument must equal the captured one. See docs/cuda.md for what fn may do while captured.
 *
 *   keng.cuda.on_replay(hook) -> id or false
 *     while a keng.cuda.graph is capturing: hook(replay) will run before every launch of that
 *     graph (replay false for the launch right after the capture, true after), to write host-side
 *     values (an optimizer's lr and step count) into device memory the graph reads; returns an
 *     id of the capture (1, 2, ...). Outside a capture: false, and nothing is kept. */
#include "keng_lua.h"

#include <string.h>

/* ---- keng.backends ---------------------------------------------------------------------------- */

/* keng.backends.cudnn_sdpa_stats: {cudnn = calls cuDNN ran, plans = plans built, build_failures =,
 * exec_failures =, fallback = calls left to keng's flash kernel, reasons = {dtype = n, ...}} */
static void push_sdpa_stats(lua_State *L) {
  kg_sdpa_stats st;
  kg_sdpa_stats_get(&st);
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, (lua_Integer)st.cudnn_calls);
  lua_setfield(L, -2, "cudnn");
  lua_pushinteger(L, (lua_Integer)st.plans_built);
  lua_setfield(L, -2, "plans");
  lua_pushinteger(L, (lua_Integer)st.build_failures);
  lua_setfield(L, -2, "build_failures");
  lua_pushinteger(L, (lua_Integer)st.exec_failures);
  lua_setfield(L, -2, "exec_failures");
  uint64_t total = st.build_failures + st.exec_failures;
  lua_createtable(L, 0, 11);
  for (int i = 0; kg_sdpa_fallback_name(i); i++) { /* the engine's names ("other" for slot 0) */
    lua_pushinteger(L, (lua_Integer)st.fallback[i]);
    lua_setfield(L, -2, kg_sdpa_fallback_name(i));
    total += st.fallback[i];
  }
  lua_setfield(L, -2, "reasons");
  lua_createtable(L, 0, 4);
  for (int i = 0; kg_sdpa_route_stat_name(i); i++) {
    lua_pushinteger(L, (lua_Integer)st.routes[i]);
    lua_setfield(L, -2, kg_sdpa_route_stat_name(i));
  }
  lua_setfield(L, -2, "routes");
  lua_pushinteger(L, (lua_Integer)total);
  lua_setfield(L, -2, "fallback");
}

static int backends_index(lua_State *L) {
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "allow_tf32") == 0) {
    lua_pushboolean(L, kg_allow_tf32());
    return 1;
  }
  if (strcmp(k, "cudnn_sdpa") == 0) {
    lua_pushboolean(L, kg_cudnn_sdpa());
    return 1;
  }
  if (strcmp(k, "sdpa_math") == 0) {
    lua_pushboolean(L, kg_sdpa_math());
    return 1;
  }
  if (strcmp(k, "cudnn_sdpa_stats") == 0) {
    push_sdpa_stats(L);
    return 1;
  }
  if (strcmp(k, "quant_activations") == 0) {
    lua_pushstring(L, kg_quant_act_int8() ? "int8" : "f32");
    return 1;
  }
  return 0;
}

static int backends_newindex(lua_State *L) {
  const char *k = luaL_checkstring(L, 2);
  bool tf32 = strcmp(k, "allow_tf32") == 0, sdpa = strcmp(k, "cudnn_sdpa") == 0, math = strcmp(k, "sdpa_math") == 0;
  if (tf32 || sdpa || math) {
    if (!lua_isboolean(L, 3))
      return luaL_error(L, "keng.backends.%s must be a boolean, got %s", k, luaL_typename(L, 3));
    if (tf32) kg_set_allow_tf32(lua_toboolean(L, 3));
    else if (math) kg_set_sdpa_math(lua_toboolean(L, 3));
    else kg_set_cudnn_sdpa(lua_toboolean(L, 3));
    return 0;
  }
  if (strcmp(k, "quant_activations") == 0) {
    const char *v = lua_type(L, 3) == LUA_TSTRING ? lua_tostring(L, 3) : "";
    if (strcmp(v, "int8") && strcmp(v, "f32"))
      return luaL_error(L, "keng.backends.quant_activations must be \"int8\" or \"f32\", got %s",
                        lua_type(L, 3) == LUA_TSTRING ? v : luaL_typename(L, 3));
    kg_set_quant_act_int8(strcmp(v, "int8") == 0);
    return 0;
  }
  if (strcmp(k, "cudnn_sdpa_stats") == 0) return luaL_error(L, "keng.backends.cudnn_sdpa_stats is read-only");
  return luaL_error(L, "keng.backends has no setting '%s' (known: allow_tf32, cudnn_sdpa, cudnn_sdpa_stats, quant_activations, sdpa_math)", k);
}

/* ---- keng.cuda.graph ---------------------------------------------------------------------------- */

#define GRAPH_MT "keng.CudaGraph"

/* uservalues: 1 = fn, 2 = captured arguments {n=}, 3 = captured results {n=}, 4 = replay hooks */
typedef struct {
  kg_cuda_graph *g;
  int device;
  int warmup, calls;
  bool broken; /* a capture failed: the tensors it made are invalid */
} lgraph;

static lgraph *check_graph(lua_State *L) { return (lgraph *)luaL_checkudata(L, 1, GRAPH_MT); }

/* pushes the stored table {n=, ...} at uservalue uv unpacked; returns the count */
static int push_packed(lua_State *L, int uv) {
  lua_getiuservalue(L, 1, uv);
  int t = lua_gettop(L);
  lua_getfield(L, t, "n");
  int n = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  luaL_checkstack(L, n, "keng.cuda.graph results");
  for (int i = 1; i <= n; i++) lua_rawgeti(L, t, i);
  lua_remove(L, t);
  return n;
}

/* stores stack slots [first, first + n) as {n=, ...} into uservalue uv */
static void store_packed(lua_State *L, int uv, int first, int n) {
  lua_createtable(L, n, 1);
  for (int i = 0; i < n; i++) {
    lua_pushvalue(L, first + i);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushinteger(L, n);
  lua_setfield(L, -2, "n");
  lua_setiuservalue(L, 1, uv);
}

/* calls fn with the arguments at [2, top]; returns the number of results left on the stack */
static int call_fn(lua_State *L, int nargs, bool protect, int *status) {
  int base = lua_gettop(L) - nargs; /* slot below the first argument */
  luaL_checkstack(L, nargs + 1, "keng.cuda.graph arguments");
  lua_getiuservalue(L, 1, 1);
  for (int i = 0; i < nargs; i++) lua_pushvalue(L, base + 1 + i);
  int top = lua_gettop(L) - nargs - 1;
  if (protect) *status = lua_pcall(L, nargs, LUA_MULTRET, 0);
  else lua_call(L, nargs, LUA_MULTRET);
  return lua_gettop(L) - top;
}

static kg_status copy_no_grad(kg_tensor *dst, const kg_tensor *src) {
  bool old = kg_set_grad_enabled(false);
  kg_status s = kg_copy_(dst, src);
  kg_set_grad_enabled(old);
  return s;
}

/* a replay's arguments against the captured ones: copies new tensors into the captured ones */
static void bind_args(lua_State *L, int nargs) {
  lua_getiuservalue(L, 1, 2);
  int cap = lua_gettop(L);
  lua_getfield(L, cap, "n");
  int n = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  if (n != nargs) luaL_error(L, "keng.cuda.graph: called with %d argument(s), captured with %d", nargs, n);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, cap, i);
    int c = lua_gettop(L), a = 1 + i;
    kg_tensor *ct = kgl_test(L, c), *at = kgl_test(L, a);
    if (ct && at) {
      if (ct != at && kg_data(ct) != kg_data(at)) {
        char s1[KG_SHAPE_STR_MAX], s2[KG_SHAPE_STR_MAX];
        bool same = at->ndim == ct->ndim && at->dtype == ct->dtype;
        for (int d = 0; same && d < at->ndim; d++) same = at->shape[d] == ct->shape[d];
        if (!same)
          luaL_error(L, "keng.cuda.graph: argument %d is %s %s, the graph was captured with %s %s: shapes must stay "
                     "the same (make a new keng.cuda.graph for the new shape)", i,
                     kg_shape_str(s1, at->ndim, at->shape), kg_dtype_info[at->dtype].name,
                     kg_shape_str(s2, ct->ndim, ct->shape), kg_dtype_info[ct->dtype].name);
        KGL_CALL(L, copy_no_grad(ct, at)); /* also from the cpu: an asynchronous upload */
      }
    } else if (!lua_rawequal(L, c, a) && !(lua_istable(L, c) && lua_istable(L, a))) {
      luaL_error(L, "keng.cuda.graph: argument %d differs from the captured one (non-tensor arguments are baked "
                 "into the graph)", i);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* the graph being captured in this Lua state (registry slot) and a counter of captures */
static const char capture_key = 'c';
static lua_Integer capture_count;

static int l_on_replay(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &capture_key) != LUA_TUSERDATA) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_getiuservalue(L, -1, 4);
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, -3, 4);
  }
  lua_pushvalue(L, 1);
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
  lua_pushinteger(L, capture_count);
  return 1;
}

/* runs the graph's replay hooks in order (an error propagates; the graph is not launched) */
static void run_hooks(lua_State *L, bool replay) {
  if (lua_getiuservalue(L, 1, 4) != LUA_TTABLE) {
    lua_pop(L, 1);
    return;
  }
  lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    lua_pushboolean(L, replay);
    lua_call(L, 1, 0);
  }
  lua_pop(L, 1);
}

static int graph_call(lua_State *L) {
  lgraph *g = check_graph(L);
  int nargs = lua_gettop(L) - 1;
  if (g->broken) return luaL_error(L, "keng.cuda.graph: the capture of this graph failed; make a new one");
  if (g->g) { /* replay */
    bind_args(L, nargs);
    run_hooks(L, true);
    KGL_CALL(L, kg_cuda_graph_launch(g->g));
    return push_packed(L, 3);
  }
  if (g->calls < g->warmup) { /* warm-up: eager */
    g->calls++;
    return call_fn(L, nargs, false, NULL);
  }
  /* capture: collect garbage and drain the queue first, so neither lands in the graph */
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCCOLLECT);
  KGL_CALL(L, kg_device_synchronize((kg_device){KG_DEV_CUDA, (int8_t)g->device}));
  KGL_CALL(L, kg_cuda_graph_begin(g->device));
  capture_count++;
  lua_pushvalue(L, 1); /* keng.cuda.on_replay registers hooks with this graph meanwhile */
  lua_rawsetp(L, LUA_REGISTRYINDEX, &capture_key);
  int status = LUA_OK;
  int nres = call_fn(L, nargs, true, &status);
  lua_pushnil(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &capture_key);
  kg_cuda_graph *cg = NULL;
  kg_status es = kg_cuda_graph_end(g->device, &cg);
  if (status != LUA_OK || es != KG_OK) {
    g->broken = true;
    const char *why = status != LUA_OK ? luaL_tolstring(L, -1, NULL) : kg_last_error();
    if (cg) kg_cuda_graph_free(cg); /* fn failed after a clean capture: the graph is never launched */
    return luaL_error(L, "keng.cuda.graph: capture failed: %s", why);
  }
  g->g = cg;
  g->calls++;
  int first = lua_gettop(L) - nres + 1;
  store_packed(L, 3, first, nres);
  store_packed(L, 2, 2, nargs);
  run_hooks(L, false);
  KGL_CALL(L, kg_cuda_graph_launch(cg));
  return nres;
}

static int graph_free(lua_State *L) {
  lgraph *g = check_graph(L);
  if (g->g) kg_cuda_graph_free(g->g);
  g->g = NULL;
  return 0;
}

/* g:free(): releases the graph now (its results stay valid); later calls raise */
static int graph_release(lua_State *L) {
  lgraph *g = check_graph(L);
  graph_free(L);
  g->broken = true;
  return 0;
}

/* g:captured() -> true once the graph has been captured */
static int graph_captured(lua_State *L) {
  lua_pushboolean(L, check_graph(L)->g != NULL);
  return 1;
}

/* keng.cuda.defer_checks(on, device = "cuda") -> the previous state: the device's eager index
 * checks report at the next synchronisation instead of each synchronising (kg_cuda_defer_checks);
 * a device other than cuda has nothing to defer (false, nothing changes) */
static int l_cuda_defer_checks(lua_State *L) {
  if (!lua_isboolean(L, 1))
    return luaL_error(L, "keng.cuda.defer_checks: on must be true or false, got %s", luaL_typename(L, 1));
  kg_device dev = {KG_DEV_CUDA, 0};
  if (!lua_isnoneornil(L, 2)) dev = kgl_device(L, 2);
  bool was = false;
  if (dev.type == KG_DEV_CUDA && kg_cuda_available())
    KGL_CALL(L, kg_cuda_defer_checks(dev.index, lua_toboolean(L, 1), &was));
  lua_pushboolean(L, was);
  return 1;
}

static int l_cuda_graph(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  int warmup = 2;
  kg_device dev = {KG_DEV_CUDA, 0};
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    double w = kgl_field_number(L, 2, "warmup", 2);
    if (w < 0 || w != (double)(int)w) return luaL_error(L, "keng.cuda.graph: warmup must be an integer >= 0, got %g", w);
    warmup = (int)w;
    lua_getfield(L, 2, "device");
    if (!lua_isnil(L, -1)) dev = kgl_device(L, -1);
    lua_pop(L, 1);
  }
  if (dev.type != KG_DEV_CUDA) return luaL_error(L, "keng.cuda.graph: device must be cuda, got another device");
  if (!kg_cuda_available())
    return luaL_error(L, "keng.cuda.graph: CUDA is not available (keng was built without CUDA, or there is no GPU "
                      "or driver)");
  if (dev.index >= kg_cuda_device_count())
    return luaL_error(L, "keng.cuda.graph: cuda:%d does not exist (%d device(s))", dev.index, kg_cuda_device_count());
  lgraph *g = (lgraph *)lua_newuserdatauv(L, sizeof *g, 4);
  memset(g, 0, sizeof *g);
  g->device = dev.index, g->warmup = warmup;
  luaL_setmetatable(L, GRAPH_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  return 1;
}

void kgl_register_backends(lua_State *L, int methods, int keng) {
  (void)methods;
  /* keng.backends: an empty table whose metatable reads and writes the engine's switches */
  lua_newtable(L);
  lua_createtable(L, 0, 2);
  lua_pushcfunction(L, backends_index);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, backends_newindex);
  lua_setfield(L, -2, "__newindex");
  lua_setmetatable(L, -2);
  lua_setfield(L, keng, "backends");

  luaL_newmetatable(L, GRAPH_MT);
  lua_pushcfunction(L, graph_call);
  lua_setfield(L, -2, "__call");
  lua_pushcfunction(L, graph_free);
  lua_setfield(L, -2, "__gc");
  lua_createtable(L, 0, 2);
  lua_pushcfunction(L, graph_release);
  lua_setfield(L, -2, "free");
  lua_pushcfunction(L, graph_captured);
  lua_setfield(L, -2, "captured");
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);

  /* keng.cuda exists (kgl_register_runtime, runtime.c, runs first) */
  lua_getfield(L, keng, "cuda");
  if (lua_istable(L, -1)) {
    lua_pushcfunction(L, l_cuda_graph);
    lua_setfield(L, -2, "graph");
    lua_pushcfunction(L, l_on_replay);
    lua_setfield(L, -2, "on_replay");
    lua_pushcfunction(L, l_cuda_defer_checks);
    lua_setfield(L, -2, "defer_checks");
  }
  lua_pop(L, 1);
}
