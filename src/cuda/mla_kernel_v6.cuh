/* MLA decode v6: one warpgroup makes S and P, two own O. 16-bit latents,
 * or fp8 converted into the stages (KV8, mla6_fp8.cuh). Same grid, arguments,
 * split walk, loads (v5's 64-key blocks in two 72 KB stages, TMA or
 * cp.async, mla5_rows / mla5_copy), partial rows, in-kernel merge, causal
 * mask, LSE and PDL as v5; 384 threads (512 for fp8).
 *
 * Warpgroup 0 (S, 104 registers): per 64-key block j in stage j % 2,
 * S = Q K^T (36 ss k-steps, each column block as soon as it landed), the
 * online softmax (it alone holds the rows' max m and sum l), P over the
 * stage's rope column block (dead once S read it; [64 rows][128 B], the A
 * operand of an ss wgmma), the rows' factors c to smem, and an arrival on
 * the stage's ready barrier. Warpgroups 1 and 2 (200 registers): O's
 * columns 0..255 and 256..511; per block: wait ready, O *= c where a row's
 * max moved, O += P V (four m64n256k16 from smem), wait, a barrier of the
 * two, then each refills the stage's column blocks it was the last to
 * read (v5's split: 0..3 and 8 / 4..7) with block j + 2. So the softmax of
 * block j + 1 runs while the tensor cores do block j's P V, and no
 * warpgroup waits for another's row maxima (v5's seesaw did). On the
 * H100: 8.5-10.4% faster than v5 at 128 query rows as first built, 1-7%
 * in its final form (docs/performance.md, "Twenty-third session").
 * fp8 latents add a fourth warpgroup that converts them (KV8, below).
 *
 * A chunk's end: warpgroup 0 puts l and m in smem (once the O warpgroups
 * read the previous chunk's: mbarriers stats_full / stats_empty); they then
 * run the chunk end of v2 and v5 (mla_chunk_end.cuh) on their named
 * barrier, load the next chunk's Q and first two blocks, and warpgroup 0
 * waits for them on the mbarriers.
 * Named barriers (bar.sync, each instance at one instruction): 1 the O
 * warpgroups (256 threads), 3 warpgroup 0 (its S over before its P
 * overwrites the rope columns that S reads). Between warpgroups' code only
 * mbarriers: bar.sync from two code paths is outside PTX's .aligned rule
 * (synccheck reported it), and barrier.sync there measured 2-3% slower. */
#ifndef KVA_CUDA_MLA_KERNEL_V6_CUH
#define KVA_CUDA_MLA_KERNEL_V6_CUH

#include "cuda/mla_kernel_v5.cuh"

#define KVA_MLA6_BAR_O 1
#define KVA_MLA6_BAR_S 3 /* warpgroup 0 */
#define KVA_MLA6_S_REGS 104
#define KVA_MLA6_O_REGS 200 /* 104 + 2 x 200 <= 384 threads x 168 */
/* fp8 with the converter warpgroup: 104 + 72 + 2 x 168 = 512 threads x 128
 * (ptxas sizes every instruction to the launch's 128 whatever setmaxnreg
 * says, hence mla6_pv_ss_n128) */
#define KVA_MLA6_C_REGS 72
#define KVA_MLA6_O8_REGS 168

#include "cuda/mla6_fp8.cuh"

/* The decode timeline's stamps (trace.h), in a build with
 * -DKVA_MLA6_TIMELINE only (e.g. scripts/variant_cli.sh . NAME
 * -DKVA_MLA6_TIMELINE), so that the default kernel stays the measured one:
 * by the first O thread, which runs the chunks' ends (word 2: its first
 * P of the launch, "first tile landed" in scripts/dec_trace.py). Never with
 * KVA_MLA_TRACE, whose records hold v5's phase sums. */
#if defined(KVA_MLA6_TIMELINE) && !defined(KVA_MLA_TRACE)
#define MLA6_STAMPS true
#define MLA6_STAMP(w, value) KVA_TRACE_STAMP_BY(threadIdx.x == KVA_MLA_THREADS / 2, w, value)
#else
#define MLA6_STAMPS false
#define MLA6_STAMP(w, value) \
  do {                       \
  } while (0)
#endif

