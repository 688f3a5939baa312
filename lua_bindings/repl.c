/* repl.c — the interactive loop: a line is tried as `return <line>` first so expressions
 * print; a trailing `;` suppresses printing; incomplete chunks continue on the next line.
 * GNU readline (history, completion) on a terminal; plain lines when stdin is a pipe. */
#include "keng_lua.h"

#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static lua_State *repl_L;

/* Ctrl-C: stop the running Lua code at its next hook, and any long engine op at its next check */
static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}
static void on_sigint(int sig) {
  (void)sig;
  kg_interrupt();
  if (repl_L) lua_sethook(repl_L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

static char *read_line(const char *prompt, bool tty) {
  if (tty) return readline(prompt);
  static char buf[1 << 16];
  if (!fgets(buf, sizeof buf, stdin)) return NULL;
  size_t n = strlen(buf);
  if (n && buf[n - 1] == '\n') buf[n - 1] = 0;
  return strdup(buf);
}

static bool incomplete(lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX) return false;
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  return len >= 5 && !strcmp(msg + len - 5, "<eof>");
}

static int msgh(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static void print_results(lua_State *L, int base) {
  int n = lua_gettop(L) - base;
  if (n <= 0) return;
  lua_getglobal(L, "print");
  lua_insert(L, base + 1);
  if (lua_pcall(L, n, 0, 0) != LUA_OK) {
    fprintf(stderr, "error printing result: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
}

/* completion over globals, fields of tables (a.b<TAB>) and tensor methods (t:<TAB>) */
static char **completions;
static int ncompl;
static void add_completion(const char *prefix, const char *s) {
  completions = realloc(completions, sizeof(char *) * (size_t)(ncompl + 2));
  size_t n = strlen(prefix) + strlen(s) + 1;
  char *c = malloc(n);
  snprintf(c, n, "%s%s", prefix, s);
  completions[ncompl++] = c;
  completions[ncompl] = NULL;
}

static void collect_keys(lua_State *L, int tbl, const char *prefix, const char *partial) {
  size_t pl = strlen(partial);
  lua_pushnil(L);
  while (lua_next(L, tbl)) {
    if (lua_type(L, -2) == LUA_TSTRING) {
      const char *k = lua_tostring(L, -2);
      if (!strncmp(k, partial, pl)) add_completion(prefix, k);
    }
    lua_pop(L, 1);
  }
}

static char *generator(const char *text, int state) {
  static int idx;
  lua_State *L = repl_L;
  if (!state) {
    for (int i = 0; i < ncompl; i++) free(completions[i]);
    free(completions);
    completions = NULL;
    ncompl = 0;
    idx = 0;
    const char *sep = strrchr(text, '.'), *colon = strrchr(text, ':');
    if (colon && (!sep || colon > sep)) sep = colon;
    int top = lua_gettop(L);
    if (!sep) {
      lua_pushglobaltable(L);
      collect_keys(L, lua_gettop(L), "", text);
    } else {
      /* evaluate the path before the separator (names only, no calls) */
      char path[512];
      size_t n = (size_t)(sep - text) < sizeof path - 1 ? (size_t)(sep - text) : sizeof path - 1;
      memcpy(path, text, n);
      path[n] = 0;
      lua_pushglobaltable(L);
      char *save, *tok = strtok_r(path, ".:", &save);
      while (tok && (lua_istable(L, -1) || lua_isuserdata(L, -1))) {
        if (lua_getfield(L, -1, tok) == LUA_TNIL) break;
        tok = strtok_r(NULL, ".:", &save);
      }
      char prefix[520];
      snprintf(prefix, sizeof prefix, "%.*s", (int)(sep - text + 1), text);
      if (kgl_test(L, -1)) {
        luaL_getmetatable(L, KGL_TENSOR_MT);
        lua_getfield(L, -1, "methods");
        collect_keys(L, lua_gettop(L), prefix, sep + 1);
      } else if (lua_istable(L, -1)) {
        collect_keys(L, lua_gettop(L), prefix, sep + 1);
      }
    }
    lua_settop(L, top);
  }
  return idx < ncompl ? strdup(completions[idx++]) : NULL;
}

static char **complete(const char *text, int start, int end) {
  (void)start;
  (void)end;
  rl_completion_append_character = '\0';
  return rl_completion_matches(text, generator);
}

int kgl_repl(lua_State *L) {
  bool tty = isatty(0);
  repl_L = L;
  char hist[4096] = "";
  if (tty) {
    const char *home = getenv("HOME");
    if (home) snprintf(hist, sizeof hist, "%s/.keng_history", home);
    rl_readline_name = "keng";
    rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,+-*/[";
    rl_attempted_completion_function = complete;
    using_history();
    if (hist[0]) read_history(hist);
    printf("keng %s — Lua 5.4 deep-learning engine. Ctrl-D exits.\n", KENG_VERSION);
  }
  signal(SIGINT, on_sigint);
  char *line;
  while ((line = read_line("> ", tty))) {
    size_t cap = strlen(line) + 1;
    char *code = malloc(cap);
    memcpy(code, line, cap);
    if (tty && *line) add_history(line);
    free(line);
    int base = lua_gettop(L), status;
    /* a trailing ';' means: run it, print nothing */
    size_t n = strlen(code);
    while (n && (code[n - 1] == ' ' || code[n - 1] == '\t')) n--;
    bool quiet = n && code[n - 1] == ';';
    /* an expression prints its value (unless it ends in ';') */
    lua_pushliteral(L, "return "); /* lua_pushfstring has no %.*s */
    lua_pushlstring(L, code, quiet ? n - 1 : n);
    lua_pushliteral(L, ";");
    lua_concat(L, 3);
    const char *ret = lua_tostring(L, -1);
    status = luaL_loadbufferx(L, ret, strlen(ret), "=stdin", "t");
    lua_remove(L, -2);
    if (status != LUA_OK) lua_pop(L, 1);
    if (status != LUA_OK) {
      for (;;) {
        status = luaL_loadbufferx(L, code, strlen(code), "=stdin", "t");
        if (!incomplete(L, status)) break;
        lua_pop(L, 1);
        char *more = read_line(">> ", tty);
        if (!more) break;
        if (tty && *more) add_history(more);
        size_t len = strlen(code) + strlen(more) + 2;
        code = realloc(code, len);
        strcat(code, "\n");
        strcat(code, more);
        free(more);
      }
    }
    free(code);
    if (status == LUA_OK) {
      lua_pushcfunction(L, msgh);
      lua_insert(L, base + 1);
      status = lua_pcall(L, 0, LUA_MULTRET, base + 1);
      lua_remove(L, base + 1);
      lua_sethook(L, NULL, 0, 0);
      kg_interrupted(); /* clear a pending interrupt */
    }
    if (status != LUA_OK) {
      fprintf(stderr, "%s\n", lua_tostring(L, -1));
      lua_settop(L, base);
      continue;
    }
    if (!quiet) print_results(L, base);
    lua_settop(L, base);
    fflush(stdout);
  }
  if (tty) {
    putchar('\n');
    if (hist[0]) write_history(hist);
  }
  return LUA_OK;
}
