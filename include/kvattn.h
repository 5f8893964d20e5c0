/*
 * kvattn: paged KV cache, per-batch planning and attention for LLM serving.
 *
 * Objects (all opaque, all created and destroyed by the library):
 *   kva_context    a device (CPU or CUDA), its backend, worker count and stream.
 *   kva_pool       per-layer K/V page buffers on the context's device plus a
 *                  reference-counted page allocator (vLLM's blocks).
 *   kva_req_table  request slots x positions -> KV slot (SGLang req_to_token).
 *   kva_plan       per-forward metadata (cu_seqlens, page table, ragged page
 *                  indices, split-KV schedule) built once by kva_plan_update and
 *                  read by every layer's kva_store_kv / kva_attention.
 *
 * Ownership: a pool must outlive the request tables and plans made from it; a
 * context must outlive its pools. Destroy functions accept NULL.
 *
 * Threads: no global mutable state. A handle is used by one thread at a time;
 * distinct handles may be used from distinct threads. The error message of the
 * last failing call is per thread (kva_last_error).
 *
 * Memory: tensors passed to kva_store_kv, kva_attention and kva_merge_states
 * live on the context's device (host memory for CPU, device memory for CUDA).
 * Index arrays in batch descriptions are host memory. Tensors are contiguous
 * row-major unless a stride says otherwise.
 *
 * Numbers: LSE is the natural-log sum of exp of the scaled (soft-capped) logits.
 * Accumulation is fp32.
 */
#ifndef KVATTN_H
#define KVATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVA_VERSION_MAJOR 0
#define KVA_VERSION_MINOR 1

#define KVA_MAX_PAGE_SIZE 256
#define KVA_MAX_HEAD_DIM 256
#define KVA_MLA_HEAD_DIM 576   /* one latent vector per token */
#define KVA_MLA_V_DIM 512      /* V = the latent's first 512 dims */
#define KVA_MAX_DECODE_Q 8     /* a request with <= 8 new tokens is a decode request */

/* ---- status ------------------------------------------------------------ */

typedef enum kva_status {
  KVA_OK = 0,
  KVA_ERR_NULL_ARGUMENT = 1,      /* a required pointer was NULL */
  KVA_ERR_INVALID_ARGUMENT = 2,   /* zero/negative size, bad enum, bad combination */
  KVA_ERR_UNSUPPORTED = 3,        /* valid but not supported (head_dim, page size, dtype) */
  KVA_ERR_OUT_OF_RANGE = 4,       /* page id, slot, layer or position beyond its table */
  KVA_ERR_OUT_OF_PAGES = 5,       /* the pool has too few free pages; nothing changed */
  KVA_ERR_OUT_OF_MEMORY = 6,      /* host or device allocation failed */
  KVA_ERR_DOUBLE_FREE = 7,        /* page or request slot already free */
  KVA_ERR_CAPACITY = 8,           /* beyond a capacity fixed at creation */
  KVA_ERR_WORKSPACE_TOO_SMALL = 9,/* split-KV scratch does not fit the plan's workspace */
  KVA_ERR_NO_DEVICE = 10,         /* the requested device is not present or not built */
  KVA_ERR_DEVICE = 11,            /* a device runtime call failed */
  KVA_ERR_STATE = 12,             /* object not in a state that allows the call */
  KVA_ERR_INTERNAL = 13
} kva_status;

/* Static name of a status ("KVA_ERR_OUT_OF_PAGES"). */
const char *kva_strerror(kva_status status);
/* Message of the last failing call on this thread, naming what was wrong.
 * Valid until the next failing call on this thread; "" if none. */
const char *kva_last_error(void);

/* ---- types ------------------------------------------------------------- */

typedef enum kva_dtype {
  KVA_F32 = 0,
  KVA_F16 = 1,
  KVA_BF16 = 2,
  KVA_FP8_E4M3 = 3   /* KV storage only; real value = stored * layer scale */
} kva_dtype;

size_t kva_dtype_size(kva_dtype dtype);      /* 0 for an unknown dtype */
const char *kva_dtype_name(kva_dtype dtype); /* "f32", "f16", "bf16", "fp8" */

typedef enum kva_device { KVA_DEVICE_CPU = 0, KVA_DEVICE_CUDA = 1 } kva_device;

/* ---- context ----------------------------------------------------------- */

typedef struct kva_context kva_context;

