/* optim.c — bindings of the fused optimizer updates (used by scripts/lib/keng/optim.lua):
 *   keng._sgd_step_(p, g, buf, {lr=, momentum=0, dampening=0, nesterov=false, weight_decay=0,
 *                               decoupled=false, step=1})            buf may be nil when momentum is 0
 *   keng._adam_step_(p, g, m, v, {lr=, beta1=0.9, beta2=0.999, eps=1e-7, weight_decay=0,
 *                                 decoupled=false, step=})
 * Both also take lr_t=, step_t=: one-element f64 tensors on p's device holding lr and step, read
 * when the update runs instead of lr and step (keng.optim passes them on cuda so that a CUDA
 * Graph replay of the step uses the values it writes there before each launch).
 * p, g, buf, m, v: one shape [*]. Both update in place and return p. They run with grad mode off
 * (an optimizer step is never part of the tape), so p may require grad. */
#include "keng_lua.h"

#include <math.h>

/* Field key of the options table at idx as a number; def when absent (required when def is NAN). */
static double opt_number(lua_State *L, int idx, const char *fn, const char *key, double def) {
  lua_getfield(L, idx, key);
  int t = lua_type(L, -1);
  if (t == LUA_TNIL && def == def) {
    lua_pop(L, 1);
    return def;
  }
  if (t != LUA_TNUMBER) luaL_error(L, "%s: option '%s' must be a number, got %s", fn, key, lua_typename(L, t));
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static int64_t opt_step(lua_State *L, int idx, const char *fn, int64_t def) {
  double s = opt_number(L, idx, fn, "step", def > 0 ? (double)def : NAN);
  if (s != (double)(int64_t)s) luaL_error(L, "%s: option 'step' must be an integer, got %g", fn, s);
  return (int64_t)s;
}

/* the optional device scalars lr_t / step_t (see kg_sgd_params); the table keeps them alive */
static const kg_tensor *opt_tensor(lua_State *L, int idx, const char *fn, const char *key) {
  lua_getfield(L, idx, key);
  kg_tensor *t = NULL;
  if (!lua_isnil(L, -1) && !(t = kgl_test(L, -1)))
    luaL_error(L, "%s: option '%s' must be a tensor, got %s", fn, key, luaL_typename(L, -1));
  lua_pop(L, 1);
  return t;
}

static kg_status sgd_no_grad(kg_tensor *p, const kg_tensor *g, kg_tensor *buf, const kg_sgd_params *q) {
  bool old = kg_set_grad_enabled(false);
  kg_status s = kg_sgd_step_(p, g, buf, q);
  kg_set_grad_enabled(old);
  return s;
}

static kg_status adam_no_grad(kg_tensor *p, const kg_tensor *g, kg_tensor *m, kg_tensor *v, const kg_adam_params *q) {
  bool old = kg_set_grad_enabled(false);
  kg_status s = kg_adam_step_(p, g, m, v, q);
  kg_set_grad_enabled(old);
  return s;
}

static int l_sgd_step_(lua_State *L) {
  const char *fn = "_sgd_step_";
  kg_tensor *p = kgl_check(L, 1), *g = kgl_check(L, 2), *buf = kgl_opt(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  kg_sgd_params q = {0};
  q.lr = opt_number(L, 4, fn, "lr", NAN);
  q.momentum = opt_number(L, 4, fn, "momentum", 0);
  q.dampening = opt_number(L, 4, fn, "dampening", 0);
  q.weight_decay = opt_number(L, 4, fn, "weight_decay", 0);
  q.step = opt_step(L, 4, fn, 1);
  q.nesterov = kgl_field_bool(L, 4, "nesterov", false);
  q.decoupled = kgl_field_bool(L, 4, "decoupled", false);
  q.lr_t = opt_tensor(L, 4, fn, "lr_t"), q.step_t = opt_tensor(L, 4, fn, "step_t");
  KGL_CALL(L, sgd_no_grad(p, g, buf, &q));
  lua_settop(L, 1);
  return 1;
}

static int l_adam_step_(lua_State *L) {
  const char *fn = "_adam_step_";
  kg_tensor *p = kgl_check(L, 1), *g = kgl_check(L, 2), *m = kgl_check(L, 3), *v = kgl_check(L, 4);
  luaL_checktype(L, 5, LUA_TTABLE);
  kg_adam_params q = {0};
  q.lr = opt_number(L, 5, fn, "lr", NAN);
  q.beta1 = opt_number(L, 5, fn, "beta1", 0.9);
  q.beta2 = opt_number(L, 5, fn, "beta2", 0.999);
  q.eps = opt_number(L, 5, fn, "eps", 1e-7);
  q.weight_decay = opt_number(L, 5, fn, "weight_decay", 0);
  q.step = opt_step(L, 5, fn, 0);
  q.decoupled = kgl_field_bool(L, 5, "decoupled", false);
  q.lr_t = opt_tensor(L, 5, fn, "lr_t"), q.step_t = opt_tensor(L, 5, fn, "step_t");
  KGL_CALL(L, adam_no_grad(p, g, m, v, &q));
  lua_settop(L, 1);
  return 1;
}

void kgl_register_optim(lua_State *L, int methods, int keng) {
  kgl_set(L, 0, keng, "_sgd_step_", l_sgd_step_);
  kgl_set(L, 0, keng, "_adam_step_", l_adam_step_);
}
