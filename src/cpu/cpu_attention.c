/* CPU attention over the paged cache (semantics: docs/design.md).
 *
 * Decode requests follow the plan's split-KV schedule: one thread-pool task
 * per schedule worker, each running its chunks with every query row of the
 * request (all q heads, all new tokens) so that each K/V row is read once per
 * chunk; single-chunk requests write O, the others partial rows that a
 * combine step merges. Extend requests run as tasks over (request, kv head,
 * chunk of query tokens). Both use one loop: blocks of keys, QK over the rows
 * of each kv head, online softmax, then PV. The AVX2 kernels read K/V in place
 * (converting in registers; fp8 scales folded into the QK scale and the final
 * O factor); the portable path converts each head's rows of a block to f32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_simd.h"

#define KEY_BLOCK 32         /* keys per softmax step (64 was slower: L1) */
#define EXTEND_ROWS 64       /* target query rows (tokens x group) of an extend task */
#define EXTEND_MAX_TOKENS 32
#define PREFETCH_BLOCKS 1    /* how far ahead the kernels prefetch, in key blocks */

/* Scratch of one thread: the query rows of one task and their state. */
typedef struct {
  int nrows, per_head;    /* rows in all, rows per kv head */
  int kvh0, nkvh;         /* kv heads covered */
  float *q, *acc;         /* [nrows][d] */
  float *m, *l, *lse;     /* [nrows] running max, running sum, final LSE */
  float *s;               /* [nrows][KEY_BLOCK] logits, then probabilities */
  float *kb, *vb;         /* [KEY_BLOCK][d] staged f32 K/V of one head */
  const float **qp;       /* [nrows] */
  float **ap;             /* [nrows] */
  int *qpos, *tok, *head; /* [nrows] absolute position, token within request, q head */
} rowset;

/* plan->backend_plan */
typedef struct {
  int max_rows, d;
  size_t thread_bytes;
  int num_threads;
  unsigned char *scratch;   /* [num_threads][thread_bytes] */
  int32_t *ext_task_start;  /* [max_batch + 1] first task of each extend request */
} cpu_plan;

typedef struct {
  const kva_plan *plan;
  const kva_pool *pool;
  const cpu_plan *cp;
  kva_attn_params params; /* sm_scale resolved */
  const void *q;
  void *o;
  float *lse;
  kva_dtype dtype;
  int hq, hkv, group, d, simd, ext_tokens;
  kva_dtype kv_t;
  const char *kbuf, *vbuf;
  float ks, vs;             /* fp8 dequantization scales (1 otherwise) */
  float qk_scale;           /* sm_scale, times k_scale * 256 when kernels read fp8 */
  float v_factor;           /* applied to O at the end: v_scale * 256 likewise, else 1 */
  size_t tok_bytes, head_bytes;
  int staged;               /* portable path: rows to f32 (dequantized) before the kernels */
} job;

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Carves a rowset for rows x d out of base; returns the bytes used. */
static size_t rowset_layout(rowset *rs, unsigned char *base, int rows, int d) {
  size_t off = 0, fr = (size_t)rows * d, fb = (size_t)KEY_BLOCK * d;
#define CARVE(field, type, count)                          \
  do {                                                     \
    if (rs) rs->field = (type *)(void *)(base + off);      \
    off += align64((size_t)(count) * sizeof(type));        \
  } while (0)
  CARVE(q, float, fr);
  CARVE(acc, float, fr);
  CARVE(m, float, rows);
  CARVE(l, float, rows);
  CARVE(lse, float, rows);
  CARVE(s, float, (size_t)rows * KEY_BLOCK);
  CARVE(kb, float, fb);
  CARVE(vb, float, fb);
  CARVE(qp, const float *, rows);
  CARVE(ap, float *, rows);
  CARVE(qpos, int, rows);
  CARVE(tok, int, rows);
  CARVE(head, int, rows);
#undef CARVE
  return off;
}

static int extend_tokens(int group) {
  int t = EXTEND_ROWS / group;
  return t < 1 ? 1 : t > EXTEND_MAX_TOKENS ? EXTEND_MAX_TOKENS : t;
}

