/* Host emulation runtime for the extend kernels (test-only): up to 512
 * coroutine threads per CTA, warp collectives, named barriers (bar.sync /
 * bar.arrive with thread counts; __syncthreads is barrier 0), mbarriers
 * with phases, cp.async that lands at its issue, at wait_group, or (with
 * cp.async.mbarrier.arrive.noinc) at a random later point followed by the
 * arrival, wgmma by descriptor, and a check that every smem chunk a wgmma
 * reads was made visible to the async proxy (fence.proxy.async by the
 * reading warp after it landed, or by its writer after it landed) and was
 * not rewritten while the wgmma was in flight (by stamps, and by a hash of
 * its operands' bytes at issue and completion, which also sees plain C++
 * stores). A thread's own mbarrier arrival sleeps it half the time, so a
 * store placed after an arrival can land under the waiters' wgmmas. */
#include "emu_cuda.h"
#include "cuda/ptx.cuh"
#include "cuda/tma.h"
#include <algorithm>
#include <map>
#include <vector>
#include <string.h>
#include <stdlib.h>
extern "C" {
#include "core/dtype.h"
}

unsigned char smem[256 * 1024] __attribute__((aligned(1024)));
size_t emu_smem_limit = sizeof(smem);
int emu_no_known_last = 0;
dim3 emu_blockIdx, emu_gridDim;

enum { NTH_MAX = 512, NBAR = 16 };
static int NTH = 128;
struct Copy {
  uint32_t dst;
  const unsigned char *src;
  int bytes;
};
struct Th {
  ucontext_t ctx;
  dim3 idx;
  int state; /* 0 runnable, 1 collective, 2 named barrier, 3 done, 4 mbarrier wait, 5 asleep */
  uint32_t wait_bar, wait_parity; /* state 4 */
  uint64_t wake_sweep;            /* state 5 */
  uint64_t fence_stamp;           /* clock of its last fence.proxy.async */
  std::vector<std::vector<Copy>> groups;
  std::vector<Copy> open;
  std::vector<char> stack;
};
static Th th[NTH_MAX];
static int cur;
static ucontext_t sched_ctx;
/* named barriers: arrivals so far and the count they were given */
static int bar_arrived[NBAR], bar_expect[NBAR];
/* mbarriers by smem address */
struct MBar {
  int count, pending;
  uint32_t phase;
  long tx; /* transaction bytes still to land in this phase */
};
static std::map<uint32_t, MBar> mbars;
/* cp.async copies whose mbarrier arrival is pending (per thread, FIFO) */
struct Copy;
struct AsyncArrive {
  std::vector<Copy> copies;
  uint32_t bar;
};
static std::vector<std::vector<AsyncArrive>> async_q(NTH_MAX);
/* logical clock; per 16-byte smem chunk: when it was last written, by whom */
static uint64_t emu_clock = 1;
static uint64_t chunk_stamp[256 * 1024 / 16];
static int chunk_writer[256 * 1024 / 16];
static uint64_t sched_rng = 0x2545f4914f6cdd1dull;
static uint32_t sched_rand() {
  sched_rng ^= sched_rng << 13; sched_rng ^= sched_rng >> 7; sched_rng ^= sched_rng << 17;
  return (uint32_t)(sched_rng >> 11);
}
long emu_bank_conflicts, emu_ldsm_count;

dim3 &emu_threadIdx() { return th[cur].idx; }

enum { OP_LDM = 1, OP_LDMT, OP_STMT, OP_MMA_F16, OP_MMA_BF16, OP_SHFL, OP_SHFLX, OP_SYNCW, OP_WG, OP_ANY,
       OP_WG_ISSUE, OP_WG_COMMIT, OP_WG_WAIT };
struct Warp {
  int op, count;
  int deferred; /* a wgmma.wait_group all lanes reached, completed by the scheduler later */
  uint32_t in[32][80];
  uint32_t out[32][64];
};
static Warp warps[NTH_MAX / 32];
/* wgmma N from the issue flags (see wg_execute) */
static int emu_wg_n(uint32_t fl) { return (fl & 256u) ? 248 : (fl & 512u) ? 8 : (fl & 32u) ? 256 : 128 >> ((fl >> 3) & 3); }

/* wgmma in flight: operands are read when the group completes (wait_group),
 * and they must be unchanged since the issue (checked), like on hardware. */
struct WgOp {
  int chained; /* an earlier in-flight wgmma accumulates into the same d */
  uint32_t flags;
  uint64_t da, db;
  float *d[32];
  const uint32_t *a[32];
  float d0[32][128];
  uint32_t a0[32][4];
  uint64_t issue_stamp;
  uint64_t operand_hash; /* its smem operands' bytes at the issue */
};
struct WgQueue {
  std::vector<WgOp> open;
  std::vector<std::vector<WgOp>> groups;
};
static WgQueue wgq[NTH_MAX / 32];
static void wg_execute(Warp &W, WgOp &op);
static void wg_check_visible(Warp &W, const WgOp &op);
static uint64_t wg_operand_hash(Warp &W, const WgOp &op);

static void yield_() { swapcontext(&th[cur].ctx, &sched_ctx); }

static float h2f(uint16_t h, int bf) { return bf ? kva_bf16_to_f32(h) : kva_f16_to_f32(h); }

static void check_smem(uint32_t a, int bytes) {
  if ((size_t)a + bytes > emu_smem_limit) {
    fprintf(stderr, "smem access at %u + %d beyond the %zu bytes launched\n", a, bytes,
            emu_smem_limit);
    abort();
  }
}

