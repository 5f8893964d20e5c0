/* MLA decode on the CPU backend against the double reference: page sizes,
 * q head counts, new tokens per request (causal and not), latent and Q/O
 * dtypes, custom sm_scale, LSE on/off, worker counts that split long
 * requests, on the AVX2 and the portable kernels; outputs NaN-poisoned.
 * Plus the MLA errors (window, soft-cap, extend, v given to store) and that
 * failures leave the pool and the outputs untouched. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_simd.h"
#include "ref/reference.h"
#include "testutil.h"

#define D KVA_MLA_HEAD_DIM
#define DV KVA_MLA_V_DIM
#define MAXR 6
#define LAYERS 2

static tu_rng g_rng = {0x3a1a5eedull};
static int g_avx2;

typedef struct {
  int nreq, prefix[MAXR], nnew[MAXR];
  int hq, page, threads, workers, split_block, want_lse, layer;
  kva_dtype kv_t, q_t, src_t;
  float k_scale;
  kva_attn_params ap;
} mcase;

static void describe(const mcase *c, char *buf, size_t n) {
  int off = snprintf(buf, n, "hq %d page %d kv %s q %s src %s thr %d wk %d blk %d causal %d "
                     "scale %g lse %d reqs",
                     c->hq, c->page, kva_dtype_name(c->kv_t), kva_dtype_name(c->q_t),
                     kva_dtype_name(c->src_t), c->threads, c->workers, c->split_block,
                     c->ap.causal, (double)c->ap.sm_scale, c->want_lse);
  for (int r = 0; r < c->nreq && off > 0 && (size_t)off < n; r++)
    off += snprintf(buf + off, n - (size_t)off, " %d+%d", c->prefix[r], c->nnew[r]);
}

/* Plans the batch and stores random latents (src dtype) into every layer. */
static kva_status store_step(kva_plan *plan, kva_pool *pool, const mcase *c, int nreq,
                             const int32_t *slots, const int32_t *cached, const int32_t *nnew) {
  kva_batch b = {nreq, slots, cached, nnew};
  kva_status st = kva_plan_update(plan, &b);
  if (st != KVA_OK) return st;
  size_t n = 0;
  for (int i = 0; i < nreq; i++) n += (size_t)nnew[i] * D;
  void *buf = malloc(n * kva_dtype_size(c->src_t));
  if (!buf) return KVA_ERR_OUT_OF_MEMORY;
  for (int l = 0; l < LAYERS && st == KVA_OK; l++) {
    for (size_t i = 0; i < n; i++) kva_store_f32(buf, i, c->src_t, tu_uniform(&g_rng));
    st = kva_store_kv(plan, pool, l, buf, NULL, c->src_t);
  }
  free(buf);
  return st;
}

