/* MLA decode v5: FlashMLA's "seesaw" pairing of key blocks in its order,
 * 16-bit latents only (fp8 pools keep v2). Same grid, arguments, split walk,
 * partial rows, in-kernel merge, causal mask, LSE and PDL as v2
 * (mla_kernel.cuh, whose helpers it uses); mla.cu runs it on batches of
 * >= 128 rows.
 *
 * Keys come in 64-key blocks, in pairs: block 2i in stage 0, 2i+1 in stage
 * 1, each [9 column blocks][64 rows][128 B]. Warpgroup 0 holds O's columns
 * 0..255 (O_L), warpgroup 1 columns 256..511 (O_R); both keep the same
 * running row max. Each warpgroup's S of its next block is issued at the
 * end of a pair and waited there, so a pair starts with softmax; P0 goes
 * to warpgroup 1 already scaled by c1, so its two P V's issue back to back
 * on one rescaled O_R. Per pair (S0 = Q K0^T, S1 = Q K1^T computed):
 *   WG0: softmax S0 (m0, c0) | c0, m0 out | O_L c0 + P0 V0_L | refill
 *        stage 0 columns 0..3, 8 | c1 in | P0 c1 to smem | O_L c1 + P1
 *        V1_L | S of block 2i+2 columns 0..3, 8 | refill stage 1 columns
 *        0..3, 8 | columns 4..7 of that S.
 *   WG1: c0, m0 in | softmax S1 against m0 (m1, c1) | c1, m1 out | P1 to
 *        smem (over stage 1's rope columns: S1 only reads them) | O_R c0
 *        c1 + P1 V1_R | P0 in | + P0 V0_R | refill stage 1 columns 4..7 |
 *        refill stage 0 columns 4..7 | S of block 2i+3, columns 4..7
 *        first (its own refill, issued first).
 * Tensor-core order: P0 V0_L, P1 V1_R, P0 V0_R, P1 V1_L (warpgroup 0
 * waits for warpgroup 1's P0 V0_R issue: stage 0 frees first), S0', S1'.
 * Named barriers: 1 c0/m0 out, 2 c1/m1 out, 3 scaled P0 out, 4 P1 out and
 * P0 V0_R issued, 5 warpgroup 1 done reading P0, 6 + wg inside a
 * warpgroup (every warp's wgmmas on a buffer are over before any thread
 * refills it).
 *
 * Loads: each warpgroup refills the column blocks it was the last to read
 * (warpgroup 0 blocks 0..3 and 8, warpgroup 1 blocks 4..7), as soon as
 * those reads are over. A block of 64 keys that starts a 64-key run of one
 * page and ends before the chunk's end comes by TMA (one 64 x 64 box per
 * column block from the warpgroup's first thread, which also makes all of
 * the barrier's 128 arrivals); other blocks by cp.async (16 bytes a
 * thread, rows through the page table, keys past the chunk's end
 * zero-filled, so masked P V stays finite). The page-table rows of a
 * pair's refills are read at the top of the pair. Every column block of a
 * stage lands on its own mbarrier, and S waits for each just before its
 * k-steps. */
#ifndef KVA_CUDA_MLA_KERNEL_V5_CUH
#define KVA_CUDA_MLA_KERNEL_V5_CUH

#include "cuda/mla_kernel.cuh"

#define KVA_MLA5_KBLK (KVA_MLA5_BN * 128) /* bytes of one 64-column block of a K/V block */

/* Diagnostics (a build with -DKVA_MLA_TRACE; `KVA_DEC_TRACE=FILE kvattn
 * bench --mode mla`, scripts/mla_trace.py): the first thread of each
 * warpgroup sums SM cycles per phase in smem and writes them at exit to
 * a.trace record wg * CTAs + cta (the per-CTA stamps are off): words 0
 * entry / 6 exit (%globaltimer), 1 S column-block waits, 2 S wgmma wait,
 * 3 softmax + publish, 4 hand-over barrier waits, 5 P V waits (wgmma and
 * the warpgroup barrier before a refill), 7 pairs, 8 refill issue, 9
 * cycles entry to exit, 10 key-loop cycles, 11 epilogue and merge. */
#ifdef KVA_MLA_TRACE
#define MLA5_CLK(v) const unsigned v = (unsigned)clock64()
#define MLA5_ACC(w, d)                                             \
  do {                                                             \
    if ((threadIdx.x & 127) == 0) mla5_tr[(threadIdx.x >> 7) * 12 + (w)] += (d); \
  } while (0)
#define MLA5_STAMP(w, value) \
  do {                       \
  } while (0)
#define MLA5_STAMPS false
#define MLA5_TR mla5_tr
#else
#define MLA5_TR NULL
#define MLA5_CLK(v)
#define MLA5_ACC(w, d)
#define MLA5_STAMP(w, value) KVA_TRACE_STAMP(w, value)
#define MLA5_STAMPS true
#endif

