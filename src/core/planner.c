/* Per-step batch planning: validates a batch against the request table and
 * builds every piece of metadata the kernels read (docs/design.md,
 * "Planning"). kva_plan_update validates and computes into scratch before it
 * writes the plan, so a failing update leaves the previous batch intact. */
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"

/* The public kva_plan plus planner-private scratch; kva_plan* points at pub. */
typedef struct plan_impl {
  struct kva_plan pub;
  uint32_t *slot_stamp;       /* [table->max_requests] duplicate-slot detection */
  uint32_t stamp;
  int32_t *sched_kv;          /* [max_batch] kv_len per request for the schedule */
  int32_t *kv_len;            /* [max_batch] num_cached + num_new of kva_plan_update's batch */
  kva_split_work *tmp_sched;  /* [num_workers] */
  int32_t *tmp_indptr;        /* [max_batch + 1] */
  int32_t *tmp_row_offset;    /* [max_batch + 1] */
  int32_t *tmp_order;         /* [max_batch] */
  int64_t *sched_keys;        /* [max_batch] kva_split_schedule_packed's scratch */
  int32_t *sched_nxt;         /* [max_batch + 1] */
  int backend_inited;
  int auto_workers;           /* config->num_workers was 0: each batch asks the backend */
} plan_impl;

static void *xcalloc(size_t n, size_t size) { return calloc(n ? n : 1, size); }

void kva_plan_destroy(kva_plan *plan) {
  if (!plan) return;
  plan_impl *pi = (plan_impl *)plan;
  const kva_backend *be = plan->ctx ? plan->ctx->backend : NULL;
  if (be && pi->backend_inited && be->plan_free) be->plan_free(plan);
  if (be && be->mem_free) {
    if (plan->partial_o) be->mem_free(plan->ctx, plan->partial_o);
    if (plan->partial_lse) be->mem_free(plan->ctx, plan->partial_lse);
  }
  free(plan->req_slots);
  free(plan->num_new);
  free(plan->cu_seqlens_q);
  free(plan->cu_seqlens_k);
  free(plan->cache_seqlens);
  free(plan->page_table);
  free(plan->kv_indptr);
  free(plan->kv_indices);
  free(plan->kv_last_page_len);
  free(plan->out_cache_loc);
  free(plan->q_req);
  free(plan->decode_reqs);
  free(plan->extend_reqs);
  free(plan->split_schedule);
  free(plan->split_indptr);
  free(plan->sched_order);
  free(plan->split_row_offset);
  free(pi->slot_stamp);
  free(pi->sched_kv);
  free(pi->kv_len);
  free(pi->tmp_sched);
  free(pi->tmp_indptr);
  free(pi->tmp_row_offset);
  free(pi->tmp_order);
  free(pi->sched_keys);
  free(pi->sched_nxt);
  free(pi);
}

/* Workers beyond this are a configuration error rather than a real machine. */
#define KVA_PLAN_MAX_WORKERS 65536

/* A plan over table (kva_plan_create) or, with table NULL, over caller page
 * tables of up to max_pages_per_req pages (kva_plan_create_paged). */
