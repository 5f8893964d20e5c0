/* Request table (SGLang's req_to_token): request slot x position -> KV slot.
 * Position pos of a request lives in its logical page pos / page_size at
 * offset pos % page_size, so a row is also the request's page list. Every
 * failing call leaves the table and the pool as they were. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static int32_t *row_of(const kva_req_table *t, int slot) {
  return t->req_to_token + (size_t)slot * (size_t)t->max_context_len;
}
static int pages_for(const kva_req_table *t, int len) {
  int ps = t->pool->cfg.page_size;
  return (len + ps - 1) / ps;
}
/* Physical page of logical page i of a request (its first position's slot). */
static int32_t page_at(const kva_req_table *t, int slot, int i) {
  return row_of(t, slot)[(size_t)i * t->pool->cfg.page_size] / t->pool->cfg.page_size;
}

kva_status kva_req_table_create(kva_pool *pool, int max_requests, int max_context_len,
                                kva_req_table **out) {
  static const char *fn = "kva_req_table_create";
  KVA_CHECK_NULL(pool, fn);
  KVA_CHECK_NULL(out, fn);
  *out = NULL;
  if (max_requests <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: max_requests must be > 0 (got %d)", fn,
                         max_requests);
  if (max_context_len <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: max_context_len must be > 0 (got %d)", fn,
                         max_context_len);
  if ((uint64_t)max_requests * (uint64_t)max_context_len > (SIZE_MAX / 8))
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: %d x %d entries are too many", fn,
                         max_requests, max_context_len);
  kva_req_table *t = (kva_req_table *)calloc(1, sizeof(*t));
  if (!t) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  t->pool = pool;
  t->max_requests = max_requests;
  t->max_context_len = max_context_len;
  t->max_pages_per_req = (max_context_len + pool->cfg.page_size - 1) / pool->cfg.page_size;
  /* zeroed so rows past a request's length hold valid slot ids, never garbage */
  t->req_to_token = (int32_t *)calloc((size_t)max_requests * (size_t)max_context_len, 4);
  t->len = (int32_t *)malloc((size_t)max_requests * 4);
  t->free_slots = (int32_t *)malloc((size_t)max_requests * 4);
  if (!t->req_to_token || !t->len || !t->free_slots) {
    free(t->req_to_token);
    free(t->len);
    free(t->free_slots);
    free(t);
    return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "%s: out of host memory for %d x %d entries", fn,
                         max_requests, max_context_len);
  }
  for (int i = 0; i < max_requests; i++) {
    t->len[i] = -1;
    t->free_slots[i] = max_requests - 1 - i; /* pop order = ascending slots */
  }
  t->num_free_slots = max_requests;
  *out = t;
  return KVA_OK;
}

static void drop_pages(kva_req_table *t, int slot, int from_page, int to_page) {
  for (int i = from_page; i < to_page; i++) kva_pool_unref_page(t->pool, page_at(t, slot, i));
}

void kva_req_table_destroy(kva_req_table *t) {
  if (!t) return;
  for (int s = 0; s < t->max_requests; s++)
    if (t->len[s] > 0) drop_pages(t, s, 0, pages_for(t, t->len[s]));
  free(t->req_to_token);
  free(t->len);
  free(t->free_slots);
  free(t);
}

static kva_status check_live(const kva_req_table *t, int slot, const char *fn) {
  if (slot < 0 || slot >= t->max_requests)
    return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: slot %d is not in [0, %d)", fn, slot,
                         t->max_requests);
  if (t->len[slot] < 0)
    return kva_set_error(KVA_ERR_STATE, "%s: slot %d holds no request", fn, slot);
  return KVA_OK;
}

kva_status kva_req_alloc(kva_req_table *t, int *slot) {
  KVA_CHECK_NULL(t, "kva_req_alloc");
  KVA_CHECK_NULL(slot, "kva_req_alloc");
  if (t->num_free_slots == 0)
    return kva_set_error(KVA_ERR_CAPACITY, "kva_req_alloc: all %d request slots are in use",
                         t->max_requests);
  int s = t->free_slots[--t->num_free_slots];
  t->len[s] = 0;
  *slot = s;
  return KVA_OK;
}

/* Fresh page holding a copy of positions [first, first + n) of slot's row,
 * which become row entries of the new page. */
static kva_status copy_into_new_page(kva_req_table *t, int slot, int first, int n, int32_t *page) {
  kva_pool *pool = t->pool;
  int ps = pool->cfg.page_size;
  kva_status st = kva_pool_alloc_pages(pool, 1, page);
  if (st != KVA_OK) return st;
  int32_t dst[KVA_MAX_PAGE_SIZE];
  for (int i = 0; i < n; i++) dst[i] = *page * ps + (first + i) % ps;
  st = pool->ctx->backend->copy_slots(pool, n, row_of(t, slot) + first, dst);
  if (st != KVA_OK) kva_pool_unref_page(pool, *page);
  return st;
}

