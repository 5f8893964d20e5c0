/* Runs the real extend kernel source under the host emulator against a
 * double-precision reference (test-only). */
#include "emu_common.h"
#include "cuda/extend_ws.cuh"
#include <vector>
#include <algorithm>

static kva_ext_args g_args;
static kva_ext_tma g_tma;
template <int D, int QT, int KV8>
static void body() { kva_ext_kernel<D, QT, KV8>(g_args); }
template <int QT>
static void body_wg() { kva_ext_wg_kernel<QT>(g_args); }
template <int D, int QT>
static void body_ws() { kva_ext_ws_kernel<D, QT, 0>(g_args, g_tma); }
template <int D, int QT>
static void body_ws_tma() { kva_ext_ws_kernel<D, QT, 1>(g_args, g_tma); }

struct Case {
  int D, qt, kv8, ps, hq, hkv, causal, window, grid;
  float softcap, sm_scale;
  std::vector<int> cached, nnew;
  int zero_first = 0; /* kernel sees kv_len 0 for request 0: no key tile at all */
  int wg = 0; /* same-type KV: 1 runs the wgmma kernel (d128), 2 the warp-specialized one (any d),
               * 3 the same with TMA loads where the page size allows them */
};

static int run_case(const Case &c, int idx) {
  const int D = c.D;
  const int use_wg = c.wg >= 2 && !c.kv8 ? 2 : c.wg == 1 && D == 128 && !c.kv8 ? 1 : 0;
  /* TMA box rows as the launcher picks them (0: cp.async) */
  const int tma_rows = c.wg != 3 || c.kv8 ? 0 : kva_ext_tma_rows(c.ps, KVA_WS_BN(D));
  const int bm = use_wg == 2 ? KVA_WS_BM : KVA_EXT_BM(D); /* the plan's tile rows */
  const EmuLayout l = emu_layout(c.cached, c.nnew, c.ps);
  const int B = l.B, total_q = l.total_q;
  const float ks = c.kv8 ? 0.05f : 1.f, vs = c.kv8 ? 0.03f : 1.f;
  const size_t qn = (size_t)total_q * c.hq * D;
  EmuData e;
  emu_data(e, 2, (size_t)l.num_pages * c.ps * c.hkv * D, c.kv8, c.qt, ks, vs, qn, qn,
           (size_t)total_q * c.hq);
  { /* NaN in every slot no request's key uses (past kv_len in a last page,
     * unowned pages): masked keys must not reach P V */
    std::vector<char> used((size_t)l.num_pages * c.ps, 0);
    for (int r = 0; r < B; r++)
      for (int k = 0; k < l.kvlen[r]; k++)
        used[(size_t)l.pt[(size_t)r * l.maxpages + k / c.ps] * c.ps + k % c.ps] = 1;
    const size_t eb = c.kv8 ? 1 : 2, row = (size_t)c.hkv * D * eb;
    for (size_t sl = 0; sl < used.size(); sl++)
      if (!used[sl]) {
        memset(e.k + sl * row, 0xff, row);
        memset(e.v + sl * row, 0xff, row);
      }
  }

  /* plan (host arrays) and tiles */
  kva_plan plan;
  memset(&plan, 0, sizeof plan);
  std::vector<int32_t> ext, nn(c.nnew.begin(), c.nnew.end()), cs(l.kvlen.begin(), l.kvlen.end());
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
  hdr.page_table_stride = l.maxpages;

  const float sm = c.sm_scale > 0 ? c.sm_scale : 1.f / sqrtf((float)D);
  kva_ext_args &a = g_args;
  memset(&a, 0, sizeof a);
  a.q = e.q; a.o = e.o; a.lse = e.lse.data(); a.k = e.k; a.v = e.v;
  a.tiles = (const int2 *)(dbuf.data() + 4);
  a.num_tiles = dbuf.data();
  dbuf[1] = 0; /* the ws kernel's item counter, zeroed before each launch */
  a.item_counter = dbuf.data() + 1;
  a.hdr = &hdr;
  a.cu_q = l.cu.data(); a.num_new = nn.data(); a.cache_seqlens = cs.data(); a.page_table = l.pt.data();
  emu_attn_args(a, c.hq, c.hkv, c.ps, sm, ks, vs, c.softcap, c.causal, c.window);

  memset(&g_tma, 0, sizeof g_tma);
  if (tma_rows) {
    g_tma.rows = tma_rows;
    g_tma.warps = 1 << (rnd() % 3); /* 1, 2 or 4 producer warps */
    const uint64_t qd[3] = {(uint64_t)D, (uint64_t)c.hq, (uint64_t)total_q};
    const uint64_t qs[2] = {(uint64_t)D * 2, (uint64_t)c.hq * D * 2};
    const uint32_t qb[3] = {64, 1, KVA_WS_QBOX_ROWS};
    kva_tma_encode_16bit_3d(&g_tma.q, e.q, qd, qs, qb);
    const uint64_t kd[3] = {(uint64_t)D, (uint64_t)c.hkv, (uint64_t)l.num_pages * c.ps};
    const uint64_t kst[2] = {(uint64_t)D * 2, (uint64_t)c.hkv * D * 2};
    const uint32_t kb[3] = {64, 1, (uint32_t)tma_rows};
    kva_tma_encode_16bit_3d(&g_tma.k, e.k, kd, kst, kb);
    kva_tma_encode_16bit_3d(&g_tma.v, e.v, kd, kst, kb);
  }
  emu_smem_limit = use_wg == 2 ? KVA_WS_SMEM(D) : use_wg ? KVA_WG_SMEM : KVA_EXT_SMEM(D, c.kv8);
  void (*fn)(void) = NULL;
#define PICK(d)                                                                         \
  if (D == d) fn = c.qt == KVA_F16 ? (c.kv8 ? body<d, KVA_F16, 1> : body<d, KVA_F16, 0>) \
                                   : (c.kv8 ? body<d, KVA_BF16, 1> : body<d, KVA_BF16, 0>);
  PICK(64) PICK(128) PICK(256)
  if (use_wg == 1) fn = c.qt == KVA_F16 ? body_wg<KVA_F16> : body_wg<KVA_BF16>;
#define PICK_WS(d) \
  if (use_wg == 2 && D == d)                                                             \
    fn = tma_rows ? (c.qt == KVA_F16 ? body_ws_tma<d, KVA_F16> : body_ws_tma<d, KVA_BF16>) \
                  : (c.qt == KVA_F16 ? body_ws<d, KVA_F16> : body_ws<d, KVA_BF16>);
  PICK_WS(64) PICK_WS(128) PICK_WS(256)
  emu_run_grid(fn, c.grid,
               use_wg == 2 ? KVA_WS_THREADS : use_wg ? KVA_WG_THREADS : KVA_EXT_THREADS);

  /* reference */
  EmuCheck ck = emu_check(idx);
  std::vector<double> s(l.maxk), ref(D);
  for (int r = 0; r < B; r++)
    for (int t = 0; t < c.nnew[r]; t++)
      for (int h = 0; h < c.hq; h++) {
        const size_t row = ((size_t)(l.cu[r] + t) * c.hq + h);
        const uint16_t *orow = e.o + row * D;
        if (c.nnew[r] <= KVA_MAX_DECODE_Q) { /* decode rows must be untouched */
          emu_check_untouched(ck, "decode", r, t, orow, D, e.lse[row]);
          continue;
        }
        if (c.zero_first && r == 0) { /* no keys: O = 0, LSE = -inf */
          for (int d = 0; d < D; d++)
            if (kva_load_f32(&orow[d], 0, (kva_dtype)c.qt) != 0.f) { ck.bad++; break; }
          if (!(isinf(e.lse[row]) && e.lse[row] < 0)) ck.bad++;
          continue;
        }
        emu_check_mha_row(ck, c, l, e, r, t, h, sm, s.data(), ref.data());
      }
  printf("case %2d %s d%-3d %s%s ps%-3d hq%d/%d causal%d win%-3d cap%g grid%d tiles%-3d",
         idx, tma_rows ? "wt" : use_wg == 2 ? "ws" : use_wg ? "wg" : "  ", D, c.qt == KVA_BF16 ? "bf16" : "f16 ", c.kv8 ? "+fp8" : "    ", c.ps, c.hq, c.hkv,
         c.causal, c.window, c.softcap, c.grid, nt);
  return emu_check_end(ck);
}

