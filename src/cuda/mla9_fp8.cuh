/* MLA decode v9 with fp8 latents (mla_kernel_v9.cuh's KV8): the byte
 * stages' loads, their conversion into v9's 16-bit stages, and Q's rope
 * columns in f16. */
#ifndef KVA_CUDA_MLA9_FP8_CUH
#define KVA_CUDA_MLA9_FP8_CUH

#include "cuda/mla_kernel_v5.cuh"

/* fp8 latents (KV8). A 64-key block comes as bytes ([64][576]) into one
 * of two byte stages (they take the third 16-bit stage's smem, so KV8
 * runs two 16-bit stages) by 1-D bulk copies, one per page run (one for a
 * block of a 64-key page), on the byte stage's mbarrier `full` (every O
 * thread arrives once a fill, those that copy with their bytes). The O
 * threads then convert it (e4m3 -> f16, exact) into the 16-bit stage and
 * arrive on its column blocks' mbarriers, and on the byte stage's `empty`
 * (256 arrivals), which the copying threads wait for before they refill
 * it. H100, 2026-11-27: per-thread cp.async of the bytes (each thread
 * converting its own copies, as v2 does) ran h128 s_q1 sk8192 at 350
 * TFLOP/s, the bulk copies at 386 (the same conversion). */
/* The block at kt (keys from k1 on: not copied) into the byte stage at
 * dst8; ct: the O thread (0..255). Threads of the first 64 rows that
 * start a page run (or the block) copy it; all arrive on `full`. PRE: the
 * thread's page-table entry was read ahead (mla9_fill_page) into page. */
/* Thread ct's page run of the 64-key block at kt (keys below k1): 1 when
 * it starts one (ct 0, or its key opens a page), with the run's page index
 * in the request's page table, its first key's offset in that page and its
 * keys; else 0. */
static __device__ __forceinline__ int mla9_page_run(int kt, int k1, const kva_mla_args &a, int ct,
                                                    int *pg, int *off, int *n) {
  const int key = kt + ct;
  if (ct >= KVA_MLA5_BN || key >= k1) return 0;
  *pg = (int)((__umulhi((uint32_t)key, a.ps_mul) + (uint32_t)key) >> a.ps_shift);
  *off = key - *pg * a.page_size;
  if (ct != 0 && *off != 0) return 0;
  int m = a.page_size - *off;
  if (m > k1 - key) m = k1 - key;
  if (m > KVA_MLA5_BN - ct) m = KVA_MLA5_BN - ct;
  *n = m;
  return 1;
}
template <bool PRE>
static __device__ __forceinline__ void mla9_issue_f8_pt(uint32_t dst8, uint32_t full,
                                                        const unsigned char *kv, const int32_t *pt,
                                                        int32_t page, int kt, int k1,
                                                        const kva_mla_args &a, int ct) {
  int pg, off, n;
  if (mla9_page_run(kt, k1, a, ct, &pg, &off, &n)) {
    const int64_t slot = (int64_t)(PRE ? page : __ldg(pt + pg)) * a.page_size + off;
    kva_mbar_arrive_expect_tx(full, (uint32_t)(n * KVA_MLA_D));
    kva_bulk_load(dst8 + ct * KVA_MLA_D, kv + slot * KVA_MLA_D, (unsigned)(n * KVA_MLA_D), full);
    return;
  }
  kva_mbar_arrive(full);
}
static __device__ __forceinline__ void mla9_issue_f8(uint32_t dst8, uint32_t full,
                                                     const unsigned char *kv, const int32_t *pt,
                                                     int kt, int k1, const kva_mla_args &a,
                                                     int ct) {
  mla9_issue_f8_pt<false>(dst8, full, kv, pt, 0, kt, k1, a, ct);
}
/* Thread ct's page-table entry for mla9_issue_f8_pt<true> (0 where it
 * copies nothing), read ahead of the fill (v10's O warpgroups, a block
 * early). */
static __device__ __forceinline__ int32_t mla9_fill_page(const int32_t *pt, int kt, int k1,
                                                         const kva_mla_args &a, int ct) {
  int pg, off, n;
  return mla9_page_run(kt, k1, a, ct, &pg, &off, &n) ? __ldg(pt + pg) : 0;
}
/* The byte stage p_st8 (its fill landed: `full` waited) into the 16-bit
 * stage p_st: row tw / 2 of warpgroup h's column blocks (0..3 and 8; 4..7),
 * two threads a row, chunk i (16 bytes) of thread tw at c = (tw & 1) + 2 i
 * (+ 16 for h 1 or the rope) -> units 2c, 2c + 1 of column block c / 4;
 * rows at or past `rows` zeroed (so masked P V stays finite). With the row
 * and tw's parity fixed every address is a base plus an immediate (the
 * first cut kept per-chunk offsets, which ptxas spilled beside O's
 * accumulators and reloaded in the loop). Fenced once for the wgmmas, then
 * arrived on the column blocks (bar + 8 k) and on the byte stage's empty. */
