/* keng.h — the engine's public C API: dtypes, devices, tensors, the op table, autograd.
 *
 * Conventions (docs/style.md): every function returns kg_status; on failure kg_last_error() names
 * the op and the shapes. Outputs come first and are marked [out]; a returned tensor is owned
 * by the caller (release with kg_tensor_release). Dimensions and indices are 0-based here;
 * the Lua binding converts 1-based positions. Nothing here knows about Lua.
 */
#ifndef KENG_H
#define KENG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KENG_VERSION "0.1.0"
#define KG_MAX_DIMS 8

/* ---- status and errors ---------------------------------------------------------------- */

typedef enum {
  KG_OK = 0,
  KG_ERR_VALUE,       /* bad argument value (negative size, bad dim, bad name) */
  KG_ERR_SHAPE,       /* shapes do not fit the op */
  KG_ERR_TYPE,        /* dtype not supported by the op */
  KG_ERR_DEVICE,      /* tensors on different devices, or no kernel for a device */
  KG_ERR_OOM,         /* allocation failed; message says asked and held bytes */
  KG_ERR_AUTOGRAD,    /* graph misuse: in-place on a saved tensor, backward twice */
  KG_ERR_IO,          /* file errors */
  KG_ERR_INTERRUPTED, /* kg_interrupt() was called during a long op */
} kg_status;

