/* The CPU backend: host memory, a thread pool, and the hooks. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_internal.h"
#include "cpu/cpu_simd.h"

static kva_status cpu_init(kva_context *ctx, const kva_context_config *cfg) {
  int n = cfg->num_threads;
  if (n == 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    n = c > 0 ? (int)c : 1;
  }
  kva_cpu_state *st = (kva_cpu_state *)calloc(1, sizeof(*st));
  if (!st) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_context_create: out of host memory");
  st->pool = kva_threadpool_create(n);
  if (!st->pool) {
    free(st);
    return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_context_create: cannot start %d threads", n);
  }
  const char *scalar = getenv("KVA_CPU_SCALAR");
  st->simd = kva_cpu_has_avx2() && !(scalar && scalar[0] == '1');
  ctx->backend_state = st;
  ctx->num_workers = kva_threadpool_size(st->pool);
  ctx->default_split_block = 64;
  return KVA_OK;
}

static void cpu_shutdown(kva_context *ctx) {
  kva_cpu_state *st = kva_cpu_state_of(ctx);
  if (!st) return;
  kva_threadpool_destroy(st->pool);
  free(st);
  ctx->backend_state = NULL;
}

static kva_status cpu_alloc(kva_context *ctx, size_t bytes, void **out) {
  (void)ctx;
  size_t rounded = (bytes + 63) & ~(size_t)63;
  void *p = rounded >= bytes ? aligned_alloc(64, rounded) : NULL;
  if (!p) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate %zu bytes", bytes);
  *out = p;
  return KVA_OK;
}
static void cpu_free(kva_context *ctx, void *p) {
  (void)ctx;
  free(p);
}
static kva_status cpu_zero(kva_context *ctx, void *p, size_t bytes) {
  (void)ctx;
  memset(p, 0, bytes);
  return KVA_OK;
}
static kva_status cpu_copy(kva_context *ctx, void *dst, const void *src, size_t bytes) {
  (void)ctx;
  memmove(dst, src, bytes);
  return KVA_OK;
}
static kva_status cpu_sync(kva_context *ctx) {
  (void)ctx;
  return KVA_OK;
}
static kva_status cpu_set_stream(kva_context *ctx, void *stream) {
  ctx->stream = stream; /* accepted and ignored */
  return KVA_OK;
}
static int cpu_default_workers(const kva_context *ctx, const kva_pool *pool, int num_qo_heads) {
  (void)pool;
  (void)num_qo_heads;
  return ctx->num_workers;
}

const kva_backend kva_cpu_backend = {
    .name = "cpu",
    .device = KVA_DEVICE_CPU,
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .mem_alloc = cpu_alloc,
    .mem_free = cpu_free,
    .mem_zero = cpu_zero,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .synchronize = cpu_sync,
    .set_stream = cpu_set_stream,
    .default_workers = cpu_default_workers,
    .copy_slots = kva_cpu_copy_slots,
    .store_kv = kva_cpu_store_kv,
    .attention = kva_cpu_attention,
    .merge_states = kva_cpu_merge_states,
};
