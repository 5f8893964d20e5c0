/* CPU attention over the paged cache. Decode requests follow the plan's
 * split-KV schedule (one task per worker, then a combine of split requests);
 * extend requests are cut into (request, query chunk) tasks. Both run the
 * same block loop over all query rows of the request: a key block reads whole
 * tokens (every kv head, contiguous in the page) once, converts them to f32,
 * and each row uses its kv head's part, so reads stream through pages. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_simd.h"

#define KEY_BLOCK 16
#define EXTEND_Q_CHUNK 16

typedef struct {
  const kva_plan *plan;
  const kva_pool *pool;
  int layer;
  kva_attn_params params; /* sm_scale resolved */
  const void *q;
  void *o;
  float *lse;
  kva_dtype dtype;
  int hq, hkv, group, d, simd;
  kva_status status; /* first failure of any task (allocation) */
} job;

/* Query rows of one request, kv-head major: row = (kv head, token t, head
 * in group g), so the rows that share a kv head are contiguous. */
typedef struct {
  int nrows, per_head; /* rows in all, rows per kv head */
  float *q;            /* [nrows][d] */
  int *qpos, *tok, *head; /* absolute position, token index within the request, q head */
  float *m, *l, *acc;
  float *kb, *vb, *s;  /* [KEY_BLOCK][hkv*d] x2, [nrows][KEY_BLOCK] */
  const float **qp;    /* [nrows] row pointers for the block kernels */
  float **ap;
} rowset;

static int rowset_alloc(rowset *rs, int nrows, int d, int hkv) {
  size_t floats = (size_t)nrows * d * 2 + (size_t)nrows * 2 + (size_t)KEY_BLOCK * d * hkv * 2 +
                  (size_t)nrows * KEY_BLOCK;
  float *f = (float *)malloc(floats * sizeof(float) + (size_t)nrows * 3 * sizeof(int) +
                             (size_t)nrows * 2 * sizeof(void *));
  if (!f) return 0;
  rs->q = f;
  rs->acc = rs->q + (size_t)nrows * d;
  rs->m = rs->acc + (size_t)nrows * d;
  rs->l = rs->m + nrows;
  rs->kb = rs->l + nrows;
  rs->vb = rs->kb + (size_t)KEY_BLOCK * d * hkv;
  rs->s = rs->vb + (size_t)KEY_BLOCK * d * hkv;
  rs->qp = (const float **)(rs->s + (size_t)nrows * KEY_BLOCK);
  rs->ap = (float **)(rs->qp + nrows);
  rs->qpos = (int *)(rs->ap + nrows);
  rs->tok = rs->qpos + nrows;
  rs->head = rs->tok + nrows;
  return 1;
}

