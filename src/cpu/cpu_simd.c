#include "cpu/cpu_simd.h"

#include "core/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVA_X86 1
#endif

int kva_cpu_has_avx2(void) {
#ifdef KVA_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return 0;
#endif
}

/* ---- portable ----------------------------------------------------------- */

static void row_to_f32_c(const void *src, kva_dtype t, int n, float scale, float *dst) {
  for (int i = 0; i < n; i++) dst[i] = kva_load_f32(src, (size_t)i, t) * scale;
}
static float dot_c(const float *a, const float *b, int n) {
  float s[8] = {0};
  for (int i = 0; i < n; i += 8)
    for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}
static void axpy_c(float *y, float a, const float *x, int n) {
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}
static void scale_c(float *y, float a, int n) {
  for (int i = 0; i < n; i++) y[i] *= a;
}

/* ---- AVX2 --------------------------------------------------------------- */
#ifdef KVA_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static void row_to_f32_avx2(const void *src, kva_dtype t, int n, float scale, float *dst) {
  __m256 s = _mm256_set1_ps(scale);
  if (t == KVA_BF16) {
    const uint16_t *p = (const uint16_t *)src;
    for (int i = 0; i < n; i += 8) {
      __m128i h = _mm_loadu_si128((const __m128i *)(p + i));
      __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_castsi256_ps(w), s));
    }
  } else if (t == KVA_F16) {
    const uint16_t *p = (const uint16_t *)src;
    for (int i = 0; i < n; i += 8) {
      __m128i h = _mm_loadu_si128((const __m128i *)(p + i));
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(h), s));
    }
  } else if (t == KVA_F32) {
    const float *p = (const float *)src;
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_loadu_ps(p + i), s));
  } else {
    /* e4m3 -> f16 bits: sign<<8 | (exp+8)<<10 | man<<7 for normals; the
     * subnormal and NaN codes go through the scalar path. */
    const uint8_t *p = (const uint8_t *)src;
    for (int i = 0; i < n; i += 8) {
      __m128i b = _mm_loadl_epi64((const __m128i *)(p + i));
      __m128i w = _mm_cvtepu8_epi16(b);
      __m128i mag = _mm_and_si128(w, _mm_set1_epi16(0x7f));
      __m128i sign = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8);
      /* magnitude bits eeeemmm -> f16 (e+8) with mantissa <<7: (mag << 7) + (8 << 10) */
      __m128i h = _mm_or_si128(sign, _mm_add_epi16(_mm_slli_epi16(mag, 7), _mm_set1_epi16(8 << 10)));
      __m256 f = _mm256_cvtph_ps(h);
      /* codes with exp 0 (subnormal/zero) or 0x7f (NaN): fix up in scalar */
      int special = _mm_movemask_epi8(_mm_or_si128(
          _mm_cmplt_epi16(mag, _mm_set1_epi16(8)), _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f))));
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(f, s));
      if (special)
        for (int j = 0; j < 8; j++) dst[i + j] = kva_fp8e4m3_to_f32(p[i + j]) * scale;
    }
  }
}
AVX2 static float dot_avx2(const float *a, const float *b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i < n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  __m256 s = _mm256_add_ps(s0, s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}
AVX2 static void axpy_avx2(float *y, float a, const float *x, int n) {
  __m256 av = _mm256_set1_ps(a);
  for (int i = 0; i < n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}
AVX2 static void scale_avx2(float *y, float a, int n) {
  __m256 av = _mm256_set1_ps(a);
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
}
#endif

void kva_cpu_row_to_f32(int simd, const void *src, kva_dtype t, int n, float scale, float *dst) {
#ifdef KVA_X86
  if (simd) {
    row_to_f32_avx2(src, t, n, scale, dst);
    return;
  }
#endif
  (void)simd;
  row_to_f32_c(src, t, n, scale, dst);
}
float kva_cpu_dot(int simd, const float *a, const float *b, int n) {
#ifdef KVA_X86
  if (simd) return dot_avx2(a, b, n);
#endif
  (void)simd;
  return dot_c(a, b, n);
}
void kva_cpu_axpy(int simd, float *y, float a, const float *x, int n) {
#ifdef KVA_X86
  if (simd) {
    axpy_avx2(y, a, x, n);
    return;
  }
#endif
  (void)simd;
  axpy_c(y, a, x, n);
}
void kva_cpu_scale(int simd, float *y, float a, int n) {
#ifdef KVA_X86
  if (simd) {
    scale_avx2(y, a, n);
    return;
  }
#endif
  (void)simd;
  scale_c(y, a, n);
}
