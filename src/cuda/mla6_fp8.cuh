/* MLA decode v6 with fp8 latents (mla_kernel_v6.cuh's KV8): a block's
 * bytes land in the upper half of its own 16-bit stage and are converted
 * there, in place, so fp8 needs no smem beyond bf16's (v9's byte stages
 * take a third stage's smem, which v6 does not have).
 *
 * A stage is nine 16-bit column blocks [64 keys][128 B] (8 KB each, 72 KB).
 * The bytes come as [64 keys][576 B] at KVA_MLA6_F8_AT = 36 KB (1-D bulk
 * copies by page run, mla9_issue_f8_pt). Column blocks 0..3 are written
 * below 32 KB and never touch the bytes; 4..8 are written over them, so
 * every thread of the converter warpgroup (mla_kernel_v6.cuh) first loads
 * its bytes of 4..8 into registers (5 x 16 B a key), the converter's
 * threads meet on their named barrier, and then the writes go. */
#ifndef KVA_CUDA_MLA6_FP8_CUH
#define KVA_CUDA_MLA6_FP8_CUH

#include "cuda/mla9_fp8.cuh"

#define KVA_MLA6_F8_AT (KVA_MLA5_TILE - KVA_MLA5_BN * KVA_MLA_D) /* 36864 */

/* KV8's mbarriers of stage s, in its column blocks' slots 0 (converted:
 * the converter's 128 threads arrive after their stores and fence;
 * warpgroup 0 waits once a block), 1 (bytes: the bulk copies'
 * transactions and an arrival of each of the 128 filling threads: the
 * converter's, or warpgroup 1's for a chunk's first two blocks) and 2
 * (empty: the 256 O threads arrive once their P V read the stage, for the
 * fill two blocks on); the other slots are unused. */
#define MLA6_F8_CONVERTED(s_bar, s) ((s_bar) + 8 + 72 * (s))
#define MLA6_F8_BYTES(s_bar, s) ((s_bar) + 16 + 72 * (s))
#define MLA6_F8_EMPTY(s_bar, s) ((s_bar) + 24 + 72 * (s))
/* the 256-arrival barriers' indices (1 + 9 s + k) as mla5_init's `wide` mask */
#define MLA6_F8_WIDE ((1u << 3) | (1u << 12))
/* the converter warpgroup's named barrier */
#define KVA_MLA6_BAR_C 4

/* The block at kt (keys from k1 on: not copied) as bytes into stage st's
 * upper half; every filling thread ct arrives once (ct < 64 start the
 * page runs' copies). */
static __device__ __forceinline__ void mla6_fill_f8(uint32_t st, uint32_t s_bar, int s,
                                                    const unsigned char *kv, const int32_t *pt,
                                                    int kt, int k1, const kva_mla_args &a,
                                                    int ct) {
  mla9_issue_f8_pt<false>(st + KVA_MLA6_F8_AT, MLA6_F8_BYTES(s_bar, s), kv, pt, 0, kt, k1, a, ct);
}

/* The block at kt's bytes (keys below k1) prefetched into L2, one bulk
 * prefetch a page run (threads ct < 64 that start one). The kernel
 * converts block j + 1 right after the fill that its stage allowed, so
 * that fill's latency is on the path unless the bytes are in L2 already:
 * each fill prefetches the block KVA_MLA6_F8_PF fills ahead (H200,
 * 2026-11-29, h64 fp8 sk8192: 0.366 ms without, 0.321 one ahead, 0.322
 * two, 0.328 three; v9 0.358-0.359 in the same calls). */
#ifndef KVA_MLA6_F8_PF
#define KVA_MLA6_F8_PF 1
#endif
static __device__ __forceinline__ void mla6_prefetch_f8(const unsigned char *kv, const int32_t *pt,
                                                        int kt, int k1, const kva_mla_args &a,
                                                        int ct) {
  int pg, off, n;
  if (mla9_page_run(kt, k1, a, ct, &pg, &off, &n))
    kva_bulk_prefetch_l2(kv + ((int64_t)__ldg(pt + pg) * a.page_size + off) * KVA_MLA_D,
                         (unsigned)(n * KVA_MLA_D));
}

