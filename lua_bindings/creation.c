/* creation.c — bindings of the creation ops (engine/ops/creation.c): keng.tensor from nested
 * tables or a tensor, zeros / ones / full / empty (and _like), arange, rand / randn / randint,
 * and the in-place fills t:fill_(v), t:zero_(). */
#include "keng_lua.h"

typedef struct {
  int ndim;
  int64_t shape[KG_MAX_DIMS];
  bool any_float, any_bool, any_number;
} nested_info;

static void nested_shape(lua_State *L, int idx, int depth, nested_info *ni) {
  if (lua_istable(L, idx)) {
    if (depth >= KG_MAX_DIMS) luaL_error(L, "tensor: nesting deeper than %d dims", KG_MAX_DIMS);
    lua_Integer n = luaL_len(L, idx);
    if (depth >= ni->ndim) {
      ni->ndim = depth + 1;
      ni->shape[depth] = n;
    } else if (ni->shape[depth] != n) {
      luaL_error(L, "tensor: ragged nested table (dim %d has lengths %d and %d)", depth + 1, (int)ni->shape[depth], (int)n);
    }
    for (lua_Integer i = 1; i <= n; i++) {
      lua_geti(L, idx, i);
      nested_shape(L, lua_gettop(L), depth + 1, ni);
      lua_pop(L, 1);
    }
  } else if (lua_isboolean(L, idx)) {
    ni->any_bool = true;
  } else if (lua_type(L, idx) == LUA_TNUMBER) {
    ni->any_number = true;
    if (!lua_isinteger(L, idx)) ni->any_float = true;
  } else {
    luaL_error(L, "tensor: expected numbers, booleans or nested tables, got %s", luaL_typename(L, idx));
  }
}

static void nested_fill(lua_State *L, int idx, kg_tensor *t, int64_t *pos) {
  if (lua_istable(L, idx)) {
    lua_Integer n = luaL_len(L, idx);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_geti(L, idx, i);
      nested_fill(L, lua_gettop(L), t, pos);
      lua_pop(L, 1);
    }
    return;
  }
  double v = lua_isboolean(L, idx) ? lua_toboolean(L, idx) : lua_tonumber(L, idx);
  if (lua_isinteger(L, idx) && t->dtype == KG_I64) ((int64_t *)kg_data(t))[*pos] = lua_tointeger(L, idx);
  else kg_set_flat(t, *pos, v);
  (*pos)++;
}

/* puts t on opts' device and requires_grad flag; pushes it */
static int push_created(lua_State *L, kg_tensor *t, const kgl_opts *o) {
  if (!kg_device_eq(t->device, o->device)) {
    kg_tensor *m;
    kg_status s = kg_to(&m, t, t->dtype, o->device);
    kg_tensor_release(t);
    if (s) return kgl_error(L);
    t = m;
  }
  kgl_push(L, t);
  kgl_set_requires_grad(L, t, o->requires_grad);
  return 1;
}

static int l_tensor(lua_State *L) {
  kg_tensor *src = kgl_test(L, 1);
  if (src) { /* keng.tensor(t, opts): a copy */
    kgl_opts o = kgl_options(L, 2, src->dtype);
    if (!lua_istable(L, 2)) o.device = src->device;
    else {
      lua_getfield(L, 2, "device");
      if (lua_isnil(L, -1)) o.device = src->device;
      lua_pop(L, 1);
    }
    kg_tensor *t;
    bool was = kg_set_grad_enabled(false);
    kg_status s = kg_tensor_empty(&t, src->ndim, src->shape, o.dtype, o.device);
    if (s == KG_OK && (s = kg_copy_(t, src))) kg_tensor_release(t);
    kg_set_grad_enabled(was);
    if (s) return kgl_error(L);
    kgl_push(L, t);
    kgl_set_requires_grad(L, t, o.requires_grad);
    return 1;
  }
  nested_info ni = {0};
  nested_shape(L, 1, 0, &ni);
  kg_dtype def = ni.any_float ? KG_F32 : ni.any_number ? KG_I64 : ni.any_bool ? KG_BOOL : KG_F32;
  kgl_opts o = kgl_options(L, 2, def);
  kg_tensor *t;
  KGL_CALL(L, kg_tensor_empty(&t, ni.ndim, ni.shape, o.dtype, KG_CPU));
  int64_t pos = 0;
  if (kg_numel(t)) nested_fill(L, 1, t, &pos);
  return push_created(L, t, &o);
}

static int full_like_args(lua_State *L, const char *op, double value, int opts_idx, int shape_idx) {
  int64_t shape[KG_MAX_DIMS];
  int nd = kgl_shape(L, shape_idx, shape);
  kgl_opts o = kgl_options(L, opts_idx, KG_F32);
  kg_tensor *t;
  KGL_CALL(L, kg_full_named(&t, nd, shape, value, o.dtype, o.device, op));
  kgl_push(L, t);
  kgl_set_requires_grad(L, t, o.requires_grad);
  return 1;
}

/* opts follow the shape table; with varargs sizes there are no opts */
static int opts_after_shape(lua_State *L, int idx) { return lua_istable(L, idx) ? idx + 1 : 0; }

