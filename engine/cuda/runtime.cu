/* runtime.cu — the CUDA runtime entry points of internal.h: device queries, one compute stream
 * per device, memory from the stream-ordered pool (cudaMallocAsync), copies between cpu and
 * cuda ordered on that stream (through a
 * small ring of pinned staging buffers), sync, the launch check that KENG_SYNC=1 makes
 * synchronous, and CUDA Graph capture / replay.
 *
 * Pool release policy: the release threshold is kept high, so a training step's freed blocks
 * stay cached across the syncs of every step (re-mapping them from the driver each step would
 * cost more than the step's kernels); the pool shrinks at chosen points instead: on an
 * allocation failure (wait, trim, retry once), and on kg_cuda_empty_cache (keng.empty_cache(),
 * called by the benchmark between rows), which also trims the memory CUDA graphs hold but no
 * longer use (cudaDeviceGraphMemTrim).
 *
 * With no driver or no GPU every query answers "none" (false / 0) and nothing else is called.
 *
 * Capture (kg_cuda_graph_begin/end): the compute stream is captured in relaxed mode. Memory
 * that kg_cuda_malloc hands out meanwhile becomes graph allocations (cudaMallocAsync nodes; the
 * graph is instantiated with AutoFreeOnLaunch, so their addresses stay fixed and tensors made
 * during the capture hold each replay's values). Memory the graph did not allocate but that is
 * released during the capture (a tensor made before it) may still be read by the graph: its
 * free is deferred until the graph is freed. Host-to-device copies get their own pinned source
 * held by the graph (the data is baked in); device-to-host copies and syncs raise an error.
 * Random kernels read (seed, offset) from a per-device buffer while captured (kg_cuda_rng_key),
 * and each launch first writes a freshly reserved position there, so every replay draws new
 * numbers — the ones an eager run of the same step would draw. */
#include "cuda.cuh"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <unordered_set>
#include <vector>

#define KG_CUDA_MAX_DEVICES 16

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int device_count = -1;
static cudaStream_t streams[KG_CUDA_MAX_DEVICES];
static int sync_mode = -1;

/* ---- capture state ------------------------------------------------------------------------ */

struct capture {
  kg_philox_state rng0;              /* the stream position when the capture began */
  bool checks;                       /* a checking op used the deferred-error slots */
  std::unordered_set<void *> allocs; /* graph allocations made during the capture, not yet freed */
  std::vector<void *> deferred;      /* other device memory freed during the capture */
  std::vector<void *> pinned;        /* host sources of captured H2D copies */
};
static capture *captures[KG_CUDA_MAX_DEVICES]; /* non-NULL while that device's stream is captured */
static uint64_t *rng_bufs[KG_CUDA_MAX_DEVICES]; /* (seed, offset) read by captured random kernels */
/* deferred-error slots of captured checking ops (util.cuh), and whether a graph that uses them
 * ran since they were last read */
#define FLAG_SLOTS 8
static long long *deferred[KG_CUDA_MAX_DEVICES];
static bool deferred_armed[KG_CUDA_MAX_DEVICES];
static bool deferring[KG_CUDA_MAX_DEVICES]; /* kg_cuda_defer_checks: eager checks use the slots too */
static const long long no_errors[FLAG_SLOTS] = {0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL,
                                                0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL,
                                                0x7fffffffffffffffLL, 0x7fffffffffffffffLL};

struct kg_cuda_graph {
  int device;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  kg_philox_state rng0; /* what the captured random ops reserved: used by the first launch */
  uint64_t rng_words;   /* Philox words one replay consumes */
  uint64_t launches;
  bool checks; /* replays set deferred-error slots */
  std::vector<void *> deferred, pinned;
};

extern "C" bool kg_cuda_capturing(int device) {
  return device >= 0 && device < KG_CUDA_MAX_DEVICES && captures[device] != NULL;
}

