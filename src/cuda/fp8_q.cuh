/* A bf16 Q against fp8 K/V: the kernels run the tensor cores in f16, where
 * e4m3 -> f16 is one instruction per two values (-> bf16 takes four), so
 * Q is converted to f16 once, scaled by 2^-KVA_FP8_Q_SHIFT so that f16's
 * range holds it, and the caller undoes the shift in the logits'
 * multiplier. Used by the MLA kernels and the decode
 * kernel. */
#ifndef KVA_CUDA_FP8_Q_CUH
#define KVA_CUDA_FP8_Q_CUH

#include "cuda/ptx.cuh"

#define KVA_FP8_Q_SHIFT 8

/* One bf16x2 word of Q -> f16x2 times 2^-KVA_FP8_Q_SHIFT, saturated to
 * f16's range: exact for 2^-6 <= |q| <= 2^23 (f16 normals after the
 * shift). NaN stays NaN. */
static __device__ __forceinline__ uint32_t kva_q_bf16x2_to_f16x2(uint32_t w) {
  const float sc = 1.0f / (float)(1 << KVA_FP8_Q_SHIFT), big = 65504.0f;
  const float lo = __uint_as_float(w << 16) * sc;
  const float hi = __uint_as_float(w & 0xffff0000u) * sc;
  return kva_pack_f16x2(fabsf(lo) > big ? copysignf(big, lo) : lo,
                        fabsf(hi) > big ? copysignf(big, hi) : hi);
}

#endif /* KVA_CUDA_FP8_Q_CUH */
