/* MLA decode v10: fp8 latents for batches of at most NQ = 16, 32 or 64
 * query rows (q heads x new tokens), with the keys as the wgmma M.
 *
 * Why: v2 and v9 put a row tile of 64 query rows on M, so 16 rows pay for
 * 64 and an fp8 step at 16-32 rows cost as much tensor work as one at 64.
 * H100 (2026-11-27): v2's fp8 ran 1.17 TB/s at 16, 32 and 64 rows alike
 * (0.515 ms, FlashMLA's h16 s_q1 sk8192 row), 1.65 TB/s with its wgmmas
 * compiled out. Here S^T = K Q^T (M = the block's 64 keys, N = NQ rows,
 * K = 576) and O^T += V^T P^T (M = 64 of V's dims, N = NQ rows, K = the
 * 64 keys), so the tensor work follows the rows: at N = 16 a block's
 * S^T and O^T took ~1360 cycles on the probe (bench/wgmma_rate.cu, both
 * operands from smem), under the ~2900 a 36 KB block takes to stream at
 * the copy rate.
 *
 * No 16-bit stage: both products take their A operand from registers,
 * converted (e4m3 -> f16, exact) straight from the bytes, and smem holds
 * Q, P^T and the byte stages. Roles: SW S^T warpgroups, then two O
 * warpgroups (128 (SW + 2) threads). An S warpgroup loads Q (f16, times
 * 2^-8 for a bf16 Q, as v2; its smem rows permuted into the k order of
 * K's fragments), and per block builds S^T's A fragments from K's bytes a
 * column block at a time (rs wgmma), runs the online softmax down S^T's
 * columns (a row's max over the block through smem between its four
 * warps), writes P^T (f16, [NQ rows][64 keys], a K-major B operand) and
 * the rows' factors into one of two buffers and arrives on its `pfull`.
 * With SW = 2 (the default) the two take alternate blocks
 * (mla10_s_chunk). The O warpgroups own O^T's dims (tile c's M rows stand
 * for dims 256 h + 64 wq + 8 g + 2 c and + 1, so one 8-byte load of a key
 * feeds all four tiles): per block they wait for P^T, rescale O^T, build
 * V^T's fragments per key step and issue the four tiles' rs wgmmas, then
 * refill the byte stage NS blocks ahead (one bulk copy per page run; a
 * chunk's rows past its end zeroed) once the S and both O warpgroups
 * read it.
 *
 * Instructions, not the tensor pipe, bound it (ncu, h32 s_q1 sk8192 with
 * two S warpgroups: 49% issue-active, ~1940 instructions a block on each
 * SM sub-partition): the conversion's high halves taken by F2FP's .H1
 * operand (no shift) and unmasked V fragments (zeroed tail rows) took
 * 9-10% off the 32-row rows, and the second S warpgroup 8-10% before
 * them (docs/performance.md, "Thirty-fifth session").
 *
 * H100 (FlashMLA's fp8 h16 s_q1 sk8192 row, v2 0.515 ms): one 16-bit
 * stage converted by the O warpgroups after O^T, S^T after all of it:
 * 0.41 ms; converted under O^T column block by column block: 0.337; K
 * converted in registers by warpgroup 0: 0.261 (the conversion was the
 * chain's largest part, 0.218 ms with it compiled out). See
 * docs/performance.md, "Thirty-third session".
 *
 * At a chunk's end the S warpgroups leave each row's m and l in smem; the O
 * warpgroups put O^T over the byte stages as O's rows (f32; no fill is in
 * flight then), read them back in v2's accumulator layout and run
 * mla_finish_chunk (O, partial rows, the merges), with the byte stages as
 * the merge's scratch. Row
 * tiles are NQ rows (grid.y from the plan's capacity), so any batch is
 * covered; the kernel is picked for fp8 batches of <= 64 rows.
 *
 * NQ = 64 (33-64 rows; before, two tiles of 32 that each read the
 * latents): O^T is 128 accumulators an O thread, so one S warpgroup
 * (setmaxnreg 104 / 200), its running max and rows' last keys in smem;
 * Q is 72 KB, so three byte stages, and a chunk's end puts O's rows over
 * Q's, P^T's and the stages' smem (the S warpgroup waits on `qfree`
 * before the next chunk's Q). H100, 2026-11-27: 7-10% faster than the two
 * tiles on FlashMLA's eight fp8 rows of 64 rows, but still ~0.5 of copy:
 * the one S warpgroup's chain (S^T's conversion and wgmmas, the block
 * max, P^T) takes ~4100 cycles a block of its own, against ~2900 to
 * stream the block (docs/performance.md, "Thirty-sixth session"). */
#ifndef KVA_CUDA_MLA_KERNEL_V10_CUH
#define KVA_CUDA_MLA_KERNEL_V10_CUH

#include "cuda/mla10_parts.cuh"