/* S k-step (m64n64k16, Q and K from smem) and P V k-step over one
 * warpgroup's 256 columns of O (m64n256k16, V through the descriptor's
 * transpose; o[0], o[1] are its 128 accumulators in order), P from
 * registers or from smem, in Q's type. */
template <int QT>
static __device__ __forceinline__ void mla5_mma_s(float d[32], uint64_t da, uint64_t db, int acc) {
  if (QT == KVA_F16)
    kva_wgmma_m64n64k16_ss_f16(d, da, db, acc);
  else
    kva_wgmma_m64n64k16_ss_bf16(d, da, db, acc);
}
template <int QT>
static __device__ __forceinline__ void mla5_mma_pv_rs(float o[2][64], const uint32_t pa[4],
                                                      uint64_t db) {
  if (QT == KVA_F16)
    kva_wgmma_m64n256k16_rs_f16_tb(&o[0][0], pa, db);
  else
    kva_wgmma_m64n256k16_rs_bf16_tb(&o[0][0], pa, db);
}
template <int QT>
static __device__ __forceinline__ void mla5_mma_pv_ss(float o[2][64], uint64_t da, uint64_t db) {
  if (QT == KVA_F16)
    kva_wgmma_m64n256k16_ss_f16_tb(&o[0][0], da, db);
  else
    kva_wgmma_m64n256k16_ss_bf16_tb(&o[0][0], da, db);
}

/* A hand-over to the other warpgroup, which syncs on the barrier. */
static __device__ __forceinline__ void mla5_signal(int id) { kva_bar_arrive(id, KVA_MLA_THREADS); }

/* The 64-key block at kt comes by TMA: a TMA build and pool, a whole
 * 64-key run of one page, ending at or before the chunk's end k1. */
template <int TMA>
static __device__ __forceinline__ int mla5_tma_block(const kva_mla_args &a, int kt, int k1) {
  return TMA && a.kv_tma && (kt & (KVA_MLA5_BN - 1)) == 0 && kt + KVA_MLA5_BN <= k1;
}
/* KV slots of this thread's 4 rows (tw / 8 + 16 p) of the 64-key block at
 * kt, -1 at or past k1: read at the top of a pair, ahead of their copies
 * later in it, so the page table's latency is off the path that issues the
 * matmuls. */
template <int TMA>
static __device__ __forceinline__ void mla5_rows(int slot[4], const int32_t *pt, int kt, int k1,
                                                 const kva_mla_args &a, int tw) {
  if (mla5_tma_block<TMA>(a, kt, k1)) { /* a TMA block needs its first row's slot only */
    slot[0] = mla_slot(pt, kt, k1, a);
    return;
  }
#pragma unroll
  for (int p = 0; p < 4; p++) slot[p] = mla_slot(pt, kt + (tw >> 3) + 16 * p, k1, a);
}

/* One column block k (a compile-time constant where called) of the
 * 64-key block at slot by TMA; the barrier's 128 arrivals from thread 0
 * (127 threads arriving on one word serialize). */
static __device__ __forceinline__ void mla5_tma_col(uint32_t dst, uint32_t bar0, int slot, int k,
                                                    const kva_mla_args &a) {
  kva_mbar_arrive_expect_tx(bar0 + 8 * k, (uint32_t)KVA_MLA5_KBLK);
  kva_mbar_arrive_cnt(bar0 + 8 * k, KVA_MLA_THREADS / 2 - 1);
  kva_tma_load_3d(dst + k * KVA_MLA5_KBLK, &a.kv_map, 64 * k, 0, slot, bar0 + 8 * k);
}

/* The TMA half of mla5_copy: the 64-key block whose first row is at slot
 * (a whole block of one page, before the chunk's end) into the stage at
 * dst. TMA 1: one box per column block, TMA 4: one per four V column
 * blocks and one for the rope columns. Each warpgroup's column blocks are
 * written out as constants: a k chosen by wg at run time made every box's
 * offsets loop invariants, which ptxas spilled and the issue then waited
 * for, box by box (ncu, thirty-eighth session). */
