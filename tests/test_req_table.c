/* Request table semantics on CPU pools of several shapes: append, fork
 * (shared whole pages, copied partial tail), copy-on-write on append into a
 * shared partial page, truncate, release, capacity and page exhaustion, with
 * every failing call checked to leave table, refcounts and KV bytes as they
 * were. K/V data is random, written straight into the pool buffers and read
 * back through kva_pool_read_tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "testutil.h"

typedef struct shape {
  const char *name;
  kva_layout layout;
  int layers, pages, ps, heads, dim;
  kva_dtype dtype;
} shape;

static const shape shapes[] = {
    {"mha f16 ps4", KVA_LAYOUT_MHA, 2, 48, 4, 2, 16, KVA_F16},
    {"mha bf16 ps1", KVA_LAYOUT_MHA, 1, 40, 1, 1, 8, KVA_BF16},
    {"mha fp8 ps16", KVA_LAYOUT_MHA, 2, 24, 16, 2, 8, KVA_FP8_E4M3},
    {"mha f16 ps3", KVA_LAYOUT_MHA, 1, 30, 3, 1, 8, KVA_F16},
    {"mha f16 ps256", KVA_LAYOUT_MHA, 1, 9, 256, 1, 8, KVA_F16},
    {"mla bf16 ps8", KVA_LAYOUT_MLA, 1, 20, 8, 1, 576, KVA_BF16},
};

static tu_rng rng = {20240601};
static kva_context *ctx;

/* ---- pool helpers ------------------------------------------------------- */

static int nbufs(const kva_pool *pool) { return kva_pool_get_config(pool)->layout == KVA_LAYOUT_MLA ? 1 : 2; }
static size_t tok_elems(const kva_pool *pool) {
  const kva_pool_config *c = kva_pool_get_config(pool);
  return (size_t)c->num_kv_heads * (size_t)c->head_dim;
}
static size_t buf_elems(const kva_pool *pool) {
  const kva_pool_config *c = kva_pool_get_config(pool);
  return (size_t)c->num_pages * (size_t)c->page_size * tok_elems(pool);
}
static size_t buf_bytes(const kva_pool *pool) {
  return buf_elems(pool) * kva_dtype_size(kva_pool_get_config(pool)->kv_dtype);
}
static unsigned char *buffer(const kva_pool *pool, int layer, int b) {
  void *k = NULL, *v = NULL;
  kva_pool_get_buffers(pool, layer, &k, &v);
  return (unsigned char *)(b == 0 ? k : v);
}

/* Random values in every element of every buffer (never zeros). */
static void fill_pool(kva_pool *pool) {
  kva_dtype t = kva_pool_get_config(pool)->kv_dtype;
  for (int l = 0; l < kva_pool_get_config(pool)->num_layers; l++)
    for (int b = 0; b < nbufs(pool); b++) {
      unsigned char *buf = buffer(pool, l, b);
      for (size_t i = 0; i < buf_elems(pool); i++) {
        float x = 0.25f + 1.5f * 0.5f * (tu_uniform(&rng) + 1.0f);
        kva_store_f32(buf, i, t, tu_int(&rng, 0, 1) ? x : -x);
      }
    }
}

/* Random values into positions [from, to) of a request, every layer. */
static void write_positions(kva_pool *pool, const int32_t *row, int from, int to) {
  kva_dtype t = kva_pool_get_config(pool)->kv_dtype;
  size_t te = tok_elems(pool);
  for (int l = 0; l < kva_pool_get_config(pool)->num_layers; l++)
    for (int b = 0; b < nbufs(pool); b++)
      for (int p = from; p < to; p++)
        for (size_t e = 0; e < te; e++)
          kva_store_f32(buffer(pool, l, b), (size_t)row[p] * te + e, t, 3.0f * tu_uniform(&rng) + 0.01f);
}

/* Dequantized K and V of n positions of a row, all layers: out[layer][b][n][te]. */
static float *read_positions(const kva_pool *pool, const int32_t *row, int n) {
  int L = kva_pool_get_config(pool)->num_layers;
  size_t te = tok_elems(pool), per = (size_t)n * te;
  float *out = (float *)malloc((size_t)L * 2 * per * sizeof(float) + 1);
  tu_poison(out, (size_t)L * 2 * per);
  for (int l = 0; l < L; l++) {
    kva_status st = kva_pool_read_tokens(pool, l, n, row, out + (size_t)l * 2 * per,
                                         nbufs(pool) == 2 ? out + ((size_t)l * 2 + 1) * per : NULL);
    CHECK(st == KVA_OK, "read_tokens: %s", kva_last_error());
  }
  if (nbufs(pool) == 1)
    for (int l = 0; l < L; l++) memset(out + ((size_t)l * 2 + 1) * per, 0, per * sizeof(float));
  return out;
}
static int same_floats(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!(a[i] == b[i])) return 0; /* NaN never compares equal */
  return 1;
}
static size_t positions_floats(const kva_pool *pool, int n) {
  return (size_t)kva_pool_get_config(pool)->num_layers * 2 * (size_t)n * tok_elems(pool);
}

