/* MLA decode v3 (FlashMLA's manner), 16-bit latents only (fp8 pools keep
 * v2); selected with KVA_MLA_KERNEL=v3. Same grid, arguments, split walk,
 * partial rows, in-kernel merge, causal mask, LSE and PDL as v2
 * (mla_kernel.cuh, whose helpers it uses).
 *
 * Keys come in 64-key blocks (one page at page size 64) held in two stages
 * of [9 column blocks][64 rows][128 B]. Block G (a CTA-wide running count
 * over its request chunks) sits in stage G % 2 and warpgroup G % 2 owns it:
 * the owner computes the whole S = Q K^T (36 wgmma m64n64k16, Q and K from
 * smem: no half-S exchange), runs the online softmax, and publishes P
 * (bf16/f16 [64][64] in smem), the per-row rescale factor and the new row
 * max (named barrier 1 + G % 2: owner arrives, the other warpgroup syncs).
 * Both then do O[:, 256 w ..] += P V for their own 256 columns: the owner
 * with P from registers (rs), the other with P from smem (ss). While one
 * warpgroup runs the softmax of its block, the other runs the P V of the
 * previous block on the tensor cores, and the next block's S follows.
 *
 * Loads: warpgroup w owns half w of every stage (column blocks 0..3 for
 * w = 0: its V half; 4..8 for w = 1: its V half and the 64 rope columns),
 * so a warpgroup reloads its half as soon as its own last use of the block
 * is over, without waiting for the other one (S of a block, the only
 * cross-half use, completes before P is published). Each 64-column block
 * of a stage lands on its own mbarrier (cp.async.mbarrier.arrive.noinc, 128
 * arrivals) and S waits for each just before its k-steps; Q on one more
 * (256). Block i+1 is issued at the start of block i. */
#ifndef KVA_CUDA_MLA_KERNEL_V3_CUH
#define KVA_CUDA_MLA_KERNEL_V3_CUH

#include "cuda/mla_kernel.cuh"

#define KVA_MLA3_KBLK (KVA_MLA3_BN * 128) /* bytes of one 64-column block of a K/V block */

template <int QT>
static __device__ __forceinline__ void mla3_mma_s(float d[32], uint64_t da, uint64_t db, int acc) {
  if (QT == KVA_F16)
    kva_wgmma_m64n64k16_ss_f16(d, da, db, acc);
  else
    kva_wgmma_m64n64k16_ss_bf16(d, da, db, acc);
}
template <int QT>
static __device__ __forceinline__ void mla3_mma_pv_ss(float d[64], uint64_t da, uint64_t db) {
  if (QT == KVA_F16)
    kva_wgmma_m64n128k16_ss_f16_tb(d, da, db);
  else
    kva_wgmma_m64n128k16_ss_bf16_tb(d, da, db);
}

/* cp.async of half `half` of the 64-key block at kt into the stage at dst
 * by the 128 threads of warpgroup `half` (tw: thread in the warpgroup): 8
 * threads per row (128 contiguous bytes), rows tw / 8 + 16 p; keys at or
 * past k1 zero-filled (masked P * V stays finite). Column block by column
 * block, each followed by this thread's arrival on that block's mbarrier
 * (bar0 + 8 k) once its copies so far landed: S starts on the first
 * column blocks while the later ones still stream in. */
static __device__ __forceinline__ void mla3_issue_half(uint32_t dst, uint32_t bar0,
                                                       const unsigned char *kv, const int32_t *pt,
                                                       int kt, int k1, const kva_mla_args &a,
                                                       int half, int tw) {
  const unsigned char *src[KVA_MLA3_BN / 16];
  int bytes[KVA_MLA3_BN / 16];
#pragma unroll
  for (int p = 0; p < KVA_MLA3_BN / 16; p++) {
    const int slot = mla_slot(pt, kt + (tw >> 3) + 16 * p, k1, a);
    src[p] = kv + (slot >= 0 ? (int64_t)slot * KVA_MLA_D * 2 : 0) + (tw & 7) * 16;
    bytes[p] = slot >= 0 ? 16 : 0;
  }
  const int kb0 = half ? 4 : 0, kb1 = half ? 9 : 4;
#pragma unroll
  for (int k = kb0; k < kb1; k++) {
#pragma unroll
    for (int p = 0; p < KVA_MLA3_BN / 16; p++)
      kva_cp_async_16(dst + mla_sw<KVA_MLA3_BN>((tw >> 3) + 16 * p, (tw & 7) + 8 * k),
                      src[p] + k * 128, bytes[p]);
    kva_cp_async_mbar_arrive_noinc(bar0 + 8 * k);
  }
}

