#include "testutil.h"

#include <math.h>

int tu_checks = 0, tu_failures = 0;

int tu_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, tu_checks - tu_failures, tu_failures);
  return tu_failures ? 1 : 0;
}

uint64_t tu_next(tu_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
int tu_int(tu_rng *r, int lo, int hi) { return lo + (int)(tu_next(r) % (uint64_t)(hi - lo + 1)); }
float tu_uniform(tu_rng *r) { return (float)((tu_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
double tu_normal(tu_rng *r) {
  double u1 = ((tu_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  double u2 = (tu_next(r) >> 11) * (1.0 / 9007199254740992.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
