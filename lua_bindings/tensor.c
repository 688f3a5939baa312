/* tensor.c — the tensor userdata (engine/core/tensor.c): push / check, errors, the collector's
 * pacing, printing, properties (item, tolist, numel, size, dim, stride), the keng.Tensor
 * metatable (t[i], t.shape, t.grad, ...) and kgl_open, which builds the module from every
 * family's lua_bindings/<family>.c. */
#include "keng_lua.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  if (!strcmp(k, "requires_grad")) kgl_set_requires_grad(L, t, lua_toboolean(L, 3));
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

static int l_is_tensor(lua_State *L) {
  lua_pushboolean(L, kgl_test(L, 1) != NULL);
  return 1;
}

void kgl_register_tensor(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, 0, "item", l_item);
  kgl_set(L, methods, 0, "tolist", l_tolist);
  kgl_set(L, methods, keng, "numel", l_numel);
  kgl_set(L, methods, 0, "size", l_size);
  kgl_set(L, methods, 0, "dim", l_dim);
  kgl_set(L, methods, 0, "stride", l_stride);
  kgl_set(L, 0, keng, "is_tensor", l_is_tensor);
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