/* The thread-local message of the last failure, "op: what went wrong". */
const char *kg_last_error(void);
/* Sets the message (printf-style) and returns `code`, so callers can `return kg_error(...)`. */
kg_status kg_error(kg_status code, const char *op, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Formats a shape as "[2,3,4]" into buf (at least 8*21+3 bytes); returns buf. */
char *kg_shape_str(char *buf, int ndim, const int64_t *shape);
#define KG_SHAPE_STR_MAX 200

/* Requests that a running op stop at its next check (signal-safe); the op returns
 * KG_ERR_INTERRUPTED. kg_interrupted() polls and clears the flag. */
void kg_interrupt(void);
bool kg_interrupted(void);
/* Polls without clearing: long kernels check it between batch elements and stop early. */
bool kg_interrupt_pending(void);
/* Numerics guard: when on (or KENG_CHECK_NUMERICS=1), every cpu op checks its float outputs
 * after the kernel and fails naming the op and shapes on NaN (or on an Inf its inputs lacked). */
bool kg_check_numerics(void);
void kg_set_check_numerics(bool on);

/* ---- dtypes --------------------------------------------------------------------------- */

/* X(ENUM, name, C storage type, size in bytes, is_float) */
#define KG_DTYPES(X)                         \
  X(F32, "f32", float, 4, 1)                 \
  X(F64, "f64", double, 8, 1)                \
  X(BF16, "bf16", uint16_t, 2, 1)            \
  X(F16, "f16", uint16_t, 2, 1)              \
  X(I32, "i32", int32_t, 4, 0)               \
  X(I64, "i64", int64_t, 8, 0)               \
  X(BOOL, "bool", uint8_t, 1, 0)             \
  X(U8, "u8", uint8_t, 1, 0)                 \
  X(I8, "i8", int8_t, 1, 0) /* quantized weights (docs/quantization.md) */

typedef enum {
#define X(e, n, t, s, f) KG_##e,
  KG_DTYPES(X)
#undef X
      KG_DTYPE_COUNT
} kg_dtype;

typedef struct {
  const char *name;
  int size;
  bool is_float;
} kg_dtype_facts;
extern const kg_dtype_facts kg_dtype_info[KG_DTYPE_COUNT];

/* Parses "f32", "float32", "bfloat16"...; returns false on an unknown name. */
bool kg_dtype_from_name(const char *name, kg_dtype *out);
/* The dtype of a binary op's result (float wins over int, wider wins; bf16+f16 -> f32). */
kg_dtype kg_dtype_promote(kg_dtype a, kg_dtype b);
/* true when the number v can be stored in dtype dt without overflow (integers: in range, not NaN) */
bool kg_value_fits(double v, kg_dtype dt);

/* ---- devices -------------------------------------------------------------------------- */

typedef enum { KG_DEV_CPU = 0, KG_DEV_CUDA = 1, KG_DEV_META = 2, KG_DEVICE_TYPES = 3 } kg_device_type;
typedef struct {
  int8_t type;  /* kg_device_type */
  int8_t index; /* cuda ordinal; 0 otherwise */
} kg_device;

#define KG_CPU ((kg_device){KG_DEV_CPU, 0})
#define KG_META ((kg_device){KG_DEV_META, 0})
bool kg_device_from_name(const char *name, kg_device *out); /* "cpu", "cuda", "cuda:1", "meta" */
const char *kg_device_name(kg_device d, char buf[16]);
static inline bool kg_device_eq(kg_device a, kg_device b) { return a.type == b.type && a.index == b.index; }
bool kg_cuda_available(void);
int kg_cuda_device_count(void);
/* Waits for all queued work on a device (no-op on cpu/meta). */
kg_status kg_device_synchronize(kg_device d);
/* CUDA Graphs (engine/cuda/runtime.cu; keng.cuda.graph in Lua): begin captures the work queued
 * on cuda:device's compute stream (no kernel runs until a launch); end stops it and instantiates
 * the graph (*out NULL on failure); launch replays it (asynchronous); free waits for its replays
 * and frees what it holds. While capturing, ops that read device memory on the host or
 * synchronise raise an error. Without CUDA each call fails with KG_ERR_DEVICE. */
typedef struct kg_cuda_graph kg_cuda_graph;
kg_status kg_cuda_graph_begin(int device);
kg_status kg_cuda_graph_end(int device, kg_cuda_graph **out);
kg_status kg_cuda_graph_launch(kg_cuda_graph *g);
void kg_cuda_graph_free(kg_cuda_graph *g);
/* Deferred index checks on cuda:device (keng.cuda.defer_checks): while on, the ops that check
 * indices on the device (gather, index_select, embedding, scatter_add_, index_add_,
 * cross_entropy, multinomial) record a bad index in the device's deferred-error slots instead
 * of reading a flag back (a stream sync per call), skip it as a replayed graph does, and the
 * next synchronisation raises; *was gets the previous state (may be NULL). Without CUDA: a
 * no-op (CPU checks cost no sync). */
kg_status kg_cuda_defer_checks(int device, bool on, bool *was);

/* ---- storage and tensors -------------------------------------------------------------- */

typedef struct kg_storage {
  int refcount;
  void *data;        /* NULL on meta */
  size_t nbytes;
  kg_device device;
  uint64_t version;  /* bumped by every in-place write; autograd checks it */
  void (*release)(struct kg_storage *); /* frees data (pool, cuda, munmap) */
  void *owner;       /* for external memory (mmap) */
} kg_storage;

struct kg_node;

typedef struct kg_tensor {
  int refcount;
  int ndim;
  int64_t shape[KG_MAX_DIMS];
  int64_t stride[KG_MAX_DIMS]; /* in elements */
  int64_t offset;              /* in elements */
  kg_dtype dtype;
  kg_device device;
  kg_storage *storage;
  bool requires_grad;          /* leaf flag; non-leaf tensors have grad_fn */
  struct kg_tensor *grad;      /* accumulated gradient of a leaf */
  struct kg_node *grad_fn;     /* the node that made this tensor, NULL for leaves */
  int output_nr;               /* which output of grad_fn this is */
} kg_tensor;

/* A fresh contiguous tensor (uninitialised memory). shape may be NULL when ndim is 0. */
kg_status kg_tensor_empty(kg_tensor **out, int ndim, const int64_t *shape, kg_dtype dt, kg_device dev);
/* A tensor over memory the caller keeps alive through `owner`/`release` (mmap, foreign). */
kg_status kg_tensor_from_blob(kg_tensor **out, void *data, int ndim, const int64_t *shape, kg_dtype dt,
                              kg_device dev, void *owner, void (*release)(kg_storage *));
/* A view header sharing storage; shape/stride/offset given (no checks beyond bounds). */
kg_status kg_tensor_view_raw(kg_tensor **out, const kg_tensor *src, int ndim, const int64_t *shape,
                             const int64_t *stride, int64_t offset);
kg_tensor *kg_tensor_retain(kg_tensor *t);
void kg_tensor_release(kg_tensor *t);

int64_t kg_numel(const kg_tensor *t);
bool kg_is_contiguous(const kg_tensor *t);
static inline size_t kg_elem_size(const kg_tensor *t) { return (size_t)kg_dtype_info[t->dtype].size; }
/* Address of element 0 of the view (storage data + offset). */
static inline void *kg_data(const kg_tensor *t) {
  return t->storage->data ? (char *)t->storage->data + t->offset * (int64_t)kg_elem_size(t) : NULL;
}
bool kg_same_shape(const kg_tensor *a, const kg_tensor *b);
/* Marks an in-place write (bumps the storage version). */
static inline void kg_tensor_bump_version(kg_tensor *t) { t->storage->version++; }
/* Contiguous strides for a shape; returns numel. */
int64_t kg_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
/* Normalises a 0-based dim that may be negative (-1 = last); false if out of range. */
bool kg_wrap_dim(int *dim, int ndim);
/* Broadcast shapes a and b into out (NumPy rules); returns false if incompatible. */
bool kg_broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int *nout, int64_t *out);

