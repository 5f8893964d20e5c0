/* Tile schedule of the extend path (host only, no CUDA calls): one tile per
 * (extend request, block of bm query tokens), heaviest first. */
#include <stdlib.h>

#include "cuda/extend.h"

/* Heaviest first; ties by request then tile for a deterministic order. */
static int ext_rec_cmp(const void *pa, const void *pb) {
  const kva_ext_rec *a = (const kva_ext_rec *)pa, *b = (const kva_ext_rec *)pb;
  if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
  if (a->req != b->req) return a->req < b->req ? -1 : 1;
  return (a->t0 > b->t0) - (a->t0 < b->t0);
}

int kva_ext_build_tiles(const kva_plan *plan, int bm, int cap, kva_ext_rec *recs, int32_t *tiles) {
  int n = 0;
  for (int e = 0; e < plan->num_extend; e++) {
    const int r = plan->extend_reqs[e];
    const int nn = plan->num_new[r], kv = plan->cache_seqlens[r];
    for (int t0 = 0; t0 < nn; t0 += bm) {
      if (n >= cap) return -1;
      const int last = t0 + bm < nn ? t0 + bm : nn;
      recs[n].cost = kv - nn + last; /* keys its last row sees when causal */
      recs[n].req = r;
      recs[n].t0 = t0;
      n++;
    }
  }
  qsort(recs, (size_t)n, sizeof(kva_ext_rec), ext_rec_cmp);
  for (int i = 0; i < n; i++) {
    tiles[2 * i] = recs[i].req;
    tiles[2 * i + 1] = recs[i].t0;
  }
  return n;
}
