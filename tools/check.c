/* kvattn check: randomized sweep of every supported feature against the
 * double-precision reference, on fresh random data with NaN-poisoned outputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "core/dtype.h"
#include "ref/reference.h"

typedef struct {
  int page_size, hkv, group, d, workers, nreq, mode; /* mode 0 decode, 1 extend, 2 mixed */
  kva_dtype kv_dtype, q_dtype;
  kva_attn_params ap;
  int want_lse, forks;
} check_case;

static const char *mode_name[3] = {"decode", "extend", "mixed"};

static void describe(const check_case *c, char *buf, size_t n) {
  snprintf(buf, n,
           "%s nreq=%d page=%d heads=%d:%d d=%d kv=%s q=%s causal=%d window=%d softcap=%g "
           "lse=%d workers=%d forks=%d",
           mode_name[c->mode], c->nreq, c->page_size, c->hkv * c->group, c->hkv, c->d,
           kva_dtype_name(c->kv_dtype), kva_dtype_name(c->q_dtype), c->ap.causal,
           c->ap.window_left, (double)c->ap.logit_softcap, c->want_lse, c->workers, c->forks);
}

static check_case draw_case(cli_rng *r, int small) {
  static const int pages[] = {1, 16, 64, 16, 1, 64, 7, 32, 256, 3};
  static const int groups[] = {1, 4, 8};
  static const int dims[] = {64, 128, 256, 64, 128, 256, 32, 72, 96, 200};
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
  static const kva_dtype kvt[] = {KVA_F16, KVA_BF16, KVA_FP8_E4M3};
  static const kva_dtype qt[] = {KVA_F32, KVA_F16, KVA_BF16};
  c.kv_dtype = kvt[cli_int(r, 0, 2)];
  c.q_dtype = qt[cli_int(r, 0, 2)];
  c.mode = cli_int(r, 0, 2);
  c.nreq = small ? cli_int(r, 1, 3) : cli_int(r, 1, c.mode == 1 ? 4 : 10);
  c.ap = kva_attn_params_default();
  c.ap.causal = cli_int(r, 0, 4) != 0;
  if (cli_int(r, 0, 3) == 0) c.ap.window_left = cli_int(r, 0, 200);
  if (cli_int(r, 0, 3) == 0) c.ap.logit_softcap = 5.0f + 45.0f * (cli_uniform(r) + 1.0f) / 2.0f;
  if (cli_int(r, 0, 4) == 0) c.ap.sm_scale = 0.05f + 0.1f * (cli_uniform(r) + 1.0f);
  c.want_lse = cli_int(r, 0, 1);
  static const int workers[] = {0, 1, 2, 3, 5, 7, 16, 64};
  c.workers = workers[cli_int(r, 0, 7)];
  c.forks = cli_int(r, 0, 2) == 0;
  return c;
}

typedef struct {
  int slot, prefix, nnew;
  float *k_orig, *v_orig; /* [prefix + nnew, hkv, d] unquantized values */
} req_state;

