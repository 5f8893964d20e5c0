/* Probe: the speed of a candidate MLA decode structure ("v6") against v5's
 * seesaw, before building it (docs/performance.md, "Twenty-third
 * session"). One warpgroup makes S and P, two warpgroups each own half of
 * O (P V from smem, each refilling the latent columns it was the last to
 * read). Does the chain reach >= 580 TFLOP/s at 128 query rows? No
 * masking, no page table walk beyond one index per block, no epilogue:
 * the key loop only, with real wgmmas, softmax, barriers and latent blocks
 * (MEM 1: 72 KB from a 1.2 GB buffer in a random block order by 1-D bulk
 * copies; MEM 2: the same by v5's 64 x 64 TMA boxes; MEM 0: no loads),
 * each block read by the CTAs of a worker's row tiles (pairs launched as
 * clusters of 2, as v5's). Nothing is checked: speed only, arbitrary bf16
 * data. Prints the median of PROBE_REPS launches (default 5; `kvattn
 * bench` times ~90 back to back, and 200 here drop the DRAM rows by 9-16%).
 *   build-cuda/mla_v6_probe [row tiles 2|4] [mean sk 8192|4096]
 * Warpgroup 0 (S): per block n in stage n % NST: S = Q K^T (36 ss
 * k-steps; QREG: 32 rs k-steps from Q's latent columns in its registers +
 * 4 ss on the rope columns, which would free Q's smem for a third stage),
 * online softmax, P over the stage's rope column block (dead once S read
 * it), the row factors c to smem, arrival on ready[stage]. Warpgroups 1, 2
 * (O halves): wait ready, rescale O where c != 1, O += P V (4 m64n256k16
 * from smem), wait, barrier of both, then refill: warpgroup 1 column
 * blocks 0..3, warpgroup 2 blocks 4..8 of the stage with block n + NST.
 * Only NST 2 with Q in smem runs: QREG with 3 stages needs 192 registers
 * in warpgroup 0 and 160 in each O warpgroup, 8 more a thread slot than
 * 384 threads hold (ptxas spills and serializes the wgmmas at 184).
 * Build flags: -DPROBE_FENCE (a proxy fence per column block in S, as v5),
 * -DPROBE_TILE_SOFTMAX (v6's mla_softmax_tile + mla5_store_p). */
#include <cuda.h>

#include <math.h>
#include <string.h>
#include "cuda/mla_kernel_v5.cuh"

#include "probe.cuh"

#define KB 8192    /* one 64-column block of a 64-key latent block */
#define BLK 73728  /* 64 keys x 576 x 2 */
#define THREADS 384
#define BAR_PVDONE 1
#ifndef SREGS
#define SREGS 192
#define OREGS 160
#endif

/* D (+)= A (64x16, registers) * B (16x64 smem descriptor, K-major). */
static __device__ __forceinline__ void wgmma_s_rs(float d[32], const uint32_t a[4], uint64_t desc_b,
                                                  int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " KVA_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : KVA_WGMMA_OUT32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(acc));
}

static __device__ __forceinline__ uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
/* two bf16 in [-range, range) */
static __device__ __forceinline__ uint32_t rand_bf16x2(uint32_t seed, float range) {
  const uint32_t h = hash32(seed);
  const float a = ((float)(h & 0xffff) / 65536.0f * 2.0f - 1.0f) * range;
  const float b = ((float)(h >> 16) / 65536.0f * 2.0f - 1.0f) * range;
  return mla_pack<KVA_BF16>(a, b);
}

__global__ void fill_latents(uint32_t *buf, size_t words) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words;
       i += (size_t)gridDim.x * blockDim.x)
    buf[i] = rand_bf16x2((uint32_t)i * 2654435761u + 12345u, 1.0f);
}

/* smem: stages [NST][9 column blocks][64 rows][128 B], Q's rope columns
 * [64][128 B], c factors [NST][64], barriers full[NST][9], ready[NST]. */
