/* index.c — Lua bindings of the indexing and layout family: cat, stack, pad, gather,
 * index_select, embedding, scatter_add_, index_add_, repeat_interleave, tril, triu.
 * Dims are 1-based (negative from the end); indices stored in tensors are 0-based. */
#include "keng_lua.h"

/* the tensors of the list at idx, in a userdata array kept on the stack; returns the count */
static int tensor_list(lua_State *L, int idx, const kg_tensor ***xs) {
  luaL_checktype(L, idx, LUA_TTABLE);
  int n = (int)luaL_len(L, idx);
  if (n < 1) luaL_argerror(L, idx, "expected a non-empty list of tensors");
  *xs = lua_newuserdatauv(L, (size_t)n * sizeof **xs, 0);
  for (int i = 0; i < n; i++) {
    lua_geti(L, idx, i + 1);
    kg_tensor *t = kgl_test(L, -1);
    if (!t) luaL_argerror(L, idx, lua_pushfstring(L, "element %d of the list is not a tensor (%s)", i + 1, luaL_typename(L, -1)));
    (*xs)[i] = t; /* the list keeps it alive */
    lua_pop(L, 1);
  }
  return n;
}

/* keng.cat(list, dim): dim defaults to 1 */
static int l_cat(lua_State *L) {
  lua_settop(L, 2);
  const kg_tensor **xs;
  int n = tensor_list(L, 1, &xs);
  int d = kgl_optdim(L, 2, xs[0]->ndim, 0);
  kg_tensor *r;
  KGL_CALL(L, kg_cat(&r, n, xs, d));
  kgl_push(L, r);
  return 1;
}

/* keng.stack(list, dim): a new dim at position dim (1 .. ndim+1; default 1) */
static int l_stack(lua_State *L) {
  lua_settop(L, 2);
  const kg_tensor **xs;
  int n = tensor_list(L, 1, &xs);
  int d = kgl_optdim(L, 2, xs[0]->ndim + 1, 0);
  kg_tensor *r;
  KGL_CALL(L, kg_stack(&r, n, xs, d));
  kgl_push(L, r);
  return 1;
}

/* keng.pad(t, {left, right, top, bottom, ...}, value) */
static int l_pad(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  luaL_checktype(L, 2, LUA_TTABLE);
  int64_t pad[2 * KG_MAX_DIMS];
  lua_Integer n = luaL_len(L, 2);
  if (n > 2 * KG_MAX_DIMS) luaL_error(L, "pad: %d pad values; at most %d", (int)n, 2 * KG_MAX_DIMS);
  for (lua_Integer i = 0; i < n; i++) {
    lua_geti(L, 2, i + 1);
    pad[i] = luaL_checkinteger(L, -1);
    lua_pop(L, 1);
  }
  KGL_CALL(L, kg_pad(&r, x, (int)n, pad, luaL_optnumber(L, 3, 0)));
  kgl_push(L, r);
  return 1;
}

/* t:gather(dim, idx): out[i][j] = t[i][idx[i][j]] along dim */
static int l_gather(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  int d = kgl_dim(L, 2, x->ndim);
  kg_tensor *idx = kgl_check(L, 3);
  KGL_CALL(L, kg_gather(&r, x, d, idx));
  kgl_push(L, r);
  return 1;
}

static int l_index_select(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  int d = kgl_dim(L, 2, x->ndim);
  kg_tensor *idx = kgl_check(L, 3);
  KGL_CALL(L, kg_index_select(&r, x, d, idx));
  kgl_push(L, r);
  return 1;
}

/* keng.embedding(ids, table): ids [...] 0-based, table [V, C] -> [..., C] */
static int l_embedding(lua_State *L) {
  kg_tensor *ids = kgl_check(L, 1), *table = kgl_check(L, 2), *r;
  KGL_CALL(L, kg_embedding(&r, ids, table));
  kgl_push(L, r);
  return 1;
}

/* t:scatter_add_(dim, idx, src) and t:index_add_(dim, idx, src) return t */
static int l_scatter_add_(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1);
  int d = kgl_dim(L, 2, x->ndim);
  KGL_CALL(L, kg_scatter_add_(x, d, kgl_check(L, 3), kgl_check(L, 4)));
  lua_settop(L, 1);
  return 1;
}

static int l_index_add_(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1);
  int d = kgl_dim(L, 2, x->ndim);
  KGL_CALL(L, kg_index_add_(x, d, kgl_check(L, 3), kgl_check(L, 4)));
  lua_settop(L, 1);
  return 1;
}

/* t:repeat_interleave(n, dim); without dim, t is flattened first (as PyTorch) */
static int l_repeat_interleave(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  lua_Integer n = luaL_checkinteger(L, 2);
  if (lua_isnoneornil(L, 3)) {
    kg_tensor *f;
    KGL_CALL(L, kg_flatten(&f, x));
    kg_status s = kg_repeat_interleave(&r, f, n, 0);
    kg_tensor_release(f);
    if (s) return kgl_error(L);
  } else {
    KGL_CALL(L, kg_repeat_interleave(&r, x, n, kgl_dim(L, 3, x->ndim)));
  }
  kgl_push(L, r);
  return 1;
}

static int l_tril(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  KGL_CALL(L, kg_tril(&r, x, luaL_optinteger(L, 2, 0)));
  kgl_push(L, r);
  return 1;
}

static int l_triu(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  KGL_CALL(L, kg_triu(&r, x, luaL_optinteger(L, 2, 0)));
  kgl_push(L, r);
  return 1;
}

void kgl_register_index(lua_State *L, int methods, int keng) {
  kgl_set(L, 0, keng, "cat", l_cat);
  kgl_set(L, 0, keng, "stack", l_stack);
  kgl_set(L, 0, keng, "pad", l_pad);
  kgl_set(L, 0, keng, "embedding", l_embedding);
  kgl_set(L, methods, keng, "gather", l_gather);
  kgl_set(L, methods, keng, "index_select", l_index_select);
  kgl_set(L, methods, keng, "repeat_interleave", l_repeat_interleave);
  kgl_set(L, methods, keng, "tril", l_tril);
  kgl_set(L, methods, keng, "triu", l_triu);
  kgl_set(L, methods, 0, "scatter_add_", l_scatter_add_);
  kgl_set(L, methods, 0, "index_add_", l_index_add_);
}
