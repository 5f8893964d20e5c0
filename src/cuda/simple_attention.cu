/* CUDA-core attention, the correctness-first fallback: one warp per (query
 * token, q head), keys looped with an online softmax, lanes splitting the
 * head dim. Covers every feature the tensor-core kernels do not: f32 Q/O,
 * head dims any multiple of 8 up to 256 and MLA's 576/512, Q and KV of different 16-bit
 * types, GQA/MQA of any group, page sizes 1..256, f16/bf16/fp8 KV, causal
 * with prefix, sliding window, soft-cap, LSE. which = 0 runs the plan's
 * decode requests, 1 its extend requests. The grid comes from the plan's
 * capacity and counts are read from the device header, so the launch is
 * valid under CUDA-graph replay. */
#include <math.h>
#include <stdint.h>

#include "core/dtype.h"
#include "cuda/cuda_internal.h"

#define WARPS_PER_BLOCK 4
#define MAX_LANE_ELEMS (KVA_MLA_HEAD_DIM / 32) /* MLA: 576 Q/K dims */

typedef struct {
  const kva_plan_header *hdr;
  const int32_t *cu_seqlens_q, *cache_seqlens, *num_new, *q_req, *page_table;
  const void *q, *k, *v;
  void *o;
  float *lse;
  kva_dtype dtype, kv_dtype;
  int hq, hkv, d, dv, page_size; /* dv: V/O dims (MLA: 512 of the 576-dim latent) */
  float sm_scale, softcap, k_scale, v_scale;
  int causal, window_left;
  int which; /* 0: decode requests' tokens, 1: extend requests', 2: all */
} simple_args;

__global__ void __launch_bounds__(WARPS_PER_BLOCK * 32)
simple_attention_kernel(simple_args a) {
  int lane = threadIdx.x & 31;
  long long warp = (long long)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
  int total_q = a.hdr->total_q;
  if (warp >= (long long)total_q * a.hq) return;
  int tok = (int)(warp / a.hq), h = (int)(warp % a.hq);
  int r = a.q_req[tok];
  int is_decode = a.num_new[r] <= KVA_MAX_DECODE_Q;
  if ((a.which == 0 && !is_decode) || (a.which == 1 && is_decode)) return;
  int kv_len = a.cache_seqlens[r];
  int pos = kv_len - a.num_new[r] + (tok - a.cu_seqlens_q[r]);
  int kvh = h / (a.hq / a.hkv), d = a.d, ps = a.page_size;
  int fp8 = a.kv_dtype == KVA_FP8_E4M3;
  float qv[MAX_LANE_ELEMS], acc[MAX_LANE_ELEMS];
#pragma unroll
  for (int i = 0; i < MAX_LANE_ELEMS; i++) {
    int e = lane + 32 * i;
    qv[i] = e < d ? kva_load_f32(a.q, ((size_t)tok * a.hq + h) * d + e, a.dtype) : 0.0f;
    acc[i] = 0.0f;
  }
  int lo = 0, hi = a.causal ? pos + 1 : kv_len;
  if (a.window_left >= 0 && pos - a.window_left > lo) lo = pos - a.window_left;
  const int32_t *pages = a.page_table + (size_t)r * a.hdr->page_table_stride;
  float m = -INFINITY, l = 0.0f;
  for (int j = lo; j < hi; j++) {
    size_t row = (((size_t)pages[j / ps] * ps + j % ps) * a.hkv + kvh) * d;
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_LANE_ELEMS; i++) {
      int e = lane + 32 * i;
      if (e < d) part += qv[i] * kva_load_f32(a.k, row + e, a.kv_dtype);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
    float x = part * (fp8 ? a.k_scale : 1.0f) * a.sm_scale;
    if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
    float mnew = fmaxf(m, x), corr = expf(m - mnew), p = expf(x - mnew);
    l = l * corr + p;
    m = mnew;
#pragma unroll
    for (int i = 0; i < MAX_LANE_ELEMS; i++) {
      int e = lane + 32 * i;
      float vv = e < a.dv ? kva_load_f32(a.v, row + e, a.kv_dtype) * (fp8 ? a.v_scale : 1.0f) : 0.0f;
      acc[i] = acc[i] * corr + p * vv;
    }
  }
  float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < MAX_LANE_ELEMS; i++) {
    int e = lane + 32 * i;
    if (e < a.dv) kva_store_f32(a.o, ((size_t)tok * a.hq + h) * a.dv + e, a.dtype, acc[i] * inv);
  }
  if (a.lse && lane == 0) a.lse[(size_t)tok * a.hq + h] = l > 0.0f ? m + logf(l) : -INFINITY;
}

extern "C" kva_status kva_cuda_simple_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                                const kva_attn_params *params, const void *q,
                                                void *o, float *lse, kva_dtype dtype, int which) {
  kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  simple_args a;
  a.hdr = cp->d_hdr;
  a.cu_seqlens_q = cp->d_cu_seqlens_q;
  a.cache_seqlens = cp->d_cache_seqlens;
  a.num_new = cp->d_num_new;
  a.q_req = cp->d_q_req;
  a.page_table = cp->d_page_table;
  a.q = q;
  a.k = pool->k[layer];
  const int mla = pool->cfg.layout == KVA_LAYOUT_MLA; /* V = the latent's first 512 dims */
  a.v = mla ? pool->k[layer] : pool->v[layer];
  a.o = o;
  a.lse = lse;
  a.dtype = dtype;
  a.kv_dtype = pool->cfg.kv_dtype;
  a.hq = plan->cfg.num_qo_heads;
  a.hkv = pool->cfg.num_kv_heads;
  a.d = pool->cfg.head_dim;
  a.dv = mla ? KVA_MLA_V_DIM : a.d;
  a.page_size = pool->cfg.page_size;
  a.sm_scale = params->sm_scale > 0.0f ? params->sm_scale : 1.0f / sqrtf((float)a.d);
  a.softcap = params->logit_softcap;
  a.k_scale = pool->k_scale[layer];
  a.v_scale = mla ? pool->k_scale[layer] : pool->v_scale[layer];
  a.causal = params->causal != 0;
  a.window_left = params->window_left < 0 ? -1 : params->window_left;
  a.which = which;
  long long warps = (long long)plan->cfg.max_q_tokens * a.hq; /* capacity, not the batch */
  unsigned blocks = (unsigned)((warps + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK);
  simple_attention_kernel<<<blocks, WARPS_PER_BLOCK * 32, 0, kva_cuda_state_of(plan->ctx)->stream>>>(a);
  KVA_CUDA_LAUNCH_CHECK("simple_attention_kernel");
  return KVA_OK;
}
