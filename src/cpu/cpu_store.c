/* New K/V into the pool (quantizing for fp8) and slot copies for forks. */
#include <string.h>

#include "core/dtype.h"
#include "cpu/cpu_internal.h"

static void store_buffer(const kva_pool *pool, void *dst_buf, float scale, const void *src,
                         kva_dtype src_dtype, int n, const int32_t *loc) {
  size_t te = pool->token_elems;
  kva_dtype kt = pool->cfg.kv_dtype;
  float inv = kt == KVA_FP8_E4M3 ? 1.0f / scale : 1.0f;
  for (int i = 0; i < n; i++) {
    size_t dst0 = (size_t)loc[i] * te, src0 = (size_t)i * te;
    for (size_t e = 0; e < te; e++) {
      float x = kva_load_f32(src, src0 + e, src_dtype);
      kva_store_f32(dst_buf, dst0 + e, kt, kt == KVA_FP8_E4M3 ? x * inv : x);
    }
  }
}

kva_status kva_cpu_store_kv(kva_plan *plan, kva_pool *pool, int layer, const void *k,
                            const void *v, kva_dtype dtype) {
  int n = plan->hdr.total_q;
  store_buffer(pool, pool->k[layer], pool->k_scale[layer], k, dtype, n, plan->out_cache_loc);
  if (v && pool->v[layer])
    store_buffer(pool, pool->v[layer], pool->v_scale[layer], v, dtype, n, plan->out_cache_loc);
  return KVA_OK;
}

kva_status kva_cpu_copy_slots(kva_pool *pool, int count, const int32_t *src, const int32_t *dst) {
  size_t tb = pool->token_elems * kva_dtype_size(pool->cfg.kv_dtype);
  for (int l = 0; l < pool->cfg.num_layers; l++)
    for (int b = 0; b < 2; b++) {
      unsigned char *buf = (unsigned char *)(b == 0 ? pool->k[l] : pool->v[l]);
      if (!buf) continue;
      for (int i = 0; i < count; i++)
        memmove(buf + (size_t)dst[i] * tb, buf + (size_t)src[i] * tb, tb);
    }
  return KVA_OK;
}
