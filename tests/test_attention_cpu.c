/* CPU backend against the double reference: random attention cases over
 * page sizes, GQA ratios, head dims, KV/Q dtypes, prefixes, masks, soft-cap,
 * mixed decode/extend batches and worker counts (so split-KV runs), on the
 * AVX2 and the portable kernels; plus exactness of the KV store, fork copies,
 * the row conversions and block kernels, and the thread pool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_simd.h"
#include "ref/reference.h"
#include "testutil.h"

#define MAXR 8
#define LAYERS 2

static int g_avx2;
static tu_rng g_rng = {0x5eed1234abcdull};

/* ---- helpers ------------------------------------------------------------ */

static float uni(void) { return tu_uniform(&g_rng); }

static void fill_typed(void *buf, size_t n, kva_dtype t, float amp) {
  for (size_t i = 0; i < n; i++) kva_store_f32(buf, i, t, uni() * amp);
}
static void to_f32(const void *buf, size_t n, kva_dtype t, float *out) {
  for (size_t i = 0; i < n; i++) out[i] = kva_load_f32(buf, i, t);
}
static void poison(void *buf, size_t n, kva_dtype t) {
  for (size_t i = 0; i < n; i++) kva_store_f32(buf, i, t, NAN);
}
static int same_f32(float a, float b) {
  return (isnan(a) && isnan(b)) || kva_f32_bits(a) == kva_f32_bits(b);
}
/* what the pool must hold after storing x */
static float stored_value(float x, kva_dtype kv_t, float scale) {
  switch (kv_t) {
    case KVA_F16: return kva_f16_to_f32(kva_f32_to_f16(x));
    case KVA_BF16: return kva_bf16_to_f32(kva_f32_to_bf16(x));
    case KVA_FP8_E4M3: return kva_fp8e4m3_to_f32(kva_f32_to_fp8e4m3(x * (1.0f / scale))) * scale;
    default: return x;
  }
}
static const kva_dtype ACT[3] = {KVA_F32, KVA_F16, KVA_BF16};

/* ---- one attention case ------------------------------------------------- */

typedef struct {
  int nreq, prefix[MAXR], nnew[MAXR];
  int hq, hkv, d, page, threads, workers, split_block, want_lse;
  kva_dtype kv_t, q_t;
  kva_attn_params ap;
} acase;

typedef struct {
  double worst_o[2], worst_lse; /* [scalar, simd] for f32 Q/O */
  int cases, split_cases, extend_cases, decode_cases, mixed_cases;
} stats;
static stats g_st;

static void describe(const acase *c, char *buf, size_t n) {
  int off = snprintf(buf, n, "hq %d hkv %d d %d page %d kv %s q %s thr %d wk %d blk %d causal %d "
                     "win %d cap %g scale %g reqs",
                     c->hq, c->hkv, c->d, c->page, kva_dtype_name(c->kv_t), kva_dtype_name(c->q_t),
                     c->threads, c->workers, c->split_block, c->ap.causal, c->ap.window_left,
                     (double)c->ap.logit_softcap, (double)c->ap.sm_scale);
  for (int r = 0; r < c->nreq && off > 0 && (size_t)off < n; r++)
    off += snprintf(buf + off, n - (size_t)off, " %d+%d", c->prefix[r], c->nnew[r]);
}

