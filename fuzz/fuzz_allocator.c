/* libFuzzer target: the page allocator and the request table driven by
 * fuzzer bytes. After every operation:
 *   - kva_pool_check is OK;
 *   - every page's refcount equals the references the fuzzer holds directly
 *     plus the live requests whose page list contains it;
 *   - free page count = pages with refcount 0;
 *   - each live request's row maps position p to page[p / ps] * ps + p % ps;
 *   - a failing call changed nothing.
 * Any violation aborts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvattn.h"

#define CHECK(c, ...)                                          \
  do {                                                         \
    if (!(c)) {                                                \
      fprintf(stderr, "fuzz_allocator: %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                            \
      fprintf(stderr, " (last error: %s)\n", kva_last_error()); \
      abort();                                                 \
    }                                                          \
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

#define MAX_PAGES 256
#define MAX_REQ 16

typedef struct model {
  kva_pool *pool;
  kva_req_table *table;
  int num_pages, ps, max_req, max_ctx;
  int32_t held[MAX_PAGES]; /* references the fuzzer holds directly */
  int32_t len[MAX_REQ];    /* shadow request lengths; -1 = free */
} model;

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

/* Full invariant check against the shadow model. */
static void verify(const model *m) {
  CHECK(kva_pool_check(m->pool) == KVA_OK, "kva_pool_check");
  int32_t want[MAX_PAGES];
  memcpy(want, m->held, sizeof(want));
  int live = 0;
  for (int s = 0; s < m->max_req; s++) {
    CHECK(kva_req_len(m->table, s) == m->len[s], "slot %d len %d, model %d", s,
          kva_req_len(m->table, s), m->len[s]);
    if (m->len[s] < 0) {
      CHECK(kva_req_tokens(m->table, s) == NULL, "free slot %d has tokens", s);
      continue;
    }
    live++;
    const int32_t *tok = kva_req_tokens(m->table, s);
    CHECK(tok != NULL, "live slot %d has no tokens", s);
    for (int p = 0; p < m->len[s]; p++) {
      int32_t base = tok[p - p % m->ps];
      CHECK(base >= 0 && base % m->ps == 0 && base / m->ps < m->num_pages,
            "slot %d position %d: page start %d", s, p, base);
      CHECK(tok[p] == base + p % m->ps, "slot %d position %d maps to %d, page start %d", s, p,
            tok[p], base);
      if (p % m->ps == 0) want[base / m->ps]++;
    }
  }
  CHECK(kva_req_num_live(m->table) == live, "num_live %d, model %d",
        kva_req_num_live(m->table), live);
  int free_pages = 0;
  for (int pg = 0; pg < m->num_pages; pg++) {
    CHECK(kva_pool_page_refcount(m->pool, pg) == want[pg], "page %d refcount %d, model %d", pg,
          kva_pool_page_refcount(m->pool, pg), want[pg]);
    free_pages += want[pg] == 0;
  }
  CHECK(kva_pool_num_free_pages(m->pool) == free_pages, "free pages %d, model %d",
        kva_pool_num_free_pages(m->pool), free_pages);
  CHECK(kva_pool_page_refcount(m->pool, -1) == -1 &&
            kva_pool_page_refcount(m->pool, m->num_pages) == -1,
        "refcount of an out-of-range page");
}

