/* Planner properties on random batches (CPU context):
 *   - kva_split_schedule and kva_split_schedule_packed alone: every key of
 *     every nonempty request covered
 *     exactly once, cuts on block boundaries, one chunk per (worker, request),
 *     split counts, the load-balance bound; workers 1..300, batches 1..512,
 *     lengths up to 128k;
 *   - kva_plan_update: every metadata array against the request table;
 *   - every validation error path of create/update/get_info and of the run
 *     entry points, and that a failed update keeps the previous plan. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "kvattn.h"

/* Must match KVA_SPLIT_OVERHEAD in src/core/split_schedule.c. */
#define OVERHEAD 2

static int failures = 0, checks = 0;
#define EXPECT(c, ...)                                     \
  do {                                                     \
    checks++;                                              \
    if (!(c)) {                                            \
      if (++failures < 50) {                               \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                      \
        fprintf(stderr, "\n");                             \
      }                                                    \
    }                                                      \
  } while (0)
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
    EXPECT(s_ == (want), "%s -> %s, want %s", #call, kva_strerror(s_), kva_strerror(want)); \
    EXPECT(kva_last_error()[0] != '\0', "%s set no message", #call);               \
  } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
static int rand_int(int lo, int hi) { return lo + (int)(next_u64() % (uint64_t)(hi - lo + 1)); }

/* ---- schedule checker ------------------------------------------------- */

/* Checks a schedule of n requests with kv[] keys whose workers walk the
 * requests in order[] (NULL: batch order), a chunk costing ovh blocks
 * beyond its keys; returns 0 if consistent. */
static int check_schedule(int n, const int32_t *kv, int block, int nw, int slack,
                          const kva_split_work *work, const int32_t *indptr, int total,
                          const int32_t *order, int ovh, const char *what) {
  int f0 = failures;
  EXPECT(indptr[0] == 0, "%s: split_indptr[0] = %d", what, indptr[0]);
  if (order) { /* a permutation */
    char *seen = (char *)calloc((size_t)n + 1, 1);
    for (int i = 0; i < n && failures == f0; i++) {
      EXPECT(order[i] >= 0 && order[i] < n && !seen[order[i]], "%s: order[%d] = %d", what, i,
             order[i]);
      if (failures == f0) seen[order[i]] = 1;
    }
    free(seen);
    if (failures != f0) return 1;
  }
#define ORD(i) (order ? order[i] : (i))
  int64_t T = 0;
  int nonempty = 0;
  for (int r = 0; r < n; r++) {
    int s = indptr[r + 1] - indptr[r];
    if (kv[r] > 0) {
      EXPECT(s >= 1, "%s: request %d (kv %d) has %d splits", what, r, kv[r], s);
      T += (kv[r] + block - 1) / block + ovh;
      nonempty++;
    } else {
      EXPECT(s == 0, "%s: empty request %d has %d splits", what, r, s);
    }
  }
  EXPECT(indptr[n] == total, "%s: split_indptr[n] = %d, returned %d", what, indptr[n], total);
  if (failures != f0) return 1;
  int64_t payload = (T + nw - 1) / nw + ovh;

  /* chunk j of request r: [lo, hi) and the worker that owns it */
  int32_t *lo = (int32_t *)malloc(((size_t)total + 1) * sizeof(int32_t));
  int32_t *hi = (int32_t *)malloc(((size_t)total + 1) * sizeof(int32_t));
  int32_t *owner = (int32_t *)malloc(((size_t)total + 1) * sizeof(int32_t));
  for (int i = 0; i < total; i++) owner[i] = -1;
  int64_t spent = 0;
  int seen_idle = 0;
  for (int w = 0; w < nw && failures == f0; w++) {
    const kva_split_work *k = &work[w];
    if (k->begin_req > k->end_req) {
      seen_idle = 1;
      continue;
    }
    EXPECT(!seen_idle, "%s: worker %d busy after an idle worker", what, w);
    EXPECT(k->begin_req >= 0 && k->end_req < n, "%s: worker %d requests %d..%d of %d", what, w,
           k->begin_req, k->end_req, n);
    if (failures != f0) break;
    EXPECT(kv[ORD(k->begin_req)] > 0 && kv[ORD(k->end_req)] > 0,
           "%s: worker %d starts or ends on an empty request", what, w);
    int64_t cost = 0;
    for (int i = k->begin_req; i <= k->end_req && failures == f0; i++) {
      const int r = ORD(i);
      if (kv[r] <= 0) continue; /* consumers skip zero-split requests */
      const kva_split_chunk ch = kva_split_work_chunk(k, i, kv[r]);
      const int a = ch.k0, b = ch.k1, j = ch.split;
      int s = indptr[r + 1] - indptr[r];
      EXPECT(a % block == 0, "%s: worker %d request %d starts at %d, block %d", what, w, r, a,
             block);
      EXPECT(b == kv[r] || b % block == 0, "%s: worker %d request %d ends at %d, block %d", what,
             w, r, b, block);
      EXPECT(0 <= a && a < b && b <= kv[r], "%s: worker %d request %d chunk [%d,%d) of %d", what,
             w, r, a, b, kv[r]);
      EXPECT(j >= 0 && j < s, "%s: worker %d request %d split %d of %d", what, w, r, j, s);
      if (failures != f0) break;
      int id = indptr[r] + j;
      EXPECT(owner[id] == -1, "%s: split %d of request %d owned by workers %d and %d", what, j, r,
             owner[id], w);
      owner[id] = w;
      lo[id] = a;
      hi[id] = b;
      cost += (b - a + block - 1) / block + ovh;
    }
    if (slack >= 0) /* < 0: the costed walk, priced otherwise */
      EXPECT(cost <= payload + slack, "%s: worker %d cost %lld > payload %lld + slack %d", what,
             w, (long long)cost, (long long)payload, slack);
    spent += cost;
  }
  /* chunks of each request tile [0, kv) in split order: every key once */
  for (int r = 0; r < n && failures == f0; r++) {
    int32_t pos = 0;
    for (int id = indptr[r]; id < indptr[r + 1]; id++) {
      EXPECT(owner[id] >= 0, "%s: split %d of request %d has no worker", what, id - indptr[r], r);
      if (owner[id] < 0) break;
      EXPECT(lo[id] == pos, "%s: request %d split %d starts at %d, want %d", what, r,
             id - indptr[r], lo[id], pos);
      pos = hi[id];
      if (id > indptr[r])
        EXPECT(owner[id] > owner[id - 1], "%s: request %d splits not in worker order", what, r);
    }
    if (kv[r] > 0) EXPECT(pos == kv[r], "%s: request %d covered to %d of %d", what, r, pos, kv[r]);
  }
  /* every block and every chunk's overhead is paid by exactly one worker */
  if (failures == f0 && slack >= 0)
    EXPECT(spent == T + (int64_t)ovh * (total - nonempty),
           "%s: workers spent %lld, want %lld", what, (long long)spent,
           (long long)(T + (int64_t)ovh * (total - nonempty)));
  free(lo);
  free(hi);
  free(owner);
#undef ORD
  return failures != f0;
}

/* A schedule's longest worker under `c` (1/16 blocks): each chunk costs
 * its blocks and c->chunk, ending at the worker's running sum; of a split
 * request, the chunk that ends last merges (c->merge for two chunks,
 * c->merge_many for more) and the others write partial rows. */
static int64_t model_max(int n, const int32_t *kv, int block, int nw, const kva_split_work *work,
                         const int32_t *indptr, const int32_t *order,
                         const kva_split_costs *c) {
  int64_t *load = (int64_t *)calloc((size_t)nw, sizeof(int64_t));
  int64_t *last_end = (int64_t *)malloc((size_t)n * sizeof(int64_t));
  int32_t *last_w = (int32_t *)malloc((size_t)n * sizeof(int32_t));
  for (int r = 0; r < n; r++) last_end[r] = -1;
  for (int w = 0; w < nw; w++)
    for (int i = work[w].begin_req; i <= work[w].end_req; i++) {
      const int r = order[i];
      if (kv[r] <= 0) continue;
      const kva_split_chunk ch = kva_split_work_chunk(&work[w], i, kv[r]);
      load[w] += (int64_t)(ch.k1 - ch.k0 + block - 1) / block * KVA_SPLIT_COST_UNIT + c->chunk;
      if (indptr[r + 1] - indptr[r] > 1) {
        load[w] += c->partial; /* taken back from the one that merges */
        if (load[w] > last_end[r]) {
          last_end[r] = load[w];
          last_w[r] = w;
        }
      }
    }
  for (int r = 0; r < n; r++)
    if (last_end[r] >= 0)
      load[last_w[r]] += (indptr[r + 1] - indptr[r] > 2 ? c->merge_many : c->merge) - c->partial;
  int64_t mx = 0;
  for (int w = 0; w < nw; w++) mx = load[w] > mx ? load[w] : mx;
  free(load);
  free(last_end);
  free(last_w);
  return mx;
}

static int run_schedule(int n, const int32_t *kv, int block, int nw, int slack,
                        const char *what) {
  kva_split_work *work = (kva_split_work *)malloc((size_t)nw * sizeof(*work));
  int32_t *indptr = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
  int32_t *q = (int32_t *)malloc((size_t)n * sizeof(int32_t));
  for (int i = 0; i < n; i++) q[i] = rand_int(1, 8);
  for (int w = 0; w < nw; w++) work[w].begin_req = work[w].end_req = -7; /* poison */
  for (int i = 0; i <= n; i++) indptr[i] = -7;
  int total = kva_split_schedule(n, kv, q, block, nw, slack, work, indptr);
  int bad = check_schedule(n, kv, block, nw, slack, work, indptr, total, NULL, OVERHEAD, what);
  /* the same batch in the packed order (MLA plans) */
  int32_t *order = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
  int64_t *keys = (int64_t *)malloc(((size_t)n + 1) * sizeof(int64_t));
  int32_t *nxt = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
  for (int w = 0; w < nw; w++) work[w].begin_req = work[w].end_req = -7;
  for (int i = 0; i <= n; i++) indptr[i] = -7;
  for (int i = 0; i < n; i++) order[i] = -7;
  char w2[160];
  snprintf(w2, sizeof(w2), "%s, packed", what);
  const int ovh = rand_int(0, 2) ? rand_int(1, 6) : 0; /* 0: the default, OVERHEAD */
  total = kva_split_schedule_packed(n, kv, block, nw, slack, ovh, work, indptr, order, keys, nxt);
  bad |= check_schedule(n, kv, block, nw, slack, work, indptr, total, order,
                        ovh ? ovh : OVERHEAD, w2);
  /* and the costed walk, at random prices (0 included) */
  for (int w = 0; w < nw; w++) work[w].begin_req = work[w].end_req = -7;
  for (int i = 0; i <= n; i++) indptr[i] = -7;
  for (int i = 0; i < n; i++) order[i] = -7;
  kva_split_costs costs = {rand_int(0, 80), rand_int(0, 40), rand_int(0, 60), rand_int(0, 200),
                           rand_int(0, 60), rand_int(0, 8)};
  if (rand_int(0, 3) == 0)
    costs.chunk = costs.partial = costs.merge = costs.merge_many = costs.margin = costs.min_head = 0;
  snprintf(w2, sizeof(w2), "%s, costed %d/%d/%d/%d/%d/%d", what, costs.chunk, costs.partial,
           costs.merge, costs.merge_many, costs.margin, costs.min_head);
  total = kva_split_schedule_costed(n, kv, block, nw, slack, &costs, work, indptr, order, keys, nxt);
  bad |= check_schedule(n, kv, block, nw, -1, work, indptr, total, order, 0, w2);
  free(order);
  free(keys);
  free(nxt);
  free(work);
  free(indptr);
  free(q);
  return bad;
}

static void test_schedule(void) {
  static const int blocks[] = {1, 7, 16, 64, 128, 256, 1000};
  int32_t *kv = (int32_t *)malloc(512 * sizeof(int32_t));
  char what[96];
  for (int it = 0; it < 3000; it++) {
    int n = it % 4 == 0 ? rand_int(1, 8) : rand_int(1, 512);
    int nw = it % 5 == 0 ? rand_int(1, 4) : rand_int(1, 300);
    int block = blocks[rand_int(0, 6)];
    int mode = rand_int(0, 4);
    int slack = it % 3 == 0 ? 0 : rand_int(0, 8);
    for (int r = 0; r < n; r++) {
      switch (mode) {
        case 0: kv[r] = rand_int(1, 131072); break;             /* long */
        case 1: kv[r] = rand_int(1, 300); break;                /* short */
        case 2: kv[r] = rand_int(0, 4) == 0 ? 0 : rand_int(1, 131072); break; /* extend holes */
        case 3: kv[r] = r == 0 ? rand_int(65536, 131072) : rand_int(1, 64); break; /* skew */
        default: kv[r] = rand_int(0, 1) ? rand_int(1, 16) : rand_int(4096, 131072); break;
      }
    }
    snprintf(what, sizeof(what), "schedule it %d (n %d, workers %d, block %d, mode %d, slack %d)",
             it, n, nw, block, mode, slack);
    if (run_schedule(n, kv, block, nw, slack, what)) break;
  }
  /* corners: all empty, one key, one huge request over many workers */
  for (int r = 0; r < 512; r++) kv[r] = 0;
  run_schedule(512, kv, 64, 300, 0, "all empty");
  kv[0] = 1;
  run_schedule(1, kv, 64, 300, 3, "one key");
  kv[0] = 131072;
  run_schedule(1, kv, 1, 300, 0, "one request, block 1");
  {
    /* one long request on many workers is split over all of them */
    kva_split_work work[132];
    int32_t indptr[2];
    int total = kva_split_schedule(1, kv, NULL, 64, 132, 0, work, indptr);
    EXPECT(total >= 120 && total <= 132, "128k keys over 132 workers: %d splits", total);
    total = kva_split_schedule(1, kv, NULL, 64, 132, 6, work, indptr);
    EXPECT(total >= 110 && total <= 132, "128k keys over 132 workers, slack 6: %d splits", total);
  }
  {
    /* 128 equal requests that nearly fit one per worker: without slack each
     * is cut a block short of whole; one block of slack keeps them whole */
    kva_split_work work[132];
    int32_t eq[128], indptr[129];
    for (int r = 0; r < 128; r++) eq[r] = 8192;
    int total = kva_split_schedule(128, eq, NULL, 64, 132, 0, work, indptr);
    EXPECT(total > 128, "128 x 8192 keys on 132 workers, no slack: %d splits", total);
    total = kva_split_schedule(128, eq, NULL, 64, 132, 1, work, indptr);
    EXPECT(total == 128, "128 x 8192 keys on 132 workers, slack 1: %d splits, want 128", total);
    check_schedule(128, eq, 64, 132, 1, work, indptr, total, NULL, OVERHEAD, "128 x 8192, slack 1");
  }
  {
    /* FlashMLA's varlen table rows: 128 requests of N(L, L/2) keys on 132
     * workers. The packed order cuts far fewer requests (simulated: 113 ->
     * 61 cuts at L = 4096) and leaves fewer of three or more chunks. */
    kva_split_work work[132];
    int32_t vl[128], indptr[129], order[128], nxt[129];
    int64_t keys[128];
    for (int L = 4096; L <= 8192; L *= 2)
      for (int trial = 0; trial < 4; trial++) {
        for (int r = 0; r < 128; r++) { /* Box-Muller, clipped at 1 */
          double u1 = (next_u64() % 1000000 + 1) / 1000001.0, u2 = (next_u64() % 1000000) / 1e6;
          double x = L + L / 2.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
          vl[r] = x < 1 ? 1 : (int32_t)x;
        }
        int seq = kva_split_schedule(128, vl, NULL, 64, 132, 6, work, indptr);
        int seq3 = 0, pk3 = 0;
        for (int r = 0; r < 128; r++) seq3 += indptr[r + 1] - indptr[r] >= 3;
        /* the CUDA backend's slack and overhead at 64 rows */
        int pk = kva_split_schedule_packed(128, vl, 64, 132, 6, 4, work, indptr, order, keys, nxt);
        for (int r = 0; r < 128; r++) pk3 += indptr[r + 1] - indptr[r] >= 3;
        check_schedule(128, vl, 64, 132, 6, work, indptr, pk, order, 4, "varlen 128, packed");
        EXPECT((pk - 128) * 4 <= (seq - 128) * 3,
               "varlen 128 x N(%d, %d): packed %d cuts, in order %d", L, L / 2, pk - 128,
               seq - 128);
        EXPECT(pk3 <= seq3, "varlen 128 x N(%d, %d): %d requests of 3+ chunks packed, %d in order",
               L, L / 2, pk3, seq3);
        /* the costed walk at the CUDA backend's 64-row prices: no longer
         * under its own model than the packed walk, and a third chunk only
         * for requests longer than two workers' share, less what their
         * chunks reserve for the merge */
        const kva_split_costs c64 = {38, 18, 29, 108, 29, 1};
        const int64_t pk_max = model_max(128, vl, 64, 132, work, indptr, order, &c64);
        int cs = kva_split_schedule_costed(128, vl, 64, 132, 6, &c64, work, indptr, order, keys, nxt);
        check_schedule(128, vl, 64, 132, -1, work, indptr, cs, order, 0, "varlen 128, costed");
        const int64_t cs_max = model_max(128, vl, 64, 132, work, indptr, order, &c64);
        int64_t tot = 0;
        for (int r = 0; r < 128; r++) tot += ((int64_t)vl[r] + 63) / 64 * 16 + c64.chunk;
        int cs3 = 0, long3 = 0;
        for (int r = 0; r < 128; r++) {
          cs3 += indptr[r + 1] - indptr[r] >= 3;
          long3 += ((int64_t)vl[r] + 63) / 64 * 16 > 2 * (tot / 132 - c64.chunk - c64.merge_many);
        }
        EXPECT(cs_max <= pk_max, "varlen 128 x N(%d, %d): costed walk's longest worker %lld > "
               "packed %lld (1/16 blocks)", L, L / 2, (long long)cs_max, (long long)pk_max);
        EXPECT(cs3 <= long3, "varlen 128 x N(%d, %d): %d requests of 3+ chunks, %d longer than "
               "two shares", L, L / 2, cs3, long3);
        if (trial == 0)
          printf("varlen 128 x N(%d, %d): modelled longest worker packed %.1f, costed %.1f "
                 "blocks (mean %.1f); cuts %d / %d\n", L, L / 2, pk_max / 16.0, cs_max / 16.0,
                 tot / 132 / 16.0, pk - 128, cs - 128);
      }
  }
  for (int r = 0; r < 512; r++) kv[r] = 131072;
  run_schedule(512, kv, 64, 1, 0, "512 x 128k on one worker");
  run_schedule(512, kv, 256, 300, 5, "512 x 128k on 300 workers");
  free(kv);
}

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
  EXPECT(st == KVA_OK, "%s: get_info after failed update -> %s", what, kva_strerror(st));
  if (st != KVA_OK) return;
  const kva_plan_info *o = &s->info;
  EXPECT(now.num_requests == o->num_requests && now.total_q == o->total_q &&
             now.total_k == o->total_k && now.max_q_len == o->max_q_len &&
             now.max_k_len == o->max_k_len && now.num_decode == o->num_decode &&
             now.num_extend == o->num_extend && now.page_table_stride == o->page_table_stride &&
             now.num_workers == o->num_workers && now.num_splits_total == o->num_splits_total,
         "%s: plan info sizes changed", what);
  snapshot t;
  take_snapshot(plan, &t);
  EXPECT(t.len == s->len && memcmp(t.buf, s->buf, t.len * sizeof(int32_t)) == 0,
         "%s: plan arrays changed", what);
  free(t.buf);
}

