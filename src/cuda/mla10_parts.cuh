/* MLA decode v10's parts shared by its roles (mla_kernel_v10.cuh, where
 * the design is described): the register sets and groups at each row
 * count, the register budgets, the chunk-end scratch and phase-clock
 * macros, and the helpers: a block's fill into the byte stages, the V and
 * K fragments, Q's permuted rows, the rs wgmma, a worker's chunk as a row
 * tile sees it, and the CTA's context. */
#ifndef KVA_CUDA_MLA10_PARTS_CUH
#define KVA_CUDA_MLA10_PARTS_CUH

#include "cuda/mla9_fp8.cuh"

/* Register sets of S^T's A fragments in flight (a set is a column block)
 * and column blocks converted before each wgmma.fence, at N = 16 / 32
 * (the sets: with one S warpgroup; two have KVA_MLA10_KSETS_S2 each).
 * A warpgroup's conversion runs in series with the rs wgmmas it feeds
 * (bench/wgmma_rate.cu, rs_rate), and fewer fences shorten that chain:
 * H100, with one S warpgroup, two column blocks a fence (six sets) and
 * two key steps of O^T a fence (four sets) took 3.3-3.8% off FlashMLA's
 * fp8 rows of 16 query rows. At N = 32 six sets serialize the wgmmas
 * (C7512, registers); with two S warpgroups more O^T steps a fence were
 * slower (+0.3 to +3.2%) and two S^T column blocks a fence level. */
#ifndef KVA_MLA10_KSETS16
#define KVA_MLA10_KSETS16 6
#endif
#ifndef KVA_MLA10_KGROUP16
#define KVA_MLA10_KGROUP16 2
#endif
#ifndef KVA_MLA10_KSETS32
#define KVA_MLA10_KSETS32 4
#endif
#ifndef KVA_MLA10_KGROUP32
#define KVA_MLA10_KGROUP32 1
#endif
/* with two S warpgroups (KVA_MLA10_SWG16/32, mla.h) each has fewer registers */
#ifndef KVA_MLA10_KSETS_S2
#define KVA_MLA10_KSETS_S2 2
#endif
/* N = 64: one S warpgroup of fewer registers (KVA_MLA10_N64_SREGS) */
#ifndef KVA_MLA10_KSETS64
#define KVA_MLA10_KSETS64 2
#endif
#ifndef KVA_MLA10_KGROUP64
#define KVA_MLA10_KGROUP64 1
#endif
#define KVA_MLA10_KSETS(NQ, SW)                                                   \
  ((SW) == 2     ? KVA_MLA10_KSETS_S2                                             \
   : (NQ) == 16 ? KVA_MLA10_KSETS16                                              \
   : (NQ) == 32 ? KVA_MLA10_KSETS32                                              \
                : KVA_MLA10_KSETS64)
#define KVA_MLA10_KGROUP(NQ) \
  ((NQ) == 16 ? KVA_MLA10_KGROUP16 : (NQ) == 32 ? KVA_MLA10_KGROUP32 : KVA_MLA10_KGROUP64)
/* register sets of O^T's A fragments (a set is a key step; half of them
 * are converted before each wgmma.fence): 2 or 4, at N = 16 / 32 */
#ifndef KVA_MLA10_VSETS16
#define KVA_MLA10_VSETS16 4
#endif
#ifndef KVA_MLA10_VSETS32
#define KVA_MLA10_VSETS32 2
#endif
#ifndef KVA_MLA10_VSETS64
#define KVA_MLA10_VSETS64 2
#endif
#define KVA_MLA10_VSETS(NQ) \
  ((NQ) == 16 ? KVA_MLA10_VSETS16 : (NQ) == 32 ? KVA_MLA10_VSETS32 : KVA_MLA10_VSETS64)
/* key steps converted before each wgmma.fence: half the sets by default */
#ifndef KVA_MLA10_VGROUP16
#define KVA_MLA10_VGROUP16 (KVA_MLA10_VSETS16 / 2)
#endif
#ifndef KVA_MLA10_VGROUP32
#define KVA_MLA10_VGROUP32 (KVA_MLA10_VSETS32 / 2)
#endif
#ifndef KVA_MLA10_VGROUP64
#define KVA_MLA10_VGROUP64 (KVA_MLA10_VSETS64 / 2)
#endif
#define KVA_MLA10_VGROUP(NQ) \
  ((NQ) == 16 ? KVA_MLA10_VGROUP16 : (NQ) == 32 ? KVA_MLA10_VGROUP32 : KVA_MLA10_VGROUP64)
/* accumulator sets S^T's k-steps go round (then summed); one with two S
 * warpgroups (fewer registers; H100: 0.7-3.9% faster than two there) */
