/* Runs the real split-KV decode kernel (which merges split requests) under the host
 * emulator against a double-precision reference (test-only). Cases mix
 * decode requests (1..8 new tokens) with extend requests, whose rows the
 * decode path must leave untouched. */
#include "emu_common.h"
#include "cuda/decode_kernel.cuh"
#include <algorithm>
#include <vector>

static kva_dec_args g_args;
static unsigned g_y;
static int g_d;
template <int D, int QT, int KV8, int MT>
static void body() {
  emu_blockIdx.y = g_y;
  kva_dec_kernel<D, QT, KV8, MT>(g_args);
}

struct Case {
  int D, qt, kv8, ps, hq, hkv, causal, window, workers, block, max_q_cap;
  float softcap, sm_scale;
  std::vector<int> cached, nnew; /* nnew > 8: extend request (not ours) */
};

static int run_case(const Case &c, int idx) {
  const int D = c.D, group = c.hq / c.hkv;
  const EmuLayout l = emu_layout(c.cached, c.nnew, c.ps);
  const int B = l.B;
  const float ks = c.kv8 ? 0.05f : 1.f, vs = c.kv8 ? 0.03f : 1.f;
  const size_t qn = (size_t)l.total_q * c.hq * D;
  EmuData e;
  emu_data(e, 2, (size_t)l.num_pages * c.ps * c.hkv * D, c.kv8, c.qt, ks, vs, qn, qn,
           (size_t)l.total_q * c.hq);

  /* schedule over the decode requests; extend requests are not ours */
  std::vector<int32_t> sched_kv(B), dec_reqs;
  int num_extend = 0;
  for (int r = 0; r < B; r++) {
    const int dec = c.nnew[r] <= KVA_MAX_DECODE_Q;
    sched_kv[r] = dec ? l.kvlen[r] : 0;
    if (dec) dec_reqs.push_back(r); else num_extend++;
  }
  EmuSplit sp;
  emu_split(sp, l, c.nnew, sched_kv.data(), c.block, c.workers, c.hq, D);
  sp.hdr.num_extend = num_extend;

  /* dec_shape of decode.cu */
  const int rows_cap = group * std::min(c.max_q_cap, KVA_MAX_DECODE_Q);
  const int mt = D <= 128 && rows_cap > 16 ? 2 : 1;
  const int row_groups = (rows_cap + 16 * mt - 1) / (16 * mt);

  const float sm = c.sm_scale > 0 ? c.sm_scale : 1.f / sqrtf((float)D);
  kva_dec_args &a = g_args;
  memset(&a, 0, sizeof a);
  emu_split_args(a, sp, l, e);
  a.decode_reqs = dec_reqs.data();
  a.k = e.k; a.v = e.v;
  emu_attn_args(a, c.hq, c.hkv, c.ps, sm, ks, vs, c.softcap, c.causal, c.window);
  std::vector<int32_t> claim((size_t)(B + 2) * c.hq, 0); /* tile counters, zeroed once */
  a.tile_claim = claim.data();

  void (*fn)(void) = NULL;
#define PICK(d, QTY, k8, m) \
  if (D == d && c.qt == QTY && c.kv8 == k8 && mt == m) fn = body<d, QTY, k8, m>, emu_smem_limit = KVA_DEC_SMEM(d, k8, m);
#define PICK2(d, m) PICK(d, KVA_F16, 0, m) PICK(d, KVA_F16, 1, m) PICK(d, KVA_BF16, 0, m) PICK(d, KVA_BF16, 1, m)
  PICK2(64, 1) PICK2(64, 2) PICK2(128, 1) PICK2(128, 2) PICK2(256, 1)
  if (!fn) { printf("case %d: no instantiation\n", idx); return 1; }
  for (int y = 0; y < c.hkv * row_groups; y++) {
    g_y = (unsigned)y;
    emu_run_grid(fn, c.workers, KVA_DEC_THREADS);
  }
  g_d = D;
  emu_smem_limit = 0;
  if (emu_split_sem_dirty(sp, idx)) return 1;
  /* ... and the request's tile counter */
  for (size_t i = 0; i < claim.size(); i++)
    if (claim[i] != 0) { printf("case %d: tile_claim[%zu] = %d after the run\n", idx, i, (int)claim[i]); return 1; }

  /* reference */
  EmuCheck ck = emu_check(idx);
  std::vector<double> s(l.maxk), ref(D);
  for (int r = 0; r < B; r++)
    for (int t = 0; t < c.nnew[r]; t++)
      for (int h = 0; h < c.hq; h++) {
        if (c.nnew[r] > KVA_MAX_DECODE_Q) { /* extend rows must be untouched */
          const size_t row = (size_t)(l.cu[r] + t) * c.hq + h;
          emu_check_untouched(ck, "extend", r, t, e.o + row * D, D, e.lse[row]);
          continue;
        }
        emu_check_mha_row(ck, c, l, e, r, t, h, sm, s.data(), ref.data());
      }
  printf("case %2d d%-3d %s%s ps%-3d hq%d/%d mt%d rg%d causal%d win%-3d cap%-4g W%-2d blk%-3d splits%-3d",
         idx, D, c.qt == KVA_BF16 ? "bf16" : "f16 ", c.kv8 ? "+fp8" : "    ", c.ps, c.hq, c.hkv, mt, row_groups,
         c.causal, c.window, c.softcap, c.workers, c.block, sp.nsplits);
  return emu_check_end(ck);
}

