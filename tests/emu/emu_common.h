/* What the emulator harnesses share (test-only): tests/emu (extend),
 * tests/emu_decode and tests/emu_mla each run a real kernel under the
 * emulated runtime and check it with the same random data, paged layout,
 * double-precision reference and tolerances, kept here so the three check
 * alike. */
#pragma once
#include "emu_cuda.h"
#include "cuda/cuda_internal.h" /* kva_cuda_fastdiv */
extern "C" {
#include "core/dtype.h"
}
#include <math.h>
#include <vector>

/* xorshift64 the cases and data are drawn from; a harness with another
 * seed sets emu_rng first (its cases depend on the sequence). */
static uint64_t emu_rng = 0x2545F4914F6CDD1Dull;
static inline uint32_t rnd(void) {
  emu_rng ^= emu_rng << 13;
  emu_rng ^= emu_rng >> 7;
  emu_rng ^= emu_rng << 17;
  return (uint32_t)emu_rng;
}
static inline float frand(void) { return (rnd() >> 8) * (1.0f / 16777216.0f) * 2.f - 1.f; }

/* The first 16-byte aligned byte of buf (sized with 16 bytes to spare):
 * the kernels load 16 bytes at a time. */
static inline void *align16(std::vector<unsigned char> &buf) {
  return buf.data() + ((16 - ((uintptr_t)buf.data() & 15)) & 15);
}

/* Paged layout of a batch: request r has cached[r] + nnew[r] keys on
 * pages of ps slots, drawn at random (one shuffle of rnd()) from a pool of
 * num_pages, 3 more than used, so that page ids are neither in order nor
 * dense. */