/* Reads element i (in row-major order of the view) as double; slow, for printing/tests. */
double kg_get_flat(const kg_tensor *t, int64_t i);
void kg_set_flat(kg_tensor *t, int64_t i, double v);

/* ---- memory --------------------------------------------------------------------------- */

/* What a device's allocator holds (docs/cuda.md, "Memory accounting"). cpu: keng's block pool;
 * cuda: the device's stream-ordered pool (scratch of running kernels counts as allocated). */
typedef struct {
  size_t allocated; /* bytes in live tensors */
  size_t cached;    /* bytes held by the pool for reuse */
  size_t peak;      /* high-water mark of allocated */
  size_t graph;     /* cuda: bytes reserved for CUDA Graph allocations (freed with their graphs); 0 on cpu */
} kg_memory_stats;
kg_memory_stats kg_memory_get_stats(kg_device d);
/* Returns cached blocks to the system (cuda: the pool's free memory and unused graph memory;
 * waits for the device's queue). */
void kg_memory_empty_cache(kg_device d);
/* Restarts the device's peak at what is allocated now (to measure one phase, one benchmark row). */
void kg_memory_reset_peak(kg_device d);
/* kg_memory_empty_cache for the cpu and every cuda device. */
void kg_memory_empty_caches(void);
/* Bytes held by live storages on every device: what a collection of dead tensors can free. */
size_t kg_memory_storage_bytes(void);
/* Called with the byte count of each new storage on any device (the Lua binding steps its
 * collector in proportion: Lua sees neither host nor device tensor memory). */
void kg_memory_set_alloc_hook(void (*hook)(size_t nbytes, void *ud), void *ud);

/* ---- the op table --------------------------------------------------------------------- */

typedef enum {
#define KG_OP(id, name, kind, saves, grad) KG_OP_##id,
#include "../../ops/ops.def"
#undef KG_OP
  KG_OP_COUNT
} kg_op;

typedef enum { KG_KIND_KERNEL, KG_KIND_UNARY, KG_KIND_BINARY, KG_KIND_VIEW, KG_KIND_COMPOSITE, KG_KIND_INTERNAL } kg_op_kind;

/* One call of an op: what kernels and backward functions receive. */
typedef struct kg_op_call {
  kg_op op;
  int nin, nout;
  const kg_tensor *const *in;
  kg_tensor *const *out;
  const void *params; /* the op's params struct, or NULL */
} kg_op_call;
typedef kg_status (*kg_kernel_fn)(const kg_op_call *call);