static void compute(Warp &W) {
  switch (W.op) {
    case OP_LDM:
    case OP_LDMT:
      for (int i = 0; i < 4; i++) { /* bank check: one phase per matrix */
        int seen[8] = {0};
        emu_ldsm_count++;
        for (int r = 0; r < 8; r++) {
          uint32_t a = W.in[8 * i + r][0];
          if (a & 15) { fprintf(stderr, "ldmatrix row address %u not 16-byte aligned\n", a); abort(); }
          check_smem(a, 16);
          int g = (a / 16) % 8;
          if (seen[g]++) emu_bank_conflicts++;
        }
      }
      for (int t = 0; t < 32; t++)
        for (int i = 0; i < 4; i++) {
          if (W.op == OP_LDM) {
            uint32_t a = W.in[8 * i + (t >> 2)][0] + (t & 3) * 4;
            memcpy(&W.out[t][i], smem + a, 4);
          } else {
            uint32_t ra = W.in[8 * i + 2 * (t & 3)][0] + (t >> 2) * 2;
            uint32_t rb = W.in[8 * i + 2 * (t & 3) + 1][0] + (t >> 2) * 2;
            uint16_t lo, hi;
            memcpy(&lo, smem + ra, 2);
            memcpy(&hi, smem + rb, 2);
            W.out[t][i] = lo | ((uint32_t)hi << 16);
          }
        }
      break;
    case OP_STMT: /* stmatrix .x4 .trans: address row r of matrix i takes column r */
      for (int i = 0; i < 4; i++)
        for (int r = 0; r < 8; r++) {
          const int t = 8 * i + r;
          const uint32_t a = W.in[t][0];
          if (a & 15) { fprintf(stderr, "stmatrix row address %u not 16-byte aligned\n", a); abort(); }
          check_smem(a, 16);
          for (int c = 0; c < 8; c++) { /* element (c, r): lane 4c + r/2, half r%2 */
            const uint32_t v = W.in[4 * c + r / 2][1 + i];
            const uint16_t h = (uint16_t)(r % 2 ? v >> 16 : v & 0xffffu);
            memcpy(smem + a + 2 * c, &h, 2);
          }
          /* a generic write: wgmma reads of it need the writer's fence.proxy.async */
          chunk_stamp[a / 16] = emu_clock++;
          chunk_writer[a / 16] = (cur & ~31) + t;
        }
      break;
    case OP_MMA_F16:
    case OP_MMA_BF16: {
      int bf = W.op == OP_MMA_BF16;
      float A[16][16], B[16][8], C[16][8];
      for (int t = 0; t < 32; t++) {
        int g = t >> 2, q = t & 3;
        const uint32_t *r = W.in[t];
        A[g][2 * q] = h2f(r[0] & 0xffff, bf); A[g][2 * q + 1] = h2f(r[0] >> 16, bf);
        A[g + 8][2 * q] = h2f(r[1] & 0xffff, bf); A[g + 8][2 * q + 1] = h2f(r[1] >> 16, bf);
        A[g][2 * q + 8] = h2f(r[2] & 0xffff, bf); A[g][2 * q + 9] = h2f(r[2] >> 16, bf);
        A[g + 8][2 * q + 8] = h2f(r[3] & 0xffff, bf); A[g + 8][2 * q + 9] = h2f(r[3] >> 16, bf);
        B[2 * q][g] = h2f(r[4] & 0xffff, bf); B[2 * q + 1][g] = h2f(r[4] >> 16, bf);
        B[2 * q + 8][g] = h2f(r[5] & 0xffff, bf); B[2 * q + 9][g] = h2f(r[5] >> 16, bf);
        float c[4];
        memcpy(c, &r[6], 16);
        C[g][2 * q] = c[0]; C[g][2 * q + 1] = c[1]; C[g + 8][2 * q] = c[2]; C[g + 8][2 * q + 1] = c[3];
      }
      float Dm[16][8];
      for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
          float s = C[i][j];
          for (int k = 0; k < 16; k++) s += A[i][k] * B[k][j];
          Dm[i][j] = s;
        }
      for (int t = 0; t < 32; t++) {
        int g = t >> 2, q = t & 3;
        float c[4] = {Dm[g][2 * q], Dm[g][2 * q + 1], Dm[g + 8][2 * q], Dm[g + 8][2 * q + 1]};
        memcpy(W.out[t], c, 16);
      }
      break;
    }
    case OP_SHFL:
      for (int t = 0; t < 32; t++) W.out[t][0] = W.in[W.in[t][1] & 31][0];
      break;
    case OP_SHFLX:
      for (int t = 0; t < 32; t++) W.out[t][0] = W.in[(t ^ W.in[t][1]) & 31][0];
      break;
    case OP_SYNCW:
      break;
    case OP_WG_ISSUE: {
      WgQueue &q = wgq[&W - warps];
      WgOp op;
      memcpy(&op.flags, &W.in[0][72], 4);
      const int dbytes = 2 * emu_wg_n(op.flags); /* N / 2 accumulators of 4 bytes */
      op.da = W.in[0][68] | ((uint64_t)W.in[0][69] << 32);
      op.db = W.in[0][70] | ((uint64_t)W.in[0][71] << 32);
      for (int t = 0; t < 32; t++) {
        memcpy((void *)&op.d[t], (const void *)&W.in[t][0], sizeof op.d[t]); /* pointer bits */
        memcpy((void *)&op.a[t], (const void *)&W.in[t][2], sizeof op.a[t]);
        memcpy(op.d0[t], op.d[t], dbytes);
        if (op.a[t]) memcpy(op.a0[t], op.a[t], 16);
        if (W.in[t][72] != W.in[0][72] || W.in[t][68] != W.in[0][68] || W.in[t][70] != W.in[0][70]) {
          fprintf(stderr, "wgmma operands differ across lanes\n");
          abort();
        }
      }
      op.issue_stamp = emu_clock++;
      wg_check_visible(W, op);
      op.operand_hash = wg_operand_hash(W, op);
      op.chained = 0;
      for (const WgOp &o2 : q.open) op.chained |= o2.d[0] == op.d[0];
      for (const auto &g : q.groups)
        for (const WgOp &o2 : g) op.chained |= o2.d[0] == op.d[0];
      q.open.push_back(op);
      break;
    }
    case OP_WG_COMMIT: {
      WgQueue &q = wgq[&W - warps];
      q.groups.push_back(q.open);
      q.open.clear();
      break;
    }
    case OP_WG_WAIT: {
      WgQueue &q = wgq[&W - warps];
      while ((int)q.groups.size() > (int)W.in[0][0]) {
        for (WgOp &op : q.groups.front()) wg_execute(W, op);
        q.groups.erase(q.groups.begin());
      }
      break;
    }
    case OP_ANY: {
      uint32_t any = 0;
      for (int t = 0; t < 32; t++) any |= W.in[t][0] != 0;
      for (int t = 0; t < 32; t++) W.out[t][0] = any;
      break;
    }
  }
}

