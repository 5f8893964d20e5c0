/* Extend (prefill) path: the tile schedule of a plan (built on the host,
 * uploaded on the context's stream) and the dispatch to the tensor-core
 * kernels (extend_dN.cu) or, for what they do not cover, the CUDA-core
 * fallback. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/extend.h"
#include "cuda/trace.h"

/* Device block: [0] = number of tiles, [1..3] padding, then int2 tiles. */
#define EXT_HDR_INTS 4

typedef struct kva_ext_plan {
  int bm; /* query rows per tile of the schedule; 0: no tensor-core head dim. mma.sync's
           * KVA_EXT_BM(d), or KVA_WS_TILE_ROWS where the plan's pool runs the ws kernel */
  int cap_tiles;     /* capacity of the tile list */
  int num_tiles;     /* host copy of the last uploaded count */
  int32_t *d_buf;    /* device block */
  int32_t *h_buf;    /* pinned staging of the same layout */
  kva_ext_rec *recs; /* host scratch for sorting */
  cudaEvent_t done;  /* staging may be rewritten once the last upload completed */
  int pending;
  int grid[3][4]; /* persistent grid per (head dim, Q type, fp8), sized at first use */
  int wgmma;      /* d=128 16-bit KV: the wgmma kernel (KVA_EXTEND_KERNEL=wgmma) */
  int grid_wg[2];
  int ws;         /* d=64/128/256 16-bit KV: the warp-specialized one (default,
                   * KVA_EXTEND_KERNEL=ws); neither: mma.sync */
  int grid_ws[3][4];
  int tma;        /* ws kernel: TMA loads from this many producer warps where the page
                   * size allows them, 0 never (KVA_EXTEND_TMA) */
} kva_ext_plan;

static kva_ext_plan *ext_plan_of(const kva_plan *plan) {
  kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  return cp ? (kva_ext_plan *)cp->extend_plan : NULL;
}

static int ext_bm_for(int head_dim) {
  return (head_dim == 64 || head_dim == 128 || head_dim == 256) ? KVA_EXT_BM(head_dim) : 0;
}

/* The ws kernel takes a pool's layers (16-bit KV at a tensor-core head dim)
 * if its producer can address a layer's K/V in 32-bit 16-byte units. */
static int ext_ws_pool(const kva_pool_config *pc) {
  const int64_t layer_units =
      (int64_t)pc->num_pages * pc->page_size * pc->num_kv_heads * pc->head_dim * 2 / 16;
  return ext_bm_for(pc->head_dim) != 0 && pc->kv_dtype != KVA_FP8_E4M3 &&
         layer_units <= INT32_MAX;
}

void kva_cuda_extend_plan_free(kva_plan *plan) {
  kva_cuda_plan *cp = plan ? kva_cuda_plan_of(plan) : NULL;
  if (!cp || !cp->extend_plan) return;
  kva_ext_plan *ep = (kva_ext_plan *)cp->extend_plan;
  if (ep->pending) cudaEventSynchronize(ep->done); /* the copy still reads h_buf */
  if (ep->done) cudaEventDestroy(ep->done);
  if (ep->d_buf) cudaFree(ep->d_buf);
  if (ep->h_buf) cudaFreeHost(ep->h_buf);
  free(ep->recs);
  free(ep);
  cp->extend_plan = NULL;
}

