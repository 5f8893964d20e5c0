/* Warp-specialized extend kernel at head_dim 256 (see extend_ws.cu). */
#include "cuda/extend_ws_launch.cuh"

KVA_WS_DEFINE_LAUNCH(256)
