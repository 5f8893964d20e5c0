/* MLA decode on the CUDA backend: the plan's decode requests on a wgmma
 * kernel, which also merges the chunks of split requests; f32 Q/O, Q of
 * another 16-bit type than the pool, or unaligned Q/O run on the CUDA-core
 * kernel (simple_attention.cu). Five wgmma kernels: v2 (mla_kernel.cuh;
 * 32-key tiles, S split between the warpgroups; fp8 latents too), v5
 * (mla_kernel_v5.cuh; 64-key blocks in pairs, FlashMLA's seesaw in its
 * order; 16-bit latents; TMA loads on pools of whole 64-key pages), v6
 * (mla_kernel_v6.cuh; v5's blocks and loads, one warpgroup making S and
 * P for two that own O), v9 (mla_kernel_v9.cuh; v6's roles on three
 * stages, Q's latent columns in warpgroup 0's registers; fp8 latents
 * through byte stages) and v10 (mla_kernel_v10.cuh; fp8 latents with the
 * keys as the wgmma M, row tiles of 16 or 32 rows). v10 runs fp8 batches
 * of <= 32 rows; where the DRAM is fast, v6 the other fp8 batches (their
 * latents converted into its stages by a fourth warpgroup) and 16-bit
 * batches of <= 64 rows (q heads x new tokens), v9 16-bit batches of more;
 * elsewhere v2 up to 64 rows of 16-bit latents and v9 the rest (mla_pick_kernel);
 * KVA_MLA_KERNEL=v2|v5|v6|v9|v10 forces one and KVA_MLA_TMA=0 keeps
 * v5/v6/v9 on cp.async (A/B). v5, v6 and v9 are launched in clusters of
 * two row tiles (placement only: a worker's
 * tile pair on one GPC; KVA_MLA_COLOC=1 turns it off). A captured launch's
 * shape comes from plan capacities only (max_q_tokens, num_workers), never
 * from the batch, so the same launch replays under CUDA graphs (the kernel
 * choice is the captured batch's); an eager launch's grid.y is the batch's
 * row tiles (mla_grid_tiles). */
#include <string.h>

#include <stdlib.h>

#include "cuda/mla_kernel.cuh"
#include "cuda/mla_kernel_v5.cuh"
#include "cuda/mla_kernel_v6.cuh"
#include "cuda/mla_kernel_v9.cuh"
#include "cuda/mla_kernel_v10.cuh"

/* Whether every SM can hold a CTA of fn (one per SM) in clusters of 2 at
 * once: else a pair would wait for a second wave. H100 at 232 KB: 66
 * clusters of 2 for 132 SMs (but 30 of 4). Cached per device in cache
 * (0 unknown, 1 no, 2 yes); after the smem opt-in. Not asked while s is
 * being captured (no pairs then, until an eager launch has asked). */
static int mla_pairs_fit(void (*fn)(kva_mla_args), int smem, int threads, cudaStream_t s,
                         int cache[KVA_CUDA_OPTIN_DEVICES]) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  const int cached = dev >= 0 && dev < KVA_CUDA_OPTIN_DEVICES;
  if (cached && __atomic_load_n(&cache[dev], __ATOMIC_ACQUIRE)) return cache[dev] == 2;
  if (kva_cuda_maybe_capturing(s)) return 0;
  cudaLaunchConfig_t lc = {};
  lc.gridDim = dim3(1, 2);
  lc.blockDim = dim3((unsigned)threads);
  lc.dynamicSmemBytes = (size_t)smem;
  cudaLaunchAttribute at = {};
  at.id = cudaLaunchAttributeClusterDimension;
  at.val.clusterDim.x = 1;
  at.val.clusterDim.y = 2;
  at.val.clusterDim.z = 1;
  lc.attrs = &at;
  lc.numAttrs = 1;
  int sms = 0, n = 0;
  const int ok = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
                 cudaOccupancyMaxActiveClusters(&n, fn, &lc) == cudaSuccess && 2 * n >= sms;
  if (!ok) (void)cudaGetLastError(); /* a refused query is not the next launch's error */
  if (cached) __atomic_store_n(&cache[dev], ok ? 2 : 1, __ATOMIC_RELEASE);
  return ok;
}

