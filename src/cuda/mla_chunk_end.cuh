/* The end of an MLA request chunk, shared by kernels v2, v5, v6 and v9: O written
 * straight from the accumulators (single-chunk request) or as the chunk's
 * f32 partial rows; the CTA whose chunk of a split request finishes last
 * merges the partial rows by LSE into O (as decode_kernel.cuh does, with a
 * counter per (request, row tile) reset by that CTA), or, for two chunks,
 * merges the other chunk's rows before it writes (mla_merge_known_last). */
#ifndef KVA_CUDA_MLA_CHUNK_END_CUH
#define KVA_CUDA_MLA_CHUNK_END_CUH

#include <math.h>
#include <stdint.h>

#include "cuda/mla.h"
#include "cuda/ptx.cuh"
#include "cuda/split_merge.cuh"
#include "cuda/trace.h"

#define KVA_MLA_LN2 0.6931471805599453f

/* A named barrier of some of a CTA's warpgroups (v6, v9, v10: one
 * warpgroup, or the O warpgroups): every instance is reached at one
 * instruction by all its threads (bar.sync is .aligned; what crosses
 * warpgroups' code goes through mbarriers), in whole warps: after a
 * __syncwarp, since the compiler reconverges a warp before
 * __syncthreads, not before inline asm (the merge's per-row loops can
 * leave one split). */
static __device__ __forceinline__ void mla_bar_sync(int id, int count) {
  __syncwarp();
  kva_bar_sync(id, count);
}

/* The barrier of the threads that end a chunk (KVA_MLA_THREADS of them):
 * NB 0 is the CTA's (v2, v5); v6, v9 and v10, whose S warpgroup stays out
 * of the chunk's end, pass a named barrier of their two O warpgroups. */
template <int NB>
static __device__ __forceinline__ void mla_end_sync(void) {
  if (NB == 0)
    __syncthreads();
  else
    mla_bar_sync(NB, KVA_MLA_THREADS);
}

/* two floats -> Q's type (P in the kernels, O here) */
template <int QT>
static __device__ __forceinline__ uint32_t mla_pack(float lo, float hi) {
  return QT == KVA_F16 ? kva_pack_f16x2(lo, hi) : kva_pack_bf16x2(lo, hi);
}

/* A chunk's merge weight exp(lse - mx) from natural-log LSEs (0 when the
 * row's largest LSE mx is -inf: every chunk empty). Every merge of split
 * chunks weighs with it, so that they give the same bits. A macro: as an
 * inline function the same expression moved v2's code (251 -> 254
 * registers, +1 KB), which the H100 would have to measure. */
#define MLA_MERGE_WEIGHT(lse, mx) \
  ((mx) == -INFINITY ? 0.0f : kva_ex2(((lse) - (mx)) * KVA_SPLIT_LOG2E))

/* Partial rows read for the last time (l2_hints bit 2): rows x 512 f32
 * from `rows0`, whole 128-byte lines (a row is 2 KB), dropped from L2 so
 * that the dirty lines are never written back to DRAM. The caller has
 * made every read of them complete (a __syncthreads after the loads). */
static __device__ __forceinline__ void mla_discard_rows(const kva_mla_args &a, const float *rows0,
                                                        int rows, int tid) {
  if (!(a.l2_hints & 4)) return;
  for (int i = tid; i < rows * (KVA_MLA_DV / 32); i += KVA_MLA_THREADS)
    kva_discard_l2_128(rows0 + 32 * i);
}

/* The chunks of request r for this CTA's row tile merged by LSE into O (and
 * LSE), by the CTA whose chunk finished last, item by item, when the
 * weights of mla_merge_chunks_w do not fit its scratch (v9 when its stages
 * hold the next chunk's blocks, v2 with many chunks). Each item recomputes
 * its row's weights from the chunks' LSEs with mla_merge_chunks_w's
 * arithmetic and order, so that O and LSE are bitwise the same whichever
 * CTA merges (a running-max merge here once made v9's LSE differ in the
 * last bit between runs; the MLA emulator's case 16). */
