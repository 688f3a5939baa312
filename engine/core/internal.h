/* internal.h — engine-private helpers shared by engine/core, engine/ops and engine/cpu. */
#ifndef KENG_INTERNAL_H
#define KENG_INTERNAL_H

#include <keng/keng.h>

/* storage */
kg_status kg_storage_new(kg_storage **out, size_t nbytes, kg_device dev);
kg_storage *kg_storage_retain(kg_storage *s);
void kg_storage_release(kg_storage *s);

/* CPU pool: 64-byte aligned blocks, cached by size class. */
void *kg_cpu_alloc(size_t nbytes, size_t *rounded);
void kg_cpu_free(void *p, size_t rounded);

/* CUDA runtime entry points (engine/cuda/runtime.cu, or stubs when built without CUDA). */
void *kg_cuda_malloc(size_t nbytes, int device); /* NULL on failure (kg_last_error says why) */
/* As kg_cuda_malloc, with the reason: KG_ERR_OOM when the pool is exhausted even after giving
 * its free and unused graph memory back to the driver, KG_ERR_DEVICE for no such device. */
kg_status kg_cuda_alloc(void **out, size_t nbytes, int device);
void kg_cuda_free(void *p, int device);
/* The device's pool: used / free / peak-used bytes and graph memory; trim gives free pool and
 * unused graph memory back to the driver (after waiting for the device's queue; skipped while
 * the device is being captured). */
kg_memory_stats kg_cuda_memory_stats(int device);
void kg_cuda_empty_cache(int device);
void kg_cuda_reset_peak(int device);

/* Device memory as storages and kg_memory_* see it: by default the CUDA runtime above. A test
 * installs a recording fake in its place to check the accounting without a GPU
 * (tests/c/test_memory.c). */
typedef struct {
  kg_status (*alloc)(void **out, size_t nbytes, int device);
  void (*free)(void *p, int device);
  kg_memory_stats (*stats)(int device);
  void (*trim)(int device);
  void (*reset_peak)(int device);
  int (*count)(void);
} kg_device_memory;
/* Installs m (NULL: the CUDA runtime); returns the previous one. Not thread-safe: install it
 * before any device storage exists. */
const kg_device_memory *kg_memory_set_device(const kg_device_memory *m);
/* Copies n bytes between any two of cpu and cuda memory, ordered on the compute stream. */
kg_status kg_cuda_memcpy(void *dst, kg_device ddev, const void *src, kg_device sdev, size_t n);
kg_status kg_cuda_sync(int device);
/* (the CUDA Graph API is public: keng.h) */
bool kg_cuda_capturing(int device);
bool kg_cuda_deferring(int device); /* kg_cuda_defer_checks is on for the device */

/* kg_tensor_empty whose errors (bad shape, dtype or device) name op, the call the user made. */
kg_status kg_tensor_empty_op(kg_tensor **out, int ndim, const int64_t *shape, kg_dtype dt, kg_device dev,
                             const char *op);

/* Sizes: every dim size and every element count is at most KG_SIZE_MAX (2^59), so byte counts
 * and offsets of any dtype stay far from int64 overflow. kg_check_shape refuses a shape past it
 * (or with a negative or too many dims), naming op; every shape a tensor or view gets passes it.
 * Shape arithmetic (cat's sum, repeat's product, pads) goes through kg_size_add / kg_size_mul,
 * false when the exact result is negative or past KG_SIZE_MAX. */
#define KG_SIZE_MAX (INT64_MAX / 16)
kg_status kg_check_shape(const char *op, int ndim, const int64_t *shape);
static inline bool kg_size_add(int64_t a, int64_t b, int64_t *r) {
  return !__builtin_add_overflow(a, b, r) && *r >= 0 && *r <= KG_SIZE_MAX;
}
static inline bool kg_size_mul(int64_t a, int64_t b, int64_t *r) {
  return !__builtin_mul_overflow(a, b, r) && *r >= 0 && *r <= KG_SIZE_MAX;
}

/* Before an in-place write into dst (engine/core/tensor.c): refuses a dst with elements that
 * share memory (an expanded view) and an input in[i] that shares memory with dst otherwise than
 * element for element (same_ok: elementwise ops, where x:add_(x) is fine) or at all (same_ok
 * false: index ops, which read their inputs at other positions than they write). */
