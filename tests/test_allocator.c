/* Page allocator and request table: exhaustion, double free, bad ids, shared
 * prefixes, and a randomized stress of 1,000,000 alloc/append/fork/truncate/
 * release/ref/unref operations with the pool's invariants checked after
 * every step (no page both free and used; refcount == references held), and
 * every failing operation checked to have changed nothing. Each appended
 * position gets a tag written into its K slot (as kva_store_kv would), so
 * copy-on-write and fork copies are checked on the data too: every live
 * request must read back its own tags after every step. */
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/internal.h" /* to corrupt the allocator on purpose */
#include "testutil.h"

#define PAGES 32
#define PS 4
#define REQS 8
#define CTX 64

static kva_context *ctx;
static kva_pool *pool;
static kva_req_table *table;
static int32_t held[4 * PAGES]; /* pages the test holds directly (with repeats) */
static int nheld;
static float tags[REQS][CTX]; /* K value each live position must read back */
static int next_tag;
#define TOKEN_ELEMS 8          /* 1 kv head x head_dim 8 */

static void *k_buffer(void) {
  void *k = NULL;
  kva_pool_get_buffers(pool, 0, &k, NULL);
  return k;
}
/* Tags for positions [from, to) of a request, written into its K slots. */
static void write_tags(int slot, int from, int to) {
  const int32_t *row = kva_req_tokens(table, slot);
  for (int p = from; p < to; p++) {
    tags[slot][p] = (float)(1 + next_tag++ % 2000); /* exact in f16 */
    kva_store_f32(k_buffer(), (size_t)row[p] * TOKEN_ELEMS, KVA_F16, tags[slot][p]);
  }
}
static int tags_hold(void) {
  for (int s = 0; s < REQS; s++) {
    const int32_t *row = kva_req_tokens(table, s);
    for (int p = 0; p < kva_req_len(table, s); p++)
      if (kva_load_f32(k_buffer(), (size_t)row[p] * TOKEN_ELEMS, KVA_F16) != tags[s][p]) {
        fprintf(stderr, "slot %d position %d: K reads %g, wrote %g\n", s, p,
                (double)kva_load_f32(k_buffer(), (size_t)row[p] * TOKEN_ELEMS, KVA_F16),
                (double)tags[s][p]);
        return 0;
      }
  }
  return 1;
}

/* refcount each page should have: one per live request page, one per hold */
static int expected_refs(int32_t *want) {
  memset(want, 0, PAGES * sizeof(int32_t));
  for (int s = 0; s < REQS; s++) {
    int len = kva_req_len(table, s);
    if (len <= 0) continue;
    const int32_t *row = kva_req_tokens(table, s);
    for (int p = 0; p < len; p++) {
      int32_t page = row[p] / PS;
      if (row[p] % PS != p % PS) return 0; /* slots are page aligned */
      if (page < 0 || page >= PAGES) return 0;
      if (p % PS == 0) want[page]++;
      else if (row[p] / PS != row[p - 1] / PS) return 0; /* one page per logical page */
    }
  }
  for (int i = 0; i < nheld; i++) want[held[i]]++;
  return 1;
}

static int invariants_hold(void) {
  int32_t want[PAGES];
  if (kva_pool_check(pool) != KVA_OK) {
    fprintf(stderr, "kva_pool_check: %s\n", kva_last_error());
    return 0;
  }
  if (!expected_refs(want)) return 0;
  int used = 0;
  for (int p = 0; p < PAGES; p++) {
    if (kva_pool_page_refcount(pool, p) != want[p]) {
      fprintf(stderr, "page %d: refcount %d, references %d\n", p, kva_pool_page_refcount(pool, p), want[p]);
      return 0;
    }
    used += want[p] > 0;
  }
  return kva_pool_num_free_pages(pool) == PAGES - used;
}

typedef struct {
  int32_t ref[PAGES];
  int32_t len[REQS];
  int32_t rows[REQS][CTX];
  int free_pages, live;
} snapshot;
static void snap(snapshot *s) {
  memset(s, 0, sizeof(*s));
  for (int p = 0; p < PAGES; p++) s->ref[p] = kva_pool_page_refcount(pool, p);
  for (int r = 0; r < REQS; r++) {
    s->len[r] = kva_req_len(table, r);
    if (s->len[r] > 0) memcpy(s->rows[r], kva_req_tokens(table, r), (size_t)s->len[r] * sizeof(int32_t));
  }
  s->free_pages = kva_pool_num_free_pages(pool);
  s->live = kva_req_num_live(table);
}
static int same(const snapshot *a, const snapshot *b) { return memcmp(a, b, sizeof(*a)) == 0; }

