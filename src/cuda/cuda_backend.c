/* The CUDA backend: device selection, memory, streams, the attention
 * dispatch, and the hooks that route to the kernels (store.cu, merge.cu,
 * decode.cu, extend.cu, simple_attention.cu) and the plan upload
 * (plan_upload.c). */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_internal.h"
#include "cuda/trace.h"

unsigned long long *kva_trace_buf = NULL;
int kva_trace_ctas = 0;
unsigned kva_trace_launches = 0;
#include "cuda/decode.h"

kva_status kva_cuda_error(cudaError_t err, const char *what, const char *file, int line) {
  return kva_set_error(KVA_ERR_DEVICE, "CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(err),
                       cudaGetErrorString(err), what, file, line);
}

static kva_status cuda_init(kva_context *ctx, const kva_context_config *cfg) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return kva_set_error(KVA_ERR_NO_DEVICE, "kva_context_create: no CUDA device present (%s)",
                         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  if (cfg->cuda_device < 0 || cfg->cuda_device >= count)
    return kva_set_error(KVA_ERR_NO_DEVICE, "kva_context_create: cuda_device %d, but %d present",
                         cfg->cuda_device, count);
  KVA_CUDA_TRY(cudaSetDevice(cfg->cuda_device));
  struct cudaDeviceProp prop;
  KVA_CUDA_TRY(cudaGetDeviceProperties(&prop, cfg->cuda_device));
  if (prop.major < 9)
    return kva_set_error(KVA_ERR_NO_DEVICE,
                         "kva_context_create: %s is sm_%d%d; this build targets sm_90a (Hopper)",
                         prop.name, prop.major, prop.minor);
  kva_cuda_state *st = (kva_cuda_state *)calloc(1, sizeof(*st));
  if (!st) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_context_create: out of host memory");
  st->device = cfg->cuda_device;
  st->num_sms = prop.multiProcessorCount;
  st->max_smem_optin = (int)prop.sharedMemPerBlockOptin;
  /* double data rate: 2 x clock (kHz) x bus bytes; the MLA dispatch reads it */
  int mem_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, cfg->cuda_device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, cfg->cuda_device) !=
          cudaSuccess) {
    (void)cudaGetLastError(); /* unknown: the dispatch keeps its H100 choice */
    mem_khz = bus_bits = 0;
  }
  st->mem_gbps = (int)(2.0 * mem_khz * 1e3 * (bus_bits / 8) / 1e9);
  /* our own stream: capturable by CUDA graphs, unlike the legacy default */
  e = cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    free(st);
    return kva_cuda_error(e, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
  }
  st->own_stream = st->stream;
  ctx->backend_state = st;
  ctx->stream = st->stream;
  ctx->num_workers = st->num_sms;
  ctx->default_split_block = 64;
  return KVA_OK;
}

static void cuda_shutdown(kva_context *ctx) {
  kva_cuda_state *st = kva_cuda_state_of(ctx);
  if (!st) return;
  cudaStreamSynchronize(st->stream);
  if (st->own_stream) cudaStreamDestroy(st->own_stream);
  free(st);
  ctx->backend_state = NULL;
}

static kva_status cuda_alloc(kva_context *ctx, size_t bytes, void **out) {
  (void)ctx;
  cudaError_t e = cudaMalloc(out, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky-free allocation error */
    return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "cuda backend: cudaMalloc of %zu bytes failed: %s",
                         bytes, cudaGetErrorString(e));
  }
  return KVA_OK;
}
static void cuda_free(kva_context *ctx, void *p) {
  (void)ctx;
  cudaFree(p);
}
static kva_status cuda_zero(kva_context *ctx, void *p, size_t bytes) {
  cudaStream_t s = kva_cuda_state_of(ctx)->stream;
  KVA_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, s));
  KVA_CUDA_TRY(cudaStreamSynchronize(s));
  return KVA_OK;
}
static kva_status cuda_copy(kva_context *ctx, void *dst, const void *src, size_t bytes) {
  cudaStream_t s = kva_cuda_state_of(ctx)->stream;
  KVA_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  KVA_CUDA_TRY(cudaStreamSynchronize(s));
  return KVA_OK;
}
static kva_status cuda_sync(kva_context *ctx) {
  KVA_CUDA_TRY(cudaStreamSynchronize(kva_cuda_state_of(ctx)->stream));
  return KVA_OK;
}
static kva_status cuda_set_stream(kva_context *ctx, void *stream) {
  kva_cuda_state *st = kva_cuda_state_of(ctx);
  /* NULL is the legacy default stream (torch's default stream), as
   * kvattn.h says; the context starts on its own non-blocking stream. */
  st->stream = (cudaStream_t)stream;
  ctx->stream = st->stream;
  return KVA_OK;
}
/* The decode grid is (workers, kv heads): enough workers that every SM
 * holds the CTAs per SM the decode kernel is sized for. MLA's grid is
 * (workers, row tiles), one CTA per SM: the SMs over the row tiles of one
 * new token per request (FlashMLA's num_sm_parts); more tokens per request
 * make more full waves. */
