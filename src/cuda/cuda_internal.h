/* CUDA backend internals shared by its translation units (backend glue,
 * decode, extend, store, merge). Plain C structs; included by .c and .cu. */
#ifndef KVA_CUDA_INTERNAL_H
#define KVA_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a failing CUDA call as KVA_ERR_DEVICE with file, line and the
 * call's text; evaluates to the kva_status. */
kva_status kva_cuda_error(cudaError_t err, const char *what, const char *file, int line);
#define KVA_CUDA_TRY(call)                                                    \
  do {                                                                        \
    cudaError_t kva_e_ = (call);                                              \
    if (kva_e_ != cudaSuccess) return kva_cuda_error(kva_e_, #call, __FILE__, __LINE__); \
  } while (0)
/* After every kernel launch. */
#define KVA_CUDA_LAUNCH_CHECK(name) KVA_CUDA_TRY(cudaGetLastError())

/* Devices whose shared-memory opt-in a launcher remembers; on a higher
 * ordinal it opts in at every launch. */
#define KVA_CUDA_OPTIN_DEVICES 64
/* Lets kernel fn use smem bytes of dynamic shared memory on the current
 * device. The attribute is per device and a context may be on any, but
 * setting it at every launch (every layer of every step) is host work:
 * done (one static table per kernel, zero-initialized) remembers per
 * device ordinal the bytes already set. Contexts on other host threads
 * may race here: both then set it, which is harmless, and a stale 0 only
 * sets it again. A failed set is returned and not remembered. Assumes no
 * cudaDeviceReset while the library is in use (it would drop the
 * attribute but not the table). */
static inline cudaError_t kva_cuda_smem_optin(const void *fn, int smem,
                                              int done[KVA_CUDA_OPTIN_DEVICES]) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const int cached = dev >= 0 && dev < KVA_CUDA_OPTIN_DEVICES;
  if (cached && __atomic_load_n(&done[dev], __ATOMIC_ACQUIRE) == smem) return cudaSuccess;
  e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess && cached) __atomic_store_n(&done[dev], smem, __ATOMIC_RELEASE);
  return e;
}

typedef struct kva_cuda_state {
  int device;
  int num_sms;
  int max_smem_optin;  /* bytes a block may use after cudaFuncSetAttribute */
  int mem_gbps;        /* peak DRAM bandwidth in GB/s from the device's attributes (0: unknown) */
  cudaStream_t stream;      /* the stream every call is ordered on */
  cudaStream_t own_stream;  /* created at init; the stream until kva_context_set_stream */
} kva_cuda_state;

static inline kva_cuda_state *kva_cuda_state_of(const kva_context *ctx) {
  return (kva_cuda_state *)ctx->backend_state;
}

/* Device copy of a plan. All batch-dependent sizes are read by kernels from
 * d_hdr, so launch configurations never depend on a batch's contents (the
 * CUDA-graph path relies on this). The metadata lives in one block uploaded
 * by one cudaMemcpyAsync from pinned staging; page_table is last so only its
 * used rows travel. */
typedef struct kva_cuda_plan {
  int32_t *d_meta;          /* device block */
  int32_t *h_meta;          /* pinned host staging of the same layout */
  size_t meta_ints;         /* capacity of the block in int32 */
  size_t page_table_off;    /* offset (ints) of the page table, the last array */
  cudaEvent_t upload_done;  /* staging may be rewritten once this completed */
  int upload_pending;

  /* device pointers into d_meta (offsets fixed at plan_init) */
  kva_plan_header *d_hdr;
  int32_t *d_cu_seqlens_q;   /* [max_batch + 1] */
  int32_t *d_cu_seqlens_k;   /* [max_batch + 1] */
  int32_t *d_cache_seqlens;  /* [max_batch] */
  int32_t *d_num_new;        /* [max_batch] */
  int32_t *d_out_cache_loc;  /* [max_q_tokens] */
  int32_t *d_q_req;          /* [max_q_tokens] */
  int32_t *d_decode_reqs;    /* [max_batch] */
  int32_t *d_extend_reqs;    /* [max_batch] */
  int32_t *d_split_indptr;   /* [max_batch + 1] */
  int32_t *d_split_row_offset; /* [max_batch + 1] */
  kva_split_work *d_split_schedule; /* [num_workers] */
  int32_t *d_sched_order;    /* [max_batch] */
  int32_t *d_page_table;     /* [max_batch * max_pages_per_req], stride d_hdr->page_table_stride */
  int32_t *d_split_sem;      /* [max_batch * num_qo_heads], zeroed once; see decode_kernel.cuh */
  int32_t *d_tile_claim;     /* [max_batch * num_qo_heads] decode tile counters, zeroed once */

  /* extend (prefill) path: its own tile schedule, filled by
   * kva_cuda_extend_plan and uploaded by it on the same stream */
  void *extend_plan;
} kva_cuda_plan;