/* S^T, the softmax and P^T of one chunk, by S warpgroup s of SW. With
 * SW = 2 the S warpgroups take alternate blocks (global block u by
 * warpgroup u % 2), so one's conversion and rs wgmmas run while the
 * other's do: a warpgroup's conversion runs in series with the wgmmas it
 * feeds. The online softmax's running max then passes between them: block
 * u's max of each row goes into mch[u % 2] and mready[u % 2] once it is
 * known (before its exponentials), and block u + 1 takes it from there.
 * Each keeps its row sums against its own last max; the chunk's end adds
 * the two at the chunk's final max. */
template <int QT, int NQ, int SW>
static __device__ __forceinline__ void mla10_s_chunk(const kva_mla_args &a, const mla10_ctx &x,
                                                     const mla10_chunk &c, int s, uint32_t nb,
                                                     uint32_t nc MLA10_PH_PARAM) {
  constexpr int NJ = NQ / 8, BN = KVA_MLA5_BN, NS = KVA_MLA10_STAGES(NQ, SW), TILE8 = KVA_MLA9_TILE8;
  constexpr int QB = NQ * 128, PB = KVA_MLA10_P(NQ), NP = KVA_MLA10_PBUF;
  const int wq = x.wq, g = x.g, tq = x.tq, tw = x.tw;
  const int nblk = c.nblk, k0 = c.ch.k0, k1 = c.ch.k1, cached = c.cached, rows = c.rows;
  /* this warpgroup's barrier, and the S warpgroups' together */
  const int bar_own = s == 0 ? KVA_MLA10_BAR_S : KVA_MLA10_BAR_S1;
  const int bar_all = SW == 1 ? KVA_MLA10_BAR_S : KVA_MLA10_BAR_SS;
  /* the running max in smem (mch, two slots by block parity) rather than
   * registers: between two S warpgroups, and at NQ 64 (registers) */
  constexpr bool MSH = SW == 2 || NQ == 64;
  if (nblk > 0) {
    /* NQ 64: Q's smem was the last chunk's end's scratch (mla10_o_chunk) */
    if (NQ == 64) kva_mbar_wait(x.qfree, (nc & 1u) ^ 1u);
    const unsigned char *qg = (const unsigned char *)a.q;
    for (int i = 128 * s + tw; i < NQ * (KVA_MLA_D / 8); i += 128 * SW) {
      const int row = i / (KVA_MLA_D / 8), cc = i - row * (KVA_MLA_D / 8);
      const int grow = x.row0 + row, ok = grow < rows;
      const int t = grow / a.hq, h = grow - t * a.hq;
      const unsigned char *src =
          ok ? qg + ((int64_t)(c.tok0 + t) * a.hq + h) * (KVA_MLA_D * 2) + cc * 16 : qg;
      kva_cp_async_16(x.s_q + mla_sw<NQ>(row, cc), src, ok ? 16 : 0);
    }
    kva_cp_async_commit();
    kva_cp_async_wait<0>();
    mla_bar_sync(bar_all, 128 * SW); /* every thread's copies landed */
    for (int i = 128 * s + tw; i < NQ * (KVA_MLA_D / 64); i += 128 * SW)
      mla10_q_permute<QT, NQ>(x.p_q, i % NQ, i / NQ);
    kva_fence_proxy_async_smem(); /* Q -> wgmma */
  }
  /* klim: a row's last key (the chunk's end, and its position when
   * causal); at NQ 64 in smem (registers), read on boundary blocks only */
  constexpr bool KLS = NQ == 64;
  if (KLS)
    for (int n = tw; n < NQ; n += 128) {
      const int pos = cached + (x.row0 + n) / a.hq;
      x.klim[n] = a.causal && pos < k1 - 1 ? pos : k1 - 1;
    }
  mla_bar_sync(bar_all, 128 * SW); /* Q (and klim) seen by every warp */
  /* this thread's S^T columns: rows 8 jj + 2 tq + e */
  int klim[NJ][2];
  float mr[NJ][2], lr[NJ][2];
#pragma unroll
  for (int jj = 0; jj < NJ; jj++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int pos = cached + (x.row0 + 8 * jj + 2 * tq + e) / a.hq;
      klim[jj][e] = KLS ? 0 : a.causal && pos < k1 - 1 ? pos : k1 - 1;
      mr[jj][e] = -INFINITY;
      lr[jj][e] = 0.0f;
    }
  const uint64_t dq = mla_desc(x.s_q, 16, 1024);
  /* this lane's P^T row for stmatrix: matrix i = lane / 8 of four, (jj =
   * 2 q + i / 2, hf = i % 2), row r = lane % 8 (P^T row 8 jj + r; keys
   * 16 wq + 8 hf .. + 7, 16-byte run (2 wq + hf) ^ r, swizzled) */
  const int lane = tw & 31;
  const uint32_t p_lane = (uint32_t)((8 * (lane >> 4) + (lane & 7)) * 128 +
                                     (((2 * wq + ((lane >> 3) & 1)) ^ (lane & 7)) << 4));
  for (int j = 0; j < nblk; j++) {
    const uint32_t u = nb + (uint32_t)j, pb = u % NP;
    if (SW == 2 && (int)(u & 1u) != s) continue; /* the other S warpgroup's block */
    const int kt = k0 + j * BN;
    /* S^T's k-steps go round KVA_MLA10_SACC accumulator sets, summed
     * after: at N = 16 or 32 a k-step is a few cycles of math, and one
     * chain of 36 wgmmas on one accumulator waits on each. H100: two
     * sets 0.3-1.4% faster on 11 of FlashMLA's 12 fp8 rows of 16 and
     * 32 (the chain is not what bounds v10); three and four no better */
    constexpr int SA = SW == 2 ? KVA_MLA10_SACC_S2 : NQ == 64 ? KVA_MLA10_SACC64 : KVA_MLA10_SACC;
    float sacc[SA][4 * NJ];
#pragma unroll
    for (int q = 0; q < SA; q++)
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) {
        sacc[q][i] = 0.0f;
        kva_reg_fence_f32(&sacc[q][i]);
      }
    /* S^T: K's bytes converted into A fragments a column block at a
     * time (a register set is rewritten once the wgmmas that read it
     * are over) */
    const uint32_t sb = u % NS;
    MLA10_CLK(t0);
    kva_mbar_wait(x.s_bar + 8 * sb, (u / NS) & 1u); /* the block's bytes */
    MLA10_CLK(tb);
    MLA10_ADD(0, tb, t0);
    const unsigned char *const st8 = x.p_b8 + sb * TILE8;
    constexpr int NK = KVA_MLA10_KSETS(NQ, SW), KG = KVA_MLA10_KGROUP(NQ);
    static_assert(KG >= 1 && NK >= KG, "column blocks a fence");
    uint32_t kf[NK][4][4];
#pragma unroll
    for (int c0 = 0; c0 < 9; c0 += KG) {
#pragma unroll
      for (int cb = c0; cb < c0 + KG && cb < 9; cb++) {
        /* set cb % NK was last read by column block cb - NK: of the
         * groups committed (column blocks < c0), at most NK - 1 - (cb - c0)
         * may still be pending */
        if (cb >= NK) mla10_wgmma_wait_n(NK - 1 - (cb - c0));
        mla10_k_frags(kf[cb % NK], st8, cb, wq, g, tq);
#pragma unroll
        for (int st = 0; st < 4; st++)
#pragma unroll
          for (int i = 0; i < 4; i++) kva_reg_fence_u32(&kf[cb % NK][st][i]);
      }
      kva_wgmma_fence(); /* one a group of column blocks */
#pragma unroll
      for (int cb = c0; cb < c0 + KG && cb < 9; cb++) {
#pragma unroll
        for (int st = 0; st < 4; st++)
          mla10_mma_rs<NQ>(sacc[(4 * cb + st) % SA], kf[cb % NK][st],
                           dq + ((uint32_t)(cb * QB + st * 32) >> 4), 4 * cb + st >= SA);
        kva_wgmma_commit();
      }
    }
    MLA10_CLK(t1);
    MLA10_ADD(1, t1, tb);
    kva_mbar_arrive(x.s_bar + 8 * (NS + sb)); /* this thread's reads of the bytes are over */
    kva_wgmma_wait<0>();
#pragma unroll
    for (int q = 0; q < SA; q++)
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&sacc[q][i]);
#pragma unroll
    for (int q = 1; q < SA; q++)
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) sacc[0][i] += sacc[q][i];
    MLA10_CLK(t2);
    MLA10_ADD(2, t2, t1);
    /* logits (base 2), masked on a chunk's boundary blocks; sacc[0][4 jj +
     * 2 hf + e]: key 16 wq + g + 8 hf, row 8 jj + 2 tq + e */
    const bool need_mask = kt + BN > k1 || (a.causal && kt + BN - 1 > cached);
