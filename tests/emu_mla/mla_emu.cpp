/* Runs the real MLA decode kernel (which merges split requests) under the
 * host emulator against a double-precision reference (test-only): random
 * h_q, 1..8 new tokens per request, varlen, page sizes, bf16/f16/fp8
 * latents, forced splits. */
#include "emu_common.h"
#include "cuda/mla_kernel_v9.cuh"
#include "cuda/mla_kernel_v10.cuh"
#include <algorithm>
#include <vector>

static kva_mla_args g_args;
/* v2's L2 prefetch before the PDL wait: every range inside the latent pool,
 * 16-byte aligned and sized; counted per case */
static const unsigned char *g_kv_lo, *g_kv_hi;
static long g_prefetch_bytes, g_prefetch_bad;
void kva_bulk_prefetch_l2(const void *p, unsigned bytes) {
  const unsigned char *c = (const unsigned char *)p;
  if (((uintptr_t)c & 15u) || (bytes & 15u) || bytes == 0 || c < g_kv_lo || c + bytes > g_kv_hi)
    g_prefetch_bad++;
  g_prefetch_bytes += bytes;
}
static unsigned g_y;
/* EMU_MLA_KERNEL=v2|v5|v6|v9|v10: the kernel (default v2); v5 runs
 * 16-bit latents, fp8 cases stay on v2 there (as mla.cu dispatches); v6
 * and v9 run fp8 latents too; v10 runs the fp8 cases only (16-bit ones on
 * v2) */
static int g_ver = 2, g_run_ver = 2;
/* EMU_MLA9_F8IP=1: v9's fp8 cases run its KV8 2 (three stages, the bytes
 * converted in place by the O warpgroups, mla9_f8ip.cuh) instead of 1 */
static int g_f8ip = 0;
/* v10 (fp8 latents only; other cases run v2): rows a row tile, 16, 32 or 64 */
static int g_nq10 = 16;
template <int QT, int KV8>
static void body() {
  emu_blockIdx.y = g_y;
  if (g_run_ver == 5 && !KV8)
    g_args.kv_tma == 4 ? kva_mla_kernel_v5<QT, 4>(g_args)
    : g_args.kv_tma    ? kva_mla_kernel_v5<QT, 1>(g_args)
                       : kva_mla_kernel_v5<QT, 0>(g_args);
  else if (g_run_ver == 6 && !KV8)
    g_args.kv_tma == 4 ? kva_mla_kernel_v6<QT, 4>(g_args)
    : g_args.kv_tma    ? kva_mla_kernel_v6<QT, 1>(g_args)
                       : kva_mla_kernel_v6<QT, 0>(g_args);
  else if (g_run_ver == 9 && !KV8)
    g_args.kv_tma == 4 ? kva_mla_kernel_v9<QT, 4>(g_args)
    : g_args.kv_tma    ? kva_mla_kernel_v9<QT, 1>(g_args)
                       : kva_mla_kernel_v9<QT, 0>(g_args);
  else if (g_run_ver == 9 && g_f8ip)
    kva_mla_kernel_v9<QT, 0, 2>(g_args); /* fp8 latents converted in place */
  else if (g_run_ver == 9)
    kva_mla_kernel_v9<QT, 0, 1>(g_args); /* fp8 latents: cp.async only */
  else if (g_run_ver == 6)
    kva_mla_kernel_v6<QT, 0, 1>(g_args); /* fp8 latents: bulk copies only */
  else if (g_run_ver == 10 && g_nq10 == 16)
    kva_mla_kernel_v10<QT, 16, KVA_MLA10_SWG16>(g_args);
  else if (g_run_ver == 10 && g_nq10 == 32)
    kva_mla_kernel_v10<QT, 32, KVA_MLA10_SWG32>(g_args);
  else if (g_run_ver == 10)
    kva_mla_kernel_v10<QT, 64, 1>(g_args);
  else
    kva_mla_kernel<QT, KV8>(g_args);
}

struct Case {
  int qt, kv8, ps, hq, causal, workers, block, max_q_cap;
  float sm_scale;
  std::vector<int> cached, nnew;
};

