/* test_memory.c — device memory accounting without a GPU: a recording fake takes the CUDA
 * runtime's place behind storages (kg_memory_set_device), and the checks are that
 *   - every device storage is reported to the alloc hook and counted in the live bytes,
 *   - stats and trims reach the device (kg_memory_get_stats / empty_cache / empty_caches),
 *   - an exhausted device fails with KG_ERR_OOM saying what was asked and what is held, and a
 *     missing device with its own error,
 *   - through the Lua binding: dropped device tensors wake the collector (the fake's high-water
 *     mark stays near one tensor, not the sum of all), an allocation failure collects, trims and
 *     retries once, and keng.memory_stats / keng.empty_cache reach the device.
 *   - CPU blocks of 2 MiB and more sit on 2 MiB boundaries with their whole huge pages marked
 *     MADV_HUGEPAGE (and no more),
 * The fake hands out 8-byte host blocks standing for device memory of any size; nothing reads
 * them. Run: ctest -R test_memory (or ./build/test_memory); exits non-zero when a check fails. */
#include <core/internal.h>
#include <keng/keng.h>
#include <keng_lua.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks, failures;
#define CHECKM(cond, ...)                                               \
  do {                                                                  \
    checks++;                                                           \
    if (!(cond)) {                                                      \
      failures++;                                                       \
      fprintf(stderr, "%s:%d: FAILED: %s ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fputc('\n', stderr);                                              \
    }                                                                   \
  } while (0)
#define CHECK(cond) CHECKM(cond, "%s", "")

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ---- the fake device: one device, a byte budget, a record of what was asked -------------- */

static struct {
  size_t capacity, live, peak;
  int allocs, frees, trims, refusals;
} fake;

static kg_status fake_alloc(void **out, size_t n, int device) {
  *out = NULL;
  if (device != 0) return kg_error(KG_ERR_DEVICE, "cuda", "cuda:%d is not available (1 device(s))", device);
  if (fake.live + n > fake.capacity) {
    fake.refusals++;
    return kg_error(KG_ERR_OOM, "cuda", "cudaMallocAsync: out of memory (fake)");
  }
  size_t *p = malloc(sizeof *p);
  *p = n;
  fake.live += n;
  if (fake.live > fake.peak) fake.peak = fake.live;
  fake.allocs++;
  *out = p;
  return KG_OK;
}
static void fake_free(void *p, int device) {
  (void)device;
  fake.live -= *(size_t *)p;
  fake.frees++;
  free(p);
}
static kg_memory_stats fake_stats(int device) {
  (void)device;
  return (kg_memory_stats){fake.live, 3 * MiB, fake.peak, 5 * MiB};
}
static void fake_trim(int device) {
  (void)device;
  fake.trims++;
}
static void fake_reset_peak(int device) {
  (void)device;
  fake.peak = fake.live;
}
static int fake_count(void) { return 1; }
static const kg_device_memory fake_device = {fake_alloc, fake_free, fake_stats, fake_trim, fake_reset_peak, fake_count};

static const kg_device CUDA0 = {KG_DEV_CUDA, 0};

/* ---- engine level ------------------------------------------------------------------------- */

static size_t hooked;
static void count_hook(size_t n, void *ud) {
  (void)ud;
  hooked += n;
}

static void engine_checks(void) {
  fake.capacity = 4 * GiB;
  kg_memory_set_alloc_hook(count_hook, NULL);
  size_t live0 = kg_memory_storage_bytes();

  kg_storage *s = NULL;
  CHECKM(kg_storage_new(&s, 1000, CUDA0) == KG_OK, "%s", kg_last_error());
  CHECKM(hooked == 1000, "the hook heard %zu bytes of a 1000-byte device storage", hooked);
  CHECK(kg_memory_storage_bytes() == live0 + 1000);
  kg_memory_stats st = kg_memory_get_stats(CUDA0);
  CHECKM(st.allocated == 1000 && st.cached == 3 * MiB && st.graph == 5 * MiB, "stats %zu %zu %zu", st.allocated,
         st.cached, st.graph);
  kg_storage_release(s);
  CHECK(fake.live == 0 && fake.frees == 1);
  CHECK(kg_memory_storage_bytes() == live0);

  /* cpu storages are reported too, by their requested size */
  CHECK(kg_storage_new(&s, 100, KG_CPU) == KG_OK);
  CHECKM(hooked == 1100, "the hook heard %zu bytes", hooked);
  kg_storage_release(s);

  /* meta storages hold no bytes: nothing to report (a model built on meta is counted when its
   * tensors are made on a device, e.g. loaded with to("cuda"), like any other storage) */
  CHECK(kg_storage_new(&s, 1 << 30, KG_META) == KG_OK);
  CHECKM(hooked == 1100 && kg_memory_storage_bytes() == live0, "meta: hook %zu", hooked);
  kg_storage_release(s);

  /* a device past the fake's count has no stats and no trim */
  st = kg_memory_get_stats((kg_device){KG_DEV_CUDA, 1});
  CHECK(st.allocated == 0 && st.graph == 0);
  kg_memory_empty_cache((kg_device){KG_DEV_CUDA, 1});
  CHECK(fake.trims == 0);
  kg_memory_empty_cache(CUDA0);
  CHECK(fake.trims == 1);
  kg_memory_empty_caches();
  CHECK(fake.trims == 2);

  /* exhausted: OOM with the sizes; missing device: its own error, not an OOM */
  kg_storage *a = NULL, *b = NULL;
  CHECK(kg_storage_new(&a, 3 * GiB, CUDA0) == KG_OK);
  kg_status r = kg_storage_new(&b, 2 * GiB, CUDA0);
  CHECKM(r == KG_ERR_OOM, "status %d", (int)r);
  const char *m = kg_last_error();
  CHECKM(strstr(m, "asked 2147483648 bytes (2.0 GiB) on cuda:0") &&
             strstr(m, "the pool holds 3.0 GiB in tensors and 3.0 MiB cached, CUDA graphs hold 5.0 MiB") &&
             strstr(m, "(fake)"),
         "message: %s", m);
  kg_storage_release(a);
  r = kg_storage_new(&b, 10, (kg_device){KG_DEV_CUDA, 2});
  CHECKM(r == KG_ERR_DEVICE && strstr(kg_last_error(), "cuda:2 is not available"), "status %d: %s", (int)r,
         kg_last_error());
  CHECK(kg_memory_storage_bytes() == live0);
  kg_memory_set_alloc_hook(NULL, NULL);
}

/* ---- through the binding -------------------------------------------------------------------- */

static void release_owner(kg_storage *w) { kg_storage_release(w->owner); }

/* a u8 "cuda" tensor of n bytes on the fake (kg_tensor_empty would ask the CUDA runtime whether
 * a device exists): its storage comes from kg_storage_new, as any device tensor's does */
static kg_status fake_tensor(kg_tensor **out, size_t n) {
  kg_storage *s = NULL;
  KG_TRY(kg_storage_new(&s, n, CUDA0));
  int64_t shape[1] = {(int64_t)n};
  kg_status st = kg_tensor_from_blob(out, s->data, 1, shape, KG_U8, CUDA0, s, release_owner);
  if (st) kg_storage_release(s);
  return st;
}

/* fake_tensor(bytes): a binding written as every keng binding is (KGL_CALL, then push) */
static int l_fake_tensor(lua_State *L) {
  size_t n = (size_t)luaL_checkinteger(L, 1);
  kg_tensor *t = NULL;
  KGL_CALL(L, fake_tensor(&t, n));
  kgl_push(L, t);
  return 1;
}
static int l_fake(lua_State *L) {
  const char *k = luaL_checkstring(L, 1);
  lua_Integer v = !strcmp(k, "peak") ? (lua_Integer)fake.peak : !strcmp(k, "live") ? (lua_Integer)fake.live
                  : !strcmp(k, "trims")  ? fake.trims
                  : !strcmp(k, "frees")  ? fake.frees
                  : !strcmp(k, "refusals") ? fake.refusals : -1;
  if (lua_gettop(L) > 1) { /* fake(key, value) sets */
    lua_Integer nv = luaL_checkinteger(L, 2);
    if (!strcmp(k, "peak")) fake.peak = (size_t)nv;
    else if (!strcmp(k, "capacity")) fake.capacity = (size_t)nv;
  }
  lua_pushinteger(L, v);
  return 1;
}

static void run(lua_State *L, const char *name, const char *code) {
  checks++;
  if (luaL_dostring(L, code) != LUA_OK) {
    failures++;
    fprintf(stderr, "FAILED: %s: %s\n", name, lua_tostring(L, -1));
    lua_pop(L, 1);
  }
}

static void binding_checks(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "keng", kgl_open, 1);
  lua_pop(L, 1);
  lua_register(L, "fake_tensor", l_fake_tensor);
  lua_register(L, "fake", l_fake);
  fake.refusals = 0;

  /* 64 dropped 256 MiB device tensors: the collector must free them as they go (the fake
   * could hold all 16 GiB, so only the collector keeps its high-water mark low) */
  fake.capacity = 64 * GiB;
  run(L, "dropped device tensors wake the collector",
      "collectgarbage(); collectgarbage(); fake('peak', 0)\n"
      "for i = 1, 64 do local t = fake_tensor(256 << 20) end\n"
      "local peak = fake('peak')\n"
      "assert(peak <= 4 * (256 << 20),\n"
      "  ('the fake held %.1f GiB at once: the collector never ran'):format(peak / 2^30))\n"
      "assert(fake('refusals') == 0)");

  /* an allocation that does not fit: collect, trim, retry once; then the OOM message */
  fake.capacity = GiB;
  run(L, "an allocation failure collects and retries",
      "collectgarbage(); collectgarbage()\n"
      "local trims = fake('trims')\n"
      "local a = fake_tensor(600 << 20)\n"
      "a = nil\n"
      "local b = fake_tensor(600 << 20)\n"
      "assert(fake('refusals') == 1, 'expected one refusal, then a retry that fits')\n"
      "assert(fake('trims') == trims + 1, 'the retry did not trim the device pool')\n"
      "local ok, err = pcall(fake_tensor, 600 << 20)\n"
      "assert(not ok and fake('refusals') == 3, 'a second failure is raised after one retry')\n"
      "assert(err:find('asked 629145600 bytes (600.0 MiB) on cuda:0; the pool holds 600.0 MiB in tensors',\n"
      "  1, true), err)\n"
      "b = nil");

  run(L, "keng.memory_stats and keng.empty_cache reach the device",
      "local keng = require 'keng'\n"
      "collectgarbage(); collectgarbage()\n"
      "local t = fake_tensor(1000)\n"
      "local s = keng.memory_stats('cuda')\n"
      "assert(s.allocated == 1000 and s.cached == 3 << 20 and s.graph == 5 << 20 and s.peak == fake('peak'),\n"
      "  ('stats %d %d %d %d'):format(s.allocated, s.cached, s.graph, s.peak))\n"
      "t = nil\n"
      "local trims = fake('trims')\n"
      "keng.empty_cache()\n"
      "assert(fake('trims') == trims + 1 and fake('live') == 0, 'empty_cache did not collect and trim the device')\n"
      "keng.reset_peak_memory_stats('cuda')\n"
      "assert(keng.memory_stats('cuda').peak == 0, 'reset_peak_memory_stats did not reach the device')");
  lua_close(L);
}

/* the VmFlags of the mapping of /proc/self/smaps holding address a ("" when none) */
static void vm_flags(uintptr_t a, char *out, size_t n) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512];
  bool in = false;
  out[0] = 0;
  while (f && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) in = a >= lo && a < hi;
    else if (in && !strncmp(line, "VmFlags:", 8)) snprintf(out, n, "%s", line + 8);
  }
  if (f) fclose(f);
}

