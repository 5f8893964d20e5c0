/* Probe: how many bytes per cycle one SM can pull into its smem from L2
 * (and from DRAM) when every SM pulls at once, with MLA v5's unit of
 * transfer (a 72 KB latent block: 64 keys x 576 x 2 bytes) and 2..3 blocks
 * in flight per SM (non-tensor bulk copies completing on mbarriers). One
 * CTA of one thread-issuing warp per SM. Also: pairs of CTAs reading the
 * same block at once (v5's two row tiles of a request). Prints bytes per
 * cycle per SM and TB/s over all SMs. Design question it answers: is v5's
 * refill wait the transfer from L2 into the SM? Each block comes either as
 * one 1-D bulk copy (the block is contiguous), as v5 loads it (nine
 * tensor-map boxes of 64 columns x 64 rows, 128-byte swizzle), as one box
 * of 64 x 64 x 9 (the column blocks as a third dimension), or by CTA pairs
 * as clusters, each issuing half the boxes multicast to both; from all SMs
 * at once, or from one SM (one pair) alone.
 * `l2_ingress pace`: DRAM-fed blocks with a per-block delay (cycles spent on
 * a landed block before its stage is refilled, as a kernel's compute), on
 * 66, 100, 116 and all SMs: whether the delivery falls as more SMs stream
 * (it did not, 2026-11-28: 3.0-3.1 TB/s at 132 CTAs in every variant).
 * `l2_ingress rows`: one bulk copy a block, the boxes, or a bulk copy a key
 * into padded rows (H200, 2026-11-28: the copy a key stalls once a block
 * has work, 3.2 TB/s at 1500 cycles a block).
 * `l2_ingress tma`: the boxes' swizzle, L2 promotion and width against one
 * bulk copy (H200, 2026-11-28: promoted to 256 bytes the boxes streamed
 * 4.14-4.27 TB/s, at 128, 64 or none 4.51-4.62, as the bulk copy).
 *   (built with the CUDA configuration: build-cuda/l2_ingress) */
#include <cuda.h>
#include <string.h>

#include "cuda/ptx.cuh"
#include "cuda/tma.h"

#include "probe.cuh"

#define BLOCK_BYTES 73728 /* 64 keys x 576 x 2 */
#define ROW_PAD 1168      /* mode 4: a key's 1152 bytes at this smem stride (16 mod 128) */
#define STAGE_BYTES (64 * ROW_PAD)
#define STAGES 3

/* Each CTA streams `iters` blocks from buf (blocks of its own, scattered;
 * shared by CTA pairs when `pair` is 1; its own in a row when 2), `depth`
 * of them in flight, `delay` cycles on each before refilling its stage. */
/* boxes: 0 one 1-D bulk copy per block; 1 nine 64 x 64 boxes (v5); 2 one
 * 64 x 64 x 9 box (map9: the column blocks as a third dimension); 3 CTA
 * pairs as clusters, each CTA issuing 4 or 5 of the nine boxes to both;
 * 4 a 1-D bulk copy per key (1152 bytes) into rows ROW_PAD apart (rows
 * whose banks differ, for register fragments read from raw rows); 5 eight
 * boxes of 72 columns x 64 rows (map: no swizzle, rows 144 bytes apart) */