kva_status kva_req_append(kva_req_table *t, int slot, int num_tokens) {
  static const char *fn = "kva_req_append";
  KVA_CHECK_NULL(t, fn);
  kva_status st = check_live(t, slot, fn);
  if (st != KVA_OK) return st;
  if (num_tokens < 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: num_tokens must be >= 0 (got %d)", fn,
                         num_tokens);
  int len = t->len[slot];
  if ((int64_t)len + num_tokens > t->max_context_len)
    return kva_set_error(KVA_ERR_CAPACITY, "%s: slot %d would hold %lld positions, max_context_len %d",
                         fn, slot, (long long)len + num_tokens, t->max_context_len);
  if (num_tokens == 0) return KVA_OK;
  kva_pool *pool = t->pool;
  int ps = pool->cfg.page_size;
  int have = pages_for(t, len), need = pages_for(t, len + num_tokens) - have;
  /* a shared, partial last page is copied before we write into it */
  int cow = (len % ps != 0) && pool->refcount[page_at(t, slot, have - 1)] > 1;
  if (need + cow > pool->num_free)
    return kva_set_error(KVA_ERR_OUT_OF_PAGES, "%s: slot %d needs %d pages, %d free of %d", fn,
                         slot, need + cow, pool->num_free, pool->cfg.num_pages);
  int32_t *row = row_of(t, slot);
  if (cow) {
    int first = (have - 1) * ps;
    int32_t old = page_at(t, slot, have - 1), fresh;
    st = copy_into_new_page(t, slot, first, len - first, &fresh);
    if (st != KVA_OK) return st;
    for (int p = first; p < len; p++) row[p] = fresh * ps + p % ps;
    kva_pool_unref_page(pool, old);
  }
  int32_t last_page = len > 0 ? row[len - 1] / ps : -1;
  for (int p = len; p < len + num_tokens; p++) {
    if (p % ps == 0) kva_pool_alloc_pages(pool, 1, &last_page); /* counted above: cannot fail */
    row[p] = last_page * ps + p % ps;
  }
  t->len[slot] = len + num_tokens;
  return KVA_OK;
}

kva_status kva_req_fork(kva_req_table *t, int src_slot, int prefix_len, int *new_slot) {
  static const char *fn = "kva_req_fork";
  KVA_CHECK_NULL(t, fn);
  KVA_CHECK_NULL(new_slot, fn);
  kva_status st = check_live(t, src_slot, fn);
  if (st != KVA_OK) return st;
  if (prefix_len < 0 || prefix_len > t->len[src_slot])
    return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: prefix_len %d is not in [0, %d] (slot %d)", fn,
                         prefix_len, t->len[src_slot], src_slot);
  if (t->num_free_slots == 0)
    return kva_set_error(KVA_ERR_CAPACITY, "%s: all %d request slots are in use", fn,
                         t->max_requests);
  int ps = t->pool->cfg.page_size, full = prefix_len / ps, tail = prefix_len % ps;
  int32_t tail_page = -1;
  if (tail) {
    if (t->pool->num_free < 1)
      return kva_set_error(KVA_ERR_OUT_OF_PAGES,
                           "%s: the partial last page of the prefix needs a free page, none left",
                           fn);
    st = copy_into_new_page(t, src_slot, full * ps, tail, &tail_page);
    if (st != KVA_OK) return st;
  }
  int s = t->free_slots[--t->num_free_slots];
  int32_t *dst = row_of(t, s);
  memcpy(dst, row_of(t, src_slot), (size_t)full * ps * sizeof(int32_t));
  for (int i = 0; i < full; i++) kva_pool_ref_page(t->pool, page_at(t, s, i));
  for (int p = full * ps; p < prefix_len; p++) dst[p] = tail_page * ps + p % ps;
  t->len[s] = prefix_len;
  *new_slot = s;
  return KVA_OK;
}

kva_status kva_req_truncate(kva_req_table *t, int slot, int new_len) {
  static const char *fn = "kva_req_truncate";
  KVA_CHECK_NULL(t, fn);
  kva_status st = check_live(t, slot, fn);
  if (st != KVA_OK) return st;
  if (new_len < 0 || new_len > t->len[slot])
    return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: new_len %d is not in [0, %d] (slot %d)", fn,
                         new_len, t->len[slot], slot);
  drop_pages(t, slot, pages_for(t, new_len), pages_for(t, t->len[slot]));
  t->len[slot] = new_len;
  return KVA_OK;
}

kva_status kva_req_release(kva_req_table *t, int slot) {
  static const char *fn = "kva_req_release";
  KVA_CHECK_NULL(t, fn);
  if (slot < 0 || slot >= t->max_requests)
    return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: slot %d is not in [0, %d)", fn, slot,
                         t->max_requests);
  if (t->len[slot] < 0)
    return kva_set_error(KVA_ERR_DOUBLE_FREE, "%s: slot %d is already free", fn, slot);
  drop_pages(t, slot, 0, pages_for(t, t->len[slot]));
  t->len[slot] = -1;
  t->free_slots[t->num_free_slots++] = slot;
  return KVA_OK;
}

int kva_req_len(const kva_req_table *t, int slot) {
  if (!t || slot < 0 || slot >= t->max_requests) return -1;
  return t->len[slot];
}

const int32_t *kva_req_tokens(const kva_req_table *t, int slot) {
  if (!t || slot < 0 || slot >= t->max_requests || t->len[slot] < 0) return NULL;
  return row_of(t, slot);
}

int kva_req_num_live(const kva_req_table *t) {
  return t ? t->max_requests - t->num_free_slots : 0;
}
