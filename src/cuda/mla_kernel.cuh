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
 * last merges the partial rows by LSE into O (as decode_kernel.cuh does,
 * with a counter per (request, row tile) reset by that CTA). */
#ifndef KVA_CUDA_MLA_KERNEL_CUH
#define KVA_CUDA_MLA_KERNEL_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/mla.h"
#include "cuda/online_max.cuh"
#include "cuda/ptx.cuh"
#include "cuda/split_merge.cuh"

#define KVA_MLA_LN2 0.6931471805599453f
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

/* two e4m3 (low 16 bits of x) -> Q's type (exact) */
template <int QT>
static __device__ __forceinline__ uint32_t mla_e4m3x2(uint32_t x) {
  return QT == KVA_F16 ? kva_cvt_e4m3x2_f16x2((uint16_t)(x & 0xffffu))
                       : kva_cvt_e4m3x2_bf16x2((uint16_t)(x & 0xffffu));
}

/* fp8 byte tile [32][576] -> 16-bit swizzled tile (Q's type): 16 bytes in,
 * two 16-byte chunks out. */
template <int QT>
static __device__ __forceinline__ void mla_convert(unsigned char *tile, const unsigned char *st8,
                                                   int tid) {
#pragma unroll
  for (int i = 0; i < 5; i++) {
    const int idx = tid + KVA_MLA_THREADS * i, row = idx / 36, c8 = idx - row * 36;
    if (idx >= KVA_MLA_BN * 36) break;
    const uint4 x = *(const uint4 *)(st8 + row * KVA_MLA_D + c8 * 16);
    *(uint4 *)(tile + mla_sw<KVA_MLA_BN>(row, 2 * c8)) =
        make_uint4(mla_e4m3x2<QT>(x.x), mla_e4m3x2<QT>(x.x >> 16), mla_e4m3x2<QT>(x.y),
                   mla_e4m3x2<QT>(x.y >> 16));
    *(uint4 *)(tile + mla_sw<KVA_MLA_BN>(row, 2 * c8 + 1)) =
        make_uint4(mla_e4m3x2<QT>(x.z), mla_e4m3x2<QT>(x.z >> 16), mla_e4m3x2<QT>(x.w),
                   mla_e4m3x2<QT>(x.w >> 16));
  }
}

/* The Q tile (bf16, any swizzle: element-wise in place) -> f16 times
 * 2^-KVA_MLA_FP8_Q_SHIFT, saturated to f16's range: fp8 latents with bf16
 * Q run the tensor cores in f16, where e4m3 -> f16 is one instruction per
 * two values (-> bf16 took four and bound the kernel). Exact for 2^-6 <=
 * |q| <= 2^23 (f16 normals after the shift); the shift is undone in the
 * logits' multiplier. */
