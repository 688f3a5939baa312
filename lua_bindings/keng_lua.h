/* keng_lua.h — the binding toolkit shared by lua_bindings/<family>.c: the tensor userdata, argument
 * checks that follow LUA_API.md (1-based positions, 0-based ids), and raising engine errors.
 * Bindings are thin: check arguments, make one engine call, push or raise. */
#ifndef KENG_LUA_H
#define KENG_LUA_H

#include <keng/keng.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#define KGL_TENSOR_MT "keng.Tensor"

/* Opens the module: returns the `keng` table (used by main.c's preload and by module.c). */
int kgl_open(lua_State *L);

/* Pushes t as a userdata; takes over the caller's reference. */
void kgl_push(lua_State *L, kg_tensor *t);
/* The tensor at idx, or a Lua error naming the argument. */
kg_tensor *kgl_check(lua_State *L, int idx);
kg_tensor *kgl_test(lua_State *L, int idx); /* NULL if not a tensor */
kg_tensor *kgl_opt(lua_State *L, int idx);  /* NULL if nil/none, else must be a tensor */
/* A tensor, or a number/boolean converted to a 0-d tensor shaped after `like` (dtype rules of
 * kg_binary_scalar). Returns a new reference in *owned when one was made (release it). */
kg_tensor *kgl_to_tensor(lua_State *L, int idx, const kg_tensor *like, kg_tensor **owned);

/* Raises the engine's last error (after a failed call). */
int kgl_error(lua_State *L);
/* Runs `expr` (a kg_status expression). On out-of-memory it runs a full Lua collection,
 * empties the pools and tries once more; any failure raises the engine's message. */
#define KGL_CALL(L, expr)                                          \
  do {                                                             \
    kg_status kgl_s_ = (expr);                                     \
    if (kgl_s_ == KG_ERR_OOM) {                                    \
      kgl_collect(L);                                              \
      kgl_s_ = (expr);                                             \
    }                                                              \
    if (kgl_s_ != KG_OK) kgl_error(L);                             \
    kgl_gc_step(L);                                                \
  } while (0)
void kgl_collect(lua_State *L);
void kgl_gc_step(lua_State *L);

/* A 1-based (negative from the end) Lua dim at idx -> 0-based dim for a tensor of ndim dims. */
int kgl_dim(lua_State *L, int idx, int ndim);
/* the name of the running C function as Lua called it ("sum", "cat"), "keng" if unknown */
const char *kgl_fname(lua_State *L);
/* Refuses a non-table in the options slot idx (nil is no options) and any key not in valid (a
 * NULL-terminated list), naming the function, the key and the valid ones. kgl_field_number and
 * kgl_field_bool refuse a non-table slot too. */
/* Field key of the options table at idx as an integer in [lo, hi] (def when absent); a
 * fraction, NaN or a value out of range is refused naming the option (never a C cast). */
lua_Integer kgl_field_integer(lua_State *L, int idx, const char *key, lua_Integer def, lua_Integer lo, lua_Integer hi);
int kgl_optdim(lua_State *L, int idx, int ndim, int def0);
/* nil/none = all dims; a number; or a list of numbers -> bit mask of 0-based dims. */
uint32_t kgl_dims_mask(lua_State *L, int idx, int ndim);
/* A shape: a table {2, 3} at idx, or numbers from idx to the top. Returns ndim. */
int kgl_shape(lua_State *L, int idx, int64_t *shape);
/* Options table {dtype=, device=, requires_grad=} at idx (may be nil). */
typedef struct {
  kg_dtype dtype;
  kg_device device;
  bool requires_grad;
  bool has_dtype;
} kgl_opts;
kgl_opts kgl_options(lua_State *L, int idx, kg_dtype def_dtype);
kg_dtype kgl_dtype(lua_State *L, int idx);
kg_device kgl_device(lua_State *L, int idx);
/* Field `key` of the table at idx, as number / boolean, or def when absent. */
double kgl_field_number(lua_State *L, int idx, const char *key, double def);
bool kgl_field_bool(lua_State *L, int idx, const char *key, bool def);
/* The options table at idx (none or nil passes; anything else but a table is an error) holds
 * only keys of `valid` (NULL-terminated), else an error at the caller's line naming the key and
 * the valid ones, as keng.options.check does in Lua; `who` names the caller in the message (NULL:
 * the running binding's name). */
void kgl_check_options(lua_State *L, int idx, const char *who, const char *const *valid);

/* Registration: each family file adds tensor methods (into the table at methods) and module
 * functions (into the table at keng). Defined in lua_bindings/<family>.c. */
#define KGL_FAMILIES(X) \
  X(core) X(elementwise) X(reduce) X(index) X(norm) X(conv) X(random) X(attention) X(loss) X(io) X(optim) X(image) X(wordpiece) X(sentencepiece) X(tokenizer_json) X(clip) X(debug) X(backends) \
  X(distributed) X(decode) X(quant) X(runtime)
#define X(f) void kgl_register_##f(lua_State *L, int methods, int keng);
KGL_FAMILIES(X)
#undef X

/* Sets fn as both t:name(...) and keng.name(...). */
void kgl_set(lua_State *L, int methods, int keng, const char *name, lua_CFunction fn);

#endif