/* ---- whole-state snapshots for all-or-nothing checks -------------------- */

typedef struct snap {
  int nreq, ctxlen, npages, nfree, live;
  int32_t *len, *rows, *ref;
  unsigned char *bytes;
  size_t nbytes;
} snap;

static snap take(const kva_pool *pool, const kva_req_table *t, int nreq, int ctxlen) {
  snap s;
  memset(&s, 0, sizeof(s));
  s.nreq = nreq;
  s.ctxlen = ctxlen;
  s.npages = kva_pool_get_config(pool)->num_pages;
  s.nfree = kva_pool_num_free_pages(pool);
  s.live = kva_req_num_live(t);
  s.len = (int32_t *)calloc((size_t)nreq, sizeof(int32_t));
  s.rows = (int32_t *)calloc((size_t)nreq * (size_t)ctxlen, sizeof(int32_t));
  s.ref = (int32_t *)calloc((size_t)s.npages, sizeof(int32_t));
  for (int r = 0; r < nreq; r++) {
    s.len[r] = kva_req_len(t, r);
    if (s.len[r] > 0)
      memcpy(s.rows + (size_t)r * ctxlen, kva_req_tokens(t, r), (size_t)s.len[r] * sizeof(int32_t));
  }
  for (int p = 0; p < s.npages; p++) s.ref[p] = kva_pool_page_refcount(pool, p);
  int L = kva_pool_get_config(pool)->num_layers;
  s.nbytes = (size_t)L * 2 * buf_bytes(pool);
  s.bytes = (unsigned char *)calloc(s.nbytes, 1);
  for (int l = 0; l < L; l++)
    for (int b = 0; b < nbufs(pool); b++)
      memcpy(s.bytes + ((size_t)l * 2 + b) * buf_bytes(pool), buffer(pool, l, b), buf_bytes(pool));
  return s;
}
static int snap_equal(const snap *a, const snap *b) {
  return a->nfree == b->nfree && a->live == b->live &&
         !memcmp(a->len, b->len, (size_t)a->nreq * sizeof(int32_t)) &&
         !memcmp(a->rows, b->rows, (size_t)a->nreq * (size_t)a->ctxlen * sizeof(int32_t)) &&
         !memcmp(a->ref, b->ref, (size_t)a->npages * sizeof(int32_t)) &&
         !memcmp(a->bytes, b->bytes, a->nbytes);
}
static void snap_free(snap *s) {
  free(s->len);
  free(s->rows);
  free(s->ref);
  free(s->bytes);
}
#define CHECK_UNCHANGED(pool, t, nreq, ctxlen, call, expect)     \
  do {                                                          \
    snap b_ = take(pool, t, nreq, ctxlen);                      \
    CHECK_STATUS(call, expect);                                 \
    snap a_ = take(pool, t, nreq, ctxlen);                      \
    CHECK(snap_equal(&b_, &a_), "%s changed the pool or table", #call); \
    snap_free(&b_);                                             \
    snap_free(&a_);                                             \
  } while (0)

/* Row of a live request is page aligned: position p in logical page p / ps
 * at offset p % ps, one physical page per logical page, pages distinct. */
static int row_ok(const kva_pool *pool, const kva_req_table *t, int slot) {
  int ps = kva_pool_get_config(pool)->page_size, P = kva_pool_get_config(pool)->num_pages;
  int len = kva_req_len(t, slot);
  const int32_t *row = kva_req_tokens(t, slot);
  if (len < 0 || !row) return 0;
  for (int p = 0; p < len; p++) {
    int32_t page = row[p] / ps;
    if (row[p] < 0 || page >= P || row[p] % ps != p % ps) return 0;
    if (page != row[p - p % ps] / ps) return 0;
    if (kva_pool_page_refcount(pool, page) < 1) return 0;
    if (p % ps == 0)
      for (int q = 0; q < p; q += ps)
        if (row[q] / ps == page) return 0;
  }
  return 1;
}
static int32_t page_of(const kva_req_table *t, int slot, int pos, int ps) {
  return kva_req_tokens(t, slot)[pos] / ps;
}
static int pages_for(int len, int ps) { return (len + ps - 1) / ps; }

/* ---- tests -------------------------------------------------------------- */

static void test_append(kva_pool *pool, int ctxlen) {
  const kva_pool_config *c = kva_pool_get_config(pool);
  int ps = c->page_size, P = c->num_pages;
  kva_req_table *t = NULL;
  CHECK_STATUS(kva_req_table_create(pool, 4, ctxlen, &t), KVA_OK);
  if (!t) return;
  int s = -1;
  CHECK_STATUS(kva_req_alloc(t, &s), KVA_OK);
  CHECK(s == 0 && kva_req_len(t, s) == 0 && kva_req_tokens(t, s) != NULL && kva_req_num_live(t) == 1,
        "fresh request: slot %d len %d live %d", s, kva_req_len(t, s), kva_req_num_live(t));
  int steps[] = {1, ps - 1, 0, ps + 1, 1, 2 * ps + 3};
  int len = 0;
  int32_t *keep = (int32_t *)malloc((size_t)ctxlen * sizeof(int32_t));
  for (int i = 0; i < 6; i++) {
    if (len + steps[i] > ctxlen) break;
    memcpy(keep, kva_req_tokens(t, s), (size_t)len * sizeof(int32_t));
    CHECK_STATUS(kva_req_append(t, s, steps[i]), KVA_OK);
    len += steps[i];
    CHECK(kva_req_len(t, s) == len, "len %d, want %d", kva_req_len(t, s), len);
    CHECK(row_ok(pool, t, s), "row not page aligned after append %d", steps[i]);
    CHECK(!memcmp(keep, kva_req_tokens(t, s), (size_t)(len - steps[i]) * sizeof(int32_t)),
          "append moved existing positions");
    CHECK(kva_pool_num_free_pages(pool) == P - pages_for(len, ps), "free %d, want %d",
          kva_pool_num_free_pages(pool), P - pages_for(len, ps));
  }
  /* beyond max_context_len: capacity, nothing changes */
  free(keep);
  CHECK_UNCHANGED(pool, t, 4, ctxlen, kva_req_append(t, s, ctxlen - len + 1), KVA_ERR_CAPACITY);
  CHECK(strstr(kva_last_error(), "max_context_len") != NULL, "message: %s", kva_last_error());
  /* a second request gets pages of its own */
  int s2 = -1;
  CHECK_STATUS(kva_req_alloc(t, &s2), KVA_OK);
  CHECK_STATUS(kva_req_append(t, s2, ps + 1), KVA_OK);
  CHECK(row_ok(pool, t, s2), "second row");
  for (int p = 0; p < len; p += ps)
    for (int q = 0; q < ps + 1; q += ps)
      CHECK(page_of(t, s, p, ps) != page_of(t, s2, q, ps), "two requests share page %d",
            page_of(t, s, p, ps));
  /* exactly max_context_len is allowed when pages suffice */
  if (pages_for(ctxlen, ps) <= kva_pool_num_free_pages(pool) + pages_for(len, ps)) {
    CHECK_STATUS(kva_req_append(t, s, ctxlen - len), KVA_OK);
    CHECK(kva_req_len(t, s) == ctxlen && row_ok(pool, t, s), "fill to max_context_len");
  }
  CHECK_STATUS(kva_req_release(t, s), KVA_OK);
  CHECK(kva_req_len(t, s) == -1 && kva_req_tokens(t, s) == NULL && kva_req_num_live(t) == 1,
        "released slot still visible");
  CHECK_STATUS(kva_req_release(t, s), KVA_ERR_DOUBLE_FREE);
  CHECK_STATUS(kva_req_append(t, s, 1), KVA_ERR_STATE);
  CHECK(kva_pool_num_free_pages(pool) == P - pages_for(ps + 1, ps), "release freed %d",
        kva_pool_num_free_pages(pool));
  kva_req_table_destroy(t);
  CHECK(kva_pool_num_free_pages(pool) == P && kva_pool_check(pool) == KVA_OK,
        "destroy did not release live requests (%d free of %d)", kva_pool_num_free_pages(pool), P);
}

static void test_fork(kva_pool *pool, int ctxlen) {
  const kva_pool_config *c = kva_pool_get_config(pool);
  int ps = c->page_size, P = c->num_pages, h = ps / 2;
  int len = 2 * ps + h;
  if (len > ctxlen || pages_for(len, ps) + 3 > P) return;
  kva_req_table *t = NULL;
  CHECK_STATUS(kva_req_table_create(pool, 6, ctxlen, &t), KVA_OK);
  if (!t) return;
  int a = -1, b = -1, cc = -1, d = -1, e = -1;
  CHECK_STATUS(kva_req_alloc(t, &a), KVA_OK);
  CHECK_STATUS(kva_req_append(t, a, len), KVA_OK);
  fill_pool(pool);
  float *a_data = read_positions(pool, kva_req_tokens(t, a), len);
  size_t nf = positions_floats(pool, len);

  /* whole pages: shared, nothing copied */
  snap pre = take(pool, t, 6, ctxlen);
  CHECK_STATUS(kva_req_fork(t, a, 2 * ps, &b), KVA_OK);
  snap post = take(pool, t, 6, ctxlen);
  CHECK(!memcmp(pre.bytes, post.bytes, pre.nbytes), "a whole-page fork wrote KV");
  snap_free(&pre);
  snap_free(&post);
  CHECK(kva_req_len(t, b) == 2 * ps && row_ok(pool, t, b), "full fork row");
  CHECK(!memcmp(kva_req_tokens(t, b), kva_req_tokens(t, a), 2 * (size_t)ps * sizeof(int32_t)),
        "full fork does not share the parent's slots");
  CHECK(kva_pool_page_refcount(pool, page_of(t, a, 0, ps)) == 2 &&
            kva_pool_page_refcount(pool, page_of(t, a, ps, ps)) == 2,
        "shared pages refcount %d %d", kva_pool_page_refcount(pool, page_of(t, a, 0, ps)),
        kva_pool_page_refcount(pool, page_of(t, a, ps, ps)));
  int used = pages_for(len, ps);
  CHECK(kva_pool_num_free_pages(pool) == P - used, "full fork took pages");

  /* partial tail: whole pages shared, the tail copied into a fresh page */
  if (h > 0) {
    snap before = take(pool, t, 6, ctxlen);
    CHECK_STATUS(kva_req_fork(t, a, len, &cc), KVA_OK);
    CHECK(kva_req_len(t, cc) == len && row_ok(pool, t, cc), "partial fork row");
    int32_t tail = page_of(t, cc, 2 * ps, ps);
    CHECK(tail != page_of(t, a, 2 * ps, ps), "partial tail page shared instead of copied");
    CHECK(kva_pool_page_refcount(pool, tail) == 1, "copied tail refcount %d",
          kva_pool_page_refcount(pool, tail));
    CHECK(kva_pool_page_refcount(pool, page_of(t, a, 0, ps)) == 3, "whole pages not shared");
    CHECK(kva_pool_num_free_pages(pool) == P - used - 1, "partial fork used %d pages",
          P - used - kva_pool_num_free_pages(pool));
    float *c_data = read_positions(pool, kva_req_tokens(t, cc), len);
    CHECK(same_floats(a_data, c_data, nf), "forked K/V differ from the parent's");
    free(c_data);
    /* nothing outside the fresh page's copied slots was written */
    snap after = take(pool, t, 6, ctxlen);
    size_t tb = tok_elems(pool) * kva_dtype_size(c->kv_dtype), bb = buf_bytes(pool);
    int outside_ok = 1;
    for (size_t i = 0; i < before.nbytes; i++) {
      size_t in_buf = i % bb, slot = in_buf / tb;
      int in_new = (int32_t)(slot / (size_t)ps) == tail && (int)(slot % (size_t)ps) < h;
      if (!in_new && before.bytes[i] != after.bytes[i]) outside_ok = 0;
    }
    CHECK(outside_ok, "fork wrote outside the copied slots");
    snap_free(&before);
    snap_free(&after);
  }
  /* a prefix ending inside an earlier page copies just that part */
  if (ps > 1) {
    CHECK_STATUS(kva_req_fork(t, a, ps + 1, &d), KVA_OK);
    CHECK(row_ok(pool, t, d) && page_of(t, d, 0, ps) == page_of(t, a, 0, ps) &&
              page_of(t, d, ps, ps) != page_of(t, a, ps, ps),
          "fork(ps + 1): page 0 shared, page 1 copied");
    float *d_data = read_positions(pool, kva_req_tokens(t, d), ps + 1);
    float *a_pre = read_positions(pool, kva_req_tokens(t, a), ps + 1);
    CHECK(same_floats(a_pre, d_data, positions_floats(pool, ps + 1)), "fork(ps + 1) data");
    free(d_data);
    free(a_pre);
  }
  CHECK_STATUS(kva_req_fork(t, a, 0, &e), KVA_OK);
  CHECK(kva_req_len(t, e) == 0, "fork(0) len %d", kva_req_len(t, e));
  int dummy = -7;
  CHECK_UNCHANGED(pool, t, 6, ctxlen, kva_req_fork(t, a, len + 1, &dummy), KVA_ERR_OUT_OF_RANGE);
  CHECK(dummy == -7, "failed fork wrote new_slot");
  CHECK_UNCHANGED(pool, t, 6, ctxlen, kva_req_fork(t, a, -1, &dummy), KVA_ERR_OUT_OF_RANGE);
  CHECK(strstr(kva_last_error(), "prefix_len") != NULL, "message: %s", kva_last_error());

  /* parent goes away: the children keep their data, its own pages are freed */
  float *a_two = read_positions(pool, kva_req_tokens(t, a), 2 * ps);
  int32_t a_tail = page_of(t, a, len - 1, ps);
  CHECK_STATUS(kva_req_release(t, a), KVA_OK);
  if (h > 0)
    CHECK(kva_pool_page_refcount(pool, a_tail) == 0, "parent's unshared tail not freed");
  float *b_data = read_positions(pool, kva_req_tokens(t, b), 2 * ps);
  CHECK(same_floats(a_two, b_data, positions_floats(pool, 2 * ps)), "child data after parent release");
  free(b_data);
  free(a_two);
  if (h > 0) {
    float *c_data = read_positions(pool, kva_req_tokens(t, cc), len);
    CHECK(same_floats(a_data, c_data, nf), "partial child data after parent release");
    free(c_data);
  }
  free(a_data);
  kva_req_table_destroy(t);
  CHECK(kva_pool_num_free_pages(pool) == P && kva_pool_check(pool) == KVA_OK, "fork test leaked pages");
}

/* Truncating into a shared page then appending copies that page first. */
static void test_cow(kva_pool *pool, int ctxlen) {
  const kva_pool_config *c = kva_pool_get_config(pool);
  int ps = c->page_size, P = c->num_pages;
  if (ps < 2 || 2 * ps + 2 > ctxlen || P < 6) return;
  kva_req_table *t = NULL;
  CHECK_STATUS(kva_req_table_create(pool, 4, ctxlen, &t), KVA_OK);
  if (!t) return;
  int a = -1, b = -1;
  CHECK_STATUS(kva_req_alloc(t, &a), KVA_OK);
  CHECK_STATUS(kva_req_append(t, a, 2 * ps), KVA_OK);
  fill_pool(pool);
  CHECK_STATUS(kva_req_fork(t, a, 2 * ps, &b), KVA_OK);
  float *a_data = read_positions(pool, kva_req_tokens(t, a), 2 * ps);
  int32_t p1 = page_of(t, a, ps, ps);
  CHECK_STATUS(kva_req_truncate(t, b, ps + 1), KVA_OK);
  CHECK(kva_pool_page_refcount(pool, p1) == 2 && kva_pool_num_free_pages(pool) == P - 2,
        "truncate into a shared page dropped it (refcount %d)", kva_pool_page_refcount(pool, p1));

  /* append 2: the shared partial page is copied, then written */
  int grow = 2, fresh_pages = pages_for(ps + 1 + grow, ps) - 2;
  CHECK_STATUS(kva_req_append(t, b, grow), KVA_OK);
  int32_t b1 = page_of(t, b, ps, ps);
  CHECK(row_ok(pool, t, b) && b1 != p1, "append into a shared page did not copy it");
  CHECK(kva_pool_page_refcount(pool, p1) == 1 && kva_pool_page_refcount(pool, b1) == 1,
        "after copy-on-write: old %d new %d", kva_pool_page_refcount(pool, p1),
        kva_pool_page_refcount(pool, b1));
  CHECK(page_of(t, b, 0, ps) == page_of(t, a, 0, ps) &&
            kva_pool_page_refcount(pool, page_of(t, a, 0, ps)) == 2,
        "whole page 0 stopped being shared");
  CHECK(kva_pool_num_free_pages(pool) == P - 3 - fresh_pages, "free %d, want %d",
        kva_pool_num_free_pages(pool), P - 3 - fresh_pages);
  float *b_data = read_positions(pool, kva_req_tokens(t, b), ps + 1);
  float *a_pre = read_positions(pool, kva_req_tokens(t, a), ps + 1);
  CHECK(same_floats(a_pre, b_data, positions_floats(pool, ps + 1)), "copied page lost data");
  free(b_data);
  free(a_pre);
  /* the child writes its new positions: the parent's KV stays intact */
  write_positions(pool, kva_req_tokens(t, b), ps + 1, ps + 1 + grow);
  float *a_now = read_positions(pool, kva_req_tokens(t, a), 2 * ps);
  CHECK(same_floats(a_data, a_now, positions_floats(pool, 2 * ps)), "child's write reached the parent");
  free(a_now);

  /* all or nothing: a needed copy with no free page fails and changes nothing */
  int d = -1;
  CHECK_STATUS(kva_req_fork(t, a, 2 * ps, &d), KVA_OK);
  CHECK_STATUS(kva_req_truncate(t, d, ps + 1), KVA_OK);
  int nfree = kva_pool_num_free_pages(pool);
  int32_t *grab = (int32_t *)malloc((size_t)nfree * sizeof(int32_t) + 4);
  CHECK_STATUS(kva_pool_alloc_pages(pool, nfree, grab), KVA_OK);
  CHECK_UNCHANGED(pool, t, 4, ctxlen, kva_req_append(t, d, 1), KVA_ERR_OUT_OF_PAGES);
  CHECK_STATUS(kva_pool_unref_page(pool, grab[nfree - 1]), KVA_OK); /* one page free */
  if (ps >= 3) {
    /* copy + one fresh page needed, one free */
    CHECK_UNCHANGED(pool, t, 4, ctxlen, kva_req_append(t, d, ps), KVA_ERR_OUT_OF_PAGES);
    CHECK_STATUS(kva_req_append(t, d, 1), KVA_OK); /* just the copy */
    CHECK(page_of(t, d, ps, ps) != p1 && kva_pool_num_free_pages(pool) == 0 && row_ok(pool, t, d),
          "copy-on-write with the last free page");
  }
  for (int i = 0; i < nfree - 1; i++) kva_pool_unref_page(pool, grab[i]);
  free(grab);
  /* the parent truncates into page 1, now shared with d only if d did not copy */
  CHECK_STATUS(kva_req_truncate(t, a, ps + 1), KVA_OK);
  int32_t before = page_of(t, a, ps, ps);
  int shared = kva_pool_page_refcount(pool, before) > 1;
  CHECK_STATUS(kva_req_append(t, a, 1), KVA_OK);
  CHECK((page_of(t, a, ps, ps) != before) == shared, "parent copy-on-write: shared %d", shared);
  free(a_data);
  kva_req_table_destroy(t);
  CHECK(kva_pool_num_free_pages(pool) == P && kva_pool_check(pool) == KVA_OK, "cow test leaked pages");
}

static void test_truncate(kva_pool *pool, int ctxlen) {
  const kva_pool_config *c = kva_pool_get_config(pool);
  int ps = c->page_size, P = c->num_pages, len = 3 * ps + 1;
  if (len > ctxlen || pages_for(len, ps) > P) return;
  kva_req_table *t = NULL;
  CHECK_STATUS(kva_req_table_create(pool, 2, ctxlen, &t), KVA_OK);
  if (!t) return;
  int a = -1;
  CHECK_STATUS(kva_req_alloc(t, &a), KVA_OK);
  CHECK_STATUS(kva_req_append(t, a, len), KVA_OK);
  int32_t pages[4];
  for (int i = 0; i < 4; i++) pages[i] = page_of(t, a, i * ps, ps);
  CHECK_UNCHANGED(pool, t, 2, ctxlen, kva_req_truncate(t, a, len), KVA_OK);
  CHECK_UNCHANGED(pool, t, 2, ctxlen, kva_req_truncate(t, a, len + 1), KVA_ERR_OUT_OF_RANGE);
  CHECK(strstr(kva_last_error(), "new_len") != NULL, "message: %s", kva_last_error());
  CHECK_STATUS(kva_req_truncate(t, a, 2 * ps + 1), KVA_OK);
  CHECK(kva_pool_page_refcount(pool, pages[3]) == 0 && kva_pool_num_free_pages(pool) == P - 3,
        "truncate kept page 3");
  CHECK_STATUS(kva_req_truncate(t, a, 2 * ps), KVA_OK);
  CHECK(kva_pool_page_refcount(pool, pages[2]) == 0 && kva_pool_page_refcount(pool, pages[1]) == 1,
        "truncate to a page boundary");
  CHECK_STATUS(kva_req_truncate(t, a, 0), KVA_OK);
  CHECK(kva_req_len(t, a) == 0 && kva_req_tokens(t, a) != NULL && kva_pool_num_free_pages(pool) == P,
        "truncate to 0: len %d free %d", kva_req_len(t, a), kva_pool_num_free_pages(pool));
  CHECK_STATUS(kva_req_truncate(t, a, 1), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_req_append(t, a, ps + 1), KVA_OK);
  CHECK(row_ok(pool, t, a) && kva_pool_num_free_pages(pool) == P - pages_for(ps + 1, ps),
        "append after truncate to 0");
  kva_req_table_destroy(t);
  CHECK(kva_pool_num_free_pages(pool) == P, "truncate test leaked pages");
}

/* Slot capacity and page exhaustion: errors change nothing. */
static void test_capacity(kva_pool *pool, int ctxlen) {
  const kva_pool_config *c = kva_pool_get_config(pool);
  int ps = c->page_size, P = c->num_pages;
  int cap = ctxlen / ps < P ? ctxlen / ps : P; /* pages one request can take */
  kva_req_table *t = NULL;
  CHECK_STATUS(kva_req_table_create(pool, 3, ctxlen, &t), KVA_OK);
  if (!t) return;
  int s[4] = {-1, -1, -1, -1};
  for (int i = 0; i < 3; i++) CHECK_STATUS(kva_req_alloc(t, &s[i]), KVA_OK);
  CHECK(s[0] == 0 && s[1] == 1 && s[2] == 2, "slots %d %d %d", s[0], s[1], s[2]);
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_alloc(t, &s[3]), KVA_ERR_CAPACITY);
  CHECK(s[3] == -1, "failed alloc wrote the slot");
  CHECK_STATUS(kva_req_append(t, s[0], 1), KVA_OK);
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_fork(t, s[0], 1, &s[3]), KVA_ERR_CAPACITY);
  CHECK(strstr(kva_last_error(), "slot") != NULL, "message: %s", kva_last_error());
  CHECK_STATUS(kva_req_release(t, s[1]), KVA_OK);
  CHECK_STATUS(kva_req_alloc(t, &s[3]), KVA_OK);
  CHECK(s[3] == s[1], "freed slot %d not reused (got %d)", s[1], s[3]);
  CHECK_STATUS(kva_req_truncate(t, s[0], 0), KVA_OK);

  /* bad and non-live slots */
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_append(t, -1, 1), KVA_ERR_OUT_OF_RANGE);
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_append(t, 3, 1), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_req_release(t, s[2]), KVA_OK);
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_append(t, s[2], 1), KVA_ERR_STATE);
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_truncate(t, s[2], 0), KVA_ERR_STATE);
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_fork(t, s[2], 0, &s[3]), KVA_ERR_STATE);
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_release(t, s[2]), KVA_ERR_DOUBLE_FREE);
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_release(t, 99), KVA_ERR_OUT_OF_RANGE);

  /* page exhaustion: a request that cannot get all its pages gets none */
  int a = s[0];
  int32_t *grab = (int32_t *)malloc((size_t)P * sizeof(int32_t));
  int keep = P - (cap - 1); /* leave one page fewer than a full request needs */
  CHECK_STATUS(kva_pool_alloc_pages(pool, keep, grab), KVA_OK);
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_append(t, a, (cap - 1) * ps + 1), KVA_ERR_OUT_OF_PAGES);
  CHECK(strstr(kva_last_error(), "free") != NULL, "message: %s", kva_last_error());
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_append(t, a, ctxlen + 1), KVA_ERR_CAPACITY);
  CHECK_STATUS(kva_req_append(t, a, (cap - 1) * ps - (ps > 1)), KVA_OK);
  CHECK(kva_pool_num_free_pages(pool) == 0 && row_ok(pool, t, a), "append took all pages");
  CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_append(t, a, ps > 1 ? 2 : 1), KVA_ERR_OUT_OF_PAGES);
  int f = -1;
  if (ps > 1) {
    /* forking a partial tail needs a page: none free */
    CHECK_UNCHANGED(pool, t, 3, ctxlen, kva_req_fork(t, a, ps + 1, &f), KVA_ERR_OUT_OF_PAGES);
    CHECK(f == -1 && kva_req_num_live(t) == 2, "failed fork took a slot");
  }
  /* whole pages need none */
  CHECK_STATUS(kva_req_fork(t, a, ps, &f), KVA_OK);
  CHECK(kva_req_len(t, f) == ps && row_ok(pool, t, f), "fork with no free pages");
  for (int i = 0; i < keep; i++) kva_pool_unref_page(pool, grab[i]);
  free(grab);
  kva_req_table_destroy(t);
  CHECK(kva_pool_num_free_pages(pool) == P && kva_pool_check(pool) == KVA_OK, "capacity test leaked pages");
}

