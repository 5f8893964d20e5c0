/* KV page pool: per-layer K/V buffers on the device and a reference-counted
 * page allocator (refcount array + free stack, O(1) per page). */
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/internal.h"

static kva_status check_config(const kva_pool_config *c, const char *fn) {
  if (c->layout != KVA_LAYOUT_MHA && c->layout != KVA_LAYOUT_MLA)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->layout %d is not a kva_layout", fn,
                         (int)c->layout);
  if (c->num_layers <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->num_layers must be > 0 (got %d)",
                         fn, c->num_layers);
  if (c->num_pages <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->num_pages must be > 0 (got %d)", fn,
                         c->num_pages);
  if (c->page_size <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->page_size must be > 0 (got %d)", fn,
                         c->page_size);
  if (c->page_size > KVA_MAX_PAGE_SIZE)
    return kva_set_error(KVA_ERR_UNSUPPORTED, "%s: config->page_size %d exceeds %d", fn,
                         c->page_size, KVA_MAX_PAGE_SIZE);
  if (c->num_kv_heads <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->num_kv_heads must be > 0 (got %d)",
                         fn, c->num_kv_heads);
  if (c->head_dim <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->head_dim must be > 0 (got %d)", fn,
                         c->head_dim);
  if (c->layout == KVA_LAYOUT_MLA) {
    if (c->head_dim != KVA_MLA_HEAD_DIM || c->num_kv_heads != 1)
      return kva_set_error(KVA_ERR_UNSUPPORTED,
                           "%s: an MLA pool needs head_dim %d and num_kv_heads 1 (got %d, %d)", fn,
                           KVA_MLA_HEAD_DIM, c->head_dim, c->num_kv_heads);
  } else if (c->head_dim % 8 != 0 || c->head_dim > KVA_MAX_HEAD_DIM) {
    return kva_set_error(KVA_ERR_UNSUPPORTED,
                         "%s: config->head_dim %d must be a multiple of 8 and <= %d", fn,
                         c->head_dim, KVA_MAX_HEAD_DIM);
  }
  if (c->kv_dtype != KVA_F16 && c->kv_dtype != KVA_BF16 && c->kv_dtype != KVA_FP8_E4M3)
    return kva_set_error(KVA_ERR_UNSUPPORTED,
                         "%s: config->kv_dtype %s is not a KV storage type (f16, bf16, fp8)", fn,
                         kva_dtype_name(c->kv_dtype));
  /* slot ids are int32: page * page_size + offset */
  if ((int64_t)c->num_pages * c->page_size > INT32_MAX)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: num_pages * page_size (%d * %d) exceeds int32 slot ids", fn,
                         c->num_pages, c->page_size);
  return KVA_OK;
}

void kva_pool_destroy(kva_pool *pool) {
  if (!pool) return;
  for (int l = 0; l < pool->cfg.num_layers && !pool->external; l++) {
    if (pool->k) kva_free(pool->ctx, pool->k[l]);
    if (pool->v) kva_free(pool->ctx, pool->v[l]);
  }
  free(pool->k);
  free(pool->v);
  free(pool->k_scale);
  free(pool->v_scale);
  free(pool->refcount);
  free(pool->free_stack);
  free(pool);
}