kg_status kg_check_overlap(const char *op, const kg_tensor *dst, int nin, const kg_tensor *const *in, bool same_ok);

/* A new contiguous output with x's device. */
static inline kg_status kg_new_like(kg_tensor **out, const kg_tensor *x, int ndim, const int64_t *shape,
                                    kg_dtype dt) {
  return kg_tensor_empty(out, ndim, shape, dt, x->device);
}

/* Checks that every tensor in ts (NULLs skipped) lives on the device of ts[0]. */
kg_status kg_check_same_device(const char *op, int n, const kg_tensor *const *ts);
/* Fails with KG_ERR_TYPE unless x is floating. */
kg_status kg_check_float(const char *op, const kg_tensor *x, const char *what);
kg_status kg_check_integer(const char *op, const kg_tensor *x, const char *what);

/* One element at element offset `off` from base, as double (slow paths only). */
double kg_load_as_double(const void *base, kg_dtype dt, int64_t off);
void kg_store_from_double(void *base, kg_dtype dt, int64_t off, double v);

/* Output shape of reducing x over the dims in mask (KG_DIMS_ALL = all). */
kg_status kg_reduce_shape(const char *op, const kg_tensor *x, uint32_t mask, bool keepdim, int *nd, int64_t *shape);

/* Shared by the index kernels of every backend (defined in engine/core/kernel_shared.c, below
 * the kernels: no kernel calls into engine/ops), so that their messages and view arithmetic
 * cannot drift apart. The error for index v outside
 * [0, t->shape[dim]): "index 7 out of range for dim 2 of size 5 (x [3,5])"; with name NULL
 * (an embedding table, dim 0) "index 7 out of range for table of 5 rows". */
kg_status kg_index_range_error(const char *op, int64_t v, const kg_tensor *t, int dim, const char *name);
/* cat and pad as copies into shallow views of the output, with the backend's kernels: copy
 * moves src into the strided view dst (op names the caller in errors), fill is its FILL. */
typedef kg_status (*kg_copy_view_fn)(const char *op, kg_tensor *dst, const kg_tensor *src);
kg_status kg_cat_into_views(const kg_op_call *c, kg_copy_view_fn copy);
kg_status kg_pad_into_views(const kg_op_call *c, kg_kernel_fn fill, kg_copy_view_fn copy);

/* Float to integer conversion for stores: a C cast of NaN or an out-of-range value is
 * undefined, so these saturate and send NaN to 0 (what CUDA's conversions do). u8 wraps modulo
 * 256 from the saturated i64, as a cast through int64 does. */
static inline int64_t kg_sat_i64(double v) {
  return v != v ? 0 : v >= 0x1p63 ? INT64_MAX : v < -0x1p63 ? INT64_MIN : (int64_t)v;
}
static inline int32_t kg_sat_i32(double v) {
  return v != v ? 0 : v >= 0x1p31 ? INT32_MAX : v < -0x1p31 ? INT32_MIN : (int32_t)v;
}
static inline uint8_t kg_sat_u8(double v) { return (uint8_t)kg_sat_i64(v); }
static inline int8_t kg_sat_i8(double v) { return (int8_t)(uint8_t)kg_sat_i64(v); } /* wraps, as u8 */

/* Fails naming op unless the number v can be stored in dtype dt without overflow (NaN and
 * infinities in an integer dtype, 300 in u8), as PyTorch's fill and scalar writes do. */
kg_status kg_check_value_fits(const char *op, double v, kg_dtype dt);

/* Messages speak the Lua API's 1-based positions (docs/lua_api.md): a 0-based dim or index i >= 0
 * prints as i + 1; a negative one (counted from the end) prints as given. Ids stored in index
 * tensors stay 0-based and print as they are. */
static inline long long kg_pos1(int64_t i) { return i >= 0 ? (long long)i + 1 : (long long)i; }

/* Releases each non-NULL tensor in a list. */
void kg_release_all(int n, kg_tensor **ts);

#define KG_TRY(expr)                 \
  do {                               \
    kg_status kg_try_s_ = (expr);    \
    if (kg_try_s_ != KG_OK) return kg_try_s_; \
  } while (0)

/* shape string temporaries for error messages */
#define KG_SHAPE(t, buf) kg_shape_str(buf, (t)->ndim, (t)->shape)

#endif