static void collective(int op) {
  int w = cur / 32;
  Warp &W = warps[w];
  if (W.count == 0)
    W.op = op;
  else if (W.op != op) {
    fprintf(stderr, "warp %d: lanes at different collectives (%d vs %d)\n", w, W.op, op);
    abort();
  }
  if (++W.count == 32 && op == OP_WG_WAIT) {
    /* the wgmmas complete (read their operands) some time later: other
     * warps run meanwhile, so a stage released too early gets rewritten */
    W.deferred = 1;
    th[cur].state = 1;
    yield_();
  } else if (W.count == 32) {
    compute(W);
    W.count = 0;
    for (int l = 0; l < 32; l++)
      if (th[w * 32 + l].state == 1) th[w * 32 + l].state = 0;
  } else {
    th[cur].state = 1;
    yield_();
  }
}

static uint32_t lane() { return (uint32_t)cur & 31; }

static void land(const Copy &c, int writer);

/* bar.sync / bar.arrive: `count` threads (all lanes of whole warps) per
 * generation; arrive does not wait. */
static void named_bar(int id, int count, int wait) {
  if (id < 0 || id >= NBAR || count <= 0 || count % 32 || count > NTH) {
    fprintf(stderr, "named barrier %d with count %d\n", id, count);
    abort();
  }
  if (bar_arrived[id] == 0) bar_expect[id] = count;
  else if (bar_expect[id] != count) {
    fprintf(stderr, "named barrier %d: counts %d and %d in one generation\n", id, bar_expect[id], count);
    abort();
  }
  if (++bar_arrived[id] == count) {
    bar_arrived[id] = 0;
    for (int t = 0; t < NTH; t++)
      if (th[t].state == 2 && th[t].wait_bar == (uint32_t)id) th[t].state = 0;
  } else if (wait) {
    th[cur].state = 2;
    th[cur].wait_bar = (uint32_t)id;
    yield_();
  }
}
void __syncthreads() { named_bar(0, NTH, 1); }
void kva_bar_sync(int id, int count) { named_bar(id, count, 1); }
void kva_bar_arrive(int id, int count) { named_bar(id, count, 0); }

static MBar &mbar_of(uint32_t bar) {
  auto it = mbars.find(bar);
  if (it == mbars.end()) {
    fprintf(stderr, "mbarrier %u used before init\n", bar);
    abort();
  }
  return it->second;
}
void kva_mbar_init(uint32_t bar, uint32_t count) {
  if (bar & 7) { fprintf(stderr, "mbarrier %u not 8-byte aligned\n", bar); abort(); }
  check_smem(bar, 8);
  mbars[bar] = MBar{(int)count, (int)count, 0, 0};
}
static void mbar_complete_if_done(MBar &b) {
  if (b.pending == 0 && b.tx == 0) {
    b.phase++;
    b.pending = b.count;
  }
}
static void mbar_arrive_at(uint32_t bar) {
  MBar &b = mbar_of(bar);
  if (b.pending <= 0) { fprintf(stderr, "mbarrier %u: arrival past its count\n", bar); abort(); }
  b.pending--;
  mbar_complete_if_done(b);
}
void kva_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  mbar_of(bar).tx += bytes;
  mbar_arrive_at(bar);
}
static void mbar_complete_tx(uint32_t bar, long bytes) {
  MBar &b = mbar_of(bar);
  b.tx -= bytes;
  if (b.tx < 0) { fprintf(stderr, "mbarrier %u: more bytes landed than expected\n", bar); abort(); }
  mbar_complete_if_done(b);
}

