/* CPU backend internals shared by its files. */
#ifndef KVA_CPU_INTERNAL_H
#define KVA_CPU_INTERNAL_H

#include "core/internal.h"
#include "cpu/threadpool.h"

typedef struct kva_cpu_state {
  kva_threadpool *pool;
  int simd; /* AVX2 row kernels (off with KVA_CPU_SCALAR=1 in the environment) */
} kva_cpu_state;

static inline kva_cpu_state *kva_cpu_state_of(const kva_context *ctx) {
  return (kva_cpu_state *)ctx->backend_state;
}

kva_status kva_cpu_store_kv(kva_plan *plan, kva_pool *pool, int layer, const void *k,
                            const void *v, kva_dtype dtype);
kva_status kva_cpu_copy_slots(kva_pool *pool, int count, const int32_t *src, const int32_t *dst);
kva_status kva_cpu_attention(kva_plan *plan, const kva_pool *pool, int layer,
                             const kva_attn_params *params, const void *q, void *o, float *lse,
                             kva_dtype dtype);
kva_status kva_cpu_merge_states(kva_context *ctx, int num_tokens, int num_heads, int head_dim,
                                kva_dtype dtype, const void *v_a, const float *s_a,
                                const void *v_b, const float *s_b, void *v_out, float *s_out);
/* Merge n states (f32 rows of d, LSEs) into out (dtype) and lse_out (may be NULL). */
void kva_cpu_merge_rows(int n, int d, const float *const *rows, const float *lses, void *out,
                        kva_dtype dtype, float *lse_out);

#endif