/* v10 (fp8 latents only): NQ rows a CTA, one CTA per SM, no pairs */
template <int QT>
static kva_status mla_launch_v10(const kva_mla_args *a, int nq, unsigned gx, unsigned gy,
                                 cudaStream_t s) {
  static int optin[3][KVA_CUDA_OPTIN_DEVICES];
  void (*const fns[3])(kva_mla_args) = {kva_mla_kernel_v10<QT, 16, KVA_MLA10_SWG16>,
                                         kva_mla_kernel_v10<QT, 32, KVA_MLA10_SWG32>,
                                         kva_mla_kernel_v10<QT, 64, 1>};
  static const int smems[3] = {KVA_MLA10_SMEM(16), KVA_MLA10_SMEM(32), KVA_MLA10_SMEM(64)};
  const int k = nq == 16 ? 0 : nq == 32 ? 1 : 2;
  void (*fn)(kva_mla_args) = fns[k];
  const int smem = smems[k];
  const int threads = KVA_MLA10_THREADS(KVA_MLA10_SWG(nq));
  KVA_CUDA_TRY(kva_cuda_smem_optin((const void *)fn, smem, optin[k]));
  KVA_CUDA_TRY(kva_launch_pdl_cluster(fn, dim3(gx, gy), dim3(threads), (size_t)smem, s,
                                      *a, 1u));
  KVA_CUDA_LAUNCH_CHECK("kva_mla_kernel_v10");
  return KVA_OK;
}

/* An integer A/B switch from the environment, read once (launches are
 * replayed under CUDA graphs): dflt when unset or empty; a leading 'v' is
 * skipped (KVA_MLA_KERNEL=v5). */
typedef struct mla_env_switch {
  int read, value;
} mla_env_switch;
static int mla_env_int(mla_env_switch *sw, const char *name, int dflt) {
  if (!sw->read) {
    const char *env = getenv(name);
    sw->value = env == NULL || env[0] == '\0' ? dflt : atoi(env + (env[0] == 'v'));
    sw->read = 1;
  }
  return sw->value;
}

/* KVA_MLA9_F8IP=1: v9 runs fp8 latents on three 16-bit stages, their
 * bytes copied into the stages and converted there by its O warpgroups
 * (kva_mla_kernel_v9's KV8 2; mla9_f8ip.cuh), instead of two stages and
 * byte stages (A/B). */
static int mla_v9_f8ip(void) {
  static mla_env_switch sw;
  return mla_env_int(&sw, "KVA_MLA9_F8IP", 0) == 1;
}

/* ver: 2, 5, 6, 9 or 10 (5: 16-bit latents only; fp8 runs v2, v6, v9 or
 * v10; v10 fp8 only, nq its rows a CTA) */
template <int QT, int KV8>
static kva_status mla_launch(const kva_mla_args *a, int ver, int nq, int coloc, unsigned gx,
                             unsigned gy, cudaStream_t s) {
  if (KV8 && ver == 10) return mla_launch_v10<QT>(a, nq, gx, gy, s);
  /* per kernel */
  static int optin_v2[KVA_CUDA_OPTIN_DEVICES], optin_v56[4][3][KVA_CUDA_OPTIN_DEVICES];
  int smem = KVA_MLA_SMEM(KV8), threads = KVA_MLA_THREADS;
  void (*fn)(kva_mla_args) = kva_mla_kernel<QT, KV8>;
  int *optin = optin_v2;
  /* v5's, v6's and v9's instantiations: cp.async only, nine TMA boxes a
   * block, four V column blocks a box (kv_tma 0, 1, 4); fp8 latents come
   * by bulk copies only (v6, v9) */
  void (*const v56_fn[4][3])(kva_mla_args) = {
      {kva_mla_kernel_v5<QT, 0>, kva_mla_kernel_v5<QT, 1>, kva_mla_kernel_v5<QT, 4>},
      {KV8 ? kva_mla_kernel_v6<QT, 0, 1> : kva_mla_kernel_v6<QT, 0>,
       KV8 ? kva_mla_kernel_v6<QT, 0, 1> : kva_mla_kernel_v6<QT, 1>,
       KV8 ? kva_mla_kernel_v6<QT, 0, 1> : kva_mla_kernel_v6<QT, 4>},
      {KV8 ? kva_mla_kernel_v9<QT, 0, 1> : kva_mla_kernel_v9<QT, 0>,
       KV8 ? kva_mla_kernel_v9<QT, 0, 1> : kva_mla_kernel_v9<QT, 1>,
       KV8 ? kva_mla_kernel_v9<QT, 0, 1> : kva_mla_kernel_v9<QT, 4>},
      {kva_mla_kernel_v9<QT, 0, 2>, kva_mla_kernel_v9<QT, 0, 2>, kva_mla_kernel_v9<QT, 0, 2>}};
  const int var = a->kv_tma == 4 ? 2 : a->kv_tma != 0;
  /* row of v56_fn (3: v9's fp8 converted in place) */
  const int v6 = ver == 6 ? 1 : ver == 9 ? (KV8 && mla_v9_f8ip() ? 3 : 2) : 0;
  if (KV8 && ver != 6 && ver != 9) ver = 2;
  if (ver == 5 || ver == 6 || ver == 9) {
    /* a variant with the TMA path (pools of whole 64-key pages), one
     * without: the cp.async-only kernel keeps its own schedule */
    smem = v6 >= 2 ? KVA_MLA9_SMEM : v6 ? KVA_MLA6_SMEM : KVA_MLA5_SMEM;
    threads = v6 == 1 ? KVA_MLA6_THREADS_OF(KV8) : v6 ? KVA_MLA6_THREADS : KVA_MLA_THREADS;
    fn = v56_fn[v6][var];
    optin = optin_v56[v6][var];
  }
  KVA_CUDA_TRY(kva_cuda_smem_optin((const void *)fn, smem, optin));
  /* a programmatic dependent of the kernel before it (the KV store, the
   * previous layer) */
  if (ver == 2) coloc = 1;
  if (coloc == 2) {
    static int fits[4][3][KVA_CUDA_OPTIN_DEVICES];
    coloc = mla_pairs_fit(fn, smem, threads, s, fits[v6][var]) ? 2 : 1;
  }
  KVA_CUDA_TRY(kva_launch_pdl_cluster(fn, dim3(gx, gy), dim3((unsigned)threads), (size_t)smem, s,
                                      *a, (unsigned)coloc));
  KVA_CUDA_LAUNCH_CHECK("kva_mla_kernel");
  return KVA_OK;
}