/* TMA emulation: the tensor map's bytes hold an EmuMap */
struct EmuMap {
  const unsigned char *base;
  uint64_t dims[3], strides[2];
  uint32_t box[3];
};
static_assert(sizeof(EmuMap) <= sizeof(CUtensorMap), "map fits");
extern "C" kva_status kva_tma_encode_16bit_3d(CUtensorMap *map, const void *base,
                                              const uint64_t dims[3], const uint64_t strides[2],
                                              const uint32_t box[3]) {
  if (((uintptr_t)base & 15) || (strides[0] & 15) || (strides[1] & 15) || box[0] * 2 != 128 ||
      box[1] < 1 || box[2] < 1 || box[1] > 256 || box[2] > 256) {
    fprintf(stderr, "tensor map: bad base, strides or box\n");
    abort();
  }
  EmuMap m;
  m.base = (const unsigned char *)base;
  for (int i = 0; i < 3; i++) m.dims[i] = dims[i], m.box[i] = box[i];
  m.strides[0] = strides[0];
  m.strides[1] = strides[1];
  memset(map, 0, sizeof *map);
  memcpy(map, &m, sizeof m);
  return KVA_OK;
}
/* MLA's maps choose their L2 promotion (a no-op here); the swizzle is 128 */
extern "C" kva_status kva_tma_encode_16bit_3d_opts(CUtensorMap *map, const void *base,
                                                   const uint64_t dims[3],
                                                   const uint64_t strides[2],
                                                   const uint32_t box[3], int swizzle,
                                                   int l2_promotion) {
  if (swizzle != 128 || (l2_promotion != 0 && l2_promotion != 64 && l2_promotion != 128 &&
                         l2_promotion != 256)) {
    fprintf(stderr, "tensor map: the emulator has the 128-byte swizzle only\n");
    abort();
  }
  return kva_tma_encode_16bit_3d(map, base, dims, strides, box);
}
struct TmaOp {
  uint32_t dst, bar;
  EmuMap m;
  int c[3];
  const unsigned char *bulk; /* a 1-D bulk copy (kva_bulk_load) of bulk_bytes, else a box */
  uint32_t bulk_bytes;
};
static std::vector<TmaOp> tma_q;
void kva_tma_load_3d(uint32_t dst, const void *map, int c0, int c1, int c2, uint32_t bar) {
  TmaOp op = {};
  memcpy(&op.m, map, sizeof op.m);
  op.dst = dst;
  op.bar = bar;
  op.c[0] = c0; op.c[1] = c1; op.c[2] = c2;
  const uint32_t bytes = op.m.box[0] * op.m.box[1] * op.m.box[2] * 2;
  if (dst & 1023) { fprintf(stderr, "TMA smem dst %u not 1024-byte aligned\n", dst); abort(); }
  check_smem(dst, (int)bytes);
  if (c0 % 8) { fprintf(stderr, "TMA column %d not 16-byte aligned\n", c0); abort(); }
  mbar_of(bar);
  memset(smem + dst, 0xff, bytes); /* garbage until it lands */
  for (uint32_t a = dst; a < dst + bytes; a += 16) chunk_stamp[a / 16] = 0; /* async proxy */
  tma_q.push_back(op);
}
/* 1-D bulk copy: 16-byte aligned ends and size; lands as a box does */
void kva_bulk_load(uint32_t dst, const void *src, unsigned bytes, uint32_t bar) {
  if ((dst & 15) || ((uintptr_t)src & 15) || (bytes & 15) || bytes == 0) {
    fprintf(stderr, "bulk copy: misaligned (smem %u, %u bytes)\n", dst, bytes);
    abort();
  }
  check_smem(dst, (int)bytes);
  mbar_of(bar);
  TmaOp op = {};
  op.dst = dst;
  op.bar = bar;
  op.bulk = (const unsigned char *)src;
  op.bulk_bytes = bytes;
  memset(smem + dst, 0xff, bytes); /* garbage until it lands */
  for (uint32_t a = dst; a < dst + bytes; a += 16) chunk_stamp[a / 16] = 0; /* async proxy */
  tma_q.push_back(op);
}
static void tma_land(size_t i) {
  const TmaOp op = tma_q[i];
  tma_q.erase(tma_q.begin() + (long)i);
  if (op.bulk) {
    memcpy(smem + op.dst, op.bulk, op.bulk_bytes);
    mbar_complete_tx(op.bar, (long)op.bulk_bytes);
    return;
  }
  const EmuMap &m = op.m;
  for (uint32_t i2 = 0; i2 < m.box[2]; i2++)
    for (uint32_t i1 = 0; i1 < m.box[1]; i1++) {
      const uint32_t r = i2 * m.box[1] + i1, row = op.dst + r * 128;
      const int64_t y = (int64_t)op.c[1] + i1, z = (int64_t)op.c[2] + i2;
      for (uint32_t j = 0; j < 8; j++) {
        const int64_t x = (int64_t)op.c[0] + 8 * j;
        unsigned char *d = smem + row + 16 * (j ^ ((row >> 7) & 7));
        if (x < 0 || x + 8 > (int64_t)m.dims[0] || y < 0 || y >= (int64_t)m.dims[1] || z < 0 ||
            z >= (int64_t)m.dims[2])
          memset(d, 0, 16);
        else
          memcpy(d, m.base + x * 2 + y * m.strides[0] + z * m.strides[1], 16);
      }
    }
  mbar_complete_tx(op.bar, (long)m.box[0] * m.box[1] * m.box[2] * 2);
}
/* A thread's own arrival may be followed at once by its waiters' next
 * steps (on hardware nothing orders them after the arriving thread's
 * later stores): half the time the arriving thread sleeps here for 1 to
 * 64 of the scheduler's sweeps (a waiting warpgroup issues one wgmma a
 * sweep), so that stores wrongly placed after an arrival get caught. */
static uint64_t sweep_no;
void kva_mbar_arrive(uint32_t bar) {
  mbar_arrive_at(bar);
  if (sched_rand() % 2) {
    th[cur].state = 5;
    th[cur].wake_sweep = sweep_no + 1 + sched_rand() % 64;
    yield_();
  }
}
void kva_mbar_arrive_cnt(uint32_t bar, uint32_t count) {
  MBar &b = mbar_of(bar);
  if (count < 1 || b.pending < (int)count) { fprintf(stderr, "mbarrier %u: %u arrivals past its count\n", bar, count); abort(); }
  b.pending -= (int)count;
  mbar_complete_if_done(b);
}
static int mbar_done(uint32_t bar, uint32_t parity) {
  /* the phase of this parity completed: the current phase has the other one */
  return (mbar_of(bar).phase & 1u) != (parity & 1u);
}
void kva_mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_done(bar, parity)) return;
  th[cur].state = 4;
  th[cur].wait_bar = bar;
  th[cur].wait_parity = parity;
  yield_();
}
/* The arrival happens once this thread's copies so far have landed: they
 * (and the arrival) are queued and completed later by the scheduler. */
void kva_cp_async_mbar_arrive_noinc(uint32_t bar) {
  mbar_of(bar);
  AsyncArrive ev;
  ev.bar = bar;
  for (auto &g : th[cur].groups) ev.copies.insert(ev.copies.end(), g.begin(), g.end());
  ev.copies.insert(ev.copies.end(), th[cur].open.begin(), th[cur].open.end());
  th[cur].groups.clear();
  th[cur].open.clear();
  async_q[cur].push_back(ev);
}
static void complete_wait(int w) {
  Warp &W = warps[w];
  compute(W);
  W.count = 0;
  W.deferred = 0;
  for (int l = 0; l < 32; l++)
    if (th[w * 32 + l].state == 1) th[w * 32 + l].state = 0;
}
static void complete_async(int t) {
  AsyncArrive ev = async_q[t].front();
  async_q[t].erase(async_q[t].begin());
  for (const Copy &c : ev.copies) land(c, t);
  mbar_arrive_at(ev.bar);
}
void kva_cp_async_wait_all(void) { /* commit_group + wait_group 0, and the tracked ones */
  while (!async_q[cur].empty()) complete_async(cur);
  kva_cp_async_commit();
  emu_cp_async_wait(0);
}
void kva_fence_proxy_async_smem(void) { th[cur].fence_stamp = emu_clock++; }
void __syncwarp() { collective(OP_SYNCW); }

