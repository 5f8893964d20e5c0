/* Decode under CUDA graphs: a fixed-address plan, one captured graph per
 * batch-size bucket, replay after an asynchronous metadata upload.
 * Backends without graph hooks (CPU) get a recorder: capture records the
 * library's calls and replay runs them against the current metadata. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

typedef struct kva_graph_op {
  int is_attention;
  kva_pool *pool;
  int layer;
  kva_attn_params params;
  const void *q, *k, *v;
  void *o;
  float *lse;
  kva_dtype dtype;
} kva_graph_op;

struct kva_graph_recorder {
  kva_graph_op *ops;
  int count, cap;
};

struct kva_graph_state {
  kva_plan *plan;
  kva_context *ctx;
  int max_q_per_req;
  int num_buckets;
  int *bucket_size;                 /* [num_buckets] ascending */
  void **graphs;                    /* [num_buckets] backend graph handles */
  struct kva_graph_recorder *recs;  /* [num_buckets] CPU recordings */
  int *captured;                    /* [num_buckets] */
  int capturing;                    /* bucket being captured, -1 if none */
};

static kva_status record(struct kva_graph_recorder *rec, const kva_graph_op *op) {
  if (rec->count == rec->cap) {
    int cap = rec->cap ? 2 * rec->cap : 16;
    kva_graph_op *ops = (kva_graph_op *)realloc(rec->ops, (size_t)cap * sizeof(*ops));
    if (!ops) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva graph capture: out of host memory");
    rec->ops = ops;
    rec->cap = cap;
  }
  rec->ops[rec->count++] = *op;
  return KVA_OK;
}

kva_status kva_graph_record_store(struct kva_graph_recorder *rec, kva_pool *pool, int layer,
                                  const void *k, const void *v, kva_dtype dtype) {
  kva_graph_op op;
  memset(&op, 0, sizeof(op));
  op.pool = pool;
  op.layer = layer;
  op.k = k;
  op.v = v;
  op.dtype = dtype;
  return record(rec, &op);
}

kva_status kva_graph_record_attention(struct kva_graph_recorder *rec, const kva_pool *pool,
                                      int layer, const kva_attn_params *params, const void *q,
                                      void *o, float *lse, kva_dtype dtype) {
  kva_graph_op op;
  memset(&op, 0, sizeof(op));
  op.is_attention = 1;
  op.pool = (kva_pool *)pool;
  op.layer = layer;
  op.params = *params;
  op.q = q;
  op.o = o;
  op.lse = lse;
  op.dtype = dtype;
  return record(rec, &op);
}

static int default_buckets(int max_batch, int *out) {
  /* SGLang's capture list: 1, 2, 4, 8, then steps of 8 to 32, of 16 to 256, of 32 beyond */
  int n = 0, b = 1;
  while (b < max_batch) {
    if (out) out[n] = b;
    n++;
    b = b < 8 ? b * 2 : b < 32 ? b + 8 : b < 256 ? b + 16 : b + 32;
  }
  if (out) out[n] = max_batch;
  return n + 1;
}

