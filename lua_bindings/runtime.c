/* runtime.c — bindings of the runtime (engine/core/runtime.c, alloc.c, dispatch.c): the op
 * table (keng.ops, ops_report), memory statistics and caches, threads, devices and
 * synchronisation, the seed, the FLOP counter and a wall clock. */
#include "keng_lua.h"

#include <stdio.h>
#include <time.h>

static int l_manual_seed(lua_State *L) {
  kg_manual_seed((uint64_t)luaL_checkinteger(L, 1));
  return 0;
}

static int l_ops_report(lua_State *L) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  char line[160];
  snprintf(line, sizeof line, "%-30s %-10s %-5s %-5s %s\n", "op", "kind", "cpu", "cuda", "backward");
  luaL_addstring(&b, line);
  for (int i = 0; i < KG_OP_COUNT; i++) {
    const kg_op_facts *f = &kg_op_info[i];
    bool no_kernel = f->kind == KG_KIND_VIEW || f->kind == KG_KIND_COMPOSITE;
    const char *cpu = no_kernel ? "any" : f->kernel[KG_DEV_CPU] ? "yes" : "-";
    const char *cuda = no_kernel ? "any" : f->kernel[KG_DEV_CUDA] ? "yes" : "-";
    const char *bw = !f->differentiable ? "no-grad"
                     : f->kind == KG_KIND_COMPOSITE ? "via parts"
                     : f->backward ? "yes"
                                   : "MISSING";
    snprintf(line, sizeof line, "%-30s %-10s %-5s %-5s %s\n", f->name, kg_kind_name(f->kind), cpu, cuda, bw);
    luaL_addstring(&b, line);
  }
  luaL_pushresult(&b);
  return 1;
}

/* keng.ops() -> list of {name=, kind=, cpu=, cuda=, backward=} */
static int l_ops(lua_State *L) {
  lua_createtable(L, KG_OP_COUNT, 0);
  for (int i = 0; i < KG_OP_COUNT; i++) {
    const kg_op_facts *f = &kg_op_info[i];
    bool no_kernel = f->kind == KG_KIND_VIEW || f->kind == KG_KIND_COMPOSITE;
    lua_createtable(L, 0, 5);
    lua_pushstring(L, f->name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, kg_kind_name(f->kind));
    lua_setfield(L, -2, "kind");
    lua_pushboolean(L, no_kernel || f->kernel[KG_DEV_CPU]);
    lua_setfield(L, -2, "cpu");
    lua_pushboolean(L, no_kernel || f->kernel[KG_DEV_CUDA]);
    lua_setfield(L, -2, "cuda");
    lua_pushboolean(L, f->differentiable);
    lua_setfield(L, -2, "differentiable");
    lua_pushboolean(L, f->backward != NULL || f->kind == KG_KIND_COMPOSITE);
    lua_setfield(L, -2, "backward");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int l_memory_stats(lua_State *L) {
  kg_device d = lua_isnoneornil(L, 1) ? KG_CPU : kgl_device(L, 1);
  kg_memory_stats s = kg_memory_get_stats(d);
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, (lua_Integer)s.allocated);
  lua_setfield(L, -2, "allocated");
  lua_pushinteger(L, (lua_Integer)s.cached);
  lua_setfield(L, -2, "cached");
  lua_pushinteger(L, (lua_Integer)s.peak);
  lua_setfield(L, -2, "peak");
  lua_pushinteger(L, (lua_Integer)s.graph);
  lua_setfield(L, -2, "graph");
  return 1;
}

static int l_reset_peak_memory_stats(lua_State *L) {
  kg_memory_reset_peak(lua_isnoneornil(L, 1) ? KG_CPU : kgl_device(L, 1));
  return 0;
}

static int l_empty_cache(lua_State *L) {
  kgl_collect(L);
  return 0;
}

static int l_num_threads(lua_State *L) {
  lua_pushinteger(L, kg_num_threads());
  return 1;
}

static int l_set_num_threads(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 1 && n <= 4096, 1, "thread count must be in [1, 4096]");
  kg_set_num_threads((int)n);
  return 0;
}

