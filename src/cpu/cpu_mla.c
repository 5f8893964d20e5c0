/* MLA decode on the CPU (FlashMLA's operation; semantics: docs/design.md).
 *
 * One latent row per token (576 elements) is both K (all of it) and V (its
 * first 512). Every query row of a request (num_new tokens x hq heads, up to
 * 8 x 128) attends together, so each latent block is read from memory once
 * per chunk and reused by all rows from cache (MQA with a group of hq * s_q).
 * Work follows the plan's split-KV schedule exactly as MHA decode does: one
 * thread-pool task per schedule worker; single-chunk requests write O, the
 * others write partial rows (512 floats per head) that a combine step merges
 * by LSE. The AVX2 kernels read the latent in place; the portable path stages
 * each block as dequantized f32. */
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_simd.h"

#define MLA_KEY_BLOCK 32 /* keys per softmax step: 32 bf16 latent rows = 36 KiB */
#define DQK KVA_MLA_HEAD_DIM
#define DV KVA_MLA_V_DIM

/* Scratch of one thread: every query row of one request. Row i is token
 * i / hq, head i % hq. */
typedef struct {
  int nrows;
  float *q, *acc;     /* [nrows][576], [nrows][512] */
  float *m, *l, *lse; /* [nrows] running max, running sum, final LSE */
  float *s;           /* [nrows][MLA_KEY_BLOCK] logits, then probabilities */
  float *kb;          /* [MLA_KEY_BLOCK][576] staged latent (portable path) */
  const float **qp;   /* [nrows] */
  float **ap;         /* [nrows] */
} mla_rows;

typedef struct {
  const kva_plan *plan;
  const void *q;
  void *o;
  float *lse;
  kva_dtype dtype;     /* Q/O */
  kva_dtype kv_t;      /* latent storage */
  int hq, simd, causal, staged, page_size;
  const char *latent;  /* the layer's buffer */
  size_t tok_bytes;    /* bytes of one latent row */
  float ks;            /* fp8 k_scale (1 otherwise): V is the same latent, same scale */
  float qk_scale;      /* sm_scale, times k_scale * 256 when the kernels read fp8 */
  float v_factor;      /* applied to O at the end: k_scale * 256 likewise, else 1 */
  unsigned char *scratch;
  size_t thread_bytes;
} mla_job;

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Carves the rows out of base (base NULL: sizes only); returns the bytes. */
static size_t rows_layout(mla_rows *rs, unsigned char *base, int rows) {
  size_t off = 0;
#define CARVE(field, type, count)                          \
  do {                                                     \
    if (rs) rs->field = (type *)(void *)(base + off);      \
    off += align64((size_t)(count) * sizeof(type));        \
  } while (0)
  CARVE(q, float, (size_t)rows * DQK);
  CARVE(acc, float, (size_t)rows * DV);
  CARVE(m, float, rows);
  CARVE(l, float, rows);
  CARVE(lse, float, rows);
  CARVE(s, float, (size_t)rows * MLA_KEY_BLOCK);
  CARVE(kb, float, (size_t)MLA_KEY_BLOCK * DQK);
  CARVE(qp, const float *, rows);
  CARVE(ap, float *, rows);
#undef CARVE
  return off;
}

size_t kva_cpu_mla_scratch_bytes(int max_rows) { return rows_layout(NULL, NULL, max_rows); }

static void load_rows(const mla_job *jb, mla_rows *rs, int thread, int r) {
  const kva_plan *p = jb->plan;
  rs->nrows = p->num_new[r] * jb->hq;
  rows_layout(rs, jb->scratch + jb->thread_bytes * (size_t)thread, rs->nrows);
  size_t esz = kva_dtype_size(jb->dtype);
  const char *src = (const char *)jb->q + (size_t)p->cu_seqlens_q[r] * jb->hq * DQK * esz;
  for (int i = 0; i < rs->nrows; i++) {
    kva_cpu_row_to_f32(jb->simd, src + (size_t)i * DQK * esz, jb->dtype, DQK, 1.0f,
                       rs->q + (size_t)i * DQK);
    rs->m[i] = -INFINITY;
    rs->l[i] = 0.0f;
    memset(rs->acc + (size_t)i * DV, 0, DV * sizeof(float));
    rs->qp[i] = rs->q + (size_t)i * DQK;
    rs->ap[i] = rs->acc + (size_t)i * DV;
  }
}