#define KVA_MLA_FP8_Q_SHIFT 8
static __device__ __forceinline__ void mla_q_bf16_to_f16(unsigned char *q, int tid) {
  const float sc = 1.0f / (float)(1 << KVA_MLA_FP8_Q_SHIFT), big = 65504.0f;
#pragma unroll 2
  for (int i = tid; i < KVA_MLA_QTILE / 16; i += KVA_MLA_THREADS) {
    uint4 *const p = (uint4 *)q + i;
    uint32_t w[4] = {p->x, p->y, p->z, p->w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const float lo = __uint_as_float(w[k] << 16) * sc;
      const float hi = __uint_as_float(w[k] & 0xffff0000u) * sc;
      w[k] = kva_pack_f16x2(fminf(fmaxf(lo, -big), big), fminf(fmaxf(hi, -big), big));
    }
    *p = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <int QT>
static __device__ __forceinline__ uint32_t mla_pack(float lo, float hi) {
  return QT == KVA_F16 ? kva_pack_f16x2(lo, hi) : kva_pack_bf16x2(lo, hi);
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

/* The chunks of request r for this CTA's row tile merged by LSE into O (and
 * LSE), by the CTA whose chunk finished last; as dec_merge_chunks
 * (decode_kernel.cuh) at 512 dims, on kva_split_merge4. */
template <int QT>
static __device__ void mla_merge_chunks(const kva_mla_args &a, int r, int nsplit, int nt, int tok0,
                                        int row0, int rows_here, int tid) {
  for (int idx = tid; idx < rows_here * (KVA_MLA_DV / 4); idx += KVA_MLA_THREADS) {
    const int row = idx / (KVA_MLA_DV / 4), d4 = idx % (KVA_MLA_DV / 4);
    const int grow = row0 + row, t = grow / a.hq, h = grow - t * a.hq;
    const size_t p0 = (size_t)a.split_row_offset[r] + t;
    float mx, ws;
    const float4 acc = kva_split_merge4(a.part_o, a.part_lse, p0, nt, a.hq, h, nsplit, KVA_MLA_DV,
                                        d4, &mx, &ws);
    const float inv = ws > 0.0f ? 1.0f / ws : 0.0f;
    const size_t orow = (size_t)(tok0 + t) * a.hq + h;
    *(uint2 *)((uint16_t *)a.o + orow * KVA_MLA_DV + 4 * d4) =
        make_uint2(mla_pack<QT>(acc.x * inv, acc.y * inv), mla_pack<QT>(acc.z * inv, acc.w * inv));
    if (a.lse && d4 == 0) a.lse[orow] = ws > 0.0f ? mx + logf(ws) : -INFINITY;
  }
}

/* mla_merge_chunks with each row's chunk weights computed once, into smem
 * (sw: rows_here * (nsplit + 1) floats): a row has 512 columns, 128 items of
 * 4, so each thread sums many items, and per item the running-max merge
 * would wait for one round of loads; here 8 items x 2 chunks of loads are in
 * flight at a time (measured, h64 varlen: a merge of 2-4 chunks took ~29 us
 * item by item). Same chunk order as the per-item merge. */
#define KVA_MLA_MERGE_ITEMS 8
template <int QT>
static __device__ void mla_merge_chunks_w(const kva_mla_args &a, int r, int nsplit, int nt,
                                          int tok0, int row0, int rows_here, int tid, float *sw) {
  const size_t p0 = (size_t)a.split_row_offset[r];
  float *const sinv = sw + rows_here * nsplit;
  for (int idx = tid; idx < rows_here * nsplit; idx += KVA_MLA_THREADS) {
    const int row = idx / nsplit, j = idx - row * nsplit;
    const int grow = row0 + row, t = grow / a.hq, h = grow - t * a.hq;
    sw[idx] = __ldcg(a.part_lse + (p0 + t + (size_t)j * nt) * a.hq + h);
  }
  __syncthreads();
  for (int row = tid; row < rows_here; row += KVA_MLA_THREADS) { /* a thread per row */
    float *const w = sw + row * nsplit;
    float mx = -INFINITY;
    for (int j = 0; j < nsplit; j++) mx = fmaxf(mx, w[j]);
    float ws = 0.0f;
    for (int j = 0; j < nsplit; j++) {
      const float e = mx == -INFINITY ? 0.0f : kva_ex2((w[j] - mx) * KVA_SPLIT_LOG2E);
      w[j] = e;
      ws += e;
    }
    sinv[row] = ws > 0.0f ? 1.0f / ws : 0.0f;
    const int grow = row0 + row, t = grow / a.hq, h = grow - t * a.hq;
    if (a.lse) a.lse[(size_t)(tok0 + t) * a.hq + h] = ws > 0.0f ? mx + logf(ws) : -INFINITY;
  }
  __syncthreads();
  const int n = rows_here * (KVA_MLA_DV / 4);
  const size_t jstride = (size_t)nt * a.hq * KVA_MLA_DV; /* chunk to chunk, floats */
  const uint64_t pol = (a.l2_hints & 1) ? kva_l2_evict_first() : kva_l2_evict_normal();
  for (int base = tid; base < n; base += KVA_MLA_MERGE_ITEMS * KVA_MLA_THREADS) {
    float4 acc[KVA_MLA_MERGE_ITEMS];
    const float *src[KVA_MLA_MERGE_ITEMS];
    int wrow[KVA_MLA_MERGE_ITEMS];
#pragma unroll
    for (int k = 0; k < KVA_MLA_MERGE_ITEMS; k++) {
      const int idx = base + k * KVA_MLA_THREADS, row = (idx < n ? idx : 0) / (KVA_MLA_DV / 4);
      const int d4 = (idx < n ? idx : 0) % (KVA_MLA_DV / 4);
      const int grow = row0 + row, t = grow / a.hq, h = grow - t * a.hq;
      acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      src[k] = a.part_o + ((p0 + t) * a.hq + h) * KVA_MLA_DV + 4 * d4;
      wrow[k] = row * nsplit;
    }
#pragma unroll 2
    for (int j = 0; j < nsplit; j++) {
      float4 v[KVA_MLA_MERGE_ITEMS];
#pragma unroll
      for (int k = 0; k < KVA_MLA_MERGE_ITEMS; k++)
        v[k] = base + k * KVA_MLA_THREADS < n ? kva_ldcg_f32x4_hint(src[k] + j * jstride, pol)
                                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int k = 0; k < KVA_MLA_MERGE_ITEMS; k++) {
        const float w = sw[wrow[k] + j]; /* fmaf: mla_merge_known_last's arithmetic */
        acc[k].x = fmaf(w, v[k].x, acc[k].x);
        acc[k].y = fmaf(w, v[k].y, acc[k].y);
        acc[k].z = fmaf(w, v[k].z, acc[k].z);
        acc[k].w = fmaf(w, v[k].w, acc[k].w);
      }
    }
#pragma unroll
    for (int k = 0; k < KVA_MLA_MERGE_ITEMS; k++) {
      const int idx = base + k * KVA_MLA_THREADS;
      if (idx >= n) continue;
      const int row = idx / (KVA_MLA_DV / 4), d4 = idx % (KVA_MLA_DV / 4);
      const int grow = row0 + row, t = grow / a.hq, h = grow - t * a.hq;
      const float inv = sinv[row];
      const size_t orow = (size_t)(tok0 + t) * a.hq + h;
      *(uint2 *)((uint16_t *)a.o + orow * KVA_MLA_DV + 4 * d4) =
          make_uint2(mla_pack<QT>(acc[k].x * inv, acc[k].y * inv),
                     mla_pack<QT>(acc[k].z * inv, acc[k].w * inv));
    }
  }
}

/* Per row of this thread (16 wq + g + 8 hf): the factor from its
 * accumulators to O (o_mul / the row's full sum) and its LSE (natural
 * log), from the full sums lt and maxima m (base 2). */
static __device__ __forceinline__ void mla_row_scale(const kva_mla_args &a, const float lt[2],
                                                     const float m[2], float inv[2],
                                                     float lse[2]) {
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    inv[hf] = lt[hf] > 0.0f ? a.o_mul / lt[hf] : 0.0f;
    lse[hf] = lt[hf] > 0.0f ? (m[hf] + log2f(lt[hf])) * KVA_MLA_LN2 : -INFINITY;
  }
}

/* O (whole: a single-chunk request) or chunk `split`'s partial row and
 * its LSE, for this thread's two rows of the row tile (16 wq + g + 8 hf)
 * and O's columns 256 wg .. 256 wg + 255, straight from the accumulators
 * times inv. */
template <int QT>
static __device__ __forceinline__ void mla_store_rows(const kva_mla_args &a, const float o[2][64],
                                                      const float inv[2], const float lse[2],
                                                      int r, int split, int whole, int nt,
                                                      int tok0, int row0, int rows, int wg,
                                                      int wq, int g, int tq) {
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int grow = row0 + 16 * wq + g + 8 * hf;
    const bool live = grow < rows; /* same for lanes tq and tq ^ 1 (same g) */
    const int t = grow / a.hq, h = grow - t * a.hq;
    if (whole) {
      /* Each store a whole 32-byte sector per row: the four tq lanes hold
       * 16 bytes of columns 8j..8j+7, so lanes tq and tq ^ 1 swap halves of
       * the pair j = 2jp, 2jp + 1 and each stores 8 contiguous bytes.
       * (Half sectors took ~7 us for a 64-row tile's O on the H100 while the
       * other SMs streamed; whole ones gained h64 rows 4 points of copy
       * rate.) */
      const size_t orow = (size_t)(tok0 + t) * a.hq + h;
      uint16_t *dst = (uint16_t *)a.o + orow * KVA_MLA_DV + 256 * wg;
      const int odd = tq & 1, col = 8 * odd + 2 * (tq & 2);
#pragma unroll
      for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int jp = 0; jp < 8; jp++) {
          const uint32_t e = mla_pack<QT>(o[hh][8 * jp + 2 * hf] * inv[hf],
                                          o[hh][8 * jp + 2 * hf + 1] * inv[hf]); /* j = 2jp */
          const uint32_t d = mla_pack<QT>(o[hh][8 * jp + 4 + 2 * hf] * inv[hf],
                                          o[hh][8 * jp + 4 + 2 * hf + 1] * inv[hf]); /* 2jp+1 */
          const uint32_t got = (uint32_t)__shfl_xor_sync(0xffffffffu, (int)(odd ? e : d), 1);
          if (live)
            *(uint2 *)(dst + 128 * hh + 16 * jp + col) =
                odd ? make_uint2(got, d) : make_uint2(e, got);
        }
      if (live && a.lse && wg == 0 && tq == 0) a.lse[orow] = lse[hf];
    } else if (live) {
      const size_t prow = ((size_t)a.split_row_offset[r] + (size_t)split * nt + t) * a.hq + h;
      float *dst = a.part_o + prow * KVA_MLA_DV + 256 * wg;
      const uint64_t pol = (a.l2_hints & 1) ? kva_l2_evict_last() : kva_l2_evict_normal();
#pragma unroll
      for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int j = 0; j < 16; j++)
          kva_st_f32x2_hint(dst + 128 * hh + 8 * j + 2 * tq, o[hh][4 * j + 2 * hf] * inv[hf],
                            o[hh][4 * j + 2 * hf + 1] * inv[hf], pol);
      if (wg == 0 && tq == 0) a.part_lse[prow] = lse[hf];
    }
  }
}