static int l_synchronize(lua_State *L) {
  kg_device d = lua_isnoneornil(L, 1) ? (kg_device){KG_DEV_CUDA, 0} : kgl_device(L, 1);
  if (d.type == KG_DEV_CUDA && !kg_cuda_available()) return 0;
  KGL_CALL(L, kg_device_synchronize(d));
  return 0;
}

static int l_cuda_available(lua_State *L) {
  lua_pushboolean(L, kg_cuda_available());
  return 1;
}

static int l_cuda_count(lua_State *L) {
  lua_pushinteger(L, kg_cuda_device_count());
  return 1;
}

static int l_flop_count(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)kg_flop_count());
  return 1;
}

/* keng.time(): monotonic wall-clock seconds (for timing; os.clock is CPU time) */
static int l_time(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (double)ts.tv_sec + ts.tv_nsec * 1e-9);
  return 1;
}

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

/* keng.cpu_simd() -> "avx512", "avx2" or "none": the vector paths the CPU kernels take
 * (KENG_NO_SIMD=1 gives "none") */
static int l_cpu_simd(lua_State *L) {
  static const char *const names[] = {"none", "avx2", "avx512"};
  lua_pushstring(L, names[kg_cpu_simd()]);
  return 1;
}

void kgl_register_runtime(lua_State *L, int methods, int keng) {
  (void)methods;
  kgl_set(L, 0, keng, "manual_seed", l_manual_seed);
  kgl_set(L, 0, keng, "ops_report", l_ops_report);
  kgl_set(L, 0, keng, "ops", l_ops);
  kgl_set(L, 0, keng, "memory_stats", l_memory_stats);
  kgl_set(L, 0, keng, "reset_peak_memory_stats", l_reset_peak_memory_stats);
  kgl_set(L, 0, keng, "empty_cache", l_empty_cache);
  kgl_set(L, 0, keng, "num_threads", l_num_threads);
  kgl_set(L, 0, keng, "set_num_threads", l_set_num_threads);
  kgl_set(L, 0, keng, "synchronize", l_synchronize);
  kgl_set(L, 0, keng, "flop_count", l_flop_count);
  kgl_set(L, 0, keng, "time", l_time);
  kgl_set(L, 0, keng, "flop_count_performed", l_flop_count_performed);
  kgl_set(L, 0, keng, "thread_policy", l_thread_policy);
  /* keng.address_sanitizer: this build runs under AddressSanitizer (its allocator, not glibc's,
   * owns the heap: memory figures differ; the specs that measure the process say so) */
#if defined(__SANITIZE_ADDRESS__)
  lua_pushboolean(L, 1);
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  lua_pushboolean(L, 1);
#else
  lua_pushboolean(L, 0);
#endif
#else
  lua_pushboolean(L, 0);
#endif
  lua_setfield(L, keng, "address_sanitizer");
  lua_createtable(L, 0, 3); /* keng.cuda */
  lua_pushcfunction(L, l_cuda_available);
  lua_setfield(L, -2, "is_available");
  lua_pushcfunction(L, l_cuda_count);
  lua_setfield(L, -2, "device_count");
  lua_pushcfunction(L, l_synchronize);
  lua_setfield(L, -2, "synchronize");
  lua_setfield(L, keng, "cuda");
  lua_createtable(L, 0, KG_DTYPE_COUNT); /* keng.dtype_sizes: {f32 = 4, ...}, the engine's table */
  for (int d = 0; d < KG_DTYPE_COUNT; d++) {
    lua_pushinteger(L, kg_dtype_info[d].size);
    lua_setfield(L, -2, kg_dtype_info[d].name);
  }
  lua_setfield(L, keng, "dtype_sizes");
  kgl_set(L, 0, keng, "cpu_simd", l_cpu_simd);
}
