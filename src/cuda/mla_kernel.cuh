/* MLA decode attention on Hopper wgmma (FlashMLA's job), device code only;
 * mla.cu launches it.
 *
 * Persistent grid (num_workers, row tiles): CTA (w, y) walks worker w's
 * entry of the plan's split schedule. The rows of a request are its h_q
 * heads x n new tokens (row i = token i / h_q, head i % h_q); CTA row y
 * takes rows 64 y .. 64 y + 63 (one wgmma M), so each latent byte is read
 * once per row tile. Keys come in tiles of 32, gathered row by row through
 * the page table with 16-byte cp.async into a 3-stage ring of 32 x 576
 * tiles (fp8: byte tiles, each converted into one of two 16-bit tiles
 * before use). Two warpgroups of 128 threads: warpgroup wg computes the
 * partial S = Q K^T over head dims 288 wg .. 288 wg + 287, the two halves
 * are summed through smem (both warpgroups then hold the same S and run
 * the same online softmax), and O[:, 256 wg .. 256 wg + 255] += P V with P
 * from registers and V = the first 512 columns of the same K tile through
 * the descriptor's transpose. Each latent byte is thus multiplied once.
 * The S of the next tile runs on the tensor cores during this tile's
 * softmax (see kva_mla_kernel). The first, unpipelined kernel (v1) was
 * removed after v2 measured 4-11% faster (docs/performance.md).
 *
 * At the end of a request chunk O is written (single-chunk request) or
 * written as a partial row; the CTA whose chunk of a split request finishes
 * last merges the partial rows by LSE into O (mla_chunk_end.cuh). */
#ifndef KVA_CUDA_MLA_KERNEL_CUH
#define KVA_CUDA_MLA_KERNEL_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/mla.h"
#include "cuda/online_max.cuh"
#include "cuda/ptx.cuh"
#include "cuda/fp8_q.cuh"
#include "cuda/mla_chunk_end.cuh"
#include "cuda/split_merge.cuh"
#include "cuda/split_work.cuh"

#define KVA_MLA_QBLK (KVA_MLA_BM * 128) /* bytes of one 64-column block of the Q tile */
#define KVA_MLA_KBLK (KVA_MLA_BN * 128) /* ... of a K/V tile */

/* Byte offset of 16-byte chunk c (0..71) of row `row` in a tile of R rows. */
template <int R>
static __device__ __forceinline__ uint32_t mla_sw(int row, int c) {
  return (uint32_t)((c >> 3) * (R * 128) + row * 128 + (((c & 7) ^ (row & 7)) << 4));
}

/* Shared-memory matrix descriptor, 128-byte swizzle (see extend_wgmma.cuh):
 * K-major operands: 8-row groups at sbo = 1024; MN-major (V): 64-column
 * blocks at lbo, 8-key groups at sbo. */
static __device__ __forceinline__ uint64_t mla_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3ffffu) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
         ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

/* Warp-uniform in ptxas's eyes (see wg_uni in extend_wgmma.cuh). */
static __device__ __forceinline__ int mla_uni(int v) { return __shfl_sync(0xffffffffu, v, 0); }

/* KV slot of `key` (page table row pt), -1 at or past k1. */
static __device__ __forceinline__ int mla_slot(const int32_t *pt, int key, int k1,
                                               const kva_mla_args &a) {
  if (key >= k1) return -1;
  const uint32_t pg = (__umulhi((uint32_t)key, a.ps_mul) + (uint32_t)key) >> a.ps_shift;
  return __ldg(pt + pg) * a.page_size + (key - (int)pg * a.page_size);
}

/* cp.async of one key row into dst: 8 threads per row (128 contiguous
 * bytes per 8 lanes), row tid / 8 at KV slot `slot` (-1: zero-filled, so
 * that masked P * V stays finite). 16-bit: swizzled tile, 9 chunks per
 * thread; fp8: byte tile [32][576], chunks (tid % 8) + 8 i < 36. */
