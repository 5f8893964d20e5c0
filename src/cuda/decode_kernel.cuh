/* Split-KV decode attention on tensor cores (FlashDecoding / FlashInfer
 * style), device code only; decode_dN.cu launches it.
 *
 * Persistent grid (num_workers, hkv * row groups): CTA (w, y) walks worker
 * w's entry of the plan's split schedule for kv head y % hkv; the key tiles
 * of a split request are shared out among its chunks at run time (static
 * prologue tiles, then a counter), so a chunk on a slow SM does not hold
 * up the request (see the request loop). All query rows
 * of a request that share the kv head (group heads x 1..8 new tokens, row i
 * = token i / group, head i % group) are the rows of one 16*MT-row tile, so
 * every K/V byte is read once per row group. K/V tiles of BK keys are
 * gathered page by page with 16-byte cp.async into a STAGES-deep smem ring;
 * each of the 4 warps takes KW keys of a tile: S = Q K^T (mma.sync
 * m16n8k16, ldmatrix), mask, soft-cap, online softmax in registers (base 2),
 * O += P V (ldmatrix.trans). At the end of a request chunk the warps' (m, l,
 * O) are merged in smem and written as O (single-chunk request) or as a
 * partial row; the CTA whose chunk of a split request finishes last (a
 * counter per request and grid row, reset by that CTA with the tile
 * counter) merges the partial rows by LSE into O (dec_merge_chunks): no
 * combine kernel.
 *
 * fp8 KV is copied as bytes (half the traffic) and converted in registers:
 * K -> f16 with the head dim permuted inside each 16-wide k-step (Q is
 * staged in smem with the same permutation, so Q.K is unchanged); V -> f16
 * through byte-transposing ldmatrix.trans + prmt, which permutes O's
 * columns (undone when O leaves the registers). Both products run in f16
 * (e4m3 -> f16 is one instruction per two values, -> bf16 four): a bf16 Q
 * is staged as f16 times 2^-8 (fp8_q.cuh), the 2^8 folded back into the
 * logits' multiplier; P is in [0, 1] and V exact. k_scale is folded into
 * qk_mul and v_scale into o_mul. */
#ifndef KVA_CUDA_DECODE_KERNEL_CUH
#define KVA_CUDA_DECODE_KERNEL_CUH

#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cuda/decode.h"
#include "cuda/fp8_q.cuh"
#include "cuda/ptx.cuh"
#include "cuda/split_merge.cuh"

#define KVA_DEC_LN2 0.6931471805599453f

/* fp8 tiles: 16-byte chunk c of tile row `row` sits at chunk c ^ dec_swz(row)
 * (rows of 128 or 256 bytes: row & 7; 64-byte rows share a 128-byte line in
 * pairs: (row >> 1) & 3). */
template <int D>
static __device__ __forceinline__ int dec_swz(int row) {
  static_assert(D == 64 || D == 128 || D == 256, "fp8 row swizzle");
  return D == 64 ? (row >> 1) & 3 : row & 7;
}

/* Where a tile row's key lives: its page's entry in the page table (-1: no
 * row, at or past k1) and the key's offset in that page; the slot is
 * page * ps + off (dec_issue). The entry is loaded a tile before dec_issue
 * first uses it. When dec_pre returned the slot itself, the use sat right
 * after the load: ncu (H200, 2026-11-29, B=64 L=4096 32:8) put 23% of the
 * warps' stall samples on it with 4 new tokens a request, 14% with 8. */
typedef struct {
  int page, off;
} dec_row;
static __device__ __forceinline__ dec_row dec_locate(const int32_t *pt, int key, int k1, int ps,
                                                     uint32_t ps_mul, int ps_shift) {
  /* key / ps by multiply-high (exact for key < 2^31) */
  const uint32_t pg = (__umulhi((uint32_t)key, ps_mul) + (uint32_t)key) >> ps_shift;
  dec_row r;
  r.page = key < k1 ? __ldg(pt + pg) : -1;
  r.off = key - (int)pg * ps;
  return r;
}
static __device__ __forceinline__ dec_row dec_no_row(void) {
  dec_row r;
  r.page = -1;
  r.off = 0;
  return r;
}

/* Issues one K and one V tile into kdst/vdst. Thread tid copies chunk
 * tid % CH of rows tid / CH + i * RPI; the slot of each row comes from lane
 * i * RW + lane / CH of the warp, whose `pre` locates tile row
 * warp * RW + lane % RW + (lane / RW) * RPI (dec_pre). Rows past the chunk
 * (slot -1) are zero-filled so that masked P * V stays finite. kg/vg point
 * at the kv head's row of slot 0; row_bytes = hkv * D * KVB. */