template <int QT>
static __device__ void mla_merge_chunks(const kva_mla_args &a, int r, int nsplit, int nt, int tok0,
                                        int row0, int rows_here, int tid) {
  const size_t p0 = (size_t)a.split_row_offset[r];
  const size_t lstride = (size_t)nt * a.hq, ostride = lstride * KVA_MLA_DV; /* chunk to chunk */
  for (int idx = tid; idx < rows_here * (KVA_MLA_DV / 4); idx += KVA_MLA_THREADS) {
    const int row = idx / (KVA_MLA_DV / 4), d4 = idx % (KVA_MLA_DV / 4);
    const int grow = row0 + row, t = grow / a.hq, h = grow - t * a.hq;
    const float *lp = a.part_lse + (p0 + t) * a.hq + h;
    const float *op = a.part_o + ((p0 + t) * a.hq + h) * KVA_MLA_DV + 4 * d4;
    float mx = -INFINITY;
    for (int j = 0; j < nsplit; j++) mx = fmaxf(mx, __ldcg(lp + j * lstride));
    float ws = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < nsplit; j++) {
      const float l = __ldcg(lp + j * lstride);
      const float w = MLA_MERGE_WEIGHT(l, mx);
      ws += w;
      const float4 v = __ldcg((const float4 *)(op + j * ostride));
      acc.x = fmaf(w, v.x, acc.x);
      acc.y = fmaf(w, v.y, acc.y);
      acc.z = fmaf(w, v.z, acc.z);
      acc.w = fmaf(w, v.w, acc.w);
    }
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
template <int QT, int NB>
static __device__ void mla_merge_chunks_w(const kva_mla_args &a, int r, int nsplit, int nt,
                                          int tok0, int row0, int rows_here, int tid, float *sw) {
  const size_t p0 = (size_t)a.split_row_offset[r];
  float *const sinv = sw + rows_here * nsplit;
  for (int idx = tid; idx < rows_here * nsplit; idx += KVA_MLA_THREADS) {
    const int row = idx / nsplit, j = idx - row * nsplit;
    const int grow = row0 + row, t = grow / a.hq, h = grow - t * a.hq;
    sw[idx] = __ldcg(a.part_lse + (p0 + t + (size_t)j * nt) * a.hq + h);
  }
  mla_end_sync<NB>();
  for (int row = tid; row < rows_here; row += KVA_MLA_THREADS) { /* a thread per row */
    float *const w = sw + row * nsplit;
    float mx = -INFINITY;
    for (int j = 0; j < nsplit; j++) mx = fmaxf(mx, w[j]);
    float ws = 0.0f;
    for (int j = 0; j < nsplit; j++) {
      const float e = MLA_MERGE_WEIGHT(w[j], mx);
      w[j] = e;
      ws += e;
    }
    sinv[row] = ws > 0.0f ? 1.0f / ws : 0.0f;
    const int grow = row0 + row, t = grow / a.hq, h = grow - t * a.hq;
    if (a.lse) a.lse[(size_t)(tok0 + t) * a.hq + h] = ws > 0.0f ? mx + logf(ws) : -INFINITY;
  }
  mla_end_sync<NB>();
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
  if (a.l2_hints & 4) {
    mla_end_sync<NB>(); /* every chunk's rows read */
    for (int j = 0; j < nsplit; j++)
      mla_discard_rows(a, a.part_o + ((p0 + (size_t)j * nt) * a.hq + row0) * KVA_MLA_DV, rows_here,
                       tid);
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

/* The merge before the write folded into O's stores (v9): this thread's
 * accumulators times own_inv are weighted by w0 / w1 against the other
 * chunk's rows at row[hf] (smem, f32) as they are stored, so the fold
 * needs no second copy of O in registers (v9's O warpgroups run at 152:
 * folded in place, it spilled and took 6-13 us). */
typedef struct mla_fold {
  float own_inv[2], w0[2], w1[2];
  const float *row[2];
} mla_fold;

/* One element of the merge of two chunks: this chunk's value own (times
 * its inv) and the other's v, in mla_merge_chunks_w's order (chunk 0's
 * product first). OWN0: this chunk is chunk 0. */
template <bool OWN0>
static __device__ __forceinline__ float mla_fold1(float own, float v, float w0, float w1) {
  return OWN0 ? fmaf(w1, v, fmaf(w0, own, 0.0f)) : fmaf(w1, own, fmaf(w0, v, 0.0f));
}

/* O (whole: a single-chunk request) or chunk `split`'s partial row and
 * its LSE, for this thread's two rows of the row tile (16 wq + g + 8 hf)
 * and O's columns 256 wg .. 256 wg + 255, straight from the accumulators
 * times inv; FOLD 1 / 2 (whole only): merged with the other chunk's rows
 * by f on the way (this chunk is chunk 0 / 1). */
template <int QT, int FOLD = 0>
static __device__ __forceinline__ void mla_store_rows(const kva_mla_args &a, const float o[2][64],
                                                      const float inv[2], const float lse[2],
                                                      int r, int split, int whole, int nt,
                                                      int tok0, int row0, int rows, int wg,
                                                      int wq, int g, int tq,
                                                      const mla_fold *f = nullptr) {
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
          float x[4] = {o[hh][8 * jp + 2 * hf], o[hh][8 * jp + 2 * hf + 1], /* j = 2jp */
                        o[hh][8 * jp + 4 + 2 * hf], o[hh][8 * jp + 4 + 2 * hf + 1]}; /* 2jp+1 */
          if (FOLD) {
            const float2 ve = *(const float2 *)(f->row[hf] + 128 * hh + 16 * jp);
            const float2 vd = *(const float2 *)(f->row[hf] + 128 * hh + 16 * jp + 8);
            const float v[4] = {ve.x, ve.y, vd.x, vd.y};
#pragma unroll
            for (int k = 0; k < 4; k++)
              x[k] = mla_fold1<FOLD == 1>(x[k] * f->own_inv[hf], v[k], f->w0[hf], f->w1[hf]);
          }
          const uint32_t e = mla_pack<QT>(x[0] * inv[hf], x[1] * inv[hf]);
          const uint32_t d = mla_pack<QT>(x[2] * inv[hf], x[3] * inv[hf]);
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
template <int QT, int NB>
static __device__ __forceinline__ void mla_merge_rows(const kva_mla_args &a, int r, int nsplit,
                                                      int nt, int tok0, int row0, int rows,
                                                      int tid, float *scratch,
                                                      size_t scratch_bytes) {
  const int rows_here = rows - row0 < KVA_MLA_BM ? rows - row0 : KVA_MLA_BM;
  if ((size_t)rows_here * (nsplit + 1) * 4 <= scratch_bytes)
    mla_merge_chunks_w<QT, NB>(a, r, nsplit, nt, tok0, row0, rows_here, tid, scratch);
  else
    mla_merge_chunks<QT>(a, r, nsplit, nt, tok0, row0, rows_here, tid);
}

/* One thread, at the end of a chunk of a request cut in two: 1 when this
 * chunk completes it (kva_split_known_last) and so merges before the
 * write. The head (split 0) is planned to end last: it waits up to
 * merge_wait_ns for the rest to count rather than fall to the merge from
 * global memory (kva_split_known_last_wait). v2 and v9. */
static __device__ __forceinline__ int mla_known_last(const kva_mla_args &a, int r, int split) {
  int32_t *const sem = a.split_sem + (size_t)r * a.hq + blockIdx.y;
  return split == 0 && a.merge_wait_ns ? kva_split_known_last_wait(sem, 2, a.merge_wait_ns)
                                       : kva_split_known_last(sem, 2);
}

/* A request of two chunks merged by the chunk known to complete it
 * (kva_split_known_last) before it wrote its own partial rows: the other
 * chunk's rows of this row tile (contiguous, rows x 512 f32) come into
 * free smem `stage` in one round of cp.async, its LSEs with them; each
 * thread then merges them into its accumulators. No partial write, no
 * count and no read-back of the CTA's own rows (H100, 64 rows: median
 * merge 12 -> 5 us). The arithmetic and chunk order of mla_merge_chunks_w:
 * bitwise the same O and LSE. On return o holds the weighted sum (NB 0;
 * else o is as it was and f says how mla_store_rows folds it), inv the
 * factor to O and lse the merged LSE. */
/* The other chunk's rows in smem, KVA_MLA_MERGE_ROW floats apart (512 +
 * 8): a warp's float2 reads of eight rows then take two wavefronts, not
 * eight as rows 2 KB apart did (64 rows: 133120 bytes, within v2's ring
 * and v9's stages). */
#define KVA_MLA_MERGE_ROW (KVA_MLA_DV + 8)
template <int NB, bool STAMPS>
static __device__ __forceinline__ void mla_merge_known_last(const kva_mla_args &a, float o[2][64],
                                                            float inv[2], float lse[2], int r,
                                                            int split, int nt, int row0,
                                                            int rows, int tid, int wg, int wq,
                                                            int g, int tq, uint32_t s_stage,
                                                            const float *stage, mla_fold *f) {
  const int rows_here = rows - row0 < KVA_MLA_BM ? rows - row0 : KVA_MLA_BM;
  const size_t other = ((size_t)a.split_row_offset[r] + (size_t)(1 - split) * nt) * a.hq + row0;
  const float *src = a.part_o + other * KVA_MLA_DV;
  for (int i = tid; i < rows_here * (KVA_MLA_DV / 4); i += KVA_MLA_THREADS)
    kva_cp_async_16(s_stage + 4 * ((i / (KVA_MLA_DV / 4)) * KVA_MLA_MERGE_ROW + 4 * (i % (KVA_MLA_DV / 4))),
                    src + 4 * i, 16);
  kva_cp_async_commit();
  float lo[2];
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int lr = 16 * wq + g + 8 * hf;
    lo[hf] = lr < rows_here ? __ldcg(a.part_lse + other + lr) : -INFINITY;
  }
  kva_cp_async_wait<0>();
  mla_end_sync<NB>(); /* every thread's copies landed */
  if (STAMPS) KVA_TRACE_STAMP_BY(tid == 0, 5, kva_globaltimer());
  mla_discard_rows(a, src, rows_here, tid);
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int lr = 16 * wq + g + 8 * hf;
    const float l0 = split == 0 ? lse[hf] : lo[hf], l1 = split == 0 ? lo[hf] : lse[hf];
    const float mx = fmaxf(l0, l1);
    const float w0 = MLA_MERGE_WEIGHT(l0, mx);
    const float w1 = MLA_MERGE_WEIGHT(l1, mx);
    const float ws = w0 + w1;
    const float *row = stage + (lr < rows_here ? lr : 0) * KVA_MLA_MERGE_ROW + 256 * wg + 2 * tq;
    if (NB != 0) { /* v9: folded by the stores (mla_fold) */
      f->own_inv[hf] = inv[hf];
      f->w0[hf] = w0;
      f->w1[hf] = w1;
      f->row[hf] = row;
    } else
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
      for (int j = 0; j < 16; j++) {
        const float2 v = *(const float2 *)(row + 128 * hh + 8 * j);
        const float own0 = o[hh][4 * j + 2 * hf] * inv[hf];
        const float own1 = o[hh][4 * j + 2 * hf + 1] * inv[hf];
        o[hh][4 * j + 2 * hf] = split == 0 ? mla_fold1<true>(own0, v.x, w0, w1)
                                           : mla_fold1<false>(own0, v.x, w0, w1);
        o[hh][4 * j + 2 * hf + 1] = split == 0 ? mla_fold1<true>(own1, v.y, w0, w1)
                                               : mla_fold1<false>(own1, v.y, w0, w1);
      }
    inv[hf] = ws > 0.0f ? 1.0f / ws : 0.0f;
    lse[hf] = ws > 0.0f ? mx + logf(ws) : -INFINITY;
  }
  if (STAMPS) KVA_TRACE_STAMP_BY(tid == 0, 6, kva_globaltimer());
}

/* A stamp of the chunk end, by the first of the threads that end the chunk
 * (tid 0: thread 0 in v2 and v5, v6's first O thread). */
#define MLA_END_STAMP(w, value) KVA_TRACE_STAMP_BY(tid == 0, w, value)

/* The end of a chunk in every kernel, after the row sums lt (maxima m):
 * O, or this chunk's partial rows and its count, and the merge by the
 * chunk that completes the request. known_last (two-chunk requests,
 * kva_split_known_last read after a CTA barrier; a constant 0 compiles
 * the path out): merge before writing, mla_merge_known_last. flag: an int
 * of smem, free until the caller's next barrier; scratch: free smem
 * for the merge (at least 64 x 512 floats). Stamps 4-7 of the decode
 * timeline when STAMPS. Returns 1 if this CTA merged. */
template <int QT, bool STAMPS, int NB = 0>
static __device__ __forceinline__ int mla_finish_chunk(const kva_mla_args &a, float o[2][64],
                                                       const float lt[2], const float m[2], int r,
                                                       int split, int nsplit, int known_last,
                                                       int nt, int tok0, int row0, int rows,
                                                       int tid, int wg, int wq, int g, int tq,
                                                       volatile int *flag, float *scratch,
                                                       size_t scratch_bytes) {
  float inv[2], lse[2];
  mla_row_scale(a, lt, m, inv, lse);
  mla_fold f; /* v9's merge before the write, for its stores */
  if (known_last) {
    /* 5: the other chunk's rows landed, 6: merged (v9: weighed; the fold
     * is in the stores), 7: O written */
    if (STAMPS) MLA_END_STAMP(4, kva_globaltimer());
    mla_merge_known_last<NB, STAMPS>(a, o, inv, lse, r, split, nt, row0, rows, tid, wg, wq, g, tq,
                                     kva_smem_u32(scratch), scratch, &f);
  }
  if (NB != 0 && known_last) { /* one store loop per split: a select of the two sums spilled */
    if (split == 0)
      mla_store_rows<QT, 1>(a, o, inv, lse, r, split, 1, nt, tok0, row0, rows, wg, wq, g, tq, &f);
    else
      mla_store_rows<QT, 2>(a, o, inv, lse, r, split, 1, nt, tok0, row0, rows, wg, wq, g, tq, &f);
  } else {
    mla_store_rows<QT>(a, o, inv, lse, r, split, nsplit == 1 || known_last, nt, tok0, row0, rows,
                       wg, wq, g, tq);
  }
  if (known_last) {
    if (STAMPS) MLA_END_STAMP(7, kva_globaltimer());
    return 1;
  }
  if (nsplit == 1) return 0;
  /* Count this chunk (split_merge.cuh); the chunk that completes the count
   * merges all of them. */
  mla_end_sync<NB>(); /* the CTA's partial rows are written */
  if (STAMPS) MLA_END_STAMP(4, kva_globaltimer());
  if (tid == 0) *flag = kva_split_arrive(a.split_sem + (size_t)r * a.hq + blockIdx.y, nsplit);
  mla_end_sync<NB>();
  if (!*flag) return 0;
  if (STAMPS) {
    MLA_END_STAMP(5, kva_globaltimer());
    MLA_END_STAMP(6, kva_globaltimer());
  }
  mla_merge_rows<QT, NB>(a, r, nsplit, nt, tok0, row0, rows, tid, scratch, scratch_bytes);
  if (STAMPS) MLA_END_STAMP(7, kva_globaltimer());
  return 1;
}

#undef MLA_END_STAMP
#undef MLA_MERGE_WEIGHT

#endif /* KVA_CUDA_MLA_CHUNK_END_CUH */
