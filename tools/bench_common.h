/* Pieces of `kvattn bench` shared by the MHA modes (bench.c) and MLA
 * (bench_mla.c). */
#ifndef KVA_BENCH_COMMON_H
#define KVA_BENCH_COMMON_H

#include "cli_common.h"

typedef struct {
  kva_device dev;
  int prefill, mixed, hq, hkv, d, page, varlen, causal, prefix, iters, json, threads, layers, workers, split_block;
  kva_dtype dtype, kv_dtype;
  int mla, sq; /* --mode mla: FlashMLA decode; sq: new tokens per request (decode, mla) */
  int deterministic; /* --deterministic: the plan's config flag */
  int warm_ms; /* --warm-ms: CUDA launches back to back this long before timing */
} bench_opts;

typedef struct {
  double t, t_single; /* median seconds per call; CUDA: of one launch alone */
  double t_host;      /* CUDA: median host seconds per call (enqueue), else t */
  int iters, reps;    /* samples; launches per sample */
} bench_timing;

/* Pool (layout, head count and dim as given; layers: --layers, or on CUDA
 * enough that the KV of all of them is >= 4x a 50 MB L2, so no call finds
 * its layer in L2), request table, B requests of cached[i] + nnew[i]
 * positions, random KV, and a plan with the batch planned; 0 on success.
 * layer_bytes: KV bytes of one layer for this batch. */
int bench_make_batch(kva_context *ctx, const bench_opts *o, kva_layout layout, int hkv, int d,
                     double layer_bytes, int B, int max_len, long long pages_total,
                     const int32_t *cached, const int32_t *nnew, int max_q, int32_t *slots,
                     cli_rng *rng, int *layers_out, kva_pool **pool_out,
                     kva_req_table **table_out, kva_plan **plan_out);
/* Fills every buffer of every layer with random values; 0 on success. */
int bench_fill_pool(kva_context *ctx, kva_pool *pool, cli_rng *rng);
/* Times kva_attention (warm-up, median of the samples); with KVA_DEC_TRACE set,
 * then records the decode / MLA kernel timeline, or the prefill kernel's phase
 * sums in a KVA_EXT_TRACE build (dec_trace.c). 0 on success. */
int bench_time_attention(kva_context *ctx, const bench_opts *o, kva_plan *plan, kva_pool *pool,
                         int layers, const kva_attn_params *ap, const void *q, void *out,
                         bench_timing *res);
/* Request lengths as every decode mode draws them: L, or with --varlen
 * N(L, L/2) clipped at lo. */
int bench_draw_len(const bench_opts *o, int L, int lo, cli_rng *rng);
/* One MLA configuration (bench_mla.c); prints a line or a JSON object. */
int bench_run_mla(kva_context *ctx, const bench_opts *o, int B, int L, double ceiling,
                  cli_rng *rng);

#endif
