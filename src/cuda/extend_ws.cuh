/* Extend (prefill) attention on Hopper, warp-specialized (FlashAttention-3
 * style): head_dim D = 64, 128 or 256, f16/bf16 Q with same-type paged KV.
 * Selected by default (KVA_EXTEND_KERNEL=ws); same work items, tile list,
 * output and LSE semantics as the wgmma kernel (extend_wgmma.cuh), whose
 * tile layout, descriptors, wgmma issue helpers and softmax it reuses.
 *
 * Per head dim (KVA_WS_BN, KVA_WS_STAGES): 128 query rows (2 consumer
 * warpgroups x 64) everywhere; key tiles of 128 keys at D = 64 and 128, of
 * 64 at D = 256, where O alone is 128 fp32 registers per consumer thread and
 * Q (64 KB) plus 2 stages of K and V (32 KB tiles) fill the smem. D = 64
 * tiles are 16 KB: 4 stages (5 and 6 measured no faster). A tile of R rows
 * is D / 64 column blocks of [R][128 B] (the wgmma 128-byte swizzle atom).
 *
 * A CTA is 3 warpgroups (384 threads):
 *  - warpgroup 0, the producer (setmaxnreg.dec to KVA_WS_PROD_REGS): its
 *    128 threads gather K and V tiles (128 keys) through the page table with
 *    16-byte cp.async into separate K and V rings of KVA_WS_STAGES stages,
 *    and the Q tile of each item into its own buffer. Completion is signalled
 *    with cp.async.mbarrier.arrive.noinc on the stage's full barrier (count:
 *    the 128 producer threads; Q's: + 1 for the item scalars' writer).
 *  - warpgroups 1 and 2, the consumers (setmaxnreg.inc to KVA_WS_CONS_REGS),
 *    64 query rows each: S = Q K^T and O += P V on wgmma, softmax on the
 *    accumulators. Every consumer thread arrives on a stage's K empty barrier
 *    once its S wgmma completed, on V's once its P V completed, on Q's once
 *    the item's last S completed (counts 256; Q's: 128 per half).
 * Each ring slot's phase follows a tile counter shared by the producer and
 * the consumers (stage = t % STAGES, parity = (t / STAGES) & 1); Q's follows
 * the round. Nothing in the main loop is a CTA-wide barrier.
 *
 * Consumers keep the intra-warpgroup overlap of the wgmma kernel (issue S_n,
 * then P_{n-1} V_{n-1}, run the softmax of S_n while P V runs) and add
 * pingpong between the two warpgroups: a token passed through named
 * barriers 1 and 2 orders their GEMM issues (consumer 0, 1, 0, 1, ...), so
 * one warpgroup's softmax runs while the tensor cores do the other's GEMMs.
 * Not at D = 64, where a tile's GEMMs are half as long and the two
 * warpgroups issue as they come: +1-3% there (fourteenth session).
 *
 * Item handoff: the producer takes each round's item from a counter
 * (head-major order, see ws_producer), prefetches its Q rows into L2, and
 * publishes its scalars in smem slot round % 3 together with the Q tile;
 * it issues K/V tile 0 of an item before waiting for the previous item's Q
 * to be released, so item boundaries keep the ring busy. Q is loaded and
 * released in halves (rows 64 w.. of consumer warpgroup w, each with its
 * own full / empty barrier), so the first warpgroup's next Q does not wait
 * for the second's last S. The slot of round r is written as soon as the
 * producer has the item: it waited for both halves of round r - 2's Q to
 * be released, so both consumers are past their epilogue of round r - 3,
 * the slot's previous user: three slots. O and LSE are stored
 * straight from the accumulators (no smem), so the epilogue cannot race
 * with the producer's loads. (Measured on the H100 before the halves and
 * the prefetch: consumers waited 1.4-2.9 us per item for Q.) */
#ifndef KVA_CUDA_EXTEND_WS_CUH
#define KVA_CUDA_EXTEND_WS_CUH

#include "cuda/extend_wgmma.cuh"
#include "cuda/trace.h"

#define KVA_WS_THREADS 384
#define KVA_WS_BM KVA_WS_TILE_ROWS /* query rows of an item (the plan's tile rows) */
/* KVA_WS_BN(d), the key tile: extend.h */
#ifndef KVA_WS_STAGES64 /* -D for A/B */
#define KVA_WS_STAGES64 4
#endif
#define KVA_WS_STAGES(d) ((d) == 64 ? KVA_WS_STAGES64 : (d) == 128 ? 3 : 2)
/* wg_softmax's SPEC: exponentials against the running max first (1, the
 * default: +2-7% on the H100's prefill rows, docs/performance.md, fourteenth
 * session); -DKVA_WS_SPEC=0 builds the max-first softmax for A/B */
#ifndef KVA_WS_SPEC
#define KVA_WS_SPEC 1
#endif
#define KVA_WS_PROD_REGS 40  /* 128 x (40 + 2 x 232) = 64512 <= 64K registers */
#define KVA_WS_CONS_REGS 232 /* launch: 65536 / 384 -> 168 per thread */
/* barriers: q_full and q_empty of each Q half (consumer warpgroup), then per
 * stage k_full, k_empty, v_full, v_empty */
