/* MLA decode v10: fp8 latents for batches of at most NQ = 16 or 32 query
 * rows (q heads x new tokens), with the keys as the wgmma M.
 *
 * Why: v2 and v9 put a row tile of 64 query rows on M, so 16 rows pay for
 * 64 and an fp8 step at 16-32 rows cost as much tensor work as one at 64.
 * H100 (2026-11-27): v2's fp8 ran 1.17 TB/s at 16, 32 and 64 rows alike
 * (0.515 ms, FlashMLA's h16 s_q1 sk8192 row), 1.65 TB/s with its wgmmas
 * compiled out. Here S^T = K Q^T (M = the block's 64 keys, N = NQ rows,
 * K = 576) and O^T += V^T P^T (M = 64 of V's dims, N = NQ rows, K = the
 * 64 keys), so the tensor work follows the rows: at N = 16 a block's
 * S^T and O^T took ~1360 cycles on the probe (bench/wgmma_rate.cu, both
 * operands from smem), under the ~2900 a 36 KB block takes to stream at
 * the copy rate.
 *
 * No 16-bit stage: both products take their A operand from registers,
 * converted (e4m3 -> f16, exact) straight from the bytes, and smem holds
 * Q, P^T and five byte stages. Roles (384 threads, v9's). Warpgroup 0
 * loads Q (f16, times 2^-8 for a bf16 Q, as v2; its smem rows permuted
 * into the k order of K's fragments), and per block builds S^T's A
 * fragments from K's bytes a column block at a time (rs wgmma), runs the
 * online softmax down S^T's columns (a row's max over the block through
 * smem between its four warps), writes P^T (f16, [NQ rows][64 keys], a
 * K-major B operand) and the rows' factors into one of two buffers and
 * arrives on its `pfull`. The two O warpgroups own O^T's dims (tile c's
 * M rows stand for dims 256 h + 64 wq + 8 g + 2 c and + 1, so one 8-byte
 * load of a key feeds all four tiles): per block they wait for P^T,
 * rescale O^T, build V^T's fragments per key step and issue the four
 * tiles' rs wgmmas, then refill the byte stage five blocks ahead (one
 * bulk copy per page run) once warpgroup 0 and both O warpgroups read it.
 * Warpgroup 0 runs up to two blocks ahead (the P^T buffers).
 *
 * H100 (FlashMLA's fp8 h16 s_q1 sk8192 row, v2 0.515 ms): one 16-bit
 * stage converted by the O warpgroups after O^T, S^T after all of it:
 * 0.41 ms; converted under O^T column block by column block: 0.337; K
 * converted in registers by warpgroup 0: 0.261 (the conversion was the
 * chain's largest part, 0.218 ms with it compiled out). See
 * docs/performance.md, "Thirty-third session".
 *
 * At a chunk's end warpgroup 0 leaves each row's m and l in smem; the O
 * warpgroups put O^T over the byte stages as O's rows (f32; no fill is in
 * flight then), read them back in v2's accumulator layout and run
 * mla_finish_chunk (O, partial rows, the merges), with the byte stages as
 * the merge's scratch. Row
 * tiles are NQ rows (grid.y from the plan's capacity), so any batch is
 * covered; the kernel is picked for batches of <= NQ rows. */
#ifndef KVA_CUDA_MLA_KERNEL_V10_CUH
#define KVA_CUDA_MLA_KERNEL_V10_CUH

#include "cuda/mla9_fp8.cuh"

/* Register sets of S^T's A fragments in flight (a set is a column block)
 * and column blocks converted before each wgmma.fence, at N = 16 / 32.
 * A warpgroup's conversion runs in series with the rs wgmmas it feeds
 * (bench/wgmma_rate.cu, rs_rate), and fewer fences shorten that chain:
 * H100, two column blocks a fence (six sets) and two key steps of O^T a
 * fence (four sets) took 3.3-3.8% off FlashMLA's fp8 rows of 16 query
 * rows. At N = 32 six sets serialize the wgmmas (C7512, registers) and
 * O^T's grouping alone was level. */
