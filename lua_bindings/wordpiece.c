/* wordpiece.c — binding of the BERT WordPiece tokenizer (engine/io/wordpiece.c):
 *   local tok = keng.wordpiece("vocab.txt", {lowercase=false, strip_accents=nil,
 *                              tokenize_chinese_chars=true, max_chars_per_word=100, unk_token="[UNK]",
 *                              split_special_tokens=false})
 *   tok:encode(text) -> {ids} (0-based, no special tokens)   tok:decode(ids) -> text
 *   tok:vocab_size()   tok:token_to_id(s) -> id or nil   tok:id_to_token(id) -> s or nil */
#include "tokenizer_util.h"

#include <keng/wordpiece.h>

#include <stdint.h>
#include <stdlib.h>

#define WP_MT "keng.WordPiece"

static kg_wordpiece *check_wp(lua_State *L) {
  kg_wordpiece **p = luaL_checkudata(L, 1, WP_MT);
  if (!*p) luaL_error(L, "wordpiece: the tokenizer was freed");
  return *p;
}

static int l_gc(lua_State *L) {
  kg_wordpiece **p = luaL_checkudata(L, 1, WP_MT);
  kg_wordpiece_free(*p);
  *p = NULL;
  return 0;
}

static int l_new(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  kg_wordpiece_opts o = {0};
  o.strip_accents = -1;
  /* max_length is tokenizers.bert's (it passes its options through); the binding ignores it */
  static const char *const valid[] = {"lowercase", "strip_accents", "tokenize_chinese_chars", "max_chars_per_word",
                                      "unk_token", "split_special_tokens", "max_length", NULL};
  kgl_check_options(L, 2, "wordpiece", valid);
  if (!lua_isnoneornil(L, 2)) {
    o.lowercase = kgl_field_bool(L, 2, "lowercase", false);
    lua_getfield(L, 2, "strip_accents");
    if (!lua_isnil(L, -1)) o.strip_accents = lua_toboolean(L, -1);
    lua_pop(L, 1);
    o.no_chinese_split = !kgl_field_bool(L, 2, "tokenize_chinese_chars", true);
    o.max_chars_per_word = (int)kgl_field_integer(L, 2, "max_chars_per_word", 100, 1, INT32_MAX);
    o.split_special_tokens = kgl_field_bool(L, 2, "split_special_tokens", false);
    lua_getfield(L, 2, "unk_token");
    if (!lua_isnil(L, -1)) o.unk_token = luaL_checkstring(L, -1); /* stays on the stack while loading */
  }
  kg_wordpiece **p = lua_newuserdatauv(L, sizeof *p, 0);
  *p = NULL;
  luaL_setmetatable(L, WP_MT);
  if (kg_wordpiece_load(p, path, &o) != KG_OK) return kgl_error(L);
  return 1;
}

static int l_encode(lua_State *L) {
  kg_wordpiece *wp = check_wp(L);
  size_t len;
  const char *text = luaL_checklstring(L, 2, &len);
  int32_t *ids;
  int64_t n;
  if (kg_wordpiece_encode(wp, text, len, &ids, &n) != KG_OK) return kgl_error(L);
  return kgl_push_ids(L, ids, n);
}

static int l_decode(lua_State *L) {
  kg_wordpiece *wp = check_wp(L);
  lua_Integer n;
  int64_t *ids = kgl_check_ids(L, 2, "wordpiece: decode", &n);
  char *s;
  size_t len;
  if (kg_wordpiece_decode(wp, ids, n, &s, &len) != KG_OK) return kgl_error(L);
  lua_pushlstring(L, s, len);
  free(s);
  return 1;
}

static int l_vocab_size(lua_State *L) {
  lua_pushinteger(L, kg_wordpiece_vocab_size(check_wp(L)));
  return 1;
}

static int l_token_to_id(lua_State *L) {
  kg_wordpiece *wp = check_wp(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  return kgl_push_id_or_nil(L, kg_wordpiece_token_to_id(wp, s, n));
}

static int l_id_to_token(lua_State *L) {
  kg_wordpiece *wp = check_wp(L);
  size_t n;
  const char *s = kg_wordpiece_id_to_token(wp, luaL_checkinteger(L, 2), &n);
  return kgl_push_lstring_or_nil(L, s, n);
}

static int l_tostring(lua_State *L) {
  lua_pushfstring(L, "WordPiece(%d tokens)", (int)kg_wordpiece_vocab_size(check_wp(L)));
  return 1;
}

void kgl_register_wordpiece(lua_State *L, int methods, int keng) {
  (void)methods;
  static const luaL_Reg m[] = {{"encode", l_encode},           {"decode", l_decode},
                               {"vocab_size", l_vocab_size},   {"token_to_id", l_token_to_id},
                               {"id_to_token", l_id_to_token}, {NULL, NULL}};
  luaL_newmetatable(L, WP_MT);
  lua_pushcfunction(L, l_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_tostring);
  lua_setfield(L, -2, "__tostring");
  luaL_newlib(L, m);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  lua_pushcfunction(L, l_new);
  lua_setfield(L, keng, "wordpiece");
}
