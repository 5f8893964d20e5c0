#include "cpu/cpu_simd.h"

#include <string.h>

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

static void row_to_f32_c(const void *restrict src, kva_dtype t, int n, float scale,
                         float *restrict dst) {
  switch (t) {
    case KVA_F32:
      for (int i = 0; i < n; i++) dst[i] = ((const float *)src)[i] * scale;
      break;
    case KVA_F16:
      for (int i = 0; i < n; i++) dst[i] = kva_f16_to_f32(((const uint16_t *)src)[i]) * scale;
      break;
    case KVA_BF16:
      for (int i = 0; i < n; i++) dst[i] = kva_bf16_to_f32(((const uint16_t *)src)[i]) * scale;
      break;
    case KVA_FP8_E4M3:
      for (int i = 0; i < n; i++) dst[i] = kva_fp8e4m3_to_f32(((const uint8_t *)src)[i]) * scale;
      break;
  }
}

/* 8 partial sums, like the vector kernels, so both paths round alike */
/* a kernel's view of element i of a row (fp8: value / KVA_CPU_FP8_DIV) */
static inline float kernel_load(const void *p, size_t i, kva_dtype t) {
  float x = kva_load_f32(p, i, t);
  return t == KVA_FP8_E4M3 ? x * (1.0f / KVA_CPU_FP8_DIV) : x;
}

static float dot_c(const float *a, const void *b, kva_dtype t, int n) {
  float s[8] = {0};
  if (t == KVA_F32) { /* the staged rows of the portable path: keep this loop simple */
    const float *f = (const float *)b;
    for (int i = 0; i < n; i += 8)
      for (int j = 0; j < 8; j++) s[j] += a[i + j] * f[i + j];
  } else {
    for (int i = 0; i < n; i += 8)
      for (int j = 0; j < 8; j++) s[j] += a[i + j] * kernel_load(b, (size_t)(i + j), t);
  }
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

static void prefetch_c(const kva_cpu_prefetch *pf) {
  for (int i = 0; pf && i < pf->n; i++)
    for (int b = 0; b < pf->bytes + 63; b += 64)
      __builtin_prefetch(pf->rows[i] + (b < pf->bytes ? b : pf->bytes - 1), 0, 2);
}

static void qk_c(int nrows, const float *const *q, const void *const *k, kva_dtype kt, int nb,
                 int d, float scale, float *s, size_t sstride) {
  for (int i = 0; i < nrows; i++)
    for (int j = 0; j < nb; j++) s[(size_t)i * sstride + j] = scale * dot_c(q[i], k[j], kt, d);
}

static void pv_c(int nrows, float *const *acc, const float *p, size_t pstride,
                 const void *const *v, kva_dtype vt, int nb, int d) {
  for (int i = 0; i < nrows; i++)
    for (int j = 0; j < nb; j++) {
      float pj = p[(size_t)i * pstride + j];
      if (pj == 0.0f) continue;
      float *restrict a = acc[i]; /* restrict: lets the compiler vectorize */
      if (vt == KVA_F32) {
        const float *restrict x = (const float *)v[j];
        for (int e = 0; e < d; e++) a[e] += pj * x[e];
      } else {
        for (int e = 0; e < d; e++) a[e] += pj * kernel_load(v[j], (size_t)e, vt);
      }
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

static float max_c(const float *s, int n) {
  float m = -INFINITY;
  for (int j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
  return m;
}

static void scale_c(float *y, float a, int n) {
  for (int i = 0; i < n; i++) y[i] *= a;
}

/* ---- AVX2 --------------------------------------------------------------- */
#ifdef KVA_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE inline __attribute__((always_inline))

enum { K_F32 = 0, K_BF16 = 1, K_F16 = 2, K_FP8 = 3 };

/* 8 e4m3 codes as f16 of value / 256, exactly: sign to bit 15, the 7
 * magnitude bits (eeeemmm) to bits 13..7; e4m3's bias 7 vs f16's 15 is the
 * factor 2^-8, and e4m3 subnormals land on f16 subnormals. NaN (magnitude
 * 0x7f, which would read as 0x3f80) gets an all-ones exponent. */
AVX2 static INLINE __m128i fp8_as_f16(const uint8_t *p) {
  __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
  __m128i h = _mm_and_si128(_mm_srai_epi16(_mm_slli_epi16(w, 8), 1), _mm_set1_epi16(-16385));
  __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x3f80));
  return _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7e00)));
}

