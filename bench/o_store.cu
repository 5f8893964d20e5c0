/* Probe: how long one CTA takes to write an MLA O tile (64 rows x 512
 * bf16 = 64 KB, contiguous rows of 1 KB) at a chunk's end, as the MLA
 * kernels store it (from registers, each lane 8 bytes, each warp store
 * one whole 32-byte sector in each of 8 rows: mla_store_rows) against
 * staging it in smem and writing it with bulk copies (cp.async.bulk
 * global <- shared, waited with wait_group.read, i.e. until smem may be
 * reused). With all SMs storing, or a few storing while the rest stream
 * latent-sized blocks from DRAM (the state of a decode step).
 * Prints the median and 90th percentile of a store's time per mode, and
 * the median of each CTA's first store (its code not yet cached).
 *   (built with the CUDA configuration: build-cuda/o_store) */
#include <stdint.h>

#include "cuda/ptx.cuh"

#include "probe.cuh"

#define ROWS 64
#define ROW_BYTES 1024    /* 512 bf16 */
#define PAD_ROW 1040      /* smem row stride of the staged tile (bank spread) */
#define TILE_BYTES (ROWS * ROW_BYTES)
#define REPS 24           /* stores per storing CTA */
#define TILES_PER_CTA 64  /* distinct destinations, round robin */
#define BLOCK_BYTES 73728 /* a streamer's unit: 64 keys x 576 x 2 */

/* mode 0: registers -> global as mla_store_rows (whole sectors); 1:
 * registers -> smem (rows PAD_ROW apart) -> 64 bulk copies of a row, one
 * per thread of the first 64; 2: as 1 into unpadded rows, one 64 KB bulk
 * copy by thread 0. CTAs below `storers` store, the rest stream blocks of
 * `lat` (nblk of them) from DRAM until every storer is done. */
__global__ void __launch_bounds__(256, 1)
    o_store(int mode, int storers, uint16_t *out, const unsigned char *lat, long nblk,
            unsigned *done, unsigned long long *ns) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s0 = (kva_smem_u32(smem) + 1023u) & ~1023u;
  unsigned char *p0 = smem + (s0 - kva_smem_u32(smem));
  const int tid = threadIdx.x;
  if ((int)blockIdx.x >= storers) { /* streamer: one thread, two blocks in flight */
    const uint32_t bar = s0 + 2 * BLOCK_BYTES;
    if (tid == 0) {
      kva_mbar_init(bar, 1);
      kva_mbar_init(bar + 8, 1);
      kva_fence_mbar_init();
      long b = (long)blockIdx.x * 7919;
      for (int j = 0;; j++) {
        const int s = j & 1;
        if (j >= 2) kva_mbar_wait(bar + 8 * s, (uint32_t)(((j - 2) >> 1) & 1));
        if (*(volatile unsigned *)done >= (unsigned)storers) {
          if (j >= 1) kva_mbar_wait(bar + 8 * (s ^ 1), (uint32_t)(((j - 1) >> 1) & 1));
          break;
        }
        kva_mbar_arrive_expect_tx(bar + 8 * s, BLOCK_BYTES);
        kva_bulk_load(s0 + s * BLOCK_BYTES, lat + (b % nblk) * BLOCK_BYTES, BLOCK_BYTES,
                      bar + 8 * s);
        b += 131;
      }
    }
    return;
  }
  /* the O warpgroups' register layout: wg, wq, g, tq; o[hh][64] floats */
  const int wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  float o[2][64];
