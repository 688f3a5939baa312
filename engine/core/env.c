/* env.c — the registry of KENG_* environment variables (env.def, docs/environment.md): read
 * once, on first use, parsed by type; `keng --env` prints it. A KENG_* variable that is not in
 * the table, or a value that does not parse, gets a warning on stderr naming it: a misspelt
 * KENG_THREDS must not be silently ignored. A warning rather than an error, because the
 * environment is shared with other programs and other keng builds (an older binary, a script's
 * own KENG_ variable); refusing to start would break runs over a variable keng never reads. */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern char **environ;

const kg_env_facts kg_env_info[KG_ENV_COUNT] = {
#define KG_ENV(name, type, def, scope, doc) [KG_ENV_##name] = {#name, #type, def, #scope, doc},
#include "env.def"
#undef KG_ENV
};

typedef struct {
  bool set; /* present and non-empty */
  bool b;
  long long i;
  double f;
  char *s; /* owned copy of the value, or NULL */
} env_value;

static env_value vals[KG_ENV_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int ready; /* set once init has run: the accessors' fast path is one load */

/* parses text as the variable's type into v; false when it does not parse */
static bool parse(const kg_env_facts *e, const char *text, env_value *v) {
  char *end;
  if (!strcmp(e->type, "BOOL")) { /* KENG_NO_SIMD=false must not switch SIMD off */
    static const char *const on[] = {"1", "true", "on", "yes"}, *const off[] = {"0", "false", "off", "no"};
    for (int k = 0; k < 4; k++) {
      if (!strcasecmp(text, on[k])) return v->b = true;
      if (!strcasecmp(text, off[k])) return !(v->b = false);
    }
    return false;
  }
  if (!strcmp(e->type, "INT")) {
    v->i = strtoll(text, &end, 10);
    return end != text && *end == 0;
  }
  if (!strcmp(e->type, "FLOAT")) {
    v->f = strtod(text, &end);
    return end != text && *end == 0;
  }
  return true; /* STR */
}

static void read_all(void) {
  for (int k = 0; k < KG_ENV_COUNT; k++) {
    const kg_env_facts *e = &kg_env_info[k];
    env_value *v = &vals[k];
    free(v->s);
    *v = (env_value){0};
    parse(e, e->def, v); /* the default (an empty INT default reads as 0, with set false) */
    v->s = strdup(e->def);
    const char *text = getenv(e->name);
    if (!text || !*text) continue;
    env_value got = *v;
    if (!parse(e, text, &got)) {
      const char *what = !strcmp(e->type, "INT") ? "an integer" : !strcmp(e->type, "BOOL") ? "0 or 1" : "a number";
      fprintf(stderr, "keng: warning: %s=%s is not %s; using the default %s (keng --env lists the variables)\n",
              e->name, text, what, *e->def ? e->def : "(none)");
      continue;
    }
    free(v->s);
    *v = got;
    v->s = strdup(text);
    v->set = true;
  }
}

/* edit distance of two short names (for "did you mean") */
static int distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b), row[64];
  if (la >= 64 || lb >= 64) return 99;
  for (int j = 0; j <= lb; j++) row[j] = j;
  for (int i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = i;
    for (int j = 1; j <= lb; j++) {
      int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

static void warn_unknown(void) {
  for (char **p = environ; p && *p; p++) {
    if (strncmp(*p, "KENG_", 5)) continue;
    const char *eq = strchr(*p, '=');
    size_t n = eq ? (size_t)(eq - *p) : strlen(*p);
    char name[64];
    if (n >= sizeof name) n = sizeof name - 1;
    memcpy(name, *p, n);
    name[n] = 0;
    int best = -1, bd = 99;
    for (int k = 0; k < KG_ENV_COUNT; k++) {
      if (!strcmp(name, kg_env_info[k].name)) {
        best = -2;
        break;
      }
      int d = distance(name, kg_env_info[k].name);
      if (d < bd) bd = d, best = k;
    }
    if (best == -2) continue;
    if (best >= 0 && bd <= 5)
      fprintf(stderr, "keng: warning: unknown environment variable %s (did you mean %s?); keng --env lists them\n",
              name, kg_env_info[best].name);
    else
      fprintf(stderr, "keng: warning: unknown environment variable %s; keng --env lists them\n", name);
  }
}

static void init(void) {
  read_all();
  warn_unknown();
  __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
}

static inline void ensure(void) {
  if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) pthread_once(&once, init);
}

void kg_env_init(void) { ensure(); }

void kg_env_reload(void) {
  ensure();
  read_all();
}

bool kg_env_is_set(kg_env_id id) {
  ensure();
  return vals[id].set;
}
bool kg_env_bool(kg_env_id id) {
  ensure();
  return vals[id].b;
}
long long kg_env_int(kg_env_id id) {
  ensure();
  return vals[id].i;
}
double kg_env_float(kg_env_id id) {
  ensure();
  return vals[id].f;
}
const char *kg_env_str(kg_env_id id) {
  ensure();
  return vals[id].s ? vals[id].s : "";
}

void kg_env_print(void) {
  ensure();
  printf("%-25s %-5s %-6s %-7s %-9s %s\n", "variable", "type", "scope", "default", "value", "meaning");
  for (int k = 0; k < KG_ENV_COUNT; k++) {
    const kg_env_facts *e = &kg_env_info[k];
    printf("%-25s %-5s %-6s %-7s %-9s %s\n", e->name, e->type, e->scope, *e->def ? e->def : "-",
           vals[k].set ? vals[k].s : "-", e->doc);
  }
  printf("value -: unset (the default holds). LAB: kernel-lab switches, not for production runs; TEST: test\n"
         "harness knobs; SCRIPT: read by scripts/. docs/environment.md has the details.\n");
}
