/* dist.c — processes and cpu collectives through MPI (see dist.h). bf16/f16 reduce in f32 (MPI has
 * no 16-bit float type); broadcast and gather move bytes. */
#include "dist.h"

#include "../core/internal.h"
#include <keng/ops_api.h>
#ifdef KENG_HAVE_MPI
#include <mpi.h>
#else
#include "mpi_none.h"
#endif
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool inited, use_mpi;
static int g_rank, g_world = 1, g_local;

/* exit status 0: MPI_Finalize; anything else (a script that raised) aborts the whole job, so the
 * other ranks do not wait forever in their next collective. */
static void at_exit(int status, void *ud) {
  (void)ud;
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  if (status != 0) {
    fprintf(stderr, "keng.distributed: rank %d exited with status %d, aborting the job\n", g_rank, status);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  MPI_Finalize();
}

static const char *env(const char *k) {
  const char *v = getenv(k);
  return v && *v ? v : NULL;
}

kg_status kg_dist_init(void) {
  if (inited) return KG_OK;
  /* Open MPI's mpirun, PMIx (srun --mpi=pmix, prterun), PMI/PMI2 (MPICH, srun --mpi=pmi2): a
   * singleton MPI_Init would start a runtime daemon for nothing, so a plain `keng x.lua` skips it */
  bool launched = env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_RANK") || env("PMI_SIZE");
  if (launched && !kg_dist_mpi_built()) /* else each rank would run alone as rank 0 of 1 */
    return kg_error(KG_ERR_VALUE, "distributed.init",
                    "this process was started by an MPI launcher, but this keng was built without MPI "
                    "(cmake -DKENG_MPI=ON with libopenmpi-dev installed)");
  if (launched) {
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
      int provided;
      if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return kg_error(KG_ERR_VALUE, "distributed.init", "MPI_Init failed");
      on_exit(at_exit, NULL);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g_local);
    MPI_Comm_free(&node);
    use_mpi = true;
  }
  inited = true;
  return KG_OK;
}

bool kg_dist_using_mpi(void) { return use_mpi; }
#ifdef KENG_HAVE_MPI
bool kg_dist_mpi_built(void) { return true; }
#else
bool kg_dist_mpi_built(void) { return false; }
#endif
int kg_dist_rank(void) { return g_rank; }
int kg_dist_world_size(void) { return g_world; }
int kg_dist_local_rank(void) { return g_local; }

static kg_status mpi_err(int rc, const char *op) {
  if (rc == MPI_SUCCESS) return KG_OK;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return kg_error(KG_ERR_VALUE, op, "MPI error on rank %d: %s", g_rank, msg);
}

/* Seconds a collective waits for the other ranks (KENG_DIST_TIMEOUT, default 1800): a rank that
 * hangs rather than exits would otherwise hang the job. */
