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

/* random numbers: src/ref/rng.h */
#include "ref/rng.h"
typedef kva_rng tu_rng;
#define tu_next kva_rng_next
#define tu_int kva_rng_int
#define tu_uniform kva_rng_uniform
#define tu_normal kva_rng_normal

#endif