/* Stores random K/V for the batch and checks the stored values exactly. */
static int store_step(kva_plan *plan, kva_pool *pool, kva_req_table *tab, int layer, int nreq,
                      const int32_t *slots, const int32_t *cached, const int32_t *nnew,
                      const char *what) {
  const kva_pool_config *pc = kva_pool_get_config(pool);
  kva_batch b = {nreq, slots, cached, nnew};
  kva_status st = kva_plan_update(plan, &b);
  CHECK(st == KVA_OK, "%s: plan_update: %s", what, kva_last_error());
  if (st != KVA_OK) return 0;
  int total = 0;
  for (int r = 0; r < nreq; r++) total += nnew[r];
  size_t te = (size_t)pc->num_kv_heads * pc->head_dim, n = (size_t)total * te;
  kva_dtype src_t = ACT[tu_int(&g_rng, 0, 2)];
  size_t esz = kva_dtype_size(src_t);
  unsigned char *k = (unsigned char *)malloc(n * esz), *v = (unsigned char *)malloc(n * esz);
  float *kf = (float *)malloc(n * sizeof(float)), *vf = (float *)malloc(n * sizeof(float));
  float *rk = (float *)malloc(n * sizeof(float)), *rv = (float *)malloc(n * sizeof(float));
  int32_t *loc = (int32_t *)malloc((size_t)total * sizeof(int32_t));
  fill_typed(k, n, src_t, 2.0f);
  fill_typed(v, n, src_t, 2.0f);
  st = kva_store_kv(plan, pool, layer, k, v, src_t);
  CHECK(st == KVA_OK, "%s: store_kv: %s", what, kva_last_error());
  /* the new tokens' slots from the request table, in batch order */
  int t = 0;
  for (int r = 0; r < nreq; r++) {
    const int32_t *row = kva_req_tokens(tab, slots[r]);
    for (int i = 0; i < nnew[r]; i++) loc[t++] = row[cached[r] + i];
  }
  st = kva_pool_read_tokens(pool, layer, total, loc, rk, rv);
  CHECK(st == KVA_OK, "%s: read_tokens: %s", what, kva_last_error());
  to_f32(k, n, src_t, kf);
  to_f32(v, n, src_t, vf);
  float ks = pool->k_scale[layer], vs = pool->v_scale[layer];
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    float ek = stored_value(kf[i], pc->kv_dtype, ks), ev = stored_value(vf[i], pc->kv_dtype, vs);
    if (!same_f32(ek, rk[i]) || !same_f32(ev, rv[i])) {
      if (!bad) first = i;
      bad++;
    }
  }
  CHECK(bad == 0, "%s: %zu stored elements differ from the %s source, first %zu: k %g v %g",
        what, bad, kva_dtype_name(src_t), first, (double)rk[first], (double)rv[first]);
  free(k), free(v), free(kf), free(vf), free(rk), free(rv), free(loc);
  return st == KVA_OK;
}

