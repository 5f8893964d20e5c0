/* Extend (prefill) attention on tensor cores: FlashAttention-2 on mma.sync.
 *
 * One CTA (4 warps) computes a work item = (request, tile of BM query rows,
 * one q head) over the request's visible keys, BN keys at a time. Each warp
 * owns 16*MT query rows. K/V rows are gathered from the paged pool with
 * 16-byte cp.async into a 2-stage smem ring (fp8 pools: raw fp8 ring plus a
 * conversion pass into one 16-bit K/V tile). 16-bit tiles have padded rows
 * so every ldmatrix and cp.async is bank-conflict free.
 *
 * Persistent grid (fixed by SM count, never by the batch): CTA b takes items
 * of the host-sorted (heaviest first) list in snake order, reading the item
 * count from device memory.
 *
 * Device code only; extend_launch.cuh launches it. */
#ifndef KVA_CUDA_EXTEND_KERNEL_CUH
#define KVA_CUDA_EXTEND_KERNEL_CUH

#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cuda/extend.h"
#include "cuda/ptx.cuh"

#define KVA_EXT_THREADS 128
#define KVA_EXT_STAGES 2

/* ---- per-tile pieces ---------------------------------------------------- */

/* 16-bit tiles keep rows of D*2 bytes at a stride of D*2 + 16: the 16-byte
 * pad shifts consecutive rows by 4 banks, so the 8 row addresses of an
 * ldmatrix (and 8 consecutive chunks of cp.async) hit distinct banks, while
 * every k-step offset stays an immediate (no per-step XOR registers). */
#define EXT_RS(d) KVA_EXT_RS(d)
static __device__ __forceinline__ uint32_t ext_off(int row, int c, int row_stride) {
  return (uint32_t)(row * row_stride + (c << 4));
}

/* KV slot of key `key` of a request (page table row pt), -1 past kv_len. */
static __device__ __forceinline__ int ext_slot(const int32_t *pt, int key, int kv_len, int ps,
                                               uint32_t ps_mul, int ps_shift) {
  if (key >= kv_len) return -1;
  /* key / ps by multiply-high (Granlund-Montgomery; exact for key < 2^31) */
  uint32_t pg = (__umulhi((uint32_t)key, ps_mul) + (uint32_t)key) >> ps_shift;
  int off = key - (int)pg * ps;
  return __ldg(pt + pg) * ps + off;
}

/* Issues the cp.async of one K and one V tile (BN keys) into kdst/vdst.
 * Thread tid copies chunk tid % LCPR of rows tid / LCPR + i * RPI; the KV
 * slot of each row comes from lane (i * RW + lane / LCPR) of the warp, whose
 * `pre` holds the slot of row warp*RW + lane%RW + (lane/RW)*RPI. Rows past
 * kv_len (slot -1) are zero-filled so that masked P * V stays finite.
 * kg/vg point at the kv head's row of slot 0 in K/V. */
template <int D, int BN, int KV8>
static __device__ __forceinline__ void ext_issue_kv(uint32_t kdst, uint32_t vdst, int pre,
                                                    const unsigned char *kg,
                                                    const unsigned char *vg, int slot_elems,
                                                    int tid) {
  constexpr int KVB = KV8 ? 1 : 2;
  constexpr int LCPR = D * KVB / 16;
  constexpr int RPI = KVA_EXT_THREADS / LCPR;
  constexpr int LIT = BN / RPI;
  constexpr int RW = 32 / LCPR;
  const int lane = tid & 31, c = tid % LCPR;
#pragma unroll
  for (int i = 0; i < LIT; i++) {
    int slot = __shfl_sync(0xffffffffu, pre, i * RW + lane / LCPR);
    int row = tid / LCPR + i * RPI;
    uint32_t dst = KV8 ? (uint32_t)(row * D + c * 16) : ext_off(row, c, EXT_RS(D));
    int64_t off = (slot >= 0 ? (int64_t)slot * slot_elems : 0) * KVB + c * 16;
    int bytes = slot >= 0 ? 16 : 0;
    kva_cp_async_16(kdst + dst, kg + off, bytes);
    kva_cp_async_16(vdst + dst, vg + off, bytes);
  }
}

