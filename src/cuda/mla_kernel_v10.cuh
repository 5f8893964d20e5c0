/* MLA decode v10: fp8 latents for batches of at most NQ = 16 or 32 query
 * rows (q heads x new tokens), with the keys as the wgmma M.
 *
 * Why: v2 and v9 put a row tile of 64 query rows on M, so 16 rows pay for
 * 64 and an fp8 step at 16-32 rows cost as much tensor work as one at 64.
 * H100 (2026-11-27): v2's fp8 ran 1.17 TB/s at 16, 32 and 64 rows alike
 * (0.515 ms, FlashMLA's h16 s_q1 sk8192 row), 1.65 TB/s with its wgmmas
 * compiled out. Here S^T = K Q^T (M = the block's 64 keys, N = NQ rows,
 * K = 576) and O^T += V^T P^T (M = 64 of V's dims, N = NQ rows, K = the
 * 64 keys, V^T read transposed from the same 16-bit stage), so the tensor
 * work follows the rows: at N = 16 a block's S^T and O^T took ~1360
 * cycles on the probe (bench/wgmma_rate.cu), under the ~2900 a 36 KB
 * block takes to stream at the copy rate.
 *
 * Roles (384 threads, v9's). Warpgroup 0 loads Q (f16, times 2^-8 for a
 * bf16 Q, as v2; its smem rows permuted into the k order of the A
 * fragments below) and, per block, converts K's bytes straight into the
 * A fragments of S^T (e4m3 -> f16 in registers, a column block at a time,
 * rs wgmma), runs the online softmax down S^T's columns (a row's max over
 * the block through smem between its four warps), writes P^T (f16, [NQ
 * rows][64 keys], a K-major B operand) and the rows' factors into one of
 * two buffers and arrives on its `pfull`; it never touches the 16-bit
 * stage, so it runs a block ahead of the O warpgroups. The two O
 * warpgroups own O^T's dims 256 h .. 256 h + 255 and V's column blocks
 * 4 h .. 4 h + 3 of the one 16-bit stage: per block they wait for P^T,
 * rescale O^T and issue its four 64-dim tiles as four commit groups;
 * under them they convert the next block's V, each column block once the
 * tile that read it is over in every warp of the warpgroup, fence, and
 * refill the byte stage three blocks ahead (one bulk copy per page run).
 * A byte stage is refilled once warpgroup 0 and both O warpgroups read it.
 *
 * H100 (FlashMLA's fp8 h16 s_q1 sk8192 row, v2 0.515 ms): 0.41 ms with
 * one 16-bit stage of K and V converted by the O warpgroups after O^T,
 * 0.337 with it converted under O^T column block by column block, 0.261
 * (0.77 of copy) with K converted in registers (the conversion was the
 * chain's largest part: 0.218 ms with it compiled out).
 *
 * At a chunk's end warpgroup 0 leaves each row's m and l in smem; the O
 * warpgroups put O^T over the 16-bit stage as O's rows (f32), read them
 * back in v2's accumulator layout and run mla_finish_chunk (O, partial
 * rows, the merges), with the byte stages as the merge's scratch. Row
 * tiles are NQ rows (grid.y from the plan's capacity), so any batch is
 * covered; the kernel is picked for batches of <= NQ rows. */
#ifndef KVA_CUDA_MLA_KERNEL_V10_CUH
#define KVA_CUDA_MLA_KERNEL_V10_CUH

#include "cuda/mla9_fp8.cuh"

#define KVA_MLA10_BAR_S 1 /* warpgroup 0 */
#define KVA_MLA10_BAR_O 2 /* the O warpgroups */
#define KVA_MLA10_BAR_H 3 /* O warpgroup h: 3 + h */

/* A named barrier of warpgroup 0 or of the O warpgroups, in whole warps. */
static __device__ __forceinline__ void mla10_sync(int id, int count) {
  __syncwarp();
  kva_bar_sync(id, count);
}

template <int NQ>
static __device__ __forceinline__ void mla10_mma_o(float *d, uint64_t da, uint64_t db) {
  if (NQ == 16)
    kva_wgmma_m64n16k16_ss_f16_ta(d, da, db);
  else
    kva_wgmma_m64n32k16_ss_f16_ta(d, da, db);
}

