/* kvattn bench --mode mla: FlashMLA's decode benchmark. B requests with
 * cache_seqlens L (or N(L, L/2) with --varlen, clipped at s_q), s_q new
 * tokens each, h_q query heads over one 576-dim latent per token, output 512
 * dims. Memory-bound shapes (h_q * s_q <= 64) are judged by GB/s of latent
 * read against the copy ceiling; compute-bound ones by TFLOP/s. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"

#define D KVA_MLA_HEAD_DIM
#define DV KVA_MLA_V_DIM

int bench_run_mla(kva_context *ctx, const bench_opts *o, int B, int L, double ceiling,
                  cli_rng *rng) {
  if (o->hkv != 1) {
    fprintf(stderr, "kvattn bench: --mode mla needs --heads HQ:1 (one latent head), got %d:%d\n",
            o->hq, o->hkv);
    return 2;
  }
  int sq = o->sq;
  int32_t *cached = (int32_t *)malloc((size_t)B * 4), *nnew = (int32_t *)malloc((size_t)B * 4);
  int32_t *slots = (int32_t *)malloc((size_t)B * 4);
  if (!cached || !nnew || !slots) return 1;
  long long kv_tokens = 0, visible = 0, pages_total = 0;
  int max_len = 0;
  for (int i = 0; i < B; i++) {
    int len = bench_draw_len(o, L, sq, rng);
    nnew[i] = sq;
    cached[i] = len - sq;
    max_len = len > max_len ? len : max_len;
    kv_tokens += len;
    pages_total += (len + o->page - 1) / o->page;
    for (int t = 0; t < sq; t++) visible += o->causal ? cached[i] + t + 1 : len;
  }
  size_t esz = kva_dtype_size(o->kv_dtype);
  double layer_bytes = (double)pages_total * o->page * D * esz;
  int layers;
  kva_pool *pool;
  kva_req_table *table;
  kva_plan *plan;
  if (bench_make_batch(ctx, o, KVA_LAYOUT_MLA, 1, D, layer_bytes, B, max_len, pages_total, cached,
                       nnew, B * sq, slots, rng, &layers, &pool, &table, &plan) != 0)
    return 1;
  size_t rows = (size_t)B * sq * o->hq, qsz = kva_dtype_size(o->dtype);
  void *q, *out, *hq = malloc(rows * D * qsz);
  if (!hq) return 1;
  CLI_TRY(kva_malloc(ctx, rows * D * qsz, &q));
  CLI_TRY(kva_malloc(ctx, rows * DV * qsz, &out));
  cli_fill_random(rng, hq, rows * D, o->dtype, 2.0f);
  CLI_TRY(kva_copy_to_device(ctx, q, hq, rows * D * qsz));
  kva_attn_params ap = kva_attn_params_default();
  ap.causal = o->causal;

  bench_timing tm;
  if (bench_time_attention(ctx, o, plan, pool, layers, &ap, q, out, &tm) != 0) return 1;
  double t = tm.t;
  double bytes = (double)kv_tokens * D * esz + (double)pages_total * 4;
  double gbps = bytes / t / 1e9;
  /* FlashMLA's test counts Q and O as well (and no page table); its GB/s
   * figures compare with this one */
  double fm_bytes = (double)kv_tokens * D * esz + (double)rows * (D + DV) * qsz;
  double fm_gbps = fm_bytes / t / 1e9;
  /* FlashMLA's count: every query row against every key of cache_seqlens */
  double flops = 2.0 * (D + DV) * o->hq * sq * (double)kv_tokens;
  double flops_exact = 2.0 * (D + DV) * o->hq * (double)visible;
  double tflops = flops / t / 1e12, tflops_exact = flops_exact / t / 1e12;
  const char *bound = o->hq * sq <= 64 ? "memory" : "compute";
  kva_plan_info pinfo; /* the schedule's chunks (split requests cost partial rows) */
  const int splits = kva_plan_get_info(plan, &pinfo) == KVA_OK ? pinfo.num_splits_total : -1;
  if (o->json) {
    printf("{\"device\":\"%s\",\"mode\":\"mla\",\"batch\":%d,\"ctx\":%d,\"varlen\":%d,\"heads\":\"%d:1\","
           "\"sq\":%d,\"head_dim\":%d,\"v_dim\":%d,\"page\":%d,\"dtype\":\"%s\",\"kv_dtype\":\"%s\","
           "\"causal\":%d,\"layers\":%d,\"iters\":%d,\"kv_tokens\":%lld,\"q_tokens\":%d,"
           "\"time_ms\":%.4f,\"kv_gbps\":%.1f,\"flashmla_gbps\":%.1f,\"tflops\":%.2f,"
           "\"tflops_exact\":%.2f,"
           "\"ceiling_gbps\":%.1f,\"ratio\":%.3f,\"bound\":\"%s\",\"launches_per_sample\":%d,"
           "\"single_ms\":%.4f,\"host_us\":%.2f,\"workers\":%d,\"split_block\":%d,\"warm_ms\":%d,"
           "\"splits\":%d}\n",
           o->dev == KVA_DEVICE_CUDA ? "cuda" : "cpu", B, L, o->varlen, o->hq, sq, D, DV, o->page,
           kva_dtype_name(o->dtype), kva_dtype_name(o->kv_dtype), o->causal, layers, tm.iters,
           kv_tokens, B * sq, t * 1e3, gbps, fm_gbps, tflops, tflops_exact, ceiling, gbps / ceiling,
           bound,
           tm.reps, tm.t_single * 1e3, tm.t_host * 1e6, o->workers, o->split_block, o->warm_ms,
           splits);
  } else {
    printf("mla     B=%-4d L=%-6d%s heads=%d:1 sq=%d page=%d q=%s kv=%s: %.3f ms, %.1f GB/s "
           "latent read, ratio %.3f (ceiling %.1f GB/s), %.2f TFLOP/s [%s-bound]; FlashMLA's "
           "count (latents + Q + O) %.1f GB/s\n",
           B, L, o->varlen ? " varlen" : "", o->hq, sq, o->page, kva_dtype_name(o->dtype),
           kva_dtype_name(o->kv_dtype), t * 1e3, gbps, gbps / ceiling, ceiling, tflops, bound,
           fm_gbps);
  }
  fflush(stdout);
  free(hq);
  kva_free(ctx, q);
  kva_free(ctx, out);
  kva_plan_destroy(plan);
  kva_req_table_destroy(table);
  kva_pool_destroy(pool);
  free(cached);
  free(nnew);
  free(slots);
  return 0;
}
