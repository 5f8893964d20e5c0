/* The split-KV merge of one output row's 4 columns, shared by the decode
 * and MLA kernels (the CTA whose chunk of a split request finishes last
 * merges them): the chunks' partial O rows weighted by exp(LSE - max LSE).
 * Every chunk's row is written (an empty chunk: O 0, LSE -inf). */
#ifndef KVA_CUDA_SPLIT_MERGE_CUH
#define KVA_CUDA_SPLIT_MERGE_CUH

#include <math.h>
#include <stddef.h>

/* Row (p0 + j * nt) * hq + h of chunk j, columns 4 d4 .. 4 d4 + 3 of dv:
 * returns the weighted sum, *mx the largest LSE (-inf: no keys anywhere)
 * and *ws the weight sum (0 when mx is -inf). */
static __device__ __forceinline__ float4 kva_split_merge4(const float *part_o,
                                                          const float *part_lse, size_t p0,
                                                          int nt, int hq, int h, int nsplit,
                                                          int dv, int d4, float *mx, float *ws) {
  float m = -INFINITY;
  for (int j = 0; j < nsplit; j++) m = fmaxf(m, __ldcg(part_lse + (p0 + (size_t)j * nt) * hq + h));
  float w_sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (m != -INFINITY) {
#pragma unroll 4
    for (int j = 0; j < nsplit; j++) {
      const size_t prow = (p0 + (size_t)j * nt) * hq + h;
      const float sj = __ldcg(part_lse + prow);
      const float w = sj == -INFINITY ? 0.0f : expf(sj - m);
      const float4 v = __ldcg((const float4 *)(part_o + prow * dv + 4 * d4));
      w_sum += w;
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
  }
  *mx = m;
  *ws = w_sum;
  return acc;
}

#endif /* KVA_CUDA_SPLIT_MERGE_CUH */