/* Online softmax over one block of keys [b0, b0 + nb); token t of the
 * request sees keys <= last_key0 + t (causal) or all of them. Returns 0 if
 * no row saw a key. */
static int softmax_block(const mla_job *jb, mla_rows *rs, int b0, int nb, int last_key0) {
  int any = 0;
  for (int i = 0; i < rs->nrows; i++) {
    float *s = rs->s + (size_t)i * MLA_KEY_BLOCK;
    if (jb->causal) {
      int last = last_key0 + i / jb->hq;
      for (int j = last + 1 - b0 < 0 ? 0 : last + 1 - b0; j < nb; j++) s[j] = -INFINITY;
    }
    any |= kva_cpu_softmax_row(jb->simd, s, nb, &rs->m[i], &rs->l[i], rs->acc + (size_t)i * DV, DV);
  }
  return any;
}

static const char *latent_row(const mla_job *jb, const int32_t *pages, int key) {
  int ps = jb->page_size;
  return jb->latent + ((size_t)pages[key / ps] * ps + (size_t)(key % ps)) * jb->tok_bytes;
}

/* Attention of every row of request r over keys [k0, k1). */
static void attend(const mla_job *jb, mla_rows *rs, int r, int k0, int k1) {
  const kva_plan *p = jb->plan;
  const int32_t *pages = p->page_table + (size_t)r * p->hdr.page_table_stride;
  int last_key0 = p->cache_seqlens[r] - p->num_new[r]; /* the last key token 0 sees */
  /* causal: no row sees beyond the last token's position */
  if (jb->causal && k1 > p->cache_seqlens[r]) k1 = p->cache_seqlens[r];
  const void *rows[MLA_KEY_BLOCK];
  const char *next[MLA_KEY_BLOCK];
  for (int b0 = k0; b0 < k1; b0 += MLA_KEY_BLOCK) {
    int nb = k1 - b0 < MLA_KEY_BLOCK ? k1 - b0 : MLA_KEY_BLOCK;
    for (int j = 0; j < nb; j++) {
      rows[j] = latent_row(jb, pages, b0 + j);
      if (jb->staged) { /* dequantized f32, read by QK (576) and PV (first 512) */
        float *dst = rs->kb + (size_t)j * DQK;
        kva_cpu_row_to_f32(jb->simd, rows[j], jb->kv_t, DQK, jb->ks, dst);
        rows[j] = dst;
      }
    }
    /* the next block streams into L2 while QK runs on this one */
    int n0 = b0 + MLA_KEY_BLOCK, npf = k1 - n0 < MLA_KEY_BLOCK ? k1 - n0 : MLA_KEY_BLOCK;
    if (npf < 0) npf = 0;
    for (int j = 0; j < npf; j++) next[j] = latent_row(jb, pages, n0 + j);
    kva_cpu_prefetch pf = {next, npf, (int)jb->tok_bytes};
    kva_dtype rt = jb->staged ? KVA_F32 : jb->kv_t;
    kva_cpu_qk(jb->simd, rs->nrows, rs->qp, rows, rt, nb, DQK, jb->qk_scale, rs->s,
               MLA_KEY_BLOCK, &pf);
    if (softmax_block(jb, rs, b0, nb, last_key0))
      kva_cpu_pv(jb->simd, rs->nrows, rs->ap, rs->s, MLA_KEY_BLOCK, rows, rt, nb, DV, NULL);
  }
}

/* Normalizes the rows in place (acc) and sets their LSE. */
static void finish_rows(const mla_job *jb, mla_rows *rs) {
  for (int i = 0; i < rs->nrows; i++) {
    float *acc = rs->acc + (size_t)i * DV;
    if (rs->l[i] > 0.0f) {
      kva_cpu_scale(jb->simd, acc, jb->v_factor / rs->l[i], DV);
      rs->lse[i] = rs->m[i] + logf(rs->l[i]);
    } else {
      memset(acc, 0, DV * sizeof(float));
      rs->lse[i] = -INFINITY;
    }
  }
}

static void write_final(const mla_job *jb, const mla_rows *rs, int r) {
  size_t esz = kva_dtype_size(jb->dtype), row0 = (size_t)jb->plan->cu_seqlens_q[r] * jb->hq;
  for (int i = 0; i < rs->nrows; i++) {
    char *dst = (char *)jb->o + (row0 + (size_t)i) * DV * esz;
    const float *acc = rs->acc + (size_t)i * DV;
    if (jb->dtype == KVA_F32)
      memcpy(dst, acc, DV * sizeof(float));
    else
      for (int e = 0; e < DV; e++) kva_store_f32(dst, (size_t)e, jb->dtype, acc[e]);
    if (jb->lse) jb->lse[row0 + (size_t)i] = rs->lse[i];
  }
}