/* The chunks of request r merged into O by the CTA that completed them:
 * with each row's weights in `scratch` (free smem of scratch_bytes) when
 * they fit, else item by item. */
template <int QT>
static __device__ __forceinline__ void mla_merge_rows(const kva_mla_args &a, int r, int nsplit,
                                                      int nt, int tok0, int row0, int rows,
                                                      int tid, float *scratch,
                                                      size_t scratch_bytes) {
  const int rows_here = rows - row0 < KVA_MLA_BM ? rows - row0 : KVA_MLA_BM;
  if ((size_t)rows_here * (nsplit + 1) * 4 <= scratch_bytes)
    mla_merge_chunks_w<QT>(a, r, nsplit, nt, tok0, row0, rows_here, tid, scratch);
  else
    mla_merge_chunks<QT>(a, r, nsplit, nt, tok0, row0, rows_here, tid);
}

/* A request of two chunks merged by the chunk known to complete it
 * (kva_split_known_last) before it wrote its own partial rows: the other
 * chunk's rows of this row tile (contiguous, rows x 512 f32) come into
 * free smem `stage` in one round of cp.async, its LSEs with them; each
 * thread then merges them into its accumulators. No partial write, no
 * count and no read-back of the CTA's own rows (H100, 64 rows: median
 * merge 12 -> 5 us). The arithmetic and chunk order of mla_merge_chunks_w:
 * bitwise the same O and LSE. On return o holds the weighted sum, inv the
 * factor to O and lse the merged LSE. */
