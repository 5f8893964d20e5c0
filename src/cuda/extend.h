/* Extend (prefill) path internals shared by extend.cu (plan, dispatch) and
 * the per-head-dim kernel units extend_d64/128/256.cu. */
#ifndef KVA_CUDA_EXTEND_H
#define KVA_CUDA_EXTEND_H

#include <stdint.h>

#include "cuda/cuda_internal.h"
#include "cuda/tma.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tile shapes per head dim (4 warps of 16*MT query rows; BN keys per step).
 * d=256 holds one m16 tile per warp so that O (128 floats) fits registers. */
#define KVA_EXT_MT(d) ((d) == 256 ? 1 : 2)
#define KVA_EXT_BM(d) (64 * KVA_EXT_MT(d))
#define KVA_EXT_BN(d) ((d) == 64 ? 128 : (d) == 128 ? 64 : 32)
/* keys per online-softmax step inside a BN tile (bounds the S registers) */
#define KVA_EXT_KS(d) ((d) == 64 ? 64 : 32)
/* Shared memory: the Q tile and 2 stages of (K, V), 16-bit rows padded by
 * 16 bytes; fp8 pools: one 16-bit (K, V) conversion target and 2 stages of
 * raw fp8 (K, V) [BN][d] bytes; then the work item's scalars. */
#define KVA_EXT_RS(d) ((d)*2 + 16)
#define KVA_EXT_TILE16(d) (KVA_EXT_BN(d) * KVA_EXT_RS(d))
#define KVA_EXT_SMEM(d, kv8)                                                                   \
  (KVA_EXT_BM(d) * KVA_EXT_RS(d) +                                                             \
   ((kv8) ? 2 * KVA_EXT_TILE16(d) + 2 * 2 * KVA_EXT_BN(d) * (d) : 2 * 2 * KVA_EXT_TILE16(d)) + \
   KVA_EXT_ITEM_BYTES)
#define KVA_EXT_ITEM_BYTES 256 /* two work items' scalars (current, next) */

/* Kernel arguments (by value). The tile list holds (batch index of an
 * extend request, first query token of the tile); item i of a launch is
 * tile i / hq, q head i % hq (head-major in the warp-specialized kernel, see
 * ext_item_at). Everything batch-dependent is read on device. */
typedef struct kva_ext_args {
  const void *q;
  void *o;
  float *lse;        /* NULL: not written */
  const void *k, *v; /* the layer's pool buffers */
  const int2 *tiles; /* [*num_tiles], heaviest first */
  const int32_t *num_tiles;
  int32_t *item_counter;   /* warp-specialized kernel: next item to hand out (0 at launch) */
  const kva_plan_header *hdr;
  const int32_t *cu_q, *num_new, *cache_seqlens, *page_table;
  int hq, hkv, group;      /* group = hq / hkv */
  int page_size, ps_shift; /* key / page_size = (umulhi(key, ps_mul) + key) >> ps_shift */
  uint32_t ps_mul;
  float qk_mul;   /* no cap: log2(e) * sm_scale * k_scale; cap: 2 log2(e) sm_scale k_scale / cap */
  float cap_log2; /* cap * log2(e), 0 = no soft-cap */
  float o_mul;    /* v_scale for fp8 pools, else 1 */
  int causal, window_left;
  unsigned long long *trace; /* ws kernel built with KVA_EXT_TRACE: per-CTA sums (cuda/trace.h) */
} kva_ext_args;

/* Tile schedule (extend_sched.c): tiles[2i], tiles[2i+1] = (batch index of
 * an extend request, its first query token of the tile), heaviest (most
 * keys under causal masking) first. recs: scratch of cap entries. Returns
 * the number of tiles, -1 if more than cap. */
typedef struct kva_ext_rec {
  int32_t cost, req, t0;
} kva_ext_rec;
int kva_ext_build_tiles(const kva_plan *plan, int bm, int cap, kva_ext_rec *recs, int32_t *tiles);