#pragma unroll
    for (int i = 0; i < 4 * NJ; i++) sacc[0][i] *= x.qk_mul;
    if (need_mask)
#pragma unroll
      for (int jj = 0; jj < NJ; jj++)
#pragma unroll
        for (int i = 0; i < 4; i++) { /* key 16 wq + g + 8 (i >> 1), row 8 jj + 2 tq + (i & 1) */
          const int kl = KLS ? x.klim[8 * jj + 2 * tq + (i & 1)] : klim[jj][i & 1];
          if (kt + 16 * wq + g + 8 * (i >> 1) > kl) sacc[0][4 * jj + i] = -INFINITY;
        }
    float mx[NJ][2];
#pragma unroll
    for (int jj = 0; jj < NJ; jj++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        mx[jj][e] = fmaxf(sacc[0][4 * jj + e], sacc[0][4 * jj + 2 + e]);
        mx[jj][e] = fmaxf(mx[jj][e], __shfl_xor_sync(0xffffffffu, mx[jj][e], 4));
        mx[jj][e] = fmaxf(mx[jj][e], __shfl_xor_sync(0xffffffffu, mx[jj][e], 8));
        mx[jj][e] = fmaxf(mx[jj][e], __shfl_xor_sync(0xffffffffu, mx[jj][e], 16));
      }
    /* the block's max of each row over the four warps' keys (two
     * buffers a warpgroup, alternating over its blocks: a barrier a block
     * keeps them apart) */
    float *const rd = x.red + (2 * s + ((SW == 1 ? u : u >> 1) & 1u)) * 4 * NQ;
    if (g == 0)
