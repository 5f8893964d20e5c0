#include "gpu_timer.h"

#include <stdio.h>

#ifdef KVA_WITH_CUDA
#include <cuda_runtime.h>

#include "cli_common.h"
#include "core/internal.h"

static cudaEvent_t ev_begin, ev_end;
static int events_made;

static int ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 1;
  fprintf(stderr, "kvattn bench: %s: %s\n", what, cudaGetErrorString(e));
  return 0;
}

double cli_gpu_copy_ceiling_gbps(kva_context *ctx, int warm_ms) {
  size_t n = (size_t)1 << 30;
  void *a = NULL, *b = NULL;
  if (kva_malloc(ctx, n, &a) != KVA_OK || kva_malloc(ctx, n, &b) != KVA_OK) {
    kva_free(ctx, a);
    return 0;
  }
  cudaStream_t s = (cudaStream_t)ctx->stream;
  double ms_sorted[10];
  int good = ok(cudaMemsetAsync(a, 1, n, s), "cudaMemsetAsync");
  /* 3 copies of warm-up, or as many as warm_ms takes (synced every 8) */
  const double t0 = cli_now();
  for (int w = 0; good && (w < 3 || cli_now() - t0 < warm_ms * 1e-3); w++) {
    good = ok(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    if (good && w % 8 == 7) good = ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }
  for (int i = 0; i < 10 && good; i++) {
    double ms;
    good = cli_gpu_time_begin(ctx) == 0 &&
           ok(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync") &&
           cli_gpu_time_end(ctx, &ms) == 0;
    int j = i;
    while (good && j > 0 && ms_sorted[j - 1] > ms) {
      ms_sorted[j] = ms_sorted[j - 1];
      j--;
    }
    if (good) ms_sorted[j] = ms;
  }
  kva_free(ctx, a);
  kva_free(ctx, b);
  return good ? 2.0 * (double)n / (ms_sorted[5] * 1e-3) / 1e9 : 0;
}

int cli_gpu_time_begin(kva_context *ctx) {
  if (!events_made) {
    if (!ok(cudaEventCreate(&ev_begin), "cudaEventCreate") || !ok(cudaEventCreate(&ev_end), "cudaEventCreate")) return 1;
    events_made = 1;
  }
  return ok(cudaEventRecord(ev_begin, (cudaStream_t)ctx->stream), "cudaEventRecord") ? 0 : 1;
}

int cli_gpu_time_end(kva_context *ctx, double *ms) {
  float f = 0;
  if (!ok(cudaEventRecord(ev_end, (cudaStream_t)ctx->stream), "cudaEventRecord") ||
      !ok(cudaEventSynchronize(ev_end), "cudaEventSynchronize") ||
      !ok(cudaEventElapsedTime(&f, ev_begin, ev_end), "cudaEventElapsedTime"))
    return 1;
  *ms = f;
  return 0;
}
#else
double cli_gpu_copy_ceiling_gbps(kva_context *ctx, int warm_ms) {
  (void)ctx;
  (void)warm_ms;
  return 0;
}
int cli_gpu_time_begin(kva_context *ctx) {
  (void)ctx;
  fprintf(stderr, "kvattn bench: this build has no CUDA\n");
  return 1;
}
int cli_gpu_time_end(kva_context *ctx, double *ms) {
  (void)ctx;
  *ms = 0;
  return 1;
}
#endif
