/* tensor.c — the tensor userdata: argument helpers, properties, printing, creation, views,
 * copies, autograd, and the module table. Everything here follows docs/lua_api.md. */
#include "keng_lua.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- userdata and errors ------------------------------------------------------------------ */

typedef struct { kg_tensor *t; } udata;

void kgl_push(lua_State *L, kg_tensor *t) {
  udata *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->t = t;
  luaL_setmetatable(L, KGL_TENSOR_MT);
}

/* the name of the running Lua-called C function, for errors about values that are not
 * arguments (list elements, option fields) */
const char *kgl_fname(lua_State *L) {
  lua_Debug ar;
  if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar) && ar.name) return ar.name;
  return "keng"; /* called through pcall or a table of functions: no name to give */
}

kg_tensor *kgl_test(lua_State *L, int idx) {
  udata *u = luaL_testudata(L, idx, KGL_TENSOR_MT);
  if (u && !u->t) { /* never a NULL tensor into the engine */
    if (idx > 0) luaL_argerror(L, idx, "tensor was closed");
    luaL_error(L, "%s: tensor was closed", kgl_fname(L));
  }
  return u ? u->t : NULL;
}

kg_tensor *kgl_check(lua_State *L, int idx) {
  udata *u = luaL_testudata(L, idx, KGL_TENSOR_MT);
  if (!u) luaL_typeerror(L, idx, "tensor");
  if (!u->t) luaL_argerror(L, idx, "tensor was closed");
  return u->t;
}

kg_tensor *kgl_opt(lua_State *L, int idx) { return lua_isnoneornil(L, idx) ? NULL : kgl_check(L, idx); }

int kgl_error(lua_State *L) { return luaL_error(L, "%s", kg_last_error()); }

kg_tensor *kgl_to_tensor(lua_State *L, int idx, const kg_tensor *like, kg_tensor **owned) {
  *owned = NULL;
  kg_tensor *t = kgl_test(L, idx);
  if (t) return t;
  double v;
  if (lua_isboolean(L, idx)) v = lua_toboolean(L, idx);
  else if (lua_isnumber(L, idx)) v = lua_tonumber(L, idx);
  else return luaL_typeerror(L, idx, "tensor or number"), NULL;
  kg_dtype dt = like ? like->dtype : KG_F32;
  if (lua_isboolean(L, idx)) dt = like ? like->dtype : KG_BOOL;
  else if (!kg_dtype_info[dt].is_float && (v != floor(v) || !isfinite(v))) dt = KG_F32;
  else if (dt == KG_BOOL) dt = KG_I64; /* a number with a bool tensor is an integer, as in PyTorch */
  if (!kg_value_fits(v, dt)) dt = dt == KG_U8 && kg_value_fits(v, KG_I64) ? KG_I64 : KG_F32;
  KGL_CALL(L, kg_scalar(owned, v, dt, like ? like->device : KG_CPU));
  return *owned;
}

/* The Lua collector does not see tensor memory, host or device: the allocator reports the
 * bytes of every new storage, and every binding call steps the collector once they pass a
 * threshold. One step with that much debt runs a whole cycle (Lua's heap is small beside the
 * tensors), so the threshold bounds the garbage: 1/16 of what live storages hold, at least
 * 32 MiB (small programs collect often) and at most 1 GiB (a 7B model's 17 GB of weights must
 * not let gigabytes of dead activations pile up; at ~0.1 ms a cycle, a step that allocates
 * 10 GB spends about a millisecond collecting). */
static size_t pending_bytes;
static size_t gc_threshold = (size_t)32 << 20;
static void alloc_hook(size_t n, void *ud) {
  (void)ud;
  __atomic_add_fetch(&pending_bytes, n, __ATOMIC_RELAXED);
}
static void gc_pace(void) {
  size_t t = kg_memory_storage_bytes() / 16, lo = (size_t)32 << 20, hi = (size_t)1 << 30;
  gc_threshold = t < lo ? lo : t > hi ? hi : t;
}
void kgl_gc_step(lua_State *L) {
  if (__atomic_load_n(&pending_bytes, __ATOMIC_RELAXED) > gc_threshold) {
    size_t kb = __atomic_exchange_n(&pending_bytes, 0, __ATOMIC_RELAXED) >> 10;
    lua_gc(L, LUA_GCSTEP, (int)(kb > 1 << 20 ? 1 << 20 : kb));
    gc_pace();
  }
}
void kgl_collect(lua_State *L) {
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCCOLLECT); /* finalizers of the first pass free tensors */
  kg_memory_empty_caches();
  pending_bytes = 0;
  gc_pace();
}