#pragma unroll
      for (int jj = 0; jj < NJ; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) rd[wq * NQ + 8 * jj + 2 * tq + e] = mx[jj][e];
    mla_bar_sync(bar_own, 128);
    MLA10_CLK(t3);
    MLA10_ADD(3, t3, t2);
    /* the running max after the block before (SW = 2: the other S
     * warpgroup's, published before its exponentials) */
    if (SW == 2 && j > 0) kva_mbar_wait(x.mready + 8 * ((u - 1u) & 1u), ((u - 1u) >> 1) & 1u);
    float mp[NJ][2], mn[NJ][2];
#pragma unroll
    for (int jj = 0; jj < NJ; jj++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int n = 8 * jj + 2 * tq + e;
        const float bm = fmaxf(fmaxf(rd[n], rd[NQ + n]), fmaxf(rd[2 * NQ + n], rd[3 * NQ + n]));
        mp[jj][e] = !MSH ? mr[jj][e] : j > 0 ? x.mch[((u - 1u) & 1u) * NQ + n] : -INFINITY;
        mn[jj][e] = kva_online_max(mp[jj][e], bm);
        if (MSH && wq == 0 && g == 0) x.mch[(u & 1u) * NQ + n] = mn[jj][e];
      }
    if (SW == 2) kva_mbar_arrive(x.mready + 8 * (u & 1u)); /* block u's max published */
    /* P^T's buffer: the O warpgroups' O^T of block u - NP is over */
    kva_mbar_wait(x.pempty + 8 * pb, ((u / NP) & 1u) ^ 1u);
    MLA10_CLK(t4);
    MLA10_ADD(4, t4, t3);
    /* P^T as f16 pairs of two rows (8 jj + 2 tq, + 1) of one key (16 wq + g
     * + 8 hf): an mma fragment of the 8 x 8 matrix (jj, hf), which
     * stmatrix .trans stores as the rows' 16-byte runs of eight keys, four
     * matrices an instruction (NQ / 32 a thread; NQ / 2 two-byte stores
     * before. H100, 2026-11-27, 2 samples: 0.1-1.0% faster on 10 of
     * FlashMLA's 12 fp8 rows of 16-32 rows, -0.7 to +1.2% at 64) */
    uint32_t pr[NJ][2];
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
      float pv[2][2]; /* [e][hf] */
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int n = 8 * jj + 2 * tq + e;
        const float mu = mn[jj][e] == -INFINITY ? 0.0f : mn[jj][e]; /* all masked so far: p = 0 */
        const float cf = kva_ex2(mp[jj][e] - mu); /* O's factor */
        /* the row sums' factor: against this warpgroup's own last max */
        const float cl = SW == 1 ? cf : kva_ex2(mr[jj][e] - mu);
        mr[jj][e] = mn[jj][e];
        pv[e][0] = kva_ex2(sacc[0][4 * jj + e] - mu);     /* key 16 wq + g */
        pv[e][1] = kva_ex2(sacc[0][4 * jj + 2 + e] - mu); /* key 16 wq + g + 8 */
        lr[jj][e] = lr[jj][e] * cl + pv[e][0] + pv[e][1];
        if (wq == 0 && g == 0) x.cst[pb * NQ + n] = cf;
      }
#pragma unroll
      for (int hf = 0; hf < 2; hf++) pr[jj][hf] = kva_pack_f16x2(pv[0][hf], pv[1][hf]);
    }
#pragma unroll
    for (int q = 0; q < NJ / 2; q++) {
      const uint32_t r4[4] = {pr[2 * q][0], pr[2 * q][1], pr[2 * q + 1][0], pr[2 * q + 1][1]};
      kva_stmatrix_x4_trans(x.s_p + pb * PB + p_lane + q * 2048u, r4);
    }
    kva_fence_proxy_async_smem(); /* P^T -> the O warpgroups' wgmma */
    kva_mbar_arrive(x.pfull + 8 * pb);
    MLA10_ADD(5, clock64(), t4);
    MLA10_BLOCK();
  }
  /* the chunk's end: each row's m and l (l over the lanes and warps) */