#ifndef KVA_MLA10_SACC
#define KVA_MLA10_SACC 2
#endif
#ifndef KVA_MLA10_SACC_S2
#define KVA_MLA10_SACC_S2 1
#endif
#ifndef KVA_MLA10_SACC64
#define KVA_MLA10_SACC64 1
#endif
/* Bytes of a chunk end's scratch (O's rows, the merge's): the NS byte
 * stages, at NQ 64 with Q's and P^T's smem before them */
#define KVA_MLA10_END_SCRATCH(nq, ns) \
  ((ns) * KVA_MLA9_TILE8 + ((nq) == 64 ? KVA_MLA10_Q(nq) + KVA_MLA10_PBUF * KVA_MLA10_P(nq) : 0))
/* -DKVA_MLA10_PHASES (diagnostics; with KVA_DEC_TRACE=FILE kvattn bench,
 * read by scripts/mla10_phases.py): each CTA's cycles per phase summed
 * over its blocks, in its trace record. S warpgroup 0 (thread 0; with two
 * S warpgroups, over its own blocks only): 0 bytes wait, 1 S^T's
 * conversion and issue, 2 S^T's wait, 3 the block max and its barrier, 4
 * the P^T buffer's wait, 5 P^T written, 11 blocks; the O warpgroups
 * (thread 128 SW): 6 bytes wait, 7 P^T's wait, 8 rescale and O^T issued,
 * 9 O^T's wait, 10 the refill. */
#ifdef KVA_MLA10_PHASES
#define MLA10_CLK(t) const long long t = clock64()
#define MLA10_ADD(k, t1, t0) ph[k] += (unsigned long long)((t1) - (t0))
#define MLA10_BLOCK() ph[11]++
#define MLA10_PH_PARAM , unsigned long long *ph
#else
#define MLA10_PH_PARAM
#define MLA10_CLK(t) \
  do {               \
  } while (0)
#define MLA10_ADD(k, t1, t0) \
  do {                       \
  } while (0)
#define MLA10_BLOCK() \
  do {                \
  } while (0)
#endif
#define KVA_MLA10_BAR_S 1  /* S warpgroup 0 */
#define KVA_MLA10_BAR_O 2  /* the O warpgroups (3 and 4: mla_finish_chunk's) */
#define KVA_MLA10_BAR_S1 5 /* S warpgroup 1 (SW = 2) */
#define KVA_MLA10_BAR_SS 6 /* both S warpgroups (SW = 2) */
/* SW = 2: setmaxnreg of the S and the O warpgroups (a zero sum over the
 * CTA's 4 x 128 registers a thread slot) */
#ifndef KVA_MLA10_S2_SREGS
#define KVA_MLA10_S2_SREGS 104
#endif
#ifndef KVA_MLA10_S2_OREGS
#define KVA_MLA10_S2_OREGS 152
#endif
static_assert(2 * KVA_MLA10_S2_SREGS + 2 * KVA_MLA10_S2_OREGS <= 4 * 128, "setmaxnreg: zero-sum");
/* NQ = 64 (one S warpgroup, 384 threads, 168 registers at launch): the O
 * warpgroups hold 128 accumulators each */
#ifndef KVA_MLA10_N64_SREGS
#define KVA_MLA10_N64_SREGS 104
#endif
#ifndef KVA_MLA10_N64_OREGS
#define KVA_MLA10_N64_OREGS 200
#endif
static_assert(KVA_MLA10_N64_SREGS + 2 * KVA_MLA10_N64_OREGS <= 3 * 168, "setmaxnreg: zero-sum");

/* The fill of the block at kt (global block index u) into byte stage
 * u % NS, once its last contents were read (a fresh barrier passes parity
 * 1: a stage's first fill waits for nothing). ct: the O thread; PRE: its
 * page-table entry was read ahead into page (mla9_fill_page). */
template <uint32_t NS, bool PRE>
static __device__ __forceinline__ void mla10_fill(unsigned char *p_b8, uint32_t s_b8,
                                                  uint32_t s_bar, uint32_t u,
                                                  const unsigned char *kvg, const int32_t *pt,
                                                  int32_t page, int kt, int k1,
                                                  const kva_mla_args &a, int ct) {
  const uint32_t sb = u % NS, use = u / NS;
  if (ct < KVA_MLA5_BN) kva_mbar_wait(s_bar + 8 * (NS + sb), (use & 1u) ^ 1u);
  /* rows past the chunk (its last block) as zero bytes, so O^T's
   * fragments need no masks (P is 0 there, and 0 x NaN would not be; H100:
   * the masks were ~10% of the 32-row time); before this thread's arrival
   * on `full`, and fenced from the next bulk copy into them */
  if (ct < KVA_MLA5_BN && kt + ct >= k1) {
    uint4 *row = (uint4 *)(p_b8 + sb * KVA_MLA9_TILE8 + ct * KVA_MLA_D);
#pragma unroll 4
    for (int i = 0; i < KVA_MLA_D / 16; i++) row[i] = make_uint4(0u, 0u, 0u, 0u);
    kva_fence_proxy_async_smem();
  }
  mla9_issue_f8_pt<PRE>(s_b8 + sb * KVA_MLA9_TILE8, s_bar + 8 * sb, kvg, pt, page, kt, k1, a, ct);
}

