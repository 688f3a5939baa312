/* error.c — the thread-local error message and the interrupt flag. */
#include <keng/keng.h>

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];
static volatile sig_atomic_t interrupt_flag;

const char *kg_last_error(void) { return last_error[0] ? last_error : "unknown error"; }

kg_status kg_error(kg_status code, const char *op, const char *fmt, ...) {
  int n = snprintf(last_error, sizeof last_error, "%s: ", op ? op : "keng");
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < sizeof last_error) vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
  va_end(ap);
  return code;
}

char *kg_shape_str(char *buf, int ndim, const int64_t *shape) {
  char *p = buf;
  *p++ = '[';
  for (int i = 0; i < ndim; i++) p += sprintf(p, i ? ",%lld" : "%lld", (long long)shape[i]);
  *p++ = ']';
  *p = 0;
  return buf;
}

void kg_interrupt(void) { interrupt_flag = 1; }
bool kg_interrupt_pending(void) { return interrupt_flag != 0; }

bool kg_interrupted(void) {
  if (!interrupt_flag) return false;
  interrupt_flag = 0;
  return true;
}