template <int KV8>
static __device__ __forceinline__ void mla_issue_row(uint32_t dst, const unsigned char *kv, int slot,
                                                     int tid, uint64_t pol) {
  static_assert(KVA_MLA_BN * 8 == KVA_MLA_THREADS, "one row per 8 threads");
  const int row = tid >> 3;
  const int bytes = slot >= 0 ? 16 : 0;
  if (KV8) {
    const unsigned char *src = kv + (slot >= 0 ? (int64_t)slot * KVA_MLA_D : 0);
#pragma unroll
    for (int i = 0; i < 5; i++) {
      const int c = (tid & 7) + 8 * i;
      if (c < KVA_MLA_D / 16) kva_cp_async_16(dst + row * KVA_MLA_D + c * 16, src + c * 16, bytes);
    }
  } else {
    const unsigned char *src = kv + (slot >= 0 ? (int64_t)slot * KVA_MLA_D * 2 : 0);
#pragma unroll
    for (int i = 0; i < 9; i++) {
      const int c = (tid & 7) + 8 * i;
      kva_cp_async_16_hint(dst + mla_sw<KVA_MLA_BN>(row, c), src + c * 16, bytes, pol);
    }
  }
}
/* The key tile starting at kt (keys at or past k1 zero-filled). */
template <int KV8>
static __device__ __forceinline__ void mla_issue_kv(uint32_t dst, const unsigned char *kv,
                                                    const int32_t *pt, int kt, int k1,
                                                    const kva_mla_args &a, int tid,
                                                    uint64_t pol) {
  mla_issue_row<KV8>(dst, kv, mla_slot(pt, kt + (tid >> 3), k1, a), tid, pol);
}

/* cp.async of Q rows row0 .. row0 + 63 of the request (zero past `rows`). */
static __device__ __forceinline__ void mla_issue_q(uint32_t dst, const kva_mla_args &a, int tok0,
                                                   int row0, int rows, int tid) {
  const unsigned char *qg = (const unsigned char *)a.q;
#pragma unroll
  for (int p = 0; p < 2; p++) {
    const int row = (tid >> 3) + 32 * p, grow = row0 + row, ok = grow < rows;
    const int t = grow / a.hq, h = grow - t * a.hq;
    const unsigned char *src = ok ? qg + ((int64_t)(tok0 + t) * a.hq + h) * (KVA_MLA_D * 2) : qg;
#pragma unroll
    for (int i = 0; i < 9; i++) {
      const int c = (tid & 7) + 8 * i;
      kva_cp_async_16(dst + mla_sw<KVA_MLA_BM>(row, c), ok ? src + c * 16 : qg, ok ? 16 : 0);
    }
  }
}

/* two e4m3 (low 16 bits of x) -> QT (the tensor cores' type; exact) */
template <int QT>
static __device__ __forceinline__ uint32_t mla_e4m3x2(uint32_t x) {
  return QT == KVA_F16 ? kva_cvt_e4m3x2_f16x2((uint16_t)(x & 0xffffu))
                       : kva_cvt_e4m3x2_bf16x2((uint16_t)(x & 0xffffu));
}

/* Eight e4m3 (the bytes of x, then of y) -> eight QT values (16 bytes);
 * f16 takes the high halves by the conversion's operand (no shift), as
 * v10 does */
template <int QT>
static __device__ __forceinline__ uint4 mla_e4m3x8(uint32_t x, uint32_t y) {
  if (QT == KVA_F16)
    return make_uint4(kva_cvt_e4m3x2_f16x2_lo(x), kva_cvt_e4m3x2_f16x2_hi(x),
                      kva_cvt_e4m3x2_f16x2_lo(y), kva_cvt_e4m3x2_f16x2_hi(y));
  return make_uint4(mla_e4m3x2<QT>(x), mla_e4m3x2<QT>(x >> 16), mla_e4m3x2<QT>(y),
                    mla_e4m3x2<QT>(y >> 16));
}

/* This thread's chunks of an fp8 byte tile [32][576] (the ones its
 * mla_issue_row copied: row tid / 8, chunks (tid % 8) + 8 i) -> the 16-bit
 * swizzled tile (type QT): 16 bytes in, two 16-byte chunks out. Only its
 * own cp.async copies are read, so no barrier is needed before, and the
 * stage may take its next copies right after. */