static int l_zeros(lua_State *L) { return full_like_args(L, "zeros", 0, opts_after_shape(L, 1), 1); }
static int l_ones(lua_State *L) { return full_like_args(L, "ones", 1, opts_after_shape(L, 1), 1); }
static int l_full(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  double v = lua_isboolean(L, 2) ? lua_toboolean(L, 2) : luaL_checknumber(L, 2);
  return full_like_args(L, "full", v, 3, 1);
}
static int l_empty(lua_State *L) {
  int64_t shape[KG_MAX_DIMS];
  int nd = kgl_shape(L, 1, shape);
  kgl_opts o = kgl_options(L, opts_after_shape(L, 1), KG_F32);
  kg_tensor *t;
  KGL_CALL(L, kg_tensor_empty(&t, nd, shape, o.dtype, o.device));
  kgl_push(L, t);
  kgl_set_requires_grad(L, t, o.requires_grad);
  return 1;
}

static int like(lua_State *L, const char *op, double v) {
  kg_tensor *x = kgl_check(L, 1);
  kgl_opts o = kgl_options(L, 2, x->dtype);
  if (!lua_istable(L, 2)) o.device = x->device;
  kg_tensor *t;
  KGL_CALL(L, kg_full_named(&t, x->ndim, x->shape, v, o.dtype, o.device, op));
  kgl_push(L, t);
  return 1;
}
static int l_zeros_like(lua_State *L) { return like(L, "zeros_like", 0); }
static int l_ones_like(lua_State *L) { return like(L, "ones_like", 1); }

static int l_arange(lua_State *L) {
  double a = luaL_checknumber(L, 1), b = 0, step = 1;
  int opts = 2;
  bool all_int = lua_isinteger(L, 1);
  if (lua_isnumber(L, 2)) {
    b = lua_tonumber(L, 2);
    all_int = all_int && lua_isinteger(L, 2);
    opts = 3;
    if (lua_isnumber(L, 3)) {
      step = lua_tonumber(L, 3);
      all_int = all_int && lua_isinteger(L, 3);
      opts = 4;
    }
  } else {
    b = a;
    a = 0;
  }
  kgl_opts o = kgl_options(L, opts, all_int ? KG_I64 : KG_F32);
  kg_tensor *t;
  KGL_CALL(L, kg_arange(&t, a, b, step, o.dtype, o.device));
  kgl_push(L, t);
  kgl_set_requires_grad(L, t, o.requires_grad);
  return 1;
}

static int random_tensor(lua_State *L, bool normal) {
  int64_t shape[KG_MAX_DIMS];
  int nd = kgl_shape(L, 1, shape);
  kgl_opts o = kgl_options(L, opts_after_shape(L, 1), KG_F32);
  kg_tensor *t;
  if (normal) KGL_CALL(L, kg_randn(&t, nd, shape, o.dtype, o.device));
  else KGL_CALL(L, kg_rand(&t, nd, shape, o.dtype, o.device));
  kgl_push(L, t);
  kgl_set_requires_grad(L, t, o.requires_grad);
  return 1;
}
static int l_rand(lua_State *L) { return random_tensor(L, false); }
static int l_randn(lua_State *L) { return random_tensor(L, true); }

static int l_randint(lua_State *L) {
  lua_Integer lo = luaL_checkinteger(L, 1), hi = luaL_checkinteger(L, 2);
  int64_t shape[KG_MAX_DIMS];
  luaL_checktype(L, 3, LUA_TTABLE);
  int nd = kgl_shape(L, 3, shape);
  kgl_opts o = kgl_options(L, 4, KG_I64);
  kg_tensor *t;
  KGL_CALL(L, kg_randint(&t, lo, hi, nd, shape, o.dtype, o.device));
  kgl_push(L, t);
  return 1;
}

static int l_fill_(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  double v = lua_isboolean(L, 2) ? lua_toboolean(L, 2) : luaL_checknumber(L, 2);
  KGL_CALL(L, kg_fill_(t, v));
  lua_settop(L, 1);
  return 1;
}

static int l_zero_(lua_State *L) {
  KGL_CALL(L, kg_fill_(kgl_check(L, 1), 0));
  lua_settop(L, 1);
  return 1;
}

void kgl_register_creation(lua_State *L, int methods, int keng) {
  kgl_set(L, 0, keng, "tensor", l_tensor);
  kgl_set(L, 0, keng, "zeros", l_zeros);
  kgl_set(L, 0, keng, "ones", l_ones);
  kgl_set(L, 0, keng, "full", l_full);
  kgl_set(L, 0, keng, "empty", l_empty);
  kgl_set(L, 0, keng, "zeros_like", l_zeros_like);
  kgl_set(L, 0, keng, "ones_like", l_ones_like);
  kgl_set(L, 0, keng, "arange", l_arange);
  kgl_set(L, 0, keng, "rand", l_rand);
  kgl_set(L, 0, keng, "randn", l_randn);
  kgl_set(L, 0, keng, "randint", l_randint);
  kgl_set(L, methods, 0, "fill_", l_fill_);
  kgl_set(L, methods, 0, "zero_", l_zero_);
}