/* One per head dim (extend_dN.cu). grid_cache[4]: persistent grid size per
 * (f16, f16+fp8, bf16, bf16+fp8), 0 until the first launch sizes it. */
kva_status kva_ext_launch_d64(const kva_ext_args *a, kva_dtype qt, int kv8, int num_sms,
                              int max_items, int grid_cache[4], cudaStream_t stream);
kva_status kva_ext_launch_d128(const kva_ext_args *a, kva_dtype qt, int kv8, int num_sms,
                               int max_items, int grid_cache[4], cudaStream_t stream);
kva_status kva_ext_launch_d256(const kva_ext_args *a, kva_dtype qt, int kv8, int num_sms,
                               int max_items, int grid_cache[4], cudaStream_t stream);

/* wgmma kernel without warp specialization (extend_wgmma.cu; KVA_EXTEND_KERNEL=wgmma):
 * head_dim 128, f16/bf16 Q, same-type KV. grid_cache[2]: (f16, bf16). */
kva_status kva_ext_launch_wgmma(const kva_ext_args *a, kva_dtype qt, int num_sms, int max_items,
                                int grid_cache[2], cudaStream_t stream);
/* Warp-specialized wgmma kernel (extend_ws*.cu, FlashAttention-3 style):
 * head_dim 64, 128, 256, f16/bf16 Q with same-type KV, the default
 * (KVA_EXTEND_KERNEL=ws). Tiles of KVA_WS_TILE_ROWS query rows at every
 * head dim (the plan's schedule; mma.sync's is 64 at d=256).
 * grid_cache[2]: (f16, bf16). */
#define KVA_WS_TILE_ROWS 128
/* Q is loaded (and released) in halves, one per consumer warpgroup */
#define KVA_WS_QBOX_ROWS (KVA_WS_TILE_ROWS / 2)
#define KVA_WS_BN(d) ((d) == 256 ? 64 : 128) /* keys per tile */
#define KVA_WS_TMA_WARPS 4 /* default producer warps of the TMA loads (1, 2 or 4: see kva_ext_tma) */
/* The ws kernel's TMA loads (tm != NULL): Q as [total_q][hq][D] and the
 * layer's K and V as [slots][hkv][D], boxes of 64 columns (128 bytes) by 1
 * head by `rows` rows: KVA_WS_QBOX_ROWS (half the Q tile), or min(page
 * size, key tile) keys, one page or one key tile per box (see
 * kva_ext_tma_rows). Without: the
 * producer gathers rows with cp.async. grid_cache[4]: (f16, bf16) x
 * (cp.async, TMA). */
/* Rows of a K/V TMA box for the ws kernel: a whole page when pages tile
 * the key tile (page size divides it), the key tile when it lies in one
 * page (divides the page size); 0 (cp.async gather) otherwise or for pages
 * of fewer than 8 keys, where a box per page would cost more than the
 * gather. */
static inline int kva_ext_tma_rows(int page_size, int key_tile) {
  if (page_size < 8) return 0;
  if (key_tile % page_size == 0) return page_size;
  return page_size % key_tile == 0 ? key_tile : 0;
}
typedef struct kva_ext_tma {
  CUtensorMap q, k, v;
  int rows;
  int warps; /* producer warps issuing them: 1 (Q, K, V), 2 (Q and K; V) or 4 (K, V in halves) */
} kva_ext_tma;
kva_status kva_ext_launch_ws_d64(const kva_ext_args *a, const kva_ext_tma *tm, kva_dtype qt,
                                 int num_sms, int max_items, int grid_cache[4],
                                 cudaStream_t stream);
kva_status kva_ext_launch_ws_d128(const kva_ext_args *a, const kva_ext_tma *tm, kva_dtype qt,
                                  int num_sms, int max_items, int grid_cache[4],
                                  cudaStream_t stream);
kva_status kva_ext_launch_ws_d256(const kva_ext_args *a, const kva_ext_tma *tm, kva_dtype qt,
                                  int num_sms, int max_items, int grid_cache[4],
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* KVA_CUDA_EXTEND_H */
