/* bandwidth.h — a STREAM-style memory bandwidth micro-benchmark (keng.memory_bandwidth): the
 * roofline of memory-bound kernels such as batch-1 decode, measured on the machine at hand. */
#ifndef KENG_CPU_BANDWIDTH_H
#define KENG_CPU_BANDWIDTH_H

#include <keng/keng.h>

typedef struct {
  double read;  /* GB/s (1e9 B/s) of a read-only sum over one buffer of `bytes` */
  double triad; /* GB/s of a[i] = b[i] + s·c[i] over three f32 arrays of bytes / 3 each, counted
                   as STREAM counts it (3 × 4 bytes per element, the write-allocate read not counted) */
  int threads;
} kg_bandwidth;

/* best of `reps` passes of each kernel on `threads` threads (0: kg_num_threads()) over `bytes`
 * bytes in all (a buffer well past the last-level cache measures DRAM; a small one the cache) */
kg_status kg_cpu_bandwidth(kg_bandwidth *out, size_t bytes, int threads, int reps);

#endif
