/* sentencepiece.c — binding of the SentencePiece tokenizer (engine/io/sentencepiece.c,
 * docs/tokenizers.md):
 *   local sp = keng.sentencepiece("path/tokenizer.model")
 *   sp:encode(text, {add_bos = false, add_eos = false}) -> {id, ...}   ids are 0-based
 *   sp:decode(ids) -> string            ids: a Lua list or a 1-D integer tensor
 *   sp:vocab_size(), sp:id_to_piece(id), sp:piece_to_id(piece)
 *   sp.bos_id, sp.eos_id, sp.pad_id, sp.unk_id   (-1 when the model has none)
 * The userdata owns the model; __gc frees it. */
#include "keng_lua.h"

#include <keng/tokenizer.h>
#include <stdlib.h>
#include <string.h>

#define SP_MT "keng.SentencePiece"

typedef struct {
  kg_sentencepiece *sp;
} box;

static kg_sentencepiece *check_sp(lua_State *L) {
  box *b = luaL_checkudata(L, 1, SP_MT);
  if (!b->sp) luaL_error(L, "sentencepiece: the tokenizer was freed");
  return b->sp;
}

static int l_new(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->sp = NULL;
  luaL_setmetatable(L, SP_MT);
  if (kg_sentencepiece_load(&b->sp, path)) return kgl_error(L);
  return 1;
}

static int l_gc(lua_State *L) {
  box *b = luaL_checkudata(L, 1, SP_MT);
  kg_sentencepiece_free(b->sp);
  b->sp = NULL;
  return 0;
}

static int l_encode(lua_State *L) {
  kg_sentencepiece *sp = check_sp(L);
  size_t n;
  const char *text = luaL_checklstring(L, 2, &n);
  static const char *const valid[] = {"add_bos", "add_eos", NULL};
  kgl_check_options(L, 3, "sentencepiece:encode", valid);
  bool add_bos = lua_istable(L, 3) && kgl_field_bool(L, 3, "add_bos", false);
  bool add_eos = lua_istable(L, 3) && kgl_field_bool(L, 3, "add_eos", false);
  kg_sentencepiece_info info = kg_sentencepiece_get_info(sp);
  if (add_bos && info.bos_id < 0) return luaL_error(L, "sentencepiece: encode: add_bos, but the model has no bos piece");
  if (add_eos && info.eos_id < 0) return luaL_error(L, "sentencepiece: encode: add_eos, but the model has no eos piece");
  int32_t *ids;
  size_t k;
  if (kg_sentencepiece_encode(sp, text, n, &ids, &k)) return kgl_error(L);
  lua_createtable(L, (int)k + 2, 0);
  lua_Integer j = 1;
  if (add_bos) lua_pushinteger(L, info.bos_id), lua_rawseti(L, -2, j++);
  for (size_t i = 0; i < k; i++) lua_pushinteger(L, ids[i]), lua_rawseti(L, -2, j++);
  if (add_eos) lua_pushinteger(L, info.eos_id), lua_rawseti(L, -2, j++);
  free(ids);
  return 1;
}

/* ids at idx (a list or a 1-D integer tensor) -> malloc'd int32 array; ids outside int32 become
 * -1 so the engine's range check names them */
static int32_t *check_ids(lua_State *L, int idx, size_t *n) {
  kg_tensor *t = kgl_test(L, idx);
  if (t) {
    if (t->ndim != 1 || kg_dtype_info[t->dtype].is_float)
      luaL_error(L, "bad argument #1 to 'decode' (a 1-D integer tensor expected, got %d-D %s)", t->ndim,
                 kg_dtype_info[t->dtype].name);
    kg_tensor *c = NULL;
    KGL_CALL(L, kg_to(&c, t, KG_I64, KG_CPU));
    kg_tensor *cc = NULL;
    kg_status s = kg_contiguous(&cc, c);
    kg_tensor_release(c);
    if (s) kgl_error(L);
    *n = (size_t)kg_numel(cc);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    if (!ids) {
      kg_tensor_release(cc);
      luaL_error(L, "sentencepiece: decode: out of memory");
    }
    const int64_t *v = kg_data(cc);
    for (size_t i = 0; i < *n; i++) ids[i] = (v[i] < INT32_MIN || v[i] > INT32_MAX) ? -1 : (int32_t)v[i];
    kg_tensor_release(cc);
    return ids;
  }
  luaL_argexpected(L, lua_istable(L, idx), idx, "list of ids or 1-D integer tensor");
  *n = (size_t)luaL_len(L, idx);
  int32_t *ids = lua_newuserdatauv(L, (*n ? *n : 1) * sizeof *ids, 0); /* freed by Lua if we raise */
  for (size_t i = 0; i < *n; i++) {
    lua_geti(L, idx, (lua_Integer)i + 1);
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok) luaL_error(L, "bad argument #1 to 'decode' (id %d is not an integer)", (int)i + 1);
    ids[i] = (v < INT32_MIN || v > INT32_MAX) ? -1 : (int32_t)v;
    lua_pop(L, 1);
  }
  int32_t *copy = malloc((*n ? *n : 1) * sizeof *ids);
  if (!copy) luaL_error(L, "sentencepiece: decode: out of memory");
  memcpy(copy, ids, *n * sizeof *ids);
  lua_pop(L, 1);
  return copy;
}