template <int NST, int QREG>
struct probe_smem {
  /* QREG: Q's 512 latent columns in warpgroup 0's registers, only its rope
   * columns in smem; else all of Q in smem (9 column blocks, rope last) */
  static constexpr int STAGES = 0, Q = NST * BLK, QROPE = Q + (QREG ? 0 : 8 * KB),
                       SC = Q + (QREG ? 1 : 9) * KB, BARS = SC + NST * 64 * 4,
                       TOTAL = BARS + (NST * 9 + NST) * 8;
};

template <int NST, int MEM, int QREG>
__global__ void __launch_bounds__(THREADS, 1)
    chain(const __grid_constant__ kva_mla_args a, const unsigned char *lat, const int *order,
          int nb, unsigned long long *cycles, float *sink) {
  typedef probe_smem<NST, QREG> L;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t s_raw = kva_smem_u32(smem_raw);
  const uint32_t s0 = (s_raw + 1023u) & ~1023u;
  unsigned char *const p0 = smem_raw + (s0 - s_raw);
  const uint32_t s_qr = s0 + L::QROPE, s_bar = s0 + L::BARS;
  const int tid = threadIdx.x, tw = tid & 127, wg = mla_uni(tid >> 7);
  const int warp = tid >> 5, wq = warp & 3, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int worker = blockIdx.x;
  const int *const ord = order + (size_t)worker * nb;
  auto full = [&](int s, int k) { return s_bar + 8u * (uint32_t)(s * 9 + k); };
  auto ready = [&](int s) { return s_bar + 8u * (uint32_t)(NST * 9 + s); };

  /* Q's rope columns and (MEM 0) the stages: arbitrary data */
  for (int i = tid; i < (QREG ? 1 : 9) * KB / 4; i += THREADS)
    ((uint32_t *)(p0 + L::Q))[i] = rand_bf16x2(i * 7u + 1u + blockIdx.y * 99991u, 0.5f);
  if (!MEM)
    for (int i = tid; i < NST * BLK / 4; i += THREADS)
      ((uint32_t *)p0)[i] = rand_bf16x2(i * 13u + 5u, 1.0f);
  if (tid == 0) {
    for (int i = 0; i < NST * 9; i++) kva_mbar_init(s_bar + 8u * i, 1);
    for (int s = 0; s < NST; s++) kva_mbar_init(ready(s), 128);
  }
  kva_fence_proxy_async_smem();
  __syncthreads();
  if (tid == 0)
    for (int s = 0; s < NST && s < nb; s++)
      for (int k = 0; k < 9; k++) {
        if (MEM == 2) { /* v5's and v6's TMA boxes: 64 keys x 64 columns of [slots][576] */
          kva_mbar_arrive_expect_tx(full(s, k), KB);
          kva_tma_load_3d(s0 + s * BLK + k * KB, &a.kv_map, 64 * k, 0, ord[s] * 64, full(s, k));
        } else if (MEM) {
          kva_mbar_arrive_expect_tx(full(s, k), KB);
          kva_bulk_load(s0 + s * BLK + k * KB, lat + (size_t)ord[s] * BLK + k * KB, KB, full(s, k));
        } else {
          kva_mbar_arrive(full(s, k));
        }
      }
  __shared__ unsigned long long t_start;
  if (tid == 0) t_start = clock64();
  float keep = 0.0f;
  if (wg == 0) {
    if (QREG)
      kva_setmaxnreg_inc<SREGS>();
    else
      kva_setmaxnreg_dec<144>();
    /* Q's 512 latent columns as rs A fragments (rows 16 wq + g (+8), columns
     * 16 kk + 2 tq (+1) (+8)): arbitrary values */
    uint32_t qa[QREG ? 32 : 1][4];
#pragma unroll
    for (int kk = 0; kk < (QREG ? 32 : 1); kk++)
#pragma unroll
      for (int r = 0; r < 4; r++) /* arbitrary: the rope block's words */
        qa[kk][r] = ((const uint32_t *)(p0 + L::QROPE))[(tw * 16 + kk * 4 + r) & (KB / 4 - 1)];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const uint64_t dqr = mla_desc(s_qr, 16, 1024);
    for (int n = 0; n < nb; n++) {
      const int s = n % NST;
      const uint32_t par = (uint32_t)((n / NST) & 1);
      const uint32_t st = s0 + s * BLK;
      float sacc[32];
#pragma unroll
      for (int i = 0; i < 32; i++) {
        sacc[i] = 0.0f;
        kva_reg_fence_f32(&sacc[i]);
      }
#pragma unroll
      for (int kk = 0; kk < (QREG ? 32 : 1); kk++) kva_reg_fence_u32(&qa[kk][0]);
      kva_wgmma_fence();
#pragma unroll
      for (int k = 0; k < 9; k++) {
        kva_mbar_wait(full(s, k), par);
#ifdef PROBE_FENCE /* as v5's and v6's S: a proxy fence per column block */
        kva_fence_proxy_async_smem();
#endif
        const uint64_t dk = mla_desc(st + k * KB, 16, 1024);
#pragma unroll
        for (int t = 0; t < 4; t++) {
          if (k < 8 && QREG)
            wgmma_s_rs(sacc, qa[QREG ? 4 * k + t : 0], dk + ((t * 32) >> 4), k > 0 || t > 0);
          else if (k < 8)
            kva_wgmma_m64n64k16_ss_bf16(sacc, mla_desc(s0 + L::Q + k * KB + t * 32, 16, 1024),
                                        dk + ((t * 32) >> 4), k > 0 || t > 0);
          else
            kva_wgmma_m64n64k16_ss_bf16(sacc, dqr + ((t * 32) >> 4), dk + ((t * 32) >> 4), 1);
        }
      }
      kva_wgmma_commit();
      kva_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; i++) kva_reg_fence_f32(&sacc[i]);
#ifdef PROBE_TILE_SOFTMAX /* v6's: mla_softmax_tile, then mla5_store_p */
      {
        const int pos[2] = {1 << 30, 1 << 30};
        float c[2];
        uint32_t pk[8][2];
        mla_softmax_tile<KVA_BF16, 8, false>(sacc, m, l, c, pk, 0, 1 << 30, 1 << 30, pos, a,
                                             a.qk_mul, tq);
        mla5_store_p(p0 + s * BLK + 8 * KB, pk, wq, g, tq);
        if (tq == 0) {
          ((float *)(p0 + L::SC))[s * 64 + 16 * wq + g] = c[0];
          ((float *)(p0 + L::SC))[s * 64 + 16 * wq + g + 8] = c[1];
        }
      }
#else
      /* online softmax (base 2), P stored as it is made: no packed copy
       * held in registers (v2/v5's mla_softmax_tile keeps one) */
      const uint32_t s_p = s0 + s * BLK + 8 * KB;
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++) {
          sacc[4 * j + 2 * hf] *= a.qk_mul;
          sacc[4 * j + 2 * hf + 1] *= a.qk_mul;
          mx = fmaxf(mx, fmaxf(sacc[4 * j + 2 * hf], sacc[4 * j + 2 * hf + 1]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m[hf], mx);
        const float c = kva_ex2(m[hf] - mn);
        m[hf] = mn;
        float sum = 0.0f;
        const int r = 16 * wq + g + 8 * hf;
#pragma unroll
        for (int j = 0; j < 8; j++) {
          const float e0 = kva_ex2(sacc[4 * j + 2 * hf] - mn), e1 = kva_ex2(sacc[4 * j + 2 * hf + 1] - mn);
          sum += e0 + e1;
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(s_p + r * 128 + ((j ^ (r & 7)) << 4) + 4 * tq),
                       "r"(mla_pack<KVA_BF16>(e0, e1)) : "memory");
        }
        l[hf] = l[hf] * c + sum;
        if (tq == 0)
          asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(s0 + L::SC + (uint32_t)(s * 64 + r) * 4u), "f"(c)
                       : "memory");
      }
      kva_fence_proxy_async_smem(); /* P (generic stores) -> the consumers' wgmma */
