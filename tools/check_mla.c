/* kvattn check, MLA decode cases: a latent pool ([pages, page, 576]) of
 * random page size, requests of random (not page-aligned) lengths with 1..8
 * new tokens (mostly 1-2, FlashMLA's s_q), h_q 16..128 (and others), latents
 * stored through kva_store_kv (v NULL) from a random source dtype, then one
 * attention step on a random layer. Checked as the MHA cases are: every
 * stored element correctly rounded, O against kva_ref_mla_attention on the
 * stored values, LSE, fp8 end to end, no page leaks. Runs unchanged on
 * every device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_common.h"
#include "core/dtype.h"
#include "ref/reference.h"

#define D KVA_MLA_HEAD_DIM
#define DV KVA_MLA_V_DIM
#define NLAYERS 2
#define MAXREQ 10
/* reference work cap (query rows x keys), so one case stays ~1 s */
#define REF_BUDGET 2e6

typedef struct {
  int page_size, hq, nreq, workers, split_block, layer, want_lse, saturating;
  int prefix[MAXREQ], nnew[MAXREQ];
  kva_dtype kv_dtype, q_dtype, src_dtype;
  float k_scale;
  kva_attn_params ap;
} mla_case;

static float rand01(cli_rng *r) { return (cli_uniform(r) + 1.0f) * 0.5f; }

static mla_case draw(cli_rng *r, int small) {
  static const int pages[] = {64, 16, 1, 64, 7, 32, 256, 3, 64, 128};
  static const int heads[] = {16, 32, 64, 128, 16, 32, 64, 128, 1, 8, 20, 48};
  static const kva_dtype kvt[] = {KVA_F16, KVA_BF16, KVA_FP8_E4M3};
  static const kva_dtype qt[] = {KVA_F32, KVA_F16, KVA_BF16};
  static const int workers[] = {0, 1, 2, 3, 5, 7, 16, 64};
  static const int blocks[] = {0, 0, 0, 0, 8, 16, 48, 256};
  mla_case c;
  memset(&c, 0, sizeof(c));
  c.page_size = pages[cli_int(r, 0, 9)];
  if (cli_int(r, 0, 5) == 0) c.page_size = cli_int(r, 1, 256);
  c.hq = heads[cli_int(r, 0, 11)];
  c.nreq = small ? cli_int(r, 1, 3) : cli_int(r, 1, MAXREQ);
  long long rows_keys = 0;
  for (int i = 0; i < c.nreq; i++) {
    c.nnew[i] = cli_int(r, 0, 3) == 0 ? cli_int(r, 1, KVA_MAX_DECODE_Q) : cli_int(r, 1, 2);
    c.prefix[i] = cli_int(r, 0, 5) == 0 ? 0 : cli_int(r, 1, small ? 100 : 1500);
    rows_keys += (long long)c.nnew[i] * c.hq * (c.prefix[i] + c.nnew[i]);
  }
  while (rows_keys > REF_BUDGET) { /* shorter prefixes keep the reference quick */
    rows_keys = 0;
    for (int i = 0; i < c.nreq; i++) {
      c.prefix[i] /= 2;
      rows_keys += (long long)c.nnew[i] * c.hq * (c.prefix[i] + c.nnew[i]);
    }
  }
  c.kv_dtype = kvt[cli_int(r, 0, 2)];
  c.q_dtype = qt[cli_int(r, 0, 2)];
  c.src_dtype = qt[cli_int(r, 0, 2)];
  c.layer = cli_int(r, 0, NLAYERS - 1);
  if (c.kv_dtype == KVA_FP8_E4M3) { /* as the MHA cases: one in eight clips */
    c.saturating = cli_int(r, 0, 7) == 0;
    c.k_scale = c.saturating ? 0.0012f + 0.0008f * rand01(r) : 0.0025f + 0.0225f * rand01(r);
  }
  c.ap = kva_attn_params_default();
  c.ap.causal = cli_int(r, 0, 4) != 0;
  /* custom scales around the default 1/sqrt(576) = 0.042 (up to 2x) */
  if (cli_int(r, 0, 3) == 0) c.ap.sm_scale = 0.01f + 0.073f * rand01(r);
  c.want_lse = cli_int(r, 0, 1);
  c.workers = workers[cli_int(r, 0, 7)];
  c.split_block = blocks[cli_int(r, 0, 7)];
  return c;
}

