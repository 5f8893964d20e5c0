/* Decode under CUDA graphs, the whole pattern: init once, capture one graph
 * per batch-size bucket, then each step plan the real batch into the fixed
 * buffers and replay the bucket's graph. Runs on CUDA when present, else on
 * the CPU through the same API (the CPU records and replays the calls).
 *   build/example_graph_decode [cpu|cuda]                                  */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvattn.h"

#define TRY(call)                                                                          \
  do {                                                                                     \
    kva_status s_ = (call);                                                                \
    if (s_ != KVA_OK) {                                                                    \
      fprintf(stderr, "%s failed: %s: %s\n", #call, kva_strerror(s_), kva_last_error());   \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

enum { LAYERS = 4, HQ = 32, HKV = 8, D = 128, MAX_BS = 64, STEPS = 50 };

int main(int argc, char **argv) {
  kva_device dev = kva_device_available(KVA_DEVICE_CUDA) == KVA_OK ? KVA_DEVICE_CUDA : KVA_DEVICE_CPU;
  if (argc > 1) dev = strcmp(argv[1], "cuda") == 0 ? KVA_DEVICE_CUDA : KVA_DEVICE_CPU;

  /* 1. init: context, pool, request table, graph state (fixed-address plan) */
  kva_context *ctx;
  kva_context_config cc = {dev, 0, 0};
  TRY(kva_context_create(&cc, &ctx));
  kva_pool_config pc = {KVA_LAYOUT_MHA, LAYERS, 4096, 16, HKV, D, KVA_BF16};
  kva_pool *pool;
  TRY(kva_pool_create(ctx, &pc, &pool));
  kva_req_table *table;
  TRY(kva_req_table_create(pool, MAX_BS, 4096, &table));
  kva_graph_config gc = {MAX_BS, 1, HQ, 0, NULL, 0};
  kva_graph_state *gs;
  TRY(kva_graph_state_create(table, &gc, &gs));
  kva_plan *plan = kva_graph_state_plan(gs);

  /* the engine's fixed activation buffers, sized for the largest bucket */
  size_t qbytes = (size_t)MAX_BS * HQ * D * 2, kvbytes = (size_t)MAX_BS * HKV * D * 2;
  void *q, *k, *v, *o;
  TRY(kva_malloc(ctx, qbytes, &q));
  TRY(kva_malloc(ctx, qbytes, &o));
  TRY(kva_malloc(ctx, kvbytes, &k));
  TRY(kva_malloc(ctx, kvbytes, &v));
  uint16_t *host = calloc(qbytes / 2, 2);
  for (size_t i = 0; i < qbytes / 2; i++) host[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 256); /* bf16 in [1,2) */
  TRY(kva_copy_to_device(ctx, q, host, qbytes));
  TRY(kva_copy_to_device(ctx, k, host, kvbytes));
  TRY(kva_copy_to_device(ctx, v, host, kvbytes));

  /* 2. capture: one graph per bucket (the engine would add its own kernels) */
  kva_attn_params ap = kva_attn_params_default();
  for (int b = 0; b < kva_graph_num_buckets(gs); b++) {
    TRY(kva_graph_begin_capture(gs, b));
    for (int l = 0; l < LAYERS; l++) {
      TRY(kva_store_kv(plan, pool, l, k, v, KVA_BF16));
      TRY(kva_attention(plan, pool, l, &ap, q, o, NULL, KVA_BF16));
    }
    TRY(kva_graph_end_capture(gs, b));
  }

  /* 3. serve: requests join with a prompt (KV written by an eager extend step
   * in a real engine; here the positions are simply reserved), then decode */
  int32_t slots[MAX_BS], cached[MAX_BS], nnew[MAX_BS];
  int n = 0;
  for (int step = 0; step < STEPS; step++) {
    if (n < MAX_BS && step % 2 == 0) { /* a request joins */
      TRY(kva_req_alloc(table, &slots[n]));
      TRY(kva_req_append(table, slots[n], 100 + 37 * n));
      n++;
    }
    if (step % 7 == 6 && n > 1) { /* the oldest leaves */
      TRY(kva_req_release(table, slots[0]));
      memmove(slots, slots + 1, (size_t)(n - 1) * sizeof(int32_t));
      n--;
    }
    for (int i = 0; i < n; i++) {
      cached[i] = kva_req_len(table, slots[i]);
      nnew[i] = 1;
      TRY(kva_req_append(table, slots[i], 1));
    }
    kva_batch batch = {n, slots, cached, nnew};
    int bucket;
    TRY(kva_graph_prepare(gs, &batch, &bucket)); /* async metadata upload */
    TRY(kva_graph_replay(gs, bucket));
    if (step % 10 == 0) printf("step %2d: batch %2d -> bucket of %2d\n", step, n, kva_graph_bucket_size(gs, bucket));
  }
  TRY(kva_synchronize(ctx));
  printf("graph_decode on %s: %d steps replayed, %d pages free\n", dev == KVA_DEVICE_CUDA ? "cuda" : "cpu",
         STEPS, kva_pool_num_free_pages(pool));
  free(host);
  kva_free(ctx, q); kva_free(ctx, o); kva_free(ctx, k); kva_free(ctx, v);
  kva_graph_state_destroy(gs);
  kva_req_table_destroy(table);
  kva_pool_destroy(pool);
  kva_context_destroy(ctx);
  return 0;
}
