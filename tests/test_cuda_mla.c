/* MLA decode on the CUDA backend against the double-precision reference
 * (kva_ref_mla_attention): random latents stored with kva_store_kv, random
 * Q, NaN-poisoned O and LSE before every run. Cases: h_q 16..128, 1..8 new
 * tokens per request (causal and not), varlen with lengths off the 64
 * grid, page sizes 64/16/1, bf16/f16/fp8 latents, b = 1 long context split
 * over every worker, forced small splits, f32 and mixed-type Q/O (the
 * CUDA-core fallback), and CUDA graphs (bf16 and fp8 latents) captured
 * once and replayed for two different batches. Prints "SKIP: no CUDA
 * device" and exits 77 without a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "ref/reference.h"
#include "testutil.h"

#define D KVA_MLA_HEAD_DIM
#define DV KVA_MLA_V_DIM

static tu_rng rng = {20261122};

typedef struct mla_case {
  const char *name;
  int page, hq, causal;
  float sm_scale;
  kva_dtype qt, kvt;
  int nreq;
  const int *cached, *fresh;
  int workers, split_block; /* 0 = defaults */
  int with_lse;
} mla_case;

typedef struct world {
  kva_context *ctx;
  kva_pool *pool;
  kva_req_table *tab;
  int32_t *slots;
  int nreq;
} world;

static void world_free(world *w) {
  kva_req_table_destroy(w->tab);
  kva_pool_destroy(w->pool);
  free(w->slots);
  memset(w, 0, sizeof *w);
}

/* Pool, table and requests holding cached + fresh tokens each, all of their
 * latents stored (one prefill-shaped batch) from random f32 values. */
static int world_make(world *w, kva_context *ctx, const mla_case *c) {
  memset(w, 0, sizeof *w);
  w->ctx = ctx;
  w->nreq = c->nreq;
  int pages = 3, max_len = 1, total = 0;
  for (int r = 0; r < c->nreq; r++) {
    const int len = c->cached[r] + c->fresh[r];
    pages += (len + c->page - 1) / c->page;
    if (len > max_len) max_len = len;
    total += len;
  }
  kva_pool_config pc = {KVA_LAYOUT_MLA, 1, pages, c->page, 1, D, c->kvt};
  CHECK_STATUS(kva_pool_create(ctx, &pc, &w->pool), KVA_OK);
  if (!w->pool) return 0;
  /* a v_scale the kernels must not use: MLA's V is the latent (k_scale) */
  if (c->kvt == KVA_FP8_E4M3) CHECK_STATUS(kva_pool_set_scale(w->pool, 0, 0.03f, 7.0f), KVA_OK);
  CHECK_STATUS(kva_req_table_create(w->pool, c->nreq, max_len, &w->tab), KVA_OK);
  if (!w->tab) return 0;
  w->slots = calloc((size_t)c->nreq, sizeof(int32_t));
  int32_t *zero = calloc((size_t)c->nreq, sizeof(int32_t)), *lens = calloc((size_t)c->nreq, 4);
  for (int r = 0; r < c->nreq; r++) {
    CHECK_STATUS(kva_req_alloc(w->tab, &w->slots[r]), KVA_OK);
    lens[r] = c->cached[r] + c->fresh[r];
    CHECK_STATUS(kva_req_append(w->tab, w->slots[r], lens[r]), KVA_OK);
  }
  kva_plan_config sc = {c->nreq, total, c->hq, 0, 0, 0};
  kva_plan *sp = NULL;
  CHECK_STATUS(kva_plan_create(w->tab, &sc, &sp), KVA_OK);
  kva_batch b = {c->nreq, w->slots, zero, lens};
  int ok = sp != NULL;
  if (ok) CHECK_STATUS(kva_plan_update(sp, &b), KVA_OK);
  float *h = malloc((size_t)total * D * sizeof(float));
  void *dk = NULL;
  tu_fill_uniform(&rng, h, (size_t)total * D, -2.0f, 2.0f);
  ok = ok && kva_malloc(ctx, (size_t)total * D * sizeof(float), &dk) == KVA_OK &&
       kva_copy_to_device(ctx, dk, h, (size_t)total * D * sizeof(float)) == KVA_OK;
  CHECK(ok, "%s: latent upload", c->name);
  if (ok) CHECK_STATUS(kva_store_kv(sp, w->pool, 0, dk, NULL, KVA_F32), KVA_OK);
  CHECK_STATUS(kva_synchronize(ctx), KVA_OK);
  kva_free(ctx, dk);
  free(h);
  kva_plan_destroy(sp);
  free(zero);
  free(lens);
  return ok;
}