extern "C" kva_status kva_mla_launch(const kva_mla_args *a, kva_dtype qt, int kv8, int ver,
                                     int nq, int coloc, unsigned gx, unsigned gy,
                                     cudaStream_t stream) {
  if (qt == KVA_F16)
    return kv8 ? mla_launch<KVA_F16, 1>(a, ver, nq, coloc, gx, gy, stream)
               : mla_launch<KVA_F16, 0>(a, ver, nq, coloc, gx, gy, stream);
  return kv8 ? mla_launch<KVA_BF16, 1>(a, ver, nq, coloc, gx, gy, stream)
             : mla_launch<KVA_BF16, 0>(a, ver, nq, coloc, gx, gy, stream);
}

/* KVA_MLA_KERNEL=v2|v5|v6|v9|v10 forces a kernel (A/B); 0 = by the batch's rows. */
static int mla_kernel_forced(void) {
  static mla_env_switch sw;
  const int v = mla_env_int(&sw, "KVA_MLA_KERNEL", 0);
  return v == 2 || v == 5 || v == 6 || v == 9 || v == 10 ? v : 0;
}

/* KVA_MLA10_NQ=32: v10 runs batches of more than 32 rows as tiles of 32
 * (A/B against its tiles of 64). */
static int mla_v10_tile32(void) {
  static mla_env_switch sw;
  return mla_env_int(&sw, "KVA_MLA10_NQ", 64) == 32;
}

/* KVA_MLA_TMA=0: v5 loads latents with cp.async only (A/B). */
static int mla_tma_enabled(void) {
  static mla_env_switch sw;
  return mla_env_int(&sw, "KVA_MLA_TMA", 1) != 0;
}

/* v5's placement: row tiles 2y and 2y+1 of a worker (the same keys) are
 * launched as a cluster of 2, so the pair runs on one GPC (the kernel has
 * no cluster code). H100, 2026-11-25, against the same binary without:
 * median +2% on FlashMLA's 12 compute-bound rows in bursts (11 of 12
 * gained), +4 to +9% under sustained load (docs/performance.md,
 * "Fifteenth session"); ncu had v5 at 99% of the L2's throughput, each
 * latent block going to every row tile of its request.
 * Only when the batch's row tiles are even, so that no working tile is
 * paired with one past the batch's rows: that tile's CTA exits at once,
 * but the cluster still needs two free SMs of a GPC together, and with a
 * CTA on every SM the last working tiles waited for a whole CTA to end
 * (v9 at 64 rows, one request of 8192 keys on each of 132 workers: 12
 * CTAs started at ~340 us, 0.554 ms against 0.428 without the pairs;
 * h64 s_q3 340 -> 623 TFLOP/s; H100, 2026-11-28, "Thirty-ninth
 * session"). KVA_MLA_COLOC=1 turns pairs off (A/B). */
static int mla_coloc(int batch_tiles) {
  static mla_env_switch sw;
  const int c = mla_env_int(&sw, "KVA_MLA_COLOC", 2);
  return c == 2 && batch_tiles % 2 == 0 ? 2 : 1;
}

/* grid.y of an eager launch: the batch's row tiles (batch_tiles >= 1), not the
 * capacity's (cap_tiles), whose extra tiles are CTAs that only exit (924
 * of them beside 132 working ones at FlashMLA's 64-row rows: 8 tiles of
 * capacity at 64 heads). Level on FlashMLA's rows (H100, 2026-11-28), so
 * idle CTAs cost little by themselves once they are not clustered with
 * working ones (mla_coloc). A launch being captured keeps the capacity's
 * (a graph replays other batches); KVA_MLA_GRID=0 keeps it always (A/B). */