#pragma unroll
  for (int jj = 0; jj < NJ; jj++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      lr[jj][e] += __shfl_xor_sync(0xffffffffu, lr[jj][e], 4);
      lr[jj][e] += __shfl_xor_sync(0xffffffffu, lr[jj][e], 8);
      lr[jj][e] += __shfl_xor_sync(0xffffffffu, lr[jj][e], 16);
    }
  if (SW == 1) {
    kva_mbar_wait(x.sempty, (nc & 1u) ^ 1u); /* the last chunk's m, l taken */
    float *const rl = x.red + ((nb + (uint32_t)nblk) & 1u) * 4 * NQ;
    if (g == 0)
#pragma unroll
      for (int jj = 0; jj < NJ; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int n = 8 * jj + 2 * tq + e;
          rl[wq * NQ + n] = lr[jj][e];
          if (wq == 0) /* wq 0, g 0 wrote mch (MSH) */
            x.sm[n] = !MSH ? mr[jj][e]
                      : nblk > 0 ? x.mch[((nb + (uint32_t)nblk - 1u) & 1u) * NQ + n]
                                 : -INFINITY;
        }
    mla_bar_sync(KVA_MLA10_BAR_S, 128);
    if (tw < NQ) x.sl[tw] = rl[tw] + rl[NQ + tw] + rl[2 * NQ + tw] + rl[3 * NQ + tw];
    mla_bar_sync(KVA_MLA10_BAR_S, 128); /* rl read before the next block writes it */
    kva_mbar_arrive(x.sfull);
  } else {
    /* the chunk's final max (the last block's, published by whichever
     * warpgroup ran it), each warpgroup's sums brought to it */
    const uint32_t ul = nb + (uint32_t)nblk - 1u;
    if (nblk > 0) kva_mbar_wait(x.mready + 8 * (ul & 1u), (ul >> 1) & 1u);
    if (s == 0) kva_mbar_wait(x.sempty, (nc & 1u) ^ 1u); /* the last chunk's m, l taken */
    if (g == 0)
#pragma unroll
      for (int jj = 0; jj < NJ; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int n = 8 * jj + 2 * tq + e;
          const float mf = nblk > 0 ? x.mch[(ul & 1u) * NQ + n] : -INFINITY;
          const float mu = mf == -INFINITY ? 0.0f : mf;
          x.rlb[(4 * s + wq) * NQ + n] = lr[jj][e] * kva_ex2(mr[jj][e] - mu);
          if (s == 0 && wq == 0) x.sm[n] = mf;
        }
    mla_bar_sync(KVA_MLA10_BAR_SS, 256);
    if (s == 0 && tw < NQ) {
      float l = 0.0f;
#pragma unroll
      for (int w = 0; w < 8; w++) l += x.rlb[w * NQ + tw];
      x.sl[tw] = l;
    }
    mla_bar_sync(KVA_MLA10_BAR_SS, 256); /* rlb and Q read before the next chunk's */
    if (s == 0) kva_mbar_arrive(x.sfull);
  }
}

/* O^T of one chunk by the O warpgroups (h: which), then its end. */
template <int QT, int NQ, int SW>
static __device__ __forceinline__ void mla10_o_chunk(const kva_mla_args &a, const mla10_ctx &x,
                                                     const mla10_chunk &c, uint32_t nb,
                                                     uint32_t nc MLA10_PH_PARAM) {
  constexpr int NJ = NQ / 8, BN = KVA_MLA5_BN, NS = KVA_MLA10_STAGES(NQ, SW), TILE8 = KVA_MLA9_TILE8;
  constexpr int PB = KVA_MLA10_P(NQ), NP = KVA_MLA10_PBUF;
  constexpr int OROW = KVA_MLA_DV + 4; /* O's rows over the byte stages at a chunk's end */
  const int wq = x.wq, g = x.g, tq = x.tq;
  const int h = x.wg - SW, ct = x.tid - 128 * SW;
  const int r = c.r, nsplit = c.nsplit, nblk = c.nblk, k0 = c.ch.k0, k1 = c.ch.k1;
  float ot[4][4 * NJ];
#pragma unroll
  for (int cc = 0; cc < 4; cc++)
#pragma unroll
    for (int i = 0; i < 4 * NJ; i++) ot[cc][i] = 0.0f;
#pragma unroll 1
  for (int b = 0; b < NS && b < nblk; b++)
    mla10_fill<NS, false>(x.p_b8, x.s_b8, x.s_bar, nb + (uint32_t)b, x.kvg, c.pt, 0, k0 + b * BN,
                          k1, a, ct);
  const uint64_t dp = mla_desc(x.s_p, 16, 1024);
  for (int j = 0; j < nblk; j++) {
    const uint32_t u = nb + (uint32_t)j, pb = u % NP, sb = u % NS;
    const int kt = k0 + j * BN;
    /* the refill's page-table entry, read a block ahead of its use (its
     * load sat in the refill, ~740 cycles a block at 64 rows. H100,
     * 2026-11-27, 2 calls: the uniform fp8 rows of 16-32 rows 0.9-2.4%
     * faster, their varlen rows 0-1.6% slower, 64 rows level) */
    const int32_t fpage = j + NS < nblk ? mla9_fill_page(c.pt, kt + NS * BN, k1, a, ct) : 0;
    MLA10_CLK(t0);
    kva_mbar_wait(x.s_bar + 8 * sb, (u / NS) & 1u); /* the block's bytes */
    MLA10_CLK(t1);
    MLA10_ADD(6, t1, t0);
    kva_mbar_wait(x.pfull + 8 * pb, (u / NP) & 1u); /* P^T and the factors */
    MLA10_CLK(t2);
    MLA10_ADD(7, t2, t1);
    float cf[NJ][2];
    bool moved = false;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        cf[jj][e] = x.cst[pb * NQ + 8 * jj + 2 * tq + e];
        moved |= cf[jj][e] != 1.0f;
      }
    if (__any_sync(0xffffffffu, moved))
#pragma unroll
      for (int cc = 0; cc < 4; cc++)
#pragma unroll
        for (int jj = 0; jj < NJ; jj++)
#pragma unroll
          for (int i = 0; i < 4; i++) ot[cc][4 * jj + i] *= cf[jj][i & 1];
#pragma unroll
    for (int cc = 0; cc < 4; cc++)
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&ot[cc][i]);
    /* O^T += V^T P^T: per key step the four tiles' A fragments from the
     * bytes (KVA_MLA10_VSETS sets: a set is rewritten once the wgmmas
     * that read it are over) */
    const unsigned char *const st8 = x.p_b8 + sb * TILE8;
    constexpr int NV = KVA_MLA10_VSETS(NQ), VG = KVA_MLA10_VGROUP(NQ); /* key steps a fence */
    static_assert(VG >= 1 && NV % VG == 0 && 4 % VG == 0, "key steps a wgmma.fence");
    uint32_t vf[NV][4][4];
