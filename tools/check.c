/* kvattn check: randomized sweep of every supported feature against the
 * double-precision reference, on fresh random data with NaN-poisoned outputs.
 *
 * Per case: a pool, table and plan of random shape; requests with cached
 * prefixes (some forked from a shared parent), stored step by step through
 * kva_store_kv from a random source dtype; then one attention step of decode,
 * extend or mixed requests on a random layer. Checked:
 *   - every stored element is the correctly rounded original (f16/bf16/fp8,
 *     fp8 with its layer scale, saturating at 448),
 *   - O against the reference on the pool's stored values (dtype tolerance),
 *   - LSE against the reference (absolute),
 *   - fp8: O against the reference on the unquantized K/V,
 *   - no page leaks once every request is released.
 * One case in six is an MLA decode case instead (check_mla.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_common.h"
#include "core/dtype.h"
#include "ref/reference.h"

#define NLAYERS 2

typedef struct {
  int page_size, hkv, group, d, workers, split_block, nreq, mode; /* mode 0 decode, 1 extend, 2 mixed */
  kva_dtype kv_dtype, q_dtype, src_dtype[NLAYERS];
  int layer;            /* the layer attended */
  float k_scale, v_scale; /* fp8 scales of the attended layer */
  int saturating;       /* fp8 scales small enough that some values saturate */
  kva_attn_params ap;
  int want_lse, forks;
} check_case;

static const char *mode_name[3] = {"decode", "extend", "mixed"};

static void describe(const check_case *c, char *buf, size_t n) {
  int k = snprintf(buf, n,
                   "%s nreq=%d page=%d heads=%d:%d d=%d kv=%s src=%s q=%s causal=%d window=%d "
                   "softcap=%g sm_scale=%g lse=%d workers=%d block=%d forks=%d layer=%d",
                   mode_name[c->mode], c->nreq, c->page_size, c->hkv * c->group, c->hkv, c->d,
                   kva_dtype_name(c->kv_dtype), kva_dtype_name(c->src_dtype[c->layer]),
                   kva_dtype_name(c->q_dtype), c->ap.causal, c->ap.window_left,
                   (double)c->ap.logit_softcap, (double)c->ap.sm_scale, c->want_lse, c->workers,
                   c->split_block, c->forks, c->layer);
  if (c->kv_dtype == KVA_FP8_E4M3 && k > 0 && (size_t)k < n)
    snprintf(buf + k, n - (size_t)k, " scales=%.4g/%.4g%s", (double)c->k_scale,
             (double)c->v_scale, c->saturating ? " (saturating)" : "");
}

static float rand01(cli_rng *r) { return (cli_uniform(r) + 1.0f) * 0.5f; }

static check_case draw_case(cli_rng *r, int small) {
  static const int pages[] = {1, 16, 64, 16, 1, 64, 7, 32, 256, 3};
  static const int groups[] = {1, 4, 8};
  static const int dims[] = {64, 128, 256, 64, 128, 256, 32, 72, 96, 200};
  static const kva_dtype kvt[] = {KVA_F16, KVA_BF16, KVA_FP8_E4M3};
  static const kva_dtype qt[] = {KVA_F32, KVA_F16, KVA_BF16};
  static const int workers[] = {0, 1, 2, 3, 5, 7, 16, 64};
  static const int blocks[] = {0, 0, 0, 0, 8, 16, 48, 256};
  check_case c;
  memset(&c, 0, sizeof(c));
  c.page_size = pages[cli_int(r, 0, 9)];
  if (cli_int(r, 0, 5) == 0) c.page_size = cli_int(r, 1, 256);
  c.group = groups[cli_int(r, 0, 2)];
  c.hkv = cli_int(r, 0, 4) == 0 ? 1 : cli_int(r, 1, 3);
  if (cli_int(r, 0, 6) == 0) { /* MQA with a wide group */
    c.hkv = 1;
    c.group = cli_int(r, 0, 1) ? 16 : 32;
  }
  c.d = dims[cli_int(r, 0, small ? 5 : 9)];
  c.kv_dtype = kvt[cli_int(r, 0, 2)];
  c.q_dtype = qt[cli_int(r, 0, 2)];
  for (int l = 0; l < NLAYERS; l++) c.src_dtype[l] = qt[cli_int(r, 0, 2)];
  c.layer = cli_int(r, 0, NLAYERS - 1);
  if (c.kv_dtype == KVA_FP8_E4M3) {
    /* values are in [-1, 1): 1/scale spans 40..400 of e4m3's 448; one case in
     * eight uses scales that clip the largest values */
    c.saturating = cli_int(r, 0, 7) == 0;
    float lo = c.saturating ? 0.0012f : 0.0025f, span = c.saturating ? 0.0008f : 0.0225f;
    c.k_scale = lo + span * rand01(r);
    c.v_scale = lo + span * rand01(r);
  }
  c.mode = cli_int(r, 0, 2);
  c.nreq = small ? cli_int(r, 1, 3) : cli_int(r, 1, c.mode == 1 ? 4 : 10);
  c.ap = kva_attn_params_default();
  c.ap.causal = cli_int(r, 0, 4) != 0;
  if (cli_int(r, 0, 3) == 0) c.ap.window_left = cli_int(r, 0, 200);
  if (cli_int(r, 0, 3) == 0) c.ap.logit_softcap = 5.0f + 45.0f * rand01(r);
  if (cli_int(r, 0, 4) == 0) c.ap.sm_scale = 0.05f + 0.2f * rand01(r);
  c.want_lse = cli_int(r, 0, 1);
  c.workers = workers[cli_int(r, 0, 7)];
  c.split_block = blocks[cli_int(r, 0, 7)];
  c.forks = cli_int(r, 0, 2) == 0;
  return c;
}