/* O^T's A fragments (V^T, f16) for key step st straight from the bytes:
 * the thread's M rows of its warpgroup's four 64-dim tiles c (16 wq + g,
 * + 8) stand for dims 256 h + 64 wq + 8 g + 2 c (+ 1), so one 8-byte load
 * of a key serves all four tiles; its keys are 16 st + 2 tq, + 1, + 8 and
 * + 9 (the fragment's k columns), rows of the first pair loaded in an
 * order that puts a quarter warp's loads on distinct banks. Keys past the
 * chunk are zero bytes (mla10_fill), so P V stays finite unmasked. */
static __device__ __forceinline__ void mla10_v_frags(uint32_t f[4][4], const unsigned char *st8,
                                                     int st, int h, int wq, int g, int tq) {
  const int r0 = 16 * st + 2 * tq, odd = tq & 1;
  const unsigned char *const base = st8 + 256 * h + 64 * wq + 8 * g;
  const uint2 xa = *(const uint2 *)(base + (r0 + odd) * KVA_MLA_D);
  const uint2 xb = *(const uint2 *)(base + (r0 + 1 - odd) * KVA_MLA_D);
  const uint2 ya = *(const uint2 *)(base + (r0 + 8 + odd) * KVA_MLA_D);
  const uint2 yb = *(const uint2 *)(base + (r0 + 9 - odd) * KVA_MLA_D);
  /* xa holds key r0 + odd: the permute's selector takes the pair's order
   * (bytes 0-3 <-> 4-7) instead of a select per word */
  const uint32_t flip = odd ? 0x4444u : 0u;
#pragma unroll
  for (int c = 0; c < 4; c++) {
    /* bytes 2c, 2c + 1 (dims 2c, 2c + 1) of the two keys of a pair */
    const uint32_t sel = ((uint32_t)(2 * (c & 1)) * 0x1111u + 0x5140u) ^ flip;
    const uint32_t px = kva_prmt(c < 2 ? xa.x : xa.y, c < 2 ? xb.x : xb.y, sel);
    const uint32_t py = kva_prmt(c < 2 ? ya.x : ya.y, c < 2 ? yb.x : yb.y, sel);
    f[c][0] = kva_cvt_e4m3x2_f16x2_lo(px); /* dim 2c, keys r0, r0 + 1 */
    f[c][1] = kva_cvt_e4m3x2_f16x2_hi(px); /* dim 2c + 1 */
    f[c][2] = kva_cvt_e4m3x2_f16x2_lo(py); /* dim 2c, keys r0 + 8, r0 + 9 */
    f[c][3] = kva_cvt_e4m3x2_f16x2_hi(py);
  }
}

/* S^T's A operand straight from the bytes: warp wq's keys 16 wq + g and
 * + 8, 16 dims 64 cb + 16 tq .. of each (one 16-byte load a key), as the
 * A fragments of the column block's four k-steps. K-step s takes dims
 * 16 t + 4 s .. 16 t + 4 s + 3 of every t (so one word of each load is one
 * k-step's pair of registers); Q's smem rows are stored in that order
 * (mla10_q_permute). */
static __device__ __forceinline__ void mla10_k_frags(uint32_t f[4][4], const unsigned char *p_st8,
                                                     int cb, int wq, int g, int tq) {
  const unsigned char *src = p_st8 + (16 * wq + g) * KVA_MLA_D + 64 * cb + 16 * tq;
  const uint4 x = *(const uint4 *)src, y = *(const uint4 *)(src + 8 * KVA_MLA_D);
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int st = 0; st < 4; st++) {
    f[st][0] = kva_cvt_e4m3x2_f16x2_lo(xs[st]); /* key g, k 2 tq .. (dims 4 st + 0, 1) */
    f[st][1] = kva_cvt_e4m3x2_f16x2_lo(ys[st]); /* key g + 8 */
    f[st][2] = kva_cvt_e4m3x2_f16x2_hi(xs[st]); /* key g, k 2 tq + 8 .. (dims 4 st + 2, 3) */
    f[st][3] = kva_cvt_e4m3x2_f16x2_hi(ys[st]);
  }
}

