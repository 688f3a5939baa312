/* alloc.c — CPU memory: a caching pool of 64-byte aligned blocks, and storage objects on every
 * device, with the accounting the Lua collector needs.
 *
 * Blocks are rounded up to a size class (64-byte steps up to 4 KiB, then four classes per
 * power of two, at most 25% slack) and kept on a free list per class when released, so a
 * training loop that allocates the same shapes every step stops calling malloc after step 1.
 *
 * Device storages come from the device memory table (the CUDA runtime's stream-ordered pool,
 * or a test's fake). Every new storage, host or device, is reported to the alloc hook: Lua sees
 * a tensor as a small userdata, so without the report a loop that makes gigabytes of device
 * temporaries would never wake the collector (docs/cuda.md, "Memory accounting").
 */
#include "internal.h"

#include <pthread.h>
#ifdef __GLIBC__
#include <malloc.h> /* malloc_trim */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NCLASSES 256
#define SMALL 4096

typedef struct block { struct block *next; } block;

static struct {
  pthread_mutex_t lock;
  block *free_list[NCLASSES];
  size_t allocated, cached, peak, cache_cap;
  void (*hook)(size_t, void *);
  void *hook_ud;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t storage_bytes; /* held by live storages, every device (atomic) */

static const kg_device_memory cuda_memory = {kg_cuda_alloc,       kg_cuda_free,       kg_cuda_memory_stats,
                                             kg_cuda_empty_cache, kg_cuda_reset_peak, kg_cuda_device_count};
static const kg_device_memory *device_memory = &cuda_memory;

const kg_device_memory *kg_memory_set_device(const kg_device_memory *m) {
  const kg_device_memory *old = device_memory;
  device_memory = m ? m : &cuda_memory;
  return old;
}

static size_t physical_memory(void) {
  static size_t mem;
  if (!mem) mem = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
  return mem;
}

/* size class index and rounded size */
static int size_class(size_t n, size_t *rounded) {
  if (n == 0) n = 1;
  if (n <= SMALL) {
    *rounded = (n + 63) & ~(size_t)63;
    return (int)(*rounded / 64);
  }
  int e = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^e < n <= 2^(e+1) */
  size_t step = (size_t)1 << (e - 2);                        /* four classes per octave */
  size_t k = (n + step - 1) / step;                          /* 5 .. 8 */
  *rounded = k * step;
  int idx = 65 + (e - 12) * 4 + (int)(k - 5);
  return idx < NCLASSES ? idx : -1;
}

void kg_memory_set_alloc_hook(void (*hook)(size_t, void *), void *ud) {
  pool.hook = hook;
  pool.hook_ud = ud;
}

/* the cached blocks go back to the C library at exit (leak checkers then see a clean heap) */
static void empty_at_exit(void) { kg_memory_empty_cache(KG_CPU); }
static void register_exit(void) { atexit(empty_at_exit); }

/* Blocks of 2 MiB and more start on a 2 MiB boundary, and the whole 2 MiB pages of the bytes
 * asked for are marked MADV_HUGEPAGE (transparent huge pages, where the kernel's THP setting is
 * "madvise" or "always"): a decode step streams every weight once (GB per token), and through
 * 4 KiB pages that is a TLB miss per 4 KiB. Measured on the 2-core VM (docs/quantization.md,
 * "Huge pages"): an int4 GEMV over 288 MiB of weights went from 10.3 to 14.0 GB/s on one thread
 * and from 19.6 to 27.6 on two. Only pages inside nbytes are marked (the size class's slack past
 * them is never touched), so a tensor's resident size stays its bytes. */
#define HUGE_PAGE ((size_t)2 << 20)

static void huge_pages(void *p, size_t nbytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  size_t n = nbytes / HUGE_PAGE * HUGE_PAGE;
  if (n && (uintptr_t)p % HUGE_PAGE == 0) (void)madvise(p, n, MADV_HUGEPAGE); /* a hint: failure is harmless */
#else
  (void)p, (void)nbytes;
#endif
}

void *kg_cpu_alloc(size_t nbytes, size_t *rounded) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_exit);
  int c = size_class(nbytes, rounded);
  if (*rounded > physical_memory()) return NULL; /* Linux overcommits: refuse the impossible */
  void *p = NULL;
  pthread_mutex_lock(&pool.lock);
  if (c >= 0 && pool.free_list[c]) {
    block *b = pool.free_list[c];
    pool.free_list[c] = b->next;
    pool.cached -= *rounded;
    p = b;
  }
  pthread_mutex_unlock(&pool.lock);
  if (!p) {
    /* posix_memalign, not aligned_alloc: C11 wants the size a multiple of the alignment, and a
     * size class need not be a multiple of 2 MiB (ASan enforces it) */
    size_t align = *rounded >= HUGE_PAGE ? HUGE_PAGE : 64;
    if (posix_memalign(&p, align, *rounded) != 0) {
      kg_memory_empty_cache(KG_CPU);
      if (posix_memalign(&p, align, *rounded) != 0) p = NULL;
    }
    if (!p) return NULL;
    huge_pages(p, nbytes);
  }
  pthread_mutex_lock(&pool.lock);
  pool.allocated += *rounded;
  if (pool.allocated > pool.peak) pool.peak = pool.allocated;
  pthread_mutex_unlock(&pool.lock);
  return p;
}

