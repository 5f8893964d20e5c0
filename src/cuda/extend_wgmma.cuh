/* Extend (prefill) attention on Hopper wgmma without warp specialization
 * (KVA_EXTEND_KERNEL=wgmma; head_dim 128, f16/bf16 Q with same-type KV).
 * The warp-specialized kernel (extend_ws.cuh) is the default and reuses the
 * tile layout, descriptors, wgmma helpers and softmax defined here.
 *
 * Same work items, tile schedule and paged cp.async gather as the mma.sync
 * kernel (extend_kernel.cuh), but a CTA is 2 warpgroups of 64 query rows
 * each and a key tile is 128 keys: S = Q K^T is 8 wgmma m64n128k16 with Q
 * and K read from smem by descriptor (K-major, 128-byte swizzle), softmax
 * runs on the accumulators, P stays in registers as the A operand of
 * O += P V (8 wgmma, V MN-major through the descriptor's transpose).
 *
 * Overlap (FA3's intra-warpgroup pipelining): tile n issues S_n and then
 * P_{n-1} V_{n-1}, waits for S_n only, and runs its softmax while the tensor
 * cores still do P_{n-1} V_{n-1}; O is rescaled after that completes. V of
 * tile n-1 is thus read during tile n, hence 3 ring stages. The ring is
 * synchronized with __syncthreads (no warp specialization, no mbarriers).
 *
 * Tiles are 128 rows of 256 bytes stored as two 64-column blocks of
 * [128 rows][128 B], 16-byte chunks swizzled by row % 8 (Swizzle<3,4,3> on
 * the byte address, so tiles sit at 1024-byte aligned addresses). */
#ifndef KVA_CUDA_EXTEND_WGMMA_CUH
#define KVA_CUDA_EXTEND_WGMMA_CUH

#include "cuda/extend_kernel.cuh"
#include "cuda/online_max.cuh"

#define KVA_WG_THREADS 256
#define KVA_WG_BM 128
#define KVA_WG_BN 128
#define KVA_WG_TILE (128 * 256) /* bytes of a Q, K or V tile */
#define KVA_WG_STAGES 3
/* 1 KB alignment slack, Q, 3 stages of (K, V), the item slots: 230656 B */
#define KVA_WG_SMEM (1024 + KVA_WG_TILE + KVA_WG_STAGES * 2 * KVA_WG_TILE + KVA_EXT_ITEM_BYTES)
#define KVA_WG_ORS 272 /* row stride of the (padded, unswizzled) O staging */

/* Byte offset of 16-byte chunk c (0..15) of row `row` in a 128-row tile. */
static __device__ __forceinline__ uint32_t wg_sw128(int row, int c) {
  return (uint32_t)((c >> 3) * (128 * 128) + row * 128 + (((c & 7) ^ (row & 7)) << 4));
}

/* Shared-memory matrix descriptor, 128-byte swizzle. K-major operands: rows
 * at 128 B, 8-row groups at sbo = 1024, lbo unused. MN-major (V): 64-column
 * blocks at lbo, 8-row (key) groups at sbo. */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3ffffu) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

/* desc (wg_desc) moved by `off` bytes: the start-address field (bits 0-13,
 * addr >> 4) takes the offset without a carry out, smem being < 256 KB.
 * Built from a tile's base descriptor, each k-step's descriptor is one
 * add instead of the mask, shift and or of wg_desc (12 uniform
 * instructions per S wgmma otherwise). */
static __device__ __forceinline__ uint64_t wg_desc_at(uint64_t desc, uint32_t off) {
  return desc + (uint64_t)(off >> 4);
}

/* cp.async of one K and one V tile (128 keys) into the swizzled layout.
 * Thread tid copies chunk tid % 16 of rows tid / 16 + 16 i; the slot of
 * each row comes from lane 2 i + lane / 16, whose `pre` holds the slot of
 * row 2 warp + lane % 2 + 16 (lane / 2). */
static __device__ __forceinline__ void wg_issue_kv(uint32_t kdst, uint32_t vdst, int pre,
                                                   const unsigned char *kg, const unsigned char *vg,
                                                   int slot_elems, int tid) {
  const int lane = tid & 31, c = tid & 15;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int slot = __shfl_sync(0xffffffffu, pre, 2 * i + (lane >> 4));
    const uint32_t dst = wg_sw128((tid >> 4) + 16 * i, c);
    const int64_t off = (slot >= 0 ? (int64_t)slot * slot_elems : 0) * 2 + c * 16;
    const int bytes = slot >= 0 ? 16 : 0;
    kva_cp_async_16(kdst + dst, kg + off, bytes);
    kva_cp_async_16(vdst + dst, vg + off, bytes);
  }
}