kva_status kva_cpu_plan_init(kva_plan *plan) {
  const kva_pool *pool = plan->pool;
  cpu_plan *cp = (cpu_plan *)calloc(1, sizeof(*cp));
  if (!cp) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_plan_create: out of host memory");
  int hq = plan->cfg.num_qo_heads, hkv = pool->cfg.num_kv_heads, group = hq / hkv;
  int dq = plan->cfg.max_q_tokens < KVA_MAX_DECODE_Q ? plan->cfg.max_q_tokens : KVA_MAX_DECODE_Q;
  int ext = extend_tokens(group) * group;
  cp->max_rows = dq * hq > ext ? dq * hq : ext;
  cp->d = pool->cfg.head_dim;
  cp->num_threads = kva_threadpool_size(kva_cpu_state_of(plan->ctx)->pool);
  cp->thread_bytes = rowset_layout(NULL, NULL, cp->max_rows, cp->d);
  if (pool->cfg.layout == KVA_LAYOUT_MLA) { /* decode only: every q head of <= 8 tokens */
    cp->max_rows = dq * hq;
    cp->thread_bytes = kva_cpu_mla_scratch_bytes(cp->max_rows);
  }
  cp->scratch = (unsigned char *)aligned_alloc(64, cp->thread_bytes * (size_t)cp->num_threads);
  cp->ext_task_start = (int32_t *)calloc((size_t)plan->cfg.max_batch + 1, sizeof(int32_t));
  if (!cp->scratch || !cp->ext_task_start) {
    size_t bytes = cp->thread_bytes;
    int threads = cp->num_threads;
    free(cp->scratch);
    free(cp->ext_task_start);
    free(cp);
    return kva_set_error(KVA_ERR_OUT_OF_MEMORY,
                         "kva_plan_create: cannot allocate CPU attention scratch (%zu bytes x %d "
                         "threads)",
                         bytes, threads);
  }
  plan->backend_plan = cp;
  return KVA_OK;
}

void kva_cpu_plan_free(kva_plan *plan) {
  cpu_plan *cp = (cpu_plan *)plan->backend_plan;
  if (!cp) return;
  free(cp->scratch);
  free(cp->ext_task_start);
  free(cp);
  plan->backend_plan = NULL;
}

/* Query rows of tokens [t0, t0+nt) of request r for kv heads [kvh0,
 * kvh0+nkvh), kv-head major (kv head, token, head in group), so the rows of
 * one kv head are contiguous. */
static void load_rows(const job *jb, rowset *rs, int thread, int r, int t0, int nt, int kvh0,
                      int nkvh) {
  const kva_plan *p = jb->plan;
  rowset_layout(rs, jb->cp->scratch + jb->cp->thread_bytes * (size_t)thread,
                nt * jb->group * nkvh, jb->d);
  int cached = p->cache_seqlens[r] - p->num_new[r], d = jb->d;
  size_t esz = kva_dtype_size(jb->dtype);
  rs->kvh0 = kvh0;
  rs->nkvh = nkvh;
  rs->per_head = nt * jb->group;
  rs->nrows = rs->per_head * nkvh;
  for (int i = 0; i < rs->nrows; i++) {
    int kvh = kvh0 + i / rs->per_head, rem = i % rs->per_head, t = rem / jb->group;
    int h = kvh * jb->group + rem % jb->group;
    size_t tok = (size_t)p->cu_seqlens_q[r] + t0 + t;
    const char *src = (const char *)jb->q + (tok * jb->hq + h) * d * esz;
    kva_cpu_row_to_f32(jb->simd, src, jb->dtype, d, 1.0f, rs->q + (size_t)i * d);
    rs->qpos[i] = cached + t0 + t;
    rs->tok[i] = t0 + t;
    rs->head[i] = h;
    rs->m[i] = -INFINITY;
    rs->l[i] = 0.0f;
    memset(rs->acc + (size_t)i * d, 0, (size_t)d * sizeof(float));
    rs->qp[i] = rs->q + (size_t)i * d;
    rs->ap[i] = rs->acc + (size_t)i * d;
  }
}

static int visible(const kva_attn_params *ap, int key, int qpos) {
  if (ap->causal && key > qpos) return 0;
  if (ap->window_left >= 0 && key < qpos - ap->window_left) return 0;
  return 1;
}

/* QK (or PV) of one block for every kv head of the rowset; buf is K (or V).
 * While head hh computes, its kernel prefetches the hh-th share of the
 * tokens of a block ahead (next_off), whole tokens in address order, so the
 * next block streams in under the arithmetic. */