struct kg_node;
/* Backward: dout[j] is the gradient of output j (NULL if none flowed); sets din[i] for each
 * input i with kg_node_needs_grad(node, i). din[i] may have a broadcast shape or a different
 * dtype: the engine sums it down to the input's shape and casts it. */
typedef kg_status (*kg_backward_fn)(struct kg_node *node, kg_tensor *const *dout, kg_tensor **din);

/* The flags of an elementwise row (engine/ops/elementwise.def); 0 for every other op. */
enum {
  KG_OPF_INT = 1,     /* integer operands give an integer result (else f32) */
  KG_OPF_COMPARE = 2, /* the result is bool */
  KG_OPF_INPLACE = 4, /* a binary op with an in-place form t:<name>_(u) */
};

typedef struct {
  const char *name;
  kg_op_kind kind;
  unsigned saves;
  bool differentiable;
  unsigned flags; /* KG_OPF_* */
  kg_kernel_fn kernel[KG_DEVICE_TYPES]; /* [cpu, cuda, meta]; NULL = none */
  kg_backward_fn backward;
} kg_op_facts;
extern const kg_op_facts kg_op_info[KG_OP_COUNT];
const char *kg_kind_name(kg_op_kind k);

/* The `saves` bits of ops.def: input i is bit i, output j is bit 16 + j. */
#define KG_SAVES_IN(i) (1u << (i))
#define KG_SAVES_OUT(j) (1u << (16 + (j)))

/* Runs op `op` on inputs -> outputs (outputs already allocated by the caller), dispatching on
 * the device of the first output, and records an autograd node when grad mode is on and an
 * input requires grad. params_size bytes of params are copied into the node. */
kg_status kg_op_run(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in,
                    const void *params, size_t params_size);
/* Dispatch only: no autograd (for in-place writes and kernels called by backward passes). */
kg_status kg_op_dispatch(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in,
                         const void *params);
/* Records a node for outputs computed without kg_op_run (views, composites with a fused path). */
kg_status kg_op_record(kg_op op, int nout, kg_tensor *const *out, int nin, const kg_tensor *const *in,
                       const void *params, size_t params_size);

/* ---- autograd ------------------------------------------------------------------------- */

typedef struct kg_edge {
  struct kg_node *fn; /* producer node of the input, or NULL */
  kg_tensor *leaf;    /* the input itself if it is a leaf that requires grad, or NULL */
  int output_nr;
} kg_edge;

typedef struct kg_tensor_meta {
  int ndim;
  int64_t shape[KG_MAX_DIMS];
  kg_dtype dtype;
  kg_device device;
} kg_tensor_meta;

typedef struct kg_node {
  int refcount;
  kg_op op;
  uint64_t seq;          /* creation order: a valid topological order */
  int nin, nout;
  kg_edge *next;         /* [nin] */
  kg_tensor_meta *in_meta;  /* [nin] */
  kg_tensor_meta *out_meta; /* [nout] */
  kg_tensor **saved_in;  /* [nin], NULL where not saved (detached views) */
  kg_tensor **saved_out; /* [nout] */
  uint64_t *saved_in_version, *saved_out_version;
  void *params;
  bool released;         /* saved tensors freed after the node ran */
  uint64_t visit;        /* backward pass bookkeeping */
  kg_tensor **grad_buf;  /* [nout] gradients gathered during backward */
} kg_node;

static inline bool kg_node_needs_grad(const kg_node *n, int i) { return n->next[i].fn || n->next[i].leaf; }
void kg_node_release(kg_node *n);

bool kg_grad_enabled(void);
/* Sets grad mode; returns the previous one (for no_grad scopes). */
bool kg_set_grad_enabled(bool on);
/* True if t is a leaf with requires_grad or has a grad_fn. */
static inline bool kg_requires_grad(const kg_tensor *t) { return t->requires_grad || t->grad_fn; }
/* Backpropagates from `root` (gradient `grad`, or ones if NULL and root has one element),
 * accumulating into leaves' .grad. Frees saved tensors unless retain_graph. */
