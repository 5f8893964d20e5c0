/* The split-KV merge of one output row's 4 columns for the decode kernel
 * (the CTA whose chunk of a split request finishes last merges them; the
 * MLA kernels merge with mla_chunk_end.cuh's weights, whose arithmetic
 * their two merge paths share): the chunks' partial O rows weighted by
 * exp(LSE - max LSE).
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
 * One pass with a running max, in base 2 and without branches, chunks in a
 * fixed order j = 0, 1, ... (the result does not depend on which CTA merges)
 * and the loads of BATCH chunks issued before any is used.
 * This runs once per step, after every other chunk finished, on the step's
 * critical path, from cold instruction caches: its code size is its cost.
 * Measured on the H100 (KVA_DEC_TRACE): with expf and a rescale branch per
 * chunk the last CTA's merge of 32 chunks took 4-5 us whether 4, 8 or 16
 * loads were in flight (staging every row in smem first: 6-7 us); this form
 * (~200 fewer instructions) takes ~2 us. The batch: see KVA_DEC_MERGE_BATCH. */
#define KVA_SPLIT_LOG2E 1.4426950408889634f
#define KVA_SPLIT_LN2 0.6931471805599453f
template <int BATCH>
static __device__ __forceinline__ float4 kva_split_merge4(const float *part_o,
                                                          const float *part_lse, size_t p0,
                                                          int nt, int hq, int h, int nsplit,
                                                          int dv, int d4, float *mx, float *ws) {
  float m = -INFINITY, w_sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const size_t lstride = (size_t)nt * hq, ostride = lstride * dv; /* chunk to chunk */
  const float *lp = part_lse + p0 * hq + h, *op = part_o + (p0 * hq + h) * dv + 4 * d4;
  for (int j0 = 0; j0 < nsplit; j0 += BATCH) {
    float sj[BATCH];
    float4 v[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; i++) {
      const bool in = j0 + i < nsplit;
      sj[i] = in ? __ldcg(lp + i * lstride) : -INFINITY;
      v[i] = in ? __ldcg((const float4 *)(op + i * ostride)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    lp += BATCH * lstride;
    op += BATCH * ostride;
#pragma unroll
    for (int i = 0; i < BATCH; i++) { /* base 2, branch-free: short code */
      const float s2 = sj[i] * KVA_SPLIT_LOG2E, mn = fmaxf(m, s2);
      const float mu = mn == -INFINITY ? 0.0f : mn; /* nothing yet: weights 0, no NaN */
      const float sc = kva_ex2(m - mu), w = kva_ex2(s2 - mu);
      m = mn;
      w_sum = w_sum * sc + w;
      acc.x = acc.x * sc + w * v[i].x;
      acc.y = acc.y * sc + w * v[i].y;
      acc.z = acc.z * sc + w * v[i].z;
      acc.w = acc.w * sc + w * v[i].w;
    }
  }
  *mx = m * KVA_SPLIT_LN2; /* natural log again */
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

/* Thread 0, before the CTA writes its partial rows (then a __syncthreads):
 * 1 when every other chunk has already counted (acquire: their rows are
 * visible after the __syncthreads), so this chunk completes the request
 * whatever happens; it resets the count and merges without writing its own
 * partial rows. 0: write and count as above. */
static __device__ __forceinline__ int kva_split_known_last(int32_t *sem, int nsplit) {
  if (kva_ld_acquire_gpu((const int *)sem) != nsplit - 1) return 0;
  atomicExch((int *)sem, 0);
  return 1;
}

/* kva_split_known_last, polling for up to wait_ns for the other chunks to
 * count (the chunk a schedule plans to end last: a late sibling would
 * otherwise make both write partial rows and the last merge from global
 * memory). Bounded, so it needs no other CTA to be resident. */
static __device__ __forceinline__ int kva_split_known_last_wait(int32_t *sem, int nsplit,
                                                                unsigned wait_ns) {
  const unsigned long long end = kva_globaltimer() + wait_ns;
  while (kva_ld_acquire_gpu((const int *)sem) != nsplit - 1 && kva_globaltimer() < end)
    __nanosleep(256);
  return kva_split_known_last(sem, nsplit);
}

#endif /* KVA_CUDA_SPLIT_MERGE_CUH */