typedef struct kva_context_config {
  kva_device device;
  int num_threads;  /* CPU worker threads; 0 = all online cores */
  int cuda_device;  /* CUDA device ordinal */
} kva_context_config;

/* KVA_OK if the device can be used, KVA_ERR_NO_DEVICE (with a message) if not. */
kva_status kva_device_available(kva_device device);

kva_status kva_context_create(const kva_context_config *config, kva_context **out);
void kva_context_destroy(kva_context *ctx);
kva_device kva_context_device(const kva_context *ctx);
/* Parallel workers the planner schedules for: CPU threads or CUDA SMs. */
int kva_context_num_workers(const kva_context *ctx);
/* CUDA: the cudaStream_t that every call of this context is ordered on
 * (NULL = legacy default stream, e.g. torch's default stream). A new CUDA
 * context starts on a non-blocking stream of its own, which graph capture
 * needs. CPU: accepted and ignored. */
kva_status kva_context_set_stream(kva_context *ctx, void *stream);
/* Waits for all work queued by this context. */
kva_status kva_synchronize(kva_context *ctx);

/* Memory on the context's device, for callers that want device-agnostic code. */
kva_status kva_malloc(kva_context *ctx, size_t bytes, void **out);
void kva_free(kva_context *ctx, void *ptr);
/* Synchronous copies between host and the context's device. */
kva_status kva_copy_to_device(kva_context *ctx, void *dst, const void *src, size_t bytes);
kva_status kva_copy_to_host(kva_context *ctx, void *dst, const void *src, size_t bytes);

/* ---- KV page pool and allocator --------------------------------------- */

typedef enum kva_layout {
  KVA_LAYOUT_MHA = 0, /* K and V per layer: [num_pages, page_size, num_kv_heads, head_dim] */
  KVA_LAYOUT_MLA = 1  /* one buffer per layer: [num_pages, page_size, 576]; V = first 512 */
} kva_layout;

typedef struct kva_pool_config {
  kva_layout layout;
  int num_layers;
  int num_pages;
  int page_size;     /* 1..256 */
  int num_kv_heads;  /* MLA: 1 */
  int head_dim;      /* MHA: multiple of 8, <= 256; MLA: 576 */
  kva_dtype kv_dtype;/* KVA_F16, KVA_BF16 or KVA_FP8_E4M3 */
} kva_pool_config;

typedef struct kva_pool kva_pool;

kva_status kva_pool_create(kva_context *ctx, const kva_pool_config *config, kva_pool **out);
void kva_pool_destroy(kva_pool *pool);
const kva_pool_config *kva_pool_get_config(const kva_pool *pool);
/* fp8 pools: per-layer dequantization scales (real = stored * scale); 1.0 by default. */
kva_status kva_pool_set_scale(kva_pool *pool, int layer, float k_scale, float v_scale);
/* A pool over caller-owned buffers (FA3 / FlashInfer / FlashMLA style):
 * k_layers[l] (and v_layers[l] for MHA; v_layers must be NULL for MLA) are
 * memory on the context's device, 16-byte aligned, laid out as the config's
 * layout says ([num_pages, page_size, num_kv_heads, head_dim] or
 * [num_pages, page_size, 576]) in kv_dtype. The pool never frees them; they
 * must outlive it. The allocator works as for an owned pool (all pages free);
 * plans from kva_plan_create_paged ignore it. */
kva_status kva_pool_create_external(kva_context *ctx, const kva_pool_config *config,
                                    void *const *k_layers, void *const *v_layers, kva_pool **out);
/* Device pointers of a layer's buffers (v is NULL for MLA). */
kva_status kva_pool_get_buffers(const kva_pool *pool, int layer, void **k, void **v);

/* Allocator. O(1) per page. A page starts with one reference; kva_pool_ref_page
 * adds one (a request sharing it); kva_pool_unref_page drops one and frees the
 * page at zero. Freeing a free page is KVA_ERR_DOUBLE_FREE; a page id outside
 * [0, num_pages) is KVA_ERR_OUT_OF_RANGE; neither changes anything. */
int kva_pool_num_free_pages(const kva_pool *pool);
kva_status kva_pool_alloc_pages(kva_pool *pool, int count, int32_t *pages); /* all or nothing */
kva_status kva_pool_ref_page(kva_pool *pool, int32_t page);
kva_status kva_pool_unref_page(kva_pool *pool, int32_t page);
int kva_pool_page_refcount(const kva_pool *pool, int32_t page); /* -1 if out of range */
/* Full invariant check (free list vs refcounts); KVA_ERR_INTERNAL with a message if broken. */
kva_status kva_pool_check(const kva_pool *pool);

