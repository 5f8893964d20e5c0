/* CUDA extend (prefill) path against the double-precision reference: head
 * dims 64/128/256, f16/bf16, same-type and fp8 pools, page sizes 1..64,
 * GQA, causal / window / soft-cap, mixed with decode requests, more work
 * items than resident CTAs, and bitwise repeatability. Skips (77) without a
 * CUDA device. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "ref/reference.h"
#include "testutil.h"

typedef struct ext_case {
  const char *name;
  int d, page, hq, hkv, causal, window;
  float softcap;
  kva_dtype qt, kvt;
  int nreq;
  const int *prefix, *fresh; /* per request; NULL fresh = gen */
  int with_lse;
  float sm_scale; /* 0 = 1/sqrt(d) */
} ext_case;

static tu_rng rng = {12345};

/* Random values of dtype t (rounded), as device bytes and as f32. */
static void *rand_dev(kva_context *ctx, size_t n, kva_dtype t, float amp, float **host_f32) {
  size_t es = kva_dtype_size(t);
  unsigned char *h = (unsigned char *)malloc(n * es);
  float *f = (float *)malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    kva_store_f32(h, i, t, amp * tu_uniform(&rng));
    f[i] = kva_load_f32(h, i, t);
  }
  void *d = NULL;
  if (kva_malloc(ctx, n * es, &d) != KVA_OK || kva_copy_to_device(ctx, d, h, n * es) != KVA_OK) {
    kva_free(ctx, d);
    d = NULL;
  }
  free(h);
  if (host_f32)
    *host_f32 = f;
  else
    free(f);
  return d;
}

