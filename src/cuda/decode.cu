/* Split-KV decode on CUDA cores. A persistent grid of (worker, kv head) CTAs
 * walks the plan's split schedule (FlashMLA's tile scheduler metadata); all
 * query rows of a request that share a kv head (group x q tokens) are
 * processed together so each K/V byte is read once. In a 32-key tile a lane
 * owns a key for Q.K (16-byte loads, many in flight) and a slice of the head
 * dim for P.V (coalesced rows); the CTA's 4 warps take interleaved tiles and
 * merge at the end. Requests split over several workers write partial
 * (O, LSE) rows that combine_kernel merges; others write O directly. */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "core/dtype.h"
#include "cuda/cuda_internal.h"

#define DEC_WARPS 4
#define TILE 32

typedef struct {
  const kva_plan_header *hdr;
  const kva_split_work *sched;
  const int32_t *split_indptr, *split_row_offset, *cu_seqlens_q, *cache_seqlens, *num_new,
      *page_table;
  const void *q, *k, *v;
  void *o;
  float *lse, *part_o, *part_lse;
  kva_dtype dtype, kv_dtype;
  int hq, hkv, page_size;
  float softcap, v_scale;
  float sm_scale_k;                   /* sm_scale (* k_scale): logits before soft-cap */
  int causal, window_left;
} dec_args;

__device__ __forceinline__ float fp8_to_f32(uint32_t b) {
  uint32_t mag = b & 0x7fu;
  float f = mag >= 8u ? __half2float(__ushort_as_half((unsigned short)((mag << 7) + (8u << 10))))
                      : (float)mag * (1.0f / 512.0f);
  if (mag == 0x7fu) f = __int_as_float(0x7fc00000);
  return (b & 0x80u) ? -f : f;
}

/* two 16-bit KV elements packed in a word, as f32 */
__device__ __forceinline__ void cvt2(uint32_t w, kva_dtype t, float *out) {
  if (t == KVA_BF16) {
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xffff0000u);
  } else {
    out[0] = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
    out[1] = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
  }
}

/* 8 consecutive KV elements as f32 */
__device__ __forceinline__ void load8(const void *base, size_t elem, kva_dtype t, float *out) {
  if (t == KVA_FP8_E4M3) {
    uint2 u = *(const uint2 *)((const uint8_t *)base + elem);
#pragma unroll
    for (int i = 0; i < 4; i++) out[i] = fp8_to_f32((u.x >> (8 * i)) & 0xffu);
#pragma unroll
    for (int i = 0; i < 4; i++) out[4 + i] = fp8_to_f32((u.y >> (8 * i)) & 0xffu);
  } else {
    uint4 u = *(const uint4 *)((const uint16_t *)base + elem);
    cvt2(u.x, t, out);
    cvt2(u.y, t, out + 2);
    cvt2(u.z, t, out + 4);
    cvt2(u.w, t, out + 6);
  }
}

/* 4 consecutive KV elements as f32 (8-byte or 4-byte load) */
__device__ __forceinline__ void load4(const void *base, size_t elem, kva_dtype t, float *out) {
  if (t == KVA_FP8_E4M3) {
    uint32_t u = *(const uint32_t *)((const uint8_t *)base + elem);
#pragma unroll
    for (int i = 0; i < 4; i++) out[i] = fp8_to_f32((u >> (8 * i)) & 0xffu);
  } else {
    uint2 u = *(const uint2 *)((const uint16_t *)base + elem);
    cvt2(u.x, t, out);
    cvt2(u.y, t, out + 2);
  }
}