/* Dequantized host copy of tokens: k_out/v_out [count, num_kv_heads, head_dim]
 * f32 (v_out ignored for MLA; either may be NULL). slots are KV slot indices
 * (page * page_size + offset), host memory. For tests and debugging. */
kva_status kva_pool_read_tokens(const kva_pool *pool, int layer, int count, const int32_t *slots,
                                float *k_out, float *v_out);

/* ---- request table (req_to_token) ------------------------------------- */

typedef struct kva_req_table kva_req_table;

kva_status kva_req_table_create(kva_pool *pool, int max_requests, int max_context_len,
                                kva_req_table **out);
/* Releases every live request's pages. */
void kva_req_table_destroy(kva_req_table *table);

kva_status kva_req_alloc(kva_req_table *table, int *slot);
/* Grows a request by num_tokens positions, allocating pages as needed.
 * All or nothing: KVA_ERR_OUT_OF_PAGES / KVA_ERR_CAPACITY leave it unchanged. */
kva_status kva_req_append(kva_req_table *table, int slot, int num_tokens);
/* New request whose first prefix_len positions are src's: whole pages are
 * shared (refcount+1); a partial last page is copied into a fresh page. */
kva_status kva_req_fork(kva_req_table *table, int src_slot, int prefix_len, int *new_slot);
/* Shrinks a request to new_len positions (speculative decoding rejects),
 * dropping its references to pages no longer used. */
kva_status kva_req_truncate(kva_req_table *table, int slot, int new_len);
/* Drops every page reference of the request and frees its slot. */
kva_status kva_req_release(kva_req_table *table, int slot);
int kva_req_len(const kva_req_table *table, int slot);           /* -1 if not live */
/* Row of req_to_token: KV slot (page * page_size + offset) of each position;
 * NULL if not live. Valid until the next call that changes the request. */
const int32_t *kva_req_tokens(const kva_req_table *table, int slot);
int kva_req_num_live(const kva_req_table *table);

/* ---- batch planning ---------------------------------------------------- */

/* One forward step. Request i attends with its num_new[i] query tokens to
 * KV positions [0, num_cached[i] + num_new[i]); the new tokens' KV goes to
 * positions [num_cached[i], num_cached[i] + num_new[i]), which the request
 * must already hold (kva_req_append). A request with num_new <= 8 is a
 * decode request; larger is extend (prefill). Any mix is allowed. */
typedef struct kva_batch {
  int num_requests;
  const int32_t *req_slots;
  const int32_t *num_cached;
  const int32_t *num_new;
} kva_batch;

typedef struct kva_plan_config {
  int max_batch;      /* most requests in one step */
  int max_q_tokens;   /* most new tokens in one step (sum of num_new) */
  int num_qo_heads;   /* multiple of the pool's num_kv_heads */
  int num_workers;    /* split-KV workers; 0 = the context's (threads or SMs x CTAs/SM) */
  int split_block;    /* KV tokens per schedule block; 0 = backend default */
  /* 1: bitwise the same output for the same inputs, run after run. 0 (the
   * default): the CUDA decode kernel may share a long request's key tiles
   * among its split chunks at run time (SMs stream at different rates), so
   * which chunk sums which keys, and so the last bits, vary between runs. */
  int deterministic;
} kva_plan_config;

typedef struct kva_plan kva_plan;

/* Work of one split-KV worker (FlashMLA's tile scheduler metadata): requests
 * begin_req..end_req inclusive, the first from position begin_pos, the last up
 * to end_pos (exclusive), those between whole. begin_split is the index of the
 * worker's first chunk among begin_req's splits. A worker with no work has
 * begin_req > end_req. begin_req and end_req are positions in the plan's
 * sched_order (kva_plan_info): the identity for MHA pools; MLA plans walk
 * the requests longest first, packed so that fewer of them are cut. */
typedef struct kva_split_work {
  int32_t begin_req, begin_pos, end_req, end_pos, begin_split;
} kva_split_work;

/* One chunk of a worker's range: at schedule position pos (begin_req <= pos
 * <= end_req; the request is sched_order[pos], of kv_len keys) the worker
 * attends keys [k0, k1), which are split number `split` of that request's
 * split_indptr[r+1] - split_indptr[r]. */
