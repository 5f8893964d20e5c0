/* The costed walk's own model on `kvattn bench --mode mla`'s batches, on the
 * host (no GPU): per-worker loads in blocks, cuts, underfill, and a lower
 * bound on the capacity any chain of chunks could reach under the same
 * prices (every request too long for a worker cut once, none other, no
 * worker below the capacity).
 *
 *   build/walk_model L [sq] [chunk/partial/merge/many/margin/min_head] [slack] [-v]
 *
 * (built with the library; or cc -O2 -std=c11 -Isrc -Iinclude
 * bench/walk_model.c src/core/split_schedule.c -lm -o /tmp/walk_model).
 *
 * L: --ctx; lengths as the bench draws them for b = 128 with --varlen
 * (N(L, L/2) clipped at sq, its seed); prices in 1/16 blocks, default
 * v6's at 64 query rows (kva_cuda_mla_split_costs); 132 workers (the
 * H100's and the H200's SMs); page and block 64. -v prints every worker
 * (W whole request, H head of a cut one, R its rest, M a middle chunk). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "ref/rng.h"

#define B 128
#define W 132
#define BLOCK 64
#define U KVA_SPLIT_COST_UNIT

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s L [sq] [chunk/partial/merge/many/margin/min_head] [slack] [-v]\n",
            argv[0]);
    return 2;
  }
  const int L = atoi(argv[1]), sq = argc > 2 ? atoi(argv[2]) : 1;
  kva_split_costs c = {4 * U, 18, 29, 108, 29, 1}; /* 64 rows: 64/18/29/108/29/1 */
  if (argc > 3 && sscanf(argv[3], "%d/%d/%d/%d/%d/%d", &c.chunk, &c.partial, &c.merge,
                         &c.merge_many, &c.margin, &c.min_head) != 6) {
    fprintf(stderr, "prices: chunk/partial/merge/many/margin/min_head\n");
    return 2;
  }
  const int slack = argc > 4 ? atoi(argv[4]) : 6, verbose = argc > 5;
  /* tools/bench.c: cli_rng seeded 12345 + 1000003 B + L, bench_draw_len */
  kva_rng rng = {12345u + 1000003ull * B + (uint64_t)L};
  int32_t len[B];
  int64_t blocks = 0;
  for (int i = 0; i < B; i++) {
    const double x = L + kva_rng_normal(&rng) * L / 2.0;
    len[i] = x < sq ? sq : (int)x;
    blocks += (len[i] + BLOCK - 1) / BLOCK;
  }
  kva_split_work work[W];
  int32_t indptr[B + 1], order[B], nxt[B + 1];
  int64_t keys[B];
  const int splits = kva_split_schedule_costed(B, len, BLOCK, W, slack, &c, work, indptr, order,
                                               keys, nxt);
  int64_t max_load = 0, sum_load = 0;
  for (int w = 0; w < W; w++) {
    const kva_split_work *wk = &work[w];
    int64_t load = 0;
    char desc[512] = "";
    for (int p = wk->begin_req; p <= wk->end_req; p++) {
      const int r = order[p];
      const kva_split_chunk k = kva_split_work_chunk(wk, p, len[r]);
      const int64_t b = ((int64_t)k.k1 - k.k0 + BLOCK - 1) / BLOCK;
      const int n = indptr[r + 1] - indptr[r], first = k.k0 == 0, last = k.k1 == len[r];
      const char kind = n == 1 ? 'W' : first ? 'H' : last ? 'R' : 'M';
      /* what the walk charges (split_schedule.c): a head merges before its
       * write, a rest writes partial rows; chunks of three or more
       * requests, or ends the walk found late, pay the merge from global
       * memory, which this sum leaves out */
      load += b * U + c.chunk + (kind == 'H' ? c.merge : kind == 'W' ? 0 : c.partial);
      char s[24];
      snprintf(s, sizeof s, "%c%lld ", kind, (long long)b);
      if (strlen(desc) + strlen(s) < sizeof desc) strcat(desc, s);
    }
    sum_load += load;
    if (load > max_load) max_load = load;
    if (verbose) printf("w%3d %6.1f  %s\n", w, load / (double)U, desc);
  }
  /* the bound: at capacity T every request of more than T - chunk blocks
   * needs a cut, which costs at least a chunk, a partial write and a merge */
  double bound = 0;
  int bound_cuts = 0;
  const double cut = (c.chunk + c.partial + c.merge) / (double)U;
  for (double T = 1; T < 1e6; T += 0.1) {
    int need = 0;
    for (int i = 0; i < B; i++)
      if ((len[i] + BLOCK - 1) / BLOCK + c.chunk / (double)U > T) need++;
    const double mean = (blocks + B * c.chunk / (double)U + need * cut) / W;
    if (mean <= T) {
      bound = T;
      bound_cuts = need;
      break;
    }
  }
  printf("L=%d sq=%d: %lld blocks, %d chunks (%d cuts); walk: max %.1f, mean %.1f blocks a "
         "worker (underfill %.1f%%); bound %.1f (%d cuts): the walk %.1f%% above it\n",
         L, sq, (long long)blocks, splits, splits - B, max_load / (double)U,
         sum_load / (double)U / W, 100.0 * (1 - (double)sum_load / W / max_load), bound,
         bound_cuts, 100.0 * (max_load / (double)U / bound - 1));
  return 0;
}