static void unit_tests(void) {
  int32_t pages[PAGES + 1];
  /* exhaustion: all or nothing */
  CHECK_STATUS(kva_pool_alloc_pages(pool, PAGES + 1, pages), KVA_ERR_OUT_OF_PAGES);
  CHECK(kva_pool_num_free_pages(pool) == PAGES, "failed alloc changed the pool");
  CHECK_STATUS(kva_pool_alloc_pages(pool, PAGES, pages), KVA_OK);
  CHECK_STATUS(kva_pool_alloc_pages(pool, 1, pages + PAGES), KVA_ERR_OUT_OF_PAGES);
  int s;
  CHECK_STATUS(kva_req_alloc(table, &s), KVA_OK);
  CHECK_STATUS(kva_req_append(table, s, 1), KVA_ERR_OUT_OF_PAGES);
  CHECK(kva_req_len(table, s) == 0, "failed append grew the request");
  for (int i = 0; i < PAGES; i++) CHECK_STATUS(kva_pool_unref_page(pool, pages[i]), KVA_OK);
  /* double free and bad ids */
  CHECK_STATUS(kva_pool_unref_page(pool, pages[0]), KVA_ERR_DOUBLE_FREE);
  CHECK_STATUS(kva_pool_ref_page(pool, pages[0]), KVA_ERR_STATE); /* sharing a free page */
  CHECK_STATUS(kva_pool_unref_page(pool, -1), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_pool_unref_page(pool, PAGES), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_pool_ref_page(pool, -1), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_pool_ref_page(pool, PAGES), KVA_ERR_OUT_OF_RANGE);
  CHECK(kva_pool_page_refcount(pool, -1) == -1, "refcount of a negative id");
  CHECK(kva_pool_page_refcount(pool, PAGES) == -1, "refcount of a bad id");
  CHECK_STATUS(kva_pool_check(pool), KVA_OK);
  CHECK(kva_pool_num_free_pages(pool) == PAGES, "double free changed the pool");
  /* shared prefix: freed only when the last user lets go */
  CHECK_STATUS(kva_req_append(table, s, 2 * PS + 1), KVA_OK); /* 3 pages */
  int c1, c2;
  CHECK_STATUS(kva_req_fork(table, s, 2 * PS, &c1), KVA_OK);     /* shares 2 pages */
  CHECK_STATUS(kva_req_fork(table, s, 2 * PS + 1, &c2), KVA_OK); /* 2 shared + copied tail */
  int32_t p0 = kva_req_tokens(table, s)[0] / PS;
  CHECK(kva_pool_page_refcount(pool, p0) == 3, "shared page refcount %d, want 3", kva_pool_page_refcount(pool, p0));
  CHECK(kva_req_tokens(table, c2)[2 * PS] / PS != kva_req_tokens(table, s)[2 * PS] / PS,
        "partial tail page was shared instead of copied");
  CHECK(kva_pool_num_free_pages(pool) == PAGES - 4, "free %d, want %d", kva_pool_num_free_pages(pool), PAGES - 4);
  CHECK_STATUS(kva_req_release(table, s), KVA_OK);
  CHECK_STATUS(kva_req_release(table, s), KVA_ERR_DOUBLE_FREE);
  CHECK(kva_pool_page_refcount(pool, p0) == 2, "after parent release");
  CHECK_STATUS(kva_req_release(table, c1), KVA_OK);
  CHECK(kva_pool_page_refcount(pool, p0) == 1, "after first child release");
  CHECK_STATUS(kva_req_release(table, c2), KVA_OK);
  CHECK(kva_pool_page_refcount(pool, p0) == 0, "page not freed by its last user");
  CHECK(kva_pool_num_free_pages(pool) == PAGES, "pages leaked");
  /* errors name what was wrong and change nothing */
  CHECK_STATUS(kva_req_append(table, 99, 1), KVA_ERR_OUT_OF_RANGE);
  CHECK(strstr(kva_last_error(), "slot 99") != NULL, "message: %s", kva_last_error());
  CHECK_STATUS(kva_req_append(table, 0, 1), KVA_ERR_STATE);
  CHECK_STATUS(kva_req_alloc(table, &s), KVA_OK);
  CHECK_STATUS(kva_req_append(table, s, CTX + 1), KVA_ERR_CAPACITY);
  CHECK_STATUS(kva_req_append(table, s, -1), KVA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kva_req_fork(table, s, 1, &c1), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_req_truncate(table, s, 1), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_req_release(table, s), KVA_OK);
  CHECK_STATUS(kva_pool_alloc_pages(NULL, 1, pages), KVA_ERR_NULL_ARGUMENT);
  CHECK(strstr(kva_last_error(), "pool") != NULL, "message: %s", kva_last_error());
  CHECK_STATUS(kva_pool_alloc_pages(pool, -1, pages), KVA_ERR_INVALID_ARGUMENT);
}

