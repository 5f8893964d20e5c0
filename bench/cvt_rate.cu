/* Probe: how many e4m3 values an SM turns into f16 per cycle, three ways:
 * cvt.rn.f16x2.e4m3x2 (F2FP, two values an instruction), integer ops
 * (prmt, shift, and, lop3: the bits moved into an f16 of the value times
 * 2^-8, four ops for two values), and both interleaved (half the words
 * each way). Each thread converts 8 independent words a round and folds
 * the results with xor (one more integer op per two values in every
 * variant), so the chains are throughput-bound. 256 threads a CTA, one CTA
 * per SM. Speed only; the integer route's exactness is checked on all 256
 * bytes against the cvt once.
 *   (built with the CUDA configuration: build-cuda/cvt_rate) */
#include <cuda_fp16.h>

#include "cuda/ptx.cuh"

#include "probe.cuh"

/* two e4m3 (bytes 0, 1 of w when hi == 0, bytes 2, 3 when hi == 1) ->
 * f16x2 of the values times 2^-8 (exact, subnormals included) */
static __device__ __forceinline__ uint32_t e4m3x2_int(uint32_t w, int hi) {
  uint32_t p;
  /* byte b of the pair into bits 15..8 of its half */
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(p) : "r"(w), "r"(hi ? 0x3424u : 0x1404u));
  return ((p >> 1) & 0x3f803f80u) | (p & 0x80008000u);
}

template <int MODE>
__global__ void __launch_bounds__(256, 1) cvt_rate(int iters, unsigned long long *cycles,
                                                   uint32_t *sink) {
  uint32_t w[8], acc = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) w[i] = (threadIdx.x * 0x9e3779b9u) ^ (i * 0x85ebca6bu);
  __syncthreads();
  const unsigned long long t0 = clock64();
  for (int it = 0; it < iters; it++) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
      uint32_t a, b;
      if (MODE == 0 || (MODE == 2 && (i & 1))) {
        a = kva_cvt_e4m3x2_f16x2((uint16_t)w[i]);
        b = kva_cvt_e4m3x2_f16x2((uint16_t)(w[i] >> 16));
      } else {
        a = e4m3x2_int(w[i], 0);
        b = e4m3x2_int(w[i], 1);
      }
      acc ^= a ^ b;
      w[i] += 0x01010101u; /* new bytes next round (one more op per 4 values) */
    }
  }
  const unsigned long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

/* the integer route against cvt on all 65536 byte pairs */
__global__ void cvt_check(int *bad) {
  const uint32_t x = blockIdx.x * blockDim.x + threadIdx.x; /* 0..65535 */
  const uint32_t c = kva_cvt_e4m3x2_f16x2((uint16_t)x);
  const uint32_t v = e4m3x2_int(x, 0);
  for (int h = 0; h < 2; h++) {
    const uint16_t ch = (uint16_t)(c >> (16 * h)), vh = (uint16_t)(v >> (16 * h));
    const float cf = __half2float(__ushort_as_half(ch)), vf = __half2float(__ushort_as_half(vh));
    const int nan = (ch & 0x7c00u) == 0x7c00u && (ch & 0x3ffu); /* e4m3 NaN */
    if (!nan && cf != vf * 256.0f) atomicAdd(bad, 1);
  }
}

template <int MODE>
static void run(int sms, const char *name) {
  const int iters = 4096;
  unsigned long long *dc;
  uint32_t *sink;
  CHECK(cudaMalloc(&dc, sizeof(unsigned long long) * sms));
  CHECK(cudaMalloc(&sink, sizeof(uint32_t) * 256 * sms));
  cvt_rate<MODE><<<sms, 256>>>(iters / 8, dc, sink); /* warm-up */
  CHECK(cudaGetLastError());
  cvt_rate<MODE><<<sms, 256>>>(iters, dc, sink);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  unsigned long long *hc = (unsigned long long *)malloc(sizeof(unsigned long long) * sms);
  CHECK(cudaMemcpy(hc, dc, sizeof(unsigned long long) * sms, cudaMemcpyDeviceToHost));
  double maxc = 0;
  for (int i = 0; i < sms; i++) maxc = hc[i] > maxc ? (double)hc[i] : maxc;
  const double vals = 256.0 * iters * 8 * 4; /* per SM */
  printf("%-12s %6.1f e4m3 values/cycle/SM (%.0f cycles for a 64 x 576 block)\n", name,
         vals / maxc, 64.0 * 576 / (vals / maxc));
  free(hc);
  CHECK(cudaFree(dc));
  CHECK(cudaFree(sink));
}

int main(void) {
  int dev = 0, sms = 0, *dbad, bad = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaMalloc(&dbad, sizeof(int)));
  CHECK(cudaMemset(dbad, 0, sizeof(int)));
  cvt_check<<<256, 256>>>(dbad);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(&bad, dbad, sizeof(int), cudaMemcpyDeviceToHost));
  printf("integer route vs cvt: %d mismatches of 131072 values\n", bad);
  run<0>(sms, "cvt (F2FP)");
  run<1>(sms, "integer");
  run<2>(sms, "half each");
  CHECK(cudaFree(dbad));
  return bad != 0;
}