/* KV8: fp8 latents (mla6_fp8.cuh), converted by a fourth warpgroup, the
 * converter (512 threads: registers 104 / 72 / 2 x 168): per block j it
 * reads the block's bytes from global memory into registers (prefetched
 * into L2 one block ahead), waits until the O warpgroups' P V(j - 2) left
 * the stage (`empty`) and stores the block's f16 there; the O warpgroups
 * only wait for P and run P V, in halves of 128 columns (under 128
 * registers an instruction). So a conversion runs beside the P V of the
 * block before instead of in the O warpgroups' chain: 9-10% less time
 * than the O warpgroups converting block j + 1 before they wait for P(j)
 * (the forty-eighth session's order, in git before 339e00c; H200,
 * 2026-11-29, FlashMLA's fp8 rows of 48-64 rows, 3 samples ABBA; h64 s_q1
 * sk8192 0.289 against 0.321 ms). Until the fiftieth session the bytes
 * came by bulk copies into the stage's upper half and were converted in
 * place; from registers, the smem read and the bulk copy's write go:
 * 0.7-2.4% less time on FlashMLA's fp8 rows of 64-256 rows. In the
 * forty-eighth session's form, converting after P V(j) was issued
 * measured 1-2% slower and an arrival for column blocks 0..3 ahead of
 * 4..8 4% slower (1.5-2% slower with the converter too). The tensor cores
 * run f16 whatever Q's type (a bf16 Q converted in place by warpgroup 0,
 * mla6_q_to_f16). */
/* mla5_pv_ss in halves of 128 columns (fp8 with the converter: 512
 * threads, so each instruction's registers must fit under 128) */
