/* matmul.c — bindings of engine/ops/matmul.c: keng.matmul(a, b) (also a:matmul(b)) and
 * keng.linear(x, w, b). */
#include "keng_lua.h"

static int l_matmul(lua_State *L) {
  kg_tensor *a = kgl_check(L, 1), *b = kgl_check(L, 2), *r;
  KGL_CALL(L, kg_matmul(&r, a, b));
  kgl_push(L, r);
  return 1;
}

static int l_linear(lua_State *L) {
  kg_tensor *x = kgl_check(L, 1), *w = kgl_check(L, 2), *b = kgl_opt(L, 3), *r;
  KGL_CALL(L, kg_linear(&r, x, w, b));
  kgl_push(L, r);
  return 1;
}

void kgl_register_matmul(lua_State *L, int methods, int keng) {
  kgl_set(L, methods, keng, "matmul", l_matmul);
  kgl_set(L, 0, keng, "linear", l_linear);
}