static int mla_grid_tiles(int cap_tiles, int batch_tiles, cudaStream_t s) {
  static mla_env_switch sw;
  if (!mla_env_int(&sw, "KVA_MLA_GRID", 1) || batch_tiles >= cap_tiles) return cap_tiles;
  return kva_cuda_maybe_capturing(s) ? cap_tiles : batch_tiles;
}

/* kva_mla_args.merge_wait_ns: 8 us unless KVA_MLA_MERGE_WAIT=N ns (0: no
 * wait). H100, 2026-11-26, same call, 4 samples: the 64-row varlen rows at
 * sk 4096 -0.8 to -1.1% time with 4, 8 or 16 us, every other varlen row
 * level. (Without it, a timeline had one rest count ~0.3 us after its head
 * looked; both wrote partial rows and the head merged from global memory in
 * 14 us, the step's last CTA.) */
static unsigned mla_merge_wait_ns(void) {
  static mla_env_switch sw;
  const int v = mla_env_int(&sw, "KVA_MLA_MERGE_WAIT", 8000);
  return v > 0 ? (unsigned)v : 0u;
}

/* kva_mla_args.l2_hints: all three (7) unless KVA_MLA_L2=N says otherwise
 * (A/B). Values: 1 evict_last on the partial rows' stores and evict_first
 * on the merge's reads, 2 v2's latent loads evict_first, 4 the partial
 * rows discarded from L2 after the merge. H100 (2026-11-22, same call,
 * v2): varlen rows at 16-32 query rows +2-4 points of copy rate, 64-row
 * varlen rows +0-1. H200, v6: 6 took 0.6-1.8% less time than 7 on
 * FlashMLA's ten varlen rows while the latent maps were promoted to 256
 * bytes in L2 (2026-11-28, "Forty-first session"); with the maps at 128
 * (mla_l2_promotion) 7 took 0.4-3.0% less time than 6 on the same ten
 * rows (3 samples, "Forty-second session"). */
static int mla_l2_hints(void) {
  static mla_env_switch sw;
  return mla_env_int(&sw, "KVA_MLA_L2", 7) & 7;
}

/* The latent tensor maps' L2 promotion (kva_mla5_kv_maps): 128 bytes
 * unless KVA_MLA_L2PROMO=0|64|128|256 says otherwise (A/B). 256 (the
 * maps' promotion before 2026-11-28) cut the H200's DRAM stream into smem
 * through the maps to 4.14-4.27 TB/s, against 4.51-4.62 at 128, 64 or 0
 * and for one bulk copy a block (bench/l2_ingress tma). */
static int mla_l2_promotion(void) {
  static mla_env_switch sw;
  const int v = mla_env_int(&sw, "KVA_MLA_L2PROMO", 128);
  return v == 0 || v == 64 || v == 256 ? v : 128;
}

/* kva_mla_args.prefetch_keys (v2): 128 keys at up to 32 query rows, else
 * none; KVA_MLA_PREFETCH=N keys overrides (A/B). H100, 2026-11-26
 * (docs/performance.md, "Twentieth session"): -0.1 to -1.4% time on all
 * twelve rows of FlashMLA's table with 16 or 32 rows; at 64 rows level or
 * slower (256 keys slower still). */
static int mla_prefetch_keys(int64_t rows) {
  static mla_env_switch sw;
  const int forced = mla_env_int(&sw, "KVA_MLA_PREFETCH", -1);
  if (forced >= 0) return forced < (1 << 24) ? forced : (1 << 24); /* key + keys fits int */
  return rows <= 32 ? 128 : 0;
}

/* Row tiles of tile_rows (head x token) rows on grid.y, from the plan's
 * capacity. */
static int mla_row_tiles(int num_qo_heads, int max_q_tokens, int tile_rows) {
  const int max_q = max_q_tokens < KVA_MAX_DECODE_Q ? max_q_tokens : KVA_MAX_DECODE_Q;
  return (num_qo_heads * max_q + tile_rows - 1) / tile_rows;
}
/* ... of 64 rows (v2, v5, v6, v9) */
extern "C" int kva_cuda_mla_row_tiles(int num_qo_heads, int max_q_tokens) {
  return mla_row_tiles(num_qo_heads, max_q_tokens, KVA_MLA_BM);
}

/* The planner's view of a batch for the split_* hooks below: its query
 * rows (q heads x the longest decode request's new tokens, at least one)
 * and the bytes of a split block of 16-bit latents. */
