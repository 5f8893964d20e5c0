/* splitmix64 random numbers for tests and `kvattn check/bench/demo`. */
#ifndef KVA_RNG_H
#define KVA_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct { uint64_t s; } kva_rng;

static inline uint64_t kva_rng_next(kva_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* inclusive range */
static inline int kva_rng_int(kva_rng *r, int lo, int hi) {
  return lo + (int)(kva_rng_next(r) % (uint64_t)(hi - lo + 1));
}
/* [-1, 1) */
static inline float kva_rng_uniform(kva_rng *r) {
  return (float)((kva_rng_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static inline double kva_rng_normal(kva_rng *r) {
  double u1 = ((kva_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  double u2 = (kva_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
