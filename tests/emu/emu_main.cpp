/* Runs the real extend kernel source under the host emulator against a
 * double-precision reference (test-only). */
#include "emu_cuda.h"
#include "cuda/extend_ws.cuh"
extern "C" {
#include "core/dtype.h"
}
#include <math.h>
#include <vector>
#include <algorithm>

void emu_run_grid(void (*body)(void), int grid, int nthreads);
extern size_t emu_smem_limit;
extern long emu_bank_conflicts, emu_ldsm_count;

static kva_ext_args g_args;
template <int D, int QT, int KV8>
static void body() { kva_ext_kernel<D, QT, KV8>(g_args); }
template <int QT>
static void body_wg() { kva_ext_wg_kernel<QT>(g_args); }
template <int D, int QT>
static void body_ws() { kva_ext_ws_kernel<D, QT>(g_args); }

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static float frand() { return (rnd() >> 8) * (1.0f / 16777216.0f) * 2.f - 1.f; }

struct Case {
  int D, qt, kv8, ps, hq, hkv, causal, window, grid;
  float softcap, sm_scale;
  std::vector<int> cached, nnew;
  int zero_first = 0; /* kernel sees kv_len 0 for request 0: no key tile at all */
  int wg = 0; /* same-type KV: 1 runs the wgmma kernel (d128), 2 the warp-specialized one (any d) */
};

