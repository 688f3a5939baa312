/* gguf.h — reading GGUF files, llama.cpp's model format (engine/io/gguf.c, docs/gguf.md).
 *
 *   "GGUF" u32 version (2 or 3) u64 n_tensors u64 n_kv
 *   n_kv × (string key, u32 type, value)         metadata; strings are u64 length + bytes
 *   n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset)
 *   padding to general.alignment (default 32), then the data section; offsets are relative to it
 *
 * kg_gguf_open validates the whole header before anything is used (every length, count, offset,
 * alignment, tensor extent and dims product, with overflow-safe arithmetic; docs/security.md)
 * and maps the file privately; kg_gguf_tensor turns one tensor into keng tensors: float types as
 * views of the mapping, Q4_0 and Q8_0 repacked into keng's layouts (codes + f16 scales, exactly)
 * or dequantized, and Q4_K / Q6_K dequantized. Errors are KG_ERR_IO "gguf: <label>: ...". Little-endian files
 * only (GGUF's default; a big-endian one is refused by name). */
#ifndef KENG_GGUF_H
#define KENG_GGUF_H

#include <keng/keng.h>

/* metadata value types (the GGUF spec's gguf_metadata_value_type) */
typedef enum {
  KG_GGUF_U8 = 0, KG_GGUF_I8, KG_GGUF_U16, KG_GGUF_I16, KG_GGUF_U32, KG_GGUF_I32, KG_GGUF_F32, KG_GGUF_BOOL,
  KG_GGUF_STRING, KG_GGUF_ARRAY, KG_GGUF_U64, KG_GGUF_I64, KG_GGUF_F64, KG_GGUF_NTYPES
} kg_gguf_vtype;

/* ggml tensor types keng reads (the others are recognised, sized and refused by name) */
enum { KG_GGML_F32 = 0, KG_GGML_F16 = 1, KG_GGML_Q4_0 = 2, KG_GGML_Q8_0 = 8, KG_GGML_Q4_K = 12,
       KG_GGML_Q6_K = 14, KG_GGML_BF16 = 30 };

typedef struct kg_gguf_value {
  int type;        /* kg_gguf_vtype */
  uint64_t u;      /* unsigned integers, bool (0/1) */
  int64_t i;       /* signed integers */
  double f;        /* F32, F64 */
  const char *str; /* STRING: len bytes inside the file (not NUL-terminated; may hold NULs) */
  uint64_t len;
  int elem_type;   /* ARRAY: element type; n items */
  uint64_t n;
  struct kg_gguf_value *items;
} kg_gguf_value;

typedef struct {
  char *name;       /* NUL-terminated copy (no NUL inside, < 64 bytes as in ggml) */
  int type;         /* ggml type id */
  int ndim;         /* 1..4 */
  int64_t ne[4];    /* ggml order: ne[0] is the innermost (row) length */
  uint64_t offset;  /* into the data section, aligned */
  uint64_t nbytes;
} kg_gguf_tensor_info;

typedef struct kg_gguf kg_gguf;

/* Maps and validates path. [out] *out, free with kg_gguf_free (tensors made from it stay valid). */
kg_status kg_gguf_open(kg_gguf **out, const char *path);
/* The same over bytes held in memory (copied); label names it in messages. */
kg_status kg_gguf_parse(kg_gguf **out, const void *bytes, size_t len, const char *label);
void kg_gguf_free(kg_gguf *g);

uint32_t kg_gguf_version(const kg_gguf *g);
int64_t kg_gguf_n_kv(const kg_gguf *g);
const char *kg_gguf_key(const kg_gguf *g, int64_t i);
const kg_gguf_value *kg_gguf_value_at(const kg_gguf *g, int64_t i);
const kg_gguf_value *kg_gguf_get(const kg_gguf *g, const char *key); /* NULL when absent */
int64_t kg_gguf_n_tensors(const kg_gguf *g);
const kg_gguf_tensor_info *kg_gguf_tensor_info_at(const kg_gguf *g, int64_t i);
/* "Q4_K", "F32", ...; "type N" for an id outside ggml's table */
const char *kg_gguf_type_name(int type);

/* Tensor i as keng tensors with the reversed (row-major) shape [ne[n-1], ..., ne[0]]:
 *   F32 / F16 / BF16: *out is a view of the mapping (a copy when misaligned); `dt` is ignored;
 *   Q4_0 with KG_GGUF_KEEP_Q4_0 in keep: *out the codes u8 [.., ne0/2] and *scale f16
 *     [.., ne0/32], keng's int4 layout (docs/quantization.md), which holds exactly the same numbers;
 *   Q8_0 with KG_GGUF_KEEP_Q8_0: *out the codes i8 [.., ne0] and *scale f16 [.., ne0/32] (keng's
 *     Q8_0 layout, linear_q8 with block scales), the same numbers;
 *   otherwise Q4_0, Q8_0, Q4_K, Q6_K: *out dequantized to f32 (the values of ggml's
 *     dequantize_row_*), then rounded to dt (f32, bf16 or f16); *scale NULL.
 * Any other type fails naming the tensor and the type. */
#define KG_GGUF_KEEP_Q4_0 1u
#define KG_GGUF_KEEP_Q8_0 2u
kg_status kg_gguf_tensor(const kg_gguf *g, int64_t i, kg_dtype dt, unsigned keep, kg_tensor **out,
                         kg_tensor **scale);

#endif