static int run_case(const Case &c, int idx) {
  const int D = KVA_MLA_D, DV = KVA_MLA_DV;
  const EmuLayout l = emu_layout(c.cached, c.nnew, c.ps);
  const int B = l.B;
  /* latent pool [slots, 576] */
  const float ks = c.kv8 ? 0.04f : 1.f;
  EmuData e;
  emu_data(e, 1, (size_t)l.num_pages * c.ps * D, c.kv8, c.qt, ks, 1.f, (size_t)l.total_q * c.hq * D,
           (size_t)l.total_q * c.hq * DV, (size_t)l.total_q * c.hq);

  /* every request is decoded: the schedule covers all keys */
  EmuSplit sp;
  const bool packed = rnd() % 4 != 0; /* MLA plans' order, mostly */
  emu_split(sp, l, c.nnew, l.kvlen.data(), c.block, c.workers, c.hq, DV, packed);
  sp.hdr.max_q_len = *std::max_element(c.nnew.begin(), c.nnew.end());

  /* kva_cuda_mla_row_tiles of mla.cu; v10's tiles of 16, 32 or 64 rows (by
   * the batch's rows, as mla.cu; EMU_MLA10_NQ=32: tiles of 32 above 32 rows,
   * as KVA_MLA10_NQ=32) */
  const int rows_cap = c.hq * std::min(c.max_q_cap, KVA_MAX_DECODE_Q);
  const int rows10 = c.hq * sp.hdr.max_q_len;
  const bool tile32 = getenv("EMU_MLA10_NQ") && atoi(getenv("EMU_MLA10_NQ")) == 32;
  g_nq10 = rows10 <= 16 ? 16 : rows10 <= 32 || tile32 ? 32 : 64;
  const int tiles = g_ver == 10 && c.kv8 ? (rows_cap + g_nq10 - 1) / g_nq10
                                         : (rows_cap + KVA_MLA_BM - 1) / KVA_MLA_BM;
  const float sm = c.sm_scale > 0 ? c.sm_scale : 1.f / sqrtf((float)D);
  kva_mla_args &a = g_args;
  memset(&a, 0, sizeof a);
  emu_split_args(a, sp, l, e);
  a.sched_order = sp.order.data();
  a.kv = e.k;
  a.hq = c.hq; a.page_size = c.ps;
  kva_cuda_fastdiv(c.ps, &a.ps_mul, &a.ps_shift);
  a.qk_mul = 1.4426950408889634f * sm * ks;
  a.o_mul = ks;
  a.causal = c.causal;
  a.l2_hints = (int)(rnd() % 8); /* policies are no-ops here; the code paths run; bit 2's
                                    discard writes NaN over merged partial rows */
  /* fp8 latents: v2, v6's in-place conversion or v9's byte stages */
  g_run_ver = g_ver == 5 && c.kv8 ? 2 : g_ver;
  if (g_ver == 10) g_run_ver = c.kv8 ? 10 : 2;
  /* the prefetch (mla.cu sets 128 keys at <= 32 rows): none, short, long */
  static const int pre_keys[4] = {0, 16, 128, 5000};
  a.prefetch_keys = pre_keys[rnd() % 4];
  g_kv_lo = (const unsigned char *)e.k;
  g_kv_hi = g_kv_lo + (size_t)l.num_pages * c.ps * D * (c.kv8 ? 1 : 2);
  g_prefetch_bytes = g_prefetch_bad = 0;
  /* v5's and v6's TMA blocks (as mla.cu: pages of whole 64-key runs),
   * mostly on; nine boxes a block (kv_tma 1) or four V column blocks a box (4) */
  a.kv_tma = g_run_ver >= 5 && !c.kv8 && c.ps % KVA_MLA5_BN == 0 && rnd() % 4 != 0;
  if (a.kv_tma) {
    const int four = rnd() % 2;
    a.kv_tma = kva_mla5_kv_maps(&a, e.k, (uint64_t)l.num_pages * c.ps, four, 128);
  }

  void (*fn)(void) = NULL;
  if (c.qt == KVA_BF16) fn = c.kv8 ? body<KVA_BF16, 1> : body<KVA_BF16, 0>;
  else fn = c.kv8 ? body<KVA_F16, 1> : body<KVA_F16, 0>;
  emu_smem_limit = g_run_ver == 10  ? KVA_MLA10_SMEM(g_nq10)
                   : g_run_ver == 9   ? KVA_MLA9_SMEM
                   : g_run_ver == 6 ? KVA_MLA6_SMEM
                   : g_run_ver == 5 ? KVA_MLA5_SMEM
                                    : KVA_MLA_SMEM(c.kv8);
  /* Twice: the last chunk of a two-chunk request merging before it writes
   * (CTAs run one after another here, so the last one always knows it is
   * last; v2 only), then every chunk counting and the last merging from
   * global; the two must agree bitwise (mla_merge_known_last's promise). */
  std::vector<uint16_t> o1((size_t)l.total_q * c.hq * DV);
  std::vector<float> lse1(e.lse.size());
  /* debugging: EMU_ONE_PASS=0|1 runs one pass and checks it against the reference */
  const int one_pass = getenv("EMU_ONE_PASS") ? atoi(getenv("EMU_ONE_PASS")) : -1;
  const int pass0 = one_pass >= 0 ? one_pass : 0, pass1 = one_pass >= 0 ? one_pass + 1 : 2;
  for (int pass = pass0; pass < pass1; pass++) {
    emu_no_known_last = pass;
    for (int y = 0; y < tiles; y++) {
      g_y = (unsigned)y;
      /* v6, v9: 384 threads (v6 with fp8: 512); v10: 128 a warpgroup */
      emu_run_grid(fn, c.workers,
                   g_run_ver == 10 ? KVA_MLA10_THREADS(KVA_MLA10_SWG(g_nq10))
                   : g_run_ver == 6 ? KVA_MLA6_THREADS_OF(c.kv8)
                   : g_run_ver >= 6 ? KVA_MLA6_THREADS
                                    : KVA_MLA_THREADS);
    }
    if (emu_split_sem_dirty(sp, idx)) return 1;
    if (pass == 0 && one_pass < 0) {
      memcpy(o1.data(), e.o, o1.size() * 2);
      lse1 = e.lse;
      for (size_t i = 0; i < o1.size(); i++) e.o[i] = 0x7fff; /* poisoned again */
      for (float &x : e.lse) x = nanf("");
    }
  }
  emu_no_known_last = 0;
  emu_smem_limit = 0;
  if (g_prefetch_bad || (a.prefetch_keys > 0 && g_run_ver == 2 && g_prefetch_bytes == 0)) {
    printf("case %d: %ld prefetches outside the pool or misaligned, %ld bytes prefetched\n", idx,
           g_prefetch_bad, g_prefetch_bytes);
    return 1;
  }
  if (one_pass < 0 && (memcmp(o1.data(), e.o, o1.size() * 2) != 0 ||
                       memcmp(lse1.data(), e.lse.data(), lse1.size() * 4) != 0)) {
    printf("case %d: O or LSE differ between the merge before the write and the merge from "
           "global\n", idx);
    if (getenv("EMU_DIFF")) { /* debugging: the first elements that differ */
      int shown = 0;
      for (size_t i = 0; i < o1.size() && shown < 8; i++)
        if (o1[i] != e.o[i])
          printf("  o[%zu] (row %zu col %zu): %04x vs %04x\n", i, i / DV, i % DV, o1[i], e.o[i]),
              shown++;
      for (size_t i = 0; i < lse1.size() && shown < 16; i++)
        if (memcmp(&lse1[i], &e.lse[i], 4))
          printf("  lse[%zu]: %g vs %g\n", i, lse1[i], e.lse[i]), shown++;
    }
    return 1;
  }

  /* reference: V is the first DV dims of the latent */
  EmuCheck ck = emu_check(idx);
  std::vector<double> s(l.maxk), ref(DV);
  for (int r = 0; r < B; r++)
    for (int t = 0; t < c.nnew[r]; t++)
      for (int h = 0; h < c.hq; h++) {
        const size_t row = (size_t)(l.cu[r] + t) * c.hq + h;
        const double ref_lse = emu_ref_row(&e.qd[row * D], e.kf.data(), e.kf.data(), D, D, DV,
                                           &l.pt[(size_t)r * l.maxpages], c.ps, l.kvlen[r], c.cached[r] + t,
                                           c.causal, -1, sm, 0.f, s.data(), ref.data());
        emu_check_row(ck, r, t, h, e.o + row * DV, c.qt, ref.data(), DV, e.lse[row], ref_lse);
      }
  printf("case %3d v%d%s %s%s ps%-3d hq%-3d B%d maxk%-4d tiles%d causal%d W%-2d blk%-3d splits%-3d",
         idx, g_run_ver, a.kv_tma == 4 ? "+tma4" : a.kv_tma ? "+tma" : "", c.qt == KVA_BF16 ? "bf16" : "f16 ", c.kv8 ? "+fp8" : "    ", c.ps, c.hq, B, l.maxk, tiles,
         c.causal, c.workers, c.block, sp.nsplits);
  const int failed = emu_check_end(ck);
  fflush(stdout);
  return failed;
}