/* The host side of a pool (config, scales, allocator); no buffers yet. */
static kva_status pool_new(kva_context *ctx, const kva_pool_config *config, const char *fn,
                           kva_pool **out) {
  *out = NULL;
  KVA_CHECK_NULL(ctx, fn);
  KVA_CHECK_NULL(config, fn);
  kva_status st = check_config(config, fn);
  if (st != KVA_OK) return st;
  size_t token_elems = (size_t)config->num_kv_heads * (size_t)config->head_dim;
  size_t page_bytes = token_elems * (size_t)config->page_size * kva_dtype_size(config->kv_dtype);
  if (page_bytes != 0 && (size_t)config->num_pages > SIZE_MAX / 4 / page_bytes)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: %d pages of %zu bytes overflow size_t", fn,
                         config->num_pages, page_bytes);

  kva_pool *pool = (kva_pool *)calloc(1, sizeof(*pool));
  if (!pool) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  pool->ctx = ctx;
  pool->cfg = *config;
  pool->token_elems = token_elems;
  pool->layer_bytes = page_bytes * (size_t)config->num_pages;
  int L = config->num_layers, P = config->num_pages;
  pool->k = (void **)calloc((size_t)L, sizeof(void *));
  pool->v = (void **)calloc((size_t)L, sizeof(void *));
  pool->k_scale = (float *)malloc((size_t)L * sizeof(float));
  pool->v_scale = (float *)malloc((size_t)L * sizeof(float));
  pool->refcount = (int32_t *)calloc((size_t)P, sizeof(int32_t));
  pool->free_stack = (int32_t *)malloc((size_t)P * sizeof(int32_t));
  if (!pool->k || !pool->v || !pool->k_scale || !pool->v_scale || !pool->refcount ||
      !pool->free_stack) {
    kva_pool_destroy(pool);
    return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  for (int l = 0; l < L; l++) pool->k_scale[l] = pool->v_scale[l] = 1.0f;
  /* pop order = ascending page ids */
  for (int i = 0; i < P; i++) pool->free_stack[i] = P - 1 - i;
  pool->num_free = P;
  *out = pool;
  return KVA_OK;
}

kva_status kva_pool_create(kva_context *ctx, const kva_pool_config *config, kva_pool **out) {
  static const char *fn = "kva_pool_create";
  KVA_CHECK_NULL(out, fn);
  *out = NULL;
  kva_pool *pool;
  kva_status st = pool_new(ctx, config, fn, &pool);
  if (st != KVA_OK) return st;
  size_t pool_bytes = pool->layer_bytes; /* per layer and buffer */
  int nbuf = config->layout == KVA_LAYOUT_MLA ? 1 : 2;
  for (int l = 0; l < config->num_layers; l++) {
    for (int b = 0; b < nbuf; b++) {
      void **dst = b == 0 ? &pool->k[l] : &pool->v[l];
      st = ctx->backend->mem_alloc(ctx, pool_bytes, dst);
      if (st == KVA_OK) st = ctx->backend->mem_zero(ctx, *dst, pool_bytes);
      if (st != KVA_OK) {
        kva_pool_destroy(pool);
        return kva_set_error(st, "%s: layer %d %s buffer of %zu bytes: %s", fn, l,
                             b == 0 ? "K" : "V", pool_bytes, kva_last_error());
      }
    }
  }
  *out = pool;
  return KVA_OK;
}

kva_status kva_pool_create_external(kva_context *ctx, const kva_pool_config *config,
                                    void *const *k_layers, void *const *v_layers,
                                    kva_pool **out) {
  static const char *fn = "kva_pool_create_external";
  KVA_CHECK_NULL(out, fn);
  *out = NULL;
  KVA_CHECK_NULL(ctx, fn);
  KVA_CHECK_NULL(config, fn);
  KVA_CHECK_NULL(k_layers, fn);
  if (config->layout == KVA_LAYOUT_MLA) {
    if (v_layers)
      return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                           "%s: v_layers must be NULL for an MLA pool (K holds the latent)", fn);
  } else {
    KVA_CHECK_NULL(v_layers, fn);
  }
  if (config->num_layers > 0) {
    /* kernels load 16-byte vectors from every buffer */
    for (int l = 0; l < config->num_layers; l++) {
      for (int b = 0; b < (v_layers ? 2 : 1); b++) {
        const void *ptr = b == 0 ? k_layers[l] : v_layers[l];
        if (!ptr)
          return kva_set_error(KVA_ERR_NULL_ARGUMENT, "%s: %s_layers[%d] is NULL", fn,
                               b == 0 ? "k" : "v", l);
        if ((uintptr_t)ptr % 16 != 0)
          return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                               "%s: %s_layers[%d] = %p is not 16-byte aligned", fn,
                               b == 0 ? "k" : "v", l, ptr);
      }
    }
  }
  kva_pool *pool;
  kva_status st = pool_new(ctx, config, fn, &pool);
  if (st != KVA_OK) return st;
  pool->external = 1;
  for (int l = 0; l < config->num_layers; l++) {
    pool->k[l] = k_layers[l];
    pool->v[l] = v_layers ? v_layers[l] : NULL;
  }
  *out = pool;
  return KVA_OK;
}

