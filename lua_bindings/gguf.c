/* gguf.c — binding of the GGUF reader (engine/io/gguf.c, docs/gguf.md):
 *   keng.gguf.load(path, {dtype = "f32", q4_0 = "int4", q8_0 = "int8"}) -> tensors, metadata, info
 *     tensors   {name = tensor}: F32/F16/BF16 as stored (views of the file mapping); Q4_K, Q6_K
 *               dequantized to dtype ("f32", "bf16" or "f16"); Q4_0 as keng's int4 pair
 *               name -> codes u8 [.., I/2] and name .. "_scale" -> f16 [.., I/32] (q4_0 = "int4",
 *               the default) or dequantized like the others (q4_0 = "dequantize"); Q8_0 likewise
 *               as codes i8 [.., I] and f16 [.., I/32] scales (q8_0 = "int8", the default)
 *     metadata  {key = value}: integers, numbers, booleans, strings; arrays as Lua lists
 *     info      {name = {type = "Q4_K", shape = {..}}}: each tensor's ggml type and keng shape
 *   tensors = false: only the metadata and info (an empty tensors table), nothing converted
 *   keng.gguf.open(path) -> file   the header alone (validated); tensors converted one at a time:
 *     file:metadata(), file:info(), file:tensor(name, {dtype =, q4_0 =, q8_0 =}) -> tensor[, scale],
 *     file:close() (also __close / __gc; tensors already made stay valid)
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

/* the options {dtype =, q4_0 =, q8_0 =, tensors =} at idx (extra: also accept "tensors") */
typedef struct {
  kg_dtype dt;
  unsigned keep; /* KG_GGUF_KEEP_Q4_0 | KG_GGUF_KEEP_Q8_0 */
  bool want;
} load_opts;

static load_opts check_opts(lua_State *L, int idx, const char *who, bool with_tensors) {
  static const char *const valid[] = {"dtype", "q4_0", "q8_0", "tensors", NULL};
  static const char *const valid1[] = {"dtype", "q4_0", "q8_0", NULL};
  kgl_check_options(L, idx, who, with_tensors ? valid : valid1);
  load_opts o = {KG_F32, KG_GGUF_KEEP_Q4_0 | KG_GGUF_KEEP_Q8_0, true};
  if (!lua_istable(L, idx)) return o;
  lua_getfield(L, idx, "tensors");
  if (!lua_isnil(L, -1)) {
    if (!lua_isboolean(L, -1)) luaL_error(L, "%s: tensors must be true or false, got %s", who, luaL_typename(L, -1));
    o.want = lua_toboolean(L, -1);
  }
  lua_pop(L, 1);
  lua_getfield(L, idx, "dtype");
  if (!lua_isnil(L, -1)) o.dt = kgl_dtype(L, -1);
  lua_pop(L, 1);
  if (o.dt != KG_F32 && o.dt != KG_BF16 && o.dt != KG_F16)
    luaL_error(L, "%s: dtype must be f32, bf16 or f16 (what quantized tensors dequantize to), got %s", who,
               kg_dtype_info[o.dt].name);
  lua_getfield(L, idx, "q4_0");
  if (!lua_isnil(L, -1)) {
    const char *m = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (!m || (strcmp(m, "int4") && strcmp(m, "dequantize")))
      luaL_error(L, "%s: q4_0 must be \"int4\" or \"dequantize\", got %s", who, m ? m : luaL_typename(L, -1));
    if (strcmp(m, "int4")) o.keep &= ~KG_GGUF_KEEP_Q4_0;
  }
  lua_pop(L, 1);
  lua_getfield(L, idx, "q8_0");
  if (!lua_isnil(L, -1)) {
    const char *m = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (!m || (strcmp(m, "int8") && strcmp(m, "dequantize")))
      luaL_error(L, "%s: q8_0 must be \"int8\" or \"dequantize\", got %s", who, m ? m : luaL_typename(L, -1));
    if (strcmp(m, "int8")) o.keep &= ~KG_GGUF_KEEP_Q8_0;
  }
  lua_pop(L, 1);
  return o;
}

static kg_gguf *check_file(lua_State *L) {
  kg_gguf **b = luaL_checkudata(L, 1, GGUF_MT);
  if (!*b) luaL_error(L, "gguf: the file was closed");
  return *b;
}

/* pushes the metadata table */
static void push_metadata(lua_State *L, const kg_gguf *g) {
  int64_t nkv = kg_gguf_n_kv(g);
  lua_createtable(L, 0, nkv < (1 << 26) ? (int)nkv : 0);
  for (int64_t i = 0; i < nkv; i++) {
    push_value(L, kg_gguf_value_at(g, i));
    lua_setfield(L, -2, kg_gguf_key(g, i));
  }
}