static kva_status plan_create(kva_pool *pool, kva_req_table *table, int max_pages_per_req,
                              const kva_plan_config *config, const char *fn, kva_plan **out) {
  KVA_CHECK_NULL(config, fn);
  KVA_CHECK_NULL(out, fn);
  *out = NULL;
  if (!pool || !pool->ctx || !pool->ctx->backend)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: the pool has no context", fn);
  kva_context *ctx = pool->ctx;
  const kva_backend *be = ctx->backend;

  if (config->max_batch <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->max_batch must be > 0 (got %d)",
                         fn, config->max_batch);
  if (config->max_q_tokens <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: config->max_q_tokens must be > 0 (got %d)", fn,
                         config->max_q_tokens);
  if (config->num_qo_heads <= 0 || config->num_qo_heads % pool->cfg.num_kv_heads != 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: config->num_qo_heads (%d) must be a positive multiple of the "
                         "pool's num_kv_heads (%d)",
                         fn, config->num_qo_heads, pool->cfg.num_kv_heads);
  if (config->num_workers < 0 || config->num_workers > KVA_PLAN_MAX_WORKERS)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: config->num_workers must be 0..%d (got %d)", fn,
                         KVA_PLAN_MAX_WORKERS, config->num_workers);
  if (config->deterministic != 0 && config->deterministic != 1)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->deterministic must be 0 or 1 (got %d)",
                         fn, config->deterministic);
  if (config->split_block < 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: config->split_block must be >= 0 (got %d)", fn,
                         config->split_block);
  /* ragged page indices and their indptr are int32 */
  int64_t max_pages = (int64_t)config->max_batch * max_pages_per_req;
  if (max_pages > INT32_MAX)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: config->max_batch (%d) x pages per request (%d) exceeds int32 "
                         "page indices",
                         fn, config->max_batch, max_pages_per_req);

  int workers = config->num_workers;
  if (workers == 0)
    workers = be->default_workers ? be->default_workers(ctx, pool, config->num_qo_heads, 1)
                                  : ctx->num_workers;
  if (workers < 1) workers = 1;
  if (workers > KVA_PLAN_MAX_WORKERS) workers = KVA_PLAN_MAX_WORKERS;
  int block = config->split_block ? config->split_block
              : be->default_split_block ? be->default_split_block(ctx, pool)
                                        : ctx->default_split_block;
  if (block < 1) block = 64;

  /* Partial rows: decode q tokens of split requests plus one extra chunk per
   * cut; a schedule makes at most workers-1 cuts, each adding <= 8 rows. */
  int64_t decode_q = config->max_q_tokens;
  if (decode_q > (int64_t)config->max_batch * KVA_MAX_DECODE_Q)
    decode_q = (int64_t)config->max_batch * KVA_MAX_DECODE_Q;
  int64_t rows = decode_q + (int64_t)workers * KVA_MAX_DECODE_Q;
  if (rows > INT32_MAX)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: split-KV workspace of %lld rows is too "
                         "large", fn, (long long)rows);

  plan_impl *pi = (plan_impl *)calloc(1, sizeof(*pi));
  if (!pi) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  kva_plan *p = &pi->pub;
  p->table = table;
  p->pool = pool;
  p->ctx = ctx;
  p->cfg = *config;
  p->cfg.num_workers = workers;
  pi->auto_workers = config->num_workers == 0;
  p->cfg.split_block = block;
  p->max_pages_per_req = max_pages_per_req;
  p->max_partial_rows = (int)rows;
  p->decode_q_cap = KVA_MAX_DECODE_Q;

  size_t B = (size_t)config->max_batch, Q = (size_t)config->max_q_tokens;
  size_t P = (size_t)max_pages;
  p->req_slots = (int32_t *)xcalloc(B, sizeof(int32_t));
  p->num_new = (int32_t *)xcalloc(B, sizeof(int32_t));
  p->cu_seqlens_q = (int32_t *)xcalloc(B + 1, sizeof(int32_t));
  p->cu_seqlens_k = (int32_t *)xcalloc(B + 1, sizeof(int32_t));
  p->cache_seqlens = (int32_t *)xcalloc(B, sizeof(int32_t));
  p->page_table = (int32_t *)xcalloc(P, sizeof(int32_t));
  p->kv_indptr = (int32_t *)xcalloc(B + 1, sizeof(int32_t));
  p->kv_indices = (int32_t *)xcalloc(P, sizeof(int32_t));
  p->kv_last_page_len = (int32_t *)xcalloc(B, sizeof(int32_t));
  p->out_cache_loc = (int32_t *)xcalloc(Q, sizeof(int32_t));
  p->q_req = (int32_t *)xcalloc(Q, sizeof(int32_t));
  p->decode_reqs = (int32_t *)xcalloc(B, sizeof(int32_t));
  p->extend_reqs = (int32_t *)xcalloc(B, sizeof(int32_t));
  p->split_schedule = (kva_split_work *)xcalloc((size_t)workers, sizeof(kva_split_work));
  p->split_indptr = (int32_t *)xcalloc(B + 1, sizeof(int32_t));
  p->sched_order = (int32_t *)xcalloc(B, sizeof(int32_t));
  p->split_row_offset = (int32_t *)xcalloc(B + 1, sizeof(int32_t));
  pi->slot_stamp = (uint32_t *)xcalloc(table ? (size_t)table->max_requests : 1, sizeof(uint32_t));
  pi->sched_kv = (int32_t *)xcalloc(B, sizeof(int32_t));
  pi->kv_len = (int32_t *)xcalloc(B, sizeof(int32_t));
  pi->tmp_sched = (kva_split_work *)xcalloc((size_t)workers, sizeof(kva_split_work));
  pi->tmp_indptr = (int32_t *)xcalloc(B + 1, sizeof(int32_t));
  pi->tmp_row_offset = (int32_t *)xcalloc(B + 1, sizeof(int32_t));
  pi->tmp_order = (int32_t *)xcalloc(B, sizeof(int32_t));
  pi->sched_keys = (int64_t *)xcalloc(B, sizeof(int64_t));
  pi->sched_nxt = (int32_t *)xcalloc(B + 1, sizeof(int32_t));
  if (!p->req_slots || !p->num_new || !p->cu_seqlens_q || !p->cu_seqlens_k ||
      !p->cache_seqlens || !p->page_table || !p->kv_indptr || !p->kv_indices ||
      !p->kv_last_page_len || !p->out_cache_loc || !p->q_req || !p->decode_reqs ||
      !p->extend_reqs || !p->split_schedule || !p->split_indptr || !p->split_row_offset ||
      !pi->slot_stamp || !pi->sched_kv || !pi->kv_len || !pi->tmp_sched || !pi->tmp_indptr ||
      !pi->tmp_row_offset || !p->sched_order || !pi->tmp_order || !pi->sched_keys ||
      !pi->sched_nxt) {
    kva_plan_destroy(p);
    return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  /* Before the first batch every worker is idle (begin_req > end_req). */
  for (int w = 0; w < workers; w++) {
    p->split_schedule[w].begin_req = 0;
    p->split_schedule[w].end_req = -1;
  }
  p->hdr.num_workers = workers;

  /* MLA's partial O holds the 512-dim V part of the latent. */
  int vdim = pool->cfg.layout == KVA_LAYOUT_MLA ? KVA_MLA_V_DIM : pool->cfg.head_dim;
  size_t o_bytes = (size_t)rows * (size_t)config->num_qo_heads * (size_t)vdim * sizeof(float);
  size_t lse_bytes = (size_t)rows * (size_t)config->num_qo_heads * sizeof(float);
  kva_status st = be->mem_alloc(ctx, o_bytes, &p->partial_o);
  if (st == KVA_OK) st = be->mem_alloc(ctx, lse_bytes, &p->partial_lse);
  if (st != KVA_OK) {
    kva_plan_destroy(p);
    return st; /* message set by mem_alloc */
  }
  if (be->plan_init) {
    st = be->plan_init(p);
    if (st != KVA_OK) {
      /* plan_init cleans up after itself on failure */
      kva_plan_destroy(p);
      return st;
    }
  }
  pi->backend_inited = 1;
  *out = p;
  return KVA_OK;
}

