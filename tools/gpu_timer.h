/* CUDA timing helpers for kvattn bench (no-ops reporting failure without CUDA). */
#ifndef KVA_GPU_TIMER_H
#define KVA_GPU_TIMER_H

#include "kvattn.h"

/* Device-to-device copy of a 1 GiB buffer, bytes read + written per second
 * (median of 10 after warm-up; warm_ms > 0: after copying back to back that
 * long, as `kvattn bench --warm-ms` times its kernels); 0 on failure. */
double cli_gpu_copy_ceiling_gbps(kva_context *ctx, int warm_ms);
/* Event timing on the context's stream; 0 on success. */
int cli_gpu_time_begin(kva_context *ctx);
int cli_gpu_time_end(kva_context *ctx, double *ms);

#endif
