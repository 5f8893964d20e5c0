#include "cli_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dtype.h"

uint64_t cli_next(cli_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
int cli_int(cli_rng *r, int lo, int hi) { return lo + (int)(cli_next(r) % (uint64_t)(hi - lo + 1)); }
float cli_uniform(cli_rng *r) { return (float)((cli_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
double cli_normal(cli_rng *r) {
  double u1 = ((cli_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  double u2 = (cli_next(r) >> 11) * (1.0 / 9007199254740992.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

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
