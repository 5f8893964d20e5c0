/* Decode path internals shared by decode.cu (dispatch), the per-head-dim
 * launch units decode_d64/128/256.cu and decode_kernel.cuh (device code). */
#ifndef KVA_CUDA_DECODE_H
#define KVA_CUDA_DECODE_H

#include <stdint.h>

#include "cuda/cuda_internal.h"
#include "cuda/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVA_DEC_THREADS 128
#define KVA_DEC_WARPS 4
/* Keys per warp per tile: one P.V k-step (16) for 16-bit KV, two for fp8 so
 * that a stage moves about as many bytes. BK = keys per tile (all warps). */
#define KVA_DEC_KW(kv8) ((kv8) ? 32 : 16)
#define KVA_DEC_BK(kv8) (KVA_DEC_WARPS * KVA_DEC_KW(kv8))
/* smem row strides (bytes). 16-bit rows are padded by 16 bytes and fp8
 * rows XOR-swizzle their 16-byte chunks (dec_swz), so the 8 row addresses
 * of an ldmatrix phase fall on distinct bank groups either way. */
#define KVA_DEC_RS(d, kv8) ((kv8) ? (d) : (d) * 2 + 16)
#define KVA_DEC_QRS(d) ((d) * 2 + 16)
#define KVA_DEC_TILE_BYTES(d, kv8) (KVA_DEC_BK(kv8) * KVA_DEC_RS(d, kv8))
#define KVA_DEC_STAGE_BYTES(d, kv8) (2 * KVA_DEC_TILE_BYTES(d, kv8)) /* K then V */
#define KVA_DEC_Q_BYTES(d, mt) (16 * (mt) * KVA_DEC_QRS(d))
/* Two CTAs per SM up to d=128 (228 KB per SM, 1 KB reserved per CTA), one
 * for d=256 (its O tile needs the registers anyway); three for fp8 KV with
 * one m-tile, whose kernel fits 168 registers: its steps are latency-bound
 * with two warps a scheduler (H200, 2026-11-29, ncu: no eligible warp 48-53%
 * of cycles; three CTAs: B=1 L=128k 16% less time, B=4 13%, B=128-256
 * L=4096 2-3%, B=64 level; bf16 KV was level to 3% slower, so it keeps
 * two). */
#define KVA_DEC_CTAS_PER_SM(d, kv8, mt) ((d) > 128 ? 1 : (kv8) && (mt) == 1 ? 3 : 2)
#define KVA_DEC_SMEM_BUDGET(d, kv8, mt) \
  ((d) > 128 ? 232448 : KVA_DEC_CTAS_PER_SM(d, kv8, mt) == 3 ? 76800 : 115712)
#define KVA_DEC_STAGES_FIT(d, kv8, mt) \
  ((KVA_DEC_SMEM_BUDGET(d, kv8, mt) - KVA_DEC_Q_BYTES(d, mt)) / KVA_DEC_STAGE_BYTES(d, kv8))
#define KVA_DEC_STAGES(d, kv8, mt) \
  (KVA_DEC_STAGES_FIT(d, kv8, mt) > 4 ? 4 : KVA_DEC_STAGES_FIT(d, kv8, mt))
/* Q, the ring, then the tile-claim slots (KVA_DEC_CLAIM_SLOTS ints) */
#define KVA_DEC_CLAIM_SLOTS 8
#define KVA_DEC_RING_END(d, kv8, mt) \
  (KVA_DEC_Q_BYTES(d, mt) + KVA_DEC_STAGES(d, kv8, mt) * KVA_DEC_STAGE_BYTES(d, kv8))
#define KVA_DEC_SMEM(d, kv8, mt) (KVA_DEC_RING_END(d, kv8, mt) + 4 * KVA_DEC_CLAIM_SLOTS)
/* Chunks whose partial rows the merging CTA loads before it uses any
 * (kva_split_merge4). H200, 2026-11-29 ("Fifty-fourth session", 3 samples
 * ABBA; B=1 has 33 chunks a kv head with bf16 KV, 49 with fp8 at three
 * CTAs an SM): against 8, 16 took 0.5-1.2% less time on bf16 B=1
 * L=32k-128k (the last CTA's merge 2.05 -> 1.76-1.86 us), level at B=2-128;
 * on fp8 B=1 L=32k/128k 24 took 3.9/1.3% less (16: 1.8% / level). 24 on
 * bf16 and 32 on either were no better than 16. */
#define KVA_DEC_MERGE_BATCH(kv8) ((kv8) ? 24 : 16)
/* Merge scratch (aliases the ring after the key loop): per warp its O rows
 * (f32, stride d + 8) then m and l of each row. */
#define KVA_DEC_OS(d) ((d) + 8)
#define KVA_DEC_SCRATCH_BYTES(d, mt) \
  (KVA_DEC_WARPS * 16 * (mt) * (KVA_DEC_OS(d) + 2) * 4)

/* Kernel arguments (by value). Everything batch-dependent is read on the
 * device from the plan's metadata. */
typedef struct kva_dec_args {
  const kva_plan_header *hdr;
  const kva_split_work *sched;
  const int32_t *split_indptr, *split_row_offset, *cu_q, *cache_seqlens, *num_new, *page_table,
      *decode_reqs;
  const void *q;
  void *o;
  float *lse;                /* NULL: not written */
  float *part_o, *part_lse;  /* split-KV partial rows */
  int32_t *split_sem;        /* [max_batch * hq]: chunks of (request, grid row) done; 0 between runs */
  int32_t *tile_claim;       /* [max_batch * hq]: key tiles of (request, grid row) handed out; 0 between runs */
  const void *k, *v;         /* the layer's pool buffers */
  int hq, hkv, group;        /* group = hq / hkv */
  int page_size, ps_shift;   /* key / page_size = (umulhi(key, ps_mul) + key) >> ps_shift */
  uint32_t ps_mul;
  float qk_mul;   /* no cap: log2(e) sm_scale k_scale; cap: 2 log2(e) sm_scale k_scale / cap */
  float cap_log2; /* cap * log2(e); 0 = no soft-cap */
  float o_mul;    /* v_scale for fp8 pools, else 1 */
  int causal, window_left;
  unsigned long long *trace; /* timeline (cuda/trace.h); NULL */
  int deterministic;  /* plan config: every chunk keeps its planned key range */
} kva_dec_args;



/* One per head dim (decode_dN.cu): the split-KV kernel of (Q type, fp8 KV,
 * m-tiles) on grid (num_workers, hkv * row groups). */
kva_status kva_dec_launch_d64(const kva_dec_args *a, kva_dtype qt, int kv8, int mt,
                              unsigned grid_x, unsigned grid_y, cudaStream_t stream);
kva_status kva_dec_launch_d128(const kva_dec_args *a, kva_dtype qt, int kv8, int mt,
                               unsigned grid_x, unsigned grid_y, cudaStream_t stream);
kva_status kva_dec_launch_d256(const kva_dec_args *a, kva_dtype qt, int kv8, int mt,
                               unsigned grid_x, unsigned grid_y, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* KVA_CUDA_DECODE_H */