extern "C" int kg_cuda_device_count(void) {
  pthread_mutex_lock(&lock);
  if (device_count < 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0; /* no driver, no device: none */
    cudaGetLastError();                               /* clear the sticky-free error */
    device_count = n > KG_CUDA_MAX_DEVICES ? KG_CUDA_MAX_DEVICES : n;
  }
  int n = device_count;
  pthread_mutex_unlock(&lock);
  return n;
}

extern "C" bool kg_cuda_available(void) { return kg_cuda_device_count() > 0; }

kg_status kg_cuda_err(cudaError_t e, const char *op, const char *what) {
  if (e == cudaSuccess) return KG_OK;
  cudaGetLastError();
  kg_status code = e == cudaErrorMemoryAllocation ? KG_ERR_OOM : KG_ERR_DEVICE;
  return kg_error(code, op, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* the stream of a device; also sets up the device's pool the first time */
cudaStream_t kg_cuda_stream(int device) {
  cudaSetDevice(device);
  if (device < 0 || device >= KG_CUDA_MAX_DEVICES) return 0;
  cudaStream_t s = streams[device];
  if (s) return s;
  pthread_mutex_lock(&lock);
  if (!streams[device]) {
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      uint64_t keep = UINT64_MAX; /* no release on sync: trimmed by kg_cuda_empty_cache (above) */
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaStream_t ns = 0;
    if (cudaStreamCreateWithFlags(&ns, cudaStreamNonBlocking) != cudaSuccess) ns = 0;
    cudaGetLastError();
    streams[device] = ns;
  }
  s = streams[device];
  pthread_mutex_unlock(&lock);
  return s;
}

kg_status kg_cuda_check(const char *op, int device) {
  if (sync_mode < 0) sync_mode = kg_env_bool(KG_ENV_KENG_SYNC);
  KG_TRY(kg_cuda_err(cudaGetLastError(), op, "kernel launch"));
  if (sync_mode && !kg_cuda_capturing(device))
    KG_TRY(kg_cuda_err(cudaStreamSynchronize(kg_cuda_stream(device)), op, "kernel (KENG_SYNC=1)"));
  return KG_OK;
}

static bool valid_device(int device) { return device >= 0 && device < kg_cuda_device_count(); }

/* gives the device's free pool memory and its unused graph memory back to the driver (the
 * caller waited for the stream, so the pool's frees have landed) */
static void trim(int device) {
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
  cudaDeviceGraphMemTrim(device);
  cudaGetLastError();
}

extern "C" kg_status kg_cuda_alloc(void **out, size_t nbytes, int device) {
  *out = NULL;
  if (!valid_device(device))
    return kg_error(KG_ERR_DEVICE, "cuda", "cuda:%d is not available (%d device(s))", device, kg_cuda_device_count());
  cudaStream_t s = kg_cuda_stream(device);
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, nbytes, s);
  capture *c = captures[device];
  if (c) { /* a graph allocation: no trim-and-retry (that would synchronise) */
    KG_TRY(kg_cuda_err(e, "cuda", "cudaMallocAsync during CUDA graph capture"));
    pthread_mutex_lock(&lock);
    c->allocs.insert(p);
    pthread_mutex_unlock(&lock);
    *out = p;
    return KG_OK;
  }
  if (e == cudaErrorMemoryAllocation) { /* give cached blocks back and try once more */
    cudaGetLastError();
    cudaStreamSynchronize(s);
    trim(device);
    e = cudaMallocAsync(&p, nbytes, s);
  }
  KG_TRY(kg_cuda_err(e, "cuda", "cudaMallocAsync"));
  *out = p;
  return KG_OK;
}

extern "C" void *kg_cuda_malloc(size_t nbytes, int device) {
  void *p = NULL;
  return kg_cuda_alloc(&p, nbytes, device) == KG_OK ? p : NULL;
}

extern "C" void kg_cuda_free(void *p, int device) {
  if (!p || !valid_device(device)) return;
  capture *c = captures[device];
  if (c) {
    pthread_mutex_lock(&lock);
    bool mine = c->allocs.erase(p) > 0;
    if (!mine) c->deferred.push_back(p); /* the graph may read it: freed with the graph */
    pthread_mutex_unlock(&lock);
    if (!mine) return;
  }
  cudaFreeAsync(p, kg_cuda_stream(device)); /* ordered after every queued use on the stream */
  cudaGetLastError();                        /* at exit the runtime may already be gone */
}

/* ---- pinned staging: a ring of KG_STAGE_SLOTS pinned buffers per device, each with an event
 * recorded after the copy that last used it. H2D copies the source into a slot and queues the
 * DMA (the host waits only when the ring is full, for the oldest slot); D2H pipelines chunks:
 * the DMA of chunk i runs while the host copies chunk i-1 out. */

#define KG_STAGE_SLOTS 4
#define KG_STAGE_BYTES ((size_t)4 << 20)
struct stage_slot {
  char *p;
  cudaEvent_t done;
  bool pending; /* an event was recorded and not yet waited for */
};
static stage_slot stage[KG_CUDA_MAX_DEVICES][KG_STAGE_SLOTS];
static int stage_next[KG_CUDA_MAX_DEVICES];
static pthread_mutex_t stage_lock = PTHREAD_MUTEX_INITIALIZER;

/* the device's next slot, free to overwrite; NULL when pinned memory cannot be had */
static stage_slot *stage_acquire(int dev) {
  stage_slot *sl = &stage[dev][stage_next[dev]];
  if (!sl->p) {
    void *p = NULL;
    if (cudaHostAlloc(&p, KG_STAGE_BYTES, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return NULL;
    }
    if (cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      cudaFreeHost(p);
      return NULL;
    }
    sl->p = (char *)p;
    sl->pending = false;
  } else if (sl->pending) {
    cudaEventSynchronize(sl->done);
    sl->pending = false;
  }
  stage_next[dev] = (stage_next[dev] + 1) % KG_STAGE_SLOTS;
  return sl;
}

static kg_status h2d(void *dst, const void *src, size_t n, int dev) {
  cudaStream_t s = kg_cuda_stream(dev);
  capture *c = captures[dev];
  if (c) { /* captured: a pinned copy of the source, owned by the graph (its data is baked in) */
    void *pin = NULL;
    KG_TRY(kg_cuda_err(cudaMallocHost(&pin, n), "copy", "cudaMallocHost during CUDA graph capture"));
    memcpy(pin, src, n);
    pthread_mutex_lock(&lock);
    c->pinned.push_back(pin);
    pthread_mutex_unlock(&lock);
    return kg_cuda_err(cudaMemcpyAsync(dst, pin, n, cudaMemcpyHostToDevice, s), "copy", "cudaMemcpyAsync H2D (captured)");
  }
  pthread_mutex_lock(&stage_lock);
  kg_status st = KG_OK;
  size_t done = 0;
  while (st == KG_OK && done < n) {
    stage_slot *sl = stage_acquire(dev);
    if (!sl) break; /* no pinned memory: the rest goes the pageable way */
    size_t len = n - done < KG_STAGE_BYTES ? n - done : KG_STAGE_BYTES;
    memcpy(sl->p, (const char *)src + done, len);
    st = kg_cuda_err(cudaMemcpyAsync((char *)dst + done, sl->p, len, cudaMemcpyHostToDevice, s), "copy",
                     "cudaMemcpyAsync H2D");
    if (st == KG_OK) st = kg_cuda_err(cudaEventRecord(sl->done, s), "copy", "cudaEventRecord");
    if (st == KG_OK) sl->pending = true;
    done += len;
  }
  pthread_mutex_unlock(&stage_lock);
  if (st == KG_OK && done < n) /* from pageable memory: returns once the source has been staged */
    st = kg_cuda_err(cudaMemcpyAsync((char *)dst + done, (const char *)src + done, n - done, cudaMemcpyHostToDevice, s),
                     "copy", "cudaMemcpyAsync H2D");
  return st;
}

static kg_status d2h(void *dst, const void *src, size_t n, int dev) {
  cudaStream_t s = kg_cuda_stream(dev);
  struct chunk {
    stage_slot *sl;
    size_t off, len;
  } q[KG_STAGE_SLOTS];
  int head = 0, count = 0;
  kg_status st = KG_OK;
  size_t done = 0;
  bool stop = false; /* no pinned memory: retire what is queued, the rest goes pageable */
  pthread_mutex_lock(&stage_lock);
  while ((!stop && done < n) || count) {
    /* retire the oldest chunk when the ring is full or nothing is left to queue */
    if (count == KG_STAGE_SLOTS || (count && (stop || done >= n || st != KG_OK))) {
      chunk *k = &q[head];
      cudaError_t e = cudaEventSynchronize(k->sl->done);
      k->sl->pending = false;
      if (st == KG_OK) st = kg_cuda_err(e, "copy", "cudaEventSynchronize");
      if (st == KG_OK) memcpy((char *)dst + k->off, k->sl->p, k->len);
      head = (head + 1) % KG_STAGE_SLOTS, count--;
      continue;
    }
    if (st != KG_OK) break;
    stage_slot *sl = stage_acquire(dev);
    if (!sl) {
      stop = true;
      continue;
    }
    size_t len = n - done < KG_STAGE_BYTES ? n - done : KG_STAGE_BYTES;
    st = kg_cuda_err(cudaMemcpyAsync(sl->p, (const char *)src + done, len, cudaMemcpyDeviceToHost, s), "copy",
                     "cudaMemcpyAsync D2H");
    if (st == KG_OK) st = kg_cuda_err(cudaEventRecord(sl->done, s), "copy", "cudaEventRecord");
    if (st == KG_OK) {
      sl->pending = true;
      q[(head + count) % KG_STAGE_SLOTS] = chunk{sl, done, len};
      count++;
      done += len;
    }
  }
  pthread_mutex_unlock(&stage_lock);
  if (st == KG_OK && done < n) { /* no pinned memory: pageable copy, then wait */
    st = kg_cuda_err(cudaMemcpyAsync((char *)dst + done, (const char *)src + done, n - done, cudaMemcpyDeviceToHost, s),
                     "copy", "cudaMemcpyAsync D2H");
    if (st == KG_OK) st = kg_cuda_err(cudaStreamSynchronize(s), "copy", "cudaStreamSynchronize");
  }
  return st;
}

static kg_status check_deferred(int device);

extern "C" kg_status kg_cuda_memcpy(void *dst, kg_device ddev, const void *src, kg_device sdev, size_t n) {
  if (!n) return KG_OK;
  bool dcuda = ddev.type == KG_DEV_CUDA, scuda = sdev.type == KG_DEV_CUDA;
  if ((dcuda && !valid_device(ddev.index)) || (scuda && !valid_device(sdev.index)))
    return kg_error(KG_ERR_DEVICE, "copy", "no such cuda device (%d available)", kg_cuda_device_count());
  if (scuda && !dcuda && kg_cuda_capturing(sdev.index))
    return kg_error(KG_ERR_DEVICE, "copy",
                    "cannot read cuda:%d memory on the host while a CUDA graph is being captured "
                    "(item, tolist, cpu, print inside keng.cuda.graph's function)", sdev.index);
  if (dcuda && scuda && ddev.index != sdev.index) { /* peer: finish the source's queue first */
    if (kg_cuda_capturing(sdev.index) || kg_cuda_capturing(ddev.index))
      return kg_error(KG_ERR_DEVICE, "copy", "copies between devices cannot be captured in a CUDA graph");
    KG_TRY(kg_cuda_err(cudaStreamSynchronize(kg_cuda_stream(sdev.index)), "copy", "cudaStreamSynchronize"));
    return kg_cuda_err(cudaMemcpyPeerAsync(dst, ddev.index, src, sdev.index, n, kg_cuda_stream(ddev.index)), "copy",
                       "cudaMemcpyPeerAsync");
  }
  if (dcuda && scuda)
    return kg_cuda_err(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, kg_cuda_stream(ddev.index)), "copy",
                       "cudaMemcpyAsync D2D");
  if (dcuda) return h2d(dst, src, n, ddev.index); /* returns without waiting: src may be freed */
  if (scuda) { /* the host reads dst next: waits */
    KG_TRY(d2h(dst, src, n, sdev.index));
    return check_deferred(sdev.index);
  }
  return kg_error(KG_ERR_DEVICE, "copy", "kg_cuda_memcpy called without a cuda side");
}

/* After the host waited for the stream: reads the deferred-error slots if a graph that checks
 * indices ran since the last read; raises (and clears them) when one was set. */
static kg_status check_deferred(int device) {
  if (!deferred_armed[device]) return KG_OK;
  deferred_armed[device] = false;
  long long got[FLAG_SLOTS];
  cudaStream_t s = kg_cuda_stream(device); /* the compute stream, never the legacy one */
  KG_TRY(kg_cuda_err(cudaMemcpyAsync(got, deferred[device], sizeof got, cudaMemcpyDeviceToHost, s), "cuda.graph",
                     "reading the deferred checks"));
  KG_TRY(kg_cuda_err(cudaStreamSynchronize(s), "cuda.graph", "reading the deferred checks"));
  for (int i = 0; i < FLAG_SLOTS; i++)
    if (got[i] != no_errors[i]) {
      /* on the compute stream: a plain cudaMemcpy (the legacy stream) is not ordered before the
       * next replay on the non-blocking compute stream, which could then set a slot this clears */
      cudaMemcpyAsync(deferred[device], no_errors, sizeof no_errors, cudaMemcpyHostToDevice, s);
      cudaGetLastError();
      return kg_error(KG_ERR_VALUE, "cuda.graph", "an index or target was out of range in a replayed CUDA graph "
                      "or under keng.cuda.defer_checks (gather, index_select, embedding, scatter_add_, index_add_, "
                      "cross_entropy or multinomial; those entries were skipped): run the step eagerly to see which");
    }
  return KG_OK;
}

extern "C" kg_status kg_cuda_sync(int device) {
  if (!valid_device(device)) return kg_error(KG_ERR_DEVICE, "synchronize", "cuda:%d is not available", device);
  if (kg_cuda_capturing(device))
    return kg_error(KG_ERR_DEVICE, "synchronize", "cuda:%d is being captured into a CUDA graph: no synchronisation "
                    "inside keng.cuda.graph's function", device);
  KG_TRY(kg_cuda_err(cudaStreamSynchronize(kg_cuda_stream(device)), "synchronize", "cudaStreamSynchronize"));
  return check_deferred(device);
}

/* Pool usage of a device (kg_memory_get_stats): allocated = bytes in use, cached = reserved
 * but free, peak = high-water mark of bytes in use, graph = reserved for graph allocations. */
/* whether keng has used the device (its stream exists): stats and trims of an unused device
 * answer at once instead of creating a CUDA context there (hundreds of MB and ms) */
static bool in_use(int device) { return valid_device(device) && streams[device] != 0; }

extern "C" kg_memory_stats kg_cuda_memory_stats(int device) {
  kg_memory_stats st = {0, 0, 0, 0};
  cudaMemPool_t pool;
  if (!in_use(device) || cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) return st;
  uint64_t used = 0, reserved = 0, peak = 0, graph = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &peak);
  cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrReservedMemCurrent, &graph);
  cudaGetLastError();
  st.allocated = (size_t)used;
  st.cached = (size_t)(reserved > used ? reserved - used : 0);
  st.peak = (size_t)peak;
  st.graph = (size_t)graph;
  return st;
}