static int64_t mla_sched_rows(int num_qo_heads, int max_q_len) {
  const int max_q = max_q_len < KVA_MAX_DECODE_Q ? max_q_len : KVA_MAX_DECODE_Q;
  return (int64_t)num_qo_heads * (max_q > 0 ? max_q : 1);
}
static int64_t mla_block_bytes(int block) {
  return (int64_t)(block > 0 ? block : 1) * KVA_MLA_D * 2;
}

/* 16-bit latents at up to 64 rows (one row tile): v6 where the DRAM
 * outruns v2's chain, else v2. v2 streams a 64-key block every ~2.8 us
 * per SM on its own (26 GB/s), so 132 of them feed at most ~3.4 TB/s:
 * the H100's 3.35 TB/s but not the H200's 4.8. Measured (FlashMLA's 20
 * memory-bound rows, same call): H100 (2026-11-28) v2 0.93-1.0 of copy
 * against v5/v9 0.86-0.98; H200 (2026-11-28, "Fortieth session") v2
 * 0.73-0.79, v6 0.81-0.96, v9 0.81-0.94 (0.87-0.97 for v6 with its merge
 * before the write and its prices, kva_cuda_mla_split_costs). So v6 from 28 GB/s
 * of peak bandwidth per SM, pools of whole 64-key pages (its TMA boxes);
 * KVA_MLA_SMALL=2|6 forces one (A/B). */
static int mla_fast_dram(const kva_cuda_state *cs) {
  return cs->mem_gbps > 0 && cs->mem_gbps >= 28 * cs->num_sms;
}
static int mla_small_kernel(const kva_cuda_state *cs, int page_size) {
  static mla_env_switch sw;
  const int forced = mla_env_int(&sw, "KVA_MLA_SMALL", 0);
  if (forced == 2 || forced == 6) return forced;
  return mla_fast_dram(cs) && page_size % KVA_MLA5_BN == 0 ? 6 : 2;
}

/* The kernel of a batch of hq x max_q rows: KVA_MLA_KERNEL if set, else by
 * rows, latents and device (before the fallback to v2 where a kernel's
 * smem does not fit). The planner's prices (kva_cuda_mla_split_costs) and
 * the launch both ask here. */
static int mla_pick_kernel(const kva_cuda_state *cs, int hq, int max_q, int kv8, int page_size) {
  const int forced = mla_kernel_forced();
  if (forced) return forced;
  const int64_t rows = mla_sched_rows(hq, max_q);
  /* fp8 latents. Up to 32 rows v10 (keys as M: the tensor work follows
   * the rows; 1.6-1.7x faster than v9 there). From 33 rows, where the
   * DRAM is fast (as mla_small_kernel), v6 with its converter warpgroup
   * (kva_mla_kernel_v6's KV8); else v9's byte stages
   * (kva_mla_kernel_v9's KV8; v6 unmeasured on the H100). H200, against
   * v9: ~20% less time on FlashMLA's fp8 rows of 64 rows (2026-11-29,
   * "Forty-eighth" and "Forty-ninth session") and 19-22% on those of 128
   * and 256 rows (490-529 against 387-419 TFLOP/s, "Fiftieth session");
   * at 33-64 rows on the H100 v9 took 5-12% less time than v10's 64-row
   * tile ("Thirty-ninth session").
   * KVA_MLA_F8=6|9 forces one from 33 rows (A/B); KVA_MLA9_F8IP=1 runs
   * v9's fp8 in place (mla_v9_f8ip; H200, 2026-11-29: 13-17% less time
   * than its byte stages on FlashMLA's fp8 rows of 64-256 rows, v6 still
   * 5-11% less; not yet the H100's default: unmeasured there). */
  if (kv8) {
    static mla_env_switch sw8;
    const int f8 = mla_env_int(&sw8, "KVA_MLA_F8", 0);
    if (rows <= 32) return 10;
    if (f8 == 6 || f8 == 9) return f8;
    return mla_fast_dram(cs) ? 6 : 9;
  }
  /* 16-bit latents: v9 on the compute-bound batches (H100, 2026-11-26, 3 samples ABBA
   * against v6 in one binary: +4.9 to +17% on 10 of FlashMLA's 12
   * compute-bound rows, -3.2 and -5.8% on the two 128-row varlen rows at
   * sk 4096; docs/performance.md, "Twenty-sixth session"; H200, 2026-11-29,
   * one sample: 6-16% less time than v6 on all 12, "Fiftieth session"), and on
   * 65-127 rows (two row tiles: 1.5-1.6x v2 at 96 rows, H100,
   * 2026-11-28, "Thirty-ninth session"); at 64 rows and below see
   * mla_small_kernel (the ~0.65 of copy that v6/v9 once streamed at 64
   * rows on the H100 was their tile clustered with idle capacity tiles) */
  if (rows > KVA_MLA_BM) return 9;
  return mla_small_kernel(cs, page_size);
}

