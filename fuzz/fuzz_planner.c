/* libFuzzer target: request-table changes interleaved with kva_plan_update
 * on fuzzer-chosen batches (valid and invalid). Invariants, abort on any
 * violation:
 *   - kva_pool_check is OK after every operation;
 *   - kva_plan_update succeeds exactly when the batch is valid by a model of
 *     the rules (sizes, live distinct slots, num_new >= 1, num_cached >= 0,
 *     num_cached + num_new <= request length, total_q <= max_q_tokens);
 *   - after a success every array of kva_plan_info agrees with the request
 *     table, and the split schedule covers every decode key exactly once;
 *   - after a failure the previous plan is unchanged;
 *   - the same batch given by its page table to a kva_plan_create_paged plan
 *     gives identical metadata, and a page table with a page id outside the
 *     pool or too narrow a stride is refused with that plan unchanged. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "kvattn.h"

#define CHECK(c, ...)                                                  \
  do {                                                                 \
    if (!(c)) {                                                        \
      fprintf(stderr, "fuzz_planner: %s:%d: ", __FILE__, __LINE__);    \
      fprintf(stderr, __VA_ARGS__);                                    \
      fprintf(stderr, " (last error: %s)\n", kva_last_error());        \
      abort();                                                         \
    }                                                                  \
  } while (0)

typedef struct bytes {
  const uint8_t *p;
  size_t n;
} bytes;
static unsigned take(bytes *b, unsigned mod) {
  unsigned v = 0;
  for (int i = 0; i < 2 && b->n; i++, b->p++, b->n--) v = (v << 8) | *b->p;
  return mod ? v % mod : v;
}

#define MAX_REQ 24
#define MAX_BATCH 32

static kva_context *ctx_get(void) {
  static kva_context *ctx;
  if (!ctx) {
    kva_context_config cc;
    memset(&cc, 0, sizeof(cc));
    cc.device = KVA_DEVICE_CPU;
    cc.num_threads = 1;
    CHECK(kva_context_create(&cc, &ctx) == KVA_OK, "context");
  }
  return ctx;
}

/* Every array of the plan against the table and the batch. */
static void check_plan(const kva_plan *plan, const kva_req_table *t, const kva_batch *b, int ps) {
  kva_plan_info in;
  CHECK(kva_plan_get_info(plan, &in) == KVA_OK, "get_info after update");
  int n = b->num_requests;
  CHECK(in.num_requests == n, "num_requests");
  int32_t q = 0, k = 0, maxp = 0, nd = 0, mq = 0, mk = 0;
  CHECK(in.cu_seqlens_q[0] == 0 && in.cu_seqlens_k[0] == 0 && in.kv_indptr[0] == 0 &&
            in.split_indptr[0] == 0,
        "first offsets");
  for (int r = 0; r < n; r++) {
    int nc = b->num_cached[r], nn = b->num_new[r], len = nc + nn, pages = (len + ps - 1) / ps;
    const int32_t *tok = kva_req_tokens(t, b->req_slots[r]);
    q += nn;
    k += len;
    if (pages > maxp) maxp = pages;
    if (nn > mq) mq = nn;
    if (len > mk) mk = len;
    nd += nn <= KVA_MAX_DECODE_Q;
    CHECK(in.cu_seqlens_q[r + 1] == q && in.cu_seqlens_k[r + 1] == k, "cu_seqlens of %d", r);
    CHECK(in.cache_seqlens[r] == len, "cache_seqlens[%d]", r);
    CHECK(in.kv_indptr[r + 1] - in.kv_indptr[r] == pages, "kv_indptr of %d", r);
    CHECK(in.kv_last_page_len[r] == len - (pages - 1) * ps, "kv_last_page_len[%d]", r);
    const int32_t *row = in.page_table + (size_t)r * (size_t)in.page_table_stride;
    const int32_t *rag = in.kv_indices + in.kv_indptr[r];
    for (int p = 0; p < len; p++) {
      CHECK(row[p / ps] * ps + p % ps == tok[p], "page_table of %d position %d", r, p);
      CHECK(rag[p / ps] * ps + p % ps == tok[p], "kv_indices of %d position %d", r, p);
    }
    for (int j = pages; j < in.page_table_stride; j++) CHECK(row[j] == 0, "unused entry");
    for (int i = 0; i < nn; i++)
      CHECK(in.out_cache_loc[in.cu_seqlens_q[r] + i] == tok[nc + i], "out_cache_loc");
    int s = in.split_indptr[r + 1] - in.split_indptr[r];
    CHECK(nn <= KVA_MAX_DECODE_Q ? s >= 1 : s == 0, "request %d has %d splits", r, s);
  }
  CHECK(in.total_q == q && in.total_k == k && in.max_q_len == mq && in.max_k_len == mk &&
            in.page_table_stride == maxp && in.num_decode == nd && in.num_extend == n - nd &&
            in.split_indptr[n] == in.num_splits_total,
        "totals");

  /* schedule: chunks tile every decode request, one owner each, block cuts */
  int block = plan->cfg.split_block, total = in.num_splits_total;
  int32_t *lo = (int32_t *)calloc((size_t)total + 1, sizeof(int32_t));
  int32_t *hi = (int32_t *)calloc((size_t)total + 1, sizeof(int32_t));
  uint8_t *own = (uint8_t *)calloc((size_t)total + 1, 1);
  CHECK(lo && hi && own, "oom");
  for (int w = 0; w < in.num_workers; w++) {
    const kva_split_work *x = &in.split_schedule[w];
    if (x->begin_req > x->end_req) continue;
    CHECK(x->begin_req >= 0 && x->end_req < n, "worker %d range", w);
    for (int r = x->begin_req; r <= x->end_req; r++) {
      int s = in.split_indptr[r + 1] - in.split_indptr[r];
      if (s == 0) continue;
      int a = r == x->begin_req ? x->begin_pos : 0;
      int e = r == x->end_req ? x->end_pos : in.cache_seqlens[r];
      int j = r == x->begin_req ? x->begin_split : 0;
      CHECK(j >= 0 && j < s && a < e && a % block == 0 &&
                (e == in.cache_seqlens[r] || e % block == 0),
            "worker %d chunk of %d", w, r);
      int id = in.split_indptr[r] + j;
      CHECK(!own[id], "split %d of %d owned twice", j, r);
      own[id] = 1;
      lo[id] = a;
      hi[id] = e;
    }
  }
  for (int r = 0; r < n; r++) {
    int pos = 0;
    for (int id = in.split_indptr[r]; id < in.split_indptr[r + 1]; id++) {
      CHECK(own[id] && lo[id] == pos, "request %d split %d", r, id - in.split_indptr[r]);
      pos = hi[id];
    }
    if (in.split_indptr[r + 1] > in.split_indptr[r])
      CHECK(pos == in.cache_seqlens[r], "request %d covered to %d", r, pos);
  }
  free(lo);
  free(hi);
  free(own);
}

