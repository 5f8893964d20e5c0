/* Probe: how fast an S = Q K^T of MLA's shape runs on the tensor cores when
 * both operands come from smem (ss wgmma, 128-byte swizzle, as MLA v5's S),
 * for key blocks of N = 32, 64 and 128 rows. Each warpgroup issues the
 * 36 k-steps of one 64 x N x 576 S per commit group, two groups in flight;
 * one or two warpgroups per CTA, one CTA per SM. Prints flop/cycle per SM
 * (dense bf16 peak: 4096) and TFLOP/s by events. The data are arbitrary
 * bf16 (speed only; nothing is checked). Design question it answers: does
 * a ring of 32-key stages lose the tensor rate to A's smem reads?
 *   (built with the CUDA configuration: build-cuda/wgmma_rate; or by hand:
 *   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude bench/wgmma_rate.cu) */
#include "cuda/mla_kernel.cuh"
#include "cuda/mla_kernel_v10.cuh" /* mla10_mma_rs */

#include "probe.cuh"

/* words of arbitrary 16-bit values near 1 (speed only), made visible to
 * the wgmmas; the whole CTA */
static __device__ __forceinline__ void probe_fill(unsigned char *p, int words) {
  for (int i = threadIdx.x; i < words; i += blockDim.x)
    ((uint32_t *)p)[i] = 0x3c003c00u ^ ((uint32_t)i * 2654435761u & 0x00ff00ffu);
  __syncthreads();
  kva_fence_proxy_async_smem();
  __syncthreads();
}

/* the slowest warpgroup's cycles of a launch (cycles[2 * sm + wg]) */
static double probe_max_cycles(const unsigned long long *dc, int sms, int wgs) {
  unsigned long long *hc = (unsigned long long *)malloc(sizeof(unsigned long long) * 2 * sms);
  CHECK(cudaMemcpy(hc, dc, sizeof(unsigned long long) * 2 * sms, cudaMemcpyDeviceToHost));
  double maxc = 0;
  for (int i = 0; i < sms; i++)
    for (int w = 0; w < wgs; w++) maxc = hc[2 * i + w] > maxc ? (double)hc[2 * i + w] : maxc;
  free(hc);
  return maxc;
}

template <int N>
static __device__ __forceinline__ void s_kstep(float *d, uint64_t da, uint64_t db, int acc) {
  if (N == 32) kva_wgmma_m64n32k16_ss_bf16(d, da, db, acc);
  if (N == 64) kva_wgmma_m64n64k16_ss_bf16(d, da, db, acc);
  if (N == 128) kva_wgmma_m64n128k16_ss_bf16(d, da, db, acc);
}

template <int N>
__global__ void __launch_bounds__(256, 1) s_rate(int iters, int wgs, unsigned long long *cycles,
                                                 float *sink) {
  constexpr int QBLK = 64 * 128, KBLK = N * 128;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_a = (s_raw + 1023u) & ~1023u, s_b = s_a + 9 * QBLK;
  unsigned char *p = smem + (s_a - s_raw);
  probe_fill(p, 9 * (QBLK + KBLK) / 4);
  const int wg = threadIdx.x >> 7;
  if (wg >= wgs) return;
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; i++) d[i] = 0.0f;
  const uint64_t da = mla_desc(s_a, 16, 1024), db = mla_desc(s_b, 16, 1024);
  const unsigned long long t0 = clock64();
  for (int it = 0; it < iters; it++) {
    kva_wgmma_fence();
#pragma unroll
    for (int k = 0; k < 9; k++)
#pragma unroll
      for (int t = 0; t < 4; t++)
        s_kstep<N>(d, da + ((k * QBLK + t * 32) >> 4), db + ((k * KBLK + t * 32) >> 4), 1);
    kva_wgmma_commit();
    kva_wgmma_wait<1>();
  }
  kva_wgmma_wait<0>();
  const unsigned long long t1 = clock64();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; i++) s += d[i];
  if ((threadIdx.x & 127) == 0) cycles[blockIdx.x * 2 + wg] = t1 - t0;
  if (s == 12345.0f) sink[threadIdx.x] = s; /* keeps d live */
}