/* The fill of the block at kt (global block index u) into byte stage
 * u % 3, once its last contents were converted (a fresh barrier passes
 * parity 1: a stage's first fill waits for nothing). ct: the O thread. */
static __device__ __forceinline__ void mla10_fill(uint32_t s_b8, uint32_t s_bar, uint32_t u,
                                                  const unsigned char *kvg, const int32_t *pt,
                                                  int kt, int k1, const kva_mla_args &a, int ct) {
  const uint32_t sb = u % 3, use = u / 3;
  if (ct < KVA_MLA5_BN) kva_mbar_wait(s_bar + 8 * (3 + sb), (use & 1u) ^ 1u);
  mla9_issue_f8(s_b8 + sb * KVA_MLA9_TILE8, s_bar + 8 * sb, kvg, pt, kt, k1, a, ct);
}

/* V's column block cb (dims 64 cb .. 64 cb + 63) of the byte stage p_st8
 * into the 16-bit stage p_st (e4m3 -> f16, exact): rows tw / 4 and tw /
 * 4 + 32, 16 bytes (unit tw % 4) of each: a quarter warp's loads and
 * stores hit eight distinct 16-byte bank groups. Rows at or past `rows`
 * zeroed (masked P V stays finite). No fence. */
static __device__ __forceinline__ void mla10_convert_col(unsigned char *p_st,
                                                         const unsigned char *p_st8, int cb,
                                                         int rows, int tw) {
  const int u4 = tw & 3;
#pragma unroll
  for (int p = 0; p < 2; p++) {
    const int row = (tw >> 2) + 32 * p;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (row < rows) x = *(const uint4 *)(p_st8 + row * KVA_MLA_D + 64 * cb + 16 * u4);
    unsigned char *const d = p_st + cb * KVA_MLA5_KBLK + row * 128;
    const int sw = row & 7;
    *(uint4 *)(d + (((2 * u4) ^ sw) << 4)) = mla_e4m3x8<KVA_F16>(x.x, x.y);
    *(uint4 *)(d + (((2 * u4 + 1) ^ sw) << 4)) = mla_e4m3x8<KVA_F16>(x.z, x.w);
  }
}

/* S^T's A operand straight from the bytes: warp wq's keys 16 wq + g and
 * + 8, 16 dims 64 cb + 16 tq .. of each (one 16-byte load a key), as the
 * A fragments of the column block's four k-steps. K-step s takes dims
 * 16 t + 4 s .. 16 t + 4 s + 3 of every t (so one word of each load is one
 * k-step's pair of registers); Q's smem rows are stored in that order
 * (mla10_q_permute). */
static __device__ __forceinline__ void mla10_k_frags(uint32_t f[4][4], const unsigned char *p_st8,
                                                     int cb, int wq, int g, int tq) {
  const unsigned char *src = p_st8 + (16 * wq + g) * KVA_MLA_D + 64 * cb + 16 * tq;
  const uint4 x = *(const uint4 *)src, y = *(const uint4 *)(src + 8 * KVA_MLA_D);
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int st = 0; st < 4; st++) {
    f[st][0] = mla_e4m3x2<KVA_F16>(xs[st]);       /* key g, k 2 tq .. (dims 4 st + 0, 1) */
    f[st][1] = mla_e4m3x2<KVA_F16>(ys[st]);       /* key g + 8 */
    f[st][2] = mla_e4m3x2<KVA_F16>(xs[st] >> 16); /* key g, k 2 tq + 8 .. (dims 4 st + 2, 3) */
    f[st][3] = mla_e4m3x2<KVA_F16>(ys[st] >> 16);
  }
}

/* Q's row `row`, column block cb, in place: its 32 words (dim pairs) into
 * mla10_k_frags's k order (logical word 8 s + i <- dim pair 8 (i % 4) +
 * 2 s + i / 4), and bf16 -> f16 times 2^-8 when Q is bf16 (as v2). */
