/* CUDA backend against the CPU backend and the double-precision reference:
 * the same pools, request tables and batches are built on a CPU and a CUDA
 * context, then
 *   - kva_store_kv (f32/f16/bf16 sources incl. special values, unaligned
 *     sources, f16/bf16/fp8 pools) must leave both pools bit-identical,
 *   - kva_req_fork's partial-page copy (copy_slots) likewise,
 *   - kva_attention on NaN-poisoned outputs must match the reference and
 *     the CPU result: decode (split-KV tensor-core kernel and its combine),
 *     extend, mixed batches, fp8 KV, page sizes 1/16/64, GQA/MQA, window,
 *     soft-cap, q tokens 1..8, and the CUDA-core fallback (f32 Q, head dim
 *     40, Q/KV of different 16-bit types),
 *   - kva_merge_states matches the CPU merge (vector and scalar paths,
 *     -inf states, output aliasing input),
 *   - a caller's own stream capture of a plan's attention replays other
 *     batches correctly and sizes their workers for the captured kernel.
 * Prints "SKIP: no CUDA device" and exits 77 without a GPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "ref/reference.h"
#include "testutil.h"

#ifdef KVA_WITH_CUDA /* a CPU-only build has no CUDA runtime (the test skips there) */
#include <cuda_runtime.h>
#endif

static tu_rng rng = {20261121};

/* A tensor in both worlds: host bytes (the CPU context's memory) and the
 * same bytes on the GPU. */
typedef struct twin {
  void *h, *d;
  size_t bytes;
} twin;

static int twin_upload(kva_context *g, twin *t, const void *host, size_t bytes) {
  t->bytes = bytes;
  t->h = malloc(bytes ? bytes : 1);
  t->d = NULL;
  if (!t->h) return 0;
  memcpy(t->h, host, bytes);
  if (kva_malloc(g, bytes, &t->d) != KVA_OK) return 0;
  return kva_copy_to_device(g, t->d, host, bytes) == KVA_OK;
}
static void twin_free(kva_context *g, twin *t) {
  free(t->h);
  kva_free(g, t->d);
  t->h = t->d = NULL;
}

/* n random values of dtype t (amp * U(-1, 1), rounded to t); f32 copy in *f. */
static void *rand_bytes(size_t n, kva_dtype t, float amp, float **f) {
  unsigned char *b = malloc(n * kva_dtype_size(t) + 16);
  if (f) *f = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    kva_store_f32(b, i, t, amp * tu_uniform(&rng));
    if (f && *f) (*f)[i] = kva_load_f32(b, i, t);
  }
  return b;
}

/* Both pools' layer buffers bit for bit. */
static void check_pools_equal(kva_context *g, kva_pool *pc, kva_pool *pg, int layer,
                              const char *what) {
  void *kc, *vc, *kg, *vg;
  CHECK_STATUS(kva_pool_get_buffers(pc, layer, &kc, &vc), KVA_OK);
  CHECK_STATUS(kva_pool_get_buffers(pg, layer, &kg, &vg), KVA_OK);
  const kva_pool_config *cfg = kva_pool_get_config(pc);
  size_t bytes = (size_t)cfg->num_pages * cfg->page_size * cfg->num_kv_heads * cfg->head_dim *
                 kva_dtype_size(cfg->kv_dtype);
  unsigned char *h = malloc(bytes);
  for (int b = 0; b < 2; b++) {
    void *src = b == 0 ? kg : vg, *ref = b == 0 ? kc : vc;
    if (!src || !ref) continue;
    CHECK_STATUS(kva_copy_to_host(g, h, src, bytes), KVA_OK);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < bytes; i++)
      if (h[i] != ((unsigned char *)ref)[i] && bad++ == 0) first = i;
    CHECK(bad == 0, "%s: %s pool differs from the CPU store in %zu bytes (first at %zu)", what,
          b == 0 ? "K" : "V", bad, first);
  }
  free(h);
}

/* ---- attention cases ------------------------------------------------------ */

typedef struct attn_case {
  const char *name;
  int d, page, hq, hkv, causal, window;
  float softcap;
  kva_dtype qt, kvt, src_t; /* Q/O, pool, new-K/V source */
  int nreq;
  const int *cached, *fresh;
  int workers, split_block; /* 0 = defaults */
  int with_lse;
} attn_case;

typedef struct world {
  kva_context *ctx;
  kva_pool *pool;
  kva_req_table *tab;
  kva_plan *pre;  /* prefix step: capacity for every prefix token */
  kva_plan *plan; /* step under test: max_q_tokens = its tokens (decode shapes by capacity) */
  int32_t *slots;
} world;

static void world_free(world *w) {
  kva_plan_destroy(w->plan);
  kva_plan_destroy(w->pre);
  kva_req_table_destroy(w->tab);
  kva_pool_destroy(w->pool);
  free(w->slots);
  memset(w, 0, sizeof *w);
  /* ctx is shared */
}

/* plan config `deterministic` of the next worlds (each case runs with 0 and 1) */
static int g_deterministic;

