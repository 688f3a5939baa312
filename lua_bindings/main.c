/* main.c — the `keng` executable: runs a script, `-e code`, or the REPL, with the keng module
 * preloaded and package.path pointing at scripts/lib and scripts/ (installed or source tree). */
#include "keng_lua.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* package.path gets keng's roots first; package.keng_path holds them alone: loadmode.c's
 * searcher looks up keng's own namespaces (keng.*, models.*) there only, so a stray
 * ./keng/x.lua in the working directory can never stand in for a library module */
static void set_paths(lua_State *L) {
  /* the first read of the environment registry: warns about unknown KENG_* variables */
  const char *home = kg_env_is_set(KG_ENV_KENG_HOME) ? kg_env_str(KG_ENV_KENG_HOME) : NULL;
  const char *roots[] = {home, KENG_INSTALL_DATADIR, KENG_SOURCE_DIR};
  lua_getglobal(L, "package");
  int n = 0;
  for (int i = 0; i < 3; i++) {
    if (!roots[i]) continue;
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/scripts/lib", roots[i]);
    if (access(probe, R_OK)) continue;
    lua_pushfstring(L, "%s/scripts/lib/?.lua;%s/scripts/lib/?/init.lua;%s/scripts/?.lua;%s/scripts/?/init.lua;", roots[i],
                    roots[i], roots[i], roots[i]);
    n++;
  }
  lua_concat(L, n); /* "" when no root was found */
  size_t len;
  const char *own = lua_tolstring(L, -1, &len);
  lua_pushlstring(L, own, len ? len - 1 : 0); /* without the trailing ';' (an empty template) */
  lua_setfield(L, -3, "keng_path");
  lua_getfield(L, -2, "path");
  lua_concat(L, 2);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static int report(lua_State *L, int status) {
  if (status != LUA_OK) {
    fprintf(stderr, "keng: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  return status;
}

static int docall(lua_State *L, int nargs, int nres) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int status = lua_pcall(L, nargs, nres, base);
  lua_remove(L, base);
  return status;
}

int kgl_repl(lua_State *L);       /* repl.c */
void kgl_text_only(lua_State *L); /* loadmode.c: binary chunks refused */

static void usage(void) {
  printf("usage: keng [options] [script [args...]]\n"
         "  -e code     run code\n"
         "  -i          enter the REPL after running the script\n"
         "  --nproc N   run N ranks of this command line through mpirun (keng.distributed)\n"
         "  --ops       list every engine op with its kernels and backward\n"
         "  --env       list the KENG_* environment variables with their values (docs/environment.md)\n"
         "  --version   print the version\n"
         "  --help      this text\n"
         "With no script, keng starts the REPL (reads stdin plainly when it is not a terminal).\n");
}

/* `keng --nproc N args...` -> `mpirun -np N keng args...` (the options before the script, less
 * --nproc N, and the script with its args). Open MPI refuses root and more ranks than cores unless
 * told: a convenience launcher allows both (a cluster job uses mpirun or srun itself). Each rank
 * gets cores / N OpenMP threads unless OMP_NUM_THREADS says otherwise. Returns only on error. */
static int launch_ranks(int argc, char **argv, int at) {
  const char *v = at + 1 < argc ? argv[at + 1] : NULL;
  char *end = NULL;
  long n = v ? strtol(v, &end, 10) : 0;
  if (!v || !*v || *end || n < 1 || n > 4096) {
    fprintf(stderr, "keng: --nproc needs a number of ranks from 1 to 4096, got %s\n", v ? v : "nothing");
    return 1;
  }
  if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK")) {
    fprintf(stderr, "keng: --nproc inside an MPI job (this process is already one of its ranks)\n");
    return 1;
  }
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) {
    fprintf(stderr, "keng: --nproc cannot find its own executable\n");
    return 1;
  }
  exe[len] = 0;
  char np[32];
  snprintf(np, sizeof np, "%ld", n);
  char **args = calloc((size_t)argc + 4, sizeof *args);
  if (!args) return 1;
  int k = 0;
  args[k++] = "mpirun", args[k++] = "-np", args[k++] = np, args[k++] = exe;
  for (int i = 1; i < argc; i++)
    if (i != at && i != at + 1) args[k++] = argv[i];
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  if (geteuid() == 0) setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0), setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  if (!getenv("OMP_NUM_THREADS")) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char t[32];
    snprintf(t, sizeof t, "%ld", cores / n > 1 ? cores / n : 1);
    setenv("OMP_NUM_THREADS", t, 1);
  }
  execvp("mpirun", args);
  fprintf(stderr, "keng: --nproc runs mpirun, which was not found (Debian: apt install openmpi-bin)\n");
  free(args);
  return 1;
}

