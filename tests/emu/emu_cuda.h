/* Host emulation of the CUDA features the extend kernel uses: 128 coroutine
 * threads per CTA, warp collectives computed when all 32 lanes arrived,
 * __syncthreads as a CTA barrier, cp.async copies that land only at
 * cp.async.wait_group. Test-only. */
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <vector>

#define __launch_bounds__(...)
#define __log2f emu_log2f
static inline float emu_log2f(float x) { return log2f(x); }

extern unsigned char smem[];
#define smem_wg smem
#define smem_ws smem
extern dim3 emu_blockIdx, emu_gridDim;
#define blockIdx emu_blockIdx
#define gridDim emu_gridDim
dim3 &emu_threadIdx();
#define threadIdx emu_threadIdx()

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
template <class T> static inline T __ldg(const T *p) { return *p; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }

void __syncthreads();
void __syncwarp();
int __shfl_sync(unsigned mask, int v, int src);
float __shfl_sync(unsigned mask, float v, int src);
int __shfl_xor_sync(unsigned mask, int v, int m);
float __shfl_xor_sync(unsigned mask, float v, int m);
int __any_sync(unsigned mask, int pred);

/* one CTA at a time: atomics are plain read-modify-writes, fences no-ops */
static inline int atomicAdd(int *p, int v) { const int o = *p; *p += v; return o; }
static inline int atomicExch(int *p, int v) { const int o = *p; *p = v; return o; }
static inline void __threadfence() {}
static inline void __nanosleep(unsigned) {} /* no bounded waits run here (merge_wait_ns 0) */
static inline int kva_atom_add_acq_rel_gpu(int *p, int v) { return atomicAdd(p, v); }
/* emu_no_known_last: every chunk counts and the last one merges from
 * global (on a GPU the order of CTAs decides which path a chunk takes) */
extern int emu_no_known_last;
static inline int kva_ld_acquire_gpu(const int *p) { return emu_no_known_last ? -1 : *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }

/* the runtime's side the harnesses drive (emu_rt.cpp): run a grid of CTAs
 * one at a time, the dynamic smem a kernel may touch, ldmatrix counters */
void emu_run_grid(void (*body)(void), int grid, int nthreads);
extern size_t emu_smem_limit;
extern long emu_bank_conflicts, emu_ldsm_count;
