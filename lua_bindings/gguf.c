/* gguf.c — binding of the GGUF reader (engine/io/gguf.c, docs/gguf.md):
 *   keng.gguf.load(path, {dtype = "f32", q4_0 = "int4"}) -> tensors, metadata, info
 *     tensors   {name = tensor}: F32/F16/BF16 as stored (views of the file mapping); Q8_0, Q4_K,
 *               Q6_K dequantized to dtype ("f32", "bf16" or "f16"); Q4_0 as keng's int4 pair
 *               name -> codes u8 [.., I/2] and name .. "_scale" -> f16 [.., I/32] (q4_0 = "int4",
 *               the default) or dequantized like the others (q4_0 = "dequantize")
 *     metadata  {key = value}: integers, numbers, booleans, strings; arrays as Lua lists
 *     info      {name = {type = "Q4_K", shape = {..}}}: each tensor's ggml type and keng shape
 *   tensors = false: only the metadata and info (an empty tensors table), nothing converted
 * Shapes are row-major (ggml's ne reversed): a ggml [ne0 = in, ne1 = out] weight is [out, in].
 * The parsed file lives in a userdata box whose __gc frees it, so an error halfway leaks nothing. */
#include "keng_lua.h"

#include <keng/gguf.h>
#include <string.h>

#define GGUF_MT "keng.gguf.file"

static int box_gc(lua_State *L) {
  kg_gguf **b = luaL_checkudata(L, 1, GGUF_MT);
  kg_gguf_free(*b);
  *b = NULL;
  return 0;
}

static void push_value(lua_State *L, const kg_gguf_value *v) {
  luaL_checkstack(L, 4, "gguf metadata nests too deep");
  switch (v->type) {
  case KG_GGUF_U8: case KG_GGUF_U16: case KG_GGUF_U32: case KG_GGUF_U64:
    if (v->u <= (uint64_t)LUA_MAXINTEGER)
      lua_pushinteger(L, (lua_Integer)v->u);
    else
      lua_pushnumber(L, (lua_Number)v->u); /* past Lua's integers: the nearest float */
    break;
  case KG_GGUF_I8: case KG_GGUF_I16: case KG_GGUF_I32: case KG_GGUF_I64: lua_pushinteger(L, (lua_Integer)v->i); break;
  case KG_GGUF_F32: case KG_GGUF_F64: lua_pushnumber(L, v->f); break;
  case KG_GGUF_BOOL: lua_pushboolean(L, v->u != 0); break;
  case KG_GGUF_STRING: lua_pushlstring(L, v->str, (size_t)v->len); break;
  case KG_GGUF_ARRAY:
    lua_createtable(L, v->n < (1u << 26) ? (int)v->n : 0, 0);
    for (uint64_t k = 0; k < v->n; k++) {
      push_value(L, &v->items[k]);
      lua_rawseti(L, -2, (lua_Integer)k + 1);
    }
    break;
  default: lua_pushnil(L);
  }
}

static int l_load(lua_State *L) {
  static const char *const valid[] = {"dtype", "q4_0", "tensors", NULL};
  const char *path = luaL_checkstring(L, 1);
  kgl_check_options(L, 2, "keng.gguf.load", valid);
  kg_dtype dt = KG_F32;
  bool keep_q4 = true, want = true;
  if (lua_istable(L, 2)) {
    lua_getfield(L, 2, "tensors");
    if (!lua_isnil(L, -1)) {
      if (!lua_isboolean(L, -1)) luaL_error(L, "keng.gguf.load: tensors must be true or false, got %s", luaL_typename(L, -1));
      want = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    lua_getfield(L, 2, "dtype");
    if (!lua_isnil(L, -1)) dt = kgl_dtype(L, -1);
    lua_pop(L, 1);
    if (dt != KG_F32 && dt != KG_BF16 && dt != KG_F16)
      luaL_error(L, "keng.gguf.load: dtype must be f32, bf16 or f16 (what quantized tensors dequantize to), got %s",
                 kg_dtype_info[dt].name);
    lua_getfield(L, 2, "q4_0");
    if (!lua_isnil(L, -1)) {
      const char *m = lua_tostring(L, -1);
      if (!m || (strcmp(m, "int4") && strcmp(m, "dequantize")))
        luaL_error(L, "keng.gguf.load: q4_0 must be \"int4\" or \"dequantize\", got %s",
                   m ? m : luaL_typename(L, -1));
      keep_q4 = !strcmp(m, "int4");
    }
    lua_pop(L, 1);
  }
  lua_settop(L, 2);
  kg_gguf **box = lua_newuserdatauv(L, sizeof *box, 0); /* index 3 */
  *box = NULL;
  luaL_setmetatable(L, GGUF_MT);
  KGL_CALL(L, kg_gguf_open(box, path));
  kg_gguf *g = *box;
  int64_t nt = kg_gguf_n_tensors(g), nkv = kg_gguf_n_kv(g);
  lua_createtable(L, 0, nt < (1 << 26) ? (int)nt : 0);   /* 4 tensors */
  lua_createtable(L, 0, nkv < (1 << 26) ? (int)nkv : 0); /* 5 metadata */
  lua_createtable(L, 0, nt < (1 << 26) ? (int)nt : 0);   /* 6 info */
  for (int64_t i = 0; i < nt; i++) {
    const kg_gguf_tensor_info *ti = kg_gguf_tensor_info_at(g, i);
    kg_tensor *t = NULL, *s = NULL;
    if (want) KGL_CALL(L, kg_gguf_tensor(g, i, dt, keep_q4, &t, &s));
    if (t) {
      kgl_push(L, t);
      lua_setfield(L, 4, ti->name);
    }
    if (s) {
      lua_pushfstring(L, "%s_scale", ti->name);
      kgl_push(L, s);
      lua_settable(L, 4);
    }
    lua_createtable(L, 0, 2);
    lua_pushstring(L, kg_gguf_type_name(ti->type));
    lua_setfield(L, -2, "type");
    lua_createtable(L, ti->ndim, 0);
    for (int d = 0; d < ti->ndim; d++) {
      lua_pushinteger(L, ti->ne[ti->ndim - 1 - d]);
      lua_rawseti(L, -2, d + 1);
    }
    lua_setfield(L, -2, "shape");
    lua_setfield(L, 6, ti->name);
  }
  for (int64_t i = 0; i < nkv; i++) {
    push_value(L, kg_gguf_value_at(g, i));
    lua_setfield(L, 5, kg_gguf_key(g, i));
  }
  return 3;
}

void kgl_register_gguf(lua_State *L, int methods, int keng) {
  (void)methods;
  luaL_newmetatable(L, GGUF_MT);
  lua_pushcfunction(L, box_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_load);
  lua_setfield(L, -2, "load");
  lua_setfield(L, keng, "gguf");
}