#define KVA_WS_NBAR(d) (4 + 4 * KVA_WS_STAGES(d))
#define KVA_WS_RING_OFF 32 /* byte offset of the stage barriers */
/* Q half hf's barriers (rows 64 hf.., consumer warpgroup hf's) */
static __device__ __forceinline__ uint32_t ws_q_full(uint32_t s_bar, int hf) { return s_bar + 16 * hf; }
static __device__ __forceinline__ uint32_t ws_q_empty(uint32_t s_bar, int hf) {
  return s_bar + 16 * hf + 8;
}
#define KVA_WS_BAR_BYTES(d) (((KVA_WS_NBAR(d) * 8) + 127) / 128 * 128)
#define KVA_WS_QTILE(d) (KVA_WS_BM * (d)*2)          /* bytes of the Q tile */
#define KVA_WS_KVTILE(d) (KVA_WS_BN(d) * (d)*2)      /* ... of a K or V tile */
/* 1 KB alignment slack, Q, K ring, V ring, barriers, three items' scalars and
 * the producer's two item indices (d=128: 230784 B, 64: 148992, 256: 198016) */
#define KVA_WS_SMEM(d)                                                                 \
  (1024 + KVA_WS_QTILE(d) + 2 * KVA_WS_STAGES(d) * KVA_WS_KVTILE(d) + KVA_WS_BAR_BYTES(d) + \
   KVA_EXT_ITEM_BYTES)
static_assert(3 * sizeof(ext_item) + 2 * sizeof(int) <= KVA_EXT_ITEM_BYTES, "item slots");
#define KVA_WS_BAR_WG0 1 /* named barriers of the pingpong token */
#define KVA_WS_BAR_WG1 2
#define KVA_WS_BAR_PROD 3 /* the producer warpgroup's item broadcast */

/* Diagnostics (a build with -DKVA_EXT_TRACE; `KVA_DEC_TRACE=FILE kvattn
 * bench --mode prefill`, scripts/ext_trace.py): the first thread of each
 * consumer warpgroup sums SM cycles per phase in smem and writes them at
 * exit to a.trace record blockIdx.x (consumer 0) or gridDim.x + blockIdx.x
 * (consumer 1): words 0 entry / 6 exit (%globaltimer), 1 Q wait, 2 turn
 * issue + S wait, 3 softmax, 4 P V wait + rescale (2-4: tiles after the
 * first), 5 epilogue, 7 items, 8 key tiles, 9 cycles from entry to exit,
 * 10 K/V waits, 11 pingpong token waits. The clock reads constrain ptxas's
 * schedule: compare the trace build's speed with the plain one. */
#ifdef KVA_EXT_TRACE
static __shared__ unsigned ws_tr_acc[2][12];
#define WS_CLK(v) const unsigned v = (unsigned)clock64()
#define WS_ACC(w, d)                                                                \
  do {                                                                              \
    if (threadIdx.x == 128 || threadIdx.x == 256) ws_tr_acc[(threadIdx.x >> 7) - 1][w] += (d); \
  } while (0)
#else
#define WS_CLK(v)
#define WS_ACC(w, d)
#endif

/* Byte offset of 16-byte chunk c (0 .. D / 8 - 1) of row `row` in a tile
 * of R rows (column blocks of [R][128 B], chunks swizzled by row % 8);
 * wg_sw128 at R = 128, D <= 128. */
template <int R>
static __device__ __forceinline__ uint32_t ws_sw(int row, int c) {
  return (uint32_t)((c >> 3) * (R * 128) + row * 128 + (((c & 7) ^ (row & 7)) << 4));
}

/* Producer row mapping of a tile: a row is CPR = D / 8 chunks (CPR =
 * 1 << CSH); thread p copies chunk p % CPR of rows p / CPR + RPI i (RPI =
 * 128 / CPR rows per step, RW = RPI / 4 of them per warp). Shifts and masks
 * (p >= 0), not signed division. */
#define KVA_WS_CSH(d) ((d) == 64 ? 3 : (d) == 128 ? 4 : 5)
template <int D>
static __device__ __forceinline__ int ws_my_row(int p) {
  constexpr int CSH = KVA_WS_CSH(D), RW = 32 >> CSH, RPI = 128 >> CSH, LIT = KVA_WS_BN(D) / RPI;
  static_assert((1 << CSH) == D / 8, "chunks per row");
  const int lane = p & 31, warp = p >> 5;
  return lane < RW * LIT ? RW * warp + (lane & (RW - 1)) + RPI * (lane >> (5 - CSH)) : 0;
}

/* Producer: cp.async of one K or V tile (BN keys) into the swizzled layout.
 * Thread p copies chunk c = p % CPR of rows p / CPR + RPI i; the slot of
 * each row comes from lane RW i + lane / CPR, whose `pre` holds the slot of
 * row ws_my_row (d=128: chunk p % 16 of rows p / 16 + 8 i from lane
 * 2 i + lane / 16, row 2 warp + lane % 2 + 8 (lane / 2)). Kept to a
 * shuffle, a max, one address multiply-add, a compare and the copy per row:
 * the chunk is the same for all rows of a thread, and so is row & 7 (the
 * swizzle) where RPI is a multiple of 8 (rows RPI 128 bytes apart; d=256:
 * two alternating bases), and slots are scaled once per tile to 16-byte
 * units (the launcher checks that a layer's buffer fits 2^31 of them). */