/* Stage s's bytes, once landed (par: the parity of the stage's fill),
 * -> its nine f16 column blocks in place, by the converter's 128 threads
 * ct. Thread ct + 128 u (u < 2) takes key r = (ct + 128 u) / 4 and 16
 * bytes (16 dims) at 16 (ct % 4) of each column block: one 16-byte load (a
 * warp's eight rows fall on both bank halves: 576 B a row) and two 16-byte
 * stores at units 2q, 2q + 1 of the row, swizzled by r % 8
 * (conflict-free). Keys at or past k1 are written as zeros (the copies
 * left stale bytes there, and a masked P of 0 times a NaN would still be
 * NaN). Ends with the stores fenced for the wgmmas and this thread's
 * arrival on `converted`. */
static __device__ __forceinline__ void mla6_take_f8(unsigned char *p_st0, uint32_t s_bar, int s,
                                                    uint32_t par, int kt, int k1, int ct) {
  constexpr int NT = 128, NU = 2;
  kva_mbar_wait(MLA6_F8_BYTES(s_bar, s), par);
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const int q = ct & 3;
  uint4 hi[NU][5]; /* column blocks 4..8: their f16 goes over the bytes */
#pragma unroll
  for (int u = 0; u < NU; u++) {
    const int r = (ct + NT * u) >> 2;
    const bool live = kt + r < k1;
    unsigned char *const dst = p_st0 + s * KVA_MLA5_TILE + r * 128;
    const unsigned char *const src =
        p_st0 + s * KVA_MLA5_TILE + KVA_MLA6_F8_AT + r * KVA_MLA_D + 16 * q;
    const int x0 = ((2 * q) ^ (r & 7)) << 4, x1 = ((2 * q + 1) ^ (r & 7)) << 4;
#pragma unroll
    for (int k = 0; k < 5; k++) hi[u][k] = live ? *(const uint4 *)(src + 64 * (k + 4)) : zero;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const uint4 x = live ? *(const uint4 *)(src + 64 * k) : zero;
      unsigned char *const d = dst + k * KVA_MLA5_KBLK;
      *(uint4 *)(d + x0) = mla_e4m3x8<KVA_F16>(x.x, x.y);
      *(uint4 *)(d + x1) = mla_e4m3x8<KVA_F16>(x.z, x.w);
    }
  }
  mla_bar_sync(KVA_MLA6_BAR_C, NT); /* every thread's bytes of 4..8 are read */
#pragma unroll
  for (int u = 0; u < NU; u++) {
    const int r = (ct + NT * u) >> 2;
    unsigned char *const dst = p_st0 + s * KVA_MLA5_TILE + r * 128;
    const int x0 = ((2 * q) ^ (r & 7)) << 4, x1 = ((2 * q + 1) ^ (r & 7)) << 4;
#pragma unroll
    for (int k = 0; k < 5; k++) {
      unsigned char *const d = dst + (k + 4) * KVA_MLA5_KBLK;
      *(uint4 *)(d + x0) = mla_e4m3x8<KVA_F16>(hi[u][k].x, hi[u][k].y);
      *(uint4 *)(d + x1) = mla_e4m3x8<KVA_F16>(hi[u][k].z, hi[u][k].w);
    }
  }
  kva_fence_proxy_async_smem(); /* generic stores -> the wgmmas (and the next bulk copy) */
  kva_mbar_arrive(MLA6_F8_CONVERTED(s_bar, s));
}

/* Warpgroup 0's Q tile (bf16, landed) -> f16 times 2^-KVA_MLA_FP8_Q_SHIFT
 * in place (element-wise, so any swizzle), fenced for the wgmmas; tw:
 * the thread of warpgroup 0. The caller syncs warpgroup 0 after. */
static __device__ __forceinline__ void mla6_q_to_f16(unsigned char *p_q, int tw) {
#pragma unroll 4
  for (int i = 0; i < KVA_MLA_QTILE / 16 / 128; i++)
    mla_q_f16x8((uint4 *)(p_q + 16 * (tw + 128 * i)));
  kva_fence_proxy_async_smem();
}

#endif /* KVA_CUDA_MLA6_FP8_CUH */
