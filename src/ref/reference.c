/* Double-precision reference: plain loops, no SIMD, no threads. */
#include "ref/reference.h"

#include <math.h>
#include <stdlib.h>

#include "core/internal.h"

/* One loop for MHA and MLA: k rows of d_qk and v rows of d_v elements, each
 * kv head's row at (j * num_kv_heads + kvh) * stride. */
static void ref_attention(int num_requests, const int32_t *num_cached, const int32_t *num_new,
                          int num_qo_heads, int num_kv_heads, int d_qk, int d_v, size_t k_stride,
                          size_t v_stride, const kva_attn_params *params, const float *q,
                          const float *const *k, const float *const *v, double *o,
                          double *lse) {
  int group = num_qo_heads / num_kv_heads;
  double scale = params->sm_scale > 0.0f ? (double)params->sm_scale : 1.0 / sqrt((double)d_qk);
  double cap = params->logit_softcap;
  size_t tok = 0;
  for (int r = 0; r < num_requests; r++) {
    int kv_len = num_cached[r] + num_new[r];
    double *x = (double *)malloc((size_t)(kv_len > 0 ? kv_len : 1) * sizeof(double));
    if (!x) { /* out of memory: NaN rows make any comparison fail loudly */
      for (int t = 0; t < num_new[r]; t++, tok++)
        for (int h = 0; h < num_qo_heads; h++) {
          for (int e = 0; e < d_v; e++) o[(tok * num_qo_heads + h) * d_v + e] = NAN;
          if (lse) lse[tok * num_qo_heads + h] = NAN;
        }
      continue;
    }
    for (int t = 0; t < num_new[r]; t++, tok++) {
      int pos = num_cached[r] + t;
      for (int h = 0; h < num_qo_heads; h++) {
        int kvh = h / group;
        const float *qr = q + (tok * num_qo_heads + h) * d_qk;
        double mx = -INFINITY;
        for (int j = 0; j < kv_len; j++) {
          int vis = (!params->causal || j <= pos) &&
                    (params->window_left < 0 || j >= pos - params->window_left);
          if (!vis) {
            x[j] = -INFINITY;
            continue;
          }
          const float *kr = k[r] + ((size_t)j * num_kv_heads + kvh) * k_stride;
          double s = 0;
          for (int e = 0; e < d_qk; e++) s += (double)qr[e] * (double)kr[e];
          s *= scale;
          if (cap > 0) s = cap * tanh(s / cap);
          x[j] = s;
          if (s > mx) mx = s;
        }
        double *out = o + (tok * num_qo_heads + h) * d_v;
        for (int e = 0; e < d_v; e++) out[e] = 0;
        double sum = 0;
        if (mx > -INFINITY) {
          for (int j = 0; j < kv_len; j++) {
            if (x[j] == -INFINITY) continue;
            double p = exp(x[j] - mx);
            sum += p;
            const float *vr = v[r] + ((size_t)j * num_kv_heads + kvh) * v_stride;
            for (int e = 0; e < d_v; e++) out[e] += p * (double)vr[e];
          }
          for (int e = 0; e < d_v; e++) out[e] /= sum;
        }
        if (lse) lse[tok * num_qo_heads + h] = mx > -INFINITY ? mx + log(sum) : -INFINITY;
      }
    }
    free(x);
  }
}

void kva_ref_attention(int num_requests, const int32_t *num_cached, const int32_t *num_new,
                       int num_qo_heads, int num_kv_heads, int head_dim,
                       const kva_attn_params *params, const float *q, const float *const *k,
                       const float *const *v, double *o, double *lse) {
  ref_attention(num_requests, num_cached, num_new, num_qo_heads, num_kv_heads, head_dim,
                head_dim, (size_t)head_dim, (size_t)head_dim, params, q, k, v, o, lse);
}

void kva_ref_mla_attention(int num_requests, const int32_t *num_cached, const int32_t *num_new,
                           int num_qo_heads, const kva_attn_params *params, const float *q,
                           const float *const *latent, double *o, double *lse) {
  ref_attention(num_requests, num_cached, num_new, num_qo_heads, 1, KVA_MLA_HEAD_DIM,
                KVA_MLA_V_DIM, KVA_MLA_HEAD_DIM, KVA_MLA_HEAD_DIM, params, q, latent, latent, o,
                lse);
}

double kva_ref_rel_error(const double *ref, const float *out, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(out[i])) return INFINITY;
    double dlt = (double)out[i] - ref[i];
    num += dlt * dlt;
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return sqrt(num / den);
}

double kva_ref_max_abs_error(const double *ref, const float *out, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    if (isinf(ref[i])) {
      if (!(isinf(out[i]) && (out[i] < 0) == (ref[i] < 0))) return INFINITY;
      continue;
    }
    if (!isfinite(out[i])) return INFINITY;
    double dlt = fabs((double)out[i] - ref[i]);
    if (dlt > m) m = dlt;
  }
  return m;
}

kva_status kva_ref_read_request_kv(const kva_pool *pool, const kva_req_table *table, int slot,
                                   int layer, int len, float **k, float **v) {
  static const char *fn = "kva_ref_read_request_kv";
  KVA_CHECK_NULL(pool, fn);
  KVA_CHECK_NULL(table, fn);
  KVA_CHECK_NULL(k, fn);
  *k = NULL;
  if (v) *v = NULL;
  const kva_pool_config *c = kva_pool_get_config(pool);
  const int32_t *slots = kva_req_tokens(table, slot);
  if (!slots)
    return kva_set_error(KVA_ERR_STATE, "%s: request slot %d is not live", fn, slot);
  if (len < 0 || len > kva_req_len(table, slot))
    return kva_set_error(KVA_ERR_OUT_OF_RANGE, "%s: len %d is not in [0, %d]", fn, len,
                         kva_req_len(table, slot));
  size_t n = (size_t)(len > 0 ? len : 1) * c->num_kv_heads * c->head_dim;
  int mla = c->layout == KVA_LAYOUT_MLA;
  *k = (float *)malloc(n * sizeof(float));
  float *vv = mla || !v ? NULL : (float *)malloc(n * sizeof(float));
  if (!*k || (!mla && v && !vv)) {
    free(*k);
    free(vv);
    *k = NULL;
    return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
  }
  kva_status st = kva_pool_read_tokens(pool, layer, len, slots, *k, vv);
  if (st != KVA_OK) {
    free(*k);
    free(vv);
    *k = NULL;
    return st;
  }
  if (v) *v = vv;
  return KVA_OK;
}