static uint32_t shfl(uint32_t v, uint32_t s, int op) {
  Warp &W = warps[cur / 32];
  W.in[lane()][0] = v;
  W.in[lane()][1] = s;
  collective(op);
  return W.out[lane()][0];
}
int __shfl_sync(unsigned, int v, int src) { return (int)shfl((uint32_t)v, (uint32_t)src, OP_SHFL); }
float __shfl_sync(unsigned, float v, int src) {
  uint32_t b;
  memcpy(&b, &v, 4);
  b = shfl(b, (uint32_t)src, OP_SHFL);
  memcpy(&v, &b, 4);
  return v;
}
int __shfl_xor_sync(unsigned, int v, int m) { return (int)shfl((uint32_t)v, (uint32_t)m, OP_SHFLX); }
float __shfl_xor_sync(unsigned, float v, int m) {
  uint32_t b;
  memcpy(&b, &v, 4);
  b = shfl(b, (uint32_t)m, OP_SHFLX);
  memcpy(&v, &b, 4);
  return v;
}

int __any_sync(unsigned, int pred) { return (int)shfl((uint32_t)(pred != 0), 0, OP_ANY); }

uint32_t kva_smem_u32(const void *p) { return (uint32_t)((const unsigned char *)p - smem); }

void kva_cp_async_16(uint32_t dst, const void *src, int src_bytes) {
  if (dst & 15) { fprintf(stderr, "cp.async smem dst %u not 16-byte aligned\n", dst); abort(); }
  if (src_bytes != 0 && src_bytes != 16) { fprintf(stderr, "cp.async src-size %d\n", src_bytes); abort(); }
  if (src_bytes && ((uintptr_t)src & 15)) { fprintf(stderr, "cp.async global src not 16-byte aligned\n"); abort(); }
  check_smem(dst, 16);
  for (const auto &mb : mbars)
    if (dst < mb.first + 8 && mb.first < dst + 16) {
      fprintf(stderr, "cp.async into the mbarrier at %u\n", mb.first);
      abort();
    }
  chunk_stamp[dst / 16] = emu_clock++;
  chunk_writer[dst / 16] = cur;
  /* A copy lands any time between its issue and its wait: here either at
   * once (then smem written later by someone else stays overwritten) or at
   * the wait (NaN until then). */
  static uint64_t r = 0x9e3779b97f4a7c15ull;
  r ^= r << 13; r ^= r >> 7; r ^= r << 17;
  if (r & 1) {
    memset(smem + dst, 0, 16);
    if (src_bytes) memcpy(smem + dst, src, (size_t)src_bytes);
    th[cur].open.push_back(Copy{dst, NULL, -1}); /* landed */
  } else {
    memset(smem + dst, 0xff, 16);
    th[cur].open.push_back(Copy{dst, (const unsigned char *)src, src_bytes});
  }
}
void kva_cp_async_commit(void) {
  th[cur].groups.push_back(th[cur].open);
  th[cur].open.clear();
}
static void land(const Copy &c, int writer) {
  if (c.bytes < 0) return; /* landed at its issue */
  memset(smem + c.dst, 0, 16);
  if (c.bytes) memcpy(smem + c.dst, c.src, (size_t)c.bytes);
  chunk_stamp[c.dst / 16] = emu_clock++;
  chunk_writer[c.dst / 16] = writer;
}
void emu_cp_async_wait(int n) {
  Th &t = th[cur];
  if (!async_q[cur].empty() && n == 0) {
    fprintf(stderr, "cp.async.wait_group with mbarrier-tracked copies (use wait_all)\n");
    abort();
  }
  while ((int)t.groups.size() > n) {
    for (const Copy &c : t.groups.front()) land(c, cur);
    t.groups.erase(t.groups.begin());
  }
}

void kva_ldmatrix_x4(uint32_t r[4], uint32_t a) {
  Warp &W = warps[cur / 32];
  W.in[lane()][0] = a;
  collective(OP_LDM);
  memcpy(r, W.out[lane()], 16);
}
void kva_ldmatrix_x4_trans(uint32_t r[4], uint32_t a) {
  Warp &W = warps[cur / 32];
  W.in[lane()][0] = a;
  collective(OP_LDMT);
  memcpy(r, W.out[lane()], 16);
}
void kva_stmatrix_x4_trans(uint32_t a, const uint32_t r[4]) {
  Warp &W = warps[cur / 32];
  W.in[lane()][0] = a;
  memcpy(&W.in[lane()][1], r, 16);
  collective(OP_STMT);
}
static void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, int op) {
  Warp &W = warps[cur / 32];
  uint32_t *in = W.in[lane()];
  memcpy(in, a, 16);
  in[4] = b0;
  in[5] = b1;
  memcpy(&in[6], c, 16);
  collective(op);
  memcpy(c, W.out[lane()], 16);
}
void kva_mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) { mma(c, a, b0, b1, OP_MMA_F16); }
void kva_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) { mma(c, a, b0, b1, OP_MMA_BF16); }
uint32_t kva_pack_f16x2(float lo, float hi) { return kva_f32_to_f16(lo) | ((uint32_t)kva_f32_to_f16(hi) << 16); }
uint32_t kva_pack_bf16x2(float lo, float hi) { return kva_f32_to_bf16(lo) | ((uint32_t)kva_f32_to_bf16(hi) << 16); }
uint32_t kva_cvt_e4m3x2_f16x2(uint16_t x) {
  return kva_f32_to_f16(kva_fp8e4m3_to_f32(x & 0xff)) |
         ((uint32_t)kva_f32_to_f16(kva_fp8e4m3_to_f32(x >> 8)) << 16);
}
uint32_t kva_f16x2_to_bf16x2(uint32_t h) {
  return kva_f32_to_bf16(kva_f16_to_f32(h & 0xffff)) |
         ((uint32_t)kva_f32_to_bf16(kva_f16_to_f32(h >> 16)) << 16);
}
uint32_t kva_tid_x_volatile(void) { return th[cur].idx.x; }