template <int QT>
static __device__ __forceinline__ void mla_convert_own(unsigned char *tile,
                                                       const unsigned char *st8, int tid) {
  const int row = tid >> 3;
#pragma unroll
  for (int i = 0; i < 5; i++) {
    const int c8 = (tid & 7) + 8 * i;
    if (c8 >= KVA_MLA_D / 16) break;
    const uint4 x = *(const uint4 *)(st8 + row * KVA_MLA_D + c8 * 16);
    *(uint4 *)(tile + mla_sw<KVA_MLA_BN>(row, 2 * c8)) = mla_e4m3x8<QT>(x.x, x.y);
    *(uint4 *)(tile + mla_sw<KVA_MLA_BN>(row, 2 * c8 + 1)) = mla_e4m3x8<QT>(x.z, x.w);
  }
}

/* fp8, one step of the conversion pipeline: this thread's part of tile nx
 * (landed in byte stage nx % 2) into 16-bit tile nx % 3, then its chunks of
 * that byte stage refilled with tile nx + 2 (one commit group). nslot: the
 * slot of this thread's row of tile nx + 2 on entry, of tile nx + 3 on
 * return. */
template <int CT>
static __device__ __forceinline__ void mla_fp8_step(unsigned char *p_kv, uint32_t s_kv, int nx,
                                                    int ntiles, const unsigned char *kvg,
                                                    int &nslot, const int32_t *pt, int k0,
                                                    int k1, const kva_mla_args &a, int tid,
                                                    uint64_t pol) {
  constexpr int TILE = KVA_MLA_TILE, TILE8 = KVA_MLA_TILE8, SLOTS8 = KVA_MLA_SLOTS8;
  const int st = nx & 1;
  if (nx < ntiles)
    mla_convert_own<CT>(p_kv + (nx % SLOTS8) * TILE, p_kv + SLOTS8 * TILE + st * TILE8, tid);
  if (nx + 2 < ntiles)
    mla_issue_row<1>(s_kv + SLOTS8 * TILE + st * TILE8, kvg, nslot, tid, pol);
  kva_cp_async_commit();
  nslot = mla_slot(pt, k0 + (nx + 3) * KVA_MLA_BN + (tid >> 3), k1, a);
}

/* 16 bytes of a bf16 Q -> f16 (kva_q_bf16x2_to_f16x2), in place */
static __device__ __forceinline__ void mla_q_f16x8(uint4 *p) {
  *p = make_uint4(kva_q_bf16x2_to_f16x2(p->x), kva_q_bf16x2_to_f16x2(p->y),
                  kva_q_bf16x2_to_f16x2(p->z), kva_q_bf16x2_to_f16x2(p->w));
}
static __device__ __forceinline__ void mla_q_bf16_to_f16(unsigned char *q, int tid) {
#pragma unroll 2
  for (int i = tid; i < KVA_MLA_QTILE / 16; i += KVA_MLA_THREADS) mla_q_f16x8((uint4 *)q + i);
}

template <int QT>
static __device__ __forceinline__ void mla_mma_s(float d[16], uint64_t da, uint64_t db, int acc) {
  if (QT == KVA_F16)
    kva_wgmma_m64n32k16_ss_f16(d, da, db, acc);
  else
    kva_wgmma_m64n32k16_ss_bf16(d, da, db, acc);
}
template <int QT>
static __device__ __forceinline__ void mla_mma_pv(float d[64], const uint32_t a[4], uint64_t db) {
  if (QT == KVA_F16)
    kva_wgmma_m64n128k16_rs_f16_tb(d, a, db);
  else
    kva_wgmma_m64n128k16_rs_bf16_tb(d, a, db);
}

/* This warpgroup's half of S = Q K^T (the k-steps of 16 head dims kb with
 * kb % 2 == wg: 18 wgmma m64n32k16, Q and K from smem) for the K tile at
 * s_t: issued and committed as one group, not waited for. The descriptors
 * are one base plus compile-time offsets (few live registers). */