static void block_heads(const job *jb, rowset *rs, int is_v, const size_t *tok_off, int nb,
                        const size_t *next_off, int nnext) {
  const char *buf = is_v ? jb->vbuf : jb->kbuf;
  float *stage = is_v ? rs->vb : rs->kb;
  int d = jb->d, ph = rs->per_head;
  const void *rows[KEY_BLOCK];
  const char *pf_rows[KEY_BLOCK];
  size_t span_off = (size_t)rs->kvh0 * jb->head_bytes, span = (size_t)rs->nkvh * jb->head_bytes;
  for (int hh = 0; hh < rs->nkvh; hh++) {
    size_t head_off = (size_t)(rs->kvh0 + hh) * jb->head_bytes;
    int j0 = hh * nnext / rs->nkvh, j1 = (hh + 1) * nnext / rs->nkvh;
    for (int j = j0; j < j1; j++) pf_rows[j - j0] = buf + next_off[j] + span_off;
    kva_cpu_prefetch pf = {pf_rows, j1 - j0, (int)span};
    for (int j = 0; j < nb; j++) {
      rows[j] = buf + tok_off[j] + head_off;
      if (jb->staged) { /* one head's rows to f32 (dequantized): stays in L1 */
        float *dst = stage + (size_t)j * d;
        kva_cpu_row_to_f32(jb->simd, rows[j], jb->kv_t, d, is_v ? jb->vs : jb->ks, dst);
        rows[j] = dst;
      }
    }
    kva_dtype rt = jb->staged ? KVA_F32 : jb->kv_t;
    float *s_h = rs->s + (size_t)hh * ph * KEY_BLOCK;
    if (!is_v)
      kva_cpu_qk(jb->simd, ph, rs->qp + hh * ph, rows, rt, nb, d, jb->qk_scale, s_h, KEY_BLOCK,
                 &pf);
    else
      kva_cpu_pv(jb->simd, ph, rs->ap + hh * ph, s_h, KEY_BLOCK, rows, rt, nb, d, &pf);
  }
}

/* Online softmax step over the block's logits; returns 0 if no row saw a key. */
static int softmax_block(const job *jb, rowset *rs, int b0, int nb, int masked) {
  const kva_attn_params *ap = &jb->params;
  float cap = ap->logit_softcap;
  int any = 0;
  for (int i = 0; i < rs->nrows; i++) {
    float *s = rs->s + (size_t)i * KEY_BLOCK;
    if (cap > 0.0f)
      for (int j = 0; j < nb; j++) s[j] = cap * tanhf(s[j] / cap);
    if (masked)
      for (int j = 0; j < nb; j++)
        if (!visible(ap, b0 + j, rs->qpos[i])) s[j] = -INFINITY;
    any |= kva_cpu_softmax_row(jb->simd, s, nb, &rs->m[i], &rs->l[i], rs->acc + (size_t)i * jb->d,
                               jb->d);
  }
  return any;
}

/* Attention of the rowset over keys [k0, k1) of request r. */
static void attend(const job *jb, rowset *rs, int r, int k0, int k1) {
  const kva_plan *p = jb->plan;
  const kva_attn_params *ap = &jb->params;
  const int32_t *pages = p->page_table + (size_t)r * p->hdr.page_table_stride;
  int ps = jb->pool->cfg.page_size;
  /* keys some row sees [lo, hi), keys every row sees [all_lo, all_hi) */
  int lo = k1, hi = k0, all_lo = k0, all_hi = k1;
  for (int i = 0; i < rs->nrows; i++) {
    int a = ap->window_left >= 0 ? rs->qpos[i] - ap->window_left : k0;
    int b = ap->causal ? rs->qpos[i] + 1 : k1;
    if (a < lo) lo = a;
    if (b > hi) hi = b;
    if (a > all_lo) all_lo = a;
    if (b < all_hi) all_hi = b;
  }
  if (lo < k0) lo = k0;
  if (hi > k1) hi = k1;
  size_t off[KEY_BLOCK], pf[KEY_BLOCK];
  for (int b0 = lo; b0 < hi; b0 += KEY_BLOCK) {
    int nb = hi - b0 < KEY_BLOCK ? hi - b0 : KEY_BLOCK;
    for (int j = 0; j < nb; j++)
      off[j] = ((size_t)pages[(b0 + j) / ps] * ps + (size_t)((b0 + j) % ps)) * jb->tok_bytes;
    /* the block PREFETCH_BLOCKS ahead */
    int n0 = b0 + PREFETCH_BLOCKS * KEY_BLOCK, npf = hi - n0 < KEY_BLOCK ? hi - n0 : KEY_BLOCK;
    if (npf < 0) npf = 0;
    for (int j = 0; j < npf; j++)
      pf[j] = ((size_t)pages[(n0 + j) / ps] * ps + (size_t)((n0 + j) % ps)) * jb->tok_bytes;
    int masked = b0 < all_lo || b0 + nb > all_hi;
    block_heads(jb, rs, 0, off, nb, pf, npf);
    if (softmax_block(jb, rs, b0, nb, masked)) block_heads(jb, rs, 1, off, nb, pf, npf);
  }
}