/* ---- CTA runner ---- */
static void (*g_body)(void);
static void entry() {
  g_body();
  if (!th[cur].groups.empty() || !th[cur].open.empty() || !async_q[cur].empty()) {
    /* legal on hardware but the kernel is meant to drain its copies */
    fprintf(stderr, "thread %d exits with cp.async groups pending (%zu groups, %zu open, %zu mbarrier-tracked)\n", cur, th[cur].groups.size(), th[cur].open.size(), async_q[cur].size());
    abort();
  }
  th[cur].state = 3;
}

void emu_run_grid(void (*body)(void), int grid, int nthreads) {
  g_body = body;
  NTH = nthreads;
  emu_gridDim = dim3(grid, 1, 1);
  /* EMU_CTA_ORDER=reverse|shuffle: CTAs in another order than blockIdx (one at
   * a time either way), for kernels whose CTAs share work at run time */
  std::vector<int> cta_order(grid);
  for (int b = 0; b < grid; b++) cta_order[b] = b;
  const char *ord = getenv("EMU_CTA_ORDER");
  if (ord && !strcmp(ord, "reverse")) std::reverse(cta_order.begin(), cta_order.end());
  if (ord && !strcmp(ord, "shuffle"))
    for (int b = grid - 1; b > 0; b--) std::swap(cta_order[b], cta_order[sched_rand() % (b + 1)]);
  for (int bi = 0; bi < grid; bi++) {
    const int b = cta_order[bi];
    emu_blockIdx = dim3(b, 1, 1);
    memset(smem, 0xff, sizeof smem); /* garbage */
    memset(chunk_stamp, 0, sizeof chunk_stamp);
    for (int i = 0; i < NBAR; i++) bar_arrived[i] = 0;
    mbars.clear();
    tma_q.clear();
    for (int w = 0; w < NTH / 32; w++) warps[w].count = warps[w].deferred = 0;
    for (int t = 0; t < NTH; t++) {
      th[t].stack.assign(1 << 18, 0);
      getcontext(&th[t].ctx);
      th[t].ctx.uc_stack.ss_sp = th[t].stack.data();
      th[t].ctx.uc_stack.ss_size = th[t].stack.size();
      th[t].ctx.uc_link = &sched_ctx;
      makecontext(&th[t].ctx, entry, 0);
      th[t].idx = dim3(t, 0, 0);
      th[t].state = 0;
      th[t].groups.clear();
      th[t].open.clear();
      th[t].fence_stamp = 0;
      async_q[t].clear();
    }
    /* Sweeps over the warps in a random order; pending cp.async arrivals
     * and wgmma waits complete at random sweeps (always when nothing else
     * can move), each with a per-CTA random rate: from at once to slower
     * than the consumers' work. */
    const uint32_t async_rate = 1u << (sched_rand() % 8), wait_rate = 1u << (sched_rand() % 4);
    int order[NTH_MAX / 32];
    for (int w = 0; w < NTH / 32; w++) order[w] = w;
    for (;;) {
      int progress = 0, done = 0;
      sweep_no++;
      for (int w = NTH / 32 - 1; w > 0; w--) std::swap(order[w], order[sched_rand() % (w + 1)]);
      for (int t = 0; t < NTH; t++)
        if (!async_q[t].empty() && sched_rand() % async_rate == 0) {
          complete_async(t);
          progress = 1;
        }
      for (size_t i = 0; i < tma_q.size();)
        if (sched_rand() % async_rate == 0) {
          tma_land(i); /* in any order */
          progress = 1;
        } else {
          i++;
        }
      for (int w = 0; w < NTH / 32; w++)
        if (warps[w].deferred && sched_rand() % wait_rate == 0) {
          complete_wait(w);
          progress = 1;
        }
      for (int wi = 0; wi < NTH / 32; wi++)
        for (int l = 0; l < 32; l++) {
          const int t = order[wi] * 32 + l;
          if (th[t].state == 3) { done++; continue; }
          if (th[t].state == 4 && mbar_done(th[t].wait_bar, th[t].wait_parity)) th[t].state = 0;
          if (th[t].state == 5 && sweep_no >= th[t].wake_sweep) th[t].state = 0;
          if (th[t].state != 0) continue;
          cur = t;
          swapcontext(&sched_ctx, &th[t].ctx);
          progress = 1;
        }
      if (done == NTH) break;
      if (!progress) {
        int any = 0;
        for (int t = 0; t < NTH && !any; t++)
          if (!async_q[t].empty()) { complete_async(t); any = 1; }
        if (!any && !tma_q.empty()) { tma_land(sched_rand() % tma_q.size()); any = 1; }
        for (int w = 0; w < NTH / 32 && !any; w++)
          if (warps[w].deferred) { complete_wait(w); any = 1; }
        if (!any) /* only sleepers left: wake them */
          for (int t = 0; t < NTH; t++)
            if (th[t].state == 5) {
              th[t].state = 0;
              any = 1;
            }
        if (!any) {
          fprintf(stderr, "deadlock in CTA %d\n", b);
          for (int t = 0; t < NTH; t += 32)
            fprintf(stderr, "  warp %d: state %d bar %u parity %u\n", t / 32, th[t].state, th[t].wait_bar, th[t].wait_parity);
          abort();
        }
      }
    }
    if (!tma_q.empty()) { fprintf(stderr, "CTA %d exits with TMA loads in flight\n", b); abort(); }
    for (int i = 0; i < NBAR; i++)
      if (bar_arrived[i]) {
        fprintf(stderr, "CTA %d exits with %d arrivals pending on named barrier %d\n", b, bar_arrived[i], i);
        abort();
      }
  }
}

/* Every smem address (one per 16-bit element) a wgmma's operands read,
 * with its place: A's (K-major, from smem; its warp's 16 rows of the
 * 64-row tile, 16 wq..) as visit(0, row, k, a), all of B's as visit(1, k,
 * n, a). B is MN-major (transposed) with A from registers unless flag bit 7
 * (K-major B), and with bit 6 for ss. The one walk that wg_execute reads
 * the operands by and the checks below inspect. */
