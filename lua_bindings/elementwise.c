/* elementwise.c — bindings of unary and binary ops (registered from the op table), clamp,
 * where, gelu's approximate option, softplus's beta and threshold, and in-place arithmetic. */
#include "keng_lua.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int l_unary(lua_State *L) {
  kg_op op = (kg_op)lua_tointeger(L, lua_upvalueindex(1));
  kg_tensor *x = kgl_check(L, 1), *r;
  /* nothing is silently ignored: t:softplus{beta = 2} must not compute beta = 1 (the operand
   * itself comes again as the second argument of __unm) */
  if (!lua_isnoneornil(L, 2) && lua_touserdata(L, 2) != lua_touserdata(L, 1))
    return luaL_error(L, "%s: takes no arguments (got a %s)", kg_op_info[op].name, luaL_typename(L, 2));
  KGL_CALL(L, kg_unary(&r, op, x));
  kgl_push(L, r);
  return 1;
}

/* a <op> b where either side may be a number (so `2 * t` works through __mul) */
static int l_binary(lua_State *L) {
  kg_op op = (kg_op)lua_tointeger(L, lua_upvalueindex(1));
  kg_tensor *a = kgl_test(L, 1), *b = kgl_test(L, 2), *r;
  if (a && b) KGL_CALL(L, kg_binary(&r, op, a, b));
  else if (a || b) {
    int num = a ? 2 : 1;
    if (lua_isboolean(L, num)) { /* a boolean is a bool scalar: mask + true is logical or */
      kg_tensor *t = a ? a : b, *s;
      KGL_CALL(L, kg_scalar(&s, lua_toboolean(L, num), KG_BOOL, t->device));
      kg_status st = a ? kg_binary(&r, op, a, s) : kg_binary(&r, op, s, b);
      kg_tensor_release(s);
      if (st) return kgl_error(L);
    } else {
      if (!lua_isnumber(L, num)) luaL_typeerror(L, num, "tensor or number");
      KGL_CALL(L, kg_binary_scalar(&r, op, a ? a : b, lua_tonumber(L, num), !a));
    }
  } else {
    return luaL_typeerror(L, 1, "tensor");
  }
  kgl_push(L, r);
  return 1;
}

/* t:add_(u) etc. */
static int l_binary_(lua_State *L) {
  kg_op op = (kg_op)lua_tointeger(L, lua_upvalueindex(1));
  kg_tensor *a = kgl_check(L, 1), *owned;
  kg_tensor *b = kgl_to_tensor(L, 2, a, &owned);
  kg_status s = kg_binary_(op, a, b);
  kg_tensor_release(owned);
  if (s) return kgl_error(L);
  lua_settop(L, 1);
  return 1;
}

/* t:gelu() exact, t:gelu{approximate="tanh"} */
static int l_gelu(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  kg_op op = KG_OP_GELU;
  if (lua_istable(L, 2)) {
    lua_getfield(L, 2, "approximate");
    const char *a = luaL_optstring(L, -1, "none");
    if (!strcmp(a, "tanh")) op = KG_OP_GELU_TANH;
    else if (strcmp(a, "none")) luaL_error(L, "gelu: approximate must be \"none\" or \"tanh\", got \"%s\"", a);
  } else if (lua_isstring(L, 2)) {
    const char *a = lua_tostring(L, 2);
    if (!strcmp(a, "tanh")) op = KG_OP_GELU_TANH;
    else if (strcmp(a, "none")) luaL_error(L, "gelu: approximate must be \"none\" or \"tanh\", got \"%s\"", a);
  }
  KGL_CALL(L, kg_unary(&r, op, x));
  kgl_push(L, r);
  return 1;
}

/* t:softplus() as the SOFTPLUS row, t:softplus{beta = 1, threshold = 20} as PyTorch's nn.Softplus */
static int l_softplus(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  kgl_check_options(L, 2, "softplus", (const char *const[]){"beta", "threshold", NULL});
  double beta = kgl_field_number(L, 2, "beta", 1), threshold = kgl_field_number(L, 2, "threshold", 20);
  KGL_CALL(L, kg_softplus(&r, x, beta, threshold));
  kgl_push(L, r);
  return 1;
}

static int l_clamp(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *r;
  double lo, hi;
  if (lua_istable(L, 2)) { /* t:clamp{min=, max=} */
    kgl_check_options(L, 2, "clamp", (const char *const[]){"min", "max", NULL});
    lo = kgl_field_number(L, 2, "min", -HUGE_VAL);
    hi = kgl_field_number(L, 2, "max", HUGE_VAL);
  } else { /* nil: no bound; a NaN bound makes the result NaN, as in PyTorch */
    lo = lua_isnoneornil(L, 2) ? -HUGE_VAL : luaL_checknumber(L, 2);
    hi = lua_isnoneornil(L, 3) ? HUGE_VAL : luaL_checknumber(L, 3);
  }
  KGL_CALL(L, kg_clamp(&r, x, lo, hi));
  kgl_push(L, r);
  return 1;
}

static int l_where(lua_State *L) {
  kg_tensor *c = kgl_check(L, 1), *oa, *ob, *r;
  kg_tensor *a = kgl_test(L, 2), *b = kgl_test(L, 3);
  const kg_tensor *like = a ? a : b;
  a = kgl_to_tensor(L, 2, like, &oa);
  b = kgl_to_tensor(L, 3, like ? like : a, &ob);
  kg_status s = kg_where(&r, c, a, b);
  kg_tensor_release(oa);
  kg_tensor_release(ob);
  if (s) return kgl_error(L);
  kgl_push(L, r);
  return 1;
}

void kgl_register_elementwise(lua_State *L, int methods, int keng) {
  for (int op = 0; op < KG_OP_COUNT; op++) {
    kg_op_kind k = kg_op_info[op].kind;
    if (k != KG_KIND_UNARY && k != KG_KIND_BINARY) continue;
    for (int where = 0; where < 2; where++) {
      lua_pushinteger(L, op);
      lua_pushcclosure(L, k == KG_KIND_UNARY ? l_unary : l_binary, 1);
      lua_setfield(L, where ? keng : methods, kg_op_info[op].name);
    }
    if (kg_op_info[op].flags & KG_OPF_INPLACE) { /* arithmetic gets an in-place form */
      char name[32];
      snprintf(name, sizeof name, "%s_", kg_op_info[op].name);
      lua_pushinteger(L, op);
      lua_pushcclosure(L, l_binary_, 1);
      lua_setfield(L, methods, name);
    }
  }
  kgl_set(L, methods, keng, "gelu", l_gelu);
  kgl_set(L, methods, keng, "clamp", l_clamp);
  kgl_set(L, methods, keng, "where", l_where);
  kgl_set(L, methods, keng, "softplus", l_softplus);
}
