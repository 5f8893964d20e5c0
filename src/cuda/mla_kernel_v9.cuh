/* MLA decode v9: v6's roles (one warpgroup makes S and P, two own O) on
 * three 72 KB stages instead of two; fp8 latents (KV8 1) on two, with
 * their bytes in the third's smem and converted by the O warpgroups
 * (mla9_fp8.cuh), or (KV8 2, KVA_MLA9_F8IP=1) on three, their bytes
 * copied into each stage's upper halves and converted there by the O
 * warpgroups under P V (mla9_f8ip.cuh). v5's grid,
 * arguments, split walk, 64-key blocks and loads (mla5_rows / mla5_copy:
 * TMA or cp.async), partial rows, in-kernel merge, causal mask, LSE and
 * PDL; 384 threads.
 *
 * The third stage comes from Q: its 512 latent columns live in warpgroup
 * 0's registers (the A operand of 32 rs k-steps, 128 registers a thread,
 * loaded from global at each chunk's start by warpgroup 0 itself), and
 * only its 64 rope columns stay in smem (8 KB: 4 ss k-steps).
 *
 * Registers: setmaxnreg moves registers between a CTA's warpgroups and
 * never adds, so the three keep the launch's 3 x 168. Warpgroup 0 needs
 * ~188 (Q, S and its state) and an O warpgroup ~160 with 128
 * accumulators: ptxas then serializes every wgmma (C7512, "insufficient
 * register resources"; measured 30% slower). So each O warpgroup's P V
 * is N = 248 (124 accumulators, 152 registers) and warpgroup 0 (200)
 * keeps the 8 columns left over of each half (columns 248..255 and
 * 504..511, two N = 8 P V's per block on P and V from smem), handing
 * them to the O warpgroups over the rope tile at the chunk's end.
 *
 * Per 64-key block j in stage j % 3: warpgroup 0 waits for the block's
 * column blocks, issues S = Q K^T, arrives on the stage's `issued`
 * mbarrier, then runs the online softmax, puts P over the stage's rope
 * columns and the rows' factors c in smem, and arrives on `ready`. The O
 * warpgroups wait `ready` of block j and (KVA_MLA9_ORDER) `issued` of
 * block j + 1, so that S(j + 1) is ahead of P V(j) on the tensor cores
 * and the softmax of j + 1 runs under P V(j); then O *= c, O += P V,
 * wait, a barrier of the two, and the refill of the stage with block
 * j + 3. With two stages (v6) that order delayed each refill by an S and
 * measured 4-16% slower; with three a refill has two blocks' time.
 *
 * The rows' m and l live in smem (sm, sl) through the chunk. A chunk's
 * end: warpgroup 0 puts its slivers over the rope tile and arrives on
 * stats_full; the O warpgroups take l, m and their 4 sliver accumulators,
 * arrive on stats_empty and run mla_finish_chunk on their named barrier.
 * mbarrier sliver_done (per stage) keeps a refill of column blocks 3 and 7
 * behind warpgroup 0's sliver P V on them. The head of a two-chunk request
 * (the end of its worker in the packed walk) waits up to merge_wait_ns for
 * the rest to count and merges its rows before the write
 * (mla_merge_known_last; H100, 2026-11-27: the merge from global memory
 * had ended the varlen steps, 17 us), folded into O's stores (mla_fold:
 * folded in place at 152 registers it spilled; its fold and write took
 * 8-15 us, now 5.7-7.8).
 *
 * Chunk to chunk (twenty-ninth session): the stages rotate across chunks,
 * and the stages that a chunk's last three blocks free are refilled in the
 * key loop with the next chunk's first three (from four blocks, not in a
 * head of two, whose merge needs the stages; the end then takes the count
 * path when it merges). Warpgroup 0 finds the next chunk at each chunk's
 * start, under its Q loads, and leaves it in smem (mla9_find_next): the O
 * warpgroups read its blocks there, and both sides take it as their next
 * chunk, so no chain of global loads sits at a chunk's end. Warpgroup 0
 * loads the next Q into registers before it waits for the O warpgroups to
 * take the stats (only the rope tile and m, l wait for that). H100: a
 * chunk to chunk switch went from 17.6 to 9.2 us (the old end spent 7.5
 * us issuing the next chunk's first three blocks, 5.9 even with their
 * slots found beforehand).
 *
 * H100 (twenty-sixth session, docs/performance.md): +4.9 to +17% over v6
 * on 10 of FlashMLA's 12 compute-bound rows, 3-6% slower on the two
 * 128-row varlen rows at sk 4096; those +7.4% with the merge before the
 * write and v9's chunk cost (twenty-eighth session); the chunk to chunk
 * switch above +2.3 to +3.5% on the 128-row rows at sk 4096 (twenty-ninth
 * session). */
#ifndef KVA_CUDA_MLA_KERNEL_V9_CUH
#define KVA_CUDA_MLA_KERNEL_V9_CUH

#include "cuda/mla_kernel_v6.cuh"
#include "cuda/mla9_fp8.cuh"
#include "cuda/mla9_f8ip.cuh"