template <int D, int KV8>
static __device__ __forceinline__ void dec_issue(uint32_t kdst, uint32_t vdst, dec_row pre,
                                                 int ps, const unsigned char *kg,
                                                 const unsigned char *vg, int64_t row_bytes,
                                                 int tid) {
  constexpr int KVB = KV8 ? 1 : 2, CH = D * KVB / 16, RPI = KVA_DEC_THREADS / CH;
  constexpr int LIT = KVA_DEC_BK(KV8) / RPI, RW = 32 / CH, RS = KVA_DEC_RS(D, KV8);
  static_assert(CH <= 32 && 32 % CH == 0 && KVA_DEC_BK(KV8) % RPI == 0, "copy mapping");
  const int lane = tid & 31, c = tid % CH;
  const int mine = pre.page >= 0 ? pre.page * ps + pre.off : -1;
#pragma unroll
  for (int i = 0; i < LIT; i++) {
    const int slot = __shfl_sync(0xffffffffu, mine, i * RW + lane / CH);
    const int row = tid / CH + i * RPI;
    const uint32_t dst = (uint32_t)(row * RS + (KV8 ? c ^ dec_swz<D>(row) : c) * 16);
    const int64_t off = (slot >= 0 ? (int64_t)slot * row_bytes : 0) + c * 16;
    const int bytes = slot >= 0 ? 16 : 0;
    kva_cp_async_16(kdst + dst, kg + off, bytes);
    kva_cp_async_16(vdst + dst, vg + off, bytes);
  }
}

/* This lane's tile row for the tile starting at key kt (see dec_issue). */
template <int D, int KV8>
static __device__ __forceinline__ dec_row dec_pre(const int32_t *pt, int kt, int k1, int ps,
                                                  uint32_t ps_mul, int ps_shift, int tid) {
  constexpr int CH = D * (KV8 ? 1 : 2) / 16, RPI = KVA_DEC_THREADS / CH, RW = 32 / CH;
  const int lane = tid & 31, warp = tid >> 5;
  const int row = warp * RW + lane % RW + (lane / RW) * RPI;
  /* rows of the warp: BK / 4 */
  return dec_locate(pt, kt + row, lane < KVA_DEC_BK(KV8) / 4 ? k1 : INT_MIN, ps, ps_mul, ps_shift);
}

/* 16-byte chunk c8 of Q's row for tile row grow (token grow / group, head
 * kvh x group + grow % group of the request whose first token is tok0):
 * dec_load_q(_async). */
template <int D>
static __device__ __forceinline__ const uint16_t *dec_q_chunk(const kva_dec_args &a, int tok0,
                                                              int kvh, int grow, int c8) {
  const int t = grow / a.group, h = kvh * a.group + grow % a.group;
  return (const uint16_t *)a.q + ((size_t)(tok0 + t) * a.hq + h) * D + c8 * 8;
}

/* 16-bit KV: the Q rows of dec_load_q by cp.async (zero-filled past `rows`),
 * so that no warp waits on the loads at a chunk's start; the caller commits
 * them as their own group ahead of the chunk's first tile, which the key
 * loop's first wait then covers. For planned chunks (the static path): at
 * B=64 L=2k varlen, many short chunks a CTA, the plain loads' stores held
 * 3.5% of the warps' stall samples (ncu, H200, 2026-11-29). */
template <int D, int MT>
static __device__ __forceinline__ void dec_load_q_async(uint32_t s_q, const kva_dec_args &a,
                                                        int tok0, int kvh, int row0, int rows,
                                                        int tid) {
  constexpr int QRS = KVA_DEC_QRS(D), C8 = D / 8; /* 16-byte chunks per row */
  for (int idx = tid; idx < 16 * MT * C8; idx += KVA_DEC_THREADS) {
    const int row = idx / C8, c8 = idx % C8, grow = row0 + row;
    const uint16_t *src = (const uint16_t *)a.q; /* a valid address for the zero fill */
    if (grow < rows) src = dec_q_chunk<D>(a, tok0, kvh, grow, c8);
    kva_cp_async_16(s_q + (uint32_t)(row * QRS + c8 * 16), src, grow < rows ? 16 : 0);
  }
}

/* Q rows [row0, row0 + 16 MT) of request r for kv head kvh -> smem (16-bit,
 * stride QRS; zero rows past `rows`). fp8 KV: within each 16-element block
 * the 32-bit words are stored permuted (word P at 4 (P & 1) + (P >> 1)), the
 * order in which the fp8 ldmatrix fragments deliver K's head dims, and a
 * bf16 Q as f16 times 2^-KVA_FP8_Q_SHIFT (the QK MMA runs f16). */
template <int D, int QT, int KV8, int MT>
static __device__ __forceinline__ void dec_load_q(unsigned char *sq, const kva_dec_args &a,
                                                  int tok0, int kvh, int row0, int rows,
                                                  int tid) {
  constexpr int QRS = KVA_DEC_QRS(D), C8 = D / 8; /* 16-byte chunks per row */
  for (int idx = tid; idx < 16 * MT * C8; idx += KVA_DEC_THREADS) {
    const int row = idx / C8, c8 = idx % C8, grow = row0 + row;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (grow < rows) x = *(const uint4 *)dec_q_chunk<D>(a, tok0, kvh, grow, c8);
    unsigned char *dst = sq + row * QRS;
    if (KV8) {
      if (QT != KVA_F16)
        x = make_uint4(kva_q_bf16x2_to_f16x2(x.x), kva_q_bf16x2_to_f16x2(x.y),
                       kva_q_bf16x2_to_f16x2(x.z), kva_q_bf16x2_to_f16x2(x.w));
      const int hb = c8 & 1; /* half of the 16-element block */
      uint32_t *blk = (uint32_t *)(dst + (c8 >> 1) * 32);
      *(uint2 *)(blk + 2 * hb) = make_uint2(x.x, x.z);
      *(uint2 *)(blk + 4 + 2 * hb) = make_uint2(x.y, x.w);
    } else {
      *(uint4 *)(dst + c8 * 16) = x;
    }
  }
}