/* Normalizes finished rows in place (acc) and sets their LSE. */
static void finish_rows(const job *jb, rowset *rs) {
  for (int i = 0; i < rs->nrows; i++) {
    float *acc = rs->acc + (size_t)i * jb->d;
    if (rs->l[i] > 0.0f) {
      kva_cpu_scale(jb->simd, acc, jb->v_factor / rs->l[i], jb->d);
      rs->lse[i] = rs->m[i] + logf(rs->l[i]);
    } else {
      memset(acc, 0, (size_t)jb->d * sizeof(float));
      rs->lse[i] = -INFINITY;
    }
  }
}

static void write_final(const job *jb, const rowset *rs, int r) {
  size_t esz = kva_dtype_size(jb->dtype);
  for (int i = 0; i < rs->nrows; i++) {
    int h = rs->head[i];
    size_t tok = (size_t)jb->plan->cu_seqlens_q[r] + rs->tok[i];
    char *dst = (char *)jb->o + (tok * jb->hq + h) * jb->d * esz;
    const float *acc = rs->acc + (size_t)i * jb->d;
    if (jb->dtype == KVA_F32)
      memcpy(dst, acc, (size_t)jb->d * sizeof(float));
    else
      for (int e = 0; e < jb->d; e++) kva_store_f32(dst, (size_t)e, jb->dtype, acc[e]);
    if (jb->lse) jb->lse[tok * jb->hq + h] = rs->lse[i];
  }
}

static void decode_task(void *arg, int w, int thread) {
  job *jb = (job *)arg;
  const kva_plan *p = jb->plan;
  const kva_split_work *wk = &p->split_schedule[w];
  float *partial_o = (float *)p->partial_o, *partial_lse = (float *)p->partial_lse;
  rowset rs;
  for (int r = wk->begin_req; r <= wk->end_req; r++) {
    int nsplit = p->split_indptr[r + 1] - p->split_indptr[r];
    if (nsplit == 0) continue; /* extend request, or no keys */
    const kva_split_chunk ch = kva_split_work_chunk(wk, r, p->cache_seqlens[r]);
    const int j = ch.split;
    int nt = p->num_new[r];
    load_rows(jb, &rs, thread, r, 0, nt, 0, jb->hkv);
    attend(jb, &rs, r, ch.k0, ch.k1);
    finish_rows(jb, &rs);
    if (nsplit == 1) {
      write_final(jb, &rs, r);
      continue;
    }
    for (int i = 0; i < rs.nrows; i++) {
      size_t row = (size_t)p->split_row_offset[r] + (size_t)j * nt + rs.tok[i];
      memcpy(partial_o + (row * jb->hq + rs.head[i]) * jb->d, rs.acc + (size_t)i * jb->d,
             (size_t)jb->d * sizeof(float));
      partial_lse[row * jb->hq + rs.head[i]] = rs.lse[i];
    }
  }
}

/* Combine: one task per decode request; those with one chunk have nothing to do. */
static void combine_task(void *arg, int idx, int thread) {
  (void)thread;
  const job *jb = (const job *)arg;
  kva_cpu_combine_request(jb->plan, jb->plan->decode_reqs[idx], jb->hq, jb->d, jb->o, jb->lse,
                          jb->dtype);
}

/* Extend tasks: request i of extend_reqs owns tasks [start[i], start[i+1]),
 * its query chunks from the last (most keys) down, each over every kv head. */