template <class F> static void wg_walk_operands(Warp &W, const WgOp &op, F visit) {
  const int w = (int)(&W - warps), wq = w & 3, rs = (op.flags >> 1) & 1;
  const int tb = (rs && !((op.flags >> 7) & 1)) || ((op.flags >> 6) & 1);
  const int N = emu_wg_n(op.flags);
  auto field = [](uint64_t d, int sh) { return (uint32_t)(((d >> sh) & 0x3fff) << 4); };
  auto swz = [](uint32_t a) { return a ^ (((a >> 7) & 7) << 4); };
  if (!rs) {
    uint32_t st = field(op.da, 0), sbo = field(op.da, 32);
    for (int i = 0; i < 16; i++) {
      int r = 16 * wq + i;
      for (int k = 0; k < 16; k++) visit(0, i, k, swz(st + (r / 8) * sbo + (r % 8) * 128 + k * 2));
    }
  }
  uint32_t st = field(op.db, 0), lbo = field(op.db, 16), sbo = field(op.db, 32);
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < N; n++)
      visit(1, k, n, swz(tb ? st + (n / 64) * lbo + (n % 64) * 2 + (k / 8) * sbo + (k % 8) * 128
                            : st + (n / 8) * sbo + (n % 8) * 128 + k * 2));
}