template <int QT>
static __device__ __forceinline__ void mla_issue_s(float s[16], uint32_t s_q, uint32_t s_t, int wg) {
#pragma unroll
  for (int i = 0; i < 16; i++) {
    s[i] = 0.0f;
    kva_reg_fence_f32(&s[i]);
  }
  const uint64_t dq = mla_desc(s_q + 32 * wg, 16, 1024), dk = mla_desc(s_t + 32 * wg, 16, 1024);
  kva_wgmma_fence();
#pragma unroll
  for (int i = 0; i < KVA_MLA_D / 32; i++) {
    /* k-step kb = 2 i + wg: 64-column block i / 2, 16-column step 2 (i % 2) + wg */
    const uint32_t qo = (uint32_t)((i >> 1) * KVA_MLA_QBLK + (i & 1) * 64);
    const uint32_t ko = (uint32_t)((i >> 1) * KVA_MLA_KBLK + (i & 1) * 64);
    mla_mma_s<QT>(s, dq + (qo >> 4), dk + (ko >> 4), i > 0);
  }
  kva_wgmma_commit();
}

/* Both warpgroups' halves of S summed (same accumulator layout) through
 * xs [4][128] float4: warpgroup 1 stores its half, warpgroup 0 adds it and
 * stores the sum, warpgroup 1 loads that (named barriers 1 and 2). Both
 * warpgroups sync on both barriers: warpgroup 1 waits for the sum anyway,
 * so an arrive would buy nothing, and full syncs order every access (the
 * arrive form drew compute-sanitizer racecheck reports; measured: no change
 * in speed). xs is free again
 * when a warpgroup returns: warpgroup 0 read the half before storing the
 * sum, and warpgroup 1 reads the sum before its next store, which warpgroup
 * 0 waits for at barrier 1. */
static __device__ __forceinline__ void mla_exchange(float s[16], float4 *xs, int wg, int tw) {
  /* the barriers sit outside the warpgroup branches: one instruction for
   * all 256 threads (compute-sanitizer synccheck) */
  if (wg) {
#pragma unroll
    for (int j = 0; j < 4; j++)
      xs[j * 128 + tw] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
  }
  kva_bar_sync(1, KVA_MLA_THREADS);
  if (!wg) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float4 x = xs[j * 128 + tw];
      s[4 * j] += x.x;
      s[4 * j + 1] += x.y;
      s[4 * j + 2] += x.z;
      s[4 * j + 3] += x.w;
      xs[j * 128 + tw] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
    }
  }
  kva_bar_sync(2, KVA_MLA_THREADS);
  if (wg) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const float4 x = xs[j * 128 + tw];
      s[4 * j] = x.x;
      s[4 * j + 1] = x.y;
      s[4 * j + 2] = x.z;
      s[4 * j + 3] = x.w;
    }
  }
}

/* O's accumulators fenced (see kva_reg_fence_f32); both kernels */
static __device__ __forceinline__ void mla_fence_o(float o[2][64]) {
#pragma unroll
  for (int i = 0; i < 64; i++) {
    kva_reg_fence_f32(&o[0][i]);
    kva_reg_fence_f32(&o[1][i]);
  }
}

/* O's rows times the factor of their half (rows g and g + 8); both kernels */
static __device__ __forceinline__ void mla_scale_o(float o[2][64], const float alpha[2]) {
#pragma unroll
  for (int hf = 0; hf < 2; hf++)
#pragma unroll
    for (int j = 0; j < 16; j++) {
      o[0][4 * j + 2 * hf] *= alpha[hf];
      o[0][4 * j + 2 * hf + 1] *= alpha[hf];
      o[1][4 * j + 2 * hf] *= alpha[hf];
      o[1][4 * j + 2 * hf + 1] *= alpha[hf];
    }
}

/* Online softmax of a tile of S of NJ 8-key column groups at key kt
 * (masked only on a chunk's boundary tiles) against the running max m:
 * logits in base 2, each row's max over its quad, m and l updated
 * (l = l c + sum), c the factor for what was accumulated before, P packed
 * to Q's type in pk and, when KEEP_P, left in s in f32. v2 (32-key tiles)
 * and v5 (64-key blocks, which rescale P) both run it. */
