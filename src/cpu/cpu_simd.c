#include "cpu/cpu_simd.h"

#include "core/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVA_X86 1
#endif

int kva_cpu_has_avx2(void) {
#ifdef KVA_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  int f16c = (c >> 29) & 1, fma = (c >> 12) & 1, osxsave = (c >> 27) & 1;
  __builtin_cpu_init();
  return f16c && fma && osxsave && __builtin_cpu_supports("avx2");
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

/* ---- block kernels ------------------------------------------------------ */

static void qk_c(int nrows, const float *const *q, const float *k, size_t kstride, int nb, int d,
                 float scale, float *s, size_t sstride) {
  for (int i = 0; i < nrows; i++)
    for (int j = 0; j < nb; j++) s[i * sstride + j] = scale * dot_c(q[i], k + j * kstride, d);
}
static void pv_c(int nrows, float *const *acc, const float *p, size_t pstride, const float *v,
                 size_t vstride, int nb, int d) {
  for (int i = 0; i < nrows; i++)
    for (int j = 0; j < nb; j++) {
      float pj = p[i * pstride + j];
      if (pj != 0.0f) axpy_c(acc[i], pj, v + j * vstride, d);
    }
}
static float exp_sum_c(float *s, int n, float m) {
  float sum = 0.0f;
  for (int j = 0; j < n; j++) {
    s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
    sum += s[j];
  }
  return sum;
}

#ifdef KVA_X86
/* sums of 8 vectors, in order */
AVX2 static inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                                __m256 a6, __m256 a7) {
  __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
  __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
  __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

AVX2 static void qk_avx2(int nrows, const float *const *q, const float *k, size_t kstride, int nb,
                         int d, float scale, float *s, size_t sstride) {
  int i = 0;
  for (; i + 4 <= nrows; i += 4) {
    const float *q0 = q[i], *q1 = q[i + 1], *q2 = q[i + 2], *q3 = q[i + 3];
    int j = 0;
    for (; j + 2 <= nb; j += 2) {
      const float *k0 = k + j * kstride, *k1 = k0 + kstride;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
      for (int e = 0; e < d; e += 8) {
        __m256 kv0 = _mm256_loadu_ps(k0 + e), kv1 = _mm256_loadu_ps(k1 + e);
        __m256 x0 = _mm256_loadu_ps(q0 + e), x1 = _mm256_loadu_ps(q1 + e);
        __m256 x2 = _mm256_loadu_ps(q2 + e), x3 = _mm256_loadu_ps(q3 + e);
        a0 = _mm256_fmadd_ps(x0, kv0, a0);
        a1 = _mm256_fmadd_ps(x1, kv0, a1);
        a2 = _mm256_fmadd_ps(x2, kv0, a2);
        a3 = _mm256_fmadd_ps(x3, kv0, a3);
        a4 = _mm256_fmadd_ps(x0, kv1, a4);
        a5 = _mm256_fmadd_ps(x1, kv1, a5);
        a6 = _mm256_fmadd_ps(x2, kv1, a6);
        a7 = _mm256_fmadd_ps(x3, kv1, a7);
      }
      float r[8];
      _mm256_storeu_ps(r, _mm256_mul_ps(hsum8(a0, a1, a2, a3, a4, a5, a6, a7), _mm256_set1_ps(scale)));
      for (int t = 0; t < 4; t++) {
        s[(i + t) * sstride + j] = r[t];
        s[(i + t) * sstride + j + 1] = r[4 + t];
      }
    }
    for (; j < nb; j++)
      for (int t = 0; t < 4; t++) s[(i + t) * sstride + j] = scale * dot_avx2(q[i + t], k + j * kstride, d);
  }
  for (; i < nrows; i++)
    for (int j = 0; j < nb; j++) s[i * sstride + j] = scale * dot_avx2(q[i], k + j * kstride, d);
}

AVX2 static void pv_avx2(int nrows, float *const *acc, const float *p, size_t pstride, const float *v,
                         size_t vstride, int nb, int d) {
  int i = 0;
  for (; i + 4 <= nrows; i += 4) {
    const float *p0 = p + i * pstride, *p1 = p0 + pstride, *p2 = p1 + pstride, *p3 = p2 + pstride;
    float *c0 = acc[i], *c1 = acc[i + 1], *c2 = acc[i + 2], *c3 = acc[i + 3];
    int e = 0;
    for (; e + 16 <= d; e += 16) {
      __m256 a0 = _mm256_loadu_ps(c0 + e), b0 = _mm256_loadu_ps(c0 + e + 8);
      __m256 a1 = _mm256_loadu_ps(c1 + e), b1 = _mm256_loadu_ps(c1 + e + 8);
      __m256 a2 = _mm256_loadu_ps(c2 + e), b2 = _mm256_loadu_ps(c2 + e + 8);
      __m256 a3 = _mm256_loadu_ps(c3 + e), b3 = _mm256_loadu_ps(c3 + e + 8);
      for (int j = 0; j < nb; j++) {
        const float *vj = v + j * vstride + e;
        __m256 va = _mm256_loadu_ps(vj), vb = _mm256_loadu_ps(vj + 8);
        __m256 w0 = _mm256_broadcast_ss(p0 + j), w1 = _mm256_broadcast_ss(p1 + j);
        __m256 w2 = _mm256_broadcast_ss(p2 + j), w3 = _mm256_broadcast_ss(p3 + j);
        a0 = _mm256_fmadd_ps(w0, va, a0);
        b0 = _mm256_fmadd_ps(w0, vb, b0);
        a1 = _mm256_fmadd_ps(w1, va, a1);
        b1 = _mm256_fmadd_ps(w1, vb, b1);
        a2 = _mm256_fmadd_ps(w2, va, a2);
        b2 = _mm256_fmadd_ps(w2, vb, b2);
        a3 = _mm256_fmadd_ps(w3, va, a3);
        b3 = _mm256_fmadd_ps(w3, vb, b3);
      }
      _mm256_storeu_ps(c0 + e, a0);
      _mm256_storeu_ps(c0 + e + 8, b0);
      _mm256_storeu_ps(c1 + e, a1);
      _mm256_storeu_ps(c1 + e + 8, b1);
      _mm256_storeu_ps(c2 + e, a2);
      _mm256_storeu_ps(c2 + e + 8, b2);
      _mm256_storeu_ps(c3 + e, a3);
      _mm256_storeu_ps(c3 + e + 8, b3);
    }
    for (; e < d; e += 8) {
      __m256 a0 = _mm256_loadu_ps(c0 + e), a1 = _mm256_loadu_ps(c1 + e);
      __m256 a2 = _mm256_loadu_ps(c2 + e), a3 = _mm256_loadu_ps(c3 + e);
      for (int j = 0; j < nb; j++) {
        __m256 va = _mm256_loadu_ps(v + j * vstride + e);
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), va, a0);
        a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), va, a1);
        a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p2 + j), va, a2);
        a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p3 + j), va, a3);
      }
      _mm256_storeu_ps(c0 + e, a0);
      _mm256_storeu_ps(c1 + e, a1);
      _mm256_storeu_ps(c2 + e, a2);
      _mm256_storeu_ps(c3 + e, a3);
    }
  }
  for (; i < nrows; i++)
    for (int j = 0; j < nb; j++) {
      float pj = p[i * pstride + j];
      if (pj != 0.0f) axpy_avx2(acc[i], pj, v + j * vstride, d);
    }
}