/* S = Q K^T of the block at s_k (36 k-steps of 16 dims), issued column
 * block by column block as each lands (the two warpgroups' blocks
 * alternately, roughly their landing order), committed as one group. */
template <int QT>
static __device__ __forceinline__ void mla3_issue_s(float s[32], uint32_t s_q, uint32_t s_k,
                                                    uint32_t bar0, uint32_t parity) {
#pragma unroll
  for (int i = 0; i < 32; i++) {
    s[i] = 0.0f;
    kva_reg_fence_f32(&s[i]);
  }
  const uint64_t dq = mla_desc(s_q, 16, 1024), dk = mla_desc(s_k, 16, 1024);
  kva_wgmma_fence();
#pragma unroll
  for (int i = 0; i < 9; i++) {
    const int k = i == 8 ? 8 : (i >> 1) + 4 * (i & 1); /* 0 4 1 5 2 6 3 7 8 */
    kva_mbar_wait(bar0 + 8 * k, parity);
    kva_fence_proxy_async_smem(); /* cp.async data -> wgmma */
#pragma unroll
    for (int t = 0; t < 4; t++) {
      const uint32_t qo = (uint32_t)(k * KVA_MLA_QBLK + t * 32);
      const uint32_t ko = (uint32_t)(k * KVA_MLA3_KBLK + t * 32);
      mla3_mma_s<QT>(s, dq + (qo >> 4), dk + (ko >> 4), i > 0 || t > 0);
    }
  }
  kva_wgmma_commit();
}

static __device__ __forceinline__ void mla3_fence_o(float o[2][64]) {
#pragma unroll
  for (int i = 0; i < 64; i++) {
    kva_reg_fence_f32(&o[0][i]);
    kva_reg_fence_f32(&o[1][i]);
  }
}

static __device__ __forceinline__ void mla3_scale_o(float o[2][64], const float alpha[2]) {
#pragma unroll
  for (int hf = 0; hf < 2; hf++)
#pragma unroll
    for (int j = 0; j < 16; j++) {
      o[0][4 * j + 2 * hf] *= alpha[hf];
      o[0][4 * j + 2 * hf + 1] *= alpha[hf];
      o[1][4 * j + 2 * hf] *= alpha[hf];
      o[1][4 * j + 2 * hf + 1] *= alpha[hf];
    }
}

/* The owner's step for the block at kt in stage s_k: S, online softmax, P
 * (and the row factors) published to the other warpgroup, O rescaled, P V
 * from registers; waited for before returning (no wgmma in flight across
 * the caller's branches: ptxas would serialize them). */
template <int QT>
static __device__ __forceinline__ void mla3_own(float o[2][64], float m[2], float l[2],
                                                const int pos[2], int kt, int k1, int cached,
                                                const kva_mla_args &a, uint32_t s_q, uint32_t s_k,
                                                unsigned char *p_p, float *sc, float *sm,
                                                int bar, int wg, int wq, int g, int tq,
                                                uint32_t bar0, uint32_t parity) {
  constexpr int NJ = KVA_MLA3_BN / 8;
  float s[4 * NJ];
  mla3_issue_s<QT>(s, s_q, s_k, bar0, parity);
  kva_wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&s[i]);

  /* logits (base 2), mask on boundary blocks, online softmax */
  const bool need_mask = kt + KVA_MLA3_BN > k1 || (a.causal && kt + KVA_MLA3_BN - 1 > cached);
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
  float alpha[2];
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
    const float mn = fmaxf(m[hf], mx[hf]);
    const float mu = mn == -INFINITY ? 0.0f : mn; /* all masked so far: p = 0, no NaN */
    alpha[hf] = kva_ex2(m[hf] - mu);
    m[hf] = mn;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const float p0 = kva_ex2(s[4 * j + 2 * hf] - mu), p1 = kva_ex2(s[4 * j + 2 * hf + 1] - mu);
      sum += p0 + p1;
      pk[j][hf] = mla_pack<QT>(p0, p1);
    }
    l[hf] = l[hf] * alpha[hf] + sum;
  }

  /* publish P (the A operand of the other warpgroup's P V: K-major
   * [64 rows][128 B], chunk j of row r at (j ^ r % 8)), alpha and m. The
   * buffers' previous readers are done: P(G-1) by this warpgroup's P V
   * (waited), alpha/m(G-1) by this warpgroup, alpha/m(G-2) by the other
   * one before it published P(G-1). */
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int r = 16 * wq + g + 8 * hf;
#pragma unroll
    for (int j = 0; j < NJ; j++)
      *(uint32_t *)(p_p + r * 128 + ((j ^ (r & 7)) << 4) + 4 * tq) = pk[j][hf];
    if (tq == 0) {
      sc[r] = alpha[hf];
      sm[r] = m[hf];
    }
  }
  kva_fence_proxy_async_smem(); /* P: generic stores -> the other warpgroup's wgmma */
  kva_bar_arrive(bar, KVA_MLA_THREADS);

  /* O[:, 256 wg ..] = O alpha + P V (P from registers) */
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) mla3_scale_o(o, alpha);
  mla3_fence_o(o);
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    kva_reg_fence_u32(&pk[j][0]);
    kva_reg_fence_u32(&pk[j][1]);
  }
  kva_wgmma_fence();
  const uint64_t dv = mla_desc(s_k + 4 * wg * KVA_MLA3_KBLK, KVA_MLA3_KBLK, 1024);