template <int TMA>
static __device__ __forceinline__ void mla5_copy_tma(uint32_t dst, uint32_t bar0, int slot, int wg,
                                                     int tw, const kva_mla_args &a) {
  if (tw != 0) return;
  if (TMA != 4) {
    if (wg) {
#pragma unroll
      for (int k = 4; k < 8; k++) mla5_tma_col(dst, bar0, slot, k, a);
    } else {
#pragma unroll
      for (int k = 0; k < 4; k++) mla5_tma_col(dst, bar0, slot, k, a);
      mla5_tma_col(dst, bar0, slot, 8, a);
    }
  } else {
    /* V column blocks k4 .. k4 + 3 in one box of kv_map4, on k4's
     * barrier; the other three barriers complete at once, which is safe
     * because every S waits for column block k4 before it reads k4 + 1 ..
     * k4 + 3 */
    const int k4 = wg ? 4 : 0;
    kva_mbar_arrive_expect_tx(bar0 + 8 * k4, (uint32_t)(4 * KVA_MLA5_KBLK));
    kva_mbar_arrive_cnt(bar0 + 8 * k4, KVA_MLA_THREADS / 2 - 1);
    kva_tma_load_3d(dst + k4 * KVA_MLA5_KBLK, &a.kv_map4, 0, slot, k4, bar0 + 8 * k4);
#pragma unroll
    for (int k = k4 + 1; k < k4 + 4; k++) kva_mbar_arrive_cnt(bar0 + 8 * k, KVA_MLA_THREADS / 2);
    if (!wg) { /* the rope columns */
      kva_mbar_arrive_expect_tx(bar0 + 8 * 8, (uint32_t)KVA_MLA5_KBLK);
      kva_mbar_arrive_cnt(bar0 + 8 * 8, KVA_MLA_THREADS / 2 - 1);
      kva_tma_load_3d(dst + 8 * KVA_MLA5_KBLK, &a.kv_map, 64 * 8, 0, slot, bar0 + 8 * 8);
    }
  }
}

/* Column block k of this thread's 4 rows by cp.async (d: the stage plus
 * this thread's offset in a column block), then its noinc arrival. */
static __device__ __forceinline__ void mla5_cp_col(uint32_t d, uint32_t bar0,
                                                   const unsigned char *const src[4],
                                                   const int bytes[4], int k) {
  static_assert(KVA_MLA5_KBLK == KVA_MLA5_BN * 128, "a column block is 64 rows of 128 bytes");
#pragma unroll
  for (int p = 0; p < 4; p++)
    kva_cp_async_16(d + k * KVA_MLA5_KBLK + p * 16 * 128, src[p] + k * 128, bytes[p]);
  kva_cp_async_mbar_arrive_noinc(bar0 + 8 * k);
}

/* This warpgroup's column blocks (wg 0: 0..3 and 8; wg 1: 4..7) of the
 * 64-key block whose rows are at slot[] into the stage at dst (slot -1:
 * zero-filled, so masked P V stays finite), each followed by this thread's
 * noinc arrival on that column block's mbarrier (bar0 + 8 k). */
template <int TMA>
static __device__ __forceinline__ void mla5_copy(uint32_t dst, uint32_t bar0,
                                                 const unsigned char *kv, const int slot[4], int wg,
                                                 int tw, int kt, int k1, const kva_mla_args &a) {
  static_assert(KVA_MLA5_BN == 64, "4 rows per thread");
  if (mla5_tma_block<TMA>(a, kt, k1)) {
    mla5_copy_tma<TMA>(dst, bar0, slot[0], wg, tw, a);
    return;
  }
  const unsigned char *src[4];
  int bytes[4];
#pragma unroll
  for (int p = 0; p < 4; p++) {
    src[p] = kv + (slot[p] >= 0 ? (int64_t)slot[p] * KVA_MLA_D * 2 : 0) + (tw & 7) * 16;
    bytes[p] = slot[p] >= 0 ? 16 : 0;
  }
  /* as the TMA half, the column blocks as constants; row tw / 8 + 16 p,
   * 16-byte column tw % 8 of block k is at mla_sw(tw / 8, tw % 8) + 8 KB k
   * + 2 KB p (16 p keeps the row's swizzle phase) */
  const uint32_t d = dst + mla_sw<KVA_MLA5_BN>(tw >> 3, tw & 7);
  if (wg) {
#pragma unroll
    for (int k = 4; k < 8; k++) mla5_cp_col(d, bar0, src, bytes, k);
  } else {
#pragma unroll
    for (int k = 0; k < 4; k++) mla5_cp_col(d, bar0, src, bytes, k);
    mla5_cp_col(d, bar0, src, bytes, 8);
  }
}

template <int TMA>
static __device__ __forceinline__ void mla5_load(uint32_t dst, uint32_t bar0,
                                                 const unsigned char *kv, const int32_t *pt,
                                                 int kt, int k1, const kva_mla_args &a, int wg,
                                                 int tw) {
  int slot[4];
  mla5_rows<TMA>(slot, pt, kt, k1, a, tw);
  mla5_copy<TMA>(dst, bar0, kv, slot, wg, tw, kt, k1, a);
}

/* O[:, 256 wg ..] += P V, P from registers; committed, not waited for.
 * One m64n256k16 per 16 keys (the V column blocks 4 wg .. 4 wg + 3 are one
 * MN-major operand, 8 KB apart). */