int main(int argc, char **argv) {
  int only = argc > 1 ? atoi(argv[1]) : -1;
  std::vector<Case> cases;
  /* D, qt, kv8, ps, hq, hkv, causal, window, workers, block, max_q_cap, softcap, sm_scale, cached, new */
  cases.push_back({128, KVA_BF16, 0, 16, 4, 1, 1, -1, 3, 16, 1, 0.f, 0.f, {300}, {1}});
  cases.push_back({128, KVA_F16, 0, 3, 8, 2, 1, -1, 4, 16, 8, 0.f, 0.f, {37, 0, 150}, {4, 1, 8}});
  cases.push_back({64, KVA_BF16, 0, 1, 8, 2, 1, -1, 5, 32, 8, 0.f, 0.f, {100, 3}, {2, 20}});
  cases.push_back({256, KVA_BF16, 0, 7, 4, 1, 1, -1, 3, 16, 8, 0.f, 0.f, {150}, {3}});
  cases.push_back({128, KVA_BF16, 0, 16, 4, 2, 0, -1, 3, 64, 8, 0.f, 0.f, {200, 0}, {5, 9}});
  cases.push_back({128, KVA_BF16, 0, 64, 4, 1, 1, 40, 2, 16, 8, 0.f, 0.f, {180}, {6}});
  cases.push_back({128, KVA_BF16, 0, 16, 4, 1, 0, 70, 2, 16, 8, 0.f, 0.f, {150}, {7}});
  cases.push_back({128, KVA_BF16, 0, 16, 4, 1, 1, -1, 2, 16, 8, 30.f, 0.f, {100}, {8}});
  cases.push_back({128, KVA_F16, 1, 16, 4, 1, 1, -1, 2, 32, 1, 0.f, 0.f, {260}, {1}});
  cases.push_back({128, KVA_BF16, 1, 5, 8, 2, 1, 33, 3, 16, 8, 0.f, 0.2f, {77, 140}, {7, 2}});
  cases.push_back({64, KVA_F16, 1, 256, 4, 1, 0, -1, 2, 64, 8, 10.f, 0.f, {300}, {3}});
  cases.push_back({256, KVA_F16, 1, 2, 4, 2, 1, -1, 3, 16, 8, 0.f, 0.f, {131}, {4}});
  cases.push_back({256, KVA_BF16, 0, 16, 4, 1, 0, 20, 2, 16, 8, 5.f, 0.f, {70}, {2}});
  cases.push_back({64, KVA_BF16, 0, 32, 2, 1, 1, 0, 2, 16, 8, 0.f, 0.f, {130}, {8}});
  /* MQA: 32 rows per token -> several row groups */
  cases.push_back({128, KVA_BF16, 0, 16, 32, 1, 1, -1, 2, 64, 8, 0.f, 0.f, {90, 40}, {3, 1}});
  cases.push_back({64, KVA_F16, 1, 8, 16, 1, 1, 5, 3, 16, 8, 0.f, 0.f, {60}, {8}});
  /* window leaves whole chunks without keys */
  cases.push_back({128, KVA_F16, 0, 4, 4, 1, 1, 3, 6, 16, 8, 0.f, 0.f, {400}, {2}});
  /* long split requests: most tiles are claimed at run time (the kernel's
   * dynamic tile counters); run with EMU_CTA_ORDER=reverse|shuffle too */
  cases.push_back({128, KVA_BF16, 0, 16, 4, 1, 1, -1, 3, 16, 1, 0.f, 0.f, {3000}, {1}});
  cases.push_back({128, KVA_F16, 1, 16, 8, 2, 1, -1, 4, 32, 8, 0.f, 0.f, {2500, 1800}, {2, 1}});
  cases.push_back({64, KVA_BF16, 0, 5, 8, 2, 1, 700, 5, 16, 8, 0.f, 0.f, {2000, 900}, {3, 1}});
  cases.push_back({256, KVA_BF16, 0, 16, 4, 1, 1, -1, 4, 64, 8, 7.f, 0.f, {1500}, {2}});
  /* fp8 KV with a bf16 Q (staged as f16 times 2^-8): split, soft-cap, d 64 and 256 */
  cases.push_back({128, KVA_BF16, 1, 16, 8, 2, 1, -1, 4, 32, 8, 0.f, 0.f, {2500, 1800}, {2, 1}});
  cases.push_back({64, KVA_BF16, 1, 16, 16, 2, 1, -1, 3, 64, 8, 20.f, 0.f, {700, 90}, {1, 4}});
  cases.push_back({256, KVA_BF16, 1, 7, 4, 1, 0, 50, 3, 16, 8, 0.f, 0.f, {400}, {3}});
  /* random sweep */
  const int nrand = argc > 2 ? atoi(argv[2]) : 40;
  for (int i = 0; i < nrand; i++) {
    Case c;
    const int ds[3] = {64, 128, 256}, pss[6] = {1, 2, 5, 16, 33, 256}, blks[4] = {16, 32, 64, 128};
    c.D = ds[rnd() % 3];
    c.qt = rnd() % 2 ? KVA_BF16 : KVA_F16;
    c.kv8 = rnd() % 3 == 0;
    c.ps = pss[rnd() % 6];
    c.hkv = 1 + rnd() % 2;
    const int groups[5] = {1, 2, 4, 5, 8};
    c.hq = c.hkv * groups[rnd() % 5];
    c.causal = rnd() % 4 != 0;
    c.window = rnd() % 3 == 0 ? (int)(rnd() % 80) : -1;
    c.workers = 1 + rnd() % 6;
    c.block = blks[rnd() % 4];
    c.max_q_cap = rnd() % 2 ? 8 : 1 + (int)(rnd() % 8);
    c.softcap = rnd() % 4 == 0 ? 3.f + (rnd() % 40) : 0.f;
    c.sm_scale = rnd() % 4 == 0 ? 0.05f + (rnd() % 100) * 0.002f : 0.f;
    int B = 1 + rnd() % 4;
    for (int r = 0; r < B; r++) {
      c.cached.push_back(rnd() % 4 == 0 ? 0 : (int)(rnd() % (rnd() % 5 == 0 ? 2500 : 300)));
      c.nnew.push_back(rnd() % 6 == 0 ? 9 + (int)(rnd() % 20) : 1 + (int)(rnd() % c.max_q_cap));
    }
    cases.push_back(c);
  }
  int fails = 0, ran = 0;
  for (int i = 0; i < (int)cases.size(); i++)
    if (only < 0 || only == i) { fails += run_case(cases[i], i); ran++; }
  printf("ldmatrix phases %ld, bank-conflicted phases %ld\n", emu_ldsm_count, emu_bank_conflicts);
  printf("%d passed, %d failed\n", ran - fails, fails);
  return fails != 0;
}
