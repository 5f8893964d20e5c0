/* Small helpers shared by the C tests. */
#ifndef KVA_TESTUTIL_H
#define KVA_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>

#include "kvattn.h"

extern int tu_checks, tu_failures;

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

/* Prints "N passed, N failed" and returns the exit code. */
int tu_summary(const char *name);

/* splitmix64 */
typedef struct { uint64_t s; } tu_rng;
uint64_t tu_next(tu_rng *r);
int tu_int(tu_rng *r, int lo, int hi);   /* inclusive */
float tu_uniform(tu_rng *r);             /* [-1, 1) */
double tu_normal(tu_rng *r);

#endif
