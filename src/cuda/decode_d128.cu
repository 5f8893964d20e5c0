/* Decode (split-KV, tensor-core) kernels for head_dim 128: f16/bf16 Q,
 * same-type or fp8 KV; one head dim per unit keeps builds parallel. */
#include "cuda/decode_launch.cuh"

KVA_DEC_DEFINE_LAUNCH(128)
