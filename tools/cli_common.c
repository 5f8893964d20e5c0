#include "cli_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dtype.h"

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_parse_device(const char *s, kva_device *out) {
  if (!strcmp(s, "cpu")) *out = KVA_DEVICE_CPU;
  else if (!strcmp(s, "cuda")) *out = KVA_DEVICE_CUDA;
  else return 0;
  return 1;
}

int cli_parse_dtype(const char *s, kva_dtype *out) {
  if (!strcmp(s, "f32")) *out = KVA_F32;
  else if (!strcmp(s, "f16")) *out = KVA_F16;
  else if (!strcmp(s, "bf16")) *out = KVA_BF16;
  else if (!strcmp(s, "fp8")) *out = KVA_FP8_E4M3;
  else return 0;
  return 1;
}

int cli_parse_list(const char *s, int *out, int max) {
  int n = 0;
  while (*s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || n == max || v <= 0 || v > 1 << 30) return -1;
    out[n++] = (int)v;
    s = end;
    if (*s == ',') s++;
    else if (*s) return -1;
  }
  return n;
}

void cli_fill_random(cli_rng *r, void *buf, size_t n, kva_dtype t, float amp) {
  for (size_t i = 0; i < n; i++) kva_store_f32(buf, i, t, amp * cli_uniform(r));
}

void cli_fill_nan(void *buf, size_t n, kva_dtype t) {
  for (size_t i = 0; i < n; i++) kva_store_f32(buf, i, t, NAN);
}

void cli_to_f32(const void *buf, size_t n, kva_dtype t, float *out) {
  for (size_t i = 0; i < n; i++) out[i] = kva_load_f32(buf, i, t);
}