static void describe(const mla_case *c, char *buf, size_t n) {
  int k = snprintf(buf, n,
                   "mla nreq=%d page=%d heads=%d:1 kv=%s src=%s q=%s causal=%d sm_scale=%g "
                   "lse=%d workers=%d block=%d layer=%d",
                   c->nreq, c->page_size, c->hq, kva_dtype_name(c->kv_dtype),
                   kva_dtype_name(c->src_dtype), kva_dtype_name(c->q_dtype), c->ap.causal,
                   (double)c->ap.sm_scale, c->want_lse, c->workers, c->split_block, c->layer);
  if (c->kv_dtype == KVA_FP8_E4M3 && k > 0 && (size_t)k < n)
    k += snprintf(buf + k, n - (size_t)k, " scale=%.4g%s", (double)c->k_scale,
                  c->saturating ? " (saturating)" : "");
  for (int i = 0; i < c->nreq && k > 0 && (size_t)k < n; i++)
    k += snprintf(buf + k, n - (size_t)k, "%s%d+%d", i ? " " : " lens=", c->prefix[i],
                  c->nnew[i]);
}

typedef struct {
  kva_context *ctx;
  kva_plan *plan;
  kva_pool *pool;
  void *dev, *host;  /* latent staging, device and host (src dtype) */
} env;

/* Plans the batch and stores random latents into every layer; `keep` gets
 * the attended layer's values as sent (f32), request by request. */
static kva_status store_step(env *e, const mla_case *c, cli_rng *r, int nb, const int32_t *bs,
                             const int32_t *bc, const int32_t *bn, float *const *keep) {
  kva_batch b = {nb, bs, bc, bn};
  kva_status st = kva_plan_update(e->plan, &b);
  if (st != KVA_OK) return st;
  size_t n = 0;
  for (int i = 0; i < nb; i++) n += (size_t)bn[i] * D;
  for (int l = 0; l < NLAYERS && st == KVA_OK; l++) {
    size_t off = 0;
    for (int i = 0; i < nb; i++)
      for (size_t x = 0; x < (size_t)bn[i] * D; x++, off++) {
        kva_store_f32(e->host, off, c->src_dtype, cli_uniform(r));
        if (l == c->layer) keep[i][(size_t)bc[i] * D + x] = kva_load_f32(e->host, off, c->src_dtype);
      }
    if ((st = kva_copy_to_device(e->ctx, e->dev, e->host, n * kva_dtype_size(c->src_dtype))) ==
        KVA_OK)
      st = kva_store_kv(e->plan, e->pool, l, e->dev, NULL, c->src_dtype);
  }
  return st;
}

