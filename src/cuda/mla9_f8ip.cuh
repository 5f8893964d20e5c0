/* MLA decode v9 with fp8 latents converted in place (mla_kernel_v9.cuh's
 * KV8 == 2): v9's three 16-bit stages, as for 16-bit latents, and no byte
 * stages. A block's bytes land by cp.async in the upper halves of its own
 * stage's column blocks (column block k's 64 bytes of each key at
 * 8192 k + 4096 + 64 key), and the O warpgroups convert them there.
 *
 * Why: KV8 == 1's byte stages take the third stage's smem, so it runs two
 * stages with its conversion in the chain (387-419 TFLOP/s on the H200's
 * fp8 rows of 128-256 rows, against 605-671 for 16-bit latents on three
 * stages). Loads straight into the O threads' registers were tried first
 * (docs/results/2026-11-29_mla9_f8_direct_s52.patch): with 124 of their
 * 152 registers O's accumulators, too few bytes were in flight (240
 * TFLOP/s). cp.async keeps the bytes in flight without registers. H200
 * (2026-11-29, one call, FlashMLA's 20 fp8 rows of 64-256 rows): 13-17%
 * less time than KV8 1 (h128 s_q1 sk8192 0.5945 against 0.7086 ms, 492
 * TFLOP/s), but v6 with its converter warpgroup took 5-11% less again
 * (0.5634), so it stays an A/B knob (KVA_MLA9_F8IP=1) until measured on an
 * H100, where v9 is the fp8 kernel from 33 rows. Timing probes: without
 * the conversion's smem reads and writes (copies, waits and barriers
 * kept) 25% less time, 616-675 TFLOP/s: its smem traffic is the cost
 * (docs/performance.md, "Fifty-second session", 2b).
 *
 * Thread ct (0..255 of the two O warpgroups) copies and converts key
 * ct / 4's 16 bytes at 16 (ct % 4) of each 64-byte column group. The f16
 * of a column block's rows 32..63 goes over its own bytes (row r over keys
 * 2 r - 64 and 2 r - 63), which other threads read, so a column block is
 * read whole before it is written: rounds of column blocks, each a named
 * barrier of the 256. */
#ifndef KVA_CUDA_MLA9_F8IP_CUH
#define KVA_CUDA_MLA9_F8IP_CUH

#include "cuda/mla6_fp8.cuh"

/* the L2 prefetch's distance: block j + PF as block j + 3's bytes are
 * copied (at least 4; H200, 4 and 7 within -0.7..+2.6% of 5) */
#ifndef KVA_MLA9_F8IP_PF
#define KVA_MLA9_F8IP_PF 5
#endif
static_assert(KVA_MLA9_F8IP_PF >= 4, "blocks 0..3 come with the chunk's first copies");

/* The block at kt's bytes (keys from k1 on zero-filled) into the stage at
 * s_st by thread ct's nine cp.async, committed as one group. */
static __device__ __forceinline__ void mla9p_issue(uint32_t s_st, const unsigned char *kv,
                                                   const int32_t *pt, int kt, int k1,
                                                   const kva_mla_args &a, int ct) {
  const int r = ct >> 2, q = ct & 3;
  const uint4 *const src = mla6_key_src(kv, pt, kt + r, k1, a, q);
  const uint32_t dst = s_st + 4096 + 64 * r + 16 * q;
#pragma unroll
  for (int k = 0; k < 9; k++)
    kva_cp_async_16(dst + k * KVA_MLA5_KBLK, src ? (const void *)(src + 4 * k) : (const void *)kv,
                    src ? 16 : 0);
  kva_cp_async_commit();
}