/* Q's row `row`, column block cb, in place: its 32 words (dim pairs) into
 * mla10_k_frags's k order (logical word 8 s + i <- dim pair 8 (i % 4) +
 * 2 s + i / 4), and bf16 -> f16 times 2^-8 when Q is bf16 (as v2). */
template <int QT, int NQ>
static __device__ __forceinline__ void mla10_q_permute(unsigned char *p_q, int row, int cb) {
  unsigned char *const base = p_q + cb * (NQ * 128) + row * 128;
  const int sw = row & 7;
  uint32_t w[32];
#pragma unroll
  for (int q = 0; q < 8; q++) {
    const uint4 v = *(const uint4 *)(base + ((q ^ sw) << 4));
    w[4 * q] = v.x;
    w[4 * q + 1] = v.y;
    w[4 * q + 2] = v.z;
    w[4 * q + 3] = v.w;
  }
  if (QT != KVA_F16)
#pragma unroll
    for (int i = 0; i < 32; i++) w[i] = kva_q_bf16x2_to_f16x2(w[i]);
#pragma unroll
  for (int q = 0; q < 8; q++) {
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int lw = 4 * q + k, st = lw >> 3, i = lw & 7;
      o[k] = w[8 * (i & 3) + 2 * st + (i >> 2)];
    }
    *(uint4 *)(base + ((q ^ sw) << 4)) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

/* wgmma.wait_group n for n known once the loops are unrolled (0..7) */
static __device__ __forceinline__ void mla10_wgmma_wait_n(int n) {
  switch (n) {
    case 0: kva_wgmma_wait<0>(); break;
    case 1: kva_wgmma_wait<1>(); break;
    case 2: kva_wgmma_wait<2>(); break;
    case 3: kva_wgmma_wait<3>(); break;
    case 4: kva_wgmma_wait<4>(); break;
    case 5: kva_wgmma_wait<5>(); break;
    case 6: kva_wgmma_wait<6>(); break;
    default: kva_wgmma_wait<7>(); break;
  }
}

/* One rs k-step of either product (N = NQ): d (+)= A B */
template <int NQ>
static __device__ __forceinline__ void mla10_mma_rs(float *d, const uint32_t a[4], uint64_t db,
                                                    int acc) {
  if (NQ == 16)
    kva_wgmma_m64n16k16_rs_f16(d, a, db, acc);
  else if (NQ == 32)
    kva_wgmma_m64n32k16_rs_f16(d, a, db, acc);
  else
    kva_wgmma_m64n64k16_rs_f16(d, a, db, acc);
}

/* A worker's chunk as a row tile of NQ rows sees it: false when the
 * request is not a decode request or has no rows in the tile. */
struct mla10_chunk {
  int r, nsplit, nt, rows, cached, nblk, tok0;
  kva_split_chunk ch;
  const int32_t *pt;
};
template <int NQ>
static __device__ __forceinline__ bool mla10_chunk_at(const kva_mla_args &a,
                                                      const kva_split_work &wk, int wi, int row0,
                                                      mla10_chunk *c) {
  const int r = a.sched_order[wi];
  c->r = r;
  c->nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
  if (c->nsplit == 0) return false; /* not a decode request */
  c->nt = a.num_new[r];
  const int rows_all = c->nt * a.hq;
  if (row0 >= rows_all) return false;
  /* this tile's rows end (mla_finish_chunk's bound) */
  c->rows = rows_all < row0 + NQ ? rows_all : row0 + NQ;
  const int kv_len = a.cache_seqlens[r];
  c->cached = kv_len - c->nt;
  c->ch = kva_split_chunk_at(wk, wi, kv_len);
  c->nblk = c->ch.k1 > c->ch.k0 ? (c->ch.k1 - c->ch.k0 + KVA_MLA5_BN - 1) / KVA_MLA5_BN : 0;
  c->tok0 = a.cu_q[r];
  c->pt = a.page_table + (size_t)r * a.hdr->page_table_stride;
  return true;
}

/* The CTA's smem and its thread's place, shared by the roles. */
struct mla10_ctx {
  unsigned char *p_q, *p_p, *p_b8;
  uint32_t s_q, s_p, s_b8;
  float *red, *cst, *sm, *sl, *mch, *rlb;
  int *klim; /* NQ 64 */
  uint32_t s_bar, pfull, pempty, sfull, sempty, mready, qfree;
  volatile int *flag;
  const unsigned char *kvg;
  float qk_mul;
  int tid, wg, wq, g, tq, tw, row0;
};

#endif /* KVA_CUDA_MLA10_PARTS_CUH */