static int world_make(world *w, kva_context *ctx, const attn_case *c, int pages, int max_len,
                      int max_pre, int max_q, int max_reqs, int layers, int layer) {
  memset(w, 0, sizeof *w);
  w->ctx = ctx;
  kva_pool_config pc = {KVA_LAYOUT_MHA, layers, pages, c->page, c->hkv, c->d, c->kvt};
  CHECK_STATUS(kva_pool_create(ctx, &pc, &w->pool), KVA_OK);
  if (!w->pool) return 0;
  if (c->kvt == KVA_FP8_E4M3) CHECK_STATUS(kva_pool_set_scale(w->pool, layer, 0.02f, 0.015f), KVA_OK);
  CHECK_STATUS(kva_req_table_create(w->pool, max_reqs, max_len, &w->tab), KVA_OK);
  if (!w->tab) return 0;
  w->slots = calloc((size_t)c->nreq, sizeof(int32_t));
  for (int r = 0; r < c->nreq; r++) {
    CHECK_STATUS(kva_req_alloc(w->tab, &w->slots[r]), KVA_OK);
    CHECK_STATUS(kva_req_append(w->tab, w->slots[r], c->cached[r] + c->fresh[r]), KVA_OK);
  }
  kva_plan_config pre = {c->nreq, max_pre, c->hq, 0, 0, 0};
  kva_plan_config cfg = {c->nreq, max_q, c->hq, c->workers, c->split_block, g_deterministic};
  CHECK_STATUS(kva_plan_create(w->tab, &pre, &w->pre), KVA_OK);
  CHECK_STATUS(kva_plan_create(w->tab, &cfg, &w->plan), KVA_OK);
  return w->plan != NULL && w->pre != NULL;
}

/* Stores n new tokens' K/V of the planned batch (pre or plan) from one
 * random source into both worlds; specials adds saturating, subnormal,
 * NaN/inf and signed-zero inputs (for layers attention does not read). */
static void store_both(world *cw, world *gw, int use_pre, int layer, size_t n, kva_dtype src_t,
                       float amp, int unaligned, int specials, const char *what) {
  const kva_pool_config *pc = kva_pool_get_config(cw->pool);
  size_t elems = n * pc->num_kv_heads * pc->head_dim, es = kva_dtype_size(src_t);
  unsigned char *kb = rand_bytes(elems, src_t, amp, NULL), *vb = rand_bytes(elems, src_t, amp, NULL);
  /* special values: saturation, subnormals, NaN, signed zero */
  const float special[] = {1e6f, -1e6f, 3e-7f, -2e-9f, 0.0f, -0.0f, nanf(""), 447.9f * 0.02f,
                           65519.0f, 65520.0f, 1e-30f, -INFINITY};
  for (size_t i = 0; specials && i < sizeof special / sizeof special[0] && i * 37 < elems; i++) {
    if (src_t != KVA_F32 && (isnan(special[i]) || isinf(special[i]))) continue;
    kva_store_f32(kb, i * 37, src_t, special[i]);
    kva_store_f32(vb, elems - 1 - i * 37, src_t, special[i]);
  }
  twin k, v;
  size_t off = unaligned ? es : 0; /* shifts the GPU source off 16-byte alignment */
  unsigned char *kx = calloc(elems * es + off, 1), *vx = calloc(elems * es + off, 1);
  memcpy(kx + off, kb, elems * es);
  memcpy(vx + off, vb, elems * es);
  int ok = twin_upload(gw->ctx, &k, kx, elems * es + off) &&
           twin_upload(gw->ctx, &v, vx, elems * es + off);
  CHECK(ok, "%s: device buffers", what);
  if (ok) {
    CHECK_STATUS(kva_store_kv(use_pre ? cw->pre : cw->plan, cw->pool, layer, kb, vb, src_t), KVA_OK);
    CHECK_STATUS(kva_store_kv(use_pre ? gw->pre : gw->plan, gw->pool, layer, (char *)k.d + off,
                              (char *)v.d + off, src_t),
                 KVA_OK);
    CHECK_STATUS(kva_synchronize(gw->ctx), KVA_OK);
    check_pools_equal(gw->ctx, cw->pool, gw->pool, layer, what);
  }
  twin_free(gw->ctx, &k);
  twin_free(gw->ctx, &v);
  free(kb);
  free(vb);
  free(kx);
  free(vx);
}

/* The planned batch's attention on both worlds (fresh random Q, NaN-poisoned
 * O and LSE), checked against the double reference over the GPU pool's K/V
 * and against the CPU's output; then once more over NaN (bitwise the same
 * for a deterministic plan). */
