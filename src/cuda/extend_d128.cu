/* Extend (prefill) tensor-core kernels for head_dim 128 (f16/bf16 Q, same-type
 * or fp8 KV); one head dim per unit keeps builds parallel. */
#include "cuda/extend_launch.cuh"

KVA_EXT_DEFINE_LAUNCH(128)
