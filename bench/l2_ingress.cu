/* Probe: how many bytes per cycle one SM can pull into its smem from L2
 * (and from DRAM) when every SM pulls at once, with MLA v5's unit of
 * transfer (a 72 KB latent block: 64 keys x 576 x 2 bytes) and 2..3 blocks
 * in flight per SM (non-tensor bulk copies completing on mbarriers). One
 * CTA of one thread-issuing warp per SM. Also: pairs of CTAs reading the
 * same block at once (v5's two row tiles of a request). Prints bytes per
 * cycle per SM and TB/s over all SMs. Design question it answers: is v5's
 * refill wait the transfer from L2 into the SM?
 *   (built with the CUDA configuration: build-cuda/l2_ingress) */
#include "cuda/ptx.cuh"

#include "probe.cuh"

#define BLOCK_BYTES 73728 /* 64 keys x 576 x 2 */
#define STAGES 3

static __device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, unsigned bytes,
                                                 uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

/* Each CTA streams `iters` blocks from buf (blocks of its own, or shared by
 * CTA pairs when `pair`), `depth` of them in flight. */
__global__ void __launch_bounds__(32, 1) ingress(const unsigned char *buf, long nblocks, int iters,
                                                 int depth, int pair, unsigned long long *cycles) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s0 = (kva_smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t bars = s0 + STAGES * BLOCK_BYTES;
  const int lane = threadIdx.x;
  const long stream = pair ? blockIdx.x / 2 : blockIdx.x;
  if (lane == 0)
    for (int s = 0; s < STAGES; s++) kva_mbar_init(bars + 8 * s, 1);
  __syncwarp();
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncwarp();
  /* block j of this stream: (stream * 977 + j * 131) % nblocks, spread over buf */
  const unsigned long long t0 = clock64();
  for (int j = 0; j < iters + depth; j++) {
    if (j >= depth) { /* block j - depth landed: its stage is free */
      const int s = (j - depth) % depth;
      kva_mbar_wait(bars + 8 * s, (uint32_t)(((j - depth) / depth) & 1));
    }
    if (j < iters && lane == 0) {
      const int s = j % depth;
      const long b = (stream * 977 + (long)j * 131) % nblocks;
      kva_mbar_arrive_expect_tx(bars + 8 * s, BLOCK_BYTES);
      bulk_load(s0 + s * BLOCK_BYTES, buf + b * BLOCK_BYTES, BLOCK_BYTES, bars + 8 * s);
    }
    __syncwarp();
  }
  const unsigned long long t1 = clock64();
  if (lane == 0) cycles[blockIdx.x] = t1 - t0;
}

static void run(const unsigned char *buf, long nblocks, int sms, int depth, int pair,
                const char *what) {
  const int iters = 400;
  unsigned long long *dc;
  CHECK(cudaMalloc(&dc, sizeof(unsigned long long) * sms));
  const size_t smem = 1024 + STAGES * BLOCK_BYTES + 64;
  CHECK(cudaFuncSetAttribute(ingress, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  ingress<<<sms, 32, smem>>>(buf, nblocks, iters / 4, depth, pair, dc); /* warm-up (L2) */
  CHECK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  ingress<<<sms, 32, smem>>>(buf, nblocks, iters, depth, pair, dc);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  unsigned long long *hc = (unsigned long long *)malloc(sizeof(unsigned long long) * sms);
  CHECK(cudaMemcpy(hc, dc, sizeof(unsigned long long) * sms, cudaMemcpyDeviceToHost));
  double maxc = 0, sumc = 0;
  for (int i = 0; i < sms; i++) {
    maxc = hc[i] > maxc ? (double)hc[i] : maxc;
    sumc += (double)hc[i];
  }
  const double bytes_sm = (double)iters * BLOCK_BYTES;
  printf("%-34s depth %d: %5.1f B/cycle/SM (mean CTA), %5.1f (slowest), %5.2f TB/s into smem, "
         "%5.0f cycles per 72 KB block\n",
         what, depth, bytes_sm / (sumc / sms), bytes_sm / maxc, bytes_sm * sms / (ms * 1e-3) / 1e12,
         (sumc / sms) / iters);
  free(hc);
  CHECK(cudaFree(dc));
}

int main(void) {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const long big = 2048L * 1024 * 1024 / BLOCK_BYTES; /* 2 GB: DRAM */
  const long small = 16L * 1024 * 1024 / BLOCK_BYTES; /* 16 MB: L2 */
  unsigned char *buf;
  CHECK(cudaMalloc(&buf, (size_t)big * BLOCK_BYTES));
  CHECK(cudaMemset(buf, 1, (size_t)big * BLOCK_BYTES));
  for (int depth = 2; depth <= STAGES; depth++) {
    run(buf, small, sms, depth, 0, "L2 (16 MB), own blocks");
    run(buf, small, sms, depth, 1, "L2 (16 MB), CTA pairs share");
    run(buf, big, sms, depth, 0, "DRAM (2 GB), own blocks");
    run(buf, big, sms, depth, 1, "DRAM (2 GB), CTA pairs share");
  }
  CHECK(cudaFree(buf));
  return 0;
}