#ifndef KVA_MLA10_KSETS16
#define KVA_MLA10_KSETS16 6
#endif
#ifndef KVA_MLA10_KGROUP16
#define KVA_MLA10_KGROUP16 2
#endif
#ifndef KVA_MLA10_KSETS32
#define KVA_MLA10_KSETS32 4
#endif
#ifndef KVA_MLA10_KGROUP32
#define KVA_MLA10_KGROUP32 1
#endif
#define KVA_MLA10_KSETS(NQ) ((NQ) == 16 ? KVA_MLA10_KSETS16 : KVA_MLA10_KSETS32)
#define KVA_MLA10_KGROUP(NQ) ((NQ) == 16 ? KVA_MLA10_KGROUP16 : KVA_MLA10_KGROUP32)
/* register sets of O^T's A fragments (a set is a key step; half of them
 * are converted before each wgmma.fence): 2 or 4, at N = 16 / 32 */
#ifndef KVA_MLA10_VSETS16
#define KVA_MLA10_VSETS16 4
#endif
#ifndef KVA_MLA10_VSETS32
#define KVA_MLA10_VSETS32 2
#endif
#define KVA_MLA10_VSETS(NQ) ((NQ) == 16 ? KVA_MLA10_VSETS16 : KVA_MLA10_VSETS32)
/* accumulator sets S^T's k-steps go round (then summed) */
#ifndef KVA_MLA10_SACC
#define KVA_MLA10_SACC 2
#endif
/* -DKVA_MLA10_PHASES (diagnostics; with KVA_DEC_TRACE=FILE kvattn bench,
 * read by scripts/mla10_phases.py): each CTA's cycles per phase summed
 * over its blocks, in its trace record. Warpgroup 0 (thread 0): 0 bytes
 * wait, 1 S^T's conversion and issue, 2 S^T's wait, 3 the block max and
 * its barrier, 4 the P^T buffer's wait, 5 P^T written, 11 blocks; the O
 * warpgroups (thread 128): 6 bytes wait, 7 P^T's wait, 8 rescale and O^T
 * issued, 9 O^T's wait, 10 the refill. */
#ifdef KVA_MLA10_PHASES
#define MLA10_CLK(t) const long long t = clock64()
#define MLA10_ADD(k, t1, t0) ph[k] += (unsigned long long)((t1) - (t0))
#define MLA10_BLOCK() ph[11]++
#else
#define MLA10_CLK(t) \
  do {               \
  } while (0)
#define MLA10_ADD(k, t1, t0) \
  do {                       \
  } while (0)
#define MLA10_BLOCK() \
  do {                \
  } while (0)
#endif
#define KVA_MLA10_BAR_S 1 /* warpgroup 0 */
#define KVA_MLA10_BAR_O 2 /* the O warpgroups */
#define KVA_MLA10_BAR_H 3 /* O warpgroup h: 3 + h */

/* The fill of the block at kt (global block index u) into byte stage
 * u % NS, once its last contents were read (a fresh barrier passes parity
 * 1: a stage's first fill waits for nothing). ct: the O thread. */
static __device__ __forceinline__ void mla10_fill(uint32_t s_b8, uint32_t s_bar, uint32_t u,
                                                  const unsigned char *kvg, const int32_t *pt,
                                                  int kt, int k1, const kva_mla_args &a, int ct) {
  constexpr uint32_t NS = KVA_MLA10_STAGES;
  const uint32_t sb = u % NS, use = u / NS;
  if (ct < KVA_MLA5_BN) kva_mbar_wait(s_bar + 8 * (NS + sb), (use & 1u) ^ 1u);
  mla9_issue_f8(s_b8 + sb * KVA_MLA9_TILE8, s_bar + 8 * sb, kvg, pt, kt, k1, a, ct);
}

/* O^T's A fragments (V^T, f16) for key step st straight from the bytes:
 * the thread's M rows of its warpgroup's four 64-dim tiles c (16 wq + g,
 * + 8) stand for dims 256 h + 64 wq + 8 g + 2 c (+ 1), so one 8-byte load
 * of a key serves all four tiles; its keys are 16 st + 2 tq, + 1, + 8 and
 * + 9 (the fragment's k columns), rows of the first pair loaded in an
 * order that puts a quarter warp's loads on distinct banks. Keys at or
 * past nrows read as zero (masked P V stays finite). */