/* warpgroup 0 / each O warpgroup (see the header): 200 + 2 x 152 = 3 x 168 */
#ifndef KVA_MLA9_S_REGS
#define KVA_MLA9_S_REGS 200
#endif
#ifndef KVA_MLA9_O_REGS
#define KVA_MLA9_O_REGS 152
#endif
static_assert(KVA_MLA9_S_REGS + 2 * KVA_MLA9_O_REGS <= 3 * 168, "setmaxnreg: zero-sum per CTA");
#ifndef KVA_MLA9_ORDER
#define KVA_MLA9_ORDER 1
#endif

#if defined(KVA_MLA9_TIMELINE) && !defined(KVA_MLA_TRACE)
/* The decode timeline's stamps (trace.h) as v6's, by the first O thread,
 * in a build with -DKVA_MLA9_TIMELINE only (scripts/stage_device.sh
 * mla9timeline), so that the default kernel stays the measured one; word 2
 * (v2's first tile) counts the merges before the write. */
#define MLA9_STAMPS true
#define MLA9_STAMP(w, value) KVA_TRACE_STAMP_BY(threadIdx.x == KVA_MLA_THREADS / 2, w, value)
#elif defined(KVA_MLA9_PHASES) && !defined(KVA_MLA_TRACE)
/* A probe build (-DKVA_MLA9_PHASES; scripts/stage_device.sh mla9phases,
 * scripts/mla9_phases.py): a CTA's first chunk end in detail. Words 1, 8
 * and 9 as in the timeline; by the first O thread, in chunk 0: 2 the first
 * P V issued, 3 the key loop's end, 4 the stats read, 5 the merge check
 * done, 6 O (or the partial rows) written, 7 fenced, and word 0 chunk 1's
 * first P V; by thread 0: 10 chunk 1's S(0) issued, 11 chunk 1's Q in
 * registers. */
#define MLA9_STAMPS false
#define MLA9_STAMP(w, value)                                                 \
  do {                                                                       \
    if ((w) == 1 || (w) == 8 || (w) == 9)                                   \
      KVA_TRACE_STAMP_BY(threadIdx.x == KVA_MLA_THREADS / 2, w, value);      \
  } while (0)
#define MLA9_PHASE(k, w, value)                                              \
  do {                                                                       \
    if ((k) == 0 || ((k) == 1 && (w) == 2))                                  \
      KVA_TRACE_STAMP_BY(threadIdx.x == KVA_MLA_THREADS / 2, (k) ? 0 : (w), value); \
  } while (0)
#define MLA9_PHASE_S(k, w, value)                                  \
  do {                                                             \
    if ((k) == 1) KVA_TRACE_STAMP_BY(threadIdx.x == 0, w, value); \
  } while (0)
#else
#define MLA9_STAMPS false
#define MLA9_STAMP(w, value) \
  do {                       \
  } while (0)
#endif
#ifndef MLA9_PHASE
#define MLA9_PHASE(k, w, value) \
  do {                          \
  } while (0)
#define MLA9_PHASE_S(k, w, value) \
  do {                            \
  } while (0)
#endif

template <int QT>
static __device__ __forceinline__ void mla9_mma_s_rs(float d[32], const uint32_t a[4], uint64_t db,
                                                     int acc) {
  if (QT == KVA_F16)
    kva_wgmma_m64n64k16_rs_f16(d, a, db, acc);
  else
    kva_wgmma_m64n64k16_rs_bf16(d, a, db, acc);
}

/* Q's 512 latent columns of this thread's rows (16 wq + g, + 8) in the
 * wgmma A-fragment layout: q[kk] holds columns 16 kk + 2 tq (+1) and
 * 16 kk + 8 + 2 tq (+1) of both rows; zero past `rows`. */
static __device__ __forceinline__ void mla9_load_q(uint32_t q[32][4], const kva_mla_args &a,
                                                   int tok0, int row0, int rows, int wq, int g,
                                                   int tq) {
  const uint32_t *qg = (const uint32_t *)a.q;
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int grow = row0 + 16 * wq + g + 8 * hf;
    const bool ok = grow < rows;
    const uint32_t *src = qg + ((int64_t)tok0 * a.hq + (ok ? grow : 0)) * (KVA_MLA_D / 2) + tq;
#pragma unroll
    for (int kk = 0; kk < 32; kk++) {
      q[kk][hf] = ok ? __ldg(src + 8 * kk) : 0u;
      q[kk][2 + hf] = ok ? __ldg(src + 8 * kk + 4) : 0u;
    }
  }
}

/* cp.async of Q's rope columns (512..575) of rows row0 .. row0 + 63 into
 * the [64][128 B] swizzled tile at dst (zero past `rows`); 128 threads. */
static __device__ __forceinline__ void mla9_issue_rope(uint32_t dst, const kva_mla_args &a,
                                                       int tok0, int row0, int rows, int tw) {
  const unsigned char *qg = (const unsigned char *)a.q;
  const int c = tw & 7;
#pragma unroll
  for (int p = 0; p < 4; p++) {
    const int row = (tw >> 3) + 16 * p, grow = row0 + row, ok = grow < rows;
    const unsigned char *src =
        ok ? qg + ((int64_t)tok0 * a.hq + grow) * (KVA_MLA_D * 2) + 1024 + 16 * c : qg;
    kva_cp_async_16(dst + mla_sw<KVA_MLA_BM>(row, c), src, ok ? 16 : 0);
  }
}