typedef struct kva_split_chunk {
  int32_t k0, k1, split;
} kva_split_chunk;
kva_split_chunk kva_split_work_chunk(const kva_split_work *work, int pos, int32_t kv_len);

/* The plan as the host sees it; arrays owned by the plan, valid until the next
 * kva_plan_update. */
typedef struct kva_plan_info {
  int num_requests, total_q, total_k, max_q_len, max_k_len;
  int num_decode, num_extend;        /* requests of each kind */
  const int32_t *cu_seqlens_q;       /* [num_requests + 1] */
  const int32_t *cu_seqlens_k;       /* [num_requests + 1] */
  const int32_t *cache_seqlens;      /* [num_requests] = num_cached + num_new */
  const int32_t *page_table;         /* [num_requests, page_table_stride] page ids */
  int page_table_stride;             /* = max pages of any request this step */
  const int32_t *kv_indptr;          /* [num_requests + 1] ragged page list */
  const int32_t *kv_indices;         /* [kv_indptr[num_requests]] */
  const int32_t *kv_last_page_len;   /* [num_requests] */
  const int32_t *out_cache_loc;      /* [total_q] KV slot of each new token */
  int num_workers;
  const kva_split_work *split_schedule; /* [num_workers] */
  const int32_t *split_indptr;       /* [num_requests + 1]: request r's splits are
                                        split_indptr[r] .. split_indptr[r+1]-1 */
  int num_splits_total;
  const int32_t *sched_order;        /* [num_requests]: worker ranges walk
                                        sched_order[begin_req..end_req] */
} kva_plan_info;

kva_status kva_plan_create(kva_req_table *table, const kva_plan_config *config, kva_plan **out);
void kva_plan_destroy(kva_plan *plan);
/* Builds the step's metadata on the host and (CUDA) queues its upload into the
 * plan's fixed device buffers on the context's stream. On failure the plan
 * keeps its previous batch. */
kva_status kva_plan_update(kva_plan *plan, const kva_batch *batch);
kva_status kva_plan_get_info(const kva_plan *plan, kva_plan_info *info);

/* Plans whose batches name their pages directly, as FA3's page_table and
 * cache_seqlens do (no request table; the caller manages the pages). */
kva_status kva_plan_create_paged(kva_pool *pool, const kva_plan_config *config,
                                 int max_pages_per_req, kva_plan **out);

typedef struct kva_paged_batch {
  int num_requests;
  const int32_t *num_new;       /* [num_requests] new (query) tokens, >= 1 */
  const int32_t *cache_seqlens; /* [num_requests] KV length including the new tokens */
  const int32_t *page_table;    /* [num_requests, page_table_stride] page ids (host) */
  int page_table_stride;        /* >= pages of the longest request, <= max_pages_per_req */
} kva_paged_batch;

/* As kva_plan_update, for a plan made by kva_plan_create_paged (each call
 * form refuses the other's plan with KVA_ERR_STATE). Page ids must be in
 * [0, num_pages); pages may be shared between requests, but the slots of new
 * tokens should not be (kva_store_kv would write them twice). New token t of
 * request r sits at position cache_seqlens[r] - num_new[r] + t, KV slot
 * page_table[r][pos / page_size] * page_size + pos % page_size. */
kva_status kva_plan_update_paged(kva_plan *plan, const kva_paged_batch *batch);

/* ---- per-layer run ----------------------------------------------------- */

/* Writes the batch's new K/V ([total_q, num_kv_heads, head_dim], dtype f32,
 * f16 or bf16, device memory) into the layer's pages at out_cache_loc,
 * quantizing for fp8 pools. MLA: k is [total_q, 576], v must be NULL. */
kva_status kva_store_kv(kva_plan *plan, kva_pool *pool, int layer, const void *k, const void *v,
                        kva_dtype dtype);

typedef struct kva_attn_params {
  float sm_scale;      /* 0 = 1/sqrt(head_dim) */
  int causal;          /* new token i of a request with p cached sees keys 0..p+i */
  int window_left;     /* < 0: off; else keys >= query position - window_left */
  float logit_softcap; /* 0: off; else logits = cap * tanh(logits / cap) */
} kva_attn_params;

/* Sensible defaults: sm_scale 0, causal 1, window_left -1, softcap 0. */
kva_attn_params kva_attn_params_default(void);