/* ---- argument helpers ------------------------------------------------------------------- */

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
static void set_requires_grad(lua_State *L, kg_tensor *t, bool on) {
  if (on && !kg_dtype_info[t->dtype].is_float)
    luaL_error(L, "requires_grad: only floating point tensors can require grad, got %s", kg_dtype_info[t->dtype].name);
  if (t->grad_fn) luaL_error(L, "requires_grad: can only be set on leaf tensors (this one has a grad_fn); use detach()");
  t->requires_grad = on;
}

/* ---- creation ------------------------------------------------------------------------------ */

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
  set_requires_grad(L, t, o->requires_grad);
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
    set_requires_grad(L, t, o.requires_grad);
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
  set_requires_grad(L, t, o.requires_grad);
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
  set_requires_grad(L, t, o.requires_grad);
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
  set_requires_grad(L, t, o.requires_grad);
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
  set_requires_grad(L, t, o.requires_grad);
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

static int l_manual_seed(lua_State *L) {
  kg_manual_seed((uint64_t)luaL_checkinteger(L, 1));
  return 0;
}

/* ---- printing ------------------------------------------------------------------------------- */

typedef struct {
  luaL_Buffer *b;
  const kg_tensor *t;
  int edge;          /* summarise: print this many items at each end (0 = all) */
  int width;
  const char *fmt;   /* printf format for one element */
  bool is_float, is_bool;
} printer;

static void fmt_elem(const printer *p, double v, char *out) {
  if (p->is_bool) snprintf(out, 32, "%s", v != 0 ? "true" : "false");
  else if (!p->is_float) snprintf(out, 32, "%.0f", v);
  else if (isnan(v)) snprintf(out, 32, "nan");
  else if (isinf(v)) snprintf(out, 32, v > 0 ? "inf" : "-inf");
  else snprintf(out, 32, p->fmt, v);
}

static bool shown(const printer *p, int64_t i, int64_t n) { return !p->edge || n <= 2 * p->edge || i < p->edge || i >= n - p->edge; }

static void print_dim(printer *p, int d, int64_t flat, int indent) {
  const kg_tensor *t = p->t;
  int64_t n = t->shape[d], inner = 1;
  for (int k = d + 1; k < t->ndim; k++) inner *= t->shape[k];
  luaL_addchar(p->b, '[');
  bool skipped = false;
  for (int64_t i = 0; i < n; i++) {
    if (!shown(p, i, n)) {
      if (!skipped) {
        if (d == t->ndim - 1) luaL_addstring(p->b, "...");
        else {
          luaL_addstring(p->b, "...");
        }
        skipped = true;
        luaL_addstring(p->b, d == t->ndim - 1 ? ", " : ",\n");
        if (d != t->ndim - 1)
          for (int k = 0; k < indent + 1; k++) luaL_addchar(p->b, ' ');
      }
      continue;
    }
    if (d == t->ndim - 1) {
      char s[40];
      fmt_elem(p, kg_get_flat(t, flat + i), s);
      char padded[64];
      snprintf(padded, sizeof padded, "%*s", p->width, s);
      luaL_addstring(p->b, padded);
    } else {
      print_dim(p, d + 1, flat + i * inner, indent + 1);
    }
    if (i < n - 1) {
      luaL_addchar(p->b, ',');
      if (d == t->ndim - 1) luaL_addchar(p->b, ' ');
      else {
        for (int k = d; k < t->ndim - 1; k++) luaL_addchar(p->b, '\n');
        for (int k = 0; k < indent + 1; k++) luaL_addchar(p->b, ' ');
      }
    }
  }
  luaL_addchar(p->b, ']');
}