static void run_case(const acase *c) {
  char desc[512];
  describe(c, desc, sizeof(desc));
  kva_context_config cc = {KVA_DEVICE_CPU, c->threads, 0};
  kva_context *ctx = NULL;
  kva_pool *pool = NULL;
  kva_req_table *tab = NULL;
  kva_plan *plan = NULL;
  int32_t slots[MAXR], zero[MAXR], cached[MAXR], nnew[MAXR], pslots[MAXR], pnew[MAXR];
  int pages = 4, maxlen = 1, total_q = 0, total_p = 0, np = 0, layer = 1;
  for (int r = 0; r < c->nreq; r++) {
    int len = c->prefix[r] + c->nnew[r];
    pages += (len + c->page - 1) / c->page;
    if (len > maxlen) maxlen = len;
    total_q += c->nnew[r];
    total_p += c->prefix[r];
  }
  kva_pool_config pc = {KVA_LAYOUT_MHA, LAYERS, pages, c->page, c->hkv, c->d, c->kv_t};
  CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_OK);
  if (!ctx) return;
  CHECK_STATUS(kva_pool_create(ctx, &pc, &pool), KVA_OK);
  if (!pool) goto out;
  if (c->kv_t == KVA_FP8_E4M3) { /* stored = x / scale must stay within +-448 */
    CHECK_STATUS(kva_pool_set_scale(pool, 0, 0.5f, 0.5f), KVA_OK);
    CHECK_STATUS(kva_pool_set_scale(pool, layer, 0.006f + 0.03f * (uni() + 1.0f),
                                    0.006f + 0.03f * (uni() + 1.0f)),
                 KVA_OK);
  }
  CHECK_STATUS(kva_req_table_create(pool, c->nreq, maxlen, &tab), KVA_OK);
  if (!tab) goto out;
  for (int r = 0; r < c->nreq; r++) {
    int s = -1;
    CHECK_STATUS(kva_req_alloc(tab, &s), KVA_OK);
    CHECK_STATUS(kva_req_append(tab, s, c->prefix[r] + c->nnew[r]), KVA_OK);
    slots[r] = s;
    zero[r] = 0;
    cached[r] = c->prefix[r];
    nnew[r] = c->nnew[r];
    if (c->prefix[r] > 0) {
      pslots[np] = s;
      pnew[np++] = c->prefix[r];
    }
  }
  kva_plan_config plc = {c->nreq, total_q > total_p ? total_q : total_p, c->hq, c->workers,
                         c->split_block, 0};
  CHECK_STATUS(kva_plan_create(tab, &plc, &plan), KVA_OK);
  if (!plan) goto out;
  /* step 1: the prefixes (written as a prefill with nothing cached) */
  if (np > 0 && !store_step(plan, pool, tab, layer, np, pslots, zero, pnew, desc)) goto out;
  /* step 2: the new tokens attend to prefix + themselves */
  if (!store_step(plan, pool, tab, layer, c->nreq, slots, cached, nnew, desc)) goto out;
  kva_plan_info info;
  CHECK_STATUS(kva_plan_get_info(plan, &info), KVA_OK);
  g_st.cases++;
  if (info.num_splits_total > info.num_decode) g_st.split_cases++;
  if (info.num_extend > 0) g_st.extend_cases++;
  if (info.num_decode > 0) g_st.decode_cases++;
  if (info.num_decode > 0 && info.num_extend > 0) g_st.mixed_cases++;

  size_t qn = (size_t)total_q * c->hq * c->d, ln = (size_t)total_q * c->hq;
  size_t qsz = kva_dtype_size(c->q_t);
  void *q = malloc(qn * qsz), *o = malloc(qn * qsz);
  float *qf = (float *)malloc(qn * sizeof(float)), *of = (float *)malloc(qn * sizeof(float));
  float *lse = (float *)malloc(ln * sizeof(float));
  double *ro = (double *)malloc(qn * sizeof(double)), *rl = (double *)malloc(ln * sizeof(double));
  float *kd[MAXR] = {0}, *vd[MAXR] = {0};
  fill_typed(q, qn, c->q_t, 2.0f);
  to_f32(q, qn, c->q_t, qf); /* the reference sees the Q the kernel sees */
  for (int r = 0; r < c->nreq; r++)
    CHECK_STATUS(kva_ref_read_request_kv(pool, tab, slots[r], layer, c->prefix[r] + c->nnew[r],
                                         &kd[r], &vd[r]),
                 KVA_OK);
  kva_ref_attention(c->nreq, cached, nnew, c->hq, c->hkv, c->d, &c->ap, qf,
                    (const float *const *)kd, (const float *const *)vd, ro, rl);
  double tol = c->q_t == KVA_F32 ? 1e-5 : 1e-2;
  for (int simd = 0; simd <= g_avx2; simd++) {
    CHECK_STATUS(kva_cpu_set_simd(ctx, simd), KVA_OK);
    poison(o, qn, c->q_t);
    for (size_t i = 0; i < ln; i++) lse[i] = NAN;
    kva_status st = kva_attention(plan, pool, layer, &c->ap, q, o, c->want_lse ? lse : NULL,
                                  c->q_t);
    CHECK(st == KVA_OK, "attention (%s): %s [%s]", simd ? "avx2" : "scalar", kva_last_error(),
          desc);
    to_f32(o, qn, c->q_t, of);
    double err = kva_ref_rel_error(ro, of, qn);
    CHECK(err < tol, "O rel error %g >= %g (%s) [%s]", err, tol, simd ? "avx2" : "scalar", desc);
    if (c->q_t == KVA_F32 && err > g_st.worst_o[simd]) g_st.worst_o[simd] = err;
    if (c->want_lse) {
      double le = kva_ref_max_abs_error(rl, lse, ln);
      CHECK(le < 2e-5, "LSE abs error %g (%s) [%s]", le, simd ? "avx2" : "scalar", desc);
      if (le > g_st.worst_lse) g_st.worst_lse = le;
    }
  }
  for (int r = 0; r < c->nreq; r++) free(kd[r]), free(vd[r]);
  free(q), free(o), free(qf), free(of), free(lse), free(ro), free(rl);
out:
  kva_plan_destroy(plan);
  kva_req_table_destroy(tab);
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
}