/* CPU blocks of 2 MiB and more start on a 2 MiB boundary, and the whole 2 MiB pages of the bytes
 * asked for (only those) are marked MADV_HUGEPAGE: "hg" in the mapping's VmFlags (where the
 * kernel has transparent huge pages) */
static void cpu_block_checks(void) {
  size_t rp, rq, n = 3 * MiB + 100;
  char *p = kg_cpu_alloc(n, &rp);
  CHECKM(p && (uintptr_t)p % (2 * MiB) == 0, "a %zu-byte block at %p, not on a 2 MiB boundary", n, (void *)p);
  FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (p && thp) {
    char head[512], tail[512];
    vm_flags((uintptr_t)p, head, sizeof head);
    vm_flags((uintptr_t)p + 2 * MiB, tail, sizeof tail);
    CHECKM(strstr(head, " hg"), "the first 2 MiB are not marked MADV_HUGEPAGE (VmFlags:%s)", head);
    CHECKM(!strstr(tail, " hg"), "the last partial 2 MiB is marked MADV_HUGEPAGE (VmFlags:%s)", tail);
  }
  if (thp) fclose(thp);
  char *q = kg_cpu_alloc(100000, &rq);
  CHECKM(q && (uintptr_t)q % 64 == 0, "a 100000-byte block at %p", (void *)q);
  kg_cpu_free(q, rq);
  kg_cpu_free(p, rp);
}

int main(void) {
  kg_memory_set_device(&fake_device);
  cpu_block_checks();
  engine_checks();
  binding_checks();
  kg_memory_set_device(NULL);
  printf("test_memory: %d checks, %d failed\n", checks, failures);
  return failures != 0;
}