/* The transposed shapes of a small-row MLA (keys as M): S^T = K Q^T
 * (m64nNk16, A = the 64-key block K-major, B = N query rows K-major, 36
 * k-steps) and half of O^T += V^T P^T (A = V^T read MN-major from the same
 * block, four 64-dim tiles x 4 key steps, B = P^T) per warpgroup. N = 16 or
 * 32. */
template <int N>
static __device__ __forceinline__ void t_mma(float *d, uint64_t da, uint64_t db, int tnsp_a) {
  if (N == 16) {
    if (tnsp_a)
      asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 1, 0;\n"
                   : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                   : "l"(da), "l"(db));
    else
      asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 0, 0;\n"
                   : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                   : "l"(da), "l"(db));
  } else {
    if (tnsp_a)
      asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " KVA_WGMMA_D16 ", %16, %17, 1, 1, 1, 1, 0;\n"
                   : KVA_WGMMA_OUT16(d) : "l"(da), "l"(db));
    else
      asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " KVA_WGMMA_D16 ", %16, %17, 1, 1, 1, 0, 0;\n"
                   : KVA_WGMMA_OUT16(d) : "l"(da), "l"(db));
  }
}
template <int N>
__global__ void __launch_bounds__(256, 1) t_rate(int iters, int wgs, unsigned long long *cycles,
                                                 float *sink) {
  constexpr int KBLK = 64 * 128, QBLK = N * 128;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_k = (s_raw + 1023u) & ~1023u, s_q = s_k + 9 * KBLK, s_p = s_q + 9 * QBLK;
  unsigned char *p = smem + (s_k - s_raw);
  probe_fill(p, (9 * (KBLK + QBLK) + QBLK) / 4);
  const int wg = threadIdx.x >> 7;
  if (wg >= wgs) return;
  float s[N / 2], o[4][N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; i++) {
    s[i] = 0.0f;
#pragma unroll
    for (int t = 0; t < 4; t++) o[t][i] = 0.0f;
  }
  const uint64_t dk = mla_desc(s_k, 16, 1024), dq = mla_desc(s_q, 16, 1024);
  const uint64_t dv = mla_desc(s_k, KBLK, 1024), dp = mla_desc(s_p, 16, 1024);
  const unsigned long long t0 = clock64();
  for (int it = 0; it < iters; it++) {
    kva_wgmma_fence();
#pragma unroll
    for (int k = 0; k < 9; k++)
#pragma unroll
      for (int t = 0; t < 4; t++)
        t_mma<N>(s, dk + ((k * KBLK + t * 32) >> 4), dq + ((k * QBLK + t * 32) >> 4), 0);
#pragma unroll
    for (int c = 0; c < 4; c++)
#pragma unroll
      for (int t = 0; t < 4; t++)
        t_mma<N>(o[c], dv + ((c * KBLK + t * 16 * 128) >> 4), dp + ((t * 32) >> 4), 1);
    kva_wgmma_commit();
    kva_wgmma_wait<1>();
  }
  kva_wgmma_wait<0>();
  const unsigned long long t1 = clock64();
  float x = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; i++) {
    x += s[i];
#pragma unroll
    for (int t = 0; t < 4; t++) x += o[t][i];
  }
  if ((threadIdx.x & 127) == 0) cycles[blockIdx.x * 2 + wg] = t1 - t0;
  if (x == 12345.0f) sink[threadIdx.x] = x;
}