__global__ void __launch_bounds__(32, 1) ingress(const unsigned char *buf, long nblocks, int iters,
                                                 int depth, int pair, int boxes, int delay,
                                                 const __grid_constant__ CUtensorMap map,
                                                 const __grid_constant__ CUtensorMap map9,
                                                 unsigned long long *cycles) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t s0 = (kva_smem_u32(smem) + 1023u) & ~1023u;
  const uint32_t bars = s0 + STAGES * STAGE_BYTES;
  const int lane = threadIdx.x;
  const long stream = pair == 1 ? blockIdx.x / 2 : blockIdx.x;
  if (lane == 0)
    for (int s = 0; s < STAGES; s++) kva_mbar_init(bars + 8 * s, 1);
  __syncwarp();
  kva_fence_mbar_init();
  __syncwarp();
  if (boxes == 3) kva_cluster_sync(); /* both CTAs' barriers are set up */
  const int rank = blockIdx.x & 1;
  /* block j of this stream: (stream * 977 + j * 131) % nblocks, spread over buf */
  const unsigned long long t0 = clock64();
  for (int j = 0; j < iters + depth; j++) {
    if (j >= depth) { /* block j - depth landed: its stage is free */
      const int s = (j - depth) % depth;
      kva_mbar_wait(bars + 8 * s, (uint32_t)(((j - depth) / depth) & 1));
      if (boxes == 3) kva_cluster_sync(); /* ... in both CTAs, before either refills it */
      /* pace mode: the block's "compute" before its stage is refilled */
      for (const long long w0 = clock64(); clock64() - w0 < delay;) {
      }
    }
    const int s = j % depth;
    /* pair 2: the stream's blocks in a row (one request's pages in order) */
    const long b = pair == 2 ? (stream * (long)iters + j) % nblocks
                             : (stream * 977 + (long)j * 131) % nblocks;
    if (j < iters && boxes == 4) {
      if (lane == 0) kva_mbar_arrive_expect_tx(bars + 8 * s, BLOCK_BYTES);
      __syncwarp();
      for (int r = lane; r < 64; r += 32)
        kva_bulk_load(s0 + s * STAGE_BYTES + r * ROW_PAD, buf + b * BLOCK_BYTES + r * 1152, 1152,
                      bars + 8 * s);
    } else if (j < iters && lane == 0) {
      kva_mbar_arrive_expect_tx(bars + 8 * s, BLOCK_BYTES);
      if (boxes == 1) /* v5's nine 64 x 64 boxes, rows b*64.. of the [rows][576] view */
        for (int k = 0; k < 9; k++)
          kva_tma_load_3d(s0 + s * STAGE_BYTES + k * 8192, &map, 64 * k, 0, (int)(b * 64),
                          bars + 8 * s);
      else if (boxes == 2)
        kva_tma_load_3d(s0 + s * STAGE_BYTES, &map9, 0, (int)(b * 64), 0, bars + 8 * s);
      else if (boxes == 5)
        for (int k = 0; k < 8; k++)
          kva_tma_load_3d(s0 + s * STAGE_BYTES + k * 9216, &map, 72 * k, 0, (int)(b * 64),
                          bars + 8 * s);
      else if (boxes == 3)
        for (int k = rank; k < 9; k += 2)
          kva_tma_load_3d_multicast(s0 + s * STAGE_BYTES + k * 8192, &map, 64 * k, 0,
                                    (int)(b * 64), bars + 8 * s, 3);
      else
        kva_bulk_load(s0 + s * STAGE_BYTES, buf + b * BLOCK_BYTES, BLOCK_BYTES, bars + 8 * s);
    }
    __syncwarp();
  }
  const unsigned long long t1 = clock64();
  if (lane == 0) cycles[blockIdx.x] = t1 - t0;
}

static void launch(const unsigned char *buf, long nblocks, int sms, int iters, int depth, int pair,
                   int boxes, int delay, const CUtensorMap *map, const CUtensorMap *map9, size_t smem,
                   unsigned long long *dc) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  cfg.gridDim = dim3((unsigned)sms);
  cfg.blockDim = dim3(32);
  cfg.dynamicSmemBytes = smem;
  if (boxes == 3) {
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 2;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
  }
  CHECK(cudaLaunchKernelEx(&cfg, ingress, buf, nblocks, iters, depth, pair, boxes, delay, *map,
                           *map9, dc));
  CHECK(cudaGetLastError());
}