int main(int argc, char **argv) {
  /* libgomp reads its wait settings once, when it loads. Its default lets idle threads spin
   * 300000 rounds after every parallel region, which steals the core the next serial step needs
   * when the machine is busy; passive puts them to sleep at once, and waking them then costs
   * tens of microseconds per op (gemma_tiny generate 32 on an idle machine: 310 ms/step passive,
   * 236 with a short spin). keng sets a short spin, GOMP_SPINCOUNT=3000, and re-executes itself
   * once; an explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT wins. Cores taken by other work are
   * handled by the thread count (engine/core/threads.c). Figures in docs/kernels.md, "Threads". */
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
    setenv("GOMP_SPINCOUNT", "3000", 1);
    execv("/proc/self/exe", argv); /* on failure, carry on with libgomp's default */
  }
  for (int i = 1; i < argc && argv[i][0] == '-' && argv[i][1]; i++) { /* options before the script */
    if (!strcmp(argv[i], "--nproc")) return launch_ranks(argc, argv, i);
    if (!strcmp(argv[i], "-e")) i++;
  }
  lua_State *L = luaL_newstate();
  if (!L) return 1;
  luaL_openlibs(L);
  kgl_text_only(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, kgl_open);
  lua_setfield(L, -2, "keng");
  lua_pop(L, 1);
  set_paths(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "keng");
  if (report(L, docall(L, 1, 1))) return 1;
  lua_setglobal(L, "keng");

  int interactive = 0, ran = 0, i = 1, status = LUA_OK;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage();
      return 0;
    } else if (!strcmp(a, "--version") || !strcmp(a, "-v")) {
      printf("keng %s (%s)\n", KENG_VERSION, LUA_RELEASE);
      return 0;
    } else if (!strcmp(a, "--ops")) {
      lua_getglobal(L, "keng");
      lua_getfield(L, -1, "ops_report");
      lua_call(L, 0, 1);
      fputs(lua_tostring(L, -1), stdout);
      return 0;
    } else if (!strcmp(a, "--env")) {
      kg_env_print();
      return 0;
    } else if (!strcmp(a, "-i")) {
      interactive = 1;
    } else if (!strcmp(a, "-e")) {
      if (++i >= argc) {
        fprintf(stderr, "keng: -e needs an argument\n");
        return 1;
      }
      ran = 1;
      status = luaL_loadbufferx(L, argv[i], strlen(argv[i]), "=(command line)", "t");
      if (status == LUA_OK) status = docall(L, 0, 0);
      if (report(L, status)) return 1;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "keng: unknown option %s\n", a);
      usage();
      return 1;
    } else {
      break;
    }
  }
  if (i < argc) { /* script and its args */
    /* the arguments are pushed as the chunk's varargs: room for as many as the shell passes */
    if (!lua_checkstack(L, argc - i + 4)) {
      fprintf(stderr, "keng: too many arguments (%d) for the Lua stack\n", argc - i - 1);
      lua_close(L);
      return 1;
    }
    lua_createtable(L, argc - i, 1);
    for (int k = 0; k < argc; k++) {
      lua_pushstring(L, argv[k]);
      lua_rawseti(L, -2, k - i);
    }
    lua_setglobal(L, "arg");
    ran = 1;
    status = luaL_loadfilex(L, strcmp(argv[i], "-") ? argv[i] : NULL, "t"); /* text only */
    if (status == LUA_OK) {
      int n = argc - i - 1;
      for (int k = i + 1; k < argc; k++) lua_pushstring(L, argv[k]);
      status = docall(L, n, 0);
    }
    if (report(L, status)) {
      lua_close(L);
      return 1;
    }
  }
  if (interactive || !ran) status = kgl_repl(L);
  lua_close(L);
  return status == LUA_OK ? 0 : 1;
}
