/* kvattn bench: times kva_attention on a filled paged pool and reports the
 * KV read bandwidth, TFLOP/s, and the ratio to a copy ceiling measured in the
 * same run (multithreaded memcpy on the CPU, device-to-device copy on CUDA,
 * both counting bytes read + written). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "dec_trace.h"
#include "gpu_timer.h"


/* ---- CPU copy ceiling ---------------------------------------------------- */
typedef struct {
  char *dst;
  const char *src;
  size_t n;
} copy_arg;
static void *copy_thread(void *p) {
  copy_arg *a = (copy_arg *)p;
  memcpy(a->dst, a->src, a->n);
  return NULL;
}
static double cpu_copy_ceiling(int threads) {
  size_t n = (size_t)256 << 20;
  char *src = (char *)malloc(n), *dst = (char *)malloc(n);
  if (!src || !dst) {
    free(src);
    free(dst);
    return 0;
  }
  memset(src, 1, n);
  memset(dst, 2, n);
  double best[7];
  for (int rep = 0; rep < 7; rep++) {
    pthread_t th[64];
    copy_arg args[64];
    int t = threads < 64 ? threads : 64;
    double t0 = cli_now();
    for (int i = 0; i < t; i++) {
      args[i].dst = dst + n / t * i;
      args[i].src = src + n / t * i;
      args[i].n = n / t;
      pthread_create(&th[i], NULL, copy_thread, &args[i]);
    }
    for (int i = 0; i < t; i++) pthread_join(th[i], NULL);
    best[rep] = cli_now() - t0;
  }
  for (int i = 0; i < 7; i++) /* median */
    for (int j = i + 1; j < 7; j++)
      if (best[j] < best[i]) {
        double x = best[i];
        best[i] = best[j];
        best[j] = x;
      }
  free(src);
  free(dst);
  return 2.0 * (double)n / best[3] / 1e9;
}

/* Whole decimal in [lo, hi]. */
static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < lo || v > hi) return 0;
  *out = (int)v;
  return 1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Random KV: a 16 MiB random block tiled over every buffer of every layer. */
int bench_make_batch(kva_context *ctx, const bench_opts *o, kva_layout layout, int hkv, int d,
                     double layer_bytes, int B, int max_len, long long pages_total,
                     const int32_t *cached, const int32_t *nnew, int max_q, int32_t *slots,
                     cli_rng *rng, int *layers_out, kva_pool **pool_out,
                     kva_req_table **table_out, kva_plan **plan_out) {
  int layers = o->layers;
  if (layers <= 0) layers = o->dev == KVA_DEVICE_CUDA ? (int)ceil(200e6 / layer_bytes) : 1;
  layers = layers < 1 ? 1 : layers > 1024 ? 1024 : layers;
  kva_pool_config pc = {layout, layers, (int)pages_total + B, o->page, hkv, d, o->kv_dtype};
  kva_pool *pool;
  kva_req_table *table;
  kva_plan *plan;
  CLI_TRY(kva_pool_create(ctx, &pc, &pool));
  CLI_TRY(kva_req_table_create(pool, B, max_len, &table));
  for (int i = 0; i < B; i++) {
    int s;
    CLI_TRY(kva_req_alloc(table, &s));
    slots[i] = s;
    CLI_TRY(kva_req_append(table, s, cached[i] + nnew[i]));
  }
  if (bench_fill_pool(ctx, pool, rng) != 0) return 1;
  kva_plan_config plc = {B, max_q, o->hq, o->workers, o->split_block, o->deterministic};
  CLI_TRY(kva_plan_create(table, &plc, &plan));
  kva_batch batch = {B, slots, cached, nnew};
  CLI_TRY(kva_plan_update(plan, &batch));
  *layers_out = layers;
  *pool_out = pool;
  *table_out = table;
  *plan_out = plan;
  return 0;
}