static void attend_and_check(kva_context *gpu, world *cw, world *gw, const attn_case *c, int R,
                             const int32_t *cached, const int32_t *fresh, int total_q,
                             int layer) {
  int ok;
  const size_t qn = (size_t)total_q * c->hq * c->d, es = kva_dtype_size(c->qt);
  const size_t lbytes = (size_t)total_q * c->hq * sizeof(float);
  float *qf = NULL;
  void *qh = rand_bytes(qn, c->qt, 1.5f, &qf);
  unsigned char *poison = malloc(qn * es);
  memset(poison, 0xff, qn * es); /* NaN in f32, f16 and bf16 */
  float *lpoison = malloc(lbytes);
  tu_poison(lpoison, lbytes / 4);
  twin q, o, lse;
  ok = twin_upload(gpu, &q, qh, qn * es) && twin_upload(gpu, &o, poison, qn * es) &&
       twin_upload(gpu, &lse, lpoison, lbytes);
  CHECK(ok, "%s: device buffers", c->name);
  kva_attn_params prm = kva_attn_params_default();
  prm.causal = c->causal;
  prm.window_left = c->window;
  prm.logit_softcap = c->softcap;
  float *og = malloc(qn * sizeof(float)), *oc = malloc(qn * sizeof(float));
  float *lg = malloc(lbytes);
  unsigned char *ob = malloc(qn * es);
  if (ok) {
    CHECK_STATUS(kva_attention(cw->plan, cw->pool, layer, &prm, q.h, o.h,
                               c->with_lse ? (float *)lse.h : NULL, c->qt),
                 KVA_OK);
    CHECK_STATUS(kva_attention(gw->plan, gw->pool, layer, &prm, q.d, o.d,
                               c->with_lse ? (float *)lse.d : NULL, c->qt),
                 KVA_OK);
    CHECK_STATUS(kva_synchronize(gpu), KVA_OK);
    CHECK_STATUS(kva_copy_to_host(gpu, ob, o.d, qn * es), KVA_OK);
    CHECK_STATUS(kva_copy_to_host(gpu, lg, lse.d, lbytes), KVA_OK);
    for (size_t i = 0; i < qn; i++) {
      og[i] = kva_load_f32(ob, i, c->qt);
      oc[i] = kva_load_f32(o.h, i, c->qt);
    }
    /* reference over the GPU pool's own (dequantized) K/V */
    double *ro = malloc(qn * sizeof(double)), *rl = malloc((size_t)total_q * c->hq * sizeof(double));
    double *co = malloc(qn * sizeof(double));
    float **kr = calloc((size_t)R, sizeof(float *)), **vr = calloc((size_t)R, sizeof(float *));
    int rd = 1;
    for (int r = 0; r < R; r++)
      if (kva_ref_read_request_kv(gw->pool, gw->tab, gw->slots[r], layer, cached[r] + fresh[r],
                                  &kr[r], &vr[r]) != KVA_OK)
        rd = 0;
    CHECK(rd, "%s: reading the pool back: %s", c->name, kva_last_error());
    if (rd) {
      kva_ref_attention(R, cached, fresh, c->hq, c->hkv, c->d, &prm, qf,
                        (const float *const *)kr, (const float *const *)vr, ro, rl);
      /* 16-bit outputs: O and P rounding (bf16 8 bits, f16 11); f32 Q/O on
       * the CUDA-core kernel: f32 accumulation only */
      const double tol = c->qt == KVA_BF16 ? 6e-3 : c->qt == KVA_F16 ? 1e-3 : 1e-5;
      double rel = kva_ref_rel_error(ro, og, qn);
      CHECK(rel < tol, "%s: GPU O vs reference: relative error %.3g (tolerance %.1g)", c->name,
            rel, tol);
      for (size_t i = 0; i < qn; i++) co[i] = oc[i];
      double relc = kva_ref_rel_error(co, og, qn);
      CHECK(relc < 2 * tol, "%s: GPU O vs CPU O: relative error %.3g (tolerance %.1g)", c->name,
            relc, 2 * tol);
      tu_check_lse(c->name, c->with_lse, rl, lg, (size_t)total_q * c->hq);

      /* The same call again, over NaN: a deterministic plan gives bitwise the
       * same output (no races, no leftover state); by default the decode
       * kernel's run-time tile sharing may move the last bits, so the output
       * must then be as close to the reference as the first one. */
      unsigned char *ob2 = malloc(qn * es);
      CHECK_STATUS(kva_copy_to_device(gpu, o.d, poison, qn * es), KVA_OK);
      CHECK_STATUS(kva_attention(gw->plan, gw->pool, layer, &prm, q.d, o.d,
                                 c->with_lse ? (float *)lse.d : NULL, c->qt),
                   KVA_OK);
      CHECK_STATUS(kva_copy_to_host(gpu, ob2, o.d, qn * es), KVA_OK);
      if (g_deterministic) {
        CHECK(memcmp(ob, ob2, qn * es) == 0, "%s: second run differs (deterministic plan)",
              c->name);
      } else {
        for (size_t i = 0; i < qn; i++) og[i] = kva_load_f32(ob2, i, c->qt);
        double rel2 = kva_ref_rel_error(ro, og, qn);
        CHECK(rel2 < tol, "%s: second run vs reference: relative error %.3g (tolerance %.1g)",
              c->name, rel2, tol);
      }
      free(ob2);
    }
    for (int r = 0; r < R; r++) {
      free(kr[r]);
      free(vr[r]);
    }
    free(kr);
    free(vr);
    free(ro);
    free(rl);
    free(co);
  }
  twin_free(gpu, &q);
  twin_free(gpu, &o);
  twin_free(gpu, &lse);
  free(qh);
  free(qf);
  free(poison);
  free(lpoison);
  free(og);
  free(oc);
  free(lg);
  free(ob);
}