kva_status kva_cuda_extend_plan_init(kva_plan *plan) {
  kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  if (!cp)
    return kva_set_error(KVA_ERR_INTERNAL, "kva_plan_create: no CUDA plan for the extend path");
  kva_ext_plan *ep = (kva_ext_plan *)calloc(1, sizeof(kva_ext_plan));
  if (!ep) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_plan_create: extend plan");
  cp->extend_plan = ep;
  ep->bm = ext_bm_for(plan->pool->cfg.head_dim);
  {
    /* 16-bit KV kernel, read once and kept in the plan: ws (default), wgmma
     * (d=128; mma.sync at d=64/256) or mma (for comparison and as fallbacks) */
    const char *env = getenv("KVA_EXTEND_KERNEL");
    ep->ws = env == NULL || env[0] == '\0' || strcmp(env, "ws") == 0;
    ep->wgmma = env != NULL && strcmp(env, "wgmma") == 0;
    /* KVA_EXTEND_TMA: 0 = cp.async gather, 1, 2 or 4 = TMA from that many
     * producer warps, unset = the default below */
    const char *tma = getenv("KVA_EXTEND_TMA");
    ep->tma = tma == NULL || tma[0] == '\0' ? KVA_WS_TMA_WARPS : atoi(tma);
    if (ep->tma != 0 && ep->tma != 1 && ep->tma != 2 && ep->tma != 4) ep->tma = KVA_WS_TMA_WARPS;
  }
  /* the ws kernel's tiles are 128 query rows at every head dim (mma.sync's
   * at d=256: 64), so the schedule follows the kernel the plan's pool gets */
  if (ep->ws && ext_ws_pool(&plan->pool->cfg)) ep->bm = KVA_WS_TILE_ROWS;
  if (ep->bm == 0) return KVA_OK; /* every extend request goes to the fallback */
  /* Tiles <= sum over extend requests of ceil(n / bm) <= max_q / bm + #extend,
   * and an extend request has more than KVA_MAX_DECODE_Q tokens. */
  int64_t max_ext = plan->cfg.max_q_tokens / (KVA_MAX_DECODE_Q + 1);
  if (max_ext > plan->cfg.max_batch) max_ext = plan->cfg.max_batch;
  int64_t cap = plan->cfg.max_q_tokens / ep->bm + max_ext + 1;
  if (cap * plan->cfg.num_qo_heads > INT32_MAX / 2) {
    kva_cuda_extend_plan_free(plan);
    return kva_set_error(KVA_ERR_CAPACITY,
                         "kva_plan_create: max_q_tokens x num_qo_heads is too large for the "
                         "extend schedule");
  }
  ep->cap_tiles = (int)cap;
  size_t bytes = (EXT_HDR_INTS + 2 * (size_t)cap) * sizeof(int32_t);
  ep->recs = (kva_ext_rec *)malloc((size_t)cap * sizeof(kva_ext_rec));
  cudaError_t e = ep->recs ? cudaSuccess : cudaErrorMemoryAllocation;
  if (e == cudaSuccess) e = cudaMalloc((void **)&ep->d_buf, bytes);
  if (e == cudaSuccess) e = cudaMallocHost((void **)&ep->h_buf, bytes);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ep->done, cudaEventDisableTiming);
  /* 0 tiles until the first upload (same stream as every later use) */
  if (e == cudaSuccess)
    e = cudaMemsetAsync(ep->d_buf, 0, bytes, kva_cuda_state_of(plan->ctx)->stream);
  if (e != cudaSuccess) {
    kva_cuda_extend_plan_free(plan);
    if (e == cudaErrorMemoryAllocation)
      return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_plan_create: extend schedule of %zu bytes",
                           bytes);
    return kva_cuda_error(e, "extend plan buffers", __FILE__, __LINE__);
  }
  return KVA_OK;
}

kva_status kva_cuda_extend_plan(kva_plan *plan) {
  kva_ext_plan *ep = ext_plan_of(plan);
  if (!ep) return kva_set_error(KVA_ERR_INTERNAL, "kva_plan_update: no extend plan");
  ep->num_tiles = 0;
  /* Nothing to schedule: the extend kernel is not launched for this batch
   * (decode-only steps, graph replays), so the device list is left as is. */
  if (ep->bm == 0 || plan->num_extend == 0) return KVA_OK;

  cudaStream_t stream = kva_cuda_state_of(plan->ctx)->stream;
  if (ep->pending) {
    KVA_CUDA_TRY(cudaEventSynchronize(ep->done));
    ep->pending = 0;
  }
  const int n =
      kva_ext_build_tiles(plan, ep->bm, ep->cap_tiles, ep->recs, ep->h_buf + EXT_HDR_INTS);
  if (n < 0)
    return kva_set_error(KVA_ERR_INTERNAL, "kva_plan_update: extend tiles exceed %d",
                         ep->cap_tiles);
  ep->h_buf[0] = n;
  ep->h_buf[1] = ep->h_buf[2] = ep->h_buf[3] = 0;
  size_t bytes = (EXT_HDR_INTS + 2 * (size_t)n) * sizeof(int32_t);
  KVA_CUDA_TRY(cudaMemcpyAsync(ep->d_buf, ep->h_buf, bytes, cudaMemcpyHostToDevice, stream));
  KVA_CUDA_TRY(cudaEventRecord(ep->done, stream));
  ep->pending = 1;
  ep->num_tiles = n;
  return KVA_OK;
}

/* The ws kernel's tensor maps (see kva_ext_tma) for this layer and Q. */
static kva_status ext_tma_maps(kva_ext_tma *tm, const kva_plan *plan, const kva_pool *pool,
                               int layer, const void *q, int rows, int warps) {
  const kva_pool_config *pc = &pool->cfg;
  const uint64_t d = (uint64_t)pc->head_dim, hq = (uint64_t)plan->cfg.num_qo_heads;
  const uint64_t hkv = (uint64_t)pc->num_kv_heads;
  memset(tm, 0, sizeof *tm);
  tm->rows = rows;
  tm->warps = warps;
  const uint64_t qdims[3] = {d, hq, (uint64_t)plan->hdr.total_q};
  const uint64_t qstr[2] = {d * 2, hq * d * 2};
  const uint32_t qbox[3] = {64, 1, KVA_WS_QBOX_ROWS};
  kva_status st = kva_tma_encode_16bit_3d(&tm->q, q, qdims, qstr, qbox);
  const uint64_t kdims[3] = {d, hkv, (uint64_t)pc->num_pages * (uint64_t)pc->page_size};
  const uint64_t kstr[2] = {d * 2, hkv * d * 2};
  const uint32_t kbox[3] = {64, 1, (uint32_t)rows};
  if (st == KVA_OK) st = kva_tma_encode_16bit_3d(&tm->k, pool->k[layer], kdims, kstr, kbox);
  if (st == KVA_OK) st = kva_tma_encode_16bit_3d(&tm->v, pool->v[layer], kdims, kstr, kbox);
  return st;
}