static void run_case(kva_context *ctx, const ext_case *c) {
  const int R = c->nreq, layer = 1;
  int32_t *slots = calloc((size_t)R, 4), *cached = calloc((size_t)R, 4),
          *fresh = calloc((size_t)R, 4);
  int max_len = 1, total_q = 0, total_pref = 0;
  for (int r = 0; r < R; r++) {
    cached[r] = c->prefix[r];
    fresh[r] = c->fresh[r];
    total_q += fresh[r];
    total_pref += cached[r];
    if (cached[r] + fresh[r] > max_len) max_len = cached[r] + fresh[r];
  }
  int pages = 0;
  for (int r = 0; r < R; r++) pages += (cached[r] + fresh[r] + c->page - 1) / c->page;
  kva_pool_config pc = {KVA_LAYOUT_MHA, 2, pages + 4, c->page, c->hkv, c->d, c->kvt};
  kva_pool *pool = NULL;
  kva_req_table *tab = NULL;
  kva_plan *plan = NULL;
  CHECK_STATUS(kva_pool_create(ctx, &pc, &pool), KVA_OK);
  if (!pool) goto out;
  { /* NaN in every byte of the layer's K/V before any store: a slot no
     * request's key uses (past kv_len in a last page, unowned pages) must
     * not reach P V, whatever the pool held before */
    const size_t kvbytes = (size_t)pc.num_pages * pc.page_size * pc.num_kv_heads * pc.head_dim *
                           kva_dtype_size(pc.kv_dtype);
    unsigned char *nanb = malloc(kvbytes);
    void *kb = NULL, *vb = NULL;
    CHECK_STATUS(kva_pool_get_buffers(pool, layer, &kb, &vb), KVA_OK);
    if (nanb && kb && vb) {
      memset(nanb, 0xff, kvbytes);
      CHECK_STATUS(kva_copy_to_device(ctx, kb, nanb, kvbytes), KVA_OK);
      CHECK_STATUS(kva_copy_to_device(ctx, vb, nanb, kvbytes), KVA_OK);
    }
    free(nanb);
  }
  if (c->kvt == KVA_FP8_E4M3) CHECK_STATUS(kva_pool_set_scale(pool, layer, 0.02f, 0.015f), KVA_OK);
  CHECK_STATUS(kva_req_table_create(pool, R, max_len, &tab), KVA_OK);
  if (!tab) goto out;
  for (int r = 0; r < R; r++) {
    CHECK_STATUS(kva_req_alloc(tab, &slots[r]), KVA_OK);
    CHECK_STATUS(kva_req_append(tab, slots[r], cached[r] + fresh[r]), KVA_OK);
  }
  int maxq = total_q > total_pref ? total_q : total_pref;
  kva_plan_config cfg = {R, maxq, c->hq, 0, 0, 0};
  CHECK_STATUS(kva_plan_create(tab, &cfg, &plan), KVA_OK);
  if (!plan) goto out;
  const size_t kvrow = (size_t)c->hkv * c->d, qrow = (size_t)c->hq * c->d;

  /* step 1: store the prefixes' K/V (only requests that have one) */
  if (total_pref > 0) {
    int32_t *s1 = calloc((size_t)R, 4), *c1 = calloc((size_t)R, 4), *n1 = calloc((size_t)R, 4);
    int m = 0;
    for (int r = 0; r < R; r++)
      if (cached[r] > 0) {
        s1[m] = slots[r];
        n1[m] = cached[r];
        m++;
      }
    kva_batch b1 = {m, s1, c1, n1};
    CHECK_STATUS(kva_plan_update(plan, &b1), KVA_OK);
    void *kp = rand_dev(ctx, (size_t)total_pref * kvrow, KVA_BF16, 1.0f, NULL);
    void *vp = rand_dev(ctx, (size_t)total_pref * kvrow, KVA_BF16, 1.0f, NULL);
    CHECK(kp && vp, "device alloc");
    if (kp && vp) CHECK_STATUS(kva_store_kv(plan, pool, layer, kp, vp, KVA_BF16), KVA_OK);
    kva_free(ctx, kp);
    kva_free(ctx, vp);
    free(s1);
    free(c1);
    free(n1);
  }

  /* step 2: the new tokens and the attention under test */
  kva_batch b2 = {R, slots, cached, fresh};
  CHECK_STATUS(kva_plan_update(plan, &b2), KVA_OK);
  float *qf = NULL;
  void *kn = rand_dev(ctx, (size_t)total_q * kvrow, c->qt, 1.0f, NULL);
  void *vn = rand_dev(ctx, (size_t)total_q * kvrow, c->qt, 1.0f, NULL);
  void *q = rand_dev(ctx, (size_t)total_q * qrow, c->qt, 1.5f, &qf);
  size_t obytes = (size_t)total_q * qrow * kva_dtype_size(c->qt);
  size_t lbytes = (size_t)total_q * c->hq * sizeof(float);
  void *o = NULL, *lse = NULL;
  unsigned char *oh = malloc(obytes), *oh2 = malloc(obytes);
  float *lh = malloc(lbytes), *of = malloc((size_t)total_q * qrow * sizeof(float));
  CHECK_STATUS(kva_malloc(ctx, obytes, &o), KVA_OK);
  CHECK_STATUS(kva_malloc(ctx, lbytes, &lse), KVA_OK);
  if (!kn || !vn || !q || !o || !lse) goto free_run;
  CHECK_STATUS(kva_store_kv(plan, pool, layer, kn, vn, c->qt), KVA_OK);

  kva_attn_params prm = kva_attn_params_default();
  prm.causal = c->causal;
  prm.window_left = c->window;
  prm.logit_softcap = c->softcap;
  prm.sm_scale = c->sm_scale;
  /* NaN poison: every row must be written */
  memset(oh, 0xff, obytes);
  for (size_t i = 0; i < lbytes / 4; i++) lh[i] = nanf("");
  CHECK_STATUS(kva_copy_to_device(ctx, o, oh, obytes), KVA_OK);
  CHECK_STATUS(kva_copy_to_device(ctx, lse, lh, lbytes), KVA_OK);
  CHECK_STATUS(
      kva_attention(plan, pool, layer, &prm, q, o, c->with_lse ? (float *)lse : NULL, c->qt),
      KVA_OK);
  CHECK_STATUS(kva_synchronize(ctx), KVA_OK);
  CHECK_STATUS(kva_copy_to_host(ctx, oh, o, obytes), KVA_OK);
  CHECK_STATUS(kva_copy_to_host(ctx, lh, lse, lbytes), KVA_OK);
  /* the same call again is bitwise identical (no races, no leftover state) */
  CHECK_STATUS(
      kva_attention(plan, pool, layer, &prm, q, o, c->with_lse ? (float *)lse : NULL, c->qt),
      KVA_OK);
  CHECK_STATUS(kva_copy_to_host(ctx, oh2, o, obytes), KVA_OK);
  CHECK(memcmp(oh, oh2, obytes) == 0, "%s: second run differs", c->name);

  /* reference over the pool's own (dequantized) K/V */
  {
    double *ro = malloc((size_t)total_q * qrow * sizeof(double));
    double *rl = malloc((size_t)total_q * c->hq * sizeof(double));
    float **kr = calloc((size_t)R, sizeof(float *)), **vr = calloc((size_t)R, sizeof(float *));
    int ok = 1;
    for (int r = 0; r < R; r++)
      if (kva_ref_read_request_kv(pool, tab, slots[r], layer, cached[r] + fresh[r], &kr[r],
                                  &vr[r]) != KVA_OK)
        ok = 0;
    CHECK(ok, "%s: reading the pool back: %s", c->name, kva_last_error());
    if (ok) {
      kva_ref_attention(R, cached, fresh, c->hq, c->hkv, c->d, &prm, qf, (const float *const *)kr,
                        (const float *const *)vr, ro, rl);
      for (size_t i = 0; i < (size_t)total_q * qrow; i++) of[i] = kva_load_f32(oh, i, c->qt);
      /* bf16 keeps 8 mantissa bits, f16 11: O and P rounding give ~2e-3 and
       * ~3e-4 (host emulation of the kernels), so 3x that */
      double tol = c->qt == KVA_BF16 ? 6e-3 : 1e-3;
      double rel = kva_ref_rel_error(ro, of, (size_t)total_q * qrow);
      CHECK(rel < tol, "%s: O relative error %.3g (tolerance %.1g)", c->name, rel, tol);
      tu_check_lse(c->name, c->with_lse, rl, lh, (size_t)total_q * c->hq);
    }
    for (int r = 0; r < R; r++) {
      free(kr[r]);
      free(vr[r]);
    }
    free(kr);
    free(vr);
    free(ro);
    free(rl);
  }
free_run:
  kva_free(ctx, kn);
  kva_free(ctx, vn);
  kva_free(ctx, q);
  kva_free(ctx, o);
  kva_free(ctx, lse);
  free(oh);
  free(oh2);
  free(lh);
  free(of);
  free(qf);
out:
  kva_plan_destroy(plan);
  kva_req_table_destroy(tab);
  kva_pool_destroy(pool);
  free(slots);
  free(cached);
  free(fresh);
}

