/* Caller-owned pools (kva_pool_create_external) and page-table plans
 * (kva_plan_create_paged / kva_plan_update_paged), the path FA3-, FlashInfer-
 * and FlashMLA-style callers take: the same batch planned from a request
 * table and from its page table must give the same metadata and bitwise the
 * same attention output, both close to the double reference; bad page tables
 * and pointers are refused with nothing changed. Runs on the CPU and, when
 * present, on CUDA (the CUDA half says SKIP without a GPU). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/reference.h"
#include "testutil.h"

#define HQ 8
#define HKV 2
#define D 64
#define PAGE 16
#define PAGES 64
#define MAXQ 256

static tu_rng g_rng = {0x9a9ed5eedull};

typedef struct {
  kva_context *ctx;
  kva_pool *pool, *ext;
  void *ext_k, *ext_v;
  kva_req_table *tab;
  kva_plan *plan, *paged;
} fixture;

static void teardown(fixture *f) {
  kva_plan_destroy(f->plan);
  kva_plan_destroy(f->paged);
  kva_req_table_destroy(f->tab);
  kva_pool_destroy(f->pool);
  kva_pool_destroy(f->ext); /* must not free ext_k/ext_v */
  if (f->ctx) {
    kva_free(f->ctx, f->ext_k);
    kva_free(f->ctx, f->ext_v);
  }
  kva_context_destroy(f->ctx);
}

