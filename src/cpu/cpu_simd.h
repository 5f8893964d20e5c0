/* Row kernels of the CPU backend: AVX2/FMA/F16C where the CPU has them
 * (chosen per call by a flag the context fixes at creation), portable C
 * otherwise. Rows are contiguous; n is a multiple of 8. */
#ifndef KVA_CPU_SIMD_H
#define KVA_CPU_SIMD_H

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

#endif