/* The stage at p_st's bytes (this thread's landed: cp.async waited) into
 * its f16 column blocks, in place, in rounds of KVA_MLA9_F8IP_RB column
 * blocks; fenced for the wgmmas and arrived on all nine column blocks'
 * mbarriers (bar + 8 k, 256 arrivals) at the end. H200 (2026-11-29,
 * fifty-second session, FlashMLA's fp8 rows of 64-256 rows): each round's
 * column blocks fenced and arrived on as they were done, so that S could
 * start on them, 2.7-3.8% more time; rounds of 5 + 4 column blocks
 * 2.0-2.8% more, one round of 9 (36 registers) 30-37% more. nb: the O
 * warpgroups' named barrier. */
#ifndef KVA_MLA9_F8IP_RB
#define KVA_MLA9_F8IP_RB 3
#endif
static __device__ __forceinline__ void mla9p_convert(unsigned char *p_st, uint32_t bar, int nb,
                                                     int ct) {
  constexpr int RB = KVA_MLA9_F8IP_RB;
  const int r = ct >> 2, q = ct & 3;
  const unsigned char *const src = p_st + 4096 + 64 * r + 16 * q;
  unsigned char *const dst = p_st + 128 * r;
  const int x0 = ((2 * q) ^ (r & 7)) << 4, x1 = ((2 * q + 1) ^ (r & 7)) << 4;
#pragma unroll
  for (int k0 = 0; k0 < 9; k0 += RB) {
    uint4 v[RB];
#pragma unroll
    for (int i = 0; i < RB; i++)
      if (k0 + i < 9) v[i] = *(const uint4 *)(src + (k0 + i) * KVA_MLA5_KBLK);
    mla_bar_sync(nb, KVA_MLA_THREADS); /* every thread read these column blocks' bytes */
#pragma unroll
    for (int i = 0; i < RB; i++) {
      if (k0 + i >= 9) break;
      unsigned char *const d = dst + (k0 + i) * KVA_MLA5_KBLK;
      *(uint4 *)(d + x0) = mla_e4m3x8<KVA_F16>(v[i].x, v[i].y);
      *(uint4 *)(d + x1) = mla_e4m3x8<KVA_F16>(v[i].z, v[i].w);
    }
  }
  kva_fence_proxy_async_smem(); /* generic stores -> the wgmmas */
#pragma unroll
  for (int k = 0; k < 9; k++) kva_mbar_arrive(bar + 8 * k);
}

/* A chunk's first blocks (up to three) into stages s0, s0 + 1, .. (mod 3),
 * all copies in flight at once, each converted as it lands; blocks 3 ..
 * KVA_MLA9_F8IP_PF - 1 prefetched into L2. */
static __device__ __forceinline__ void mla9p_load_first(const mla5_chunk &c, unsigned char *p_st0,
                                                        uint32_t s_st0, uint32_t s_bar,
                                                        const unsigned char *kvg,
                                                        const kva_mla_args &a, int nb, int ct,
                                                        int s0) {
  int sb[3];
#pragma unroll
  for (int b = 0; b < 3; b++) {
    sb[b] = s0 + b < 3 ? s0 + b : s0 + b - 3;
    if (b < c.nblk) mla9p_issue(s_st0 + sb[b] * KVA_MLA5_TILE, kvg, c.pt, c.k0 + b * KVA_MLA5_BN, c.k1, a, ct);
  }
#pragma unroll
  for (int b = 3; b < KVA_MLA9_F8IP_PF; b++)
    if (b < c.nblk) mla6_prefetch_f8(kvg, c.pt, c.k0 + b * KVA_MLA5_BN, c.k1, a, ct);
  /* n blocks issued: block b's group is the (n - 1 - b)-th newest */
  const int n = c.nblk < 3 ? c.nblk : 3;
#pragma unroll
  for (int b = 0; b < 3; b++) {
    if (b >= n) break;
    if (n - 1 - b >= 2) kva_cp_async_wait<2>();
    else if (n - 1 - b == 1) kva_cp_async_wait<1>();
    else kva_cp_async_wait<0>();
    mla9p_convert(p_st0 + sb[b] * KVA_MLA5_TILE, s_bar + 72 * sb[b], nb, ct);
  }
}

#endif /* KVA_CUDA_MLA9_F8IP_CUH */