int bench_fill_pool(kva_context *ctx, kva_pool *pool, cli_rng *rng) {
  const kva_pool_config *pc = kva_pool_get_config(pool);
  size_t esz = kva_dtype_size(pc->kv_dtype), blk = (size_t)16 << 20;
  void *host = malloc(blk);
  if (!host) return 1;
  cli_fill_random(rng, host, blk / esz, pc->kv_dtype, 1.0f);
  size_t layer_bytes = (size_t)pc->num_pages * pc->page_size * pc->num_kv_heads * pc->head_dim * esz;
  for (int l = 0; l < pc->num_layers; l++) {
    void *kb, *vb;
    CLI_TRY(kva_pool_get_buffers(pool, l, &kb, &vb));
    for (size_t off = 0; off < layer_bytes; off += blk) {
      size_t n = layer_bytes - off < blk ? layer_bytes - off : blk;
      CLI_TRY(kva_copy_to_device(ctx, (char *)kb + off, host, n));
      if (vb) CLI_TRY(kva_copy_to_device(ctx, (char *)vb + off, host, n));
    }
  }
  free(host);
  return 0;
}

/* The timed samples of bench_time_attention into times / host (iters
 * each); its early returns leave the buffers to the caller. */
static int bench_samples(kva_context *ctx, const bench_opts *o, kva_plan *plan, kva_pool *pool,
                         int layers, const kva_attn_params *ap, const void *q, void *out,
                         double *times, double *host, int iters, bench_timing *res) {
  for (int w = 0; w < (o->dev == KVA_DEVICE_CUDA ? 3 : 1); w++)
    CLI_TRY(kva_attention(plan, pool, w % layers, ap, q, out, NULL, o->dtype));
  CLI_TRY(kva_synchronize(ctx));
  /* --warm-ms: the GPU brought to the clock it holds under sustained load
   * (the H100 runs at its power cap within ~0.1 s of heavy tensor work) */
  if (o->dev == KVA_DEVICE_CUDA && o->warm_ms > 0) {
    const double t0 = cli_now();
    for (int n = 0; cli_now() - t0 < o->warm_ms * 1e-3; n++) {
      CLI_TRY(kva_attention(plan, pool, n % layers, ap, q, out, NULL, o->dtype));
      if (n % 16 == 15) CLI_TRY(kva_synchronize(ctx));
    }
    CLI_TRY(kva_synchronize(ctx));
  }
  /* CUDA: each sample is `reps` launches back to back (a different layer
   * each), as in a forward pass or a graph replay, so a short kernel's time
   * is not the host's launch latency; the single-launch event time is
   * reported too (single_ms). */
  double t_single = 0;
  int reps = 1;
  for (int pass = 0; pass < (o->dev == KVA_DEVICE_CUDA ? 2 : 1); pass++) {
    for (int it = 0; it < iters; it++) {
      if (o->dev == KVA_DEVICE_CUDA) {
        double ms = -1;
        if (cli_gpu_time_begin(ctx) != 0) return 1;
        const double h0 = cli_now(); /* the host's side of a call: checks, maps, launch */
        for (int r = 0; r < reps; r++)
          CLI_TRY(kva_attention(plan, pool, (it * reps + r) % layers, ap, q, out, NULL, o->dtype));
        host[it] = (cli_now() - h0) / reps;
        if (cli_gpu_time_end(ctx, &ms) != 0) return 1;
        times[it] = ms * 1e-3 / reps;
      } else {
        double t0 = cli_now();
        CLI_TRY(kva_attention(plan, pool, it % layers, ap, q, out, NULL, o->dtype));
        times[it] = host[it] = cli_now() - t0;
      }
    }
    qsort(times, (size_t)iters, sizeof(double), cmp_double);
    qsort(host, (size_t)iters, sizeof(double), cmp_double);
    if (pass == 0 && o->dev == KVA_DEVICE_CUDA) {
      t_single = times[iters / 2];
      /* about 1 ms of launches per sample, at most 50 */
      reps = (int)ceil(1e-3 / (t_single > 1e-7 ? t_single : 1e-7));
      reps = reps < 1 ? 1 : reps > 50 ? 50 : reps;
    }
  }
  res->t = times[iters / 2];
  res->t_single = o->dev == KVA_DEVICE_CUDA ? t_single : res->t;
  res->t_host = host[iters / 2];
  res->iters = iters;
  res->reps = reps;
  return 0;
}

