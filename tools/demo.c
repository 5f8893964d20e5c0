/* kvattn demo: a simulated serving workload. Requests with varied prompt and
 * output lengths arrive over time; each step batches the running decodes
 * with a chunk of waiting prompts (continuous batching with chunked prefill)
 * through the pool; pages are allocated as requests grow and freed when they
 * finish; many requests fork a shared system prompt. Random Q/K/V; a sample
 * of steps is checked against the double reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "ref/reference.h"

enum { LAYERS = 4, HQ = 16, HKV = 4, D = 128, PAGE = 16, PAGES = 3072, MAX_REQS = 96,
       MAX_CTX = 2048, SYS_PROMPT = 200, PREFILL_BUDGET = 384, MAX_BATCH = 64 };

typedef struct {
  int slot, prompt, output, done_prompt, generated, active;
} request;

int cli_demo(int argc, char **argv) {
  kva_device dev = KVA_DEVICE_CPU;
  int steps = 300;
  unsigned long long seed = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      if (!cli_parse_device(argv[++i], &dev)) return 2;
    } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = strtoull(argv[++i], NULL, 10);
    } else if (!strcmp(argv[i], "--help")) {
      printf("usage: kvattn demo [--device cpu|cuda] [--steps N] [--seed N]\n");
      return 0;
    } else {
      fprintf(stderr, "kvattn demo: unknown option '%s'\n", argv[i]);
      return 2;
    }
  }
  cli_rng r = {seed};
  kva_context *ctx;
  kva_context_config cc = {dev, 0, 0};
  CLI_TRY(kva_context_create(&cc, &ctx));
  kva_pool_config pc = {KVA_LAYOUT_MHA, LAYERS, PAGES, PAGE, HKV, D, KVA_BF16};
  kva_pool *pool;
  kva_req_table *table;
  kva_plan *plan;
  CLI_TRY(kva_pool_create(ctx, &pc, &pool));
  CLI_TRY(kva_req_table_create(pool, MAX_REQS + 1, MAX_CTX, &table));
  kva_plan_config plc = {MAX_BATCH, PREFILL_BUDGET + MAX_BATCH, HQ, 0, 0};
  CLI_TRY(kva_plan_create(table, &plc, &plan));
  size_t max_tok = PREFILL_BUDGET + MAX_BATCH, qn = max_tok * HQ * D, kvn = max_tok * HKV * D;
  void *q, *k, *v, *o;
  CLI_TRY(kva_malloc(ctx, qn * 2, &q));
  CLI_TRY(kva_malloc(ctx, qn * 2, &o));
  CLI_TRY(kva_malloc(ctx, kvn * 2, &k));
  CLI_TRY(kva_malloc(ctx, kvn * 2, &v));
  uint16_t *hq = malloc(qn * 2), *hkv = malloc(kvn * 2), *ho = malloc(qn * 2);
  float *qf = malloc(qn * 4), *of = malloc(qn * 4);
  double *ref = malloc(qn * sizeof(double));

  /* the shared system prompt, stored once */
  int sys;
  int32_t bs[MAX_BATCH], bc[MAX_BATCH], bn[MAX_BATCH];
  CLI_TRY(kva_req_alloc(table, &sys));
  CLI_TRY(kva_req_append(table, sys, SYS_PROMPT));
  kva_attn_params ap = kva_attn_params_default();
  request reqs[MAX_REQS];
  memset(reqs, 0, sizeof(reqs));
  int nreq = 0, finished = 0, forked = 0, checked = 0, peak_used = 0, waiting_peak = 0;
  long prefill_tokens = 0, decode_tokens = 0, shared_pages_saved = 0;
  double attn_time = 0, worst = 0;
  int step_sys = 1; /* step 0 stores the system prompt */
  for (int step = 0; step < steps + step_sys; step++) {
    int nb = 0, tot = 0;
    if (step == 0) {
      bs[0] = sys, bc[0] = 0, bn[0] = SYS_PROMPT, nb = 1, tot = SYS_PROMPT;
    } else {
      /* arrivals */
      int arrivals = cli_int(&r, 0, 3) == 0 ? cli_int(&r, 1, 3) : 0;
      for (int a = 0; a < arrivals && nreq < MAX_REQS; a++) {
        request *q0 = &reqs[nreq];
        q0->prompt = cli_int(&r, 16, 600);
        q0->output = cli_int(&r, 8, 160);
        q0->active = 0;
        q0->slot = -1;
        nreq++;
      }
      /* decodes first (each running request, one token) */
      for (int i = 0; i < nreq && nb < MAX_BATCH; i++) {
        request *x = &reqs[i];
        if (x->active != 1 || x->done_prompt < x->prompt) continue;
        if (kva_req_append(table, x->slot, 1) != KVA_OK) continue; /* out of pages: wait */
        bs[nb] = x->slot, bc[nb] = x->prompt + x->generated, bn[nb] = 1, nb++, tot++;
      }
      /* then prompt chunks within the prefill budget; admit waiting requests when pages allow */
      int waiting = 0;
      for (int i = 0; i < nreq && nb < MAX_BATCH; i++) {
        request *x = &reqs[i];
        if (x->active == 0) {
          waiting++;
          int need = (x->prompt + x->output) / PAGE + 2;
          if (kva_pool_num_free_pages(pool) < need + 32) continue;
          if (cli_int(&r, 0, 1)) { /* shares the system prompt */
            CLI_TRY(kva_req_fork(table, sys, SYS_PROMPT, &x->slot));
            x->done_prompt = SYS_PROMPT;
            x->prompt += SYS_PROMPT;
            forked++;
            shared_pages_saved += SYS_PROMPT / PAGE;
          } else {
            CLI_TRY(kva_req_alloc(table, &x->slot));
          }
          x->active = 1;
          waiting--;
        }
        if (x->active != 1 || x->done_prompt >= x->prompt) continue;
        int chunk = x->prompt - x->done_prompt;
        if (chunk > PREFILL_BUDGET - (tot - nb)) chunk = PREFILL_BUDGET - (tot - nb);
        if (chunk <= 0) break;
        if (kva_req_append(table, x->slot, chunk) != KVA_OK) continue;
        bs[nb] = x->slot, bc[nb] = x->done_prompt, bn[nb] = chunk, nb++, tot += chunk;
      }
      if (waiting > waiting_peak) waiting_peak = waiting;
    }
    if (nb == 0) continue;
    kva_batch batch = {nb, bs, bc, bn};
    CLI_TRY(kva_plan_update(plan, &batch));
    int check_now = step > 0 && step % 40 == 0;
    double t0 = cli_now();
    for (int l = 0; l < LAYERS; l++) {
      cli_fill_random(&r, hkv, (size_t)tot * HKV * D, KVA_BF16, 1.0f);
      CLI_TRY(kva_copy_to_device(ctx, k, hkv, (size_t)tot * HKV * D * 2));
      cli_fill_random(&r, hkv, (size_t)tot * HKV * D, KVA_BF16, 1.0f);
      CLI_TRY(kva_copy_to_device(ctx, v, hkv, (size_t)tot * HKV * D * 2));
      cli_fill_random(&r, hq, (size_t)tot * HQ * D, KVA_BF16, 2.0f);
      CLI_TRY(kva_copy_to_device(ctx, q, hq, (size_t)tot * HQ * D * 2));
      CLI_TRY(kva_store_kv(plan, pool, l, k, v, KVA_BF16));
      if (step > 0) CLI_TRY(kva_attention(plan, pool, l, &ap, q, o, NULL, KVA_BF16));
    }
    CLI_TRY(kva_synchronize(ctx));
    attn_time += cli_now() - t0;
    if (check_now) { /* the last layer against the reference */
      CLI_TRY(kva_copy_to_host(ctx, ho, o, (size_t)tot * HQ * D * 2));
      cli_to_f32(hq, (size_t)tot * HQ * D, KVA_BF16, qf);
      cli_to_f32(ho, (size_t)tot * HQ * D, KVA_BF16, of);
      float **kd = calloc((size_t)nb, sizeof(float *)), **vd = calloc((size_t)nb, sizeof(float *));
      for (int i = 0; i < nb; i++)
        CLI_TRY(kva_ref_read_request_kv(pool, table, bs[i], LAYERS - 1, bc[i] + bn[i], &kd[i], &vd[i]));
      kva_ref_attention(nb, bc, bn, HQ, HKV, D, &ap, qf, (const float *const *)kd, (const float *const *)vd, ref, NULL);
      double err = kva_ref_rel_error(ref, of, (size_t)tot * HQ * D);
      if (err > worst) worst = err;
      checked++;
      for (int i = 0; i < nb; i++) {
        free(kd[i]);
        free(vd[i]);
      }
      free(kd);
      free(vd);
    }
    /* account and retire */
    for (int i = 0; i < nb; i++) {
      if (step == 0) break;
      request *x = NULL;
      for (int j = 0; j < nreq; j++)
        if (reqs[j].active == 1 && reqs[j].slot == bs[i]) x = &reqs[j];
      if (!x) continue;
      if (bn[i] == 1 && x->done_prompt >= x->prompt) {
        x->generated++;
        decode_tokens++;
      } else {
        x->done_prompt += bn[i];
        prefill_tokens += bn[i];
      }
      if (x->generated >= x->output) {
        CLI_TRY(kva_req_release(table, x->slot));
        x->active = 2;
        finished++;
      }
    }
    int used = PAGES - kva_pool_num_free_pages(pool);
    if (used > peak_used) peak_used = used;
    if (step > 0 && step % 50 == 0)
      printf("step %4d: batch %2d (%3d tokens), running %d, finished %d, pages used %d/%d\n", step, nb, tot,
             kva_req_num_live(table) - 1, finished, used, PAGES);
  }
  CLI_TRY(kva_pool_check(pool));
  int ok = checked > 0 && worst < 1e-2;
  printf("\nkvattn demo on %s: %d steps, %d requests arrived, %d finished, %d forked from a %d-token "
         "system prompt\n",
         dev == KVA_DEVICE_CUDA ? "cuda" : "cpu", steps, nreq, finished, forked, SYS_PROMPT);
  printf("  tokens: %ld prefill + %ld decode in %.2f s of store+attention (%d layers): %.0f tokens/s\n",
         prefill_tokens, decode_tokens, attn_time, LAYERS, (prefill_tokens + decode_tokens) / attn_time);
  printf("  pool: peak %d of %d pages (%.0f%%), %d in use at the end; %ld pages shared instead of "
         "copied\n",
         peak_used, PAGES, 100.0 * peak_used / PAGES, PAGES - kva_pool_num_free_pages(pool),
         shared_pages_saved);
  printf("  checked %d steps against the double reference: worst rel error %.3g (%s)\n", checked, worst,
         ok ? "ok" : "FAILED");
  free(hq); free(hkv); free(ho); free(qf); free(of); free(ref);
  kva_free(ctx, q); kva_free(ctx, k); kva_free(ctx, v); kva_free(ctx, o);
  kva_plan_destroy(plan);
  kva_req_table_destroy(table);
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
  return ok ? 0 : 1;
}
