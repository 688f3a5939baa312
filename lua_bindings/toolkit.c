/* toolkit.c — the binding toolkit shared by every lua_bindings/<family>.c (keng_lua.h): argument
 * checks that follow docs/lua_api.md (1-based dims, shapes, dtypes, devices, option tables),
 * registration, and requires_grad on a fresh tensor. */
#include "keng_lua.h"

#include <string.h>

/* the dim at stack slot idx; errors name argument arg of the calling function ("bad argument #2
 * to 'sum' (dim 3 out of range ...)"), arg 0 when the dim sits in a list (the list's slot is
 * named by the caller) */
static int dim_at(lua_State *L, int idx, int arg, int ndim) {
  int isnum;
  lua_Integer d = lua_tointegerx(L, idx, &isnum);
  int n = ndim ? ndim : 1;
  const char *msg = NULL;
  if (!isnum)
    msg = lua_pushfstring(L, "dim must be an integer, got %s", lua_type(L, idx) == LUA_TNUMBER ? "a fraction" : luaL_typename(L, idx));
  else if (d == 0 || d > n || d < -n)
    msg = lua_pushfstring(L, "dim %I out of range for a tensor of %d dims (dims are 1-based; -1 is the last)", (LUAI_UACINT)d, ndim);
  if (msg) {
    if (arg) luaL_argerror(L, arg, msg);
    luaL_error(L, "%s", msg);
  }
  return d > 0 ? (int)d - 1 : (int)(d + n);
}

int kgl_dim(lua_State *L, int idx, int ndim) { return dim_at(L, idx, lua_absindex(L, idx), ndim); }

int kgl_optdim(lua_State *L, int idx, int ndim, int def0) {
  return lua_isnoneornil(L, idx) ? def0 : kgl_dim(L, idx, ndim);
}

uint32_t kgl_dims_mask(lua_State *L, int idx, int ndim) {
  if (lua_isnoneornil(L, idx)) return KG_DIMS_ALL;
  if (lua_istable(L, idx)) {
    uint32_t m = 0;
    lua_Integer n = luaL_len(L, idx);
    for (lua_Integer i = 1; i <= n; i++) {
      lua_geti(L, idx, i);
      int d = dim_at(L, lua_gettop(L), idx, ndim);
      if (m & (1u << d)) luaL_argerror(L, idx, lua_pushfstring(L, "dim %d appears twice in the list", d + 1));
      m |= 1u << d;
      lua_pop(L, 1);
    }
    return m;
  }
  return 1u << kgl_dim(L, idx, ndim);
}

int kgl_shape(lua_State *L, int idx, int64_t *shape) {
  int n = 0;
  if (lua_istable(L, idx)) {
    lua_Integer len = luaL_len(L, idx);
    if (len > KG_MAX_DIMS) luaL_error(L, "shape has %d dims; at most %d are supported", (int)len, KG_MAX_DIMS);
    for (lua_Integer i = 1; i <= len; i++) {
      lua_geti(L, idx, i);
      int isnum;
      lua_Integer v = lua_tointegerx(L, -1, &isnum);
      if (!isnum) luaL_argerror(L, idx, lua_pushfstring(L, "shape entry %d is not an integer (%s)", (int)i, luaL_typename(L, -1)));
      shape[n++] = v;
      lua_pop(L, 1);
    }
    return n;
  }
  int top = lua_gettop(L);
  for (int i = idx; i <= top && lua_isinteger(L, i); i++) {
    if (n == KG_MAX_DIMS) luaL_error(L, "at most %d dims are supported", KG_MAX_DIMS);
    shape[n++] = lua_tointeger(L, i);
  }
  if (n == 0 && !lua_isnoneornil(L, idx) && !lua_istable(L, idx)) luaL_typeerror(L, idx, "shape table");
  return n;
}

kg_dtype kgl_dtype(lua_State *L, int idx) {
  const char *name = luaL_checkstring(L, idx);
  kg_dtype dt;
  if (!kg_dtype_from_name(name, &dt))
    luaL_error(L, "%s: unknown dtype '%s' (expected f32, f64, bf16, f16, i32, i64, bool, u8 or i8)", kgl_fname(L), name);
  return dt;
}

kg_device kgl_device(lua_State *L, int idx) {
  const char *name = luaL_checkstring(L, idx);
  kg_device d;
  if (!kg_device_from_name(name, &d))
    luaL_error(L, "%s: unknown device '%s' (expected cpu, cuda, cuda:N or meta)", kgl_fname(L), name);
  return d;
}