/* value range of the elements that will be printed */
static void scan(const printer *p, int d, int64_t flat, double *maxabs, double *minabs, bool *all_int, bool *neg) {
  const kg_tensor *t = p->t;
  int64_t n = t->ndim ? t->shape[d] : 1, inner = 1;
  for (int k = d + 1; k < t->ndim; k++) inner *= t->shape[k];
  for (int64_t i = 0; i < n; i++) {
    if (t->ndim && !shown(p, i, n)) continue;
    if (t->ndim == 0 || d == t->ndim - 1) {
      double v = kg_get_flat(t, flat + i);
      if (!isfinite(v)) continue;
      double a = fabs(v);
      if (a > *maxabs) *maxabs = a;
      if (a > 0 && a < *minabs) *minabs = a;
      if (v != floor(v)) *all_int = false;
      if (v < 0) *neg = true;
    } else {
      scan(p, d + 1, flat + i * inner, maxabs, minabs, all_int, neg);
    }
  }
}

static int l_tostring(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *cpu = NULL;
  char shape[KG_SHAPE_STR_MAX], dev[16];
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "tensor(");
  bool has_data = t->device.type != KG_DEV_META;
  if (has_data && t->device.type != KG_DEV_CPU) {
    KGL_CALL(L, kg_to(&cpu, t, t->dtype, KG_CPU));
  }
  const kg_tensor *src = cpu ? cpu : t;
  if (has_data) {
    printer p = {&b, src, kg_numel(src) > 1000 ? 3 : 0, 0, "%.4f", kg_dtype_info[src->dtype].is_float,
                 src->dtype == KG_BOOL};
    double maxabs = 0, minabs = INFINITY;
    bool all_int = true, neg = false;
    scan(&p, 0, 0, &maxabs, &minabs, &all_int, &neg);
    if (p.is_float) {
      if (all_int && maxabs < 1e8) p.fmt = "%.0f.";
      else if (maxabs >= 1e8 || (minabs < 1e-4 && minabs > 0) || maxabs / minabs > 1e7) p.fmt = "%.4e";
    }
    /* common width */
    p.width = 1;
    char s[40];
    double small = minabs < INFINITY ? minabs : 0, sign = neg ? -1 : 1;
    double probe[] = {sign * maxabs, sign * small};
    for (int i = 0; i < 2; i++) {
      fmt_elem(&p, probe[i], s);
      int w = (int)strlen(s);
      if (w > p.width) p.width = w;
    }
    if (p.is_bool) p.width = 5;
    if (src->ndim == 0) {
      fmt_elem(&p, kg_get_flat(src, 0), s);
      luaL_addstring(&b, s);
    } else if (kg_numel(src) == 0) {
      luaL_addstring(&b, "[]");
    } else {
      print_dim(&p, 0, 0, 7);
    }
    luaL_addstring(&b, ", ");
  } else {
    luaL_addstring(&b, "..., ");
  }
  lua_pushfstring(L, "shape=%s, dtype=%s, device=%s", kg_shape_str(shape, t->ndim, t->shape),
                  kg_dtype_info[t->dtype].name, kg_device_name(t->device, dev));
  luaL_addvalue(&b);
  if (t->grad_fn) {
    lua_pushfstring(L, ", grad_fn=%s", kg_op_info[t->grad_fn->op].name);
    luaL_addvalue(&b);
  } else if (t->requires_grad) {
    luaL_addstring(&b, ", requires_grad=true");
  }
  luaL_addchar(&b, ')');
  kg_tensor_release(cpu);
  luaL_pushresult(&b);
  return 1;
}

/* ---- properties and conversions ---------------------------------------------------------- */

