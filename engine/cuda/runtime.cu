/* runtime.cu — the CUDA runtime entry points of internal.h: device queries, one compute stream
 * per device, memory from the stream-ordered pool (cudaMallocAsync, release threshold set high
 * so freed blocks stay cached), copies between cpu and cuda ordered on that stream, sync, and
 * the launch check that KENG_SYNC=1 makes synchronous.
 *
 * With no driver or no GPU every query answers "none" (false / 0) and nothing else is called.
 */
#include "cuda.cuh"

#include <pthread.h>
#include <stdlib.h>

#define KG_CUDA_MAX_DEVICES 16

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int device_count = -1;
static cudaStream_t streams[KG_CUDA_MAX_DEVICES];
static int sync_mode = -1;

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
      uint64_t keep = UINT64_MAX; /* never hand freed memory back to the driver on sync */
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
  if (sync_mode < 0) {
    const char *e = getenv("KENG_SYNC");
    sync_mode = e && atoi(e) > 0;
  }
  KG_TRY(kg_cuda_err(cudaGetLastError(), op, "kernel launch"));
  if (sync_mode) KG_TRY(kg_cuda_err(cudaStreamSynchronize(kg_cuda_stream(device)), op, "kernel (KENG_SYNC=1)"));
  return KG_OK;
}

static bool valid_device(int device) { return device >= 0 && device < kg_cuda_device_count(); }

extern "C" void *kg_cuda_malloc(size_t nbytes, int device) {
  if (!valid_device(device)) {
    kg_error(KG_ERR_DEVICE, "cuda", "cuda:%d is not available (%d device(s))", device, kg_cuda_device_count());
    return NULL;
  }
  cudaStream_t s = kg_cuda_stream(device);
  void *p = NULL;
  cudaError_t e = cudaMallocAsync(&p, nbytes, s);
  if (e == cudaErrorMemoryAllocation) { /* give cached blocks back and try once more */
    cudaGetLastError();
    cudaMemPool_t pool;
    cudaStreamSynchronize(s);
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
    e = cudaMallocAsync(&p, nbytes, s);
  }
  if (e != cudaSuccess) {
    kg_cuda_err(e, "cuda", "cudaMallocAsync");
    return NULL;
  }
  return p;
}

extern "C" void kg_cuda_free(void *p, int device) {
  if (!p || !valid_device(device)) return;
  cudaFreeAsync(p, kg_cuda_stream(device)); /* ordered after every queued use on the stream */
  cudaGetLastError();                        /* at exit the runtime may already be gone */
}

extern "C" kg_status kg_cuda_memcpy(void *dst, kg_device ddev, const void *src, kg_device sdev, size_t n) {
  if (!n) return KG_OK;
  bool dcuda = ddev.type == KG_DEV_CUDA, scuda = sdev.type == KG_DEV_CUDA;
  if ((dcuda && !valid_device(ddev.index)) || (scuda && !valid_device(sdev.index)))
    return kg_error(KG_ERR_DEVICE, "copy", "no such cuda device (%d available)", kg_cuda_device_count());
  if (dcuda && scuda && ddev.index != sdev.index) { /* peer: finish the source's queue first */
    KG_TRY(kg_cuda_err(cudaStreamSynchronize(kg_cuda_stream(sdev.index)), "copy", "cudaStreamSynchronize"));
    return kg_cuda_err(cudaMemcpyPeerAsync(dst, ddev.index, src, sdev.index, n, kg_cuda_stream(ddev.index)), "copy",
                       "cudaMemcpyPeerAsync");
  }
  if (dcuda && scuda)
    return kg_cuda_err(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, kg_cuda_stream(ddev.index)), "copy",
                       "cudaMemcpyAsync D2D");
  if (dcuda) /* from pageable host memory: returns once src has been staged, so src may be freed */
    return kg_cuda_err(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, kg_cuda_stream(ddev.index)), "copy",
                       "cudaMemcpyAsync H2D");
  if (scuda) { /* the host reads dst next: wait for it */
    cudaStream_t s = kg_cuda_stream(sdev.index);
    KG_TRY(kg_cuda_err(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s), "copy", "cudaMemcpyAsync D2H"));
    return kg_cuda_err(cudaStreamSynchronize(s), "copy", "cudaStreamSynchronize");
  }
  return kg_error(KG_ERR_DEVICE, "copy", "kg_cuda_memcpy called without a cuda side");
}

extern "C" kg_status kg_cuda_sync(int device) {
  if (!valid_device(device)) return kg_error(KG_ERR_DEVICE, "synchronize", "cuda:%d is not available", device);
  return kg_cuda_err(cudaStreamSynchronize(kg_cuda_stream(device)), "synchronize", "cudaStreamSynchronize");
}

/* Pool usage of a device (for kg_memory_get_stats once alloc.c asks for it): allocated = bytes
 * in use, cached = reserved but free, peak = high-water mark of reserved bytes. */
extern "C" kg_memory_stats kg_cuda_memory_stats(int device) {
  kg_memory_stats st = {0, 0, 0};
  cudaMemPool_t pool;
  if (!valid_device(device) || cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) return st;
  uint64_t used = 0, reserved = 0, peak = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &peak);
  cudaGetLastError();
  st.allocated = (size_t)used;
  st.cached = (size_t)(reserved > used ? reserved - used : 0);
  st.peak = (size_t)peak;
  return st;
}

/* Hands the pool's free blocks back to the driver (kg_memory_empty_cache for cuda). */
extern "C" void kg_cuda_empty_cache(int device) {
  cudaMemPool_t pool;
  if (!valid_device(device)) return;
  cudaStreamSynchronize(kg_cuda_stream(device));
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
  cudaGetLastError();
}