/* 8 elements of a key/value row from element e, as f32 */
AVX2 static INLINE __m256 ld8(const void *p, int e, int kind) {
  if (kind == K_F32) return _mm256_loadu_ps((const float *)p + e);
  if (kind == K_FP8) return _mm256_cvtph_ps(fp8_as_f16((const uint8_t *)p + e));
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + e));
  if (kind == K_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

AVX2 static void row_to_f32_avx2(const void *src, kva_dtype t, int n, float scale, float *dst) {
  __m256 s = _mm256_set1_ps(scale);
  int i = 0;
  switch (t) {
    case KVA_F32:
      for (; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(ld8(src, i, K_F32), s));
      break;
    case KVA_BF16:
      for (; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(ld8(src, i, K_BF16), s));
      break;
    case KVA_F16:
      for (; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(ld8(src, i, K_F16), s));
      break;
    case KVA_FP8_E4M3: /* (code / 256) * (256 * scale) rounds like code * scale */
      s = _mm256_set1_ps(scale * KVA_CPU_FP8_DIV);
      for (; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(ld8(src, i, K_FP8), s));
      break;
  }
}

/* lane i = horizontal sum of a[i] */
AVX2 static INLINE __m256 hsum8(const __m256 *a) {
  __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* R query rows x K keys (R * K == 8 accumulators): each key vector is
 * converted once and used by R rows. nk <= K keys are real (the rest repeat
 * the last and are not stored). */
AVX2 static INLINE void qk_tile(const float *const *q, const void *const *k, int nk, int kind,
                                int d, __m256 scale, float *s, size_t sstride, int R, int K) {
  const void *kr[8];
#pragma GCC unroll 8
  for (int c = 0; c < K; c++) kr[c] = k[c < nk ? c : nk - 1];
  __m256 acc[8];
#pragma GCC unroll 8
  for (int x = 0; x < 8; x++) acc[x] = _mm256_setzero_ps();
  for (int e = 0; e < d; e += 8) {
    __m256 kv[8];
#pragma GCC unroll 8
    for (int c = 0; c < K; c++) kv[c] = ld8(kr[c], e, kind);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m256 x = _mm256_loadu_ps(q[r] + e);
#pragma GCC unroll 8
      for (int c = 0; c < K; c++) acc[r * K + c] = _mm256_fmadd_ps(x, kv[c], acc[r * K + c]);
    }
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_mul_ps(hsum8(acc), scale));
  for (int r = 0; r < R; r++)
    for (int c = 0; c < nk; c++) s[(size_t)r * sstride + c] = out[r * K + c];
}

/* Spreads a kernel's prefetches over its work: after `units` of `total`,
 * that share of the lines has been requested. Line i of a row is at byte
 * min(64 i, bytes - 1), so a row that starts mid-line is still covered. */
typedef struct {
  const char *const *rows;
  int bytes, lpt, lines, done, units, total, row, line;
} pf_spread;

static INLINE void pf_init(pf_spread *ps, const kva_cpu_prefetch *pf, int total) {
  memset(ps, 0, sizeof(*ps));
  if (!pf || pf->n <= 0 || pf->bytes <= 0) return;
  ps->rows = pf->rows;
  ps->bytes = pf->bytes;
  ps->lpt = (pf->bytes + 63) / 64 + 1;
  ps->lines = pf->n * ps->lpt;
  ps->total = total > 0 ? total : 1;
}

static INLINE void pf_step(pf_spread *ps, int units) {
  ps->units += units;
  int upto = ps->units >= ps->total ? ps->lines
                                    : (int)((long long)ps->lines * ps->units / ps->total);
  for (; ps->done < upto; ps->done++) {
    int b = 64 * ps->line;
    _mm_prefetch(ps->rows[ps->row] + (b < ps->bytes ? b : ps->bytes - 1), _MM_HINT_T1);
    if (++ps->line == ps->lpt) ps->line = 0, ps->row++;
  }
}

AVX2 static INLINE void qk_kind(int nrows, const float *const *q, const void *const *k, int kind,
                                int nb, int d, float scale, float *s, size_t sstride,
                                const kva_cpu_prefetch *pf) {
  __m256 sc = _mm256_set1_ps(scale);
  int r4 = nrows / 4, r2 = (nrows % 4) / 2, r1 = nrows % 2;
  pf_spread ps;
  pf_init(&ps, pf, r4 * ((nb + 1) / 2) + r2 * ((nb + 3) / 4) + r1 * ((nb + 7) / 8));
  int i = 0;
  for (; i + 4 <= nrows; i += 4)
    for (int j = 0; j < nb; j += 2) {
      pf_step(&ps, 1);
      qk_tile(q + i, k + j, nb - j < 2 ? nb - j : 2, kind, d, sc, s + (size_t)i * sstride + j,
              sstride, 4, 2);
    }
  for (; i + 2 <= nrows; i += 2)
    for (int j = 0; j < nb; j += 4) {
      pf_step(&ps, 1);
      qk_tile(q + i, k + j, nb - j < 4 ? nb - j : 4, kind, d, sc, s + (size_t)i * sstride + j,
              sstride, 2, 4);
    }
  for (; i < nrows; i++)
    for (int j = 0; j < nb; j += 8) {
      pf_step(&ps, 1);
      qk_tile(q + i, k + j, nb - j < 8 ? nb - j : 8, kind, d, sc, s + (size_t)i * sstride + j,
              sstride, 1, 8);
    }
}

/* R accumulator rows x W vectors of 8 (R * W <= 8) over all nb keys */
AVX2 static INLINE void pv_tile(float *const *acc, const float *p, size_t pstride,
                                const void *const *v, int kind, int nb, int e0, int R, int W) {
  __m256 a[8];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int w = 0; w < W; w++) a[r * W + w] = _mm256_loadu_ps(acc[r] + e0 + 8 * w);
  for (int j = 0; j < nb; j++) {
    __m256 x[8];
#pragma GCC unroll 8
    for (int w = 0; w < W; w++) x[w] = ld8(v[j], e0 + 8 * w, kind);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      __m256 pr = _mm256_broadcast_ss(p + (size_t)r * pstride + j);
#pragma GCC unroll 8
      for (int w = 0; w < W; w++) a[r * W + w] = _mm256_fmadd_ps(pr, x[w], a[r * W + w]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int w = 0; w < W; w++) _mm256_storeu_ps(acc[r] + e0 + 8 * w, a[r * W + w]);
}

AVX2 static INLINE void pv_kind(int nrows, float *const *acc, const float *p, size_t pstride,
                                const void *const *v, int kind, int nb, int d,
                                const kva_cpu_prefetch *pf) {
  /* work counted in 8-wide columns of a row group */
  pf_spread ps;
  pf_init(&ps, pf, (nrows / 4 + (nrows % 4) / 2 + nrows % 2) * (d / 8));
  int i = 0;
  for (; i + 4 <= nrows; i += 4) {
    const float *pi = p + (size_t)i * pstride;
    int e = 0;
    for (; e + 16 <= d; e += 16) {
      pf_step(&ps, 2);
      pv_tile(acc + i, pi, pstride, v, kind, nb, e, 4, 2);
    }
    for (; e < d; e += 8) {
      pf_step(&ps, 1);
      pv_tile(acc + i, pi, pstride, v, kind, nb, e, 4, 1);
    }
  }
  for (; i + 2 <= nrows; i += 2) {
    const float *pi = p + (size_t)i * pstride;
    int e = 0;
    for (; e + 32 <= d; e += 32) {
      pf_step(&ps, 4);
      pv_tile(acc + i, pi, pstride, v, kind, nb, e, 2, 4);
    }
    for (; e < d; e += 8) {
      pf_step(&ps, 1);
      pv_tile(acc + i, pi, pstride, v, kind, nb, e, 2, 1);
    }
  }
  for (; i < nrows; i++) {
    const float *pi = p + (size_t)i * pstride;
    int e = 0;
    for (; e + 64 <= d; e += 64) {
      pf_step(&ps, 8);
      pv_tile(acc + i, pi, pstride, v, kind, nb, e, 1, 8);
    }
    for (; e < d; e += 8) {
      pf_step(&ps, 1);
      pv_tile(acc + i, pi, pstride, v, kind, nb, e, 1, 1);
    }
  }
}

/* one function per row type so the conversion is fixed at compile time */
AVX2 static void qk_f32(int n, const float *const *q, const void *const *k, int nb, int d,
                        float sc, float *s, size_t ss, const kva_cpu_prefetch *pf) {
  qk_kind(n, q, k, K_F32, nb, d, sc, s, ss, pf);
}
AVX2 static void qk_bf16(int n, const float *const *q, const void *const *k, int nb, int d,
                        float sc, float *s, size_t ss, const kva_cpu_prefetch *pf) {
  qk_kind(n, q, k, K_BF16, nb, d, sc, s, ss, pf);
}
AVX2 static void qk_f16(int n, const float *const *q, const void *const *k, int nb, int d,
                        float sc, float *s, size_t ss, const kva_cpu_prefetch *pf) {
  qk_kind(n, q, k, K_F16, nb, d, sc, s, ss, pf);
}
AVX2 static void qk_fp8(int n, const float *const *q, const void *const *k, int nb, int d,
                        float sc, float *s, size_t ss, const kva_cpu_prefetch *pf) {
  qk_kind(n, q, k, K_FP8, nb, d, sc, s, ss, pf);
}
AVX2 static void pv_f32(int n, float *const *acc, const float *p, size_t ps,
                        const void *const *v, int nb, int d, const kva_cpu_prefetch *pf) {
  pv_kind(n, acc, p, ps, v, K_F32, nb, d, pf);
}
AVX2 static void pv_bf16(int n, float *const *acc, const float *p, size_t ps,
                        const void *const *v, int nb, int d, const kva_cpu_prefetch *pf) {
  pv_kind(n, acc, p, ps, v, K_BF16, nb, d, pf);
}
AVX2 static void pv_f16(int n, float *const *acc, const float *p, size_t ps,
                        const void *const *v, int nb, int d, const kva_cpu_prefetch *pf) {
  pv_kind(n, acc, p, ps, v, K_F16, nb, d, pf);
}

AVX2 static void pv_fp8(int n, float *const *acc, const float *p, size_t ps,
                        const void *const *v, int nb, int d, const kva_cpu_prefetch *pf) {
  pv_kind(n, acc, p, ps, v, K_FP8, nb, d, pf);
}

/* exp(x): Cephes-style range reduction and a degree-6 polynomial, relative
 * error ~1e-7; -inf -> 0. */
AVX2 static INLINE __m256 exp256(__m256 x) {
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

AVX2 static float max_avx2(const float *s, int n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + j), m); /* NaN in s -> m */
  float r[8], mx = -INFINITY;
  _mm256_storeu_ps(r, m);
  for (int t = 0; t < 8; t++) mx = r[t] > mx ? r[t] : mx;
  for (; j < n; j++) mx = s[j] > mx ? s[j] : mx;
  return mx;
}