template <int QT, int NQ>
static __device__ __forceinline__ void mla10_q_permute(unsigned char *p_q, int row, int cb) {
  unsigned char *const base = p_q + cb * (NQ * 128) + row * 128;
  const int sw = row & 7;
  uint32_t w[32];
#pragma unroll
  for (int q = 0; q < 8; q++) {
    const uint4 v = *(const uint4 *)(base + ((q ^ sw) << 4));
    w[4 * q] = v.x;
    w[4 * q + 1] = v.y;
    w[4 * q + 2] = v.z;
    w[4 * q + 3] = v.w;
  }
  if (QT != KVA_F16)
#pragma unroll
    for (int i = 0; i < 32; i++) w[i] = mla_q_f16x2(w[i]);
#pragma unroll
  for (int q = 0; q < 8; q++) {
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int lw = 4 * q + k, st = lw >> 3, i = lw & 7;
      o[k] = w[8 * (i & 3) + 2 * st + (i >> 2)];
    }
    *(uint4 *)(base + ((q ^ sw) << 4)) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

template <int NQ>
static __device__ __forceinline__ void mla10_mma_s_rs(float *d, const uint32_t a[4], uint64_t db,
                                                      int acc) {
  if (NQ == 16)
    kva_wgmma_m64n16k16_rs_f16(d, a, db, acc);
  else
    kva_wgmma_m64n32k16_rs_f16(d, a, db, acc);
}

template <int QT, int NQ>
__global__ void __launch_bounds__(KVA_MLA10_THREADS, 1)
    kva_mla_kernel_v10(const __grid_constant__ kva_mla_args a) {
  constexpr int NJ = NQ / 8; /* 8-row groups of N */
  constexpr int TILE = KVA_MLA5_TILE, TILE8 = KVA_MLA9_TILE8, BN = KVA_MLA5_BN;
  constexpr int KB = KVA_MLA5_KBLK, QB = NQ * 128; /* a column block of the stage, of Q */
  constexpr int PB = KVA_MLA10_P(NQ);
  constexpr int OROW = KVA_MLA_DV + 4; /* O's rows over the stage at a chunk's end */
  constexpr int CT = KVA_F16;          /* the tensor cores' type (fp8 latents) */
  static_assert(NQ == 16 || NQ == 32, "N of the keys-as-M wgmmas");
  static_assert(KVA_MLA10_SMEM(NQ) <= 232448, "227 KB of smem per CTA");
  static_assert(NQ * OROW * 4 <= TILE, "O's rows fit the stage");
  static_assert(12 * NQ * 4 + 12 * 8 + 8 <= KVA_MLA10_MISC, "misc smem");
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u;
  unsigned char *const p_q = smem + (s_q - s_raw);
  const uint32_t s_st = s_q + KVA_MLA10_Q(NQ), s_p = s_st + TILE, s_b8 = s_p + 2 * PB;
  unsigned char *const p_st = p_q + KVA_MLA10_Q(NQ);
  unsigned char *const p_p = p_st + TILE, *const p_b8 = p_p + 2 * PB;
  float *const red = (float *)(p_b8 + 3 * TILE8); /* [2][4 warps][NQ] */
  float *const cst = red + 8 * NQ;                /* [2][NQ]: a block's factors */
  float *const sm = cst + 2 * NQ, *const sl = sm + NQ;
  /* mbarriers: byte stage full 0-2 (the O threads' fills), empty 3-5
   * (read by warpgroup 0's S^T and the O threads' conversion); pfull 6-7,
   * pempty 8-9; stats full 10, empty 11 */
  const uint32_t s_bar = s_b8 + 3 * TILE8 + 12 * NQ * 4;
  const uint32_t sfull = s_bar + 8 * 10, sempty = s_bar + 8 * 11;
  volatile int *const flag = (volatile int *)(p_b8 + 3 * TILE8 + 12 * NQ * 4 + 12 * 8);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = mla_uni(warp >> 2), wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const int tw = tid & 127;
  const kva_plan_header *hdr = a.hdr;
  kva_griddep_launch_dependents();
  const int row0 = (int)blockIdx.y * NQ;
  if ((int)blockIdx.x >= hdr->num_workers || row0 >= hdr->max_q_len * a.hq) return;
  const kva_split_work wk = a.sched[blockIdx.x];
  if (a.prefetch_keys > 0 && blockIdx.y == 0 && tid == 0)
    mla_prefetch_first<1>(a, wk, a.prefetch_keys);
  if (tid == 0) {
#pragma unroll 1
    for (int i = 0; i < 12; i++)
      kva_mbar_init(s_bar + 8 * i, i >= 3 && i < 6       ? KVA_MLA10_THREADS
                                   : i == 6 || i == 7 || i == 10 ? KVA_MLA_THREADS / 2
                                                                 : KVA_MLA_THREADS);
  }
  __syncthreads(); /* the inits are seen by every thread */
  /* Q, the latents and the outputs belong to the kernels before (PDL) */
  kva_griddep_wait();
  const unsigned char *const kvg = (const unsigned char *)a.kv;
  const float qk_mul = CT != QT ? a.qk_mul * (float)(1 << KVA_MLA_FP8_Q_SHIFT) : a.qk_mul;

  uint32_t nb = 0, nc = 0; /* blocks and chunks so far: the barriers' phases */
  for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
    const int r = a.sched_order[wi];
    const int nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
    if (nsplit == 0) continue; /* not a decode request */
    const int nt = a.num_new[r], rows_all = nt * a.hq;
    if (row0 >= rows_all) continue;
    /* this tile's rows end (mla_finish_chunk's bound) */
    const int rows = rows_all < row0 + NQ ? rows_all : row0 + NQ;
    const int kv_len = a.cache_seqlens[r], cached = kv_len - nt;
    const kva_split_chunk ch = kva_split_chunk_at(wk, wi, kv_len);
    const int k0 = ch.k0, k1 = ch.k1;
    const int nblk = k1 > k0 ? (k1 - k0 + BN - 1) / BN : 0;
    const int tok0 = a.cu_q[r];
    const int32_t *const pt = a.page_table + (size_t)r * hdr->page_table_stride;

    if (wg == 0) {
      /* ---- warpgroup 0: Q, S^T, the softmax, P^T ---- */
      if (nblk > 0) {
        const unsigned char *qg = (const unsigned char *)a.q;
        for (int i = tw; i < NQ * (KVA_MLA_D / 8); i += 128) {
          const int row = i / (KVA_MLA_D / 8), c = i - row * (KVA_MLA_D / 8);
          const int grow = row0 + row, ok = grow < rows;
          const int t = grow / a.hq, h = grow - t * a.hq;
          const unsigned char *src =
              ok ? qg + ((int64_t)(tok0 + t) * a.hq + h) * (KVA_MLA_D * 2) + c * 16 : qg;
          kva_cp_async_16(s_q + mla_sw<NQ>(row, c), src, ok ? 16 : 0);
        }
        kva_cp_async_commit();
        kva_cp_async_wait<0>();
        mla10_sync(KVA_MLA10_BAR_S, 128); /* every thread's copies landed */
        for (int i = tw; i < NQ * (KVA_MLA_D / 64); i += 128)
          mla10_q_permute<QT, NQ>(p_q, i % NQ, i / NQ);
        kva_fence_proxy_async_smem(); /* Q -> wgmma */
      }
      mla10_sync(KVA_MLA10_BAR_S, 128); /* Q seen by every warp */
      /* this thread's S^T columns: rows 8 jj + 2 tq + e */
      int pos[NJ][2];
      float mr[NJ][2], lr[NJ][2];
#pragma unroll
      for (int jj = 0; jj < NJ; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          pos[jj][e] = cached + (row0 + 8 * jj + 2 * tq + e) / a.hq;
          mr[jj][e] = -INFINITY;
          lr[jj][e] = 0.0f;
        }
      const uint64_t dq = mla_desc(s_q, 16, 1024);
      for (int j = 0; j < nblk; j++) {
        const uint32_t u = nb + (uint32_t)j, pb = u & 1u;
        const int kt = k0 + j * BN;
        float sacc[4 * NJ];
#pragma unroll
        for (int i = 0; i < 4 * NJ; i++) {
          sacc[i] = 0.0f;
          kva_reg_fence_f32(&sacc[i]);
        }
        /* S^T: K's bytes converted into A fragments a column block at a
         * time (two sets: a set is rewritten once the wgmmas that read it
         * are over) */
        const uint32_t sb = u % 3;
        kva_mbar_wait(s_bar + 8 * sb, (u / 3) & 1u); /* the block's bytes */
        const unsigned char *const st8 = p_b8 + sb * TILE8;
        uint32_t kf[2][4][4];
#pragma unroll
        for (int cb = 0; cb < 9; cb++) {
          if (cb >= 2) kva_wgmma_wait<1>();
          mla10_k_frags(kf[cb & 1], st8, cb, wq, g, tq);
#pragma unroll
          for (int st = 0; st < 4; st++)
#pragma unroll
            for (int i = 0; i < 4; i++) kva_reg_fence_u32(&kf[cb & 1][st][i]);
          kva_wgmma_fence();
#pragma unroll
          for (int st = 0; st < 4; st++)
            mla10_mma_s_rs<NQ>(sacc, kf[cb & 1][st], dq + ((uint32_t)(cb * QB + st * 32) >> 4),
                               cb > 0 || st > 0);
          kva_wgmma_commit();
        }
        kva_mbar_arrive(s_bar + 8 * (3 + sb)); /* this thread's reads of the bytes are over */
        kva_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&sacc[i]);
        /* logits (base 2), masked on a chunk's boundary blocks; sacc[4 jj +
         * 2 hf + e]: key 16 wq + g + 8 hf, row 8 jj + 2 tq + e */
        const bool need_mask = kt + BN > k1 || (a.causal && kt + BN - 1 > cached);
        float mx[NJ][2];
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            mx[jj][e] = -INFINITY;
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
              float x = sacc[4 * jj + 2 * hf + e] * qk_mul;
              if (need_mask) {
                const int key = kt + 16 * wq + g + 8 * hf;
                if (key >= k1 || (a.causal && key > pos[jj][e])) x = -INFINITY;
              }
              sacc[4 * jj + 2 * hf + e] = x;
              mx[jj][e] = fmaxf(mx[jj][e], x);
            }
            mx[jj][e] = fmaxf(mx[jj][e], __shfl_xor_sync(0xffffffffu, mx[jj][e], 4));
            mx[jj][e] = fmaxf(mx[jj][e], __shfl_xor_sync(0xffffffffu, mx[jj][e], 8));
            mx[jj][e] = fmaxf(mx[jj][e], __shfl_xor_sync(0xffffffffu, mx[jj][e], 16));
          }
        /* the block's max of each row over the four warps' keys (two
         * buffers: a barrier a block keeps them apart) */
        float *const rd = red + (u & 1u) * 4 * NQ;
        if (g == 0)
#pragma unroll
          for (int jj = 0; jj < NJ; jj++)
#pragma unroll
            for (int e = 0; e < 2; e++) rd[wq * NQ + 8 * jj + 2 * tq + e] = mx[jj][e];
        mla10_sync(KVA_MLA10_BAR_S, 128);
        /* P^T's buffer: the O warpgroups' O^T of block u - 2 is over */
        kva_mbar_wait(s_bar + 8 * (8 + pb), ((u >> 1) & 1u) ^ 1u);
        unsigned char *const pp = p_p + pb * PB;
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int n = 8 * jj + 2 * tq + e;
            const float bm = fmaxf(fmaxf(rd[n], rd[NQ + n]), fmaxf(rd[2 * NQ + n], rd[3 * NQ + n]));
            const float mn = kva_online_max(mr[jj][e], bm);
            const float mu = mn == -INFINITY ? 0.0f : mn; /* all masked so far: p = 0 */
            const float c = kva_ex2(mr[jj][e] - mu);
            mr[jj][e] = mn;
            const float p0 = kva_ex2(sacc[4 * jj + e] - mu), p1 = kva_ex2(sacc[4 * jj + 2 + e] - mu);
            lr[jj][e] = lr[jj][e] * c + p0 + p1;
            const uint32_t pk = kva_pack_f16x2(p0, p1);
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
              const int key = 16 * wq + g + 8 * hf;
              *(uint16_t *)(pp + n * 128 + (((key >> 3) ^ (n & 7)) << 4) + (key & 7) * 2) =
                  (uint16_t)(hf ? pk >> 16 : pk & 0xffffu);
            }
            if (wq == 0 && g == 0) cst[pb * NQ + n] = c;
          }
        kva_fence_proxy_async_smem(); /* P^T -> the O warpgroups' wgmma */
        kva_mbar_arrive(s_bar + 8 * (6 + pb));
      }
      /* the chunk's end: each row's m and l (l over the lanes and warps) */
