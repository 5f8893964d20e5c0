/* MLA decode internals shared by mla.cu (dispatch, launch), mla_kernel.cuh
 * (the wgmma kernel) and mla_simple.cu (the CUDA-core fallback). */
#ifndef KVA_CUDA_MLA_H
#define KVA_CUDA_MLA_H

#include <stdint.h>

#include "cuda/cuda_internal.h"
#include "cuda/tma.h"
#include "cuda/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVA_MLA_D KVA_MLA_HEAD_DIM /* 576: Q.K dims */
#define KVA_MLA_DV KVA_MLA_V_DIM   /* 512: V = the latent's first 512 dims */
#define KVA_MLA_THREADS 256        /* two warpgroups, each owning 256 of O's columns */
#define KVA_MLA_BM 64              /* query rows (head x token) per CTA: one wgmma M */
#define KVA_MLA_BN 32              /* keys per tile */
/* Tiles of R rows of 576 16-bit columns: nine 64-column blocks of
 * [R rows][128 B], 16-byte chunks swizzled by row % 8 (the wgmma 128-byte
 * swizzle). Q: R = 64; K/V: R = 32. */
#define KVA_MLA_QTILE (KVA_MLA_D / 64 * KVA_MLA_BM * 128) /* 73728 */
#define KVA_MLA_TILE (KVA_MLA_D / 64 * KVA_MLA_BN * 128)  /* 36864 */
#define KVA_MLA_TILE8 (KVA_MLA_BN * KVA_MLA_D)            /* fp8 staging tile: 18432 */
/* v2 (mla_kernel.cuh): ring of NS 16-bit tiles (two in flight while one
 * is computed on); fp8: NS = 2 byte tiles in flight and three converted
 * 16-bit tiles (tile i's V and tile i+1's K are read while tile i+2 is
 * converted). The S exchange holds one warpgroup's half, then the sum:
 * [BN / 8 float4][128]. */
#define KVA_MLA_STAGES(kv8) ((kv8) ? 2 : 4)
#define KVA_MLA_SLOTS8 3 /* converted 16-bit tiles (fp8) */
#define KVA_MLA_RING(kv8)                                                           \
  ((kv8) ? KVA_MLA_SLOTS8 * KVA_MLA_TILE + KVA_MLA_STAGES(1) * KVA_MLA_TILE8       \
         : KVA_MLA_STAGES(0) * KVA_MLA_TILE)
#define KVA_MLA_XS2 (KVA_MLA_BN / 8 * 128 * 16) /* 8192 */
#define KVA_MLA_SMEM(kv8) (1024 + KVA_MLA_QTILE + KVA_MLA_RING(kv8) + KVA_MLA_XS2 + 16) /* 230416 */

/* v5 (mla_kernel_v5.cuh, 16-bit latents only): 64-key blocks in pairs,
 * two stages of [9][64 rows][128 B] (P1 over stage 1's rope columns), P0
 * ([64][128 B]), per-row factor and max of each warpgroup, the two row
 * sums, 19 mbarriers (Q; stage x 9 column blocks) and a flag. */
#define KVA_MLA5_BN 64
#define KVA_MLA5_TILE (KVA_MLA_D / 64 * KVA_MLA5_BN * 128) /* 73728 */
#define KVA_MLA5_P (KVA_MLA_BM * 128)                     /* 8192 */
#define KVA_MLA5_STATS (6 * KVA_MLA_BM * 4)               /* c0, m0, c1, m1, l[2]: 1536 */
#ifdef KVA_MLA_TRACE /* + the phase sums, 2 x 12 words */
#define KVA_MLA5_BARS 256
#else
#define KVA_MLA5_BARS 160
#endif
#define KVA_MLA5_SMEM \
  (1024 + KVA_MLA_QTILE + 2 * KVA_MLA5_TILE + KVA_MLA5_P + KVA_MLA5_STATS + KVA_MLA5_BARS) /* 232096 */

/* v6 (mla_kernel_v6.cuh; fp8 latents converted into the stages by a
 * fourth warpgroup, mla6_fp8.cuh): v5's 64-key blocks in two stages (P over each stage's
 * rope columns), three warpgroups (fp8: four); the factors c per stage,
 * the chunk's max m and sum l, 23 mbarriers (Q; stage x 9 column blocks;
 * ready per stage; the chunk's l and m written, read) and a flag. */
#define KVA_MLA6_THREADS 384
/* fp8 latents (KV8): a fourth warpgroup converts them (mla_kernel_v6.cuh) */
#define KVA_MLA6_THREADS_OF(kv8) ((kv8) ? 512 : KVA_MLA6_THREADS)
#define KVA_MLA6_STATS (4 * KVA_MLA_BM * 4) /* c[2][64], m[64], l[64]: 1024 */
#ifdef KVA_MLA_TRACE
#define KVA_MLA6_BARS 288
#else
#define KVA_MLA6_BARS 192
#endif
#define KVA_MLA6_SMEM \
  (1024 + KVA_MLA_QTILE + 2 * KVA_MLA5_TILE + KVA_MLA6_STATS + KVA_MLA6_BARS) /* 223424 */