int check_fp8_end_to_end(const char *desc, const char *what, const double *ref2,
                         const float *out, size_t n, float sm_scale, int d, worst_errors *worst,
                         double *e2_out) {
  double e2 = kva_ref_rel_error(ref2, out, n);
  double sharp = sm_scale > 0 ? sm_scale * sqrt((double)d) / 2.0 : 0.5;
  double ftol = TOL_FP8_E2E * (sharp > 1.0 ? sharp : 1.0);
  int fail = 0;
  if (!(e2 < ftol)) {
    printf("FAIL %s: fp8 end-to-end rel error %.3g >= %.2g vs unquantized %s\n", desc, e2, ftol,
           what);
    fail = 1;
  }
  if (e2 > worst->fp8 || isnan(e2)) worst->fp8 = e2;
  *e2_out = e2;
  return fail;
}

double check_allowed_store_error(float x, kva_dtype t, float scale) {
  double a = fabs((double)x), step;
  int e;
  switch (t) {
    case KVA_BF16:
      frexp(a, &e);
      step = a < 0x1p-126 ? 0x1p-133 : ldexp(1.0, e - 1 - 7);
      return 0.5 * step;
    case KVA_F16:
      frexp(a, &e);
      step = a < 0x1p-14 ? 0x1p-24 : ldexp(1.0, e - 1 - 10);
      return 0.5 * step;
    case KVA_FP8_E4M3: {
      double y = a / scale;
      if (y >= 448.0) return (y - 448.0) * scale + 1e-6 * a;
      frexp(y, &e);
      step = y < 0x1p-6 ? 0x1p-9 : ldexp(1.0, e - 1 - 3);
      /* x * (1/scale) in f32 may sit an ulp off a tie: slack of 1e-6 relative */
      return (0.5 * step * (1.0 + 1e-6)) * scale + 1e-6 * a;
    }
    default: return 0;
  }
}

/* Everything one case allocates; freed by case_free. */
typedef struct {
  kva_context *ctx;
  const check_case *c;
  cli_rng *r;
  size_t kv_te;
  kva_pool *pool;
  kva_req_table *table;
  kva_plan *plan;
  void *dk, *dv, *hk, *hv;   /* new K/V staging: device and host typed */
  float *kbuf, *vbuf;        /* the attended layer's new K/V as sent (f32) */
} case_env;

/* Stores the new tokens of a batch into every layer from random values in
 * each layer's source dtype; kbuf/vbuf keep the attended layer's values. */
