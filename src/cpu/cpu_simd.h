/* Inner loops of the CPU backend: AVX2/FMA/F16C versions where the CPU has
 * them, portable C otherwise. The caller picks per call with `simd` (fixed
 * per context, see kva_cpu_set_simd), so there is no per-element dispatch.
 * Row lengths (n, d) are multiples of 8. */
#ifndef KVA_CPU_SIMD_H
#define KVA_CPU_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "kvattn.h"

/* 1 if this CPU (and OS) runs the AVX2+FMA+F16C kernels. */
int kva_cpu_has_avx2(void);

/* dst[i] = src[i] (f32, f16, bf16 or fp8 e4m3, as f32) * scale */
void kva_cpu_row_to_f32(int simd, const void *src, kva_dtype t, int n, float scale, float *dst);

#define KVA_CPU_FP8_DIV 256.0f

/* Memory a kernel prefetches into L2 while it computes, spread over its
 * work so the requests overlap the arithmetic: `bytes` from each of
 * rows[0..n). */
typedef struct {
  const char *const *rows;
  int n, bytes;
} kva_cpu_prefetch;

/* Block kernels over nrows query rows and nb keys; key/value rows are given
 * by pointers (they sit in pages) and hold f32, f16, bf16 or fp8 e4m3 (kt),
 * converted in registers. fp8 codes read as value / KVA_CPU_FP8_DIV (exact in
 * f16, which is how AVX2 converts them); callers fold the factor and the
 * layer scale into their own scales.
 *   qk: s[i * sstride + j] = scale * dot(q[i], k[j])
 *   pv: acc[i] += sum_j p[i * pstride + j] * v[j]
 * pf may be NULL. */
void kva_cpu_qk(int simd, int nrows, const float *const *q, const void *const *k, kva_dtype kt,
                int nb, int d, float scale, float *s, size_t sstride, const kva_cpu_prefetch *pf);
void kva_cpu_pv(int simd, int nrows, float *const *acc, const float *p, size_t pstride,
                const void *const *v, kva_dtype vt, int nb, int d, const kva_cpu_prefetch *pf);

/* max of s[0..n), -inf for n == 0 (NaNs are skipped) */
float kva_cpu_max(int simd, const float *s, int n);
/* s[j] = exp(s[j] - m), -inf -> 0; returns the sum. */
float kva_cpu_exp_sum(int simd, float *s, int n, float m);
/* y *= a */
void kva_cpu_scale(int simd, float *y, float a, int n);
/* One row's online-softmax step over a block of n logits s (masked ones
 * -inf): s becomes the weights exp(s - m) and the row's running max *m, sum
 * *l and accumulator acc[0..d) are rescaled to the new max. Returns 0 (s all
 * 0, state untouched) when no key of the block is visible. */
int kva_cpu_softmax_row(int simd, float *s, int n, float *m, float *l, float *acc, int d);

#endif
