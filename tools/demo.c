/* kvattn demo: a simulated serving workload. Requests with varied prompt and
 * output lengths arrive over time; each step batches the running decodes
 * with chunks of waiting prompts (continuous batching with chunked prefill)
 * through the pool; pages are allocated as requests grow and freed when they
 * finish; half the requests fork a shared system prompt. Random Q/K/V; a
 * sample of steps is checked against the double reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "core/dtype.h"
#include "ref/reference.h"

enum {
  LAYERS = 4, HQ = 16, HKV = 4, D = 128, PAGE = 16, PAGES = 2048,
  MAX_LIVE = 96,         /* request records (waiting + running) */
  MAX_CTX = 2048,        /* longest request: system prompt + prompt + output */
  SYS_PROMPT = 200,      /* tokens of the shared system prompt */
  PREFILL_BUDGET = 384,  /* prompt tokens per step (chunked prefill) */
  MAX_BATCH = 64,        /* requests per step */
  CHECK_EVERY = 40
};
#define DEMO_TOL 1e-2 /* bf16 Q/O, as `kvattn check` */

typedef enum { R_FREE = 0, R_WAITING, R_RUNNING } req_state;

typedef struct {
  req_state state;
  int slot, prompt, output; /* prompt includes the system prompt when forked */
  int done_prompt, generated, reserved;
  int arrival; /* arrival order */
} request;

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvattn demo [--device cpu|cuda] [--steps N] [--seed N]\n"
          "Simulated serving: requests (prompt 16..400, output 8..160 tokens) arrive over time;\n"
          "each step batches running decodes with chunks of waiting prompts (continuous\n"
          "batching, chunked prefill, %d prompt tokens per step) through a paged pool of %d\n"
          "pages x %d tokens; %d layers, %d:%d heads, d=%d, bf16. Half the requests fork a\n"
          "%d-token system prompt. Every %d steps the last layer is checked against the double\n"
          "reference (rel error < %.0e). Exit 0 on success, 1 on failure, 77 without the device.\n"
          "  --steps N   scheduler steps (default 300)\n"
          "  --seed N    random seed (default 1)\n",
          PREFILL_BUDGET, PAGES, PAGE, LAYERS, HQ, HKV, D, SYS_PROMPT, CHECK_EVERY, DEMO_TOL);
}

/* Pages a request may still need, held in reserve at admission so that its
 * appends never run out (a real engine would preempt instead). */
static int pages_needed(const request *x, int forked) {
  int total = (x->prompt + x->output + PAGE - 1) / PAGE + 1;
  return forked ? total - SYS_PROMPT / PAGE : total;
}