/* Random Q of type qt on the device (its rounded values in *qf). */
static void *make_q(kva_context *ctx, size_t n, kva_dtype qt, float **qf) {
  const size_t es = kva_dtype_size(qt);
  unsigned char *hb = malloc(n * es);
  *qf = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    kva_store_f32(hb, i, qt, 1.5f * tu_uniform(&rng));
    (*qf)[i] = kva_load_f32(hb, i, qt);
  }
  void *d = NULL;
  if (kva_malloc(ctx, n * es, &d) == KVA_OK) kva_copy_to_device(ctx, d, hb, n * es);
  free(hb);
  return d;
}

/* O (type qt) and LSE poisoned with NaN on the device. */
static void poison(kva_context *ctx, void *o, size_t on, kva_dtype qt, float *lse, size_t ln) {
  const size_t es = kva_dtype_size(qt);
  unsigned char *hb = malloc(on * es);
  for (size_t i = 0; i < on; i++) kva_store_f32(hb, i, qt, nanf(""));
  CHECK_STATUS(kva_copy_to_device(ctx, o, hb, on * es), KVA_OK);
  free(hb);
  float *hl = malloc(ln * sizeof(float));
  tu_poison(hl, ln);
  CHECK_STATUS(kva_copy_to_device(ctx, lse, hl, ln * sizeof(float)), KVA_OK);
  free(hl);
}

/* Device O/LSE of the batch (cached, fresh) against the reference. */
static void check_against_ref(world *w, const mla_case *c, const kva_attn_params *ap,
                              const int32_t *cached, const int32_t *fresh, const float *qf,
                              const void *o, const float *lse, int with_lse, const char *what) {
  int total_q = 0;
  for (int r = 0; r < c->nreq; r++) total_q += fresh[r];
  const size_t on = (size_t)total_q * c->hq * DV, ln = (size_t)total_q * c->hq;
  float **lat = calloc((size_t)c->nreq, sizeof(float *));
  int ok = 1;
  for (int r = 0; r < c->nreq; r++)
    if (kva_ref_read_request_kv(w->pool, w->tab, w->slots[r], 0, cached[r] + fresh[r], &lat[r],
                                NULL) != KVA_OK)
      ok = 0;
  CHECK(ok, "%s: reading the latents back (%s)", what, kva_last_error());
  double *ro = malloc(on * sizeof(double)), *rl = malloc(ln * sizeof(double));
  float *og = malloc(on * sizeof(float)), *lg = malloc(ln * sizeof(float));
  const size_t es = kva_dtype_size(c->qt);
  unsigned char *ob = malloc(on * es);
  if (ok) {
    kva_ref_mla_attention(c->nreq, cached, fresh, c->hq, ap, qf, (const float *const *)lat, ro, rl);
    CHECK_STATUS(kva_copy_to_host(w->ctx, ob, o, on * es), KVA_OK);
    CHECK_STATUS(kva_copy_to_host(w->ctx, lg, lse, ln * sizeof(float)), KVA_OK);
    for (size_t i = 0; i < on; i++) og[i] = kva_load_f32(ob, i, c->qt);
    const double tol = c->qt == KVA_BF16 ? 6e-3 : c->qt == KVA_F16 ? 1e-3 : 1e-5;
    const double rel = kva_ref_rel_error(ro, og, on);
    CHECK(rel < tol, "%s: O vs reference: relative error %.3g (tolerance %.1g)", what, rel, tol);
    tu_check_lse(what, with_lse, rl, lg, ln);
  }
  for (int r = 0; r < c->nreq; r++) free(lat[r]);
  free(lat);
  free(ro);
  free(rl);
  free(og);
  free(lg);
  free(ob);
}