kva_status kva_plan_create(kva_req_table *table, const kva_plan_config *config, kva_plan **out) {
  static const char *fn = "kva_plan_create";
  KVA_CHECK_NULL(table, fn);
  return plan_create(table->pool, table, table->max_pages_per_req, config, fn, out);
}

kva_status kva_plan_create_paged(kva_pool *pool, const kva_plan_config *config,
                                 int max_pages_per_req, kva_plan **out) {
  static const char *fn = "kva_plan_create_paged";
  KVA_CHECK_NULL(pool, fn);
  if (max_pages_per_req <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: max_pages_per_req must be > 0 (got %d)",
                         fn, max_pages_per_req);
  return plan_create(pool, NULL, max_pages_per_req, config, fn, out);
}

/* Validation of request i of the batch; reads only. */
static kva_status check_request(const kva_plan *p, const kva_batch *b, int i) {
  static const char *fn = "kva_plan_update";
  const kva_req_table *t = p->table;
  int32_t slot = b->req_slots[i];
  if (slot < 0 || slot >= t->max_requests)
    return kva_set_error(KVA_ERR_OUT_OF_RANGE,
                         "%s: batch->req_slots[%d] = %d is not in [0, %d)", fn, i, slot,
                         t->max_requests);
  int len = kva_req_len(t, slot);
  if (len < 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: batch->req_slots[%d] = %d is not a live request", fn, i, slot);
  if (b->num_new[i] < 1)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: batch->num_new[%d] = %d must be >= 1",
                         fn, i, b->num_new[i]);
  if (b->num_cached[i] < 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: batch->num_cached[%d] = %d must be >= 0", fn, i,
                         b->num_cached[i]);
  int64_t need = (int64_t)b->num_cached[i] + b->num_new[i];
  if (need > len)
    return kva_set_error(KVA_ERR_OUT_OF_RANGE,
                         "%s: request %d (slot %d) holds %d positions but num_cached + num_new "
                         "= %lld (kva_req_append first)",
                         fn, i, slot, len, (long long)need);
  /* page ids of the pages this step reads, and the slots it writes */
  const int32_t *tok = kva_req_tokens(t, slot);
  if (!tok) return kva_set_error(KVA_ERR_INTERNAL, "%s: live slot %d has no tokens", fn, slot);
  const kva_pool *pool = p->pool;
  int ps = pool->cfg.page_size;
  int64_t nslots = (int64_t)pool->cfg.num_pages * ps;
  for (int64_t pos = 0; pos < need; pos += ps) {
    int32_t s = tok[pos];
    if (s < 0 || s >= nslots || s % ps != 0 || pool->refcount[s / ps] <= 0)
      return kva_set_error(KVA_ERR_INTERNAL,
                           "%s: request slot %d position %lld maps to KV slot %d, not the start "
                           "of a live page",
                           fn, slot, (long long)pos, s);
  }
  for (int64_t pos = b->num_cached[i]; pos < need; pos++)
    if (tok[pos] < 0 || tok[pos] >= nslots)
      return kva_set_error(KVA_ERR_INTERNAL, "%s: request slot %d position %lld maps to KV slot "
                           "%d outside the pool", fn, slot, (long long)pos, tok[pos]);
  return KVA_OK;
}

