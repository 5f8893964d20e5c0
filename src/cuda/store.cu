/* KV store: the batch's new K/V rows into the layer's pages at the plan's
 * out_cache_loc, converted (and for fp8 pools quantized) with the
 * conversions of core/dtype.h so that GPU and CPU stores match bit for bit.
 * One thread per 16 bytes of pool output (8 bytes for fp8 rows that are
 * not a multiple of 16); the grid is fixed by the plan's capacity and
 * strides over the batch's tokens, read from the device header. */
#include <stdint.h>

#include "core/dtype.h"
#include "cuda/cuda_internal.h"

#define STORE_THREADS 256

/* EPT source elements from element i0 as f32; vec: 16-byte loads (src
 * 16-byte aligned; rows are multiples of 8 elements). */
template <int EPT>
static __device__ __forceinline__ void store_load(const void *src, size_t i0, kva_dtype t,
                                                  bool vec, float *x) {
  if (vec && t == KVA_F32) {
#pragma unroll
    for (int k = 0; k < EPT / 4; k++) {
      const float4 v = ((const float4 *)src)[i0 / 4 + k];
      x[4 * k] = v.x;
      x[4 * k + 1] = v.y;
      x[4 * k + 2] = v.z;
      x[4 * k + 3] = v.w;
    }
  } else if (vec) {
#pragma unroll
    for (int k = 0; k < EPT / 8; k++) {
      const uint4 v = ((const uint4 *)src)[i0 / 8 + k];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const uint16_t h = (uint16_t)(w[j / 2] >> (16 * (j & 1)));
        x[8 * k + j] = t == KVA_F16 ? kva_f16_to_f32(h) : kva_bf16_to_f32(h);
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < EPT; k++) x[k] = kva_load_f32(src, i0 + k, t);
  }
}

/* EPT = elements per thread: 8 for 16-bit pools (dst_t), 16 or 8 for fp8. */
template <int EPT, int FP8>
__global__ void __launch_bounds__(STORE_THREADS)
    kva_store_kernel(const kva_plan_header *hdr, const int32_t *out_cache_loc, const void *src,
                     kva_dtype src_t, bool vec, void *dst, kva_dtype dst_t, float inv_scale,
                     int token_elems) {
  static_assert(FP8 ? (EPT == 8 || EPT == 16) : EPT == 8, "one 16-byte (or 8-byte fp8) store");
  const int per_tok = token_elems / EPT;
  const long long total = (long long)hdr->total_q * per_tok;
  for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < total;
       c += (long long)gridDim.x * blockDim.x) {
    const long long tok = c / per_tok;
    const int e0 = (int)(c % per_tok) * EPT;
    float x[EPT];
    store_load<EPT>(src, (size_t)tok * token_elems + e0, src_t, vec, x);
    const size_t d0 = (size_t)out_cache_loc[tok] * token_elems + e0;
    if constexpr (FP8) {
      uint32_t w[EPT / 4];
#pragma unroll
      for (int k = 0; k < EPT / 4; k++) {
        w[k] = 0;
#pragma unroll
        for (int j = 0; j < 4; j++)
          w[k] |= (uint32_t)kva_f32_to_fp8e4m3(x[4 * k + j] * inv_scale) << (8 * j);
      }
      if constexpr (EPT == 16)
        *(uint4 *)((uint8_t *)dst + d0) = make_uint4(w[0], w[1], w[2], w[3]);
      else
        *(uint2 *)((uint8_t *)dst + d0) = make_uint2(w[0], w[1]);
    } else {
      uint32_t w[EPT / 2];
#pragma unroll
      for (int k = 0; k < EPT / 2; k++) {
        const float lo = x[2 * k], hi = x[2 * k + 1];
        const uint16_t l16 = dst_t == KVA_F16 ? kva_f32_to_f16(lo) : kva_f32_to_bf16(lo);
        const uint16_t h16 = dst_t == KVA_F16 ? kva_f32_to_f16(hi) : kva_f32_to_bf16(hi);
        w[k] = (uint32_t)l16 | ((uint32_t)h16 << 16);
      }
      *(uint4 *)((uint16_t *)dst + d0) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

extern "C" kva_status kva_cuda_store_kv(kva_plan *plan, kva_pool *pool, int layer, const void *k,
                                        const void *v, kva_dtype dtype) {
  const kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  const kva_cuda_state *cs = kva_cuda_state_of(plan->ctx);
  const int te = (int)pool->token_elems; /* multiple of 8 (head_dim, or 576 for MLA) */
  const kva_dtype kt = pool->cfg.kv_dtype;
  const int ept = kt != KVA_FP8_E4M3 ? 8 : te % 16 == 0 ? 16 : 8;
  /* grid from the plan's capacity (not the batch), capped: the kernel strides */
  const long long chunks = (long long)plan->cfg.max_q_tokens * (te / ept);
  long long blocks = (chunks + STORE_THREADS - 1) / STORE_THREADS;
  if (blocks > (long long)cs->num_sms * 16) blocks = (long long)cs->num_sms * 16;
  if (blocks < 1) blocks = 1;
  for (int b = 0; b < 2; b++) {
    const void *src = b == 0 ? k : v;
    void *dst = b == 0 ? pool->k[layer] : pool->v[layer];
    if (!src || !dst) continue; /* MLA: K only */
    /* the CPU store computes x * (1 / scale) the same way */
    const float inv = kt == KVA_FP8_E4M3 ? 1.0f / (b == 0 ? pool->k_scale[layer]
                                                          : pool->v_scale[layer])
                                         : 1.0f;
    const bool vec = ((uintptr_t)src & 15u) == 0;
    const unsigned g = (unsigned)blocks;
    if (kt != KVA_FP8_E4M3)
      kva_store_kernel<8, 0><<<g, STORE_THREADS, 0, cs->stream>>>(cp->d_hdr, cp->d_out_cache_loc,
                                                                 src, dtype, vec, dst, kt, inv, te);
    else if (ept == 16)
      kva_store_kernel<16, 1><<<g, STORE_THREADS, 0, cs->stream>>>(
          cp->d_hdr, cp->d_out_cache_loc, src, dtype, vec, dst, kt, inv, te);
    else
      kva_store_kernel<8, 1><<<g, STORE_THREADS, 0, cs->stream>>>(
          cp->d_hdr, cp->d_out_cache_loc, src, dtype, vec, dst, kt, inv, te);
    KVA_CUDA_LAUNCH_CHECK("kva_store_kernel");
  }
  return KVA_OK;
}
