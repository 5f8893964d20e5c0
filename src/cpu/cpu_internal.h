/* CPU backend internals shared by its files (and by tests that force the
 * portable kernels). */
#ifndef KVA_CPU_INTERNAL_H
#define KVA_CPU_INTERNAL_H

#include "core/internal.h"
#include "cpu/threadpool.h"

typedef struct kva_cpu_state {
  kva_threadpool *pool;
  int simd; /* AVX2 kernels; off with KVA_CPU_SCALAR=1 or kva_cpu_set_simd(ctx, 0) */
} kva_cpu_state;

static inline kva_cpu_state *kva_cpu_state_of(const kva_context *ctx) {
  return (kva_cpu_state *)ctx->backend_state;
}

/* Picks the AVX2 kernels (enable = 1) or the portable C ones (0) for every
 * later call on this CPU context. KVA_ERR_UNSUPPORTED if enable is asked on a
 * CPU without AVX2+FMA+F16C, KVA_ERR_INVALID_ARGUMENT for a non-CPU context. */
kva_status kva_cpu_set_simd(kva_context *ctx, int enable);
/* 1 if the context runs the AVX2 kernels, 0 if not, -1 for a non-CPU context. */
int kva_cpu_get_simd(const kva_context *ctx);

/* Per-plan scratch (plan->backend_plan): sized from the plan's capacities at
 * kva_plan_create so that attention allocates nothing. */
kva_status kva_cpu_plan_init(kva_plan *plan);
void kva_cpu_plan_free(kva_plan *plan);

kva_status kva_cpu_store_kv(kva_plan *plan, kva_pool *pool, int layer, const void *k,
                            const void *v, kva_dtype dtype);
kva_status kva_cpu_copy_slots(kva_pool *pool, int count, const int32_t *src, const int32_t *dst);
kva_status kva_cpu_attention(kva_plan *plan, const kva_pool *pool, int layer,
                             const kva_attn_params *params, const void *q, void *o, float *lse,
                             kva_dtype dtype);
/* MLA decode (cpu_mla.c), called by kva_cpu_attention for MLA pools with
 * the plan's scratch: thread_bytes per thread, at least
 * kva_cpu_mla_scratch_bytes(min(max_q_tokens, 8) * num_qo_heads). */
size_t kva_cpu_mla_scratch_bytes(int max_rows);
kva_status kva_cpu_mla_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                 const kva_attn_params *params, const void *q, void *o,
                                 float *lse, kva_dtype dtype, unsigned char *scratch,
                                 size_t thread_bytes);
kva_status kva_cpu_merge_states(kva_context *ctx, int num_tokens, int num_heads, int head_dim,
                                kva_dtype dtype, const void *v_a, const float *s_a,
                                const void *v_b, const float *s_b, void *v_out, float *s_out);

/* Merges n states over disjoint key sets: state j has f32 O row
 * o + j * o_stride (d floats) and LSE lse[j * lse_stride]. Writes the merged
 * row to out (dtype) and its LSE to *lse_out (may be NULL). LSE -inf = no
 * keys; if every state is -inf the row is 0 and the LSE -inf. d <= 576. */
void kva_cpu_merge_rows(int n, int d, const float *o, size_t o_stride, const float *lse,
                        size_t lse_stride, void *out, kva_dtype dtype, float *lse_out);

/* Decode request r's split-KV chunks merged into O (and LSE) for its
 * num_new tokens x hq heads of dv dims; nothing to do for one chunk. The
 * combine step of both the MHA and the MLA decode paths. */
void kva_cpu_combine_request(const kva_plan *p, int r, int hq, int dv, void *o, float *lse,
                             kva_dtype dtype);

#endif