template <int D, int ROWS>
__global__ void __launch_bounds__(DEC_WARPS * 32) decode_split_kernel(dec_args a) {
  constexpr int PER_LANE = D / 32; /* head-dim slice of a lane in P.V */
  extern __shared__ float smem[];
  float *q_s = smem;                         /* [ROWS][D] */
  float *p_s = q_s + ROWS * D;               /* [DEC_WARPS][ROWS][TILE] */
  float *m_s = p_s + DEC_WARPS * ROWS * TILE; /* [DEC_WARPS][ROWS] */
  float *l_s = m_s + DEC_WARPS * ROWS;       /* [DEC_WARPS][ROWS] */
  float *o_s = l_s + DEC_WARPS * ROWS;       /* [DEC_WARPS][ROWS][D] */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvh = blockIdx.y, group = a.hq / a.hkv;
  if (blockIdx.x >= (unsigned)a.hdr->num_workers) return;
  const kva_split_work wk = a.sched[blockIdx.x];
  for (int r = wk.begin_req; r <= wk.end_req; r++) {
    int nsplit = a.split_indptr[r + 1] - a.split_indptr[r];
    if (nsplit == 0) continue; /* extend request: not ours */
    const int k0 = r == wk.begin_req ? wk.begin_pos : 0;
    const int k1 = r == wk.end_req ? wk.end_pos : a.cache_seqlens[r];
    const int split = r == wk.begin_req ? wk.begin_split : 0;
    const int nt = a.num_new[r], rows = nt * group, cached = a.cache_seqlens[r] - nt;
    const int tok0 = a.cu_seqlens_q[r];
    const int32_t *pages = a.page_table + (size_t)r * a.hdr->page_table_stride;
    __syncthreads(); /* smem of the previous request is free */
    for (int i = threadIdx.x; i < ROWS * D; i += blockDim.x) {
      int row = i / D, e = i % D;
      float x = 0.0f;
      if (row < rows) {
        int t = row / group, h = kvh * group + row % group;
        x = kva_load_f32(a.q, ((size_t)(tok0 + t) * a.hq + h) * D + e, a.dtype);
      }
      q_s[i] = x;
    }
    __syncthreads();
    float m[ROWS], l[ROWS], acc[ROWS][PER_LANE];
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
      m[i] = -INFINITY;
      l[i] = 0.0f;
#pragma unroll
      for (int e = 0; e < PER_LANE; e++) acc[i][e] = 0.0f;
    }
    float *p_w = p_s + warp * ROWS * TILE;
    for (int kt = k0 + warp * TILE; kt < k1; kt += DEC_WARPS * TILE) {
      /* Q.K: lane owns key kt + lane */
      const int key = kt + lane;
      const bool kin = key < k1;
      float s[ROWS];
#pragma unroll
      for (int i = 0; i < ROWS; i++) s[i] = 0.0f;
      size_t krow = 0;
      if (kin) krow = (((size_t)pages[key / a.page_size] * a.page_size + key % a.page_size) * a.hkv + kvh) * D;
      if (kin) {
#pragma unroll 4
        for (int e = 0; e < D; e += 8) {
          float kv[8];
          load8(a.k, krow + e, a.kv_dtype, kv);
#pragma unroll
          for (int i = 0; i < ROWS; i++) {
            const float4 qa = *(const float4 *)(q_s + i * D + e);
            const float4 qb = *(const float4 *)(q_s + i * D + e + 4);
            s[i] += qa.x * kv[0] + qa.y * kv[1] + qa.z * kv[2] + qa.w * kv[3] + qb.x * kv[4] +
                    qb.y * kv[5] + qb.z * kv[6] + qb.w * kv[7];
          }
        }
      }
      /* mask, soft-cap, online softmax (base 2) */
#pragma unroll
      for (int i = 0; i < ROWS; i++) {
        float x = -INFINITY;
        if (i < rows && kin) {
          int pos = cached + i / group;
          bool vis = (!a.causal || key <= pos) && (a.window_left < 0 || key >= pos - a.window_left);
          if (vis) {
            float lg = s[i] * a.sm_scale_k;
            if (a.softcap > 0.0f) lg = a.softcap * tanhf(lg / a.softcap);
            x = lg * 1.4426950408889634f;
          }
        }
        float mx = x;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        float mnew = fmaxf(m[i], mx);
        float corr = mnew == -INFINITY ? 1.0f : exp2f(m[i] - mnew);
        float p = x == -INFINITY ? 0.0f : exp2f(x - mnew);
        m[i] = mnew;
        l[i] = l[i] * corr + p; /* per-lane partial sum */
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) acc[i][e] *= corr;
        p_w[i * TILE + lane] = p;
      }
      __syncwarp();
      /* P.V: lane owns dims lane*PER_LANE .. +PER_LANE of each key's row */
      const int nk = k1 - kt < TILE ? k1 - kt : TILE;
#pragma unroll 8
      for (int j = 0; j < nk; j++) {
        const int kj = kt + j;
        const size_t vrow = (((size_t)pages[kj / a.page_size] * a.page_size + kj % a.page_size) * a.hkv + kvh) * D +
                            (size_t)lane * PER_LANE;
        float vv[PER_LANE];
        if (PER_LANE == 8) {
          load8(a.v, vrow, a.kv_dtype, vv);
        } else if (PER_LANE == 4) {
          load4(a.v, vrow, a.kv_dtype, vv);
        } else {
#pragma unroll
          for (int e = 0; e < PER_LANE; e++) vv[e] = kva_load_f32(a.v, vrow + e, a.kv_dtype);
        }
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
          float p = p_w[i * TILE + j];
#pragma unroll
          for (int e = 0; e < PER_LANE; e++) acc[i][e] += p * vv[e];
        }
      }
      __syncwarp();
    }
    /* merge the 4 warps: per row, m and l over lanes then warps */
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
      float li = l[i];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) li += __shfl_xor_sync(0xffffffffu, li, off);
      if (lane == 0) {
        m_s[warp * ROWS + i] = m[i];
        l_s[warp * ROWS + i] = li;
      }