/* kva_pool_check must notice each kind of broken allocator state. */
static void check_detects_corruption(void) {
  int32_t p;
  CHECK_STATUS(kva_pool_alloc_pages(pool, 1, &p), KVA_OK);
  int32_t f = pool->free_stack[pool->num_free - 1]; /* a free page */
  pool->refcount[f] = 1; /* free page with a refcount: both free and used */
  CHECK_STATUS(kva_pool_check(pool), KVA_ERR_INTERNAL);
  pool->refcount[f] = 0;
  pool->refcount[p] = 0; /* neither used nor on the free list */
  CHECK_STATUS(kva_pool_check(pool), KVA_ERR_INTERNAL);
  CHECK(strstr(kva_last_error(), "neither") != NULL, "message: %s", kva_last_error());
  pool->refcount[p] = 1;
  pool->free_stack[pool->num_free++] = f; /* on the free list twice */
  CHECK_STATUS(kva_pool_check(pool), KVA_ERR_INTERNAL);
  pool->free_stack[pool->num_free - 1] = p; /* a used page on the free list */
  CHECK_STATUS(kva_pool_check(pool), KVA_ERR_INTERNAL);
  pool->num_free--;
  pool->refcount[p] = -1;
  CHECK_STATUS(kva_pool_check(pool), KVA_ERR_INTERNAL);
  pool->refcount[p] = 1;
  CHECK_STATUS(kva_pool_check(pool), KVA_OK);
  CHECK_STATUS(kva_pool_unref_page(pool, p), KVA_OK);
  CHECK_STATUS(kva_pool_check(pool), KVA_OK);
}