static __device__ __forceinline__ void wg_issue_q(const kva_ext_args *a, uint32_t s_q, int q_row0,
                                                  int n_valid, int h, int tid) {
  const unsigned char *qg = (const unsigned char *)a->q;
#pragma unroll 1
  for (int i = 0; i < 8; i++) {
    const int idx = tid + i * KVA_WG_THREADS, row = idx >> 4, c = idx & 15;
    const int ok = row < n_valid;
    const unsigned char *src =
        ok ? qg + (((int64_t)(q_row0 + row) * a->hq + h) * 128) * 2 + c * 16 : qg;
    kva_cp_async_16(s_q + wg_sw128(row, c), src, ok ? 16 : 0);
  }
}

/* m64nNk16: S (SS, N = key tile 128 or 64) and P V (RS, N = head dim) */
template <int QT, int N = 128>
static __device__ __forceinline__ void wg_mma_ss(float d[N / 2], uint64_t da, uint64_t db,
                                                 int acc) {
  static_assert(N == 128 || N == 64, "wgmma SS shape");
  if (N == 64)
    QT == KVA_F16 ? kva_wgmma_m64n64k16_ss_f16(d, da, db, acc)
                  : kva_wgmma_m64n64k16_ss_bf16(d, da, db, acc);
  else if (QT == KVA_F16)
    kva_wgmma_m64n128k16_ss_f16(d, da, db, acc);
  else
    kva_wgmma_m64n128k16_ss_bf16(d, da, db, acc);
}
template <int QT, int N = 128>
static __device__ __forceinline__ void wg_mma_rs(float d[N / 2], const uint32_t a[4],
                                                 uint64_t db) {
  static_assert(N == 128 || N == 64 || N == 256, "wgmma RS shape");
  if (N == 64)
    QT == KVA_F16 ? kva_wgmma_m64n64k16_rs_f16_tb(d, a, db) : kva_wgmma_m64n64k16_rs_bf16_tb(d, a, db);
  else if (N == 256)
    QT == KVA_F16 ? kva_wgmma_m64n256k16_rs_f16_tb(d, a, db)
                  : kva_wgmma_m64n256k16_rs_bf16_tb(d, a, db);
  else if (QT == KVA_F16)
    kva_wgmma_m64n128k16_rs_f16_tb(d, a, db);
  else
    kva_wgmma_m64n128k16_rs_bf16_tb(d, a, db);
}

/* S = Q K^T for this warpgroup's 64 rows (issued, committed, not waited).
 * Accumulator element 4 j + e: row g + 8 (e >> 1) of the warp, column
 * 8 j + 2 t + (e & 1). D: head dim, BN: keys of the K tile; tiles hold
 * D / 64 column blocks of [rows][128 B] (Q: 128 rows, K: BN rows). */
template <int QT, int D = 128, int BN = 128>
static __device__ __forceinline__ void wg_issue_s(float s[BN / 2], uint32_t q_wg, uint32_t k_s) {
#pragma unroll
  for (int i = 0; i < BN / 2; i++) {
    s[i] = 0.f;
    kva_reg_fence_f32(&s[i]); /* written before the wgmma.fence, not sunk past it */
  }
  kva_wgmma_fence();
  const uint64_t dq = wg_desc(q_wg, 16, 1024), dk = wg_desc(k_s, 16, 1024);
#pragma unroll
  for (int j = 0; j < D / 16; j++) {
    const uint32_t qoff = (uint32_t)((j >> 2) * (128 * 128) + (j & 3) * 32);
    const uint32_t koff = (uint32_t)((j >> 2) * (BN * 128) + (j & 3) * 32);
    wg_mma_ss<QT, BN>(s, wg_desc_at(dq, qoff), wg_desc_at(dk, koff), j > 0);
  }
  kva_wgmma_commit();
}

/* O += P V for one key tile (issued, committed, not waited): BN / 16
 * k-steps of 16 keys, N = D (the V tile's 64-column blocks at BN * 128). */