/* pushes the info table {name = {type =, shape =}} */
static void push_info(lua_State *L, const kg_gguf *g) {
  int64_t nt = kg_gguf_n_tensors(g);
  lua_createtable(L, 0, nt < (1 << 26) ? (int)nt : 0);
  for (int64_t i = 0; i < nt; i++) {
    const kg_gguf_tensor_info *ti = kg_gguf_tensor_info_at(g, i);
    lua_createtable(L, 0, 2);
    lua_pushstring(L, kg_gguf_type_name(ti->type));
    lua_setfield(L, -2, "type");
    lua_createtable(L, ti->ndim, 0);
    for (int d = 0; d < ti->ndim; d++) {
      lua_pushinteger(L, ti->ne[ti->ndim - 1 - d]);
      lua_rawseti(L, -2, d + 1);
    }
    lua_setfield(L, -2, "shape");
    lua_setfield(L, -2, ti->name);
  }
}

/* converts tensor i and pushes it (and its scale, or nil): 2 values */
static void push_tensor(lua_State *L, const kg_gguf *g, int64_t i, load_opts o) {
  kg_tensor *t = NULL, *s = NULL;
  KGL_CALL(L, kg_gguf_tensor(g, i, o.dt, o.keep, &t, &s));
  kgl_push(L, t);
  if (s)
    kgl_push(L, s);
  else
    lua_pushnil(L);
}

/* keng.gguf.open(path) -> file: the validated header, tensors converted on demand */
static int l_open(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  if (!lua_isnoneornil(L, 2)) luaL_error(L, "keng.gguf.open takes a path only");
  kg_gguf **box = lua_newuserdatauv(L, sizeof *box, 0);
  *box = NULL;
  luaL_setmetatable(L, GGUF_MT);
  KGL_CALL(L, kg_gguf_open(box, path));
  return 1;
}

/* file:metadata() -> {key = value} */
static int f_metadata(lua_State *L) {
  push_metadata(L, check_file(L));
  return 1;
}

/* file:info() -> {name = {type =, shape =}} */
static int f_info(lua_State *L) {
  push_info(L, check_file(L));
  return 1;
}

/* file:tensor(name, {dtype =, q4_0 =, q8_0 =}) -> tensor[, scale] (a kept Q4_0 / Q8_0 returns both) */
static int f_tensor(lua_State *L) {
  kg_gguf *g = check_file(L);
  const char *name = luaL_checkstring(L, 2);
  load_opts o = check_opts(L, 3, "gguf file:tensor", false);
  int64_t nt = kg_gguf_n_tensors(g);
  for (int64_t i = 0; i < nt; i++)
    if (!strcmp(kg_gguf_tensor_info_at(g, i)->name, name)) {
      push_tensor(L, g, i, o);
      return lua_isnil(L, -1) ? (lua_pop(L, 1), 1) : 2;
    }
  return luaL_error(L, "gguf file:tensor: the file has no tensor '%s'", name);
}

/* file:close(): frees the header now (tensors already made stay valid) */
static int f_close(lua_State *L) { return box_gc(L); }

static int l_load(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  load_opts o = check_opts(L, 2, "keng.gguf.load", true);
  lua_settop(L, 2);
  kg_gguf **box = lua_newuserdatauv(L, sizeof *box, 0); /* index 3 */
  *box = NULL;
  luaL_setmetatable(L, GGUF_MT);
  KGL_CALL(L, kg_gguf_open(box, path));
  kg_gguf *g = *box;
  int64_t nt = kg_gguf_n_tensors(g);
  lua_createtable(L, 0, nt < (1 << 26) ? (int)nt : 0); /* 4 tensors */
  for (int64_t i = 0; i < nt && o.want; i++) {
    const char *name = kg_gguf_tensor_info_at(g, i)->name;
    push_tensor(L, g, i, o);
    if (!lua_isnil(L, -1)) {
      lua_pushfstring(L, "%s_scale", name);
      lua_insert(L, -2);
      lua_settable(L, 4);
    } else
      lua_pop(L, 1);
    lua_setfield(L, 4, name);
  }
  push_metadata(L, g);
  push_info(L, g);
  return 3;
}

void kgl_register_gguf(lua_State *L, int methods, int keng) {
  (void)methods;
  static const luaL_Reg file_methods[] = {
      {"metadata", f_metadata}, {"info", f_info}, {"tensor", f_tensor}, {"close", f_close}, {NULL, NULL}};
  luaL_newmetatable(L, GGUF_MT);
  lua_pushcfunction(L, box_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, box_gc);
  lua_setfield(L, -2, "__close");
  luaL_newlib(L, file_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  lua_createtable(L, 0, 2);
  lua_pushcfunction(L, l_load);
  lua_setfield(L, -2, "load");
  lua_pushcfunction(L, l_open);
  lua_setfield(L, -2, "open");
  lua_setfield(L, keng, "gguf");
}