/* Hands the pool's free blocks and unused graph memory back to the driver (kg_memory_empty_cache
 * for cuda). Not while capturing: the wait would break the capture. */
extern "C" void kg_cuda_empty_cache(int device) {
  if (!in_use(device) || kg_cuda_capturing(device)) return;
  cudaStreamSynchronize(kg_cuda_stream(device));
  trim(device);
}

/* The pool's high-water mark restarts at its current use (the only reset CUDA allows is to 0). */
extern "C" void kg_cuda_reset_peak(int device) {
  cudaMemPool_t pool;
  if (!in_use(device) || cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) return;
  uint64_t zero = 0;
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
  cudaGetLastError();
}

/* ---- CUDA Graphs ---------------------------------------------------------------------------- */

__global__ void rng_set_kernel(uint64_t *buf, uint64_t seed, uint64_t offset) {
  buf[0] = seed;
  buf[1] = offset;
}

/* the slots (allocated and cleared once per device) */
static kg_status deferred_slots(int device, const char *op) {
  if (deferred[device]) return KG_OK;
  long long *p = NULL;
  KG_TRY(kg_cuda_err(cudaMalloc((void **)&p, sizeof no_errors), op, "cudaMalloc"));
  /* on the compute stream: ordered before the kernels launched or captured next (see check_deferred) */
  kg_status st = kg_cuda_err(cudaMemcpyAsync(p, no_errors, sizeof no_errors, cudaMemcpyHostToDevice,
                                             kg_cuda_stream(device)), op, "cudaMemcpyAsync");
  if (st) return cudaFree(p), st;
  deferred[device] = p;
  return KG_OK;
}

