/* Small helpers shared by the C tests. */
#ifndef KVA_TESTUTIL_H
#define KVA_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvattn.h"

extern int tu_checks, tu_failures;

/* Counts a check; on failure prints file:line and the printf-style message. */
#define CHECK(cond, ...)                                   \
  do {                                                     \
    tu_checks++;                                           \
    if (!(cond)) {                                         \
      tu_failures++;                                       \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
    }                                                      \
  } while (0)

/* CHECK that a call returns the expected status. */
#define CHECK_STATUS(call, expect)                                                      \
  do {                                                                                  \
    kva_status s_ = (call);                                                             \
    CHECK(s_ == (expect), "%s -> %s, expected %s (%s)", #call, kva_strerror(s_),        \
          kva_strerror(expect), kva_last_error());                                      \
  } while (0)

/* Prints "name: N passed, N failed" and returns the exit code (0 or 1). */
int tu_summary(const char *name);

/* random numbers: src/ref/rng.h (splitmix64), shared with the CLI */
#include "ref/rng.h"
typedef kva_rng tu_rng;
#define tu_next kva_rng_next     /* uint64 */
#define tu_int kva_rng_int       /* int in [lo, hi] */
#define tu_uniform kva_rng_uniform /* float in [-1, 1) */
#define tu_normal kva_rng_normal /* double N(0, 1) */

/* x[i] = uniform in [lo, hi) */
void tu_fill_uniform(tu_rng *r, float *x, size_t n, float lo, float hi);
/* x[i] = NaN, so outputs a kernel forgot to write show up */
void tu_poison(float *x, size_t n);

/* LSE as a run asked for it: within 1e-3 (absolute) of the reference when
 * requested (with_lse), else untouched, i.e. still NaN-poisoned. */
void tu_check_lse(const char *name, int with_lse, const double *ref, const float *got, size_t n);

/* CPU context with num_threads workers (0 = all cores); NULL (message
 * printed) on failure. */
kva_context *tu_cpu_context(int num_threads);
/* Pool on ctx; NULL (message printed) on failure. */
kva_pool *tu_pool(kva_context *ctx, kva_layout layout, int num_layers, int num_pages,
                  int page_size, int num_kv_heads, int head_dim, kva_dtype kv_dtype);

/* a chunk's cost in the in-order and packed walks: must match
 * KVA_SPLIT_OVERHEAD in src/core/split_schedule.c */
#define TU_SPLIT_OVERHEAD 2
/* Checks a split schedule (src/core/split_schedule.c) of n requests with
 * kv[] keys, block-key blocks and nw workers, whose workers walk the
 * requests in order[] (NULL: batch order), a chunk costing ovh blocks
 * beyond its keys (slack -1: no load-balance bound): every key of every
 * nonempty request covered exactly once, on block boundaries, one chunk per
 * (worker, request), split counts. CHECKs each; returns 0 if consistent.
 * tests/split_check.c. */
int tu_check_schedule(int n, const int32_t *kv, int block, int nw, int slack,
                      const kva_split_work *work, const int32_t *indptr, int total,
                      const int32_t *order, int ovh, const char *what);

#endif