template <int QT, int NJ, bool KEEP_P>
static __device__ __forceinline__ void mla_softmax_tile(float s[4 * NJ], float m[2], float l[2],
                                                        float c[2], uint32_t pk[NJ][2], int kt,
                                                        int k1, int cached, const int pos[2],
                                                        const kva_mla_args &a, float qk_mul,
                                                        int tq) {
  const bool need_mask = kt + 8 * NJ > k1 || (a.causal && kt + 8 * NJ - 1 > cached);
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < NJ; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float x = s[4 * j + e] * qk_mul;
      if (need_mask) {
        const int key = kt + 8 * j + 2 * tq + (e & 1);
        if (key >= k1 || (a.causal && key > pos[e >> 1])) x = -INFINITY;
      }
      s[4 * j + e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
    mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
    const float mn = kva_online_max(m[hf], mx[hf]);
    const float mu = mn == -INFINITY ? 0.0f : mn; /* all masked so far: p = 0, no NaN */
    c[hf] = kva_ex2(m[hf] - mu);
    m[hf] = mn;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const float p0 = kva_ex2(s[4 * j + 2 * hf] - mu), p1 = kva_ex2(s[4 * j + 2 * hf + 1] - mu);
      sum += p0 + p1;
      pk[j][hf] = mla_pack<QT>(p0, p1);
      if (KEEP_P) {
        s[4 * j + 2 * hf] = p0;
        s[4 * j + 2 * hf + 1] = p1;
      }
    }
    l[hf] = l[hf] * c[hf] + sum;
  }
}

/* Online softmax of the tile of S at key kt (masked on the request's
 * boundary tiles only), O rescaled where a row's max moved, then
 * O[:, 256 wg ..] += P V issued and committed (not waited for). */
template <int QT>
static __device__ __forceinline__ void mla_softmax_pv(float s[16], float o[2][64], float m[2],
                                                      float l[2], const int pos[2], int kt, int k1,
                                                      int cached, const kva_mla_args &a,
                                                      float qk_mul, uint32_t s_cur, int wg,
                                                      int tq) {
  constexpr int BN = KVA_MLA_BN, NJ = BN / 8;
  /* ---- logits (base 2), mask, online softmax; P -> registers ---- */
  uint32_t pk[NJ][2];
  float alpha[2];
  mla_softmax_tile<QT, NJ, false>(s, m, l, alpha, pk, kt, k1, cached, pos, a, qk_mul, tq);
  /* a row's max rarely moves after the first tiles: skip the rescale */
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) mla_scale_o(o, alpha);

  /* ---- O[:, 256 wg ..] += P V (V: the tile's first 512 columns) ---- */
  mla_fence_o(o);
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    kva_reg_fence_u32(&pk[j][0]);
    kva_reg_fence_u32(&pk[j][1]);
  }
  kva_wgmma_fence();
  const uint64_t dv = mla_desc(s_cur + 4 * wg * KVA_MLA_KBLK, KVA_MLA_KBLK, 1024);
#pragma unroll
  for (int kk = 0; kk < BN / 16; kk++) {
    const uint32_t pa[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0],
                            pk[2 * kk + 1][1]};
#pragma unroll
    for (int h = 0; h < 2; h++)
      mla_mma_pv<QT>(o[h], pa, dv + ((2 * h * KVA_MLA_KBLK + kk * 16 * 128) >> 4));
  }
  kva_wgmma_commit();

}

/* While the kernel before this one (PDL) finishes, before
 * griddepcontrol.wait: the first `keys` latents of the worker's first
 * decode chunk into L2, one bulk prefetch per page run (thread 0 of row
 * tile 0). It reads plan metadata only, copied before the kernels before
 * (as the schedule is); those kernels may still write the new tokens'
 * latents, but they write them into L2, so a prefetched line stays
 * current. */