static void run_case(const mcase *c, int simd) {
  char desc[300];
  describe(c, desc, sizeof(desc));
  kva_context *ctx = tu_cpu_context(c->threads);
  if (!ctx) {
    CHECK(0, "%s: no context", desc);
    return;
  }
  CHECK_STATUS(kva_cpu_set_simd(ctx, simd), KVA_OK);
  int total_new = 0, max_len = 0, pages = 0;
  for (int r = 0; r < c->nreq; r++) {
    int len = c->prefix[r] + c->nnew[r];
    total_new += c->nnew[r];
    if (len > max_len) max_len = len;
    pages += (len + c->page - 1) / c->page;
  }
  kva_pool *pool = tu_pool(ctx, KVA_LAYOUT_MLA, LAYERS, pages + 2, c->page, 1, D, c->kv_t);
  kva_req_table *tab = NULL;
  kva_plan *plan = NULL;
  int maxq = 0;
  for (int r = 0; r < c->nreq; r++) maxq += c->prefix[r] > c->nnew[r] ? c->prefix[r] : c->nnew[r];
  kva_plan_config pc = {c->nreq, maxq, c->hq, c->workers, c->split_block, 0};
  int32_t slots[MAXR], cached[MAXR], nnew[MAXR], zero[MAXR];
  size_t nq = (size_t)total_new * c->hq, esz = kva_dtype_size(c->q_t);
  void *q = malloc(nq * D * esz), *o = malloc(nq * DV * esz);
  float *qf = (float *)malloc(nq * D * 4), *of = (float *)malloc(nq * DV * 4);
  float *lse = (float *)malloc(nq * 4), *lat[MAXR] = {0};
  double *ref = (double *)malloc(nq * DV * 8), *ref_lse = (double *)malloc(nq * 8);
  if (!pool || kva_req_table_create(pool, c->nreq, max_len, &tab) != KVA_OK ||
      kva_plan_create(tab, &pc, &plan) != KVA_OK) {
    CHECK(0, "%s: setup: %s", desc, kva_last_error());
    goto out;
  }
  if (c->kv_t == KVA_FP8_E4M3)
    for (int l = 0; l < LAYERS; l++)
      CHECK_STATUS(kva_pool_set_scale(pool, l, l == c->layer ? c->k_scale : 0.02f, 1.0f), KVA_OK);
  /* prefixes as one extend batch (store only), then the decode step */
  int np = 0;
  int32_t ps[MAXR], pl[MAXR];
  for (int r = 0; r < c->nreq; r++) {
    int s;
    CHECK_STATUS(kva_req_alloc(tab, &s), KVA_OK);
    slots[r] = s, zero[r] = 0, cached[r] = c->prefix[r], nnew[r] = c->nnew[r];
    if (c->prefix[r] > 0) {
      CHECK_STATUS(kva_req_append(tab, s, c->prefix[r]), KVA_OK);
      ps[np] = s, pl[np++] = c->prefix[r];
    }
  }
  if (np > 0) CHECK_STATUS(store_step(plan, pool, c, np, ps, zero, pl), KVA_OK);
  for (int r = 0; r < c->nreq; r++) CHECK_STATUS(kva_req_append(tab, slots[r], nnew[r]), KVA_OK);
  CHECK_STATUS(store_step(plan, pool, c, c->nreq, slots, cached, nnew), KVA_OK);

  for (size_t i = 0; i < nq * D; i++) kva_store_f32(q, i, c->q_t, 2.0f * tu_uniform(&g_rng));
  for (size_t i = 0; i < nq * D; i++) qf[i] = kva_load_f32(q, i, c->q_t);
  for (size_t i = 0; i < nq * DV; i++) kva_store_f32(o, i, c->q_t, NAN);
  tu_poison(lse, nq);
  CHECK_STATUS(kva_attention(plan, pool, c->layer, &c->ap, q, o, c->want_lse ? lse : NULL, c->q_t),
               KVA_OK);
  for (size_t i = 0; i < nq * DV; i++) of[i] = kva_load_f32(o, i, c->q_t);

  for (int r = 0; r < c->nreq; r++)
    CHECK_STATUS(kva_ref_read_request_kv(pool, tab, slots[r], c->layer, cached[r] + nnew[r],
                                         &lat[r], NULL),
                 KVA_OK);
  for (int r = 0; r < c->nreq; r++)
    if (!lat[r]) goto out;
  kva_ref_mla_attention(c->nreq, cached, nnew, c->hq, &c->ap, qf, (const float *const *)lat, ref,
                        ref_lse);
  double err = kva_ref_rel_error(ref, of, nq * DV), tol = c->q_t == KVA_F32 ? 1e-5 : 1e-2;
  CHECK(err < tol, "%s simd %d: O rel error %.3g >= %.0e", desc, simd, err, tol);
  tu_check_lse(desc, c->want_lse, ref_lse, lse, nq);
out:
  for (int r = 0; r < MAXR; r++) free(lat[r]);
  free(q), free(o), free(qf), free(of), free(lse), free(ref), free(ref_lse);
  kva_plan_destroy(plan);
  kva_req_table_destroy(tab);
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
}

static mcase base_case(void) {
  mcase c;
  memset(&c, 0, sizeof(c));
  c.nreq = 1;
  c.prefix[0] = 100;
  c.nnew[0] = 1;
  c.hq = 16;
  c.page = 64;
  c.threads = 2;
  c.want_lse = 1;
  c.layer = 1;
  c.kv_t = KVA_BF16;
  c.q_t = KVA_F32;
  c.src_t = KVA_F32;
  c.k_scale = 1.0f;
  c.ap = kva_attn_params_default();
  return c;
}

