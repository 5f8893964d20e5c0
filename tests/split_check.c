/* The split-schedule checker shared by test_split_schedule and
 * test_planner (declared in testutil.h). */
#include <stdio.h>
#include <stdlib.h>

#include "core/internal.h"
#include "testutil.h"

int tu_check_schedule(int n, const int32_t *kv, int block, int nw, int slack,
                      const kva_split_work *work, const int32_t *indptr, int total,
                      const int32_t *order, int ovh, const char *what) {
  int f0 = tu_failures;
  CHECK(indptr[0] == 0, "%s: split_indptr[0] = %d", what, indptr[0]);
  if (order) { /* a permutation */
    char *seen = (char *)calloc((size_t)n + 1, 1);
    for (int i = 0; i < n && tu_failures == f0; i++) {
      CHECK(order[i] >= 0 && order[i] < n && !seen[order[i]], "%s: order[%d] = %d", what, i,
            order[i]);
      if (tu_failures == f0) seen[order[i]] = 1;
    }
    free(seen);
    if (tu_failures != f0) return 1;
  }
#define ORD(i) (order ? order[i] : (i))
  int64_t T = 0;
  int nonempty = 0;
  for (int r = 0; r < n; r++) {
    int s = indptr[r + 1] - indptr[r];
    if (kv[r] > 0) {
      CHECK(s >= 1, "%s: request %d (kv %d) has %d splits", what, r, kv[r], s);
      T += (kv[r] + block - 1) / block + ovh;
      nonempty++;
    } else {
      CHECK(s == 0, "%s: empty request %d has %d splits", what, r, s);
    }
  }
  CHECK(indptr[n] == total, "%s: split_indptr[n] = %d, returned %d", what, indptr[n], total);
  if (tu_failures != f0) return 1;
  int64_t payload = (T + nw - 1) / nw + ovh;

  /* chunk j of request r: [lo, hi) and the worker that owns it */
  int32_t *lo = (int32_t *)malloc(((size_t)total + 1) * sizeof(int32_t));
  int32_t *hi = (int32_t *)malloc(((size_t)total + 1) * sizeof(int32_t));
  int32_t *owner = (int32_t *)malloc(((size_t)total + 1) * sizeof(int32_t));
  for (int i = 0; i < total; i++) owner[i] = -1;
  int64_t spent = 0;
  int seen_idle = 0;
  for (int w = 0; w < nw && tu_failures == f0; w++) {
    const kva_split_work *k = &work[w];
    if (k->begin_req > k->end_req) {
      seen_idle = 1;
      continue;
    }
    CHECK(!seen_idle, "%s: worker %d busy after an idle worker", what, w);
    CHECK(k->begin_req >= 0 && k->end_req < n, "%s: worker %d requests %d..%d of %d", what, w,
          k->begin_req, k->end_req, n);
    if (tu_failures != f0) break;
    CHECK(kv[ORD(k->begin_req)] > 0 && kv[ORD(k->end_req)] > 0,
          "%s: worker %d starts or ends on an empty request", what, w);
    int64_t cost = 0;
    for (int i = k->begin_req; i <= k->end_req && tu_failures == f0; i++) {
      const int r = ORD(i);
      if (kv[r] <= 0) continue; /* consumers skip zero-split requests */
      const kva_split_chunk ch = kva_split_work_chunk(k, i, kv[r]);
      const int a = ch.k0, b = ch.k1, j = ch.split;
      int s = indptr[r + 1] - indptr[r];
      CHECK(a % block == 0, "%s: worker %d request %d starts at %d, block %d", what, w, r, a,
            block);
      CHECK(b == kv[r] || b % block == 0, "%s: worker %d request %d ends at %d, block %d", what,
            w, r, b, block);
      CHECK(0 <= a && a < b && b <= kv[r], "%s: worker %d request %d chunk [%d,%d) of %d", what,
            w, r, a, b, kv[r]);
      CHECK(j >= 0 && j < s, "%s: worker %d request %d split %d of %d", what, w, r, j, s);
      if (tu_failures != f0) break;
      int id = indptr[r] + j;
      CHECK(owner[id] == -1, "%s: split %d of request %d owned by workers %d and %d", what, j, r,
            owner[id], w);
      owner[id] = w;
      lo[id] = a;
      hi[id] = b;
      cost += (b - a + block - 1) / block + ovh;
    }
    if (slack >= 0) /* < 0: the costed walk, priced otherwise */
      CHECK(cost <= payload + slack, "%s: worker %d cost %lld > payload %lld + slack %d", what,
            w, (long long)cost, (long long)payload, slack);
    spent += cost;
  }
  /* chunks of each request tile [0, kv) in split order: every key once */
  for (int r = 0; r < n && tu_failures == f0; r++) {
    int32_t pos = 0;
    for (int id = indptr[r]; id < indptr[r + 1]; id++) {
      CHECK(owner[id] >= 0, "%s: split %d of request %d has no worker", what, id - indptr[r], r);
      if (owner[id] < 0) break;
      CHECK(lo[id] == pos, "%s: request %d split %d starts at %d, want %d", what, r,
            id - indptr[r], lo[id], pos);
      pos = hi[id];
      if (id > indptr[r])
        CHECK(owner[id] > owner[id - 1], "%s: request %d splits not in worker order", what, r);
    }
    if (kv[r] > 0) CHECK(pos == kv[r], "%s: request %d covered to %d of %d", what, r, pos, kv[r]);
  }
  /* every block and every chunk's overhead is paid by exactly one worker */
  if (tu_failures == f0 && slack >= 0)
    CHECK(spent == T + (int64_t)ovh * (total - nonempty),
          "%s: workers spent %lld, want %lld", what, (long long)spent,
          (long long)(T + (int64_t)ovh * (total - nonempty)));
  free(lo);
  free(hi);
  free(owner);
#undef ORD
  return tu_failures != f0;
}

/* A schedule's longest worker under `c` (1/16 blocks): each chunk costs
 * its blocks and c->chunk, ending at the worker's running sum; of a split
 * request, the chunk that ends last merges (c->merge for two chunks,
 * c->merge_many for more) and the others write partial rows. */
