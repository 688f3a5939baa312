/* dtype.c — dtype facts, names and promotion; device names. */
#include "internal.h"

#include <math.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const kg_dtype_facts kg_dtype_info[KG_DTYPE_COUNT] = {
#define X(e, n, t, s, f) {n, s, f},
    KG_DTYPES(X)
#undef X
};

bool kg_dtype_from_name(const char *name, kg_dtype *out) {
  static const struct { const char *alias; kg_dtype dt; } aliases[] = {
      {"float32", KG_F32}, {"float", KG_F32},  {"float64", KG_F64}, {"double", KG_F64}, {"bfloat16", KG_BF16},
      {"float16", KG_F16}, {"half", KG_F16},   {"int32", KG_I32},   {"int", KG_I32},    {"int64", KG_I64},
      {"long", KG_I64},    {"uint8", KG_U8},   {"byte", KG_U8},     {"int8", KG_I8},
  };
  for (int i = 0; i < KG_DTYPE_COUNT; i++)
    if (!strcmp(name, kg_dtype_info[i].name)) return *out = (kg_dtype)i, true;
  for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
    if (!strcmp(name, aliases[i].alias)) return *out = aliases[i].dt, true;
  return false;
}

/* rank: bool < u8 < i32 < i64 < f16/bf16 < f32 < f64 */
static int rank(kg_dtype d) {
  switch (d) {
  case KG_BOOL: return 0;
  case KG_U8: case KG_I8: return 1;
  case KG_I32: return 2;
  case KG_I64: return 3;
  case KG_F16: case KG_BF16: return 4;
  case KG_F32: return 5;
  default: return 6;
  }
}

kg_dtype kg_dtype_promote(kg_dtype a, kg_dtype b) {
  if (a == b) return a;
  if ((a == KG_BF16 && b == KG_F16) || (a == KG_F16 && b == KG_BF16)) return KG_F32;
  return rank(a) >= rank(b) ? a : b;
}

bool kg_device_from_name(const char *name, kg_device *out) {
  if (!strcmp(name, "cpu")) return *out = KG_CPU, true;
  if (!strcmp(name, "meta")) return *out = KG_META, true;
  if (!strncmp(name, "cuda", 4)) {
    int idx = 0;
    if (name[4] == ':') {
      char *end;
      long v = strtol(name + 5, &end, 10);
      if (*end || end == name + 5 || v < 0 || v > 127) return false;
      idx = (int)v;
    } else if (name[4]) {
      return false;
    }
    *out = (kg_device){KG_DEV_CUDA, (int8_t)idx};
    return true;
  }
  return false;
}

const char *kg_device_name(kg_device d, char buf[16]) {
  if (d.type == KG_DEV_CUDA) snprintf(buf, 16, "cuda:%d", d.index);
  else snprintf(buf, 16, "%s", d.type == KG_DEV_META ? "meta" : "cpu");
  return buf;
}

bool kg_value_fits(double v, kg_dtype dt) {
  switch (dt) { /* the range as doubles, [lo, hi); false for NaN */
  case KG_I32: return v >= -0x1p31 && v < 0x1p31;
  case KG_I64: return v >= -0x1p63 && v < 0x1p63;
  case KG_U8: return v >= 0 && v < 256;
  case KG_I8: return v >= -128 && v < 128;
  default: return true; /* floats hold every number (overflow gives inf); bool is v != 0 */
  }
}

kg_status kg_check_value_fits(const char *op, double v, kg_dtype dt) {
  if (kg_value_fits(v, dt)) return KG_OK;
  char num[32];
  if (isnan(v)) snprintf(num, sizeof num, "NaN"); /* not "-nan" */
  else snprintf(num, sizeof num, "%g", v);
  return kg_error(KG_ERR_VALUE, op, "value %s cannot be stored in a tensor of dtype %s (out of its range)", num,
                  kg_dtype_info[dt].name);
}