/* Two e4m3 values (low 16 bits of x) -> two values of the MMA type. */
template <int QT>
static __device__ __forceinline__ uint32_t ext_e4m3x2(uint32_t x) {
  uint32_t h = kva_cvt_e4m3x2_f16x2((uint16_t)(x & 0xffffu));
  if (QT == KVA_F16) return h;
  return kva_f16x2_to_bf16x2(h); /* exact: e4m3 fits bf16 */
}

/* fp8 pools: raw [BN][D] bytes -> padded 16-bit [BN][D] tile, one
 * 16-byte output chunk (8 values) per thread and step. */
template <int D, int BN, int QT>
static __device__ __forceinline__ void ext_convert_tile(const unsigned char *raw,
                                                        unsigned char *dst) {
  constexpr int CPR = D / 8;
  static_assert((BN * CPR) % KVA_EXT_THREADS == 0, "conversion mapping");
  /* rows tid / CPR + i * (THREADS / CPR): offsets are immediates. tid is
   * re-read so that these addresses are not kept live across the tile loop. */
  const uint32_t tid = kva_tid_x_volatile();
  const unsigned char *src = raw + (tid / CPR) * D + (tid % CPR) * 8;
  unsigned char *out_p = dst + ext_off(tid / CPR, tid % CPR, EXT_RS(D));
#pragma unroll
  for (int i = 0; i < BN * CPR / KVA_EXT_THREADS; i++) {
    const uint2 in = *(const uint2 *)(src + i * (KVA_EXT_THREADS / CPR) * D);
    uint4 out;
    out.x = ext_e4m3x2<QT>(in.x);
    out.y = ext_e4m3x2<QT>(in.x >> 16);
    out.z = ext_e4m3x2<QT>(in.y);
    out.w = ext_e4m3x2<QT>(in.y >> 16);
    *(uint4 *)(out_p + i * (KVA_EXT_THREADS / CPR) * EXT_RS(D)) = out;
  }
}

template <int QT>
static __device__ __forceinline__ uint32_t ext_pack(float lo, float hi) {
  return QT == KVA_F16 ? kva_pack_f16x2(lo, hi) : kva_pack_bf16x2(lo, hi);
}

template <int QT>
static __device__ __forceinline__ void ext_mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
  if (QT == KVA_F16)
    kva_mma_f16(c, a, b0, b1);
  else
    kva_mma_bf16(c, a, b0, b1);
}

/* ---- the kernel --------------------------------------------------------- */

/* One softmax step over KS keys of the current K/V tile for this warp's
 * 16*MT rows: S = Q K^T, scale or soft-cap, mask, online softmax, O += P V.
 * q_base/k_base/v_base are the lane's ldmatrix addresses of k-step 0;
 * p_row0 is the position of the warp's first row. */
template <int D, int QT, int MT, int KS>
static __device__ __forceinline__ void ext_step(float o[MT][D / 8][4], float m[MT][2],
                                                float l[MT][2], uint32_t q_base, uint32_t k_base,
                                                uint32_t v_base, int k0, int need_mask, int p_row0,
                                                int kv_len, int causal, int window_left,
                                                float qk_mul, float cap_log2, int lane) {
  constexpr int RS = EXT_RS(D);
  float sc[MT][KS / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int nt = 0; nt < KS / 8; nt++)
#pragma unroll
      for (int e = 0; e < 4; e++) sc[mt][nt][e] = 0.f;
#pragma unroll 4
  for (int kk = 0; kk < D / 16; kk++) {
    uint32_t qa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) kva_ldmatrix_x4(qa[mt], q_base + mt * 16 * RS + kk * 32);
#pragma unroll
    for (int np = 0; np < KS / 16; np++) {
      uint32_t kf[4];
      kva_ldmatrix_x4(kf, k_base + np * 16 * RS + kk * 32);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        ext_mma<QT>(sc[mt][2 * np], qa[mt], kf[0], kf[1]);
        ext_mma<QT>(sc[mt][2 * np + 1], qa[mt], kf[2], kf[3]);
      }
    }
  }

  /* Logits in log2 units are mul * s: the scale is folded into the exp's
   * FFMA (mul > 0: sm_scale and k_scale are positive). The soft-cap,
   * x = cap tanh(y) with tanh(y) = 1 - 2 / (1 + e^2y), is applied here. */
  float mul = qk_mul;
  if (cap_log2 != 0.f) {
    mul = 1.f;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int nt = 0; nt < KS / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          sc[mt][nt][e] = cap_log2 * (1.f - 2.f * kva_rcp(1.f + kva_ex2(sc[mt][nt][e] * qk_mul)));
  }

  if (need_mask) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const int p = p_row0 + mt * 16 + (lane >> 2) + hf * 8;
        const int jhi = causal ? min(kv_len, p + 1) : kv_len;
        const int jlo = window_left >= 0 ? p - window_left : INT_MIN;