struct EmuLayout {
  int B, total_q, maxpages, num_pages, maxk; /* maxk: most keys of a request */
  std::vector<int> kvlen, cu; /* keys per request; cu_seqlens of the new tokens */
  std::vector<int32_t> pt;    /* page table [B][maxpages] */
};
static EmuLayout emu_layout(const std::vector<int> &cached, const std::vector<int> &nnew, int ps) {
  EmuLayout l;
  l.B = (int)nnew.size();
  l.kvlen.resize(l.B);
  l.cu.assign(l.B + 1, 0);
  l.maxpages = 1;
  l.maxk = 0;
  int total_pages = 0;
  for (int r = 0; r < l.B; r++) {
    l.kvlen[r] = cached[r] + nnew[r];
    l.cu[r + 1] = l.cu[r] + nnew[r];
    const int pages = (l.kvlen[r] + ps - 1) / ps;
    if (pages > l.maxpages) l.maxpages = pages;
    if (l.kvlen[r] > l.maxk) l.maxk = l.kvlen[r];
    total_pages += pages;
  }
  l.total_q = l.cu[l.B];
  l.num_pages = total_pages + 3;
  std::vector<int> perm(l.num_pages);
  for (int i = 0; i < l.num_pages; i++) perm[i] = i;
  for (int i = l.num_pages - 1; i > 0; i--) {
    const int j = (int)(rnd() % (i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  l.pt.assign((size_t)l.B * l.maxpages, 0);
  int next = 0;
  for (int r = 0; r < l.B; r++)
    for (int j = 0; j < (l.kvlen[r] + ps - 1) / ps; j++) l.pt[(size_t)r * l.maxpages + j] = perm[next++];
  return l;
}

/* Stores x as element i of a cache buffer (e4m3 of x / scale when kv8,
 * else the 16-bit qt) and returns the value the kernel will read back. */
static inline double emu_store_kv(unsigned char *p, size_t i, float x, int kv8, int qt, float scale) {
  if (kv8) {
    const uint8_t b = kva_f32_to_fp8e4m3(x / scale);
    p[i] = b;
    return (double)kva_fp8e4m3_to_f32(b) * scale;
  }
  const uint16_t h = qt == KVA_BF16 ? kva_f32_to_bf16(x) : kva_f32_to_f16(x);
  memcpy(p + 2 * i, &h, 2);
  return kva_load_f32(&h, 0, (kva_dtype)qt);
}

/* A case's buffers, 16-byte aligned: the cache (K and V, or with
 * kv_bufs 1 only k: the MLA latent) of pool_elems elements, random in
 * [-2, 2) (K and V drawn in turn per element) stored as emu_store_kv does
 * with scales ks, vs; Q [qn] random in [-1.5, 1.5) of qt; O [on]
 * NaN-poisoned (0x7fff), LSE [nlse] NaN: a row the kernel misses shows.
 * kf, vf, qd: the values the kernel reads, for the reference. */
struct EmuData {
  std::vector<unsigned char> kbuf, vbuf, qbuf, obuf;
  std::vector<double> kf, vf, qd;
  std::vector<float> lse;
  unsigned char *k, *v;
  uint16_t *q, *o;
};
static void emu_data(EmuData &e, int kv_bufs, size_t pool_elems, int kv8, int qt, float ks, float vs,
                     size_t qn, size_t on, size_t nlse) {
  const size_t kv_bytes = pool_elems * (kv8 ? 1 : 2) + 64;
  e.kbuf.assign(kv_bytes, 0);
  e.k = (unsigned char *)align16(e.kbuf);
  e.kf.assign(pool_elems, 0);
  e.v = NULL;
  if (kv_bufs == 2) {
    e.vbuf.assign(kv_bytes, 0);
    e.v = (unsigned char *)align16(e.vbuf);
    e.vf.assign(pool_elems, 0);
  }
  for (size_t i = 0; i < pool_elems; i++) {
    e.kf[i] = emu_store_kv(e.k, i, frand() * 2.f, kv8, qt, ks);
    if (kv_bufs == 2) e.vf[i] = emu_store_kv(e.v, i, frand() * 2.f, kv8, qt, vs);
  }
  e.qbuf.assign(qn * 2 + 16, 0);
  e.obuf.assign(on * 2 + 16, 0);
  e.q = (uint16_t *)align16(e.qbuf);
  e.o = (uint16_t *)align16(e.obuf);
  e.qd.assign(qn, 0);
  for (size_t i = 0; i < qn; i++) {
    const float x = frand() * 1.5f;
    e.q[i] = qt == KVA_BF16 ? kva_f32_to_bf16(x) : kva_f32_to_f16(x);
    e.qd[i] = kva_load_f32(&e.q[i], 0, (kva_dtype)qt);
  }
  for (size_t i = 0; i < on; i++) e.o[i] = 0x7fff;
  e.lse.assign(nlse, nanf(""));
}

/* The split-KV schedule of a decode case as the planner builds it
 * (kva_split_schedule, or with packed kva_split_schedule_packed's order,
 * over sched_kv keys per request, 0 for a request
 * not decoded here), the partial rows of split requests (dv floats per
 * head, NaN), their semaphores (zeroed once, as the plan does) and the
 * header fields the split kernels read. */
struct EmuSplit {
  std::vector<int32_t> nn, cs, indptr, rowoff, sem, order;
  std::vector<kva_split_work> work;
  std::vector<float> part_o, part_lse;
  kva_plan_header hdr;
  int nsplits;
};
static void emu_split(EmuSplit &sp, const EmuLayout &l, const std::vector<int> &nnew,
                      const int32_t *sched_kv, int block, int workers, int hq, int dv,
                      bool packed = false) {
  const int B = l.B;
  sp.nn.assign(nnew.begin(), nnew.end());
  sp.cs.assign(l.kvlen.begin(), l.kvlen.end());
  sp.work.resize(workers);
  sp.indptr.assign(B + 1, 0);
  sp.rowoff.assign(B + 1, 0);
  sp.order.resize(B > 0 ? B : 1);
  if (packed) { /* MLA plans' order (kva_split_schedule_packed) */
    std::vector<int64_t> keys(B > 0 ? B : 1);
    std::vector<int32_t> nxt(B + 1);
    sp.nsplits = kva_split_schedule_packed(B, sched_kv, block, workers, 0, 0, sp.work.data(),
                                           sp.indptr.data(), sp.order.data(), keys.data(),
                                           nxt.data());
  } else {
    sp.nsplits = kva_split_schedule(B, sched_kv, sp.nn.data(), block, workers, 0,
                                    sp.work.data(), sp.indptr.data());
    for (int r = 0; r < B; r++) sp.order[r] = r;
  }
  int rows = 0;
  for (int r = 0; r < B; r++) {
    sp.rowoff[r] = rows;
    const int n = sp.indptr[r + 1] - sp.indptr[r];
    if (n > 1) rows += n * nnew[r];
  }
  sp.rowoff[B] = rows;
  const int max_rows = rows > 1 ? rows : 1;
  sp.part_o.assign((size_t)max_rows * hq * dv, nanf(""));
  sp.part_lse.assign((size_t)max_rows * hq, nanf(""));
  sp.sem.assign((size_t)(B + 2) * hq, 0); /* capacity rows */
  memset(&sp.hdr, 0, sizeof sp.hdr);
  sp.hdr.num_requests = B;
  sp.hdr.total_q = l.total_q;
  sp.hdr.page_table_stride = l.maxpages;
  sp.hdr.num_workers = workers;
  sp.hdr.num_splits_total = sp.nsplits;
}
/* The split kernels' shared argument fields (kva_dec_args, kva_mla_args). */
template <class A>
static void emu_split_args(A &a, EmuSplit &sp, const EmuLayout &l, EmuData &e) {
  a.hdr = &sp.hdr;
  a.sched = sp.work.data();
  a.split_indptr = sp.indptr.data();
  a.split_row_offset = sp.rowoff.data();
  a.cu_q = l.cu.data();
  a.cache_seqlens = sp.cs.data();
  a.num_new = sp.nn.data();
  a.page_table = l.pt.data();
  a.q = e.q; a.o = e.o; a.lse = e.lse.data();
  a.part_o = sp.part_o.data(); a.part_lse = sp.part_lse.data();
  a.split_sem = sp.sem.data();
}
/* After the run: the last chunk of each split request resets its
 * semaphore (the next run relies on 0); 1 (and a line) if one did not. */
static int emu_split_sem_dirty(const EmuSplit &sp, int idx) {
  for (size_t i = 0; i < sp.sem.size(); i++)
    if (sp.sem[i] != 0) { printf("case %d: split_sem[%zu] = %d after the run\n", idx, i, (int)sp.sem[i]); return 1; }
  return 0;
}

/* The MHA kernels' shared argument fields (kva_ext_args, kva_dec_args), as
 * KVA_CUDA_FILL_ATTN_ARGS sets them; ks, vs: the fp8 scales (1 for 16-bit). */
template <class A>
static void emu_attn_args(A &a, int hq, int hkv, int ps, float sm, float ks, float vs,
                          float softcap, int causal, int window) {
  const float log2e = 1.4426950408889634f;
  a.hq = hq; a.hkv = hkv; a.group = hq / hkv; a.page_size = ps;
  kva_cuda_fastdiv(ps, &a.ps_mul, &a.ps_shift);
  if (softcap > 0) { a.qk_mul = 2.f * log2e * sm * ks / softcap; a.cap_log2 = softcap * log2e; }
  else { a.qk_mul = log2e * sm * ks; a.cap_log2 = 0; }
  a.o_mul = vs;
  a.causal = causal; a.window_left = window;
}

/* Reference attention of one query row q[dk] at position p of a request
 * with kvlen keys: key j is dk values at k + slot * stride, its value dv
 * values at v + slot * stride, slot from the request's page-table row pt
 * (pages of ps). Causal and window (-1: none) masks, soft-cap when > 0.
 * s: kvlen scratch. Writes out[dv] (0 when no key is visible) and returns
 * the LSE (-inf then). */
static double emu_ref_row(const double *q, const double *k, const double *v, size_t stride,
                          int dk, int dv, const int32_t *pt, int ps, int kvlen, int p, int causal,
                          int window, float sm, float softcap, double *s, double *out) {
  double mx = -INFINITY;
  for (int j = 0; j < kvlen; j++) {
    s[j] = -INFINITY;
    if (causal && j > p) continue;
    if (window >= 0 && j < p - window) continue;
    const size_t slot = (size_t)pt[j / ps] * ps + j % ps;
    double dot = 0;
    for (int d = 0; d < dk; d++) dot += q[d] * k[slot * stride + d];
    double x = sm * dot;
    if (softcap > 0) x = softcap * tanh(x / softcap);
    s[j] = x;
    if (mx < x) mx = x;
  }
  double sum = 0;
  for (int j = 0; j < kvlen; j++) if (s[j] > -INFINITY) sum += exp(s[j] - mx);
  const bool empty = sum == 0;
  for (int d = 0; d < dv; d++) {
    double acc = 0;
    for (int j = 0; !empty && j < kvlen; j++)
      if (s[j] > -INFINITY) {
        const size_t slot = (size_t)pt[j / ps] * ps + j % ps;
        acc += exp(s[j] - mx) / sum * v[slot * stride + d];
      }
    out[d] = acc;
  }
  return empty ? -INFINITY : mx + log(sum);
}

/* A case's checks: error statistics and failures (the first 5 printed). */
struct EmuCheck {
  int idx, bad;
  double max_err, max_lse_err, se, sr;
};
static inline EmuCheck emu_check(int idx) {
  EmuCheck ck = {idx, 0, 0, 0, 0, 0};
  return ck;
}

/* Output row orow[dv] (16-bit qt) and its LSE against the reference:
 * |dO| <= 1e-2 + 1e-2 |O|, |dLSE| <= 1e-3 (1 + |LSE|); -inf (no key
 * visible) must be matched exactly. */
static void emu_check_row(EmuCheck &ck, int r, int t, int h, const uint16_t *orow, int qt,
                          const double *ref, int dv, float lse, double ref_lse) {
  for (int d = 0; d < dv; d++) {
    const double acc = ref[d];
    const double got = kva_load_f32(&orow[d], 0, (kva_dtype)qt);
    const double err = fabs(got - acc);
    ck.se += (got - acc) * (got - acc);
    ck.sr += acc * acc;
    if (!(err <= 1e-2 + 1e-2 * fabs(acc))) { if (ck.bad++ < 5) printf("case %d: r%d t%d h%d d%d got %g want %g\n", ck.idx, r, t, h, d, got, acc); }
    if (err > ck.max_err || isnan(got)) ck.max_err = isnan(got) ? INFINITY : err;
  }
  const bool empty = ref_lse == -INFINITY;
  const double le = empty ? (lse == -INFINITY ? 0 : INFINITY) : fabs(lse - ref_lse);
  if (!(le <= 1e-3 * (1 + fabs(empty ? 0 : ref_lse)))) { if (ck.bad++ < 5) printf("case %d: lse r%d t%d h%d got %g want %g\n", ck.idx, r, t, h, lse, ref_lse); }
  if (le > ck.max_lse_err || isnan(lse)) ck.max_lse_err = isnan(lse) ? INFINITY : le;
}

/* A row of a request the kernel does not own (what: "decode", "extend")
 * must keep its NaN poison (0x7fff) and NaN LSE. */
static void emu_check_untouched(EmuCheck &ck, const char *what, int r, int t, const uint16_t *orow,
                                int dv, float lse) {
  for (int d = 0; d < dv; d++)
    if (orow[d] != 0x7fff) { if (ck.bad++ < 5) printf("case %d: %s row r%d t%d written\n", ck.idx, what, r, t); break; }
  if (!isnan(lse)) ck.bad++;
}

/* Row (r, t, h) of an MHA case c (tests/emu, tests/emu_decode: same
 * field names) against the reference on its pool [slots][hkv][D]; s, ref:
 * scratch of l.maxk and c.D. */
template <class C>
static void emu_check_mha_row(EmuCheck &ck, const C &c, const EmuLayout &l, const EmuData &e,
                              int r, int t, int h, float sm, double *s, double *ref) {
  const int D = c.D;
  const size_t row = (size_t)(l.cu[r] + t) * c.hq + h;
  const size_t kvo = (size_t)(h / (c.hq / c.hkv)) * D; /* the kv head's offset in a slot */
  const double ref_lse = emu_ref_row(&e.qd[row * D], &e.kf[kvo], &e.vf[kvo], (size_t)c.hkv * D, D, D,
                                     &l.pt[(size_t)r * l.maxpages], c.ps, l.kvlen[r], c.cached[r] + t,
                                     c.causal, c.window, sm, c.softcap, s, ref);
  emu_check_row(ck, r, t, h, e.o + row * D, c.qt, ref, D, e.lse[row], ref_lse);
}

/* Ends a harness's case line with the errors and the verdict; 1 if failed. */
static int emu_check_end(const EmuCheck &ck) {
  printf(": max|dO| %.2e rel %.1e max|dLSE| %.2e %s\n", ck.max_err,
         ck.sr > 0 ? sqrt(ck.se / ck.sr) : 0.0, ck.max_lse_err, ck.bad ? "FAIL" : "ok");
  return ck.bad ? 1 : 0;
}