/* Fixed shapes that each exercise one thing, then random ones. */
static void test_correctness(void) {
  static const kva_dtype kvt[3] = {KVA_BF16, KVA_F16, KVA_FP8_E4M3};
  static const kva_dtype act[3] = {KVA_F32, KVA_F16, KVA_BF16};
  for (int simd = 0; simd <= g_avx2; simd++) {
    mcase c = base_case();
    run_case(&c, simd); /* one token, one request */
    c.prefix[0] = 3000, c.workers = 7, c.split_block = 64; /* one long request split 7 ways */
    run_case(&c, simd);
    c.nnew[0] = 2, c.hq = 128; /* FlashMLA's s_q 2, h_q 128 */
    run_case(&c, simd);
    c.ap.causal = 0; /* both tokens see every key */
    run_case(&c, simd);
    c = base_case();
    c.nreq = 3, c.prefix[1] = 0, c.nnew[1] = 8, c.prefix[2] = 65, c.nnew[2] = 5;
    c.page = 1, c.hq = 32, c.want_lse = 0, c.ap.sm_scale = 0.11f;
    run_case(&c, simd);
    c.kv_t = KVA_FP8_E4M3, c.k_scale = 0.004f, c.q_t = KVA_BF16, c.page = 7;
    run_case(&c, simd);
    for (int it = 0; it < 12; it++) {
      static const int pages[] = {64, 16, 1, 7, 128, 33};
      static const int heads[] = {16, 32, 64, 128, 8, 20};
      static const int workers[] = {0, 1, 3, 16};
      c = base_case();
      c.nreq = tu_int(&g_rng, 1, MAXR);
      for (int r = 0; r < c.nreq; r++) {
        c.prefix[r] = tu_int(&g_rng, 0, 3) == 0 ? 0 : tu_int(&g_rng, 1, 900);
        c.nnew[r] = tu_int(&g_rng, 0, 2) == 0 ? tu_int(&g_rng, 1, 8) : tu_int(&g_rng, 1, 2);
      }
      c.hq = heads[tu_int(&g_rng, 0, 5)];
      c.page = pages[tu_int(&g_rng, 0, 5)];
      c.threads = tu_int(&g_rng, 1, 3);
      c.workers = workers[tu_int(&g_rng, 0, 3)];
      c.split_block = tu_int(&g_rng, 0, 1) ? 0 : 32 * tu_int(&g_rng, 1, 4);
      c.kv_t = kvt[tu_int(&g_rng, 0, 2)];
      c.q_t = act[tu_int(&g_rng, 0, 2)];
      c.src_t = act[tu_int(&g_rng, 0, 2)];
      c.k_scale = 0.003f + 0.02f * (tu_uniform(&g_rng) + 1.0f) * 0.5f;
      c.want_lse = tu_int(&g_rng, 0, 1);
      c.layer = tu_int(&g_rng, 0, LAYERS - 1);
      c.ap.causal = tu_int(&g_rng, 0, 3) != 0;
      if (tu_int(&g_rng, 0, 3) == 0) c.ap.sm_scale = 0.03f + 0.1f * (tu_uniform(&g_rng) + 1.0f);
      run_case(&c, simd);
    }
  }
}

/* MLA plans walk the requests in the packed order (longest first): the
 * plan's sched_order is a permutation that starts with the longest, and
 * every worker's range is a run of it (test_correctness checked the
 * output of such plans). */