template <int QT>
static __device__ __forceinline__ void mla5_pv_rs(float o[2][64], uint32_t pk[8][2], uint32_t s_k,
                                                  int wg) {
  mla_fence_o(o);
#pragma unroll
  for (int j = 0; j < 8; j++) {
    kva_reg_fence_u32(&pk[j][0]);
    kva_reg_fence_u32(&pk[j][1]);
  }
  kva_wgmma_fence();
  const uint64_t dv = mla_desc(s_k + 4 * wg * KVA_MLA5_KBLK, KVA_MLA5_KBLK, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    const uint32_t pa[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
    mla5_mma_pv_rs<QT>(o, pa, dv + ((kk * 16 * 128) >> 4));
  }
  kva_wgmma_commit();
}

/* O[:, 256 wg ..] += P V, P from smem at s_p; committed, not waited for. */
template <int QT, int CHAIN = 0>
static __device__ __forceinline__ void mla5_pv_ss(float o[2][64], uint32_t s_p, uint32_t s_k,
                                                  int wg) {
  if (!CHAIN) mla_fence_o(o); /* CHAIN: right after another P V on o, still in flight */
  kva_wgmma_fence();
  const uint64_t dp = mla_desc(s_p, 16, 1024);
  const uint64_t dv = mla_desc(s_k + 4 * wg * KVA_MLA5_KBLK, KVA_MLA5_KBLK, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
    mla5_mma_pv_ss<QT>(o, dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4));
  kva_wgmma_commit();
}


#define KVA_MLA5_BAR_C0 1
#define KVA_MLA5_BAR_C1 2
#define KVA_MLA5_BAR_P0 3
#define KVA_MLA5_BAR_P1 4
#define KVA_MLA5_BAR_SP 5
#define KVA_MLA5_BAR_WG 6 /* + wg */

/* S's accumulators zeroed and fenced, ahead of a block's k-steps. */
static __device__ __forceinline__ void mla5_s_begin(float s[32]) {
#pragma unroll
  for (int i = 0; i < 32; i++) {
    s[i] = 0.0f;
    kva_reg_fence_f32(&s[i]);
  }
  kva_wgmma_fence();
}

/* S's k-steps over column block k once it landed (first: the block that
 * starts the sum). fence 0: the block came by TMA (the async proxy wrote
 * it; v6 skips the fence then, v5 always fences). WAIT false: the caller
 * waited for the whole block (v6's fp8 latents, converted in place). */
template <int QT, bool WAIT = true>
static __device__ __forceinline__ void mla5_s_cols(float s[32], uint32_t s_q, uint32_t s_k,
                                                   uint32_t bar0, uint32_t parity, int k,
                                                   int first, unsigned *mla5_tr, int fence = 1) {
  const uint64_t dq = mla_desc(s_q, 16, 1024), dk = mla_desc(s_k, 16, 1024);
  MLA5_CLK(tw0);
  if (WAIT) kva_mbar_wait(bar0 + 8 * k, parity);
  MLA5_CLK(tw1);
  MLA5_ACC(1, tw1 - tw0);
  if (fence) kva_fence_proxy_async_smem(); /* cp.async data -> wgmma */
#pragma unroll
  for (int t = 0; t < 4; t++) {
    const uint32_t qo = (uint32_t)(k * KVA_MLA_QBLK + t * 32);
    const uint32_t ko = (uint32_t)(k * KVA_MLA5_KBLK + t * 32);
    mla5_mma_s<QT>(s, dq + (qo >> 4), dk + (ko >> 4), !first || t > 0);
  }
}

/* This thread's rows' factor and max out (one thread per row) / in. */
static __device__ __forceinline__ void mla5_put(float *sc, float *sm, const float c[2],
                                                const float m[2], int wq, int g, int tq) {
  if (tq == 0)
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      sc[16 * wq + g + 8 * hf] = c[hf];
      sm[16 * wq + g + 8 * hf] = m[hf];
    }
}
static __device__ __forceinline__ void mla5_get(float c[2], float m[2], const float *sc,
                                                const float *sm, int wq, int g) {
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    c[hf] = sc[16 * wq + g + 8 * hf];
    m[hf] = sm[16 * wq + g + 8 * hf];
  }
}

/* P ([64 rows][128 B], the A operand of an ss wgmma) to smem. */
static __device__ __forceinline__ void mla5_store_p(unsigned char *p_dst, const uint32_t pk[8][2],
                                                    int wq, int g, int tq) {
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int r = 16 * wq + g + 8 * hf;
#pragma unroll
    for (int j = 0; j < 8; j++)
      *(uint32_t *)(p_dst + r * 128 + ((j ^ (r & 7)) << 4) + 4 * tq) = pk[j][hf];
  }
  kva_fence_proxy_async_smem(); /* generic stores -> the other warpgroup's wgmma */
}

/* The chunk of request wi of a worker's range for row tile row0; 0 when
 * the CTA has nothing to do there. v5; every warpgroup of v6 walks the same. */