static __device__ __forceinline__ void mla9_convert_f8(unsigned char *p_st,
                                                       const unsigned char *p_st8, uint32_t bar,
                                                       uint32_t empty, int rows, int h, int tw) {
  const int row = tw >> 1, b = tw & 1;
  const bool live = row < rows;
  const unsigned char *const src = p_st8 + row * KVA_MLA_D + 16 * b + (h ? 256 : 0);
  unsigned char *const dst = p_st + (h ? 4 * KVA_MLA5_KBLK : 0) + row * 128;
  /* unit 2c's 16-byte slot in its row (swizzled by row % 8): i even / odd */
  const int x0 = ((2 * b) ^ (row & 7)) << 4, x1 = ((2 * b + 4) ^ (row & 7)) << 4;
#pragma unroll
  for (int i = 0; i < 10; i++) {
    if (h && i == 8) break;
    const int rope = i >= 8 ? 1 : 0;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (live) x = *(const uint4 *)(src + 32 * i + 256 * rope);
    unsigned char *const d = dst + ((i >> 1) + 4 * rope) * KVA_MLA5_KBLK;
    const int xs = i & 1 ? x1 : x0;
    *(uint4 *)(d + xs) = mla_e4m3x8<KVA_F16>(x.x, x.y);
    *(uint4 *)(d + (xs ^ 16)) = mla_e4m3x8<KVA_F16>(x.z, x.w);
  }
  kva_mbar_arrive(empty); /* this thread's reads of the byte stage are over */
  kva_fence_proxy_async_smem(); /* generic stores -> warpgroup 0's wgmma */
#pragma unroll
  for (int k = 0; k < 5; k++) {
    if (h && k == 4) break;
    kva_mbar_arrive(bar + 8 * (h ? 4 + k : k < 4 ? k : 8));
  }
}
/* KV8 byte stage f's mbarriers: stage 2's unused column-block ones, full
 * at MLA9_F8_BAR + f and empty at MLA9_F8_BAR + 2 + f (the kernel inits
 * the four with 256 arrivals) */
#define MLA9_F8_BAR 18
#define MLA9_F8_FULL(s_bar, f) ((s_bar) + 8 * (MLA9_F8_BAR + (f)))
#define MLA9_F8_EMPTY(s_bar, f) ((s_bar) + 8 * (MLA9_F8_BAR + 2 + (f)))
/* KV8: a fill of byte stage sb (parity par of its phases) with the block
 * at kt, once the last fill's conversion is over (a fresh barrier passes
 * parity 1: the stage's first fill waits for nothing). */
static __device__ __forceinline__ void mla9_fill_f8(uint32_t s_st0, uint32_t s_bar, int sb,
                                                    uint32_t par, const unsigned char *kvg,
                                                    const int32_t *pt, int kt, int k1,
                                                    const kva_mla_args &a, int ct) {
  if (ct < KVA_MLA5_BN) kva_mbar_wait(MLA9_F8_EMPTY(s_bar, sb), par ^ 1u);
  mla9_issue_f8(s_st0 + 2 * KVA_MLA5_TILE + sb * KVA_MLA9_TILE8, MLA9_F8_FULL(s_bar, sb), kvg, pt,
                kt, k1, a, ct);
}
/* KV8: block kt of byte stage sb (parity par) into 16-bit stage sb. */
static __device__ __forceinline__ void mla9_take_f8(unsigned char *p_st0, uint32_t s_bar, int sb,
                                                    uint32_t par, int kt, int k1, int h, int tw) {
  kva_mbar_wait(MLA9_F8_FULL(s_bar, sb), par);
  mla9_convert_f8(p_st0 + sb * KVA_MLA5_TILE, p_st0 + 2 * KVA_MLA5_TILE + sb * KVA_MLA9_TILE8,
                  s_bar + 72 * sb, MLA9_F8_EMPTY(s_bar, sb), k1 - kt, h, tw);
}
/* KV8: the first two blocks of chunk c into byte stages s0 and s0 ^ 1,
 * converted into their 16-bit stages, and the byte stages refilled with
 * blocks 2 and 3, as after each conversion in the key loop; pw: the
 * stages' parities. */
static __device__ __forceinline__ void mla9_load_first_f8(const mla5_chunk &c,
                                                          unsigned char *p_st0, uint32_t s_st0,
                                                          uint32_t s_bar, uint32_t pw,
                                                          const unsigned char *kvg,
                                                          const kva_mla_args &a, int h, int tw,
                                                          int s0) {
  const int ct = 128 * h + tw;
#pragma unroll
  for (int b = 0; b < 2; b++)
    if (b < c.nblk)
      mla9_fill_f8(s_st0, s_bar, s0 ^ b, (pw >> (s0 ^ b)) & 1u, kvg, c.pt,
                   c.k0 + b * KVA_MLA5_BN, c.k1, a, ct);
#pragma unroll
  for (int b = 0; b < 2; b++) {
    const int sb = s0 ^ b;
    const uint32_t par = (pw >> sb) & 1u;
    if (b < c.nblk) {
      mla9_take_f8(p_st0, s_bar, sb, par, c.k0 + b * KVA_MLA5_BN, c.k1, h, tw);
      if (b + 2 < c.nblk)
        mla9_fill_f8(s_st0, s_bar, sb, par ^ 1u, kvg, c.pt, c.k0 + (b + 2) * KVA_MLA5_BN, c.k1, a,
                     ct);
    }
  }
}
/* KV8 with bf16 Q: Q's rope columns as this thread copied them
 * (mla9_issue_rope) -> f16 times 2^-KVA_FP8_Q_SHIFT, in place. */
static __device__ __forceinline__ void mla9_rope_to_f16(unsigned char *p_rope, int tw) {
#pragma unroll
  for (int p = 0; p < 4; p++)
    mla_q_f16x8((uint4 *)(p_rope + mla_sw<KVA_MLA_BM>((tw >> 3) + 16 * p, tw & 7)));
}

#undef MLA9_F8_FULL
#undef MLA9_F8_EMPTY

#endif /* KVA_CUDA_MLA9_FP8_CUH */