/* Load query rows (all heads) for tokens [t0, t0+nt) of request r. */
static void load_rows(const job *jb, rowset *rs, int r, int t0, int nt) {
  const kva_plan *p = jb->plan;
  int cached = p->cache_seqlens[r] - p->num_new[r], d = jb->d;
  size_t esz = kva_dtype_size(jb->dtype);
  rs->per_head = nt * jb->group;
  rs->nrows = nt * jb->hq;
  for (int i = 0; i < rs->nrows; i++) {
    int kvh = i / rs->per_head, rem = i % rs->per_head, t = rem / jb->group;
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

/* Converts tokens [b0, b0+nb) of one buffer (every kv head) to f32. */
static void load_block(const job *jb, const int32_t *pages, const char *buf, float scale, int b0,
                       int nb, float *dst) {
  const kva_pool *pool = jb->pool;
  int ps = pool->cfg.page_size;
  size_t esz = kva_dtype_size(pool->cfg.kv_dtype), row_elems = pool->token_elems;
  for (int j = 0; j < nb; j++) {
    int pos = b0 + j;
    size_t slot = (size_t)pages[pos / ps] * ps + pos % ps;
    kva_cpu_row_to_f32(jb->simd, buf + slot * row_elems * esz, pool->cfg.kv_dtype, (int)row_elems,
                       scale, dst + (size_t)j * row_elems);
  }
}

/* Online softmax of rows over keys [k0, k1) of request r. */
static void attend(const job *jb, rowset *rs, int r, int k0, int k1) {
  const kva_plan *p = jb->plan;
  const kva_pool *pool = jb->pool;
  const kva_attn_params *ap = &jb->params;
  int d = jb->d, n = rs->nrows, ph = rs->per_head;
  const int32_t *pages = p->page_table + (size_t)r * p->hdr.page_table_stride;
  size_t row_elems = pool->token_elems;
  const char *kbuf = (const char *)pool->k[jb->layer], *vbuf = (const char *)pool->v[jb->layer];
  int fp8 = pool->cfg.kv_dtype == KVA_FP8_E4M3;
  float ks = fp8 ? pool->k_scale[jb->layer] : 1.0f, vs = fp8 ? pool->v_scale[jb->layer] : 1.0f;
  /* keys any row can see, and keys every row sees (no mask needed there) */
  int lo = k1, hi = k0, all_lo = k0, all_hi = k1;
  for (int i = 0; i < n; i++) {
    int a = ap->window_left >= 0 ? rs->qpos[i] - ap->window_left : 0;
    int b = ap->causal ? rs->qpos[i] + 1 : k1;
    if (a < lo) lo = a;
    if (b > hi) hi = b;
    if (a > all_lo) all_lo = a;
    if (b < all_hi) all_hi = b;
  }
  if (lo < k0) lo = k0;
  if (hi > k1) hi = k1;
  /* 16-bit KV is read in place (converted in registers); fp8 is staged */
  int in_place = !fp8 && jb->simd;
  const uint16_t *rows16[KEY_BLOCK];
  int ps = pool->cfg.page_size;
  for (int b0 = lo; b0 < hi; b0 += KEY_BLOCK) {
    int nb = hi - b0 < KEY_BLOCK ? hi - b0 : KEY_BLOCK;
    int masked = b0 < all_lo || b0 + nb > all_hi;
    if (!in_place) load_block(jb, pages, kbuf, ks, b0, nb, rs->kb);
    for (int kvh = 0; kvh < jb->hkv; kvh++) {
      float *s_h = rs->s + (size_t)kvh * ph * KEY_BLOCK;
      if (in_place) {
        for (int j = 0; j < nb; j++) {
          size_t slot = (size_t)pages[(b0 + j) / ps] * ps + (b0 + j) % ps;
          rows16[j] = (const uint16_t *)kbuf + slot * row_elems + (size_t)kvh * d;
        }
        kva_cpu_qk16(jb->simd, ph, rs->qp + kvh * ph, rows16, pool->cfg.kv_dtype, nb, d,
                     ap->sm_scale, s_h, KEY_BLOCK);
      } else {
        kva_cpu_qk(jb->simd, ph, rs->qp + kvh * ph, rs->kb + (size_t)kvh * d, row_elems, nb, d,
                   ap->sm_scale, s_h, KEY_BLOCK);
      }
    }
    int any = 0;
    for (int i = 0; i < n; i++) {
      float *s = rs->s + (size_t)i * KEY_BLOCK, mx = -INFINITY;
      for (int j = 0; j < nb; j++) {
        if (masked && !visible(ap, b0 + j, rs->qpos[i])) {
          s[j] = -INFINITY;
          continue;
        }
        if (ap->logit_softcap > 0.0f) s[j] = ap->logit_softcap * tanhf(s[j] / ap->logit_softcap);
        if (s[j] > mx) mx = s[j];
      }
      if (mx == -INFINITY) { /* nothing visible: contributes nothing */
        for (int j = 0; j < nb; j++) s[j] = 0.0f;
        continue;
      }
      float mnew = rs->m[i] > mx ? rs->m[i] : mx;
      float corr = expf(rs->m[i] - mnew); /* 0 when m was -inf */
      if (corr != 1.0f) {
        kva_cpu_scale(jb->simd, rs->acc + (size_t)i * d, corr, d);
        rs->l[i] *= corr;
      }
      rs->m[i] = mnew;
      rs->l[i] += kva_cpu_exp_sum(jb->simd, s, nb, mnew);
      any = 1;
    }
    if (!any) continue;
    if (!in_place) load_block(jb, pages, vbuf, vs, b0, nb, rs->vb);
    for (int kvh = 0; kvh < jb->hkv; kvh++) {
      const float *s_h = rs->s + (size_t)kvh * ph * KEY_BLOCK;
      if (in_place) {
        for (int j = 0; j < nb; j++) {
          size_t slot = (size_t)pages[(b0 + j) / ps] * ps + (b0 + j) % ps;
          rows16[j] = (const uint16_t *)vbuf + slot * row_elems + (size_t)kvh * d;
        }
        kva_cpu_pv16(jb->simd, ph, rs->ap + kvh * ph, s_h, KEY_BLOCK, rows16, pool->cfg.kv_dtype,
                     nb, d);
      } else {
        kva_cpu_pv(jb->simd, ph, rs->ap + kvh * ph, s_h, KEY_BLOCK, rs->vb + (size_t)kvh * d,
                   row_elems, nb, d);
      }
    }
  }
}

/* Finished rows: normalized O in f32 (in place in acc) and LSE. */
static void finish_rows(const job *jb, rowset *rs, float *lse_rows) {
  for (int i = 0; i < rs->nrows; i++) {
    float *acc = rs->acc + (size_t)i * jb->d;
    if (rs->l[i] > 0.0f) {
      kva_cpu_scale(jb->simd, acc, 1.0f / rs->l[i], jb->d);
      lse_rows[i] = rs->m[i] + logf(rs->l[i]);
    } else {
      memset(acc, 0, (size_t)jb->d * sizeof(float));
      lse_rows[i] = -INFINITY;
    }
  }
}

/* Write finished rows of request r to O / LSE. */
static void write_final(const job *jb, rowset *rs, int r, const float *lse_rows) {
  size_t esz = kva_dtype_size(jb->dtype);
  for (int i = 0; i < rs->nrows; i++) {
    int h = rs->head[i];
    size_t tok = (size_t)jb->plan->cu_seqlens_q[r] + rs->tok[i];
    char *dst = (char *)jb->o + (tok * jb->hq + h) * jb->d * esz;
    const float *acc = rs->acc + (size_t)i * jb->d;
    for (int e = 0; e < jb->d; e++) kva_store_f32(dst, (size_t)e, jb->dtype, acc[e]);
    if (jb->lse) jb->lse[tok * jb->hq + h] = lse_rows[i];
  }
}

static void decode_task(void *arg, int w, int thread) {
  (void)thread;
  job *jb = (job *)arg;
  const kva_plan *p = jb->plan;
  const kva_split_work *wk = &p->split_schedule[w];
  if (wk->begin_req > wk->end_req) return;
  rowset rs;
  float *lse_rows = (float *)malloc((size_t)KVA_MAX_DECODE_Q * jb->hq * sizeof(float));
  if (!lse_rows || !rowset_alloc(&rs, KVA_MAX_DECODE_Q * jb->hq, jb->d, jb->hkv)) {
    free(lse_rows);
    jb->status = KVA_ERR_OUT_OF_MEMORY;
    return;
  }
  float *partial_o = (float *)p->partial_o, *partial_lse = (float *)p->partial_lse;
  for (int r = wk->begin_req; r <= wk->end_req; r++) {
    int nsplit = p->split_indptr[r + 1] - p->split_indptr[r];
    if (nsplit == 0) continue; /* extend request */
    int k0 = r == wk->begin_req ? wk->begin_pos : 0;
    int k1 = r == wk->end_req ? wk->end_pos : p->cache_seqlens[r];
    int j = r == wk->begin_req ? wk->begin_split : 0;
    int nt = p->num_new[r];
    load_rows(jb, &rs, r, 0, nt);
    attend(jb, &rs, r, k0, k1);
    finish_rows(jb, &rs, lse_rows);
    if (nsplit == 1) {
      write_final(jb, &rs, r, lse_rows);
      continue;
    }
    for (int i = 0; i < rs.nrows; i++) {
      int t = rs.tok[i], h = rs.head[i];
      size_t row = (size_t)p->split_row_offset[r] + (size_t)j * nt + t;
      memcpy(partial_o + (row * jb->hq + h) * jb->d, rs.acc + (size_t)i * jb->d,
             (size_t)jb->d * sizeof(float));
      partial_lse[row * jb->hq + h] = lse_rows[i];
    }
  }
  free(rs.q);
  free(lse_rows);
}

/* Combine: one task per decode request with more than one split. */
static void combine_task(void *arg, int idx, int thread) {
  (void)thread;
  job *jb = (job *)arg;
  const kva_plan *p = jb->plan;
  int r = p->decode_reqs[idx];
  int nsplit = p->split_indptr[r + 1] - p->split_indptr[r];
  if (nsplit <= 1) return;
  const float *po = (const float *)p->partial_o, *pl = (const float *)p->partial_lse;
  const float **rows = (const float **)malloc((size_t)nsplit * sizeof(float *));
  float *lses = (float *)malloc((size_t)nsplit * sizeof(float));
  if (!rows || !lses) {
    free(rows);
    free(lses);
    jb->status = KVA_ERR_OUT_OF_MEMORY;
    return;
  }
  size_t esz = kva_dtype_size(jb->dtype);
  int nt = p->num_new[r];
  for (int t = 0; t < nt; t++)
    for (int h = 0; h < jb->hq; h++) {
      for (int j = 0; j < nsplit; j++) {
        size_t row = (size_t)p->split_row_offset[r] + (size_t)j * nt + t;
        rows[j] = po + (row * jb->hq + h) * jb->d;
        lses[j] = pl[row * jb->hq + h];
      }
      size_t tok = (size_t)p->cu_seqlens_q[r] + t;
      float lse;
      kva_cpu_merge_rows(nsplit, jb->d, rows, lses, (char *)jb->o + (tok * jb->hq + h) * jb->d * esz,
                         jb->dtype, &lse);
      if (jb->lse) jb->lse[tok * jb->hq + h] = lse;
    }
  free(rows);
  free(lses);
}

/* Extend tasks: (extend request, query chunk), claimed dynamically. */
typedef struct {
  job *jb;
  int *task_req, *task_t0; /* [ntasks / hkv] */
} extend_job;

static void extend_task(void *arg, int idx, int thread) {
  (void)thread;
  extend_job *ej = (extend_job *)arg;
  job *jb = ej->jb;
  int r = ej->task_req[idx], t0 = ej->task_t0[idx];
  int nt = jb->plan->num_new[r] - t0;
  if (nt > EXTEND_Q_CHUNK) nt = EXTEND_Q_CHUNK;
  rowset rs;
  float *lse_rows = (float *)malloc((size_t)EXTEND_Q_CHUNK * jb->hq * sizeof(float));
  if (!lse_rows || !rowset_alloc(&rs, EXTEND_Q_CHUNK * jb->hq, jb->d, jb->hkv)) {
    free(lse_rows);
    jb->status = KVA_ERR_OUT_OF_MEMORY;
    return;
  }
  load_rows(jb, &rs, r, t0, nt);
  attend(jb, &rs, r, 0, jb->plan->cache_seqlens[r]);
  finish_rows(jb, &rs, lse_rows);
  write_final(jb, &rs, r, lse_rows);
  free(rs.q);
  free(lse_rows);
}

kva_status kva_cpu_attention(kva_plan *plan, const kva_pool *pool, int layer,
                             const kva_attn_params *params, const void *q, void *o, float *lse,
                             kva_dtype dtype) {
  kva_cpu_state *st = kva_cpu_state_of(plan->ctx);
  job jb;
  memset(&jb, 0, sizeof(jb));
  jb.plan = plan;
  jb.pool = pool;
  jb.layer = layer;
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
  if (jb.params.sm_scale == 0.0f) jb.params.sm_scale = 1.0f / sqrtf((float)jb.d);
  jb.status = KVA_OK;

  if (plan->num_decode > 0) {
    kva_threadpool_run(st->pool, plan->cfg.num_workers, decode_task, &jb);
    kva_threadpool_run(st->pool, plan->num_decode, combine_task, &jb);
  }
  if (plan->num_extend > 0) {
    int items = 0;
    for (int i = 0; i < plan->num_extend; i++)
      items += (plan->num_new[plan->extend_reqs[i]] + EXTEND_Q_CHUNK - 1) / EXTEND_Q_CHUNK;
    extend_job ej = {&jb, (int *)malloc((size_t)items * sizeof(int)),
                     (int *)malloc((size_t)items * sizeof(int))};
    if (!ej.task_req || !ej.task_t0) {
      free(ej.task_req);
      free(ej.task_t0);
      return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_attention: out of host memory");
    }
    /* later query chunks see more keys: put them first so the tail is short */
    int n = 0;
    for (int i = 0; i < plan->num_extend; i++) {
      int r = plan->extend_reqs[i];
      for (int t0 = ((plan->num_new[r] - 1) / EXTEND_Q_CHUNK) * EXTEND_Q_CHUNK; t0 >= 0;
           t0 -= EXTEND_Q_CHUNK) {
        ej.task_req[n] = r;
        ej.task_t0[n++] = t0;
      }
    }
    kva_threadpool_run(st->pool, items, extend_task, &ej);
    free(ej.task_req);
    free(ej.task_t0);
  }
  if (jb.status != KVA_OK)
    return kva_set_error(jb.status, "kva_attention: out of host memory in a CPU task");
  return KVA_OK;
}