kg_status kg_backward(kg_tensor *root, const kg_tensor *grad, bool retain_graph);
/* kg_backward that calls on_ready(leaf, ud) as soon as a leaf's .grad is final for this pass
 * (after the last node feeding it has run; a leaf fed by no node that ran is still reported),
 * so a caller can start using the gradient (data-parallel all-reduce) while backward goes on.
 * An error from on_ready stops the backward and is returned. */
typedef kg_status (*kg_grad_ready_fn)(kg_tensor *leaf, void *ud);
kg_status kg_backward_ex(kg_tensor *root, const kg_tensor *grad, bool retain_graph, kg_grad_ready_fn on_ready,
                         void *ud);
/* Reduces g (a broadcast of `shape`) to `shape` by summing; casts to dt. Returns new ref. */
kg_status kg_sum_to(kg_tensor **out, kg_tensor *g, int ndim, const int64_t *shape, kg_dtype dt);
/* Fails if a tensor about to be written in place requires grad under grad mode. */
kg_status kg_check_inplace(const char *op, const kg_tensor *t);

/* ---- random numbers ------------------------------------------------------------------- */

/* One counter-based generator (Philox4x32-10) per process: the seed plus an offset that every
 * random op advances by the number of 32-bit words it consumes, on any device. */
void kg_manual_seed(uint64_t seed);
typedef struct {
  uint64_t seed, offset;
} kg_philox_state;
/* The generator's position (for checkpoints) and putting it back. */
kg_philox_state kg_get_rng_state(void);
void kg_set_rng_state(kg_philox_state s);
/* Reserves n 32-bit words of the stream and returns where they start. */
kg_philox_state kg_rng_reserve(uint64_t n);

/* ---- environment switches (engine/core/env.def, docs/environment.md) ------------------- */

typedef enum {
#define KG_ENV(name, type, def, scope, doc) KG_ENV_##name,
#include "../../core/env.def"
#undef KG_ENV
  KG_ENV_COUNT
} kg_env_id;
typedef struct {
  const char *name, *type, *def, *scope, *doc; /* the columns of env.def, as written */
} kg_env_facts;
extern const kg_env_facts kg_env_info[KG_ENV_COUNT];
/* The variable's value, parsed by its type, as the environment had it when first read (unset or
 * empty: the default). Engine code reads KENG_* variables only through these. */
bool kg_env_bool(kg_env_id id);
long long kg_env_int(kg_env_id id);
double kg_env_float(kg_env_id id);
const char *kg_env_str(kg_env_id id);
bool kg_env_is_set(kg_env_id id); /* set and non-empty (and parsed) */
/* Reads the environment again: for the kernel lab, which setenv()s between variants (not while
 * other threads run kernels). */
void kg_env_reload(void);
/* Reads the environment now, warning on stderr about each KENG_* variable that is not in the
 * table (with the nearest name) and each value that does not parse; any accessor does this on
 * its first call. */
void kg_env_init(void);
/* Prints the table with each variable's value ("-": unset) to stdout (`keng --env`). */
void kg_env_print(void);
/* Prints the table with each variable's value ("-": unset) to stdout (`keng --env`). */
void kg_env_print(void);

/* ---- runtime -------------------------------------------------------------------------- */

/* Thread count for kernels and BLAS (engine/core/threads.c). A count given by KENG_NUM_THREADS,
 * OMP_NUM_THREADS or kg_set_num_threads is kept; without one, the count starts at the cores this
 * process may use and follows the load: cores other processes keep busy are left to them. */
int kg_num_threads(void);
void kg_set_num_threads(int n);
typedef struct {
  int current;        /* threads the next parallel region gets */
  int max;            /* cores this process may use (affinity mask, cgroup CPU quota) */
  int adaptive;       /* 1: current follows the load */
  double others;      /* cores other processes kept busy over the last window; -1: not measured yet */
  const char *source; /* "adaptive", "KENG_NUM_THREADS", "OMP_NUM_THREADS" or "set_num_threads" */
  double waiting;     /* cores' worth of time our threads sat runnable but not running, last window */
} kg_thread_policy;
kg_thread_policy kg_get_thread_policy(void);