static void run_case(kva_context *ctx, const mla_case *c) {
  world w;
  if (!world_make(&w, ctx, c)) {
    CHECK(0, "%s: setup", c->name);
    world_free(&w);
    return;
  }
  int total_q = 0;
  int32_t *cached = calloc((size_t)c->nreq, 4), *fresh = calloc((size_t)c->nreq, 4);
  for (int r = 0; r < c->nreq; r++) {
    cached[r] = c->cached[r];
    fresh[r] = c->fresh[r];
    total_q += c->fresh[r];
  }
  kva_plan_config cfg = {c->nreq, total_q, c->hq, c->workers, c->split_block, 0};
  kva_plan *plan = NULL;
  CHECK_STATUS(kva_plan_create(w.tab, &cfg, &plan), KVA_OK);
  kva_batch b = {c->nreq, w.slots, cached, fresh};
  if (plan) CHECK_STATUS(kva_plan_update(plan, &b), KVA_OK);
  const size_t on = (size_t)total_q * c->hq * DV, ln = (size_t)total_q * c->hq;
  float *qf = NULL;
  void *q = make_q(ctx, (size_t)total_q * c->hq * D, c->qt, &qf), *o = NULL;
  float *lse = NULL;
  int ok = plan && q && kva_malloc(ctx, on * kva_dtype_size(c->qt), &o) == KVA_OK &&
           kva_malloc(ctx, ln * sizeof(float), (void **)&lse) == KVA_OK;
  CHECK(ok, "%s: buffers", c->name);
  if (ok) {
    kva_attn_params ap = kva_attn_params_default();
    ap.causal = c->causal;
    ap.sm_scale = c->sm_scale;
    /* twice against the reference (the split counters must be back at zero
     * after a run), then four more runs bitwise equal to the first:
     * whichever CTA completes a split request and merges it (before its
     * write, from smem weights or item by item), O and LSE are the same */
    const size_t ob = on * kva_dtype_size(c->qt);
    unsigned char *o0 = malloc(ob), *o1 = malloc(ob);
    float *l0 = malloc(ln * sizeof(float)), *l1 = malloc(ln * sizeof(float));
    CHECK(o0 && o1 && l0 && l1, "%s: host buffers for the repeat runs", c->name);
    for (int rep = 0; rep < 6 && o0 && o1 && l0 && l1; rep++) {
      poison(ctx, o, on, c->qt, lse, ln);
      CHECK_STATUS(kva_attention(plan, w.pool, 0, &ap, q, o, c->with_lse ? lse : NULL, c->qt),
                   KVA_OK);
      CHECK_STATUS(kva_synchronize(ctx), KVA_OK);
      if (rep < 2) check_against_ref(&w, c, &ap, cached, fresh, qf, o, lse, c->with_lse, c->name);
      CHECK_STATUS(kva_copy_to_host(ctx, rep ? o1 : o0, o, ob), KVA_OK);
      if (c->with_lse)
        CHECK_STATUS(kva_copy_to_host(ctx, rep ? l1 : l0, lse, ln * sizeof(float)), KVA_OK);
      if (rep > 0) {
        CHECK(memcmp(o0, o1, ob) == 0, "%s: run %d's O differs bitwise from run 1's", c->name,
              rep + 1);
        CHECK(!c->with_lse || memcmp(l0, l1, ln * sizeof(float)) == 0,
              "%s: run %d's LSE differs bitwise from run 1's", c->name, rep + 1);
      }
    }
    free(o0);
    free(o1);
    free(l0);
    free(l1);
  }
  kva_free(ctx, q);
  kva_free(ctx, o);
  kva_free(ctx, lse);
  free(qf);
  kva_plan_destroy(plan);
  free(cached);
  free(fresh);
  world_free(&w);
}

