/* Shared pieces of the kvattn CLI. */
#ifndef KVA_CLI_COMMON_H
#define KVA_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "kvattn.h"

int cli_check(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_demo(int argc, char **argv);

/* random numbers: src/ref/rng.h */
#include "ref/rng.h"
typedef kva_rng cli_rng;
#define cli_next kva_rng_next
#define cli_int kva_rng_int
#define cli_uniform kva_rng_uniform
#define cli_normal kva_rng_normal

double cli_now(void); /* seconds, monotonic */
int cli_parse_device(const char *s, kva_device *out);
int cli_parse_dtype(const char *s, kva_dtype *out);
/* "a,b,c" -> up to max ints; returns count or -1 */
int cli_parse_list(const char *s, int *out, int max);
/* Fills a typed buffer of n random values in [-amp, amp). */
void cli_fill_random(cli_rng *r, void *buf, size_t n, kva_dtype t, float amp);
/* Bytes of NaN in dtype (f32 / f16 / bf16 quiet NaN patterns). */
void cli_fill_nan(void *buf, size_t n, kva_dtype t);
/* Host copy of a typed buffer as f32. */
void cli_to_f32(const void *buf, size_t n, kva_dtype t, float *out);
#define CLI_TRY(call)                                                                    \
  do {                                                                                   \
    kva_status s_ = (call);                                                              \
    if (s_ != KVA_OK) {                                                                  \
      fprintf(stderr, "kvattn: %s failed: %s: %s\n", #call, kva_strerror(s_),            \
              kva_last_error());                                                         \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

#endif