/* Batch-size checks common to both update forms. */
static kva_status check_batch_size(const kva_plan *p, int n, const char *fn) {
  if (p->capturing)
    return kva_set_error(KVA_ERR_STATE, "%s: plan is inside a graph capture", fn);
  if (n < 1)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: batch->num_requests must be >= 1 (got %d)",
                         fn, n);
  if (n > p->cfg.max_batch)
    return kva_set_error(KVA_ERR_CAPACITY, "%s: batch->num_requests %d exceeds max_batch %d", fn,
                         n, p->cfg.max_batch);
  return KVA_OK;
}

/* Totals of a validated batch against the plan's capacities. */
static kva_status check_totals(const kva_plan *p, int64_t total_q, int64_t total_k,
                               const char *fn) {
  if (total_q > p->cfg.max_q_tokens)
    return kva_set_error(KVA_ERR_CAPACITY, "%s: the batch has %lld new tokens, max_q_tokens is %d",
                         fn, (long long)total_q, p->cfg.max_q_tokens);
  if (total_k > INT32_MAX)
    return kva_set_error(KVA_ERR_CAPACITY, "%s: the batch has %lld KV tokens, beyond int32", fn,
                         (long long)total_k);
  return KVA_OK;
}

/* An integer A/B switch from the environment, read once into *cache
 * (INT_MIN: not read yet); dflt when unset or empty. */
static int env_int_once(int *cache, const char *name, int dflt) {
  if (*cache == INT_MIN) {
    const char *e = getenv(name);
    *cache = e && *e ? atoi(e) : dflt;
  }
  return *cache;
}

/* MLA plans walk the requests in the packed order (split_schedule.c):
 * fewer cut requests, whose 512-dim partial rows cost the MLA kernels the
 * most. KVA_SCHED_PACK=0 walks them in batch order (A/B). MHA consumers
 * index requests directly, so their order stays the identity. */
static int sched_packed(const kva_plan *p) {
  static int env = INT_MIN;
  return env_int_once(&env, "KVA_SCHED_PACK", 1) != 0 && p->pool->cfg.layout == KVA_LAYOUT_MLA;
}

/* The packed walk's cost of a chunk in blocks: the backend's, unless
 * KVA_SCHED_OVERHEAD=N > 0 (A/B); <= 0: the in-order walk's 2. */