template <int N>
static void run_t(int sms, int wgs) {
  const int iters = 2000;
  const size_t smem = 1024 + 9 * (64 + N) * 128 + N * 128;
  unsigned long long *dc;
  float *sink;
  CHECK(cudaMalloc(&dc, sizeof(unsigned long long) * 2 * sms));
  CHECK(cudaMalloc(&sink, 256 * sizeof(float)));
  CHECK(cudaFuncSetAttribute(t_rate<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  t_rate<N><<<sms, 256, smem>>>(iters / 10, wgs, dc, sink);
  CHECK(cudaGetLastError());
  t_rate<N><<<sms, 256, smem>>>(iters, wgs, dc, sink);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  const double maxc = probe_max_cycles(dc, sms, wgs);
  const double flop = 2.0 * 64 * N * (576 + 256); /* S^T and half of O^T */
  printf("keys-as-M block (S^T + half O^T) N=%2d, %d warpgroup(s): %6.0f cycles per block per "
         "warpgroup, %6.0f useful flop/cycle/SM\n",
         N, wgs, maxc / iters, flop * iters * wgs / maxc);
  CHECK(cudaFree(dc));
  CHECK(cudaFree(sink));
}

/* v10's S^T issue alone (the thirty-fourth session: it took ~1900 cycles a
 * block in the kernel, ~50 a wgmma): 36 rs m64nNk16 k-steps a block, a
 * commit group per 4, four register sets in flight (wait_group 3 before a
 * set's reuse, all of it waited for at the block's end), B = N query rows
 * from smem; 1-3 warpgroups. conv 1: each set converted from 64 fp8
 * bytes a thread in smem first (two 16-byte loads, 16 cvt, as
 * mla10_k_frags); conv 0: the sets are fixed registers; conv 2 / 3: six
 * sets, 2 / 3 column blocks converted before one wgmma.fence; conv 4:
 * three sets, the next column block's k-step converted right after each
 * wgmma is issued (does the conversion then overlap the wgmmas?). */
template <int N, int CONV>
__global__ void __launch_bounds__(384, 1) rs_rate(int iters, int wgs, unsigned long long *cycles,
                                                  float *sink) {
  /* CONV 0: fixed registers, 1: each set converted before its k-steps
   * (four sets, as v10); 2 / 3: six sets, converted 2 / 3 column blocks
   * at a time before one wgmma.fence and their 8 / 12 k-steps */
  constexpr int QBLK = N * 128, NK = CONV == 4 ? 3 : CONV >= 2 ? 6 : 4,
                G = CONV == 2 || CONV == 3 ? CONV : 1;
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s_raw = kva_smem_u32(smem);
  const uint32_t s_q = (s_raw + 1023u) & ~1023u;
  unsigned char *p = smem + (s_q - s_raw), *bytes = p + 9 * QBLK;
  probe_fill(p, (9 * QBLK + 64 * 576) / 4);
  const int wg = threadIdx.x >> 7, tw = threadIdx.x & 127;
  if (wg >= wgs) return;
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; i++) d[i] = 0.0f;
  uint32_t kf[NK][4][4];
#pragma unroll
  for (int q = 0; q < NK; q++)
#pragma unroll
    for (int st = 0; st < 4; st++)
#pragma unroll
      for (int i = 0; i < 4; i++) kf[q][st][i] = 0x3c003c00u ^ (uint32_t)(tw * 7 + q + st + i);
  const uint64_t dq = mla_desc(s_q, 16, 1024);
  const unsigned char *src = bytes + (tw >> 2) * 576 + 16 * (tw & 3);
  const unsigned long long t0 = clock64();
  for (int it = 0; it < iters; it++) {
    if (CONV == 4) {
      /* column block 0 converted first; cb + 1's k-step st after cb's wgmma st */
      {
        const uint4 x = *(const uint4 *)src, y = *(const uint4 *)(src + 32 * 576);
        const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
        for (int st = 0; st < 4; st++) {
          kf[0][st][0] = kva_cvt_e4m3x2_f16x2_lo(xs[st]);
          kf[0][st][1] = kva_cvt_e4m3x2_f16x2_lo(ys[st]);
          kf[0][st][2] = kva_cvt_e4m3x2_f16x2_hi(xs[st]);
          kf[0][st][3] = kva_cvt_e4m3x2_f16x2_hi(ys[st]);
        }
      }
#pragma unroll
      for (int cb = 0; cb < 9; cb++) {
        uint32_t xs[4] = {0, 0, 0, 0}, ys[4] = {0, 0, 0, 0};
        if (cb + 1 < 9) {
          if (cb >= 2) kva_wgmma_wait<1>(); /* set (cb + 1) % 3: group cb - 2 done */
          const uint4 x = *(const uint4 *)(src + 64 * (cb + 1));
          const uint4 y = *(const uint4 *)(src + 64 * (cb + 1) + 32 * 576);
          xs[0] = x.x, xs[1] = x.y, xs[2] = x.z, xs[3] = x.w;
          ys[0] = y.x, ys[1] = y.y, ys[2] = y.z, ys[3] = y.w;
        }
#pragma unroll
        for (int st = 0; st < 4; st++)
#pragma unroll
          for (int i = 0; i < 4; i++) kva_reg_fence_u32(&kf[cb % 3][st][i]);
        kva_wgmma_fence();
#pragma unroll
        for (int st = 0; st < 4; st++) {
          mla10_mma_rs<N>(d, kf[cb % 3][st], dq + ((uint32_t)(cb * QBLK + st * 32) >> 4), 1);
          if (cb + 1 < 9) {
            uint32_t *f = kf[(cb + 1) % 3][st];
            f[0] = kva_cvt_e4m3x2_f16x2_lo(xs[st]);
            f[1] = kva_cvt_e4m3x2_f16x2_lo(ys[st]);
            f[2] = kva_cvt_e4m3x2_f16x2_hi(xs[st]);
            f[3] = kva_cvt_e4m3x2_f16x2_hi(ys[st]);
          }
        }
        kva_wgmma_commit();
      }
    }
#pragma unroll
    for (int c0 = 0; c0 < 9 && CONV != 4; c0 += G) {
#pragma unroll
      for (int cb = c0; cb < c0 + G && cb < 9; cb++) {
        if (cb >= NK) kva_wgmma_wait<NK - 1>();
        if (CONV) {
          const uint4 x = *(const uint4 *)(src + 64 * cb);
          const uint4 y = *(const uint4 *)(src + 64 * cb + 32 * 576);
          const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
          for (int st = 0; st < 4; st++) {
            kf[cb % NK][st][0] = kva_cvt_e4m3x2_f16x2((uint16_t)xs[st]);
            kf[cb % NK][st][1] = kva_cvt_e4m3x2_f16x2((uint16_t)ys[st]);
            kf[cb % NK][st][2] = kva_cvt_e4m3x2_f16x2((uint16_t)(xs[st] >> 16));
            kf[cb % NK][st][3] = kva_cvt_e4m3x2_f16x2((uint16_t)(ys[st] >> 16));
          }
        }
#pragma unroll
        for (int st = 0; st < 4; st++)
#pragma unroll
          for (int i = 0; i < 4; i++) kva_reg_fence_u32(&kf[cb % NK][st][i]);
      }
      kva_wgmma_fence();
#pragma unroll
      for (int cb = c0; cb < c0 + G && cb < 9; cb++) {
#pragma unroll
        for (int st = 0; st < 4; st++)
          mla10_mma_rs<N>(d, kf[cb % NK][st], dq + ((uint32_t)(cb * QBLK + st * 32) >> 4), 1);
        kva_wgmma_commit();
      }
    }
    kva_wgmma_wait<0>(); /* as v10: S^T whole before the softmax */
#pragma unroll
    for (int i = 0; i < N / 2; i++) kva_reg_fence_f32(&d[i]);
  }
  const unsigned long long t1 = clock64();
  float x = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; i++) x += d[i];
  if (tw == 0) cycles[blockIdx.x * 3 + wg] = t1 - t0;
  if (x == 12345.0f) sink[threadIdx.x] = x;
}