static int cuda_default_workers(const kva_context *ctx, const kva_pool *pool, int num_qo_heads,
                                int max_q_len) {
  if (pool->cfg.layout == KVA_LAYOUT_MLA) {
    /* one CTA per SM: workers x row tiles of the batch's rows fill the SMs
     * in one wave (FlashMLA's num_sm_parts) */
    const int tiles = kva_cuda_mla_row_tiles(num_qo_heads > 0 ? num_qo_heads : 1,
                                             max_q_len > 0 ? max_q_len : 1);
    const int w = kva_cuda_state_of(ctx)->num_sms / tiles;
    return w > 1 ? w : 1;
  }
  const int hkv = pool->cfg.num_kv_heads > 0 ? pool->cfg.num_kv_heads : 1;
  const int q = max_q_len < 1 ? 1 : max_q_len < KVA_MAX_DECODE_Q ? max_q_len : KVA_MAX_DECODE_Q;
  const int ctas = kva_cuda_decode_ctas_per_sm(pool->cfg.head_dim,
                                               pool->cfg.kv_dtype == KVA_FP8_E4M3,
                                               num_qo_heads / hkv * q);
  const int w = ctas * kva_cuda_state_of(ctx)->num_sms / hkv;
  return w > 1 ? w : 1;
}

/* The decode kernel's key tile (64 keys of 16-bit KV, 128 of fp8): a
 * 64-token block would end fp8 chunks mid-tile (measured: B=1 L=128k fp8
 * 1.78x -> 1.82x bf16's tokens/s). */
static int cuda_default_split_block(const kva_context *ctx, const kva_pool *pool) {
  (void)ctx;
  return KVA_DEC_BK(pool->cfg.kv_dtype == KVA_FP8_E4M3);
}

/* Only MLA's merge is costly enough to be worth slack (512-dim rows);
 * decode's schedule stays exactly balanced. */
static int cuda_split_slack(const kva_context *ctx, const kva_pool *pool, int num_qo_heads,
                            int max_q_len, int block) {
  (void)ctx;
  if (pool->cfg.layout != KVA_LAYOUT_MLA) return 0;
  return kva_cuda_mla_split_slack(num_qo_heads, max_q_len, block);
}

static int cuda_split_overhead(const kva_context *ctx, const kva_pool *pool, int num_qo_heads,
                               int max_q_len, int block) {
  if (pool->cfg.layout != KVA_LAYOUT_MLA) return 0;
  return kva_cuda_mla_split_overhead(kva_cuda_state_of(ctx), num_qo_heads, max_q_len, block,
                                     pool->cfg.kv_dtype == KVA_FP8_E4M3, pool->cfg.page_size);
}

static int cuda_split_costs(const kva_context *ctx, const kva_pool *pool, int num_qo_heads,
                            int max_q_len, int block, kva_split_costs *out) {
  if (pool->cfg.layout != KVA_LAYOUT_MLA) return 0;
  return kva_cuda_mla_split_costs(kva_cuda_state_of(ctx), num_qo_heads, max_q_len, block,
                                  pool->cfg.kv_dtype == KVA_FP8_E4M3, pool->cfg.page_size, out);
}