#pragma unroll
      for (int e = 0; e < PER_LANE; e++) o_s[(warp * ROWS + i) * D + lane * PER_LANE + e] = acc[i][e];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
      int i = idx / D, e = idx % D;
      float mt = -INFINITY;
      for (int w = 0; w < DEC_WARPS; w++) mt = fmaxf(mt, m_s[w * ROWS + i]);
      float lt = 0.0f, ot = 0.0f;
      for (int w = 0; w < DEC_WARPS; w++) {
        float mw = m_s[w * ROWS + i];
        float c = mw == -INFINITY ? 0.0f : exp2f(mw - mt);
        lt += l_s[w * ROWS + i] * c;
        ot += o_s[(w * ROWS + i) * D + e] * c;
      }
      float out = lt > 0.0f ? ot / lt * a.v_scale : 0.0f; /* fp8: V's scale, once */
      float lse = lt > 0.0f ? (mt + log2f(lt)) * 0.6931471805599453f : -INFINITY;
      int t = i / group, h = kvh * group + i % group;
      if (nsplit == 1) {
        kva_store_f32(a.o, ((size_t)(tok0 + t) * a.hq + h) * D + e, a.dtype, out);
        if (a.lse && e == 0) a.lse[(size_t)(tok0 + t) * a.hq + h] = lse;
      } else {
        size_t prow = (size_t)a.split_row_offset[r] + (size_t)split * nt + t;
        a.part_o[(prow * a.hq + h) * D + e] = out;
        if (e == 0) a.part_lse[prow * a.hq + h] = lse;
      }
    }
  }
}

/* One warp per (decode request, q token, q head) of a split request. */
__global__ void combine_kernel(dec_args a, const int32_t *decode_reqs, int d) {
  const int lane = threadIdx.x & 31;
  long long wid = (long long)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  long long per_req = (long long)KVA_MAX_DECODE_Q * a.hq;
  int idx = (int)(wid / per_req), rem = (int)(wid % per_req);
  if (idx >= a.hdr->num_requests - a.hdr->num_extend) return;
  int r = decode_reqs[idx], t = rem / a.hq, h = rem % a.hq;
  int nsplit = a.split_indptr[r + 1] - a.split_indptr[r], nt = a.num_new[r];
  if (nsplit <= 1 || t >= nt) return;
  size_t row0 = (size_t)a.split_row_offset[r] + t;
  float mt = -INFINITY;
  for (int j = 0; j < nsplit; j++) mt = fmaxf(mt, a.part_lse[(row0 + (size_t)j * nt) * a.hq + h]);
  float wsum = 0.0f;
  for (int j = 0; j < nsplit; j++) {
    float s = a.part_lse[(row0 + (size_t)j * nt) * a.hq + h];
    wsum += s == -INFINITY ? 0.0f : expf(s - mt);
  }
  size_t tok = (size_t)a.cu_seqlens_q[r] + t;
  for (int e = lane; e < d; e += 32) {
    float acc = 0.0f;
    for (int j = 0; j < nsplit; j++) {
      size_t prow = row0 + (size_t)j * nt;
      float s = a.part_lse[prow * a.hq + h];
      if (s != -INFINITY) acc += expf(s - mt) * a.part_o[(prow * a.hq + h) * d + e];
    }
    kva_store_f32(a.o, (tok * a.hq + h) * d + e, a.dtype, wsum > 0.0f ? acc / wsum : 0.0f);
  }
  if (a.lse && lane == 0) a.lse[tok * a.hq + h] = wsum > 0.0f ? mt + logf(wsum) : -INFINITY;
}