#pragma unroll
        for (int nt = 0; nt < KS / 8; nt++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int j = k0 + nt * 8 + 2 * (lane & 3) + e;
            if (j >= jhi || j < jlo) sc[mt][nt][2 * hf + e] = -INFINITY;
          }
      }
  }

  /* Online softmax; a row's 4 owners are one lane quad. P is packed to the
   * MMA type right away (pk[mt][nt][hf]: row half hf, 2 keys). O is
   * rescaled only when some row of the warp got a new maximum. */
  uint32_t pk[MT][KS / 8][2];
  float alpha[MT][2];
  int rescale = 0;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < KS / 8; nt++)
        mx = fmaxf(mx, fmaxf(sc[mt][nt][2 * hf], sc[mt][nt][2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(m[mt][hf], mx * mul);
      const float m_use = mx == -INFINITY ? 0.f : mx; /* row fully masked so far */
      alpha[mt][hf] = kva_ex2(m[mt][hf] - m_use);
      rescale |= mx != m[mt][hf];
      m[mt][hf] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < KS / 8; nt++) {
        const float p0 = kva_ex2(fmaf(sc[mt][nt][2 * hf], mul, -m_use));
        const float p1 = kva_ex2(fmaf(sc[mt][nt][2 * hf + 1], mul, -m_use));
        sum += p0 + p1;
        pk[mt][nt][hf] = ext_pack<QT>(p0, p1);
      }
      l[mt][hf] = l[mt][hf] * alpha[mt][hf] + sum;
    }
  if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++) {
        o[mt][dt][0] *= alpha[mt][0];
        o[mt][dt][1] *= alpha[mt][0];
        o[mt][dt][2] *= alpha[mt][1];
        o[mt][dt][3] *= alpha[mt][1];
      }
  }

  /* O += P V: P from registers as the A operand, V via ldmatrix.trans */
#pragma unroll
  for (int kk = 0; kk < KS / 16; kk++) {
    uint32_t pa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      pa[mt][0] = pk[mt][2 * kk][0];
      pa[mt][1] = pk[mt][2 * kk][1];
      pa[mt][2] = pk[mt][2 * kk + 1][0];
      pa[mt][3] = pk[mt][2 * kk + 1][1];
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; dp++) {
      uint32_t vf[4];
      kva_ldmatrix_x4_trans(vf, v_base + kk * 16 * RS + dp * 32);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        ext_mma<QT>(o[mt][2 * dp], pa[mt], vf[0], vf[1]);
        ext_mma<QT>(o[mt][2 * dp + 1], pa[mt], vf[2], vf[3]);
      }
    }
  }
}

/* A work item's scalars. Every thread derives them from the item index;
 * between rounds they live in smem (two slots, current and next) rather
 * than in registers, which the accumulators need: thread 0 writes a slot
 * before a barrier, all threads read it (volatile) after it. */