static kva_status store_step(case_env *e, int nb, int32_t *bs, int32_t *bc, int32_t *bn) {
  kva_batch b = {nb, bs, bc, bn};
  kva_status st = kva_plan_update(e->plan, &b);
  if (st != KVA_OK) return st;
  int tot = 0;
  for (int i = 0; i < nb; i++) tot += bn[i];
  size_t n = (size_t)tot * e->kv_te;
  for (int l = 0; l < NLAYERS; l++) {
    kva_dtype t = e->c->src_dtype[l];
    float *kf = l == e->c->layer ? e->kbuf : NULL, *vf = l == e->c->layer ? e->vbuf : NULL;
    for (size_t i = 0; i < n; i++) {
      float kx = cli_uniform(e->r), vx = cli_uniform(e->r);
      kva_store_f32(e->hk, i, t, kx);
      kva_store_f32(e->hv, i, t, vx);
      if (kf) {
        kf[i] = kva_load_f32(e->hk, i, t);
        vf[i] = kva_load_f32(e->hv, i, t);
      }
    }
    size_t bytes = n * kva_dtype_size(t);
    if ((st = kva_copy_to_device(e->ctx, e->dk, e->hk, bytes)) != KVA_OK ||
        (st = kva_copy_to_device(e->ctx, e->dv, e->hv, bytes)) != KVA_OK ||
        (st = kva_store_kv(e->plan, e->pool, l, e->dk, e->dv, t)) != KVA_OK)
      return st;
  }
  return KVA_OK;
}

typedef struct {
  int slot, prefix, nnew;
  float *k_orig, *v_orig; /* [prefix + nnew, hkv, d] values as sent to kva_store_kv */
} req_state;