#pragma unroll
  for (int kk = 0; kk < KVA_MLA3_BN / 16; kk++) {
    const uint32_t pa[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
#pragma unroll
    for (int h = 0; h < 2; h++)
      mla_mma_pv<QT>(o[h], pa, dv + ((2 * h * KVA_MLA3_KBLK + kk * 16 * 128) >> 4));
  }
  kva_wgmma_commit();
  kva_wgmma_wait<0>();
  mla3_fence_o(o);
}

/* The other warpgroup's step: wait for the owner's P, rescale O, P V with
 * P from smem; waited for before returning. */
template <int QT>
static __device__ __forceinline__ void mla3_other(float o[2][64], float m[2], float l[2],
                                                  uint32_t s_k, uint32_t s_p, const float *sc,
                                                  const float *sm, int bar, int wg, int wq, int g) {
  kva_bar_sync(bar, KVA_MLA_THREADS);
  kva_fence_proxy_async_smem(); /* P and this warpgroup's landed V half -> wgmma */
  float alpha[2];
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int r = 16 * wq + g + 8 * hf;
    alpha[hf] = sc[r];
    m[hf] = sm[r];
    l[hf] *= alpha[hf];
  }
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) mla3_scale_o(o, alpha);
  mla3_fence_o(o);
  kva_wgmma_fence();
  const uint64_t dp = mla_desc(s_p, 16, 1024);
  const uint64_t dv = mla_desc(s_k + 4 * wg * KVA_MLA3_KBLK, KVA_MLA3_KBLK, 1024);
#pragma unroll
  for (int kk = 0; kk < KVA_MLA3_BN / 16; kk++)
#pragma unroll
    for (int h = 0; h < 2; h++)
      mla3_mma_pv_ss<QT>(o[h], dp + ((kk * 32) >> 4),
                         dv + ((2 * h * KVA_MLA3_KBLK + kk * 16 * 128) >> 4));
  kva_wgmma_commit();
  kva_wgmma_wait<0>();
  mla3_fence_o(o);
}