template <int D>
static __device__ __forceinline__ void ws_issue_tile(uint32_t dst, int pre, const unsigned char *g,
                                                     int slot_elems, int full, int p) {
  constexpr int BN = KVA_WS_BN(D), CSH = KVA_WS_CSH(D), RW = 32 >> CSH, RPI = 128 >> CSH;
  constexpr int LIT = BN / RPI;
  static_assert(RPI % 8 == 0 || RPI == 4, "swizzle phase per row step");
  const int lane = p & 31, c = p & ((1 << CSH) - 1);
  const int pre16 = pre >= 0 ? pre * (slot_elems >> 3) : -1; /* 16-byte units */
  const uint32_t d0 = dst + ws_sw<BN>(p >> CSH, c);
  const uint32_t d1 = dst + ws_sw<BN>((p >> CSH) + RPI, c); /* RPI = 4: odd steps */
  const unsigned char *const gc = kva_opaque_ptr(g + c * 16);
  if (full) { /* every row is a key (all but an item's last tile): no zero-fill */
#pragma unroll
    for (int i = 0; i < LIT; i++) {
      const int u = __shfl_sync(0xffffffffu, pre16, RW * i + (lane >> CSH));
      const uint32_t d = RPI % 8 == 0 ? d0 + i * RPI * 128 : (i & 1 ? d1 : d0) + (i >> 1) * 1024;
      kva_cp_async_16_all(d, gc + (size_t)(uint32_t)u * 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < LIT; i++) {
      const int u = __shfl_sync(0xffffffffu, pre16, RW * i + (lane >> CSH));
      const uint32_t d = RPI % 8 == 0 ? d0 + i * RPI * 128 : (i & 1 ? d1 : d0) + (i >> 1) * 1024;
      kva_cp_async_16_zfill(d, gc + (size_t)(uint32_t)max(u, 0) * 16, u < 0);
    }
  }
}

/* Rows 64 hf .. 64 hf + 63 of an item's Q tile (consumer warpgroup hf's). */
template <int D>
static __device__ __forceinline__ void ws_issue_q(const kva_ext_args *a, uint32_t s_q, int q_row0,
                                                  int n_valid, int h, int hf, int p) {
  constexpr int CSH = KVA_WS_CSH(D), RPI = 128 >> CSH, HI = KVA_WS_QBOX_ROWS / RPI;
  const unsigned char *qg = (const unsigned char *)a->q;
  const int c = p & ((1 << CSH) - 1);
#pragma unroll 1
  for (int i = hf * HI; i < hf * HI + HI; i++) {
    const int row = (p >> CSH) + RPI * i;
    const int ok = row < n_valid;
    const unsigned char *src =
        ok ? qg + (((int64_t)(q_row0 + row) * a->hq + h) * D) * 2 + c * 16 : qg;
    kva_cp_async_16(s_q + ws_sw<KVA_WS_BM>(row, c), src, ok ? 16 : 0);
  }
}

/* The producer warpgroup's loop (p = thread index in the warpgroup). */
template <int D>
static __device__ __forceinline__ void ws_producer(const kva_ext_args *ap, uint32_t s_q,
                                                uint32_t s_k, uint32_t s_v, uint32_t s_bar,
                                                volatile ext_item *its, int p) {
  constexpr int BM = KVA_WS_BM, BN = KVA_WS_BN(D), NS = KVA_WS_STAGES(D);
  constexpr int KVT = KVA_WS_KVTILE(D);
  const int my_row = ws_my_row<D>(p);
  const uint32_t ring = s_bar + KVA_WS_RING_OFF;
  uint32_t t = 0; /* key tiles issued so far (ring position) */
  volatile int *const idx = (volatile int *)(its + 3); /* [2]: this round's item index */
  for (int round = 0;; round++) {
    /* Items are handed out by a counter, head-major, heaviest tile first
     * within a head: the CTAs at work share few heads' KV in L2, and the
     * light tiles at the end balance the finish. Double-buffered: thread 0
     * writes round + 2's index only after all producers passed round + 1's
     * barrier, so after they read this one. */
    if (p == 0) idx[round & 1] = atomicAdd(ap->item_counter, 1);
    kva_bar_sync(KVA_WS_BAR_PROD, 128);
    const ext_item x = ext_item_at<D, 0, BM, BN, 1>(ap, idx[round & 1]);
    if (p == 0) ext_item_store(&its[round % 3], x); /* free: see the top of this file */
    const int slot_elems = ap->hkv * D;
    /* the item's Q into L2 now, a few key tiles before the previous item
     * releases the Q buffer (row p; its lines) */
    if (x.valid && p < x.n_valid) {
      const unsigned char *qr =
          (const unsigned char *)ap->q + ((int64_t)(x.q_row0 + p) * ap->hq + x.h) * D * 2;
#pragma unroll
      for (int i = 0; i < D * 2 / 128; i++) kva_prefetch_l2(qr + 128 * i);
    }
    int pre = x.ntiles > 0 ? ext_slot(x.pt, x.kb + my_row, x.kv_len, ap->page_size, ap->ps_mul,
                                      ap->ps_shift)
                           : -1;
    /* tile n of the item; tile 0 goes before the Q handoff below */
#pragma unroll 1
    for (int n = 0; n < x.ntiles + 1; n++) {
      if (n == 1 || (n == 0 && x.ntiles == 0)) {
        /* Q, each half once its consumer warpgroup released it */
#pragma unroll 1
        for (int hf = 0; hf < 2; hf++) {
          kva_mbar_wait(ws_q_empty(s_bar, hf), (uint32_t)(round & 1) ^ 1u);
          if (x.valid) ws_issue_q<D>(ap, s_q, x.q_row0, x.n_valid, x.h, hf, p);
          kva_cp_async_mbar_arrive_noinc(ws_q_full(s_bar, hf));
          if (p == 0) kva_mbar_arrive(ws_q_full(s_bar, hf)); /* publishes the item (release) */
        }
        if (x.ntiles == 0) break;
      }
      if (n == x.ntiles) break;
      const uint32_t st = t % NS, par = (t / NS) & 1;
      const uint32_t bk = ring + st * 32; /* k_full, k_empty, v_full, v_empty */
      kva_mbar_wait(bk + 8, par ^ 1u);
      const int full = x.kb + (n + 1) * BN <= x.kv_len; /* no slot is -1 */
      ws_issue_tile<D>(s_k + st * KVT, pre, x.kg, slot_elems, full, p);
      kva_cp_async_mbar_arrive_noinc(bk);
      kva_mbar_wait(bk + 24, par ^ 1u);
      ws_issue_tile<D>(s_v + st * KVT, pre, x.vg, slot_elems, full, p);
      kva_cp_async_mbar_arrive_noinc(bk + 16);
      t++;
      pre = n + 1 < x.ntiles ? ext_slot(x.pt, x.kb + (n + 1) * BN + my_row, x.kv_len,
                                        ap->page_size, ap->ps_mul, ap->ps_shift)
                             : -1;
    }
    if (!x.valid) break;
  }
  kva_cp_async_wait_all(); /* leave no copy in flight at exit */
}

/* TMA producer: tm->warps = 1 (warp 0 loads Q, K and V), 2 (warp 0 Q and
 * K, warp 1 V: each ring refills as soon as its own stage is released) or
 * 4 (warps 0 and 1 K, 2 and 3 V, each half of a tile's boxes; warp 0 also
 * Q). A full key tile is BN / rows boxes (a page, or the tile inside one
 * page) per 64-column block: lane i holds box i's slot (looked up a tile
 * ahead) and issues its loads if box i is its warp's (i % nsub == sub),
 * once lane 0 armed the stage's full barrier with the warp's bytes
 * (UTMALDG takes uniform operands, so ptxas issues the lanes' loads one
 * lane at a time; only the slot changes between them). An item's last
 * tile when it runs past kv_len is gathered with cp.async instead by the
 * pair's first warp (rows past kv_len zero-filled, so masked P V stays
 * finite whatever the page holds there), waited for and fenced to the
 * async proxy, then arrived on; the second warp only arrives. */
/* Warps loading one ring (K or V) under TMA: two with four producer warps,
 * else one; each arrives once per stage phase. */
static __device__ __forceinline__ int ws_tma_ring_warps(int warps) { return warps == 4 ? 2 : 1; }

template <int D>
static __device__ __forceinline__ void ws_tma_tile(uint32_t dst, const CUtensorMap *map, int hk,
                                                   int slot, int nbox, int rows, int sub, int nsub,
                                                   uint32_t bar, int lane) {
  constexpr int BN = KVA_WS_BN(D);
  const int mine = (nbox - sub + nsub - 1) / nsub; /* boxes of this warp */
  if (lane == 0) kva_mbar_arrive_expect_tx(bar, (uint32_t)(mine * rows * 128 * (D / 64)));
  __syncwarp();
  if (lane < nbox && lane % nsub == sub) {
#pragma unroll
    for (int cb = 0; cb < D / 64; cb++)
      kva_tma_load_3d(dst + cb * (BN * 128) + lane * rows * 128, map, cb * 64, hk, slot, bar);
  }
}
template <int D>
static __device__ __forceinline__ void ws_copy_tile_warp(uint32_t dst, const kva_ext_args *ap,
                                                         const ext_item &x, int k0,
                                                         const unsigned char *g, uint32_t bar,
                                                         int lane) {
#pragma unroll 1
  for (int w = 0; w < 4; w++) { /* the rows of the cp.async producer's 4 warps */
    const int p = lane + 32 * w;
    const int pre = ext_slot(x.pt, k0 + ws_my_row<D>(p), x.kv_len, ap->page_size, ap->ps_mul,
                             ap->ps_shift);
    ws_issue_tile<D>(dst, pre, g, ap->hkv * D, 0, p);
  }
  kva_cp_async_wait_all();
  kva_fence_proxy_async_smem(); /* generic-proxy writes -> the consumers' wgmma */
  __syncwarp();
  if (lane == 0) kva_mbar_arrive(bar);
}

/* Slot of box `lane` of the key tile at k0 (0 for lanes past the boxes
 * and for keys past kv_len: such a tile is gathered with cp.async). */
static __device__ __forceinline__ int ws_box_slot(const kva_ext_args *ap, const ext_item &x, int k0,
                                                  int rows, int nbox, int lane) {
  const int key = k0 + lane * rows;
  return lane < nbox && key < x.kv_len
             ? ext_slot(x.pt, key, x.kv_len, ap->page_size, ap->ps_mul, ap->ps_shift)
             : 0;
}

/* One warp's part of filling a ring stage (full barrier at bar, empty at
 * bar + 8) with the key tile at k0: TMA boxes, or for a tile past kv_len
 * the cp.async gather by the pair's first warp while the second only
 * arrives. */
template <int D>
static __device__ __forceinline__ void ws_fill_stage(uint32_t dst, uint32_t bar, uint32_t par,
                                                     const CUtensorMap *map, const unsigned char *g,
                                                     const kva_ext_args *ap, const ext_item &x,
                                                     int k0, int full, int hk, int slot, int nbox,
                                                     int rows, int sub, int nsub, int lane) {
  kva_mbar_wait(bar + 8, par ^ 1u);
  if (full)
    ws_tma_tile<D>(dst, map, hk, slot, nbox, rows, sub, nsub, bar, lane);
  else if (sub == 0)
    ws_copy_tile_warp<D>(dst, ap, x, k0, g, bar, lane);
  else if (lane == 0)
    kva_mbar_arrive(bar);
}

template <int D>
static __device__ __forceinline__ void ws_producer_tma(const kva_ext_args *ap, const kva_ext_tma *tm,
                                                    uint32_t s_q, uint32_t s_k, uint32_t s_v,
                                                    uint32_t s_bar, volatile ext_item *its,
                                                    int w, int lane) {
  constexpr int BM = KVA_WS_BM, BN = KVA_WS_BN(D), NS = KVA_WS_STAGES(D);
  constexpr int KVT = KVA_WS_KVTILE(D);
  const uint32_t ring = s_bar + KVA_WS_RING_OFF;
  const int rows = tm->rows, nbox = BN / rows, nw = tm->warps;
  /* this warp's share of a tile: sub of nsub */
  const int nsub = ws_tma_ring_warps(nw), sub = nsub == 2 ? w & 1 : 0;
  const int do_k = nw == 4 ? w < 2 : w == 0, do_v = nw == 1 || (nw == 2 ? w == 1 : w >= 2);
  if (lane == 0) {
    if (do_k) kva_tma_prefetch_map(&tm->q), kva_tma_prefetch_map(&tm->k);
    if (do_v) kva_tma_prefetch_map(&tm->v);
  }
  volatile int *const idx = (volatile int *)(its + 3); /* [2]: this round's item index */
  uint32_t t = 0; /* key tiles issued so far (ring position) */
  for (int round = 0;; round++) {
    /* the cp.async producer's item order and index handoff (see ws_producer) */
    if (w == 0 && lane == 0) idx[round & 1] = atomicAdd(ap->item_counter, 1);
    kva_bar_sync(KVA_WS_BAR_PROD, 32 * nw);
    const int item = idx[round & 1];
    const ext_item x = ext_item_at<D, 0, BM, BN, 1>(ap, item);
    if (w == 0 && lane == 0) ext_item_store(&its[round % 3], x); /* free: see the top of this file */
    const int hk = x.h / ap->group;
    /* the item's Q into L2 now, a few key tiles before the previous item
     * releases the Q buffer: lane i a 64-column block of one half */
    if (w == 0 && x.valid && lane < 2 * (D / 64))
      kva_tma_prefetch_l2_3d(&tm->q, (lane >> 1) * 64, x.h, x.q_row0 + (lane & 1) * KVA_WS_QBOX_ROWS);
    /* this lane's box slot of the tile to issue next */
    int slot = x.ntiles > 0 ? ws_box_slot(ap, x, x.kb, rows, nbox, lane) : 0;
#pragma unroll 1
    for (int n = 0; n < x.ntiles + 1; n++) {
      if (w == 0 && (n == 1 || (n == 0 && x.ntiles == 0))) {
        /* Q, each half once its consumer warpgroup released it (K tile 0
         * of the item is already on its way) */
#pragma unroll 1
        for (int hf = 0; hf < 2; hf++) {
          const uint32_t q_full = ws_q_full(s_bar, hf);
          kva_mbar_wait(ws_q_empty(s_bar, hf), (uint32_t)(round & 1) ^ 1u);
          if (lane == 0) {
            if (x.valid) { /* the arrival publishes the item (release) */
              constexpr int QH = KVA_WS_QBOX_ROWS;
              kva_mbar_arrive_expect_tx(q_full, (uint32_t)(QH * D * 2));
#pragma unroll
              for (int cb = 0; cb < D / 64; cb++)
                kva_tma_load_3d(s_q + cb * (BM * 128) + hf * (QH * 128), &tm->q, cb * 64, x.h,
                                x.q_row0 + hf * QH, q_full);
            } else {
              kva_mbar_arrive(q_full);
            }
          }
        }
      }
      if (n == x.ntiles) break;
      const uint32_t st = t % NS, par = (t / NS) & 1;
      const uint32_t bk = ring + st * 32; /* k_full, k_empty, v_full, v_empty */
      const int k0 = x.kb + n * BN;
      const int full = k0 + BN <= x.kv_len;
      if (do_k)
        ws_fill_stage<D>(s_k + st * KVT, bk, par, &tm->k, x.kg, ap, x, k0, full, hk, slot, nbox,
                         rows, sub, nsub, lane);
      if (do_v)
        ws_fill_stage<D>(s_v + st * KVT, bk + 16, par, &tm->v, x.vg, ap, x, k0, full, hk, slot,
                         nbox, rows, sub, nsub, lane);
      t++;
      /* the next tile's slots now: their page-table loads overlap the waits */
      if (n + 1 < x.ntiles) slot = ws_box_slot(ap, x, k0 + BN, rows, nbox, lane);
    }
    if (!x.valid) break;
  }
}

/* Consumer: one GEMM turn of the pingpong (S_n and, if any, P_{n-1} V_{n-1}
 * issued between the wait for this warpgroup's token and its handoff); no-ops
 * where the head dim runs without it (d=64; -DKVA_WS_PINGPONG64=1 for A/B). */
#ifndef KVA_WS_PINGPONG64
#define KVA_WS_PINGPONG64 0
#endif
#define KVA_WS_PINGPONG(d) ((d) == 64 ? KVA_WS_PINGPONG64 : 1)
template <int D>
static __device__ __forceinline__ void ws_turn_wait(int cw) {
  if (KVA_WS_PINGPONG(D)) kva_bar_sync(cw ? KVA_WS_BAR_WG1 : KVA_WS_BAR_WG0, 256);
}
template <int D>
static __device__ __forceinline__ void ws_turn_pass(int cw) {
  if (KVA_WS_PINGPONG(D)) kva_bar_arrive(cw ? KVA_WS_BAR_WG0 : KVA_WS_BAR_WG1, 256);
}

/* A consumer's loop invariants over one item. */
typedef struct ws_cons {
  uint32_t q_wg, s_k, s_v, ring, q_empty;
  int cw, lane, row_w, kb, kv_len, p_first, p_last, ntiles;
} ws_cons;

/* Key tile n of the item (ring position t): S_n and, but for the first
 * tile (FIRST), P_{n-1} V_{n-1} with P_{n-1} in pk, issued in this
 * warpgroup's pingpong turn; the softmax of S_n into pn while P V runs;
 * O rescaled if a row max moved. Straight-line wgmma sequences on each
 * path (ptxas would otherwise serialize every wgmma); no wgmma is in
 * flight at the end. */
template <int D, int QT, int TMA, int FIRST>
static __device__ __forceinline__ void ws_step(const kva_ext_args &a, const ws_cons &c, int n,
                                               uint32_t &t, float o[D / 2], float m[2], float l[2],
                                               uint32_t pk[KVA_WS_BN(D) / 8][2],
                                               uint32_t pn[KVA_WS_BN(D) / 8][2]) {
  constexpr int BN = KVA_WS_BN(D), NS = KVA_WS_STAGES(D), KVT = KVA_WS_KVTILE(D);
  const uint32_t st = t % NS, par = (t / NS) & 1, bk = c.ring + st * 32;
  const uint32_t sp = (t + NS - 1) % NS, bv = c.ring + sp * 32;
  const int k0 = c.kb + n * BN;
  /* Both warpgroups compute every tile of the item (see kva_ext_wg_kernel:
   * no branch around the wgmma sequences) */
  const int p_lo = c.p_first + 64 * c.cw, p_hi = min(p_lo + 63, c.p_last);
  const int need_mask = (k0 + BN > c.kv_len) || (a.causal && k0 + BN - 1 > p_lo) ||
                        (a.window_left >= 0 && k0 < p_hi - a.window_left);
  const int last = n == c.ntiles - 1;
  float s[BN / 2];
  float alpha[2];
  int rescale;
  if (!FIRST) {
    WS_CLK(tw0);
    kva_mbar_wait(bk, par);                     /* K_n landed */
    kva_mbar_wait(bv + 16, ((t - 1) / NS) & 1); /* V_{n-1} landed */
    WS_CLK(tw1);
    WS_ACC(10, tw1 - tw0);
    if (!TMA) kva_fence_proxy_async_smem();     /* cp.async data (generic proxy) -> wgmma */
    ws_turn_wait<D>(c.cw);
    WS_CLK(tw2);
    WS_ACC(11, tw2 - tw1);
    wg_issue_s<QT, D, BN>(s, c.q_wg, c.s_k + st * KVT);
    wg_issue_pv<QT, D, BN>(o, pk, c.s_v + sp * KVT);
    ws_turn_pass<D>(c.cw);
    kva_wgmma_wait<1>(); /* S is the older group: P V may still run */
    wg_fence_acc<BN / 2>(s);
    WS_CLK(tw3);
    WS_ACC(2, tw3 - tw2);
    kva_mbar_arrive(bk + 8);             /* K stage free */
    kva_mbar_arrive_if(c.q_empty, last); /* Q free after the item's last S */
    rescale = wg_softmax<QT, BN, KVA_WS_SPEC>(s, pn, m, l, alpha, k0, need_mask,
                                              c.p_first + c.row_w, c.kv_len, a.causal,
                                              a.window_left, a.qk_mul, a.cap_log2, c.lane);
    WS_CLK(tw4);
    WS_ACC(3, tw4 - tw3);
    wg_finish_pv<D, BN>(o, pk, pn, m, l, alpha, rescale);
    WS_CLK(tw5);
    WS_ACC(4, tw5 - tw4);
    kva_mbar_arrive(bv + 24); /* V_{n-1} stage free */
  } else {
    kva_mbar_wait(bk, par);
    if (!TMA) kva_fence_proxy_async_smem();
    ws_turn_wait<D>(c.cw);
    wg_issue_s<QT, D, BN>(s, c.q_wg, c.s_k + st * KVT);
    ws_turn_pass<D>(c.cw);
    kva_wgmma_wait<0>();
    wg_fence_acc<BN / 2>(s);
    kva_mbar_arrive(bk + 8);
    kva_mbar_arrive_if(c.q_empty, last);
    rescale = wg_softmax<QT, BN, KVA_WS_SPEC>(s, pn, m, l, alpha, k0, need_mask,
                                              c.p_first + c.row_w, c.kv_len, a.causal,
                                              a.window_left, a.qk_mul, a.cap_log2, c.lane);
    if (rescale) wg_rescale<D>(o, alpha);
  }
  t++;
}

/* The item's last P V (outside the pingpong), P in pk. */
template <int D, int QT, int TMA>
static __device__ __forceinline__ void ws_last_pv(const ws_cons &c, uint32_t t, float o[D / 2],
                                                  uint32_t pk[KVA_WS_BN(D) / 8][2]) {
  constexpr int BN = KVA_WS_BN(D), NS = KVA_WS_STAGES(D), KVT = KVA_WS_KVTILE(D);
  const uint32_t sp = (t - 1) % NS, bv = c.ring + sp * 32;
  kva_mbar_wait(bv + 16, ((t - 1) / NS) & 1);
  if (!TMA) kva_fence_proxy_async_smem();
  wg_issue_pv<QT, D, BN>(o, pk, c.s_v + sp * KVT);
  kva_wgmma_wait<0>();
  wg_fence_acc<D / 2>(o);
  kva_mbar_arrive(bv + 24);
}

template <int D, int QT, int TMA>
__global__ void __launch_bounds__(KVA_WS_THREADS, 1)
    kva_ext_ws_kernel(const __grid_constant__ kva_ext_args a,
                      const __grid_constant__ kva_ext_tma tm) {
  constexpr int BN = KVA_WS_BN(D), NS = KVA_WS_STAGES(D);
  constexpr int QTL = KVA_WS_QTILE(D), KVT = KVA_WS_KVTILE(D);
  static_assert(D != 128 || KVA_WS_BM == KVA_EXT_BM(128), "d=128 tiles shared with mma.sync");
  static_assert(D != 128 || (BN == KVA_WG_BN && KVT == KVA_WG_TILE), "d=128: the wgmma tiles");
  static_assert(KVA_WS_PROD_REGS + 2 * KVA_WS_CONS_REGS <= 512, "register file");
  extern __shared__ __align__(1024) unsigned char smem_ws[];
  const uint32_t s_raw = kva_smem_u32(smem_ws);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u; /* swizzle atoms are 1024-byte aligned */
  unsigned char *const p_base = smem_ws + (s_q - s_raw);
  const uint32_t s_k = s_q + QTL, s_v = s_k + NS * KVT;
  const uint32_t s_bar = s_v + NS * KVT;
  volatile ext_item *const its =
      (volatile ext_item *)(p_base + QTL + 2 * NS * KVT + KVA_WS_BAR_BYTES(D));
  const uint32_t ring = s_bar + KVA_WS_RING_OFF;

  const int tid = threadIdx.x;
  if (tid == 0) {
    /* full barriers: the cp.async producer's 128 threads (Q: + the item's
     * writer), or under TMA one arrival (with its transaction bytes) per
     * warp loading the ring */
    const int kv_arrivals = TMA ? ws_tma_ring_warps(tm.warps) : 128;
    for (int hf = 0; hf < 2; hf++) {
      kva_mbar_init(ws_q_full(s_bar, hf), TMA ? 1 : 128 + 1);
      kva_mbar_init(ws_q_empty(s_bar, hf), 128); /* its warpgroup */
    }
    for (int s = 0; s < NS; s++) {
      kva_mbar_init(ring + 32 * s, kv_arrivals);        /* k_full */
      kva_mbar_init(ring + 32 * s + 8, 256);            /* k_empty */
      kva_mbar_init(ring + 32 * s + 16, kv_arrivals);   /* v_full */
      kva_mbar_init(ring + 32 * s + 24, 256); /* v_empty */
    }
  }
  __syncthreads(); /* the barriers are initialized; the only CTA-wide barrier */

  const int wg = wg_uni(tid >> 7);
  if (wg == 0) {
    kva_setmaxnreg_dec<KVA_WS_PROD_REGS>();
    if (!TMA)
      ws_producer<D>(&a, s_q, s_k, s_v, s_bar, its, tid);
    else if (tid < 32 * tm.warps) /* one, two or four warps issue the TMA loads */
      ws_producer_tma<D>(&a, &tm, s_q, s_k, s_v, s_bar, its, tid >> 5, tid & 31);
    return;
  }
  kva_setmaxnreg_inc<KVA_WS_CONS_REGS>();

  const int lane = tid & 31, cw = wg - 1; /* consumer warpgroup 0 or 1 */
  const int row_w = 16 * ((tid >> 5) - 4); /* first tile row of the warp */
  const uint32_t q_wg = s_q + 64 * cw * 128; /* its 64 rows in every column block */
  const uint32_t q_full = ws_q_full(s_bar, cw), q_empty = ws_q_empty(s_bar, cw);
  if (cw == 1) ws_turn_pass<D>(1); /* consumer 0 issues first */
#ifdef KVA_EXT_TRACE
  const unsigned long long tr_entry = kva_globaltimer();
  WS_CLK(tr_c0);
  if (tid == 128 || tid == 256)
    for (int i = 0; i < 12; i++) ws_tr_acc[cw][i] = 0;
#endif

  uint32_t t = 0; /* key tiles consumed so far (ring position) */
  for (int round = 0;; round++) {
    volatile ext_item *const it = &its[round % 3];
    WS_CLK(tq0);
    kva_mbar_wait(q_full, (uint32_t)round & 1u); /* Q landed, *it written */
    WS_CLK(tq1);
    WS_ACC(1, tq1 - tq0);
    if (!wg_uni(it->valid)) break;
    const int ntiles = wg_uni(it->ntiles);

    float o[D / 2], m[2], l[2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;

    if (ntiles == 0) kva_mbar_arrive(q_empty);
    /* the item's scalars, read once (smem) */
    ws_cons c;
    c.q_wg = q_wg;
    c.s_k = s_k;
    c.s_v = s_v;
    c.ring = ring;
    c.q_empty = q_empty;
    c.cw = cw;
    c.lane = lane;
    c.row_w = row_w;
    c.kb = wg_uni(it->kb);
    c.kv_len = wg_uni(it->kv_len);
    c.p_first = wg_uni(it->p_first);
    c.p_last = wg_uni(it->p_last);
    c.ntiles = ntiles;
    if (ntiles > 0) {
      /* P of the tile whose P V is still to be issued alternates between
       * pa and pb (two steps per loop turn): no register copy per tile
       * (+3-10% at S = 8192-16384 on the H100). A copy after each step
       * instead makes ptxas serialize every wgmma (C7513). */
      uint32_t pa[BN / 8][2], pb[BN / 8][2];
      ws_step<D, QT, TMA, 1>(a, c, 0, t, o, m, l, pb, pa);
      int n = 1;
      for (; n + 1 < ntiles; n += 2) {
        ws_step<D, QT, TMA, 0>(a, c, n, t, o, m, l, pa, pb);
        ws_step<D, QT, TMA, 0>(a, c, n + 1, t, o, m, l, pb, pa);
      }
      if (n < ntiles) {
        ws_step<D, QT, TMA, 0>(a, c, n, t, o, m, l, pa, pb);
        ws_last_pv<D, QT, TMA>(c, t, o, pb);
      } else {
        ws_last_pv<D, QT, TMA>(c, t, o, pa);
      }
    }
    WS_CLK(te0);

    /* Epilogue: O and LSE straight from the accumulators. A lane quad holds
     * a row; two shuffle rounds within the quad turn its 4-byte pieces into
     * 16-byte ones, so a row's stores fill whole 32-byte sectors (a quarter
     * of the store instructions of 4-byte stores). */
    const int q_row0 = wg_uni(it->q_row0), n_valid = wg_uni(it->n_valid), qh = wg_uni(it->h);
    const int hq = a.hq, q4 = lane & 3;
    unsigned char *og = (unsigned char *)a.o;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      float sum = l[hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? a.o_mul / sum : 0.f;
      const int row = row_w + (lane >> 2) + hf * 8;
      /* word j: columns 8 j + 2 q4, + 1. Round 1 (lanes q4, q4 ^ 1): a lane
       * gets 4 columns of 16-column block k: 16 k + 4 ((q4 & 1) 2 + q4 / 2) */
      uint2 u[D / 16];
#pragma unroll
      for (int k = 0; k < D / 16; k++) {
        const uint32_t w0 = ext_pack<QT>(o[8 * k + 2 * hf] * inv, o[8 * k + 2 * hf + 1] * inv);
        const uint32_t w1 =
            ext_pack<QT>(o[8 * k + 4 + 2 * hf] * inv, o[8 * k + 4 + 2 * hf + 1] * inv);
        const uint32_t r = (uint32_t)__shfl_xor_sync(0xffffffffu, (int)(q4 & 1 ? w0 : w1), 1);
        u[k] = q4 & 1 ? make_uint2(r, w1) : make_uint2(w0, r);
      }
      /* Round 2 (lanes q4, q4 ^ 2): 8 columns of 32-column block mb, at
       * 32 mb + 8 (q4 & 1) + 16 (q4 / 2) */
      unsigned char *orow = og + (((int64_t)(q_row0 + row) * hq + qh) * D) * 2 +
                            (8 * (q4 & 1) + 16 * (q4 >> 1)) * 2;
#pragma unroll
      for (int mb = 0; mb < D / 32; mb++) {
        const uint2 snd = q4 >> 1 ? u[2 * mb] : u[2 * mb + 1];
        uint2 r;
        r.x = (uint32_t)__shfl_xor_sync(0xffffffffu, (int)snd.x, 2);
        r.y = (uint32_t)__shfl_xor_sync(0xffffffffu, (int)snd.y, 2);
        const uint4 v = q4 >> 1 ? make_uint4(r.x, r.y, u[2 * mb + 1].x, u[2 * mb + 1].y)
                                : make_uint4(u[2 * mb].x, u[2 * mb].y, r.x, r.y);
        if (row < n_valid) *(uint4 *)(orow + mb * 64) = v;
      }
      if (row < n_valid && a.lse != NULL && q4 == 0)
        a.lse[(int64_t)(q_row0 + row) * hq + qh] =
            sum > 0.f ? (m[hf] + __log2f(sum)) * 0.69314718055994531f : -INFINITY;
    }
    WS_CLK(te1);
    WS_ACC(5, te1 - te0);
    WS_ACC(7, 1);
    WS_ACC(8, ntiles);
  }
#ifdef KVA_EXT_TRACE
  if ((tid == 128 || tid == 256) && a.trace) {
    unsigned long long *w = a.trace + (size_t)(cw * gridDim.x + blockIdx.x) * KVA_TRACE_WORDS;
    for (int i = 1; i < 12; i++) w[i] = ws_tr_acc[cw][i];
    w[0] = tr_entry;
    w[6] = kva_globaltimer();
    WS_CLK(tr_c1);
    w[9] = tr_c1 - tr_c0;
  }
#endif
  /* consumer 1 passed the token last: consumer 0 takes it so that no named
   * barrier is left with pending arrivals */
  if (cw == 0) ws_turn_wait<D>(0);
}

#endif /* KVA_CUDA_EXTEND_WS_CUH */