/* read_tokens against a direct decode of the buffers: runs, repeats, any order. */
static void test_read_tokens(kva_pool *pool) {
  const kva_pool_config *c = kva_pool_get_config(pool);
  int nslots = c->num_pages * c->page_size, n = 600;
  size_t te = tok_elems(pool);
  fill_pool(pool);
  int32_t *slots = (int32_t *)malloc((size_t)n * sizeof(int32_t));
  for (int i = 0; i < n;) { /* runs of 1..300 consecutive slots, random starts */
    int start = tu_int(&rng, 0, nslots - 1), run = tu_int(&rng, 1, tu_int(&rng, 0, 1) ? 8 : 300);
    for (int j = 0; j < run && i < n && start + j < nslots; j++) slots[i++] = start + j;
  }
  float *k = (float *)malloc((size_t)n * te * sizeof(float));
  float *v = (float *)malloc((size_t)n * te * sizeof(float));
  for (int l = 0; l < c->num_layers; l++) {
    float ks = 0.5f + (float)l, vs = 2.0f + (float)l;
    CHECK_STATUS(kva_pool_set_scale(pool, l, ks, vs), KVA_OK);
    tu_poison(k, (size_t)n * te);
    tu_poison(v, (size_t)n * te);
    CHECK_STATUS(kva_pool_read_tokens(pool, l, n, slots, k, v), KVA_OK);
    int bad = 0;
    for (int b = 0; b < nbufs(pool); b++) {
      float scale = c->kv_dtype == KVA_FP8_E4M3 ? (b == 0 ? ks : vs) : 1.0f;
      const float *out = b == 0 ? k : v;
      for (int i = 0; i < n; i++)
        for (size_t e = 0; e < te; e++) {
          float want = kva_load_f32(buffer(pool, l, b), (size_t)slots[i] * te + e, c->kv_dtype) * scale;
          if (!(out[(size_t)i * te + e] == want)) bad++;
        }
    }
    CHECK(bad == 0, "layer %d: %d read-back values differ", l, bad);
    if (nbufs(pool) == 1) {
      int untouched = 1;
      for (size_t i = 0; i < (size_t)n * te; i++) untouched &= isnan(v[i]) != 0;
      CHECK(untouched, "MLA read_tokens wrote v_out");
    }
    /* either output may be NULL */
    tu_poison(k, (size_t)n * te);
    CHECK_STATUS(kva_pool_read_tokens(pool, l, n, slots, k, NULL), KVA_OK);
    int written = 1;
    for (size_t i = 0; i < (size_t)n * te; i++) written &= !isnan(k[i]);
    CHECK(written, "k_out not fully written with v_out NULL");
    CHECK_STATUS(kva_pool_set_scale(pool, l, 1.0f, 1.0f), KVA_OK);
  }
  free(slots);
  free(k);
  free(v);
}

int main(void) {
  ctx = tu_cpu_context(2);
  if (!ctx) return 1;
  for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
    const shape *sh = &shapes[i];
    kva_pool *pool = tu_pool(ctx, sh->layout, sh->layers, sh->pages, sh->ps, sh->heads, sh->dim, sh->dtype);
    CHECK(pool != NULL, "pool %s", sh->name);
    if (!pool) continue;
    int fails = tu_failures;
    int ctxlen = 6 * sh->ps;
    test_append(pool, ctxlen);
    test_fork(pool, ctxlen);
    test_cow(pool, ctxlen);
    test_truncate(pool, ctxlen);
    test_capacity(pool, ctxlen);
    test_read_tokens(pool);
    CHECK_STATUS(kva_pool_check(pool), KVA_OK);
    printf("%-14s %s\n", sh->name, tu_failures == fails ? "ok" : "FAILED");
    kva_pool_destroy(pool);
  }
  kva_context_destroy(ctx);
  return tu_summary("test_req_table");
}