template <int D, int ROWS>
static kva_status launch(const dec_args &a, kva_plan *plan, cudaStream_t s) {
  size_t smem = sizeof(float) * ((size_t)ROWS * D + DEC_WARPS * ROWS * TILE + 2 * DEC_WARPS * ROWS +
                                 (size_t)DEC_WARPS * ROWS * D);
  KVA_CUDA_TRY(cudaFuncSetAttribute(decode_split_kernel<D, ROWS>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  dim3 grid((unsigned)plan->cfg.num_workers, (unsigned)a.hkv);
  decode_split_kernel<D, ROWS><<<grid, DEC_WARPS * 32, smem, s>>>(a);
  KVA_CUDA_LAUNCH_CHECK("decode_split_kernel");
  return KVA_OK;
}

/* Fast path when the head dim is 64/128/256 and the group's rows fit the
 * register tile; returns KVA_ERR_UNSUPPORTED otherwise (caller falls back). */
extern "C" kva_status kva_cuda_decode_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                                const kva_attn_params *params, const void *q,
                                                void *o, float *lse, kva_dtype dtype) {
  int d = pool->cfg.head_dim, group = plan->cfg.num_qo_heads / pool->cfg.num_kv_heads;
  /* decode requests have <= 8 tokens; graph mode sizes for the capacity */
  int max_q = plan->graph_mode || plan->hdr.max_q_len > KVA_MAX_DECODE_Q ? KVA_MAX_DECODE_Q
                                                                          : plan->hdr.max_q_len;
  int max_rows = group * max_q;
  kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  dec_args a;
  a.hdr = cp->d_hdr;
  a.sched = cp->d_split_schedule;
  a.split_indptr = cp->d_split_indptr;
  a.split_row_offset = cp->d_split_row_offset;
  a.cu_seqlens_q = cp->d_cu_seqlens_q;
  a.cache_seqlens = cp->d_cache_seqlens;
  a.num_new = cp->d_num_new;
  a.page_table = cp->d_page_table;
  a.q = q;
  a.k = pool->k[layer];
  a.v = pool->v[layer];
  a.o = o;
  a.lse = lse;
  a.part_o = (float *)plan->partial_o;
  a.part_lse = (float *)plan->partial_lse;
  a.dtype = dtype;
  a.kv_dtype = pool->cfg.kv_dtype;
  a.hq = plan->cfg.num_qo_heads;
  a.hkv = pool->cfg.num_kv_heads;
  a.page_size = pool->cfg.page_size;
  float sm = params->sm_scale > 0.0f ? params->sm_scale : 1.0f / sqrtf((float)d);
  float ks = pool->cfg.kv_dtype == KVA_FP8_E4M3 ? pool->k_scale[layer] : 1.0f;
  a.sm_scale_k = sm * ks;
  a.softcap = params->logit_softcap;
  a.v_scale = pool->cfg.kv_dtype == KVA_FP8_E4M3 ? pool->v_scale[layer] : 1.0f;
  a.causal = params->causal != 0;
  a.window_left = params->window_left < 0 ? -1 : params->window_left;
  cudaStream_t s = kva_cuda_state_of(plan->ctx)->stream;
  kva_status st = KVA_ERR_UNSUPPORTED;
  if (d == 128 && max_rows <= 4) st = launch<128, 4>(a, plan, s);
  else if (d == 128 && max_rows <= 8) st = launch<128, 8>(a, plan, s);
  else if (d == 128 && max_rows <= 16) st = launch<128, 16>(a, plan, s);
  else if (d == 64 && max_rows <= 8) st = launch<64, 8>(a, plan, s);
  else if (d == 64 && max_rows <= 32) st = launch<64, 32>(a, plan, s);
  else if (d == 256 && max_rows <= 4) st = launch<256, 4>(a, plan, s);
  else if (d == 256 && max_rows <= 8) st = launch<256, 8>(a, plan, s);
  if (st != KVA_OK) return st;
  int warps_per_block = 4;
  long long warps = (long long)plan->cfg.max_batch * KVA_MAX_DECODE_Q * a.hq;
  combine_kernel<<<(unsigned)((warps + warps_per_block - 1) / warps_per_block), warps_per_block * 32, 0, s>>>(
      a, cp->d_decode_reqs, d);
  KVA_CUDA_LAUNCH_CHECK("combine_kernel");
  return KVA_OK;
}
