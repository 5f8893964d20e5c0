/* MLA decode v4: FlashMLA's "seesaw" pairing of key blocks, 16-bit latents
 * only (fp8 pools keep v2). Same grid, arguments, split walk, partial rows,
 * in-kernel merge, causal mask, LSE and PDL as v2 (mla_kernel.cuh, whose
 * helpers it uses); mla.cu runs it on batches of >= 128 rows.
 *
 * Keys come in 64-key blocks, in pairs: block 2i in stage 0, 2i+1 in stage
 * 1, each [9 column blocks][64 rows][128 B]. Warpgroup 0 holds O's columns
 * 0..255 (O_L), warpgroup 1 columns 256..511 (O_R); both keep the same
 * running row max. Per pair, with S_j = Q K_j^T (m64n64, 36 k-steps):
 *   WG0: S0; softmax of S0 (max m0, factor c0); P0 to smem; O_L = O_L c0 +
 *        P0 V0_L (P from registers); then O_L = O_L c1 + P1 V1_L (P1 from
 *        smem).
 *   WG1: S1 (issued at once, so it runs while WG0 does its softmax); waits
 *        for m0, c0; O_R = O_R c0 + P0 V0_R (P0 from smem); softmax of S1
 *        against m0 (factor c1) while that runs; P1 to smem; O_R = O_R c1 +
 *        P1 V1_R.
 * Both warpgroups thus do the same share of tensor work (one S, two P V
 * halves per pair) and each one's softmax runs under the other's matmuls;
 * the tensor cores see S0 S1 PV0_L PV0_R PV1_L PV1_R. P1 is written over
 * stage 1's rope columns (block 8: read by S1 only, already done); P0 has a
 * buffer of its own. Named barriers: 1 (P0, c0, m0 published), 2 (P1, c1,
 * m1 published), 3 (warpgroup 1 done reading P0, so the next pair's P0 may
 * overwrite it), 4 + wg (inside a warpgroup: every warp's wgmmas on a
 * buffer are over before any thread reloads it).
 *
 * Loads (cp.async, 16 bytes a thread, rows through the page table, keys at
 * or past the chunk's end zero-filled): each warpgroup refills the column
 * blocks it was the last to read: warpgroup 0 blocks 0..3 and 8 (its V
 * half; stage 0's rope after its S0, stage 1's after P1 V1_L), warpgroup 1
 * blocks 4..7. A stage's next block is issued as soon as those reads are
 * over; the page table rows of those
 * copies are read at the top of the pair (their latency was on the path
 * that issues the matmuls). Every column block of a stage lands on its own
 * mbarrier (128 noinc arrivals), and S waits for each just before its
 * k-steps. */
#ifndef KVA_CUDA_MLA_KERNEL_V4_CUH
#define KVA_CUDA_MLA_KERNEL_V4_CUH

#include "cuda/mla_kernel.cuh"

#define KVA_MLA4_KBLK (KVA_MLA4_BN * 128) /* bytes of one 64-column block of a K/V block */

#define KVA_MLA4_BAR_P0 1
#define KVA_MLA4_BAR_P1 2
#define KVA_MLA4_BAR_SP 3
#define KVA_MLA4_BAR_WG 4 /* + wg */

/* S k-step (m64n64k16, Q and K from smem) and P V step with P from smem
 * (m64n128k16, V through the descriptor's transpose), in Q's type. */
template <int QT>
static __device__ __forceinline__ void mla4_mma_s(float d[32], uint64_t da, uint64_t db, int acc) {
  if (QT == KVA_F16)
    kva_wgmma_m64n64k16_ss_f16(d, da, db, acc);
  else
    kva_wgmma_m64n64k16_ss_bf16(d, da, db, acc);
}

template <int QT>
static __device__ __forceinline__ void mla4_mma_pv_ss(float d[64], uint64_t da, uint64_t db) {
  if (QT == KVA_F16)
    kva_wgmma_m64n128k16_ss_f16_tb(d, da, db);
  else
    kva_wgmma_m64n128k16_ss_bf16_tb(d, da, db);
}

