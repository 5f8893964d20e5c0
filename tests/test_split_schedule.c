/* The split schedules alone (src/core/split_schedule.c), on random batches:
 * kva_split_schedule, kva_split_schedule_packed and
 * kva_split_schedule_costed cover every key of every nonempty request
 * exactly once, cut on block boundaries, give one chunk per (worker,
 * request), count splits right and keep the load-balance bound; workers
 * 1..300, batches 1..512, lengths up to 128k; plus FlashMLA's varlen rows
 * under the costed walk's own model. The planner around them is
 * tests/test_planner.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "kvattn.h"
#include "testutil.h"

static tu_rng rng = {0x9e3779b97f4a7c15ull};

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
  for (int i = 0; i < n; i++) q[i] = tu_int(&rng, 1, 8);
  for (int w = 0; w < nw; w++) work[w].begin_req = work[w].end_req = -7; /* poison */
  for (int i = 0; i <= n; i++) indptr[i] = -7;
  int total = kva_split_schedule(n, kv, q, block, nw, slack, work, indptr);
  int bad = tu_check_schedule(n, kv, block, nw, slack, work, indptr, total, NULL, TU_SPLIT_OVERHEAD, what);
  /* the same batch in the packed order (MLA plans) */
  int32_t *order = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
  int64_t *keys = (int64_t *)malloc(((size_t)n + 1) * sizeof(int64_t));
  int32_t *nxt = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
  for (int w = 0; w < nw; w++) work[w].begin_req = work[w].end_req = -7;
  for (int i = 0; i <= n; i++) indptr[i] = -7;
  for (int i = 0; i < n; i++) order[i] = -7;
  char w2[160];
  snprintf(w2, sizeof(w2), "%s, packed", what);
  const int ovh = tu_int(&rng, 0, 2) ? tu_int(&rng, 1, 6) : 0; /* 0: the default, TU_SPLIT_OVERHEAD */
  total = kva_split_schedule_packed(n, kv, block, nw, slack, ovh, work, indptr, order, keys, nxt);
  bad |= tu_check_schedule(n, kv, block, nw, slack, work, indptr, total, order,
                        ovh ? ovh : TU_SPLIT_OVERHEAD, w2);
  /* and the costed walk, at random prices (0 included) */
  for (int w = 0; w < nw; w++) work[w].begin_req = work[w].end_req = -7;
  for (int i = 0; i <= n; i++) indptr[i] = -7;
  for (int i = 0; i < n; i++) order[i] = -7;
  kva_split_costs costs = {tu_int(&rng, 0, 80), tu_int(&rng, 0, 40), tu_int(&rng, 0, 60), tu_int(&rng, 0, 200),
                           tu_int(&rng, 0, 60), tu_int(&rng, 0, 8)};
  if (tu_int(&rng, 0, 3) == 0)
    costs.chunk = costs.partial = costs.merge = costs.merge_many = costs.margin = costs.min_head = 0;
  snprintf(w2, sizeof(w2), "%s, costed %d/%d/%d/%d/%d/%d", what, costs.chunk, costs.partial,
           costs.merge, costs.merge_many, costs.margin, costs.min_head);
  total = kva_split_schedule_costed(n, kv, block, nw, slack, &costs, work, indptr, order, keys, nxt);
  bad |= tu_check_schedule(n, kv, block, nw, -1, work, indptr, total, order, 0, w2);
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
    int n = it % 4 == 0 ? tu_int(&rng, 1, 8) : tu_int(&rng, 1, 512);
    int nw = it % 5 == 0 ? tu_int(&rng, 1, 4) : tu_int(&rng, 1, 300);
    int block = blocks[tu_int(&rng, 0, 6)];
    int mode = tu_int(&rng, 0, 4);
    int slack = it % 3 == 0 ? 0 : tu_int(&rng, 0, 8);
    for (int r = 0; r < n; r++) {
      switch (mode) {
        case 0: kv[r] = tu_int(&rng, 1, 131072); break;             /* long */
        case 1: kv[r] = tu_int(&rng, 1, 300); break;                /* short */
        case 2: kv[r] = tu_int(&rng, 0, 4) == 0 ? 0 : tu_int(&rng, 1, 131072); break; /* extend holes */
        case 3: kv[r] = r == 0 ? tu_int(&rng, 65536, 131072) : tu_int(&rng, 1, 64); break; /* skew */
        default: kv[r] = tu_int(&rng, 0, 1) ? tu_int(&rng, 1, 16) : tu_int(&rng, 4096, 131072); break;
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
    CHECK(total >= 120 && total <= 132, "128k keys over 132 workers: %d splits", total);
    total = kva_split_schedule(1, kv, NULL, 64, 132, 6, work, indptr);
    CHECK(total >= 110 && total <= 132, "128k keys over 132 workers, slack 6: %d splits", total);
  }
  {
    /* 128 equal requests that nearly fit one per worker: without slack each
     * is cut a block short of whole; one block of slack keeps them whole */
    kva_split_work work[132];
    int32_t eq[128], indptr[129];
    for (int r = 0; r < 128; r++) eq[r] = 8192;
    int total = kva_split_schedule(128, eq, NULL, 64, 132, 0, work, indptr);
    CHECK(total > 128, "128 x 8192 keys on 132 workers, no slack: %d splits", total);
    total = kva_split_schedule(128, eq, NULL, 64, 132, 1, work, indptr);
    CHECK(total == 128, "128 x 8192 keys on 132 workers, slack 1: %d splits, want 128", total);
    tu_check_schedule(128, eq, 64, 132, 1, work, indptr, total, NULL, TU_SPLIT_OVERHEAD, "128 x 8192, slack 1");
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
          double u1 = (tu_next(&rng) % 1000000 + 1) / 1000001.0, u2 = (tu_next(&rng) % 1000000) / 1e6;
          double x = L + L / 2.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
          vl[r] = x < 1 ? 1 : (int32_t)x;
        }
        int seq = kva_split_schedule(128, vl, NULL, 64, 132, 6, work, indptr);
        int seq3 = 0, pk3 = 0;
        for (int r = 0; r < 128; r++) seq3 += indptr[r + 1] - indptr[r] >= 3;
        /* the CUDA backend's slack and overhead at 64 rows */
        int pk = kva_split_schedule_packed(128, vl, 64, 132, 6, 4, work, indptr, order, keys, nxt);
        for (int r = 0; r < 128; r++) pk3 += indptr[r + 1] - indptr[r] >= 3;
        tu_check_schedule(128, vl, 64, 132, 6, work, indptr, pk, order, 4, "varlen 128, packed");
        CHECK((pk - 128) * 4 <= (seq - 128) * 3,
              "varlen 128 x N(%d, %d): packed %d cuts, in order %d", L, L / 2, pk - 128,
              seq - 128);
        CHECK(pk3 <= seq3, "varlen 128 x N(%d, %d): %d requests of 3+ chunks packed, %d in order",
              L, L / 2, pk3, seq3);
        /* the costed walk at the CUDA backend's 64-row prices: no longer
         * under its own model than the packed walk, and a third chunk only
         * for requests longer than two workers' share, less what their
         * chunks reserve for the merge */
        const kva_split_costs c64 = {38, 18, 29, 108, 29, 1};
        const int64_t pk_max = model_max(128, vl, 64, 132, work, indptr, order, &c64);
        int cs = kva_split_schedule_costed(128, vl, 64, 132, 6, &c64, work, indptr, order, keys, nxt);
        tu_check_schedule(128, vl, 64, 132, -1, work, indptr, cs, order, 0, "varlen 128, costed");
        const int64_t cs_max = model_max(128, vl, 64, 132, work, indptr, order, &c64);
        int64_t tot = 0;
        for (int r = 0; r < 128; r++) tot += ((int64_t)vl[r] + 63) / 64 * 16 + c64.chunk;
        int cs3 = 0, long3 = 0;
        for (int r = 0; r < 128; r++) {
          cs3 += indptr[r + 1] - indptr[r] >= 3;
          long3 += ((int64_t)vl[r] + 63) / 64 * 16 > 2 * (tot / 132 - c64.chunk - c64.merge_many);
        }
        CHECK(cs_max <= pk_max, "varlen 128 x N(%d, %d): costed walk's longest worker %lld > "
              "packed %lld (1/16 blocks)", L, L / 2, (long long)cs_max, (long long)pk_max);
        CHECK(cs3 <= long3, "varlen 128 x N(%d, %d): %d requests of 3+ chunks, %d longer than "
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

int main(void) {
  test_schedule();
  return tu_summary("test_split_schedule");
}