static void extend_task(void *arg, int idx, int thread) {
  job *jb = (job *)arg;
  const kva_plan *p = jb->plan;
  const int32_t *start = jb->cp->ext_task_start;
  int lo = 0, hi = p->num_extend - 1;
  while (lo < hi) { /* last i with start[i] <= idx */
    int mid = (lo + hi + 1) / 2;
    if (start[mid] <= idx) lo = mid;
    else hi = mid - 1;
  }
  int r = p->extend_reqs[lo], local = idx - start[lo];
  int chunk = local / jb->hkv, kvh = local % jb->hkv;
  int nchunks = (p->num_new[r] + jb->ext_tokens - 1) / jb->ext_tokens;
  int t0 = (nchunks - 1 - chunk) * jb->ext_tokens;
  int nt = p->num_new[r] - t0 < jb->ext_tokens ? p->num_new[r] - t0 : jb->ext_tokens;
  rowset rs;
  load_rows(jb, &rs, thread, r, t0, nt, kvh, 1);
  attend(jb, &rs, r, 0, p->cache_seqlens[r]);
  finish_rows(jb, &rs);
  write_final(jb, &rs, r);
}

kva_status kva_cpu_attention(kva_plan *plan, const kva_pool *pool, int layer,
                             const kva_attn_params *params, const void *q, void *o, float *lse,
                             kva_dtype dtype) {
  kva_cpu_state *st = kva_cpu_state_of(plan->ctx);
  const cpu_plan *cp = (const cpu_plan *)plan->backend_plan;
  if (!cp || cp->num_threads < kva_threadpool_size(st->pool))
    return kva_set_error(KVA_ERR_INTERNAL, "kva_attention: CPU plan scratch missing");
  if (pool->cfg.layout == KVA_LAYOUT_MLA)
    return kva_cpu_mla_attention(plan, pool, layer, params, q, o, lse, dtype, cp->scratch,
                                 cp->thread_bytes);
  job jb;
  memset(&jb, 0, sizeof(jb));
  jb.plan = plan;
  jb.pool = pool;
  jb.cp = cp;
  jb.params = *params;
  jb.q = q;
  jb.o = o;
  jb.lse = lse;
  jb.dtype = dtype;
  jb.hq = plan->cfg.num_qo_heads;
  jb.hkv = pool->cfg.num_kv_heads;
  jb.group = jb.hq / jb.hkv;
  jb.d = pool->cfg.head_dim;
  jb.simd = st->simd;
  jb.ext_tokens = extend_tokens(jb.group);
  jb.kv_t = pool->cfg.kv_dtype;
  jb.kbuf = (const char *)pool->k[layer];
  jb.vbuf = (const char *)pool->v[layer];
  int fp8 = jb.kv_t == KVA_FP8_E4M3;
  jb.ks = fp8 ? pool->k_scale[layer] : 1.0f;
  jb.vs = fp8 ? pool->v_scale[layer] : 1.0f;
  jb.head_bytes = (size_t)jb.d * kva_dtype_size(jb.kv_t);
  jb.tok_bytes = jb.head_bytes * (size_t)jb.hkv;
  jb.staged = !jb.simd;
  if (jb.params.sm_scale == 0.0f) jb.params.sm_scale = 1.0f / sqrtf((float)jb.d);
  int fused_fp8 = fp8 && !jb.staged;
  jb.qk_scale = jb.params.sm_scale * (fused_fp8 ? jb.ks * KVA_CPU_FP8_DIV : 1.0f);
  jb.v_factor = fused_fp8 ? jb.vs * KVA_CPU_FP8_DIV : 1.0f;

  if (plan->num_decode > 0) {
    kva_threadpool_run(st->pool, plan->cfg.num_workers, decode_task, &jb);
    kva_threadpool_run(st->pool, plan->num_decode, combine_task, &jb);
  }
  if (plan->num_extend > 0) {
    int32_t *start = cp->ext_task_start;
    start[0] = 0;
    for (int i = 0; i < plan->num_extend; i++) {
      int nt = plan->num_new[plan->extend_reqs[i]];
      start[i + 1] = start[i] + (nt + jb.ext_tokens - 1) / jb.ext_tokens * jb.hkv;
    }
    kva_threadpool_run(st->pool, start[plan->num_extend], extend_task, &jb);
  }
  return KVA_OK;
}