static __device__ __forceinline__ void mla6_pv_ss_n128(float o[2][64], uint32_t s_p, uint32_t s_k,
                                                       int wg) {
  mla_fence_o(o);
  kva_wgmma_fence();
  const uint64_t dp = mla_desc(s_p, 16, 1024);
  const uint64_t dv = mla_desc(s_k + 4 * wg * KVA_MLA5_KBLK, KVA_MLA5_KBLK, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
#pragma unroll
    for (int n = 0; n < 2; n++)
      kva_wgmma_m64n128k16_ss_f16_tb(o[n], dp + ((kk * 32) >> 4),
                                     dv + ((kk * 16 * 128 + n * 2 * KVA_MLA5_KBLK) >> 4));
  kva_wgmma_commit();
}

/* The phase parity of a chunk's block j in stage j % 2, whose fills
 * before the chunk were f0 and f1. */
static __device__ __forceinline__ uint32_t mla6_parity(int f0, int f1, int j) {
  return (uint32_t)((((j & 1) ? f1 : f0) + (j >> 1)) & 1);
}

template <int QT, int TMA, int KV8 = 0>
__global__ void __launch_bounds__(KVA_MLA6_THREADS_OF(KV8), 1)
    kva_mla_kernel_v6(const __grid_constant__ kva_mla_args a) {
  constexpr int TILE = KVA_MLA5_TILE, BN = KVA_MLA5_BN, KB = KVA_MLA5_KBLK;
  constexpr int MT = KV8 ? KVA_F16 : QT; /* the tensor cores' type */
  static_assert(!KV8 || TMA == 0, "fp8 latents come by bulk copies, not tensor maps");
  static_assert(KVA_MLA6_SMEM <= 232448, "227 KB of smem per CTA");
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_q = smem + (s_q - s_raw);
  const uint32_t s_st0 = s_q + KVA_MLA_QTILE;
  unsigned char *const p_st0 = p_q + KVA_MLA_QTILE;
  float *const sc = (float *)(p_st0 + 2 * TILE); /* [2 stages][64] factor c */
  float *const sm = sc + 2 * KVA_MLA_BM;          /* [64] the chunk's max m */
  float *const sl = sm + KVA_MLA_BM;              /* [64] the chunk's sum l */
  /* mbarriers: Q, stage s column block k at 8 (1 + 9 s + k), ready of
   * stage s at 8 (19 + s), the chunk's l and m written (21) and read (22);
   * then a flag */
  const uint32_t s_bar = s_q + KVA_MLA_QTILE + 2 * TILE + KVA_MLA6_STATS;
  const uint32_t stats_full = s_bar + 8 * 21, stats_empty = s_bar + 8 * 22;
  volatile int *const flag = (volatile int *)(p_st0 + 2 * TILE + KVA_MLA6_STATS + 184);
#ifdef KVA_MLA_TRACE /* v5's S helper sums phases into words here (not reported) */
  unsigned *const mla5_tr = (unsigned *)(p_st0 + 2 * TILE + KVA_MLA6_STATS + 192);
#else
  unsigned *const mla5_tr = NULL;
#endif

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = mla_uni(warp >> 2), wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const int tw = tid & 127;
  const kva_plan_header *hdr = a.hdr;
  kva_griddep_launch_dependents();
  MLA6_STAMP(0, kva_globaltimer());
  if ((int)blockIdx.x >= hdr->num_workers) {
    MLA6_STAMP(8, kva_globaltimer());
    MLA6_STAMP(9, kva_smid());
    return;
  }
  const int row0 = (int)blockIdx.y * KVA_MLA_BM;
  if (row0 >= hdr->max_q_len * a.hq) {
    MLA6_STAMP(8, kva_globaltimer());
    MLA6_STAMP(9, kva_smid());
    return;
  }
  const kva_split_work wk = a.sched[blockIdx.x];
  if (tid == 0) {
    /* KV8: the O warpgroups arrive on the stages' empty */
    mla5_init<TMA>(s_bar, 22, a, KV8 ? MLA6_F8_WIDE : 0u);
    kva_mbar_init(stats_empty, KVA_MLA_THREADS);
  }
  __syncthreads(); /* the inits are seen by every thread */

  /* fills of each stage, Q loads and chunks so far, CTA-uniform */
  int f0 = 0, f1 = 0, nq = 0, nchunk = 0;
  if (wg == 0) {
    kva_setmaxnreg_dec<KVA_MLA6_S_REGS>();
    /* a bf16 Q in f16 is Q 2^-KVA_FP8_Q_SHIFT (kva_q_bf16x2_to_f16x2) */
    const float qk_mul = MT != QT ? a.qk_mul * (float)(1 << KVA_FP8_Q_SHIFT) : a.qk_mul;
    for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
      mla5_chunk c;
      if (!mla5_chunk_at(a, wk, wi, row0, &c)) continue;
      int pos[2];
#pragma unroll
      for (int hf = 0; hf < 2; hf++) pos[hf] = c.cached + (row0 + 16 * wq + g + 8 * hf) / a.hq;
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
      if (c.nblk > 0) {
        kva_mbar_wait(s_bar, (uint32_t)(nq & 1)); /* Q */
        if (MT != QT) mla6_q_to_f16(p_q, tid);
        kva_fence_proxy_async_smem(); /* Q came by cp.async */
        if (MT != QT) mla_bar_sync(KVA_MLA6_BAR_S, KVA_MLA_THREADS / 2); /* all of Q in f16 */
      }
      for (int j = 0; j < c.nblk; j++) {
        const int s = j & 1;
        const uint32_t st = s_st0 + s * TILE, bar = s_bar + 8 + 72 * s;
        const uint32_t par = mla6_parity(f0, f1, j);
        /* a TMA block needs no proxy fence before its wgmmas (the async
         * proxy wrote it; H100: 4-6% of a probe's time, bench/mla_v6_probe.cu) */
        const int fence = !KV8 && !mla5_tma_block<TMA>(a, c.k0 + j * BN, c.k1);
        float sacc[32], cf[2];
        uint32_t pk[8][2];
        if (KV8) kva_mbar_wait(MLA6_F8_CONVERTED(s_bar, s), par); /* converters fenced */
        mla5_s_begin(sacc);
#pragma unroll
        for (int k = 0; k < 9; k++)
          mla5_s_cols<MT, !KV8>(sacc, s_q, st, bar, par, k, k == 0, mla5_tr, fence);
        kva_wgmma_commit();
        kva_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; i++) kva_reg_fence_f32(&sacc[i]);
        /* every warp's S is over before any warp's P goes over the rope
         * columns it reads (the emulator caught keys 32..63 of a block read
         * after warp 2 had stored its P rows there) */
        mla_bar_sync(KVA_MLA6_BAR_S, KVA_MLA_THREADS / 2);
        mla_softmax_tile<MT, 8, false>(sacc, m, l, cf, pk, c.k0 + j * BN, c.k1, c.cached, pos, a,
                                       qk_mul, tq);
        /* rows past the tile's (their logits are 0, so P is 1 there) get P =
         * 0: their P V then multiplies zeros, which draws less power (the
         * H200 under sustained load runs at its 700 W cap) */
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
          if (row0 + 16 * wq + g + 8 * hf >= c.rows)
#pragma unroll
            for (int i = 0; i < 8; i++) pk[i][hf] = 0u;
        /* P over the stage's rope column block; its factors; then ready */
        mla5_store_p(p_st0 + s * TILE + 8 * KB, pk, wq, g, tq);
        if (tq == 0) {
          sc[s * KVA_MLA_BM + 16 * wq + g] = cf[0];
          sc[s * KVA_MLA_BM + 16 * wq + g + 8] = cf[1];
        }
        kva_mbar_arrive(s_bar + 8 * (19 + s));
      }
      /* the rows' sums and maxima to the O warpgroups, once they read the
       * previous chunk's */
      if (nchunk > 0) kva_mbar_wait(stats_empty, (uint32_t)((nchunk - 1) & 1));
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        float lt = l[hf];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        if (tq == 0) {
          sl[16 * wq + g + 8 * hf] = lt;
          sm[16 * wq + g + 8 * hf] = m[hf];
        }
      }
      kva_mbar_arrive(stats_full);
      if (c.nblk > 0) {
        f0 += (c.nblk + 1) >> 1;
        f1 += c.nblk >> 1;
        nq++;
      }
      nchunk++;
    }
    return;
  }

  if (KV8 && wg == 3) {
    /* the converter: per block j of a chunk, the L2 prefetch of block
     * j + KVA_MLA6_F8_PF, then its keys r = cv / 4 and r + 32 of block j,
     * 16 bytes at 16 (cv % 4) of each column group, from global memory
     * (mla6_load_key_f8): the first key's loads go out before the stage
     * is free (`empty`: the O threads arrive once P V(j - 2) left it, or
     * at the chunk's start for blocks 0 and 1, after the chunk end that
     * used both stages as scratch), the second's under the first's
     * stores */
    kva_setmaxnreg_dec<KVA_MLA6_C_REGS>();
    const int cv = tid - 384;
    const unsigned char *const kvg = (const unsigned char *)a.kv;
    for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
      mla5_chunk c;
      if (!mla5_chunk_at(a, wk, wi, row0, &c)) continue;
      kva_griddep_wait(); /* the latents may come from the kernel before */
      const int r0 = cv >> 2, q = cv & 3;
      for (int b = 0; b < KVA_MLA6_F8_PF && b < c.nblk; b++)
        mla6_prefetch_f8(kvg, c.pt, c.k0 + b * BN, c.k1, a, cv);
      for (int j = 0; j < c.nblk; j++) {
        const int s = j & 1, kt = c.k0 + j * BN;
        if (j + KVA_MLA6_F8_PF < c.nblk)
          mla6_prefetch_f8(kvg, c.pt, kt + KVA_MLA6_F8_PF * BN, c.k1, a, cv);
        uint4 x[9];
        mla6_load_key_f8(x, kvg, c.pt, kt + r0, c.k1, a, q);
        /* `empty` completes once per block of its stage, as `converted` */
        kva_mbar_wait(MLA6_F8_EMPTY(s_bar, s), mla6_parity(f0, f1, j));
        unsigned char *const p_st = p_st0 + s * TILE;
        mla6_store_key_f16<true>(p_st, r0, q, x, kvg, c.pt, kt + r0 + 32, c.k1, a);
        mla6_store_key_f16<false>(p_st, r0 + 32, q, x, kvg, c.pt, 0, 0, a);
        kva_fence_proxy_async_smem(); /* generic stores -> the wgmmas */
        kva_mbar_arrive(MLA6_F8_CONVERTED(s_bar, s));
      }
      if (c.nblk > 0) {
        f0 += (c.nblk + 1) >> 1;
        f1 += c.nblk >> 1;
      }
    }
    return;
  }
  kva_setmaxnreg_inc<KV8 ? KVA_MLA6_O8_REGS : KVA_MLA6_O_REGS>();
  const int h = wg - 1, ct = tid - 128; /* O columns 256 h ..; thread of the two */
  const unsigned char *const kvg = (const unsigned char *)a.kv;
  unsigned trace_merges = 0;
  for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
    mla5_chunk c;
    if (!mla5_chunk_at(a, wk, wi, row0, &c)) continue;
    kva_griddep_wait();
    if (nchunk == 0) MLA6_STAMP(1, kva_globaltimer());
    float o[2][64];