/* kva_store_kv and kva_attention take the plan's pool or any pool of the
 * same geometry (layout, num_pages, page_size, num_kv_heads, head_dim,
 * kv_dtype), e.g. one kva_pool_create_external pool per layer planned once
 * per step. */

/* Attention of the plan's batch over one layer of the pool.
 * q, o: [total_q, num_qo_heads, head_dim] of dtype (f32, f16, bf16).
 * lse: [total_q, num_qo_heads] f32, or NULL.
 * MLA pools (FlashMLA's decode): q [total_q, num_qo_heads, 576], o
 * [total_q, num_qo_heads, 512]; every request has 1..8 new tokens; no
 * sliding window or soft-cap (KVA_ERR_UNSUPPORTED otherwise). */
kva_status kva_attention(kva_plan *plan, const kva_pool *pool, int layer,
                         const kva_attn_params *params, const void *q, void *o, float *lse,
                         kva_dtype dtype);

/* Merge two partial attention states over disjoint key sets (FlashInfer's
 * merge_state): v [num_tokens, num_heads, head_dim] of dtype, s (LSE)
 * [num_tokens, num_heads] f32. v_out/s_out may alias a's. s_out may be NULL.
 * An LSE of -inf means "no keys": the other state passes through. */
kva_status kva_merge_states(kva_context *ctx, int num_tokens, int num_heads, int head_dim,
                            kva_dtype dtype, const void *v_a, const float *s_a, const void *v_b,
                            const float *s_b, void *v_out, float *s_out);

/* ---- decode under CUDA graphs ----------------------------------------- */

/* A graph state owns one plan whose device metadata (header, cu_seqlens,
 * cache_seqlens, page table, split schedule, workspace) sits at fixed
 * addresses sized for max_batch requests of up to max_q_per_req tokens. The
 * library's decode kernels read only those buffers and launch with a
 * configuration fixed by the capacities, so one captured step replays any
 * batch of its bucket's size or smaller.
 *
 *   kva_graph_state_create(table, &cfg, &gs);
 *   plan = kva_graph_state_plan(gs);            // pass to store_kv/attention
 *   for each bucket b:  kva_graph_begin_capture(gs, b);
 *                       per layer: kva_store_kv(plan,...); kva_attention(plan,...);
 *                       (plus the caller's own kernels on the same stream)
 *                       kva_graph_end_capture(gs, b);
 *   each step:          kva_graph_prepare(gs, &batch, &b);  // async metadata upload
 *                       kva_graph_replay(gs, b);
 *
 * CUDA: capture is stream capture on the context's stream (nothing runs while
 * capturing); prepare plans on the host and queues the upload on the stream
 * without host synchronization. CPU: capture records the library's calls (the
 * caller's own work is not recorded) and replay runs them, so engine code does
 * not branch on the device. Decode only: every request of a replayed batch
 * must have 1..max_q_per_req new tokens. */
typedef struct kva_graph_state kva_graph_state;

typedef struct kva_graph_config {
  int max_batch;       /* largest bucket */
  int max_q_per_req;   /* 1..8 (speculative verify) */
  int num_qo_heads;
  int num_workers;     /* 0 = backend default */
  const int *buckets;  /* ascending batch sizes; NULL = 1,2,4,8,16,24,32,48,64,... up to max_batch */
  int num_buckets;
} kva_graph_config;

kva_status kva_graph_state_create(kva_req_table *table, const kva_graph_config *config,
                                  kva_graph_state **out);
void kva_graph_state_destroy(kva_graph_state *gs);
kva_plan *kva_graph_state_plan(kva_graph_state *gs);
int kva_graph_num_buckets(const kva_graph_state *gs);
int kva_graph_bucket_size(const kva_graph_state *gs, int bucket); /* -1 if out of range */
/* Index of the smallest bucket holding batch_size requests, or -1. */
int kva_graph_bucket_for(const kva_graph_state *gs, int batch_size);
kva_status kva_graph_begin_capture(kva_graph_state *gs, int bucket);
kva_status kva_graph_end_capture(kva_graph_state *gs, int bucket);
/* Plans the batch into the fixed buffers and returns the bucket to replay. */
kva_status kva_graph_prepare(kva_graph_state *gs, const kva_batch *batch, int *bucket);
kva_status kva_graph_replay(kva_graph_state *gs, int bucket);

#ifdef __cplusplus
}
#endif
#endif /* KVATTN_H */