#pragma unroll
    for (int s0 = 0; s0 < 4; s0 += VG) {
#pragma unroll
      for (int st = s0; st < s0 + VG; st++) {
        if (st >= NV) mla10_wgmma_wait_n(NV - 1 - (st - s0)); /* as S^T's sets */
        mla10_v_frags(vf[st % NV], st8, st, h, wq, g, tq);
#pragma unroll
        for (int cc = 0; cc < 4; cc++)
#pragma unroll
          for (int i = 0; i < 4; i++) kva_reg_fence_u32(&vf[st % NV][cc][i]);
      }
      kva_wgmma_fence();
#pragma unroll
      for (int st = s0; st < s0 + VG; st++) {
#pragma unroll
        for (int cc = 0; cc < 4; cc++)
          mla10_mma_rs<NQ>(ot[cc], vf[st % NV][cc], dp + ((uint32_t)(pb * PB + st * 32) >> 4), 1);
        kva_wgmma_commit();
      }
    }
    MLA10_CLK(t3);
    MLA10_ADD(8, t3, t2);
    kva_mbar_arrive(x.s_bar + 8 * (NS + sb)); /* this thread's reads of the bytes are over */
    kva_wgmma_wait<0>();
#pragma unroll
    for (int cc = 0; cc < 4; cc++)
#pragma unroll
      for (int i = 0; i < 4 * NJ; i++) kva_reg_fence_f32(&ot[cc][i]);
    MLA10_CLK(t4);
    MLA10_ADD(9, t4, t3);
    kva_mbar_arrive(x.pempty + 8 * pb); /* P^T read (every warp's arrival after its wait) */
    if (j + NS < nblk)
      mla10_fill<NS, true>(x.p_b8, x.s_b8, x.s_bar, u + NS, x.kvg, c.pt, fpage, kt + NS * BN, k1,
                           a, ct);
    MLA10_ADD(10, clock64(), t4);
  }
  /* ---- the chunk's end ---- */
  kva_mbar_wait(x.sfull, nc & 1u);
  float m2[2], lt[2];
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int lrow = 16 * wq + g + 8 * hf;
    m2[hf] = lrow < NQ ? x.sm[lrow] : -INFINITY;
    lt[hf] = lrow < NQ ? x.sl[lrow] : 0.0f;
  }
  kva_mbar_arrive(x.sempty);
  mla_bar_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS); /* both O^T's are over */
  /* O's rows [NQ][OROW] and the merge's scratch: the byte stages (no fill
   * is in flight), at NQ 64 with Q's and P^T's smem before them (the S
   * warpgroup waits for qfree before the next chunk's Q) */
  unsigned char *const scr = NQ == 64 ? x.p_q : x.p_b8;
  const size_t scr_bytes = (size_t)KVA_MLA10_END_SCRATCH(NQ, NS);
  float *const orows = (float *)scr;
#pragma unroll
  for (int cc = 0; cc < 4; cc++)
#pragma unroll
    for (int jj = 0; jj < NJ; jj++)
