/* Contexts: a device, its backend and its stream; device memory helpers. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static kva_status backend_for(kva_device device, const kva_backend **out, const char *fn) {
  switch (device) {
    case KVA_DEVICE_CPU: *out = &kva_cpu_backend; return KVA_OK;
    case KVA_DEVICE_CUDA:
      *out = kva_cuda_backend_get();
      if (!*out)
        return kva_set_error(KVA_ERR_NO_DEVICE,
                             "%s: no CUDA backend in this build (nvcc was not found at configure "
                             "time, or KVA_CUDA=OFF)",
                             fn);
      return KVA_OK;
  }
  return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: device %d is not a kva_device", fn,
                       (int)device);
}

kva_status kva_device_available(kva_device device) {
  const kva_backend *be = NULL;
  kva_status st = backend_for(device, &be, "kva_device_available");
  if (st != KVA_OK || device == KVA_DEVICE_CPU) return st;
  /* Only the backend knows whether a device is present ("no CUDA device present"). */
  kva_context_config cfg = {device, 1, 0};
  kva_context *ctx = NULL;
  st = kva_context_create(&cfg, &ctx);
  kva_context_destroy(ctx);
  return st;
}

kva_status kva_context_create(const kva_context_config *config, kva_context **out) {
  static const char *fn = "kva_context_create";
  KVA_CHECK_NULL(config, fn);
  KVA_CHECK_NULL(out, fn);
  *out = NULL;
  if (config->num_threads < 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->num_threads must be >= 0 (got %d)",
                         fn, config->num_threads);
  if (config->cuda_device < 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "%s: config->cuda_device must be >= 0 (got %d)",
                         fn, config->cuda_device);
  const kva_backend *be = NULL;
  kva_status st = backend_for(config->device, &be, fn);
  if (st != KVA_OK) return st;
  kva_context *ctx = (kva_context *)calloc(1, sizeof(*ctx));
  if (!ctx) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  ctx->device = config->device;
  ctx->backend = be;
  ctx->num_workers = 1;
  ctx->default_split_block = 64;
  st = be->init(ctx, config);
  if (st != KVA_OK) {
    free(ctx);
    return st; /* the backend named the problem */
  }
  *out = ctx;
  return KVA_OK;
}

void kva_context_destroy(kva_context *ctx) {
  if (!ctx) return;
  if (ctx->backend && ctx->backend->shutdown) ctx->backend->shutdown(ctx);
  free(ctx);
}

kva_device kva_context_device(const kva_context *ctx) { return ctx ? ctx->device : KVA_DEVICE_CPU; }
int kva_context_num_workers(const kva_context *ctx) { return ctx ? ctx->num_workers : 0; }

kva_status kva_context_set_stream(kva_context *ctx, void *stream) {
  KVA_CHECK_NULL(ctx, "kva_context_set_stream");
  if (ctx->backend->set_stream) return ctx->backend->set_stream(ctx, stream);
  ctx->stream = stream;
  return KVA_OK;
}

kva_status kva_synchronize(kva_context *ctx) {
  KVA_CHECK_NULL(ctx, "kva_synchronize");
  return ctx->backend->synchronize ? ctx->backend->synchronize(ctx) : KVA_OK;
}

kva_status kva_malloc(kva_context *ctx, size_t bytes, void **out) {
  KVA_CHECK_NULL(ctx, "kva_malloc");
  KVA_CHECK_NULL(out, "kva_malloc");
  *out = NULL;
  if (bytes == 0)
    return kva_set_error(KVA_ERR_INVALID_ARGUMENT, "kva_malloc: bytes must be > 0");
  return ctx->backend->mem_alloc(ctx, bytes, out);
}

void kva_free(kva_context *ctx, void *ptr) {
  if (ctx && ptr) ctx->backend->mem_free(ctx, ptr);
}

kva_status kva_copy_to_device(kva_context *ctx, void *dst, const void *src, size_t bytes) {
  KVA_CHECK_NULL(ctx, "kva_copy_to_device");
  KVA_CHECK_NULL(dst, "kva_copy_to_device");
  KVA_CHECK_NULL(src, "kva_copy_to_device");
  if (bytes == 0) return KVA_OK;
  return ctx->backend->copy_to_device(ctx, dst, src, bytes);
}

kva_status kva_copy_to_host(kva_context *ctx, void *dst, const void *src, size_t bytes) {
  KVA_CHECK_NULL(ctx, "kva_copy_to_host");
  KVA_CHECK_NULL(dst, "kva_copy_to_host");
  KVA_CHECK_NULL(src, "kva_copy_to_host");
  if (bytes == 0) return KVA_OK;
  return ctx->backend->copy_to_host(ctx, dst, src, bytes);
}