/* Median time of o->iters runs of kva_attention (CUDA: launches back to back
 * on a different layer each; see usage). */
int bench_time_attention(kva_context *ctx, const bench_opts *o, kva_plan *plan, kva_pool *pool,
                         int layers, const kva_attn_params *ap, const void *q, void *out,
                         bench_timing *res) {
  int iters = o->iters > 0 ? o->iters : (o->dev == KVA_DEVICE_CUDA ? 30 : 5);
  double *times = (double *)malloc((size_t)iters * sizeof(double));
  double *host = (double *)malloc((size_t)iters * sizeof(double));
  int rc = 1;
  if (times && host)
    rc = bench_samples(ctx, o, plan, pool, layers, ap, q, out, times, host, iters, res);
  free(times);
  free(host);
  if (rc != 0) return rc;
  /* KVA_DEC_TRACE: the split-KV (decode, MLA) kernels' timeline, or the
   * prefill ws kernel's phase sums in a KVA_EXT_TRACE build */
  if (o->dev == KVA_DEVICE_CUDA)
    return bench_dec_trace(ctx, plan, pool, layers, ap, q, out, o->dtype, res->reps);
  return 0;
}

int bench_draw_len(const bench_opts *o, int L, int lo, cli_rng *rng) {
  if (!o->varlen) return L < lo ? lo : L;
  double x = L + cli_normal(rng) * L / 2.0;
  return x < lo ? lo : (int)x;
}