#pragma unroll
      for (int jj = 0; jj < NJ; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          lr[jj][e] += __shfl_xor_sync(0xffffffffu, lr[jj][e], 4);
          lr[jj][e] += __shfl_xor_sync(0xffffffffu, lr[jj][e], 8);
          lr[jj][e] += __shfl_xor_sync(0xffffffffu, lr[jj][e], 16);
        }
      kva_mbar_wait(sempty, (nc & 1u) ^ 1u); /* the last chunk's m, l taken */
      float *const rl = red + ((nb + (uint32_t)nblk) & 1u) * 4 * NQ;
      if (g == 0)
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int n = 8 * jj + 2 * tq + e;
            rl[wq * NQ + n] = lr[jj][e];
            if (wq == 0) sm[n] = mr[jj][e];
          }
      mla10_sync(KVA_MLA10_BAR_S, 128);
      if (tw < NQ) sl[tw] = rl[tw] + rl[NQ + tw] + rl[2 * NQ + tw] + rl[3 * NQ + tw];
      mla10_sync(KVA_MLA10_BAR_S, 128); /* rl read before the next block writes it */
      kva_mbar_arrive(sfull);
    } else {
      /* ---- the O warpgroups: bytes, conversion, O^T ---- */
      const int h = wg - 1, ct = tid - 128;
      float ot[4][4 * NJ];
#pragma unroll
      for (int c = 0; c < 4; c++)
#pragma unroll
        for (int i = 0; i < 4 * NJ; i++) ot[c][i] = 0.0f;
#pragma unroll 1
      for (int b = 0; b < 3 && b < nblk; b++)
        mla10_fill(s_b8, s_bar, nb + (uint32_t)b, kvg, pt, k0 + b * BN, k1, a, ct);
      /* the chunk's first block's V */
      if (nblk > 0) {
        const uint32_t sb = nb % 3;
        kva_mbar_wait(s_bar + 8 * sb, (nb / 3) & 1u);
        const unsigned char *const st8 = p_b8 + sb * TILE8;
#pragma unroll
        for (int c = 0; c < 4; c++) mla10_convert_col(p_st, st8, 4 * h + c, k1 - k0, tw);
        kva_mbar_arrive(s_bar + 8 * (3 + sb)); /* this thread's reads of the bytes are over */
        kva_fence_proxy_async_smem();          /* generic stores -> this warpgroup's wgmma */
        mla10_sync(KVA_MLA10_BAR_H + h, 128);
        if (3 < nblk) mla10_fill(s_b8, s_bar, nb + 3, kvg, pt, k0 + 3 * BN, k1, a, ct);
      }
      const uint64_t dv = mla_desc(s_st + 4 * h * KB, KB, 1024), dp = mla_desc(s_p, 16, 1024);
      for (int j = 0; j < nblk; j++) {
        const uint32_t u = nb + (uint32_t)j, pb = u & 1u, sn = (u + 1) % 3;
        const bool nxt = j + 1 < nblk;
        const int kn = k0 + (j + 1) * BN; /* the next block */
        kva_mbar_wait(s_bar + 8 * (6 + pb), (u >> 1) & 1u); /* P^T and the factors */
        float cf[NJ][2];
        bool moved = false;
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            cf[jj][e] = cst[pb * NQ + 8 * jj + 2 * tq + e];
            moved |= cf[jj][e] != 1.0f;
          }
        if (__any_sync(0xffffffffu, moved))
#pragma unroll
          for (int c = 0; c < 4; c++)
#pragma unroll
            for (int jj = 0; jj < NJ; jj++)
#pragma unroll
              for (int i = 0; i < 4; i++) ot[c][4 * jj + i] *= cf[jj][i & 1];
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
          for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&ot[c][i]);
        kva_wgmma_fence();
        /* O^T's four 64-dim tiles, a commit group each */