typedef struct ext_item {
  const unsigned char *kg, *vg; /* the item's kv head at slot 0 in K and V */
  const int32_t *pt;            /* the request's page table row */
  int kv_len, kb;               /* keys of the request; first key of tile 0 */
  int p_first, p_last;          /* positions of the first and last valid query row */
  int q_row0, n_valid, h;       /* Q/O row of tile row 0, valid rows, q head */
  int ntiles;                   /* key tiles (0 when not valid) */
  int valid;                    /* the round has an item */
  int base;                     /* ring stage of key tile 0 */
  int pref;                     /* key tile 0 already issued by the previous round */
} ext_item;
static_assert(2 * sizeof(ext_item) <= KVA_EXT_ITEM_BYTES, "item scalars");

/* Item `item` of the launch. Tile-major (the static kernels): tile item / hq,
 * head item % hq. Head-major (the warp-specialized kernel, which hands items
 * out dynamically): head item / num_tiles, tile item % num_tiles, so the
 * CTAs at work at any time share few heads' KV in L2. BM: query rows of a
 * tile (the schedule's), BN: keys per key tile. */
template <int D, int KV8, int BM, int BN, int HEAD_MAJOR>
static __device__ __forceinline__ ext_item ext_item_at(const kva_ext_args *a, int item) {
  constexpr int KVB = KV8 ? 1 : 2;
  ext_item x;
  /* read per item (L1 hit) rather than held in a register */
  const int ntl = *(volatile const int32_t *)a->num_tiles;
  x.valid = item < ntl * a->hq;
  x.base = 0;
  x.pref = 0;
  if (!x.valid) {
    x.kg = x.vg = NULL;
    x.pt = NULL;
    x.kv_len = x.kb = x.p_first = x.p_last = x.q_row0 = x.n_valid = x.h = x.ntiles = 0;
    return x;
  }
  const int tile = HEAD_MAJOR ? item % ntl : item / a->hq;
  const int h = HEAD_MAJOR ? item / ntl : item % a->hq;
  const int2 tl = __ldg(&a->tiles[tile]);
  const int r = tl.x, t0 = tl.y;
  const int n_new = __ldg(&a->num_new[r]), kv_len = __ldg(&a->cache_seqlens[r]);
  const int64_t head_off = (int64_t)(h / a->group) * D * KVB;
  x.kg = (const unsigned char *)a->k + head_off;
  x.vg = (const unsigned char *)a->v + head_off;
  x.pt = a->page_table + (int64_t)r * __ldg(&a->hdr->page_table_stride);
  x.kv_len = kv_len;
  x.p_first = kv_len - n_new + t0;
  x.p_last = kv_len - n_new + min(t0 + BM, n_new) - 1;
  /* the key range [kb, kv_hi) the tile's rows can see */
  const int kv_hi = a->causal ? min(kv_len, x.p_last + 1) : kv_len;
  const int kv_lo = a->window_left >= 0 ? max(0, x.p_first - a->window_left) : 0;
  x.kb = (kv_lo / BN) * BN;
  x.ntiles = kv_hi > x.kb ? (kv_hi - x.kb + BN - 1) / BN : 0;
  x.q_row0 = __ldg(&a->cu_q[r]) + t0;
  x.n_valid = n_new - t0;
  x.h = h;
  return x;
}

/* The item of `round` for this CTA in the static kernels: snake order over
 * the sorted list. */
template <int D, int KV8, int BM, int BN>
static __device__ __forceinline__ ext_item ext_item_of(const kva_ext_args *a, int round) {
  const int g = (int)gridDim.x, b = (int)blockIdx.x;
  return ext_item_at<D, KV8, BM, BN, 0>(a, round * g + ((round & 1) ? g - 1 - b : b));
}

static __device__ __forceinline__ void ext_item_store(volatile ext_item *d, const ext_item &x) {
  d->kg = x.kg;
  d->vg = x.vg;
  d->pt = x.pt;
  d->kv_len = x.kv_len;
  d->kb = x.kb;
  d->p_first = x.p_first;
  d->p_last = x.p_last;
  d->q_row0 = x.q_row0;
  d->n_valid = x.n_valid;
  d->h = x.h;
  d->ntiles = x.ntiles;
  d->valid = x.valid;
  d->base = x.base;
  d->pref = x.pref;
}

