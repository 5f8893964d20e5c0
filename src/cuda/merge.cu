/* kva_merge_states on the GPU (FlashInfer's merge_state): one warp per
 * (token, head) row; lanes take 8 consecutive elements (16-byte loads) when
 * every row is 16-byte aligned, single elements otherwise. Same arithmetic
 * as the CPU merge: an LSE of -inf drops its state without reading it. */
#include <math.h>
#include <stdint.h>

#include "core/dtype.h"
#include "cuda/cuda_internal.h"

#define MERGE_WARPS 4

/* 8 elements of a 16-byte aligned typed row as f32 / back. */
static __device__ __forceinline__ void merge_load8(const void *p, size_t i, kva_dtype t, float *x) {
  if (t == KVA_F32) {
    const float4 a = ((const float4 *)p)[i / 4], b = ((const float4 *)p)[i / 4 + 1];
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
    x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  } else {
    const uint4 u = ((const uint4 *)p)[i / 8];
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const uint16_t h = (uint16_t)(w[j / 2] >> (16 * (j & 1)));
      x[j] = t == KVA_F16 ? kva_f16_to_f32(h) : kva_bf16_to_f32(h);
    }
  }
}
static __device__ __forceinline__ void merge_store8(void *p, size_t i, kva_dtype t, const float *x) {
  if (t == KVA_F32) {
    ((float4 *)p)[i / 4] = make_float4(x[0], x[1], x[2], x[3]);
    ((float4 *)p)[i / 4 + 1] = make_float4(x[4], x[5], x[6], x[7]);
  } else {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const uint16_t lo = t == KVA_F16 ? kva_f32_to_f16(x[2 * j]) : kva_f32_to_bf16(x[2 * j]);
      const uint16_t hi =
          t == KVA_F16 ? kva_f32_to_f16(x[2 * j + 1]) : kva_f32_to_bf16(x[2 * j + 1]);
      w[j] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    ((uint4 *)p)[i / 8] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

__global__ void __launch_bounds__(MERGE_WARPS * 32)
    kva_merge_kernel(long long rows, int d, kva_dtype t, bool vec, const void *va,
                     const float *sa, const void *vb, const float *sb, void *vo, float *so) {
  const int lane = threadIdx.x & 31;
  for (long long i = (long long)blockIdx.x * MERGE_WARPS + (threadIdx.x >> 5); i < rows;
       i += (long long)gridDim.x * MERGE_WARPS) {
    const float a = sa[i], b = sb[i], m = fmaxf(a, b);
    __syncwarp(); /* every lane read the LSEs before lane 0 may overwrite them (so == sa) */
    const size_t base = (size_t)i * d;
    if (m == -INFINITY) { /* no keys in either state */
      for (int e = lane; e < d; e += 32) kva_store_f32(vo, base + e, t, 0.0f);
      if (so && lane == 0) so[i] = -INFINITY;
      continue;
    }
    const bool ua = a != -INFINITY, ub = b != -INFINITY;
    const float wa = ua ? expf(a - m) : 0.0f, wb = ub ? expf(b - m) : 0.0f;
    const float sum = wa + wb, inv = 1.0f / sum; /* sum >= 1 */
    if (vec) {
      for (int e = 8 * lane; e < d; e += 256) {
        float xa[8], xb[8], y[8];
        if (ua) merge_load8(va, base + e, t, xa);
        if (ub) merge_load8(vb, base + e, t, xb);
#pragma unroll
        for (int j = 0; j < 8; j++) {
          float acc = 0.0f;
          if (ua) acc += wa * xa[j];
          if (ub) acc += wb * xb[j];
          y[j] = acc * inv;
        }
        merge_store8(vo, base + e, t, y);
      }
    } else {
      for (int e = lane; e < d; e += 32) {
        float acc = 0.0f;
        if (ua) acc += wa * kva_load_f32(va, base + e, t);
        if (ub) acc += wb * kva_load_f32(vb, base + e, t);
        kva_store_f32(vo, base + e, t, acc * inv);
      }
    }
    if (so && lane == 0) so[i] = m + logf(sum);
  }
}

extern "C" kva_status kva_cuda_merge_states(kva_context *ctx, int num_tokens, int num_heads,
                                            int head_dim, kva_dtype dtype, const void *v_a,
                                            const float *s_a, const void *v_b, const float *s_b,
                                            void *v_out, float *s_out) {
  const kva_cuda_state *cs = kva_cuda_state_of(ctx);
  const long long rows = (long long)num_tokens * num_heads;
  const size_t es = kva_dtype_size(dtype);
  /* 16-byte vectors need every row start aligned: base pointers and row bytes */
  const bool vec = head_dim % 8 == 0 && ((size_t)head_dim * es) % 16 == 0 &&
                   ((((uintptr_t)v_a) | ((uintptr_t)v_b) | ((uintptr_t)v_out)) & 15u) == 0;
  long long blocks = (rows + MERGE_WARPS - 1) / MERGE_WARPS;
  if (blocks > (long long)cs->num_sms * 32) blocks = (long long)cs->num_sms * 32;
  kva_merge_kernel<<<(unsigned)blocks, MERGE_WARPS * 32, 0, cs->stream>>>(
      rows, head_dim, dtype, vec, v_a, s_a, v_b, s_b, v_out, s_out);
  KVA_CUDA_LAUNCH_CHECK("kva_merge_kernel");
  return KVA_OK;
}