/* S = Q K^T of the block in the stage at st (column block k on mbarrier
 * bar + 8 k): 32 rs k-steps on the latent columns, each column block as
 * soon as it landed, then 4 ss k-steps on the rope columns; committed,
 * not waited for. fence: a cp.async block (generic-proxy writes). */
template <int QT>
static __device__ __forceinline__ void mla9_s(float s[32], const uint32_t q[32][4], uint32_t s_rope,
                                              uint32_t st, uint32_t bar, uint32_t par, int fence) {
  mla5_s_begin(s);
  const uint64_t dk = mla_desc(st, 16, 1024);
#pragma unroll
  for (int k = 0; k < 8; k++) {
    kva_mbar_wait(bar + 8 * k, par);
    if (fence) kva_fence_proxy_async_smem();
#pragma unroll
    for (int t = 0; t < 4; t++)
      mla9_mma_s_rs<QT>(s, q[4 * k + t], dk + ((uint32_t)(k * KVA_MLA5_KBLK + t * 32) >> 4),
                        k > 0 || t > 0);
  }
  kva_mbar_wait(bar + 64, par);
  if (fence) kva_fence_proxy_async_smem();
  /* the rope tile's address through an opaque move, so ptxas does not keep
   * four loop-invariant descriptors in registers */
  asm volatile("" : "+r"(s_rope));
  const uint64_t dq = mla_desc(s_rope, 16, 1024);
#pragma unroll
  for (int t = 0; t < 4; t++)
    mla5_mma_s<QT>(s, dq + ((uint32_t)(t * 32) >> 4),
                   dk + ((uint32_t)(8 * KVA_MLA5_KBLK + t * 32) >> 4), 1);
  kva_wgmma_commit();
}

/* mla_softmax_tile<QT, 8> with P stored as it is made (each packed pair
 * straight to its place in the [64][128 B] tile at p_dst, fenced for the
 * O warpgroups' wgmma), so no packed P is held in registers next to Q;
 * the causal positions are computed only on a masked block; the rows'
 * running max m and sum l (quad-reduced each block) live in smem (sm, sl),
 * not in registers, through S. */
/* QS: Q was converted to f16 times 2^-KVA_FP8_Q_SHIFT (fp8 latents) */
#define MLA9_QK_MUL(a, QS) ((QS) ? (a).qk_mul * (float)(1 << KVA_FP8_Q_SHIFT) : (a).qk_mul)
template <int QT, int QS = 0>
static __device__ __forceinline__ void mla9_softmax_store(float s[32], float *sm, float *sl,
                                                          float c[2], int kt, int k1, int cached,
                                                          int row0, const kva_mla_args &a,
                                                          unsigned char *p_dst, int wq, int g,
                                                          int tq) {
  const bool need_mask = kt + 64 > k1 || (a.causal && kt + 63 > cached);
  float mx[2] = {-INFINITY, -INFINITY};
  if (need_mask) {
    int pos[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) pos[hf] = cached + (row0 + 16 * wq + g + 8 * hf) / a.hq;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = kt + 8 * j + 2 * tq + (e & 1);
        float x = s[4 * j + e] * MLA9_QK_MUL(a, QS);
        if (key >= k1 || (a.causal && key > pos[e >> 1])) x = -INFINITY;
        s[4 * j + e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
  } else {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float x = s[4 * j + e] * MLA9_QK_MUL(a, QS);
        s[4 * j + e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
  }
  float mo[2], lo[2];
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int r = 16 * wq + g + 8 * hf;
    mo[hf] = sm[r];
    lo[hf] = sl[r];
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
    const float mn = kva_online_max(mo[hf], mx[hf]);
    const float mu = mn == -INFINITY ? 0.0f : mn; /* all masked so far: p = 0, no NaN */
    c[hf] = kva_ex2(mo[hf] - mu);
    mo[hf] = mn;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const float p0 = kva_ex2(s[4 * j + 2 * hf] - mu), p1 = kva_ex2(s[4 * j + 2 * hf + 1] - mu);
      sum += p0 + p1;
      *(uint32_t *)(p_dst + r * 128 + ((j ^ (r & 7)) << 4) + 4 * tq) = mla_pack<QT>(p0, p1);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    lo[hf] = lo[hf] * c[hf] + sum;
  }
  kva_fence_proxy_async_smem(); /* generic stores -> the other warpgroups' wgmma */
  __syncwarp(); /* the quad's reads of m and l before its first thread's writes */
  if (tq == 0)
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      sm[16 * wq + g + 8 * hf] = mo[hf];
      sl[16 * wq + g + 8 * hf] = lo[hf];
    }
}

/* P V over 248 of the O warpgroup's 256 columns (256 h .. 256 h + 247:
 * o's first 124 accumulators); the last 8 (V column block 4 h + 3,
 * columns 56..63) are warpgroup 0's (mla9_pv_sliver). */