static int sched_overhead(const kva_plan *p, int max_dq) {
  static int env = INT_MIN;
  const int forced = env_int_once(&env, "KVA_SCHED_OVERHEAD", 0);
  if (forced > 0) return forced;
  const kva_backend *be = p->ctx->backend;
  return be->split_overhead && max_dq > 0
             ? be->split_overhead(p->ctx, p->pool, p->cfg.num_qo_heads, max_dq,
                                  p->cfg.split_block)
             : 0;
}

/* The costed walk's prices (the backend's, with its own worker count
 * only: an explicit count gets the packed walk, as slack). KVA_SCHED_COSTED=0
 * keeps the packed walk; KVA_SCHED_COSTS="chunk/partial/merge/many/margin/
 * min_head" (1/16 blocks; min_head in blocks) overrides the prices and takes
 * the costed walk also where the backend keeps the packed one (A/B). */
static int sched_costs(const kva_plan *p, int max_dq, kva_split_costs *c) {
  static int env = INT_MIN;
  static int forced = 0;
  static kva_split_costs fc;
  if (env == INT_MIN) {
    const char *e = getenv("KVA_SCHED_COSTS");
    forced = e && sscanf(e, "%d/%d/%d/%d/%d/%d", &fc.chunk, &fc.partial, &fc.merge,
                         &fc.merge_many, &fc.margin, &fc.min_head) == 6;
  }
  if (!env_int_once(&env, "KVA_SCHED_COSTED", 1)) return 0;
  const plan_impl *pi = (const plan_impl *)p;
  const kva_backend *be = p->ctx->backend;
  if (!pi->auto_workers || !be->split_costs || max_dq <= 0) return 0;
  if (forced) { /* also where the backend keeps the packed walk */
    *c = fc;
    return 1;
  }
  return be->split_costs(p->ctx, p->pool, p->cfg.num_qo_heads, max_dq, p->cfg.split_block, c);
}

/* Split schedule over the decode requests and their partial rows, into
 * scratch. kv_len[i] = num_cached + num_new. */
static kva_status schedule(plan_impl *pi, int n, const int32_t *kv_len, const int32_t *num_new,
                           int *nsplits, int *workers, const char *fn) {
  kva_plan *p = &pi->pub;
  int max_dq = 0; /* the longest decode request */
  for (int i = 0; i < n; i++) {
    pi->sched_kv[i] = num_new[i] <= KVA_MAX_DECODE_Q ? kv_len[i] : 0;
    if (num_new[i] <= KVA_MAX_DECODE_Q && num_new[i] > max_dq) max_dq = num_new[i];
  }
  int w = p->cfg.num_workers;
  const kva_backend *be = p->ctx->backend;
  /* MHA decode: workers for the kernel the launch runs, which a graph sizes
   * for its capacity (decode_q_cap, decode_q_floor) */
  int wq = max_dq;
  if (p->pool->cfg.layout == KVA_LAYOUT_MHA && max_dq > 0) {
    if (p->graph_mode && p->decode_q_cap > wq) wq = p->decode_q_cap;
    if (p->decode_q_floor > wq) wq = p->decode_q_floor;
  }
  if (pi->auto_workers && be->default_workers && wq > 1) {
    const int bw = be->default_workers(p->ctx, p->pool, p->cfg.num_qo_heads, wq);
    if (bw >= 1 && bw < w) w = bw;
  }
  *workers = w; /* <= cfg.num_workers */
  /* Slack only with the backend's own worker count: an explicit count gets
   * the exact balanced schedule (tests set one to force cuts). */
  const int slack = pi->auto_workers && be->split_slack && max_dq > 0
                        ? be->split_slack(p->ctx, p->pool, p->cfg.num_qo_heads, max_dq,
                                          p->cfg.split_block)
                        : 0;
  kva_split_costs costs;
  if (sched_packed(p) && sched_costs(p, max_dq, &costs))
    *nsplits = kva_split_schedule_costed(n, pi->sched_kv, p->cfg.split_block, w, slack, &costs,
                                         pi->tmp_sched, pi->tmp_indptr, pi->tmp_order,
                                         pi->sched_keys, pi->sched_nxt);
  else if (sched_packed(p))
    *nsplits = kva_split_schedule_packed(n, pi->sched_kv, p->cfg.split_block, w, slack,
                                         sched_overhead(p, max_dq), pi->tmp_sched, pi->tmp_indptr, pi->tmp_order,
                                         pi->sched_keys, pi->sched_nxt);
  else {
    *nsplits = kva_split_schedule(n, pi->sched_kv, num_new, p->cfg.split_block, w, slack,
                                  pi->tmp_sched, pi->tmp_indptr);
    for (int i = 0; i < n; i++) pi->tmp_order[i] = i;
  }
  int64_t rows = 0;
  for (int i = 0; i < n; i++) {
    pi->tmp_row_offset[i] = (int32_t)(rows <= INT32_MAX ? rows : INT32_MAX);
    int s = pi->tmp_indptr[i + 1] - pi->tmp_indptr[i];
    if (s > 1) rows += (int64_t)s * num_new[i];
  }
  if (rows > p->max_partial_rows)
    return kva_set_error(KVA_ERR_WORKSPACE_TOO_SMALL,
                         "%s: split-KV needs %lld partial rows, the plan has %d", fn,
                         (long long)rows, p->max_partial_rows);
  pi->tmp_row_offset[n] = (int32_t)rows;
  return KVA_OK;
}

