/* The first MLA decode kernel (v1), kept for A/B against kva_mla_kernel
 * (KVA_MLA_KERNEL=v1): per 32-key tile, S = Q K^T split over head dims
 * between the warpgroups and summed through smem, then softmax, then P V,
 * with no overlap between the steps. Same arguments, smem size
 * (KVA_MLA1_SMEM) and semantics as kva_mla_kernel. */
#ifndef KVA_CUDA_MLA_KERNEL_V1_CUH
#define KVA_CUDA_MLA_KERNEL_V1_CUH

#include "cuda/mla_kernel.cuh"

template <int QT, int KV8>
__global__ void __launch_bounds__(KVA_MLA_THREADS, 1)
    kva_mla_kernel_v1(const __grid_constant__ kva_mla_args a) {
  constexpr int QTILE = KVA_MLA_QTILE, TILE = KVA_MLA_TILE, TILE8 = KVA_MLA_TILE8;
  constexpr int NS = KVA_MLA1_STAGES(KV8), BN = KVA_MLA_BN, NJ = BN / 8; /* S n-tiles */
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_q = smem + (s_q - s_raw);
  /* 16-bit: stage i at s_kv + i TILE. fp8: the 16-bit tile at s_kv, byte
   * stage i at s_kv + TILE + i TILE8. */
  const uint32_t s_kv = s_q + QTILE;
  float4 *const xs = (float4 *)(p_q + QTILE + KVA_MLA1_RING(KV8)); /* [2][NJ][128] */
  volatile int *const flag = (volatile int *)(p_q + QTILE + KVA_MLA1_RING(KV8) + KVA_MLA_XS);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = mla_uni(warp >> 2), wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const int tw = tid & 127; /* thread within the warpgroup */
  const kva_plan_header *hdr = a.hdr;
  /* a PDL-launched kernel after this one may be scheduled now; it waits for
   * this grid's end before touching memory */
  kva_griddep_launch_dependents();
  if ((int)blockIdx.x >= hdr->num_workers) return;
  const int row0 = (int)blockIdx.y * KVA_MLA_BM;
  const kva_split_work wk = a.sched[blockIdx.x];
  const unsigned char *const kvg = (const unsigned char *)a.kv;

  for (int r = wk.begin_req; r <= wk.end_req; r++) {
    const int nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
    if (nsplit == 0) continue; /* not a decode request */
    const int nt = a.num_new[r], rows = nt * a.hq;
    if (row0 >= rows) continue; /* no rows of this row tile */
    const int kv_len = a.cache_seqlens[r], cached = kv_len - nt;
    const int split = r == wk.begin_req ? wk.begin_split : 0;
    const int k1 = r == wk.end_req ? wk.end_pos : kv_len;
    const int k0 = r == wk.begin_req ? wk.begin_pos : 0;
    const int ntiles = k1 > k0 ? (k1 - k0 + BN - 1) / BN : 0;
    const int tok0 = a.cu_q[r];
    const int32_t *const pt = a.page_table + (size_t)r * hdr->page_table_stride;

    /* Q, KV and the outputs belong to the kernels before this one (PDL) */
    kva_griddep_wait();
    /* prologue: Q and tile 0 in group 0, tiles 1 .. NS-2 one group each */
    mla_issue_q(s_q, a, tok0, row0, rows, tid);
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
      if (i < ntiles)
        mla_issue_kv<KV8>(KV8 ? s_kv + TILE + i * TILE8 : s_kv + i * TILE, kvg, pt, k0 + i * BN, k1,
                          a, tid);
      kva_cp_async_commit();
    }

    /* this thread's accumulator rows: tile rows 16 wq + g + 8 hf */
    int pos[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) pos[hf] = cached + (row0 + 16 * wq + g + 8 * hf) / a.hq;
    float o[2][64], m[2], l[2];
#pragma unroll
    for (int i = 0; i < 64; i++) o[0][i] = o[1][i] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
      kva_cp_async_wait<NS - 2>();  /* this thread's copies of tile it (and Q) landed */
      kva_fence_proxy_async_smem(); /* cp.async data -> wgmma (async proxy) */
      __syncthreads(); /* everyone's did; every wgmma of tile it-1 is complete */
      {
        const int nx = it + NS - 1, st = nx % NS;
        if (nx < ntiles)
          mla_issue_kv<KV8>(KV8 ? s_kv + TILE + st * TILE8 : s_kv + st * TILE, kvg, pt,
                            k0 + nx * BN, k1, a, tid);
        kva_cp_async_commit();
      }
      uint32_t s_t;
      if (KV8) {
        mla_convert<QT>(p_q + QTILE, p_q + QTILE + TILE + (it % NS) * TILE8, tid);
        kva_fence_proxy_async_smem();
        __syncthreads();
        s_t = s_kv;
      } else {
        s_t = s_kv + (it % NS) * TILE;
      }

      /* ---- S = Q K^T: this warpgroup's half of the head dims ---- */
      float s[4 * NJ];
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) {
        s[i] = 0.0f;
        kva_reg_fence_f32(&s[i]);
      }
      kva_wgmma_fence();