long long *kg_cuda_deferred_flags(int device) {
  if (device < 0 || device >= KG_CUDA_MAX_DEVICES) return NULL;
  capture *c = captures[device];
  if (c) c->checks = true;
  else if (deferring[device]) deferred_armed[device] = true; /* read at the next synchronisation */
  else return NULL;
  return deferred[device];
}

extern "C" bool kg_cuda_deferring(int device) {
  return device >= 0 && device < KG_CUDA_MAX_DEVICES && deferring[device];
}

extern "C" kg_status kg_cuda_defer_checks(int device, bool on, bool *was) {
  const char *op = "cuda.defer_checks";
  if (!valid_device(device)) return kg_error(KG_ERR_DEVICE, op, "cuda:%d is not available", device);
  if (on) KG_TRY(deferred_slots(device, op));
  if (was) *was = deferring[device];
  deferring[device] = on; /* turning it off keeps the slots armed: the next synchronisation reads them */
  return KG_OK;
}

kg_cuda_rng kg_cuda_rng_key(kg_philox_state st, int device) {
  capture *c = device >= 0 && device < KG_CUDA_MAX_DEVICES ? captures[device] : NULL;
  if (!c) return kg_cuda_rng{st.seed, st.offset, NULL};
  /* relative to the capture's start: a launch adds the position it reserved */
  return kg_cuda_rng{0, st.offset - c->rng0.offset, rng_bufs[device]};
}