/* One graph captured for a bucket of 4 requests x up to 2 new tokens, then
 * replayed for two batches of different lengths (and sizes) through the same
 * Q/O/LSE buffers. bf16 latents at h64, or fp8 at h16 or h32 (v10's rows:
 * captured at 32 or 64 rows, a tile of 32 or 64; the replays take fewer). */
static void run_graph_case(kva_context *ctx, kva_dtype kvt, int hq) {
  static const int cached0[] = {3000, 70, 600, 1}, fresh0[] = {2, 2, 2, 2};
  const mla_case c = {kvt != KVA_FP8_E4M3 ? "graph bf16 p64 h64"
                      : hq == 16          ? "graph fp8 p64 h16"
                                          : "graph fp8 p64 h32",
                      64, hq, 1, 0.f, KVA_BF16, kvt, 4, cached0, fresh0, 0, 0, 1};
  world w;
  if (!world_make(&w, ctx, &c)) {
    CHECK(0, "graph: setup");
    world_free(&w);
    return;
  }
  kva_graph_config gc;
  memset(&gc, 0, sizeof gc);
  gc.max_batch = 4;
  gc.max_q_per_req = 2;
  gc.num_qo_heads = c.hq;
  kva_graph_state *gs = NULL;
  CHECK_STATUS(kva_graph_state_create(w.tab, &gc, &gs), KVA_OK);
  const size_t qcap = (size_t)4 * 2 * c.hq;
  float *qf = NULL, *lse = NULL;
  void *q = make_q(ctx, qcap * D, c.qt, &qf), *o = NULL;
  int ok = gs && q && kva_malloc(ctx, qcap * DV * 2, &o) == KVA_OK &&
           kva_malloc(ctx, qcap * sizeof(float), (void **)&lse) == KVA_OK;
  CHECK(ok, "graph: buffers");
  kva_attn_params ap = kva_attn_params_default();
  const int nb = ok ? kva_graph_num_buckets(gs) : 0;
  for (int bk = 0; ok && bk < nb; bk++) {
    CHECK_STATUS(kva_graph_begin_capture(gs, bk), KVA_OK);
    CHECK_STATUS(kva_attention(kva_graph_state_plan(gs), w.pool, 0, &ap, q, o, lse, c.qt), KVA_OK);
    CHECK_STATUS(kva_graph_end_capture(gs, bk), KVA_OK);
  }
  /* batch 1: all four requests, 2 new tokens each (their last two) */
  /* batch 2: requests 0 and 2 only, 1 new token (shorter views of them) */
  for (int step = 0; ok && step < 2; step++) {
    mla_case s = c;
    int32_t slots[4], cached[4], fresh[4];
    int n = 0;
    for (int r = 0; r < 4; r++) {
      if (step == 1 && (r & 1)) continue;
      slots[n] = w.slots[r];
      fresh[n] = step == 0 ? 2 : 1;
      cached[n] = c.cached[r] + 2 - fresh[n] - (step == 1 ? 1 : 0);
      n++;
    }
    s.nreq = n;
    kva_batch b = {n, slots, cached, fresh};
    int bucket = -1;
    CHECK_STATUS(kva_graph_prepare(gs, &b, &bucket), KVA_OK);
    poison(ctx, o, qcap * DV, c.qt, lse, qcap);
    CHECK_STATUS(kva_graph_replay(gs, bucket), KVA_OK);
    CHECK_STATUS(kva_synchronize(ctx), KVA_OK);
    /* the reference reads request r's first cached + fresh latents */
    world sub = w;
    sub.slots = slots;
    check_against_ref(&sub, &s, &ap, cached, fresh, qf, o, lse, 1,
                      step == 0 ? "graph replay, batch 1" : "graph replay, batch 2");
  }
  kva_free(ctx, q);
  kva_free(ctx, o);
  kva_free(ctx, lse);
  free(qf);
  kva_graph_state_destroy(gs);
  world_free(&w);
}