/* Where a validated, scheduled batch's pages and new-token slots come from:
 * the request table's rows, or the caller's page table. */
typedef struct page_source {
  const int32_t *req_slots;  /* request-table plans */
  const int32_t *page_table; /* paged plans: [n, stride] */
  int stride;
} page_source;

/* Writes the batch into the plan (nothing here can fail), then publishes it;
 * W: the batch's workers (schedule). */
static kva_status commit(plan_impl *pi, int n, const int32_t *kv_len, const int32_t *num_new,
                         int max_pages, const page_source *src, int nsplits, int W) {
  kva_plan *p = &pi->pub;
  const int ps = p->pool->cfg.page_size;
  int32_t cq = 0, ck = 0, kvp = 0, max_q = 0, max_k = 0;
  int nd = 0, ne = 0, max_dq = 0;
  memset(p->page_table, 0, (size_t)n * (size_t)max_pages * sizeof(int32_t));
  p->cu_seqlens_q[0] = 0;
  p->cu_seqlens_k[0] = 0;
  p->kv_indptr[0] = 0;
  for (int i = 0; i < n; i++) {
    int32_t len = kv_len[i], nn = num_new[i], nc = len - nn;
    const int32_t *tok = src->req_slots ? kva_req_tokens(p->table, src->req_slots[i]) : NULL;
    const int32_t *user_row = src->page_table ? src->page_table + (size_t)i * src->stride : NULL;
    p->req_slots[i] = src->req_slots ? src->req_slots[i] : -1;
    p->num_new[i] = nn;
    p->cache_seqlens[i] = len;
    int pages = (len + ps - 1) / ps;
    int32_t *row = p->page_table + (size_t)i * (size_t)max_pages;
    for (int j = 0; j < pages; j++) {
      int32_t page = tok ? tok[(size_t)j * (size_t)ps] / ps : user_row[j];
      row[j] = page;
      p->kv_indices[kvp + j] = page;
    }
    kvp += pages;
    p->kv_indptr[i + 1] = kvp;
    p->kv_last_page_len[i] = len - (pages - 1) * ps;
    for (int t = 0; t < nn; t++) {
      int32_t pos = nc + t;
      p->out_cache_loc[cq + t] = tok ? tok[pos] : row[pos / ps] * ps + pos % ps;
      p->q_req[cq + t] = i;
    }
    cq += nn;
    ck += len;
    p->cu_seqlens_q[i + 1] = cq;
    p->cu_seqlens_k[i + 1] = ck;
    if (nn > max_q) max_q = nn;
    if (len > max_k) max_k = len;
    if (nn <= KVA_MAX_DECODE_Q) {
      p->decode_reqs[nd++] = i;
      if (nn > max_dq) max_dq = nn;
    } else {
      p->extend_reqs[ne++] = i;
    }
  }
  memcpy(p->split_schedule, pi->tmp_sched, (size_t)W * sizeof(kva_split_work));
  for (int w = W; w < p->cfg.num_workers; w++) { /* idle: the launch grid is the capacity */
    memset(&p->split_schedule[w], 0, sizeof(kva_split_work));
    p->split_schedule[w].end_req = -1;
  }
  memcpy(p->split_indptr, pi->tmp_indptr, (size_t)(n + 1) * sizeof(int32_t));
  memcpy(p->sched_order, pi->tmp_order, (size_t)n * sizeof(int32_t));
  memcpy(p->split_row_offset, pi->tmp_row_offset, (size_t)(n + 1) * sizeof(int32_t));

  p->hdr.num_requests = n;
  p->hdr.total_q = cq;
  p->hdr.max_q_len = max_q;
  p->hdr.max_k_len = max_k;
  p->hdr.page_table_stride = max_pages;
  p->hdr.num_workers = W;
  p->hdr.num_splits_total = nsplits;
  p->hdr.num_extend = ne;
  p->num_decode = nd;
  p->max_decode_q = max_dq;
  p->num_extend = ne;
  p->total_k = ck;
  p->valid = 1;

  if (p->ctx->backend->plan_upload) {
    kva_status st = p->ctx->backend->plan_upload(p);
    if (st != KVA_OK) {
      /* the device copy is now in an unknown state: refuse runs until a
       * successful update */
      p->valid = 0;
      return st;
    }
  }
  return KVA_OK;
}