template <int QT>
__global__ void __launch_bounds__(KVA_MLA_THREADS, 1)
    kva_mla_kernel_v3(const __grid_constant__ kva_mla_args a) {
  constexpr int TILE = KVA_MLA3_TILE, BN = KVA_MLA3_BN;
  static_assert(KVA_MLA3_SMEM <= 232448, "227 KB of smem per CTA");
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_q = smem + (s_q - s_raw);
  const uint32_t s_kv = s_q + KVA_MLA_QTILE; /* stage i at s_kv + i TILE */
  const uint32_t s_p = s_kv + 2 * TILE;
  unsigned char *const p_p = p_q + KVA_MLA_QTILE + 2 * TILE;
  float *const sc = (float *)(p_p + KVA_MLA3_P); /* [64] rescale factors */
  float *const sm = sc + KVA_MLA_BM;             /* [64] row max */
  float *const sl = sm + KVA_MLA_BM;             /* [2][64] row sums */
  /* mbarriers: Q, then stage s column block k at 8 (1 + 9 s + k) */
  const uint32_t s_bar = s_p + KVA_MLA3_P + KVA_MLA3_STATS;
  volatile int *const flag = (volatile int *)(p_p + KVA_MLA3_P + KVA_MLA3_STATS + 152);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = mla_uni(warp >> 2), wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const int tw = tid & 127;
  const kva_plan_header *hdr = a.hdr;
  kva_griddep_launch_dependents();
  if ((int)blockIdx.x >= hdr->num_workers) return;
  const int row0 = (int)blockIdx.y * KVA_MLA_BM;
  if (row0 >= hdr->max_q_len * a.hq) return;
  const kva_split_work wk = a.sched[blockIdx.x];
  const unsigned char *const kvg = (const unsigned char *)a.kv;
  if (tid == 0) {
    kva_mbar_init(s_bar, KVA_MLA_THREADS);
#pragma unroll
    for (int i = 1; i < 19; i++) kva_mbar_init(s_bar + 8 * i, KVA_MLA_THREADS / 2);
  }
  __syncthreads(); /* the inits are seen by every thread */

  int gb = 0, nq = 0; /* blocks and Q loads so far (mbarrier phases) */
  for (int r = wk.begin_req; r <= wk.end_req; r++) {
    const int nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
    if (nsplit == 0) continue;
    const int nt = a.num_new[r], rows = nt * a.hq;
    if (row0 >= rows) continue;
    const int kv_len = a.cache_seqlens[r], cached = kv_len - nt;
    const int split = r == wk.begin_req ? wk.begin_split : 0;
    const int k1 = r == wk.end_req ? wk.end_pos : kv_len;
    const int k0 = r == wk.begin_req ? wk.begin_pos : 0;
    const int ntiles = k1 > k0 ? (k1 - k0 + BN - 1) / BN : 0;
    const int tok0 = a.cu_q[r];
    const int32_t *const pt = a.page_table + (size_t)r * hdr->page_table_stride;

    kva_griddep_wait();
    if (ntiles > 0) { /* Q (all threads), block 0 (each warpgroup its half) */
      mla_issue_q(s_q, a, tok0, row0, rows, tid);
      kva_cp_async_mbar_arrive_noinc(s_bar);
      mla3_issue_half(s_kv + (gb & 1) * TILE, s_bar + 8 * (1 + 9 * (gb & 1)), kvg, pt, k0, k1, a,
                      wg, tw);
    }

    int pos[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) pos[hf] = cached + (row0 + 16 * wq + g + 8 * hf) / a.hq;
    float o[2][64], m[2], l[2];
#pragma unroll
    for (int i = 0; i < 64; i++) o[0][i] = o[1][i] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
      const int gi = gb + it, st = gi & 1;
      /* this warpgroup's uses of block it-1 (stage st ^ 1, and P in smem)
       * are over in all four warps (each waited only for its own part of
       * the wgmmas): its half of block it+1 goes there */
      if (it > 0) kva_bar_sync(3 + wg, KVA_MLA_THREADS / 2);
      if (it + 1 < ntiles)
        mla3_issue_half(s_kv + (st ^ 1) * TILE, s_bar + 8 * (1 + 9 * (st ^ 1)), kvg, pt,
                        k0 + (it + 1) * BN, k1, a, wg, tw);
      const uint32_t s_k = s_kv + st * TILE;
      if (st == wg) {
        kva_mbar_wait(s_bar, (uint32_t)(nq & 1)); /* Q */
        mla3_own<QT>(o, m, l, pos, k0 + it * BN, k1, cached, a, s_q, s_k, p_p, sc, sm, 1 + st,
                     wg, wq, g, tq, s_bar + 8 * (1 + 9 * st), (uint32_t)((gi >> 1) & 1));
      } else {
        mla3_other<QT>(o, m, l, s_k, s_p, sc, sm, 1 + st, wg, wq, g);
      }
    }
    if (ntiles > 0) {
      gb += ntiles;
      nq++;
    }

    /* ---- row sums of both warpgroups, then O (or the partial row) ---- */
    /* sl is read below by the other warpgroup: after a chunk of one block
     * the owner never waits on it and would overwrite the previous chunk's
     * sums while they are being read (compute-sanitizer racecheck) */
    __syncthreads();
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      float lt = l[hf];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      l[hf] = lt;
      if (tq == 0) sl[wg * KVA_MLA_BM + 16 * wq + g + 8 * hf] = lt;
    }
    __syncthreads();
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      const int lr = 16 * wq + g + 8 * hf, grow = row0 + lr;
      const float lt = l[hf] + sl[(wg ^ 1) * KVA_MLA_BM + lr];
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
      /* Count this chunk (split_merge.cuh); the chunk that completes the
       * count merges all of them. */
      __syncthreads(); /* the CTA's partial rows are written */
      if (tid == 0) *flag = kva_split_arrive(a.split_sem + (size_t)r * a.hq + blockIdx.y, nsplit);
      __syncthreads();
      if (*flag) {
        const int rows_here = rows - row0 < KVA_MLA_BM ? rows - row0 : KVA_MLA_BM;
        mla_merge_chunks<QT>(a, r, nsplit, nt, tok0, row0, rows_here, tid);
      }
    }
    __syncthreads(); /* row sums, flag read; stages free for the next request */
  }
}

#endif /* KVA_CUDA_MLA_KERNEL_V3_CUH */