template <int QT>
static __device__ __forceinline__ void dec_mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
  if (QT == KVA_F16)
    kva_mma_f16(c, a, b0, b1);
  else
    kva_mma_bf16(c, a, b0, b1);
}
template <int QT>
static __device__ __forceinline__ uint32_t dec_pack(float lo, float hi) {
  return QT == KVA_F16 ? kva_pack_f16x2(lo, hi) : kva_pack_bf16x2(lo, hi);
}

/* Four consecutive outputs of dtype QT (8 bytes). */
template <int QT>
static __device__ __forceinline__ void dec_store4(void *p, float x0, float x1, float x2,
                                                  float x3) {
  *(uint2 *)p = make_uint2(dec_pack<QT>(x0, x1), dec_pack<QT>(x2, x3));
}

/* The chunks of request r, this CTA's kv head and row group, merged by LSE
 * into O (and LSE): run by the CTA whose chunk finished last. Chunk j of
 * token t is partial row split_row_offset[r] + j * nt + t; partials are read
 * through L2 (__ldcg: other SMs wrote them). The order over j is fixed, so
 * the result does not depend on which chunk was last. */
template <int D, int QT, int KV8>
static __device__ void dec_merge_chunks(const kva_dec_args &a, int r, int nsplit, int nt, int tok0,
                                        int kvh, int row0, int rows_here, int tid) {
  for (int idx = tid; idx < rows_here * (D / 4); idx += KVA_DEC_THREADS) {
    const int row = idx / (D / 4), d4 = idx % (D / 4);
    const int grow = row0 + row, t = grow / a.group, h = kvh * a.group + grow % a.group;
    const size_t p0 = (size_t)a.split_row_offset[r] + t;
    float mx, ws;
    const float4 acc =
        kva_split_merge4<KVA_DEC_MERGE_BATCH(KV8)>(a.part_o, a.part_lse, p0, nt, a.hq, h, nsplit,
                                                   D, d4, &mx, &ws);
    const float inv = ws > 0.0f ? 1.0f / ws : 0.0f;
    const size_t orow = (size_t)(tok0 + t) * a.hq + h;
    dec_store4<QT>((uint16_t *)a.o + orow * D + 4 * d4, acc.x * inv, acc.y * inv, acc.z * inv,
                   acc.w * inv);
    if (a.lse && d4 == 0) a.lse[orow] = ws > 0.0f ? mx + logf(ws) : -INFINITY;
  }
}

/* One key tile of the ring (K at sk, V at sv; first key kt, keys from k1
 * on masked): S = Q K^T over each warp's KW keys, mask, soft-cap, online
 * softmax (m, l), O += P V. MT1: the second m-tile holds rows (MT = 2),
 * a template argument so that the m-tile loops carry no branches
 * (dec_tile_any picks the instance). */