/* Split-schedule slack for MLA (the backend's split_slack): a cut makes
 * one more chunk whose 512-dim f32 partial rows (one row tile's worth, at
 * most 64 rows) are written and read back by the merge; that is about
 * rows x 512 x 4 x 3 bytes against a block of 16-bit latents (measured,
 * H100 h64: partial write ~3 us + merge ~13 us, 5 blocks of streaming).
 * Batches priced for the costed walk (kva_cuda_mla_split_costs) use it only
 * as the capacity a batch may give up to keep every request whole.
 * KVA_MLA_SLACK=N overrides (A/B; read once). */
extern "C" int kva_cuda_mla_split_slack(int num_qo_heads, int max_q_len, int block) {
  static mla_env_switch sw;
  const int forced = mla_env_int(&sw, "KVA_MLA_SLACK", -1);
  if (forced >= 0) return forced;
  int64_t rows = mla_sched_rows(num_qo_heads, max_q_len);
  if (rows > KVA_MLA_BM) rows = KVA_MLA_BM;
  const int64_t merge = rows * KVA_MLA_DV * 4 * 3, blk = mla_block_bytes(block);
  const int64_t slack = (merge + blk - 1) / blk;
  return (int)(slack < 8 ? slack : 8);
}

/* The packed walk's cost of a chunk (the backend's split_overhead), in
 * blocks: a chunk loads Q (rows x 576 x 2 bytes), refills the pipeline
 * after the previous chunk's last block, and writes O or its f32 partial
 * rows. On the H100 (2026-11-25, h64 varlen timelines) workers of two
 * chunks ended their key loops ~10 us (~3 blocks) later than workers of
 * one at the default 2. Measured with KVA_SCHED_OVERHEAD (same call, 3
 * samples): 3-4 gained 0.5-1 point of copy rate over 2 on the varlen rows
 * of 32 and 64 query rows. 2 + rows / 32: 3 up to 32 rows, 4 at 64.
 * v9's batches (two or more row tiles, any latents) pay more a chunk
 * (Q into registers, three stages to fill, the merge of a cut request):
 * swept on the H100 (2026-11-27, 4 samples ABBA), the 128-row varlen rows
 * gained 3.5-4% at 18 64-key blocks over 4 (11 and 14 in between), the
 * 256-row ones 3-6% at 11 (18 noisier); uniform rows level. fp8 latents
 * (v9 too) take 2.8 us a block against 1.65, so a chunk is fewer of them:
 * at 128 rows 6 measured +5% on the two varlen rows at sk 8192 and
 * -0.3..-0.7% on three others (H100, 2026-11-27, 3 samples ABBA); at 256
 * rows 6 was level with 11. v6's fp8 batches of two or more row tiles
 * (H200, 2026-11-29, 2 samples ABBA, "Fiftieth session"): 3 took 2-3%
 * less time than 6 or 11 on the two 256-row varlen rows, the ten others
 * within +-1.2% of the old price (6 at 128 rows, 11 at 256). */
extern "C" int kva_cuda_mla_split_overhead(const kva_cuda_state *cs, int num_qo_heads,
                                           int max_q_len, int block, int kv8, int page_size) {
  const int64_t rows = mla_sched_rows(num_qo_heads, max_q_len);
  if (rows >= 2 * KVA_MLA_BM) {
    const int v6 = kv8 && mla_pick_kernel(cs, num_qo_heads, max_q_len, kv8, page_size) == 6;
    const int keys = (v6 ? 3 : rows >= 4 * KVA_MLA_BM ? 11 : kv8 ? 6 : 18) * KVA_MLA5_BN;
    const int b = block > 0 ? block : 1;
    return (keys + b - 1) / b;
  }
  return 2 + (int)(((rows < KVA_MLA_BM ? rows : KVA_MLA_BM) + 31) / 32);
}

/* The costed walk's prices (split_schedule.c), in 1/16 blocks, from a fit
 * of v2's CTA ends on the H100 (h16 and h64 s_q1 sk4096 varlen timelines,
 * 2026-11-26; scripts/mla_cost_model.py): with pb the partial rows' bytes in
 * blocks of 16-bit latents (rows x 512 x 4 / (block x 1152): 1.78 at 64
 * rows of 64-key blocks), a chunk 2.1 + 0.16 pb, a partial write 0.4 +
 * 0.46 pb, the two-chunk merge (one round of loads into smem) 1.0 + 0.47 pb,
 * and the merge of three or more (every chunk's rows written, counted and
 * read back) 0.9 + 3.37 pb. */
