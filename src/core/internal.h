/* Internal structures shared by src/core, src/cpu and src/cuda. Not installed. */
#ifndef KVA_INTERNAL_H
#define KVA_INTERNAL_H

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors (errors.c) ------------------------------------------------- */

/* Records a printf-style message for kva_last_error() and returns status. */
kva_status kva_set_error(kva_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define KVA_CHECK_NULL(p, fn)                                                              \
  do {                                                                                     \
    if ((p) == NULL) return kva_set_error(KVA_ERR_NULL_ARGUMENT, "%s: %s is NULL", fn, #p); \
  } while (0)

/* ---- backend interface ------------------------------------------------- */

typedef struct kva_backend kva_backend;
typedef struct kva_plan_device kva_plan_device;

struct kva_context {
  kva_device device;
  const kva_backend *backend;
  void *backend_state;  /* owned by the backend */
  int num_workers;      /* default split-KV worker count */
  int default_split_block;
  void *stream;         /* CUDA stream (cudaStream_t) or NULL */
};

struct kva_pool {
  kva_context *ctx;
  kva_pool_config cfg;
  size_t token_elems;   /* elements per token per buffer: num_kv_heads * head_dim */
  size_t layer_bytes;   /* bytes of one layer's K (or V) buffer */
  void **k;             /* [num_layers] device pointers */
  void **v;             /* [num_layers] device pointers; NULL entries for MLA */
  float *k_scale;       /* [num_layers] */
  float *v_scale;       /* [num_layers] */
  /* allocator: refcount per page, free pages as a stack */
  int32_t *refcount;    /* [num_pages]; 0 = free */
  int32_t *free_stack;  /* [num_pages] */
  int32_t num_free;
  int external;         /* buffers are the caller's (kva_pool_create_external): never freed */
};

struct kva_req_table {
  kva_pool *pool;
  int max_requests;
  int max_context_len;
  int max_pages_per_req;  /* ceil(max_context_len / page_size) */
  int32_t *req_to_token;  /* [max_requests, max_context_len] KV slot per position */
  int32_t *len;           /* [max_requests]; -1 = slot free */
  int32_t *free_slots;    /* stack of free slots */
  int32_t num_free_slots;
};

/* Plan metadata that kernels read, in one block of int32 so that one copy
 * uploads it. The scalar header comes first so every kernel (and a CUDA graph)
 * reads batch-dependent sizes from fixed device addresses. */
typedef struct kva_plan_header {
  int32_t num_requests;
  int32_t total_q;
  int32_t max_q_len;
  int32_t max_k_len;
  int32_t page_table_stride;
  int32_t num_workers;
  int32_t num_splits_total;
  int32_t num_extend;
} kva_plan_header;

struct kva_plan {
  kva_req_table *table;
  kva_pool *pool;
  kva_context *ctx;
  kva_plan_config cfg;
  int max_pages_per_req;

  /* host metadata, sized by capacity at create */
  kva_plan_header hdr;
  int num_decode, num_extend;
  int total_k;
  int32_t *req_slots;       /* [max_batch] */
  int32_t *num_new;         /* [max_batch] */
  int32_t *cu_seqlens_q;    /* [max_batch + 1] */
  int32_t *cu_seqlens_k;    /* [max_batch + 1] */
  int32_t *cache_seqlens;   /* [max_batch] */
  int32_t *page_table;      /* [max_batch * max_pages_per_req], row stride hdr.page_table_stride */
  int32_t *kv_indptr;       /* [max_batch + 1] */
  int32_t *kv_indices;      /* [max_batch * max_pages_per_req] */
  int32_t *kv_last_page_len;/* [max_batch] */
  int32_t *out_cache_loc;   /* [max_q_tokens] */
  int32_t *q_req;           /* [max_q_tokens] request of each query token */
  int32_t *decode_reqs;     /* [max_batch] batch indices of decode requests */
  int32_t *extend_reqs;     /* [max_batch] batch indices of extend requests */

  /* Split-KV schedule over the decode requests only (extend requests have
   * zero splits here; backends run them on their own extend path). */
  kva_split_work *split_schedule; /* [cfg.num_workers] */
  /* [max_batch] the order the workers walk the requests: worker ranges
   * begin_req..end_req are positions in it (identity for MHA pools) */
  int32_t *sched_order;
  int32_t *split_indptr;    /* [max_batch + 1] */
  /* Partial states: row(r, j, t) = split_row_offset[r] + j * num_new[r] + t
   * for split j of request r and its query token t; each row holds
   * num_qo_heads x head_dim floats of O and num_qo_heads floats of LSE.
   * Requests with a single split write O directly and use no rows. */
  int32_t *split_row_offset;/* [max_batch + 1] */
  int max_partial_rows;     /* capacity: max_q_tokens + num_workers * KVA_MAX_DECODE_Q */
  void *partial_o;          /* [max_partial_rows, num_qo_heads, head_dim] f32, device */
  void *partial_lse;        /* [max_partial_rows, num_qo_heads] f32, device */

  void *backend_plan;       /* backend-owned (device copies, events) */
  int valid;                /* a batch has been planned */

  /* New tokens of the batch's longest decode request (0: none), and the
   * most any decode request may have in a batch this plan replays under a
   * CUDA graph (KVA_MAX_DECODE_Q; a graph state's max_q_per_req). Eager
   * decode launches are shaped by the first, captured ones by the second. */
  int max_decode_q, decode_q_cap;
  /* Set by a decode launch being captured, which takes the capacity's row
   * tiles (decode.cu): later batches' workers are sized for that kernel
   * (schedule), which the graph replays. */
  int decode_q_floor;
  /* Set by a kva_graph_state that owns the plan: every run launches the
   * decode path with capacity-fixed grids whatever the host counts say
   * (kernels read the real counts from device metadata). */
  int graph_mode;
  int capturing;            /* inside begin/end capture: no batch needed yet */
  /* Non-NULL while a CPU graph capture records this plan's calls. */
  struct kva_graph_recorder *recorder;
};

/* graph.c: called by run.c while plan->recorder is set (CPU capture). */
struct kva_graph_recorder;
kva_status kva_graph_record_store(struct kva_graph_recorder *rec, kva_pool *pool, int layer,
                                  const void *k, const void *v, kva_dtype dtype);
kva_status kva_graph_record_attention(struct kva_graph_recorder *rec, const kva_pool *pool,
                                      int layer, const kva_attn_params *params, const void *q,
                                      void *o, float *lse, kva_dtype dtype);

/* What a chunk's end costs a worker, in 1/KVA_SPLIT_COST_UNIT blocks
 * (the costed walk, split_schedule.c): every chunk (its Q load and pipeline
 * refill), partial rows written by a chunk that does not complete its
 * request, the merge by the chunk that completes a request of two chunks
 * (having found the other's rows written), and the merge from global
 * memory (three or more chunks, or two that end together). margin: how
 * much earlier than the head's end the rest of a cut request must end,
 * for the spread of CTA ends; min_head: the fewest blocks a cut leaves in
 * the worker that makes it. */
#define KVA_SPLIT_COST_UNIT 16
typedef struct kva_split_costs {
  int32_t chunk, partial, merge, merge_many, margin, min_head;
} kva_split_costs;

struct kva_backend {
  const char *name;
  kva_device device;
  /* Fill ctx->backend_state, ctx->num_workers, ctx->default_split_block. */
  kva_status (*init)(kva_context *ctx, const kva_context_config *config);
  void (*shutdown)(kva_context *ctx);
  kva_status (*mem_alloc)(kva_context *ctx, size_t bytes, void **out);
  void (*mem_free)(kva_context *ctx, void *ptr);
  kva_status (*mem_zero)(kva_context *ctx, void *ptr, size_t bytes);
  kva_status (*copy_to_device)(kva_context *ctx, void *dst, const void *src, size_t bytes);
  kva_status (*copy_to_host)(kva_context *ctx, void *dst, const void *src, size_t bytes);
  kva_status (*synchronize)(kva_context *ctx);
  kva_status (*set_stream)(kva_context *ctx, void *stream);
  /* Split-KV workers for a plan when its config says 0 (CPU: threads;
   * CUDA: enough CTAs over the kv heads to fill every SM), for decode
   * requests of up to max_q_len new tokens: called with 1 when the plan is
   * made (its capacity) and with the batch's longest decode request when a
   * batch is planned (a batch uses at most the capacity). */
  int (*default_workers)(const kva_context *ctx, const kva_pool *pool, int num_qo_heads,
                         int max_q_len);
  /* KV tokens per split-schedule block when the plan config says 0 (NULL:
   * ctx->default_split_block). A block that is a whole number of the
   * kernel's key tiles keeps chunk edges off partial tiles. */
  int (*default_split_block)(const kva_context *ctx, const kva_pool *pool);
  /* Blocks of `block` tokens a split-KV worker may take past its share to
   * keep a request of max_q_len new tokens whole: what a cut costs the
   * kernel beyond a chunk's overhead (its merge). NULL: 0. */
  int (*split_slack)(const kva_context *ctx, const kva_pool *pool, int num_qo_heads,
                     int max_q_len, int block);
  /* Blocks a chunk costs beyond its keys in the packed walk of MLA plans
   * (kva_split_schedule_packed): its Q load, pipeline refill and O or
   * partial write. NULL or <= 0: 2. */
  int (*split_overhead)(const kva_context *ctx, const kva_pool *pool, int num_qo_heads,
                        int max_q_len, int block);
  /* What a chunk's end costs (struct kva_split_costs, above) for the costed
   * walk of MLA plans; returns 0 to keep the packed walk. NULL: packed. */
  int (*split_costs)(const kva_context *ctx, const kva_pool *pool, int num_qo_heads,
                     int max_q_len, int block, kva_split_costs *out);

  /* Plan hooks: create backend-side buffers; publish a freshly planned batch
   * (CUDA: async upload on the stream); free. */
  kva_status (*plan_init)(kva_plan *plan);
  kva_status (*plan_upload)(kva_plan *plan);
  void (*plan_free)(kva_plan *plan);

  /* Copy tokens (all layers, K and V) from src slots to dst slots; host
   * arrays of count slot ids. Used by kva_req_fork for a partial page. */
  kva_status (*copy_slots)(kva_pool *pool, int count, const int32_t *src, const int32_t *dst);
  kva_status (*store_kv)(kva_plan *plan, kva_pool *pool, int layer, const void *k,
                         const void *v, kva_dtype dtype);
  kva_status (*attention)(kva_plan *plan, const kva_pool *pool, int layer,
                          const kva_attn_params *params, const void *q, void *o, float *lse,
                          kva_dtype dtype);
  kva_status (*merge_states)(kva_context *ctx, int num_tokens, int num_heads, int head_dim,
                             kva_dtype dtype, const void *v_a, const float *s_a,
                             const void *v_b, const float *s_b, void *v_out, float *s_out);

  /* Graph capture on the context's stream (NULL on backends without graphs:
   * the core then records calls and replays them itself). */
  kva_status (*graph_begin)(kva_context *ctx);
  kva_status (*graph_end)(kva_context *ctx, void **graph);
  kva_status (*graph_launch)(kva_context *ctx, void *graph);
  void (*graph_destroy)(kva_context *ctx, void *graph);
};

extern const kva_backend kva_cpu_backend;
/* NULL when the library was built without CUDA. */
const kva_backend *kva_cuda_backend_get(void);

/* ---- planner pieces (planner.c, split_schedule.c) ---------------------- */

/* Balanced split-KV schedule over num_requests requests of kv_len[r] tokens
 * with q_len[r] query rows each (cost of a block grows with q rows), cut in
 * blocks of `block` tokens, over num_workers workers; a worker may take up
 * to `slack` blocks more than its share to keep a request whole (uncut).
 * Writes work[num_workers] and split_indptr[num_requests + 1]; returns
 * total splits. */
int kva_split_schedule(int num_requests, const int32_t *kv_len, const int32_t *q_len, int block,
                       int num_workers, int slack, kva_split_work *work, int32_t *split_indptr);
/* Requests with kv_len[r] == 0 are skipped: zero splits, no cost. */

/* As kva_split_schedule, but the workers walk the requests in order[]
 * (written here, a permutation of 0..num_requests-1; work[] indexes
 * positions in it), longest first and packed so that fewer requests are
 * cut (split_schedule.c, "packed order"). split_indptr stays indexed by
 * request. overhead: blocks a chunk costs beyond its keys (<= 0: the
 * in-order walk's 2). Scratch: keys[num_requests], nxt[num_requests + 1]. */
int kva_split_schedule_packed(int num_requests, const int32_t *kv_len, int block, int num_workers,
                              int slack, int overhead, kva_split_work *work,
                              int32_t *split_indptr, int32_t *order, int64_t *keys,
                              int32_t *nxt);

/* As kva_split_schedule_packed (same outputs and scratch), each worker
 * charged what its chunks cost (split_schedule.c, "costed walk"); requests
 * stay whole when that needs at most `slack` blocks more capacity than
 * cutting. costs NULL or negative: the packed walk with its defaults. */
int kva_split_schedule_costed(int num_requests, const int32_t *kv_len, int block,
                              int num_workers, int slack, const kva_split_costs *costs,
                              kva_split_work *work, int32_t *split_indptr, int32_t *order,
                              int64_t *keys, int32_t *nxt);

#ifdef __cplusplus
}
#endif
#endif /* KVA_INTERNAL_H */