template <int QT, int D = 128, int BN = 128>
static __device__ __forceinline__ void wg_issue_pv(float o[D / 2], uint32_t pk[BN / 8][2],
                                                   uint32_t v_s) {
  /* O (rescaled) and P are written before the wgmma.fence, not sunk past it */
#pragma unroll
  for (int i = 0; i < D / 2; i++) kva_reg_fence_f32(&o[i]);
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    kva_reg_fence_u32(&pk[j][0]);
    kva_reg_fence_u32(&pk[j][1]);
  }
  kva_wgmma_fence();
  const uint64_t dv = wg_desc(v_s, BN * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++) {
    const uint32_t pa[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
    wg_mma_rs<QT, D>(o, pa, wg_desc_at(dv, kk * 16 * 128));
  }
  kva_wgmma_commit();
}

/* P of half row hf (its accumulator elements 4 j + 2 hf + e) against the
 * max mu, packed into pk; returns this thread's share of the row sum, a
 * 4-way tree (short dependency chains to interleave). */
template <int QT, int BN>
static __device__ __forceinline__ float wg_exp_half(const float s[BN / 2], uint32_t pk[BN / 8][2],
                                                    int hf, float mul, float mu) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    const float p0 = kva_ex2(fmaf(s[4 * j + 2 * hf], mul, -mu));
    const float p1 = kva_ex2(fmaf(s[4 * j + 2 * hf + 1], mul, -mu));
    acc[j & 3] += p0 + p1;
    pk[j][hf] = ext_pack<QT>(p0, p1);
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

/* Scale or soft-cap, mask and online softmax of S (valid, fenced) into P;
 * returns whether the running max of some row of the warp moved (by more
 * than the slack of online_max.cuh; then O must be multiplied by alpha once
 * the previous P V is done). p_w: position of the warp's first row.
 *
 * SPEC: once every row of the warp has a running max, the exponentials are
 * first taken against it without the tile's row max (64 max operations and
 * 4 shuffles per thread at BN = 128, and the max -> exp dependency). That
 * stands if every p <= 2^slack, i.e. the max would not have moved: checked
 * on each thread's share of the row sums (each p is at most its thread's
 * sum; NaN and inf fail too). Otherwise the warp redoes the tile as before.
 * Either way P, l and m come out as the max-first code computes them. */
template <int QT, int BN = 128, int SPEC = 0>
static __device__ __forceinline__ int wg_softmax(float s[BN / 2], uint32_t pk[BN / 8][2], float m[2],
                                                 float l[2], float alpha[2], int k0, int need_mask,
                                                 int p_w, int kv_len, int causal, int window_left,
                                                 float qk_mul, float cap_log2, int lane) {
  /* logits in log2 units are mul * s (see ext_step) */
  float mul = qk_mul;
  if (cap_log2 != 0.f) {
    mul = 1.f;
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
      s[i] = cap_log2 * (1.f - 2.f * kva_rcp(1.f + kva_ex2(s[i] * qk_mul)));
  }
  if (need_mask) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      const int p = p_w + (lane >> 2) + hf * 8;
      const int jhi = causal ? min(kv_len, p + 1) : kv_len;
      const int jlo = window_left >= 0 ? p - window_left : INT_MIN;
#pragma unroll
      for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int key = k0 + j * 8 + 2 * (lane & 3) + e;
          if (key >= jhi || key < jlo) s[4 * j + 2 * hf + e] = -INFINITY;
        }
    }
  }
  if (SPEC && !__any_sync(0xffffffffu, m[0] == -INFINITY || m[1] == -INFINITY)) {
    float ts[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) ts[hf] = wg_exp_half<QT, BN>(s, pk, hf, mul, m[hf]);
    constexpr float P_MAX = (float)(1 << (int)KVA_MAX_SLACK_LOG2);
    if (!__any_sync(0xffffffffu, !(ts[0] <= P_MAX && ts[1] <= P_MAX))) {
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        alpha[hf] = 1.f;
        l[hf] += ts[hf]; /* as below with alpha = ex2(0) = 1 */
      }
      return 0;
    }
  }
  /* Row max and sum as 4-way trees per half row (both halves independent):
   * short dependency chains for the scheduler to interleave. */
  float mx2[2];
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    float a[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
      a[j & 3] = fmaxf(a[j & 3], fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]));
    mx2[hf] = fmaxf(fmaxf(a[0], a[1]), fmaxf(a[2], a[3]));
  }