/* v9 (mla_kernel_v9.cuh; fp8 latents on two stages, mla9_fp8.cuh): v6's roles on three
 * stages; Q's latent columns live in warpgroup 0's registers, its rope
 * columns in smem ([64 rows][128 B]); the factors c per stage, the
 * chunk's max m and sum l, 38 mbarriers (stage x 9 column blocks; ready,
 * S-issued and sliver P V over per stage; the chunk's l and m written,
 * read), a flag and three records of the next chunk. */
#define KVA_MLA9_ROPE (KVA_MLA_BM * 128)    /* 8192 */
#define KVA_MLA9_STATS (5 * KVA_MLA_BM * 4) /* c[3][64], m[64], l[64]: 1280 */
#define KVA_MLA9_BARS 320
#define KVA_MLA9_NEXT_REC 192 /* [3][16] ints: the next chunk */
/* fp8 latents: two 16-bit stages, and two byte stages of a 64-key block
 * in the third one's smem (the same total) */
#define KVA_MLA9_TILE8 (KVA_MLA5_BN * KVA_MLA_D) /* 36864 */
#define KVA_MLA9_SMEM \
  (1024 + KVA_MLA9_ROPE + 3 * KVA_MLA5_TILE + KVA_MLA9_STATS + KVA_MLA9_BARS + KVA_MLA9_NEXT_REC) /* 232192 */

/* v10 (mla_kernel_v10.cuh; fp8 latents, at most NQ = 16, 32 or 64 query
 * rows a CTA): Q ([9][NQ rows][128 B]), two P^T buffers ([NQ rows][64
 * keys]), the byte stages of a 64-key block (O's f32 rows at a chunk's
 * end) and the row maxima, factors, m, l, mbarriers and a flag. SW S^T
 * warpgroups (KVA_MLA10_SWG16 / 32 at NQ 16 / 32): one, with five byte
 * stages, or two taking alternate blocks, with four (the default at both:
 * H100, 2026-11-27, -8 to -10% at 32 rows, -1.5 to -3.6% on three of four
 * 16-row rows and +1.0% on the fourth; docs/performance.md, "Thirty-fifth
 * session"). NQ 64: one S warpgroup (the O warpgroups hold 128
 * accumulators each, so two S warpgroups leave them too few registers)
 * and three byte stages (Q is 72 KB); O's rows at a chunk's end then
 * need Q's, P^T's and the stages' smem together. */
#ifndef KVA_MLA10_SWG16
#define KVA_MLA10_SWG16 2
#endif
#ifndef KVA_MLA10_SWG32
#define KVA_MLA10_SWG32 2
#endif
#define KVA_MLA10_SWG(nq) ((nq) == 16 ? KVA_MLA10_SWG16 : (nq) == 32 ? KVA_MLA10_SWG32 : 1)
#define KVA_MLA10_THREADS(sw) (128 * ((sw) + 2))
/* byte stages: with two S warpgroups at 16 rows a fifth fits (A/B knob;
 * H200, 2026-11-29, 4 samples ABBA on FlashMLA's four fp8 rows of 16
 * rows: -1.0 to +1.0% time, level; docs/performance.md, "Fifty-first
 * session") */
#ifndef KVA_MLA10_STAGES16_S2
#define KVA_MLA10_STAGES16_S2 4
#endif
#define KVA_MLA10_STAGES(nq, sw) \
  ((nq) == 64 ? 3 : (sw) == 2 ? ((nq) == 16 ? KVA_MLA10_STAGES16_S2 : 4) : 5)
#define KVA_MLA10_Q(nq) (KVA_MLA_D / 64 * (nq) * 128)
#define KVA_MLA10_P(nq) ((nq) * 128)
#define KVA_MLA10_MISC(nq, sw) ((nq) == 64 ? 5120 : (sw) == 2 ? 4096 : 2048)
/* P^T buffers (four measured 1-3% slower with two S warpgroups; three
 * and four no faster at 64 rows) */
#define KVA_MLA10_PBUF 2
#define KVA_MLA10_SMEM_SW(nq, sw)                                                 \
  (1024 + KVA_MLA10_Q(nq) + KVA_MLA10_PBUF * KVA_MLA10_P(nq) +                    \
   KVA_MLA10_STAGES(nq, sw) * KVA_MLA9_TILE8 +                                    \
   KVA_MLA10_MISC(nq, sw)) /* SW 1: 209920 (16), 232448 (32), 206848 (64); SW 2: 175104, 197632 */
#define KVA_MLA10_SMEM(nq) KVA_MLA10_SMEM_SW(nq, KVA_MLA10_SWG(nq))

/* Kernel arguments (by value); batch-dependent values are read on the
 * device from the plan's metadata. */