static void wg_execute(Warp &W, WgOp &op) {
      /* in[t]: 0..63 acc, 64..67 A regs (rs), 68..69 desc a, 70..71 desc b, 72 flags:
       * bit0 bf16, bit1 A from registers, bit2 scale_d, bits 3-4 n: N = 128 >> n (bit 5: N = 256),
       * bit 6 B MN-major with A from smem (ss), bit 7 B K-major with A from registers,
       * bit 8 N = 248, bit 9 N = 8; 73 warp in group */
      const uint32_t fl = op.flags;
      const int N = emu_wg_n(fl);
      const int bf = fl & 1, rs = (fl >> 1) & 1, scale_d = (fl >> 2) & 1;
      const uint64_t da = op.da, db = op.db;
      for (int t = 0; t < 32; t++) {
        /* A registers are values at the issue (PTX registers are not reused
         * under an in-flight wgmma); the accumulators must be untouched */
        if (!op.chained && memcmp(op.d0[t], op.d[t], N * 2)) {
          fprintf(stderr, "wgmma operand registers changed while the wgmma was in flight\n");
          abort();
        }
      }
      /* plain C++ stores to smem carry no stamps: the bytes themselves must
       * not have changed since the issue (a store that should have come
       * before the issue, or a rewrite while in flight) */
      if (wg_operand_hash(W, op) != op.operand_hash) {
        fprintf(stderr, "wgmma (warp %d) smem operands changed between its issue and completion\n",
                (int)(&W - warps));
        abort();
      }
      auto rd = [&](uint32_t a) {
        check_smem(a, 2);
        if (chunk_stamp[a / 16] > op.issue_stamp) {
          fprintf(stderr, "wgmma operand smem at %u rewritten while the wgmma was in flight\n", a);
          abort();
        }
        uint16_t h; memcpy(&h, smem + a, 2); return h2f(h, bf); };
      if ((db >> 62) != 1 || (!rs && (da >> 62) != 1)) { fprintf(stderr, "wgmma: not 128B swizzle\n"); abort(); }
      float A[16][16], B[16][256];
      if (rs) {
        for (int t = 0; t < 32; t++) {
          int g = t >> 2, q = t & 3;
          const uint32_t *r = op.a0[t];
          A[g][2 * q] = h2f(r[0] & 0xffff, bf); A[g][2 * q + 1] = h2f(r[0] >> 16, bf);
          A[g + 8][2 * q] = h2f(r[1] & 0xffff, bf); A[g + 8][2 * q + 1] = h2f(r[1] >> 16, bf);
          A[g][2 * q + 8] = h2f(r[2] & 0xffff, bf); A[g][2 * q + 9] = h2f(r[2] >> 16, bf);
          A[g + 8][2 * q + 8] = h2f(r[3] & 0xffff, bf); A[g + 8][2 * q + 9] = h2f(r[3] >> 16, bf);
        }
      }
      wg_walk_operands(W, op, [&](int b, int x, int y, uint32_t a) { (b ? B[x][y] : A[x][y]) = rd(a); });
      static float Dout[32][128];
      for (int t = 0; t < 32; t++) {
        int g = t >> 2, q = t & 3;
        for (int j = 0; j < N / 8; j++)
          for (int e = 0; e < 4; e++) {
            int row = g + 8 * (e >> 1), col = 8 * j + 2 * q + (e & 1);
            float sum = scale_d ? op.d[t][4 * j + e] : 0.f;
            for (int k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
            Dout[t][4 * j + e] = sum;
          }
      }
      for (int t = 0; t < 32; t++) memcpy(op.d[t], Dout[t], N * 2);
}

/* Every smem chunk the wgmma reads must have been made visible to the async
 * proxy: a fence.proxy.async by each lane of the issuing warp after the
 * chunk was written, or by the thread that wrote it (then synchronized). */
static void wg_check_visible(Warp &W, const WgOp &op) {
  const int w = (int)(&W - warps);
  uint64_t fence = UINT64_MAX;
  for (int l = 0; l < 32; l++) fence = std::min(fence, th[w * 32 + l].fence_stamp);
  wg_walk_operands(W, op, [&](int, int, int, uint32_t a) {
    const uint64_t st = chunk_stamp[a / 16];
    if (st == 0 || st < fence || th[chunk_writer[a / 16]].fence_stamp > st) return;
    fprintf(stderr, "wgmma (warp %d) reads smem at %u written after the last fence.proxy.async\n", w, a);
    abort();
  });
}

/* FNV-1a over the bytes of smem a wgmma reads */
static uint64_t wg_operand_hash(Warp &W, const WgOp &op) {
  uint64_t h = 1469598103934665603ull;
  wg_walk_operands(W, op, [&](int, int, int, uint32_t a) {
    check_smem(a, 2);
    for (int i = 0; i < 2; i++) h = (h ^ smem[a + i]) * 1099511628211ull;
  });
  return h;
}

static void wg_issue(float d[64], const uint32_t *a, uint64_t da, uint64_t db, uint32_t flags) {
  Warp &W = warps[cur / 32];
  uint32_t *in = W.in[cur & 31];
  memcpy(&in[0], &d, sizeof(float *));
  memcpy(&in[2], &a, sizeof(const uint32_t *));
  in[68] = (uint32_t)da; in[69] = (uint32_t)(da >> 32);
  in[70] = (uint32_t)db; in[71] = (uint32_t)(db >> 32);
  in[72] = flags;
  collective(OP_WG_ISSUE);
}
void kva_wgmma_m64n128k16_ss_bf16(float d[64], uint64_t da, uint64_t db, int scale_d) { wg_issue(d, NULL, da, db, 1u | (scale_d ? 4u : 0u)); }
void kva_wgmma_m64n128k16_ss_f16(float d[64], uint64_t da, uint64_t db, int scale_d) { wg_issue(d, NULL, da, db, scale_d ? 4u : 0u); }
void kva_wgmma_m64n32k16_ss_bf16(float d[16], uint64_t da, uint64_t db, int scale_d) { wg_issue(d, NULL, da, db, 1u | 16u | (scale_d ? 4u : 0u)); }
void kva_wgmma_m64n32k16_ss_f16(float d[16], uint64_t da, uint64_t db, int scale_d) { wg_issue(d, NULL, da, db, 16u | (scale_d ? 4u : 0u)); }
void kva_wgmma_m64n64k16_ss_bf16(float d[32], uint64_t da, uint64_t db, int scale_d) { wg_issue(d, NULL, da, db, 1u | 8u | (scale_d ? 4u : 0u)); }
void kva_wgmma_m64n64k16_ss_f16(float d[32], uint64_t da, uint64_t db, int scale_d) { wg_issue(d, NULL, da, db, 8u | (scale_d ? 4u : 0u)); }
void kva_wgmma_m64n64k16_rs_bf16(float d[32], const uint32_t a[4], uint64_t db, int scale_d) { wg_issue(d, a, 0, db, 1u | 2u | 8u | 128u | (scale_d ? 4u : 0u)); }
void kva_wgmma_m64n64k16_rs_f16(float d[32], const uint32_t a[4], uint64_t db, int scale_d) { wg_issue(d, a, 0, db, 2u | 8u | 128u | (scale_d ? 4u : 0u)); }
void kva_wgmma_m64n248k16_ss_bf16_tb(float d[124], uint64_t da, uint64_t db) { wg_issue(d, NULL, da, db, 1u | 4u | 64u | 256u); }
void kva_wgmma_m64n248k16_ss_f16_tb(float d[124], uint64_t da, uint64_t db) { wg_issue(d, NULL, da, db, 4u | 64u | 256u); }
void kva_wgmma_m64n8k16_ss_bf16_tb(float d[4], uint64_t da, uint64_t db) { wg_issue(d, NULL, da, db, 1u | 4u | 64u | 512u); }
void kva_wgmma_m64n8k16_ss_f16_tb(float d[4], uint64_t da, uint64_t db) { wg_issue(d, NULL, da, db, 4u | 64u | 512u); }
void kva_wgmma_m64n128k16_rs_bf16_tb(float d[64], const uint32_t a[4], uint64_t db) { wg_issue(d, a, 0, db, 1u | 2u | 4u); }
void kva_wgmma_m64n128k16_rs_f16_tb(float d[64], const uint32_t a[4], uint64_t db) { wg_issue(d, a, 0, db, 2u | 4u); }
void kva_wgmma_m64n64k16_rs_bf16_tb(float d[32], const uint32_t a[4], uint64_t db) { wg_issue(d, a, 0, db, 1u | 2u | 4u | 8u); }
void kva_wgmma_m64n64k16_rs_f16_tb(float d[32], const uint32_t a[4], uint64_t db) { wg_issue(d, a, 0, db, 2u | 4u | 8u); }
void kva_wgmma_m64n256k16_rs_bf16_tb(float d[128], const uint32_t a[4], uint64_t db) { wg_issue(d, a, 0, db, 1u | 2u | 4u | 32u); }
void kva_wgmma_m64n256k16_rs_f16_tb(float d[128], const uint32_t a[4], uint64_t db) { wg_issue(d, a, 0, db, 2u | 4u | 32u); }
/* A K-major from smem, B MN-major (bit 6): MLA v5's P V with P in smem */
void kva_wgmma_m64n256k16_ss_bf16_tb(float d[128], uint64_t da, uint64_t db) { wg_issue(d, NULL, da, db, 1u | 4u | 32u | 64u); }
void kva_wgmma_m64n256k16_ss_f16_tb(float d[128], uint64_t da, uint64_t db) { wg_issue(d, NULL, da, db, 4u | 32u | 64u); }
void kva_wgmma_m64n128k16_ss_f16_tb(float d[64], uint64_t da, uint64_t db) { wg_issue(d, NULL, da, db, 4u | 64u); }
/* keys-as-M shapes (MLA v10): N = 16 (bits 3-4 = 3) or 32, A from registers, B K-major */
void kva_wgmma_m64n16k16_rs_f16(float d[8], const uint32_t a[4], uint64_t db, int scale_d) { wg_issue(d, a, 0, db, 2u | 24u | 128u | (scale_d ? 4u : 0u)); }
void kva_wgmma_m64n32k16_rs_f16(float d[16], const uint32_t a[4], uint64_t db, int scale_d) { wg_issue(d, a, 0, db, 2u | 16u | 128u | (scale_d ? 4u : 0u)); }
void kva_wgmma_commit(void) { collective(OP_WG_COMMIT); }
void emu_wgmma_wait(int n) { warps[cur / 32].in[cur & 31][0] = (uint32_t)n; collective(OP_WG_WAIT); }