/* One case; returns 0 pass, 1 fail (message printed). */
static int run_case(kva_context *ctx, const check_case *c, cli_rng *r, int small, int verbose,
                    worst_errors *worst) {
  char desc[400];
  describe(c, desc, sizeof(desc));
  int hq = c->hkv * c->group, d = c->d, hkv = c->hkv, nreq = c->nreq;
  size_t kv_te = (size_t)hkv * d, q_te = (size_t)hq * d;
  req_state *rq = (req_state *)calloc((size_t)nreq, sizeof(req_state));
  int max_len = 0, total_new = 0, total_prefix = 0;
  for (int i = 0; i < nreq; i++) {
    int decode = c->mode == 0 || (c->mode == 2 && i % 2 == 0);
    rq[i].nnew = decode ? cli_int(r, 1, KVA_MAX_DECODE_Q)
                        : cli_int(r, KVA_MAX_DECODE_Q + 1, small ? 40 : 160);
    rq[i].prefix = cli_int(r, 0, 2) == 0 ? 0 : cli_int(r, 1, small ? 100 : (decode ? 700 : 300));
    if (rq[i].prefix + rq[i].nnew > max_len) max_len = rq[i].prefix + rq[i].nnew;
    total_new += rq[i].nnew;
    total_prefix += rq[i].prefix;
  }
  int parent_len = c->forks ? cli_int(r, 1, 200) : 0;
  int maxq = total_prefix + total_new + parent_len;
  kva_pool_config pc = {KVA_LAYOUT_MHA, NLAYERS, maxq / c->page_size + 2 * nreq + 8,
                        c->page_size, hkv, d, c->kv_dtype};
  case_env e;
  memset(&e, 0, sizeof(e));
  e.ctx = ctx;
  e.c = c;
  e.r = r;
  e.kv_te = kv_te;
  void *dq = NULL, *dout = NULL, *hq_buf = NULL, *ho = NULL;
  float *dlse = NULL, *qf = NULL, *of = NULL, *lsef = NULL, *parent_k = NULL, *parent_v = NULL;
  double *ref = NULL, *ref_lse = NULL, *ref2 = NULL;
  float **kd = NULL, **vd = NULL;
  int32_t cached[16], nnew[16], bs[16], bc[16], bn[16];
  int fail = 1, parent = -1;
  kva_status st;
  char why[200] = "";
#define T(call)                                                                  \
  do {                                                                           \
    if ((st = (call)) != KVA_OK) {                                               \
      snprintf(why, sizeof(why), "%s -> %s: %s", #call, kva_strerror(st), kva_last_error()); \
      goto out;                                                                  \
    }                                                                            \
  } while (0)
  T(kva_pool_create(ctx, &pc, &e.pool));
  if (c->kv_dtype == KVA_FP8_E4M3)
    for (int l = 0; l < NLAYERS; l++)
      T(kva_pool_set_scale(e.pool, l, l == c->layer ? c->k_scale : 0.01f + 0.01f * rand01(r),
                           l == c->layer ? c->v_scale : 0.01f + 0.01f * rand01(r)));
  T(kva_req_table_create(e.pool, nreq + 2, max_len + parent_len + 8, &e.table));
  kva_plan_config plc = {nreq + 1, maxq, hq, c->workers, c->split_block, 0};
  T(kva_plan_create(e.table, &plc, &e.plan));
  size_t kvbytes = (size_t)maxq * kv_te * 4;
  T(kva_malloc(ctx, kvbytes, &e.dk));
  T(kva_malloc(ctx, kvbytes, &e.dv));
  e.hk = malloc(kvbytes);
  e.hv = malloc(kvbytes);
  e.kbuf = (float *)malloc(kvbytes);
  e.vbuf = (float *)malloc(kvbytes);
  for (int i = 0; i < nreq; i++) {
    size_t bytes = (size_t)(rq[i].prefix + rq[i].nnew) * kv_te * 4;
    rq[i].k_orig = (float *)malloc(bytes);
    rq[i].v_orig = (float *)malloc(bytes);
  }

  /* a shared parent whose prefix odd requests fork (fork lengths are random,
   * so partial last pages get copied) */
  if (c->forks) {
    T(kva_req_alloc(e.table, &parent));
    T(kva_req_append(e.table, parent, parent_len));
    bs[0] = parent, bc[0] = 0, bn[0] = parent_len;
    T(store_step(&e, 1, bs, bc, bn));
    parent_k = (float *)malloc((size_t)parent_len * kv_te * 4);
    parent_v = (float *)malloc((size_t)parent_len * kv_te * 4);
    memcpy(parent_k, e.kbuf, (size_t)parent_len * kv_te * 4);
    memcpy(parent_v, e.vbuf, (size_t)parent_len * kv_te * 4);
  }
  int nb = 0, who[16];
  for (int i = 0; i < nreq; i++) {
    int shared = 0;
    if (c->forks && i % 2 == 1) {
      shared = cli_int(r, 0, parent_len < rq[i].prefix ? parent_len : rq[i].prefix);
      T(kva_req_fork(e.table, parent, shared, &rq[i].slot));
      memcpy(rq[i].k_orig, parent_k, (size_t)shared * kv_te * 4);
      memcpy(rq[i].v_orig, parent_v, (size_t)shared * kv_te * 4);
    } else {
      T(kva_req_alloc(e.table, &rq[i].slot));
    }
    if (rq[i].prefix > shared) {
      T(kva_req_append(e.table, rq[i].slot, rq[i].prefix - shared));
      bs[nb] = rq[i].slot, bc[nb] = shared, bn[nb] = rq[i].prefix - shared, who[nb] = i;
      nb++;
    }
  }
  if (nb > 0) { /* the cached prefixes, stored as one extend batch */
    T(store_step(&e, nb, bs, bc, bn));
    size_t off = 0;
    for (int j = 0; j < nb; j++) {
      req_state *q = &rq[who[j]];
      memcpy(q->k_orig + (size_t)bc[j] * kv_te, e.kbuf + off, (size_t)bn[j] * kv_te * 4);
      memcpy(q->v_orig + (size_t)bc[j] * kv_te, e.vbuf + off, (size_t)bn[j] * kv_te * 4);
      off += (size_t)bn[j] * kv_te;
    }
  }
  if (parent >= 0 && cli_int(r, 0, 1)) T(kva_req_release(e.table, parent)); /* children keep pages */

  /* the attention step: store the new tokens, then attend */
  for (int i = 0; i < nreq; i++) {
    T(kva_req_append(e.table, rq[i].slot, rq[i].nnew));
    bs[i] = rq[i].slot, bc[i] = rq[i].prefix, bn[i] = rq[i].nnew;
    cached[i] = rq[i].prefix, nnew[i] = rq[i].nnew;
  }
  T(store_step(&e, nreq, bs, bc, bn));
  {
    size_t off = 0;
    for (int i = 0; i < nreq; i++) {
      size_t n = (size_t)rq[i].nnew * kv_te, at = (size_t)rq[i].prefix * kv_te;
      memcpy(rq[i].k_orig + at, e.kbuf + off, n * 4);
      memcpy(rq[i].v_orig + at, e.vbuf + off, n * 4);
      off += n;
    }
  }
  size_t nq = (size_t)total_new * q_te, qsz = kva_dtype_size(c->q_dtype);
  size_t nl = (size_t)total_new * hq;
  hq_buf = malloc(nq * qsz);
  ho = malloc(nq * qsz);
  qf = (float *)malloc(nq * 4);
  of = (float *)malloc(nq * 4);
  lsef = (float *)malloc(nl * 4);
  cli_fill_random(r, hq_buf, nq, c->q_dtype, 2.0f); /* scores of std ~0.7: peaked, not one-hot */
  cli_to_f32(hq_buf, nq, c->q_dtype, qf);
  T(kva_malloc(ctx, nq * qsz, &dq));
  T(kva_malloc(ctx, nq * qsz, &dout));
  T(kva_malloc(ctx, nl * 4, (void **)&dlse));
  T(kva_copy_to_device(ctx, dq, hq_buf, nq * qsz));
  cli_fill_nan(ho, nq, c->q_dtype); /* poison O and LSE */
  T(kva_copy_to_device(ctx, dout, ho, nq * qsz));
  cli_fill_nan(lsef, nl, KVA_F32);
  T(kva_copy_to_device(ctx, dlse, lsef, nl * 4));
  T(kva_attention(e.plan, e.pool, c->layer, &c->ap, dq, dout, c->want_lse ? dlse : NULL,
                  c->q_dtype));
  T(kva_synchronize(ctx));
  T(kva_copy_to_host(ctx, ho, dout, nq * qsz));
  cli_to_f32(ho, nq, c->q_dtype, of);
  if (c->want_lse) T(kva_copy_to_host(ctx, lsef, dlse, nl * 4));

  /* the pool's stored values, each checked against correct rounding */
  kd = (float **)calloc((size_t)nreq, sizeof(float *));
  vd = (float **)calloc((size_t)nreq, sizeof(float *));
  double store_worst = 0;
  for (int i = 0; i < nreq; i++) {
    int len = rq[i].prefix + rq[i].nnew;
    T(kva_ref_read_request_kv(e.pool, e.table, rq[i].slot, c->layer, len, &kd[i], &vd[i]));
    for (size_t x = 0; x < (size_t)len * kv_te; x++) {
      double ek = fabs((double)kd[i][x] - rq[i].k_orig[x]);
      double ev = fabs((double)vd[i][x] - rq[i].v_orig[x]);
      double ak = check_allowed_store_error(rq[i].k_orig[x], c->kv_dtype, c->k_scale);
      double av = check_allowed_store_error(rq[i].v_orig[x], c->kv_dtype, c->v_scale);
      double rk = ek <= ak ? (ak > 0 ? ek / ak : 0) : (ak > 0 ? ek / ak : INFINITY);
      double rv = ev <= av ? (av > 0 ? ev / av : 0) : (av > 0 ? ev / av : INFINITY);
      if (!(rk <= 1.0) || !(rv <= 1.0)) {
        int tok = (int)(x / kv_te);
        snprintf(why, sizeof(why),
                 "stored KV of request %d position %d elem %d: K %.9g (sent %.9g), V %.9g (sent "
                 "%.9g) not correctly rounded",
                 i, tok, (int)(x % kv_te), (double)kd[i][x], (double)rq[i].k_orig[x],
                 (double)vd[i][x], (double)rq[i].v_orig[x]);
        goto out;
      }
      if (rk > store_worst) store_worst = rk;
      if (rv > store_worst) store_worst = rv;
    }
  }
  if (store_worst > worst->store) worst->store = store_worst;

  /* O and LSE against the reference on the stored (dequantized) values */
  ref = (double *)malloc(nq * sizeof(double));
  ref_lse = (double *)malloc(nl * sizeof(double));
  kva_ref_attention(nreq, cached, nnew, hq, hkv, d, &c->ap, qf, (const float *const *)kd,
                    (const float *const *)vd, ref, ref_lse);
  double err = kva_ref_rel_error(ref, of, nq), lerr = 0, e2 = 0;
  double tol = c->q_dtype == KVA_F32 ? TOL_O_F32 : TOL_O_16;
  double ltol = c->q_dtype == KVA_F32 ? TOL_LSE_F32 : TOL_LSE_16;
  fail = 0;
  if (!(err < tol)) {
    printf("FAIL %s: O rel error %.3g >= %.0e vs reference on stored KV\n", desc, err, tol);
    fail = 1;
  }
  if (err > worst->o || isnan(err)) worst->o = err;
  if (c->want_lse) {
    lerr = kva_ref_max_abs_error(ref_lse, lsef, nl);
    if (!(lerr < ltol)) {
      printf("FAIL %s: LSE max abs error %.3g >= %.0e\n", desc, lerr, ltol);
      fail = 1;
    }
    if (lerr > worst->lse || isnan(lerr)) worst->lse = lerr;
  }
  if (c->kv_dtype == KVA_FP8_E4M3 && !c->saturating) {
    /* End to end against the unquantized K/V: this measures e4m3 itself
     * (3-bit mantissa); the kernel is held to the dtype tolerance above and
     * the rounding of every stored element is checked exactly. Saturating
     * cases clip on purpose and are covered by the rounding check. */
    ref2 = (double *)malloc(nq * sizeof(double));
    float **ko = (float **)malloc((size_t)nreq * sizeof(float *));
    float **vo = (float **)malloc((size_t)nreq * sizeof(float *));
    for (int i = 0; i < nreq; i++) ko[i] = rq[i].k_orig, vo[i] = rq[i].v_orig;
    kva_ref_attention(nreq, cached, nnew, hq, hkv, d, &c->ap, qf, (const float *const *)ko,
                      (const float *const *)vo, ref2, NULL);
    free(ko);
    free(vo);
    if (check_fp8_end_to_end(desc, "KV", ref2, of, nq, c->ap.sm_scale, d, worst, &e2)) fail = 1;
  }
  if (verbose && !fail)
    printf("ok %s: O %.3g LSE %.3g fp8-e2e %.3g store %.2f\n", desc, err, lerr, e2, store_worst);
out:
  if (why[0]) printf("FAIL %s: %s\n", desc, why);
  for (int i = 0; i < nreq; i++) {
    if (kd) free(kd[i]);
    if (vd) free(vd[i]);
    free(rq[i].k_orig);
    free(rq[i].v_orig);
  }
  free(kd), free(vd), free(rq), free(parent_k), free(parent_v);
  free(ref), free(ref_lse), free(ref2), free(qf), free(of), free(lsef);
  free(e.kbuf), free(e.vbuf), free(e.hk), free(e.hv), free(hq_buf), free(ho);
  kva_free(ctx, dq), kva_free(ctx, e.dk), kva_free(ctx, e.dv), kva_free(ctx, dout);
  kva_free(ctx, dlse);
  kva_plan_destroy(e.plan);
  kva_req_table_destroy(e.table);
  if (e.pool && fail == 0 &&
      kva_pool_num_free_pages(e.pool) != kva_pool_get_config(e.pool)->num_pages) {
    printf("FAIL %s: %d pages leaked after releasing every request\n", desc,
           kva_pool_get_config(e.pool)->num_pages - kva_pool_num_free_pages(e.pool));
    fail = 1;
  }
  kva_pool_destroy(e.pool);
  return fail;
#undef T
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvattn check [--device cpu|cuda] [--seed N] [--cases N] [--small] [--verbose]\n"
          "                    [--only mha|mla]\n"
          "Randomized sweep against the double reference: page sizes 1..256, GQA/MQA, head dims\n"
          "(64/128/256 and other multiples of 8), cached prefixes, forks of a shared prefix,\n"
          "sliding window, soft-cap, f16/bf16/fp8 KV (fp8 with per-layer scales), f32/f16/bf16\n"
          "Q/O, LSE, decode (q_len 1..8), extend and mixed batches, split-KV worker counts.\n"
          "One case in six is MLA decode (latent 576, V = first 512, one KV head): h_q 1..128,\n"
          "s_q 1..8 (mostly 1-2), varlen lengths, page sizes 1..256, causal on/off, f16/bf16/fp8\n"
          "latents, checked against the MLA reference with the same tolerances.\n"
          "Outputs are NaN-poisoned before each run. Tolerances: O rel error < %.0e (f32 Q/O),\n"
          "< %.0e (f16/bf16) vs the reference on the stored KV; LSE abs error < %.0e (f32),\n"
          "< %.0e (f16/bf16); fp8 vs unquantized KV < %.0e (x sm_scale*sqrt(d)/2 when that\n"
          "exceeds 1); every stored KV element correctly rounded.\n"
          "  --cases N   number of random cases (default 200)\n"
          "  --seed N    random seed (default 1)\n"
          "  --small     smaller shapes (for slow tools such as compute-sanitizer)\n"
          "  --only K    only MHA or only MLA cases (same draws otherwise)\n"
          "  --verbose   also print a line per passing case (prefixed 'ok')\n"
          "Prints a line per failing case, then 'N passed, N failed'; exit 1 on any failure,\n"
          "77 when the device is absent, 2 on a bad option.\n",
          TOL_O_F32, TOL_O_16, TOL_LSE_F32, TOL_LSE_16, TOL_FP8_E2E);
}

