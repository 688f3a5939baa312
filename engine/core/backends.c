/* backends.c — process-wide switches read by the device kernels (keng.backends in Lua). */
#include "internal.h"

static int allow_tf32; /* read by engine/cuda/matmul.cu and conv.cu at each launch */

void kg_set_allow_tf32(bool on) { __atomic_store_n(&allow_tf32, on ? 1 : 0, __ATOMIC_RELAXED); }
bool kg_allow_tf32(void) { return __atomic_load_n(&allow_tf32, __ATOMIC_RELAXED) != 0; }