static int l_decode(lua_State *L) {
  kg_sentencepiece *sp = check_sp(L);
  size_t n;
  int32_t *ids = check_ids(L, 2, &n);
  char *text;
  size_t len;
  kg_status s = kg_sentencepiece_decode(sp, ids, n, &text, &len);
  free(ids);
  if (s) return kgl_error(L);
  lua_pushlstring(L, text, len);
  free(text);
  return 1;
}

static int l_vocab_size(lua_State *L) {
  lua_pushinteger(L, kg_sentencepiece_vocab_size(check_sp(L)));
  return 1;
}

static int l_id_to_piece(lua_State *L) {
  kg_sentencepiece *sp = check_sp(L);
  lua_Integer id = luaL_checkinteger(L, 2);
  size_t len;
  const char *p = id >= 0 && id <= INT32_MAX ? kg_sentencepiece_id_to_piece(sp, (int)id, &len) : NULL;
  if (!p)
    return luaL_error(L, "sentencepiece: id_to_piece: id %I is outside [0, %d)", (LUAI_UACINT)id,
                      kg_sentencepiece_vocab_size(sp));
  lua_pushlstring(L, p, len);
  return 1;
}

static int l_piece_to_id(lua_State *L) {
  kg_sentencepiece *sp = check_sp(L);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  lua_pushinteger(L, kg_sentencepiece_piece_to_id(sp, p, n));
  return 1;
}

static int l_tostring(lua_State *L) {
  kg_sentencepiece_info i = kg_sentencepiece_get_info(check_sp(L));
  lua_pushfstring(L, "SentencePiece(%s, vocab %d, byte_fallback %s)", i.model_type == 2 ? "bpe" : "unigram",
                  i.vocab_size, i.byte_fallback ? "on" : "off");
  return 1;
}

static const luaL_Reg methods[] = {{"encode", l_encode},           {"decode", l_decode},
                                   {"vocab_size", l_vocab_size},   {"id_to_piece", l_id_to_piece},
                                   {"piece_to_id", l_piece_to_id}, {NULL, NULL}};

/* methods first, then the id fields */
static int l_index(lua_State *L) {
  kg_sentencepiece *sp = check_sp(L);
  if (lua_type(L, 2) != LUA_TSTRING) return 0;
  const char *k = lua_tostring(L, 2);
  lua_getfield(L, lua_upvalueindex(1), k);
  if (!lua_isnil(L, -1)) return 1;
  kg_sentencepiece_info i = kg_sentencepiece_get_info(sp);
  if (!strcmp(k, "bos_id")) lua_pushinteger(L, i.bos_id);
  else if (!strcmp(k, "eos_id")) lua_pushinteger(L, i.eos_id);
  else if (!strcmp(k, "pad_id")) lua_pushinteger(L, i.pad_id);
  else if (!strcmp(k, "unk_id")) lua_pushinteger(L, i.unk_id);
  else if (!strcmp(k, "model_type")) lua_pushstring(L, i.model_type == 2 ? "bpe" : "unigram");
  else if (!strcmp(k, "byte_fallback")) lua_pushboolean(L, i.byte_fallback);
  else lua_pushnil(L);
  return 1;
}

void kgl_register_sentencepiece(lua_State *L, int methods_idx, int keng) {
  (void)methods_idx;
  if (luaL_newmetatable(L, SP_MT)) {
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
  lua_setfield(L, keng, "sentencepiece");
}