int main(void) {
  if (kva_device_available(KVA_DEVICE_CUDA) != KVA_OK) {
    printf("test_cuda_extend: no CUDA device, skipped\n");
    return 77;
  }
  kva_context_config cc = {KVA_DEVICE_CUDA, 0, 0};
  kva_context *ctx = NULL;
  CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_OK);
  if (!ctx) return tu_summary("test_cuda_extend");

  static const int p3[] = {0, 129, 50}, n3[] = {300, 200, 5};
  static const int p2[] = {70, 0}, n2[] = {150, 9};
  static const int p1[] = {333}, n1[] = {260};
  static const int plong[] = {1000}, nlong[] = {1100};
  static int pmany[40], nmany[40];
  for (int i = 0; i < 40; i++) {
    pmany[i] = 17 * (i % 5);
    nmany[i] = i % 7 == 3 ? 4 : 40 + 3 * i; /* a few decode requests mixed in */
  }
  const ext_case cases[] = {
      {"d128 bf16 p16 gqa causal", 128, 16, 8, 2, 1, -1, 0.f, KVA_BF16, KVA_BF16, 3, p3, n3, 1,
       0.f},
      {"d64 f16 p1 window", 64, 1, 4, 4, 1, 37, 0.f, KVA_F16, KVA_F16, 2, p2, n2, 1, 0.f},
      {"d256 bf16 p64 noncausal cap", 256, 64, 4, 1, 0, -1, 20.f, KVA_BF16, KVA_BF16, 2, p2, n2, 1,
       0.f},
      {"d128 f16 fp8 p16", 128, 16, 8, 2, 1, -1, 0.f, KVA_F16, KVA_FP8_E4M3, 3, p3, n3, 1, 0.f},
      {"d128 bf16 fp8 p7 window", 128, 7, 4, 2, 1, 100, 0.f, KVA_BF16, KVA_FP8_E4M3, 1, p1, n1, 1,
       0.f},
      {"d64 bf16 fp8 p33 noncausal win", 64, 33, 2, 1, 0, 90, 0.f, KVA_BF16, KVA_FP8_E4M3, 1, p1,
       n1, 0, 0.f},
      {"d256 f16 fp8 p5 cap", 256, 5, 2, 2, 1, -1, 15.f, KVA_F16, KVA_FP8_E4M3, 2, p2, n2, 1, 0.f},
      {"d64 bf16 p16 many items", 64, 16, 8, 1, 1, -1, 0.f, KVA_BF16, KVA_BF16, 40, pmany, nmany, 1,
       0.f},
      {"d128 bf16 p16 long", 128, 16, 2, 1, 1, -1, 0.f, KVA_BF16, KVA_BF16, 1, plong, nlong, 1,
       0.f},
      {"d128 f16 p256 window 0", 128, 256, 2, 1, 1, 0, 0.f, KVA_F16, KVA_F16, 2, p2, n2, 1, 0.f},
      /* non-causal d128: GQA, key ranges of several tiles with a partial last one, soft-cap */
      {"d128 bf16 p16 noncausal gqa", 128, 16, 8, 2, 0, -1, 0.f, KVA_BF16, KVA_BF16, 3, p3, n3, 1,
       0.f},
      {"d128 f16 p8 noncausal long", 128, 8, 2, 1, 0, -1, 0.f, KVA_F16, KVA_F16, 1, plong, nlong, 1,
       0.f},
      {"d128 bf16 p16 noncausal cap many", 128, 16, 4, 2, 0, -1, 30.f, KVA_BF16, KVA_BF16, 40,
       pmany, nmany, 1, 0.f},
      /* sharp logits (base-2 spread ~15-25): later key tiles move a row's max
       * by more than the kernels' online-max slack, others by less */
      {"d128 bf16 p16 sharp", 128, 16, 4, 2, 1, -1, 0.f, KVA_BF16, KVA_BF16, 3, p3, n3, 1, 1.0f},
      {"d64 f16 p8 noncausal sharp long", 64, 8, 2, 1, 0, -1, 0.f, KVA_F16, KVA_F16, 1, plong,
       nlong, 1, 1.5f},
      {"d256 bf16 p64 sharp", 256, 64, 2, 1, 1, -1, 0.f, KVA_BF16, KVA_BF16, 2, p2, n2, 1, 0.7f},
  };
  /* every case with each way the warp-specialized kernel loads K/V (read
   * at plan creation): TMA from 4, 2 or 1 producer warps, cp.async gather */
  static const char *const loads[] = {"4", "2", "1", "0"};
  for (size_t l = 0; l < sizeof loads / sizeof loads[0]; l++) {
    setenv("KVA_EXTEND_TMA", loads[l], 1);
    const int failed_before = tu_failures;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(ctx, &cases[i]);
    if (tu_failures != failed_before) printf("(the failures above: KVA_EXTEND_TMA=%s)\n", loads[l]);
  }
  unsetenv("KVA_EXTEND_TMA");
  kva_context_destroy(ctx);
  return tu_summary("test_cuda_extend");
}