/* the vector instructions the CPU kernels use: 2 AVX-512F, 1 AVX2 + FMA, 0 none (an older CPU, or
 * KENG_NO_SIMD=1: the kernels dispatched on it run their scalar fallbacks) */
int kg_cpu_simd(void);

/* A STREAM-style memory bandwidth micro-benchmark (keng.memory_bandwidth, engine/cpu/bandwidth.c):
 * the roofline of memory-bound kernels such as batch-1 decode, measured on the machine at hand. */
typedef struct {
  double read;  /* GB/s (1e9 B/s) of a read-only sum over one buffer of `bytes` */
  double triad; /* GB/s of a[i] = b[i] + s·c[i] over three f32 arrays of bytes / 3 each, counted
                   as STREAM counts it (3 × 4 bytes per element, the write-allocate read not counted) */
  int threads;
} kg_bandwidth;
/* best of `reps` passes of each kernel on `threads` threads (0: kg_num_threads()) over `bytes`
 * bytes in all (a buffer well past the last-level cache measures DRAM; a small one the cache) */
kg_status kg_cpu_bandwidth(kg_bandwidth *out, size_t bytes, int threads, int reps);
/* Called before each cpu op: applies the count the measuring thread (started by the first call)
 * decided; that thread decides KG_THREADS_SHORT_MS after ops start, then after each window
 * (kg_threads_window_ms) while they run. */
void kg_threads_poll(void);
#define KG_THREADS_SHORT_MS 50
#define KG_THREADS_WINDOW_MS 100
#define KG_THREADS_MAX_CPUS 1024
/* The decision, a plain function of one window's readings: `others` = busy cores of other
 * processes, `waiting` = cores' worth of time our threads sat runnable but not running. It drops
 * threads when ours queued (waiting >= KG_THREADS_WAIT_DOWN), adds them at once when a whole core
 * was idle, and otherwise, below max, tries one thread more for one window every probe_every_s
 * (doubled after each failed try up to KG_THREADS_PROBE_MAX_S, reset by a kept one). */
typedef struct {
  int current;          /* the count; the caller sets it, the step moves it */
  int probing;          /* 1: the count was raised by a probe for the window being measured */
  double since_s;       /* seconds since the count last moved */
  double probe_every_s; /* start at KG_THREADS_PROBE_MIN_S */
} kg_threads_state;
#define KG_THREADS_WAIT_DOWN 0.5
#define KG_THREADS_PROBE_MIN_S 1.0
#define KG_THREADS_PROBE_MAX_S 16.0
void kg_threads_step(kg_threads_state *st, int max, int ncpu, double others, double waiting, double window_s);
/* The next window's length in ms: KG_THREADS_SHORT_MS right after the count moved, a probe began
 * or ended (since_s == 0), KG_THREADS_WINDOW_MS otherwise. */
int kg_threads_window_ms(const kg_threads_state *st);
/* One reading: monotonic wall time, busy seconds of our cores (/proc/stat), this process's CPU,
 * and the run-queue wait of its threads (/proc/self/task/N/schedstat). */
typedef struct {
  double wall_s, busy_s, own_s, delay_s;
} kg_cpu_sample;
/* Cores other processes kept busy between two readings (>= 0). */
double kg_threads_others(const kg_cpu_sample *a, const kg_cpu_sample *b);
/* Busy seconds (all but idle and iowait, steal included) summed over the "cpuN" lines of
 * /proc/stat text whose N has cpus[N] set (N < ncpus); returns the number of lines summed. */