#pragma unroll
      for (int i = 0; i < 4; i++)
        orows[(8 * jj + 2 * tq + (i & 1)) * OROW + 256 * h + 64 * wq + 8 * g + 2 * cc + (i >> 1)] =
            ot[cc][4 * jj + i];
  if (nsplit == 2 && ct == 0) *x.flag = mla_known_last(a, r, c.ch.split);
  mla_bar_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS); /* O's rows and the flag written */
  float o[2][64];
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {
    const int lrow = 16 * wq + g + 8 * hf;
#pragma unroll
    for (int hh = 0; hh < 2; hh++)
#pragma unroll
      for (int j16 = 0; j16 < 16; j16++) {
        float2 v = make_float2(0.0f, 0.0f);
        if (lrow < NQ)
          v = *(const float2 *)(orows + lrow * OROW + 256 * h + 128 * hh + 8 * j16 + 2 * tq);
        o[hh][4 * j16 + 2 * hf] = v.x;
        o[hh][4 * j16 + 2 * hf + 1] = v.y;
      }
  }
  const int known_last = nsplit == 2 && *x.flag;
  mla_bar_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS); /* O's rows read: the stages are scratch */
  mla_finish_chunk<QT, false, KVA_MLA10_BAR_O>(a, o, lt, m2, r, c.ch.split, nsplit, known_last,
                                               c.nt, c.tok0, x.row0, c.rows, ct, h, wq, g, tq,
                                               x.flag, (float *)scr, scr_bytes);
  /* the merge's scratch (generic writes) before the next bulk copies;
   * O's rows read before the next conversion */
  kva_fence_proxy_async_smem();
  mla_bar_sync(KVA_MLA10_BAR_O, KVA_MLA_THREADS);
  if (NQ == 64) kva_mbar_arrive(x.qfree); /* Q's and P^T's smem free again */
}