int cli_demo(int argc, char **argv) {
  kva_device dev = KVA_DEVICE_CPU;
  int steps = 300;
  unsigned long long seed = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--device") && strcmp(a, "--steps") && strcmp(a, "--seed")) {
      fprintf(stderr, "kvattn demo: unknown option '%s' (see kvattn demo --help)\n", a);
      return 2;
    } else if (!v) {
      fprintf(stderr, "kvattn demo: %s needs a value\n", a);
      return 2;
    }
    i++;
    if (!strcmp(a, "--device")) {
      if (!cli_parse_device(v, &dev)) {
        fprintf(stderr, "kvattn demo: --device must be cpu or cuda (got '%s')\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--steps")) {
      long n = strtol(v, &end, 10);
      if (*v == '\0' || *end != '\0' || n <= 0 || n > 1000000) {
        fprintf(stderr, "kvattn demo: --steps must be a positive number (got '%s')\n", v);
        return 2;
      }
      steps = (int)n;
    } else {
      seed = strtoull(v, &end, 10);
      if (*v == '\0' || *end != '\0') {
        fprintf(stderr, "kvattn demo: --seed must be a number (got '%s')\n", v);
        return 2;
      }
    }
  }
  kva_context *ctx;
  kva_context_config cc = {dev, 0, 0};
  kva_status st = kva_context_create(&cc, &ctx);
  if (st == KVA_ERR_NO_DEVICE) {
    printf("kvattn demo: SKIPPED: no %s device present (%s)\n", dev == KVA_DEVICE_CUDA ? "CUDA" : "CPU",
           kva_last_error());
    return 77;
  }
  CLI_TRY(st);
  cli_rng r = {seed * 0x9E3779B97F4A7C15ull + 3};
  kva_pool_config pc = {KVA_LAYOUT_MHA, LAYERS, PAGES, PAGE, HKV, D, KVA_BF16};
  kva_pool *pool;
  kva_req_table *table;
  kva_plan *plan;
  CLI_TRY(kva_pool_create(ctx, &pc, &pool));
  CLI_TRY(kva_req_table_create(pool, MAX_LIVE + 1, MAX_CTX, &table));
  kva_plan_config plc = {MAX_BATCH, PREFILL_BUDGET + MAX_BATCH, HQ, 0, 0, 0};
  CLI_TRY(kva_plan_create(table, &plc, &plan));
  size_t max_tok = PREFILL_BUDGET + MAX_BATCH, qn = max_tok * HQ * D, kvn = max_tok * HKV * D;
  void *q, *k, *v, *o;
  CLI_TRY(kva_malloc(ctx, qn * 2, &q));
  CLI_TRY(kva_malloc(ctx, qn * 2, &o));
  CLI_TRY(kva_malloc(ctx, kvn * 2, &k));
  CLI_TRY(kva_malloc(ctx, kvn * 2, &v));
  uint16_t *hq = malloc(qn * 2), *hk = malloc(kvn * 2), *hv = malloc(kvn * 2), *ho = malloc(qn * 2);
  float *qf = malloc(qn * 4), *of = malloc(qn * 4);
  double *ref = malloc(qn * sizeof(double));
  if (!hq || !hk || !hv || !ho || !qf || !of || !ref) {
    fprintf(stderr, "kvattn demo: out of host memory\n");
    return 1;
  }

  /* the shared system prompt: a request of its own, stored at step 0 and
   * forked by half the arrivals; it lives until the end */
  int sys;
  CLI_TRY(kva_req_alloc(table, &sys));
  CLI_TRY(kva_req_append(table, sys, SYS_PROMPT));
  int sys_pages = PAGES - kva_pool_num_free_pages(pool);
  kva_attn_params ap = kva_attn_params_default();
  request reqs[MAX_LIVE];
  memset(reqs, 0, sizeof(reqs));
  int32_t bs[MAX_BATCH], bc[MAX_BATCH], bn[MAX_BATCH], bw[MAX_BATCH]; /* bw: record index */
  int arrived = 0, finished = 0, forked = 0, checked = 0, peak_used = 0, waiting = 0;
  int reserved = 0, batch_peak = 0;
  long prefill_tokens = 0, decode_tokens = 0, shared_pages = 0;
  double run_time = 0, worst = 0, t_start = cli_now();
  for (int step = 0; step <= steps; step++) {
    int nb = 0, tot = 0;
    if (step == 0) {
      bs[0] = sys, bc[0] = 0, bn[0] = SYS_PROMPT, bw[0] = -1, nb = 1, tot = SYS_PROMPT;
    } else {
      /* arrivals: about one request every 2.7 steps */
      int arrivals = cli_int(&r, 0, 3) == 0 ? cli_int(&r, 1, 4) : 0;
      for (int i = 0; i < MAX_LIVE && arrivals > 0; i++) {
        if (reqs[i].state != R_FREE) continue;
        request *x = &reqs[i];
        memset(x, 0, sizeof(*x));
        x->state = R_WAITING;
        x->slot = -1;
        x->prompt = cli_int(&r, 16, 400);
        x->output = cli_int(&r, 8, 160);
        x->arrival = arrived++;
        arrivals--;
      }
      /* one decode token for every running request whose prompt is done */
      for (int i = 0; i < MAX_LIVE && nb < MAX_BATCH; i++) {
        request *x = &reqs[i];
        if (x->state != R_RUNNING || x->done_prompt < x->prompt) continue;
        CLI_TRY(kva_req_append(table, x->slot, 1));
        bs[nb] = x->slot, bc[nb] = x->prompt + x->generated, bn[nb] = 1, bw[nb] = i;
        nb++, tot++;
      }
      /* prompt chunks within the budget, oldest first; admit waiting requests
       * while the pool can hold them to completion */
      int order[MAX_LIVE], n_order = 0, budget = PREFILL_BUDGET;
      for (int i = 0; i < MAX_LIVE; i++) { /* insertion sort by arrival */
        if (reqs[i].state == R_FREE) continue;
        int j = n_order++;
        for (; j > 0 && reqs[order[j - 1]].arrival > reqs[i].arrival; j--) order[j] = order[j - 1];
        order[j] = i;
      }
      waiting = 0;
      for (int oi = 0; oi < n_order && nb < MAX_BATCH; oi++) {
        int i = order[oi];
        request *x = &reqs[i];
        if (x->state == R_WAITING) {
          int fork = cli_int(&r, 0, 1);
          int need = pages_needed(x, fork);
          if (budget == 0 || reserved + need > PAGES - sys_pages) {
            waiting++;
            continue;
          }
          if (fork) { /* shares the system prompt's whole pages */
            CLI_TRY(kva_req_fork(table, sys, SYS_PROMPT, &x->slot));
            x->prompt += SYS_PROMPT;
            x->done_prompt = SYS_PROMPT;
            forked++;
            shared_pages += SYS_PROMPT / PAGE;
          } else {
            CLI_TRY(kva_req_alloc(table, &x->slot));
          }
          x->reserved = need;
          reserved += need;
          x->state = R_RUNNING;
        }
        if (x->state != R_RUNNING || x->done_prompt >= x->prompt || budget == 0) continue;
        int chunk = x->prompt - x->done_prompt;
        if (chunk > budget) chunk = budget;
        CLI_TRY(kva_req_append(table, x->slot, chunk));
        bs[nb] = x->slot, bc[nb] = x->done_prompt, bn[nb] = chunk, bw[nb] = i;
        nb++, tot += chunk, budget -= chunk;
      }
    }
    if (nb == 0) continue;
    if (nb > batch_peak) batch_peak = nb;
    kva_batch batch = {nb, bs, bc, bn};
    int check_now = step > 0 && step % CHECK_EVERY == 0;
    size_t nkv = (size_t)tot * HKV * D, nq = (size_t)tot * HQ * D;
    double t0 = cli_now();
    CLI_TRY(kva_plan_update(plan, &batch));
    for (int l = 0; l < LAYERS; l++) {
      /* fresh random activations per layer (generation is not timed) */
      double g0 = cli_now();
      cli_fill_random(&r, hk, nkv, KVA_BF16, 1.0f);
      cli_fill_random(&r, hv, nkv, KVA_BF16, 1.0f);
      cli_fill_random(&r, hq, nq, KVA_BF16, 2.0f);
      t0 += cli_now() - g0;
      CLI_TRY(kva_copy_to_device(ctx, k, hk, nkv * 2));
      CLI_TRY(kva_copy_to_device(ctx, v, hv, nkv * 2));
      CLI_TRY(kva_copy_to_device(ctx, q, hq, nq * 2));
      CLI_TRY(kva_store_kv(plan, pool, l, k, v, KVA_BF16));
      CLI_TRY(kva_attention(plan, pool, l, &ap, q, o, NULL, KVA_BF16));
    }
    CLI_TRY(kva_synchronize(ctx));
    run_time += cli_now() - t0;
    if (check_now) { /* the last layer against the reference on the stored KV */
      CLI_TRY(kva_copy_to_host(ctx, ho, o, nq * 2));
      cli_to_f32(hq, nq, KVA_BF16, qf);
      cli_to_f32(ho, nq, KVA_BF16, of);
      float *kd[MAX_BATCH], *vd[MAX_BATCH];
      for (int i = 0; i < nb; i++)
        CLI_TRY(kva_ref_read_request_kv(pool, table, bs[i], LAYERS - 1, bc[i] + bn[i], &kd[i], &vd[i]));
      kva_ref_attention(nb, bc, bn, HQ, HKV, D, &ap, qf, (const float *const *)kd,
                        (const float *const *)vd, ref, NULL);
      double err = kva_ref_rel_error(ref, of, nq);
      if (err > worst || isnan(err)) worst = err;
      checked++;
      for (int i = 0; i < nb; i++) free(kd[i]), free(vd[i]);
    }
    /* account tokens, retire finished requests (their pages go back) */
    for (int i = 0; i < nb; i++) {
      if (bw[i] < 0) { /* the system prompt */
        prefill_tokens += bn[i];
        continue;
      }
      request *x = &reqs[bw[i]];
      if (x->done_prompt >= x->prompt) {
        x->generated++;
        decode_tokens++;
      } else {
        x->done_prompt += bn[i];
        prefill_tokens += bn[i];
      }
      if (x->generated >= x->output) {
        CLI_TRY(kva_req_release(table, x->slot));
        reserved -= x->reserved;
        x->state = R_FREE;
        finished++;
      }
    }
    int used = PAGES - kva_pool_num_free_pages(pool);
    if (used > peak_used) peak_used = used;
    if (step > 0 && step % 50 == 0)
      printf("step %4d: batch %2d (%3d tokens), running %2d, waiting %2d, finished %3d, pages %4d/%d\n",
             step, nb, tot, kva_req_num_live(table) - 1, waiting, finished, used, PAGES);
  }
  CLI_TRY(kva_pool_check(pool));
  int final_used = PAGES - kva_pool_num_free_pages(pool);
  int running = kva_req_num_live(table) - 1;
  double wall = cli_now() - t_start;
  /* every page must come back once the table releases the rest */
  kva_plan_destroy(plan);
  kva_req_table_destroy(table);
  int leaked = PAGES - kva_pool_num_free_pages(pool);
  int ok = checked > 0 && worst < DEMO_TOL && leaked == 0;
  printf("\nkvattn demo on %s: %d steps in %.1f s (%d layers, %d:%d heads, d=%d, bf16, page %d)\n",
         dev == KVA_DEVICE_CUDA ? "cuda" : "cpu", steps, wall, LAYERS, HQ, HKV, D, PAGE);
  printf("  requests: %d arrived, %d served to completion, %d still running, %d forked from a "
         "%d-token system prompt; largest batch %d\n",
         arrived, finished, running, forked, SYS_PROMPT, batch_peak);
  printf("  throughput over %.2f s of plan+store+attention: prefill %.0f tokens/s (%ld tokens), "
         "decode %.0f tokens/s (%ld tokens)\n",
         run_time, prefill_tokens / run_time, prefill_tokens, decode_tokens / run_time, decode_tokens);
  printf("  pool: peak %d of %d pages used (%.0f%%), %d at the end, %d after releasing all; "
         "%ld pages shared instead of copied\n",
         peak_used, PAGES, 100.0 * peak_used / PAGES, final_used, leaked, shared_pages);
  printf("  checked %d steps against the double reference: worst rel error %.3g (limit %.0e): %s\n",
         checked, worst, DEMO_TOL, ok ? "ok" : "FAILED");
  free(hq), free(hk), free(hv), free(ho), free(qf), free(of), free(ref);
  kva_free(ctx, q), kva_free(ctx, k), kva_free(ctx, v), kva_free(ctx, o);
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
  return ok ? 0 : 1;
}