#endif
      kva_mbar_arrive(ready(s));
    }
    keep = l[0] + l[1];
  } else {
    if (QREG)
      kva_setmaxnreg_dec<OREGS>();
    else
      kva_setmaxnreg_inc<176>();
    const int h = wg - 1; /* O columns 256 h .. 256 h + 255 */
    const uint32_t s_sc = s0 + L::SC;
    const int row = 16 * wq + g;
    float o[2][64];
#pragma unroll
    for (int i = 0; i < 64; i++) o[0][i] = o[1][i] = 0.0f;
    for (int n = 0; n < nb; n++) {
      const int s = n % NST;
      const uint32_t par = (uint32_t)((n / NST) & 1);
      const uint32_t st = s0 + s * BLK;
      const int next = n + NST < nb ? ord[n + NST] : -1; /* the refill's block, early */
      kva_mbar_wait(ready(s), par);
      float c[2];
      asm volatile("ld.shared.f32 %0, [%2];\nld.shared.f32 %1, [%2 + 32];\n"
                   : "=f"(c[0]), "=f"(c[1])
                   : "r"(s_sc + (uint32_t)(s * 64 + row) * 4u));
      if (__any_sync(0xffffffffu, c[0] != 1.0f || c[1] != 1.0f)) mla_scale_o(o, c);
      kva_fence_proxy_async_smem();
      mla5_pv_ss<KVA_BF16>(o, st + 8 * KB, st, h);
      kva_wgmma_wait<0>();
      mla_fence_o(o);
      kva_bar_sync(BAR_PVDONE, 256); /* both halves' P V of this stage are over */
      if (next >= 0 && tw == 0) {
        for (int k = h ? 4 : 0; k < (h ? 9 : 4); k++) {
          if (MEM == 2) {
            kva_mbar_arrive_expect_tx(full(s, k), KB);
            kva_tma_load_3d(st + k * KB, &a.kv_map, 64 * k, 0, next * 64, full(s, k));
          } else if (MEM) {
            kva_mbar_arrive_expect_tx(full(s, k), KB);
            kva_bulk_load(st + k * KB, lat + (size_t)next * BLK + k * KB, KB, full(s, k));
          } else {
            kva_mbar_arrive(full(s, k));
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 64; i++) keep += o[0][i] + o[1][i];
  }
  const unsigned long long t1 = clock64();
  if (tw == 0) cycles[(blockIdx.y * gridDim.x + blockIdx.x) * 3 + wg] = t1 - t_start;
  if (keep == 12345.0f) sink[tid] = keep; /* keeps the work live */
}

template <int NST, int MEM, int QREG>
static void run(int workers, int tiles, int nb, const unsigned char *lat, const int *order, int clock_khz) {
  typedef probe_smem<NST, QREG> L;
  const size_t smem = 1024 + L::TOTAL;
  kva_mla_args a;
  memset(&a, 0, sizeof a);
  a.qk_mul = 1.4426950408889634f / sqrtf(576.0f);
  if (MEM == 2 && !kva_mla5_kv_maps(&a, lat, (uint64_t)128 * 8192, 0, 128)) {
    printf("v6 probe: no tensor map\n");
    return;
  }
  const int ctas = tiles * workers;
  unsigned long long *dc;
  float *sink;
  CHECK(cudaMalloc(&dc, sizeof(unsigned long long) * 3 * ctas));
  CHECK(cudaMalloc(&sink, THREADS * sizeof(float)));
  CHECK(cudaFuncSetAttribute(chain<NST, MEM, QREG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(workers, tiles);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 1;
  at[0].val.clusterDim.y = 2;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  /* PROBE_REPS timed launches after one warm-up (default 5); the median,
   * as `kvattn bench` reports (its ~90 launches of a 0.5 ms kernel run at
   * the clocks of sustained load) */
  const char *env = getenv("PROBE_REPS");
  const int reps = env && atoi(env) > 0 ? atoi(env) : 5;
  float *ts = (float *)malloc(sizeof(float) * reps);
  for (int rep = -1; rep < reps; rep++) {
    probe_timer tm;
    probe_timer_start(&tm);
    CHECK(cudaLaunchKernelEx(&cfg, chain<NST, MEM, QREG>, a, lat, order, nb, dc, sink));
    CHECK(cudaGetLastError());
    const float ms = probe_timer_stop_ms(&tm);
    if (rep >= 0) ts[rep] = ms;
  }
  for (int i = 1; i < reps; i++) /* insertion sort */
    for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) {
      const float t = ts[j];
      ts[j] = ts[j - 1];
      ts[j - 1] = t;
    }
  const float best = ts[reps / 2];
  free(ts);
  unsigned long long *hc = (unsigned long long *)malloc(sizeof(unsigned long long) * 3 * ctas);
  CHECK(cudaMemcpy(hc, dc, sizeof(unsigned long long) * 3 * ctas, cudaMemcpyDeviceToHost));
  double maxc = 0;
  for (int i = 0; i < 3 * ctas; i++) maxc = hc[i] > maxc ? (double)hc[i] : maxc;
  const double flop = 2.0 * 64 * 64 * (576 + 512) * (double)nb * ctas;
  printf("v6 probe (median of %d): %d row tiles, %d stages, Q %s, %s: %d CTAs x %d blocks, %.3f ms, %.1f TFLOP/s, %.0f cycles per "
         "block (slowest CTA; %.2f GHz SM clock at launch), %.0f%% of 4096 flop/cycle\n",
         reps, tiles, NST, QREG ? "latent columns in registers" : "in smem", MEM == 2 ? "latents from DRAM by TMA boxes (pairs share blocks)" : MEM ? "latents from DRAM by 1-D bulk copies (pairs share blocks)" : "no loads (smem data fixed)", ctas,
         nb, best, flop / (best * 1e-3) / 1e12, maxc / nb, clock_khz / 1e6,
         100.0 * (flop / ctas) / maxc / 4096);
  free(hc);
  CHECK(cudaFree(dc));
  CHECK(cudaFree(sink));
}

int main(int argc, char **argv) {
  int dev = 0, sms = 0, clk = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
  /* FlashMLA's b = 128 at sk = 8192 (argv[2] = 4096: half the blocks):
   * 128 query rows are 2 row tiles (argv[1] = 4: 256 rows), the 16384
   * blocks over sms / tiles workers, each block read by all of a worker's
   * row tiles (pairs of them launched as clusters of 2) */
  const int tiles = argc > 1 ? atoi(argv[1]) : 2, sk = argc > 2 ? atoi(argv[2]) : 8192;
  const int workers = sms / tiles, total = 128 * 8192 / 64;
  const int nb = 128 * (sk / 64) / workers;
  unsigned char *lat;
  int *order;
  CHECK(cudaMalloc(&lat, (size_t)total * BLK));
  fill_latents<<<1024, 256>>>((uint32_t *)lat, (size_t)total * BLK / 4);
  CHECK(cudaGetLastError());
  int *h = (int *)malloc(sizeof(int) * total);
  for (int i = 0; i < total; i++) h[i] = i;
  srand(7);
  for (int i = total - 1; i > 0; i--) { /* a random block order, as pages of a pool */
    const int j = rand() % (i + 1), t = h[i];
    h[i] = h[j];
    h[j] = t;
  }
  CHECK(cudaMalloc(&order, sizeof(int) * total));
  CHECK(cudaMemcpy(order, h, sizeof(int) * total, cudaMemcpyHostToDevice));
  free(h);
  CHECK(cudaDeviceSynchronize());
  /* 3 stages need Q's latent columns in registers: warpgroup 0 then needs
   * 192 registers with 160 for each O half, 8 more than 384 threads hold
   * (ptxas at 184: spills and serialized wgmmas), so only 2 stages run */
  run<2, 0, 0>(workers, tiles, nb, lat, order, clk);
  run<2, 1, 0>(workers, tiles, nb, lat, order, clk);
  run<2, 2, 0>(workers, tiles, nb, lat, order, clk);
  CHECK(cudaFree(lat));
  CHECK(cudaFree(order));
  return 0;
}
