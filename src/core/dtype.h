/* Scalar conversions between f32 and the storage types, host side.
 * Round-to-nearest-even everywhere; fp8 e4m3 (OCP "fn": no inf, max 448,
 * NaN = 0x7f/0xff) saturates finite values to +-448. */
#ifndef KVA_DTYPE_H
#define KVA_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kvattn.h"

/* The same conversions run in CUDA kernels, so GPU stores match CPU stores bit for bit. */
#ifdef __CUDACC__
#define KVA_HD __host__ __device__
#else
#define KVA_HD
#endif

static inline KVA_HD uint32_t kva_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline KVA_HD float kva_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline KVA_HD float kva_bf16_to_f32(uint16_t h) { return kva_bits_f32((uint32_t)h << 16); }
static inline KVA_HD uint16_t kva_f32_to_bf16(float f) {
  uint32_t u = kva_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline KVA_HD float kva_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return kva_bits_f32(sign);
    float f = (float)man * (1.0f / 16777216.0f); /* 2^-24 */
    return sign ? -f : f;
  }
  if (exp == 31) return kva_bits_f32(sign | 0x7f800000u | (man << 13));
  return kva_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
static inline KVA_HD uint16_t kva_f32_to_f16(float f) {
  uint32_t u = kva_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
  if (a < 0x38800000u) {                                    /* subnormal or zero in f16 */
    float af = kva_bits_f32(a);
    /* af * 2^24 rounded to nearest even integer = subnormal mantissa */
    float m = nearbyintf(af * 16777216.0f);
    return (uint16_t)(sign | (uint16_t)m);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | (uint16_t)(((r >> 13) - (112u << 10)) & 0x7fffu));
}

static inline KVA_HD float kva_fp8e4m3_to_f32(uint8_t v) {
  uint32_t sign = v & 0x80u, exp = (v >> 3) & 0xfu, man = v & 0x7u;
  float f;
  if (exp == 0xf && man == 0x7) return nanf("");
  if (exp == 0)
    f = (float)man * (1.0f / 512.0f); /* 2^-6 * man/8 */
  else
    f = ldexpf(1.0f + (float)man / 8.0f, (int)exp - 7);
  return sign ? -f : f;
}
static inline KVA_HD uint8_t kva_f32_to_fp8e4m3(float f) {
  uint8_t sign = (uint8_t)((kva_f32_bits(f) >> 24) & 0x80u);
  float a = fabsf(f);
  if (isnan(f)) return 0x7f;
  if (a >= 448.0f) return (uint8_t)(sign | 0x7e); /* saturate */
  if (a < 1.0f / 64.0f) {                         /* subnormal: steps of 2^-9 */
    int m = (int)nearbyintf(a * 512.0f);
    return (uint8_t)(sign | (uint8_t)m);           /* m == 8 lands on 2^-6, exp 1 */
  }
  int e;
  float fr = frexpf(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
  int exp = e - 1 + 7;      /* a = (2fr) * 2^(e-1) */
  int m = (int)nearbyintf((2.0f * fr - 1.0f) * 8.0f);
  if (m == 8) {
    m = 0;
    exp++;
  }
  if (exp > 15 || (exp == 15 && m == 7)) return (uint8_t)(sign | 0x7e);
  return (uint8_t)(sign | (uint8_t)(exp << 3) | (uint8_t)m);
}

/* Element i of a typed buffer as f32 (f32, f16, bf16, fp8 without scale). */
static inline KVA_HD float kva_load_f32(const void *p, size_t i, kva_dtype t) {
  switch (t) {
    case KVA_F32: return ((const float *)p)[i];
    case KVA_F16: return kva_f16_to_f32(((const uint16_t *)p)[i]);
    case KVA_BF16: return kva_bf16_to_f32(((const uint16_t *)p)[i]);
    case KVA_FP8_E4M3: return kva_fp8e4m3_to_f32(((const uint8_t *)p)[i]);
  }
  return nanf("");
}
static inline KVA_HD void kva_store_f32(void *p, size_t i, kva_dtype t, float f) {
  switch (t) {
    case KVA_F32: ((float *)p)[i] = f; break;
    case KVA_F16: ((uint16_t *)p)[i] = kva_f32_to_f16(f); break;
    case KVA_BF16: ((uint16_t *)p)[i] = kva_f32_to_bf16(f); break;
    case KVA_FP8_E4M3: ((uint8_t *)p)[i] = kva_f32_to_fp8e4m3(f); break;
  }
}

#endif /* KVA_DTYPE_H */