kva_status kva_plan_update(kva_plan *plan, const kva_batch *batch) {
  static const char *fn = "kva_plan_update";
  KVA_CHECK_NULL(plan, fn);
  KVA_CHECK_NULL(batch, fn);
  plan_impl *pi = (plan_impl *)plan;
  kva_plan *p = plan;
  if (!p->table)
    return kva_set_error(KVA_ERR_STATE, "%s: the plan was made by kva_plan_create_paged; use "
                         "kva_plan_update_paged", fn);
  const int n = batch->num_requests;
  kva_status st = check_batch_size(p, n, fn);
  if (st != KVA_OK) return st;
  KVA_CHECK_NULL(batch->req_slots, fn);
  KVA_CHECK_NULL(batch->num_cached, fn);
  KVA_CHECK_NULL(batch->num_new, fn);

  /* ---- validate everything before touching the plan ---- */
  if (++pi->stamp == 0) { /* wrapped: forget old stamps */
    memset(pi->slot_stamp, 0, (size_t)p->table->max_requests * sizeof(uint32_t));
    pi->stamp = 1;
  }
  const int ps = p->pool->cfg.page_size;
  int64_t total_q = 0, total_k = 0;
  int max_pages = 0;
  for (int i = 0; i < n; i++) {
    st = check_request(p, batch, i);
    if (st != KVA_OK) return st;
    int32_t slot = batch->req_slots[i];
    if (pi->slot_stamp[slot] == pi->stamp)
      return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                           "%s: batch->req_slots[%d] = %d appears twice in the batch", fn, i,
                           slot);
    pi->slot_stamp[slot] = pi->stamp;
    int32_t len = batch->num_cached[i] + batch->num_new[i]; /* fits: checked <= req len */
    pi->kv_len[i] = len;
    total_q += batch->num_new[i];
    total_k += len;
    int pages = (len + ps - 1) / ps;
    if (pages > max_pages) max_pages = pages;
  }
  st = check_totals(p, total_q, total_k, fn);
  if (st != KVA_OK) return st;
  int nsplits, workers;
  st = schedule(pi, n, pi->kv_len, batch->num_new, &nsplits, &workers, fn);
  if (st != KVA_OK) return st;
  page_source src = {batch->req_slots, NULL, 0};
  return commit(pi, n, pi->kv_len, batch->num_new, max_pages, &src, nsplits, workers);
}

