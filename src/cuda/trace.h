/* Per-CTA timelines of the split-KV kernels (decode and MLA) for
 * `KVA_DEC_TRACE=FILE kvattn bench` (tools/dec_trace.c): diagnostics only.
 * The bench sets kva_trace_buf; the launchers then hand each launch one of
 * two halves of it (consecutive kernels can be compared), and thread 0 of
 * every CTA stamps KVA_TRACE_WORDS words: %globaltimer at 0 entry, 1 wait
 * return, 2 first tile, 3 key loop end, 4 partial written, 5 counted, 6 merge
 * start, 7 merge end, 8 exit; 9 SM id, 10 chunks, 11 merges. */
#ifndef KVA_CUDA_TRACE_H
#define KVA_CUDA_TRACE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVA_TRACE_WORDS 12
extern unsigned long long *kva_trace_buf; /* NULL: no timeline (always, in the library) */
extern int kva_trace_ctas;                /* CTAs of each half */
extern unsigned kva_trace_launches;       /* launches traced so far */

/* The next launch's record, or NULL (tracing off, or more CTAs than fit). */
static inline unsigned long long *kva_trace_next(long long ctas) {
  if (!kva_trace_buf || ctas > kva_trace_ctas) return NULL;
  return kva_trace_buf + (size_t)(kva_trace_launches++ & 1u) * kva_trace_ctas * KVA_TRACE_WORDS;
}

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus /* the kernels (nvcc, or g++ in the host emulators) */
/* Word w of this CTA's record, written by the thread for which `first`
 * holds (a.trace NULL: one untaken branch); KVA_TRACE_STAMP: by thread 0. */
#define KVA_TRACE_STAMP_BY(first, w, value)                                               \
  do {                                                                                    \
    if (a.trace && (first))                                                               \
      a.trace[((size_t)blockIdx.y * gridDim.x + blockIdx.x) * KVA_TRACE_WORDS + (w)] = (value); \
  } while (0)
#define KVA_TRACE_STAMP(w, value) KVA_TRACE_STAMP_BY(threadIdx.x == 0, w, value)
#endif

#endif /* KVA_CUDA_TRACE_H */