/* Runs of consecutive src and dst slots (a fork copies a page prefix) move
 * in one stream-ordered copy per layer and buffer. */
static kva_status cuda_copy_slots(kva_pool *pool, int count, const int32_t *src, const int32_t *dst) {
  cudaStream_t s = kva_cuda_state_of(pool->ctx)->stream;
  size_t tb = pool->token_elems * kva_dtype_size(pool->cfg.kv_dtype);
  for (int i = 0; i < count;) {
    /* ranges of a run never overlap (cudaMemcpy has no memmove semantics) */
    const int64_t gap = (int64_t)dst[i] > src[i] ? (int64_t)dst[i] - src[i] : (int64_t)src[i] - dst[i];
    int n = 1;
    while (i + n < count && src[i + n] == src[i] + n && dst[i + n] == dst[i] + n && gap > n) n++;
    if (gap == 0) { /* a slot onto itself */
      i += n;
      continue;
    }
    for (int l = 0; l < pool->cfg.num_layers; l++)
      for (int b = 0; b < 2; b++) {
        char *buf = (char *)(b == 0 ? pool->k[l] : pool->v[l]);
        if (!buf) continue;
        KVA_CUDA_TRY(cudaMemcpyAsync(buf + (size_t)dst[i] * tb, buf + (size_t)src[i] * tb,
                                     (size_t)n * tb, cudaMemcpyDeviceToDevice, s));
      }
    i += n;
  }
  return KVA_OK;
}

/* Decode requests: the split-KV tensor-core kernel (decode.cu) where it
 * applies, else the CUDA-core kernel; extend requests: the tensor-core
 * extend kernel (extend.cu), which falls back to the CUDA-core kernel
 * itself. Graph mode runs the decode path whatever the host counts say
 * (the kernels read the real counts on the device). */
kva_status kva_cuda_attention(kva_plan *plan, const kva_pool *pool, int layer,
                              const kva_attn_params *params, const void *q, void *o, float *lse,
                              kva_dtype dtype) {
  if (pool->cfg.layout == KVA_LAYOUT_MLA) /* decode only (run.c checked) */
    return plan->num_decode > 0 || plan->graph_mode
               ? kva_cuda_mla_attention(plan, pool, layer, params, q, o, lse, dtype)
               : KVA_OK;
  if (plan->num_decode > 0 || plan->graph_mode) {
    kva_status st = kva_cuda_decode_attention(plan, pool, layer, params, q, o, lse, dtype);
    if (st == KVA_ERR_UNSUPPORTED)
      st = kva_cuda_simple_attention(plan, pool, layer, params, q, o, lse, dtype, 0);
    if (st != KVA_OK) return st;
  }
  if (plan->num_extend > 0 && !plan->graph_mode)
    return kva_cuda_extend_attention(plan, pool, layer, params, q, o, lse, dtype);
  return KVA_OK;
}

static const kva_backend cuda_backend = {
    .name = "cuda",
    .device = KVA_DEVICE_CUDA,
    .init = cuda_init,
    .shutdown = cuda_shutdown,
    .mem_alloc = cuda_alloc,
    .mem_free = cuda_free,
    .mem_zero = cuda_zero,
    .copy_to_device = cuda_copy,
    .copy_to_host = cuda_copy,
    .synchronize = cuda_sync,
    .set_stream = cuda_set_stream,
    .default_workers = cuda_default_workers,
    .default_split_block = cuda_default_split_block,
    .split_slack = cuda_split_slack,
    .split_overhead = cuda_split_overhead,
    .split_costs = cuda_split_costs,
    .plan_init = kva_cuda_plan_init,
    .plan_upload = kva_cuda_plan_upload,
    .plan_free = kva_cuda_plan_free,
    .copy_slots = cuda_copy_slots,
    .store_kv = kva_cuda_store_kv,
    .attention = kva_cuda_attention,
    .merge_states = kva_cuda_merge_states,
    .graph_begin = kva_cuda_graph_begin,
    .graph_end = kva_cuda_graph_end,
    .graph_launch = kva_cuda_graph_launch,
    .graph_destroy = kva_cuda_graph_destroy,
};

const kva_backend *kva_cuda_backend_get(void) { return &cuda_backend; }
