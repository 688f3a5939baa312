/* mpi_none.h — a build without MPI (cmake -DKENG_MPI=OFF, or no libopenmpi-dev): the MPI names
 * dist.c uses, every call failing. dist.c starts MPI only when built with it (KENG_HAVE_MPI), so
 * here use_mpi stays false, the process is rank 0 of 1 and none of these calls is reached; they
 * exist so that dist.c keeps one code path for both builds. */
#ifndef KENG_MPI_NONE_H
#define KENG_MPI_NONE_H

#include <stdio.h>

typedef int MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request, MPI_Info, MPI_Errhandler;
typedef struct { int unused; } MPI_Status;

enum { MPI_SUCCESS = 0, MPI_ERR_OTHER = 16, MPI_MAX_ERROR_STRING = 64 };
enum { MPI_COMM_WORLD = 1, MPI_COMM_TYPE_SHARED = 1, MPI_INFO_NULL = 0, MPI_ERRORS_RETURN = 0 };
enum { MPI_REQUEST_NULL = 0, MPI_THREAD_FUNNELED = 1 };
enum { MPI_DATATYPE_NULL, MPI_BYTE, MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T, MPI_UINT8_T };
enum { MPI_SUM = 1, MPI_MAX, MPI_MIN };
#define MPI_IN_PLACE ((void *)1)
#define MPI_STATUS_IGNORE ((MPI_Status *)NULL)

static inline int MPI_Initialized(int *flag) { *flag = 0; return MPI_SUCCESS; }
static inline int MPI_Finalized(int *flag) { *flag = 1; return MPI_SUCCESS; }
static inline int MPI_Init_thread(int *argc, char ***argv, int req, int *prov) { return MPI_ERR_OTHER; }
static inline int MPI_Finalize(void) { return MPI_ERR_OTHER; }
static inline int MPI_Abort(MPI_Comm c, int code) { return MPI_ERR_OTHER; }
static inline int MPI_Comm_set_errhandler(MPI_Comm c, MPI_Errhandler h) { return MPI_ERR_OTHER; }
static inline int MPI_Comm_rank(MPI_Comm c, int *r) { *r = 0; return MPI_SUCCESS; }
static inline int MPI_Comm_size(MPI_Comm c, int *n) { *n = 1; return MPI_SUCCESS; }
static inline int MPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info i, MPI_Comm *out) {
  *out = c;
  return MPI_SUCCESS;
}
static inline int MPI_Comm_free(MPI_Comm *c) { return MPI_SUCCESS; }
static inline int MPI_Error_string(int code, char *msg, int *len) {
  *len = snprintf(msg, MPI_MAX_ERROR_STRING, "this keng was built without MPI");
  return MPI_SUCCESS;
}
static inline int MPI_Test(MPI_Request *r, int *flag, MPI_Status *s) { *flag = 1; return MPI_ERR_OTHER; }
static inline int MPI_Ibarrier(MPI_Comm c, MPI_Request *r) { return MPI_ERR_OTHER; }
static inline int MPI_Ibcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c, MPI_Request *r) {
  return MPI_ERR_OTHER;
}
static inline int MPI_Iallreduce(const void *in, void *out, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                                 MPI_Request *r) { return MPI_ERR_OTHER; }
static inline int MPI_Iallgather(const void *in, int n, MPI_Datatype t, void *out, int m, MPI_Datatype t2, MPI_Comm c,
                                 MPI_Request *r) { return MPI_ERR_OTHER; }
static inline int MPI_Ireduce_scatter_block(const void *in, void *out, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                                            MPI_Request *r) { return MPI_ERR_OTHER; }

#endif