/* O's accumulators fenced (see kva_reg_fence_f32) */
static __device__ __forceinline__ void mla4_fence_o(float o[2][64]) {
#pragma unroll
  for (int i = 0; i < 64; i++) {
    kva_reg_fence_f32(&o[0][i]);
    kva_reg_fence_f32(&o[1][i]);
  }
}

/* O's rows times the factor of their half (rows g and g + 8) */
static __device__ __forceinline__ void mla4_scale_o(float o[2][64], const float alpha[2]) {
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

/* A hand-over to the other warpgroup, which syncs on the barrier. */
static __device__ __forceinline__ void mla4_signal(int id) { kva_bar_arrive(id, KVA_MLA_THREADS); }

/* KV slots of this thread's 4 rows (tw / 8 + 16 p) of the 64-key block at
 * kt, -1 at or past k1: read a pair ahead of their copies, so the page
 * table's latency is off the path that issues the matmuls. */
static __device__ __forceinline__ void mla4_rows(int slot[4], const int32_t *pt, int kt, int k1,
                                                 const kva_mla_args &a, int tw) {
#pragma unroll
  for (int p = 0; p < 4; p++) slot[p] = mla_slot(pt, kt + (tw >> 3) + 16 * p, k1, a);
}

/* This warpgroup's column blocks (wg 0: 0..3 and 8; wg 1: 4..7) of the
 * 64-key block whose rows are at slot[] into the stage at dst (slot -1:
 * zero-filled, so masked P V stays finite), each followed by this thread's
 * noinc arrival on that column block's mbarrier (bar0 + 8 k). */
static __device__ __forceinline__ void mla4_copy(uint32_t dst, uint32_t bar0,
                                                 const unsigned char *kv, const int slot[4], int wg,
                                                 int tw) {
  static_assert(KVA_MLA4_BN == 64, "4 rows per thread");
  const unsigned char *src[4];
  int bytes[4];
#pragma unroll
  for (int p = 0; p < 4; p++) {
    src[p] = kv + (slot[p] >= 0 ? (int64_t)slot[p] * KVA_MLA_D * 2 : 0) + (tw & 7) * 16;
    bytes[p] = slot[p] >= 0 ? 16 : 0;
  }
#pragma unroll
  for (int i = 0; i < 5; i++) {
    if (wg && i == 4) break;
    const int k = wg ? 4 + i : (i < 4 ? i : 8);
#pragma unroll
    for (int p = 0; p < 4; p++)
      kva_cp_async_16(dst + mla_sw<KVA_MLA4_BN>((tw >> 3) + 16 * p, (tw & 7) + 8 * k),
                      src[p] + k * 128, bytes[p]);
    kva_cp_async_mbar_arrive_noinc(bar0 + 8 * k);
  }
}

static __device__ __forceinline__ void mla4_load(uint32_t dst, uint32_t bar0,
                                                 const unsigned char *kv, const int32_t *pt,
                                                 int kt, int k1, const kva_mla_args &a, int wg,
                                                 int tw) {
  int slot[4];
  mla4_rows(slot, pt, kt, k1, a, tw);
  mla4_copy(dst, bar0, kv, slot, wg, tw);
}

/* S = Q K^T of the block in stage s_k, column block by column block as
 * each lands; one commit group, not waited for. */
template <int QT>
static __device__ __forceinline__ void mla4_issue_s(float s[32], uint32_t s_q, uint32_t s_k,
                                                    uint32_t bar0, uint32_t parity) {
#pragma unroll
  for (int i = 0; i < 32; i++) {
    s[i] = 0.0f;
    kva_reg_fence_f32(&s[i]);
  }
  const uint64_t dq = mla_desc(s_q, 16, 1024), dk = mla_desc(s_k, 16, 1024);
  kva_wgmma_fence();
#pragma unroll
  for (int k = 0; k < 9; k++) {
    kva_mbar_wait(bar0 + 8 * k, parity);
    kva_fence_proxy_async_smem(); /* cp.async data -> wgmma */
#pragma unroll
    for (int t = 0; t < 4; t++) {
      const uint32_t qo = (uint32_t)(k * KVA_MLA_QBLK + t * 32);
      const uint32_t ko = (uint32_t)(k * KVA_MLA4_KBLK + t * 32);
      mla4_mma_s<QT>(s, dq + (qo >> 4), dk + (ko >> 4), k > 0 || t > 0);
    }
  }
  kva_wgmma_commit();
}

/* Online softmax of S (block at key kt; masked on the chunk's boundary
 * blocks) against the running max m: m and l updated (l = l c + sum), c
 * the factor for what was accumulated before, P packed to Q's type. */
template <int QT>
static __device__ __forceinline__ void mla4_softmax(float s[32], float m[2], float l[2],
                                                    float c[2], uint32_t pk[8][2], int kt,
                                                    int k1, int cached, const int pos[2],
                                                    const kva_mla_args &a, int tq) {
  const bool need_mask = kt + KVA_MLA4_BN > k1 || (a.causal && kt + KVA_MLA4_BN - 1 > cached);
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 8; j++)
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
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
    const float mn = fmaxf(m[hf], mx[hf]);
    const float mu = mn == -INFINITY ? 0.0f : mn; /* all masked so far: p = 0, no NaN */
    c[hf] = kva_ex2(m[hf] - mu);
    m[hf] = mn;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const float p0 = kva_ex2(s[4 * j + 2 * hf] - mu), p1 = kva_ex2(s[4 * j + 2 * hf + 1] - mu);
      sum += p0 + p1;
      pk[j][hf] = mla_pack<QT>(p0, p1);
    }
    l[hf] = l[hf] * c[hf] + sum;
  }
}

