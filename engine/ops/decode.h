/* decode.h — the decode-step op shared by its front-end (engine/ops/decode.c) and its kernels
 * (engine/cpu/decode.c, engine/cuda/decode.cu). */
#ifndef KENG_OPS_DECODE_H
#define KENG_OPS_DECODE_H

#include "../core/internal.h"

/* kg_decode_qkv and kg_decode_qkv_params are public: <keng/ops_api.h> */

#endif
