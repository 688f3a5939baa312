/* copy.c — bindings of the copy ops (engine/ops/copy.c): t:to(dtype | device | {dtype=, device=}),
 * the casts (float, double, bf16, half, long, int, bool), cpu / cuda, clone, detach, contiguous
 * and t:copy_(src). */
#include "keng_lua.h"

/* t:to("bf16") / t:to("cuda") / t:to{dtype=, device=} */
static int l_to(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  kg_dtype dt = t->dtype;
  kg_device dev = t->device;
  if (lua_istable(L, 2)) {
    kgl_check_options(L, 2, "to", (const char *const[]){"dtype", "device", NULL});
    lua_getfield(L, 2, "dtype");
    if (!lua_isnil(L, -1)) dt = kgl_dtype(L, -1);
    lua_getfield(L, 2, "device");
    if (!lua_isnil(L, -1)) dev = kgl_device(L, -1);
    lua_pop(L, 2);
  } else {
    const char *s = luaL_checkstring(L, 2);
    if (!kg_dtype_from_name(s, &dt) && !kg_device_from_name(s, &dev))
      luaL_error(L, "to: '%s' is neither a dtype (f32, bf16, ...) nor a device (cpu, cuda, meta)", s);
  }
  KGL_CALL(L, kg_to(&r, t, dt, dev));
  kgl_push(L, r);
  return 1;
}

static int cast(lua_State *L, kg_dtype dt) {
  kg_tensor *t = kgl_check(L, 1), *r;
  KGL_CALL(L, kg_to(&r, t, dt, t->device));
  kgl_push(L, r);
  return 1;
}
static int l_float(lua_State *L) { return cast(L, KG_F32); }
static int l_double(lua_State *L) { return cast(L, KG_F64); }
static int l_bf16(lua_State *L) { return cast(L, KG_BF16); }
static int l_half(lua_State *L) { return cast(L, KG_F16); }
static int l_long(lua_State *L) { return cast(L, KG_I64); }
static int l_int(lua_State *L) { return cast(L, KG_I32); }
static int l_bool(lua_State *L) { return cast(L, KG_BOOL); }

static int move(lua_State *L, kg_device d) {
  kg_tensor *t = kgl_check(L, 1), *r;
  KGL_CALL(L, kg_to(&r, t, t->dtype, d));
  kgl_push(L, r);
  return 1;
}
static int l_cpu(lua_State *L) { return move(L, KG_CPU); }
static int l_cuda(lua_State *L) {
  kg_device d = {KG_DEV_CUDA, (int8_t)luaL_optinteger(L, 2, 0)};
  return move(L, d);
}

KGL_UNARY_METHOD(clone, kg_clone(&r, t))
KGL_UNARY_METHOD(detach, kg_detach(&r, t))
KGL_UNARY_METHOD(contiguous, kg_contiguous(&r, t))

static int l_copy_(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *owned;
  kg_tensor *src = kgl_to_tensor(L, 2, t, &owned);
  kg_status s = kg_copy_(t, src);
  kg_tensor_release(owned);
  if (s) return kgl_error(L);
  lua_settop(L, 1);
  return 1;
}

void kgl_register_copy(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, 0, "to", l_to);
  kgl_set(L, methods, 0, "float", l_float);
  kgl_set(L, methods, 0, "double", l_double);
  kgl_set(L, methods, 0, "bf16", l_bf16);
  kgl_set(L, methods, 0, "half", l_half);
  kgl_set(L, methods, 0, "long", l_long);
  kgl_set(L, methods, 0, "int", l_int);
  kgl_set(L, methods, 0, "bool", l_bool);
  kgl_set(L, methods, 0, "cpu", l_cpu);
  kgl_set(L, methods, 0, "cuda", l_cuda);
  kgl_set(L, methods, keng, "clone", l_clone);
  kgl_set(L, methods, 0, "detach", l_detach);
  kgl_set(L, methods, 0, "contiguous", l_contiguous);
  kgl_set(L, methods, 0, "copy_", l_copy_);
}