static inline kva_cuda_plan *kva_cuda_plan_of(const kva_plan *plan) {
  return (kva_cuda_plan *)plan->backend_plan;
}

/* n / d == (umulhi(n, mul) + n) >> shift for n < 2^31, d in [1, 2^31): the
 * kernels divide key positions by the page size this way. */
static inline void kva_cuda_fastdiv(int d, uint32_t *mul, int *shift) {
  int l = 0;
  while ((1u << l) < (uint32_t)d) l++;
  *mul = (uint32_t)(((uint64_t)1 << 32) * (((uint64_t)1 << l) - (uint64_t)d) / (uint64_t)d + 1);
  *shift = l;
}

/* 1 unless s is known not to be under stream capture: a launch being
 * captured takes its shape from the plan's capacity (the graph replays
 * other batches). A failed query counts as capture (its error cleared, so
 * that it is not taken for the next launch's). */
static inline int kva_cuda_maybe_capturing(cudaStream_t s) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return st != cudaStreamCaptureStatusNone;
}

/* Softmax constants of the tensor-core kernels, in base 2 with the fp8
 * scales folded in: logits are qk_mul * (q.k) without soft-cap, else
 * cap_log2 * tanh-like(qk_mul * (q.k)) (see the kernels); O is scaled by o_mul. */
typedef struct kva_cuda_softmax {
  float qk_mul, cap_log2, o_mul;
} kva_cuda_softmax;
static inline kva_cuda_softmax kva_cuda_softmax_of(const kva_pool *pool, int layer,
                                                   const kva_attn_params *params) {
  const int kv8 = pool->cfg.kv_dtype == KVA_FP8_E4M3;
  const float log2e = 1.4426950408889634f;
  const float sm = params->sm_scale > 0.0f ? params->sm_scale
                                           : 1.0f / sqrtf((float)pool->cfg.head_dim);
  const float ks = kv8 ? pool->k_scale[layer] : 1.0f;
  kva_cuda_softmax c;
  if (params->logit_softcap > 0.0f) {
    c.qk_mul = 2.0f * log2e * sm * ks / params->logit_softcap;
    c.cap_log2 = params->logit_softcap * log2e;
  } else {
    c.qk_mul = log2e * sm * ks;
    c.cap_log2 = 0.0f;
  }
  c.o_mul = kv8 ? pool->v_scale[layer] : 1.0f;
  return c;
}

/* The fields the decode and extend kernel arguments share (both structs
 * name them alike): head counts, page-size division, softmax constants,
 * mask parameters. */
#define KVA_CUDA_FILL_ATTN_ARGS(a, plan, pool, layer, params)                          \
  do {                                                                                  \
    (a).hq = (plan)->cfg.num_qo_heads;                                                  \
    (a).hkv = (pool)->cfg.num_kv_heads;                                                 \
    (a).group = (a).hq / (a).hkv;                                                       \
    (a).page_size = (pool)->cfg.page_size;                                              \
    kva_cuda_fastdiv((pool)->cfg.page_size, &(a).ps_mul, &(a).ps_shift);                \
    const kva_cuda_softmax sc_ = kva_cuda_softmax_of((pool), (layer), (params));        \
    (a).qk_mul = sc_.qk_mul;                                                            \
    (a).cap_log2 = sc_.cap_log2;                                                        \
    (a).o_mul = sc_.o_mul;                                                              \
    (a).causal = (params)->causal != 0;                                                 \
    (a).window_left = (params)->window_left < 0 ? -1 : (params)->window_left;           \
  } while (0)


/* Plan hooks (plan_upload.c) and kernels (store.cu, cuda_backend.c dispatch, merge.cu). */
kva_status kva_cuda_plan_init(kva_plan *plan);
kva_status kva_cuda_plan_upload(kva_plan *plan);
void kva_cuda_plan_free(kva_plan *plan);
kva_status kva_cuda_store_kv(kva_plan *plan, kva_pool *pool, int layer, const void *k,
                             const void *v, kva_dtype dtype);
kva_status kva_cuda_attention(kva_plan *plan, const kva_pool *pool, int layer,
                              const kva_attn_params *params, const void *q, void *o, float *lse,
                              kva_dtype dtype);
kva_status kva_cuda_merge_states(kva_context *ctx, int num_tokens, int num_heads, int head_dim,
                                 kva_dtype dtype, const void *v_a, const float *s_a,
                                 const void *v_b, const float *s_b, void *v_out, float *s_out);

