/* Decode-kernel timeline for `kvattn bench` (KVA_DEC_TRACE=FILE; see dec_trace.c). */
#ifndef KVA_DEC_TRACE_H
#define KVA_DEC_TRACE_H

#include "kvattn.h"

/* Without KVA_DEC_TRACE in the environment: returns 0 at once. Otherwise
 * reps more launches (layers in turn) with the timeline on, written to the
 * file; 0 on success. */
int bench_dec_trace(kva_context *ctx, kva_plan *plan, kva_pool *pool, int layers,
                    const kva_attn_params *ap, const void *q, void *out, kva_dtype dtype,
                    int reps);

#endif