/* One configuration; prints a line or a JSON object. */
static int run_config(kva_context *ctx, const bench_opts *o, int B, int L, double ceiling,
                      cli_rng *rng) {
  if (o->mla) return bench_run_mla(ctx, o, B, L, ceiling, rng);
  int32_t *cached = (int32_t *)malloc((size_t)B * 4), *nnew = (int32_t *)malloc((size_t)B * 4);
  int32_t *slots = (int32_t *)malloc((size_t)B * 4);
  long long kv_tokens = 0, pairs = 0, total_q = 0, pages_total = 0;
  int max_len = 0;
  const int sq = o->mixed || o->prefill ? 1 : o->sq; /* decode: new tokens a request */
  for (int i = 0; i < B; i++) {
    int len = bench_draw_len(o, L, sq, rng);
    if (o->mixed) { /* prefix uniform in [0, --prefix], new tokens in [1, L] */
      cached[i] = kva_rng_int(rng, 0, o->prefix);
      nnew[i] = kva_rng_int(rng, 1, L);
    } else if (o->prefill) {
      cached[i] = o->prefix;
      nnew[i] = len;
    } else {
      nnew[i] = sq;
      cached[i] = len - sq;
    }
    int kv = cached[i] + nnew[i];
    if (kv > max_len) max_len = kv;
    kv_tokens += kv;
    total_q += nnew[i];
    pages_total += (kv + o->page - 1) / o->page;
    for (int t = 0; t < nnew[i]; t++) {
      int pos = cached[i] + t;
      pairs += o->causal ? pos + 1 : kv;
    }
  }
  size_t esz = kva_dtype_size(o->kv_dtype);
  double layer_kv_bytes = (double)pages_total * o->page * o->hkv * o->d * esz * 2;
  int layers;
  kva_pool *pool;
  kva_req_table *table;
  kva_plan *plan;
  if (bench_make_batch(ctx, o, KVA_LAYOUT_MHA, o->hkv, o->d, layer_kv_bytes, B, max_len,
                       pages_total, cached, nnew, (int)total_q, slots, rng, &layers, &pool, &table,
                       &plan) != 0)
    return 1;
  size_t qbytes = (size_t)total_q * o->hq * o->d * kva_dtype_size(o->dtype);
  void *q, *out;
  CLI_TRY(kva_malloc(ctx, qbytes, &q));
  CLI_TRY(kva_malloc(ctx, qbytes, &out));
  void *hq = malloc(qbytes);
  cli_fill_random(rng, hq, qbytes / kva_dtype_size(o->dtype), o->dtype, 2.0f);
  CLI_TRY(kva_copy_to_device(ctx, q, hq, qbytes));
  kva_attn_params ap = kva_attn_params_default();
  ap.causal = o->causal;

  bench_timing tm;
  if (bench_time_attention(ctx, o, plan, pool, layers, &ap, q, out, &tm) != 0) return 1;
  double t = tm.t, t_single = tm.t_single;
  int iters = tm.iters, reps = tm.reps;
  double kv_bytes = (double)kv_tokens * o->hkv * o->d * esz * 2 + (double)pages_total * 4;
  double gbps = kv_bytes / t / 1e9, tflops = 4.0 * o->hq * o->d * (double)pairs / t / 1e12;
  char heads[32];
  snprintf(heads, sizeof(heads), "%d:%d", o->hq, o->hkv);
  if (o->json) {
    printf("{\"device\":\"%s\",\"mode\":\"%s\",\"batch\":%d,\"ctx\":%d,\"varlen\":%d,\"heads\":\"%s\","
           "\"head_dim\":%d,\"page\":%d,\"dtype\":\"%s\",\"kv_dtype\":\"%s\",\"causal\":%d,\"prefix\":%d,"
           "\"layers\":%d,\"iters\":%d,\"kv_tokens\":%lld,\"q_tokens\":%lld,\"time_ms\":%.4f,\"kv_gbps\":%.1f,"
           "\"tflops\":%.2f,\"ceiling_gbps\":%.1f,\"ratio\":%.3f,\"launches_per_sample\":%d,\"single_ms\":%.4f,"
           "\"host_us\":%.2f,\"workers\":%d,\"split_block\":%d,\"deterministic\":%d,\"warm_ms\":%d,"
           "\"sq\":%d}\n",
           o->dev == KVA_DEVICE_CUDA ? "cuda" : "cpu", o->mixed ? "mixed" : o->prefill ? "prefill" : "decode", B, L,
           o->varlen, heads, o->d, o->page, kva_dtype_name(o->dtype), kva_dtype_name(o->kv_dtype),
           o->causal, o->prefix, layers, iters, kv_tokens, total_q, t * 1e3, gbps, tflops, ceiling,
           gbps / ceiling, reps, t_single * 1e3, tm.t_host * 1e6, o->workers, o->split_block,
           o->deterministic, o->warm_ms, sq);
  } else {
    char sqs[16] = "";
    if (sq > 1) snprintf(sqs, sizeof(sqs), " sq=%d", sq);
    printf("%-7s B=%-4d L=%-6d%s%s%s heads=%s d=%d page=%d q=%s kv=%s: %.3f ms, %.1f GB/s KV read, "
           "%.2f TFLOP/s, ceiling %.1f GB/s, ratio %.3f\n",
           o->mixed ? "mixed" : o->prefill ? "prefill" : "decode", B, L, sqs, o->varlen ? " varlen" : "",
           o->deterministic ? " deterministic" : "", heads, o->d, o->page,
           kva_dtype_name(o->dtype), kva_dtype_name(o->kv_dtype), t * 1e3, gbps, tflops, ceiling,
           gbps / ceiling);
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

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvattn bench [--device cpu|cuda] [--mode decode|prefill|mixed|mla] [--batch B[,B..]]\n"
          "                    [--ctx L[,L..]] [--heads HQ:HKV] [--head-dim D] [--page P]\n"
          "                    [--dtype bf16|f16] [--kv-dtype bf16|f16|fp8] [--varlen]\n"
          "                    [--causal 0|1] [--prefix N] [--iters N] [--threads N]\n"
          "                    [--layers N] [--workers N] [--split-block N] [--sq N]\n"
          "                    [--deterministic] [--warm-ms MS] [--json]\n"
          "decode: B requests of L keys, the last --sq (1..8, default 1) of them new (causal);\n"
          "prefill: B requests of L new tokens after --prefix cached ones; mixed: B requests of\n"
          "U[0, --prefix] cached and U[1, L] new tokens (requests of <= 8 new tokens run as\n"
          "decode). --varlen draws lengths from N(L, L/2) clipped at 1 (decode: at --sq).\n"
          "Lengths use a fixed seed. Comma lists in --batch/--ctx run every combination\n"
          "(progress on stderr).\n"
          "mla: FlashMLA's decode: B requests of --sq (1..8, default 1) new tokens and L keys in\n"
          "all (cache_seqlens; --varlen: N(L, L/2) clipped at sq), latent cache of 576 dims\n"
          "(V = first 512), --heads HQ:1, page 64 unless --page; reports GB/s of latent read\n"
          "(+ page table) with the ratio to the copy ceiling, and TFLOP/s counted as FlashMLA\n"
          "does: 2 * (576 + 512) * hq * sq per key of cache_seqlens (tflops_exact in --json\n"
          "counts only the causally visible keys). --head-dim is ignored.\n"
          "Reports the median time of --iters runs (default 5 CPU, 30 CUDA). CUDA: event timing\n"
          "of back-to-back launches (~1 ms per sample, the single-launch time as single_ms;\n"
          "host_us in --json: the host's median wall time per call within those samples),\n"
          "GB/s of K+V read in the storage dtype + page table, TFLOP/s (4*hq*d per visible\n"
          "query-key pair), and the ratio to a copy ceiling from the same run (CPU: memcpy of\n"
          "256 MiB over the worker threads; CUDA: 1 GiB device-to-device; bytes read + written).\n"
          "CUDA attends to a different layer each iteration over enough layers (--layers to\n"
          "override) that the KV is >= 4x the 50 MB L2. --workers/--split-block: the plan's\n"
          "split-KV workers and block (0 = backend default). --deterministic: plans that give\n"
          "bitwise-reproducible output (CUDA decode keeps every chunk's planned keys).\n"
          "--warm-ms MS (CUDA): launches back to back for MS ms before timing, so that the\n"
          "samples see the clock the GPU holds under sustained load (its power cap); the\n"
          "copy ceiling is then timed after MS ms of copies too.\n"
          "--json: one object per configuration.\n");
}