double kg_dist_timeout_s(void) {
  static double t = -1;
  if (t < 0) {
    double v = kg_env_float(KG_ENV_KENG_DIST_TIMEOUT);
    t = v > 0 ? v : 1800;
  }
  return t;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits for a non-blocking collective (rc: what starting it returned). Polls, sleeping a little
 * between tests after the first ones, until done or the timeout: then the error names the rank;
 * the collective cannot be cancelled, so the job is over (the exit aborts it). */
static kg_status mpi_wait(int rc, MPI_Request *req, const char *op) {
  if (rc != MPI_SUCCESS) return mpi_err(rc, op);
  double end = now_s() + kg_dist_timeout_s();
  for (long spins = 0;; spins++) {
    int done = 0;
    rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_err(rc, op);
    if (done) return KG_OK;
    if (spins > 1000) {
      if (now_s() > end)
        return kg_error(KG_ERR_VALUE, op, "rank %d waited %.0f s for the other ranks (KENG_DIST_TIMEOUT)", g_rank,
                        kg_dist_timeout_s());
      nanosleep(&(struct timespec){0, 50000}, NULL);
    }
  }
}

static kg_status need_init(const char *op) {
  if (!inited) return kg_error(KG_ERR_VALUE, op, "call keng.distributed.init() first");
  return KG_OK;
}

kg_status kg_dist_setup(kg_device dev) {
  KG_TRY(need_init("setup"));
  if (dev.type != KG_DEV_CUDA) return KG_OK;
  if (!kg_nccl_available()) return kg_error(KG_ERR_DEVICE, "setup", "cuda tensors need NCCL, and this keng was built without it");
  return kg_nccl_setup(dev.index);
}

kg_status kg_dist_comm_rule(const char *op, int device, bool have_comm, bool capturing) {
  if (have_comm || !capturing) return KG_OK;
  return kg_error(KG_ERR_DEVICE, op,
                  "cuda:%d has no NCCL communicator yet, and none can be made while a CUDA graph is being captured: "
                  "call keng.distributed.setup(\"cuda:%d\") before capturing (data_parallel and tensor_parallel do)",
                  device, device);
}

kg_status kg_dist_barrier(void) {
  KG_TRY(need_init("barrier"));
  if (!use_mpi) return KG_OK;
  MPI_Request req;
  return mpi_wait(MPI_Ibarrier(MPI_COMM_WORLD, &req), &req, "barrier");
}

kg_status kg_dist_bcast_bytes(void *buf, size_t n, int root) {
  if (!use_mpi) return KG_OK;
  MPI_Request req;
  return mpi_wait(MPI_Ibcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD, &req), &req, "broadcast");
}

/* Every rank's dtype, device type and shape agree (one small all-gather); else an error on every
 * rank listing them all, so the whole job raises the same message. */
static kg_status check_same(const char *op, const kg_tensor *t) {
  if (!use_mpi) return KG_OK;
  enum { W = KG_MAX_DIMS + 3 };
  int64_t mine[W] = {t->ndim, t->dtype, t->device.type};
  for (int d = 0; d < t->ndim; d++) mine[3 + d] = t->shape[d];
  int64_t *all = malloc(sizeof(int64_t) * W * g_world);
  if (!all) return kg_error(KG_ERR_OOM, op, "no memory for the shape check");
  MPI_Request req;
  kg_status s = mpi_wait(MPI_Iallgather(mine, W, MPI_INT64_T, all, W, MPI_INT64_T, MPI_COMM_WORLD, &req), &req, op);
  bool same = true;
  for (int r = 1; s == KG_OK && r < g_world; r++) same = same && memcmp(all, all + r * W, sizeof mine) == 0;
  if (s == KG_OK && !same) {
    char msg[1024] = "", buf[KG_SHAPE_STR_MAX], dev[16];
    size_t len = 0;
    for (int r = 0; r < g_world && len < sizeof msg - 64; r++) {
      const int64_t *e = all + r * W;
      len += (size_t)snprintf(msg + len, sizeof msg - len, "%srank %d %s %s%s", r ? ", " : "", r,
                              kg_dtype_info[e[1]].name, kg_device_name((kg_device){(int8_t)e[2], 0}, dev),
                              kg_shape_str(buf, (int)e[0], e + 3));
    }
    s = kg_error(KG_ERR_SHAPE, op, "the ranks' tensors differ: %s", msg);
  }
  free(all);
  return s;
}