extern "C" int kva_cuda_mla_split_costs(const kva_cuda_state *cs, int num_qo_heads,
                                        int max_q_len, int block, int kv8, int page_size,
                                        kva_split_costs *out) {
  const int64_t rows = mla_sched_rows(num_qo_heads, max_q_len);
  /* v5's batches (two or more row tiles) keep the packed walk: there the
   * costed one measured 0-2.4% slower on the compute-bound varlen rows,
   * priced as v2's or with every merge from global memory (v5 has no merge
   * before the write) */
  if (rows >= 2 * KVA_MLA_BM) return 0;
  /* KVA_MLA6_COSTED=0: v6's batches keep the packed walk (A/B). v6's
   * prices below are its 16-bit batches'; its fp8 ones (~2.6 us a block)
   * keep the fit's: v6's 16-bit prices measured 2-4% slower on FlashMLA's
   * fp8 varlen rows of 64 rows, scaled to the block 0-1.4% (H200,
   * 2026-11-29, "Forty-eighth session") */
  static mla_env_switch sw6;
  const int v6 = !kv8 && mla_pick_kernel(cs, num_qo_heads, max_q_len, kv8, page_size) == 6;
  if (v6 && !mla_env_int(&sw6, "KVA_MLA6_COSTED", 1)) return 0;
  /* the partial rows' bytes in 1/16 blocks */
  const int64_t pb = rows * KVA_MLA_DV * 4 * KVA_SPLIT_COST_UNIT / mla_block_bytes(block);
  out->chunk = (int32_t)(34 + pb * 16 / 100);
  /* v6 on the H200: a chunk measured ~4 blocks (fit of a 64-row varlen
   * timeline, 2026-11-28); priced so, FlashMLA's varlen rows at sk 4096
   * took 0.5-1.4% less time (sk 8192 level) */
  if (v6) out->chunk = 4 * KVA_SPLIT_COST_UNIT;
  out->partial = (int32_t)(6 + pb * 46 / 100);
  out->merge = (int32_t)(16 + pb * 47 / 100);
  out->merge_many = (int32_t)(14 + pb * 337 / 100);
  /* v6 on the H200: a merge of three chunks at 64 rows measured ~27 us
   * (its partial write 4.1-4.7, the count 0.7-0.9, the merge 19-23: rounds
   * of loads back from L2 and DRAM, as many as the rows need), ~14 of its
   * ~1.95 us blocks against the H100 fit's 6.8; such merges ended the step
   * on FlashMLA's varlen rows at sk 8192. Priced so, in proportion to the
   * rows: those 64-row rows took 0.3-1.2% less time, 16 and 32 rows level
   * (2026-11-29, docs/performance.md, "Forty-seventh session") */
  if (v6) out->merge_many = (int32_t)(14 + pb * 740 / 100);
  out->margin = out->merge;
  out->min_head = 1;
  return 1;
}

