/* clip.c — binding of the CLIP byte-level BPE tokenizer (engine/io/clip_bpe.c):
 *   local tok = keng.clip_tokenizer("vocab.json", "merges.txt")
 *   tok:encode(text) -> {ids} (0-based, no special tokens)   tok:decode(ids) -> text
 *   tok:vocab_size()   tok:token_to_id(s) -> id or nil   tok:id_to_token(id) -> s or nil
 *   tok.bos_id (<|startoftext|>)   tok.eos_id (<|endoftext|>) */
#include "tokenizer_util.h"

#include <keng/clip_bpe.h>

#include <stdlib.h>
#include <string.h>

#define CLIP_MT "keng.ClipTokenizer"

static kg_clip_bpe *check_tok(lua_State *L) {
  kg_clip_bpe **p = luaL_checkudata(L, 1, CLIP_MT);
  if (!*p) luaL_error(L, "clip_tokenizer: the tokenizer was freed");
  return *p;
}

static int l_gc(lua_State *L) {
  kg_clip_bpe **p = luaL_checkudata(L, 1, CLIP_MT);
  kg_clip_bpe_free(*p);
  *p = NULL;
  return 0;
}

static int l_new(lua_State *L) {
  const char *vocab = luaL_checkstring(L, 1);
  const char *merges = luaL_checkstring(L, 2);
  kg_clip_bpe **p = lua_newuserdatauv(L, sizeof *p, 0);
  *p = NULL;
  luaL_setmetatable(L, CLIP_MT);
  if (kg_clip_bpe_load(p, vocab, merges) != KG_OK) return kgl_error(L);
  return 1;
}

static int l_encode(lua_State *L) {
  kg_clip_bpe *t = check_tok(L);
  size_t len;
  const char *text = luaL_checklstring(L, 2, &len);
  int32_t *ids;
  int64_t n;
  if (kg_clip_bpe_encode(t, text, len, &ids, &n) != KG_OK) return kgl_error(L);
  return kgl_push_ids(L, ids, n);
}

static int l_decode(lua_State *L) {
  kg_clip_bpe *t = check_tok(L);
  lua_Integer n;
  int64_t *ids = kgl_check_ids(L, 2, "clip_tokenizer: decode", &n);
  char *s;
  size_t len;
  if (kg_clip_bpe_decode(t, ids, n, &s, &len) != KG_OK) return kgl_error(L);
  lua_pushlstring(L, s, len);
  free(s);
  return 1;
}

static int l_vocab_size(lua_State *L) {
  lua_pushinteger(L, kg_clip_bpe_vocab_size(check_tok(L)));
  return 1;
}

static int l_token_to_id(lua_State *L) {
  kg_clip_bpe *t = check_tok(L);
  size_t n;
  const char *s = luaL_checklstring(L, 2, &n);
  return kgl_push_id_or_nil(L, kg_clip_bpe_token_to_id(t, s, n));
}

static int l_id_to_token(lua_State *L) {
  kg_clip_bpe *t = check_tok(L);
  size_t n;
  const char *s = kg_clip_bpe_id_to_token(t, luaL_checkinteger(L, 2), &n);
  return kgl_push_lstring_or_nil(L, s, n);
}

/* tok.bos_id / tok.eos_id, else the methods */
static int l_index(lua_State *L) {
  kg_clip_bpe *t = check_tok(L);
  const char *k = lua_tostring(L, 2);
  if (k && strcmp(k, "bos_id") == 0)
    lua_pushinteger(L, kg_clip_bpe_bos_id(t));
  else if (k && strcmp(k, "eos_id") == 0)
    lua_pushinteger(L, kg_clip_bpe_eos_id(t));
  else {
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
  }
  return 1;
}

static int l_tostring(lua_State *L) {
  lua_pushfstring(L, "ClipTokenizer(%d tokens)", (int)kg_clip_bpe_vocab_size(check_tok(L)));
  return 1;
}

void kgl_register_clip(lua_State *L, int methods, int keng) {
  (void)methods;
  static const luaL_Reg m[] = {{"encode", l_encode},           {"decode", l_decode},
                               {"vocab_size", l_vocab_size},   {"token_to_id", l_token_to_id},
                               {"id_to_token", l_id_to_token}, {NULL, NULL}};
  luaL_newmetatable(L, CLIP_MT);
  lua_pushcfunction(L, l_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_tostring);
  lua_setfield(L, -2, "__tostring");
  luaL_newlib(L, m);
  lua_pushcclosure(L, l_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  lua_pushcfunction(L, l_new);
  lua_setfield(L, keng, "clip_tokenizer");
}