template <int D, int QT, int KV8, int MT, bool MT1>
static __device__ __forceinline__ void dec_tile(const kva_dec_args &a, uint32_t s_q, uint32_t sk,
                                                uint32_t sv, int kt, int k1, int cached, int nt,
                                                const int (&trow)[MT][2], bool cap,
                                                int swz, int lane, int warp,
                                                float (&o)[MT][D / 8][4], float (&m)[MT][2],
                                                float (&l)[MT][2]) {
  constexpr int KW = KVA_DEC_KW(KV8), BK = KVA_DEC_BK(KV8), NT = KW / 8;
  constexpr int RS = KVA_DEC_RS(D, KV8), QRS = KVA_DEC_QRS(D), ON = D / 8;
  constexpr int ST = KV8 ? KVA_F16 : QT; /* the QK MMA's type (dec_load_q) */
  const float qk_mul = ST != QT ? a.qk_mul * (float)(1 << KVA_FP8_Q_SHIFT) : a.qk_mul;
  const int q = lane & 3;
  const int kw0 = kt + warp * KW; /* first key of the warp */
  /* ---- S = Q K^T over this warp's KW keys ---- */
  float s[MT][NT][4];
#pragma unroll
  for (int mi = 0; mi < MT; mi++)
#pragma unroll
    for (int j = 0; j < NT; j++) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.0f;
#pragma unroll
  for (int c = 0; c < D / 16; c++) {
    uint32_t kb[NT][2];
    if (KV8) { /* matrix i = keys 8i..8i+7 of the warp, bytes 16c..16c+15 */
      uint32_t kr[4];
      kva_ldmatrix_x4(kr, sk + (warp * KW + 8 * (lane >> 3) + (lane & 7)) * RS +
                              16 * (c ^ swz));
#pragma unroll
      for (int j = 0; j < NT; j++) {
        kb[j][0] = kva_cvt_e4m3x2_f16x2((uint16_t)(kr[j] & 0xffffu));
        kb[j][1] = kva_cvt_e4m3x2_f16x2((uint16_t)(kr[j] >> 16));
      }
    } else { /* matrices: (keys 0-7 | 8-15) x (dims 0-7 | 8-15) of the k-step */
      uint32_t kr[4];
      kva_ldmatrix_x4(kr, sk + (warp * KW + (lane >> 4) * 8 + (lane & 7)) * RS +
                              (16 * c + ((lane >> 3) & 1) * 8) * 2);
      kb[0][0] = kr[0];
      kb[0][1] = kr[1];
      kb[NT - 1][0] = kr[2];
      kb[NT - 1][1] = kr[3];
    }
#pragma unroll
    for (int mi = 0; mi < MT; mi++) {
      if (mi > 0 && !MT1) continue;
      uint32_t qa[4];
      kva_ldmatrix_x4(qa, s_q + (16 * mi + ((lane >> 3) & 1) * 8 + (lane & 7)) * QRS +
                              (16 * c + (lane >> 4) * 8) * 2);
#pragma unroll
      for (int j = 0; j < NT; j++) dec_mma<ST>(s[mi][j], qa, kb[j][0], kb[j][1]);
    }
  }

  /* ---- logits (base 2), mask ---- */
  const bool need_mask = kt + BK > k1 || (a.causal && kt + BK - 1 > cached) ||
                         (a.window_left >= 0 && kt < cached + nt - 1 - a.window_left);
#pragma unroll
  for (int mi = 0; mi < MT; mi++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[mi][j][e];
        x = cap ? a.cap_log2 * (1.0f - 2.0f * kva_rcp(kva_ex2(x * qk_mul) + 1.0f))
                : x * qk_mul;
        if (need_mask) {
          const int key = kw0 + 8 * j + 2 * q + (e & 1), pos = cached + trow[mi][e >> 1];
          const bool vis = key < k1 && (!a.causal || key <= pos) &&
                           (a.window_left < 0 || key >= pos - a.window_left);
          if (!vis) x = -INFINITY;
        }
        s[mi][j][e] = x;
      }

  /* ---- online softmax per row (rows g and g + 8 of each m-tile) ---- */
#pragma unroll
  for (int mi = 0; mi < MT; mi++) {
    if (mi > 0 && !MT1) continue;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < NT; j++) mx = fmaxf(mx, fmaxf(s[mi][j][2 * h], s[mi][j][2 * h + 1]));
      mx = kva_quad_max(mx);
      const float mn = fmaxf(m[mi][h], mx);
      const float mu = mn == -INFINITY ? 0.0f : mn; /* all masked so far: p = 0, no NaN */
      const float sc = kva_ex2(m[mi][h] - mu);
      m[mi][h] = mn;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const float p0 = kva_ex2(s[mi][j][2 * h] - mu), p1 = kva_ex2(s[mi][j][2 * h + 1] - mu);
        s[mi][j][2 * h] = p0;
        s[mi][j][2 * h + 1] = p1;
        sum += p0 + p1;
      }
      l[mi][h] = l[mi][h] * sc + sum;
#pragma unroll
      for (int n = 0; n < ON; n++) {
        o[mi][n][2 * h] *= sc;
        o[mi][n][2 * h + 1] *= sc;
      }
    }
  }

  /* ---- O += P V ---- */
#pragma unroll
  for (int ks = 0; ks < KW / 16; ks++) {
    uint32_t pa[MT][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++) {
      if (KV8) { /* P.V in f16 */
        pa[mi][0] = kva_pack_f16x2(s[mi][2 * ks][0], s[mi][2 * ks][1]);
        pa[mi][1] = kva_pack_f16x2(s[mi][2 * ks][2], s[mi][2 * ks][3]);
        pa[mi][2] = kva_pack_f16x2(s[mi][2 * ks + 1][0], s[mi][2 * ks + 1][1]);
        pa[mi][3] = kva_pack_f16x2(s[mi][2 * ks + 1][2], s[mi][2 * ks + 1][3]);
      } else {
        pa[mi][0] = dec_pack<QT>(s[mi][2 * ks][0], s[mi][2 * ks][1]);
        pa[mi][1] = dec_pack<QT>(s[mi][2 * ks][2], s[mi][2 * ks][3]);
        pa[mi][2] = dec_pack<QT>(s[mi][2 * ks + 1][0], s[mi][2 * ks + 1][1]);
        pa[mi][3] = dec_pack<QT>(s[mi][2 * ks + 1][2], s[mi][2 * ks + 1][3]);
      }
    }
    /* V rows of the k-step: keys 16 ks + (0-7 | 8-15) of the warp */
    const uint32_t vrow = sv + (warp * KW + 16 * ks + ((lane >> 3) & 1) * 8 + (lane & 7)) * RS;
    if (KV8) {
#pragma unroll
      for (int b2 = 0; b2 < D / 32; b2++) { /* 32 head dims = two 16-byte blocks */
        uint32_t vr[4];
        kva_ldmatrix_x4_trans(vr, vrow + 16 * ((2 * b2 + (lane >> 4)) ^ swz));
#pragma unroll
        for (int blk = 0; blk < 2; blk++) {
          /* bytes (V[2q][2g], V[2q][2g+1], V[2q+1][2g], V[2q+1][2g+1]) ->
           * (dim 2g: keys 2q, 2q+1 | dim 2g+1: keys 2q, 2q+1) */
          const uint32_t lo = kva_prmt(vr[2 * blk], 0u, 0x3120u);
          const uint32_t hi = kva_prmt(vr[2 * blk + 1], 0u, 0x3120u);
          const uint32_t e0 = kva_cvt_e4m3x2_f16x2((uint16_t)(lo & 0xffffu));
          const uint32_t e1 = kva_cvt_e4m3x2_f16x2((uint16_t)(hi & 0xffffu));
          const uint32_t d0 = kva_cvt_e4m3x2_f16x2((uint16_t)(lo >> 16));
          const uint32_t d1 = kva_cvt_e4m3x2_f16x2((uint16_t)(hi >> 16));
          const int nb = 2 * (2 * b2 + blk); /* even n-tile: dims 2n, odd: 2n + 1 */
#pragma unroll
          for (int mi = 0; mi < MT; mi++) {
            if (mi > 0 && !MT1) continue;
            kva_mma_f16(o[mi][nb], pa[mi], e0, e1);
            kva_mma_f16(o[mi][nb + 1], pa[mi], d0, d1);
          }
        }
      }
    } else {
#pragma unroll
      for (int b = 0; b < D / 16; b++) { /* matrices: (keys 0-7 | 8-15) x (dims 0-7 | 8-15) */
        uint32_t vr[4];
        kva_ldmatrix_x4_trans(vr, vrow + (16 * b + (lane >> 4) * 8) * 2);
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
          if (mi > 0 && !MT1) continue;
          dec_mma<QT>(o[mi][2 * b], pa[mi], vr[0], vr[1]);
          dec_mma<QT>(o[mi][2 * b + 1], pa[mi], vr[2], vr[3]);
        }
      }
    }
  }
}