static void run_attn_case(kva_context *cpu, kva_context *gpu, const attn_case *c) {
  const int R = c->nreq > 0 ? c->nreq : 1, layer = 1;
  int max_len = 1, total_q = 0, total_pref = 0, pages = 0;
  for (int r = 0; r < R; r++) {
    int len = c->cached[r] + c->fresh[r];
    if (len > max_len) max_len = len;
    total_q += c->fresh[r];
    total_pref += c->cached[r];
    pages += (len + c->page - 1) / c->page;
  }
  const int max_pre = total_pref > 0 ? total_pref : 1;
  world cw, gw;
  int ok = world_make(&cw, cpu, c, pages + 3, max_len, max_pre, total_q, R, 2, layer) &&
           world_make(&gw, gpu, c, pages + 3, max_len, max_pre, total_q, R, 2, layer);
  CHECK(ok, "%s: setup", c->name);
  if (!ok) goto out;
  for (int r = 0; r < R; r++)
    CHECK(cw.slots[r] == gw.slots[r], "%s: allocators diverged", c->name);

  /* step 1: the cached prefixes (as their own batch of the requests that have one) */
  if (total_pref > 0) {
    int32_t *s1 = calloc((size_t)R, 4), *c1 = calloc((size_t)R, 4), *n1 = calloc((size_t)R, 4);
    int m = 0;
    for (int r = 0; r < R; r++)
      if (c->cached[r] > 0) {
        s1[m] = cw.slots[r];
        n1[m++] = c->cached[r];
      }
    kva_batch b1 = {m, s1, c1, n1};
    CHECK_STATUS(kva_plan_update(cw.pre, &b1), KVA_OK);
    CHECK_STATUS(kva_plan_update(gw.pre, &b1), KVA_OK);
    store_both(&cw, &gw, 1, layer, (size_t)total_pref, KVA_F32, 1.0f, 0, 0, c->name);
    store_both(&cw, &gw, 1, 0, (size_t)total_pref, KVA_F32, 1.0f, 0, 1, c->name);
    free(s1);
    free(c1);
    free(n1);
  }

  /* step 2: the batch under test */
  int32_t *cached = calloc((size_t)R, 4), *fresh = calloc((size_t)R, 4);
  for (int r = 0; r < R; r++) {
    cached[r] = c->cached[r];
    fresh[r] = c->fresh[r];
  }
  kva_batch b2 = {R, cw.slots, cached, fresh};
  CHECK_STATUS(kva_plan_update(cw.plan, &b2), KVA_OK);
  CHECK_STATUS(kva_plan_update(gw.plan, &b2), KVA_OK);
  store_both(&cw, &gw, 0, layer, (size_t)total_q, c->src_t, 1.0f, c->src_t != KVA_F32, 0, c->name);
  store_both(&cw, &gw, 0, 0, (size_t)total_q, c->src_t, 1.0f, 0, 1, c->name);

  attend_and_check(gpu, &cw, &gw, c, R, cached, fresh, total_q, layer);
  free(cached);
  free(fresh);
out:
  world_free(&cw);
  world_free(&gw);
}

/* Both worlds for c's requests (lengths cached + fresh, every cached > 0),
 * plans sized for max_q new tokens, each prefix stored (one extend batch);
 * 0 on a setup failure (reported). */
static int prefixed_worlds(kva_context *cpu, kva_context *gpu, const attn_case *c, int max_q,
                           int layer, world *cw, world *gw) {
  const int R = c->nreq;
  int max_len = 1, total_pref = 0, pages = 0;
  memset(cw, 0, sizeof *cw);
  memset(gw, 0, sizeof *gw);
  for (int r = 0; r < R; r++) {
    const int len = c->cached[r] + c->fresh[r];
    if (len > max_len) max_len = len;
    total_pref += c->cached[r];
    pages += (len + c->page - 1) / c->page;
  }
  int ok = world_make(cw, cpu, c, pages + 3, max_len, total_pref, max_q, R, 2, layer) &&
           world_make(gw, gpu, c, pages + 3, max_len, total_pref, max_q, R, 2, layer);
  CHECK(ok, "%s: setup", c->name);
  if (!ok) return 0;
  int32_t *zero = calloc((size_t)R, 4), *pre = calloc((size_t)R, 4);
  for (int r = 0; r < R; r++) pre[r] = c->cached[r];
  kva_batch b1 = {R, cw->slots, zero, pre};
  CHECK_STATUS(kva_plan_update(cw->pre, &b1), KVA_OK);
  CHECK_STATUS(kva_plan_update(gw->pre, &b1), KVA_OK);
  store_both(cw, gw, 1, layer, (size_t)total_pref, KVA_F32, 1.0f, 0, 0, c->name);
  free(zero);
  free(pre);
  return 1;
}

/* The batch of c's requests whose last news[r] tokens are new (the rest
 * cached); returns the batch's new tokens. */
static int tail_batch(const attn_case *c, const int *news, int32_t *cached, int32_t *fresh) {
  int total = 0;
  for (int r = 0; r < c->nreq; r++) {
    fresh[r] = news[r];
    cached[r] = c->cached[r] + c->fresh[r] - news[r];
    total += news[r];
  }
  return total;
}

/* One plan over a run of decode batches whose longest request has 8, 1, 3,
 * 8 and 2 new tokens: an eager launch sizes its row tiles for its own batch
 * (decode.cu, dec_shape), so the kernel's MT and grid.y change from batch to
 * batch while the plan's split counters are reused. c->fresh are the 8
 * tokens past each prefix; every batch attends to the whole request. */