#pragma unroll
  for (int i = 0; i < 64; i++) {
    o[0][i] = 0.25f * (float)((tid + i) & 15);
    o[1][i] = 0.5f * (float)((tid * 3 + i) & 7);
  }
  const float inv = 1.0f / (1.0f + (float)(tid & 1));
  for (int rep = 0; rep < REPS; rep++) {
    uint16_t *tile = out + ((size_t)blockIdx.x * TILES_PER_CTA + rep % TILES_PER_CTA) *
                               (TILE_BYTES / 2);
    /* 10 us apart, as chunk ends are: each store drains before the next */
    const unsigned long long tw = kva_globaltimer();
    while (kva_globaltimer() - tw < 10000ull) {
    }
    __syncthreads();
    const unsigned long long t0 = kva_globaltimer();
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
      const int row = 16 * wq + g + 8 * hf;
      const int odd = tq & 1, col = 8 * odd + 2 * (tq & 2);
#pragma unroll
      for (int hh = 0; hh < 2; hh++)
#pragma unroll
        for (int jp = 0; jp < 8; jp++) {
          const uint32_t e =
              kva_pack_bf16x2(o[hh][8 * jp + 2 * hf] * inv, o[hh][8 * jp + 2 * hf + 1] * inv);
          const uint32_t d = kva_pack_bf16x2(o[hh][8 * jp + 4 + 2 * hf] * inv,
                                             o[hh][8 * jp + 4 + 2 * hf + 1] * inv);
          const uint32_t got = (uint32_t)__shfl_xor_sync(0xffffffffu, (int)(odd ? e : d), 1);
          const uint2 v = odd ? make_uint2(got, d) : make_uint2(e, got);
          const int c = 256 * wg + 128 * hh + 16 * jp + col; /* bf16 column */
          if (mode == 0)
            *(uint2 *)(tile + (size_t)row * 512 + c) = v;
          else
            *(uint2 *)(p0 + (size_t)row * (mode == 1 ? PAD_ROW : ROW_BYTES) + 2 * c) = v;
        }
    }
    if (mode != 0) {
      kva_fence_proxy_async_smem(); /* generic smem writes -> the bulk copies */
      __syncthreads();
      if (mode == 1 && tid < ROWS) {
        kva_bulk_store(tile + (size_t)tid * 512, s0 + tid * PAD_ROW, ROW_BYTES);
        kva_bulk_commit();
        kva_bulk_wait_read();
      } else if (mode == 2 && tid == 0) {
        kva_bulk_store(tile, s0, TILE_BYTES);
        kva_bulk_commit();
        kva_bulk_wait_read();
      }
    }
    __syncthreads();
    const unsigned long long t1 = kva_globaltimer();
    if (tid == 0) ns[(size_t)blockIdx.x * REPS + rep] = t1 - t0;
  }
  if (mode != 0 && tid < ROWS) kva_bulk_wait();
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    atomicAdd(done, 1u);
  }
}

static int cmp_u64(const void *a, const void *b) {
  const unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
  return x < y ? -1 : x > y;
}

int main(void) {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (sms > 1024) sms = 1024; /* cold[] below */
  const long nblk = 2048L * 1024 * 1024 / BLOCK_BYTES; /* 2 GB of latents: DRAM */
  unsigned char *lat;
  uint16_t *out;
  unsigned *done;
  unsigned long long *dns;
  CHECK(cudaMalloc(&lat, (size_t)nblk * BLOCK_BYTES));
  CHECK(cudaMemset(lat, 1, (size_t)nblk * BLOCK_BYTES));
  CHECK(cudaMalloc(&out, (size_t)sms * TILES_PER_CTA * TILE_BYTES));
  CHECK(cudaMalloc(&done, sizeof(unsigned)));
  CHECK(cudaMalloc(&dns, sizeof(unsigned long long) * sms * REPS));
  const size_t smem = 1024 + 2 * BLOCK_BYTES + 64 > 1024 + ROWS * PAD_ROW
                          ? 1024 + 2 * BLOCK_BYTES + 64
                          : 1024 + ROWS * PAD_ROW;
  CHECK(cudaFuncSetAttribute(o_store, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  unsigned long long *hns = (unsigned long long *)malloc(sizeof(unsigned long long) * sms * REPS);
  static const char *names[3] = {"registers -> global (mla_store_rows)",
                                 "smem (padded rows) + 64 row bulk copies",
                                 "smem + one 64 KB bulk copy"};
  const int storer_counts[3] = {sms, 16, 4};
  for (int si = 0; si < 3; si++)
    for (int mode = 0; mode < 3; mode++) {
      const int storers = storer_counts[si];
      for (int pass = 0; pass < 2; pass++) { /* the first warms up */
        CHECK(cudaMemset(done, 0, sizeof(unsigned)));
        o_store<<<sms, 256, smem>>>(mode, storers, out, lat, nblk, done, dns);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
      }
      CHECK(cudaMemcpy(hns, dns, sizeof(unsigned long long) * storers * REPS,
                       cudaMemcpyDeviceToHost));
      /* the first store of each CTA (its code not yet in the instruction
       * caches) apart from the rest */
      unsigned long long cold[1024];
      int n = 0;
      for (int c = 0; c < storers && c < 1024; c++) {
        cold[c] = hns[(size_t)c * REPS];
        for (int r = 1; r < REPS; r++) hns[n++] = hns[(size_t)c * REPS + r];
      }
      qsort(hns, (size_t)n, sizeof(unsigned long long), cmp_u64);
      qsort(cold, (size_t)storers, sizeof(unsigned long long), cmp_u64);
      printf("%3d storers, %3d streaming: %-40s median %6.2f us, p90 %6.2f us (%d stores); "
             "first store median %6.2f us\n",
             storers, sms - storers, names[mode], hns[n / 2] * 1e-3, hns[n * 9 / 10] * 1e-3, n,
             cold[storers / 2] * 1e-3);
    }
  free(hns);
  CHECK(cudaFree(lat));
  CHECK(cudaFree(out));
  CHECK(cudaFree(done));
  CHECK(cudaFree(dns));
  return 0;
}