static int run_case(const Case &c, int idx) {
  const int D = c.D, B = (int)c.nnew.size();
  const int use_wg = c.wg == 2 && !c.kv8 ? 2 : c.wg == 1 && D == 128 && !c.kv8 ? 1 : 0;
  const int bm = use_wg == 2 ? KVA_WS_BM : KVA_EXT_BM(D); /* the plan's tile rows */
  std::vector<int> kvlen(B), cu(B + 1, 0);
  int maxpages = 1;
  for (int r = 0; r < B; r++) {
    kvlen[r] = c.cached[r] + c.nnew[r];
    cu[r + 1] = cu[r] + c.nnew[r];
    maxpages = std::max(maxpages, (kvlen[r] + c.ps - 1) / c.ps);
  }
  const int total_q = cu[B];
  int total_pages = 0;
  for (int r = 0; r < B; r++) total_pages += (kvlen[r] + c.ps - 1) / c.ps;
  const int num_pages = total_pages + 3;
  std::vector<int> perm(num_pages);
  for (int i = 0; i < num_pages; i++) perm[i] = i;
  for (int i = num_pages - 1; i > 0; i--) std::swap(perm[i], perm[rnd() % (i + 1)]);
  std::vector<int32_t> pt((size_t)B * maxpages, 0);
  int next = 0;
  for (int r = 0; r < B; r++)
    for (int j = 0; j < (kvlen[r] + c.ps - 1) / c.ps; j++) pt[(size_t)r * maxpages + j] = perm[next++];

  /* pool */
  const size_t tok_elems = (size_t)c.hkv * D, pool_elems = (size_t)num_pages * c.ps * tok_elems;
  const int kvb = c.kv8 ? 1 : 2;
  std::vector<unsigned char> kbuf(pool_elems * kvb + 64), vbuf(pool_elems * kvb + 64);
  unsigned char *kp = kbuf.data() + ((16 - ((uintptr_t)kbuf.data() & 15)) & 15);
  unsigned char *vp = vbuf.data() + ((16 - ((uintptr_t)vbuf.data() & 15)) & 15);
  const float ks = c.kv8 ? 0.05f : 1.f, vs = c.kv8 ? 0.03f : 1.f;
  std::vector<double> kf(pool_elems), vf(pool_elems);
  for (size_t i = 0; i < pool_elems; i++) {
    float a = frand() * 2.f, b = frand() * 2.f;
    if (c.kv8) {
      uint8_t x = kva_f32_to_fp8e4m3(a / ks), y = kva_f32_to_fp8e4m3(b / vs);
      kp[i] = x; vp[i] = y;
      kf[i] = (double)kva_fp8e4m3_to_f32(x) * ks;
      vf[i] = (double)kva_fp8e4m3_to_f32(y) * vs;
    } else {
      uint16_t x = c.qt == KVA_BF16 ? kva_f32_to_bf16(a) : kva_f32_to_f16(a);
      uint16_t y = c.qt == KVA_BF16 ? kva_f32_to_bf16(b) : kva_f32_to_f16(b);
      memcpy(kp + 2 * i, &x, 2); memcpy(vp + 2 * i, &y, 2);
      kf[i] = kva_load_f32(&x, 0, (kva_dtype)c.qt);
      vf[i] = kva_load_f32(&y, 0, (kva_dtype)c.qt);
    }
  }
  /* q, o */
  const size_t qn = (size_t)total_q * c.hq * D;
  std::vector<uint16_t> qbuf(qn + 8), obuf(qn + 8);
  uint16_t *q = qbuf.data() + ((16 - ((uintptr_t)qbuf.data() & 15)) & 15) / 2;
  uint16_t *o = obuf.data() + ((16 - ((uintptr_t)obuf.data() & 15)) & 15) / 2;
  std::vector<double> qd(qn);
  for (size_t i = 0; i < qn; i++) {
    float a = frand() * 1.5f;
    q[i] = c.qt == KVA_BF16 ? kva_f32_to_bf16(a) : kva_f32_to_f16(a);
    qd[i] = kva_load_f32(&q[i], 0, (kva_dtype)c.qt);
    o[i] = 0x7fff; /* NaN poison */
  }
  std::vector<float> lse((size_t)total_q * c.hq, nanf(""));

  /* plan (host arrays) and tiles */
  kva_plan plan;
  memset(&plan, 0, sizeof plan);
  std::vector<int32_t> ext, nn(c.nnew.begin(), c.nnew.end()), cs(kvlen.begin(), kvlen.end());
  for (int r = 0; r < B; r++)
    if (c.nnew[r] > KVA_MAX_DECODE_Q) ext.push_back(r);
  plan.num_extend = (int)ext.size();
  plan.extend_reqs = ext.data();
  plan.num_new = nn.data();
  plan.cache_seqlens = cs.data();
  if (c.zero_first) cs[0] = 0;
  const int cap = total_q / bm + B + 1;
  std::vector<kva_ext_rec> recs(cap);
  std::vector<int32_t> dbuf(4 + 2 * cap, -7);
  int nt = kva_ext_build_tiles(&plan, bm, cap, recs.data(), dbuf.data() + 4);
  if (nt < 0) { printf("case %d: tiles over capacity\n", idx); return 1; }
  dbuf[0] = nt;
  if (c.zero_first) { /* put request 0's (keyless) tiles first: keyless -> normal transitions */
    std::vector<int32_t> a0, a1;
    for (int i = 0; i < nt; i++) {
      std::vector<int32_t> &dst = dbuf[4 + 2 * i] == 0 ? a0 : a1;
      dst.push_back(dbuf[4 + 2 * i]); dst.push_back(dbuf[5 + 2 * i]);
    }
    a0.insert(a0.end(), a1.begin(), a1.end());
    std::copy(a0.begin(), a0.end(), dbuf.begin() + 4);
  }
  kva_plan_header hdr;
  memset(&hdr, 0, sizeof hdr);
  hdr.page_table_stride = maxpages;

  const float sm = c.sm_scale > 0 ? c.sm_scale : 1.f / sqrtf((float)D);
  const float log2e = 1.4426950408889634f;
  kva_ext_args &a = g_args;
  memset(&a, 0, sizeof a);
  a.q = q; a.o = o; a.lse = lse.data(); a.k = kp; a.v = vp;
  a.tiles = (const int2 *)(dbuf.data() + 4);
  a.num_tiles = dbuf.data();
  dbuf[1] = 0; /* the ws kernel's item counter, zeroed before each launch */
  a.item_counter = dbuf.data() + 1;
  a.hdr = &hdr;
  a.cu_q = cu.data(); a.num_new = nn.data(); a.cache_seqlens = cs.data(); a.page_table = pt.data();
  a.hq = c.hq; a.hkv = c.hkv; a.group = c.hq / c.hkv; a.page_size = c.ps;
  { int l = 0; while ((1u << l) < (uint32_t)c.ps) l++;
    a.ps_mul = (uint32_t)(((uint64_t)1 << 32) * (((uint64_t)1 << l) - (uint64_t)c.ps) / (uint64_t)c.ps + 1);
    a.ps_shift = l; }
  if (c.softcap > 0) { a.qk_mul = 2.f * log2e * sm * ks / c.softcap; a.cap_log2 = c.softcap * log2e; }
  else { a.qk_mul = log2e * sm * ks; a.cap_log2 = 0; }
  a.o_mul = vs;
  a.causal = c.causal; a.window_left = c.window;

  emu_smem_limit = use_wg == 2 ? KVA_WS_SMEM(D) : use_wg ? KVA_WG_SMEM : KVA_EXT_SMEM(D, c.kv8);
  void (*fn)(void) = NULL;
#define PICK(d)                                                                         \
  if (D == d) fn = c.qt == KVA_F16 ? (c.kv8 ? body<d, KVA_F16, 1> : body<d, KVA_F16, 0>) \
                                   : (c.kv8 ? body<d, KVA_BF16, 1> : body<d, KVA_BF16, 0>);
  PICK(64) PICK(128) PICK(256)
  if (use_wg == 1) fn = c.qt == KVA_F16 ? body_wg<KVA_F16> : body_wg<KVA_BF16>;
#define PICK_WS(d) \
  if (use_wg == 2 && D == d) fn = c.qt == KVA_F16 ? body_ws<d, KVA_F16> : body_ws<d, KVA_BF16>;
  PICK_WS(64) PICK_WS(128) PICK_WS(256)
  emu_run_grid(fn, c.grid,
               use_wg == 2 ? KVA_WS_THREADS : use_wg ? KVA_WG_THREADS : KVA_EXT_THREADS);

  /* reference */
  double max_err = 0, max_lse_err = 0, se = 0, sr = 0;
  int bad = 0;
  const int g = c.hq / c.hkv;
  std::vector<double> s;
  for (int r = 0; r < B; r++)
    for (int t = 0; t < c.nnew[r]; t++)
      for (int h = 0; h < c.hq; h++) {
        const size_t row = ((size_t)(cu[r] + t) * c.hq + h);
        const uint16_t *orow = o + row * D;
        if (c.nnew[r] <= KVA_MAX_DECODE_Q) { /* decode rows must be untouched */
          for (int d = 0; d < D; d++)
            if (orow[d] != 0x7fff) { if (bad++ < 5) printf("case %d: decode row r%d t%d written\n", idx, r, t); break; }
          if (!isnan(lse[row])) bad++;
          continue;
        }
        if (c.zero_first && r == 0) { /* no keys: O = 0, LSE = -inf */
          for (int d = 0; d < D; d++)
            if (kva_load_f32(&orow[d], 0, (kva_dtype)c.qt) != 0.f) { bad++; break; }
          if (!(isinf(lse[row]) && lse[row] < 0)) bad++;
          continue;
        }
        const int p = c.cached[r] + t, kvh = h / g;
        double mx = -INFINITY;
        s.assign(kvlen[r], -INFINITY);
        for (int j = 0; j < kvlen[r]; j++) {
          if (c.causal && j > p) continue;
          if (c.window >= 0 && j < p - c.window) continue;
          const size_t slot = (size_t)pt[(size_t)r * maxpages + j / c.ps] * c.ps + j % c.ps;
          double dot = 0;
          for (int d = 0; d < D; d++) dot += qd[row * D + d] * kf[(slot * c.hkv + kvh) * D + d];
          double x = sm * dot;
          if (c.softcap > 0) x = c.softcap * tanh(x / c.softcap);
          s[j] = x;
          mx = std::max(mx, x);
        }
        double sum = 0;
        for (int j = 0; j < kvlen[r]; j++) if (s[j] > -INFINITY) sum += exp(s[j] - mx);
        double ref_lse = mx + log(sum);
        for (int d = 0; d < D; d++) {
          double acc = 0;
          for (int j = 0; j < kvlen[r]; j++)
            if (s[j] > -INFINITY) {
              const size_t slot = (size_t)pt[(size_t)r * maxpages + j / c.ps] * c.ps + j % c.ps;
              acc += exp(s[j] - mx) / sum * vf[(slot * c.hkv + kvh) * D + d];
            }
          double got = kva_load_f32(&orow[d], 0, (kva_dtype)c.qt);
          double err = fabs(got - acc);
          se += (got - acc) * (got - acc);
          sr += acc * acc;
          if (!(err <= 1e-2 + 1e-2 * fabs(acc))) { if (bad++ < 5) printf("case %d: r%d t%d h%d d%d got %g want %g\n", idx, r, t, h, d, got, acc); }
          if (err > max_err || isnan(got)) max_err = isnan(got) ? INFINITY : err;
        }
        double le = fabs(lse[row] - ref_lse);
        if (!(le <= 1e-3 * (1 + fabs(ref_lse)))) { if (bad++ < 5) printf("case %d: lse r%d t%d h%d got %g want %g\n", idx, r, t, h, lse[row], ref_lse); }
        if (le > max_lse_err || isnan(lse[row])) max_lse_err = isnan(lse[row]) ? INFINITY : le;
      }
  printf("case %2d %s d%-3d %s%s ps%-3d hq%d/%d causal%d win%-3d cap%g grid%d tiles%-3d: max|dO| %.2e rel %.1e max|dLSE| %.2e %s\n",
         idx, use_wg == 2 ? "ws" : use_wg ? "wg" : "  ", D, c.qt == KVA_BF16 ? "bf16" : "f16 ", c.kv8 ? "+fp8" : "    ", c.ps, c.hq, c.hkv,
         c.causal, c.window, c.softcap, c.grid, nt, max_err, sr > 0 ? sqrt(se / sr) : 0.0, max_lse_err, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  int only = argc > 1 ? atoi(argv[1]) : -1;
  std::vector<Case> cases;
  /* D, qt, kv8, ps, hq, hkv, causal, window, grid, softcap, sm_scale, cached, new */
  cases.push_back({128, KVA_BF16, 0, 16, 2, 1, 1, -1, 3, 0.f, 0.f, {0}, {200}});
  cases.push_back({128, KVA_F16, 0, 3, 2, 2, 1, -1, 2, 0.f, 0.f, {37, 0, 5}, {70, 4, 150}});
  cases.push_back({64, KVA_BF16, 0, 1, 4, 2, 1, -1, 5, 0.f, 0.f, {100, 3}, {140, 20}});
  cases.push_back({256, KVA_BF16, 0, 7, 2, 1, 1, -1, 3, 0.f, 0.f, {50}, {90}});
  cases.push_back({128, KVA_BF16, 0, 16, 2, 1, 0, -1, 3, 0.f, 0.f, {33, 0}, {140, 9}});
  cases.push_back({128, KVA_BF16, 0, 64, 2, 1, 1, 40, 2, 0.f, 0.f, {100}, {180}});
  cases.push_back({128, KVA_BF16, 0, 16, 2, 1, 0, 70, 2, 0.f, 0.f, {20}, {150}});
  cases.push_back({128, KVA_BF16, 0, 16, 2, 1, 1, -1, 2, 30.f, 0.f, {10}, {100}});
  cases.push_back({128, KVA_F16, 1, 16, 2, 1, 1, -1, 2, 0.f, 0.f, {60}, {130}});
  cases.push_back({128, KVA_BF16, 1, 5, 4, 1, 1, 33, 3, 0.f, 0.2f, {7}, {77}});
  cases.push_back({64, KVA_F16, 1, 256, 2, 1, 0, -1, 2, 10.f, 0.f, {300}, {60}});
  cases.push_back({256, KVA_F16, 1, 2, 2, 2, 1, -1, 3, 0.f, 0.f, {31}, {40}});
  cases.push_back({256, KVA_BF16, 0, 16, 2, 1, 0, 20, 2, 5.f, 0.f, {0}, {70}});
  cases.push_back({64, KVA_BF16, 0, 32, 2, 1, 1, 0, 2, 0.f, 0.f, {5}, {130}});
  /* long key ranges (up to 7 key tiles of 128): the rings wrap within an item */
  cases.push_back({128, KVA_BF16, 0, 16, 2, 1, 1, -1, 2, 0.f, 0.f, {700}, {140}});
  cases.push_back({128, KVA_F16, 0, 7, 4, 2, 0, -1, 3, 0.f, 0.f, {300, 500}, {130, 70}});
  { Case z = {128, KVA_BF16, 0, 16, 2, 1, 1, -1, 1, 0.f, 0.f, {0, 40, 0}, {20, 100, 150}}; z.zero_first = 1; cases.push_back(z); }
  { Case z = {128, KVA_F16, 1, 16, 2, 1, 0, -1, 2, 0.f, 0.f, {0, 0}, {300, 100}}; z.zero_first = 1; cases.push_back(z); }
  /* d64 / d256 long key ranges (the rings wrap within an item), GQA 4:1 and MQA */
  cases.push_back({64, KVA_BF16, 0, 16, 4, 1, 1, -1, 2, 0.f, 0.f, {900, 13}, {150, 140}});
  cases.push_back({256, KVA_F16, 0, 64, 4, 2, 1, -1, 2, 0.f, 0.f, {333}, {200}});
  cases.push_back({64, KVA_F16, 0, 1, 2, 1, 0, 100, 3, 0.f, 0.f, {250, 0}, {129, 127}});
  cases.push_back({256, KVA_BF16, 0, 13, 2, 1, 1, 90, 1, 20.f, 0.f, {150, 64}, {130, 64}});
  { Case z = {64, KVA_F16, 0, 5, 2, 1, 1, -1, 1, 0.f, 0.f, {0, 40, 0}, {20, 300, 150}}; z.zero_first = 1; cases.push_back(z); }
  { Case z = {256, KVA_BF16, 0, 16, 2, 1, 0, -1, 2, 0.f, 0.f, {0, 70}, {140, 100}}; z.zero_first = 1; cases.push_back(z); }
  { /* the d128 same-type fixed cases again on the wgmma kernel */
    size_t nfix = cases.size();
    for (size_t i = 0; i < nfix; i++)
      if (cases[i].D == 128 && !cases[i].kv8) { Case w = cases[i]; w.wg = 1; cases.push_back(w); }
    /* ... and every same-type fixed case on the warp-specialized kernel */
    for (size_t i = 0; i < nfix; i++)
      if (!cases[i].kv8) { Case w = cases[i]; w.wg = 2; cases.push_back(w); }
  }
  /* random sweep */
  const int nrand = argc > 2 ? atoi(argv[2]) : 60;
  for (int i = 0; i < nrand; i++) {
    Case c;
    const int ds[3] = {64, 128, 256}, pss[6] = {1, 2, 5, 16, 33, 256};
    c.D = ds[rnd() % 3];
    c.qt = rnd() % 2 ? KVA_BF16 : KVA_F16;
    c.kv8 = rnd() % 3 == 0;
    c.ps = pss[rnd() % 6];
    c.hkv = 1 + rnd() % 2;
    c.hq = c.hkv * (1 + rnd() % 3);
    c.causal = rnd() % 4 != 0;
    c.window = rnd() % 3 == 0 ? (int)(rnd() % 80) : -1;
    c.grid = 1 + rnd() % 4;
    c.softcap = rnd() % 4 == 0 ? 3.f + (rnd() % 40) : 0.f;
    c.sm_scale = rnd() % 4 == 0 ? 0.05f + (rnd() % 100) * 0.002f : 0.f;
    int B = 1 + rnd() % 3;
    for (int r = 0; r < B; r++) {
      c.cached.push_back(rnd() % 3 == 0 ? 0 : (int)(rnd() % 200));
      c.nnew.push_back(rnd() % 5 == 0 ? 1 + (int)(rnd() % 8) : 9 + (int)(rnd() % 170));
    }
    c.wg = argc > 3 ? atoi(argv[3]) : (int)(rnd() % 3);
    const int only_d = argc > 4 ? atoi(argv[4]) : 0;
    if (only_d) { /* only same-type KV cases (the wgmma kernels'): 1 = d128, 64/128/256
                   * = that head dim, 2 = any of the three */
      c.D = only_d == 1 ? 128 : only_d == 2 ? c.D : only_d;
      c.kv8 = 0;
    }
    cases.push_back(c);
  }
  int fails = 0;
  for (int i = 0; i < (int)cases.size(); i++)
    if (only < 0 || only == i) fails += run_case(cases[i], i);
  printf("ldmatrix phases %ld, bank-conflicted phases %ld\n", emu_ldsm_count, emu_bank_conflicts);
  printf("%d passed, %d failed\n", (int)(only < 0 ? cases.size() : 1) - fails, fails);
  return fails != 0;
}