typedef struct snap {
  kva_plan_info info;
  int32_t *buf;
  size_t len;
} snap;

static void take_snap(const kva_plan *plan, snap *s) {
  s->buf = NULL;
  s->len = 0;
  if (kva_plan_get_info(plan, &s->info) != KVA_OK) {
    memset(&s->info, 0, sizeof(s->info));
    return;
  }
  const kva_plan_info *in = &s->info;
  int n = in->num_requests;
  size_t len = (size_t)(n + 1) * 4 + (size_t)n * 2 + (size_t)n * (size_t)in->page_table_stride +
               (size_t)in->kv_indptr[n] + (size_t)in->total_q + (size_t)in->num_workers * 5;
  s->buf = (int32_t *)malloc(len * sizeof(int32_t));
  CHECK(s->buf, "oom");
  int32_t *p = s->buf;
#define PUT(a, c)                                     \
  do {                                                \
    memcpy(p, (a), (size_t)(c) * sizeof(int32_t));    \
    p += (c);                                         \
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
#undef PUT
  s->len = len;
}

static void check_unchanged(const kva_plan *plan, const snap *before) {
  snap now;
  take_snap(plan, &now);
  CHECK(now.len == before->len &&
            (now.len == 0 || memcmp(now.buf, before->buf, now.len * sizeof(int32_t)) == 0) &&
            now.info.num_requests == before->info.num_requests &&
            now.info.total_k == before->info.total_k &&
            now.info.num_splits_total == before->info.num_splits_total,
        "a failed update changed the plan");
  free(now.buf);
}

/* The request plan's batch through the paged plan, sometimes broken. */
static void paged_round(kva_plan *paged, const kva_plan *plan, bytes *b, int num_pages) {
  kva_plan_info in;
  CHECK(kva_plan_get_info(plan, &in) == KVA_OK, "get_info");
  int n = in.num_requests, need = in.page_table_stride;
  int stride = need + (int)take(b, 3);
  if (stride > paged->max_pages_per_req) stride = paged->max_pages_per_req;
  int32_t *pt = (int32_t *)malloc((size_t)n * (size_t)stride * sizeof(int32_t));
  int32_t *nn = (int32_t *)malloc((size_t)n * sizeof(int32_t));
  CHECK(pt && nn, "oom");
  for (int r = 0; r < n; r++) {
    nn[r] = in.cu_seqlens_q[r + 1] - in.cu_seqlens_q[r];
    for (int j = 0; j < stride; j++) /* entries past a request's pages are never read */
      pt[r * stride + j] = j < need ? in.page_table[r * need + j] : -7 - (int)take(b, 100);
  }
  kva_paged_batch pb = {n, nn, in.cache_seqlens, pt, stride};
  unsigned mode = take(b, 4);
  int expect_ok = 1;
  if (mode == 1) { /* a page id outside the pool, on a page the batch reads */
    int r = (int)take(b, (unsigned)n);
    int pages = (in.cache_seqlens[r] + paged->pool->cfg.page_size - 1) /
                paged->pool->cfg.page_size;
    int j = (int)take(b, (unsigned)pages);
    pt[r * stride + j] = take(b, 2) ? num_pages + (int)take(b, 5) : -1 - (int)take(b, 5);
    expect_ok = 0;
  } else if (mode == 2) { /* narrower than the longest request */
    pb.page_table_stride = need - 1;
    expect_ok = 0;
  }
  snap before;
  take_snap(paged, &before);
  kva_status st = kva_plan_update_paged(paged, &pb);
  CHECK((st == KVA_OK) == expect_ok, "plan_update_paged -> %d in mode %u", st, mode);
  if (st == KVA_OK) {
    snap a, c;
    take_snap(plan, &a);
    take_snap(paged, &c);
    CHECK(a.len == c.len && memcmp(a.buf, c.buf, a.len * sizeof(int32_t)) == 0 &&
              a.info.total_k == c.info.total_k && a.info.num_decode == c.info.num_decode &&
              a.info.num_splits_total == c.info.num_splits_total,
          "paged plan metadata differs from the request plan's");
    free(a.buf);
    free(c.buf);
  } else {
    check_unchanged(paged, &before);
  }
  free(before.buf);
  free(pt);
  free(nn);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  bytes b = {data, size};
  kva_pool_config pc;
  memset(&pc, 0, sizeof(pc));
  pc.layout = KVA_LAYOUT_MHA;
  pc.num_layers = 1;
  pc.num_pages = 1 + (int)take(&b, 200);
  pc.page_size = 1 + (int)take(&b, 40);
  pc.num_kv_heads = 1 + (int)take(&b, 2);
  pc.head_dim = 8;
  pc.kv_dtype = KVA_F16;
  const int ps = pc.page_size;
  int max_req = 1 + (int)take(&b, MAX_REQ), max_ctx = 1 + (int)take(&b, 400);
  kva_pool *pool = NULL;
  kva_req_table *t = NULL;
  CHECK(kva_pool_create(ctx_get(), &pc, &pool) == KVA_OK, "pool");
  CHECK(kva_req_table_create(pool, max_req, max_ctx, &t) == KVA_OK, "table");

  /* plan config: invalid values must be refused cleanly */
  kva_plan_config cfg;
  memset(&cfg, 0, sizeof cfg); /* every field set below; no stack garbage in new ones */
  cfg.max_batch = (int)take(&b, MAX_BATCH + 1);
  cfg.max_q_tokens = (int)take(&b, 300);
  cfg.num_qo_heads = (int)take(&b, 9);
  cfg.num_workers = (int)take(&b, 302) - 1;
  cfg.split_block = (int)take(&b, 302) - 1;
  cfg.deterministic = (int)take(&b, 4) - 1; /* -1 and 2 are refused */
  kva_plan *plan = NULL;
  kva_status st = kva_plan_create(t, &cfg, &plan);
  int cfg_ok = cfg.max_batch > 0 && cfg.max_q_tokens > 0 && cfg.num_qo_heads > 0 &&
               cfg.num_qo_heads % pc.num_kv_heads == 0 && cfg.num_workers >= 0 &&
               cfg.split_block >= 0 && (cfg.deterministic == 0 || cfg.deterministic == 1);
  CHECK((st == KVA_OK) == cfg_ok, "plan_create -> %d for a %s config", st,
        cfg_ok ? "valid" : "invalid");
  if (st != KVA_OK) {
    CHECK(plan == NULL, "failed create set *out");
    goto done;
  }

  kva_plan *paged = NULL;
  CHECK(kva_plan_create_paged(pool, &cfg, (max_ctx + ps - 1) / ps, &paged) == KVA_OK, "paged");
  int32_t slots[MAX_BATCH + 1], cached[MAX_BATCH + 1], nnew[MAX_BATCH + 1];
  while (b.n) {
    unsigned op = take(&b, 6);
    if (op == 0) { /* new request */
      int s;
      if (kva_req_alloc(t, &s) == KVA_OK) (void)kva_req_append(t, s, 1 + (int)take(&b, 300));
    } else if (op == 1) { /* grow */
      (void)kva_req_append(t, (int)take(&b, (unsigned)max_req), 1 + (int)take(&b, 64));
    } else if (op == 2) { /* fork */
      int s, src = (int)take(&b, (unsigned)max_req);
      int len = kva_req_len(t, src);
      if (len > 0 && kva_req_fork(t, src, 1 + (int)take(&b, (unsigned)len), &s) == KVA_OK)
        (void)kva_req_append(t, s, (int)take(&b, 8) + 1);
    } else if (op == 3) { /* truncate or release */
      int s = (int)take(&b, (unsigned)max_req), len = kva_req_len(t, s);
      if (len > 1 && take(&b, 2))
        (void)kva_req_truncate(t, s, 1 + (int)take(&b, (unsigned)len - 1));
      else if (len >= 0)
        (void)kva_req_release(t, s);
    } else { /* plan a batch, mostly valid, sometimes broken on purpose */
      int n = (int)take(&b, MAX_BATCH + 2);
      if (n > MAX_BATCH + 1) n = MAX_BATCH + 1;
      int64_t total_q = 0;
      int valid = n >= 1 && n <= cfg.max_batch;
      uint32_t used = 0;
      for (int i = 0; i < n; i++) {
        unsigned mode = take(&b, 16);
        int s = (int)take(&b, (unsigned)max_req + 1) - (mode == 15);
        int len = s >= 0 && s < max_req ? kva_req_len(t, s) : -1;
        int nn = len > 0 ? 1 + (int)take(&b, (unsigned)len) : 1;
        if (mode == 14) nn = -(int)take(&b, 3);
        int nc = (len > 0 ? len : 1) - nn - (int)take(&b, 3);
        if (mode == 13) nc += 1 + (int)take(&b, 4);
        if (nc < 0 && mode != 12) nc = 0;
        slots[i] = s;
        nnew[i] = nn;
        cached[i] = nc;
        total_q += nn;
        if (s < 0 || s >= max_req || len < 0 || nn < 1 || nc < 0 || (int64_t)nc + nn > len ||
            (used >> s & 1u))
          valid = 0;
        if (s >= 0 && s < max_req) used |= 1u << s;
      }
      if (total_q > cfg.max_q_tokens) valid = 0;
      kva_batch batch = {n, slots, cached, nnew};
      snap before;
      take_snap(plan, &before);
      st = kva_plan_update(plan, &batch);
      CHECK((st == KVA_OK) == (valid != 0), "plan_update -> %d for a %s batch", st,
            valid ? "valid" : "invalid");
      if (st == KVA_OK) {
        check_plan(plan, t, &batch, ps);
        paged_round(paged, plan, &b, pc.num_pages);
      } else
        check_unchanged(plan, &before);
      free(before.buf);
    }
    CHECK(kva_pool_check(pool) == KVA_OK, "kva_pool_check after op %u", op);
  }
  kva_plan_destroy(plan);
  kva_plan_destroy(paged);
done:
  kva_req_table_destroy(t);
  CHECK(kva_pool_num_free_pages(pool) == pc.num_pages, "pages leaked");
  kva_pool_destroy(pool);
  return 0;
}