static void test_sched_order(void) {
  kva_context *ctx = tu_cpu_context(2);
  kva_pool *pool = tu_pool(ctx, KVA_LAYOUT_MLA, 1, 64, 16, 1, D, KVA_BF16);
  kva_plan *plan = NULL;
  if (!pool) {
    CHECK(0, "setup: %s", kva_last_error());
    goto out;
  }
  kva_plan_config pc = {5, 5, 16, 4, 16, 0};
  CHECK_STATUS(kva_plan_create_paged(pool, &pc, 16, &plan), KVA_OK);
  int32_t nn[5] = {1, 1, 1, 1, 1}, cs[5] = {40, 250, 17, 130, 90}, pt[5 * 16];
  for (int i = 0; i < 5 * 16; i++) pt[i] = i % 64;
  kva_paged_batch b = {5, nn, cs, pt, 16};
  CHECK_STATUS(kva_plan_update_paged(plan, &b), KVA_OK);
  kva_plan_info info;
  CHECK_STATUS(kva_plan_get_info(plan, &info), KVA_OK);
  int seen = 0;
  for (int i = 0; i < 5; i++) seen |= 1 << info.sched_order[i];
  CHECK(seen == 31, "sched_order is not a permutation of 0..4");
  CHECK(info.sched_order[0] == 1, "sched_order[0] = %d, want the longest (1)", info.sched_order[0]);
out:
  kva_plan_destroy(plan);
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
}

/* The plan really splits a long request over the workers (so the combine
 * ran in test_correctness) and the scratch covers 8 tokens x 128 heads. */
static void test_split_and_capacity(void) {
  kva_context *ctx = tu_cpu_context(2);
  kva_pool *pool = tu_pool(ctx, KVA_LAYOUT_MLA, 1, 64, 64, 1, D, KVA_BF16);
  kva_req_table *tab = NULL;
  kva_plan *plan = NULL;
  if (!pool || kva_req_table_create(pool, 1, 4096, &tab) != KVA_OK) {
    CHECK(0, "setup: %s", kva_last_error());
    goto out;
  }
  kva_plan_config pc = {1, 8, 128, 7, 64, 0};
  CHECK_STATUS(kva_plan_create(tab, &pc, &plan), KVA_OK);
  int s;
  CHECK_STATUS(kva_req_alloc(tab, &s), KVA_OK);
  CHECK_STATUS(kva_req_append(tab, s, 3000), KVA_OK);
  int32_t sl[1] = {s}, ca[1] = {2992}, nn[1] = {8};
  kva_batch b = {1, sl, ca, nn};
  CHECK_STATUS(kva_plan_update(plan, &b), KVA_OK);
  kva_plan_info info;
  CHECK_STATUS(kva_plan_get_info(plan, &info), KVA_OK);
  CHECK(info.num_splits_total == 7, "3000 keys over 7 workers: %d splits", info.num_splits_total);
  size_t nq = (size_t)8 * 128;
  float *q = (float *)malloc(nq * D * 4), *o = (float *)malloc(nq * DV * 4);
  for (size_t i = 0; i < nq * D; i++) q[i] = tu_uniform(&g_rng);
  tu_poison(o, nq * DV);
  kva_attn_params ap = kva_attn_params_default();
  CHECK_STATUS(kva_attention(plan, pool, 0, &ap, q, o, NULL, KVA_F32), KVA_OK);
  int finite = 1;
  for (size_t i = 0; i < nq * DV; i++) finite &= isfinite(o[i]) != 0;
  CHECK(finite, "8 tokens x 128 heads: O has non-finite values");
  free(q), free(o);
out:
  kva_plan_destroy(plan);
  kva_req_table_destroy(tab);
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
}