/* exp(x) for x <= 0 region and beyond: Cephes-style range reduction and a
 * degree-6 polynomial; relative error ~1e-7. -inf maps to 0. */
AVX2 static inline __m256 exp256(__m256 x) {
  __m256 is_ninf = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.0f));
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(is_ninf, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

AVX2 static float exp_sum_avx2(float *s, int n, float m) {
  __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 x = _mm256_loadu_ps(s + j);
    __m256 ninf = _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
    __m256 y = _mm256_andnot_ps(ninf, exp256(_mm256_sub_ps(x, mv)));
    _mm256_storeu_ps(s + j, y);
    acc = _mm256_add_ps(acc, y);
  }
  float r[8], sum = 0.0f;
  _mm256_storeu_ps(r, acc);
  for (int t = 0; t < 8; t++) sum += r[t];
  for (; j < n; j++) {
    s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
    sum += s[j];
  }
  return sum;
}
#endif

void kva_cpu_qk(int simd, int nrows, const float *const *q, const float *k, size_t kstride, int nb,
                int d, float scale, float *s, size_t sstride) {
#ifdef KVA_X86
  if (simd) {
    qk_avx2(nrows, q, k, kstride, nb, d, scale, s, sstride);
    return;
  }
#endif
  (void)simd;
  qk_c(nrows, q, k, kstride, nb, d, scale, s, sstride);
}
void kva_cpu_pv(int simd, int nrows, float *const *acc, const float *p, size_t pstride,
                const float *v, size_t vstride, int nb, int d) {
#ifdef KVA_X86
  if (simd) {
    pv_avx2(nrows, acc, p, pstride, v, vstride, nb, d);
    return;
  }
#endif
  (void)simd;
  pv_c(nrows, acc, p, pstride, v, vstride, nb, d);
}
float kva_cpu_exp_sum(int simd, float *s, int n, float m) {
#ifdef KVA_X86
  if (simd) return exp_sum_avx2(s, n, m);
#endif
  (void)simd;
  return exp_sum_c(s, n, m);
}

/* ---- fused kernels on bf16/f16 rows (AVX2 only) -------------------------- */
#ifdef KVA_X86
AVX2 static inline __m256 ld8(const uint16_t *p, int bf16) {
  __m128i h = _mm_loadu_si128((const __m128i *)p);
  return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
              : _mm256_cvtph_ps(h);
}