extern "C" kva_status kva_cuda_mla_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                             const kva_attn_params *params, const void *q,
                                             void *o, float *lse, kva_dtype dtype) {
  const kva_pool_config *pc = &pool->cfg;
  const int kv8 = pc->kv_dtype == KVA_FP8_E4M3;
  const kva_cuda_state *cs = kva_cuda_state_of(plan->ctx);
  const int hq = plan->cfg.num_qo_heads;
  const int tiles = kva_cuda_mla_row_tiles(hq, plan->cfg.max_q_tokens);
  const int fast = (dtype == KVA_F16 || dtype == KVA_BF16) && (kv8 || pc->kv_dtype == dtype) &&
                   !((((uintptr_t)q) | ((uintptr_t)o)) & 15u) &&
                   KVA_MLA_SMEM(kv8) <= cs->max_smem_optin &&
                   tiles <= 65535 && tiles <= hq;
  if (!fast) return kva_cuda_simple_attention(plan, pool, layer, params, q, o, lse, dtype, 0);

  const kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  kva_mla_args a;
  memset(&a, 0, sizeof a);
  a.hdr = cp->d_hdr;
  a.sched = cp->d_split_schedule;
  a.sched_order = cp->d_sched_order;
  a.split_indptr = cp->d_split_indptr;
  a.split_row_offset = cp->d_split_row_offset;
  a.cu_q = cp->d_cu_seqlens_q;
  a.cache_seqlens = cp->d_cache_seqlens;
  a.num_new = cp->d_num_new;
  a.page_table = cp->d_page_table;
  a.q = q;
  a.o = o;
  a.lse = lse;
  a.part_o = (float *)plan->partial_o;
  a.part_lse = (float *)plan->partial_lse;
  a.split_sem = cp->d_split_sem; /* [max_batch * hq]: row tile y < hq */
  a.kv = pool->k[layer];
  a.hq = hq;
  a.page_size = pc->page_size;
  kva_cuda_fastdiv(pc->page_size, &a.ps_mul, &a.ps_shift);
  const float sm = params->sm_scale > 0.0f ? params->sm_scale : 1.0f / sqrtf((float)KVA_MLA_D);
  const float ks = kv8 ? pool->k_scale[layer] : 1.0f;
  a.qk_mul = 1.4426950408889634f * sm * ks;
  a.o_mul = ks; /* V is the same latent */
  a.causal = params->causal != 0;
  const int max_q = plan->hdr.max_q_len < KVA_MAX_DECODE_Q ? plan->hdr.max_q_len : KVA_MAX_DECODE_Q;
  const int64_t batch_rows = mla_sched_rows(hq, max_q);
  a.prefetch_keys = mla_prefetch_keys(batch_rows);
  /* the kernel by the batch's rows (a graph replays the captured one; both
   * are correct for any batch); the grid from plan capacities */
  int ver = mla_pick_kernel(cs, hq, max_q, kv8, pc->page_size);
  /* v10's rows a CTA: 16, 32 or 64 (the batch's rows; a forced v10 on more
   * rows runs tiles of 64) */
  const int nq10 = batch_rows <= 16 ? 16 : batch_rows <= 32 || mla_v10_tile32() ? 32 : 64;
  if ((ver == 5 && (kv8 || KVA_MLA5_SMEM > cs->max_smem_optin)) ||
      (ver == 6 && KVA_MLA6_SMEM > cs->max_smem_optin) ||
      (ver == 9 && KVA_MLA9_SMEM > cs->max_smem_optin) ||
      (ver == 10 && (!kv8 || KVA_MLA10_SMEM(nq10) > cs->max_smem_optin)))
    ver = 2;
  /* the head's wait where the walk plans the rest to end early: the costed
   * walk (kva_cuda_mla_split_costs: fewer than two row tiles) and v9's
   * packed one (the head ends its worker, the rest starts the next), which
   * v6 also runs on batches of two or more row tiles; v5 merges from
   * global memory only */
  a.merge_wait_ns = hq * max_q < 2 * KVA_MLA_BM || ver == 9 || ver == 6 ? mla_merge_wait_ns() : 0u;
  a.l2_hints = mla_l2_hints();
  /* v5's and v6's TMA boxes of 64 keys need pages of whole 64-key runs; a
   * driver without tensor-map encoding keeps cp.async */
  a.kv_tma = ver >= 5 && !kv8 && pc->page_size % KVA_MLA5_BN == 0 && mla_tma_enabled();
  if (a.kv_tma) {
    /* Four V column blocks per box (kv_tma 4): one SM alone takes a 72 KB
     * block as one box of its nine column blocks at ~93 bytes/cycle on the
     * H100, as nine 64 x 64 boxes at ~60 (bench/l2_ingress.cu). Measured
     * (2026-11-26, 6 samples): +0.2 to +5% on FlashMLA's 256-row rows, -2.5
     * to -6% at 128 rows, whose pairs take their refills from DRAM and
     * start S sooner with a barrier per column block. v6 at up to 64 rows
     * (H200, 2026-11-28, 3 samples): 18 of FlashMLA's 20 memory-bound rows
     * 0.03-0.8% less time with four, one +0.5%. KVA_MLA5_BOX: 0 (default)
     * four V column blocks a box from 4 row tiles (256 query rows) up and
     * for v6, nine boxes otherwise; 1 always nine; 4 always four. */
    static mla_env_switch box_sw;
    int nbox = mla_env_int(&box_sw, "KVA_MLA5_BOX", 0);
    if (nbox == 0) nbox = hq * max_q >= 4 * KVA_MLA_BM || ver == 6 ? 4 : 1;
    a.kv_tma = kva_mla5_kv_maps(&a, pool->k[layer],
                                (uint64_t)pc->num_pages * (uint64_t)pc->page_size, nbox == 4,
                                mla_l2_promotion());
  }
  /* grid.y: v10's row tiles are nq10 rows, the others' 64; the batch's
   * own in an eager launch */
  const int tile_rows = ver == 10 ? nq10 : KVA_MLA_BM;
  const int batch_tiles = mla_row_tiles(hq, max_q > 0 ? max_q : 1, tile_rows);
  const int gy = mla_grid_tiles(mla_row_tiles(hq, plan->cfg.max_q_tokens, tile_rows), batch_tiles,
                                cs->stream);
  /* the timeline's records: one a CTA (v10 may have more row tiles than
   * `tiles`) */
#ifdef KVA_MLA_TRACE /* v5's phase sums: a record per warpgroup */
  a.trace = kva_trace_next(2LL * plan->cfg.num_workers * gy);
#else
  a.trace = kva_trace_next((long long)plan->cfg.num_workers * gy);
#endif
  return kva_mla_launch(&a, dtype, kv8, ver, nq10, mla_coloc(batch_tiles),
                        (unsigned)plan->cfg.num_workers, (unsigned)gy, cs->stream);
}
