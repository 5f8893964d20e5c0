/* Public per-layer entry points: validate, then hand to the backend (or to
 * the CPU graph recorder while a capture is open). Backends may assume valid
 * arguments. */
#include <math.h>

#include "core/internal.h"

kva_attn_params kva_attn_params_default(void) {
  kva_attn_params p;
  p.sm_scale = 0.0f;
  p.causal = 1;
  p.window_left = -1;
  p.logit_softcap = 0.0f;
  return p;
}

/* Q/O and new-KV source dtypes. FP8 is storage only. */
static kva_status check_act_dtype(kva_dtype dtype, const char *fn) {
  switch (dtype) {
    case KVA_F32:
    case KVA_F16:
    case KVA_BF16: return KVA_OK;
    case KVA_FP8_E4M3:
      return kva_set_error(KVA_ERR_UNSUPPORTED,
                           "%s: dtype fp8 is KV storage only; use f32, f16 or bf16", fn);
  }
  return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: dtype %d is not a kva_dtype", fn,
                       (int)dtype);
}

/* A plan reads only page ids (checked against num_pages) and sizes, so any
 * pool laid out like its own will do: one plan per step serves every layer
 * of an engine that keeps one caller-owned pool per layer (FlashInfer's
 * plan once, run per layer). */
static int same_geometry(const kva_pool_config *a, const kva_pool_config *b) {
  return a->layout == b->layout && a->num_pages == b->num_pages &&
         a->page_size == b->page_size && a->num_kv_heads == b->num_kv_heads &&
         a->head_dim == b->head_dim && a->kv_dtype == b->kv_dtype;
}

/* The plan has a batch (or a graph capture records calls for a later one),
 * pool is the plan's pool or one of its geometry, and layer is one of the
 * pool's layers. */
static kva_status check_plan_pool_layer(const kva_plan *plan, const kva_pool *pool, int layer,
                                        const char *fn) {
  if (pool != plan->pool && !same_geometry(&pool->cfg, &plan->pool->cfg))
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: pool is neither the plan's pool nor one of its geometry (layout, "
                         "pages, page size, kv heads, head dim, kv dtype)",
                         fn);
  if (layer < 0 || layer >= pool->cfg.num_layers)
    return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: layer %d is not in [0, %d)", fn, layer,
                         pool->cfg.num_layers);
  if (!plan->valid && !plan->capturing)
    return kva_set_error(KVA_ERR_STATE, "%s: the plan has no batch (kva_plan_update)", fn);
  return KVA_OK;
}

kva_status kva_store_kv(kva_plan *plan, kva_pool *pool, int layer, const void *k, const void *v,
                        kva_dtype dtype) {
  static const char *fn = "kva_store_kv";
  KVA_CHECK_NULL(plan, fn);
  KVA_CHECK_NULL(pool, fn);
  KVA_CHECK_NULL(k, fn);
  kva_status st = check_plan_pool_layer(plan, pool, layer, fn);
  if (st != KVA_OK) return st;
  if (pool->cfg.layout == KVA_LAYOUT_MLA) {
    if (v != NULL)
      return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                           "%s: v must be NULL for an MLA pool (k holds the 576-dim latent)", fn);
  } else {
    KVA_CHECK_NULL(v, fn);
  }
  st = check_act_dtype(dtype, fn);
  if (st != KVA_OK) return st;
  if (plan->recorder) return kva_graph_record_store(plan->recorder, pool, layer, k, v, dtype);
  const kva_backend *be = plan->ctx->backend;
  if (!be->store_kv)
    return kva_set_error(KVA_ERR_UNSUPPORTED, "%s: backend %s has no store_kv", fn, be->name);
  return be->store_kv(plan, pool, layer, k, v, dtype);
}

static kva_status check_params(const kva_attn_params *params, const char *fn) {
  if (!isfinite(params->sm_scale) || params->sm_scale < 0.0f)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: params->sm_scale must be finite and >= 0 (0 = 1/sqrt(head_dim)), "
                         "got %g",
                         fn, (double)params->sm_scale);
  if (!isfinite(params->logit_softcap) || params->logit_softcap < 0.0f)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: params->logit_softcap must be finite and >= 0 (0 = off), got %g",
                         fn, (double)params->logit_softcap);
  /* window_left: any negative value means no window (kvattn.h); causal: any
   * nonzero value means causal. Neither has an invalid value. */
  return KVA_OK;
}