static acase random_case(void) {
  static const int pages[] = {1, 7, 16, 64, 3, 16};
  static const int dims[] = {64, 128, 256, 72, 8, 128};
  static const int gqa[][2] = {{4, 4}, {8, 2}, {16, 4}, {8, 1}, {16, 2}, {2, 1}};
  static const kva_dtype kvs[] = {KVA_F16, KVA_BF16, KVA_FP8_E4M3};
  acase c;
  memset(&c, 0, sizeof(c));
  c.page = pages[tu_int(&g_rng, 0, 5)];
  c.d = dims[tu_int(&g_rng, 0, 5)];
  int g = tu_int(&g_rng, 0, 5);
  c.hq = gqa[g][0];
  c.hkv = gqa[g][1];
  c.kv_t = kvs[tu_int(&g_rng, 0, 2)];
  c.q_t = ACT[tu_int(&g_rng, 0, 2)];
  c.threads = tu_int(&g_rng, 1, 3);
  c.workers = tu_int(&g_rng, 0, 2) ? tu_int(&g_rng, 1, 7) : 0;
  c.split_block = tu_int(&g_rng, 0, 1) ? (int[]){8, 16, 32, 64}[tu_int(&g_rng, 0, 3)] : 0;
  c.want_lse = tu_int(&g_rng, 0, 3) != 0;
  c.ap = kva_attn_params_default();
  c.ap.causal = tu_int(&g_rng, 0, 4) != 0;
  if (tu_int(&g_rng, 0, 3) == 0) c.ap.window_left = tu_int(&g_rng, 0, 120);
  if (tu_int(&g_rng, 0, 3) == 0) c.ap.logit_softcap = 2.0f + 30.0f * (uni() + 1.0f);
  if (tu_int(&g_rng, 0, 3) == 0) c.ap.sm_scale = 0.03f + 0.15f * (uni() + 1.0f);
  int kind = tu_int(&g_rng, 0, 2); /* 0 decode only, 1 extend only, 2 mixed */
  c.nreq = tu_int(&g_rng, 1, 6);
  /* keep the double reference cheap: fewer keys for big rows */
  int maxp = c.d * c.hq >= 2048 ? 160 : 400;
  for (int r = 0; r < c.nreq; r++) {
    int ext = kind == 1 || (kind == 2 && (c.nreq == 1 ? tu_int(&g_rng, 0, 1) : r % 2));
    c.nnew[r] = ext ? tu_int(&g_rng, KVA_MAX_DECODE_Q + 1, 48) : tu_int(&g_rng, 1, KVA_MAX_DECODE_Q);
    c.prefix[r] = tu_int(&g_rng, 0, 3) == 0 ? 0 : tu_int(&g_rng, 1, maxp);
  }
  return c;
}

/* Named cases that each pin one feature. */
static void fixed_cases(void) {
  acase c;
  memset(&c, 0, sizeof(c));
  c.ap = kva_attn_params_default();
  c.hq = 32, c.hkv = 8, c.d = 128, c.page = 16, c.threads = 2, c.want_lse = 1;
  c.kv_t = KVA_BF16, c.q_t = KVA_F32;
  /* long decode, split over many workers */
  c.nreq = 3, c.workers = 7, c.split_block = 64;
  c.prefix[0] = 1500, c.prefix[1] = 700, c.prefix[2] = 33;
  c.nnew[0] = 1, c.nnew[1] = 4, c.nnew[2] = 8;
  run_case(&c);
  /* the same with fp8 and f16 KV, bf16 Q/O */
  c.kv_t = KVA_FP8_E4M3, c.q_t = KVA_BF16;
  run_case(&c);
  c.kv_t = KVA_F16, c.q_t = KVA_F16;
  run_case(&c);
  /* window 0: each token sees only itself; non-causal window */
  c.kv_t = KVA_BF16, c.q_t = KVA_F32, c.ap.window_left = 0;
  c.nnew[1] = 20;
  run_case(&c);
  c.ap.causal = 0, c.ap.window_left = 5;
  run_case(&c);
  /* soft-cap with an explicit scale, MQA, page size 1 */
  c.ap = kva_attn_params_default();
  c.ap.logit_softcap = 3.0f, c.ap.sm_scale = 0.5f;
  c.hq = 8, c.hkv = 1, c.page = 1, c.d = 64;
  run_case(&c);
  /* prefill only, no prefix, big odd page */
  c.ap = kva_attn_params_default();
  c.page = 37, c.hq = 8, c.hkv = 8, c.d = 72, c.nreq = 2;
  c.prefix[0] = 0, c.prefix[1] = 0, c.nnew[0] = 100, c.nnew[1] = 9;
  run_case(&c);
  /* one thread, one worker, one 1-token request with one key */
  c.threads = 1, c.workers = 1, c.nreq = 1, c.prefix[0] = 0, c.nnew[0] = 1;
  run_case(&c);
}