/* an options slot holds nil or a table: anything else was a mistake, not "no options" */
static bool options_slot(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx)) return false;
  if (!lua_istable(L, idx)) luaL_typeerror(L, idx, "table of options");
  return true;
}

void kgl_check_options(lua_State *L, int idx, const char *who, const char *const *valid) {
  if (!options_slot(L, idx)) return;
  if (!who) who = kgl_fname(L); /* NULL: the binding's own name */
  idx = lua_absindex(L, idx);
  for (lua_pushnil(L); lua_next(L, idx); lua_pop(L, 1)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      luaL_error(L, "%s: options are named fields, got a %s key", who, luaL_typename(L, -2));
    const char *k = lua_tostring(L, -2);
    bool ok = false;
    for (int i = 0; valid[i] && !ok; i++) ok = !strcmp(k, valid[i]);
    if (ok) continue;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; valid[i]; i++) {
      if (i) luaL_addstring(&b, ", ");
      luaL_addstring(&b, valid[i]);
    }
    luaL_pushresult(&b);
    luaL_error(L, "%s: unknown option '%s' (valid: %s)", who, k, lua_tostring(L, -1));
  }
}

double kgl_field_number(lua_State *L, int idx, const char *key, double def) {
  if (!options_slot(L, idx)) return def;
  lua_getfield(L, idx, key);
  if (!lua_isnil(L, -1) && !lua_isnumber(L, -1))
    luaL_error(L, "%s: option '%s' must be a number, got %s", kgl_fname(L), key, luaL_typename(L, -1));
  double v = lua_isnil(L, -1) ? def : lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

lua_Integer kgl_field_integer(lua_State *L, int idx, const char *key, lua_Integer def, lua_Integer lo, lua_Integer hi) {
  if (!options_slot(L, idx)) return def;
  lua_getfield(L, idx, key);
  lua_Integer v = def;
  if (!lua_isnil(L, -1)) {
    int isnum;
    v = lua_tointegerx(L, -1, &isnum); /* no C cast of a double: NaN, 2.5 and 1e300 are refused */
    if (!isnum || v < lo || v > hi)
      luaL_error(L, "%s: option '%s' must be an integer in [%I, %I], got %s", kgl_fname(L), key, (LUAI_UACINT)lo,
                 (LUAI_UACINT)hi, luaL_tolstring(L, -1, NULL));
  }
  lua_pop(L, 1);
  return v;
}

bool kgl_field_bool(lua_State *L, int idx, const char *key, bool def) {
  if (!options_slot(L, idx)) return def;
  lua_getfield(L, idx, key);
  bool v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

kgl_opts kgl_options(lua_State *L, int idx, kg_dtype def_dtype) {
  kgl_opts o = {def_dtype, KG_CPU, false, false};
  if (idx == 0 || lua_isnoneornil(L, idx)) return o; /* 0: no options slot (sizes given as varargs) */
  luaL_checktype(L, idx, LUA_TTABLE);
  idx = lua_absindex(L, idx);
  kgl_check_options(L, idx, NULL, (const char *const[]){"dtype", "device", "requires_grad", NULL});
  lua_getfield(L, idx, "dtype");
  if (!lua_isnil(L, -1)) o.dtype = kgl_dtype(L, -1), o.has_dtype = true;
  lua_getfield(L, idx, "device");
  if (!lua_isnil(L, -1)) o.device = kgl_device(L, -1);
  lua_getfield(L, idx, "requires_grad");
  o.requires_grad = lua_toboolean(L, -1);
  lua_pop(L, 3);
  return o;
}

void kgl_set(lua_State *L, int methods, int keng, const char *name, lua_CFunction fn) {
  if (methods) {
    lua_pushcfunction(L, fn);
    lua_setfield(L, methods, name);
  }
  if (keng) {
    lua_pushcfunction(L, fn);
    lua_setfield(L, keng, name);
  }
}

/* requires_grad on a fresh tensor must be a float leaf */
void kgl_set_requires_grad(lua_State *L, kg_tensor *t, bool on) {
  if (on && !kg_dtype_info[t->dtype].is_float)
    luaL_error(L, "requires_grad: only floating point tensors can require grad, got %s", kg_dtype_info[t->dtype].name);
  if (t->grad_fn) luaL_error(L, "requires_grad: can only be set on leaf tensors (this one has a grad_fn); use detach()");
  t->requires_grad = on;
}