static __device__ __forceinline__ void mla10_v_frags(uint32_t f[4][4], const unsigned char *st8,
                                                     int st, int nrows, int h, int wq, int g,
                                                     int tq) {
  const int r0 = 16 * st + 2 * tq, odd = tq & 1;
  const unsigned char *const base = st8 + 256 * h + 64 * wq + 8 * g;
  const uint2 xa = *(const uint2 *)(base + (r0 + odd) * KVA_MLA_D);
  const uint2 xb = *(const uint2 *)(base + (r0 + 1 - odd) * KVA_MLA_D);
  const uint2 ya = *(const uint2 *)(base + (r0 + 8 + odd) * KVA_MLA_D);
  const uint2 yb = *(const uint2 *)(base + (r0 + 9 - odd) * KVA_MLA_D);
  const uint2 z = make_uint2(0u, 0u);
  const uint2 x0 = r0 < nrows ? (odd ? xb : xa) : z, x1 = r0 + 1 < nrows ? (odd ? xa : xb) : z;
  const uint2 y0 = r0 + 8 < nrows ? (odd ? yb : ya) : z, y1 = r0 + 9 < nrows ? (odd ? ya : yb) : z;
#pragma unroll
  for (int c = 0; c < 4; c++) {
    /* bytes 2c, 2c + 1 (dims 2c, 2c + 1) of the two keys of a pair */
    const uint32_t sel = (uint32_t)(2 * (c & 1)) * 0x1111u + 0x5140u;
    const uint32_t px = kva_prmt(c < 2 ? x0.x : x0.y, c < 2 ? x1.x : x1.y, sel);
    const uint32_t py = kva_prmt(c < 2 ? y0.x : y0.y, c < 2 ? y1.x : y1.y, sel);
    f[c][0] = mla_e4m3x2<KVA_F16>(px);       /* dim 2c, keys r0, r0 + 1 */
    f[c][1] = mla_e4m3x2<KVA_F16>(px >> 16); /* dim 2c + 1 */
    f[c][2] = mla_e4m3x2<KVA_F16>(py);       /* dim 2c, keys r0 + 8, r0 + 9 */
    f[c][3] = mla_e4m3x2<KVA_F16>(py >> 16);
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

/* One rs k-step of either product (N = NQ): d (+)= A B */
template <int NQ>
static __device__ __forceinline__ void mla10_mma_rs(float *d, const uint32_t a[4], uint64_t db,
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
  constexpr int TILE8 = KVA_MLA9_TILE8, BN = KVA_MLA5_BN, NS = KVA_MLA10_STAGES;
  constexpr int QB = NQ * 128; /* a column block of Q */
  constexpr int PB = KVA_MLA10_P(NQ);
  constexpr int OROW = KVA_MLA_DV + 4; /* O's rows over the byte stages at a chunk's end */
  constexpr int CT = KVA_F16;          /* the tensor cores' type (fp8 latents) */
  static_assert(NQ == 16 || NQ == 32, "N of the keys-as-M wgmmas");
  static_assert(KVA_MLA10_SMEM(NQ) <= 232448, "227 KB of smem per CTA");
  static_assert(NQ * OROW * 4 <= NS * TILE8, "O's rows fit the byte stages");
  static_assert(12 * NQ * 4 + 4 * NS * 8 + 8 <= KVA_MLA10_MISC, "misc smem");
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u;
  unsigned char *const p_q = smem + (s_q - s_raw);
  const uint32_t s_p = s_q + KVA_MLA10_Q(NQ), s_b8 = s_p + 2 * PB;
  unsigned char *const p_p = p_q + KVA_MLA10_Q(NQ), *const p_b8 = p_p + 2 * PB;
  float *const red = (float *)(p_b8 + NS * TILE8); /* [2][4 warps][NQ] */
  float *const cst = red + 8 * NQ;                /* [2][NQ]: a block's factors */
  float *const sm = cst + 2 * NQ, *const sl = sm + NQ;
  /* mbarriers: byte stage full 0..NS-1 (the O threads' fills), empty
   * NS..2NS-1 (read by warpgroup 0's S^T and the O warpgroups' O^T); then
   * pfull x 2, pempty x 2, stats full, stats empty */
  const uint32_t s_bar = s_b8 + NS * TILE8 + 12 * NQ * 4;
  const uint32_t pfull = s_bar + 8 * (2 * NS), pempty = pfull + 16;
  const uint32_t sfull = pempty + 16, sempty = sfull + 8;
  volatile int *const flag = (volatile int *)(p_b8 + NS * TILE8 + 12 * NQ * 4 + 4 * NS * 8);

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
    for (int i = 0; i < 2 * NS + 6; i++) /* pfull and stats full: warpgroup 0 */
      kva_mbar_init(s_bar + 8 * i, i >= NS && i < 2 * NS ? KVA_MLA10_THREADS
                                   : i == 2 * NS || i == 2 * NS + 1 || i == 2 * NS + 4
                                       ? KVA_MLA_THREADS / 2
                                       : KVA_MLA_THREADS);
  }
  __syncthreads(); /* the inits are seen by every thread */
  /* Q, the latents and the outputs belong to the kernels before (PDL) */
  kva_griddep_wait();
  const unsigned char *const kvg = (const unsigned char *)a.kv;
  const float qk_mul = CT != QT ? a.qk_mul * (float)(1 << KVA_MLA_FP8_Q_SHIFT) : a.qk_mul;
#ifdef KVA_MLA10_PHASES
  unsigned long long ph[KVA_TRACE_WORDS] = {0};
#endif

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
        mla_bar_sync(KVA_MLA10_BAR_S, 128); /* every thread's copies landed */
        for (int i = tw; i < NQ * (KVA_MLA_D / 64); i += 128)
          mla10_q_permute<QT, NQ>(p_q, i % NQ, i / NQ);
        kva_fence_proxy_async_smem(); /* Q -> wgmma */
      }
      mla_bar_sync(KVA_MLA10_BAR_S, 128); /* Q seen by every warp */
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
        /* S^T's k-steps go round KVA_MLA10_SACC accumulator sets, summed
         * after: at N = 16 or 32 a k-step is a few cycles of math, and one
         * chain of 36 wgmmas on one accumulator waits on each. H100: two
         * sets 0.3-1.4% faster on 11 of FlashMLA's 12 fp8 rows of 16 and
         * 32 (the chain is not what bounds v10); three and four no better */
        constexpr int SA = KVA_MLA10_SACC;
        float sacc[SA][4 * NJ];
#pragma unroll
        for (int q = 0; q < SA; q++)
#pragma unroll
          for (int i = 0; i < 4 * NJ; i++) {
            sacc[q][i] = 0.0f;
            kva_reg_fence_f32(&sacc[q][i]);
          }
        /* S^T: K's bytes converted into A fragments a column block at a
         * time (a register set is rewritten once the wgmmas that read it
         * are over) */
        const uint32_t sb = u % NS;
        MLA10_CLK(t0);
        kva_mbar_wait(s_bar + 8 * sb, (u / NS) & 1u); /* the block's bytes */
        MLA10_CLK(tb);
        MLA10_ADD(0, tb, t0);
        const unsigned char *const st8 = p_b8 + sb * TILE8;
        constexpr int NK = KVA_MLA10_KSETS(NQ), KG = KVA_MLA10_KGROUP(NQ);
        uint32_t kf[NK][4][4];
#pragma unroll
        for (int c0 = 0; c0 < 9; c0 += KG) {
#pragma unroll
          for (int cb = c0; cb < c0 + KG && cb < 9; cb++) {
            if (cb >= NK) kva_wgmma_wait<NK - 1>();
            mla10_k_frags(kf[cb % NK], st8, cb, wq, g, tq);
#pragma unroll
            for (int st = 0; st < 4; st++)
#pragma unroll
              for (int i = 0; i < 4; i++) kva_reg_fence_u32(&kf[cb % NK][st][i]);
          }
          kva_wgmma_fence(); /* one a group of column blocks */
#pragma unroll
          for (int cb = c0; cb < c0 + KG && cb < 9; cb++) {
#pragma unroll
            for (int st = 0; st < 4; st++)
              mla10_mma_rs<NQ>(sacc[(4 * cb + st) % SA], kf[cb % NK][st],
                               dq + ((uint32_t)(cb * QB + st * 32) >> 4), 4 * cb + st >= SA);
            kva_wgmma_commit();
          }
        }
        MLA10_CLK(t1);
        MLA10_ADD(1, t1, tb);
        kva_mbar_arrive(s_bar + 8 * (NS + sb)); /* this thread's reads of the bytes are over */
        kva_wgmma_wait<0>();
#pragma unroll
        for (int q = 0; q < SA; q++)
#pragma unroll
          for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&sacc[q][i]);