/* MLA is decode attention as FlashMLA's: q [total_q, hq, 576], o [total_q,
 * hq, 512], 1..8 query tokens per request, no window or soft-cap. */
static kva_status check_mla(const kva_plan *plan, const kva_attn_params *params, const char *fn) {
  if (params->window_left >= 0 || params->logit_softcap != 0.0f)
    return kva_set_error(KVA_ERR_UNSUPPORTED,
                         "%s: MLA attention has no sliding window or soft-cap (window_left %d, "
                         "logit_softcap %g)",
                         fn, params->window_left, (double)params->logit_softcap);
  if (!plan->capturing && plan->num_extend > 0)
    return kva_set_error(KVA_ERR_UNSUPPORTED,
                         "%s: MLA attention is decode only (<= %d new tokens per request); the "
                         "batch has %d extend requests",
                         fn, KVA_MAX_DECODE_Q, plan->num_extend);
  return KVA_OK;
}

kva_status kva_attention(kva_plan *plan, const kva_pool *pool, int layer,
                         const kva_attn_params *params, const void *q, void *o, float *lse,
                         kva_dtype dtype) {
  static const char *fn = "kva_attention";
  KVA_CHECK_NULL(plan, fn);
  KVA_CHECK_NULL(pool, fn);
  KVA_CHECK_NULL(params, fn);
  KVA_CHECK_NULL(q, fn);
  KVA_CHECK_NULL(o, fn);
  kva_status st = check_plan_pool_layer(plan, pool, layer, fn);
  if (st != KVA_OK) return st;
  st = check_act_dtype(dtype, fn);
  if (st != KVA_OK) return st;
  st = check_params(params, fn);
  if (st != KVA_OK) return st;
  if (pool->cfg.layout == KVA_LAYOUT_MLA) {
    st = check_mla(plan, params, fn);
    if (st != KVA_OK) return st;
  }
  /* kernels read Q while other workers write O */
  if ((const void *)o == q)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: o must not alias q", fn);
  if (plan->recorder)
    return kva_graph_record_attention(plan->recorder, pool, layer, params, q, o, lse, dtype);
  const kva_backend *be = plan->ctx->backend;
  if (!be->attention)
    return kva_set_error(KVA_ERR_UNSUPPORTED, "%s: backend %s has no attention", fn, be->name);
  return be->attention(plan, pool, layer, params, q, o, lse, dtype);
}

kva_status kva_merge_states(kva_context *ctx, int num_tokens, int num_heads, int head_dim,
                            kva_dtype dtype, const void *v_a, const float *s_a, const void *v_b,
                            const float *s_b, void *v_out, float *s_out) {
  static const char *fn = "kva_merge_states";
  KVA_CHECK_NULL(ctx, fn);
  KVA_CHECK_NULL(v_a, fn);
  KVA_CHECK_NULL(s_a, fn);
  KVA_CHECK_NULL(v_b, fn);
  KVA_CHECK_NULL(s_b, fn);
  KVA_CHECK_NULL(v_out, fn);
  if (num_tokens <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: num_tokens must be > 0 (got %d)", fn,
                         num_tokens);
  if (num_heads <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: num_heads must be > 0 (got %d)", fn,
                         num_heads);
  if (head_dim <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: head_dim must be > 0 (got %d)", fn,
                         head_dim);
  /* MLA merges its 512-dim V; nothing larger is a head */
  if (head_dim > KVA_MLA_HEAD_DIM)
    return kva_set_error(KVA_ERR_UNSUPPORTED, "%s: head_dim %d exceeds %d", fn, head_dim,
                         KVA_MLA_HEAD_DIM);
  /* kernels index elements with int32 */
  if ((int64_t)num_tokens * num_heads * head_dim > INT32_MAX)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: %d x %d x %d elements exceed int32 indexing", fn, num_tokens,
                         num_heads, head_dim);
  kva_status st = check_act_dtype(dtype, fn);
  if (st != KVA_OK) return st;
  if (!ctx->backend || !ctx->backend->merge_states)
    return kva_set_error(KVA_ERR_UNSUPPORTED, "%s: the context's backend has no merge_states",
                         fn);
  return ctx->backend->merge_states(ctx, num_tokens, num_heads, head_dim, dtype, v_a, s_a, v_b,
                                    s_b, v_out, s_out);
}