static int pages_of(const model *m, int len) { return (len + m->ps - 1) / m->ps; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  bytes b = {data, size};
  model m;
  memset(&m, 0, sizeof(m));
  m.num_pages = 1 + (int)take(&b, MAX_PAGES);
  m.ps = 1 + (int)take(&b, 32);
  m.max_req = 1 + (int)take(&b, MAX_REQ);
  m.max_ctx = 1 + (int)take(&b, 300);
  kva_pool_config pc;
  memset(&pc, 0, sizeof(pc));
  pc.layout = KVA_LAYOUT_MHA;
  pc.num_layers = 1;
  pc.num_pages = m.num_pages;
  pc.page_size = m.ps;
  pc.num_kv_heads = 1;
  pc.head_dim = 8;
  pc.kv_dtype = KVA_F16;
  CHECK(kva_pool_create(ctx_get(), &pc, &m.pool) == KVA_OK, "pool");
  CHECK(kva_req_table_create(m.pool, m.max_req, m.max_ctx, &m.table) == KVA_OK, "table");
  for (int s = 0; s < MAX_REQ; s++) m.len[s] = -1;
  verify(&m);

  while (b.n) {
    unsigned op = take(&b, 9);
    int free_before = kva_pool_num_free_pages(m.pool);
    kva_status st;
    switch (op) {
      case 0: { /* raw alloc */
        int count = (int)take(&b, 40) - 4;
        int32_t pages[40];
        for (int i = 0; i < 40; i++) pages[i] = -77;
        st = kva_pool_alloc_pages(m.pool, count, pages);
        if (count <= 0) {
          CHECK(st == KVA_ERR_INVALID_ARGUMENT || (count == 0 && st == KVA_OK),
                "alloc %d -> %d", count, st);
        } else if (count > free_before) {
          CHECK(st == KVA_ERR_OUT_OF_PAGES, "alloc %d of %d free -> %d", count, free_before, st);
        } else {
          CHECK(st == KVA_OK, "alloc %d of %d free -> %d", count, free_before, st);
          for (int i = 0; i < count; i++) {
            CHECK(pages[i] >= 0 && pages[i] < m.num_pages && m.held[pages[i]] == 0,
                  "alloc gave page %d", pages[i]);
            m.held[pages[i]] = 1;
            /* a page handed out twice in one call would show as refcount 1, held 1 twice */
            for (int j = 0; j < i; j++) CHECK(pages[j] != pages[i], "page %d twice", pages[i]);
          }
        }
        break;
      }
      case 1:   /* raw ref */
      case 2: { /* raw unref */
        int32_t pg = (int32_t)take(&b, (unsigned)m.num_pages + 4) - 2;
        int rc = kva_pool_page_refcount(m.pool, pg);
        int inrange = pg >= 0 && pg < m.num_pages;
        /* a page only requests hold: unref + ref is a no-op when another
         * reference keeps it alive; with one reference skip it (freeing it
         * under a request would corrupt the table) */
        if (op == 2 && inrange && rc == 1 && m.held[pg] == 0) break;
        st = op == 1 ? kva_pool_ref_page(m.pool, pg) : kva_pool_unref_page(m.pool, pg);
        if (!inrange) {
          CHECK(st == KVA_ERR_OUT_OF_RANGE, "ref/unref page %d -> %d", pg, st);
        } else if (rc == 0) {
          /* unref: DOUBLE_FREE per kvattn.h; ref of a free page: any error */
          CHECK(op == 1 ? st != KVA_OK : st == KVA_ERR_DOUBLE_FREE,
                "ref/unref of free page %d -> %d", pg, st);
        } else if (op == 1) {
          CHECK(st == KVA_OK, "ref page %d -> %d", pg, st);
          m.held[pg]++;
        } else if (m.held[pg] > 0) {
          CHECK(st == KVA_OK, "unref page %d -> %d", pg, st);
          m.held[pg]--;
        } else {
          CHECK(st == KVA_OK, "unref page %d -> %d", pg, st);
          CHECK(kva_pool_ref_page(m.pool, pg) == KVA_OK, "re-ref page %d", pg);
        }
        break;
      }
      case 3: { /* request alloc */
        int slot = -5;
        int live_before = kva_req_num_live(m.table);
        st = kva_req_alloc(m.table, &slot);
        if (live_before == m.max_req) {
          CHECK(st != KVA_OK, "req_alloc on a full table succeeded");
        } else {
          CHECK(st == KVA_OK && slot >= 0 && slot < m.max_req && m.len[slot] < 0,
                "req_alloc -> %d slot %d", st, slot);
          m.len[slot] = 0;
        }
        break;
      }
      case 4: { /* append */
        int slot = (int)take(&b, (unsigned)m.max_req + 2) - 1;
        int n = (int)take(&b, 80) - 2;
        st = kva_req_append(m.table, slot, n);
        if (slot < 0 || slot >= m.max_req) {
          CHECK(st == KVA_ERR_OUT_OF_RANGE || st == KVA_ERR_INVALID_ARGUMENT,
                "append slot %d -> %d", slot, st);
        } else if (m.len[slot] < 0) {
          CHECK(st != KVA_OK, "append to free slot %d succeeded", slot);
        } else if (n < 0) {
          CHECK(st == KVA_ERR_INVALID_ARGUMENT, "append %d -> %d", n, st);
        } else if (m.len[slot] + n > m.max_ctx) {
          CHECK(st == KVA_ERR_CAPACITY, "append past max_context_len -> %d", st);
        } else if (st == KVA_OK) {
          m.len[slot] += n;
        } else {
          CHECK(st == KVA_ERR_OUT_OF_PAGES || (n == 0 && st == KVA_ERR_INVALID_ARGUMENT),
                "append %d to slot %d (len %d) -> %d", n, slot, m.len[slot], st);
          /* new pages needed (plus a copy-on-write page) exceed the free ones */
          CHECK(n > 0 && pages_of(&m, m.len[slot] + n) - pages_of(&m, m.len[slot]) + 1 >
                             free_before,
                "append failed with %d free pages", free_before);
        }
        break;
      }
      case 5: { /* fork */
        int src = (int)take(&b, (unsigned)m.max_req);
        int prefix = (int)take(&b, 320) - 4;
        int slot = -5;
        st = kva_req_fork(m.table, src, prefix, &slot);
        if (st == KVA_OK) {
          CHECK(m.len[src] >= 0 && prefix >= 0 && prefix <= m.len[src], "fork of %d prefix %d",
                src, prefix);
          CHECK(slot >= 0 && slot < m.max_req && m.len[slot] < 0, "fork gave slot %d", slot);
          m.len[slot] = prefix;
          /* whole pages are shared with the source */
          const int32_t *a = kva_req_tokens(m.table, src), *c = kva_req_tokens(m.table, slot);
          for (int p = 0; p < prefix - prefix % m.ps; p++)
            CHECK(a[p] == c[p], "fork: position %d not shared", p);
        } else {
          CHECK(m.len[src] < 0 || prefix <= 0 || prefix > m.len[src] ||
                    st == KVA_ERR_OUT_OF_PAGES || st == KVA_ERR_CAPACITY,
                "fork of %d prefix %d -> %d", src, prefix, st);
        }
        break;
      }
      case 6: { /* truncate */
        int slot = (int)take(&b, (unsigned)m.max_req);
        int nl = (int)take(&b, 320) - 4;
        st = kva_req_truncate(m.table, slot, nl);
        if (m.len[slot] >= 0 && nl >= 0 && nl <= m.len[slot]) {
          CHECK(st == KVA_OK, "truncate slot %d to %d -> %d", slot, nl, st);
          m.len[slot] = nl;
        } else {
          CHECK(st != KVA_OK, "bad truncate of slot %d to %d succeeded", slot, nl);
        }
        break;
      }
      case 7: { /* release */
        int slot = (int)take(&b, (unsigned)m.max_req + 2) - 1;
        st = kva_req_release(m.table, slot);
        if (slot < 0 || slot >= m.max_req)
          CHECK(st == KVA_ERR_OUT_OF_RANGE, "release slot %d -> %d", slot, st);
        else if (m.len[slot] < 0)
          CHECK(st == KVA_ERR_DOUBLE_FREE, "release of free slot %d -> %d", slot, st);
        else {
          CHECK(st == KVA_OK, "release slot %d -> %d", slot, st);
          m.len[slot] = -1;
        }
        break;
      }
      default: { /* give back a raw page */
        int32_t pg = (int32_t)take(&b, (unsigned)m.num_pages);
        if (m.held[pg] > 0) {
          CHECK(kva_pool_unref_page(m.pool, pg) == KVA_OK, "unref held page %d", pg);
          m.held[pg]--;
        }
        break;
      }
    }
    verify(&m);
  }
  kva_req_table_destroy(m.table);
  for (int pg = 0; pg < m.num_pages; pg++)
    while (m.held[pg]-- > 0) CHECK(kva_pool_unref_page(m.pool, pg) == KVA_OK, "final unref");
  CHECK(kva_pool_num_free_pages(m.pool) == m.num_pages, "pages leaked: %d of %d free",
        kva_pool_num_free_pages(m.pool), m.num_pages);
  kva_pool_destroy(m.pool);
  return 0;
}
