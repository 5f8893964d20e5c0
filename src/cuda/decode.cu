/* Decode path: the plan's decode requests on the split-KV tensor-core kernel
 * (decode_kernel.cuh, launched per head dim by decode_dN.cu), which also
 * merges the chunks of split requests (the last chunk to finish does it).
 * The grid's x comes from the plan's capacity (num_workers). Its row tiles
 * come from the batch's longest decode request in an eager launch, and from
 * the capacity in one being captured or made for a graph state, so that the
 * same launch replays any batch the graph may get. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda/decode_kernel.cuh"

/* Row tiles: MT m16 tiles per CTA; more rows than that (MQA, or many q
 * tokens) become extra row groups on grid.y, each re-reading the KV. An
 * eager launch sizes them for the batch: with group x tokens <= 16 rows the
 * MT = 1 kernel (H200, 2026-11-29, 32:8 heads, one new token, against MT = 2
 * for the capacity's 8 tokens: fp8 KV 20-21% less time at B=64-256
 * L=4096, bf16 6-9% less at B=64 L=2048 and 4-5% at B=128 L=4096). */
static int dec_mt(int d, int rows) { return d <= 128 && rows > 16 ? 2 : 1; }

static void dec_shape(kva_plan *plan, int d, cudaStream_t s, int *mt, int *row_groups) {
  const int group = plan->cfg.num_qo_heads / plan->pool->cfg.num_kv_heads;
  int max_q = plan->decode_q_cap;
  if (plan->cfg.max_q_tokens < max_q) max_q = plan->cfg.max_q_tokens;
  if (!plan->graph_mode) {
    if (kva_cuda_maybe_capturing(s)) /* the batches it replays: workers for this kernel */
      plan->decode_q_floor = max_q;
    else if (plan->max_decode_q >= 1 && plan->max_decode_q < max_q)
      max_q = plan->max_decode_q;
  }
  const int rows_cap = group * max_q;
  *mt = dec_mt(d, rows_cap);
  *row_groups = (rows_cap + 16 * *mt - 1) / (16 * *mt);
}

static int dec_smem(int d, int kv8, int mt) {
  if (d == 64) return kv8 ? (mt == 2 ? KVA_DEC_SMEM(64, 1, 2) : KVA_DEC_SMEM(64, 1, 1))
                          : (mt == 2 ? KVA_DEC_SMEM(64, 0, 2) : KVA_DEC_SMEM(64, 0, 1));
  if (d == 128) return kv8 ? (mt == 2 ? KVA_DEC_SMEM(128, 1, 2) : KVA_DEC_SMEM(128, 1, 1))
                           : (mt == 2 ? KVA_DEC_SMEM(128, 0, 2) : KVA_DEC_SMEM(128, 0, 1));
  return kv8 ? KVA_DEC_SMEM(256, 1, 1) : KVA_DEC_SMEM(256, 0, 1);
}

/* CTAs an SM of the kernel for `rows` query rows a kv head (group x new
 * tokens): the decode grid's workers (cuda_default_workers). Head dims
 * without a tensor-core kernel keep two (one above 128). */
extern "C" int kva_cuda_decode_ctas_per_sm(int head_dim, int kv8, int rows) {
  if (head_dim != 64 && head_dim != 128) kv8 = 0;
  return KVA_DEC_CTAS_PER_SM(head_dim, kv8, dec_mt(head_dim, rows));
}

/* KVA_ERR_UNSUPPORTED (no message) where the tensor-core kernel does not
 * apply: the caller runs the CUDA-core kernel instead. */
extern "C" kva_status kva_cuda_decode_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                                const kva_attn_params *params, const void *q,
                                                void *o, float *lse, kva_dtype dtype) {
  const kva_pool_config *pc = &pool->cfg;
  const int d = pc->head_dim, kv8 = pc->kv_dtype == KVA_FP8_E4M3;
  if (pc->layout != KVA_LAYOUT_MHA || (d != 64 && d != 128 && d != 256)) return KVA_ERR_UNSUPPORTED;
  if (dtype != KVA_F16 && dtype != KVA_BF16) return KVA_ERR_UNSUPPORTED;
  if (!kv8 && pc->kv_dtype != dtype) return KVA_ERR_UNSUPPORTED; /* mma operands share a type */
  if ((((uintptr_t)q) | ((uintptr_t)o)) & 15u) return KVA_ERR_UNSUPPORTED; /* 16-byte rows */
  const kva_cuda_state *cs = kva_cuda_state_of(plan->ctx);
  int mt, row_groups;
  dec_shape(plan, d, cs->stream, &mt, &row_groups);
  if (dec_smem(d, kv8, mt) > cs->max_smem_optin) return KVA_ERR_UNSUPPORTED;
  const int64_t gy = (int64_t)pc->num_kv_heads * row_groups;
  if (gy > 65535 || plan->cfg.num_qo_heads > 65535) return KVA_ERR_UNSUPPORTED; /* grid.y */
  if (gy > plan->cfg.num_qo_heads) return KVA_ERR_UNSUPPORTED; /* split_sem rows (never: rg <= group) */

  const kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  kva_dec_args a;
  memset(&a, 0, sizeof a);
  a.hdr = cp->d_hdr;
  a.sched = cp->d_split_schedule;
  a.split_indptr = cp->d_split_indptr;
  a.split_row_offset = cp->d_split_row_offset;
  a.cu_q = cp->d_cu_seqlens_q;
  a.cache_seqlens = cp->d_cache_seqlens;
  a.num_new = cp->d_num_new;
  a.page_table = cp->d_page_table;
  a.decode_reqs = cp->d_decode_reqs;
  a.q = q;
  a.o = o;
  a.lse = lse;
  a.part_o = (float *)plan->partial_o;
  a.part_lse = (float *)plan->partial_lse;
  a.split_sem = cp->d_split_sem;
  a.tile_claim = cp->d_tile_claim;
  a.deterministic = plan->cfg.deterministic;
  a.k = pool->k[layer];
  a.v = pool->v[layer];
  KVA_CUDA_FILL_ATTN_ARGS(a, plan, pool, layer, params);
  a.trace = kva_trace_next((long long)plan->cfg.num_workers * gy);

  const unsigned gx = (unsigned)plan->cfg.num_workers;
  kva_status st;
  switch (d) {
    case 64: st = kva_dec_launch_d64(&a, dtype, kv8, mt, gx, (unsigned)gy, cs->stream); break;
    case 128: st = kva_dec_launch_d128(&a, dtype, kv8, mt, gx, (unsigned)gy, cs->stream); break;
    default: st = kva_dec_launch_d256(&a, dtype, kv8, mt, gx, (unsigned)gy, cs->stream); break;
  }
  return st;
}
