/* Runs the real MLA decode kernel (which merges split requests) under the
 * host emulator against a double-precision reference (test-only): random
 * h_q, 1..8 new tokens per request, varlen, page sizes, bf16/f16/fp8
 * latents, forced splits. */
#include "emu_cuda.h"
#include "cuda/mla_kernel_v3.cuh"
extern "C" {
#include "core/dtype.h"
}
#include <math.h>
#include <algorithm>
#include <vector>

void emu_run_grid(void (*body)(void), int grid, int nthreads);
extern size_t emu_smem_limit;
extern dim3 emu_blockIdx;

static kva_mla_args g_args;
static unsigned g_y;
/* EMU_MLA_KERNEL=v2|v3: the kernel (default v2); v3
 * runs 16-bit latents, fp8 cases stay on v2 (as mla.cu dispatches) */
static int g_ver = 2, g_run_ver = 2;
template <int QT, int KV8>
static void body() {
  emu_blockIdx.y = g_y;
  if (g_run_ver == 3 && !KV8)
    kva_mla_kernel_v3<QT>(g_args);
  else
    kva_mla_kernel<QT, KV8>(g_args);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static float frand() { return (rnd() >> 8) * (1.0f / 16777216.0f) * 2.f - 1.f; }

struct Case {
  int qt, kv8, ps, hq, causal, workers, block, max_q_cap;
  float sm_scale;
  std::vector<int> cached, nnew;
};

static void *align16(std::vector<unsigned char> &buf) {
  return buf.data() + ((16 - ((uintptr_t)buf.data() & 15)) & 15);
}

static int run_case(const Case &c, int idx) {
  const int D = KVA_MLA_D, DV = KVA_MLA_DV, B = (int)c.nnew.size();
  std::vector<int> kvlen(B), cu(B + 1, 0);
  int maxpages = 1, total_pages = 0;
  for (int r = 0; r < B; r++) {
    kvlen[r] = c.cached[r] + c.nnew[r];
    cu[r + 1] = cu[r] + c.nnew[r];
    maxpages = std::max(maxpages, (kvlen[r] + c.ps - 1) / c.ps);
    total_pages += (kvlen[r] + c.ps - 1) / c.ps;
  }
  const int total_q = cu[B], num_pages = total_pages + 3;
  std::vector<int> perm(num_pages);
  for (int i = 0; i < num_pages; i++) perm[i] = i;
  for (int i = num_pages - 1; i > 0; i--) std::swap(perm[i], perm[rnd() % (i + 1)]);
  std::vector<int32_t> pt((size_t)B * maxpages, 0);
  int next = 0;
  for (int r = 0; r < B; r++)
    for (int j = 0; j < (kvlen[r] + c.ps - 1) / c.ps; j++) pt[(size_t)r * maxpages + j] = perm[next++];

  /* latent pool [slots, 576] */
  const size_t pool_elems = (size_t)num_pages * c.ps * D;
  const int kvb = c.kv8 ? 1 : 2;
  std::vector<unsigned char> kbuf(pool_elems * kvb + 16);
  unsigned char *kp = (unsigned char *)align16(kbuf);
  const float ks = c.kv8 ? 0.04f : 1.f;
  std::vector<double> kf(pool_elems);
  for (size_t i = 0; i < pool_elems; i++) {
    const float x = frand() * 2.f;
    if (c.kv8) {
      const uint8_t b = kva_f32_to_fp8e4m3(x / ks);
      kp[i] = b;
      kf[i] = (double)kva_fp8e4m3_to_f32(b) * ks;
    } else {
      const uint16_t h = c.qt == KVA_BF16 ? kva_f32_to_bf16(x) : kva_f32_to_f16(x);
      memcpy(kp + 2 * i, &h, 2);
      kf[i] = kva_load_f32(&h, 0, (kva_dtype)c.qt);
    }
  }
  /* q, o (NaN poison), lse */
  const size_t qn = (size_t)total_q * c.hq * D, on = (size_t)total_q * c.hq * DV;
  std::vector<unsigned char> qbuf(qn * 2 + 16), obuf(on * 2 + 16);
  uint16_t *q = (uint16_t *)align16(qbuf), *o = (uint16_t *)align16(obuf);
  std::vector<double> qd(qn);
  for (size_t i = 0; i < qn; i++) {
    const float x = frand() * 1.5f;
    q[i] = c.qt == KVA_BF16 ? kva_f32_to_bf16(x) : kva_f32_to_f16(x);
    qd[i] = kva_load_f32(&q[i], 0, (kva_dtype)c.qt);
  }
  for (size_t i = 0; i < on; i++) o[i] = 0x7fff;
  std::vector<float> lse((size_t)total_q * c.hq, nanf(""));

  /* schedule, as the planner builds it */
  std::vector<int32_t> nn(c.nnew.begin(), c.nnew.end()), cs(kvlen.begin(), kvlen.end());
  std::vector<kva_split_work> work(c.workers);
  std::vector<int32_t> indptr(B + 1), rowoff(B + 1);
  const int nsplits = kva_split_schedule(B, cs.data(), nn.data(), c.block, c.workers, work.data(),
                                         indptr.data());
  int prow = 0;
  for (int r = 0; r < B; r++) {
    rowoff[r] = prow;
    const int s = indptr[r + 1] - indptr[r];
    if (s > 1) prow += s * c.nnew[r];
  }
  rowoff[B] = prow;
  const int max_rows = std::max(prow, 1);
  std::vector<float> part_o((size_t)max_rows * c.hq * DV, nanf("")), part_lse((size_t)max_rows * c.hq, nanf(""));

  kva_plan_header hdr;
  memset(&hdr, 0, sizeof hdr);
  hdr.num_requests = B;
  hdr.total_q = total_q;
  hdr.max_q_len = *std::max_element(c.nnew.begin(), c.nnew.end());
  hdr.page_table_stride = maxpages;
  hdr.num_workers = c.workers;
  hdr.num_splits_total = nsplits;

  /* kva_cuda_mla_row_tiles of mla.cu */
  const int tiles = (c.hq * std::min(c.max_q_cap, KVA_MAX_DECODE_Q) + KVA_MLA_BM - 1) / KVA_MLA_BM;
  const float sm = c.sm_scale > 0 ? c.sm_scale : 1.f / sqrtf((float)D);
  kva_mla_args &a = g_args;
  memset(&a, 0, sizeof a);
  a.hdr = &hdr;
  a.sched = work.data();
  a.split_indptr = indptr.data();
  a.split_row_offset = rowoff.data();
  a.cu_q = cu.data();
  a.cache_seqlens = cs.data();
  a.num_new = nn.data();
  a.page_table = pt.data();
  a.q = q; a.o = o; a.lse = lse.data();
  a.part_o = part_o.data(); a.part_lse = part_lse.data();
  std::vector<int32_t> sem((size_t)(B + 2) * c.hq, 0); /* capacity rows, zeroed once */
  a.split_sem = sem.data();
  a.kv = kp;
  a.hq = c.hq; a.page_size = c.ps;
  { int l = 0; while ((1u << l) < (uint32_t)c.ps) l++;
    a.ps_mul = (uint32_t)(((uint64_t)1 << 32) * (((uint64_t)1 << l) - (uint64_t)c.ps) / (uint64_t)c.ps + 1);
    a.ps_shift = l; }
  a.qk_mul = 1.4426950408889634f * sm * ks;
  a.o_mul = ks;
  a.causal = c.causal;

  void (*fn)(void) = NULL;
  if (c.qt == KVA_BF16) fn = c.kv8 ? body<KVA_BF16, 1> : body<KVA_BF16, 0>;
  else fn = c.kv8 ? body<KVA_F16, 1> : body<KVA_F16, 0>;
  g_run_ver = g_ver == 3 && c.kv8 ? 2 : g_ver;
  emu_smem_limit = g_run_ver == 3 ? KVA_MLA3_SMEM : KVA_MLA_SMEM(c.kv8);
  for (int y = 0; y < tiles; y++) {
    g_y = (unsigned)y;
    emu_run_grid(fn, c.workers, KVA_MLA_THREADS);
  }
  emu_smem_limit = 0;
  for (size_t i = 0; i < sem.size(); i++)
    if (sem[i] != 0) { printf("case %d: split_sem[%zu] = %d after the run\n", idx, i, (int)sem[i]); return 1; }

  /* reference */
  double max_err = 0, max_lse_err = 0, se = 0, sr = 0;
  int bad = 0;
  std::vector<double> s;
  for (int r = 0; r < B; r++)
    for (int t = 0; t < c.nnew[r]; t++)
      for (int h = 0; h < c.hq; h++) {
        const size_t row = (size_t)(cu[r] + t) * c.hq + h;
        const uint16_t *orow = o + row * DV;
        const int p = c.cached[r] + t;
        double mx = -INFINITY;
        s.assign(kvlen[r], -INFINITY);
        for (int j = 0; j < kvlen[r]; j++) {
          if (c.causal && j > p) continue;
          const size_t slot = (size_t)pt[(size_t)r * maxpages + j / c.ps] * c.ps + j % c.ps;
          double dot = 0;
          for (int d = 0; d < D; d++) dot += qd[row * D + d] * kf[slot * D + d];
          s[j] = sm * dot;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < kvlen[r]; j++) if (s[j] > -INFINITY) sum += exp(s[j] - mx);
        const bool empty = sum == 0;
        const double ref_lse = empty ? -INFINITY : mx + log(sum);
        for (int d = 0; d < DV; d++) {
          double acc = 0;
          for (int j = 0; !empty && j < kvlen[r]; j++)
            if (s[j] > -INFINITY) {
              const size_t slot = (size_t)pt[(size_t)r * maxpages + j / c.ps] * c.ps + j % c.ps;
              acc += exp(s[j] - mx) / sum * kf[slot * D + d];
            }
          const double got = kva_load_f32(&orow[d], 0, (kva_dtype)c.qt);
          const double err = fabs(got - acc);
          se += (got - acc) * (got - acc);
          sr += acc * acc;
          if (!(err <= 1e-2 + 1e-2 * fabs(acc))) { if (bad++ < 5) printf("case %d: r%d t%d h%d d%d got %g want %g\n", idx, r, t, h, d, got, acc); }
          if (err > max_err || isnan(got)) max_err = isnan(got) ? INFINITY : err;
        }
        const double le = empty ? (lse[row] == -INFINITY ? 0 : INFINITY) : fabs(lse[row] - ref_lse);
        if (!(le <= 1e-3 * (1 + fabs(empty ? 0 : ref_lse)))) { if (bad++ < 5) printf("case %d: lse r%d t%d h%d got %g want %g\n", idx, r, t, h, lse[row], ref_lse); }
        if (le > max_lse_err || isnan(lse[row])) max_lse_err = isnan(lse[row]) ? INFINITY : le;
      }
  int maxk = 0;
  for (int r = 0; r < B; r++) maxk = std::max(maxk, kvlen[r]);
  printf("case %3d v%d %s%s ps%-3d hq%-3d B%d maxk%-4d tiles%d causal%d W%-2d blk%-3d splits%-3d: max|dO| %.2e rel %.1e max|dLSE| %.2e %s\n",
         idx, g_run_ver, c.qt == KVA_BF16 ? "bf16" : "f16 ", c.kv8 ? "+fp8" : "    ", c.ps, c.hq, B, maxk, tiles,
         c.causal, c.workers, c.block, nsplits, max_err, sr > 0 ? sqrt(se / sr) : 0.0, max_lse_err,
         bad ? "FAIL" : "ok");
  fflush(stdout);
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  if (getenv("EMU_MLA_KERNEL")) g_ver = atoi(getenv("EMU_MLA_KERNEL") + (getenv("EMU_MLA_KERNEL")[0] == 'v'));
  if (g_ver < 2 || g_ver > 3) { fprintf(stderr, "EMU_MLA_KERNEL: v2 or v3\n"); return 2; }
  printf("kernel v%d\n", g_ver);
  const int only = argc > 1 ? atoi(argv[1]) : -1;
  const int nrand = argc > 2 ? atoi(argv[2]) : 20;
  if (argc > 3) rng ^= (uint64_t)strtoull(argv[3], NULL, 10) * 0x9E3779B97F4A7C15ull;
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