/* Q tile of an item: rows past the request's tokens are zero-filled. Not
 * unrolled: its per-thread offsets would otherwise be hoisted and spilled. */
template <int D, int BM>
static __device__ __forceinline__ void ext_issue_q(const kva_ext_args *a, uint32_t s_q, int q_row0,
                                                   int n_valid, int h, int tid) {
  constexpr int CPR = D / 8, RS = EXT_RS(D);
  const unsigned char *qg = (const unsigned char *)a->q;
#pragma unroll 1
  for (int i = 0; i < BM * CPR / KVA_EXT_THREADS; i++) {
    const int idx = tid + i * KVA_EXT_THREADS, row = idx / CPR, c = idx % CPR;
    const int ok = row < n_valid;
    const unsigned char *src =
        ok ? qg + (((int64_t)(q_row0 + row) * a->hq + h) * D) * 2 + c * 16 : qg;
    kva_cp_async_16(s_q + ext_off(row, c, RS), src, ok ? 16 : 0);
  }
}

template <int D, int QT, int KV8>
__global__ void __launch_bounds__(KVA_EXT_THREADS, 2)
    kva_ext_kernel(const __grid_constant__ kva_ext_args a) {
  constexpr int MT = KVA_EXT_MT(D), BN = KVA_EXT_BN(D), BM = KVA_EXT_BM(D);
  constexpr int KS = KVA_EXT_KS(D);
  constexpr int NT = KVA_EXT_THREADS;
  constexpr int RS = EXT_RS(D); /* row stride of a 16-bit tile */
  constexpr int CPR = D / 8;    /* 16-byte chunks of a 16-bit row */
  constexpr int T16 = BN * RS;  /* bytes of one 16-bit K or V tile */
  constexpr int KVB = KV8 ? 1 : 2;
  constexpr int TRAW = BN * D * KVB;    /* bytes of one stored (unpadded) K or V tile */
  constexpr int STG = KV8 ? TRAW : T16; /* bytes of one K or V tile of a ring stage */
  constexpr int LCPR = D * KVB / 16;
  constexpr int RPI = NT / LCPR;
  constexpr int RW = 32 / LCPR;
  constexpr int LIT = BN / RPI;
  constexpr int RING = KV8 ? 2 * T16 : 0; /* offset of the cp.async stages after Q */
  constexpr int ITEM_OFF = KVA_EXT_SMEM(D, KV8) - KVA_EXT_ITEM_BYTES;
  static_assert(KVA_EXT_STAGES == 2, "the ring below alternates two stages");
  static_assert(LIT * RW <= 32, "one lane per gathered row");
  static_assert(BN % RPI == 0 && NT % LCPR == 0, "load mapping");
  static_assert((BM * CPR) % NT == 0, "Q load mapping");
  static_assert(ITEM_OFF >= BM * RS + RING + 2 * 2 * STG, "smem layout");
  static_assert(BM * RS <= 2 * T16, "O staging fits one stage (or the fp8 conversion tiles)");

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = kva_smem_u32(smem);
  const uint32_t s_kv = s_q + BM * RS; /* stages of (K, V); fp8: the converted K, V */
  const uint32_t s_ring = s_kv + RING; /* cp.async target stages */
  volatile ext_item *const its = (volatile ext_item *)(smem + ITEM_OFF);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wrow0 = warp * 16 * MT; /* first tile row of this warp */
  /* this lane's gathered row (slot prefetch, see ext_issue_kv); lanes past
   * LIT * RW are never read and just repeat row 0 */
  const int my_row = lane < LIT * RW ? warp * RW + (lane % RW) + (lane / RW) * RPI : 0;

  /* Lane parts of the ldmatrix addresses (matrix lane>>3, its row lane&7):
   * Q (A, x4) and V (B, x4.trans): row lane&15, chunk lane>>4;
   * K (B, x4): row (lane&7) + 8*(lane>>4), chunk (lane>>3)&1. */
  const uint32_t v_lane = ext_off(lane & 15, lane >> 4, RS);
  const uint32_t k_lane = ext_off((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1, RS);

  /* Round 0 issues its own Q and key tile 0. Each later round finds both in
   * flight: the previous round issued key tile 0 during its last key tile
   * and Q right after its last use of the Q tile, so item boundaries do not
   * drain the pipeline. `pre` = this lane's slot of the next tile to issue. */
  int pre = -1;
  {
    const ext_item x = ext_item_of<D, KV8, BM, BN>(&a, 0);
    if (tid == 0) ext_item_store(&its[0], x);
    if (x.valid) ext_issue_q<D, BM>(&a, s_q, x.q_row0, x.n_valid, x.h, tid);
    kva_cp_async_commit();
  }
  for (int round = 0;; round++) {
    volatile ext_item *const it = &its[round & 1], *const nx = &its[(round & 1) ^ 1];
    __syncthreads(); /* *it written; the previous round is done with smem */
    if (!it->valid) break;
    const int ntiles = it->ntiles;
    if (!it->pref && ntiles > 0) { /* round 0, or the previous item had no key tile */
      pre = ext_slot(it->pt, it->kb + my_row, it->kv_len, a.page_size, a.ps_mul, a.ps_shift);
      const uint32_t st = s_ring + it->base * 2 * STG;
      ext_issue_kv<D, BN, KV8>(st, st + STG, pre, it->kg, it->vg, a.hkv * D, tid);
      pre = ntiles > 1 ? ext_slot(it->pt, it->kb + BN + my_row, it->kv_len, a.page_size, a.ps_mul,
                                  a.ps_shift)
                       : -1;
      kva_cp_async_commit();
    }

    float o[MT][D / 8][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
      for (int dt = 0; dt < D / 8; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[mt][dt][e] = 0.f;
      m[mt][0] = m[mt][1] = -INFINITY;
      l[mt][0] = l[mt][1] = 0.f;
    }

    for (int n = 0; n < ntiles; n++) {
      kva_cp_async_wait<0>();
      __syncthreads(); /* tile n (and Q) visible to all; every warp left tile n-1 */
      const int kb = it->kb, kv_len = it->kv_len, base = it->base;
      {
        const uint32_t st = s_ring + ((base + n + 1) & 1) * 2 * STG;
        if (n + 1 < ntiles) {
          ext_issue_kv<D, BN, KV8>(st, st + STG, pre, it->kg, it->vg, a.hkv * D, tid);
          pre = n + 2 < ntiles ? ext_slot(it->pt, kb + (n + 2) * BN + my_row, kv_len, a.page_size,
                                          a.ps_mul, a.ps_shift)
                               : -1;
        } else { /* last tile: the next round's item and its key tile 0 */
          ext_item x = ext_item_of<D, KV8, BM, BN>(&a, round + 1);
          x.base = (base + n + 1) & 1;
          if (x.ntiles > 0) {
            x.pref = 1;
            pre = ext_slot(x.pt, x.kb + my_row, x.kv_len, a.page_size, a.ps_mul, a.ps_shift);
            ext_issue_kv<D, BN, KV8>(st, st + STG, pre, x.kg, x.vg, a.hkv * D, tid);
            pre = x.ntiles > 1 ? ext_slot(x.pt, x.kb + BN + my_row, x.kv_len, a.page_size, a.ps_mul,
                                          a.ps_shift)
                               : -1;
          }
          if (tid == 0) ext_item_store(nx, x);
        }
        kva_cp_async_commit();
      }
      uint32_t k_s;
      if (KV8) {
        const unsigned char *raw = smem + BM * RS + RING + ((base + n) & 1) * 2 * STG;
        ext_convert_tile<D, BN, QT>(raw, smem + BM * RS);
        ext_convert_tile<D, BN, QT>(raw + STG, smem + BM * RS + T16);
        __syncthreads();
        k_s = s_kv;
      } else {
        k_s = s_ring + ((base + n) & 1) * 2 * STG;
      }
      /* Softmax sub-steps of KS keys keep the S accumulators small. A warp
       * skips a sub-step none of its rows can see (past the diagonal of its
       * last row or kv_len, before the window of its first row); rows
       * beyond the request (p > p_last) are never stored. */
      const uint32_t q_base = s_q + wrow0 * RS + v_lane;
      const int p_lo = it->p_first + wrow0;                 /* warp's first row */
      const int p_hi = min(p_lo + 16 * MT - 1, it->p_last); /* its last valid row */
#pragma unroll 1
      for (int sub = 0; sub < BN / KS; sub++) {
        const int k0 = kb + n * BN + sub * KS;
        if (k0 >= kv_len || (a.causal && k0 > p_hi) ||
            (a.window_left >= 0 && k0 + KS - 1 < p_lo - a.window_left))
          continue;
        const int need_mask = (k0 + KS > kv_len) || (a.causal && k0 + KS - 1 > p_lo) ||
                              (a.window_left >= 0 && k0 < p_hi - a.window_left);
        ext_step<D, QT, MT, KS>(o, m, l, q_base, k_s + sub * KS * RS + k_lane,
                                k_s + T16 + sub * KS * RS + v_lane, k0, need_mask, p_lo, kv_len,
                                a.causal, a.window_left, a.qk_mul, a.cap_log2, lane);
      }
    }

    /* Epilogue. With no key tile the next item is set up here (behind an
     * extra barrier: the previous round may still read that slot) and Q may
     * still be landing. */
    if (ntiles == 0) {
      kva_cp_async_wait<0>();
      __syncthreads();
      if (tid == 0) {
        ext_item x = ext_item_of<D, KV8, BM, BN>(&a, round + 1);
        ext_item_store(nx, x);
      }
    }
    __syncthreads(); /* all warps are done with Q and the last stage; *nx written */
    /* O is staged in the last tile's stage (fp8: the conversion tiles; no
     * tile: stage 1, as the next key tile 0 goes to stage 0), freeing Q for
     * the next item's load right now. */
    const uint32_t s_o =
        KV8 ? s_kv : s_ring + (ntiles > 0 ? ((it->base + ntiles - 1) & 1) : 1) * 2 * STG;
    if (nx->valid) ext_issue_q<D, BM>(&a, s_q, nx->q_row0, nx->n_valid, nx->h, tid);
    kva_cp_async_commit();
    unsigned char *const p_o = smem + (s_o - s_q);
    const int q_row0 = it->q_row0, n_valid = it->n_valid, qh = it->h, hq = a.hq;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        float sum = l[mt][hf];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float inv = sum > 0.f ? a.o_mul / sum : 0.f;
        const int row = wrow0 + mt * 16 + (lane >> 2) + hf * 8;
        if (a.lse != NULL && (lane & 3) == 0 && row < n_valid)
          a.lse[(int64_t)(q_row0 + row) * hq + qh] =
              sum > 0.f ? (m[mt][hf] + __log2f(sum)) * 0.69314718055994531f : -INFINITY;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
          const uint32_t v = ext_pack<QT>(o[mt][dt][2 * hf] * inv, o[mt][dt][2 * hf + 1] * inv);
          *(uint32_t *)(p_o + ext_off(row, dt, RS) + (lane & 3) * 4) = v;
        }
      }
    __syncwarp();
    unsigned char *og = (unsigned char *)a.o;
#pragma unroll
    for (int i = 0; i < 16 * MT * CPR / 32; i++) {
      const int idx = lane + i * 32, row = wrow0 + idx / CPR, c = idx % CPR;
      if (row < n_valid) {
        const uint4 v = *(const uint4 *)(p_o + ext_off(row, c, RS));
        *(uint4 *)(og + (((int64_t)(q_row0 + row) * hq + qh) * D) * 2 + c * 16) = v;
      }
    }
  }
  kva_cp_async_wait<0>(); /* leave no copy in flight at exit */
}

#endif /* KVA_CUDA_EXTEND_KERNEL_CUH */