void kg_cpu_free(void *p, size_t rounded) {
  if (!p) return;
  size_t r;
  int c = size_class(rounded, &r);
  pthread_mutex_lock(&pool.lock);
  pool.allocated -= rounded;
  if (!pool.cache_cap) pool.cache_cap = physical_memory() / 4;
  if (c >= 0 && pool.cached + rounded <= pool.cache_cap) {
    block *b = p;
    b->next = pool.free_list[c];
    pool.free_list[c] = b;
    pool.cached += rounded;
    p = NULL;
  }
  pthread_mutex_unlock(&pool.lock);
  free(p);
}

void kg_memory_empty_cache(kg_device d) {
  if (d.type == KG_DEV_CUDA) {
    if (d.index < device_memory->count()) device_memory->trim(d.index);
    return;
  }
  if (d.type != KG_DEV_CPU) return;
  pthread_mutex_lock(&pool.lock);
  for (int c = 0; c < NCLASSES; c++) {
    for (block *b = pool.free_list[c]; b;) {
      block *next = b->next;
      free(b);
      b = next;
    }
    pool.free_list[c] = NULL;
  }
  pool.cached = 0;
  pthread_mutex_unlock(&pool.lock);
#ifdef __GLIBC__
  /* blocks under glibc's mmap threshold (it rises to 32 MB once large blocks are freed) live in
   * its heap, and free() keeps their pages: a model whose weights were replaced (keng.quantize)
   * would stay resident at its float size. malloc_trim hands every free page back. */
  malloc_trim(0);
#endif
}

void kg_memory_empty_caches(void) {
  kg_memory_empty_cache(KG_CPU);
  for (int i = 0, n = device_memory->count(); i < n; i++) kg_memory_empty_cache((kg_device){KG_DEV_CUDA, (int8_t)i});
}

kg_memory_stats kg_memory_get_stats(kg_device d) {
  kg_memory_stats s = {0};
  if (d.type == KG_DEV_CUDA) return d.index < device_memory->count() ? device_memory->stats(d.index) : s;
  if (d.type != KG_DEV_CPU) return s;
  pthread_mutex_lock(&pool.lock);
  s.allocated = pool.allocated;
  s.cached = pool.cached;
  s.peak = pool.peak;
  pthread_mutex_unlock(&pool.lock);
  return s;
}

void kg_memory_reset_peak(kg_device d) {
  if (d.type == KG_DEV_CUDA) {
    if (d.index < device_memory->count()) device_memory->reset_peak(d.index);
    return;
  }
  if (d.type != KG_DEV_CPU) return;
  pthread_mutex_lock(&pool.lock);
  pool.peak = pool.allocated;
  pthread_mutex_unlock(&pool.lock);
}

size_t kg_memory_storage_bytes(void) { return __atomic_load_n(&storage_bytes, __ATOMIC_RELAXED); }

/* ---- storage ------------------------------------------------------------------------------- */

static void release_cpu(kg_storage *s) { kg_cpu_free(s->data, (size_t)(uintptr_t)s->owner); }
static void release_cuda(kg_storage *s) { device_memory->free(s->data, s->device.index); }

/* "1.5 GiB" */
static const char *human(char buf[32], size_t n) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  snprintf(buf, 32, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
  return buf;
}

/* the out-of-memory message: what was asked, and what the device's allocator holds */
static kg_status oom(size_t nbytes, kg_device dev, const char *why) {
  kg_memory_stats st = kg_memory_get_stats(dev);
  char d[16], a[32], h[32], c[32], gh[32], g[64] = "";
  kg_device_name(dev, d);
  if (dev.type == KG_DEV_CUDA) snprintf(g, sizeof g, ", CUDA graphs hold %s", human(gh, st.graph));
  return kg_error(KG_ERR_OOM, "alloc", "out of memory: asked %zu bytes (%s) on %s; the pool holds %s in tensors and %s "
                  "cached%s (%s)", nbytes, human(a, nbytes), d, human(h, st.allocated), human(c, st.cached), g, why);
}

kg_status kg_storage_new(kg_storage **out, size_t nbytes, kg_device dev) {
  kg_storage *s = calloc(1, sizeof *s);
  if (!s) return kg_error(KG_ERR_OOM, "alloc", "out of memory allocating a storage header");
  s->refcount = 1;
  s->nbytes = nbytes;
  s->device = dev;
  if (dev.type == KG_DEV_CPU) {
    size_t rounded;
    s->data = kg_cpu_alloc(nbytes, &rounded);
    if (!s->data) {
      free(s);
      return oom(nbytes, dev, "the C library's allocator refused");
    }
    s->owner = (void *)(uintptr_t)rounded;
    s->release = release_cpu;
  } else if (dev.type == KG_DEV_CUDA) {
    kg_status st = device_memory->alloc(&s->data, nbytes ? nbytes : 1, dev.index);
    if (st != KG_OK) {
      free(s);
      if (st != KG_ERR_OOM) return st; /* no such device: its own message */
      char e[1024];
      snprintf(e, sizeof e, "%s", kg_last_error());
      return oom(nbytes, dev, e);
    }
    s->release = release_cuda;
  }
  if (s->data) {
    __atomic_add_fetch(&storage_bytes, nbytes, __ATOMIC_RELAXED);
    if (pool.hook) pool.hook(nbytes, pool.hook_ud);
  }
  *out = s;
  return KG_OK;
}

kg_storage *kg_storage_retain(kg_storage *s) {
  __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
  return s;
}

void kg_storage_release(kg_storage *s) {
  if (!s || __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
  if (s->release == release_cpu || s->release == release_cuda)
    __atomic_sub_fetch(&storage_bytes, s->nbytes, __ATOMIC_RELAXED);
  if (s->release) s->release(s);
  free(s);
}