typedef struct kva_mla_args {
  const kva_plan_header *hdr;
  const kva_split_work *sched;
  const int32_t *sched_order; /* [num_requests]: worker ranges are positions in it */
  const int32_t *split_indptr, *split_row_offset, *cu_q, *cache_seqlens, *num_new, *page_table;
  const void *q;   /* [total_q, hq, 576] */
  void *o;         /* [total_q, hq, 512] */
  float *lse;      /* [total_q, hq] or NULL */
  float *part_o, *part_lse; /* split-KV partial rows (512 dims) */
  int32_t *split_sem;       /* [max_batch * hq]: chunks of (request, row tile) done; 0 between runs */
  unsigned long long *trace; /* timeline (cuda/trace.h); NULL */
  const void *kv;           /* the layer's latent buffer [slots, 576] */
  int hq;
  int page_size, ps_shift; /* key / page_size = (umulhi(key, ps_mul) + key) >> ps_shift */
  uint32_t ps_mul;
  float qk_mul; /* log2(e) sm_scale k_scale */
  float o_mul;  /* k_scale for fp8 pools (V is the same latent), else 1 */
  int causal;
  /* L2 eviction hints (mla.cu sets both; KVA_MLA_L2 for A/B): bit 0
   * partial rows stored evict_last and read back by the merge evict_first,
   * so they stay in L2 between the two; bit 1 16-bit latents read
   * evict_first (v2), so the stream does not push them out; bit 2 partial
   * rows dropped from L2 (discard) once merged, never written back */
  int l2_hints;
  /* v5 and v6: kv_tma != 0 loads a 64-key block that starts a 64-key run of one
   * page and ends at or before the chunk's end by TMA, not the threads'
   * cp.async: 1 as nine boxes of kv_map ([slots][576], 64 columns x 64
   * keys a box), 4 as two boxes of kv_map4 (four V column blocks each) and
   * one of kv_map (the rope columns); see kva_mla5_kv_maps. mla.cu picks 4
   * from 256 query rows (h_q x s_q) up, else 1, unless KVA_MLA5_BOX says
   * otherwise */
  int kv_tma;
  /* v2: how long the head (split 0) of a two-chunk request waits for the
   * other chunk to count before it writes its own partial rows (ns; 0: no
   * wait) */
  unsigned merge_wait_ns;
  /* v2: latents of the worker's first chunk that row tile 0 prefetches into
   * L2 before waiting for the kernel before it (PDL); 0: none */
  int prefetch_keys;
  CUtensorMap kv_map;
  /* v5 with kv_tma 4: the same latents with their nine 64-column blocks as
   * a third dimension, boxes of 64 columns x 64 keys x 4 column blocks */
  CUtensorMap kv_map4;
} kva_mla_args;

/* v5's tensor maps of the latents at kv ([slots][576] 16-bit): kv_map, and
 * with four_a_box kv_map4, the nine 64-column blocks as a third dimension
 * (byte strides 1152 and 128: a box lands as [4][64 keys][128 B], v5's
 * stage layout). Returns the kv_tma to launch with: 0 when kv_map does not
 * encode, 4 when kv_map4 does too, else 1. mla.cu and the MLA emulator
 * both build their maps here. l2_promotion: the maps' L2 promotion in
 * bytes (0, 64, 128 or 256). A box's rows are 128 bytes of rows 1152
 * apart; promoted to 256 they streamed from DRAM at 4.14-4.27 TB/s on the
 * H200, at 128 or less 4.51-4.62, as fast as one bulk copy a block
 * (bench/l2_ingress tma, 2026-11-28; docs/performance.md, "Forty-second
 * session"). */
static inline int kva_mla5_kv_maps(kva_mla_args *a, const void *kv, uint64_t slots,
                                   int four_a_box, int l2_promotion) {
  const uint64_t dims[3] = {KVA_MLA_D, 1, slots};
  const uint64_t strides[2] = {KVA_MLA_D * 2, KVA_MLA_D * 2};
  const uint32_t box[3] = {64, 1, KVA_MLA5_BN};
  if (kva_tma_encode_16bit_3d_opts(&a->kv_map, kv, dims, strides, box, 128, l2_promotion) !=
      KVA_OK)
    return 0;
  if (!four_a_box) return 1;
  const uint64_t dims4[3] = {64, slots, KVA_MLA_D / 64};
  const uint64_t strides4[2] = {KVA_MLA_D * 2, 128};
  const uint32_t box4[3] = {64, KVA_MLA5_BN, 4};
  return kva_tma_encode_16bit_3d_opts(&a->kv_map4, kv, dims4, strides4, box4, 128,
                                      l2_promotion) == KVA_OK
             ? 4
             : 1;
}

/* Launch of the wgmma kernel (mla.cu): grid (num_workers, row tiles); ver:
 * 2, 5, 6, 9 or 10 (5 and 6 with 16-bit latents only, 10 with fp8 only:
 * nq its rows a row tile, 16 or 32); coloc 2: v5's, v6's or v9's row
 * tiles launched in clusters of 2 (a worker's tile pairs on one GPC), else 1. */
kva_status kva_mla_launch(const kva_mla_args *a, kva_dtype qt, int kv8, int ver, int nq,
                          int coloc, unsigned grid_x, unsigned grid_y, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* KVA_CUDA_MLA_H */