typedef struct mla5_chunk {
  int r, nsplit, nt, rows, cached, split, k0, k1, nblk, tok0;
  const int32_t *pt;
} mla5_chunk;
static __device__ __forceinline__ int mla5_chunk_at(const kva_mla_args &a,
                                                    const kva_split_work &wk, int wi, int row0,
                                                    mla5_chunk *c) {
  const int r = a.sched_order[wi];
  c->nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
  if (c->nsplit == 0) return 0;
  c->nt = a.num_new[r];
  c->rows = c->nt * a.hq;
  if (row0 >= c->rows) return 0;
  const int kv_len = a.cache_seqlens[r];
  c->r = r;
  c->cached = kv_len - c->nt;
  const kva_split_chunk ch = kva_split_chunk_at(wk, wi, kv_len);
  c->split = ch.split;
  c->k0 = ch.k0;
  c->k1 = ch.k1;
  c->nblk = ch.k1 > ch.k0 ? (ch.k1 - ch.k0 + KVA_MLA5_BN - 1) / KVA_MLA5_BN : 0;
  c->tok0 = a.cu_q[r];
  c->pt = a.page_table + (size_t)r * a.hdr->page_table_stride;
  return 1;
}

/* One thread's CTA setup (v5, v6): the mbarriers at s_bar, Q's first
 * (KVA_MLA_THREADS arrivals) and nbars - 1 of a warpgroup's 128 (of
 * KVA_MLA_THREADS where bit i of wide is set), and the TMA builds' tensor
 * maps prefetched. */
template <int TMA>
static __device__ __forceinline__ void mla5_init(uint32_t s_bar, int nbars, const kva_mla_args &a,
                                                 uint32_t wide = 0) {
  kva_mbar_init(s_bar, KVA_MLA_THREADS);
#pragma unroll
  for (int i = 1; i < nbars; i++)
    kva_mbar_init(s_bar + 8 * i, (wide >> i) & 1u ? KVA_MLA_THREADS : KVA_MLA_THREADS / 2);
  if (TMA && a.kv_tma) {
    kva_tma_prefetch_map(&a.kv_map);
    if (TMA == 4) kva_tma_prefetch_map(&a.kv_map4);
  }
}