static void run_shape_switch_case(kva_context *cpu, kva_context *gpu, const attn_case *c) {
  enum { R = 3, STEPS = 5 };
  static const int news[STEPS][R] = {{8, 8, 8}, {1, 1, 1}, {3, 1, 2}, {5, 8, 1}, {2, 1, 2}};
  const int layer = 1;
  world cw, gw;
  if (prefixed_worlds(cpu, gpu, c, 8 * R, layer, &cw, &gw)) {
    int32_t cached[R], fresh[R];
    for (int st = 0; st < STEPS; st++) {
      const int total_q = tail_batch(c, news[st], cached, fresh);
      kva_batch b = {R, cw.slots, cached, fresh};
      CHECK_STATUS(kva_plan_update(cw.plan, &b), KVA_OK);
      CHECK_STATUS(kva_plan_update(gw.plan, &b), KVA_OK);
      store_both(&cw, &gw, 0, layer, (size_t)total_q, c->src_t, 1.0f, 0, 0, c->name);
      attend_and_check(gpu, &cw, &gw, c, R, cached, fresh, total_q, layer);
    }
  }
  world_free(&cw);
  world_free(&gw);
}

#ifdef KVA_WITH_CUDA
/* A caller's own CUDA graph of a normal plan's attention (not a graph
 * state): the captured launch takes the capacity's row tiles (32:8 heads at
 * up to 8 new tokens: the two-m-tile kernel) and replays batches of 1..8 new
 * tokens against the CPU; after the capture, the plan's one-token batches
 * schedule the captured kernel's workers (fp8 KV: two CTAs an SM, where an
 * eager one-token batch gets three). */
static void run_capture_case(kva_context *cpu) {
  enum { R = 3 };
  static const int cs[] = {300, 17, 90}, fs[] = {8, 8, 8}, ones[] = {1, 1, 1};
  static const int news[3][R] = {{1, 1, 1}, {8, 3, 5}, {1, 2, 1}};
  const attn_case c = {"user capture d128 bf16+fp8 32:8", 128, 16, 32, 8, 1, -1, 0.f,
                       KVA_BF16, KVA_FP8_E4M3, KVA_BF16, R, cs, fs, 0, 0, 1};
  const int layer = 1, maxq = 8 * R;
  kva_context_config gc = {KVA_DEVICE_CUDA, 0, 0};
  kva_context *gpu = NULL;
  cudaStream_t st = NULL;
  CHECK_STATUS(kva_context_create(&gc, &gpu), KVA_OK);
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess, "%s: stream",
        c.name);
  if (!gpu || !st) {
    kva_context_destroy(gpu);
    if (st) cudaStreamDestroy(st);
    return;
  }
  CHECK_STATUS(kva_context_set_stream(gpu, st), KVA_OK);
  world cw, gw;
  int ok = prefixed_worlds(cpu, gpu, &c, maxq, layer, &cw, &gw);
  const size_t qn = (size_t)maxq * c.hq * c.d, qb = qn * 2;
  twin q = {0}, o = {0};
  unsigned char *poison = malloc(qb);
  memset(poison, 0xff, qb);
  ok = ok && twin_upload(gpu, &q, poison, qb) && twin_upload(gpu, &o, poison, qb);
  kva_attn_params prm = kva_attn_params_default();
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  int32_t cached[R], fresh[R];
  kva_batch b = {R, cw.slots, cached, fresh};
  kva_plan_info info;
  int w_eager = 0;
  if (ok) {
    /* before any capture: a one-token batch's eager workers */
    tail_batch(&c, ones, cached, fresh);
    CHECK_STATUS(kva_plan_update(gw.plan, &b), KVA_OK);
    CHECK_STATUS(kva_plan_get_info(gw.plan, &info), KVA_OK);
    w_eager = info.num_workers;
    /* every tail token's K/V, then the capture of that batch's attention */
    const int total_q = tail_batch(&c, fs, cached, fresh);
    CHECK_STATUS(kva_plan_update(cw.plan, &b), KVA_OK);
    CHECK_STATUS(kva_plan_update(gw.plan, &b), KVA_OK);
    store_both(&cw, &gw, 0, layer, (size_t)total_q, KVA_BF16, 1.0f, 0, 0, c.name);
    CHECK_STATUS(kva_synchronize(gpu), KVA_OK);
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess,
          "%s: begin capture", c.name);
    CHECK_STATUS(kva_attention(gw.plan, gw.pool, layer, &prm, q.d, o.d, NULL, KVA_BF16), KVA_OK);
    CHECK(cudaStreamEndCapture(st, &graph) == cudaSuccess && graph, "%s: end capture", c.name);
    CHECK(graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "%s: instantiate",
          c.name);
    ok = exec != NULL;
  }
  for (int step = 0; ok && step < 3; step++) {
    const int total_q = tail_batch(&c, news[step], cached, fresh);
    CHECK_STATUS(kva_plan_update(cw.plan, &b), KVA_OK);
    CHECK_STATUS(kva_plan_update(gw.plan, &b), KVA_OK);
    CHECK_STATUS(kva_plan_get_info(gw.plan, &info), KVA_OK);
    if (step == 0)
      CHECK(info.num_workers < w_eager,
            "%s: a one-token batch after the capture schedules %d workers (eager before: %d); "
            "the captured two-m-tile kernel runs fewer CTAs an SM", c.name, info.num_workers,
            w_eager);
    store_both(&cw, &gw, 0, layer, (size_t)total_q, KVA_BF16, 1.0f, 0, 0, c.name);
    const size_t n = (size_t)total_q * c.hq * c.d;
    float *qf = NULL;
    void *qh = rand_bytes(n, KVA_BF16, 1.5f, &qf);
    CHECK_STATUS(kva_copy_to_device(gpu, q.d, qh, n * 2), KVA_OK);
    CHECK_STATUS(kva_copy_to_device(gpu, o.d, poison, qb), KVA_OK);
    CHECK(cudaGraphLaunch(exec, st) == cudaSuccess, "%s: replay", c.name);
    CHECK_STATUS(kva_synchronize(gpu), KVA_OK);
    unsigned char *ob = malloc(n * 2);
    CHECK_STATUS(kva_copy_to_host(gpu, ob, o.d, n * 2), KVA_OK);
    CHECK_STATUS(kva_attention(cw.plan, cw.pool, layer, &prm, qh, o.h, NULL, KVA_BF16), KVA_OK);
    double *co = malloc(n * sizeof(double));
    float *og = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
      co[i] = kva_load_f32(o.h, i, KVA_BF16);
      og[i] = kva_load_f32(ob, i, KVA_BF16);
    }
    const double rel = kva_ref_rel_error(co, og, n);
    CHECK(rel < 1.2e-2, "%s: replay %d (new tokens %d/%d/%d) vs CPU: relative error %.3g",
          c.name, step, news[step][0], news[step][1], news[step][2], rel);
    free(co);
    free(og);
    free(ob);
    free(qh);
    free(qf);
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  twin_free(gpu, &q);
  twin_free(gpu, &o);
  free(poison);
  world_free(&cw);
  world_free(&gw);
  kva_context_destroy(gpu);
  cudaStreamDestroy(st);
}
#endif /* KVA_WITH_CUDA */