extern "C" kg_status kg_cuda_graph_begin(int device) {
  const char *op = "cuda.graph";
  if (!valid_device(device)) return kg_error(KG_ERR_DEVICE, op, "cuda:%d is not available", device);
  if (captures[device]) return kg_error(KG_ERR_DEVICE, op, "cuda:%d is already being captured", device);
  cudaStream_t s = kg_cuda_stream(device);
  if (!rng_bufs[device]) /* plain cudaMalloc: lives forever, never a graph allocation */
    KG_TRY(kg_cuda_err(cudaMalloc((void **)&rng_bufs[device], 2 * sizeof(uint64_t)), op, "cudaMalloc"));
  KG_TRY(deferred_slots(device, op));
  capture *c = new capture;
  c->rng0 = kg_rng_reserve(0);
  c->checks = false;
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    delete c;
    return kg_cuda_err(e, op, "cudaStreamBeginCapture");
  }
  captures[device] = c;
  return KG_OK;
}

/* frees what a graph holds once its queued replays are done (handed to the capture in progress,
 * if any, since nothing may synchronise then) */
static void release_held(int device, std::vector<void *> &deferred, std::vector<void *> &pinned) {
  capture *c = captures[device];
  if (c) {
    pthread_mutex_lock(&lock);
    c->deferred.insert(c->deferred.end(), deferred.begin(), deferred.end());
    c->pinned.insert(c->pinned.end(), pinned.begin(), pinned.end());
    pthread_mutex_unlock(&lock);
  } else {
    cudaStream_t s = kg_cuda_stream(device);
    if (!pinned.empty()) cudaStreamSynchronize(s);
    for (void *p : deferred) cudaFreeAsync(p, s);
    for (void *p : pinned) cudaFreeHost(p);
    cudaGetLastError();
  }
  deferred.clear();
  pinned.clear();
}