int kg_proc_stat_busy(const char *text, const unsigned char *cpus, int ncpus, double hz, double *busy_s);
/* Cores a cgroup v2 cpu.max line ("150000 100000" -> 2, rounded up) allows; 0 for "max" or junk. */
int kg_cgroup_cpu_limit(const char *cpu_max);
/* KENG_DEBUG level (0 = off): 1 logs each op with shapes, dtype, device and time. */
int kg_debug_level(void);
void kg_log(const char *fmt, ...);
/* Op profile: between kg_profile_start (clears it) and kg_profile_stop, every op that runs adds
 * its wall time (device synchronised), call count and counted FLOPs to an entry per distinct
 * "op dtype[shape]... -> dtype[shape]..." line (the KENG_DEBUG format without the time). At
 * most KG_PROFILE_MAX entries; later new lines are counted in the last one, "(other)". */
#define KG_PROFILE_MAX 4096
typedef struct {
  char line[256];
  const char *op;
  uint64_t calls, flops;
  double ms;
} kg_profile_entry;
void kg_profile_start(void);
void kg_profile_stop(void);
void kg_profile_clear(void);
bool kg_profiling(void);
/* the entries in first-seen order; *n their count (valid until the next kg_profile_start) */
const kg_profile_entry *kg_profile_entries(int *n);
/* FLOPs counted by matmul, convolution and attention since start (for the benchmarks). */
uint64_t kg_flop_count(void);
void kg_flop_add(uint64_t n);
/* For an algorithm that does fewer FLOPs than the direct formula (Winograd convolution): adds
 * `direct` to kg_flop_count (what every peer counts for the op) and `performed` to
 * kg_flop_count_performed (what the CPU actually executed). kg_flop_add adds n to both. */
void kg_flop_add_algo(uint64_t direct, uint64_t performed);
uint64_t kg_flop_count_performed(void);
/* TF32 tensor cores for f32 matmul (cuBLASLt) and convolution (cuDNN) on cuda; off by default
 * (results then match f32 FMA arithmetic). No effect on the CPU. */
void kg_set_allow_tf32(bool on);
bool kg_allow_tf32(void);
/* cuDNN's fused attention for scaled_dot_product_attention on cuda where it applies (bf16/f16,
 * see engine/cuda/sdpa_plan.h); on by default; off = keng's flash kernel always. */
void kg_set_cudnn_sdpa(bool on);
bool kg_cudnn_sdpa(void);
/* every scaled_dot_product_attention call through the math route (GEMM -> masked softmax -> GEMM
 * of engine ops, engine/ops/sdpa_route.h) on every device; off by default (debugging, checks). */
void kg_set_sdpa_math(bool on);
bool kg_sdpa_math(void);
/* counters of the cuDNN attention path since start (debug): calls it ran, plans built, plan
 * builds cuDNN refused, launches that failed (then the flash kernel ran), and calls left to the
 * flash kernel by reason (index = kg_sdpa_reason of engine/ops/sdpa_route.h; names below). */
typedef struct {
  uint64_t cudnn_calls, plans_built, build_failures, exec_failures;
  uint64_t fallback[16];
  uint64_t routes[4]; /* calls per route of engine/ops/sdpa_route.h: cpu, cudnn, flash, math */
} kg_sdpa_stats;
void kg_sdpa_stats_get(kg_sdpa_stats *out);
/* The names of kg_sdpa_stats' slots (keng.backends.cudnn_sdpa_stats): fallback[i] is the
 * router's kg_sdpa_reason name ("dtype", "head_dim", ...), except slot 0, which counts calls
 * declined for no reason of the rules (during a CUDA Graph capture, or no workspace memory) and is
 * named "other"; routes[i] "cpu", "cudnn", "flash", "math". NULL past the last slot. */
const char *kg_sdpa_fallback_name(int i);
const char *kg_sdpa_route_stat_name(int i);
/* field: 0 calls, 1 built, 2 build fail, 3 exec fail, 4 fallback (by reason), 5 route (reason = route) */
void kg_sdpa_stat_add(int field, int reason);

#include "ops_api.h"
#include "io.h"

#ifdef __cplusplus
}
#endif
#endif
