/* The split-KV merge of one output row's 4 columns, shared by the decode
 * and MLA kernels (the CTA whose chunk of a split request finishes last
 * merges them): the chunks' partial O rows weighted by exp(LSE - max LSE).
 * Every chunk's row is written (an empty chunk: O 0, LSE -inf). */
#ifndef KVA_CUDA_SPLIT_MERGE_CUH
#define KVA_CUDA_SPLIT_MERGE_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/ptx.cuh"

/* Row (p0 + j * nt) * hq + h of chunk j, columns 4 d4 .. 4 d4 + 3 of dv:
 * returns the weighted sum, *mx the largest LSE (-inf: no keys anywhere)
 * and *ws the weight sum (0 when mx is -inf).
 *
 * One pass with a running max (weights rescaled when it grows), chunks in a
 * fixed order j = 0, 1, ... (the result does not depend on which CTA merges)
 * and the loads of KVA_SPLIT_MERGE_BATCH chunks issued before any is used.
 * This runs after every other chunk finished, on the step's critical path.
 * Measured on the H100 (bench/dec_trace): the last CTA's merge of 32 chunks
 * takes 4-5 us whether 4, 8 or 16 chunks' loads are in flight, so the time
 * is not the count of L2 round trips; where it goes is not known yet. */
#define KVA_SPLIT_MERGE_BATCH 8
static __device__ __forceinline__ float4 kva_split_merge4(const float *part_o,
                                                          const float *part_lse, size_t p0,
                                                          int nt, int hq, int h, int nsplit,
                                                          int dv, int d4, float *mx, float *ws) {
  float m = -INFINITY, w_sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int j0 = 0; j0 < nsplit; j0 += KVA_SPLIT_MERGE_BATCH) {
    float sj[KVA_SPLIT_MERGE_BATCH];
    float4 v[KVA_SPLIT_MERGE_BATCH];
#pragma unroll
    for (int i = 0; i < KVA_SPLIT_MERGE_BATCH; i++) {
      const size_t prow = (p0 + (size_t)(j0 + i) * nt) * hq + h;
      const bool in = j0 + i < nsplit;
      sj[i] = in ? __ldcg(part_lse + prow) : -INFINITY;
      v[i] = in ? __ldcg((const float4 *)(part_o + prow * dv + 4 * d4))
                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < KVA_SPLIT_MERGE_BATCH; i++) {
      if (sj[i] == -INFINITY) continue; /* an empty chunk (or past the last) */
      if (sj[i] > m) {                  /* new max: rescale what is summed so far */
        const float sc = expf(m - sj[i]); /* 0 while m is -inf */
        w_sum *= sc;
        acc.x *= sc;
        acc.y *= sc;
        acc.z *= sc;
        acc.w *= sc;
        m = sj[i];
      }
      const float w = expf(sj[i] - m);
      w_sum += w;
      acc.x += w * v[i].x;
      acc.y += w * v[i].y;
      acc.z += w * v[i].z;
      acc.w += w * v[i].w;
    }
  }
  *mx = m;
  *ws = w_sum;
  return acc;
}

/* Thread 0, after a __syncthreads that follows the CTA's partial-row writes:
 * counts this chunk of a split request and returns 1 for the chunk that
 * completes the count, which then merges (after a __syncthreads) and has
 * reset the count for the next run. One acquire-release atomic instead of a
 * __threadfence per thread on each side: both sat on the last chunk's
 * critical path. */
static __device__ __forceinline__ int kva_split_arrive(int32_t *sem, int nsplit) {
  const int last = kva_atom_add_acq_rel_gpu((int *)sem, 1) == nsplit - 1;
  if (last) atomicExch((int *)sem, 0); /* every chunk has counted */
  return last;
}

#endif /* KVA_CUDA_SPLIT_MERGE_CUH */