/* Failing calls name the problem and change neither the pool nor O/LSE. */
static void test_errors(void) {
  kva_context *ctx = tu_cpu_context(2);
  kva_pool *pool = tu_pool(ctx, KVA_LAYOUT_MLA, 1, 8, 16, 1, D, KVA_BF16);
  kva_req_table *tab = NULL;
  kva_plan *plan = NULL;
  if (!pool || kva_req_table_create(pool, 2, 100, &tab) != KVA_OK) {
    CHECK(0, "setup: %s", kva_last_error());
    goto out;
  }
  kva_plan_config pc = {2, 40, 16, 0, 0, 0};
  CHECK_STATUS(kva_plan_create(tab, &pc, &plan), KVA_OK);
  int s;
  CHECK_STATUS(kva_req_alloc(tab, &s), KVA_OK);
  CHECK_STATUS(kva_req_append(tab, s, 40), KVA_OK);
  int32_t sl[1] = {s}, ca[1] = {0}, nn[1] = {40};
  kva_batch b = {1, sl, ca, nn};
  CHECK_STATUS(kva_plan_update(plan, &b), KVA_OK);
  float *lat = (float *)malloc((size_t)40 * D * 4);
  for (int i = 0; i < 40 * D; i++) lat[i] = tu_uniform(&g_rng);
  CHECK_STATUS(kva_store_kv(plan, pool, 0, lat, NULL, KVA_F32), KVA_OK);

  /* snapshot of the pool, to show failures leave it alone */
  void *kb = NULL, *vb = NULL;
  CHECK_STATUS(kva_pool_get_buffers(pool, 0, &kb, &vb), KVA_OK);
  CHECK(vb == NULL, "MLA pool has a V buffer");
  size_t pool_bytes = (size_t)8 * 16 * D * 2;
  void *snap = malloc(pool_bytes);
  memcpy(snap, kb, pool_bytes);

  /* store with v given: INVALID_ARGUMENT, pool unchanged */
  for (int i = 0; i < 40 * D; i++) lat[i] = tu_uniform(&g_rng);
  CHECK_STATUS(kva_store_kv(plan, pool, 0, lat, lat, KVA_F32), KVA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(kva_last_error(), "v must be NULL") != NULL, "message: %s", kva_last_error());

  /* attention of an extend request (40 new tokens): UNSUPPORTED */
  float *q = (float *)malloc((size_t)40 * 16 * D * 4), *o = (float *)malloc((size_t)40 * 16 * DV * 4);
  float lse[40 * 16];
  for (int i = 0; i < 40 * 16 * D; i++) q[i] = tu_uniform(&g_rng);
  tu_poison(o, (size_t)40 * 16 * DV);
  tu_poison(lse, 40 * 16);
  kva_attn_params ap = kva_attn_params_default();
  CHECK_STATUS(kva_attention(plan, pool, 0, &ap, q, o, lse, KVA_F32), KVA_ERR_UNSUPPORTED);
  CHECK(strstr(kva_last_error(), "decode only") != NULL, "message: %s", kva_last_error());

  /* a decode step: window and soft-cap are UNSUPPORTED */
  CHECK_STATUS(kva_req_append(tab, s, 1), KVA_OK);
  ca[0] = 40, nn[0] = 1;
  CHECK_STATUS(kva_plan_update(plan, &b), KVA_OK);
  kva_attn_params wp = ap;
  wp.window_left = 8;
  CHECK_STATUS(kva_attention(plan, pool, 0, &wp, q, o, lse, KVA_F32), KVA_ERR_UNSUPPORTED);
  CHECK(strstr(kva_last_error(), "sliding window") != NULL, "message: %s", kva_last_error());
  kva_attn_params cp = ap;
  cp.logit_softcap = 30.0f;
  CHECK_STATUS(kva_attention(plan, pool, 0, &cp, q, o, lse, KVA_F32), KVA_ERR_UNSUPPORTED);
  CHECK(strstr(kva_last_error(), "soft-cap") != NULL, "message: %s", kva_last_error());
  int untouched = 1;
  for (int i = 0; i < 40 * 16 * DV; i++) untouched &= isnan(o[i]) != 0;
  for (int i = 0; i < 40 * 16; i++) untouched &= isnan(lse[i]) != 0;
  CHECK(untouched, "a failing MLA attention wrote O or LSE");
  CHECK(memcmp(snap, kb, pool_bytes) == 0, "a failing MLA call changed the pool");
  /* and the same step without them runs */
  CHECK_STATUS(kva_attention(plan, pool, 0, &ap, q, o, lse, KVA_F32), KVA_OK);
  CHECK(isfinite(o[0]) && isfinite(lse[15]), "MLA decode left NaN");
  free(snap), free(lat), free(q), free(o);
out:
  kva_plan_destroy(plan);
  kva_req_table_destroy(tab);
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
}

int main(void) {
  g_avx2 = kva_cpu_has_avx2();
  test_correctness();
  test_split_and_capacity();
  test_sched_order();
  test_errors();
  return tu_summary("test_mla");
}