const kva_pool_config *kva_pool_get_config(const kva_pool *pool) { return pool ? &pool->cfg : NULL; }

static kva_status check_layer(const kva_pool *pool, int layer, const char *fn) {
  if (layer < 0 || layer >= pool->cfg.num_layers)
    return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: layer %d is not in [0, %d)", fn, layer,
                         pool->cfg.num_layers);
  return KVA_OK;
}

kva_status kva_pool_set_scale(kva_pool *pool, int layer, float k_scale, float v_scale) {
  static const char *fn = "kva_pool_set_scale";
  KVA_CHECK_NULL(pool, fn);
  kva_status st = check_layer(pool, layer, fn);
  if (st != KVA_OK) return st;
  if (!(k_scale > 0.0f) || !isfinite(k_scale) || !(v_scale > 0.0f) || !isfinite(v_scale))
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "%s: k_scale and v_scale must be finite and > 0 (got %g, %g)", fn,
                         (double)k_scale, (double)v_scale);
  pool->k_scale[layer] = k_scale;
  pool->v_scale[layer] = v_scale;
  return KVA_OK;
}

kva_status kva_pool_get_buffers(const kva_pool *pool, int layer, void **k, void **v) {
  static const char *fn = "kva_pool_get_buffers";
  KVA_CHECK_NULL(pool, fn);
  kva_status st = check_layer(pool, layer, fn);
  if (st != KVA_OK) return st;
  if (k) *k = pool->k[layer];
  if (v) *v = pool->v[layer];
  return KVA_OK;
}

/* ---- allocator ---------------------------------------------------------- */

int kva_pool_num_free_pages(const kva_pool *pool) { return pool ? pool->num_free : 0; }

kva_status kva_pool_alloc_pages(kva_pool *pool, int count, int32_t *pages) {
  static const char *fn = "kva_pool_alloc_pages";
  KVA_CHECK_NULL(pool, fn);
  if (count < 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: count must be >= 0 (got %d)", fn, count);
  if (count == 0) return KVA_OK;
  KVA_CHECK_NULL(pages, fn);
  if (count > pool->num_free)
    return kva_set_error(KVA_ERR_OUT_OF_PAGES, "%s: %d pages asked, %d free of %d", fn, count,
                         pool->num_free, pool->cfg.num_pages);
  for (int i = 0; i < count; i++) {
    int32_t p = pool->free_stack[--pool->num_free];
    pool->refcount[p] = 1;
    pages[i] = p;
  }
  return KVA_OK;
}

static kva_status check_page_id(const kva_pool *pool, int32_t page, const char *fn) {
  if (page < 0 || page >= pool->cfg.num_pages)
    return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: page %d is not in [0, %d)", fn, page,
                         pool->cfg.num_pages);
  return KVA_OK;
}

kva_status kva_pool_ref_page(kva_pool *pool, int32_t page) {
  static const char *fn = "kva_pool_ref_page";
  KVA_CHECK_NULL(pool, fn);
  kva_status st = check_page_id(pool, page, fn);
  if (st != KVA_OK) return st;
  /* sharing a free page would hand it out twice once it is allocated */
  if (pool->refcount[page] == 0)
    return kva_set_error(KVA_ERR_STATE, "%s: page %d is free (allocate it first)", fn, page);
  if (pool->refcount[page] == INT32_MAX)
    return kva_set_error(KVA_ERR_CAPACITY, "%s: page %d has too many users", fn, page);
  pool->refcount[page]++;
  return KVA_OK;
}

kva_status kva_pool_unref_page(kva_pool *pool, int32_t page) {
  static const char *fn = "kva_pool_unref_page";
  KVA_CHECK_NULL(pool, fn);
  kva_status st = check_page_id(pool, page, fn);
  if (st != KVA_OK) return st;
  if (pool->refcount[page] == 0)
    return kva_set_error(KVA_ERR_DOUBLE_FREE, "%s: page %d is already free", fn, page);
  if (--pool->refcount[page] == 0) pool->free_stack[pool->num_free++] = page;
  return KVA_OK;
}

int kva_pool_page_refcount(const kva_pool *pool, int32_t page) {
  if (!pool || page < 0 || page >= pool->cfg.num_pages) return -1;
  return pool->refcount[page];
}