static void stress(long steps) {
  tu_rng r = {42};
  long failed_ops = 0, ok_ops = 0, cow = 0, tail_copies = 0, by_status[KVA_ERR_INTERNAL + 1] = {0};
  int broken = 0;
  for (long step = 0; step < steps && !broken; step++) {
    snapshot before, after;
    snap(&before);
    /* mostly live slots, sometimes any (free slots must fail cleanly) */
    int slot = tu_int(&r, 0, REQS - 1), op = tu_int(&r, 0, 99);
    for (int tries = 0; tries < 3 && kva_req_len(table, slot) < 0; tries++) slot = tu_int(&r, 0, REQS - 1);
    kva_status st;
    if (op < 8) {
      int s;
      st = kva_req_alloc(table, &s);
    } else if (op < 43) {
      int len = kva_req_len(table, slot), n = tu_int(&r, 0, 9);
      int32_t last = len > 0 && len % PS ? kva_req_tokens(table, slot)[len - 1] / PS : -1;
      int shared = last >= 0 && kva_pool_page_refcount(pool, last) > 1;
      st = kva_req_append(table, slot, n);
      if (st == KVA_OK && n > 0) {
        if (shared) { /* the shared partial page must have been copied */
          cow++;
          if (kva_req_tokens(table, slot)[len - 1] / PS == last) {
            fprintf(stderr, "step %ld: append wrote into shared page %d\n", step, last);
            broken = 1;
          }
        }
        write_tags(slot, len, len + n);
      }
    } else if (op < 55) {
      int s, len = kva_req_len(table, slot);
      int prefix = len > 0 ? tu_int(&r, 0, len) : 0;
      st = kva_req_fork(table, slot, prefix, &s);
      if (st == KVA_OK) {
        const int32_t *src = kva_req_tokens(table, slot), *dst = kva_req_tokens(table, s);
        int whole = prefix / PS * PS;
        if (memcmp(src, dst, (size_t)whole * sizeof(int32_t)) != 0) {
          fprintf(stderr, "step %ld: fork did not share the whole pages\n", step);
          broken = 1;
        }
        if (prefix % PS) {
          tail_copies++;
          if (dst[whole] / PS == src[whole] / PS) {
            fprintf(stderr, "step %ld: fork shared a partial page\n", step);
            broken = 1;
          }
        }
        memcpy(tags[s], tags[slot], (size_t)prefix * sizeof(float));
      }
    } else if (op < 70) {
      int len = kva_req_len(table, slot);
      st = kva_req_truncate(table, slot, len > 0 ? tu_int(&r, 0, len) : 0);
    } else if (op < 78) {
      st = kva_req_release(table, slot);
    } else if (op < 83) {
      int32_t p;
      st = kva_pool_alloc_pages(pool, 1, &p);
      if (st == KVA_OK) held[nheld++] = p;
    } else if (op < 86 && nheld > 0 && nheld < 4 * PAGES) { /* share a held page */
      int32_t p = held[tu_int(&r, 0, nheld - 1)];
      st = kva_pool_ref_page(pool, p);
      if (st == KVA_OK) held[nheld++] = p;
    } else if (op < 97 && nheld > 0) {
      int i = tu_int(&r, 0, nheld - 1);
      st = kva_pool_unref_page(pool, held[i]);
      if (st == KVA_OK) held[i] = held[--nheld];
    } else { /* a bad id must fail and change nothing */
      st = kva_pool_unref_page(pool, tu_int(&r, 0, 1) ? -1 - tu_int(&r, 0, 5) : PAGES + tu_int(&r, 0, 5));
      if (st == KVA_OK) broken = 1;
    }
    if (st == KVA_OK) {
      ok_ops++;
    } else {
      failed_ops++;
      if ((int)st >= 0 && st <= KVA_ERR_INTERNAL) by_status[st]++;
      snap(&after);
      if (!same(&before, &after)) {
        fprintf(stderr, "step %ld: failing op %d (%s) changed the pool or table\n", step, op, kva_strerror(st));
        broken = 1;
      }
    }
    if (!invariants_hold() || !tags_hold()) {
      fprintf(stderr, "step %ld (op %d): invariants broken\n", step, op);
      broken = 1;
    }
  }
  CHECK(!broken, "stress: invariants broken");
  CHECK(by_status[KVA_ERR_OUT_OF_PAGES] > steps / 1000 && by_status[KVA_ERR_CAPACITY] > steps / 1000,
        "stress hit %ld out-of-pages and %ld capacity failures", by_status[KVA_ERR_OUT_OF_PAGES],
        by_status[KVA_ERR_CAPACITY]);
  CHECK(cow > steps / 1000 && tail_copies > steps / 1000, "stress exercised %ld copy-on-writes, %ld tail copies",
        cow, tail_copies);
  CHECK(ok_ops > steps / 3 && failed_ops > steps / 50, "stress mix: %ld ok, %ld failed", ok_ops, failed_ops);
  printf("stress: %ld steps, %ld succeeded (%ld copy-on-write appends, %ld partial-page forks), "
         "%ld failed as expected (%ld out of pages, %ld capacity), invariants held after each\n",
         steps, ok_ops, cow, tail_copies, failed_ops, by_status[KVA_ERR_OUT_OF_PAGES],
         by_status[KVA_ERR_CAPACITY]);
}

int main(int argc, char **argv) {
  long steps = argc > 1 ? atol(argv[1]) : 1000000;
  kva_context_config cc = {KVA_DEVICE_CPU, 1, 0};
  kva_pool_config pc = {KVA_LAYOUT_MHA, 1, PAGES, PS, 1, 8, KVA_F16};
  if (kva_context_create(&cc, &ctx) != KVA_OK || kva_pool_create(ctx, &pc, &pool) != KVA_OK ||
      kva_req_table_create(pool, REQS, CTX, &table) != KVA_OK) {
    fprintf(stderr, "setup failed: %s\n", kva_last_error());
    return 1;
  }
  unit_tests();
  check_detects_corruption();
  stress(steps);
  kva_req_table_destroy(table);
  for (int i = 0; i < nheld; i++) kva_pool_unref_page(pool, held[i]);
  CHECK(kva_pool_num_free_pages(pool) == PAGES, "pages leaked at the end");
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
  return tu_summary("test_allocator");
}
