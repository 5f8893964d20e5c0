/* Row kernels of the CPU backend: AVX2/FMA/F16C where the CPU has them
 * (chosen per call by a flag the context fixes at creation), portable C
 * otherwise. Rows are contiguous; n is a multiple of 8. */
#ifndef KVA_CPU_SIMD_H
#define KVA_CPU_SIMD_H

#include <stdint.h>

#include "kvattn.h"

/* 1 if this CPU runs the AVX2 kernels. */
int kva_cpu_has_avx2(void);
/* dst[i] = src[i] (as f32) * scale */
void kva_cpu_row_to_f32(int simd, const void *src, kva_dtype t, int n, float scale, float *dst);
float kva_cpu_dot(int simd, const float *a, const float *b, int n);
/* y += a * x */
void kva_cpu_axpy(int simd, float *y, float a, const float *x, int n);
/* y *= a */
void kva_cpu_scale(int simd, float *y, float a, int n);



/* Block kernels over nrows query rows and nb keys (rows given by pointers).
 * s[i * sstride + j] = scale * dot(q[i], k + j * kstride) */
void kva_cpu_qk(int simd, int nrows, const float *const *q, const float *k, size_t kstride, int nb,
                int d, float scale, float *s, size_t sstride);
/* acc[i] += sum_j p[i * pstride + j] * (v + j * vstride) */
void kva_cpu_pv(int simd, int nrows, float *const *acc, const float *p, size_t pstride,
                const float *v, size_t vstride, int nb, int d);
/* The same reading bf16/f16 rows in place (row pointers per key), converting
 * in registers; return 0 (doing nothing) where no such kernel exists. */
int kva_cpu_qk16(int simd, int nrows, const float *const *q, const uint16_t *const *k, kva_dtype t,
                 int nb, int d, float scale, float *s, size_t sstride);
int kva_cpu_pv16(int simd, int nrows, float *const *acc, const float *p, size_t pstride,
                 const uint16_t *const *v, kva_dtype t, int nb, int d);
/* s[j] = exp(s[j] - m) (-inf -> 0); returns the sum */
float kva_cpu_exp_sum(int simd, float *s, int n, float m);
#endif