static MPI_Datatype mpi_type(kg_dtype dt) {
  switch (dt) {
    case KG_F32: return MPI_FLOAT;
    case KG_F64: return MPI_DOUBLE;
    case KG_I32: return MPI_INT32_T;
    case KG_I64: return MPI_INT64_T;
    case KG_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(kg_dist_op op) {
  return op == KG_DIST_MAX ? MPI_MAX : op == KG_DIST_MIN ? MPI_MIN : MPI_SUM;
}

/* the dtype the reduction runs in: 16-bit floats in f32 */
static kg_dtype reduce_dtype(kg_dtype dt) { return dt == KG_BF16 || dt == KG_F16 ? KG_F32 : dt; }

static kg_status check_reduce(const char *op, const kg_tensor *t, kg_dist_op rop) {
  if (t->dtype == KG_BOOL) return kg_error(KG_ERR_TYPE, op, "bool tensors cannot be reduced (use u8 or i32)");
  if (rop == KG_DIST_AVG && !kg_dtype_info[t->dtype].is_float)
    return kg_error(KG_ERR_TYPE, op, "op \"avg\" needs a float tensor, got %s", kg_dtype_info[t->dtype].name);
  return KG_OK;
}

static void scale(kg_tensor *t, double f) { /* t contiguous f32 or f64 */
  int64_t n = kg_numel(t);
  if (t->dtype == KG_F32) {
    float *p = kg_data(t);
    for (int64_t i = 0; i < n; i++) p[i] = (float)(p[i] * f);
  } else {
    double *p = kg_data(t);
    for (int64_t i = 0; i < n; i++) p[i] *= f;
  }
}

/* A contiguous tensor of dtype dt holding x's values: x itself (retained) when it already is one. */
static kg_status work_copy(kg_tensor **out, const kg_tensor *x, kg_dtype dt) {
  if (x->dtype == dt) return kg_contiguous(out, x);
  return kg_to(out, x, dt, x->device);
}

static kg_status check_device(const char *op, const kg_tensor *t) {
  if (t->device.type == KG_DEV_CUDA && !kg_nccl_available())
    return kg_error(KG_ERR_DEVICE, op, "cuda tensors need NCCL, and this keng was built without it");
  if (t->device.type == KG_DEV_META) return kg_error(KG_ERR_DEVICE, op, "meta tensors hold no data");
  /* MPI counts are ints: byte counts (broadcast, gather) must fit */
  if (t->device.type == KG_DEV_CPU && kg_numel(t) * (int64_t)kg_elem_size(t) > INT_MAX) {
    char buf[KG_SHAPE_STR_MAX];
    return kg_error(KG_ERR_SHAPE, op, "%s %s is over 2^31 - 1 bytes, more than one MPI call moves: split it",
                    kg_dtype_info[t->dtype].name, kg_shape_str(buf, t->ndim, t->shape));
  }
  return KG_OK;
}

kg_status kg_dist_all_reduce(kg_tensor *t, kg_dist_op op) {
  KG_TRY(need_init("all_reduce"));
  KG_TRY(check_device("all_reduce", t));
  KG_TRY(check_reduce("all_reduce", t, op));
  KG_TRY(kg_check_inplace("all_reduce", t));
  KG_TRY(check_same("all_reduce", t));
  /* cuda: NCCL even alone (a real communicator of one: the path a single-GPU run can check) */
  if ((g_world == 1 && t->device.type != KG_DEV_CUDA) || kg_numel(t) == 0) return KG_OK;
  kg_tensor *w;
  bool cuda = t->device.type == KG_DEV_CUDA;
  KG_TRY(work_copy(&w, t, cuda ? t->dtype : reduce_dtype(t->dtype)));
  kg_status s;
  if (cuda) {
    s = kg_nccl_run(KG_NCCL_ALL_REDUCE, w, w, op, 0);
  } else {
    MPI_Request req;
    s = mpi_wait(MPI_Iallreduce(MPI_IN_PLACE, kg_data(w), (int)kg_numel(w), mpi_type(w->dtype), mpi_op(op),
                                MPI_COMM_WORLD, &req), &req, "all_reduce");
    if (s == KG_OK && op == KG_DIST_AVG) scale(w, 1.0 / g_world);
  }
  if (s == KG_OK && w != t) s = kg_copy_(t, w);
  if (s == KG_OK && w == t) kg_tensor_bump_version(t);
  kg_tensor_release(w);
  return s;
}

struct kg_dist_work {
  MPI_Request req; /* MPI_REQUEST_NULL: nothing in flight (world 1, cuda, empty) */
  kg_tensor *t, *w; /* w: the contiguous buffer reduced (t itself, or a copy in the reduce dtype) */
  kg_dist_op op;
};

kg_status kg_dist_all_reduce_start(kg_tensor *t, kg_dist_op op, kg_dist_work **work) {
  KG_TRY(need_init("all_reduce"));
  KG_TRY(check_device("all_reduce", t));
  KG_TRY(check_reduce("all_reduce", t, op));
  kg_dist_work *k = calloc(1, sizeof *k);
  if (!k) return kg_error(KG_ERR_OOM, "all_reduce", "no memory for a started all-reduce");
  k->req = MPI_REQUEST_NULL, k->op = op, k->t = kg_tensor_retain(t);
  bool cuda = t->device.type == KG_DEV_CUDA;
  kg_status s = KG_OK;
  if ((g_world > 1 || cuda) && kg_numel(t) > 0) {
    s = work_copy(&k->w, t, cuda ? t->dtype : reduce_dtype(t->dtype));
    if (s == KG_OK && cuda) s = kg_nccl_run(KG_NCCL_ALL_REDUCE, k->w, k->w, op, 0);
    else if (s == KG_OK)
      s = mpi_err(MPI_Iallreduce(MPI_IN_PLACE, kg_data(k->w), (int)kg_numel(k->w), mpi_type(k->w->dtype), mpi_op(op),
                                 MPI_COMM_WORLD, &k->req),
                  "all_reduce");
  }
  if (s != KG_OK) {
    if (k->w) kg_tensor_release(k->w);
    kg_tensor_release(k->t);
    free(k);
    return s;
  }
  *work = k;
  return KG_OK;
}

kg_status kg_dist_test(kg_dist_work *k, bool *done) {
  int flag = 1;
  if (k->req != MPI_REQUEST_NULL) KG_TRY(mpi_err(MPI_Test(&k->req, &flag, MPI_STATUS_IGNORE), "all_reduce"));
  *done = flag != 0;
  return KG_OK;
}

kg_status kg_dist_wait(kg_dist_work *k) {
  kg_status s = KG_OK;
  if (k->req != MPI_REQUEST_NULL) s = mpi_wait(MPI_SUCCESS, &k->req, "all_reduce");
  if (s == KG_OK && k->w && !(k->t->device.type == KG_DEV_CUDA) && k->op == KG_DIST_AVG) scale(k->w, 1.0 / g_world);
  if (s == KG_OK && k->w && k->w != k->t) s = kg_copy_(k->t, k->w);
  if (s == KG_OK && k->w == k->t) kg_tensor_bump_version(k->t);
  if (k->w) kg_tensor_release(k->w);
  kg_tensor_release(k->t);
  free(k);
  return s;
}

kg_status kg_dist_broadcast(kg_tensor *t, int root) {
  KG_TRY(need_init("broadcast"));
  if (root < 0 || root >= g_world)
    return kg_error(KG_ERR_VALUE, "broadcast", "root %d is not a rank (world size %d, ranks are 0-based)", root, g_world);
  KG_TRY(check_device("broadcast", t));
  KG_TRY(kg_check_inplace("broadcast", t));
  KG_TRY(check_same("broadcast", t));
  if ((g_world == 1 && t->device.type != KG_DEV_CUDA) || kg_numel(t) == 0) return KG_OK;
  kg_tensor *w;
  KG_TRY(kg_contiguous(&w, t));
  kg_status s;
  if (t->device.type == KG_DEV_CUDA) {
    s = kg_nccl_run(KG_NCCL_BROADCAST, w, w, KG_DIST_SUM, root);
  } else {
    MPI_Request req;
    s = mpi_wait(MPI_Ibcast(kg_data(w), (int)(kg_numel(w) * (int64_t)kg_elem_size(w)), MPI_BYTE, root, MPI_COMM_WORLD,
                            &req), &req, "broadcast");
  }
  if (s == KG_OK && w != t) s = kg_copy_(t, w);
  if (s == KG_OK && w == t) kg_tensor_bump_version(t);
  kg_tensor_release(w);
  return s;
}

kg_status kg_dist_all_gather(kg_tensor **out, const kg_tensor *t) {
  KG_TRY(need_init("all_gather"));
  KG_TRY(check_device("all_gather", t));
  KG_TRY(check_same("all_gather", t));
  if (t->ndim >= KG_MAX_DIMS)
    return kg_error(KG_ERR_SHAPE, "all_gather", "a %d-dim tensor leaves no room for the rank dim", t->ndim);
  int64_t shape[KG_MAX_DIMS] = {g_world};
  memcpy(shape + 1, t->shape, sizeof(int64_t) * t->ndim);
  kg_tensor *w, *o = NULL;
  KG_TRY(kg_contiguous(&w, t));
  kg_status s = kg_tensor_empty(&o, t->ndim + 1, shape, t->dtype, t->device);
  if (s == KG_OK && kg_numel(t) > 0) {
    if (t->device.type == KG_DEV_CUDA) {
      s = kg_nccl_run(KG_NCCL_ALL_GATHER, o, w, KG_DIST_SUM, 0);
    } else if (!use_mpi) {
      memcpy(kg_data(o), kg_data(w), (size_t)kg_numel(w) * kg_elem_size(w));
    } else {
      int n = (int)(kg_numel(w) * (int64_t)kg_elem_size(w));
      MPI_Request req;
      s = mpi_wait(MPI_Iallgather(kg_data(w), n, MPI_BYTE, kg_data(o), n, MPI_BYTE, MPI_COMM_WORLD, &req), &req,
                   "all_gather");
    }
  }
  kg_tensor_release(w);
  if (s != KG_OK) {
    if (o) kg_tensor_release(o);
    return s;
  }
  *out = o;
  return KG_OK;
}

kg_status kg_dist_reduce_scatter(kg_tensor **out, const kg_tensor *t, kg_dist_op op) {
  KG_TRY(need_init("reduce_scatter"));
  KG_TRY(check_device("reduce_scatter", t));
  KG_TRY(check_reduce("reduce_scatter", t, op));
  KG_TRY(check_same("reduce_scatter", t));
  char buf[KG_SHAPE_STR_MAX];
  if (t->ndim == 0 || t->shape[0] % g_world != 0)
    return kg_error(KG_ERR_SHAPE, "reduce_scatter", "dim 1 of %s must be a multiple of the world size %d",
                    kg_shape_str(buf, t->ndim, t->shape), g_world);
  int64_t shape[KG_MAX_DIMS];
  memcpy(shape, t->shape, sizeof(int64_t) * t->ndim);
  shape[0] /= g_world;
  bool cuda = t->device.type == KG_DEV_CUDA;
  kg_dtype wd = cuda ? t->dtype : reduce_dtype(t->dtype);
  kg_tensor *w, *o = NULL, *r = NULL;
  KG_TRY(work_copy(&w, t, wd));
  kg_status s = kg_tensor_empty(&o, t->ndim, shape, wd, t->device);
  if (s == KG_OK && kg_numel(o) > 0) {
    if (cuda) {
      s = kg_nccl_run(KG_NCCL_REDUCE_SCATTER, o, w, op, 0);
    } else if (!use_mpi) {
      memcpy(kg_data(o), kg_data(w), (size_t)kg_numel(w) * kg_elem_size(w));
    } else {
      MPI_Request req;
      s = mpi_wait(MPI_Ireduce_scatter_block(kg_data(w), kg_data(o), (int)kg_numel(o), mpi_type(wd), mpi_op(op),
                                             MPI_COMM_WORLD, &req), &req, "reduce_scatter");
      if (s == KG_OK && op == KG_DIST_AVG) scale(o, 1.0 / g_world);
    }
  }
  kg_tensor_release(w);
  if (s == KG_OK && wd != t->dtype) s = kg_to(&r, o, t->dtype, t->device);
  else if (s == KG_OK) r = kg_tensor_retain(o);
  if (o) kg_tensor_release(o);
  if (s != KG_OK) return s;
  *out = r;
  return KG_OK;
}
