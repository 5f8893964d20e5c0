/* Shared pieces of the kvattn CLI. */
#ifndef KVA_CLI_COMMON_H
#define KVA_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "kvattn.h"

int cli_check(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_demo(int argc, char **argv);

/* splitmix64 random numbers */
typedef struct { uint64_t s; } cli_rng;
uint64_t cli_next(cli_rng *r);
int cli_int(cli_rng *r, int lo, int hi); /* inclusive */
float cli_uniform(cli_rng *r);           /* [-1, 1) */
double cli_normal(cli_rng *r);

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