template <int QT>
static __device__ __forceinline__ void mla9_pv248(float o[2][64], uint32_t s_p, uint32_t s_k, int h) {
  kva_wgmma_fence();
  const uint64_t dp = mla_desc(s_p, 16, 1024);
  const uint64_t dv = mla_desc(s_k + 4 * h * KVA_MLA5_KBLK, KVA_MLA5_KBLK, 1024);
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    if (QT == KVA_F16)
      kva_wgmma_m64n248k16_ss_f16_tb(&o[0][0], dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4));
    else
      kva_wgmma_m64n248k16_ss_bf16_tb(&o[0][0], dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4));
  }
  kva_wgmma_commit();
}
/* Warpgroup 0's 8-column slivers of O += P V: columns 248..255 (osl[0])
 * and 504..511 (osl[1]), each an N = 8 operand starting 112 bytes into V
 * column block 3 / 7 (the 128-byte swizzle applies to the whole address,
 * as for a K-major k-step's 32-byte advance); committed, not waited for. */
template <int QT>
static __device__ __forceinline__ void mla9_pv_sliver(float osl[2][4], uint32_t s_p, uint32_t s_k) {
  kva_wgmma_fence();
  const uint64_t dp = mla_desc(s_p, 16, 1024);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const uint64_t dv = mla_desc(s_k + (4 * h + 3) * KVA_MLA5_KBLK + 112, KVA_MLA5_KBLK, 1024);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      if (QT == KVA_F16)
        kva_wgmma_m64n8k16_ss_f16_tb(osl[h], dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4));
      else
        kva_wgmma_m64n8k16_ss_bf16_tb(osl[h], dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4));
    }
  }
  kva_wgmma_commit();
}
/* o's first 124 accumulators (the P V's) fenced / times their rows' factor */
static __device__ __forceinline__ void mla9_fence_o124(float o[2][64]) {
#pragma unroll
  for (int i = 0; i < 124; i++) kva_reg_fence_f32(&o[i >> 6][i & 63]);
}
static __device__ __forceinline__ void mla9_scale_o124(float o[2][64], const float c[2]) {
#pragma unroll
  for (int i = 0; i < 124; i++) o[i >> 6][i & 63] *= c[(i >> 1) & 1];
}

/* The first three blocks of chunk c into stages s0, s0 + 1, .. (mod 3),
 * each O warpgroup its column blocks. */
template <int TMA>
static __device__ __forceinline__ void mla9_load_first(const mla5_chunk &c, uint32_t s_st0,
                                                       uint32_t s_bar, const unsigned char *kvg,
                                                       const kva_mla_args &a, int h, int tw,
                                                       int s0) {
#pragma unroll
  for (int b = 0; b < 3; b++) {
    const int sb = s0 + b < 3 ? s0 + b : s0 + b - 3;
    if (b < c.nblk)
      mla5_load<TMA>(s_st0 + sb * KVA_MLA5_TILE, s_bar + 72 * sb, kvg, c.pt,
                     c.k0 + b * KVA_MLA5_BN, c.k1, a, h, tw);
  }
}

/* The next chunk of a worker (and row tile), as warpgroup 0 finds it at
 * the start of the chunk before it: [0] whether there is one, [1] its
 * index wi, [2..11] mla5_chunk's ints, [12..13] its page-table row. */
enum { MLA9_REC_INTS = 16 };
static __device__ __forceinline__ void mla9_find_next(const kva_mla_args &a,
                                                      const kva_split_work &wk, int wi, int row0,
                                                      volatile int *rec) {
  mla5_chunk nc;
  int wn = wi + 1;
  while (wn <= wk.end_req && !mla5_chunk_at(a, wk, wn, row0, &nc)) wn++;
  rec[0] = wn <= wk.end_req;
  if (wn > wk.end_req) return;
  const int v[10] = {nc.r, nc.nsplit, nc.nt, nc.rows, nc.cached, nc.split, nc.k0, nc.k1, nc.nblk, nc.tok0};
  rec[1] = wn;
#pragma unroll
  for (int i = 0; i < 10; i++) rec[2 + i] = v[i];
  *(const int32_t *volatile *)(rec + 12) = nc.pt;
}
/* The chunk in rec (mla9_find_next) into c and wi; 0 when there is none. */
static __device__ __forceinline__ int mla9_next_chunk(const volatile int *rec, mla5_chunk *c,
                                                      int *wi) {
  if (!rec[0]) return 0;
  *wi = rec[1];
  c->r = rec[2];
  c->nsplit = rec[3];
  c->nt = rec[4];
  c->rows = rec[5];
  c->cached = rec[6];
  c->split = rec[7];
  c->k0 = rec[8];
  c->k1 = rec[9];
  c->nblk = rec[10];
  c->tok0 = rec[11];
  c->pt = *(const int32_t *const volatile *)(rec + 12);
  return 1;
}
/* The first chunk of a worker (and row tile): into c and wi; 0 when it
 * has none (mla9_find_next's search, from the worker's start). */