int check_mla_case(kva_context *ctx, cli_rng *r, int small, int verbose, worst_errors *worst) {
  mla_case c = draw(r, small);
  char desc[600];
  describe(&c, desc, sizeof(desc));
  int total_new = 0, total_len = 0, max_len = 0, pages = 0, slots[MAXREQ];
  int32_t cached[MAXREQ], nnew[MAXREQ], bs[MAXREQ], bc[MAXREQ], bn[MAXREQ];
  float *orig[MAXREQ] = {0}, *stored[MAXREQ] = {0};
  for (int i = 0; i < c.nreq; i++) {
    int len = c.prefix[i] + c.nnew[i];
    cached[i] = c.prefix[i], nnew[i] = c.nnew[i];
    total_new += c.nnew[i], total_len += len;
    max_len = len > max_len ? len : max_len;
    pages += (len + c.page_size - 1) / c.page_size;
    orig[i] = (float *)malloc((size_t)len * D * sizeof(float));
  }
  size_t nq = (size_t)total_new * c.hq, qsz = kva_dtype_size(c.q_dtype);
  env e = {ctx, NULL, NULL, NULL, NULL};
  kva_req_table *table = NULL;
  void *dq = NULL, *dout = NULL, *hq_buf = malloc(nq * D * qsz), *ho = malloc(nq * DV * qsz);
  float *dlse = NULL, *qf = (float *)malloc(nq * D * 4), *of = (float *)malloc(nq * DV * 4);
  float *lsef = (float *)malloc(nq * 4);
  double *ref = (double *)malloc(nq * DV * 8), *ref_lse = (double *)malloc(nq * 8), *ref2 = NULL;
  kva_status st;
  char why[300] = "";
  int fail = 1;
  e.host = malloc((size_t)total_len * D * 4);
#define T(call)                                                                           \
  do {                                                                                    \
    if ((st = (call)) != KVA_OK) {                                                        \
      snprintf(why, sizeof(why), "%s -> %s: %s", #call, kva_strerror(st), kva_last_error()); \
      goto out;                                                                           \
    }                                                                                     \
  } while (0)
  kva_pool_config pc = {KVA_LAYOUT_MLA, NLAYERS, pages + 4, c.page_size, 1, D, c.kv_dtype};
  T(kva_pool_create(ctx, &pc, &e.pool));
  if (c.kv_dtype == KVA_FP8_E4M3)
    for (int l = 0; l < NLAYERS; l++)
      T(kva_pool_set_scale(e.pool, l, l == c.layer ? c.k_scale : 0.01f + 0.01f * rand01(r), 1.0f));
  T(kva_req_table_create(e.pool, c.nreq, max_len + 8, &table));
  kva_plan_config plc = {c.nreq, total_len, c.hq, c.workers, c.split_block, 0};
  T(kva_plan_create(table, &plc, &e.plan));
  T(kva_malloc(ctx, (size_t)total_len * D * 4, &e.dev));
  /* cached prefixes as one extend batch (store only; MLA attention is decode) */
  int nb = 0;
  float *keep[MAXREQ];
  for (int i = 0; i < c.nreq; i++) {
    T(kva_req_alloc(table, &slots[i]));
    if (c.prefix[i] == 0) continue;
    T(kva_req_append(table, slots[i], c.prefix[i]));
    bs[nb] = slots[i], bc[nb] = 0, bn[nb] = c.prefix[i], keep[nb++] = orig[i];
  }
  if (nb > 0) T(store_step(&e, &c, r, nb, bs, bc, bn, keep));
  for (int i = 0; i < c.nreq; i++) {
    T(kva_req_append(table, slots[i], c.nnew[i]));
    bs[i] = slots[i], bc[i] = cached[i], bn[i] = nnew[i], keep[i] = orig[i];
  }
  T(store_step(&e, &c, r, c.nreq, bs, bc, bn, keep));

  cli_fill_random(r, hq_buf, nq * D, c.q_dtype, 2.0f);
  cli_to_f32(hq_buf, nq * D, c.q_dtype, qf);
  T(kva_malloc(ctx, nq * D * qsz, &dq));
  T(kva_malloc(ctx, nq * DV * qsz, &dout));
  T(kva_malloc(ctx, nq * 4, (void **)&dlse));
  T(kva_copy_to_device(ctx, dq, hq_buf, nq * D * qsz));
  cli_fill_nan(ho, nq * DV, c.q_dtype); /* poison O and LSE */
  T(kva_copy_to_device(ctx, dout, ho, nq * DV * qsz));
  cli_fill_nan(lsef, nq, KVA_F32);
  T(kva_copy_to_device(ctx, dlse, lsef, nq * 4));
  T(kva_attention(e.plan, e.pool, c.layer, &c.ap, dq, dout, c.want_lse ? dlse : NULL, c.q_dtype));
  T(kva_synchronize(ctx));
  T(kva_copy_to_host(ctx, ho, dout, nq * DV * qsz));
  cli_to_f32(ho, nq * DV, c.q_dtype, of);
  T(kva_copy_to_host(ctx, lsef, dlse, nq * 4));

  /* the pool's stored latents, each element checked against correct rounding */
  double store_worst = 0;
  for (int i = 0; i < c.nreq; i++) {
    int len = c.prefix[i] + c.nnew[i];
    T(kva_ref_read_request_kv(e.pool, table, slots[i], c.layer, len, &stored[i], NULL));
    for (size_t x = 0; x < (size_t)len * D; x++) {
      double err = fabs((double)stored[i][x] - orig[i][x]);
      double allowed = check_allowed_store_error(orig[i][x], c.kv_dtype, c.k_scale);
      double ratio = allowed > 0 ? err / allowed : (err == 0 ? 0 : INFINITY);
      if (!(ratio <= 1.0)) {
        snprintf(why, sizeof(why),
                 "stored latent of request %d position %d elem %d: %.9g (sent %.9g) not "
                 "correctly rounded",
                 i, (int)(x / D), (int)(x % D), (double)stored[i][x], (double)orig[i][x]);
        goto out;
      }
      if (ratio > store_worst) store_worst = ratio;
    }
  }
  if (store_worst > worst->store) worst->store = store_worst;

  kva_ref_mla_attention(c.nreq, cached, nnew, c.hq, &c.ap, qf, (const float *const *)stored, ref,
                        ref_lse);
  double err = kva_ref_rel_error(ref, of, nq * DV), lerr = 0, e2 = 0;
  double tol = c.q_dtype == KVA_F32 ? TOL_O_F32 : TOL_O_16;
  double ltol = c.q_dtype == KVA_F32 ? TOL_LSE_F32 : TOL_LSE_16;
  fail = 0;
  if (!(err < tol)) {
    printf("FAIL %s: O rel error %.3g >= %.0e vs reference on stored latents\n", desc, err, tol);
    fail = 1;
  }
  if (err > worst->o || isnan(err)) worst->o = err;
  if (c.want_lse) {
    lerr = kva_ref_max_abs_error(ref_lse, lsef, nq);
    if (!(lerr < ltol)) {
      printf("FAIL %s: LSE max abs error %.3g >= %.0e\n", desc, lerr, ltol);
      fail = 1;
    }
    if (lerr > worst->lse || isnan(lerr)) worst->lse = lerr;
  } else {
    int untouched = 1;
    for (size_t i = 0; i < nq; i++) untouched &= isnan(lsef[i]) != 0;
    if (!untouched) {
      printf("FAIL %s: LSE written although NULL was passed\n", desc);
      fail = 1;
    }
  }
  if (c.kv_dtype == KVA_FP8_E4M3 && !c.saturating) { /* e4m3 itself, as the MHA cases */
    ref2 = (double *)malloc(nq * DV * 8);
    kva_ref_mla_attention(c.nreq, cached, nnew, c.hq, &c.ap, qf, (const float *const *)orig, ref2,
                          NULL);
    if (check_fp8_end_to_end(desc, "latents", ref2, of, nq * DV, c.ap.sm_scale, D, worst, &e2))
      fail = 1;
  }
  if (verbose && !fail)
    printf("ok %s: O %.3g LSE %.3g fp8-e2e %.3g store %.2f\n", desc, err, lerr, e2, store_worst);
out:
  if (why[0]) printf("FAIL %s: %s\n", desc, why);
#undef T
  for (int i = 0; i < c.nreq; i++) free(orig[i]), free(stored[i]);
  free(hq_buf), free(ho), free(qf), free(of), free(lsef), free(ref), free(ref_lse), free(ref2);
  free(e.host);
  kva_free(ctx, dq), kva_free(ctx, dout), kva_free(ctx, dlse), kva_free(ctx, e.dev);
  kva_plan_destroy(e.plan);
  kva_req_table_destroy(table);
  if (e.pool && !fail && kva_pool_num_free_pages(e.pool) != pc.num_pages) {
    printf("FAIL %s: %d pages leaked after releasing every request\n", desc,
           pc.num_pages - kva_pool_num_free_pages(e.pool));
    fail = 1;
  }
  kva_pool_destroy(e.pool);
  return fail;
}