static __device__ __forceinline__ void mla_merge_known_last(const kva_mla_args &a, float o[2][64],
                                                            float inv[2], float lse[2], int r,
                                                            int split, int nt, int row0,
                                                            int rows, int tid, int wg, int wq,
                                                            int g, int tq, uint32_t s_stage,
                                                            const float *stage) {
  const int rows_here = rows - row0 < KVA_MLA_BM ? rows - row0 : KVA_MLA_BM;
  const size_t other = ((size_t)a.split_row_offset[r] + (size_t)(1 - split) * nt) * a.hq + row0;
  const float *src = a.part_o + other * KVA_MLA_DV;
  for (int i = tid; i < rows_here * (KVA_MLA_DV / 4); i += KVA_MLA_THREADS)
    kva_cp_async_16(s_stage + 16 * i, src + 4 * i, 16);
  kva_cp_async_commit();
  float lo[2];
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int lr = 16 * wq + g + 8 * hf;
    lo[hf] = lr < rows_here ? __ldcg(a.part_lse + other + lr) : -INFINITY;
  }
  kva_cp_async_wait<0>();
  __syncthreads(); /* every thread's copies landed */
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int lr = 16 * wq + g + 8 * hf;
    const float l0 = split == 0 ? lse[hf] : lo[hf], l1 = split == 0 ? lo[hf] : lse[hf];
    const float mx = fmaxf(l0, l1);
    const float w0 = mx == -INFINITY ? 0.0f : kva_ex2((l0 - mx) * KVA_SPLIT_LOG2E);
    const float w1 = mx == -INFINITY ? 0.0f : kva_ex2((l1 - mx) * KVA_SPLIT_LOG2E);
    const float ws = w0 + w1;
    const float *row = stage + (lr < rows_here ? lr : 0) * KVA_MLA_DV + 256 * wg + 2 * tq;
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
      for (int j = 0; j < 16; j++) {
        const float2 v = *(const float2 *)(row + 128 * hh + 8 * j);
        const float own0 = o[hh][4 * j + 2 * hf] * inv[hf];
        const float own1 = o[hh][4 * j + 2 * hf + 1] * inv[hf];
        o[hh][4 * j + 2 * hf] = split == 0 ? fmaf(w1, v.x, fmaf(w0, own0, 0.0f))
                                           : fmaf(w1, own0, fmaf(w0, v.x, 0.0f));
        o[hh][4 * j + 2 * hf + 1] = split == 0 ? fmaf(w1, v.y, fmaf(w0, own1, 0.0f))
                                               : fmaf(w1, own1, fmaf(w0, v.y, 0.0f));
      }
    inv[hf] = ws > 0.0f ? 1.0f / ws : 0.0f;
    lse[hf] = ws > 0.0f ? mx + logf(ws) : -INFINITY;
  }
}