/* dec_tile's instance for the batch's rows: the second m-tile's work only
 * where it holds rows (mt1). */
template <int D, int QT, int KV8, int MT>
static __device__ __forceinline__ void dec_tile_any(const kva_dec_args &a, uint32_t s_q,
                                                    uint32_t sk, uint32_t sv, int kt, int k1,
                                                    int cached, int nt, const int (&trow)[MT][2],
                                                    bool mt1, bool cap, int swz, int lane,
                                                    int warp, float (&o)[MT][D / 8][4],
                                                    float (&m)[MT][2], float (&l)[MT][2]) {
  if (MT > 1 && mt1)
    dec_tile<D, QT, KV8, MT, true>(a, s_q, sk, sv, kt, k1, cached, nt, trow, cap, swz, lane, warp,
                                   o, m, l);
  else
    dec_tile<D, QT, KV8, MT, false>(a, s_q, sk, sv, kt, k1, cached, nt, trow, cap, swz, lane,
                                    warp, o, m, l);
}

template <int D, int QT, int KV8, int MT>
__global__ void __launch_bounds__(KVA_DEC_THREADS, KVA_DEC_CTAS_PER_SM(D, KV8, MT))
    kva_dec_kernel(const kva_dec_args a) {
  constexpr int KVB = KV8 ? 1 : 2;
  constexpr int BK = KVA_DEC_BK(KV8);
  constexpr int TILE = KVA_DEC_TILE_BYTES(D, KV8), STAGE = KVA_DEC_STAGE_BYTES(D, KV8);
  constexpr int STAGES = KVA_DEC_STAGES(D, KV8, MT), QB = KVA_DEC_Q_BYTES(D, MT);
  constexpr int ON = D / 8; /* O n-tiles */
  constexpr int OS = KVA_DEC_OS(D), ROWS = 16 * MT;
  static_assert(STAGES >= 2, "smem budget holds fewer than two stages");
  static_assert(KVA_DEC_SCRATCH_BYTES(D, MT) <= STAGES * STAGE, "merge scratch exceeds the ring");
  static_assert(D % 32 == 0 && (MT == 1 || MT == 2), "tile shape");

  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
  const kva_plan_header *hdr = a.hdr;
  /* a PDL-launched kernel after this one (the next layer's decode) may be
   * scheduled now; it waits for this grid's end before touching memory */
  kva_griddep_launch_dependents();
  KVA_TRACE_STAMP(0, kva_globaltimer());
  unsigned trace_chunks = 0, trace_merges = 0;
  if ((int)blockIdx.x >= hdr->num_workers) {
    KVA_TRACE_STAMP(8, kva_globaltimer());
    KVA_TRACE_STAMP(9, kva_smid());
    return;
  }
  const int kvh = (int)blockIdx.y % a.hkv, rg = (int)blockIdx.y / a.hkv;
  const int row0 = rg * ROWS;
  const kva_split_work wk = a.sched[blockIdx.x];
  const uint32_t s_q = kva_smem_u32(smem), s_ring = s_q + QB;
  float *const scr_o = (float *)(smem + QB);               /* [4][ROWS][OS], after the loop */
  float *const scr_m = scr_o + KVA_DEC_WARPS * ROWS * OS;   /* [4][ROWS] */
  float *const scr_l = scr_m + KVA_DEC_WARPS * ROWS;        /* [4][ROWS] */
  int *const claim_s = (int *)(smem + KVA_DEC_RING_END(D, KV8, MT)); /* [KVA_DEC_CLAIM_SLOTS] */
  const int64_t row_bytes = (int64_t)a.hkv * D * KVB;
  const unsigned char *const kg = (const unsigned char *)a.k + (size_t)kvh * D * KVB;
  const unsigned char *const vg = (const unsigned char *)a.v + (size_t)kvh * D * KVB;
  const int ps = a.page_size, ps_shift = a.ps_shift;
  const uint32_t ps_mul = a.ps_mul;
  const bool cap = a.cap_log2 != 0.0f;
  /* fp8 ldmatrix rows are (multiple of 8) + (lane & 7): their swizzle is per lane */
  const int swz = KV8 ? dec_swz<D>(lane & 7) : 0;

  for (int r = wk.begin_req; r <= wk.end_req; r++) {
    const int nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
    if (nsplit == 0) continue; /* extend request: not on this path */
    const int nt = a.num_new[r], rows = nt * a.group;
    if (row0 >= rows) continue; /* no rows of this row group */
    const int kv_len = a.cache_seqlens[r], cached = kv_len - nt;
    const int split = r == wk.begin_req ? wk.begin_split : 0;
    /* keys below every row's window are skipped, not loaded */
    const int kstart =
        a.window_left >= 0 && cached - a.window_left > 0 ? cached - a.window_left : 0;
    /* Key tiles: tile t covers keys [k0 + t BK, ...) below k1. By default
     * this chunk's planned range [begin_pos, end_pos) in order. But the
     * chunks of a split request whose workers have no other request
     * ("dedicated": all of a long request's chunks but the first and last,
     * which share a worker with other requests) share their keys at run
     * time, unless the plan is deterministic: SMs do not stream at the same
     * rate (on the H100 some finished equal shares 20-30% early), and a
     * static split ends on its slowest chunk. Dedicated chunk jd (of nd)
     * starts with the pool's tiles [jd (STAGES-1), (jd+1) (STAGES-1)) (its
     * prologue) and then claims tiles nd (STAGES-1) + c from a counter per
     * (request, grid row) until they run out. The first and last chunks keep
     * their planned ranges, so a worker's other requests are not delayed. */
    int k0 = r == wk.begin_req ? wk.begin_pos : 0, k1 = r == wk.end_req ? wk.end_pos : kv_len;
    bool dyn = false;
    int st0 = 0, dbase = 0;
    if (nsplit > 1 && !a.deterministic && wk.begin_req == r && wk.end_req == r) {
      /* the chunks of r belong to consecutive workers */
      const int w0 = (int)blockIdx.x - split, wl = w0 + nsplit - 1;
      const kva_split_work s0 = a.sched[w0], sl = a.sched[wl];
      const bool d0 = s0.begin_req == r && s0.end_req == r, dl = sl.end_req == r;
      const int nd = nsplit - !d0 - !dl;
      if (nd >= 2) {
        dyn = true;
        k0 = d0 ? 0 : a.sched[w0 + 1].begin_pos;
        k1 = dl ? kv_len : sl.begin_pos;
        st0 = (split - !d0) * (STAGES - 1);
        dbase = nd * (STAGES - 1);
      }
    }
    if (k0 < kstart) k0 = kstart;
    const int ntiles = k1 > k0 ? (k1 - k0 + BK - 1) / BK : 0;
    const int nst = ntiles - st0 < 0 ? 0 : ntiles - st0 < STAGES - 1 ? ntiles - st0 : STAGES - 1;
    int32_t *const claim_ctr = a.tile_claim + (size_t)r * a.hq + blockIdx.y;
    const int tok0 = a.cu_q[r];
    const int32_t *const pt = a.page_table + (size_t)r * hdr->page_table_stride;
    const bool mt1 = MT > 1 && rows - row0 > 16; /* second m-tile holds rows */

    /* token of each of this lane's rows (mask positions) */
    int trow[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
      for (int h = 0; h < 2; h++) trow[mi][h] = (row0 + 16 * mi + g + 8 * h) / a.group;

    float o[MT][ON][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; mi++) {
#pragma unroll
      for (int n = 0; n < ON; n++) o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
      m[mi][0] = m[mi][1] = -INFINITY;
      l[mi][0] = l[mi][1] = 0.0f;
    }

    if (!dyn) { /* this chunk's planned keys, in order */
      /* pipeline prologue: tiles 0 .. STAGES-2, one commit group each */
      dec_row pre = dec_pre<D, KV8>(pt, k0, k1, ps, ps_mul, ps_shift, tid);
      /* Q, KV and the outputs belong to the kernels before this one (plan
       * data was copied before them): wait for them (PDL launch) */
      kva_griddep_wait();
      if (trace_chunks == 0) KVA_TRACE_STAMP(1, kva_globaltimer());
      if (!KV8) {
        dec_load_q_async<D, MT>(s_q, a, tok0, kvh, row0, rows, tid);
        kva_cp_async_commit();
      }
#pragma unroll
      for (int s = 0; s < STAGES - 1; s++) {
        if (s < ntiles) {
          dec_issue<D, KV8>(s_ring + s * STAGE, s_ring + s * STAGE + TILE,
                            pre, ps, kg, vg, row_bytes, tid);
          pre = dec_pre<D, KV8>(pt, k0 + (s + 1) * BK, k1, ps, ps_mul, ps_shift, tid);
        }
        kva_cp_async_commit();
      }
      /* fp8 KV: Q (converted) after the KV copies are in flight (plain
       * loads; visible to every warp after the first barrier of the key loop) */
      if (KV8) dec_load_q<D, QT, KV8, MT>(smem, a, tok0, kvh, row0, rows, tid);
      for (int it = 0; it < ntiles; it++) {
        kva_cp_async_wait<STAGES - 2>(); /* this thread's copies of tile it landed */
        __syncthreads();                 /* everyone's did; tile it-1's stage is free */
        if (it == 0 && trace_chunks == 0) KVA_TRACE_STAMP(2, kva_globaltimer());
        const int nx = it + STAGES - 1;
        if (nx < ntiles) {
          const uint32_t st = s_ring + (nx % STAGES) * STAGE;
          dec_issue<D, KV8>(st, st + TILE, pre, ps, kg, vg, row_bytes, tid);
          pre = dec_pre<D, KV8>(pt, k0 + (nx + 1) * BK, k1, ps, ps_mul, ps_shift, tid);
        }
        kva_cp_async_commit();
        const uint32_t sk = s_ring + (it % STAGES) * STAGE;
        dec_tile_any<D, QT, KV8, MT>(a, s_q, sk, sk + TILE, k0 + it * BK, k1, cached, nt, trow,
                                     mt1, cap, swz, lane, warp, o, m, l);
      }
    } else { /* a dedicated chunk: static prologue tiles, then claims */
      /* pipeline prologue: slots 0 .. STAGES-2, one commit group each, this
       * chunk's static tiles first (known before the claim returns) */
      dec_row pre = nst > 0 ? dec_pre<D, KV8>(pt, k0 + st0 * BK, k1, ps, ps_mul, ps_shift, tid)
                          : dec_no_row();
      /* Q, KV, the outputs and the tile counters belong to the kernels before
       * this one (plan data was copied before them): wait for them (PDL) */
      kva_griddep_wait();
      if (trace_chunks == 0) KVA_TRACE_STAMP(1, kva_globaltimer());
      int claim0 = 0;
      if (tid == 0) claim0 = atomicAdd(claim_ctr, STAGES + 1 - nst); /* slots nst .. STAGES */
#pragma unroll
      for (int i = 0; i < STAGES - 1; i++) {
        if (i < nst) {
          dec_issue<D, KV8>(s_ring + i * STAGE, s_ring + i * STAGE + TILE,
                            pre, ps, kg, vg, row_bytes, tid);
          kva_cp_async_commit();
          if (i + 1 < nst && i + 1 < STAGES - 1)
            pre = dec_pre<D, KV8>(pt, k0 + (st0 + i + 1) * BK, k1, ps, ps_mul, ps_shift, tid);
        }
      }
      /* Q after the KV copies are in flight (plain loads; visible to every
       * warp after the first barrier of the key loop). By cp.async, as the
       * planned chunks load it, B=4 L=32k took 2% more time (H200). */
      dec_load_q<D, QT, KV8, MT>(smem, a, tok0, kvh, row0, rows, tid);
      int seq[STAGES + 1];
#pragma unroll
      for (int i = 0; i <= STAGES; i++) seq[i] = i < nst ? st0 + i : -1;
      { /* the claimed slots, through smem */
        if (tid == 0)
          for (int i = nst; i <= STAGES; i++) {
            const int t = dbase + claim0 + (i - nst);
            claim_s[i] = t < ntiles ? t : -1;
          }
        __syncthreads();
#pragma unroll
        for (int i = 0; i <= STAGES; i++)
          if (i >= nst) seq[i] = claim_s[i];
        __syncthreads(); /* claim_s read before the key loop's slot writes */
      }
      /* the prologue slots that are not static */
#pragma unroll
      for (int i = 0; i < STAGES - 1; i++) {
        if (i >= (nst < STAGES - 1 ? nst : STAGES - 1)) {
          if (seq[i] >= 0) {
            pre = dec_pre<D, KV8>(pt, k0 + seq[i] * BK, k1, ps, ps_mul, ps_shift, tid);
            dec_issue<D, KV8>(s_ring + i * STAGE, s_ring + i * STAGE + TILE,
                              pre, ps, kg, vg, row_bytes, tid);
          }
          kva_cp_async_commit();
        }
      }
      pre = seq[STAGES - 1] >= 0
                ? dec_pre<D, KV8>(pt, k0 + seq[STAGES - 1] * BK, k1, ps, ps_mul, ps_shift, tid)
                : dec_no_row();

      for (int it = 0; seq[0] >= 0; it++) {
        kva_cp_async_wait<STAGES - 2>(); /* this thread's copies of tile seq[0] landed */
        __syncthreads();                 /* everyone's did; the previous tile's stage is free */
        if (it == 0 && trace_chunks == 0) KVA_TRACE_STAMP(2, kva_globaltimer());
        if (it > 0) seq[STAGES] = claim_s[it & 1]; /* written before the barrier */
        int claim = 0;
        if (tid == 0) claim = atomicAdd(claim_ctr, 1); /* slot STAGES + 1, read below */
        {
          if (seq[STAGES - 1] >= 0) {
            const uint32_t st = s_ring + ((it + STAGES - 1) % STAGES) * STAGE;
            dec_issue<D, KV8>(st, st + TILE, pre, ps, kg, vg, row_bytes, tid);
          }
          pre = seq[STAGES] >= 0
                    ? dec_pre<D, KV8>(pt, k0 + seq[STAGES] * BK, k1, ps, ps_mul, ps_shift, tid)
                    : dec_no_row();
          kva_cp_async_commit();
        }
        const uint32_t sk = s_ring + (it % STAGES) * STAGE, sv = sk + TILE;
        dec_tile_any<D, QT, KV8, MT>(a, s_q, sk, sv, k0 + seq[0] * BK, k1, cached, nt, trow, mt1,
                                     cap, swz, lane, warp, o, m, l);
        /* the claim for slot STAGES + 1 (its latency hidden behind this tile) */
        if (tid == 0) {
          const int t = dbase + claim;
          claim_s[(it + 1) & 1] = t < ntiles ? t : -1;
        }
#pragma unroll
        for (int i = 0; i < STAGES; i++) seq[i] = seq[i + 1];
      }
    }
    kva_cp_async_wait<0>(); /* only empty groups remain; the ring becomes scratch */
    __syncthreads();
    trace_chunks++;
    KVA_TRACE_STAMP(3, kva_globaltimer());

    /* ---- merge the 4 warps' states: registers -> scratch ---- */
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int row = 16 * mi + g + 8 * h;
        const float lsum = kva_quad_sum(l[mi][h]);
        if (q == 0) {
          scr_m[warp * ROWS + row] = m[mi][h];
          scr_l[warp * ROWS + row] = lsum;
        }
        float *orow = scr_o + (warp * ROWS + row) * OS;
        if (KV8) { /* n-tiles 2b, 2b+1 hold dims 16b + 4q + {0, 2} and {1, 3} */
#pragma unroll
          for (int b = 0; b < D / 16; b++)
            *(float4 *)(orow + 16 * b + 4 * q) =
                make_float4(o[mi][2 * b][2 * h], o[mi][2 * b + 1][2 * h], o[mi][2 * b][2 * h + 1],
                            o[mi][2 * b + 1][2 * h + 1]);
        } else {
#pragma unroll
          for (int n = 0; n < ON; n++)
            *(float2 *)(orow + 8 * n + 2 * q) = make_float2(o[mi][n][2 * h], o[mi][n][2 * h + 1]);
        }
      }
    __syncthreads();

    /* ---- scratch -> O (or the partial row), 4 dims per thread ---- */
    const int rows_here = rows - row0 < ROWS ? rows - row0 : ROWS;
    for (int idx = tid; idx < rows_here * (D / 4); idx += KVA_DEC_THREADS) {
      const int row = idx / (D / 4), d4 = idx % (D / 4);
      float mt = -INFINITY;
#pragma unroll
      for (int w = 0; w < KVA_DEC_WARPS; w++) mt = fmaxf(mt, scr_m[w * ROWS + row]);
      float lt = 0.0f;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (mt != -INFINITY) {
#pragma unroll
        for (int w = 0; w < KVA_DEC_WARPS; w++) {
          const float sc = kva_ex2(scr_m[w * ROWS + row] - mt);
          const float4 v = *(const float4 *)(scr_o + (w * ROWS + row) * OS + 4 * d4);
          lt += scr_l[w * ROWS + row] * sc;
          acc.x += v.x * sc;
          acc.y += v.y * sc;
          acc.z += v.z * sc;
          acc.w += v.w * sc;
        }
      }
      const float inv = lt > 0.0f ? a.o_mul / lt : 0.0f;
      const float lse = lt > 0.0f ? (mt + log2f(lt)) * KVA_DEC_LN2 : -INFINITY;
      const int grow = row0 + row, t = grow / a.group, h = kvh * a.group + grow % a.group;
      if (nsplit == 1) {
        const size_t orow = (size_t)(tok0 + t) * a.hq + h;
        dec_store4<QT>((uint16_t *)a.o + orow * D + 4 * d4, acc.x * inv, acc.y * inv, acc.z * inv,
                       acc.w * inv);
        if (a.lse && d4 == 0) a.lse[orow] = lse;
      } else {
        const size_t prow = ((size_t)a.split_row_offset[r] + (size_t)split * nt + t) * a.hq + h;
        *(float4 *)(a.part_o + prow * D + 4 * d4) =
            make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
        if (d4 == 0) a.part_lse[prow] = lse;
      }
    }
    if (nsplit > 1) {
      /* Publish this chunk and count it; the chunk that completes the count
       * merges all of them and resets the counters for the next run. */
      KVA_TRACE_STAMP(4, kva_globaltimer());
      __syncthreads(); /* the CTA's partial rows are written; scratch is read */
      if (tid == 0) {
        const int last = kva_split_arrive(a.split_sem + (size_t)r * a.hq + blockIdx.y, nsplit);
        if (last) atomicExch(claim_ctr, 0); /* every chunk has stopped claiming */
        scr_m[0] = last ? 1.0f : 0.0f;
      }
      __syncthreads();
      if (scr_m[0] != 0.0f) {
        trace_merges++;
        KVA_TRACE_STAMP(5, kva_globaltimer());
        KVA_TRACE_STAMP(6, kva_globaltimer());
        dec_merge_chunks<D, QT, KV8>(a, r, nsplit, nt, tok0, kvh, row0, rows_here, tid);
        KVA_TRACE_STAMP(7, kva_globaltimer());
      }
    }
    __syncthreads(); /* scratch read before the next request's Q and ring writes */
  }
  KVA_TRACE_STAMP(8, kva_globaltimer());
  KVA_TRACE_STAMP(9, kva_smid());
  KVA_TRACE_STAMP(10, trace_chunks);
  KVA_TRACE_STAMP(11, trace_merges);
}

#endif /* KVA_CUDA_DECODE_KERNEL_CUH */