extern "C" kg_status kg_cuda_graph_end(int device, kg_cuda_graph **out) {
  const char *op = "cuda.graph";
  *out = NULL;
  if (device < 0 || device >= KG_CUDA_MAX_DEVICES || !captures[device])
    return kg_error(KG_ERR_DEVICE, op, "cuda:%d is not being captured", device);
  capture *c = captures[device];
  cudaGraph_t graph = NULL;
  cudaError_t e = cudaStreamEndCapture(kg_cuda_stream(device), &graph);
  captures[device] = NULL;
  kg_cuda_graph *g = new kg_cuda_graph;
  g->device = device, g->graph = graph, g->exec = NULL, g->launches = 0;
  g->rng0 = c->rng0;
  g->rng_words = kg_rng_reserve(0).offset - c->rng0.offset;
  g->checks = c->checks;
  g->deferred.swap(c->deferred);
  g->pinned.swap(c->pinned);
  delete c;
  kg_status st = kg_cuda_err(e, op, "cudaStreamEndCapture (the capture was invalidated)");
  if (st == KG_OK && !graph) st = kg_error(KG_ERR_DEVICE, op, "the capture recorded nothing");
  if (st == KG_OK)
    st = kg_cuda_err(cudaGraphInstantiateWithFlags(&g->exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch), op,
                     "cudaGraphInstantiateWithFlags");
  if (st != KG_OK) {
    kg_cuda_graph_free(g);
    return st;
  }
  *out = g;
  return KG_OK;
}

