/* tokenizer_json.c — binding of the tokenizer.json reader (engine/io/tokenizer_json*.c,
 * docs/tokenizers.md). The Lua front is scripts/lib/keng/tokenizers.lua (T.from_file):
 *   local raw = keng.tokenizer_json("tokenizer.json")
 *   raw:encode(text) -> {id, ...}                 no post-processor (0-based ids)
 *   raw:post_process(ids_a, ids_b_or_nil, add_special) -> ids, type_ids
 *   raw:num_special(pair) -> n                    ids the post-processor adds
 *   raw:decode(ids, skip_special) -> string       ids: a list or a 1-D integer tensor
 *   raw:vocab_size(), raw:token_to_id(s) (nil when absent), raw:id_to_token(id) (nil),
 *   raw:is_special(id), raw.model_type
 * The userdata owns the tokenizer; __gc frees it. */
#include "keng_lua.h"
#include "tokenizer_util.h"

#include <keng/tokenizer_json.h>
#include <stdlib.h>
#include <string.h>

#define TJ_MT "keng.TokenizerJson"

typedef struct {
  kg_tokenizer_json *t;
} box;

static kg_tokenizer_json *check(lua_State *L) {
  box *b = luaL_checkudata(L, 1, TJ_MT);
  if (!b->t) luaL_error(L, "tokenizer_json: the tokenizer was freed");
  return b->t;
}

static int l_new(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->t = NULL;
  luaL_setmetatable(L, TJ_MT);
  if (kg_tokenizer_json_load(&b->t, path)) return kgl_error(L);
  return 1;
}

static int l_gc(lua_State *L) {
  box *b = luaL_checkudata(L, 1, TJ_MT);
  kg_tokenizer_json_free(b->t);
  b->t = NULL;
  return 0;
}

static int l_encode(lua_State *L) {
  kg_tokenizer_json *t = check(L);
  size_t n;
  const char *text = luaL_checklstring(L, 2, &n);
  int32_t *ids;
  size_t k;
  if (kg_tokenizer_json_encode(t, text, n, &ids, &k)) return kgl_error(L);
  return kgl_push_ids(L, ids, (int64_t)k);
}

/* the ids at idx as a malloc'd int32 array; an id outside int32 becomes -1 (named later) */
static int32_t *ids32(lua_State *L, int idx, const char *who, size_t *n) {
  lua_Integer k;
  int64_t *v = kgl_check_ids(L, idx, who, &k);
  int32_t *o = malloc(((size_t)k + 1) * sizeof *o);
  if (!o) luaL_error(L, "%s: out of memory", who);
  for (lua_Integer i = 0; i < k; i++)
    o[i] = (v[i] < INT32_MIN || v[i] > INT32_MAX) ? -1 : (int32_t)v[i];
  lua_pop(L, 1); /* the userdata of kgl_check_ids */
  *n = (size_t)k;
  return o;
}

static void push_list(lua_State *L, const int32_t *v, size_t n) {
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushinteger(L, v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

static int l_post_process(lua_State *L) {
  kg_tokenizer_json *t = check(L);
  bool pair = !lua_isnoneornil(L, 3);
  bool add = lua_isnoneornil(L, 4) ? true : lua_toboolean(L, 4);
  size_t na, nb = 0;
  int32_t *a = ids32(L, 2, "tokenizer_json: post_process", &na), *b = NULL;
  if (pair) {
    lua_pushvalue(L, 3);
    b = ids32(L, lua_gettop(L), "tokenizer_json: post_process", &nb);
    lua_pop(L, 1);
  }
  int32_t *ids, *types;
  size_t n;
  kg_status st = kg_tokenizer_json_post_process(t, a, na, b, nb, pair, add, &ids, &types, &n);
  free(a);
  free(b);
  if (st) return kgl_error(L);
  push_list(L, ids, n);
  push_list(L, types, n);
  free(ids);
  free(types);
  return 2;
}

static int l_num_special(lua_State *L) {
  kg_tokenizer_json *t = check(L);
  lua_pushinteger(L, (lua_Integer)kg_tokenizer_json_num_special(t, lua_toboolean(L, 2)));
  return 1;
}

static int l_decode(lua_State *L) {
  kg_tokenizer_json *t = check(L);
  bool skip = lua_toboolean(L, 3);
  size_t n;
  int32_t *ids = ids32(L, 2, "tokenizer_json: decode", &n);
  char *text;
  size_t len;
  kg_status st = kg_tokenizer_json_decode(t, ids, n, skip, &text, &len);
  free(ids);
  if (st) return kgl_error(L);
  lua_pushlstring(L, text, len);
  free(text);
  return 1;
}

static int l_vocab_size(lua_State *L) {
  lua_pushinteger(L, kg_tokenizer_json_vocab_size(check(L)));
  return 1;
}

static int l_token_to_id(lua_State *L) {
  kg_tokenizer_json *t = check(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  return kgl_push_id_or_nil(L, kg_tokenizer_json_token_to_id(t, s, n));
}

static int l_id_to_token(lua_State *L) {
  kg_tokenizer_json *t = check(L);
  size_t n = 0;
  const char *s = kg_tokenizer_json_id_to_token(t, luaL_checkinteger(L, 2), &n);
  return kgl_push_lstring_or_nil(L, s, n);
}

static int l_is_special(lua_State *L) {
  kg_tokenizer_json *t = check(L);
  lua_pushboolean(L, kg_tokenizer_json_is_special(t, luaL_checkinteger(L, 2)));
  return 1;
}

static int l_tostring(lua_State *L) {
  kg_tokenizer_json *t = check(L);
  lua_pushfstring(L, "TokenizerJson(%s, vocab %d)", kg_tokenizer_json_model_type(t),
                  (int)kg_tokenizer_json_vocab_size(t));
  return 1;
}

static const luaL_Reg methods[] = {
    {"encode", l_encode},           {"post_process", l_post_process}, {"num_special", l_num_special},
    {"decode", l_decode},           {"vocab_size", l_vocab_size},     {"token_to_id", l_token_to_id},
    {"id_to_token", l_id_to_token}, {"is_special", l_is_special},     {NULL, NULL}};

static int l_index(lua_State *L) {
  kg_tokenizer_json *t = check(L);
  if (lua_type(L, 2) != LUA_TSTRING) return 0;
  const char *k = lua_tostring(L, 2);
  lua_getfield(L, lua_upvalueindex(1), k);
  if (!lua_isnil(L, -1)) return 1;
  if (!strcmp(k, "model_type"))
    lua_pushstring(L, kg_tokenizer_json_model_type(t));
  else
    lua_pushnil(L);
  return 1;
}

void kgl_register_tokenizer_json(lua_State *L, int methods_idx, int keng) {
  (void)methods_idx;
  if (luaL_newmetatable(L, TJ_MT)) {
    lua_pushcfunction(L, l_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_gc);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, l_tostring);
    lua_setfield(L, -2, "__tostring");
    luaL_newlib(L, methods);
    lua_pushcclosure(L, l_index, 1);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, l_new);
  lua_setfield(L, keng, "tokenizer_json");
}