int cli_check(int argc, char **argv) {
  kva_device dev = KVA_DEVICE_CPU;
  unsigned long long seed = 1;
  int cases = 200, small = 0, verbose = 0, only = -1; /* --only: 0 mha, 1 mla */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--small")) {
      small = 1;
    } else if (!strcmp(a, "--verbose")) {
      verbose = 1;
    } else if (!strcmp(a, "--only")) {
      if (!v || (strcmp(v, "mha") && strcmp(v, "mla"))) {
        fprintf(stderr, "kvattn check: --only must be mha or mla\n");
        return 2;
      }
      only = !strcmp(v, "mla");
      i++;
    } else if (!strcmp(a, "--device") || !strcmp(a, "--seed") || !strcmp(a, "--cases")) {
      char *end = NULL;
      if (!v) {
        fprintf(stderr, "kvattn check: %s needs a value\n", a);
        return 2;
      }
      i++;
      if (!strcmp(a, "--device")) {
        if (!cli_parse_device(v, &dev)) {
          fprintf(stderr, "kvattn check: --device must be cpu or cuda (got '%s')\n", v);
          return 2;
        }
      } else if (!strcmp(a, "--seed")) {
        seed = strtoull(v, &end, 10);
        if (*v == '\0' || *end != '\0') {
          fprintf(stderr, "kvattn check: --seed must be a number (got '%s')\n", v);
          return 2;
        }
      } else {
        long n = strtol(v, &end, 10);
        if (*v == '\0' || *end != '\0' || n <= 0 || n > 10000000) {
          fprintf(stderr, "kvattn check: --cases must be a positive number (got '%s')\n", v);
          return 2;
        }
        cases = (int)n;
      }
    } else {
      fprintf(stderr, "kvattn check: unknown option '%s' (see kvattn check --help)\n", a);
      return 2;
    }
  }
  const char *dev_name = dev == KVA_DEVICE_CUDA ? "cuda" : "cpu";
  kva_context_config cc = {dev, 0, 0};
  kva_context *ctx = NULL;
  kva_status st = kva_context_create(&cc, &ctx);
  if (st == KVA_ERR_NO_DEVICE) {
    printf("kvattn check: SKIPPED: no %s device present (%s)\n",
           dev == KVA_DEVICE_CUDA ? "CUDA" : "CPU", kva_last_error());
    printf("0 passed, 0 failed, %d skipped\n", cases);
    return 77;
  }
  if (st != KVA_OK) {
    fprintf(stderr, "kvattn check: cannot create a %s context: %s: %s\n", dev_name,
            kva_strerror(st), kva_last_error());
    return 1;
  }
  cli_rng r = {seed * 0x2545F4914F6CDD1Dull + 7};
  int passed = 0, failed = 0;
  worst_errors worst = {0, 0, 0, 0};
  double t0 = cli_now();
  for (int i = 0; i < cases; i++) {
    int fail;
    int mla = cli_int(&r, 0, 5) == 0; /* one case in six is MLA decode */
    if (only >= 0) mla = only;
    if (mla) {
      fail = check_mla_case(ctx, &r, small, verbose, &worst);
    } else {
      check_case c = draw_case(&r, small);
      fail = run_case(ctx, &c, &r, small, verbose, &worst);
    }
    if (fail) failed++;
    else passed++;
    fflush(stdout);
  }
  printf("device %s, seed %llu, %.1f s; worst O rel error %.3g, LSE abs error %.3g, fp8 "
         "end-to-end rel error %.3g, stored-KV rounding %.2f of half a step\n",
         dev_name, seed, cli_now() - t0, worst.o, worst.lse, worst.fp8, worst.store);
  printf("%d passed, %d failed\n", passed, failed);
  kva_context_destroy(ctx);
  return failed ? 1 : 0;
}