AVX2 static void qk16_avx2(int nrows, const float *const *q, const uint16_t *const *k, int bf16,
                           int nb, int d, float scale, float *s, size_t sstride) {
  int i = 0;
  for (; i + 4 <= nrows; i += 4) {
    const float *q0 = q[i], *q1 = q[i + 1], *q2 = q[i + 2], *q3 = q[i + 3];
    for (int j = 0; j < nb; j += 2) {
      const uint16_t *k0 = k[j], *k1 = j + 1 < nb ? k[j + 1] : k[j];
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
      for (int e = 0; e < d; e += 8) {
        __m256 kv0 = ld8(k0 + e, bf16), kv1 = ld8(k1 + e, bf16);
        __m256 x0 = _mm256_loadu_ps(q0 + e), x1 = _mm256_loadu_ps(q1 + e);
        __m256 x2 = _mm256_loadu_ps(q2 + e), x3 = _mm256_loadu_ps(q3 + e);
        a0 = _mm256_fmadd_ps(x0, kv0, a0);
        a1 = _mm256_fmadd_ps(x1, kv0, a1);
        a2 = _mm256_fmadd_ps(x2, kv0, a2);
        a3 = _mm256_fmadd_ps(x3, kv0, a3);
        a4 = _mm256_fmadd_ps(x0, kv1, a4);
        a5 = _mm256_fmadd_ps(x1, kv1, a5);
        a6 = _mm256_fmadd_ps(x2, kv1, a6);
        a7 = _mm256_fmadd_ps(x3, kv1, a7);
      }
      float r[8];
      _mm256_storeu_ps(r, _mm256_mul_ps(hsum8(a0, a1, a2, a3, a4, a5, a6, a7), _mm256_set1_ps(scale)));
      for (int t = 0; t < 4; t++) {
        s[(i + t) * sstride + j] = r[t];
        if (j + 1 < nb) s[(i + t) * sstride + j + 1] = r[4 + t];
      }
    }
  }
  for (; i < nrows; i++)
    for (int j = 0; j < nb; j++) {
      __m256 a = _mm256_setzero_ps();
      for (int e = 0; e < d; e += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q[i] + e), ld8(k[j] + e, bf16), a);
      float r[8];
      _mm256_storeu_ps(r, a);
      s[i * sstride + j] = scale * (((r[0] + r[4]) + (r[1] + r[5])) + ((r[2] + r[6]) + (r[3] + r[7])));
    }
}

AVX2 static void pv16_avx2(int nrows, float *const *acc, const float *p, size_t pstride,
                           const uint16_t *const *v, int bf16, int nb, int d) {
  int i = 0;
  for (; i + 4 <= nrows; i += 4) {
    const float *p0 = p + i * pstride, *p1 = p0 + pstride, *p2 = p1 + pstride, *p3 = p2 + pstride;
    float *c0 = acc[i], *c1 = acc[i + 1], *c2 = acc[i + 2], *c3 = acc[i + 3];
    for (int e = 0; e < d; e += 8) {
      __m256 a0 = _mm256_loadu_ps(c0 + e), a1 = _mm256_loadu_ps(c1 + e);
      __m256 a2 = _mm256_loadu_ps(c2 + e), a3 = _mm256_loadu_ps(c3 + e);
      for (int j = 0; j < nb; j++) {
        __m256 va = ld8(v[j] + e, bf16);
        a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), va, a0);
        a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), va, a1);
        a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p2 + j), va, a2);
        a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p3 + j), va, a3);
      }
      _mm256_storeu_ps(c0 + e, a0);
      _mm256_storeu_ps(c1 + e, a1);
      _mm256_storeu_ps(c2 + e, a2);
      _mm256_storeu_ps(c3 + e, a3);
    }
  }
  for (; i < nrows; i++)
    for (int e = 0; e < d; e += 8) {
      __m256 a = _mm256_loadu_ps(acc[i] + e);
      for (int j = 0; j < nb; j++)
        a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + i * pstride + j), ld8(v[j] + e, bf16), a);
      _mm256_storeu_ps(acc[i] + e, a);
    }
}
#endif

int kva_cpu_qk16(int simd, int nrows, const float *const *q, const uint16_t *const *k, kva_dtype t,
                 int nb, int d, float scale, float *s, size_t sstride) {
#ifdef KVA_X86
  if (simd && (t == KVA_BF16 || t == KVA_F16)) {
    qk16_avx2(nrows, q, k, t == KVA_BF16, nb, d, scale, s, sstride);
    return 1;
  }
#endif
  (void)simd, (void)nrows, (void)q, (void)k, (void)t, (void)nb, (void)d, (void)scale, (void)s, (void)sstride;
  return 0;
}
int kva_cpu_pv16(int simd, int nrows, float *const *acc, const float *p, size_t pstride,
                 const uint16_t *const *v, kva_dtype t, int nb, int d) {
#ifdef KVA_X86
  if (simd && (t == KVA_BF16 || t == KVA_F16)) {
    pv16_avx2(nrows, acc, p, pstride, v, t == KVA_BF16, nb, d);
    return 1;
  }
#endif
  (void)simd, (void)nrows, (void)acc, (void)p, (void)pstride, (void)v, (void)t, (void)nb, (void)d;
  return 0;
}