/* Decode path (decode.cu): the plan's decode requests, split-KV over the
 * schedule, split requests merged in the same kernel. */
kva_status kva_cuda_decode_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                     const kva_attn_params *params, const void *q, void *o,
                                     float *lse, kva_dtype dtype);

/* CTAs per SM the decode kernel is sized for at this head dim, KV type and
 * rows a kv head (group x new tokens) (decode.cu); default_workers fills
 * the SMs with workers x kv heads of them. */
int kva_cuda_decode_ctas_per_sm(int head_dim, int kv8, int rows);

/* MLA decode (mla.cu): the plan's decode requests over a 576-dim latent
 * pool on the wgmma kernel, else (f32 Q/O, mixed types) the CUDA-core one. */
kva_status kva_cuda_mla_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                  const kva_attn_params *params, const void *q, void *o,
                                  float *lse, kva_dtype dtype);
/* Row tiles (grid.y) of the MLA kernel at these plan capacities. */
int kva_cuda_mla_row_tiles(int num_qo_heads, int max_q_tokens);
/* Blocks past a worker's share that keep an MLA request whole (split_slack). */
int kva_cuda_mla_split_slack(int num_qo_heads, int max_q_len, int block);
/* Blocks a chunk of an MLA request costs beyond its keys (split_overhead);
 * kv8: an fp8 latent pool. */
int kva_cuda_mla_split_overhead(const kva_cuda_state *cs, int num_qo_heads, int max_q_len,
                                int block, int kv8, int page_size);
/* What an MLA chunk's end costs the costed walk (split_costs); returns 1,
 * or 0 for batches that keep the packed walk (two or more row tiles; v6's
 * with KVA_MLA6_COSTED=0). The prices follow the kernel mla.cu will
 * launch (v6 where the DRAM is fast, cs->mem_gbps). */
int kva_cuda_mla_split_costs(const kva_cuda_state *cs, int num_qo_heads, int max_q_len, int block,
                             int kv8, int page_size, kva_split_costs *out);
/* Extend path (extend.cu): the plan's extend requests on tensor cores. */
kva_status kva_cuda_extend_plan_init(kva_plan *plan);
kva_status kva_cuda_extend_plan(kva_plan *plan);  /* called from plan_upload */
void kva_cuda_extend_plan_free(kva_plan *plan);
kva_status kva_cuda_extend_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                     const kva_attn_params *params, const void *q, void *o,
                                     float *lse, kva_dtype dtype);

/* Graph hooks (cuda_graph.c) for the backend struct. */
kva_status kva_cuda_graph_begin(kva_context *ctx);
kva_status kva_cuda_graph_end(kva_context *ctx, void **graph);
kva_status kva_cuda_graph_launch(kva_context *ctx, void *graph);
void kva_cuda_graph_destroy(kva_context *ctx, void *graph);

/* CUDA-core path (simple_attention.cu) for what the tensor-core kernels do
 * not cover: f32 Q/O, head dims other than 64/128/256. which = 0: the plan's
 * decode requests, 1: its extend requests. Same semantics as the CPU backend. */
kva_status kva_cuda_simple_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                     const kva_attn_params *params, const void *q, void *o,
                                     float *lse, kva_dtype dtype, int which);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
/* Launches fn as a programmatic dependent (PDL) of the kernel before it on
 * stream s: its launch and prologue (schedule and page-table lookups)
 * overlap that kernel's tail; fn runs griddepcontrol.wait before it touches
 * Q, KV or the outputs. With cluster_y > 1, in clusters of cluster_y CTAs
 * along grid.y. */
template <typename Args>
static inline cudaError_t kva_launch_pdl_cluster(void (*fn)(Args), dim3 grid, dim3 block,
                                                 size_t smem, cudaStream_t s, Args args,
                                                 unsigned cluster_y) {
  cudaLaunchConfig_t lc = {};
  lc.gridDim = grid;
  lc.blockDim = block;
  lc.dynamicSmemBytes = smem;
  lc.stream = s;
  cudaLaunchAttribute attr[2] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = 1;
  attr[1].val.clusterDim.y = cluster_y;
  attr[1].val.clusterDim.z = 1;
  lc.attrs = attr;
  lc.numAttrs = cluster_y > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&lc, fn, args);
}
template <typename Args>
static inline cudaError_t kva_launch_pdl(void (*fn)(Args), dim3 grid, dim3 block, size_t smem,
                                         cudaStream_t s, Args args) {
  return kva_launch_pdl_cluster(fn, grid, block, smem, s, args, 1u);
}
#endif
#endif /* KVA_CUDA_INTERNAL_H */