#pragma unroll
        for (int c = 0; c < 4; c++) {
#pragma unroll
          for (int t = 0; t < 4; t++)
            mla10_mma_o<NQ>(ot[c], dv + ((uint32_t)(c * KB + t * 2048) >> 4),
                            dp + ((uint32_t)(pb * PB + t * 32) >> 4));
          kva_wgmma_commit();
        }
        /* the next block's V under them: column block 4 h + c once tile c is
         * over in every warp (a warp's wait covers its own rows of V^T) */
        const unsigned char *const st8 = p_b8 + sn * TILE8;
        if (nxt) kva_mbar_wait(s_bar + 8 * sn, ((u + 1) / 3) & 1u); /* its bytes */
        kva_wgmma_wait<3>();
        mla10_sync(KVA_MLA10_BAR_H + h, 128);
        if (nxt) mla10_convert_col(p_st, st8, 4 * h, k1 - kn, tw);
        kva_wgmma_wait<2>();
        mla10_sync(KVA_MLA10_BAR_H + h, 128);
        if (nxt) mla10_convert_col(p_st, st8, 4 * h + 1, k1 - kn, tw);
        kva_wgmma_wait<1>();
        mla10_sync(KVA_MLA10_BAR_H + h, 128);
        if (nxt) mla10_convert_col(p_st, st8, 4 * h + 2, k1 - kn, tw);
        kva_wgmma_wait<0>();
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
          for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&ot[c][i]);
        mla10_sync(KVA_MLA10_BAR_H + h, 128);
        kva_mbar_arrive(s_bar + 8 * (8 + pb)); /* P^T read */
        if (nxt) {
          mla10_convert_col(p_st, st8, 4 * h + 3, k1 - kn, tw);
          kva_mbar_arrive(s_bar + 8 * (3 + sn)); /* this thread's reads of the bytes are over */
          kva_fence_proxy_async_smem();          /* generic stores -> this warpgroup's wgmma */
          mla10_sync(KVA_MLA10_BAR_H + h, 128);
          if (j + 4 < nblk) mla10_fill(s_b8, s_bar, u + 4, kvg, pt, kn + 3 * BN, k1, a, ct);
        }
      }
      /* ---- the chunk's end ---- */
      kva_mbar_wait(sfull, nc & 1u);
      float m2[2], lt[2];
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int lrow = 16 * wq + g + 8 * hf;
        m2[hf] = lrow < NQ ? sm[lrow] : -INFINITY;
        lt[hf] = lrow < NQ ? sl[lrow] : 0.0f;
      }
      kva_mbar_arrive(sempty);
      mla10_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS); /* both O^T's are over: the stage is free */
      float *const orows = (float *)p_st;           /* [NQ][OROW] */