/* key / d == (umulhi(key, mul) + key) >> shift for key < 2^31, d in [1, 2^31). */
kva_status kva_cuda_extend_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                     const kva_attn_params *params, const void *q, void *o,
                                     float *lse, kva_dtype dtype) {
  if (plan->num_extend == 0) return KVA_OK;
  kva_ext_plan *ep = ext_plan_of(plan);
  const kva_pool_config *pc = &pool->cfg;
  const int d = pc->head_dim;
  const int kv8 = pc->kv_dtype == KVA_FP8_E4M3;
  /* 16-byte cp.async / vector stores need 16-byte aligned Q and O rows */
  const int aligned = (((uintptr_t)q | (uintptr_t)o) & 15u) == 0;
  /* the plan's schedule must be the chosen kernel's: ws (KVA_WS_TILE_ROWS)
   * or mma.sync / wgmma (KVA_EXT_BM(d); the same at d=64/128) */
  const int ws = ep && ep->ws && ep->bm == KVA_WS_TILE_ROWS && ext_ws_pool(pc);
  const int tensor_cores =
      ep && ep->bm != 0 && (ws || ep->bm == ext_bm_for(d)) && pc->layout == KVA_LAYOUT_MHA &&
      aligned && (dtype == KVA_F16 || dtype == KVA_BF16) && (pc->kv_dtype == dtype || kv8);
  if (!tensor_cores)
    return kva_cuda_simple_attention(plan, pool, layer, params, q, o, lse, dtype, 1);
  if (ep->num_tiles == 0) return KVA_OK;

  const kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  const kva_cuda_state *cs = kva_cuda_state_of(plan->ctx);
  kva_ext_args a;
  memset(&a, 0, sizeof a);
  a.q = q;
  a.o = o;
  a.lse = lse;
  a.k = pool->k[layer];
  a.v = pool->v[layer];
  a.tiles = (const int2 *)(ep->d_buf + EXT_HDR_INTS);
  a.num_tiles = ep->d_buf;
  a.item_counter = ep->d_buf + 1; /* header int 1 */
  a.hdr = cp->d_hdr;
  a.cu_q = cp->d_cu_seqlens_q;
  a.num_new = cp->d_num_new;
  a.cache_seqlens = cp->d_cache_seqlens;
  a.page_table = cp->d_page_table;
  KVA_CUDA_FILL_ATTN_ARGS(a, plan, pool, layer, params);

  const int max_items = ep->cap_tiles * a.hq;
  if (ws) {
    /* its CTAs take items from a counter: 0 before every launch */
    KVA_CUDA_TRY(cudaMemsetAsync(a.item_counter, 0, sizeof(int32_t), cs->stream));
    /* stamped only by a KVA_EXT_TRACE build: a record per consumer warpgroup
     * of each CTA (grid <= num_sms) */
    a.trace = kva_trace_next(2LL * cs->num_sms);
    const int rows = ep->tma ? kva_ext_tma_rows(pc->page_size, KVA_WS_BN(d)) : 0;
    kva_ext_tma tm_buf;
    const kva_ext_tma *tm = NULL;
    /* a driver without tensor-map encoding leaves the cp.async gather */
    if (rows > 0 && ext_tma_maps(&tm_buf, plan, pool, layer, q, rows, ep->tma) == KVA_OK)
      tm = &tm_buf;
    switch (d) {
      case 64:
        return kva_ext_launch_ws_d64(&a, tm, dtype, cs->num_sms, max_items, ep->grid_ws[0],
                                     cs->stream);
      case 128:
        return kva_ext_launch_ws_d128(&a, tm, dtype, cs->num_sms, max_items, ep->grid_ws[1],
                                      cs->stream);
      default:
        return kva_ext_launch_ws_d256(&a, tm, dtype, cs->num_sms, max_items, ep->grid_ws[2],
                                      cs->stream);
    }
  }
  if (ep->wgmma && d == 128 && !kv8)
    return kva_ext_launch_wgmma(&a, dtype, cs->num_sms, max_items, ep->grid_wg, cs->stream);
  switch (d) {
    case 64:
      return kva_ext_launch_d64(&a, dtype, kv8, cs->num_sms, max_items, ep->grid[0], cs->stream);
    case 128:
      return kva_ext_launch_d128(&a, dtype, kv8, cs->num_sms, max_items, ep->grid[1], cs->stream);
    default:
      return kva_ext_launch_d256(&a, dtype, kv8, cs->num_sms, max_items, ep->grid[2], cs->stream);
  }
}