#pragma unroll
      for (int i = 0; i < KVA_MLA_D / 32; i++) {
        const int kb = (KVA_MLA_D / 32) * wg + i; /* k-step of 16 dims */
        const uint32_t qo = (uint32_t)((kb >> 2) * KVA_MLA_QBLK + (kb & 3) * 32);
        const uint32_t ko = (uint32_t)((kb >> 2) * KVA_MLA_KBLK + (kb & 3) * 32);
        mla_mma_s<QT>(s, mla_desc(s_q + qo, 16, 1024), mla_desc(s_t + ko, 16, 1024), i > 0);
      }
      kva_wgmma_commit();
      kva_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&s[i]);
      /* the other half from the other warpgroup (same accumulator layout) */
#pragma unroll
      for (int j = 0; j < NJ; j++)
        xs[(wg * NJ + j) * 128 + tw] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
      kva_bar_sync(1, KVA_MLA_THREADS);
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const float4 x = xs[((wg ^ 1) * NJ + j) * 128 + tw];
        s[4 * j] += x.x;
        s[4 * j + 1] += x.y;
        s[4 * j + 2] += x.z;
        s[4 * j + 3] += x.w;
      }

      /* ---- logits (base 2), mask, online softmax; P -> registers ---- */
      const int kt = k0 + it * BN;
      const bool need_mask = kt + BN > k1 || (a.causal && kt + BN - 1 > cached);
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          float x = s[4 * j + e] * a.qk_mul;
          if (need_mask) {
            const int key = kt + 8 * j + 2 * tq + (e & 1);
            if (key >= k1 || (a.causal && key > pos[e >> 1])) x = -INFINITY;
          }
          s[4 * j + e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      uint32_t pk[NJ][2];
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
        mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
        const float mn = fmaxf(m[hf], mx[hf]);
        const float mu = mn == -INFINITY ? 0.0f : mn; /* all masked so far: p = 0, no NaN */
        const float alpha = kva_ex2(m[hf] - mu);
        m[hf] = mn;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
          const float p0 = kva_ex2(s[4 * j + 2 * hf] - mu), p1 = kva_ex2(s[4 * j + 2 * hf + 1] - mu);
          sum += p0 + p1;
          pk[j][hf] = mla_pack<QT>(p0, p1);
        }
        l[hf] = l[hf] * alpha + sum;
#pragma unroll
        for (int j = 0; j < 16; j++) {
          o[0][4 * j + 2 * hf] *= alpha;
          o[0][4 * j + 2 * hf + 1] *= alpha;
          o[1][4 * j + 2 * hf] *= alpha;
          o[1][4 * j + 2 * hf + 1] *= alpha;
        }
      }

      /* ---- O[:, 256 wg ..] += P V (V: the tile's first 512 columns) ---- */