#pragma unroll
  for (int hf = 0; hf < 2; hf++) mx2[hf] = fmaxf(mx2[hf], __shfl_xor_sync(0xffffffffu, mx2[hf], 1));
#pragma unroll
  for (int hf = 0; hf < 2; hf++) mx2[hf] = fmaxf(mx2[hf], __shfl_xor_sync(0xffffffffu, mx2[hf], 2));
  int rescale = 0;
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const float mx = kva_online_max(m[hf], mx2[hf] * mul);
    const float m_use = mx == -INFINITY ? 0.f : mx;
    alpha[hf] = kva_ex2(m[hf] - m_use);
    rescale |= mx != m[hf];
    m[hf] = mx;
    l[hf] = l[hf] * alpha[hf] + wg_exp_half<QT, BN>(s, pk, hf, mul, m_use);
  }
  return __any_sync(0xffffffffu, rescale);
}

template <int D = 128>
static __device__ __forceinline__ void wg_rescale(float o[D / 2], const float alpha[2]) {
#pragma unroll
  for (int j = 0; j < D / 8; j++) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

/* A value every lane of the warp holds (loaded from smem, derived from the
 * warp index), broadcast from lane 0 so that ptxas sees it warp-uniform:
 * otherwise branches on it count as divergent and it serializes the wgmmas
 * around them (CUTLASS's canonical_warp_idx_sync does the same). */
static __device__ __forceinline__ int wg_uni(int v) { return __shfl_sync(0xffffffffu, v, 0); }

template <int N = 64>
static __device__ __forceinline__ void wg_fence_acc(float d[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) kva_reg_fence_f32(&d[i]);
}

template <int BN = 128>
static __device__ __forceinline__ void wg_fence_softmax(uint32_t pn[BN / 8][2], float m[2],
                                                        float l[2], float alpha[2], int *rescale) {
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    kva_reg_fence_u32(&pn[j][0]);
    kva_reg_fence_u32(&pn[j][1]);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    kva_reg_fence_f32(&m[i]);
    kva_reg_fence_f32(&l[i]);
    kva_reg_fence_f32(&alpha[i]);
  }
  uint32_t r = (uint32_t)*rescale;
  kva_reg_fence_u32(&r);
  *rescale = (int)r;
}

/* After the softmax of tile n, issued while P_{n-1} V_{n-1} runs: pins the
 * softmax before the wait (otherwise the compiler sinks it to its uses after
 * the wait and nothing overlaps P V), waits for P V after a branch on the
 * softmax's last result (never taken: a row sum is not negative; the branch
 * keeps ptxas from hoisting the wait above the softmax), rescales O if a
 * row max moved, and fences the P registers the finished P V read. The
 * wait is one instruction for every warp: wgmma.wait_group is .aligned
 * over the warpgroup, and the rescale vote is per warp. */
template <int D = 128, int BN = 128>
static __device__ __forceinline__ void wg_finish_pv(float o[D / 2], uint32_t pk[BN / 8][2],
                                                    uint32_t pn[BN / 8][2], float m[2], float l[2],
                                                    float alpha[2], int rescale) {
  wg_fence_softmax<BN>(pn, m, l, alpha, &rescale);
  kva_sched_fence_on(l[1] < 0.f);
  kva_wgmma_wait<0>();
  wg_fence_acc<D / 2>(o);
  if (rescale) wg_rescale<D>(o, alpha);
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    kva_reg_fence_u32(&pk[j][0]);
    kva_reg_fence_u32(&pk[j][1]);
  }
}

/* End of a key tile: O rescaled if the softmax moved a row max (and P V
 * did not already do it), and this tile's P becomes the pending one. */
template <int D = 128, int BN = 128>
static __device__ __forceinline__ void wg_keep_p(float o[D / 2], const float alpha[2], int rescale,
                                                 uint32_t pk[BN / 8][2], uint32_t pn[BN / 8][2]) {
  if (rescale) wg_rescale<D>(o, alpha);
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    pk[j][0] = pn[j][0];
    pk[j][1] = pn[j][1];
  }
}