kva_status kva_pool_check(const kva_pool *pool) {
  KVA_CHECK_NULL(pool, "kva_pool_check");
  int P = pool->cfg.num_pages;
  if (pool->num_free < 0 || pool->num_free > P)
    return kva_set_error(KVA_ERR_INTERNAL, "kva_pool_check: num_free %d not in [0, %d]",
                         pool->num_free, P);
  unsigned char *seen = (unsigned char *)calloc((size_t)P, 1);
  if (!seen) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_pool_check: out of host memory");
  kva_status st = KVA_OK;
  for (int i = 0; i < pool->num_free && st == KVA_OK; i++) {
    int32_t p = pool->free_stack[i];
    if (p < 0 || p >= P)
      st = kva_set_error(KVA_ERR_INTERNAL, "kva_pool_check: free list holds bad page %d", p);
    else if (seen[p])
      st = kva_set_error(KVA_ERR_INTERNAL, "kva_pool_check: page %d is on the free list twice", p);
    else if (pool->refcount[p] != 0)
      st = kva_set_error(KVA_ERR_INTERNAL, "kva_pool_check: free page %d has refcount %d", p,
                         pool->refcount[p]);
    else
      seen[p] = 1;
  }
  for (int p = 0; p < P && st == KVA_OK; p++) {
    if (pool->refcount[p] < 0)
      st = kva_set_error(KVA_ERR_INTERNAL, "kva_pool_check: page %d has refcount %d", p,
                         pool->refcount[p]);
    else if (pool->refcount[p] == 0 && !seen[p])
      st = kva_set_error(KVA_ERR_INTERNAL, "kva_pool_check: page %d is neither used nor free", p);
  }
  free(seen);
  return st;
}

/* ---- host read-back ----------------------------------------------------- */

kva_status kva_pool_read_tokens(const kva_pool *pool, int layer, int count, const int32_t *slots,
                                float *k_out, float *v_out) {
  static const char *fn = "kva_pool_read_tokens";
  KVA_CHECK_NULL(pool, fn);
  kva_status st = check_layer(pool, layer, fn);
  if (st != KVA_OK) return st;
  if (count < 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: count must be >= 0 (got %d)", fn, count);
  if (count == 0) return KVA_OK;
  KVA_CHECK_NULL(slots, fn);
  int64_t nslots = (int64_t)pool->cfg.num_pages * pool->cfg.page_size;
  for (int i = 0; i < count; i++)
    if (slots[i] < 0 || slots[i] >= nslots)
      return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: slots[%d] = %d is not in [0, %lld)", fn, i,
                           slots[i], (long long)nslots);
  /* Stage runs of consecutive slots (a page holds up to 256) so a device pool
   * takes one copy per run, not one per token. */
  size_t esz = kva_dtype_size(pool->cfg.kv_dtype), tok_bytes = pool->token_elems * esz;
  unsigned char *stage = (unsigned char *)malloc(tok_bytes * KVA_MAX_PAGE_SIZE);
  if (!stage) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  int fp8 = pool->cfg.kv_dtype == KVA_FP8_E4M3;
  for (int b = 0; b < 2 && st == KVA_OK; b++) {
    float *dst = b == 0 ? k_out : v_out;
    const unsigned char *buf = (const unsigned char *)(b == 0 ? pool->k[layer] : pool->v[layer]);
    if (!dst || !buf) continue;
    float scale = b == 0 ? pool->k_scale[layer] : pool->v_scale[layer];
    for (int i = 0; i < count && st == KVA_OK;) {
      int n = 1;
      while (i + n < count && n < KVA_MAX_PAGE_SIZE && slots[i + n] == slots[i] + n) n++;
      st = pool->ctx->backend->copy_to_host(pool->ctx, stage, buf + (size_t)slots[i] * tok_bytes,
                                            (size_t)n * tok_bytes);
      size_t elems = (size_t)n * pool->token_elems;
      float *o = dst + (size_t)i * pool->token_elems;
      for (size_t e = 0; st == KVA_OK && e < elems; e++) {
        float x = kva_load_f32(stage, e, pool->cfg.kv_dtype);
        o[e] = fp8 ? x * scale : x;
      }
      i += n;
    }
  }
  free(stage);
  return st;
}