/* ---- fork copies (copy_slots) --------------------------------------------- */

static void test_fork_copy(void) {
  kva_context_config cc = {KVA_DEVICE_CPU, 2, 0};
  kva_context *ctx = NULL;
  kva_pool *pool = NULL;
  kva_req_table *tab = NULL;
  CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_OK);
  kva_pool_config pc = {KVA_LAYOUT_MHA, 3, 16, 8, 2, 16, KVA_BF16};
  CHECK_STATUS(kva_pool_create(ctx, &pc, &pool), KVA_OK);
  CHECK_STATUS(kva_req_table_create(pool, 4, 64, &tab), KVA_OK);
  if (!tab) goto out;
  int src = -1, dst = -1, len = 21; /* two whole pages and 5 tokens */
  CHECK_STATUS(kva_req_alloc(tab, &src), KVA_OK);
  CHECK_STATUS(kva_req_append(tab, src, len), KVA_OK);
  size_t te = (size_t)pc.num_kv_heads * pc.head_dim;
  for (int l = 0; l < pc.num_layers; l++) { /* random contents everywhere */
    void *k, *v;
    CHECK_STATUS(kva_pool_get_buffers(pool, l, &k, &v), KVA_OK);
    fill_typed(k, (size_t)pc.num_pages * pc.page_size * te, KVA_BF16, 1.0f);
    fill_typed(v, (size_t)pc.num_pages * pc.page_size * te, KVA_BF16, 1.0f);
  }
  CHECK_STATUS(kva_req_fork(tab, src, len, &dst), KVA_OK);
  if (dst < 0) goto out;
  const int32_t *a = kva_req_tokens(tab, src), *b = kva_req_tokens(tab, dst);
  CHECK(b[len - 1] != a[len - 1], "partial last page must be a copy, not shared");
  size_t n = (size_t)len * te;
  float *ka = malloc(n * 4), *va = malloc(n * 4), *kb = malloc(n * 4), *vb = malloc(n * 4);
  for (int l = 0; l < pc.num_layers; l++) {
    CHECK_STATUS(kva_pool_read_tokens(pool, l, len, a, ka, va), KVA_OK);
    CHECK_STATUS(kva_pool_read_tokens(pool, l, len, b, kb, vb), KVA_OK);
    CHECK(!memcmp(ka, kb, n * 4) && !memcmp(va, vb, n * 4), "layer %d: fork differs", l);
  }
  free(ka), free(va), free(kb), free(vb);
out:
  kva_req_table_destroy(tab);
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
}

/* ---- kernels ------------------------------------------------------------ */

static void test_conversions(void) {
  static uint8_t codes8[256];
  static uint16_t codes16[65536];
  static float out[65536];
  for (int i = 0; i < 256; i++) codes8[i] = (uint8_t)i;
  for (int i = 0; i < 65536; i++) codes16[i] = (uint16_t)i;
  for (int simd = 0; simd <= g_avx2; simd++) {
    int bad = 0;
    kva_cpu_row_to_f32(simd, codes8, KVA_FP8_E4M3, 256, 0.37f, out);
    for (int i = 0; i < 256; i++) bad += !same_f32(out[i], kva_fp8e4m3_to_f32((uint8_t)i) * 0.37f);
    CHECK(bad == 0, "fp8 row conversion (simd %d): %d codes differ", simd, bad);
    kva_dtype t16[2] = {KVA_F16, KVA_BF16};
    for (int k = 0; k < 2; k++) {
      bad = 0;
      kva_cpu_row_to_f32(simd, codes16, t16[k], 65536, 1.0f, out);
      for (int i = 0; i < 65536; i++)
        bad += !same_f32(out[i], kva_load_f32(codes16, (size_t)i, t16[k]));
      CHECK(bad == 0, "%s row conversion (simd %d): %d codes differ", kva_dtype_name(t16[k]),
            simd, bad);
    }
  }
}

