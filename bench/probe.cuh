/* Shared by the GPU probes in bench/ (one-off measurements, not tests):
 * every CUDA call checked, the first failure printed and fatal. */
#ifndef KVA_BENCH_PROBE_CUH
#define KVA_BENCH_PROBE_CUH

#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

/* Wall time of the work queued on the default stream between start and
 * stop, in ms (events created at start, destroyed at stop). */
typedef struct probe_timer {
  cudaEvent_t e0, e1;
} probe_timer;
static inline void probe_timer_start(probe_timer *t) {
  CHECK(cudaEventCreate(&t->e0));
  CHECK(cudaEventCreate(&t->e1));
  CHECK(cudaEventRecord(t->e0));
}
static inline float probe_timer_stop_ms(probe_timer *t) {
  float ms = 0;
  CHECK(cudaEventRecord(t->e1));
  CHECK(cudaEventSynchronize(t->e1));
  CHECK(cudaEventElapsedTime(&ms, t->e0, t->e1));
  CHECK(cudaEventDestroy(t->e0));
  CHECK(cudaEventDestroy(t->e1));
  return ms;
}

#endif