/* ---- fork (copy_slots) ------------------------------------------------------ */

static void run_fork_case(kva_context *cpu, kva_context *gpu, int page, kva_dtype kvt) {
  static const int cached[] = {0}, fresh[] = {100};
  attn_case c = {"fork", 64, page, 4, 2, 1, -1, 0.f, KVA_BF16, kvt, KVA_BF16, 1, cached, fresh,
                 0, 0, 0};
  world cw, gw;
  int ok = world_make(&cw, cpu, &c, 120, 200, 100, 100, 2, 2, 0) &&
           world_make(&gw, gpu, &c, 120, 200, 100, 100, 2, 2, 0);
  CHECK(ok, "fork: setup");
  if (ok) {
    kva_batch b = {1, cw.slots, cached, fresh};
    CHECK_STATUS(kva_plan_update(cw.plan, &b), KVA_OK);
    CHECK_STATUS(kva_plan_update(gw.plan, &b), KVA_OK);
    for (int layer = 0; layer < 2; layer++)
      store_both(&cw, &gw, 0, layer, 100, KVA_BF16, 2.0f, 0, layer, "fork store");
    int sc = -1, sg = -1, prefix = 100 - page / 2 - 1; /* a partial last page when page > 2 */
    CHECK_STATUS(kva_req_fork(cw.tab, cw.slots[0], prefix, &sc), KVA_OK);
    CHECK_STATUS(kva_req_fork(gw.tab, gw.slots[0], prefix, &sg), KVA_OK);
    CHECK(sc == sg, "fork: slots differ");
    CHECK_STATUS(kva_synchronize(gpu), KVA_OK);
    for (int layer = 0; layer < 2; layer++) check_pools_equal(gpu, cw.pool, gw.pool, layer, "fork");
  }
  world_free(&cw);
  world_free(&gw);
}

/* ---- merge_states ------------------------------------------------------------ */