/* Checks every array of the plan against the request table and the batch. */
static void check_plan(const kva_plan *plan, const kva_req_table *table, const kva_batch *b,
                       int page_size, int block, const char *what) {
  int f0 = failures;
  kva_plan_info in;
  TRY(kva_plan_get_info(plan, &in));
  int n = b->num_requests;
  EXPECT(in.num_requests == n, "%s: num_requests %d", what, in.num_requests);
  int64_t tq = 0, tk = 0;
  int maxq = 0, maxk = 0, maxpages = 0, nd = 0, ne = 0;
  EXPECT(in.cu_seqlens_q[0] == 0 && in.cu_seqlens_k[0] == 0 && in.kv_indptr[0] == 0,
         "%s: first offsets not 0", what);
  int32_t *kv = (int32_t *)malloc((size_t)n * sizeof(int32_t));
  for (int r = 0; r < n && failures == f0; r++) {
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
    EXPECT(in.cache_seqlens[r] == len, "%s: cache_seqlens[%d] = %d, want %d", what, r,
           in.cache_seqlens[r], len);
    EXPECT(in.cu_seqlens_q[r + 1] == tq, "%s: cu_seqlens_q[%d]", what, r + 1);
    EXPECT(in.cu_seqlens_k[r + 1] == tk, "%s: cu_seqlens_k[%d]", what, r + 1);
    EXPECT(in.kv_indptr[r + 1] - in.kv_indptr[r] == pages, "%s: request %d has %d ragged pages, "
           "want %d", what, r, in.kv_indptr[r + 1] - in.kv_indptr[r], pages);
    EXPECT(in.kv_last_page_len[r] == len - (pages - 1) * page_size &&
               in.kv_last_page_len[r] >= 1 && in.kv_last_page_len[r] <= page_size,
           "%s: kv_last_page_len[%d] = %d", what, r, in.kv_last_page_len[r]);
    if (failures != f0) break;
    const int32_t *row = in.page_table + (size_t)r * (size_t)in.page_table_stride;
    const int32_t *rag = in.kv_indices + in.kv_indptr[r];
    /* every position (sampled for long requests) against req_to_token */
    int step = len > 4096 ? rand_int(1, 97) : 1;
    for (int pos = 0; pos < len && failures == f0; pos += step) {
      int32_t want = tok[pos];
      EXPECT(row[pos / page_size] * page_size + pos % page_size == want,
             "%s: page_table of request %d position %d", what, r, pos);
      EXPECT(rag[pos / page_size] * page_size + pos % page_size == want,
             "%s: kv_indices of request %d position %d", what, r, pos);
    }
    EXPECT(row[(len - 1) / page_size] * page_size + (len - 1) % page_size == tok[len - 1],
           "%s: page_table of request %d last position", what, r);
    for (int j = pages; j < in.page_table_stride; j++)
      EXPECT(row[j] == 0, "%s: unused page_table[%d][%d] = %d", what, r, j, row[j]);
    for (int t = 0; t < nn; t++) {
      EXPECT(in.out_cache_loc[in.cu_seqlens_q[r] + t] == tok[nc + t],
             "%s: out_cache_loc of request %d token %d", what, r, t);
      EXPECT(plan->q_req[in.cu_seqlens_q[r] + t] == r, "%s: q_req of request %d token %d", what,
             r, t);
    }
    if (dec) {
      EXPECT(nd < in.num_decode && plan->decode_reqs[nd] == r, "%s: decode_reqs[%d]", what, nd);
      nd++;
    } else {
      EXPECT(ne < in.num_extend && plan->extend_reqs[ne] == r, "%s: extend_reqs[%d]", what, ne);
      ne++;
    }
    EXPECT(plan->req_slots[r] == b->req_slots[r] && plan->num_new[r] == nn,
           "%s: req_slots/num_new[%d]", what, r);
  }
  if (failures == f0) {
    EXPECT(in.total_q == tq && in.total_k == tk && in.max_q_len == maxq && in.max_k_len == maxk,
           "%s: totals %d %d %d %d, want %lld %lld %d %d", what, in.total_q, in.total_k,
           in.max_q_len, in.max_k_len, (long long)tq, (long long)tk, maxq, maxk);
    EXPECT(in.page_table_stride == maxpages, "%s: page_table_stride %d, want %d", what,
           in.page_table_stride, maxpages);
    EXPECT(in.num_decode == nd && in.num_extend == ne, "%s: %d decode %d extend, want %d %d",
           what, in.num_decode, in.num_extend, nd, ne);
    const kva_plan_header *h = &plan->hdr;
    EXPECT(h->num_requests == n && h->total_q == tq && h->max_q_len == maxq &&
               h->max_k_len == maxk && h->page_table_stride == maxpages &&
               h->num_workers == in.num_workers && h->num_splits_total == in.num_splits_total &&
               h->num_extend == ne,
           "%s: header disagrees with info", what);
    check_schedule(n, kv, block, in.num_workers, 0 /* the CPU backend has no slack */,
                   in.split_schedule, in.split_indptr, in.num_splits_total, in.sched_order,
                   OVERHEAD, what);
    for (int i = 0; i < n; i++) /* MHA pools: batch order */
      EXPECT(in.sched_order[i] == i, "%s: sched_order[%d] = %d on an MHA pool", what, i,
             in.sched_order[i]);
    /* partial rows: only multi-split requests, packed in request order */
    int32_t rows = 0;
    for (int r = 0; r < n; r++) {
      EXPECT(plan->split_row_offset[r] == rows, "%s: split_row_offset[%d] = %d, want %d", what, r,
             plan->split_row_offset[r], rows);
      int s = in.split_indptr[r + 1] - in.split_indptr[r];
      if (s > 1) rows += s * b->num_new[r];
    }
    EXPECT(plan->split_row_offset[n] == rows && rows <= plan->max_partial_rows,
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
    int len = rand_int(0, 3) == 0 ? rand_int(1, 16) : rand_int(1, max_len);
    if (used + len > (int64_t)max_req * max_len / 2) len = rand_int(1, 16);
    int s;
    if (nlive > 0 && rand_int(0, 3) == 0) {
      int src = slots[rand_int(0, nlive - 1)];
      int srclen = kva_req_len(w.table, src);
      TRY(kva_req_fork(w.table, src, rand_int(0, srclen), &s));
      int grow = rand_int(1, 64);
      if (kva_req_len(w.table, s) + grow <= max_ctx) TRY(kva_req_append(w.table, s, grow));
    } else {
      TRY(kva_req_alloc(w.table, &s));
      TRY(kva_req_append(w.table, s, len));
      if (rand_int(0, 5) == 0 && len > 1) TRY(kva_req_truncate(w.table, s, rand_int(1, len)));
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
      cfg.num_workers = it % 16 == 0 ? 0 : rand_int(1, 300);
      cfg.split_block = it % 24 == 0 ? 0 : rand_int(1, 300);
      TRY(kva_plan_create(w.table, &cfg, &plan));
    }
    /* random subset in random order */
    for (int i = nlive - 1; i > 0; i--) {
      int j = rand_int(0, i);
      int32_t t = slots[i];
      slots[i] = slots[j];
      slots[j] = t;
    }
    int nmax = max_batch < nlive ? max_batch : nlive;
    int n = it % 5 == 0 ? nmax : rand_int(1, nmax);
    int qbudget = cfg.max_q_tokens;
    int mix = rand_int(0, 2); /* 0 decode only, 1 extend heavy, 2 mixed */
    for (int i = 0; i < n; i++) {
      int len = kva_req_len(w.table, slots[i]);
      int use = rand_int(0, 3) == 0 ? rand_int(1, len) : len; /* may plan a prefix */
      int nn;
      int left = qbudget - (n - 1 - i);
      if (mix == 0 || (mix == 2 && rand_int(0, 1)))
        nn = rand_int(1, use < 8 ? use : 8);
      else
        nn = rand_int(1, use < 200 ? use : 200);
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
    EXPECT(st == KVA_OK, "%s: update -> %s: %s", what, kva_strerror(st), kva_last_error());
    if (st != KVA_OK) break;
    int f0 = failures;
    check_plan(plan, w.table, &b, page_size, plan->cfg.split_block, what);
    if (failures != f0) break;
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
  EXPECT(plan == NULL, "failed create left *out set");
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
  EXPECT(ap.sm_scale == 0.f && ap.causal == 1 && ap.window_left == -1 && ap.logit_softcap == 0.f,
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
      kbuf[i] = (float)(rand_int(-64, 64)) / 32.f; /* exact in f16 */
      vbuf[i] = (float)(rand_int(-64, 64)) / 16.f;
    }
    TRY(kva_store_kv(plan, w.pool, 1, kbuf, vbuf, KVA_F32));
    const int32_t *tok = kva_req_tokens(w.table, s[1]);
    float kr[3 * 2 * 8], vr[3 * 2 * 8];
    TRY(kva_pool_read_tokens(w.pool, 1, 3, tok + 128, kr, vr));
    EXPECT(memcmp(kr, kbuf, sizeof(kr)) == 0 && memcmp(vr, vbuf, sizeof(vr)) == 0,
           "kva_store_kv: tokens read back differ");
    for (int i = 0; i < 3 * 4 * 8; i++) o[i] = NAN;
    for (int i = 0; i < 3 * 4; i++) lse[i] = NAN;
    st = kva_attention(plan, w.pool, 1, &ap, q, o, lse, KVA_F32);
    EXPECT(st == KVA_OK, "kva_attention -> %s: %s", kva_strerror(st), kva_last_error());
    int finite = 1;
    for (int i = 0; i < 3 * 4 * 8; i++) finite &= isfinite(o[i]) != 0;
    for (int i = 0; i < 3 * 4; i++) finite &= isfinite(lse[i]) != 0;
    EXPECT(finite, "kva_attention left non-finite outputs");
  }

  /* merge */
  float va[2 * 3 * 8], vb[2 * 3 * 8], sa[6], sb[6], vo[2 * 3 * 8], so[6];
  for (int i = 0; i < 48; i++) {
    va[i] = (float)rand_int(-100, 100) / 50.f;
    vb[i] = (float)rand_int(-100, 100) / 50.f;
    vo[i] = NAN;
  }
  for (int i = 0; i < 6; i++) {
    sa[i] = (float)rand_int(-100, 100) / 25.f;
    sb[i] = (float)rand_int(-100, 100) / 25.f;
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
  EXPECT(st == KVA_OK, "kva_merge_states -> %s: %s", kva_strerror(st), kva_last_error());
  for (int i = 0; i < 6 && st == KVA_OK; i++) {
    double m = fmax(sa[i], sb[i]);
    double wa = exp(sa[i] - m), wb = exp(sb[i] - m);
    double s = m + log(wa + wb);
    EXPECT(fabs(so[i] - s) <= 1e-5 * (1 + fabs(s)), "merge lse[%d] %g want %g", i, so[i], s);
    for (int d = 0; d < 8; d++) {
      double want = (wa * va[i * 8 + d] + wb * vb[i * 8 + d]) / (wa + wb);
      EXPECT(fabs(vo[i * 8 + d] - want) <= 1e-5 * (1 + fabs(want)), "merge v[%d][%d] %g want %g",
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
  test_schedule();
  test_errors();
  /* page sizes 1..256; small and large tables; batches up to 512 */
  test_plans(1, 64, 2048, 2048, 40, 64);
  test_plans(16, 600, 2048, 2048, 48, 512);
  test_plans(64, 16, 131072, 131072, 40, 16);
  test_plans(256, 40, 131072, 40000, 40, 40);
  test_plans(7, 300, 1024, 1024, 48, 300);
  printf("test_planner: %d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
