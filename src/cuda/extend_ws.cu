/* Launcher of the warp-specialized extend kernel (extend_ws.cuh) at
 * head_dim 128, f16/bf16 Q with same-type KV; the default for those shapes
 * (KVA_EXTEND_KERNEL=ws or unset at plan creation). head_dim 64 and 256:
 * extend_ws_d64.cu, extend_ws_d256.cu (one head dim per unit). */
#include "cuda/extend_ws_launch.cuh"

KVA_WS_DEFINE_LAUNCH(128)