static void run_merge_case(kva_context *cpu, kva_context *gpu, int tokens, int heads, int d,
                           kva_dtype t, int alias, int misalign) {
  const size_t rows = (size_t)tokens * heads, n = rows * d, es = kva_dtype_size(t);
  void *va = rand_bytes(n, t, 2.0f, NULL), *vb = rand_bytes(n, t, 2.0f, NULL);
  float *sa = malloc(rows * 4), *sb = malloc(rows * 4);
  for (size_t i = 0; i < rows; i++) {
    sa[i] = 3.0f * tu_uniform(&rng);
    sb[i] = 3.0f * tu_uniform(&rng);
    if (i % 7 == 3) sa[i] = -INFINITY;
    if (i % 11 == 5) sb[i] = -INFINITY;
    if (i % 13 == 0) sa[i] = sb[i] = -INFINITY;
    if (i % 17 == 2) sb[i] = sa[i] + 30.0f; /* one state dominates */
  }
  /* a -inf state's O may hold anything: it must not be read into the result */
  for (size_t i = 0; i < rows; i++)
    if (sa[i] == -INFINITY) kva_store_f32(va, i * d, t, nanf(""));
  size_t off = misalign ? es : 0;
  twin a, b, s1, s2, out, sout;
  unsigned char *ax = calloc(n * es + off, 1), *bx = calloc(n * es + off, 1);
  memcpy(ax + off, va, n * es);
  memcpy(bx + off, vb, n * es);
  int ok = twin_upload(gpu, &a, ax, n * es + off) && twin_upload(gpu, &b, bx, n * es + off) &&
           twin_upload(gpu, &s1, sa, rows * 4) && twin_upload(gpu, &s2, sb, rows * 4);
  float *nanrow = malloc(n * es + rows * 4 + off);
  memset(nanrow, 0xff, n * es + rows * 4 + off);
  ok = ok && twin_upload(gpu, &out, nanrow, n * es + off) && twin_upload(gpu, &sout, nanrow, rows * 4);
  CHECK(ok, "merge: device buffers");
  if (ok) {
    /* CPU result into its own buffers */
    void *oc = malloc(n * es);
    float *lc = malloc(rows * 4);
    CHECK_STATUS(kva_merge_states(cpu, tokens, heads, d, t, va, sa, vb, sb, oc, lc), KVA_OK);
    void *vo = alias ? (char *)a.d + off : (char *)out.d + off;
    float *so = alias ? (float *)s1.d : (float *)sout.d;
    CHECK_STATUS(kva_merge_states(gpu, tokens, heads, d, t, (char *)a.d + off, (float *)s1.d,
                                  (char *)b.d + off, (float *)s2.d, vo, so),
                 KVA_OK);
    unsigned char *og = malloc(n * es);
    float *lg = malloc(rows * 4);
    CHECK_STATUS(kva_copy_to_host(gpu, og, vo, n * es), KVA_OK);
    CHECK_STATUS(kva_copy_to_host(gpu, lg, so, rows * 4), KVA_OK);
    double maxe = 0, maxl = 0;
    for (size_t i = 0; i < n; i++) {
      double x = kva_load_f32(og, i, t), y = kva_load_f32(oc, i, t);
      double e = isnan(x) || isnan(y) ? INFINITY : fabs(x - y) / (1.0 + fabs(y));
      if (e > maxe) maxe = e;
    }
    for (size_t i = 0; i < rows; i++) {
      double e = lc[i] == -INFINITY ? (lg[i] == -INFINITY ? 0 : INFINITY) : fabs(lg[i] - lc[i]);
      if (!(e <= maxl)) maxl = isnan(e) ? INFINITY : e;
    }
    /* one rounding step of the output type apart at most */
    double tol = t == KVA_BF16 ? 8e-3 : t == KVA_F16 ? 1e-3 : 1e-5;
    CHECK(maxe < tol, "merge %dx%dx%d %s alias %d misalign %d: O differs from CPU by %.3g", tokens,
          heads, d, kva_dtype_name(t), alias, misalign, maxe);
    CHECK(maxl < 1e-5, "merge %dx%dx%d %s: LSE differs from CPU by %.3g", tokens, heads, d,
          kva_dtype_name(t), maxl);
    free(oc);
    free(lc);
    free(og);
    free(lg);
  }
  twin_free(gpu, &a);
  twin_free(gpu, &b);
  twin_free(gpu, &s1);
  twin_free(gpu, &s2);
  twin_free(gpu, &out);
  twin_free(gpu, &sout);
  free(va);
  free(vb);
  free(sa);
  free(sb);
  free(ax);
  free(bx);
  free(nanrow);
}