#pragma unroll
        for (int q = 1; q < SA; q++)
#pragma unroll
          for (int i = 0; i < 4 * NJ; i++) sacc[0][i] += sacc[q][i];
        MLA10_CLK(t2);
        MLA10_ADD(2, t2, t1);
        /* logits (base 2), masked on a chunk's boundary blocks; sacc[0][4 jj +
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
              float x = sacc[0][4 * jj + 2 * hf + e] * qk_mul;
              if (need_mask) {
                const int key = kt + 16 * wq + g + 8 * hf;
                if (key >= k1 || (a.causal && key > pos[jj][e])) x = -INFINITY;
              }
              sacc[0][4 * jj + 2 * hf + e] = x;
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
        mla_bar_sync(KVA_MLA10_BAR_S, 128);
        MLA10_CLK(t3);
        MLA10_ADD(3, t3, t2);
        /* P^T's buffer: the O warpgroups' O^T of block u - 2 is over */
        kva_mbar_wait(pempty + 8 * pb, ((u >> 1) & 1u) ^ 1u);
        MLA10_CLK(t4);
        MLA10_ADD(4, t4, t3);
        unsigned char *const pp = p_p + pb * PB;
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int n = 8 * jj + 2 * tq + e;
            const float bm =
                fmaxf(fmaxf(rd[n], rd[NQ + n]), fmaxf(rd[2 * NQ + n], rd[3 * NQ + n]));
            const float mn = kva_online_max(mr[jj][e], bm);
            const float mu = mn == -INFINITY ? 0.0f : mn; /* all masked so far: p = 0 */
            const float c = kva_ex2(mr[jj][e] - mu);
            mr[jj][e] = mn;
            const float p0 = kva_ex2(sacc[0][4 * jj + e] - mu);     /* key 16 wq + g */
            const float p1 = kva_ex2(sacc[0][4 * jj + 2 + e] - mu); /* key 16 wq + g + 8 */
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
        kva_mbar_arrive(pfull + 8 * pb);
        MLA10_ADD(5, clock64(), t4);
        MLA10_BLOCK();
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
      mla_bar_sync(KVA_MLA10_BAR_S, 128);
      if (tw < NQ) sl[tw] = rl[tw] + rl[NQ + tw] + rl[2 * NQ + tw] + rl[3 * NQ + tw];
      mla_bar_sync(KVA_MLA10_BAR_S, 128); /* rl read before the next block writes it */
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
      for (int b = 0; b < NS && b < nblk; b++)
        mla10_fill(s_b8, s_bar, nb + (uint32_t)b, kvg, pt, k0 + b * BN, k1, a, ct);
      const uint64_t dp = mla_desc(s_p, 16, 1024);
      for (int j = 0; j < nblk; j++) {
        const uint32_t u = nb + (uint32_t)j, pb = u & 1u, sb = u % NS;
        const int kt = k0 + j * BN;
        MLA10_CLK(t0);
        kva_mbar_wait(s_bar + 8 * sb, (u / NS) & 1u); /* the block's bytes */
        MLA10_CLK(t1);
        MLA10_ADD(6, t1, t0);
        kva_mbar_wait(pfull + 8 * pb, (u >> 1) & 1u);  /* P^T and the factors */
        MLA10_CLK(t2);
        MLA10_ADD(7, t2, t1);
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
        /* O^T += V^T P^T: per key step the four tiles' A fragments from the
         * bytes (KVA_MLA10_VSETS sets: a set is rewritten once the wgmmas
         * that read it are over) */
        const unsigned char *const st8 = p_b8 + sb * TILE8;
        constexpr int NV = KVA_MLA10_VSETS(NQ), VG = NV / 2; /* key steps a wgmma.fence */
        uint32_t vf[NV][4][4];
#pragma unroll
        for (int s0 = 0; s0 < 4; s0 += VG) {
#pragma unroll
          for (int st = s0; st < s0 + VG; st++) {
            if (st >= NV) kva_wgmma_wait<NV - 1>();
            mla10_v_frags(vf[st % NV], st8, st, k1 - kt, h, wq, g, tq);
#pragma unroll
            for (int c = 0; c < 4; c++)
#pragma unroll
              for (int i = 0; i < 4; i++) kva_reg_fence_u32(&vf[st % NV][c][i]);
          }
          kva_wgmma_fence();
#pragma unroll
          for (int st = s0; st < s0 + VG; st++) {
#pragma unroll
            for (int c = 0; c < 4; c++)
              mla10_mma_rs<NQ>(ot[c], vf[st % NV][c], dp + ((uint32_t)(pb * PB + st * 32) >> 4),
                               1);
            kva_wgmma_commit();
          }
        }
        MLA10_CLK(t3);
        MLA10_ADD(8, t3, t2);
        kva_mbar_arrive(s_bar + 8 * (NS + sb)); /* this thread's reads of the bytes are over */
        kva_wgmma_wait<0>();
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
          for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&ot[c][i]);
        MLA10_CLK(t4);
        MLA10_ADD(9, t4, t3);
        kva_mbar_arrive(pempty + 8 * pb); /* P^T read (every warp's arrival after its wait) */
        if (j + NS < nblk) mla10_fill(s_b8, s_bar, u + NS, kvg, pt, kt + NS * BN, k1, a, ct);
        MLA10_ADD(10, clock64(), t4);
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
      mla_bar_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS); /* both O^T's are over */
      float *const orows = (float *)p_b8;           /* [NQ][OROW]: no fill is in flight */