template <int QT>
__global__ void __launch_bounds__(KVA_WG_THREADS, 1)
    kva_ext_wg_kernel(const __grid_constant__ kva_ext_args a) {
  constexpr int D = 128, BM = KVA_WG_BM, BN = KVA_WG_BN, STG = 2 * KVA_WG_TILE;
  constexpr int NS = KVA_WG_STAGES;
  static_assert(KVA_WG_BM == KVA_EXT_BM(128), "the tile schedule is shared with mma.sync");
  static_assert(BM * KVA_WG_ORS <= STG, "O staging fits one stage");
  extern __shared__ __align__(1024) unsigned char smem_wg[];
  const uint32_t s_raw = kva_smem_u32(smem_wg);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_base = smem_wg + (s_q - s_raw);
  const uint32_t s_ring = s_q + KVA_WG_TILE;
  volatile ext_item *const its = (volatile ext_item *)(p_base + KVA_WG_TILE + NS * STG);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  /* warpgroup (made visibly warp-uniform, see wg_uni); first tile row of the warp */
  const int wg = wg_uni(warp >> 2), row_w = 16 * warp;
  const int my_row = lane < 16 ? 2 * warp + (lane & 1) + 16 * (lane >> 1) : 0;

  int pre = -1;
  {
    const ext_item x = ext_item_of<D, 0, BM, BN>(&a, 0);
    if (tid == 0) ext_item_store(&its[0], x);
    if (x.valid) wg_issue_q(&a, s_q, x.q_row0, x.n_valid, x.h, tid);
    kva_cp_async_commit();
  }
  for (int round = 0;; round++) {
    volatile ext_item *const it = &its[round & 1], *const nx = &its[(round & 1) ^ 1];
    __syncthreads(); /* *it written; the previous round is done with smem */
    if (!it->valid) break;
    const int ntiles = wg_uni(it->ntiles);
    if (!it->pref && ntiles > 0) {
      pre = ext_slot(it->pt, it->kb + my_row, it->kv_len, a.page_size, a.ps_mul, a.ps_shift);
      const uint32_t st = s_ring + it->base * STG;
      wg_issue_kv(st, st + KVA_WG_TILE, pre, it->kg, it->vg, a.hkv * D, tid);
      pre = ntiles > 1 ? ext_slot(it->pt, it->kb + BN + my_row, it->kv_len, a.page_size, a.ps_mul,
                                  a.ps_shift)
                       : -1;
      kva_cp_async_commit();
    }

    float o[64], m[2], l[2];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
    uint32_t pk[16][2];  /* P of the tile whose P V is still to be issued */
    int have_p = 0;      /* ... whether there is one */
    uint32_t v_pend = 0; /* ... and its V */

    for (int n = 0; n < ntiles; n++) {
      kva_cp_async_wait<0>();
      kva_fence_proxy_async_smem(); /* cp.async data -> wgmma (async proxy) */
      __syncthreads();              /* tile n landed; every P V older than tile n-1 is complete */
      const int kb = wg_uni(it->kb), kv_len = wg_uni(it->kv_len), base = wg_uni(it->base);
      {
        /* tile n+1 goes to the stage of tile n-2, whose P V completed */
        const uint32_t st = s_ring + ((base + n + 1) % NS) * STG;
        if (n + 1 < ntiles) {
          wg_issue_kv(st, st + KVA_WG_TILE, pre, it->kg, it->vg, a.hkv * D, tid);
          pre = n + 2 < ntiles ? ext_slot(it->pt, kb + (n + 2) * BN + my_row, kv_len, a.page_size,
                                          a.ps_mul, a.ps_shift)
                               : -1;
        } else {
          ext_item x = ext_item_of<D, 0, BM, BN>(&a, round + 1);
          x.base = (base + n + 1) % NS;
          if (x.ntiles > 0) {
            x.pref = 1;
            pre = ext_slot(x.pt, x.kb + my_row, x.kv_len, a.page_size, a.ps_mul, a.ps_shift);
            wg_issue_kv(st, st + KVA_WG_TILE, pre, x.kg, x.vg, a.hkv * D, tid);
            pre = x.ntiles > 1 ? ext_slot(x.pt, x.kb + BN + my_row, x.kv_len, a.page_size, a.ps_mul,
                                          a.ps_shift)
                               : -1;
          }
          if (tid == 0) ext_item_store(nx, x);
        }
        kva_cp_async_commit();
      }
      const uint32_t k_s = s_ring + ((base + n) % NS) * STG;
      const int k0 = kb + n * BN;
      /* Both warpgroups compute every tile of the item, a tile none of a
       * warpgroup's rows can see fully masked (at most one per item and
       * warpgroup, past the diagonal or before the window): any branch
       * around the wgmma sequence, even one without a wgmma in it, makes
       * ptxas serialize all of them (C7513). */
      const int p_lo = wg_uni(it->p_first) + 64 * wg, p_hi = min(p_lo + 63, wg_uni(it->p_last));
      const int need_mask = (k0 + BN > kv_len) || (a.causal && k0 + BN - 1 > p_lo) ||
                            (a.window_left >= 0 && k0 < p_hi - a.window_left);
      /* Straight-line wgmma sequences on each path: ptxas tracks the groups
       * in flight per path and would otherwise serialize every wgmma. */
      float s[64];
      uint32_t pn[16][2];
      float alpha[2];
      int rescale;
      const int p_w = wg_uni(it->p_first) + row_w;
      if (have_p) {
        wg_issue_s<QT>(s, s_q + 64 * wg * 128, k_s);
        wg_issue_pv<QT>(o, pk, v_pend);
        kva_wgmma_wait<1>(); /* S is the older group: P V may still run */
        wg_fence_acc(s);
        rescale = wg_softmax<QT>(s, pn, m, l, alpha, k0, need_mask, p_w, kv_len, a.causal,
                                 a.window_left, a.qk_mul, a.cap_log2, lane);
        wg_finish_pv(o, pk, pn, m, l, alpha, rescale);
        rescale = 0;
      } else {
        wg_issue_s<QT>(s, s_q + 64 * wg * 128, k_s);
        kva_wgmma_wait<0>();
        wg_fence_acc(s);
        rescale = wg_softmax<QT>(s, pn, m, l, alpha, k0, need_mask, p_w, kv_len, a.causal,
                                 a.window_left, a.qk_mul, a.cap_log2, lane);
      }
      wg_keep_p(o, alpha, rescale, pk, pn);
      have_p = 1;
      v_pend = k_s + KVA_WG_TILE;
    }
    if (have_p) { /* the last P V */
      wg_issue_pv<QT>(o, pk, v_pend);
      kva_wgmma_wait<0>();
      wg_fence_acc(o);
    }

    if (ntiles == 0) {
      kva_cp_async_wait<0>();
      __syncthreads();
      if (tid == 0) ext_item_store(nx, ext_item_of<D, 0, BM, BN>(&a, round + 1));
    }
    __syncthreads(); /* all warps are done with Q and the last stage; *nx written */
    /* O staging: the last tile's stage (the next tile 0 went to the one
     * after it; with no tile, stage 1 while the next tile 0 goes to 0) */
    const uint32_t s_o = s_ring + (ntiles > 0 ? ((it->base + ntiles - 1) % NS) : 1) * STG;
    if (nx->valid) wg_issue_q(&a, s_q, nx->q_row0, nx->n_valid, nx->h, tid);
    kva_cp_async_commit();
    unsigned char *const p_o = p_base + (s_o - s_q);
    const int q_row0 = it->q_row0, n_valid = it->n_valid, qh = it->h, hq = a.hq;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      float sum = l[hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? a.o_mul / sum : 0.f;
      const int row = row_w + (lane >> 2) + hf * 8;
      if (a.lse != NULL && (lane & 3) == 0 && row < n_valid)
        a.lse[(int64_t)(q_row0 + row) * hq + qh] =
            sum > 0.f ? (m[hf] + __log2f(sum)) * 0.69314718055994531f : -INFINITY;
#pragma unroll
      for (int j = 0; j < 16; j++)
        *(uint32_t *)(p_o + row * KVA_WG_ORS + j * 16 + (lane & 3) * 4) =
            ext_pack<QT>(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
    }
    __syncwarp();
    unsigned char *og = (unsigned char *)a.o;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const int idx = lane + i * 32, row = row_w + (idx >> 4), c = idx & 15;
      if (row < n_valid) {
        const uint4 v = *(const uint4 *)(p_o + row * KVA_WG_ORS + c * 16);
        *(uint4 *)(og + (((int64_t)(q_row0 + row) * hq + qh) * D) * 2 + c * 16) = v;
      }
    }
  }
  kva_cp_async_wait<0>();
}

#endif /* KVA_CUDA_EXTEND_WGMMA_CUH */