static void run(const unsigned char *buf, long nblocks, int sms, int depth, int pair, int boxes,
                int delay, const CUtensorMap *map, const CUtensorMap *map9, const char *what) {
  const int iters = 400;
  unsigned long long *dc;
  CHECK(cudaMalloc(&dc, sizeof(unsigned long long) * sms));
  const size_t smem = 1024 + STAGES * STAGE_BYTES + 64;
  CHECK(cudaFuncSetAttribute(ingress, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  launch(buf, nblocks, sms, iters / 4, depth, pair, boxes, delay, map, map9, smem,
         dc); /* warm-up (L2) */
  probe_timer tm;
  probe_timer_start(&tm);
  launch(buf, nblocks, sms, iters, depth, pair, boxes, delay, map, map9, smem, dc);
  const float ms = probe_timer_stop_ms(&tm);
  unsigned long long *hc = (unsigned long long *)malloc(sizeof(unsigned long long) * sms);
  CHECK(cudaMemcpy(hc, dc, sizeof(unsigned long long) * sms, cudaMemcpyDeviceToHost));
  double maxc = 0, sumc = 0;
  for (int i = 0; i < sms; i++) {
    maxc = hc[i] > maxc ? (double)hc[i] : maxc;
    sumc += (double)hc[i];
  }
  const double bytes_sm = (double)iters * BLOCK_BYTES;
  printf("%-44s depth %d: %5.1f B/cycle/SM (mean CTA), %5.1f (slowest), %5.2f TB/s into smem, "
         "%5.0f cycles per 72 KB block\n",
         what, depth, bytes_sm / (sumc / sms), bytes_sm / maxc, bytes_sm * sms / (ms * 1e-3) / 1e12,
         (sumc / sms) / iters);
  free(hc);
  CHECK(cudaFree(dc));
}

int main(int argc, char **argv) {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const long big = 2048L * 1024 * 1024 / BLOCK_BYTES; /* 2 GB: DRAM */
  const long small = 16L * 1024 * 1024 / BLOCK_BYTES; /* 16 MB: L2 */
  unsigned char *buf;
  CHECK(cudaMalloc(&buf, (size_t)big * BLOCK_BYTES));
  CHECK(cudaMemset(buf, 1, (size_t)big * BLOCK_BYTES));
  CUtensorMap map, map9;
  const uint64_t dims[3] = {576, 1, (uint64_t)big * 64}, strides[2] = {1152, 1152};
  const uint32_t box[3] = {64, 1, 64};
  /* the same rows with the nine column blocks as the third dimension
   * (stride 128 bytes): one box lands as [9][64 rows][128 B], v5's stage */
  const uint64_t dims9[3] = {64, (uint64_t)big * 64, 9}, strides9[2] = {1152, 128};
  const uint32_t box9[3] = {64, 64, 9};
  if (kva_tma_encode_16bit_3d(&map, buf, dims, strides, box) != KVA_OK) {
    fprintf(stderr, "tensor map encode failed\n");
    return 1;
  }
  const int have9 = kva_tma_encode_16bit_3d(&map9, buf, dims9, strides9, box9) == KVA_OK;
  if (!have9) printf("the 64 x 64 x 9 box map did not encode: mode 2 skipped\n");
  static const char *how[6] = {"1 bulk", "9 boxes", "1 box of 9", "pairs multicast",
                               "64 row copies", "8 boxes 72"};
  char what[96];
  if (argc > 1 && strcmp(argv[1], "tma") == 0) {
    /* the tensor path's options against one bulk copy a block: swizzle,
     * L2 promotion, box shape (DRAM-fed, depth 2, blocks in order) */
    struct {
      int mode, swz, promo, boxw;
    } cfg[] = {{0, 0, 0, 0},     {1, 128, 256, 64}, {1, 128, 128, 64}, {1, 128, 64, 64},
               {1, 128, 0, 64},  {1, 0, 256, 64},   {2, 128, 256, 64}, {2, 128, 0, 64},
               {5, 0, 256, 72},  {5, 0, 128, 72},   {5, 0, 0, 72}};
    for (int delay = 0; delay <= 1500; delay += 1500)
      for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        CUtensorMap m = map, m9 = map9;
        if (cfg[i].mode == 1 || cfg[i].mode == 5) {
          const uint32_t bx[3] = {(uint32_t)cfg[i].boxw, 1, 64};
          if (kva_tma_encode_16bit_3d_opts(&m, buf, dims, strides, bx, cfg[i].swz,
                                           cfg[i].promo) != KVA_OK) {
            printf("cfg %zu: encode failed\n", i);
            continue;
          }
        } else if (cfg[i].mode == 2) {
          if (kva_tma_encode_16bit_3d_opts(&m9, buf, dims9, strides9, box9, cfg[i].swz,
                                           cfg[i].promo) != KVA_OK) {
            printf("cfg %zu: encode failed\n", i);
            continue;
          }
        }
        snprintf(what, sizeof what, "tma %-10s swz %3d promo %3d delay %4d", how[cfg[i].mode],
                 cfg[i].swz, cfg[i].promo, delay);
        run(buf, big, 128, 2, 2, cfg[i].mode, delay, &m, &m9, what);
      }
    CHECK(cudaFree(buf));
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "rows") == 0) {
    /* one bulk copy a block, nine boxes, one box of nine, or a copy a key
     * into padded rows: DRAM-fed, depth 2, 128 and all SMs, per-block delay */
    static const int modes[4] = {0, 1, 2, 4};
    const int counts[2] = {128, sms};
    for (int delay = 0; delay <= 3000; delay += 1500)
      for (int ci = 0; ci < (sms > 128 ? 2 : 1); ci++)
        for (int mi = 0; mi < 4; mi++) {
          const int n = counts[ci];
          if (modes[mi] == 2 && !have9) continue;
          snprintf(what, sizeof what, "rows %s delay %4d CTAs %3d", how[modes[mi]], delay, n);
          run(buf, big, n, 2, 2, modes[mi], delay, &map, &map9, what);
        }
    CHECK(cudaFree(buf));
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "pace") == 0) {
    /* Each CTA spends `delay` cycles on a landed block before refilling its
     * stage (a kernel's compute between a stage's landing and its release),
     * on 66 .. all SMs: does the DRAM's delivery fall as more SMs stream? */
    static const int counts[4] = {66, 100, 116, 0};
    for (int boxes = 0; boxes <= 1; boxes++)
      for (int order = 0; order <= 2; order += 2)
        for (int depth = 2; depth <= STAGES; depth++)
          for (int delay = 0; delay <= 4500; delay += 1500)
            for (int c = 0; c < 4; c++) {
              const int n = counts[c] ? counts[c] : sms;
              snprintf(what, sizeof what, "pace %s %s delay %4d CTAs %3d", how[boxes],
                       order ? "in-order" : "scattered", delay, n);
              run(buf, big, n, depth, order, boxes, delay, &map, &map9, what);
            }
    CHECK(cudaFree(buf));
    return 0;
  }
  for (int boxes = 0; boxes <= 3; boxes++) {
    if (boxes == 2 && !have9) continue;
    const int pairs_only = boxes == 3;
    for (int depth = 2; depth <= STAGES; depth++) {
      if (!pairs_only) {
        snprintf(what, sizeof what, "L2 (16 MB), own blocks, %s", how[boxes]);
        run(buf, small, sms, depth, 0, boxes, 0, &map, &map9, what);
      }
      snprintf(what, sizeof what, "L2 (16 MB), CTA pairs share, %s", how[boxes]);
      run(buf, small, sms, depth, 1, boxes, 0, &map, &map9, what);
      if (!pairs_only) {
        snprintf(what, sizeof what, "DRAM (2 GB), own blocks, %s", how[boxes]);
        run(buf, big, sms, depth, 0, boxes, 0, &map, &map9, what);
      }
      snprintf(what, sizeof what, "DRAM (2 GB), CTA pairs share, %s", how[boxes]);
      run(buf, big, sms, depth, 1, boxes, 0, &map, &map9, what);
    }
    snprintf(what, sizeof what, "L2 (16 MB), %s alone, %s", pairs_only ? "one pair" : "one SM",
             how[boxes]);
    run(buf, small, pairs_only ? 2 : 1, STAGES, pairs_only, boxes, 0, &map, &map9, what);
    snprintf(what, sizeof what, "DRAM (2 GB), %s alone, %s", pairs_only ? "one pair" : "one SM",
             how[boxes]);
    run(buf, big, pairs_only ? 2 : 1, STAGES, pairs_only, boxes, 0, &map, &map9, what);
  }
  CHECK(cudaFree(buf));
  return 0;
}
