/* MLA decode v6 with fp8 latents (mla_kernel_v6.cuh's KV8): the
 * converter warpgroup reads a block's bytes from global memory into
 * registers and stores their f16 into the block's 16-bit stage, so fp8
 * needs no smem beyond bf16's (v9's byte stages take a third stage's
 * smem, which v6 does not have).
 *
 * A stage is nine 16-bit column blocks [64 keys][128 B] (8 KB each, 72 KB).
 * Each of the converter's 128 threads takes keys cv / 4 and cv / 4 + 32
 * and 16 bytes at 16 (cv % 4) of each of their nine 64-byte column
 * groups: a warp's 16-byte loads cover eight keys' 64 contiguous bytes,
 * and its 16-byte stores go to units 2q, 2q + 1 of a row, swizzled by
 * r % 8 (conflict-free). */
#ifndef KVA_CUDA_MLA6_FP8_CUH
#define KVA_CUDA_MLA6_FP8_CUH

#include "cuda/mla9_fp8.cuh"

/* KV8's mbarriers of stage s, in its column blocks' slots 0 (converted:
 * the converter's 128 threads arrive after their stores and fence;
 * warpgroup 0 waits once a block) and 2 (empty: the 256 O threads arrive
 * once their P V read the stage, or at a chunk's start for its first two
 * blocks); the other slots are unused. */
#define MLA6_F8_CONVERTED(s_bar, s) ((s_bar) + 8 + 72 * (s))
#define MLA6_F8_EMPTY(s_bar, s) ((s_bar) + 24 + 72 * (s))
/* the 256-arrival barriers' indices (1 + 9 s + k) as mla5_init's `wide` mask */
#define MLA6_F8_WIDE ((1u << 3) | (1u << 12))

/* The block at kt's bytes (keys below k1) prefetched into L2, one bulk
 * prefetch a page run (threads ct < 64 that start one), so that the
 * converter's loads of it hit the L2: the converter prefetches block
 * j + KVA_MLA6_F8_PF as it starts block j. H200, 2026-11-29: with the
 * bytes by bulk copies into the stage, h64 fp8 sk8192 0.366 ms without,
 * 0.321 one ahead, 0.322 two, 0.328 three (v9 0.358-0.359 in the same
 * calls); with the loads into registers, two ahead 0.1-2.4% slower than
 * one on FlashMLA's fp8 rows of 64-256 rows ("Fiftieth session"). */
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

/* Key `key`'s bytes at 16 q of its row in global memory, or NULL at and
 * past k1. mla_slot's twin with the slot in 64 bits: through mla_slot's
 * int slot, ptxas spilled 8 bytes in the 72-register converter instead of
 * 4 (CUDA 13.0), a build not measured on the device. */
static __device__ __forceinline__ const uint4 *mla6_key_src(const unsigned char *kv,
                                                           const int32_t *pt, int key, int k1,
                                                           const kva_mla_args &a, int q) {
  if (key >= k1) return NULL;
  const int pg = (int)((__umulhi((uint32_t)key, a.ps_mul) + (uint32_t)key) >> a.ps_shift);
  const int64_t slot = (int64_t)__ldg(pt + pg) * a.page_size + (key - pg * a.page_size);
  return (const uint4 *)(kv + slot * KVA_MLA_D) + q;
}

/* Key `key`'s 16 bytes at 16 q of each of its nine 64-byte column
 * groups, from global memory (the L2, prefetched), into x; zeros at and
 * past k1 (a masked P of 0 times a NaN would still be NaN). */
static __device__ __forceinline__ void mla6_load_key_f8(uint4 x[9], const unsigned char *kv,
                                                        const int32_t *pt, int key, int k1,
                                                        const kva_mla_args &a, int q) {
  const uint4 *const src = mla6_key_src(kv, pt, key, k1, a, q);
#pragma unroll
  for (int k = 0; k < 9; k++) x[k] = src ? __ldg(src + 4 * k) : make_uint4(0u, 0u, 0u, 0u);
}

/* One key's f16 (row r of stage p_st's nine column blocks, 16 dims at
 * 16 q of each, swizzled by r % 8) from x; with NEXT, each register is
 * reloaded with key `key`'s bytes once stored, so those loads go out
 * under the stores. */
template <bool NEXT>
static __device__ __forceinline__ void mla6_store_key_f16(unsigned char *p_st, int r, int q,
                                                          uint4 x[9], const unsigned char *kv,
                                                          const int32_t *pt, int key, int k1,
                                                          const kva_mla_args &a) {
  unsigned char *const dst = p_st + r * 128;
  const int x0 = ((2 * q) ^ (r & 7)) << 4, x1 = ((2 * q + 1) ^ (r & 7)) << 4;
  const uint4 *const src = NEXT ? mla6_key_src(kv, pt, key, k1, a, q) : NULL;
#pragma unroll
  for (int k = 0; k < 9; k++) {
    unsigned char *const d = dst + k * KVA_MLA5_KBLK;
    *(uint4 *)(d + x0) = mla_e4m3x8<KVA_F16>(x[k].x, x[k].y);
    *(uint4 *)(d + x1) = mla_e4m3x8<KVA_F16>(x[k].z, x[k].w);
    if (NEXT) x[k] = src ? __ldg(src + 4 * k) : make_uint4(0u, 0u, 0u, 0u);
  }
}

/* Warpgroup 0's Q tile (bf16, landed) -> f16 times 2^-KVA_FP8_Q_SHIFT
 * in place (element-wise, so any swizzle), fenced for the wgmmas; tw:
 * the thread of warpgroup 0. The caller syncs warpgroup 0 after. */
static __device__ __forceinline__ void mla6_q_to_f16(unsigned char *p_q, int tw) {
#pragma unroll 4
  for (int i = 0; i < KVA_MLA_QTILE / 16 / 128; i++)
    mla_q_f16x8((uint4 *)(p_q + 16 * (tw + 128 * i)));
  kva_fence_proxy_async_smem();
}

#endif /* KVA_CUDA_MLA6_FP8_CUH */
