#include "testutil.h"

#include <math.h>

#include "ref/reference.h"

int tu_checks = 0, tu_failures = 0;

int tu_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, tu_checks - tu_failures, tu_failures);
  return tu_failures ? 1 : 0;
}

void tu_fill_uniform(tu_rng *r, float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * 0.5f * (tu_uniform(r) + 1.0f);
}

void tu_poison(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = nanf("");
}

void tu_check_lse(const char *name, int with_lse, const double *ref, const float *got, size_t n) {
  if (with_lse) {
    double le = kva_ref_max_abs_error(ref, got, n);
    CHECK(le < 1e-3, "%s: LSE max abs error %.3g", name, le);
  } else {
    int untouched = 1;
    for (size_t i = 0; i < n; i++) untouched &= isnan(got[i]);
    CHECK(untouched, "%s: lse written although NULL was passed", name);
  }
}

kva_context *tu_cpu_context(int num_threads) {
  kva_context_config cc = {KVA_DEVICE_CPU, num_threads, 0};
  kva_context *ctx = NULL;
  if (kva_context_create(&cc, &ctx) != KVA_OK)
    fprintf(stderr, "tu_cpu_context: %s\n", kva_last_error());
  return ctx;
}

kva_pool *tu_pool(kva_context *ctx, kva_layout layout, int num_layers, int num_pages,
                  int page_size, int num_kv_heads, int head_dim, kva_dtype kv_dtype) {
  kva_pool_config pc = {layout, num_layers, num_pages, page_size, num_kv_heads, head_dim,
                        kv_dtype};
  kva_pool *pool = NULL;
  if (kva_pool_create(ctx, &pc, &pool) != KVA_OK)
    fprintf(stderr, "tu_pool: %s\n", kva_last_error());
  return pool;
}