kva_status kva_graph_state_create(kva_req_table *table, const kva_graph_config *config,
                                  kva_graph_state **out) {
  KVA_CHECK_NULL(table, "kva_graph_state_create");
  KVA_CHECK_NULL(config, "kva_graph_state_create");
  KVA_CHECK_NULL(out, "kva_graph_state_create");
  *out = NULL;
  if (config->max_batch <= 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "kva_graph_state_create: config->max_batch must be > 0 (got %d)",
                         config->max_batch);
  if (config->max_q_per_req < 1 || config->max_q_per_req > KVA_MAX_DECODE_Q)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                         "kva_graph_state_create: config->max_q_per_req must be 1..%d (got %d)",
                         KVA_MAX_DECODE_Q, config->max_q_per_req);
  int nb = config->buckets ? config->num_buckets : default_buckets(config->max_batch, NULL);
  if (config->buckets) {
    if (nb <= 0)
      return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                           "kva_graph_state_create: config->num_buckets must be > 0");
    for (int i = 0; i < nb; i++) {
      int b = config->buckets[i];
      if (b <= 0 || b > config->max_batch || (i > 0 && b <= config->buckets[i - 1]))
        return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                             "kva_graph_state_create: config->buckets[%d] = %d must be ascending "
                             "in 1..max_batch (%d)",
                             i, b, config->max_batch);
    }
  }

  kva_graph_state *gs = (kva_graph_state *)calloc(1, sizeof(*gs));
  if (gs) {
    gs->bucket_size = (int *)calloc((size_t)nb, sizeof(int));
    gs->graphs = (void **)calloc((size_t)nb, sizeof(void *));
    gs->recs = (struct kva_graph_recorder *)calloc((size_t)nb, sizeof(*gs->recs));
    gs->captured = (int *)calloc((size_t)nb, sizeof(int));
  }
  if (!gs || !gs->bucket_size || !gs->graphs || !gs->recs || !gs->captured) {
    kva_graph_state_destroy(gs);
    return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_graph_state_create: out of host memory");
  }
  gs->num_buckets = nb;
  gs->capturing = -1;
  gs->max_q_per_req = config->max_q_per_req;
  if (config->buckets)
    memcpy(gs->bucket_size, config->buckets, (size_t)nb * sizeof(int));
  else
    default_buckets(config->max_batch, gs->bucket_size);

  kva_plan_config pc;
  memset(&pc, 0, sizeof(pc));
  pc.max_batch = config->max_batch;
  pc.max_q_tokens = config->max_batch * config->max_q_per_req;
  pc.num_qo_heads = config->num_qo_heads;
  pc.num_workers = config->num_workers;
  kva_status st = kva_plan_create(table, &pc, &gs->plan);
  if (st != KVA_OK) {
    kva_graph_state_destroy(gs);
    return st; /* message set by kva_plan_create */
  }
  gs->plan->graph_mode = 1;
  gs->plan->decode_q_cap = config->max_q_per_req; /* prepare refuses more */
  gs->ctx = gs->plan->ctx;
  *out = gs;
  return KVA_OK;
}

void kva_graph_state_destroy(kva_graph_state *gs) {
  if (!gs) return;
  for (int i = 0; gs->graphs && i < gs->num_buckets; i++)
    if (gs->graphs[i] && gs->ctx->backend->graph_destroy)
      gs->ctx->backend->graph_destroy(gs->ctx, gs->graphs[i]);
  for (int i = 0; gs->recs && i < gs->num_buckets; i++) free(gs->recs[i].ops);
  kva_plan_destroy(gs->plan);
  free(gs->bucket_size);
  free(gs->graphs);
  free(gs->recs);
  free(gs->captured);
  free(gs);
}

kva_plan *kva_graph_state_plan(kva_graph_state *gs) { return gs ? gs->plan : NULL; }
int kva_graph_num_buckets(const kva_graph_state *gs) { return gs ? gs->num_buckets : 0; }

int kva_graph_bucket_size(const kva_graph_state *gs, int bucket) {
  if (!gs || bucket < 0 || bucket >= gs->num_buckets) return -1;
  return gs->bucket_size[bucket];
}

int kva_graph_bucket_for(const kva_graph_state *gs, int batch_size) {
  if (!gs || batch_size <= 0) return -1;
  for (int i = 0; i < gs->num_buckets; i++)
    if (gs->bucket_size[i] >= batch_size) return i;
  return -1;
}

static kva_status check_bucket(const kva_graph_state *gs, int bucket, const char *fn) {
  if (!gs) return kva_set_error(KVA_ERR_NULL_ARGUMENT, "%s: gs is NULL", fn);
  if (bucket < 0 || bucket >= gs->num_buckets)
    return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: bucket %d is not in [0, %d)", fn, bucket,
                         gs->num_buckets);
  return KVA_OK;
}

