/* Warp-specialized extend kernel at head_dim 64 (see extend_ws.cu). */
#include "cuda/extend_ws_launch.cuh"

KVA_WS_DEFINE_LAUNCH(64)
