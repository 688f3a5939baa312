/* view.c — bindings of the view ops (engine/ops/view.c): reshape, view, flatten, transpose,
 * permute, unsqueeze, squeeze, expand, narrow, select, split, chunk. Dims and positions are
 * 1-based (negative from the end). */
#include "keng_lua.h"

KGL_UNARY_METHOD(flatten, kg_flatten(&r, t))

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

void kgl_register_view(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "reshape", l_reshape);
  kgl_set(L, methods, 0, "view", l_view);
  kgl_set(L, methods, keng, "flatten", l_flatten);
  kgl_set(L, methods, keng, "transpose", l_transpose);
  kgl_set(L, methods, keng, "permute", l_permute);
  kgl_set(L, methods, keng, "unsqueeze", l_unsqueeze);
  kgl_set(L, methods, keng, "squeeze", l_squeeze);
  kgl_set(L, methods, 0, "expand", l_expand);
  kgl_set(L, methods, keng, "narrow", l_narrow);
  kgl_set(L, methods, keng, "select", l_select);
  kgl_set(L, methods, keng, "split", l_split);
  kgl_set(L, methods, keng, "chunk", l_chunk);
}