int main(int argc, char **argv) {
  emu_rng = 88172645463325252ull; /* this harness's cases */
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
  /* sharp logits (base-2 spread ~15-40): a row's max moves by more than the
   * online max's slack in later tiles, and by less in others */
  cases.push_back({128, KVA_BF16, 0, 16, 2, 1, 1, -1, 2, 0.f, 1.2f, {700}, {140}});
  cases.push_back({64, KVA_F16, 0, 16, 2, 1, 0, -1, 2, 0.f, 2.0f, {400}, {130}});
  cases.push_back({256, KVA_BF16, 0, 64, 2, 1, 1, -1, 2, 0.f, 0.8f, {300}, {150}});
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
    /* ... and on it with TMA loads (pages of 8 or more keys that tile the key tile) */
    for (size_t i = 0; i < nfix; i++)
      if (!cases[i].kv8) { Case w = cases[i]; w.wg = 3; cases.push_back(w); }
  }
  /* random sweep */
  const int nrand = argc > 2 ? atoi(argv[2]) : 60;
  for (int i = 0; i < nrand; i++) {
    Case c;
    const int ds[3] = {64, 128, 256}, pss[8] = {1, 2, 5, 16, 33, 256, 8, 64};
    c.D = ds[rnd() % 3];
    c.qt = rnd() % 2 ? KVA_BF16 : KVA_F16;
    c.kv8 = rnd() % 3 == 0;
    c.ps = pss[rnd() % 8];
    c.hkv = 1 + rnd() % 2;
    c.hq = c.hkv * (1 + rnd() % 3);
    c.causal = rnd() % 4 != 0;
    c.window = rnd() % 3 == 0 ? (int)(rnd() % 80) : -1;
    c.grid = 1 + rnd() % 4;
    c.softcap = rnd() % 4 == 0 ? 3.f + (rnd() % 40) : 0.f;
    c.sm_scale = rnd() % 4 == 0 ? 0.05f + (rnd() % 100) * 0.002f : 0.f;
    if (rnd() % 8 == 0) c.sm_scale = 0.5f + (rnd() % 100) * 0.015f; /* sharp */
    int B = 1 + rnd() % 3;
    for (int r = 0; r < B; r++) {
      c.cached.push_back(rnd() % 3 == 0 ? 0 : (int)(rnd() % 200));
      c.nnew.push_back(rnd() % 5 == 0 ? 1 + (int)(rnd() % 8) : 9 + (int)(rnd() % 170));
    }
    c.wg = argc > 3 ? atoi(argv[3]) : (int)(rnd() % 4);
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
