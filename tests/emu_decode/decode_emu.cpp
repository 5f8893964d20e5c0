/* Runs the real split-KV decode kernel (which merges split requests) under the host
 * emulator against a double-precision reference (test-only). Cases mix
 * decode requests (1..8 new tokens) with extend requests, whose rows the
 * decode path must leave untouched. */
#include "emu_cuda.h"
#include "cuda/decode_kernel.cuh"
extern "C" {
#include "core/dtype.h"
}
#include <math.h>
#include <algorithm>
#include <vector>

void emu_run_grid(void (*body)(void), int grid, int nthreads);
extern size_t emu_smem_limit;
extern long emu_bank_conflicts, emu_ldsm_count;
extern dim3 emu_blockIdx;

static kva_dec_args g_args;
static unsigned g_y;
static int g_d;
template <int D, int QT, int KV8, int MT>
static void body() {
  emu_blockIdx.y = g_y;
  kva_dec_kernel<D, QT, KV8, MT>(g_args);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static float frand() { return (rnd() >> 8) * (1.0f / 16777216.0f) * 2.f - 1.f; }

struct Case {
  int D, qt, kv8, ps, hq, hkv, causal, window, workers, block, max_q_cap;
  float softcap, sm_scale;
  std::vector<int> cached, nnew; /* nnew > 8: extend request (not ours) */
};

static void *align16(std::vector<unsigned char> &buf) {
  return buf.data() + ((16 - ((uintptr_t)buf.data() & 15)) & 15);
}

static int run_case(const Case &c, int idx) {
  const int D = c.D, B = (int)c.nnew.size(), group = c.hq / c.hkv;
  std::vector<int> kvlen(B), cu(B + 1, 0);
  int maxpages = 1, total_pages = 0, num_decode = 0, num_extend = 0;
  for (int r = 0; r < B; r++) {
    kvlen[r] = c.cached[r] + c.nnew[r];
    cu[r + 1] = cu[r] + c.nnew[r];
    maxpages = std::max(maxpages, (kvlen[r] + c.ps - 1) / c.ps);
    total_pages += (kvlen[r] + c.ps - 1) / c.ps;
    if (c.nnew[r] <= KVA_MAX_DECODE_Q) num_decode++; else num_extend++;
  }
  const int total_q = cu[B], num_pages = total_pages + 3;
  std::vector<int> perm(num_pages);
  for (int i = 0; i < num_pages; i++) perm[i] = i;
  for (int i = num_pages - 1; i > 0; i--) std::swap(perm[i], perm[rnd() % (i + 1)]);
  std::vector<int32_t> pt((size_t)B * maxpages, 0);
  int next = 0;
  for (int r = 0; r < B; r++)
    for (int j = 0; j < (kvlen[r] + c.ps - 1) / c.ps; j++) pt[(size_t)r * maxpages + j] = perm[next++];

  /* pool */
  const size_t pool_elems = (size_t)num_pages * c.ps * c.hkv * D;
  const int kvb = c.kv8 ? 1 : 2;
  std::vector<unsigned char> kbuf(pool_elems * kvb + 16), vbuf(pool_elems * kvb + 16);
  unsigned char *kp = (unsigned char *)align16(kbuf), *vp = (unsigned char *)align16(vbuf);
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
  /* q, o (NaN poison), lse */
  const size_t qn = (size_t)total_q * c.hq * D;
  std::vector<unsigned char> qbuf(qn * 2 + 16), obuf(qn * 2 + 16);
  uint16_t *q = (uint16_t *)align16(qbuf), *o = (uint16_t *)align16(obuf);
  std::vector<double> qd(qn);
  for (size_t i = 0; i < qn; i++) {
    float a = frand() * 1.5f;
    q[i] = c.qt == KVA_BF16 ? kva_f32_to_bf16(a) : kva_f32_to_f16(a);
    qd[i] = kva_load_f32(&q[i], 0, (kva_dtype)c.qt);
    o[i] = 0x7fff;
  }
  std::vector<float> lse((size_t)total_q * c.hq, nanf(""));

  /* schedule over decode requests, as the planner builds it */
  std::vector<int32_t> sched_kv(B), nn(c.nnew.begin(), c.nnew.end()), cs(kvlen.begin(), kvlen.end());
  for (int r = 0; r < B; r++) sched_kv[r] = c.nnew[r] <= KVA_MAX_DECODE_Q ? kvlen[r] : 0;
  std::vector<kva_split_work> work(c.workers);
  std::vector<int32_t> indptr(B + 1), rowoff(B + 1), dec_reqs;
  const int nsplits = kva_split_schedule(B, sched_kv.data(), nn.data(), c.block, c.workers,
                                         work.data(), indptr.data());
  int rows = 0;
  for (int r = 0; r < B; r++) {
    rowoff[r] = rows;
    const int s = indptr[r + 1] - indptr[r];
    if (s > 1) rows += s * c.nnew[r];
    if (c.nnew[r] <= KVA_MAX_DECODE_Q) dec_reqs.push_back(r);
  }
  rowoff[B] = rows;
  const int max_rows = std::max(rows, 1);
  std::vector<float> part_o((size_t)max_rows * c.hq * D, nanf("")), part_lse((size_t)max_rows * c.hq, nanf(""));

  kva_plan_header hdr;
  memset(&hdr, 0, sizeof hdr);
  hdr.num_requests = B;
  hdr.total_q = total_q;
  hdr.page_table_stride = maxpages;
  hdr.num_workers = c.workers;
  hdr.num_splits_total = nsplits;
  hdr.num_extend = num_extend;

  /* dec_shape of decode.cu */
  const int rows_cap = group * std::min(c.max_q_cap, KVA_MAX_DECODE_Q);
  const int mt = D <= 128 && rows_cap > 16 ? 2 : 1;
  const int row_groups = (rows_cap + 16 * mt - 1) / (16 * mt);

  const float sm = c.sm_scale > 0 ? c.sm_scale : 1.f / sqrtf((float)D);
  const float log2e = 1.4426950408889634f;
  kva_dec_args &a = g_args;
  memset(&a, 0, sizeof a);
  a.hdr = &hdr;
  a.sched = work.data();
  a.split_indptr = indptr.data();
  a.split_row_offset = rowoff.data();
  a.cu_q = cu.data();
  a.cache_seqlens = cs.data();
  a.num_new = nn.data();
  a.page_table = pt.data();
  a.decode_reqs = dec_reqs.data();
  a.q = q; a.o = o; a.lse = lse.data();
  a.part_o = part_o.data(); a.part_lse = part_lse.data();
  std::vector<int32_t> sem((size_t)(B + 2) * c.hq, 0); /* capacity rows, zeroed once */
  a.split_sem = sem.data();
  std::vector<int32_t> claim((size_t)(B + 2) * c.hq, 0); /* tile counters, zeroed once */
  a.tile_claim = claim.data();
  a.k = kp; a.v = vp;
  a.hq = c.hq; a.hkv = c.hkv; a.group = group; a.page_size = c.ps;
  { int l = 0; while ((1u << l) < (uint32_t)c.ps) l++;
    a.ps_mul = (uint32_t)(((uint64_t)1 << 32) * (((uint64_t)1 << l) - (uint64_t)c.ps) / (uint64_t)c.ps + 1);
    a.ps_shift = l; }
  if (c.softcap > 0) { a.qk_mul = 2.f * log2e * sm * ks / c.softcap; a.cap_log2 = c.softcap * log2e; }
  else { a.qk_mul = log2e * sm * ks; a.cap_log2 = 0; }
  a.o_mul = vs;
  a.causal = c.causal; a.window_left = c.window;

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
  /* the last chunk of each split request reset its count */
  for (size_t i = 0; i < sem.size(); i++)
    if (sem[i] != 0) { printf("case %d: split_sem[%zu] = %d after the run\n", idx, i, (int)sem[i]); return 1; }
  for (size_t i = 0; i < claim.size(); i++)
    if (claim[i] != 0) { printf("case %d: tile_claim[%zu] = %d after the run\n", idx, i, (int)claim[i]); return 1; }

  /* reference */
  double max_err = 0, max_lse_err = 0, se = 0, sr = 0;
  int bad = 0;
  std::vector<double> s;
  for (int r = 0; r < B; r++)
    for (int t = 0; t < c.nnew[r]; t++)
      for (int h = 0; h < c.hq; h++) {
        const size_t row = ((size_t)(cu[r] + t) * c.hq + h);
        const uint16_t *orow = o + row * D;
        if (c.nnew[r] > KVA_MAX_DECODE_Q) { /* extend rows must be untouched */
          for (int d = 0; d < D; d++)
            if (orow[d] != 0x7fff) { if (bad++ < 5) printf("case %d: extend row r%d t%d written\n", idx, r, t); break; }
          if (!isnan(lse[row])) bad++;
          continue;
        }
        const int p = c.cached[r] + t, kvh = h / group;
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
        const bool empty = sum == 0;
        double ref_lse = empty ? -INFINITY : mx + log(sum);
        for (int d = 0; d < D; d++) {
          double acc = 0;
          for (int j = 0; !empty && j < kvlen[r]; j++)
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
        double le = empty ? (lse[row] == -INFINITY ? 0 : INFINITY) : fabs(lse[row] - ref_lse);
        if (!(le <= 1e-3 * (1 + fabs(empty ? 0 : ref_lse)))) { if (bad++ < 5) printf("case %d: lse r%d t%d h%d got %g want %g\n", idx, r, t, h, lse[row], ref_lse); }
        if (le > max_lse_err || isnan(lse[row])) max_lse_err = isnan(lse[row]) ? INFINITY : le;
      }
  printf("case %2d d%-3d %s%s ps%-3d hq%d/%d mt%d rg%d causal%d win%-3d cap%-4g W%-2d blk%-3d splits%-3d: max|dO| %.2e rel %.1e max|dLSE| %.2e %s\n",
         idx, D, c.qt == KVA_BF16 ? "bf16" : "f16 ", c.kv8 ? "+fp8" : "    ", c.ps, c.hq, c.hkv, mt, row_groups,
         c.causal, c.window, c.softcap, c.workers, c.block, nsplits, max_err, sr > 0 ? sqrt(se / sr) : 0.0,
         max_lse_err, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
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