int cli_bench(int argc, char **argv) {
  bench_opts o = {KVA_DEVICE_CPU, 0, 0, 32, 8, 128, 16, 0, 1, 0, 0, 0, 0, 0, 0, 0, KVA_BF16, KVA_BF16, 0, 1, 0, 0};
  int page_given = 0;
  int batches[32] = {16}, ctxs[32] = {4096}, nb = 1, nc = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    static const char *valued[] = {"--device", "--mode", "--batch", "--ctx", "--heads",
                                   "--head-dim", "--page", "--dtype", "--kv-dtype", "--causal",
                                   "--prefix", "--iters", "--threads", "--layers",
                                   "--workers", "--split-block", "--sq", "--warm-ms"};
    int known = 0;
    for (size_t j = 0; j < sizeof(valued) / sizeof(valued[0]); j++) known |= !strcmp(a, valued[j]);
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      o.json = 1;
    } else if (!strcmp(a, "--varlen")) {
      o.varlen = 1;
    } else if (!strcmp(a, "--deterministic")) {
      o.deterministic = 1;
    } else if (!known) {
      fprintf(stderr, "kvattn bench: unknown option '%s' (see kvattn bench --help)\n", a);
      return 2;
    } else if (!v) {
      fprintf(stderr, "kvattn bench: %s needs a value\n", a);
      return 2;
    } else if (!strcmp(a, "--device")) {
      if (!cli_parse_device(v, &o.dev)) goto bad;
      i++;
    } else if (!strcmp(a, "--mode")) {
      o.mixed = o.mla = 0;
      if (!strcmp(v, "decode")) o.prefill = 0;
      else if (!strcmp(v, "mla")) o.prefill = 0, o.mla = 1;
      else if (!strcmp(v, "prefill")) o.prefill = 1;
      else if (!strcmp(v, "mixed")) o.prefill = o.mixed = 1;
      else goto bad;
      i++;
    } else if (!strcmp(a, "--batch")) {
      if ((nb = cli_parse_list(v, batches, 32)) <= 0) goto bad;
      i++;
    } else if (!strcmp(a, "--ctx")) {
      if ((nc = cli_parse_list(v, ctxs, 32)) <= 0) goto bad;
      i++;
    } else if (!strcmp(a, "--heads")) {
      if (sscanf(v, "%d:%d", &o.hq, &o.hkv) != 2 || o.hq <= 0 || o.hkv <= 0 || o.hq % o.hkv) goto bad;
      i++;
    } else if (!strcmp(a, "--head-dim")) {
      if (!parse_int(v, 1, 1 << 20, &o.d)) goto bad;
      i++;
    } else if (!strcmp(a, "--page")) {
      if (!parse_int(v, 1, 1 << 20, &o.page)) goto bad;
      page_given = 1;
      i++;
    } else if (!strcmp(a, "--dtype")) {
      if (!cli_parse_dtype(v, &o.dtype) || o.dtype == KVA_FP8_E4M3) goto bad;
      i++;
    } else if (!strcmp(a, "--kv-dtype")) {
      if (!cli_parse_dtype(v, &o.kv_dtype) || o.kv_dtype == KVA_F32) goto bad;
      i++;
    } else if (!strcmp(a, "--causal")) {
      if (!parse_int(v, 0, 1, &o.causal)) goto bad;
      i++;
    } else if (!strcmp(a, "--sq")) {
      if (!parse_int(v, 1, KVA_MAX_DECODE_Q, &o.sq)) goto bad;
      i++;
    } else if (!strcmp(a, "--prefix")) {
      if (!parse_int(v, 0, 1 << 30, &o.prefix)) goto bad;
      i++;
    } else if (!strcmp(a, "--iters")) {
      if (!parse_int(v, 1, 1000000, &o.iters)) goto bad;
      i++;
    } else if (!strcmp(a, "--warm-ms")) {
      if (!parse_int(v, 0, 600000, &o.warm_ms)) goto bad;
      i++;
    } else if (!strcmp(a, "--workers")) {
      if (!parse_int(v, 0, 1 << 16, &o.workers)) goto bad;
      i++;
    } else if (!strcmp(a, "--split-block")) {
      if (!parse_int(v, 0, 1 << 20, &o.split_block)) goto bad;
      i++;
    } else if (!strcmp(a, "--threads")) {
      if (!parse_int(v, 0, 4096, &o.threads)) goto bad;
      i++;
    } else if (!strcmp(a, "--layers")) {
      if (!parse_int(v, 1, 1024, &o.layers)) goto bad;
      i++;
    }
    continue;
  bad:
    fprintf(stderr, "kvattn bench: bad value '%s' for %s\n", v, a);
    return 2;
  }
  if (o.mla && !page_given) o.page = 64; /* FlashMLA's page size */
  kva_context_config cc = {o.dev, o.threads, 0};
  kva_context *ctx;
  kva_status st = kva_context_create(&cc, &ctx);
  if (st != KVA_OK) {
    fprintf(stderr, "kvattn bench: %s: %s\n", kva_strerror(st), kva_last_error());
    return st == KVA_ERR_NO_DEVICE ? 77 : 1;
  }
  double ceiling = o.dev == KVA_DEVICE_CUDA ? cli_gpu_copy_ceiling_gbps(ctx, o.warm_ms)
                                            : cpu_copy_ceiling(kva_context_num_workers(ctx));
  if (!(ceiling > 0)) {
    fprintf(stderr, "kvattn bench: could not measure the copy ceiling\n");
    return 1;
  }
  int total = nb * nc, done = 0, rc = 0;
  for (int bi = 0; bi < nb && rc == 0; bi++)
    for (int ci = 0; ci < nc && rc == 0; ci++) {
      if (total > 1) {
        int w = 30, fill = done * w / total;
        fprintf(stderr, "\r[%.*s%*s] %d/%d B=%d L=%d ", fill, "##############################", w - fill, "",
                done, total, batches[bi], ctxs[ci]);
      }
      /* seeded per configuration: its lengths do not depend on the others run */
      cli_rng rng = {12345u + 1000003ull * (uint64_t)batches[bi] + (uint64_t)ctxs[ci]};
      rc = run_config(ctx, &o, batches[bi], ctxs[ci], ceiling, &rng);
      done++;
    }
  if (total > 1) fprintf(stderr, "\r[##############################] %d/%d done%20s\n", done, total, "");
  kva_context_destroy(ctx);
  return rc;
}