/* P ([64 rows][128 B], chunk j of row r at j ^ r % 8: the A operand of an
 * ss wgmma) and, from one thread per row, the factor and the new max. */
static __device__ __forceinline__ void mla4_publish(unsigned char *p_dst, float *sc, float *sm,
                                                    const uint32_t pk[8][2], const float c[2],
                                                    const float m[2], int wq, int g, int tq) {
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int r = 16 * wq + g + 8 * hf;
#pragma unroll
    for (int j = 0; j < 8; j++)
      *(uint32_t *)(p_dst + r * 128 + ((j ^ (r & 7)) << 4) + 4 * tq) = pk[j][hf];
    if (tq == 0) {
      sc[r] = c[hf];
      sm[r] = m[hf];
    }
  }
  kva_fence_proxy_async_smem(); /* generic stores -> the other warpgroup's wgmma */
}

/* The other warpgroup's factor and max for this thread's rows: O and l
 * rescaled, m taken. */
static __device__ __forceinline__ void mla4_take(float o[2][64], float m[2], float l[2],
                                                 const float *sc, const float *sm, int wq, int g) {
  float c[2];
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int r = 16 * wq + g + 8 * hf;
    c[hf] = sc[r];
    m[hf] = sm[r];
    l[hf] *= c[hf];
  }
  if (__any_sync(0xffffffffu, c[0] != 1.0f || c[1] != 1.0f)) mla4_scale_o(o, c);
}