kva_status kva_graph_begin_capture(kva_graph_state *gs, int bucket) {
  kva_status st = check_bucket(gs, bucket, "kva_graph_begin_capture");
  if (st != KVA_OK) return st;
  if (gs->capturing >= 0)
    return kva_set_error(KVA_ERR_STATE, "kva_graph_begin_capture: bucket %d is being captured",
                         gs->capturing);
  const kva_backend *be = gs->ctx->backend;
  if (be->graph_begin) {
    st = be->graph_begin(gs->ctx);
    if (st != KVA_OK) return st;
  } else {
    gs->recs[bucket].count = 0;
    gs->plan->recorder = &gs->recs[bucket];
  }
  gs->plan->capturing = 1;
  gs->capturing = bucket;
  return KVA_OK;
}

kva_status kva_graph_end_capture(kva_graph_state *gs, int bucket) {
  kva_status st = check_bucket(gs, bucket, "kva_graph_end_capture");
  if (st != KVA_OK) return st;
  if (gs->capturing != bucket)
    return kva_set_error(KVA_ERR_STATE, "kva_graph_end_capture: bucket %d is not being captured",
                         bucket);
  const kva_backend *be = gs->ctx->backend;
  gs->plan->capturing = 0;
  gs->plan->recorder = NULL;
  gs->capturing = -1;
  if (be->graph_end) {
    void *graph = NULL;
    st = be->graph_end(gs->ctx, &graph);
    if (st != KVA_OK) return st;
    if (gs->graphs[bucket] && be->graph_destroy) be->graph_destroy(gs->ctx, gs->graphs[bucket]);
    gs->graphs[bucket] = graph;
  }
  gs->captured[bucket] = 1;
  return KVA_OK;
}

kva_status kva_graph_prepare(kva_graph_state *gs, const kva_batch *batch, int *bucket) {
  KVA_CHECK_NULL(gs, "kva_graph_prepare");
  KVA_CHECK_NULL(batch, "kva_graph_prepare");
  KVA_CHECK_NULL(bucket, "kva_graph_prepare");
  if (gs->capturing >= 0)
    return kva_set_error(KVA_ERR_STATE, "kva_graph_prepare: called during capture of bucket %d",
                         gs->capturing);
  int b = kva_graph_bucket_for(gs, batch->num_requests);
  if (b < 0)
    return kva_set_error(KVA_ERR_CAPACITY,
                         "kva_graph_prepare: batch->num_requests %d fits no bucket (largest %d)",
                         batch->num_requests, gs->bucket_size[gs->num_buckets - 1]);
  if (batch->num_new)
    for (int i = 0; i < batch->num_requests; i++)
      if (batch->num_new[i] < 1 || batch->num_new[i] > gs->max_q_per_req)
        return kva_set_error(KVA_ERR_INVALID_ARGUMENT,
                             "kva_graph_prepare: batch->num_new[%d] = %d, graphs take decode "
                             "steps of 1..%d tokens",
                             i, batch->num_new[i], gs->max_q_per_req);
  kva_status st = kva_plan_update(gs->plan, batch);
  if (st != KVA_OK) return st;
  *bucket = b;
  return KVA_OK;
}

kva_status kva_graph_replay(kva_graph_state *gs, int bucket) {
  kva_status st = check_bucket(gs, bucket, "kva_graph_replay");
  if (st != KVA_OK) return st;
  if (!gs->captured[bucket])
    return kva_set_error(KVA_ERR_STATE, "kva_graph_replay: bucket %d (size %d) was not captured",
                         bucket, gs->bucket_size[bucket]);
  if (!gs->plan->valid)
    return kva_set_error(KVA_ERR_STATE, "kva_graph_replay: no batch prepared (kva_graph_prepare)");
  const kva_backend *be = gs->ctx->backend;
  if (be->graph_launch) return be->graph_launch(gs->ctx, gs->graphs[bucket]);
  const struct kva_graph_recorder *rec = &gs->recs[bucket];
  for (int i = 0; i < rec->count; i++) {
    const kva_graph_op *op = &rec->ops[i];
    st = op->is_attention ? be->attention(gs->plan, op->pool, op->layer, &op->params, op->q, op->o,
                                          op->lse, op->dtype)
                          : be->store_kv(gs->plan, op->pool, op->layer, op->k, op->v, op->dtype);
    if (st != KVA_OK) return st;
  }
  return KVA_OK;
}