template <int N, int CONV>
static void run_rs(int sms, int wgs) {
  const int iters = 2000;
  const size_t smem = 1024 + 9 * N * 128 + 64 * 576;
  unsigned long long *dc, *hc = (unsigned long long *)calloc(3 * sms, 8);
  float *sink;
  CHECK(cudaMalloc(&dc, sizeof(unsigned long long) * 3 * sms));
  CHECK(cudaMalloc(&sink, 384 * sizeof(float)));
  CHECK(cudaFuncSetAttribute(rs_rate<N, CONV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem));
  rs_rate<N, CONV><<<sms, 384, smem>>>(iters / 10, wgs, dc, sink);
  CHECK(cudaGetLastError());
  rs_rate<N, CONV><<<sms, 384, smem>>>(iters, wgs, dc, sink);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(hc, dc, sizeof(unsigned long long) * 3 * sms, cudaMemcpyDeviceToHost));
  double maxc = 0;
  for (int i = 0; i < sms * 3; i++)
    if (i % 3 < wgs && hc[i] > maxc) maxc = (double)hc[i];
  printf("rs S^T block (36 k-steps) N=%2d, conversion %d, %d warpgroup(s): %6.0f cycles per "
         "block per warpgroup, %5.1f a wgmma\n",
         N, CONV, wgs, maxc / iters, maxc / iters / 36);
  free(hc);
  CHECK(cudaFree(dc));
  CHECK(cudaFree(sink));
}