static void decode_task(void *arg, int w, int thread) {
  const mla_job *jb = (const mla_job *)arg;
  const kva_plan *p = jb->plan;
  const kva_split_work *wk = &p->split_schedule[w];
  float *partial_o = (float *)p->partial_o, *partial_lse = (float *)p->partial_lse;
  mla_rows rs;
  for (int wi = wk->begin_req; wi <= wk->end_req; wi++) {
    const int r = p->sched_order[wi]; /* positions in the schedule's order */
    int nsplit = p->split_indptr[r + 1] - p->split_indptr[r];
    if (nsplit == 0) continue; /* no keys */
    const kva_split_chunk ch = kva_split_work_chunk(wk, wi, p->cache_seqlens[r]);
    const int j = ch.split;
    load_rows(jb, &rs, thread, r);
    attend(jb, &rs, r, ch.k0, ch.k1);
    finish_rows(jb, &rs);
    if (nsplit == 1) {
      write_final(jb, &rs, r);
      continue;
    }
    /* split j's rows: split_row_offset[r] + j * num_new + t, hq heads each,
     * so the request's rows i = t * hq + h are contiguous */
    size_t row0 = ((size_t)p->split_row_offset[r] + (size_t)j * p->num_new[r]) * jb->hq;
    memcpy(partial_o + row0 * DV, rs.acc, (size_t)rs.nrows * DV * sizeof(float));
    memcpy(partial_lse + row0, rs.lse, (size_t)rs.nrows * sizeof(float));
  }
}

/* Combine: one task per decode request; those with one chunk have nothing to do. */
static void combine_task(void *arg, int idx, int thread) {
  (void)thread;
  const mla_job *jb = (const mla_job *)arg;
  kva_cpu_combine_request(jb->plan, jb->plan->decode_reqs[idx], jb->hq, DV, jb->o, jb->lse,
                          jb->dtype);
}

kva_status kva_cpu_mla_attention(kva_plan *plan, const kva_pool *pool, int layer,
                                 const kva_attn_params *params, const void *q, void *o,
                                 float *lse, kva_dtype dtype, unsigned char *scratch,
                                 size_t thread_bytes) {
  kva_cpu_state *st = kva_cpu_state_of(plan->ctx);
  int dq = plan->cfg.max_q_tokens < KVA_MAX_DECODE_Q ? plan->cfg.max_q_tokens : KVA_MAX_DECODE_Q;
  if (thread_bytes < kva_cpu_mla_scratch_bytes(dq * plan->cfg.num_qo_heads))
    return kva_set_error(KVA_ERR_INTERNAL, "kva_attention: CPU plan scratch too small for MLA");
  mla_job jb;
  memset(&jb, 0, sizeof(jb));
  jb.plan = plan;
  jb.q = q;
  jb.o = o;
  jb.lse = lse;
  jb.dtype = dtype;
  jb.kv_t = pool->cfg.kv_dtype;
  jb.hq = plan->cfg.num_qo_heads;
  jb.simd = st->simd;
  jb.causal = params->causal != 0;
  jb.staged = !jb.simd;
  jb.page_size = pool->cfg.page_size;
  jb.latent = (const char *)pool->k[layer];
  jb.tok_bytes = (size_t)DQK * kva_dtype_size(jb.kv_t);
  int fp8 = jb.kv_t == KVA_FP8_E4M3, fused_fp8 = fp8 && !jb.staged;
  jb.ks = fp8 ? pool->k_scale[layer] : 1.0f;
  float sm_scale = params->sm_scale > 0.0f ? params->sm_scale : 1.0f / sqrtf((float)DQK);
  jb.qk_scale = sm_scale * (fused_fp8 ? jb.ks * KVA_CPU_FP8_DIV : 1.0f);
  jb.v_factor = fused_fp8 ? jb.ks * KVA_CPU_FP8_DIV : 1.0f;
  jb.scratch = scratch;
  jb.thread_bytes = thread_bytes;
  if (plan->num_decode > 0) {
    kva_threadpool_run(st->pool, plan->cfg.num_workers, decode_task, &jb);
    kva_threadpool_run(st->pool, plan->num_decode, combine_task, &jb);
  }
  return KVA_OK;
}