int main(void) {
  if (kva_device_available(KVA_DEVICE_CUDA) != KVA_OK) {
    printf("SKIP: no CUDA device (%s)\n", kva_last_error());
    printf("test_cuda_mla: SKIP: no CUDA device\n");
    return 77;
  }
  kva_context_config gc = {KVA_DEVICE_CUDA, 0, 0};
  kva_context *ctx = NULL;
  CHECK_STATUS(kva_context_create(&gc, &ctx), KVA_OK);
  if (!ctx) return tu_summary("test_cuda_mla");

  static const int c1[] = {20000}, f1[] = {1};
  static const int c1b[] = {9000}, f1b[] = {2};
  static const int c4[] = {4000, 1, 777, 64}, f4[] = {1, 1, 1, 1};
  static const int c3[] = {300, 17, 90}, f3[] = {8, 3, 5};
  static const int c2[] = {513, 40}, f2[] = {2, 2};
  static const int c5[] = {129, 0, 1000, 63, 2500}, f5[] = {2, 1, 2, 2, 1};
  /* 128 rows on five workers: requests cut in two, so v9's merge before the
   * write runs (the head ends its worker, the rest starts the next) */
  static const int c8[] = {700, 1500, 300, 900, 1200, 450, 2000, 800}, f8[] = {1, 1, 1, 1, 1, 1, 1, 1};
  static int cb[32], fb[32];
  for (int i = 0; i < 32; i++) {
    cb[i] = 61 * i + (i % 7) * 150;
    fb[i] = 1 + (i % 2);
  }
  const mla_case cases[] = {
      /* name, page, hq, causal, sm_scale, Q/O, latent, n, cached, new, W, blk, lse */
      {"b1 long bf16 p64 h16 splits", 64, 16, 1, 0.f, KVA_BF16, KVA_BF16, 1, c1, f1, 0, 0, 1},
      {"b1 long fp8 p64 h128 s2", 64, 128, 1, 0.f, KVA_BF16, KVA_FP8_E4M3, 1, c1b, f1b, 0, 0, 1},
      {"varlen bf16 p64 h64", 64, 64, 1, 0.f, KVA_BF16, KVA_BF16, 4, c4, f4, 0, 0, 1},
      {"h128 s2 bf16 p64", 64, 128, 1, 0.f, KVA_BF16, KVA_BF16, 5, c5, f5, 0, 0, 1},
      {"h32 s2 f16 p16 non-causal", 16, 32, 0, 0.f, KVA_F16, KVA_F16, 2, c2, f2, 0, 0, 1},
      {"h16 q1-8 f16+fp8 p1 small splits", 1, 16, 1, 0.07f, KVA_F16, KVA_FP8_E4M3, 3, c3, f3, 7,
       16, 1},
      {"h128 q1-8 bf16 p16 few workers", 16, 128, 1, 0.f, KVA_BF16, KVA_BF16, 3, c3, f3, 3, 64, 0},
      {"b32 h64 s1-2 bf16 p64", 64, 64, 1, 0.f, KVA_BF16, KVA_BF16, 32, cb, fb, 0, 0, 1},
      {"h128 s1 bf16 p64 two-chunk cuts", 64, 128, 1, 0.f, KVA_BF16, KVA_BF16, 8, c8, f8, 5, 64, 1},
      {"f32 Q/O fallback p64 h16", 64, 16, 1, 0.f, KVA_F32, KVA_BF16, 2, c2, f2, 0, 0, 1},
      {"f32 Q/O fallback fp8 p16 h32", 16, 32, 1, 0.f, KVA_F32, KVA_FP8_E4M3, 3, c3, f3, 0, 0, 1},
      {"f16 Q on a bf16 latent (fallback)", 64, 16, 1, 0.f, KVA_F16, KVA_BF16, 2, c2, f2, 0, 0, 1},
      /* sharp logits (base-2 spread ~25-35): later blocks move a row's max by
       * more than the kernels' online-max slack, others by less */
      {"varlen h64 bf16 p64 sharp", 64, 64, 1, 1.0f, KVA_BF16, KVA_BF16, 4, c4, f4, 0, 0, 1},
      {"h128 s2 f16 p64 sharp", 64, 128, 1, 0.7f, KVA_F16, KVA_F16, 5, c5, f5, 0, 0, 1},
      /* fp8 batches of <= 32 rows (v10: keys as M): 16 rows, 32 rows with
       * cut requests and merges, f16 Q with sharp logits, many requests */
      {"varlen fp8 p64 h16 s1", 64, 16, 1, 0.f, KVA_BF16, KVA_FP8_E4M3, 4, c4, f4, 0, 0, 1},
      {"fp8 p16 h16 s2 cuts", 16, 16, 1, 0.f, KVA_BF16, KVA_FP8_E4M3, 2, c2, f2, 5, 64, 1},
      {"varlen fp8 p64 h32 f16 sharp", 64, 32, 1, 0.6f, KVA_F16, KVA_FP8_E4M3, 4, c4, f4, 0, 0, 1},
      {"b32 h16 s1-2 fp8 p64", 64, 16, 1, 0.f, KVA_BF16, KVA_FP8_E4M3, 32, cb, fb, 0, 0, 0},
      /* fp8 batches of 33-64 rows (v10, one tile of 64): 64 rows, cuts,
       * sharp logits with f16 Q, many requests, a partial tile (48 rows) */
      {"varlen fp8 p64 h64 s1", 64, 64, 1, 0.f, KVA_BF16, KVA_FP8_E4M3, 4, c4, f4, 0, 0, 1},
      {"fp8 p16 h32 s2 cuts", 16, 32, 1, 0.f, KVA_BF16, KVA_FP8_E4M3, 2, c2, f2, 5, 64, 1},
      {"varlen fp8 p64 h64 f16 sharp", 64, 64, 1, 0.6f, KVA_F16, KVA_FP8_E4M3, 4, c4, f4, 0, 0, 1},
      {"b32 h32 s1-2 fp8 p64", 64, 32, 1, 0.f, KVA_BF16, KVA_FP8_E4M3, 32, cb, fb, 0, 0, 1},
      {"fp8 p1 h24 s2 non-causal", 1, 24, 0, 0.f, KVA_BF16, KVA_FP8_E4M3, 2, c2, f2, 0, 0, 1},
      /* 16-bit batches of <= 32 rows (v6 on fast DRAM with pages of whole
       * 64-key runs, else v2): pages of 64, 16 and 1 keys, cuts, sharp
       * f16, many requests */
      {"varlen bf16 p64 h16 s1", 64, 16, 1, 0.f, KVA_BF16, KVA_BF16, 4, c4, f4, 0, 0, 1},
      {"bf16 p16 h16 s2 cuts", 16, 16, 1, 0.f, KVA_BF16, KVA_BF16, 2, c2, f2, 5, 64, 1},
      {"varlen f16 p64 h32 sharp", 64, 32, 1, 0.6f, KVA_F16, KVA_F16, 4, c4, f4, 0, 0, 1},
      {"b32 h16 s1-2 bf16 p64", 64, 16, 1, 0.f, KVA_BF16, KVA_BF16, 32, cb, fb, 0, 0, 0},
      {"bf16 p1 h16 s2 non-causal", 1, 16, 0, 0.f, KVA_BF16, KVA_BF16, 2, c2, f2, 0, 0, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(ctx, &cases[i]);
  run_graph_case(ctx, KVA_BF16, 64);
  run_graph_case(ctx, KVA_FP8_E4M3, 16);
  run_graph_case(ctx, KVA_FP8_E4M3, 32);
  kva_context_destroy(ctx);
  return tu_summary("test_cuda_mla");
}
