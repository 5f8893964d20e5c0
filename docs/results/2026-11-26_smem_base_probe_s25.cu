// Where dynamic shared memory starts (H100, driver 580.159.04, twenty-fifth session):
// nvcc -gencode=arch=compute_90a,code=sm_90a -O2 THIS.cu -o smem_base && ./smem_base
// printed: base 1024 (mod 1024: 0) at 1 KB, 100 KB, 223424 and 232448 bytes, 384 threads.
#include <cstdio>
#include <cstdint>
extern "C" __global__ void k(unsigned *out) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (threadIdx.x == 0) out[blockIdx.x] = (unsigned)__cvta_generic_to_shared(smem);
}
int main() {
  unsigned *d; cudaMalloc(&d, 64 * 4);
  int sizes[] = {1024, 100 * 1024, 223424, 232448};
  for (int s : sizes) {
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, s);
    k<<<4, 384, s>>>(d);
    cudaError_t e = cudaDeviceSynchronize();
    unsigned h[4]; cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost);
    printf("dyn smem %d: %s, base %u %u %u %u (mod 1024: %u)\n", s, cudaGetErrorString(e), h[0], h[1], h[2], h[3], h[0] % 1024);
  }
  return 0;
}