template <int KV8>
static __device__ __forceinline__ void mla_prefetch_first(const kva_mla_args &a,
                                                          const kva_split_work &wk, int keys) {
  constexpr int ROW = KV8 ? KVA_MLA_D : 2 * KVA_MLA_D; /* bytes per token */
  for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
    const int r = a.sched_order[wi];
    if (a.split_indptr[r + 1] == a.split_indptr[r]) continue; /* not a decode request */
    /* kva_split_chunk_at's bounds, with cache_seqlens read only when needed */
    const int k1 = wi == wk.end_req ? wk.end_pos : a.cache_seqlens[r];
    int key = wi == wk.begin_req ? wk.begin_pos : 0;
    const int kend = k1 < key + keys ? k1 : key + keys;
    const int32_t *const pt = a.page_table + (size_t)r * a.hdr->page_table_stride;
    while (key < kend) {
      const int page = pt[key / a.page_size], off = key % a.page_size;
      const int n = a.page_size - off < kend - key ? a.page_size - off : kend - key;
      if (page >= 0)
        kva_bulk_prefetch_l2(
            (const unsigned char *)a.kv + ((int64_t)page * a.page_size + off) * ROW,
            (unsigned)(n * ROW));
      key += n;
    }
    return;
  }
}

/* v2. Per request chunk and key tile it, both warpgroups (in this order):
 * wait for tile it+1 and one CTA barrier; issue tile it+NS-1's loads (its
 * page-table entries were fetched one tile earlier); issue the half S of
 * tile it+1 (async); softmax of tile it (its S already summed) and P into
 * registers; issue P V of tile it; wait for the S group, sum the halves
 * through smem (one named barrier); wait for P V. So the tensor cores run
 * S(it+1) under the softmax of tile it and P V(it) under the S exchange;
 * O is rescaled only when a row's max moved. fp8: each thread converts
 * its own copies of tile it+2 into the third 16-bit tile while S(it+1) and
 * P V(it) run, then refills that byte stage with tile it+4 (two byte tiles
 * in flight), so the conversion needs no barrier of its own. */