kva_status kva_plan_update_paged(kva_plan *plan, const kva_paged_batch *batch) {
  static const char *fn = "kva_plan_update_paged";
  KVA_CHECK_NULL(plan, fn);
  KVA_CHECK_NULL(batch, fn);
  plan_impl *pi = (plan_impl *)plan;
  kva_plan *p = plan;
  if (p->table)
    return kva_set_error(KVA_ERR_STATE, "%s: the plan was made by kva_plan_create over a request "
                         "table; use kva_plan_update", fn);
  const int n = batch->num_requests;
  kva_status st = check_batch_size(p, n, fn);
  if (st != KVA_OK) return st;
  KVA_CHECK_NULL(batch->num_new, fn);
  KVA_CHECK_NULL(batch->cache_seqlens, fn);
  KVA_CHECK_NULL(batch->page_table, fn);
  const int stride = batch->page_table_stride;
  if (stride < 1 || stride > p->max_pages_per_req)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: batch->page_table_stride %d is not in [1, max_pages_per_req %d]", fn,
                         stride, p->max_pages_per_req);
  const kva_pool_config *pc = &p->pool->cfg;
  const int ps = pc->page_size;
  int64_t total_q = 0, total_k = 0;
  int max_pages = 0;
  for (int i = 0; i < n; i++) {
    int32_t nn = batch->num_new[i], len = batch->cache_seqlens[i];
    if (nn < 1)
      return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: batch->num_new[%d] = %d must be >= 1",
                           fn, i, nn);
    if (len < nn)
      return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                           "%s: batch->cache_seqlens[%d] = %d is less than num_new (%d); it "
                           "counts the new tokens too",
                           fn, i, len, nn);
    int64_t pages = ((int64_t)len + ps - 1) / ps;
    if (pages > stride)
      return kva_set_error(KVA_ERR_OUT_OF_RANGE,
                           "%s: request %d has %d tokens = %lld pages of %d, beyond "
                           "page_table_stride %d",
                           fn, i, len, (long long)pages, ps, stride);
    const int32_t *row = batch->page_table + (size_t)i * (size_t)stride;
    for (int64_t j = 0; j < pages; j++)
      if (row[j] < 0 || row[j] >= pc->num_pages)
        return kva_set_error(KVA_ERR_OUT_OF_RANGE,
                             "%s: batch->page_table[%d][%lld] = %d is not a page of the pool "
                             "[0, %d)",
                             fn, i, (long long)j, row[j], pc->num_pages);
    total_q += nn;
    total_k += len;
    if (pages > max_pages) max_pages = (int)pages;
  }
  st = check_totals(p, total_q, total_k, fn);
  if (st != KVA_OK) return st;
  int nsplits, workers;
  st = schedule(pi, n, batch->cache_seqlens, batch->num_new, &nsplits, &workers, fn);
  if (st != KVA_OK) return st;
  page_source src = {NULL, batch->page_table, stride};
  return commit(pi, n, batch->cache_seqlens, batch->num_new, max_pages, &src, nsplits, workers);
}

kva_status kva_plan_get_info(const kva_plan *plan, kva_plan_info *info) {
  static const char *fn = "kva_plan_get_info";
  KVA_CHECK_NULL(plan, fn);
  KVA_CHECK_NULL(info, fn);
  if (!plan->valid)
    return kva_set_error(KVA_ERR_STATE, "%s: no batch planned yet (kva_plan_update)", fn);
  memset(info, 0, sizeof(*info));
  info->num_requests = plan->hdr.num_requests;
  info->total_q = plan->hdr.total_q;
  info->total_k = plan->total_k;
  info->max_q_len = plan->hdr.max_q_len;
  info->max_k_len = plan->hdr.max_k_len;
  info->num_decode = plan->num_decode;
  info->num_extend = plan->num_extend;
  info->cu_seqlens_q = plan->cu_seqlens_q;
  info->cu_seqlens_k = plan->cu_seqlens_k;
  info->cache_seqlens = plan->cache_seqlens;
  info->page_table = plan->page_table;
  info->page_table_stride = plan->hdr.page_table_stride;
  info->kv_indptr = plan->kv_indptr;
  info->kv_indices = plan->kv_indices;
  info->kv_last_page_len = plan->kv_last_page_len;
  info->out_cache_loc = plan->out_cache_loc;
  info->num_workers = plan->hdr.num_workers;
  info->split_schedule = plan->split_schedule;
  info->split_indptr = plan->split_indptr;
  info->sched_order = plan->sched_order;
  info->num_splits_total = plan->hdr.num_splits_total;
  return KVA_OK;
}
