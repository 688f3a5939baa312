/* repl.c — the interactive loop: a line is tried as `return <line>` first so expressions
 * print; a trailing `;` suppresses printing; incomplete chunks continue on the next line.
 * GNU readline (history, completion) on a terminal; plain lines when stdin is a pipe.
 *
 * On a terminal readline runs through its callback interface, so a Ctrl-C at the prompt only
 * drops the line being typed (and a pending multi-line chunk) instead of interrupting the next
 * command; a Ctrl-C while code runs stops it at its next hook. Completion runs protected (a
 * raising __index completes nothing), and each line is appended to ~/.keng_history as it is
 * entered, so the history survives a crash. */
#include "keng_lua.h"

#include <errno.h>
#include <readline/history.h>
#include <readline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

static lua_State *repl_L;
static volatile sig_atomic_t at_prompt, prompt_interrupted;

/* Ctrl-C: stop the running Lua code at its next hook, and any long engine op at its next check */
static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted!");
}
static void on_sigint(int sig) {
  (void)sig;
  if (at_prompt) { /* nothing runs: drop the line being typed (read_line sees the flag) */
    prompt_interrupted = 1;
    return;
  }
  kg_interrupt();
  if (repl_L) lua_sethook(repl_L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

static char *rl_got;
static bool rl_done_line;
static void on_line(char *line) {
  rl_got = line;
  rl_done_line = true;
  rl_callback_handler_remove();
}

/* the next line (malloc'd), or NULL at the end of input; *cancelled when a Ctrl-C dropped it */
static char *read_line(const char *prompt, bool tty, bool *cancelled) {
  *cancelled = false;
  prompt_interrupted = 0;
  at_prompt = 1;
  char *line = NULL;
  if (!tty) {
    static char buf[1 << 16];
    if (fgets(buf, sizeof buf, stdin)) {
      size_t n = strlen(buf);
      if (n && buf[n - 1] == '\n') buf[n - 1] = 0;
      line = strdup(buf);
    }
    at_prompt = 0;
    return line;
  }
  rl_got = NULL;
  rl_done_line = false;
  rl_callback_handler_install(prompt, on_line);
  int fd = fileno(rl_instream);
  while (!rl_done_line) {
    fd_set fds;
    FD_ZERO(&fds);
    FD_SET(fd, &fds);
    int r = select(fd + 1, &fds, NULL, NULL, NULL);
    if (prompt_interrupted) {
      rl_free_line_state();
      rl_callback_sigcleanup();
      rl_cleanup_after_signal();
      rl_callback_handler_remove();
      fputs("\n", stdout);
      fflush(stdout);
      *cancelled = true;
      break;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      rl_callback_handler_remove();
      break; /* treated as the end of input */
    }
    rl_callback_read_char();
  }
  at_prompt = 0;
  return rl_got;
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
  if (!lua_checkstack(L, 2)) { /* as many results as the stack holds: no room for print itself */
    fprintf(stderr, "error printing result: too many results (%d)\n", n);
    return;
  }
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
  char **grown = realloc(completions, sizeof(char *) * (size_t)(ncompl + 2));
  size_t n = strlen(prefix) + strlen(s) + 1;
  char *c = grown ? malloc(n) : NULL;
  if (grown) completions = grown;
  if (!c) return;
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

/* runs in lua_pcall: a field lookup may raise (a strict __index, a freed object) */
static int collect(lua_State *L) {
  const char *text = lua_touserdata(L, 1);
  const char *sep = strrchr(text, '.'), *colon = strrchr(text, ':');
  if (colon && (!sep || colon > sep)) sep = colon;
  if (!sep) {
    lua_pushglobaltable(L);
    collect_keys(L, lua_gettop(L), "", text);
    return 0;
  }
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
  return 0;
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
    int top = lua_gettop(L);
    if (lua_checkstack(L, 2)) {
      lua_pushcfunction(L, collect);
      lua_pushlightuserdata(L, (void *)text);
      (void)lua_pcall(L, 1, 0, 0); /* an error completes nothing */
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

/* one history line: kept in memory and appended to the file at once */
static void remember(const char *hist, const char *line) {
  if (!*line) return;
  add_history(line);
  if (hist[0]) append_history(1, hist);
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
    rl_catch_signals = 0; /* Ctrl-C is on_sigint's: readline must not re-raise it */
    using_history();
    /* append_history needs the file to exist */
    if (hist[0] && read_history(hist) != 0 && write_history(hist) != 0) hist[0] = 0;
    printf("keng %s — Lua 5.4 deep-learning engine. Ctrl-D exits.\n", KENG_VERSION);
  }
  signal(SIGINT, on_sigint);
  char *line;
  bool cancelled;
  for (;;) {
    line = read_line("> ", tty, &cancelled);
    if (cancelled) continue;
    if (!line) break;
    size_t cap = strlen(line) + 1;
    char *code = malloc(cap);
    if (!code) {
      free(line);
      fprintf(stderr, "out of memory\n");
      continue;
    }
    memcpy(code, line, cap);
    if (tty) remember(hist, line);
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
    bool dropped = false; /* a Ctrl-C on a continuation line drops the whole pending chunk */
    if (status != LUA_OK) {
      for (;;) {
        status = luaL_loadbufferx(L, code, strlen(code), "=stdin", "t");
        if (!incomplete(L, status)) break;
        char *more = read_line(">> ", tty, &cancelled);
        if (cancelled || !more) { /* Ctrl-C drops the chunk; at the end of input it stays unfinished */
          dropped = cancelled;
          break;
        }
        lua_pop(L, 1);
        if (tty) remember(hist, more);
        size_t len = strlen(code) + strlen(more) + 2;
        char *grown = realloc(code, len);
        if (grown) {
          code = grown;
          strcat(code, "\n");
          strcat(code, more);
        }
        free(more);
        if (!grown) {
          lua_pushliteral(L, "out of memory");
          status = LUA_ERRMEM;
          break;
        }
      }
    }
    free(code);
    if (dropped) {
      lua_settop(L, base);
      continue;
    }
    if (status == LUA_OK) {
      lua_sethook(L, NULL, 0, 0);
      kg_interrupted(); /* a Ctrl-C that came before the command started is not for it */
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
    if (hist[0]) history_truncate_file(hist, 1000);
  }
  return LUA_OK;
}