template <int QT, int KV8>
__global__ void __launch_bounds__(KVA_MLA_THREADS, 1)
    kva_mla_kernel(const __grid_constant__ kva_mla_args a) {
  constexpr int QTILE = KVA_MLA_QTILE, TILE = KVA_MLA_TILE, TILE8 = KVA_MLA_TILE8;
  constexpr int NS = KVA_MLA_STAGES(KV8), BN = KVA_MLA_BN, NJ = BN / 8; /* S n-tiles */
  /* the tensor cores' type: f16 for fp8 latents (see mla_q_bf16_to_f16) */
  constexpr int CT = KV8 ? KVA_F16 : QT;
  const float qk_mul = CT != QT ? a.qk_mul * (float)(1 << KVA_FP8_Q_SHIFT) : a.qk_mul;
  constexpr int SLOTS8 = KVA_MLA_SLOTS8;
  constexpr int AHEAD = KV8 ? 2 : NS - 1; /* tiles the prologue loads */
  static_assert(NJ == 4 && (KV8 ? NS == 2 : NS >= 3), "tile shape");
  static_assert(KVA_MLA_SMEM(KV8) <= 232448, "227 KB of smem per CTA");
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_q = smem + (s_q - s_raw);
  /* 16-bit: stage i at s_kv + i TILE. fp8: 16-bit tile j (= key tile % 3)
   * at s_kv + j TILE, byte stage i (= key tile % 2) at s_kv + 3 TILE + i
   * TILE8. */
  const uint32_t s_kv = s_q + QTILE;
  unsigned char *const p_kv = p_q + QTILE;
  float4 *const xs = (float4 *)(p_q + QTILE + KVA_MLA_RING(KV8)); /* [NJ][128] */
  volatile int *const flag = (volatile int *)(p_q + QTILE + KVA_MLA_RING(KV8) + KVA_MLA_XS2);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = mla_uni(warp >> 2), wq = warp & 3, g = lane >> 2, tq = lane & 3;
  const int tw = tid & 127; /* thread within the warpgroup */
  const kva_plan_header *hdr = a.hdr;
  /* a PDL-launched kernel after this one may be scheduled now; it waits for
   * this grid's end before touching memory */
  kva_griddep_launch_dependents();
  KVA_TRACE_STAMP(0, kva_globaltimer());
  unsigned trace_chunks = 0, trace_merges = 0;
  const int row0 = (int)blockIdx.y * KVA_MLA_BM;
  /* row tiles come from the plan's capacity; past the batch's longest
   * request no request has rows here */
  if ((int)blockIdx.x >= hdr->num_workers || row0 >= hdr->max_q_len * a.hq) {
    KVA_TRACE_STAMP(8, kva_globaltimer());
    KVA_TRACE_STAMP(9, kva_smid());
    return;
  }
  const kva_split_work wk = a.sched[blockIdx.x];
  if (a.prefetch_keys > 0 && blockIdx.y == 0 && tid == 0)
    mla_prefetch_first<KV8>(a, wk, a.prefetch_keys);
  const unsigned char *const kvg = (const unsigned char *)a.kv;
  const uint64_t kv_pol = (a.l2_hints & 2) ? kva_l2_evict_first() : kva_l2_evict_normal();

  for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
    const int r = a.sched_order[wi]; /* positions in the schedule's order */
    const int nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
    if (nsplit == 0) continue; /* not a decode request */
    const int nt = a.num_new[r], rows = nt * a.hq;
    if (row0 >= rows) continue; /* no rows of this row tile */
    const int kv_len = a.cache_seqlens[r], cached = kv_len - nt;
    const kva_split_chunk ch = kva_split_chunk_at(wk, wi, kv_len);
    const int split = ch.split, k0 = ch.k0, k1 = ch.k1;
    const int ntiles = k1 > k0 ? (k1 - k0 + BN - 1) / BN : 0;
    const int tok0 = a.cu_q[r];
    const int32_t *const pt = a.page_table + (size_t)r * hdr->page_table_stride;

    /* Q, KV and the outputs belong to the kernels before this one (PDL) */
    kva_griddep_wait();
    if (trace_chunks == 0) KVA_TRACE_STAMP(1, kva_globaltimer());
    /* prologue: Q and tile 0 in group 0, tiles 1 .. AHEAD-1 one group
     * each (16-bit: NS - 2 in flight; fp8: the byte stages' two) */
    mla_issue_q(s_q, a, tok0, row0, rows, tid);
#pragma unroll
    for (int i = 0; i < AHEAD; i++) {
      if (i < ntiles)
        mla_issue_kv<KV8>(KV8 ? s_kv + SLOTS8 * TILE + i * TILE8 : s_kv + i * TILE, kvg, pt,
                          k0 + i * BN, k1, a, tid, kv_pol);
      kva_cp_async_commit();
    }
    /* KV slot of this thread's row of the next tile to load (-1: none) */
    int nslot = mla_slot(pt, k0 + AHEAD * BN + (tid >> 3), k1, a);

    /* this thread's accumulator rows: tile rows 16 wq + g + 8 hf */
    int pos[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) pos[hf] = cached + (row0 + 16 * wq + g + 8 * hf) / a.hq;
    float o[2][64], m[2], l[2];
#pragma unroll
    for (int i = 0; i < 64; i++) o[0][i] = o[1][i] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;

    /* S of tile 0, summed */
    float s[4 * NJ];
#pragma unroll
    for (int i = 0; i < 4 * NJ; i++) s[i] = 0.0f;
    if (ntiles > 0) {
      kva_cp_async_wait<KV8 ? 1 : NS - 2>(); /* this thread's copies of tile 0 and Q landed */
      kva_fence_proxy_async_smem();          /* cp.async data -> wgmma (async proxy) */
      __syncthreads();
      if (KV8) {
        /* Q (every thread's copies: after the barrier), then tiles 0 and
         * 1 into slots 0 and 1, each stage refilled with tile 2 and 3 */
        if (CT != QT) mla_q_bf16_to_f16(p_q, tid);
        mla_fp8_step<CT>(p_kv, s_kv, 0, ntiles, kvg, nslot, pt, k0, k1, a, tid, kv_pol);
        kva_cp_async_wait<1>(); /* tile 1 */
        mla_fp8_step<CT>(p_kv, s_kv, 1, ntiles, kvg, nslot, pt, k0, k1, a, tid, kv_pol);
        kva_fence_proxy_async_smem();
        __syncthreads();
      }
      mla_issue_s<CT>(s, s_q, s_kv, wg);
      kva_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&s[i]);
      mla_exchange(s, xs, wg, tw);
    }

    /* every tile but the last: S of tile it+1 in flight during tile it's
     * softmax (straight-line wgmma code: ptxas serializes wgmma around
     * conditional issue) */
    for (int it = 0; it + 1 < ntiles; it++) {
      uint32_t s_cur, s_nx;
      if (KV8) {
        /* tile it+1 was converted (every thread's part) and fenced during
         * tile it-1, whose P V is complete: its slot takes tile it+2 */
        __syncthreads();
        s_cur = s_kv + (it % SLOTS8) * TILE;
        s_nx = s_kv + ((it + 1) % SLOTS8) * TILE;
      } else {
        kva_cp_async_wait<NS - 3>(); /* this thread's copies of tile it+1 landed */
        kva_fence_proxy_async_smem();
        /* everyone's did; every P V of tile it-1 is complete (its stage is
         * free) */
        __syncthreads();
        const int nx = it + NS - 1, st = nx % NS;
        if (nx < ntiles) mla_issue_row<KV8>(s_kv + st * TILE, kvg, nslot, tid, kv_pol);
        kva_cp_async_commit();
        nslot = mla_slot(pt, k0 + (nx + 1) * BN + (tid >> 3), k1, a); /* used next tile */
        s_cur = s_kv + (it % NS) * TILE;
        s_nx = s_kv + ((it + 1) % NS) * TILE;
      }
      float sn[4 * NJ];
      mla_issue_s<CT>(sn, s_q, s_nx, wg);
      mla_softmax_pv<CT>(s, o, m, l, pos, k0 + it * BN, k1, cached, a, qk_mul, s_cur, wg, tq);
      if (KV8) {
        /* tile it+2 converted under S(it+1) and P V(it); its byte stage
         * then takes tile it+4 */
        kva_cp_async_wait<1>(); /* this thread's copies of tile it+2 */
        mla_fp8_step<CT>(p_kv, s_kv, it + 2, ntiles, kvg, nslot, pt, k0, k1, a, tid, kv_pol);
        kva_fence_proxy_async_smem(); /* for S(it+2), after the next barrier */
      }
      /* tile it+1's S summed while P V runs */
      kva_wgmma_wait<1>();
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&sn[i]);
      mla_exchange(sn, xs, wg, tw);
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) s[i] = sn[i];
      kva_wgmma_wait<0>();
      mla_fence_o(o);
    }
    if (ntiles > 0) { /* the last tile: its stage landed and was synced above */
      const int it = ntiles - 1;
      mla_softmax_pv<CT>(s, o, m, l, pos, k0 + it * BN, k1, cached, a, qk_mul,
                         KV8 ? s_kv + (it % SLOTS8) * TILE : s_kv + (it % NS) * TILE, wg, tq);
      kva_wgmma_wait<0>();
      mla_fence_o(o);
    }
    kva_cp_async_wait<0>(); /* only empty groups remain (Q's, when there were no tiles) */
    trace_chunks++;
    KVA_TRACE_STAMP(3, kva_globaltimer());

    /* ---- O (or the partial row) straight from the accumulators ---- */
    if (nsplit == 2 && tid == 0) *flag = mla_known_last(a, r, split);
    float lt[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      lt[hf] = l[hf];
      lt[hf] += __shfl_xor_sync(0xffffffffu, lt[hf], 1);
      lt[hf] += __shfl_xor_sync(0xffffffffu, lt[hf], 2);
    }
    if (nsplit == 2) __syncthreads(); /* flag written */
    /* the ring is free until the next request's prologue */
    trace_merges += mla_finish_chunk<QT, true>(a, o, lt, m, r, split, nsplit,
                                               nsplit == 2 && *flag, nt, tok0, row0, rows, tid,
                                               wg, wq, g, tq, flag, (float *)p_kv,
                                               (size_t)KVA_MLA_RING(KV8));
    __syncthreads(); /* flag read, smem done with before the next request's copies */
  }
  KVA_TRACE_STAMP(8, kva_globaltimer());
  KVA_TRACE_STAMP(9, kva_smid());
  KVA_TRACE_STAMP(10, trace_chunks);
  KVA_TRACE_STAMP(11, trace_merges);
}

#endif /* KVA_CUDA_MLA_KERNEL_CUH */