/* The end of a chunk in both kernels, after the row sums lt (maxima m):
 * O, or this chunk's partial rows and its count, and the merge by the
 * chunk that completes the request. known_last (two-chunk requests,
 * kva_split_known_last read after a __syncthreads; a constant 0 compiles
 * the path out): merge before writing, mla_merge_known_last. flag: an int
 * of smem, free until the caller's next __syncthreads; scratch: free smem
 * for the merge (at least 64 x 512 floats). Stamps 4-7 of the decode
 * timeline when STAMPS. Returns 1 if this CTA merged. */
template <int QT, bool STAMPS>
static __device__ __forceinline__ int mla_finish_chunk(const kva_mla_args &a, float o[2][64],
                                                       const float lt[2], const float m[2], int r,
                                                       int split, int nsplit, int known_last,
                                                       int nt, int tok0, int row0, int rows,
                                                       int tid, int wg, int wq, int g, int tq,
                                                       volatile int *flag, float *scratch,
                                                       size_t scratch_bytes) {
  float inv[2], lse[2];
  mla_row_scale(a, lt, m, inv, lse);
  if (known_last) {
    if (STAMPS) {
      KVA_TRACE_STAMP(4, kva_globaltimer());
      KVA_TRACE_STAMP(5, kva_globaltimer());
      KVA_TRACE_STAMP(6, kva_globaltimer());
    }
    mla_merge_known_last(a, o, inv, lse, r, split, nt, row0, rows, tid, wg, wq, g, tq,
                         kva_smem_u32(scratch), scratch);
  }
  mla_store_rows<QT>(a, o, inv, lse, r, split, nsplit == 1 || known_last, nt, tok0, row0, rows,
                     wg, wq, g, tq);
  if (known_last) {
    if (STAMPS) KVA_TRACE_STAMP(7, kva_globaltimer());
    return 1;
  }
  if (nsplit == 1) return 0;
  /* Count this chunk (split_merge.cuh); the chunk that completes the count
   * merges all of them. */
  __syncthreads(); /* the CTA's partial rows are written */
  if (STAMPS) KVA_TRACE_STAMP(4, kva_globaltimer());
  if (tid == 0) *flag = kva_split_arrive(a.split_sem + (size_t)r * a.hq + blockIdx.y, nsplit);
  __syncthreads();
  if (!*flag) return 0;
  if (STAMPS) {
    KVA_TRACE_STAMP(5, kva_globaltimer());
    KVA_TRACE_STAMP(6, kva_globaltimer());
  }
  mla_merge_rows<QT>(a, r, nsplit, nt, tok0, row0, rows, tid, scratch, scratch_bytes);
  if (STAMPS) KVA_TRACE_STAMP(7, kva_globaltimer());
  return 1;
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

/* v2. Per request chunk and key tile it, both warpgroups (in this order):
 * wait for tile it+1 and one CTA barrier; issue tile it+NS-1's loads (its
 * page-table entries were fetched one tile earlier); issue the half S of
 * tile it+1 (async); softmax of tile it (its S already summed) and P into
 * registers; issue P V of tile it; wait for the S group, sum the halves
 * through smem (one named barrier); wait for P V. So the tensor cores run
 * S(it+1) under the softmax of tile it and P V(it) under the S exchange;
 * O is rescaled only when a row's max moved. fp8: tile it+1's bytes are
 * converted into the other of two 16-bit tiles before its S. */
template <int QT, int KV8>
__global__ void __launch_bounds__(KVA_MLA_THREADS, 1)
    kva_mla_kernel(const __grid_constant__ kva_mla_args a) {
  constexpr int QTILE = KVA_MLA_QTILE, TILE = KVA_MLA_TILE, TILE8 = KVA_MLA_TILE8;
  constexpr int NS = KVA_MLA_STAGES(KV8), BN = KVA_MLA_BN, NJ = BN / 8; /* S n-tiles */
  /* the tensor cores' type: f16 for fp8 latents (see mla_q_bf16_to_f16) */
  constexpr int CT = KV8 ? KVA_F16 : QT;
  const float qk_mul = CT != QT ? a.qk_mul * (float)(1 << KVA_MLA_FP8_Q_SHIFT) : a.qk_mul;
  static_assert(NJ == 4 && NS >= 3, "tile shape");
  static_assert(KVA_MLA_SMEM(KV8) <= 232448, "227 KB of smem per CTA");
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_q = smem + (s_q - s_raw);
  /* 16-bit: stage i at s_kv + i TILE. fp8: 16-bit tile j (= key tile % 2)
   * at s_kv + j TILE, byte stage i at s_kv + 2 TILE + i TILE8. */
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
  const unsigned char *const kvg = (const unsigned char *)a.kv;
  const uint64_t kv_pol = (a.l2_hints & 2) ? kva_l2_evict_first() : kva_l2_evict_normal();

  for (int r = wk.begin_req; r <= wk.end_req; r++) {
    const int nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
    if (nsplit == 0) continue; /* not a decode request */
    const int nt = a.num_new[r], rows = nt * a.hq;
    if (row0 >= rows) continue; /* no rows of this row tile */
    const int kv_len = a.cache_seqlens[r], cached = kv_len - nt;
    const int split = r == wk.begin_req ? wk.begin_split : 0;
    const int k1 = r == wk.end_req ? wk.end_pos : kv_len;
    const int k0 = r == wk.begin_req ? wk.begin_pos : 0;
    const int ntiles = k1 > k0 ? (k1 - k0 + BN - 1) / BN : 0;
    const int tok0 = a.cu_q[r];
    const int32_t *const pt = a.page_table + (size_t)r * hdr->page_table_stride;

    /* Q, KV and the outputs belong to the kernels before this one (PDL) */
    kva_griddep_wait();
    if (trace_chunks == 0) KVA_TRACE_STAMP(1, kva_globaltimer());
    /* prologue: Q and tile 0 in group 0, tiles 1 .. NS-2 one group each */
    mla_issue_q(s_q, a, tok0, row0, rows, tid);
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
      if (i < ntiles)
        mla_issue_kv<KV8>(KV8 ? s_kv + 2 * TILE + i * TILE8 : s_kv + i * TILE, kvg, pt, k0 + i * BN,
                          k1, a, tid, kv_pol);
      kva_cp_async_commit();
    }
    /* KV slot of this thread's row of the next tile to load (-1: none) */
    int nslot = mla_slot(pt, k0 + (NS - 1) * BN + (tid >> 3), k1, a);

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
      kva_cp_async_wait<NS - 2>();  /* this thread's copies of tile 0 and Q landed */
      kva_fence_proxy_async_smem(); /* cp.async data -> wgmma (async proxy) */
      __syncthreads();
      if (KV8) {
        if (CT != QT) mla_q_bf16_to_f16(p_q, tid);
        mla_convert<CT>(p_kv, p_kv + 2 * TILE, tid);
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
      kva_cp_async_wait<NS - 3>();  /* this thread's copies of tile it+1 landed */
      kva_fence_proxy_async_smem();
      /* everyone's did; every P V of tile it-1 is complete (its stage is
       * free) */
      __syncthreads();
      {
        const int nx = it + NS - 1, st = nx % NS;
        if (nx < ntiles)
          mla_issue_row<KV8>(KV8 ? s_kv + 2 * TILE + st * TILE8 : s_kv + st * TILE, kvg, nslot, tid,
                             kv_pol);
        kva_cp_async_commit();
        nslot = mla_slot(pt, k0 + (nx + 1) * BN + (tid >> 3), k1, a); /* used next tile */
      }
      uint32_t s_cur = s_kv + (it % NS) * TILE, s_nx = s_kv + ((it + 1) % NS) * TILE;
      if (KV8) {
        s_cur = s_kv + (it & 1) * TILE;
        s_nx = s_kv + ((it + 1) & 1) * TILE;
        mla_convert<CT>(p_kv + ((it + 1) & 1) * TILE, p_kv + 2 * TILE + ((it + 1) % NS) * TILE8,
                        tid);
        kva_fence_proxy_async_smem();
        __syncthreads();
      }
      float sn[4 * NJ];
      mla_issue_s<CT>(sn, s_q, s_nx, wg);
      mla_softmax_pv<CT>(s, o, m, l, pos, k0 + it * BN, k1, cached, a, qk_mul, s_cur, wg, tq);
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
                         KV8 ? s_kv + (it & 1) * TILE : s_kv + (it % NS) * TILE, wg, tq);
      kva_wgmma_wait<0>();
      mla_fence_o(o);
    }
    kva_cp_async_wait<0>(); /* only empty groups remain (Q's, when there were no tiles) */
    trace_chunks++;
    KVA_TRACE_STAMP(3, kva_globaltimer());

    /* ---- O (or the partial row) straight from the accumulators ---- */
    if (nsplit == 2 && tid == 0)
      *flag = kva_split_known_last(a.split_sem + (size_t)r * a.hq + blockIdx.y, nsplit);
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