/* O[:, 256 wg ..] += P V, P from registers; committed, not waited for. */
template <int QT>
static __device__ __forceinline__ void mla4_pv_rs(float o[2][64], uint32_t pk[8][2], uint32_t s_k,
                                                  int wg) {
  mla4_fence_o(o);
#pragma unroll
  for (int j = 0; j < 8; j++) {
    kva_reg_fence_u32(&pk[j][0]);
    kva_reg_fence_u32(&pk[j][1]);
  }
  kva_wgmma_fence();
  const uint64_t dv = mla_desc(s_k + 4 * wg * KVA_MLA4_KBLK, KVA_MLA4_KBLK, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    const uint32_t pa[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
#pragma unroll
    for (int h = 0; h < 2; h++)
      mla_mma_pv<QT>(o[h], pa, dv + ((2 * h * KVA_MLA4_KBLK + kk * 16 * 128) >> 4));
  }
  kva_wgmma_commit();
}

/* O[:, 256 wg ..] += P V, P from smem at s_p; committed, not waited for. */
template <int QT>
static __device__ __forceinline__ void mla4_pv_ss(float o[2][64], uint32_t s_p, uint32_t s_k,
                                                  int wg) {
  mla4_fence_o(o);
  kva_wgmma_fence();
  const uint64_t dp = mla_desc(s_p, 16, 1024);
  const uint64_t dv = mla_desc(s_k + 4 * wg * KVA_MLA4_KBLK, KVA_MLA4_KBLK, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
#pragma unroll
    for (int h = 0; h < 2; h++)
      mla4_mma_pv_ss<QT>(o[h], dp + ((kk * 32) >> 4),
                         dv + ((2 * h * KVA_MLA4_KBLK + kk * 16 * 128) >> 4));
  kva_wgmma_commit();
}

template <int QT>
__global__ void __launch_bounds__(KVA_MLA_THREADS, 1)
    kva_mla_kernel_v4(const __grid_constant__ kva_mla_args a) {
  constexpr int TILE = KVA_MLA4_TILE, BN = KVA_MLA4_BN, KB = KVA_MLA4_KBLK;
  static_assert(KVA_MLA4_SMEM <= 232448, "227 KB of smem per CTA");
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_q = smem + (s_q - s_raw);
  const uint32_t s_st0 = s_q + KVA_MLA_QTILE, s_st1 = s_st0 + TILE;
  const uint32_t s_p1 = s_st1 + 8 * KB; /* P1 over stage 1's rope columns */
  unsigned char *const p_p1 = p_q + KVA_MLA_QTILE + TILE + 8 * KB;
  const uint32_t s_p0 = s_st1 + TILE;
  unsigned char *const p_p0 = p_q + KVA_MLA_QTILE + 2 * TILE;
  float *const sc0 = (float *)(p_p0 + KVA_MLA4_P); /* [64] factor c0 */
  float *const sm0 = sc0 + KVA_MLA_BM;             /* [64] max m0 */
  float *const sc1 = sm0 + KVA_MLA_BM;             /* [64] factor c1 */
  float *const sm1 = sc1 + KVA_MLA_BM;             /* [64] max m1 */
  float *const sl = sm1 + KVA_MLA_BM;              /* [2][64] row sums */
  /* mbarriers: Q, then stage s column block k at 8 (1 + 9 s + k) */
  const uint32_t s_bar = s_p0 + KVA_MLA4_P + KVA_MLA4_STATS;
  volatile int *const flag = (volatile int *)(p_p0 + KVA_MLA4_P + KVA_MLA4_STATS + 152);
  const uint32_t bar_st0 = s_bar + 8, bar_st1 = s_bar + 8 * 10;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = mla_uni(warp >> 2), wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const int tw = tid & 127;
  const kva_plan_header *hdr = a.hdr;
  kva_griddep_launch_dependents();
  KVA_TRACE_STAMP(0, kva_globaltimer());
  if ((int)blockIdx.x >= hdr->num_workers) {
    KVA_TRACE_STAMP(8, kva_globaltimer());
    KVA_TRACE_STAMP(9, kva_smid());
    return;
  }
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

  /* fills of each stage and Q loads so far (mbarrier phases), CTA-uniform */
  int f0 = 0, f1 = 0, nq = 0;
  unsigned trace_chunks = 0, trace_merges = 0;
  for (int r = wk.begin_req; r <= wk.end_req; r++) {
    const int nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
    if (nsplit == 0) continue;
    const int nt = a.num_new[r], rows = nt * a.hq;
    if (row0 >= rows) continue;
    const int kv_len = a.cache_seqlens[r], cached = kv_len - nt;
    const int split = r == wk.begin_req ? wk.begin_split : 0;
    const int k1 = r == wk.end_req ? wk.end_pos : kv_len;
    const int k0 = r == wk.begin_req ? wk.begin_pos : 0;
    const int nblk = k1 > k0 ? (k1 - k0 + BN - 1) / BN : 0;
    const int npairs = (nblk + 1) >> 1;
    const int tok0 = a.cu_q[r];
    const int32_t *const pt = a.page_table + (size_t)r * hdr->page_table_stride;

    kva_griddep_wait();
    if (trace_chunks == 0) KVA_TRACE_STAMP(1, kva_globaltimer());
    if (nblk > 0) { /* Q (all threads), blocks 0 and 1 (each warpgroup its columns) */
      mla_issue_q(s_q, a, tok0, row0, rows, tid);
      kva_cp_async_mbar_arrive_noinc(s_bar);
      mla4_load(s_st0, bar_st0, kvg, pt, k0, k1, a, wg, tw);
      if (nblk > 1) mla4_load(s_st1, bar_st1, kvg, pt, k0 + BN, k1, a, wg, tw);
    }

    int pos[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) pos[hf] = cached + (row0 + 16 * wq + g + 8 * hf) / a.hq;
    float o[2][64], m[2], l[2];
#pragma unroll
    for (int i = 0; i < 64; i++) o[0][i] = o[1][i] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;

    for (int i = 0; i < npairs; i++) {
      const int kt0 = k0 + 2 * i * BN, kt1 = kt0 + BN;
      const bool has1 = 2 * i + 1 < nblk, more = i + 1 < npairs;
      const uint32_t par0 = (uint32_t)((f0 + i) & 1), par1 = (uint32_t)((f1 + i) & 1);
      float s[32], c[2];
      uint32_t pk[8][2];
      int nx0[4], nx1[4]; /* rows of the blocks this pair loads: 2i+2, 2i+3 */
      mla4_rows(nx0, pt, kt0 + 2 * BN, more ? k1 : 0, a, tw);
      mla4_rows(nx1, pt, kt1 + 2 * BN, 2 * i + 3 < nblk ? k1 : 0, a, tw);
      if (i == 0) kva_mbar_wait(s_bar, (uint32_t)(nq & 1)); /* Q */
      if (wg == 0) {
        mla4_issue_s<QT>(s, s_q, s_st0, bar_st0, par0);
        kva_wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 32; j++) kva_reg_fence_f32(&s[j]);
        mla4_softmax<QT>(s, m, l, c, pk, kt0, k1, cached, pos, a, tq);
        if (i > 0) kva_bar_sync(KVA_MLA4_BAR_SP, KVA_MLA_THREADS); /* WG1 is done with P0 */
        mla4_publish(p_p0, sc0, sm0, pk, c, m, wq, g, tq);
        mla4_signal(KVA_MLA4_BAR_P0);
        if (__any_sync(0xffffffffu, c[0] != 1.0f || c[1] != 1.0f)) mla4_scale_o(o, c);
        mla4_pv_rs<QT>(o, pk, s_st0, 0);
        if (has1) {
          kva_bar_sync(KVA_MLA4_BAR_P1, KVA_MLA_THREADS); /* P1, c1, m1 */
          /* V1_L was waited for by warpgroup 1 (S1), not here: this
           * warp's own proxy fence, after the barrier, covers it */
          kva_fence_proxy_async_smem();
          kva_wgmma_wait<0>();
          mla4_fence_o(o);
          mla4_take(o, m, l, sc1, sm1, wq, g);
          kva_bar_sync(KVA_MLA4_BAR_WG, KVA_MLA_THREADS / 2); /* S0, P0 V0_L over */
          if (more) mla4_copy(s_st0, bar_st0, kvg, nx0, 0, tw);
          mla4_pv_ss<QT>(o, s_p1, s_st1, 0);
          kva_wgmma_wait<0>();
          mla4_fence_o(o);
          kva_bar_sync(KVA_MLA4_BAR_WG, KVA_MLA_THREADS / 2); /* P1 V1_L over */
          if (2 * i + 3 < nblk) mla4_copy(s_st1, bar_st1, kvg, nx1, 0, tw);
        } else {
          kva_wgmma_wait<0>();
          mla4_fence_o(o);
        }
      } else {
        if (has1) {
          mla4_issue_s<QT>(s, s_q, s_st1, bar_st1, par1);
          kva_bar_sync(KVA_MLA4_BAR_P0, KVA_MLA_THREADS); /* P0, c0, m0 */
          kva_fence_proxy_async_smem(); /* V0_R landed for warpgroup 0's S0 */
          mla4_take(o, m, l, sc0, sm0, wq, g);
          mla4_pv_ss<QT>(o, s_p0, s_st0, 1);
          kva_wgmma_wait<1>(); /* S1 */
#pragma unroll
          for (int j = 0; j < 32; j++) kva_reg_fence_f32(&s[j]);
          mla4_softmax<QT>(s, m, l, c, pk, kt1, k1, cached, pos, a, tq);
          kva_bar_sync(KVA_MLA4_BAR_WG + 1, KVA_MLA_THREADS / 2); /* S1 over: P1 may go there */
          mla4_publish(p_p1, sc1, sm1, pk, c, m, wq, g, tq);
          mla4_signal(KVA_MLA4_BAR_P1);
          kva_wgmma_wait<0>(); /* P0 V0_R */
          mla4_fence_o(o);
          kva_bar_sync(KVA_MLA4_BAR_WG + 1, KVA_MLA_THREADS / 2); /* P0 V0_R over */
          if (more) {
            mla4_copy(s_st0, bar_st0, kvg, nx0, 1, tw); /* before the signal: S0 needs it */
            mla4_signal(KVA_MLA4_BAR_SP);
          }
          if (__any_sync(0xffffffffu, c[0] != 1.0f || c[1] != 1.0f)) mla4_scale_o(o, c);
          mla4_pv_rs<QT>(o, pk, s_st1, 1);
          kva_wgmma_wait<0>();
          mla4_fence_o(o);
          kva_bar_sync(KVA_MLA4_BAR_WG + 1, KVA_MLA_THREADS / 2); /* P1 V1_R over */
          if (2 * i + 3 < nblk) mla4_copy(s_st1, bar_st1, kvg, nx1, 1, tw);
        } else {
          kva_bar_sync(KVA_MLA4_BAR_P0, KVA_MLA_THREADS);
          kva_fence_proxy_async_smem();
          mla4_take(o, m, l, sc0, sm0, wq, g);
          mla4_pv_ss<QT>(o, s_p0, s_st0, 1);
          kva_wgmma_wait<0>();
          mla4_fence_o(o);
        }
      }
    }
    trace_chunks++;
    KVA_TRACE_STAMP(3, kva_globaltimer());
    if (nblk > 0) {
      f0 += npairs;
      f1 += nblk >> 1;
      nq++;
    }

    /* ---- row sums of both warpgroups, then O (or the partial row) ---- */
    __syncthreads(); /* the previous chunk's sums are read */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      float lt = l[hf];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      l[hf] = lt;
      if (tq == 0) sl[wg * KVA_MLA_BM + 16 * wq + g + 8 * hf] = lt;
    }
    __syncthreads();
    float lt[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) lt[hf] = l[hf] + sl[(wg ^ 1) * KVA_MLA_BM + 16 * wq + g + 8 * hf];
    mla_store_rows<QT>(a, o, lt, m, r, split, nsplit, nt, tok0, row0, rows, wg, wq, g, tq);
    if (nsplit > 1) {
      /* Count this chunk (split_merge.cuh); the chunk that completes the
       * count merges all of them. */
      __syncthreads(); /* the CTA's partial rows are written */
      KVA_TRACE_STAMP(4, kva_globaltimer());
      if (tid == 0) *flag = kva_split_arrive(a.split_sem + (size_t)r * a.hq + blockIdx.y, nsplit);
      __syncthreads();
      if (*flag) {
        trace_merges++;
        KVA_TRACE_STAMP(5, kva_globaltimer());
        KVA_TRACE_STAMP(6, kva_globaltimer());
        /* the stages are free until the next request's loads */
        mla_merge_rows<QT>(a, r, nsplit, nt, tok0, row0, rows, tid,
                           (float *)(p_q + KVA_MLA_QTILE), (size_t)(2 * TILE));
        KVA_TRACE_STAMP(7, kva_globaltimer());
      }
    }
    __syncthreads(); /* row sums, flag read; stages free for the next request */
  }
  KVA_TRACE_STAMP(8, kva_globaltimer());
  KVA_TRACE_STAMP(9, kva_smid());
  KVA_TRACE_STAMP(10, trace_chunks);
  KVA_TRACE_STAMP(11, trace_merges);
}

#endif /* KVA_CUDA_MLA_KERNEL_V4_CUH */