static void push_shape(lua_State *L, const kg_tensor *t) {
  lua_createtable(L, t->ndim, 0);
  for (int i = 0; i < t->ndim; i++) {
    lua_pushinteger(L, t->shape[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

static void push_value(lua_State *L, const kg_tensor *t, int64_t i) {
  if (t->dtype == KG_BOOL) lua_pushboolean(L, kg_get_flat(t, i) != 0);
  else if (t->dtype == KG_I64) { /* exact for 64-bit ids: read the element itself */
    int64_t off = t->offset, rem = i;
    for (int d = t->ndim - 1; d >= 0; d--) {
      off += (rem % t->shape[d]) * t->stride[d];
      rem /= t->shape[d];
    }
    lua_pushinteger(L, ((const int64_t *)t->storage->data)[off]);
  } else if (!kg_dtype_info[t->dtype].is_float) lua_pushinteger(L, (lua_Integer)kg_get_flat(t, i));
  else lua_pushnumber(L, kg_get_flat(t, i));
}

/* a CPU tensor with readable values (a copy for cuda; error for meta) */
static kg_tensor *readable(lua_State *L, kg_tensor *t, kg_tensor **owned, const char *what) {
  *owned = NULL;
  if (t->device.type == KG_DEV_META) luaL_error(L, "%s: a meta tensor has no values", what);
  if (t->device.type == KG_DEV_CPU) return t;
  KGL_CALL(L, kg_to(owned, t, t->dtype, KG_CPU));
  return *owned;
}

static int l_item(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *owned;
  char b[KG_SHAPE_STR_MAX];
  if (kg_numel(t) != 1) luaL_error(L, "item: tensor %s has %d elements, not one", kg_shape_str(b, t->ndim, t->shape), (int)kg_numel(t));
  kg_tensor *r = readable(L, t, &owned, "item");
  push_value(L, r, 0);
  kg_tensor_release(owned);
  return 1;
}

static void tolist_dim(lua_State *L, const kg_tensor *t, int d, int64_t *flat) {
  if (d == t->ndim) {
    push_value(L, t, (*flat)++);
    return;
  }
  lua_createtable(L, (int)t->shape[d], 0);
  for (int64_t i = 0; i < t->shape[d]; i++) {
    tolist_dim(L, t, d + 1, flat);
    lua_rawseti(L, -2, i + 1);
  }
}

static int l_tolist(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *owned;
  kg_tensor *r = readable(L, t, &owned, "tolist");
  int64_t flat = 0;
  tolist_dim(L, r, 0, &flat);
  kg_tensor_release(owned);
  return 1;
}

static int l_numel(lua_State *L) {
  lua_pushinteger(L, kg_numel(kgl_check(L, 1)));
  return 1;
}

static int l_size(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  if (lua_isnoneornil(L, 2)) {
    push_shape(L, t);
    return 1;
  }
  lua_pushinteger(L, t->shape[kgl_dim(L, 2, t->ndim)]);
  return 1;
}

static int l_dim(lua_State *L) {
  lua_pushinteger(L, kgl_check(L, 1)->ndim);
  return 1;
}

static int l_stride(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  lua_createtable(L, t->ndim, 0);
  for (int i = 0; i < t->ndim; i++) {
    lua_pushinteger(L, t->stride[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

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

#define UNARY_METHOD(name, call)             \
  static int l_##name(lua_State *L) {        \
    kg_tensor *t = kgl_check(L, 1), *r;      \
    KGL_CALL(L, call);                       \
    kgl_push(L, r);                          \
    return 1;                                \
  }
UNARY_METHOD(clone, kg_clone(&r, t))
UNARY_METHOD(detach, kg_detach(&r, t))
UNARY_METHOD(contiguous, kg_contiguous(&r, t))
UNARY_METHOD(flatten, kg_flatten(&r, t))

static int l_copy_(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *owned;
  kg_tensor *src = kgl_to_tensor(L, 2, t, &owned);
  kg_status s = kg_copy_(t, src);
  kg_tensor_release(owned);
  if (s) return kgl_error(L);
  lua_settop(L, 1);
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

/* ---- views ------------------------------------------------------------------------------- */

static int l_reshape(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  int64_t shape[KG_MAX_DIMS];
  int nd = kgl_shape(L, 2, shape);
  KGL_CALL(L, kg_reshape(&r, t, nd, shape));
  kgl_push(L, r);
  return 1;
}

static int l_view(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  int64_t shape[KG_MAX_DIMS];
  int nd = kgl_shape(L, 2, shape);
  KGL_CALL(L, kg_view(&r, t, nd, shape));
  kgl_push(L, r);
  return 1;
}

static int l_transpose(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  int d0 = lua_isnoneornil(L, 2) ? (t->ndim >= 2 ? t->ndim - 2 : 0) : kgl_dim(L, 2, t->ndim);
  int d1 = lua_isnoneornil(L, 3) ? (t->ndim >= 1 ? t->ndim - 1 : 0) : kgl_dim(L, 3, t->ndim);
  KGL_CALL(L, kg_transpose(&r, t, d0, d1));
  kgl_push(L, r);
  return 1;
}

static int l_permute(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  int64_t dims[KG_MAX_DIMS];
  int n = kgl_shape(L, 2, dims);
  if (n != t->ndim) luaL_error(L, "permute: %d dims given for a tensor of %d dims", n, t->ndim);
  int perm[KG_MAX_DIMS];
  for (int i = 0; i < n; i++) {
    int64_t d = dims[i];
    if (d == 0 || d > n || d < -n) luaL_error(L, "permute: dim %I out of range (dims are 1-based)", (LUAI_UACINT)d);
    perm[i] = d > 0 ? (int)d - 1 : (int)(d + n);
  }
  KGL_CALL(L, kg_permute(&r, t, perm));
  kgl_push(L, r);
  return 1;
}

static int l_unsqueeze(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  lua_Integer d = luaL_checkinteger(L, 2);
  int n = t->ndim + 1;
  if (d == 0 || d > n || d < -n) luaL_error(L, "unsqueeze: dim %I out of range for a result of %d dims", (LUAI_UACINT)d, n);
  KGL_CALL(L, kg_unsqueeze(&r, t, d > 0 ? (int)d - 1 : (int)(d + n)));
  kgl_push(L, r);
  return 1;
}

static int l_squeeze(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  int d = lua_isnoneornil(L, 2) ? KG_ALL_DIMS : kgl_dim(L, 2, t->ndim);
  KGL_CALL(L, kg_squeeze(&r, t, d));
  kgl_push(L, r);
  return 1;
}

static int l_expand(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  int64_t shape[KG_MAX_DIMS];
  int nd = kgl_shape(L, 2, shape);
  KGL_CALL(L, kg_expand(&r, t, nd, shape));
  kgl_push(L, r);
  return 1;
}

static int l_narrow(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  int d = kgl_dim(L, 2, t->ndim);
  lua_Integer start = luaL_checkinteger(L, 3), len = luaL_checkinteger(L, 4);
  if (start == 0) luaL_error(L, "narrow: start is 1-based; 0 is not a position");
  KGL_CALL(L, kg_narrow(&r, t, d, start > 0 ? start - 1 : start, len));
  kgl_push(L, r);
  return 1;
}

static int l_select(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *r;
  int d = kgl_dim(L, 2, t->ndim);
  lua_Integer i = luaL_checkinteger(L, 3);
  if (i == 0) luaL_error(L, "select: index is 1-based; 0 is not a position");
  KGL_CALL(L, kg_select(&r, t, d, i > 0 ? i - 1 : i));
  kgl_push(L, r);
  return 1;
}

/* t:split(size, dim) -> list of views of `size` along dim (the last may be shorter);
 * size may also be a list of sizes */
static int l_split(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  int d = kgl_optdim(L, 3, t->ndim, 0);
  int64_t n = t->ndim ? t->shape[d] : 1, start = 0;
  lua_newtable(L);
  int out = lua_gettop(L), k = 0;
  if (lua_istable(L, 2)) {
    lua_Integer cnt = luaL_len(L, 2), total = 0;
    for (lua_Integer i = 1; i <= cnt; i++) {
      lua_geti(L, 2, i);
      int isnum;
      lua_Integer len = lua_tointegerx(L, -1, &isnum);
      if (!isnum || len < 0 || len > n - total) /* checked before adding: the sum cannot wrap */
        luaL_error(L, "split: size %d (%s) is not a non-negative integer within the %I elements of dim %d", (int)i,
                   luaL_tolstring(L, -1, NULL), (LUAI_UACINT)n, d + 1);
      total += len;
      lua_pop(L, 1);
    }
    if (total != n) luaL_error(L, "split: sizes add up to %I but dim %d has size %I", (LUAI_UACINT)total, d + 1, (LUAI_UACINT)n);
    for (lua_Integer i = 1; i <= cnt; i++) {
      lua_geti(L, 2, i);
      int64_t len = lua_tointeger(L, -1);
      lua_pop(L, 1);
      kg_tensor *r;
      KGL_CALL(L, kg_narrow(&r, t, d, start, len));
      kgl_push(L, r);
      lua_rawseti(L, out, ++k);
      start += len;
    }
    return 1;
  }
  lua_Integer size = luaL_checkinteger(L, 2);
  if (size <= 0) luaL_error(L, "split: size must be positive, got %I", (LUAI_UACINT)size);
  for (int64_t len; start < n; start += len) {
    kg_tensor *r;
    len = size > n - start ? n - start : size; /* never start + size: it may not fit */
    KGL_CALL(L, kg_narrow(&r, t, d, start, len));
    kgl_push(L, r);
    lua_rawseti(L, out, ++k);
  }
  return 1;
}

/* t:chunk(n, dim) -> n views (fewer if the dim is short), sizes ceil(len / n) */
static int l_chunk(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  lua_Integer n = luaL_checkinteger(L, 2);
  if (n <= 0) luaL_error(L, "chunk: number of chunks must be positive, got %I", (LUAI_UACINT)n);
  int d = kgl_optdim(L, 3, t->ndim, 0);
  int64_t len = t->ndim ? t->shape[d] : 1;
  lua_settop(L, 1);
  int64_t size = len / n + (len % n != 0); /* ceil without len + n - 1, which may not fit */
  lua_pushinteger(L, size > 0 ? size : 1);
  lua_pushinteger(L, d + 1);
  return l_split(L);
}

/* ---- linear algebra ------------------------------------------------------------------------- */

static int l_matmul(lua_State *L) {
  kg_tensor *a = kgl_check(L, 1), *b = kgl_check(L, 2), *r;
  KGL_CALL(L, kg_matmul(&r, a, b));
  kgl_push(L, r);
  return 1;
}

static int l_linear(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *w = kgl_check(L, 2), *b = kgl_opt(L, 3), *r;
  KGL_CALL(L, kg_linear(&r, x, w, b));
  kgl_push(L, r);
  return 1;
}

/* ---- autograd ------------------------------------------------------------------------------- */

static int l_backward(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1), *g = NULL;
  bool retain = false;
  if (lua_istable(L, 2) && !kgl_test(L, 2)) {
    kgl_check_options(L, 2, "backward", (const char *const[]){"gradient", "retain_graph", NULL});
    lua_getfield(L, 2, "gradient");
    g = kgl_opt(L, -1);
    retain = kgl_field_bool(L, 2, "retain_graph", false);
  } else {
    g = kgl_opt(L, 2);
    retain = lua_toboolean(L, 3);
  }
  KGL_CALL(L, kg_backward(t, g, retain));
  return 0;
}

static int l_requires_grad_(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  set_requires_grad(L, t, lua_isnoneornil(L, 2) ? true : lua_toboolean(L, 2));
  lua_settop(L, 1);
  return 1;
}

/* runs fn(...) with grad mode `on` and returns its results; the mode is restored on error */
static int with_grad_mode(lua_State *L, bool on) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  bool was = kg_set_grad_enabled(on);
  int st = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  kg_set_grad_enabled(was);
  if (st != LUA_OK) return lua_error(L);
  return lua_gettop(L);
}
static int l_no_grad(lua_State *L) { return with_grad_mode(L, false); }
static int l_enable_grad(lua_State *L) { return with_grad_mode(L, true); }

static int l_is_grad_enabled(lua_State *L) {
  lua_pushboolean(L, kg_grad_enabled());
  return 1;
}

static int l_set_grad_enabled(lua_State *L) {
  lua_pushboolean(L, kg_set_grad_enabled(lua_toboolean(L, 1)));
  return 1;
}

/* ---- metatable ------------------------------------------------------------------------------ */

static int l_gc(lua_State *L) {
  udata *u = luaL_checkudata(L, 1, KGL_TENSOR_MT);
  kg_tensor_release(u->t);
  u->t = NULL;
  return 0;
}

static int l_index(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  if (lua_type(L, 2) == LUA_TNUMBER) { /* t[i] = t:select(1, i) */
    if (t->ndim == 0) luaL_error(L, "cannot index a 0-d tensor");
    lua_Integer i = luaL_checkinteger(L, 2);
    if (i == 0) luaL_error(L, "index is 1-based; 0 is not a position");
    kg_tensor *r;
    KGL_CALL(L, kg_select(&r, t, 0, i > 0 ? i - 1 : i));
    kgl_push(L, r);
    return 1;
  }
  const char *k = luaL_checkstring(L, 2);
  char buf[16];
  if (!strcmp(k, "shape")) push_shape(L, t);
  else if (!strcmp(k, "ndim")) lua_pushinteger(L, t->ndim);
  else if (!strcmp(k, "dtype")) lua_pushstring(L, kg_dtype_info[t->dtype].name);
  else if (!strcmp(k, "device")) lua_pushstring(L, kg_device_name(t->device, buf));
  else if (!strcmp(k, "requires_grad")) lua_pushboolean(L, kg_requires_grad(t));
  else if (!strcmp(k, "is_leaf")) lua_pushboolean(L, t->grad_fn == NULL);
  else if (!strcmp(k, "is_contiguous")) lua_pushboolean(L, kg_is_contiguous(t));
  else if (!strcmp(k, "grad_fn")) {
    if (t->grad_fn) lua_pushstring(L, kg_op_info[t->grad_fn->op].name);
    else lua_pushnil(L);
  } else if (!strcmp(k, "grad")) {
    if (t->grad) kgl_push(L, kg_tensor_retain(t->grad));
    else lua_pushnil(L);
  } else if (!strcmp(k, "T")) {
    kg_tensor *r;
    int perm[KG_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) perm[i] = t->ndim - 1 - i;
    KGL_CALL(L, kg_permute(&r, t, perm));
    kgl_push(L, r);
  } else {
    lua_getfield(L, lua_upvalueindex(1), k);
  }
  return 1;
}

static int l_newindex(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  if (lua_type(L, 2) == LUA_TNUMBER) { /* t[i] = value */
    lua_Integer i = luaL_checkinteger(L, 2);
    if (t->ndim == 0 || i == 0) luaL_error(L, "index is 1-based and needs at least 1 dim");
    bool number = lua_type(L, 3) == LUA_TNUMBER || lua_isboolean(L, 3);
    kg_tensor *src = number ? NULL : kgl_test(L, 3), *r; /* checked before r exists: no leak on error */
    if (!number && !src) return luaL_typeerror(L, 3, "tensor, number or boolean");
    KGL_CALL(L, kg_select(&r, t, 0, i > 0 ? i - 1 : i));
    kg_status s = number ? /* a number is a fill: checked against the dtype */
                      kg_fill_(r, lua_isboolean(L, 3) ? lua_toboolean(L, 3) : lua_tonumber(L, 3))
                         : kg_copy_(r, src);
    kg_tensor_release(r);
    if (s) kgl_error(L);
    return 0;
  }
  const char *k = luaL_checkstring(L, 2);
  if (!strcmp(k, "requires_grad")) set_requires_grad(L, t, lua_toboolean(L, 3));
  else if (!strcmp(k, "grad")) {
    kg_tensor *g = kgl_opt(L, 3);
    char a[KG_SHAPE_STR_MAX], b[KG_SHAPE_STR_MAX];
    if (g && !kg_same_shape(g, t))
      luaL_error(L, "grad: shape %s does not match the tensor %s", kg_shape_str(a, g->ndim, g->shape),
                 kg_shape_str(b, t->ndim, t->shape));
    kg_tensor_release(t->grad);
    t->grad = g ? kg_tensor_retain(g) : NULL;
  } else luaL_error(L, "cannot set field '%s' of a tensor", k);
  return 0;
}

static int l_len(lua_State *L) {
  kg_tensor *t = kgl_check(L, 1);
  if (t->ndim == 0) luaL_error(L, "len() of a 0-d tensor");
  lua_pushinteger(L, t->shape[0]);
  return 1;
}

/* ---- module-level queries ------------------------------------------------------------------- */

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

static int l_is_tensor(lua_State *L) {
  lua_pushboolean(L, kgl_test(L, 1) != NULL);
  return 1;
}

void kgl_register_core(lua_State *L, int methods, int keng) {
  static const struct { const char *name; lua_CFunction fn; int where; } fns[] = {
      /* where: 1 = method, 2 = keng function, 3 = both */
      {"tensor", l_tensor, 2},       {"zeros", l_zeros, 2},         {"ones", l_ones, 2},
      {"full", l_full, 2},           {"empty", l_empty, 2},         {"zeros_like", l_zeros_like, 2},
      {"ones_like", l_ones_like, 2}, {"arange", l_arange, 2},       {"rand", l_rand, 2},
      {"randn", l_randn, 2},         {"randint", l_randint, 2},     {"manual_seed", l_manual_seed, 2},
      {"item", l_item, 1},           {"tolist", l_tolist, 1},       {"numel", l_numel, 3},
      {"size", l_size, 1},           {"dim", l_dim, 1},             {"stride", l_stride, 1},
      {"to", l_to, 1},               {"float", l_float, 1},         {"double", l_double, 1},
      {"bf16", l_bf16, 1},           {"half", l_half, 1},           {"long", l_long, 1},
      {"int", l_int, 1},             {"bool", l_bool, 1},           {"cpu", l_cpu, 1},
      {"cuda", l_cuda, 1},           {"clone", l_clone, 3},         {"detach", l_detach, 1},
      {"contiguous", l_contiguous, 1}, {"flatten", l_flatten, 3},   {"copy_", l_copy_, 1},
      {"fill_", l_fill_, 1},         {"zero_", l_zero_, 1},         {"reshape", l_reshape, 3},
      {"view", l_view, 1},           {"transpose", l_transpose, 3}, {"permute", l_permute, 3},
      {"unsqueeze", l_unsqueeze, 3}, {"squeeze", l_squeeze, 3},     {"expand", l_expand, 1},
      {"narrow", l_narrow, 3},       {"select", l_select, 3},       {"split", l_split, 3},
      {"chunk", l_chunk, 3},         {"matmul", l_matmul, 3},       {"linear", l_linear, 2},
      {"backward", l_backward, 1},   {"requires_grad_", l_requires_grad_, 1},
      {"no_grad", l_no_grad, 2},     {"enable_grad", l_enable_grad, 2},
      {"is_grad_enabled", l_is_grad_enabled, 2}, {"set_grad_enabled", l_set_grad_enabled, 2},
      {"ops_report", l_ops_report, 2}, {"ops", l_ops, 2},           {"memory_stats", l_memory_stats, 2},
      {"reset_peak_memory_stats", l_reset_peak_memory_stats, 2},
      {"empty_cache", l_empty_cache, 2}, {"num_threads", l_num_threads, 2},
      {"set_num_threads", l_set_num_threads, 2}, {"synchronize", l_synchronize, 2},
      {"flop_count", l_flop_count, 2}, {"is_tensor", l_is_tensor, 2},   {"time", l_time, 2},
  };
  for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
    kgl_set(L, fns[i].where & 1 ? methods : 0, fns[i].where & 2 ? keng : 0, fns[i].name, fns[i].fn);
  lua_createtable(L, 0, 3); /* keng.cuda */
  lua_pushcfunction(L, l_cuda_available);
  lua_setfield(L, -2, "is_available");
  lua_pushcfunction(L, l_cuda_count);
  lua_setfield(L, -2, "device_count");
  lua_pushcfunction(L, l_synchronize);
  lua_setfield(L, -2, "synchronize");
  lua_setfield(L, keng, "cuda");
}

int kgl_open(lua_State *L) {
  kg_memory_set_alloc_hook(alloc_hook, NULL);
  lua_newtable(L); /* keng */
  int keng = lua_gettop(L);
  lua_newtable(L); /* methods */
  int methods = lua_gettop(L);
#define X(f) kgl_register_##f(L, methods, keng);
  KGL_FAMILIES(X)
#undef X
  luaL_newmetatable(L, KGL_TENSOR_MT);
  int mt = lua_gettop(L);
  lua_pushvalue(L, methods);
  lua_setfield(L, mt, "methods"); /* for REPL completion */
  lua_pushvalue(L, methods);
  lua_pushcclosure(L, l_index, 1);
  lua_setfield(L, mt, "__index");
  lua_pushcfunction(L, l_newindex);
  lua_setfield(L, mt, "__newindex");
  lua_pushcfunction(L, l_gc);
  lua_setfield(L, mt, "__gc");
  lua_pushcfunction(L, l_gc);
  lua_setfield(L, mt, "__close");
  lua_pushcfunction(L, l_tostring);
  lua_setfield(L, mt, "__tostring");
  lua_pushcfunction(L, l_len);
  lua_setfield(L, mt, "__len");
  lua_pushstring(L, "keng.Tensor");
  lua_setfield(L, mt, "__name");
  /* arithmetic metamethods come from the elementwise methods */
  static const char *ops[][2] = {{"__add", "add"}, {"__sub", "sub"}, {"__mul", "mul"}, {"__div", "div"},
                                 {"__pow", "pow"}, {"__unm", "neg"}};
  for (int i = 0; i < 6; i++) {
    lua_getfield(L, methods, ops[i][1]);
    lua_setfield(L, mt, ops[i][0]);
  }
  lua_pushvalue(L, methods);
  lua_setfield(L, keng, "Tensor"); /* keng.Tensor: the method table (users may add methods) */
  lua_pushstring(L, KENG_VERSION);
  lua_setfield(L, keng, "version");
  lua_settop(L, keng);
  return 1;
}