static __device__ __forceinline__ int mla9_first_chunk(const kva_mla_args &a,
                                                       const kva_split_work &wk, int row0,
                                                       mla5_chunk *c, int *wi) {
  for (int w = wk.begin_req; w <= wk.end_req; w++)
    if (mla5_chunk_at(a, wk, w, row0, c)) {
      *wi = w;
      return 1;
    }
  return 0;
}
/* A warpgroup's registers from the launch's 168 (65536 / 384) to N. */
template <int N>
static __device__ __forceinline__ void mla9_setmaxnreg(void) {
  if (N > 168)
    kva_setmaxnreg_inc<N>();
  else
    kva_setmaxnreg_dec<N>();
}

/* KV8: fp8 latents (TMA 0: their copies need no tensor map), on f16
 * tensor cores whatever Q's type (a bf16 Q converted as v2's,
 * kva_q_bf16x2_to_f16x2): 1 in two 16-bit stages and two byte stages (mla9_fp8.cuh),
 * 2 in three 16-bit stages converted in place (mla9_f8ip.cuh). */
template <int QT, int TMA, int KV8 = 0>
__global__ void __launch_bounds__(KVA_MLA6_THREADS, 1)
    kva_mla_kernel_v9(const __grid_constant__ kva_mla_args a) {
  constexpr int TILE = KVA_MLA5_TILE, BN = KVA_MLA5_BN, KB = KVA_MLA5_KBLK;
  constexpr int NS = KV8 == 1 ? 2 : 3;      /* 16-bit stages */
  constexpr int MT = KV8 ? KVA_F16 : QT;    /* the tensor cores' type */
  static_assert(!KV8 || TMA == 0, "fp8 latents come by bulk copies or cp.async, not tensor maps");
  static_assert(KVA_MLA9_SMEM <= 232448, "227 KB of smem per CTA");
  static_assert(2 * KVA_MLA9_TILE8 == TILE, "KV8's byte stages fill the third stage");
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_rope = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_rope = smem + (s_rope - s_raw);
  const uint32_t s_st0 = s_rope + KVA_MLA9_ROPE;
  unsigned char *const p_st0 = p_rope + KVA_MLA9_ROPE;
  float *const sc = (float *)(p_st0 + 3 * TILE); /* [3 stages][64] factor c */
  float *const sm = sc + 3 * KVA_MLA_BM;          /* [64] the chunk's max m */
  float *const sl = sm + KVA_MLA_BM;              /* [64] the chunk's sum l */
  /* mbarriers: stage s column block k at 8 (9 s + k), ready of stage s at
   * 8 (27 + s), the chunk's l and m written (30) and read (31), S of
   * stage s issued at 8 (32 + s), warpgroup 0's sliver P V on stage s
   * over at 8 (35 + s); then a flag */
  const uint32_t s_bar = s_st0 + 3 * TILE + KVA_MLA9_STATS;
  const uint32_t stats_full = s_bar + 8 * 30, stats_empty = s_bar + 8 * 31;
  volatile int *const flag = (volatile int *)(p_st0 + 3 * TILE + KVA_MLA9_STATS + 8 * 38);
  /* [3][MLA9_REC_INTS]: the chunk after chunk n (mla9_find_next) at
   * (n + 1) % 3. Three: at chunk n + 1's start warpgroup 0 has waited
   * stats_empty of chunk n - 1 only, so it may write the one after next
   * while the O warpgroups still read the next at chunk n's end. */
  volatile int *const next_rec = (volatile int *)(p_st0 + 3 * TILE + KVA_MLA9_STATS + KVA_MLA9_BARS);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = mla_uni(warp >> 2), wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const int tw = tid & 127;
  const kva_plan_header *hdr = a.hdr;
  kva_griddep_launch_dependents();
  MLA9_STAMP(0, kva_globaltimer());
  if ((int)blockIdx.x >= hdr->num_workers) {
    MLA9_STAMP(8, kva_globaltimer());
    MLA9_STAMP(9, kva_smid());
    return;
  }
  const int row0 = (int)blockIdx.y * KVA_MLA_BM;
  if (row0 >= hdr->max_q_len * a.hq) {
    MLA9_STAMP(8, kva_globaltimer());
    MLA9_STAMP(9, kva_smid());
    return;
  }
  const kva_split_work wk = a.sched[blockIdx.x];
  if (tid == 0) {
#pragma unroll 1
    for (int i = 0; i < 38; i++) /* stats_empty: both O warpgroups */
      kva_mbar_init(s_bar + 8 * i, i == 31 || (KV8 == 1 && i >= MLA9_F8_BAR && i < MLA9_F8_BAR + 4) ||
                                       (KV8 == 2 && i < 27) /* every O thread converts */
                                       ? KVA_MLA_THREADS
                                       : KVA_MLA_THREADS / 2);
    if (TMA && a.kv_tma) {
      kva_tma_prefetch_map(&a.kv_map);
      if (TMA == 4) kva_tma_prefetch_map(&a.kv_map4);
    }
  }
  __syncthreads(); /* the inits are seen by every thread */

  /* bit s: the parity of stage s's next fill (and its ready / issued
   * phases), CTA-uniform */
  uint32_t pw = 0;
  int nchunk = 0;
  int s = 0; /* the stage of the next block: the stages rotate across chunks */
  if (wg == 0) {
    mla9_setmaxnreg<KVA_MLA9_S_REGS>();
    uint32_t q[32][4];
    float *const sliver = (float *)p_rope; /* [2][64 rows][8] at a chunk's end */
    mla5_chunk c;
    int wi;
    for (int have = mla9_first_chunk(a, wk, row0, &c, &wi); have;
         have = mla9_next_chunk(next_rec + MLA9_REC_INTS * (nchunk % 3), &c, &wi)) {
      /* Q into registers (the last chunk's S's are over), then the next
       * chunk (for the O warpgroups' refills and everyone's next turn)
       * under Q's loads; then the rope tile, once the O warpgroups took
       * the last chunk's m, l and slivers from it */
      if (c.nblk > 0) {
        kva_griddep_wait();
        mla9_load_q(q, a, c.tok0, row0, c.rows, wq, g, tq);
        if (MT != QT)
#pragma unroll
          for (int i = 0; i < 128; i++) q[i >> 2][i & 3] = kva_q_bf16x2_to_f16x2(q[i >> 2][i & 3]);
      }
      if (tid == 0) mla9_find_next(a, wk, wi, row0, next_rec + MLA9_REC_INTS * ((nchunk + 1) % 3));
      if (nchunk > 0) kva_mbar_wait(stats_empty, (uint32_t)((nchunk - 1) & 1));
      if (c.nblk > 0) mla9_issue_rope(s_rope, a, c.tok0, row0, c.rows, tw);
#ifdef KVA_MLA9_PHASES
      if (c.nblk > 0 && nchunk == 1) { /* once Q's last register landed */
        uint32_t last;
        asm volatile("mov.b32 %0, %1;" : "=r"(last) : "r"(q[31][3]));
        MLA9_PHASE_S(nchunk, 11, kva_globaltimer() + (last == 0x7fc00001u));
      }
#endif
      float osl[2][4];
#pragma unroll
      for (int i = 0; i < 8; i++) osl[i >> 2][i & 3] = 0.0f;
      if (tq == 0)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
          sm[16 * wq + g + 8 * hf] = -INFINITY;
          sl[16 * wq + g + 8 * hf] = 0.0f;
        }
      if (c.nblk > 0) {
        kva_cp_async_wait_all();
        if (MT != QT) mla9_rope_to_f16(p_rope, tw);
        kva_fence_proxy_async_smem(); /* the rope tile -> wgmma */
      }
      /* the rope tile and m, l are seen by every warp */
      mla_bar_sync(KVA_MLA6_BAR_S, KVA_MLA_THREADS / 2);
      for (int j = 0; j < c.nblk; j++) {
        const uint32_t st = s_st0 + s * TILE, bar = s_bar + 72 * s, par = (pw >> s) & 1u;
        /* a cp.async block's landing is fenced here; KV8's converters
         * fence their own stores before they arrive */
        const int fence = !KV8 && !mla5_tma_block<TMA>(a, c.k0 + j * BN, c.k1);
        float sacc[32], cf[2];
        mla9_s<MT>(sacc, q, s_rope, st, bar, par, fence);
        if (j == 0) MLA9_PHASE_S(nchunk, 10, kva_globaltimer());
        if (KVA_MLA9_ORDER) kva_mbar_arrive(s_bar + 8 * (32 + s)); /* S(j) is on the tensor cores */
        kva_wgmma_wait<0>(); /* S(j) and the sliver P V of block j - 1 */
#pragma unroll
        for (int i = 0; i < 32; i++) kva_reg_fence_f32(&sacc[i]);
#pragma unroll
        for (int i = 0; i < 8; i++) kva_reg_fence_f32(&osl[i >> 2][i & 3]);
        if (j > 0) kva_mbar_arrive(s_bar + 8 * (35 + (s == 0 ? NS - 1 : s - 1)));
        /* every warp's S is over before any warp's P goes over the rope
         * columns of K that it reads */
        mla_bar_sync(KVA_MLA6_BAR_S, KVA_MLA_THREADS / 2);
        mla9_softmax_store<MT, MT != QT>(sacc, sm, sl, cf, c.k0 + j * BN, c.k1, c.cached, row0, a,
                               p_st0 + s * TILE + 8 * KB, wq, g, tq);
        if (tq == 0) {
          sc[s * KVA_MLA_BM + 16 * wq + g] = cf[0];
          sc[s * KVA_MLA_BM + 16 * wq + g + 8] = cf[1];
        }
        kva_mbar_arrive(s_bar + 8 * (27 + s));
        /* this warpgroup's slivers of O: rescaled, + P V once every warp's
         * P rows are out */
#pragma unroll
        for (int i = 0; i < 8; i++) osl[i >> 2][i & 3] *= cf[(i >> 1) & 1];
        mla_bar_sync(KVA_MLA6_BAR_S, KVA_MLA_THREADS / 2);
        mla9_pv_sliver<MT>(osl, st + 8 * KB, st);
        pw ^= 1u << s;
        s = s == NS - 1 ? 0 : s + 1;
      }
      kva_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 8; i++) kva_reg_fence_f32(&osl[i >> 2][i & 3]);
      if (c.nblk > 0) kva_mbar_arrive(s_bar + 8 * (35 + (s == 0 ? NS - 1 : s - 1)));
      /* the slivers over the rope tile (its last S is over) */
#pragma unroll
      for (int i = 0; i < 8; i++)
        sliver[((i >> 2) * 64 + 16 * wq + g + 8 * ((i >> 1) & 1)) * 8 + 2 * tq + (i & 1)] =
            osl[i >> 2][i & 3];
      /* the rows' sums and maxima (in sm, sl) and the slivers to the O
       * warpgroups */
      kva_mbar_arrive(stats_full);
      nchunk++;
    }
    return;
  }

  mla9_setmaxnreg<KVA_MLA9_O_REGS>();
  const int h = wg - 1, ct = tid - 128; /* O columns 256 h ..; thread of the two */
  const unsigned char *const kvg = (const unsigned char *)a.kv;
  unsigned trace_merges = 0, trace_known_last = 0;
  int preloaded = 0; /* this chunk's first blocks were issued in the last one's loop */
  mla5_chunk c;
  int wi;
  /* the chunks after the first as warpgroup 0 found them (read after
   * stats_full) */
  for (int have = mla9_first_chunk(a, wk, row0, &c, &wi); have;
       have = mla9_next_chunk(next_rec + MLA9_REC_INTS * (nchunk % 3), &c, &wi)) {
    kva_griddep_wait();
    if (nchunk == 0) MLA9_STAMP(1, kva_globaltimer());
    float o[2][64]; /* the last 4 (columns 248..255 of the half) come at the end */
#pragma unroll
    for (int i = 0; i < 124; i++) o[i >> 6][i & 63] = 0.0f;
    if (KV8 == 1)
      mla9_load_first_f8(c, p_st0, s_st0, s_bar, pw, kvg, a, h, tw, s);
    else if (KV8 == 2)
      mla9p_load_first(c, p_st0, s_st0, s_bar, kvg, a, KVA_MLA6_BAR_O, ct, s);
    else if (!preloaded)
      mla9_load_first<TMA>(c, s_st0, s_bar, kvg, a, h, tw, s);
    /* the stages this chunk's last three blocks free take the next chunk's
     * first blocks (not in a head of two: its merge before the write needs
     * them; from four blocks, so that the record is read after ready(0)) */
    const bool xc = !KV8 && c.nblk >= 4 && !(c.nsplit == 2 && c.split == 0);
    preloaded = 0;
    for (int j = 0; j < c.nblk; j++) {
      const uint32_t st = s_st0 + s * TILE, bar = s_bar + 72 * s, par = (pw >> s) & 1u;
      const int kt = c.k0 + j * BN;
      /* the block to refill this stage with: j + 3, or the next chunk's
       * j + 3 - nblk */
      int rk = kt + 3 * BN, rk1 = c.k1;
      const int32_t *rpt = c.pt;
      bool more = j + 3 < c.nblk;
      if (!more && xc) {
        const volatile int *rc = next_rec + MLA9_REC_INTS * ((nchunk + 1) % 3);
        const int b = j + 3 - c.nblk;
        if (rc[0] && b < rc[10]) {
          rk = rc[8] + b * BN;
          rk1 = rc[9];
          rpt = *(const int32_t *const volatile *)(rc + 12);
          more = true;
          preloaded = 1;
        }
      }
      int nx[4]; /* rows of the refill, read ahead of the wait */
      if (!KV8) mla5_rows<TMA>(nx, rpt, rk, more ? rk1 : 0, a, tw);
      kva_mbar_wait(s_bar + 8 * (27 + s), par); /* P, c of block j */
      if (KVA_MLA9_ORDER) {
        /* S(j + 1) issued: ahead of this P V on the tensor cores (block
         * 0's phase is waited too: synccheck wants every phase waited) */
        if (j == 0) kva_mbar_wait(s_bar + 8 * (32 + s), par);
        if (j + 1 < c.nblk) {
          const int s1 = s == NS - 1 ? 0 : s + 1;
          kva_mbar_wait(s_bar + 8 * (32 + s1), (pw >> s1) & 1u);
        }
      }
      float cf[2];
#pragma unroll
      for (int hf = 0; hf < 2; hf++) cf[hf] = sc[s * KVA_MLA_BM + 16 * wq + g + 8 * hf];
      if (__any_sync(0xffffffffu, cf[0] != 1.0f || cf[1] != 1.0f)) mla9_scale_o124(o, cf);
      /* V of a cp.async block landed for warpgroup 0's S: fenced for this
       * warpgroup's wgmma (P's generic stores were fenced by their writers) */
      if (!KV8 && !mla5_tma_block<TMA>(a, kt, c.k1)) kva_fence_proxy_async_smem();
      mla9_fence_o124(o);
      if (j == 0) MLA9_PHASE(nchunk, 2, kva_globaltimer());
      mla9_pv248<MT>(o, st + 8 * KB, st, h);
      /* KV8 2: under this P V, block j + 2 (its bytes copied at the end of
       * block j - 1, into that block's stage) converted in place */
      if (KV8 == 2 && j >= 1 && j + 2 < c.nblk) {
        const int s2 = s == 0 ? 2 : s - 1;
        kva_cp_async_wait<0>();
        mla9p_convert(p_st0 + s2 * TILE, s_bar + 72 * s2, KVA_MLA6_BAR_O, ct);
      }
      kva_wgmma_wait<0>();
      mla9_fence_o124(o);
      mla_bar_sync(KVA_MLA6_BAR_O, KVA_MLA_THREADS); /* both P V's on the stage are over */
      /* and warpgroup 0's slivers, which read column blocks 3 and 7 (every
       * block's phase, refilled or not) */
      kva_mbar_wait(s_bar + 8 * (35 + s), (pw >> s) & 1u);
      if (KV8 == 2) {
        /* block j + 3's bytes into this stage, block j + KVA_MLA9_F8IP_PF
         * into L2 */
        if (j + 3 < c.nblk) {
          mla9p_issue(st, kvg, c.pt, kt + 3 * BN, c.k1, a, ct);
          if (j + KVA_MLA9_F8IP_PF < c.nblk)
            mla6_prefetch_f8(kvg, c.pt, kt + KVA_MLA9_F8IP_PF * BN, c.k1, a, ct);
        }
      } else if (KV8) {
        /* block j + 2 into this stage (its byte stage's next phase), whose
         * byte stage then takes block j + 4 (converting block j + 1 under
         * P V(j) instead, with S(j + 1) behind it, measured 6-7% slower:
         * docs/results/2026-11-27_mla_fp8_order1_s32.patch) */
        if (j + 2 < c.nblk) {
          mla9_take_f8(p_st0, s_bar, s, par ^ 1u, kt + 2 * BN, c.k1, h, tw);
          if (j + 4 < c.nblk)
            mla9_fill_f8(s_st0, s_bar, s, par, kvg, c.pt, kt + 4 * BN, c.k1, a, ct);
        }
      } else if (more) {
        mla5_copy<TMA>(st, bar, kvg, nx, h, tw, rk, rk1, a);
      }
      pw ^= 1u << s;
      s = s == NS - 1 ? 0 : s + 1;
    }
    MLA9_STAMP(3, kva_globaltimer());
    MLA9_PHASE(nchunk, 3, kva_globaltimer());
    kva_mbar_wait(stats_full, (uint32_t)(nchunk & 1)); /* the rows' l and m */
    float lt[2], m[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      lt[hf] = sl[16 * wq + g + 8 * hf];
      m[hf] = sm[16 * wq + g + 8 * hf];
    }
    {
      const float *sliver = (const float *)p_rope;
#pragma unroll
      for (int e = 0; e < 4; e++)
        o[1][60 + e] = sliver[(h * 64 + 16 * wq + g + 8 * (e >> 1)) * 8 + 2 * tq + (e & 1)];
    }
    kva_mbar_arrive(stats_empty);
    MLA9_PHASE(nchunk, 4, kva_globaltimer());
    /* a request cut in two that this chunk completes: merged before the
     * write, the other chunk's rows through the stages, unless they hold
     * the next chunk's blocks (preloaded: the count path, whose merge goes
     * item by item) */
    if (c.nsplit == 2 && ct == 0) *flag = !preloaded && mla_known_last(a, c.r, c.split);
    if (c.nsplit == 2) mla_bar_sync(KVA_MLA6_BAR_O, KVA_MLA_THREADS); /* flag written */
    const int known_last = c.nsplit == 2 && *flag;
    trace_known_last += known_last;
    MLA9_PHASE(nchunk, 5, kva_globaltimer());
    /* the stages, unless loading already: the merge's scratch */
    trace_merges += mla_finish_chunk<QT, MLA9_STAMPS, KVA_MLA6_BAR_O>(
        a, o, lt, m, c.r, c.split, c.nsplit, known_last, c.nt, c.tok0, row0, c.rows, ct, h, wq, g,
        tq, flag, (float *)p_st0, preloaded ? (size_t)0 : (size_t)(3 * TILE));
    MLA9_PHASE(nchunk, 6, kva_globaltimer());
    /* the merge's scratch (generic writes) before the next chunk's TMA
     * writes there */
    if ((TMA && a.kv_tma) || KV8) kva_fence_proxy_async_smem();
    MLA9_PHASE(nchunk, 7, kva_globaltimer());
    mla_bar_sync(KVA_MLA6_BAR_O, KVA_MLA_THREADS); /* flag read; stages free */
    nchunk++;
  }
  MLA9_STAMP(8, kva_globaltimer());
  MLA9_STAMP(9, kva_smid());
  MLA9_STAMP(10, (unsigned)nchunk);
  MLA9_STAMP(11, trace_merges);
  MLA9_STAMP(2, trace_known_last); /* of them merged before the write */
}

#undef MLA9_QK_MUL
#undef MLA9_STAMP
#undef MLA9_STAMPS
#undef MLA9_PHASE
#undef MLA9_PHASE_S

#endif /* KVA_CUDA_MLA_KERNEL_V9_CUH */
