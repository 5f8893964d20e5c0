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

#endif
