/* tokenizer_util.h — what the bindings of the WordPiece and CLIP tokenizers (wordpiece.c,
 * clip.c) share: pushing encoded ids, reading ids to decode, and the nil-or-value lookups. */
#ifndef KENG_LUA_TOKENIZER_UTIL_H
#define KENG_LUA_TOKENIZER_UTIL_H

#include "keng_lua.h"

/* Pushes ids[0..n) as a Lua list and frees ids; returns 1 (the values pushed). */
int kgl_push_ids(lua_State *L, int32_t *ids, int64_t n);
/* The ids at idx (a list, or a tensor read through its tolist, which replaces it on the stack)
 * as an int64 array owned by Lua (a userdata pushed on the stack, so nothing leaks on an error);
 * *n is their count. who prefixes the message on a non-integer element ("wordpiece: decode"). */
int64_t *kgl_check_ids(lua_State *L, int idx, const char *who, lua_Integer *n);
/* Pushes id, or nil when it is negative (unknown); returns 1. */
int kgl_push_id_or_nil(lua_State *L, int64_t id);
/* Pushes s[0..n), or nil when s is NULL; returns 1. */
int kgl_push_lstring_or_nil(lua_State *L, const char *s, size_t n);

#endif