extern "C" kg_status kg_cuda_graph_launch(kg_cuda_graph *g) {
  const char *op = "cuda.graph";
  if (!g || !g->exec) return kg_error(KG_ERR_VALUE, op, "no graph to launch");
  if (kg_cuda_capturing(g->device)) return kg_error(KG_ERR_DEVICE, op, "cannot launch a graph while capturing");
  cudaStream_t s = kg_cuda_stream(g->device);
  if (g->rng_words) { /* where this replay's random ops draw from */
    kg_philox_state at = g->launches == 0 ? g->rng0 : kg_rng_reserve(g->rng_words);
    rng_set_kernel<<<1, 1, 0, s>>>(rng_bufs[g->device], at.seed, at.offset);
    KG_TRY(kg_cuda_err(cudaGetLastError(), op, "rng_set_kernel"));
  }
  KG_TRY(kg_cuda_err(cudaGraphLaunch(g->exec, s), op, "cudaGraphLaunch"));
  g->launches++;
  if (g->checks) deferred_armed[g->device] = true;
  return kg_cuda_check(op, g->device);
}

extern "C" void kg_cuda_graph_free(kg_cuda_graph *g) {
  if (!g) return;
  if (!kg_cuda_capturing(g->device)) cudaStreamSynchronize(kg_cuda_stream(g->device));
  if (g->exec) cudaGraphExecDestroy(g->exec);
  if (g->graph) cudaGraphDestroy(g->graph);
  release_held(g->device, g->deferred, g->pinned);
  delete g;
}