template <int QT, int NQ, int SW>
__global__ void __launch_bounds__(KVA_MLA10_THREADS(SW), 1)
    kva_mla_kernel_v10(const __grid_constant__ kva_mla_args a) {
  constexpr int TILE8 = KVA_MLA9_TILE8, NS = KVA_MLA10_STAGES(NQ, SW);
  constexpr int PB = KVA_MLA10_P(NQ), NP = KVA_MLA10_PBUF;
  constexpr int CT = KVA_F16; /* the tensor cores' type (fp8 latents) */
  /* misc smem: red [SW][2][4][NQ], cst [NP][NQ], sm, sl [NQ]; SW = 2: mch
   * [2][NQ], rlb [2][4][NQ]; NQ = 64: mch, klim [NQ]; then the mbarriers
   * and the flag */
  constexpr int NF = 8 * NQ * SW + (NP + 2) * NQ + (SW == 2 ? 10 * NQ : NQ == 64 ? 3 * NQ : 0);
  constexpr int NBAR = 2 * NS + 2 * NP + 2 + (SW == 2 ? 2 : 0) + (NQ == 64 ? 1 : 0);
  static_assert(NQ == 16 || NQ == 32 || NQ == 64, "N of the keys-as-M wgmmas");
  static_assert(SW == 1 || SW == 2, "one or two S warpgroups");
  static_assert(NQ != 64 || SW == 1, "64 rows: one S warpgroup");
  static_assert(KVA_MLA10_SMEM_SW(NQ, SW) <= 232448, "227 KB of smem per CTA");
  static_assert(NQ * (KVA_MLA_DV + 4) * 4 <= KVA_MLA10_END_SCRATCH(NQ, NS),
                "O's rows fit the chunk end's scratch");
  static_assert(NQ < 64 || NQ * KVA_MLA_MERGE_ROW * 4 <= KVA_MLA10_END_SCRATCH(NQ, NS),
                "the merge before the write fits the scratch");
  static_assert(NF * 4 + 8 * NBAR + 8 <= KVA_MLA10_MISC(NQ, SW), "misc smem");
  extern __shared__ __align__(1024) unsigned char smem[];
  mla10_ctx x;
  const uint32_t s_raw = kva_smem_u32(smem);
  x.s_q = (s_raw + 1023u) & ~1023u;
  x.p_q = smem + (x.s_q - s_raw);
  x.s_p = x.s_q + KVA_MLA10_Q(NQ);
  x.s_b8 = x.s_p + NP * PB;
  x.p_p = x.p_q + KVA_MLA10_Q(NQ);
  x.p_b8 = x.p_p + NP * PB;
  x.red = (float *)(x.p_b8 + NS * TILE8);
  x.cst = x.red + 8 * NQ * SW;
  x.sm = x.cst + NP * NQ;
  x.sl = x.sm + NQ;
  x.mch = x.sl + NQ;
  x.rlb = x.mch + 2 * NQ;
  x.klim = (int *)(x.mch + 2 * NQ); /* NQ 64 (SW 1: no rlb) */
  /* mbarriers: byte stage full 0..NS-1 (the O threads' fills), empty
   * NS..2NS-1 (read by an S warpgroup's S^T and the O warpgroups' O^T);
   * then pfull x NP, pempty x NP, stats full, stats empty; SW = 2: mready x 2 */
  x.s_bar = x.s_b8 + NS * TILE8 + NF * 4;
  x.pfull = x.s_bar + 8 * (2 * NS);
  x.pempty = x.pfull + 8 * NP;
  x.sfull = x.pempty + 8 * NP;
  x.sempty = x.sfull + 8;
  x.mready = x.sempty + 8;
  x.qfree = x.sempty + 8 + (SW == 2 ? 16 : 0); /* NQ 64 */
  x.flag = (volatile int *)(x.p_b8 + NS * TILE8 + NF * 4 + 8 * NBAR);

  x.tid = threadIdx.x;
  const int lane = x.tid & 31, warp = x.tid >> 5;
  x.wg = mla_uni(warp >> 2);
  x.wq = warp & 3;
  x.g = lane >> 2;
  x.tq = lane & 3;
  x.tw = x.tid & 127;
  const kva_plan_header *hdr = a.hdr;
  kva_griddep_launch_dependents();
  x.row0 = (int)blockIdx.y * NQ;
  if ((int)blockIdx.x >= hdr->num_workers || x.row0 >= hdr->max_q_len * a.hq) return;
  const kva_split_work wk = a.sched[blockIdx.x];
  if (a.prefetch_keys > 0 && blockIdx.y == 0 && x.tid == 0)
    mla_prefetch_first<1>(a, wk, a.prefetch_keys);
  if (x.tid == 0) {
    /* empty: an S warpgroup's 128 and the O threads'; pfull, stats full
     * and mready: one S warpgroup's; full, pempty, stats empty and qfree:
     * the O threads' */
#pragma unroll 1
    for (int i = 0; i < NBAR; i++) {
      const uint32_t b = x.s_bar + 8 * i;
      const bool s128 =
          (b >= x.pfull && b < x.pempty) || b == x.sfull || (SW == 2 && b >= x.mready);
      kva_mbar_init(b, i >= NS && i < 2 * NS ? 128 + KVA_MLA_THREADS
                       : s128                ? 128
                                             : KVA_MLA_THREADS);
    }
  }
  __syncthreads(); /* the inits are seen by every thread */
  /* Q, the latents and the outputs belong to the kernels before (PDL) */
  kva_griddep_wait();
  x.kvg = (const unsigned char *)a.kv;
  x.qk_mul = CT != QT ? a.qk_mul * (float)(1 << KVA_FP8_Q_SHIFT) : a.qk_mul;
#ifdef KVA_MLA10_PHASES
  unsigned long long ph[KVA_TRACE_WORDS] = {0};
#define MLA10_PH , ph
#else
#define MLA10_PH
#endif

  uint32_t nb = 0, nc = 0; /* blocks and chunks so far: the barriers' phases */
  if (SW == 1 && NQ != 64) {
    for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
      mla10_chunk c;
      if (!mla10_chunk_at<NQ>(a, wk, wi, x.row0, &c)) continue;
      if (x.wg == 0)
        mla10_s_chunk<QT, NQ, SW>(a, x, c, 0, nb, nc MLA10_PH);
      else
        mla10_o_chunk<QT, NQ, SW>(a, x, c, nb, nc MLA10_PH);
      nb += (uint32_t)c.nblk;
      nc++;
    }
  } else if (x.wg < SW) {
    /* registers from the S warpgroups to the O warpgroups (a zero sum) */
    kva_setmaxnreg_dec<NQ == 64 ? KVA_MLA10_N64_SREGS : KVA_MLA10_S2_SREGS>();
    for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
      mla10_chunk c;
      if (!mla10_chunk_at<NQ>(a, wk, wi, x.row0, &c)) continue;
      mla10_s_chunk<QT, NQ, SW>(a, x, c, x.wg, nb, nc MLA10_PH);
      nb += (uint32_t)c.nblk;
      nc++;
    }
  } else {
    kva_setmaxnreg_inc<NQ == 64 ? KVA_MLA10_N64_OREGS : KVA_MLA10_S2_OREGS>();
    for (int wi = wk.begin_req; wi <= wk.end_req; wi++) {
      mla10_chunk c;
      if (!mla10_chunk_at<NQ>(a, wk, wi, x.row0, &c)) continue;
      mla10_o_chunk<QT, NQ, SW>(a, x, c, nb, nc MLA10_PH);
      nb += (uint32_t)c.nblk;
      nc++;
    }
  }
#undef MLA10_PH
#ifdef KVA_MLA10_PHASES
  /* words 0-5 and 11 by the first S thread, 6-10 by the first O thread */
  if (a.trace && (x.tid == 0 || x.tid == 128 * SW)) {
    unsigned long long *w =
        a.trace + ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * KVA_TRACE_WORDS;
    for (int k = 0; k < KVA_TRACE_WORDS; k++)
      if ((x.tid == 0) == (k < 6 || k == 11)) w[k] = ph[k];
  }
#endif
}

#endif /* KVA_CUDA_MLA_KERNEL_V10_CUH */