#pragma unroll
      for (int c = 0; c < 4; c++)
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
#pragma unroll
          for (int i = 0; i < 4; i++)
            orows[(8 * jj + 2 * tq + (i & 1)) * OROW + 256 * h + 64 * c + 16 * wq + g +
                  8 * (i >> 1)] = ot[c][4 * jj + i];
      if (nsplit == 2 && ct == 0) *flag = mla_known_last(a, r, ch.split);
      mla10_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS); /* O's rows and the flag written */
      float o[2][64];
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int lrow = 16 * wq + g + 8 * hf;
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
          for (int j16 = 0; j16 < 16; j16++) {
            float2 v = make_float2(0.0f, 0.0f);
            if (lrow < NQ)
              v = *(const float2 *)(orows + lrow * OROW + 256 * h + 128 * hh + 8 * j16 + 2 * tq);
            o[hh][4 * j16 + 2 * hf] = v.x;
            o[hh][4 * j16 + 2 * hf + 1] = v.y;
          }
      }
      const int known_last = nsplit == 2 && *flag;
      mla_finish_chunk<QT, false, KVA_MLA10_BAR_O>(a, o, lt, m2, r, ch.split, nsplit, known_last,
                                                   nt, tok0, row0, rows, ct, h, wq, g, tq, flag,
                                                   (float *)p_b8, (size_t)3 * TILE8);
      /* the merge's scratch (generic writes) before the next bulk copies;
       * O's rows read before the next conversion */
      kva_fence_proxy_async_smem();
      mla10_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS);
    }
    nb += (uint32_t)nblk;
    nc++;
  }
}

#endif /* KVA_CUDA_MLA_KERNEL_V10_CUH */