/* Device buffer of n floats converted to bf16 from host x. */
static void *upload_bf16(kva_context *ctx, const float *x, size_t n) {
  uint16_t *h = (uint16_t *)malloc(n * 2);
  for (size_t i = 0; i < n; i++) {
    uint32_t b;
    memcpy(&b, &x[i], 4);
    h[i] = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  }
  void *d = NULL;
  if (kva_malloc(ctx, n * 2, &d) == KVA_OK) kva_copy_to_device(ctx, d, h, n * 2);
  free(h);
  return d;
}
static float bf16_to_f32(uint16_t v) {
  uint32_t b = (uint32_t)v << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static void run_device(kva_device dev) {
  const char *dn = dev == KVA_DEVICE_CPU ? "cpu" : "cuda";
  fixture f;
  memset(&f, 0, sizeof f);
  kva_context_config cc = {dev, 2, 0};
  CHECK_STATUS(kva_context_create(&cc, &f.ctx), KVA_OK);
  if (!f.ctx) return;
  kva_pool_config pc = {KVA_LAYOUT_MHA, 1, PAGES, PAGE, HKV, D, KVA_BF16};
  CHECK_STATUS(kva_pool_create(f.ctx, &pc, &f.pool), KVA_OK);
  CHECK_STATUS(kva_req_table_create(f.pool, 8, 512, &f.tab), KVA_OK);
  kva_plan_config plc = {8, MAXQ, HQ, 5, 32, 0}; /* few workers, small blocks: splits */
  CHECK_STATUS(kva_plan_create(f.tab, &plc, &f.plan), KVA_OK);
  if (!f.plan) return teardown(&f);

  /* A mixed batch: decode requests with long prefixes, one extend request,
   * a prefix not page-aligned. */
  enum { NR = 4 };
  int32_t cached[NR] = {203, 77, 1, 150}, nnew[NR] = {1, 3, 120, 8}, slots[NR];
  for (int i = 0; i < NR; i++) {
    CHECK_STATUS(kva_req_alloc(f.tab, &slots[i]), KVA_OK);
    CHECK_STATUS(kva_req_append(f.tab, slots[i], cached[i] + nnew[i]), KVA_OK);
  }
  /* KV for every position (the prefix as if stored by earlier steps): one
   * step whose num_new covers each whole request. */
  int32_t zero[NR] = {0}, all[NR];
  int total_all = 0;
  for (int i = 0; i < NR; i++) total_all += all[i] = cached[i] + nnew[i];
  size_t kv_n = (size_t)total_all * HKV * D;
  float *kv_h = (float *)malloc(kv_n * 2 * sizeof(float));
  tu_fill_uniform(&g_rng, kv_h, kv_n * 2, -1.0f, 1.0f);
  void *k_d = upload_bf16(f.ctx, kv_h, kv_n), *v_d = upload_bf16(f.ctx, kv_h + kv_n, kv_n);
  kva_plan_config bigc = {8, total_all, HQ, 5, 32, 0};
  kva_plan *fill = NULL;
  CHECK_STATUS(kva_plan_create(f.tab, &bigc, &fill), KVA_OK);
  kva_batch fb = {NR, slots, zero, all};
  CHECK_STATUS(kva_plan_update(fill, &fb), KVA_OK);
  CHECK_STATUS(kva_store_kv(fill, f.pool, 0, k_d, v_d, KVA_BF16), KVA_OK);
  kva_plan_destroy(fill);

  kva_batch b = {NR, slots, cached, nnew};
  CHECK_STATUS(kva_plan_update(f.plan, &b), KVA_OK);
  kva_plan_info ri;
  CHECK_STATUS(kva_plan_get_info(f.plan, &ri), KVA_OK);

  /* The external pool holds a byte copy of the owned pool's layer. */
  size_t layer_bytes = (size_t)PAGES * PAGE * HKV * D * 2;
  void *pk, *pv;
  CHECK_STATUS(kva_pool_get_buffers(f.pool, 0, &pk, &pv), KVA_OK);
  unsigned char *tmp = (unsigned char *)malloc(layer_bytes);
  CHECK_STATUS(kva_malloc(f.ctx, layer_bytes, &f.ext_k), KVA_OK);
  CHECK_STATUS(kva_malloc(f.ctx, layer_bytes, &f.ext_v), KVA_OK);
  CHECK_STATUS(kva_copy_to_host(f.ctx, tmp, pk, layer_bytes), KVA_OK);
  CHECK_STATUS(kva_copy_to_device(f.ctx, f.ext_k, tmp, layer_bytes), KVA_OK);
  CHECK_STATUS(kva_copy_to_host(f.ctx, tmp, pv, layer_bytes), KVA_OK);
  CHECK_STATUS(kva_copy_to_device(f.ctx, f.ext_v, tmp, layer_bytes), KVA_OK);
  void *kl[1] = {f.ext_k}, *vl[1] = {f.ext_v};
  CHECK_STATUS(kva_pool_create_external(f.ctx, &pc, kl, vl, &f.ext), KVA_OK);
  CHECK_STATUS(kva_plan_create_paged(f.ext, &plc, 40, &f.paged), KVA_OK);
  if (!f.ext || !f.paged) {
    free(kv_h), free(tmp), kva_free(f.ctx, k_d), kva_free(f.ctx, v_d);
    return teardown(&f);
  }

  /* The same batch by its page table (copied: info arrays belong to the plan). */
  int stride = ri.page_table_stride + 3; /* a wider caller table is fine */
  int32_t *pt = (int32_t *)malloc((size_t)NR * stride * sizeof(int32_t));
  for (int i = 0; i < NR; i++)
    for (int j = 0; j < stride; j++)
      pt[i * stride + j] = j < ri.page_table_stride ? ri.page_table[i * ri.page_table_stride + j]
                                                    : 12345678; /* beyond the request: unread */
  int32_t seqlens[NR];
  for (int i = 0; i < NR; i++) seqlens[i] = cached[i] + nnew[i];
  kva_paged_batch pb = {NR, nnew, seqlens, pt, stride};
  CHECK_STATUS(kva_plan_update_paged(f.paged, &pb), KVA_OK);
  kva_plan_info pi;
  CHECK_STATUS(kva_plan_get_info(f.paged, &pi), KVA_OK);
  CHECK(pi.total_q == ri.total_q && pi.total_k == ri.total_k && pi.num_decode == ri.num_decode &&
            pi.num_extend == ri.num_extend && pi.num_splits_total == ri.num_splits_total,
        "%s: paged plan totals differ from the request-table plan", dn);
  CHECK(memcmp(pi.out_cache_loc, ri.out_cache_loc, (size_t)ri.total_q * 4) == 0 &&
            memcmp(pi.kv_indices, ri.kv_indices, (size_t)ri.kv_indptr[NR] * 4) == 0 &&
            memcmp(pi.cu_seqlens_k, ri.cu_seqlens_k, (NR + 1) * 4) == 0 &&
            memcmp(pi.kv_last_page_len, ri.kv_last_page_len, NR * 4) == 0 &&
            memcmp(pi.split_schedule, ri.split_schedule,
                   (size_t)ri.num_workers * sizeof(kva_split_work)) == 0,
        "%s: paged plan metadata differs from the request-table plan", dn);

  /* Attention both ways: bitwise equal, and close to the reference. */
  size_t qn = (size_t)ri.total_q * HQ * D;
  float *q_h = (float *)malloc(qn * sizeof(float));
  tu_fill_uniform(&g_rng, q_h, qn, -1.0f, 1.0f);
  void *q_d = upload_bf16(f.ctx, q_h, qn), *o1 = NULL, *o2 = NULL, *lse1 = NULL, *lse2 = NULL;
  CHECK_STATUS(kva_malloc(f.ctx, qn * 2, &o1), KVA_OK);
  CHECK_STATUS(kva_malloc(f.ctx, qn * 2, &o2), KVA_OK);
  CHECK_STATUS(kva_malloc(f.ctx, (size_t)ri.total_q * HQ * 4, &lse1), KVA_OK);
  CHECK_STATUS(kva_malloc(f.ctx, (size_t)ri.total_q * HQ * 4, &lse2), KVA_OK);
  uint16_t *oh1 = (uint16_t *)malloc(qn * 2), *oh2 = (uint16_t *)malloc(qn * 2);
  float *lh1 = (float *)malloc((size_t)ri.total_q * HQ * 4),
        *lh2 = (float *)malloc((size_t)ri.total_q * HQ * 4);
  memset(oh1, 0xff, qn * 2); /* bf16 NaN */
  tu_poison(lh1, (size_t)ri.total_q * HQ);
  CHECK_STATUS(kva_copy_to_device(f.ctx, o1, oh1, qn * 2), KVA_OK);
  CHECK_STATUS(kva_copy_to_device(f.ctx, o2, oh1, qn * 2), KVA_OK);
  CHECK_STATUS(kva_copy_to_device(f.ctx, lse1, lh1, (size_t)ri.total_q * HQ * 4), KVA_OK);
  CHECK_STATUS(kva_copy_to_device(f.ctx, lse2, lh1, (size_t)ri.total_q * HQ * 4), KVA_OK);
  kva_attn_params ap = kva_attn_params_default();
  CHECK_STATUS(kva_attention(f.plan, f.pool, 0, &ap, q_d, o1, (float *)lse1, KVA_BF16), KVA_OK);
  CHECK_STATUS(kva_attention(f.paged, f.ext, 0, &ap, q_d, o2, (float *)lse2, KVA_BF16), KVA_OK);
  CHECK_STATUS(kva_synchronize(f.ctx), KVA_OK);
  CHECK_STATUS(kva_copy_to_host(f.ctx, oh1, o1, qn * 2), KVA_OK);
  CHECK_STATUS(kva_copy_to_host(f.ctx, oh2, o2, qn * 2), KVA_OK);
  CHECK_STATUS(kva_copy_to_host(f.ctx, lh1, lse1, (size_t)ri.total_q * HQ * 4), KVA_OK);
  CHECK_STATUS(kva_copy_to_host(f.ctx, lh2, lse2, (size_t)ri.total_q * HQ * 4), KVA_OK);
  CHECK(memcmp(oh1, oh2, qn * 2) == 0 && memcmp(lh1, lh2, (size_t)ri.total_q * HQ * 4) == 0,
        "%s: paged-plan output differs from the request-table plan's", dn);

  /* Any pool of the plan's geometry will do (one plan, a pool per layer):
   * a second external pool over the owned pool's buffers gives the same
   * output; a pool of another geometry is refused. */
  {
    void *ok_k[1] = {pk}, *ok_v[1] = {pv};
    kva_pool *twin = NULL, *other = NULL;
    CHECK_STATUS(kva_pool_create_external(f.ctx, &pc, ok_k, ok_v, &twin), KVA_OK);
    kva_pool_config oc = pc;
    oc.num_pages = PAGES / 2;
    CHECK_STATUS(kva_pool_create_external(f.ctx, &oc, ok_k, ok_v, &other), KVA_OK);
    if (twin && other) {
      uint16_t *oh3 = (uint16_t *)malloc(qn * 2);
      memset(oh3, 0xff, qn * 2); /* NaN-poison o2 */
      CHECK_STATUS(kva_copy_to_device(f.ctx, o2, oh3, qn * 2), KVA_OK);
      CHECK_STATUS(kva_attention(f.paged, twin, 0, &ap, q_d, o2, NULL, KVA_BF16), KVA_OK);
      CHECK_STATUS(kva_attention(f.paged, other, 0, &ap, q_d, o2, NULL, KVA_BF16),
                   KVA_ERR_INVALID_ARGUMENT);
      CHECK_STATUS(kva_store_kv(f.paged, other, 0, k_d, v_d, KVA_BF16), KVA_ERR_INVALID_ARGUMENT);
      CHECK_STATUS(kva_synchronize(f.ctx), KVA_OK);
      CHECK_STATUS(kva_copy_to_host(f.ctx, oh3, o2, qn * 2), KVA_OK);
      CHECK(memcmp(oh1, oh3, qn * 2) == 0, "%s: a pool of the same geometry gave another output",
            dn); /* oh1 holds the request-table plan's output */
      free(oh3);
    }
    kva_pool_destroy(twin);
    kva_pool_destroy(other);
  }

  /* reference on the stored (bf16-rounded) K/V */
  float *kr[NR], *vr[NR];
  for (int i = 0; i < NR; i++)
    CHECK_STATUS(kva_ref_read_request_kv(f.pool, f.tab, slots[i], 0, seqlens[i], &kr[i], &vr[i]),
                 KVA_OK);
  float *qr = (float *)malloc(qn * sizeof(float)), *of = (float *)malloc(qn * sizeof(float));
  for (size_t i = 0; i < qn; i++) {
    uint32_t bits;
    memcpy(&bits, &q_h[i], 4);
    qr[i] = bf16_to_f32((uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16));
    of[i] = bf16_to_f32(oh2[i]);
  }
  double *oref = (double *)malloc(qn * sizeof(double)),
         *lref = (double *)malloc((size_t)ri.total_q * HQ * sizeof(double));
  kva_ref_attention(NR, cached, nnew, HQ, HKV, D, &ap, qr, (const float *const *)kr,
                    (const float *const *)vr, oref, lref);
  double err = kva_ref_rel_error(oref, of, qn);
  CHECK(err < 1e-2, "%s: paged-plan output vs reference: rel error %g", dn, err);
  tu_check_lse(dn, 1, lref, lh2, (size_t)ri.total_q * HQ);

  /* A store through the paged plan lands where the request plan's would. */
  size_t nk = (size_t)ri.total_q * HKV * D;
  float *nkv = (float *)malloc(nk * 2 * sizeof(float));
  tu_fill_uniform(&g_rng, nkv, nk * 2, -2.0f, 2.0f);
  void *nk_d = upload_bf16(f.ctx, nkv, nk), *nv_d = upload_bf16(f.ctx, nkv + nk, nk);
  CHECK_STATUS(kva_store_kv(f.paged, f.ext, 0, nk_d, nv_d, KVA_BF16), KVA_OK);
  float *got = (float *)malloc(nk * 2 * sizeof(float));
  CHECK_STATUS(kva_pool_read_tokens(f.ext, 0, ri.total_q, pi.out_cache_loc, got, got + nk), KVA_OK);
  int store_bad = 0;
  for (size_t i = 0; i < nk * 2; i++) {
    uint32_t bits;
    memcpy(&bits, &nkv[i], 4);
    float want = bf16_to_f32((uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16));
    store_bad += got[i] != want;
  }
  CHECK(store_bad == 0, "%s: %d stored elements differ after a paged-plan store", dn, store_bad);

  /* ---- bad input: refused, the plan keeps its batch ---- */
  int32_t saved = pt[1 * stride + 2];
  pt[1 * stride + 2] = PAGES; /* beyond the pool */
  CHECK_STATUS(kva_plan_update_paged(f.paged, &pb), KVA_ERR_OUT_OF_RANGE);
  CHECK(strstr(kva_last_error(), "page_table[1][2]") != NULL, "message names the entry: %s",
        kva_last_error());
  pt[1 * stride + 2] = -1;
  CHECK_STATUS(kva_plan_update_paged(f.paged, &pb), KVA_ERR_OUT_OF_RANGE);
  pt[1 * stride + 2] = saved;
  kva_paged_batch bad = pb;
  bad.page_table_stride = 41; /* > max_pages_per_req 40 */
  CHECK_STATUS(kva_plan_update_paged(f.paged, &bad), KVA_ERR_INVALID_ARGUMENT);
  bad.page_table_stride = 2; /* request 0 needs 13 pages */
  CHECK_STATUS(kva_plan_update_paged(f.paged, &bad), KVA_ERR_OUT_OF_RANGE);
  int32_t short_len[NR] = {seqlens[0], 2, seqlens[2], seqlens[3]}; /* 2 < num_new 3 */
  bad = pb;
  bad.cache_seqlens = short_len;
  CHECK_STATUS(kva_plan_update_paged(f.paged, &bad), KVA_ERR_INVALID_ARGUMENT);
  bad = pb;
  bad.page_table = NULL;
  CHECK_STATUS(kva_plan_update_paged(f.paged, &bad), KVA_ERR_NULL_ARGUMENT);
  bad = pb;
  bad.num_requests = 9;
  CHECK_STATUS(kva_plan_update_paged(f.paged, &bad), KVA_ERR_CAPACITY);
  CHECK_STATUS(kva_plan_update_paged(f.plan, &pb), KVA_ERR_STATE);
  CHECK_STATUS(kva_plan_update(f.paged, &b), KVA_ERR_STATE);
  kva_plan_info after;
  CHECK_STATUS(kva_plan_get_info(f.paged, &after), KVA_OK);
  CHECK(after.total_q == pi.total_q && after.out_cache_loc[0] == pi.out_cache_loc[0],
        "%s: a refused update changed the plan", dn);
  kva_plan *np = NULL;
  CHECK_STATUS(kva_plan_create_paged(f.ext, &plc, 0, &np), KVA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kva_plan_create_paged(NULL, &plc, 4, &np), KVA_ERR_NULL_ARGUMENT);
  CHECK(np == NULL, "failed create leaves *out NULL");

  kva_pool *xp = NULL;
  void *mis[1] = {(unsigned char *)f.ext_k + 8};
  CHECK_STATUS(kva_pool_create_external(f.ctx, &pc, mis, vl, &xp), KVA_ERR_INVALID_ARGUMENT);
  void *nul[1] = {NULL};
  CHECK_STATUS(kva_pool_create_external(f.ctx, &pc, kl, nul, &xp), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_pool_create_external(f.ctx, &pc, kl, NULL, &xp), KVA_ERR_NULL_ARGUMENT);
  kva_pool_config mla = {KVA_LAYOUT_MLA, 1, 4, 64, 1, KVA_MLA_HEAD_DIM, KVA_BF16};
  CHECK_STATUS(kva_pool_create_external(f.ctx, &mla, kl, vl, &xp), KVA_ERR_INVALID_ARGUMENT);
  kva_pool_config badc = pc;
  badc.head_dim = 12;
  CHECK_STATUS(kva_pool_create_external(f.ctx, &badc, kl, vl, &xp), KVA_ERR_UNSUPPORTED);
  CHECK(xp == NULL, "failed create leaves *out NULL");
  CHECK_STATUS(kva_pool_create_external(f.ctx, &pc, kl, vl, NULL), KVA_ERR_NULL_ARGUMENT);

  for (int i = 0; i < NR; i++) free(kr[i]), free(vr[i]);
  free(kv_h), free(tmp), free(pt), free(q_h), free(oh1), free(oh2), free(lh1), free(lh2);
  free(qr), free(of), free(oref), free(lref), free(nkv), free(got);
  kva_free(f.ctx, k_d), kva_free(f.ctx, v_d), kva_free(f.ctx, q_d), kva_free(f.ctx, o1);
  kva_free(f.ctx, o2), kva_free(f.ctx, lse1), kva_free(f.ctx, lse2), kva_free(f.ctx, nk_d);
  kva_free(f.ctx, nv_d);
  /* teardown frees ext_k/ext_v after destroying the external pool: had the
   * pool freed them, ASan would report a double free */
  teardown(&f);
}

int main(void) {
  run_device(KVA_DEVICE_CPU);
  if (kva_device_available(KVA_DEVICE_CUDA) == KVA_OK)
    run_device(KVA_DEVICE_CUDA);
  else
    printf("test_paged_plan: SKIP cuda half: %s\n", kva_last_error());
  return tu_summary("test_paged_plan");
}