/* One case; returns 0 pass, 1 fail (message printed), 2 setup error. */
static int run_case(kva_context *ctx, const check_case *c, cli_rng *r, int small, double *worst) {
  char desc[320];
  describe(c, desc, sizeof(desc));
  int hq = c->hkv * c->group, d = c->d, hkv = c->hkv;
  size_t kv_te = (size_t)hkv * d, q_te = (size_t)hq * d;
  int nreq = c->nreq;
  req_state *rq = (req_state *)calloc((size_t)nreq + 1, sizeof(req_state));
  int max_len = 0, total_new = 0, total_prefix = 0;
  for (int i = 0; i < nreq; i++) {
    int decode = c->mode == 0 || (c->mode == 2 && i % 2 == 0);
    rq[i].nnew = decode ? cli_int(r, 1, KVA_MAX_DECODE_Q) : cli_int(r, KVA_MAX_DECODE_Q + 1, small ? 40 : 160);
    rq[i].prefix = cli_int(r, 0, 2) == 0 ? 0 : cli_int(r, 1, small ? 100 : (decode ? 700 : 300));
    if (rq[i].prefix + rq[i].nnew > max_len) max_len = rq[i].prefix + rq[i].nnew;
    total_new += rq[i].nnew;
    total_prefix += rq[i].prefix;
  }
  int parent_len = c->forks ? cli_int(r, 1, 200) : 0;
  int total_tokens = total_prefix + total_new + parent_len;
  kva_pool_config pc = {KVA_LAYOUT_MHA, 2, total_tokens / c->page_size + 2 * nreq + 8, c->page_size,
                        hkv, d, c->kv_dtype};
  kva_pool *pool = NULL;
  kva_req_table *table = NULL;
  kva_plan *plan = NULL;
  void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
  float *dlse = NULL;
  int fail = 2, layer = 1;
  float *qf = NULL, *of = NULL, *lsef = NULL, *kbuf = NULL, *vbuf = NULL;
  double *ref = NULL, *ref_lse = NULL, *ref2 = NULL;
  void *hq_buf = NULL, *hkv_buf = NULL, *hv_buf = NULL, *ho = NULL;
  float **kd = NULL, **vd = NULL;
  float *parent_k = NULL, *parent_v = NULL;
  int parent = -1;
  int32_t cached[64], nnew[64];
  kva_status st;
#define T(call)                                                                                \
  do {                                                                                         \
    if ((st = (call)) != KVA_OK) {                                                             \
      printf("FAIL %s: %s -> %s: %s\n", desc, #call, kva_strerror(st), kva_last_error());      \
      fail = 1;                                                                                \
      goto out;                                                                                \
    }                                                                                          \
  } while (0)
  T(kva_pool_create(ctx, &pc, &pool));
  if (c->kv_dtype == KVA_FP8_E4M3)
    for (int l = 0; l < 2; l++)
      T(kva_pool_set_scale(pool, l, 0.004f + 0.02f * (cli_uniform(r) + 1.0f),
                           0.004f + 0.02f * (cli_uniform(r) + 1.0f)));
  T(kva_req_table_create(pool, nreq + 2, max_len + parent_len + 8, &table));
  int maxq = total_prefix + total_new + parent_len;
  kva_plan_config plc = {nreq + 1, maxq, hq, c->workers, 0};
  T(kva_plan_create(table, &plc, &plan));
  size_t kvbytes = (size_t)maxq * kv_te * 4;
  T(kva_malloc(ctx, kvbytes, &dk));
  T(kva_malloc(ctx, kvbytes, &dv));
  hkv_buf = malloc(kvbytes);
  hv_buf = malloc(kvbytes);
  kbuf = (float *)malloc(kvbytes);
  vbuf = (float *)malloc(kvbytes);

  /* a shared parent whose prefix some requests fork */
  int32_t bs[64], bc[64], bn[64];
  /* Store step: stores n new tokens per listed request with random values,
   * keeping the unquantized originals. Values are drawn per layer but only
   * the checked layer's originals are kept. */
#define STORE_STEP(NB)                                                                        \
  do {                                                                                        \
    kva_batch b_ = {(NB), bs, bc, bn};                                                        \
    T(kva_plan_update(plan, &b_));                                                            \
    int tot_ = 0;                                                                             \
    for (int i_ = 0; i_ < (NB); i_++) tot_ += bn[i_];                                         \
    for (int l_ = 0; l_ < 2; l_++) {                                                          \
      for (size_t e_ = 0; e_ < (size_t)tot_ * kv_te; e_++) {                                  \
        kbuf[e_] = cli_uniform(r);                                                            \
        vbuf[e_] = cli_uniform(r);                                                            \
      }                                                                                       \
      kva_dtype src_t_ = (l_ == 0) ? KVA_BF16 : KVA_F32;                                      \
      for (size_t e_ = 0; e_ < (size_t)tot_ * kv_te; e_++) {                                  \
        if (src_t_ == KVA_BF16) {                                                             \
          kbuf[e_] = kva_bf16_to_f32(kva_f32_to_bf16(kbuf[e_]));                              \
          vbuf[e_] = kva_bf16_to_f32(kva_f32_to_bf16(vbuf[e_]));                              \
        }                                                                                     \
        kva_store_f32(hkv_buf, e_, src_t_, kbuf[e_]);                                         \
        kva_store_f32(hv_buf, e_, src_t_, vbuf[e_]);                                          \
      }                                                                                       \
      T(kva_copy_to_device(ctx, dk, hkv_buf, (size_t)tot_ * kv_te * kva_dtype_size(src_t_))); \
      T(kva_copy_to_device(ctx, dv, hv_buf, (size_t)tot_ * kv_te * kva_dtype_size(src_t_))); \
      T(kva_store_kv(plan, pool, l_, dk, dv, src_t_));                                        \
    }                                                                                         \
  } while (0)

  if (c->forks) {
    T(kva_req_alloc(table, &parent));
    T(kva_req_append(table, parent, parent_len));
    bs[0] = parent;
    bc[0] = 0;
    bn[0] = parent_len;
    STORE_STEP(1);
    parent_k = (float *)malloc((size_t)parent_len * kv_te * 4);
    parent_v = (float *)malloc((size_t)parent_len * kv_te * 4);
    memcpy(parent_k, kbuf, (size_t)parent_len * kv_te * 4);
    memcpy(parent_v, vbuf, (size_t)parent_len * kv_te * 4);
  }
  /* prefixes: forked ones share the parent's first tokens */
  int nb = 0;
  for (int i = 0; i < nreq; i++) {
    int len = rq[i].prefix + rq[i].nnew;
    rq[i].k_orig = (float *)malloc((size_t)len * kv_te * 4);
    rq[i].v_orig = (float *)malloc((size_t)len * kv_te * 4);
    int shared = 0;
    if (c->forks && i % 2 == 1) {
      shared = cli_int(r, 0, parent_len < rq[i].prefix ? parent_len : rq[i].prefix);
      T(kva_req_fork(table, parent, shared, &rq[i].slot));
      memcpy(rq[i].k_orig, parent_k, (size_t)shared * kv_te * 4);
      memcpy(rq[i].v_orig, parent_v, (size_t)shared * kv_te * 4);
    } else {
      T(kva_req_alloc(table, &rq[i].slot));
    }
    if (rq[i].prefix > shared) {
      T(kva_req_append(table, rq[i].slot, rq[i].prefix - shared));
      bs[nb] = rq[i].slot;
      bc[nb] = shared;
      bn[nb] = rq[i].prefix - shared;
      nb++;
    }
  }
  if (nb > 0) {
    STORE_STEP(nb);
    int off = 0;
    for (int i = 0, j = 0; i < nreq && j < nb; i++) {
      if (bs[j] != rq[i].slot) continue;
      memcpy(rq[i].k_orig + (size_t)bc[j] * kv_te, kbuf + (size_t)off * kv_te, (size_t)bn[j] * kv_te * 4);
      memcpy(rq[i].v_orig + (size_t)bc[j] * kv_te, vbuf + (size_t)off * kv_te, (size_t)bn[j] * kv_te * 4);
      off += bn[j];
      j++;
    }
  }
  if (parent >= 0 && cli_int(r, 0, 1)) T(kva_req_release(table, parent)); /* children keep pages */

  /* the attention step */
  for (int i = 0; i < nreq; i++) {
    T(kva_req_append(table, rq[i].slot, rq[i].nnew));
    bs[i] = rq[i].slot;
    bc[i] = rq[i].prefix;
    bn[i] = rq[i].nnew;
  }
  STORE_STEP(nreq);
  {
    int off = 0;
    for (int i = 0; i < nreq; i++) {
      memcpy(rq[i].k_orig + (size_t)rq[i].prefix * kv_te, kbuf + (size_t)off * kv_te, (size_t)rq[i].nnew * kv_te * 4);
      memcpy(rq[i].v_orig + (size_t)rq[i].prefix * kv_te, vbuf + (size_t)off * kv_te, (size_t)rq[i].nnew * kv_te * 4);
      off += rq[i].nnew;
    }
  }
  size_t nq = (size_t)total_new * q_te, qsz = kva_dtype_size(c->q_dtype);
  hq_buf = malloc(nq * qsz);
  ho = malloc(nq * qsz);
  qf = (float *)malloc(nq * 4);
  of = (float *)malloc(nq * 4);
  lsef = (float *)malloc((size_t)total_new * hq * 4);
  cli_fill_random(r, hq_buf, nq, c->q_dtype, 2.0f); /* scores of std ~0.7: peaked, not one-hot */
  cli_to_f32(hq_buf, nq, c->q_dtype, qf);
  T(kva_malloc(ctx, nq * qsz, &dq));
  T(kva_malloc(ctx, nq * qsz, &dout));
  T(kva_malloc(ctx, (size_t)total_new * hq * 4, (void **)&dlse));
  T(kva_copy_to_device(ctx, dq, hq_buf, nq * qsz));
  cli_fill_nan(ho, nq, c->q_dtype);
  T(kva_copy_to_device(ctx, dout, ho, nq * qsz));
  cli_fill_nan(lsef, (size_t)total_new * hq, KVA_F32);
  T(kva_copy_to_device(ctx, dlse, lsef, (size_t)total_new * hq * 4));
  T(kva_attention(plan, pool, layer, &c->ap, dq, dout, c->want_lse ? dlse : NULL, c->q_dtype));
  T(kva_synchronize(ctx));
  T(kva_copy_to_host(ctx, ho, dout, nq * qsz));
  cli_to_f32(ho, nq, c->q_dtype, of);
  if (c->want_lse) T(kva_copy_to_host(ctx, lsef, dlse, (size_t)total_new * hq * 4));

  /* reference on the stored (dequantized) values */
  kd = (float **)calloc((size_t)nreq, sizeof(float *));
  vd = (float **)calloc((size_t)nreq, sizeof(float *));
  for (int i = 0; i < nreq; i++) {
    cached[i] = rq[i].prefix;
    nnew[i] = rq[i].nnew;
    T(kva_ref_read_request_kv(pool, table, rq[i].slot, layer, rq[i].prefix + rq[i].nnew, &kd[i], &vd[i]));
  }
  ref = (double *)malloc(nq * sizeof(double));
  ref_lse = (double *)malloc((size_t)total_new * hq * sizeof(double));
  kva_ref_attention(nreq, cached, nnew, hq, hkv, d, &c->ap, qf, (const float *const *)kd,
                    (const float *const *)vd, ref, ref_lse);
  double err = kva_ref_rel_error(ref, of, nq);
  double tol = c->q_dtype == KVA_F32 ? 1e-5 : 1e-2;
  fail = 0;
  if (!(err < tol)) {
    printf("FAIL %s: rel error %.3g >= %.0e vs reference on stored KV\n", desc, err, tol);
    fail = 1;
  }
  if (err > worst[0]) worst[0] = err;
  if (c->want_lse) {
    double lerr = kva_ref_max_abs_error(ref_lse, lsef, (size_t)total_new * hq);
    double ltol = c->q_dtype == KVA_F32 ? 1e-4 : 2e-3;
    if (!(lerr < ltol)) {
      printf("FAIL %s: LSE max abs error %.3g >= %.0e\n", desc, lerr, ltol);
      fail = 1;
    }
    if (lerr > worst[1]) worst[1] = lerr;
  }
  if (c->kv_dtype == KVA_FP8_E4M3) { /* end to end against the unquantized originals */
    ref2 = (double *)malloc(nq * sizeof(double));
    float **ko = (float **)malloc((size_t)nreq * sizeof(float *));
    float **vo = (float **)malloc((size_t)nreq * sizeof(float *));
    for (int i = 0; i < nreq; i++) {
      ko[i] = rq[i].k_orig;
      vo[i] = rq[i].v_orig;
    }
    kva_ref_attention(nreq, cached, nnew, hq, hkv, d, &c->ap, qf, (const float *const *)ko,
                      (const float *const *)vo, ref2, NULL);
    free(ko);
    free(vo);
    /* This measures e4m3 itself (3-bit mantissa: 2.5% RMS per element), not
     * the kernel, which is held to the dtype tolerance above; it guards
     * against gross quantization bugs (wrong scale, saturation, rounding). */
    double e2 = kva_ref_rel_error(ref2, of, nq);
    if (!(e2 < 0.15)) {
      printf("FAIL %s: fp8 end-to-end rel error %.3g >= 0.15 vs unquantized KV\n", desc, e2);
      fail = 1;
    }
    if (e2 > worst[2]) worst[2] = e2;
  }
out:
  for (int i = 0; i < nreq && kd; i++) {
    free(kd[i]);
    free(vd[i]);
  }
  for (int i = 0; i < nreq; i++) {
    free(rq[i].k_orig);
    free(rq[i].v_orig);
  }
  free(kd); free(vd); free(rq); free(parent_k); free(parent_v);
  free(ref); free(ref_lse); free(ref2); free(qf); free(of); free(lsef); free(kbuf); free(vbuf);
  free(hq_buf); free(hkv_buf); free(hv_buf); free(ho);
  kva_free(ctx, dq); kva_free(ctx, dk); kva_free(ctx, dv); kva_free(ctx, dout); kva_free(ctx, dlse);
  kva_plan_destroy(plan);
  kva_req_table_destroy(table);
  if (pool && fail == 0 && kva_pool_num_free_pages(pool) != kva_pool_get_config(pool)->num_pages) {
    printf("FAIL %s: %d pages leaked after releasing every request\n", desc,
           kva_pool_get_config(pool)->num_pages - kva_pool_num_free_pages(pool));
    fail = 1;
  }
  kva_pool_destroy(pool);
  return fail;
#undef T
#undef STORE_STEP
}

int cli_check(int argc, char **argv) {
  kva_device dev = KVA_DEVICE_CPU;
  unsigned long long seed = 1;
  int cases = 200, small = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      if (!cli_parse_device(argv[++i], &dev)) {
        fprintf(stderr, "kvattn check: --device must be cpu or cuda\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = strtoull(argv[++i], NULL, 10);
    } else if (!strcmp(argv[i], "--cases") && i + 1 < argc) {
      cases = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--small")) {
      small = 1;
    } else if (!strcmp(argv[i], "--help")) {
      printf("usage: kvattn check [--device cpu|cuda] [--seed N] [--cases N] [--small]\n"
             "Randomized sweep (page sizes, GQA/MQA, head dims, prefix, forks, window, soft-cap,\n"
             "fp8/f16/bf16 KV, f32/f16/bf16 Q, LSE, decode q_len 1..8, extend, mixed batches,\n"
             "split-KV worker counts) against the double reference. Prints failing cases, then\n"
             "'N passed, N failed'; exits 1 on any failure, 77 when the device is absent.\n");
      return 0;
    } else {
      fprintf(stderr, "kvattn check: unknown option '%s' (see --help)\n", argv[i]);
      return 2;
    }
  }
  if (cases <= 0) {
    fprintf(stderr, "kvattn check: --cases must be > 0\n");
    return 2;
  }
  kva_context_config cc = {dev, 0, 0};
  kva_context *ctx = NULL;
  kva_status st = kva_context_create(&cc, &ctx);
  if (st == KVA_ERR_NO_DEVICE) {
    printf("kvattn check: SKIPPED: no %s device present (%s)\n", dev == KVA_DEVICE_CUDA ? "CUDA" : "CPU",
           kva_last_error());
    printf("0 passed, 0 failed, %d skipped\n", cases);
    return 77;
  }
  if (st != KVA_OK) {
    fprintf(stderr, "kvattn check: cannot create context: %s: %s\n", kva_strerror(st), kva_last_error());
    return 1;
  }
  cli_rng r = {seed * 0x2545F4914F6CDD1Dull + 7};
  int passed = 0, failed = 0;
  double worst[3] = {0, 0, 0};
  double t0 = cli_now();
  for (int i = 0; i < cases; i++) {
    check_case c = draw_case(&r, small);
    int rc = run_case(ctx, &c, &r, small, worst);
    if (rc == 0) passed++;
    else failed++;
  }
  printf("device %s, seed %llu, %.1f s; worst rel error %.3g, worst LSE abs error %.3g, worst fp8 "
         "end-to-end rel error %.3g\n",
         dev == KVA_DEVICE_CUDA ? "cuda" : "cpu", seed, cli_now() - t0, worst[0], worst[1], worst[2]);
  printf("%d passed, %d failed\n", passed, failed);
  kva_context_destroy(ctx);
  return failed ? 1 : 0;
}