int main(int argc, char **argv) {
  /* CTAs in a shuffled order unless told: either chunk of a split request
   * may then be the last, so both sides of mla_merge_known_last run */
  setenv("EMU_CTA_ORDER", "shuffle", 0);
  if (getenv("EMU_MLA_KERNEL")) g_ver = atoi(getenv("EMU_MLA_KERNEL") + (getenv("EMU_MLA_KERNEL")[0] == 'v'));
  if (g_ver != 2 && g_ver != 5 && g_ver != 6 && g_ver != 9 && g_ver != 10) {
    fprintf(stderr, "EMU_MLA_KERNEL: v2, v5, v6, v9 or v10\n");
    return 2;
  }
  g_f8ip = getenv("EMU_MLA9_F8IP") && atoi(getenv("EMU_MLA9_F8IP")) == 1;
  printf("kernel v%d%s\n", g_ver, g_f8ip ? " (fp8 converted in place)" : "");
  const int only = argc > 1 ? atoi(argv[1]) : -1;
  const int nrand = argc > 2 ? atoi(argv[2]) : 20;
  if (argc > 3) emu_rng ^= (uint64_t)strtoull(argv[3], NULL, 10) * 0x9E3779B97F4A7C15ull;
  std::vector<Case> cases;
  /* qt, kv8, ps, hq, causal, workers, block, max_q_cap, sm_scale, cached, new */
  cases.push_back({KVA_BF16, 0, 64, 16, 1, 1, 64, 1, 0.f, {100}, {1}});
  cases.push_back({KVA_BF16, 0, 64, 16, 1, 3, 64, 2, 0.f, {300, 5}, {2, 1}});
  cases.push_back({KVA_F16, 0, 16, 32, 1, 4, 32, 2, 0.f, {130, 0, 64}, {2, 2, 1}});
  cases.push_back({KVA_BF16, 1, 64, 64, 1, 2, 64, 1, 0.f, {250}, {1}});
  cases.push_back({KVA_F16, 1, 1, 16, 0, 3, 16, 8, 0.1f, {70, 20}, {8, 3}});
  cases.push_back({KVA_BF16, 0, 64, 128, 1, 2, 64, 2, 0.f, {190}, {2}});
  cases.push_back({KVA_BF16, 0, 5, 24, 1, 5, 16, 8, 0.f, {0, 33, 7}, {5, 8, 1}});
  cases.push_back({KVA_F16, 1, 64, 128, 1, 3, 64, 2, 0.f, {200, 64}, {2, 1}});
  /* sharp logits (base-2 spread ~25-35): later blocks move a row's max by
   * more than the online max's slack, others by less */
  cases.push_back({KVA_BF16, 0, 64, 64, 1, 2, 64, 1, 1.0f, {500}, {1}});
  /* fp8 latents with bf16 Q (v2 runs them in f16): long, s_q 2, sharp */
  cases.push_back({KVA_BF16, 1, 64, 128, 1, 3, 64, 2, 0.f, {300, 77}, {2, 1}});
  cases.push_back({KVA_BF16, 1, 16, 32, 1, 2, 32, 2, 0.6f, {400}, {2}});
  cases.push_back({KVA_F16, 0, 64, 128, 1, 2, 64, 2, 0.7f, {400, 90}, {2, 1}});
  /* a worker of two whole requests of 11 and 7 64-key blocks: v9's second
   * chunk starts from blocks refilled in the first's loop and refills its
   * own from the record of it (TMA blocks when kv_tma) */
  cases.push_back({KVA_BF16, 0, 64, 128, 1, 1, 64, 1, 0.f, {700, 400}, {1, 1}});
  /* one worker's chunk of 11 blocks at 64 rows (v6's and v9's one row tile) */
  cases.push_back({KVA_BF16, 0, 64, 64, 1, 1, 64, 1, 0.f, {700}, {1}});
  /* workers of several chunks at one row tile: the rests of cut requests
   * followed by whole requests (s_q 1 and 2), and a request of three
   * chunks whose merging CTA is whichever counts last (v9: item by item
   * when its stages hold the next chunk's blocks, else with the weights in
   * smem; both passes must agree bitwise, which a running-max item merge
   * missed in the LSE's last bit) */
  cases.push_back({KVA_BF16, 0, 64, 64, 1, 3, 64, 1, 0.f, {1100, 500, 300}, {1, 1, 1}});
  cases.push_back({KVA_F16, 0, 64, 32, 1, 3, 64, 2, 0.f, {1200, 700, 600}, {2, 1, 2}});
  cases.push_back({KVA_BF16, 0, 64, 16, 1, 4, 64, 1, 0.f, {1500, 600}, {1, 1}});
  /* workers of many short chunks (1-3 blocks) at 64 rows, by TMA and by
   * cp.async (16-key pages): chunks of one block between longer ones
   * (a tried form of v6 issued a chunk's Q and first blocks during the
   * chunk before it; docs/performance.md, forty-sixth session) */
  cases.push_back({KVA_BF16, 0, 64, 64, 1, 1, 64, 1, 0.f, {40, 100, 10, 130, 64, 0}, {1, 1, 1, 1, 1, 1}});
  cases.push_back({KVA_F16, 0, 16, 64, 1, 2, 64, 1, 0.f, {40, 100, 10, 600, 64}, {1, 1, 1, 1, 1}});
  /* fp8 latents in chunks of many blocks, so that the key loops' refills
   * run (the random cases' chunks are mostly of 1-3 blocks: v9's fp8 in
   * place converts blocks j + 2 in its key loop, and a planted fault there
   * passed every case before these): one worker of two requests; page 16;
   * cut requests of three workers, sharp */
  cases.push_back({KVA_BF16, 1, 64, 64, 1, 1, 64, 1, 0.f, {700, 300}, {1, 1}});
  cases.push_back({KVA_F16, 1, 16, 32, 1, 1, 64, 2, 0.f, {600}, {2}});
  cases.push_back({KVA_BF16, 1, 64, 128, 1, 3, 64, 1, 0.5f, {1100, 500, 300}, {1, 1, 1}});
  if (getenv("EMU_CASE")) { /* debugging: one more case, fp8 h16 s_q 1: kv_len,workers,sm_scale */
    int kl = 129, w = 1; float sc = 0.f;
    sscanf(getenv("EMU_CASE"), "%d,%d,%f", &kl, &w, &sc);
    cases.push_back({KVA_F16, 1, 64, 16, 0, w, 64, 1, sc, {kl}, {1}});
  }
  for (int i = 0; i < nrand; i++) {
    Case c;
    const int pss[4] = {64, 16, 1, 7}, blks[3] = {16, 64, 128}, hqs[6] = {16, 32, 64, 128, 8, 24};
    c.qt = rnd() % 2 ? KVA_BF16 : KVA_F16;
    c.kv8 = rnd() % 3 == 0;
    c.ps = pss[rnd() % 4];
    c.hq = hqs[rnd() % 6];
    c.causal = rnd() % 4 != 0;
    c.workers = 1 + rnd() % 5;
    c.block = blks[rnd() % 3];
    c.max_q_cap = rnd() % 3 == 0 ? 1 + (int)(rnd() % 8) : 1 + (int)(rnd() % 2);
    c.sm_scale = rnd() % 4 == 0 ? 0.02f + (rnd() % 50) * 0.002f : 0.f;
    if (rnd() % 8 == 0) c.sm_scale = 0.3f + (rnd() % 100) * 0.01f; /* sharp */
    /* keep the emulated work bounded: fewer keys for many rows */
    const int kmax = c.hq * c.max_q_cap > 64 ? 160 : 300;
    const int B = 1 + rnd() % 3;
    for (int r = 0; r < B; r++) {
      c.cached.push_back(rnd() % 5 == 0 ? 0 : (int)(rnd() % kmax));
      c.nnew.push_back(1 + (int)(rnd() % c.max_q_cap));
    }
    cases.push_back(c);
  }
  int fails = 0, ran = 0;
  for (int i = 0; i < (int)cases.size(); i++)
    if (only < 0 || only == i) { fails += run_case(cases[i], i); ran++; }
  printf("%d passed, %d failed\n", ran - fails, fails);
  return fails != 0;
}