#pragma unroll
      for (int i = 0; i < 64; i++) {
        kva_reg_fence_f32(&o[0][i]);
        kva_reg_fence_f32(&o[1][i]);
      }
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        kva_reg_fence_u32(&pk[j][0]);
        kva_reg_fence_u32(&pk[j][1]);
      }
      kva_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) {
        const uint32_t pa[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0],
                                pk[2 * kk + 1][1]};
#pragma unroll
        for (int h = 0; h < 2; h++)
          mla_mma_pv<QT>(o[h], pa,
                         mla_desc(s_t + (4 * wg + 2 * h) * KVA_MLA_KBLK + kk * 16 * 128,
                                  KVA_MLA_KBLK, 1024));
      }
      kva_wgmma_commit();
      kva_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 64; i++) {
        kva_reg_fence_f32(&o[0][i]);
        kva_reg_fence_f32(&o[1][i]);
      }
    }
    kva_cp_async_wait<0>(); /* only empty groups remain (Q's, when there were no tiles) */

    /* ---- O (or the partial row) straight from the accumulators ---- */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      float lt = l[hf];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const int grow = row0 + 16 * wq + g + 8 * hf;
      if (grow >= rows) continue;
      const int t = grow / a.hq, h = grow - t * a.hq;
      const float inv = lt > 0.0f ? a.o_mul / lt : 0.0f;
      const float lse = lt > 0.0f ? (m[hf] + log2f(lt)) * KVA_MLA_LN2 : -INFINITY;
      if (nsplit == 1) {
        const size_t orow = (size_t)(tok0 + t) * a.hq + h;
        uint32_t *dst = (uint32_t *)((uint16_t *)a.o + orow * KVA_MLA_DV + 256 * wg);
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
          for (int j = 0; j < 16; j++)
            dst[(128 * hh + 8 * j + 2 * tq) / 2] =
                mla_pack<QT>(o[hh][4 * j + 2 * hf] * inv, o[hh][4 * j + 2 * hf + 1] * inv);
        if (a.lse && wg == 0 && tq == 0) a.lse[orow] = lse;
      } else {
        const size_t prow = ((size_t)a.split_row_offset[r] + (size_t)split * nt + t) * a.hq + h;
        float *dst = a.part_o + prow * KVA_MLA_DV + 256 * wg;
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
          for (int j = 0; j < 16; j++)
            *(float2 *)(dst + 128 * hh + 8 * j + 2 * tq) =
                make_float2(o[hh][4 * j + 2 * hf] * inv, o[hh][4 * j + 2 * hf + 1] * inv);
        if (wg == 0 && tq == 0) a.part_lse[prow] = lse;
      }
    }
    if (nsplit > 1) {
      /* Publish this chunk (fence, then count it); the chunk that completes
       * the count merges all of them and resets the count for the next run. */
      __threadfence();
      __syncthreads(); /* the CTA's partial rows are written and fenced */
      if (tid == 0) {
        int32_t *const sem = a.split_sem + (size_t)r * a.hq + blockIdx.y;
        const int last = atomicAdd(sem, 1) == nsplit - 1;
        if (last) atomicExch(sem, 0); /* every chunk has counted */
        *flag = last;
      }
      __syncthreads();
      if (*flag) {
        __threadfence(); /* the other chunks' rows, published before their count */
        const int rows_here = rows - row0 < KVA_MLA_BM ? rows - row0 : KVA_MLA_BM;
        mla_merge_chunks<QT>(a, r, nsplit, nt, tok0, row0, rows_here, tid);
      }
    }
    __syncthreads(); /* flag read, smem done with before the next request's copies */
  }
}

#endif /* KVA_CUDA_MLA_KERNEL_V1_CUH */