static void test_block_kernels(void) {
  enum { NB = 40, ROWS = 11, DMAX = 264 };
  static float q[ROWS][DMAX], acc[ROWS][DMAX], p[ROWS][NB], s[ROWS][NB];
  static double want_s[ROWS][NB], mag_s[ROWS][NB], want_acc[ROWS][DMAX], mag_acc[ROWS][DMAX];
  static unsigned char kv[NB][DMAX * 4];
  static const char lines[4][200];
  const char *pf_rows[4] = {lines[0], lines[1] + 5, lines[2] + 63, lines[3]};
  kva_cpu_prefetch pf = {pf_rows, 4, 130};
  kva_dtype types[4] = {KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3};
  for (int it = 0; it < 300; it++) {
    int simd = it % 2 && g_avx2, nrows = tu_int(&g_rng, 1, ROWS), nb = tu_int(&g_rng, 1, NB);
    int d = 8 * tu_int(&g_rng, 1, DMAX / 8);
    kva_dtype t = types[tu_int(&g_rng, 0, 3)];
    double unit = t == KVA_FP8_E4M3 ? 1.0 / KVA_CPU_FP8_DIV : 1.0; /* kernels' fp8 view */
    float scale = 0.1f + uni() * 0.05f;
    const float *qp[ROWS];
    float *ap[ROWS];
    const void *rows[NB];
    for (int j = 0; j < nb; j++) {
      fill_typed(kv[j], (size_t)d, t, 1.5f);
      rows[j] = kv[j];
    }
    for (int i = 0; i < nrows; i++) {
      for (int e = 0; e < d; e++) q[i][e] = uni() * 2.0f, acc[i][e] = uni();
      for (int j = 0; j < nb; j++) p[i][j] = tu_int(&g_rng, 0, 5) ? uni() + 1.0f : 0.0f;
      qp[i] = q[i];
      ap[i] = acc[i];
      for (int e = 0; e < d; e++) want_acc[i][e] = acc[i][e], mag_acc[i][e] = fabs(acc[i][e]);
      for (int j = 0; j < nb; j++) {
        double dot = 0, mag = 0;
        for (int e = 0; e < d; e++) {
          double x = kva_load_f32(kv[j], (size_t)e, t) * unit;
          dot += (double)q[i][e] * x;
          mag += fabs((double)q[i][e] * x);
          want_acc[i][e] += (double)p[i][j] * x;
          mag_acc[i][e] += fabs((double)p[i][j] * x);
        }
        want_s[i][j] = dot * scale;
        mag_s[i][j] = mag * scale;
        s[i][j] = NAN;
      }
    }
    kva_cpu_qk(simd, nrows, qp, rows, t, nb, d, scale, &s[0][0], NB, it % 3 ? &pf : NULL);
    kva_cpu_pv(simd, nrows, ap, &p[0][0], NB, rows, t, nb, d, it % 3 ? &pf : NULL);
    int bad = 0;
    for (int i = 0; i < nrows; i++) {
      for (int j = 0; j < nb; j++)
        bad += !(fabs(s[i][j] - want_s[i][j]) <= 2e-6 * mag_s[i][j]);
      for (int e = 0; e < d; e++)
        bad += !(fabs(acc[i][e] - want_acc[i][e]) <= 2e-6 * mag_acc[i][e]);
    }
    CHECK(bad == 0, "block kernels (simd %d, %s, rows %d, keys %d, d %d): %d wrong", simd,
          kva_dtype_name(t), nrows, nb, d, bad);
  }
}