#pragma unroll
      for (int c = 0; c < 4; c++)
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
#pragma unroll
          for (int i = 0; i < 4; i++)
            orows[(8 * jj + 2 * tq + (i & 1)) * OROW + 256 * h + 64 * wq + 8 * g + 2 * c +
                  (i >> 1)] = ot[c][4 * jj + i];
      if (nsplit == 2 && ct == 0) *flag = mla_known_last(a, r, ch.split);
      mla_bar_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS); /* O's rows and the flag written */
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
      mla_bar_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS); /* O's rows read: the stages are scratch */
      mla_finish_chunk<QT, false, KVA_MLA10_BAR_O>(a, o, lt, m2, r, ch.split, nsplit, known_last,
                                                   nt, tok0, row0, rows, ct, h, wq, g, tq, flag,
                                                   (float *)p_b8, (size_t)NS * TILE8);
      /* the merge's scratch (generic writes) before the next bulk copies;
       * O's rows read before the next conversion */
      kva_fence_proxy_async_smem();
      mla_bar_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS);
    }
    nb += (uint32_t)nblk;
    nc++;
  }
#ifdef KVA_MLA10_PHASES
  if (a.trace && (tid == 0 || tid == 128)) { /* words 0-5 and 11 by warpgroup 0, 6-10 by the O */
    unsigned long long *w = a.trace + ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * KVA_TRACE_WORDS;
    for (int k = 0; k < KVA_TRACE_WORDS; k++)
      if ((tid == 0) == (k < 6 || k == 11)) w[k] = ph[k];
  }
#endif
}

#endif /* KVA_CUDA_MLA_KERNEL_V10_CUH */