AVX2 static void scale_avx2(float *y, float a, int n) {
  __m256 av = _mm256_set1_ps(a);
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
}
#endif /* KVA_X86 */

/* ---- dispatch ----------------------------------------------------------- */

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

void kva_cpu_qk(int simd, int nrows, const float *const *q, const void *const *k, kva_dtype kt,
                int nb, int d, float scale, float *s, size_t sstride, const kva_cpu_prefetch *pf) {
#ifdef KVA_X86
  if (simd) {
    switch (kt) {
      case KVA_F32: qk_f32(nrows, q, k, nb, d, scale, s, sstride, pf); return;
      case KVA_BF16: qk_bf16(nrows, q, k, nb, d, scale, s, sstride, pf); return;
      case KVA_F16: qk_f16(nrows, q, k, nb, d, scale, s, sstride, pf); return;
      case KVA_FP8_E4M3: qk_fp8(nrows, q, k, nb, d, scale, s, sstride, pf); return;
    }
  }
#endif
  (void)simd;
  prefetch_c(pf);
  qk_c(nrows, q, k, kt, nb, d, scale, s, sstride);
}

void kva_cpu_pv(int simd, int nrows, float *const *acc, const float *p, size_t pstride,
                const void *const *v, kva_dtype vt, int nb, int d, const kva_cpu_prefetch *pf) {
#ifdef KVA_X86
  if (simd) {
    switch (vt) {
      case KVA_F32: pv_f32(nrows, acc, p, pstride, v, nb, d, pf); return;
      case KVA_BF16: pv_bf16(nrows, acc, p, pstride, v, nb, d, pf); return;
      case KVA_F16: pv_f16(nrows, acc, p, pstride, v, nb, d, pf); return;
      case KVA_FP8_E4M3: pv_fp8(nrows, acc, p, pstride, v, nb, d, pf); return;
    }
  }
#endif
  (void)simd;
  prefetch_c(pf);
  pv_c(nrows, acc, p, pstride, v, vt, nb, d);
}

float kva_cpu_exp_sum(int simd, float *s, int n, float m) {
#ifdef KVA_X86
  if (simd) return exp_sum_avx2(s, n, m);
#endif
  (void)simd;
  return exp_sum_c(s, n, m);
}

float kva_cpu_max(int simd, const float *s, int n) {
#ifdef KVA_X86
  if (simd) return max_avx2(s, n);
#endif
  (void)simd;
  return max_c(s, n);
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

int kva_cpu_softmax_row(int simd, float *s, int n, float *m, float *l, float *acc, int d) {
  float mx = kva_cpu_max(simd, s, n);
  if (mx == -INFINITY) { /* nothing visible: weights 0 */
    for (int j = 0; j < n; j++) s[j] = 0.0f;
    return 0;
  }
  float mnew = *m > mx ? *m : mx;
  if (mnew != *m) {
    float corr = expf(*m - mnew); /* 0 when m was -inf */
    kva_cpu_scale(simd, acc, corr, d);
    *l *= corr;
    *m = mnew;
  }
  *l += kva_cpu_exp_sum(simd, s, n, mnew);
  return 1;
}
