/* io.c — bindings of the checkpoint functions (docs/lua_api.md, docs/checkpoints.md):
 *   keng.save(path, {name = tensor, ...}, metadata)   metadata: optional {string = string}
 *   keng.load(path) -> {name = tensor, ...}, metadata  path: a .safetensors file, an
 *                                                       index.json, or a directory
 * The engine does the work (engine/io/safetensors.c). A kg_tensor_dict lives in a userdata box
 * whose __gc frees it, so a Lua error raised halfway leaks nothing. */
#include "keng_lua.h"

#include <stdlib.h>
#include <string.h>

#define DICT_MT "keng.io.dict"

static int dict_gc(lua_State *L) {
  kg_tensor_dict *d = luaL_checkudata(L, 1, DICT_MT);
  kg_tensor_dict_free(d);
  return 0;
}

/* pushes an empty dict box */
static kg_tensor_dict *new_dict(lua_State *L) {
  kg_tensor_dict *d = lua_newuserdatauv(L, sizeof *d, 0);
  memset(d, 0, sizeof *d);
  luaL_setmetatable(L, DICT_MT);
  return d;
}

/* a string key without inner NULs, or an argument error */
static const char *check_key(lua_State *L, int arg, const char *what) {
  if (lua_type(L, -2) != LUA_TSTRING)
    luaL_error(L, "bad argument #%d to 'save' (%s names must be strings, got a %s key)", arg, what,
               luaL_typename(L, -2));
  size_t n;
  const char *k = lua_tolstring(L, -2, &n);
  if (strlen(k) != n) luaL_error(L, "bad argument #%d to 'save' (%s name contains a NUL byte)", arg, what);
  return k;
}

/* an argument beyond the documented ones (an options table keng.save/load do not take) is an
 * error, not silently dropped */
static void no_more_args(lua_State *L, int first, const char *fn, const char *usage) {
  if (lua_gettop(L) >= first && !lua_isnil(L, first))
    luaL_error(L, "%s takes %s; got a %s as argument %d (there are no options)", fn, usage, luaL_typename(L, first), first);
}

static int l_save(lua_State *L) {
  no_more_args(L, 4, "keng.save", "(path, tensors, metadata)");
  const char *path = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
  lua_settop(L, 3);
  kg_tensor_dict *d = new_dict(L); /* index 4 */
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    const char *name = check_key(L, 2, "tensor");
    kg_tensor *t = kgl_test(L, -1);
    if (!t) luaL_error(L, "bad argument #2 to 'save' (tensor expected for '%s', got %s)", name, luaL_typename(L, -1));
    if (kg_tensor_dict_add(d, name, t)) return kgl_error(L);
    lua_pop(L, 1);
  }
  if (lua_istable(L, 3)) {
    lua_pushnil(L);
    while (lua_next(L, 3)) {
      const char *key = check_key(L, 3, "metadata");
      int ty = lua_type(L, -1);
      if (ty != LUA_TSTRING && ty != LUA_TNUMBER)
        luaL_error(L, "bad argument #3 to 'save' (metadata values must be strings; '%s' holds a %s)", key,
                   luaL_typename(L, -1));
      lua_pushvalue(L, -1); /* convert a number on a copy: lua_tolstring must not touch the key lua_next reads */
      size_t n;
      const char *value = lua_tolstring(L, -1, &n);
      if (strlen(value) != n) luaL_error(L, "bad argument #3 to 'save' (metadata '%s' contains a NUL byte)", key);
      if (kg_tensor_dict_add_meta(d, key, value)) return kgl_error(L);
      lua_pop(L, 2);
    }
  }
  kg_status s = kg_safetensors_save(path, d);
  if (s == KG_ERR_OOM) {
    kgl_collect(L);
    s = kg_safetensors_save(path, d);
  }
  if (s) return kgl_error(L);
  return 0;
}

static int l_load(lua_State *L) {
  no_more_args(L, 2, "keng.load", "a path only");
  const char *path = luaL_checkstring(L, 1);
  kg_tensor_dict *d = new_dict(L);
  if (kg_safetensors_load(d, path)) return kgl_error(L);
  lua_createtable(L, 0, d->n);
  for (int i = 0; i < d->n; i++) {
    kgl_push(L, d->tensors[i]); /* the userdata takes the dict's reference */
    d->tensors[i] = NULL;
    lua_setfield(L, -2, d->names[i]);
  }
  lua_createtable(L, 0, d->nmeta);
  for (int i = 0; i < d->nmeta; i++) {
    lua_pushstring(L, d->meta_values[i]);
    lua_setfield(L, -2, d->meta_keys[i]);
  }
  kg_tensor_dict_free(d);
  kgl_gc_step(L);
  return 2;
}

/* keng.path_escapes(dir, path) -> nil when path (symlinks followed) stays inside the model
 * directory dir (kg_path_escapes), else the path it resolves to and the directory it had to stay in */
static int l_path_escapes(lua_State *L) {
  no_more_args(L, 3, "keng.path_escapes", "a directory and a path");
  const char *dir = luaL_checkstring(L, 1), *path = luaL_checkstring(L, 2);
  char *real, *root;
  if (!kg_path_escapes(dir, path, &real, &root)) return lua_pushnil(L), 1;
  lua_pushstring(L, real);
  lua_pushstring(L, root);
  free(real);
  free(root);
  return 2;
}

void kgl_register_io(lua_State *L, int methods, int keng) {
  (void)methods;
  luaL_newmetatable(L, DICT_MT);
  lua_pushcfunction(L, dict_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lua_pushcfunction(L, l_save);
  lua_setfield(L, keng, "save");
  lua_pushcfunction(L, l_load);
  lua_setfield(L, keng, "load");
  lua_pushcfunction(L, l_path_escapes);
  lua_setfield(L, keng, "path_escapes");
}