#pragma unroll
    for (int i = 0; i < 64; i++) o[0][i] = o[1][i] = 0.0f;
    if (c.nblk > 0) {
      /* Q (both warpgroups), blocks 0 and 1 (each its column blocks) */
      mla_issue_q(s_q, a, c.tok0, row0, c.rows, ct);
      kva_cp_async_mbar_arrive_noinc(s_bar);
      if (KV8) { /* both stages are free for the converter */
        kva_mbar_arrive(MLA6_F8_EMPTY(s_bar, 0));
        if (c.nblk > 1) kva_mbar_arrive(MLA6_F8_EMPTY(s_bar, 1));
      } else {
        mla5_load<TMA>(s_st0, s_bar + 8, kvg, c.pt, c.k0, c.k1, a, h, tw);
        if (c.nblk > 1)
          mla5_load<TMA>(s_st0 + TILE, s_bar + 80, kvg, c.pt, c.k0 + BN, c.k1, a, h, tw);
      }
    }
    for (int j = 0; j < c.nblk; j++) {
      const int s = j & 1;
      const uint32_t st = s_st0 + s * TILE, bar = s_bar + 8 + 72 * s;
      const uint32_t par = mla6_parity(f0, f1, j);
      const int kt = c.k0 + j * BN;
      const bool more = j + 2 < c.nblk;
      int nx[4]; /* rows of block j + 2, read ahead of the wait */
      if (!KV8) mla5_rows<TMA>(nx, c.pt, kt + 2 * BN, more ? c.k1 : 0, a, tw);
      kva_mbar_wait(s_bar + 8 * (19 + s), par); /* P, c of block j */
      if (nchunk == 0 && j == 0) MLA6_STAMP(2, kva_globaltimer()); /* the first P */
      float cf[2];
#pragma unroll
      for (int hf = 0; hf < 2; hf++) cf[hf] = sc[s * KVA_MLA_BM + 16 * wq + g + 8 * hf];
      if (__any_sync(0xffffffffu, cf[0] != 1.0f || cf[1] != 1.0f)) mla_scale_o(o, cf);
      /* V of a cp.async block landed for warpgroup 0's S: fenced for this
       * warpgroup's wgmma (P's generic stores were fenced by their writers) */
      if (!KV8 && !mla5_tma_block<TMA>(a, kt, c.k1)) kva_fence_proxy_async_smem();
      if (KV8) mla6_pv_ss_n128(o, st + 8 * KB, st, h);
      else mla5_pv_ss<QT>(o, st + 8 * KB, st, h);
      kva_wgmma_wait<0>();
      mla_fence_o(o);
      if (KV8) { /* the converter refills the stage once both P V's are over */
        if (more) kva_mbar_arrive(MLA6_F8_EMPTY(s_bar, s));
        continue;
      }
      mla_bar_sync(KVA_MLA6_BAR_O, KVA_MLA_THREADS); /* both P V's on the stage are over */
      if (more) mla5_copy<TMA>(st, bar, kvg, nx, h, tw, kt + 2 * BN, c.k1, a);
    }
    MLA6_STAMP(3, kva_globaltimer());
    kva_mbar_wait(stats_full, (uint32_t)(nchunk & 1)); /* the rows' l and m */
    float lt[2], m[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      lt[hf] = sl[16 * wq + g + 8 * hf];
      m[hf] = sm[16 * wq + g + 8 * hf];
    }
    kva_mbar_arrive(stats_empty);
    /* a chunk that completes a request of two merges the other's rows
     * before its write (as v2 and v9; the head waits for the rest where the
     * costed walk planned it to end first) */
    if (c.nsplit == 2) {
      if (ct == 0) *flag = mla_known_last(a, c.r, c.split);
      mla_bar_sync(KVA_MLA6_BAR_O, KVA_MLA_THREADS); /* flag written */
    }
    const int known_last = c.nsplit == 2 && *flag;
    /* the stages are free until the next chunk's loads: the merge's scratch */
    trace_merges += mla_finish_chunk<QT, MLA6_STAMPS, KVA_MLA6_BAR_O>(
        a, o, lt, m, c.r, c.split, c.nsplit, known_last, c.nt, c.tok0, row0, c.rows, ct, h, wq, g,
        tq, flag, (float *)p_st0, (size_t)(2 * TILE));
    /* the merge's scratch (generic writes) before the next chunk's TMA
     * or (KV8) bulk copies write there */
    if ((TMA && a.kv_tma) || KV8) kva_fence_proxy_async_smem();
    mla_bar_sync(KVA_MLA6_BAR_O, KVA_MLA_THREADS); /* flag read; stages free */
    if (c.nblk > 0) {
      f0 += (c.nblk + 1) >> 1;
      f1 += c.nblk >> 1;
      nq++;
    }
    nchunk++;
  }
  MLA6_STAMP(8, kva_globaltimer());
  MLA6_STAMP(9, kva_smid());
  MLA6_STAMP(10, (unsigned)nchunk);
  MLA6_STAMP(11, trace_merges);
}

#undef MLA6_STAMP
#undef MLA6_STAMPS

#endif /* KVA_CUDA_MLA_KERNEL_V6_CUH */
