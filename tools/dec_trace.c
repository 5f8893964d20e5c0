/* KVA_DEC_TRACE=FILE: `kvattn bench --device cuda --mode decode` runs its
 * timed launches once more with the decode kernel stamping a per-CTA
 * timeline (%globaltimer, ns) and writes the last two launches to FILE
 * (scripts/dec_trace.py reads it): where a step's fixed cost goes (start
 * spread, first tile, tail, split merge). Diagnostics only; the stamps cost
 * one untaken branch when off. */
#include "dec_trace.h"

#include <stdio.h>
#include <stdlib.h>

#ifdef KVA_WITH_CUDA
#include <cuda_runtime.h>

#include "cli_common.h"

#include "cuda/trace.h" /* internal; not in kvattn.h */
#define TRACE_WORDS KVA_TRACE_WORDS

int bench_dec_trace(kva_context *ctx, kva_plan *plan, kva_pool *pool, int layers,
                    const kva_attn_params *ap, const void *q, void *out, kva_dtype dtype,
                    int reps) {
  const char *path = getenv("KVA_DEC_TRACE");
  if (!path || !*path) return 0;
  kva_plan_info info;
  CLI_TRY(kva_plan_get_info(plan, &info));
  const int ctas = 1 << 16; /* >= num_workers x grid rows of any bench shape */
  const size_t words = (size_t)2 * ctas * TRACE_WORDS;
  unsigned long long *d = NULL, *h = (unsigned long long *)calloc(words, 8);
  if (!h || cudaMalloc((void **)&d, words * 8) != cudaSuccess) {
    fprintf(stderr, "kvattn bench: KVA_DEC_TRACE: no memory for the trace\n");
    free(h);
    return 1;
  }
  int rc = 1;
  if (cudaMemset(d, 0, words * 8) != cudaSuccess) goto done;
  kva_trace_buf = d;
  kva_trace_ctas = ctas;
  kva_trace_launches = 0;
  for (int r = 0; r < reps; r++)
    if (kva_attention(plan, pool, r % layers, ap, q, out, NULL, dtype) != KVA_OK) {
      fprintf(stderr, "kvattn bench: KVA_DEC_TRACE: %s\n", kva_last_error());
      goto done;
    }
  if (kva_synchronize(ctx) != KVA_OK ||
      cudaMemcpy(h, d, words * 8, cudaMemcpyDeviceToHost) != cudaSuccess)
    goto done;
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "kvattn bench: KVA_DEC_TRACE: cannot write %s\n", path);
    goto done;
  }
  /* launch 0 = the one before the last, 1 = the last */
  const unsigned last = (kva_trace_launches - 1) & 1u;
  /* prefill (ws kernel, KVA_EXT_TRACE build): the words of extend_ws.cuh */
  fprintf(f, "# launch cta t_entry t_wait t_tile0 t_loop_end t_partial t_counted t_fenced "
             "t_merged t_end smid chunks merges (workers %d, launches %u; prefill: see "
             "extend_ws.cuh)\n",
          info.num_workers, kva_trace_launches);
  /* the schedule, so that each CTA's time can be set against its work:
   * "#w worker request k0 k1 split nsplit" per chunk */
  for (int w = 0; w < info.num_workers; w++) {
    const kva_split_work *wk = &info.split_schedule[w];
    for (int i = wk->begin_req; i <= wk->end_req; i++) {
      const int r = info.sched_order[i];
      const int ns = info.split_indptr[r + 1] - info.split_indptr[r];
      if (ns == 0) continue;
      const kva_split_chunk ch = kva_split_work_chunk(wk, i, info.cache_seqlens[r]);
      fprintf(f, "#w %d %d %d %d %d %d\n", w, r, ch.k0, ch.k1, ch.split, ns);
    }
  }
  for (int l = 0; l < 2; l++) {
    const unsigned half = l == 1 ? last : last ^ 1u;
    for (int c = 0; c < ctas; c++) {
      const unsigned long long *w = h + ((size_t)half * ctas + c) * TRACE_WORDS;
      if (w[0] == 0) continue; /* no such CTA */
      fprintf(f, "%d %d", l, c);
      for (int i = 0; i < TRACE_WORDS; i++) fprintf(f, " %llu", w[i]);
      fputc('\n', f);
    }
  }
  fclose(f);
  fprintf(stderr, "kvattn bench: kernel timeline of the last 2 of %u launches -> %s\n",
          kva_trace_launches, path);
  rc = 0;
done:
  kva_synchronize(ctx);
  kva_trace_buf = NULL;
  cudaFree(d);
  free(h);
  return rc;
}
#else
int bench_dec_trace(kva_context *ctx, kva_plan *plan, kva_pool *pool, int layers,
                    const kva_attn_params *ap, const void *q, void *out, kva_dtype dtype,
                    int reps) {
  (void)ctx, (void)plan, (void)pool, (void)layers, (void)ap, (void)q, (void)out, (void)dtype,
      (void)reps;
  if (getenv("KVA_DEC_TRACE")) fprintf(stderr, "kvattn bench: KVA_DEC_TRACE needs CUDA\n");
  return 0;
}
#endif