static void test_exp_sum(void) {
  float s[37], orig[37];
  for (int simd = 0; simd <= g_avx2; simd++)
    for (int n = 1; n <= 37; n += 4) {
      double want = 0;
      for (int j = 0; j < n; j++) {
        orig[j] = s[j] = j % 5 == 3 ? -INFINITY : uni() * 40.0f - 20.0f;
        if (orig[j] != -INFINITY) want += exp((double)(orig[j] - 3.0f)); /* x - m is a float */
      }
      float got = kva_cpu_exp_sum(simd, s, n, 3.0f);
      /* a float sum of n positive terms is within ~n ulps */
      int bad = !(fabs(got - want) <= (n + 4) * 1.2e-7 * want + 1e-37);
      for (int j = 0; j < n; j++) {
        double w = orig[j] == -INFINITY ? 0.0 : exp((double)(orig[j] - 3.0f));
        bad += !(fabs(s[j] - w) <= 1e-6 * w + 1e-37);
      }
      CHECK(bad == 0, "exp_sum (simd %d, n %d): %d wrong, sum %.9g want %.9g", simd, n, bad,
            (double)got, want);
    }
}

/* ---- thread pool -------------------------------------------------------- */

typedef struct {
  int *hits;
  int nthreads;
  int bad_thread;
} tp_arg;
static void tp_task(void *arg, int task, int thread) {
  tp_arg *a = (tp_arg *)arg;
  a->hits[task]++; /* each task runs exactly once, so no two threads share a slot */
  if (thread < 0 || thread >= a->nthreads) a->bad_thread = 1;
}

static void test_threadpool(void) {
  for (int n = 1; n <= 4; n++) {
    kva_threadpool *tp = kva_threadpool_create(n);
    CHECK(tp != NULL && kva_threadpool_size(tp) == n, "threadpool_create(%d)", n);
    if (!tp) continue;
    for (int rep = 0; rep < 50; rep++) {
      int tasks = tu_int(&g_rng, 0, 300), hits[300] = {0};
      tp_arg a = {hits, n, 0};
      kva_threadpool_run(tp, tasks, tp_task, &a);
      int bad = a.bad_thread;
      for (int i = 0; i < 300; i++) bad += hits[i] != (i < tasks);
      CHECK(bad == 0, "threadpool %d threads, %d tasks: %d wrong", n, tasks, bad);
    }
    kva_threadpool_destroy(tp);
  }
}

static void test_set_simd(void) {
  kva_context_config cc = {KVA_DEVICE_CPU, 1, 0};
  kva_context *ctx = NULL;
  CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_OK);
  CHECK_STATUS(kva_cpu_set_simd(NULL, 0), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_cpu_set_simd(ctx, 0), KVA_OK);
  CHECK(kva_cpu_get_simd(ctx) == 0, "simd off");
  CHECK_STATUS(kva_cpu_set_simd(ctx, 1), g_avx2 ? KVA_OK : KVA_ERR_UNSUPPORTED);
  CHECK(kva_cpu_get_simd(ctx) == g_avx2, "simd on");
  CHECK(kva_context_num_workers(ctx) == 1, "num_threads 1 -> 1 worker");
  kva_context_destroy(ctx);
}

int main(int argc, char **argv) {
  int ncases = argc > 1 ? atoi(argv[1]) : 160;
  g_avx2 = kva_cpu_has_avx2();
  if (!g_avx2) printf("test_attention_cpu: no AVX2 on this CPU; portable kernels only\n");
  test_set_simd();
  test_threadpool();
  test_conversions();
  test_block_kernels();
  test_exp_sum();
  test_fork_copy();
  fixed_cases();
  for (int i = 0; i < ncases; i++) run_case((const acase[]){random_case()});
  CHECK(g_st.split_cases > 0 && g_st.extend_cases > 0 && g_st.mixed_cases > 0,
        "sweep coverage: %d split, %d extend, %d mixed of %d", g_st.split_cases,
        g_st.extend_cases, g_st.mixed_cases, g_st.cases);
  printf("attention cases %d (split-KV %d, with extend %d, mixed %d); worst f32 O rel error "
         "scalar %.2e avx2 %.2e; worst LSE abs error %.2e\n",
         g_st.cases, g_st.split_cases, g_st.extend_cases, g_st.mixed_cases, g_st.worst_o[0],
         g_st.worst_o[1], g_st.worst_lse);
  return tu_summary("test_attention_cpu");
}