int main(void) {
  if (kva_device_available(KVA_DEVICE_CUDA) != KVA_OK) {
    printf("SKIP: no CUDA device (%s)\n", kva_last_error());
    printf("test_cuda_backend: SKIP: no CUDA device\n");
    return 77;
  }
  kva_context_config gc = {KVA_DEVICE_CUDA, 0, 0};
  kva_context *gpu = NULL, *cpu = tu_cpu_context(2);
  CHECK_STATUS(kva_context_create(&gc, &gpu), KVA_OK);
  if (!gpu || !cpu) {
    kva_context_destroy(gpu);
    kva_context_destroy(cpu);
    return tu_summary("test_cuda_backend");
  }

  static const int c5[] = {700, 0, 129, 64, 1500}, f5[] = {1, 1, 1, 1, 1};
  static const int c3[] = {300, 17, 90}, f3[] = {8, 3, 5};
  static const int c2[] = {513, 40}, f2[] = {2, 7};
  static const int cm[] = {0, 250, 31, 100}, fm[] = {300, 1, 60, 4}; /* mixed decode/extend */
  static const int cl[] = {20000}, fl[] = {1};
  static const int c1[] = {999}, f1[] = {4};
  static const int c4[] = {333, 1, 4000, 64}, f4[] = {1, 1, 1, 1};
  static int cb[48], fb[48];
  for (int i = 0; i < 48; i++) {
    cb[i] = 37 * i + (i % 5) * 100;
    fb[i] = 1 + (i % 3 == 0);
  }
  const attn_case cases[] = {
      /* name, d, page, hq, hkv, causal, window, cap, Q, pool, src, n, cached, new, W, blk, lse */
      {"decode d128 bf16 p16 32:8", 128, 16, 32, 8, 1, -1, 0.f, KVA_BF16, KVA_BF16, KVA_F32, 5,
       c5, f5, 0, 0, 1},
      {"decode d128 bf16 p16 32:8 one m-tile", 128, 16, 32, 8, 1, -1, 0.f, KVA_BF16, KVA_BF16,
       KVA_BF16, 4, c4, f4, 0, 0, 1},
      {"decode d128 f16+fp8 p16 32:8 one m-tile", 128, 16, 32, 8, 1, -1, 0.f, KVA_F16,
       KVA_FP8_E4M3, KVA_BF16, 4, c4, f4, 0, 0, 0},
      {"decode d128 bf16 p16 few workers", 128, 16, 32, 8, 1, -1, 0.f, KVA_BF16, KVA_BF16,
       KVA_BF16, 5, c5, f5, 3, 16, 1},
      {"decode d64 f16 p1 8:2 spec q1-8 window", 64, 1, 8, 2, 1, 50, 0.f, KVA_F16, KVA_F16,
       KVA_F16, 3, c3, f3, 5, 32, 1},
      {"decode d128 bf16+fp8 p64 16:2 softcap", 128, 64, 16, 2, 1, -1, 30.f, KVA_BF16,
       KVA_FP8_E4M3, KVA_BF16, 2, c2, f2, 4, 64, 1},
      {"decode d256 f16+fp8 p16 4:1", 256, 16, 4, 1, 1, -1, 0.f, KVA_F16, KVA_FP8_E4M3, KVA_F32,
       3, c3, f3, 0, 0, 1},
      {"decode d256 bf16 p16 noncausal window", 256, 16, 8, 4, 0, 200, 0.f, KVA_BF16, KVA_BF16,
       KVA_BF16, 2, c2, f2, 3, 64, 0},
      {"decode d64 bf16+fp8 p16 MQA 16:1 q8", 64, 16, 16, 1, 1, -1, 0.f, KVA_BF16, KVA_FP8_E4M3,
       KVA_F16, 3, c3, f3, 0, 0, 1},
      {"decode d128 f16 p16 MQA 32:1", 128, 16, 32, 1, 1, -1, 0.f, KVA_F16, KVA_F16, KVA_F16, 2,
       c2, f2, 0, 0, 1},
      {"mixed d128 bf16 p16 8:2", 128, 16, 8, 2, 1, -1, 0.f, KVA_BF16, KVA_BF16, KVA_BF16, 4, cm,
       fm, 0, 0, 1},
      {"mixed d64 f16+fp8 p64 window", 64, 64, 8, 8, 1, 77, 0.f, KVA_F16, KVA_FP8_E4M3, KVA_F16,
       4, cm, fm, 0, 0, 1},
      {"long decode d128 bf16 p16 20k", 128, 16, 32, 8, 1, -1, 0.f, KVA_BF16, KVA_BF16, KVA_BF16,
       1, cl, fl, 0, 0, 1},
      {"batch 48 d128 bf16+fp8 p16", 128, 16, 32, 8, 1, -1, 0.f, KVA_BF16, KVA_FP8_E4M3,
       KVA_BF16, 48, cb, fb, 0, 0, 1},
      /* CUDA-core fallback */
      {"fallback f32 Q d128 p16", 128, 16, 8, 2, 1, -1, 0.f, KVA_F32, KVA_BF16, KVA_F32, 3, c3,
       f3, 0, 0, 1},
      {"fallback d40 bf16 p16", 40, 16, 4, 2, 1, 30, 5.f, KVA_BF16, KVA_BF16, KVA_BF16, 2, c2,
       f2, 0, 0, 1},
      {"fallback bf16 Q on f16 pool", 128, 16, 8, 2, 1, -1, 0.f, KVA_BF16, KVA_F16, KVA_F32, 1,
       c1, f1, 0, 0, 1},
      {"fallback f32 Q fp8 mixed", 64, 1, 4, 1, 1, -1, 0.f, KVA_F32, KVA_FP8_E4M3, KVA_F32, 4,
       cm, fm, 0, 0, 1},
  };
  /* every case with the default plan and with a deterministic one */
  for (g_deterministic = 0; g_deterministic < 2; g_deterministic++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_attn_case(cpu, gpu, &cases[i]);
  g_deterministic = 0;

  static const int cs[] = {300, 17, 90}, fs[] = {8, 8, 8};
  const attn_case switches[] = {
      {"shape switch d128 bf16 p16 16:2", 128, 16, 16, 2, 1, -1, 0.f, KVA_BF16, KVA_BF16,
       KVA_BF16, 3, cs, fs, 0, 0, 1},
      {"shape switch d128 bf16+fp8 p16 32:8", 128, 16, 32, 8, 1, -1, 0.f, KVA_BF16,
       KVA_FP8_E4M3, KVA_BF16, 3, cs, fs, 0, 0, 1},
      {"shape switch d64 f16+fp8 p1 16:2", 64, 1, 16, 2, 1, -1, 0.f, KVA_F16, KVA_FP8_E4M3,
       KVA_F16, 3, cs, fs, 3, 16, 1},
  };
  for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++)
    run_shape_switch_case(cpu, gpu, &switches[i]);
#ifdef KVA_WITH_CUDA
  run_capture_case(cpu);
#endif

  run_fork_case(cpu, gpu, 16, KVA_BF16);
  run_fork_case(cpu, gpu, 64, KVA_FP8_E4M3);
  run_fork_case(cpu, gpu, 1, KVA_F16);

  const kva_dtype ts[3] = {KVA_F32, KVA_F16, KVA_BF16};
  for (int i = 0; i < 3; i++) {
    run_merge_case(cpu, gpu, 37, 8, 128, ts[i], 0, 0);
    run_merge_case(cpu, gpu, 5, 3, 20, ts[i], 1, 0);  /* scalar path, in place */
    run_merge_case(cpu, gpu, 9, 4, 64, ts[i], 0, 1);  /* misaligned: scalar path */
    run_merge_case(cpu, gpu, 2, 2, 576, ts[i], 1, 0); /* MLA V width */
  }

  kva_context_destroy(gpu);
  kva_context_destroy(cpu);
  return tu_summary("test_cuda_backend");
}