template <int QT, int TMA>
__global__ void __launch_bounds__(KVA_MLA_THREADS, 1)
    kva_mla_kernel_v5(const __grid_constant__ kva_mla_args a) {
  constexpr int TILE = KVA_MLA5_TILE, BN = KVA_MLA5_BN, KB = KVA_MLA5_KBLK;
  static_assert(KVA_MLA5_SMEM <= 232448, "227 KB of smem per CTA");
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_q = smem + (s_q - s_raw);
  const uint32_t s_st0 = s_q + KVA_MLA_QTILE, s_st1 = s_st0 + TILE;
  const uint32_t s_p1 = s_st1 + 8 * KB; /* P1 over stage 1's rope columns */
  unsigned char *const p_p1 = p_q + KVA_MLA_QTILE + TILE + 8 * KB;
  const uint32_t s_p0 = s_st1 + TILE;
  unsigned char *const p_p0 = p_q + KVA_MLA_QTILE + 2 * TILE;
  float *const sc0 = (float *)(p_p0 + KVA_MLA5_P); /* [64] factor c0 */
  float *const sm0 = sc0 + KVA_MLA_BM;             /* [64] max m0 */
  float *const sc1 = sm0 + KVA_MLA_BM;             /* [64] factor c1 */
  float *const sm1 = sc1 + KVA_MLA_BM;             /* [64] max m1 */
  float *const sl = sm1 + KVA_MLA_BM;              /* [2][64] row sums */
  /* mbarriers: Q, then stage s column block k at 8 (1 + 9 s + k) */
  const uint32_t s_bar = s_p0 + KVA_MLA5_P + KVA_MLA5_STATS;
  volatile int *const flag = (volatile int *)(p_p0 + KVA_MLA5_P + KVA_MLA5_STATS + 152);
  const uint32_t bar_st0 = s_bar + 8, bar_st1 = s_bar + 8 * 10;
#ifdef KVA_MLA_TRACE
  unsigned *const mla5_tr = (unsigned *)(p_p0 + KVA_MLA5_P + KVA_MLA5_STATS + 160);
#endif

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = mla_uni(warp >> 2), wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const int tw = tid & 127;
  const kva_plan_header *hdr = a.hdr;
#ifdef KVA_MLA_TRACE
  const unsigned long long tr_entry = kva_globaltimer();
  MLA5_CLK(tr_c0);
  if (tw == 0)
    for (int i = 0; i < 12; i++) mla5_tr[wg * 12 + i] = 0;
#endif
  kva_griddep_launch_dependents();
  MLA5_STAMP(0, kva_globaltimer());
  if ((int)blockIdx.x >= hdr->num_workers) {
    MLA5_STAMP(8, kva_globaltimer());
    MLA5_STAMP(9, kva_smid());
    return;
  }
  const int row0 = (int)blockIdx.y * KVA_MLA_BM;
  if (row0 >= hdr->max_q_len * a.hq) return;
  const kva_split_work wk = a.sched[blockIdx.x];
  const unsigned char *const kvg = (const unsigned char *)a.kv;
  if (tid == 0) mla5_init<TMA>(s_bar, 19, a);
  __syncthreads(); /* the inits are seen by every thread */

  /* fills of each stage and Q loads so far (mbarrier phases), CTA-uniform */
  int f0 = 0, f1 = 0, nq = 0;
  unsigned trace_chunks = 0, trace_merges = 0;
  for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
    mla5_chunk c; /* positions in the schedule's order */
    if (!mla5_chunk_at(a, wk, wi, row0, &c)) continue;
    const int r = c.r, nsplit = c.nsplit, nt = c.nt, rows = c.rows, cached = c.cached;
    const int split = c.split, k0 = c.k0, k1 = c.k1, nblk = c.nblk, tok0 = c.tok0;
    const int npairs = (nblk + 1) >> 1;
    const int32_t *const pt = c.pt;

    kva_griddep_wait();
    if (trace_chunks == 0) MLA5_STAMP(1, kva_globaltimer());
    int pos[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) pos[hf] = cached + (row0 + 16 * wq + g + 8 * hf) / a.hq;
    float o[2][64], m[2], l[2], s[32];
#pragma unroll
    for (int i = 0; i < 64; i++) o[0][i] = o[1][i] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;

    if (nblk > 0) {
      /* Q (all threads), blocks 0 and 1 (each warpgroup its columns); each
       * warpgroup's first S */
      mla_issue_q(s_q, a, tok0, row0, rows, tid);
      kva_cp_async_mbar_arrive_noinc(s_bar);
      mla5_load<TMA>(s_st0, bar_st0, kvg, pt, k0, k1, a, wg, tw);
      if (nblk > 1) mla5_load<TMA>(s_st1, bar_st1, kvg, pt, k0 + BN, k1, a, wg, tw);
      kva_mbar_wait(s_bar, (uint32_t)(nq & 1)); /* Q */
      if (wg == 0 || nblk > 1) {
        const uint32_t st = wg ? s_st1 : s_st0, bar = wg ? bar_st1 : bar_st0;
        const uint32_t par = (uint32_t)((wg ? f1 : f0) & 1);
        mla5_s_begin(s);
#pragma unroll
        for (int k = 0; k < 9; k++) mla5_s_cols<QT>(s, s_q, st, bar, par, k, k == 0, MLA5_TR);
        kva_wgmma_commit();
        kva_wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 32; j++) kva_reg_fence_f32(&s[j]);
        /* every warp's S1 is over before P1 goes over its rope columns */
        if (wg == 1) kva_bar_sync(KVA_MLA5_BAR_WG + 1, KVA_MLA_THREADS / 2);
      }
    }

    MLA5_CLK(tl0);
    for (int i = 0; i < npairs; i++) {
      const int kt0 = k0 + 2 * i * BN, kt1 = kt0 + BN;
      const bool has1 = 2 * i + 1 < nblk, more = 2 * i + 2 < nblk, more1 = 2 * i + 3 < nblk;
      /* parities of the next blocks' fills of each stage */
      const uint32_t par0 = (uint32_t)((f0 + i + 1) & 1), par1 = (uint32_t)((f1 + i + 1) & 1);
      float c[2];
      uint32_t pk[8][2];
      int nx0[4], nx1[4]; /* rows of the blocks this pair loads: 2i+2, 2i+3 */
      mla5_rows<TMA>(nx0, pt, kt0 + 2 * BN, more ? k1 : 0, a, tw);
      mla5_rows<TMA>(nx1, pt, kt1 + 2 * BN, more1 ? k1 : 0, a, tw);
      if (wg == 0) {
        MLA5_CLK(ta0);
        /* m = m0 */
        mla_softmax_tile<QT, 8, true>(s, m, l, c, pk, kt0, k1, cached, pos, a, a.qk_mul, tq);
        mla5_put(sc0, sm0, c, m, wq, g, tq);
        mla5_signal(KVA_MLA5_BAR_C0);
        if (__any_sync(0xffffffffu, c[0] != 1.0f || c[1] != 1.0f)) mla_scale_o(o, c);
        mla5_pv_rs<QT>(o, pk, s_st0, 0); /* P0 V0_L */
        MLA5_CLK(ta1);
        MLA5_ACC(3, ta1 - ta0);
        kva_wgmma_wait<0>();
        mla_fence_o(o);
        kva_bar_sync(KVA_MLA5_BAR_WG, KVA_MLA_THREADS / 2); /* S0, P0 V0_L over */
        MLA5_CLK(ta2);
        MLA5_ACC(5, ta2 - ta1);
        if (more) mla5_copy<TMA>(s_st0, bar_st0, kvg, nx0, 0, tw, kt0 + 2 * BN, k1, a);
        MLA5_CLK(ta3);
        MLA5_ACC(8, ta3 - ta2);
        float c1[2] = {1.0f, 1.0f};
        if (has1) {
          kva_bar_sync(KVA_MLA5_BAR_C1, KVA_MLA_THREADS); /* c1, m1 */
          mla5_get(c1, m, sc1, sm1, wq, g);
        }
        if (i > 0) kva_bar_sync(KVA_MLA5_BAR_SP, KVA_MLA_THREADS); /* WG1 is done with P0 */
        MLA5_CLK(ta4);
        MLA5_ACC(4, ta4 - ta3);
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
          for (int j = 0; j < 8; j++)
            pk[j][hf] = mla_pack<QT>(s[4 * j + 2 * hf] * c1[hf], s[4 * j + 2 * hf + 1] * c1[hf]);
        mla5_store_p(p_p0, pk, wq, g, tq);
        mla5_signal(KVA_MLA5_BAR_P0);
        MLA5_CLK(ta5);
        MLA5_ACC(3, ta5 - ta4);
        if (has1) {
#pragma unroll
          for (int hf = 0; hf < 2; hf++) l[hf] *= c1[hf];
          if (__any_sync(0xffffffffu, c1[0] != 1.0f || c1[1] != 1.0f)) mla_scale_o(o, c1);
          MLA5_CLK(ta6);
          kva_bar_sync(KVA_MLA5_BAR_P1, KVA_MLA_THREADS); /* P1; P0 V0_R issued */
          MLA5_CLK(ta7);
          MLA5_ACC(4, ta7 - ta6);
          /* V1_L was waited for by warpgroup 1 (S1), not here: this
           * warp's own proxy fence, after the barrier, covers it */
          kva_fence_proxy_async_smem();
          mla5_pv_ss<QT>(o, s_p1, s_st1, 0); /* P1 V1_L */
          if (more) {
            mla5_s_begin(s);
            mla5_s_cols<QT>(s, s_q, s_st0, bar_st0, par0, 0, 1, MLA5_TR);
            mla5_s_cols<QT>(s, s_q, s_st0, bar_st0, par0, 1, 0, MLA5_TR);
            mla5_s_cols<QT>(s, s_q, s_st0, bar_st0, par0, 2, 0, MLA5_TR);
            mla5_s_cols<QT>(s, s_q, s_st0, bar_st0, par0, 3, 0, MLA5_TR);
            mla5_s_cols<QT>(s, s_q, s_st0, bar_st0, par0, 8, 0, MLA5_TR);
            kva_wgmma_commit();
            MLA5_CLK(ta8);
            kva_wgmma_wait<1>(); /* P1 V1_L */
            mla_fence_o(o);
            kva_bar_sync(KVA_MLA5_BAR_WG, KVA_MLA_THREADS / 2); /* P1 V1_L over */
            MLA5_CLK(ta9);
            MLA5_ACC(5, ta9 - ta8);
            if (more1) mla5_copy<TMA>(s_st1, bar_st1, kvg, nx1, 0, tw, kt1 + 2 * BN, k1, a);
            MLA5_CLK(ta10);
            MLA5_ACC(8, ta10 - ta9);
            kva_wgmma_fence();
#pragma unroll
            for (int k = 4; k < 8; k++) mla5_s_cols<QT>(s, s_q, s_st0, bar_st0, par0, k, 0, MLA5_TR);
            kva_wgmma_commit();
            MLA5_CLK(ta11);
            kva_wgmma_wait<0>();
#pragma unroll
            for (int j = 0; j < 32; j++) kva_reg_fence_f32(&s[j]);
            MLA5_CLK(ta12);
            MLA5_ACC(2, ta12 - ta11);
          } else {
            kva_wgmma_wait<0>();
            mla_fence_o(o);
          }
        }
      } else if (has1) {
        float c0[2];
        MLA5_CLK(tb0);
        kva_bar_sync(KVA_MLA5_BAR_C0, KVA_MLA_THREADS); /* c0, m0 */
        MLA5_CLK(tb1);
        MLA5_ACC(4, tb1 - tb0);
        mla5_get(c0, m, sc0, sm0, wq, g);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) l[hf] *= c0[hf];
        /* c = c1, m = m1 */
        mla_softmax_tile<QT, 8, true>(s, m, l, c, pk, kt1, k1, cached, pos, a, a.qk_mul, tq);
        mla5_put(sc1, sm1, c, m, wq, g, tq);
        mla5_signal(KVA_MLA5_BAR_C1);
        mla5_store_p(p_p1, pk, wq, g, tq);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) c[hf] *= c0[hf];
        if (__any_sync(0xffffffffu, c[0] != 1.0f || c[1] != 1.0f)) mla_scale_o(o, c);
        mla5_pv_rs<QT>(o, pk, s_st1, 1); /* P1 V1_R */
        MLA5_CLK(tb2);
        MLA5_ACC(3, tb2 - tb1);
        kva_bar_sync(KVA_MLA5_BAR_P0, KVA_MLA_THREADS); /* P0 c1 */
        MLA5_CLK(tb3);
        MLA5_ACC(4, tb3 - tb2);
        kva_fence_proxy_async_smem(); /* V0_R landed for warpgroup 0's S0 */
        mla5_pv_ss<QT, 1>(o, s_p0, s_st0, 1); /* P0 V0_R */
        mla5_signal(KVA_MLA5_BAR_P1);
        kva_wgmma_wait<1>(); /* P1 V1_R */
        kva_bar_sync(KVA_MLA5_BAR_WG + 1, KVA_MLA_THREADS / 2); /* P1 V1_R over */
        MLA5_CLK(tb4);
        MLA5_ACC(5, tb4 - tb3);
        if (more1) mla5_copy<TMA>(s_st1, bar_st1, kvg, nx1, 1, tw, kt1 + 2 * BN, k1, a);
        MLA5_CLK(tb5);
        MLA5_ACC(8, tb5 - tb4);
        kva_wgmma_wait<0>(); /* P0 V0_R */
        mla_fence_o(o);
        kva_bar_sync(KVA_MLA5_BAR_WG + 1, KVA_MLA_THREADS / 2); /* P0 V0_R over */
        MLA5_CLK(tb6);
        MLA5_ACC(5, tb6 - tb5);
        if (more) {
          mla5_copy<TMA>(s_st0, bar_st0, kvg, nx0, 1, tw, kt0 + 2 * BN, k1, a);
          mla5_signal(KVA_MLA5_BAR_SP);
        }
        MLA5_CLK(tb7);
        MLA5_ACC(8, tb7 - tb6);
        if (more1) {
          mla5_s_begin(s);
#pragma unroll
          for (int kk = 0; kk < 9; kk++) {
            const int k = kk < 4 ? 4 + kk : kk < 8 ? kk - 4 : 8; /* its own refill first */
            mla5_s_cols<QT>(s, s_q, s_st1, bar_st1, par1, k, kk == 0, MLA5_TR);
          }
          kva_wgmma_commit();
          MLA5_CLK(tb8);
          kva_wgmma_wait<0>();
#pragma unroll
          for (int j = 0; j < 32; j++) kva_reg_fence_f32(&s[j]);
          /* every warp's S1 is over before the next P1 goes over it */
          kva_bar_sync(KVA_MLA5_BAR_WG + 1, KVA_MLA_THREADS / 2);
          MLA5_CLK(tb9);
          MLA5_ACC(2, tb9 - tb8);
        }
      } else { /* the chunk's last block is a pair's first: O_R += P0 V0_R */
        float c0[2];
        kva_bar_sync(KVA_MLA5_BAR_C0, KVA_MLA_THREADS);
        mla5_get(c0, m, sc0, sm0, wq, g);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) l[hf] *= c0[hf];
        if (__any_sync(0xffffffffu, c0[0] != 1.0f || c0[1] != 1.0f)) mla_scale_o(o, c0);
        kva_bar_sync(KVA_MLA5_BAR_P0, KVA_MLA_THREADS);
        kva_fence_proxy_async_smem();
        mla5_pv_ss<QT>(o, s_p0, s_st0, 1);
        kva_wgmma_wait<0>();
        mla_fence_o(o);
      }
    }
    trace_chunks++;
    MLA5_STAMP(3, kva_globaltimer());
    MLA5_CLK(tl1);
    MLA5_ACC(10, tl1 - tl0);
    MLA5_ACC(7, npairs);
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
    /* The stages are free until the next request's loads. No merge before
     * the write (known_last 0): at 254 registers (P V at N = 128) its
     * first version made ptxas spill; v2 runs the memory-bound rows where
     * it counts. */
    trace_merges += mla_finish_chunk<QT, MLA5_STAMPS>(a, o, lt, m, r, split, nsplit, 0, nt,
                                                      tok0, row0, rows, tid, wg, wq, g, tq, flag,
                                                      (float *)(p_q + KVA_MLA_QTILE),
                                                      (size_t)(2 * TILE));
    /* the merge's scratch in the stages (generic writes) before the next
     * request's TMA writes there */
    if (TMA && a.kv_tma) kva_fence_proxy_async_smem();
    __syncthreads(); /* row sums, flag read; stages free for the next request */
    MLA5_CLK(tl2);
    MLA5_ACC(11, tl2 - tl1);
  }
#ifdef KVA_MLA_TRACE
  if (tw == 0 && a.trace) {
    unsigned long long *w =
        a.trace + ((size_t)wg * gridDim.x * gridDim.y + blockIdx.y * gridDim.x + blockIdx.x) *
                      KVA_TRACE_WORDS;
    for (int i = 1; i < 12; i++) w[i] = mla5_tr[wg * 12 + i];
    w[0] = tr_entry;
    w[6] = kva_globaltimer();
    MLA5_CLK(tr_c1);
    w[9] = tr_c1 - tr_c0;
  }
#endif
  MLA5_STAMP(8, kva_globaltimer());
  MLA5_STAMP(9, kva_smid());
  MLA5_STAMP(10, trace_chunks);
  MLA5_STAMP(11, trace_merges);
}

#endif /* KVA_CUDA_MLA_KERNEL_V5_CUH */