template <int N>
static void run(int sms, int wgs) {
  const int iters = 2000;
  const size_t smem = 1024 + 9 * (64 + N) * 128;
  unsigned long long *dc;
  float *sink;
  CHECK(cudaMalloc(&dc, sizeof(unsigned long long) * 2 * sms));
  CHECK(cudaMalloc(&sink, 256 * sizeof(float)));
  CHECK(cudaFuncSetAttribute(s_rate<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  s_rate<N><<<sms, 256, smem>>>(iters / 10, wgs, dc, sink); /* warm-up */
  CHECK(cudaGetLastError());
  probe_timer tm;
  probe_timer_start(&tm);
  s_rate<N><<<sms, 256, smem>>>(iters, wgs, dc, sink);
  CHECK(cudaGetLastError());
  const float ms = probe_timer_stop_ms(&tm);
  const double maxc = probe_max_cycles(dc, sms, wgs);
  const double flop_sm = 2.0 * 64 * N * 576 * iters * wgs; /* per SM */
  printf("S 64 x %3d x 576, %d warpgroup(s): %6.0f flop/cycle/SM (%.0f%% of 4096), %6.1f TFLOP/s, "
         "%.0f cycles per S per warpgroup\n",
         N, wgs, flop_sm / maxc, 100.0 * flop_sm / maxc / 4096, flop_sm * sms / (ms * 1e-3) / 1e12,
         maxc / iters);
  CHECK(cudaFree(dc));
  CHECK(cudaFree(sink));
}

int main(void) {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  for (int wgs = 1; wgs <= 2; wgs++) {
    run<32>(sms, wgs);
    run<64>(sms, wgs);
    run<128>(sms, wgs);
    run_t<16>(sms, wgs);
    run_t<32>(sms, wgs);
  }
  for (int wgs = 1; wgs <= 3; wgs++) {
    run_rs<64, 0>(sms, wgs);
    run_rs<64, 1>(sms, wgs);
    run_rs<64, 4>(sms, wgs);
    run_rs<32, 4>(sms, wgs);
    run_rs<16, 4>(sms, wgs);
  }
  for (int wgs = 1; wgs <= 3; wgs++) {
    run_rs<16, 0>(sms, wgs);
    run_rs<16, 1>(sms, wgs);
    run_rs<16, 2>(sms, wgs);
    run_rs<16, 3>(sms, wgs);
    run_rs<32, 0>(sms, wgs);
    run_rs<32, 1>(sms, wgs);
    run_rs<32, 2>(sms, wgs);
  }
  return 0;
}
