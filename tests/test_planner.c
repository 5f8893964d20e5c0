/* Planner properties on random batches (CPU context; the split schedules
 * alone are tests/test_split_schedule.c):
 *   - kva_plan_update: every metadata array against the request table;
 *   - every validation error path of create/update/get_info and of the run
 *     entry points, and that a failed update keeps the previous plan. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "kvattn.h"
#include "testutil.h"

#define TRY(call)                                                                \
  do {                                                                           \
    kva_status s_ = (call);                                                      \
    if (s_ != KVA_OK) {                                                          \
      fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,   \
              kva_strerror(s_), kva_last_error());                               \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)
/* An expected failure: status and a message naming something. */
#define EXPECT_ERR(call, want)                                                       \
  do {                                                                               \
    kva_status s_ = (call);                                                          \
    CHECK(s_ == (want), "%s -> %s, want %s", #call, kva_strerror(s_), kva_strerror(want)); \
    CHECK(kva_last_error()[0] != '\0', "%s set no message", #call);                \
  } while (0)

static tu_rng rng = {0x9e3779b97f4a7c15ull};

/* ---- full planner ----------------------------------------------------- */

typedef struct snapshot {
  kva_plan_info info;
  int32_t *buf; /* every array of info, concatenated */
  size_t len;
} snapshot;

static size_t info_ints(const kva_plan_info *in) {
  int n = in->num_requests;
  return (size_t)(n + 1) * 4 + (size_t)n * 2 + (size_t)n * (size_t)in->page_table_stride +
         (size_t)in->kv_indptr[n] + (size_t)in->total_q + (size_t)in->num_workers * 5 + (size_t)n;
}
static void take_snapshot(const kva_plan *plan, snapshot *s) {
  TRY(kva_plan_get_info(plan, &s->info));
  const kva_plan_info *in = &s->info;
  int n = in->num_requests;
  s->len = info_ints(in);
  s->buf = (int32_t *)malloc(s->len * sizeof(int32_t));
  int32_t *p = s->buf;
#define PUT(arr, cnt)                                         \
  do {                                                        \
    memcpy(p, (arr), (size_t)(cnt) * sizeof(int32_t));        \
    p += (cnt);                                               \
  } while (0)
  PUT(in->cu_seqlens_q, n + 1);
  PUT(in->cu_seqlens_k, n + 1);
  PUT(in->kv_indptr, n + 1);
  PUT(in->split_indptr, n + 1);
  PUT(in->cache_seqlens, n);
  PUT(in->kv_last_page_len, n);
  PUT(in->page_table, (size_t)n * (size_t)in->page_table_stride);
  PUT(in->kv_indices, in->kv_indptr[n]);
  PUT(in->out_cache_loc, in->total_q);
  PUT(in->split_schedule, (size_t)in->num_workers * 5);
  PUT(in->sched_order, n);
#undef PUT
}
static void expect_same(const kva_plan *plan, const snapshot *s, const char *what) {
  kva_plan_info now;
  kva_status st = kva_plan_get_info(plan, &now);
  CHECK(st == KVA_OK, "%s: get_info after failed update -> %s", what, kva_strerror(st));
  if (st != KVA_OK) return;
  const kva_plan_info *o = &s->info;
  CHECK(now.num_requests == o->num_requests && now.total_q == o->total_q &&
             now.total_k == o->total_k && now.max_q_len == o->max_q_len &&
             now.max_k_len == o->max_k_len && now.num_decode == o->num_decode &&
             now.num_extend == o->num_extend && now.page_table_stride == o->page_table_stride &&
             now.num_workers == o->num_workers && now.num_splits_total == o->num_splits_total,
        "%s: plan info sizes changed", what);
  snapshot t;
  take_snapshot(plan, &t);
  CHECK(t.len == s->len && memcmp(t.buf, s->buf, t.len * sizeof(int32_t)) == 0,
        "%s: plan arrays changed", what);
  free(t.buf);
}

/* Checks every array of the plan against the request table and the batch. */
static void check_plan(const kva_plan *plan, const kva_req_table *table, const kva_batch *b,
                       int page_size, int block, const char *what) {
  int f0 = tu_failures;
  kva_plan_info in;
  TRY(kva_plan_get_info(plan, &in));
  int n = b->num_requests;
  CHECK(in.num_requests == n, "%s: num_requests %d", what, in.num_requests);
  int64_t tq = 0, tk = 0;
  int maxq = 0, maxk = 0, maxpages = 0, nd = 0, ne = 0;
  CHECK(in.cu_seqlens_q[0] == 0 && in.cu_seqlens_k[0] == 0 && in.kv_indptr[0] == 0,
        "%s: first offsets not 0", what);
  int32_t *kv = (int32_t *)malloc((size_t)n * sizeof(int32_t));
  for (int r = 0; r < n && tu_failures == f0; r++) {
    int nc = b->num_cached[r], nn = b->num_new[r], len = nc + nn;
    const int32_t *tok = kva_req_tokens(table, b->req_slots[r]);
    tq += nn;
    tk += len;
    if (nn > maxq) maxq = nn;
    if (len > maxk) maxk = len;
    int pages = (len + page_size - 1) / page_size;
    if (pages > maxpages) maxpages = pages;
    int dec = nn <= KVA_MAX_DECODE_Q;
    kv[r] = dec ? len : 0;
    CHECK(in.cache_seqlens[r] == len, "%s: cache_seqlens[%d] = %d, want %d", what, r,
          in.cache_seqlens[r], len);
    CHECK(in.cu_seqlens_q[r + 1] == tq, "%s: cu_seqlens_q[%d]", what, r + 1);
    CHECK(in.cu_seqlens_k[r + 1] == tk, "%s: cu_seqlens_k[%d]", what, r + 1);
    CHECK(in.kv_indptr[r + 1] - in.kv_indptr[r] == pages, "%s: request %d has %d ragged pages, "
          "want %d", what, r, in.kv_indptr[r + 1] - in.kv_indptr[r], pages);
    CHECK(in.kv_last_page_len[r] == len - (pages - 1) * page_size &&
               in.kv_last_page_len[r] >= 1 && in.kv_last_page_len[r] <= page_size,
          "%s: kv_last_page_len[%d] = %d", what, r, in.kv_last_page_len[r]);
    if (tu_failures != f0) break;
    const int32_t *row = in.page_table + (size_t)r * (size_t)in.page_table_stride;
    const int32_t *rag = in.kv_indices + in.kv_indptr[r];
    /* every position (sampled for long requests) against req_to_token */
    int step = len > 4096 ? tu_int(&rng, 1, 97) : 1;
    for (int pos = 0; pos < len && tu_failures == f0; pos += step) {
      int32_t want = tok[pos];
      CHECK(row[pos / page_size] * page_size + pos % page_size == want,
            "%s: page_table of request %d position %d", what, r, pos);
      CHECK(rag[pos / page_size] * page_size + pos % page_size == want,
            "%s: kv_indices of request %d position %d", what, r, pos);
    }
    CHECK(row[(len - 1) / page_size] * page_size + (len - 1) % page_size == tok[len - 1],
          "%s: page_table of request %d last position", what, r);
    for (int j = pages; j < in.page_table_stride; j++)
      CHECK(row[j] == 0, "%s: unused page_table[%d][%d] = %d", what, r, j, row[j]);
    for (int t = 0; t < nn; t++) {
      CHECK(in.out_cache_loc[in.cu_seqlens_q[r] + t] == tok[nc + t],
            "%s: out_cache_loc of request %d token %d", what, r, t);
      CHECK(plan->q_req[in.cu_seqlens_q[r] + t] == r, "%s: q_req of request %d token %d", what,
            r, t);
    }
    if (dec) {
      CHECK(nd < in.num_decode && plan->decode_reqs[nd] == r, "%s: decode_reqs[%d]", what, nd);
      nd++;
    } else {
      CHECK(ne < in.num_extend && plan->extend_reqs[ne] == r, "%s: extend_reqs[%d]", what, ne);
      ne++;
    }
    CHECK(plan->req_slots[r] == b->req_slots[r] && plan->num_new[r] == nn,
          "%s: req_slots/num_new[%d]", what, r);
  }
  if (tu_failures == f0) {
    CHECK(in.total_q == tq && in.total_k == tk && in.max_q_len == maxq && in.max_k_len == maxk,
          "%s: totals %d %d %d %d, want %lld %lld %d %d", what, in.total_q, in.total_k,
          in.max_q_len, in.max_k_len, (long long)tq, (long long)tk, maxq, maxk);
    CHECK(in.page_table_stride == maxpages, "%s: page_table_stride %d, want %d", what,
          in.page_table_stride, maxpages);
    CHECK(in.num_decode == nd && in.num_extend == ne, "%s: %d decode %d extend, want %d %d",
          what, in.num_decode, in.num_extend, nd, ne);
    const kva_plan_header *h = &plan->hdr;
    CHECK(h->num_requests == n && h->total_q == tq && h->max_q_len == maxq &&
               h->max_k_len == maxk && h->page_table_stride == maxpages &&
               h->num_workers == in.num_workers && h->num_splits_total == in.num_splits_total &&
               h->num_extend == ne,
          "%s: header disagrees with info", what);
    tu_check_schedule(n, kv, block, in.num_workers, 0 /* the CPU backend has no slack */,
                   in.split_schedule, in.split_indptr, in.num_splits_total, in.sched_order,
                   TU_SPLIT_OVERHEAD, what);
    for (int i = 0; i < n; i++) /* MHA pools: batch order */
      CHECK(in.sched_order[i] == i, "%s: sched_order[%d] = %d on an MHA pool", what, i,
            in.sched_order[i]);
    /* partial rows: only multi-split requests, packed in request order */
    int32_t rows = 0;
    for (int r = 0; r < n; r++) {
      CHECK(plan->split_row_offset[r] == rows, "%s: split_row_offset[%d] = %d, want %d", what, r,
            plan->split_row_offset[r], rows);
      int s = in.split_indptr[r + 1] - in.split_indptr[r];
      if (s > 1) rows += s * b->num_new[r];
    }
    CHECK(plan->split_row_offset[n] == rows && rows <= plan->max_partial_rows,
          "%s: %d partial rows, capacity %d", what, rows, plan->max_partial_rows);
  }
  free(kv);
}

typedef struct world {
  kva_context *ctx;
  kva_pool *pool;
  kva_req_table *table;
  int page_size;
} world;

static void world_make(world *w, int layers, int page_size, int num_pages, int max_req,
                       int max_ctx) {
  kva_context_config cc;
  memset(&cc, 0, sizeof(cc));
  cc.device = KVA_DEVICE_CPU;
  cc.num_threads = 2;
  TRY(kva_context_create(&cc, &w->ctx));
  kva_pool_config pc;
  memset(&pc, 0, sizeof(pc));
  pc.layout = KVA_LAYOUT_MHA;
  pc.num_layers = layers;
  pc.num_pages = num_pages;
  pc.page_size = page_size;
  pc.num_kv_heads = 2;
  pc.head_dim = 8;
  pc.kv_dtype = KVA_F16;
  TRY(kva_pool_create(w->ctx, &pc, &w->pool));
  TRY(kva_req_table_create(w->pool, max_req, max_ctx, &w->table));
  w->page_size = page_size;
}
static void world_free(world *w) {
  kva_req_table_destroy(w->table);
  kva_pool_destroy(w->pool);
  kva_context_destroy(w->ctx);
}

/* Random live requests (appends, forks, truncates) and random batches over
 * them, each planned and checked. */
static void test_plans(int page_size, int max_req, int max_ctx, int max_len, int iters,
                       int max_batch) {
  world w;
  int64_t budget = (int64_t)max_req * max_len / 2 + (int64_t)max_req * page_size;
  /* forks add a copied partial page and up to 64 tokens each */
  int num_pages = (int)(budget / page_size + (int64_t)max_req * (2 + 80 / page_size) + 8);
  world_make(&w, 1, page_size, num_pages, max_req, max_ctx);
  int32_t *slots = (int32_t *)malloc((size_t)max_req * sizeof(int32_t));
  int nlive = 0;
  int64_t used = 0;
  /* fill: fresh requests, some forks of earlier ones, some truncated */
  while (nlive < max_req) {
    int len = tu_int(&rng, 0, 3) == 0 ? tu_int(&rng, 1, 16) : tu_int(&rng, 1, max_len);
    if (used + len > (int64_t)max_req * max_len / 2) len = tu_int(&rng, 1, 16);
    int s;
    if (nlive > 0 && tu_int(&rng, 0, 3) == 0) {
      int src = slots[tu_int(&rng, 0, nlive - 1)];
      int srclen = kva_req_len(w.table, src);
      TRY(kva_req_fork(w.table, src, tu_int(&rng, 0, srclen), &s));
      int grow = tu_int(&rng, 1, 64);
      if (kva_req_len(w.table, s) + grow <= max_ctx) TRY(kva_req_append(w.table, s, grow));
    } else {
      TRY(kva_req_alloc(w.table, &s));
      TRY(kva_req_append(w.table, s, len));
      if (tu_int(&rng, 0, 5) == 0 && len > 1) TRY(kva_req_truncate(w.table, s, tu_int(&rng, 1, len)));
    }
    if (kva_req_len(w.table, s) == 0) TRY(kva_req_append(w.table, s, 1));
    used += kva_req_len(w.table, s);
    slots[nlive++] = s;
  }
  TRY(kva_pool_check(w.pool));

  kva_plan *plan = NULL;
  kva_plan_config cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.max_batch = max_batch;
  cfg.max_q_tokens = max_batch * 64;
  cfg.num_qo_heads = 4;
  int32_t *bs = (int32_t *)malloc((size_t)max_batch * sizeof(int32_t));
  int32_t *bc = (int32_t *)malloc((size_t)max_batch * sizeof(int32_t));
  int32_t *bn = (int32_t *)malloc((size_t)max_batch * sizeof(int32_t));
  char what[128];
  for (int it = 0; it < iters; it++) {
    if (it % 8 == 0) { /* new plan: random workers and block every few batches */
      kva_plan_destroy(plan);
      cfg.num_workers = it % 16 == 0 ? 0 : tu_int(&rng, 1, 300);
      cfg.split_block = it % 24 == 0 ? 0 : tu_int(&rng, 1, 300);
      TRY(kva_plan_create(w.table, &cfg, &plan));
    }
    /* random subset in random order */
    for (int i = nlive - 1; i > 0; i--) {
      int j = tu_int(&rng, 0, i);
      int32_t t = slots[i];
      slots[i] = slots[j];
      slots[j] = t;
    }
    int nmax = max_batch < nlive ? max_batch : nlive;
    int n = it % 5 == 0 ? nmax : tu_int(&rng, 1, nmax);
    int qbudget = cfg.max_q_tokens;
    int mix = tu_int(&rng, 0, 2); /* 0 decode only, 1 extend heavy, 2 mixed */
    for (int i = 0; i < n; i++) {
      int len = kva_req_len(w.table, slots[i]);
      int use = tu_int(&rng, 0, 3) == 0 ? tu_int(&rng, 1, len) : len; /* may plan a prefix */
      int nn;
      int left = qbudget - (n - 1 - i);
      if (mix == 0 || (mix == 2 && tu_int(&rng, 0, 1)))
        nn = tu_int(&rng, 1, use < 8 ? use : 8);
      else
        nn = tu_int(&rng, 1, use < 200 ? use : 200);
      if (nn > left) nn = left;
      qbudget -= nn;
      bs[i] = slots[i];
      bn[i] = nn;
      bc[i] = use - nn;
    }
    kva_batch b = {n, bs, bc, bn};
    snprintf(what, sizeof(what), "plan ps %d it %d (n %d, workers %d, block %d)", page_size, it,
             n, plan->cfg.num_workers, plan->cfg.split_block);
    kva_status st = kva_plan_update(plan, &b);
    CHECK(st == KVA_OK, "%s: update -> %s: %s", what, kva_strerror(st), kva_last_error());
    if (st != KVA_OK) break;
    int f0 = tu_failures;
    check_plan(plan, w.table, &b, page_size, plan->cfg.split_block, what);
    if (tu_failures != f0) break;
  }
  kva_plan_destroy(plan);
  free(bs);
  free(bc);
  free(bn);
  free(slots);
  world_free(&w);
}

/* ---- validation ------------------------------------------------------- */

static void test_errors(void) {
  world w;
  world_make(&w, 2, 16, 256, 8, 512);
  int s[4];
  for (int i = 0; i < 4; i++) {
    TRY(kva_req_alloc(w.table, &s[i]));
    TRY(kva_req_append(w.table, s[i], 100 + 37 * i));
  }
  kva_plan_config cfg = {4, 64, 4, 3, 16, 0};
  kva_plan *plan = NULL;

  /* create */
  EXPECT_ERR(kva_plan_create(NULL, &cfg, &plan), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_plan_create(w.table, NULL, &plan), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_plan_create(w.table, &cfg, NULL), KVA_ERR_NULL_ARGUMENT);
  kva_plan_config bad = cfg;
  bad.max_batch = 0;
  EXPECT_ERR(kva_plan_create(w.table, &bad, &plan), KVA_ERR_INVALID_ARGUMENT);
  CHECK(plan == NULL, "failed create left *out set");
  bad = cfg;
  bad.max_q_tokens = -1;
  EXPECT_ERR(kva_plan_create(w.table, &bad, &plan), KVA_ERR_INVALID_ARGUMENT);
  bad = cfg;
  bad.num_qo_heads = 3; /* pool has 2 kv heads */
  EXPECT_ERR(kva_plan_create(w.table, &bad, &plan), KVA_ERR_INVALID_ARGUMENT);
  bad.num_qo_heads = 0;
  EXPECT_ERR(kva_plan_create(w.table, &bad, &plan), KVA_ERR_INVALID_ARGUMENT);
  bad = cfg;
  bad.num_workers = -2;
  EXPECT_ERR(kva_plan_create(w.table, &bad, &plan), KVA_ERR_INVALID_ARGUMENT);
  bad = cfg;
  bad.split_block = -1;
  EXPECT_ERR(kva_plan_create(w.table, &bad, &plan), KVA_ERR_INVALID_ARGUMENT);
  bad = cfg;
  bad.deterministic = 2;
  EXPECT_ERR(kva_plan_create(w.table, &bad, &plan), KVA_ERR_INVALID_ARGUMENT);
  TRY(kva_plan_create(w.table, &cfg, &plan));

  kva_plan_info info;
  EXPECT_ERR(kva_plan_get_info(plan, &info), KVA_ERR_STATE);
  EXPECT_ERR(kva_plan_get_info(NULL, &info), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_plan_get_info(plan, NULL), KVA_ERR_NULL_ARGUMENT);

  /* run entry points before any batch */
  float kbuf[64 * 2 * 8], vbuf[64 * 2 * 8], q[64 * 4 * 8], o[64 * 4 * 8], lse[64 * 4];
  for (size_t i = 0; i < sizeof(kbuf) / sizeof(float); i++) kbuf[i] = vbuf[i] = 0.25f;
  for (size_t i = 0; i < sizeof(q) / sizeof(float); i++) q[i] = 0.5f;
  kva_attn_params ap = kva_attn_params_default();
  CHECK(ap.sm_scale == 0.f && ap.causal == 1 && ap.window_left == -1 && ap.logit_softcap == 0.f,
        "kva_attn_params_default");
  EXPECT_ERR(kva_store_kv(plan, w.pool, 0, kbuf, vbuf, KVA_F32), KVA_ERR_STATE);
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &ap, q, o, lse, KVA_F32), KVA_ERR_STATE);

  /* a good batch, then every failing update keeps it */
  int32_t slots[4] = {s[2], s[0], s[3], s[1]}, cached[4] = {170, 90, 200, 130},
          nnew[4] = {4, 10, 11, 1};
  kva_batch b = {4, slots, cached, nnew};
  TRY(kva_plan_update(plan, &b));
  check_plan(plan, w.table, &b, 16, 16, "errors: good batch");
  snapshot snap;
  take_snapshot(plan, &snap);

#define UPDATE_FAILS(batchexpr, want, label)                 \
  do {                                                       \
    kva_batch bb_ = (batchexpr);                             \
    EXPECT_ERR(kva_plan_update(plan, &bb_), want);           \
    expect_same(plan, &snap, label);                         \
  } while (0)
  int32_t sl[4], ca[4], nw[4];
#define RESET() memcpy(sl, slots, sizeof(sl)), memcpy(ca, cached, sizeof(ca)), memcpy(nw, nnew, sizeof(nw))
  RESET();
  EXPECT_ERR(kva_plan_update(NULL, &b), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_plan_update(plan, NULL), KVA_ERR_NULL_ARGUMENT);
  UPDATE_FAILS(((kva_batch){0, sl, ca, nw}), KVA_ERR_INVALID_ARGUMENT, "zero requests");
  UPDATE_FAILS(((kva_batch){-3, sl, ca, nw}), KVA_ERR_INVALID_ARGUMENT, "negative requests");
  UPDATE_FAILS(((kva_batch){5, sl, ca, nw}), KVA_ERR_CAPACITY, "beyond max_batch");
  UPDATE_FAILS(((kva_batch){4, NULL, ca, nw}), KVA_ERR_NULL_ARGUMENT, "null slots");
  UPDATE_FAILS(((kva_batch){4, sl, NULL, nw}), KVA_ERR_NULL_ARGUMENT, "null cached");
  UPDATE_FAILS(((kva_batch){4, sl, ca, NULL}), KVA_ERR_NULL_ARGUMENT, "null new");
  sl[3] = 8;
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_OUT_OF_RANGE, "slot beyond table");
  sl[3] = -1;
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_OUT_OF_RANGE, "negative slot");
  RESET();
  for (int c = 0; c < 8; c++) /* a slot never allocated */
    if (c != s[0] && c != s[1] && c != s[2] && c != s[3]) sl[2] = c;
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_INVALID_ARGUMENT, "dead slot");
  RESET();
  sl[3] = sl[0];
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_INVALID_ARGUMENT, "repeated slot");
  RESET();
  nw[1] = 0;
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_INVALID_ARGUMENT, "zero new");
  nw[1] = -4;
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_INVALID_ARGUMENT, "negative new");
  RESET();
  ca[2] = -1;
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_INVALID_ARGUMENT, "negative cached");
  RESET();
  ca[0] = 171; /* slot s[2] holds 174 positions; 171 + 4 = 175 */
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_OUT_OF_RANGE, "past request length");
  RESET();
  ca[0] = 2147483640; /* overflow of cached + new */
  nw[0] = 100;
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_OUT_OF_RANGE, "cached + new overflows");
  RESET();
  nw[2] = 50;
  ca[2] = 150;
  UPDATE_FAILS(((kva_batch){4, sl, ca, nw}), KVA_ERR_CAPACITY, "beyond max_q_tokens");
  /* a failed update after a released request: the plan still holds its batch */
  RESET();
  {
    /* WORKSPACE_TOO_SMALL cannot happen with create's capacity; shrink it */
    int keep = plan->max_partial_rows;
    int32_t one[1] = {s[3]}, c1[1] = {210}, n1[1] = {1};
    plan->max_partial_rows = 0;
    UPDATE_FAILS(((kva_batch){1, one, c1, n1}), KVA_ERR_WORKSPACE_TOO_SMALL, "workspace");
    plan->max_partial_rows = keep;
  }
  free(snap.buf);

  /* ---- run entry points ---- */
  /* a pool of another geometry (a pool of the same one is accepted: kvattn.h) */
  kva_pool *other = NULL;
  kva_pool_config pc = *kva_pool_get_config(w.pool);
  pc.num_pages += 1;
  TRY(kva_pool_create(w.ctx, &pc, &other));
  kva_status st;
  EXPECT_ERR(kva_store_kv(NULL, w.pool, 0, kbuf, vbuf, KVA_F32), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_store_kv(plan, NULL, 0, kbuf, vbuf, KVA_F32), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_store_kv(plan, w.pool, 0, NULL, vbuf, KVA_F32), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_store_kv(plan, w.pool, 0, kbuf, NULL, KVA_F32), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_store_kv(plan, other, 0, kbuf, vbuf, KVA_F32), KVA_ERR_INVALID_ARGUMENT);
  EXPECT_ERR(kva_store_kv(plan, w.pool, 2, kbuf, vbuf, KVA_F32), KVA_ERR_OUT_OF_RANGE);
  EXPECT_ERR(kva_store_kv(plan, w.pool, -1, kbuf, vbuf, KVA_F32), KVA_ERR_OUT_OF_RANGE);
  EXPECT_ERR(kva_store_kv(plan, w.pool, 0, kbuf, vbuf, KVA_FP8_E4M3), KVA_ERR_UNSUPPORTED);
  EXPECT_ERR(kva_store_kv(plan, w.pool, 0, kbuf, vbuf, (kva_dtype)9), KVA_ERR_INVALID_ARGUMENT);

  EXPECT_ERR(kva_attention(NULL, w.pool, 0, &ap, q, o, lse, KVA_F32), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_attention(plan, NULL, 0, &ap, q, o, lse, KVA_F32), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_attention(plan, w.pool, 0, NULL, q, o, lse, KVA_F32), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &ap, NULL, o, lse, KVA_F32), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &ap, q, NULL, lse, KVA_F32), KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_attention(plan, other, 0, &ap, q, o, lse, KVA_F32), KVA_ERR_INVALID_ARGUMENT);
  EXPECT_ERR(kva_attention(plan, w.pool, 5, &ap, q, o, lse, KVA_F32), KVA_ERR_OUT_OF_RANGE);
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &ap, q, o, lse, KVA_FP8_E4M3), KVA_ERR_UNSUPPORTED);
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &ap, q, o, lse, (kva_dtype)-1),
             KVA_ERR_INVALID_ARGUMENT);
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &ap, q, (void *)q, lse, KVA_F32),
             KVA_ERR_INVALID_ARGUMENT);
  kva_attn_params bp = ap;
  bp.sm_scale = -0.5f;
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &bp, q, o, lse, KVA_F32), KVA_ERR_INVALID_ARGUMENT);
  bp.sm_scale = NAN;
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &bp, q, o, lse, KVA_F32), KVA_ERR_INVALID_ARGUMENT);
  bp.sm_scale = INFINITY;
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &bp, q, o, lse, KVA_F32), KVA_ERR_INVALID_ARGUMENT);
  bp = ap;
  bp.logit_softcap = -1.f;
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &bp, q, o, lse, KVA_F32), KVA_ERR_INVALID_ARGUMENT);
  bp.logit_softcap = INFINITY;
  EXPECT_ERR(kva_attention(plan, w.pool, 0, &bp, q, o, lse, KVA_F32), KVA_ERR_INVALID_ARGUMENT);

  /* valid calls reach the backend: stored tokens read back */
  {
    int32_t one[1] = {s[1]}, c1[1] = {128}, n1[1] = {3};
    kva_batch b1 = {1, one, c1, n1};
    TRY(kva_plan_update(plan, &b1));
    for (int i = 0; i < 3 * 2 * 8; i++) {
      kbuf[i] = (float)(tu_int(&rng, -64, 64)) / 32.f; /* exact in f16 */
      vbuf[i] = (float)(tu_int(&rng, -64, 64)) / 16.f;
    }
    TRY(kva_store_kv(plan, w.pool, 1, kbuf, vbuf, KVA_F32));
    const int32_t *tok = kva_req_tokens(w.table, s[1]);
    float kr[3 * 2 * 8], vr[3 * 2 * 8];
    TRY(kva_pool_read_tokens(w.pool, 1, 3, tok + 128, kr, vr));
    CHECK(memcmp(kr, kbuf, sizeof(kr)) == 0 && memcmp(vr, vbuf, sizeof(vr)) == 0,
          "kva_store_kv: tokens read back differ");
    for (int i = 0; i < 3 * 4 * 8; i++) o[i] = NAN;
    for (int i = 0; i < 3 * 4; i++) lse[i] = NAN;
    st = kva_attention(plan, w.pool, 1, &ap, q, o, lse, KVA_F32);
    CHECK(st == KVA_OK, "kva_attention -> %s: %s", kva_strerror(st), kva_last_error());
    int finite = 1;
    for (int i = 0; i < 3 * 4 * 8; i++) finite &= isfinite(o[i]) != 0;
    for (int i = 0; i < 3 * 4; i++) finite &= isfinite(lse[i]) != 0;
    CHECK(finite, "kva_attention left non-finite outputs");
  }

  /* merge */
  float va[2 * 3 * 8], vb[2 * 3 * 8], sa[6], sb[6], vo[2 * 3 * 8], so[6];
  for (int i = 0; i < 48; i++) {
    va[i] = (float)tu_int(&rng, -100, 100) / 50.f;
    vb[i] = (float)tu_int(&rng, -100, 100) / 50.f;
    vo[i] = NAN;
  }
  for (int i = 0; i < 6; i++) {
    sa[i] = (float)tu_int(&rng, -100, 100) / 25.f;
    sb[i] = (float)tu_int(&rng, -100, 100) / 25.f;
    so[i] = NAN;
  }
  EXPECT_ERR(kva_merge_states(NULL, 2, 3, 8, KVA_F32, va, sa, vb, sb, vo, so),
             KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_merge_states(w.ctx, 2, 3, 8, KVA_F32, NULL, sa, vb, sb, vo, so),
             KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_merge_states(w.ctx, 2, 3, 8, KVA_F32, va, NULL, vb, sb, vo, so),
             KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_merge_states(w.ctx, 2, 3, 8, KVA_F32, va, sa, NULL, sb, vo, so),
             KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_merge_states(w.ctx, 2, 3, 8, KVA_F32, va, sa, vb, NULL, vo, so),
             KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_merge_states(w.ctx, 2, 3, 8, KVA_F32, va, sa, vb, sb, NULL, so),
             KVA_ERR_NULL_ARGUMENT);
  EXPECT_ERR(kva_merge_states(w.ctx, 0, 3, 8, KVA_F32, va, sa, vb, sb, vo, so),
             KVA_ERR_INVALID_ARGUMENT);
  EXPECT_ERR(kva_merge_states(w.ctx, 2, -3, 8, KVA_F32, va, sa, vb, sb, vo, so),
             KVA_ERR_INVALID_ARGUMENT);
  EXPECT_ERR(kva_merge_states(w.ctx, 2, 3, 0, KVA_F32, va, sa, vb, sb, vo, so),
             KVA_ERR_INVALID_ARGUMENT);
  EXPECT_ERR(kva_merge_states(w.ctx, 2, 3, 1000, KVA_F32, va, sa, vb, sb, vo, so),
             KVA_ERR_UNSUPPORTED);
  EXPECT_ERR(kva_merge_states(w.ctx, 2, 3, 8, KVA_FP8_E4M3, va, sa, vb, sb, vo, so),
             KVA_ERR_UNSUPPORTED);
  EXPECT_ERR(kva_merge_states(w.ctx, 1 << 20, 1 << 10, 8, KVA_F32, va, sa, vb, sb, vo, so),
             KVA_ERR_INVALID_ARGUMENT);
  st = kva_merge_states(w.ctx, 2, 3, 8, KVA_F32, va, sa, vb, sb, vo, so);
  CHECK(st == KVA_OK, "kva_merge_states -> %s: %s", kva_strerror(st), kva_last_error());
  for (int i = 0; i < 6 && st == KVA_OK; i++) {
    double m = fmax(sa[i], sb[i]);
    double wa = exp(sa[i] - m), wb = exp(sb[i] - m);
    double s = m + log(wa + wb);
    CHECK(fabs(so[i] - s) <= 1e-5 * (1 + fabs(s)), "merge lse[%d] %g want %g", i, so[i], s);
    for (int d = 0; d < 8; d++) {
      double want = (wa * va[i * 8 + d] + wb * vb[i * 8 + d]) / (wa + wb);
      CHECK(fabs(vo[i * 8 + d] - want) <= 1e-5 * (1 + fabs(want)), "merge v[%d][%d] %g want %g",
            i, d, vo[i * 8 + d], want);
    }
  }

  /* a released request in the current plan: the next update names it */
  TRY(kva_req_release(w.table, s[0]));
  {
    int32_t one[1] = {s[0]}, c1[1] = {0}, n1[1] = {1};
    kva_batch b1 = {1, one, c1, n1};
    EXPECT_ERR(kva_plan_update(plan, &b1), KVA_ERR_INVALID_ARGUMENT);
  }
  kva_plan_destroy(plan);
  kva_plan_destroy(NULL);
  kva_pool_destroy(other);

  /* MLA pool: store needs v == NULL; no sliding window (tests/test_mla.c has the rest) */
  {
    kva_pool_config mc;
    memset(&mc, 0, sizeof(mc));
    mc.layout = KVA_LAYOUT_MLA;
    mc.num_layers = 1;
    mc.num_pages = 8;
    mc.page_size = 16;
    mc.num_kv_heads = 1;
    mc.head_dim = KVA_MLA_HEAD_DIM;
    mc.kv_dtype = KVA_BF16;
    kva_pool *mp = NULL;
    kva_req_table *mt = NULL;
    kva_plan *mpl = NULL;
    TRY(kva_pool_create(w.ctx, &mc, &mp));
    TRY(kva_req_table_create(mp, 2, 64, &mt));
    int ms;
    TRY(kva_req_alloc(mt, &ms));
    TRY(kva_req_append(mt, ms, 20));
    kva_plan_config mcfg = {2, 16, 16, 0, 0, 0};
    TRY(kva_plan_create(mt, &mcfg, &mpl));
    int32_t one[1] = {ms}, c1[1] = {19}, n1[1] = {1};
    kva_batch b1 = {1, one, c1, n1};
    TRY(kva_plan_update(mpl, &b1));
    float *lat = (float *)calloc(KVA_MLA_HEAD_DIM, sizeof(float));
    float *mq = (float *)calloc(16 * KVA_MLA_HEAD_DIM, sizeof(float));
    float *mo = (float *)calloc(16 * KVA_MLA_V_DIM, sizeof(float));
    EXPECT_ERR(kva_store_kv(mpl, mp, 0, lat, lat, KVA_F32), KVA_ERR_INVALID_ARGUMENT);
    kva_attn_params wp = ap;
    wp.window_left = 4; /* MLA has no sliding window */
    EXPECT_ERR(kva_attention(mpl, mp, 0, &wp, mq, mo, NULL, KVA_F32), KVA_ERR_UNSUPPORTED);
    free(lat);
    free(mq);
    free(mo);
    kva_plan_destroy(mpl);
    kva_req_table_destroy(mt);
    kva_pool_destroy(mp);
  }
  world_free(&w);
}

int main(void) {
  test_errors();
  /* page sizes 1..256; small and large tables; batches up to 512 */
  test_plans(1, 64, 2048, 2048, 40, 64);
  test_plans(16, 600, 2048, 2048, 48, 512);
  test_plans(64, 16, 131072, 131072, 40, 16);
  test_plans(256, 40, 131072, 40000, 40, 40);
  test_plans(7, 300, 1024, 1024, 48, 300);
  return tu_summary("test_planner");
}
