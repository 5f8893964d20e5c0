/* Merging partial attention states by their LSE (FlashInfer's merge_state),
 * shared by kva_merge_states and the split-KV combine of attention. */
#include <math.h>
#include <stdlib.h>

#include "core/dtype.h"
#include "cpu/cpu_internal.h"

void kva_cpu_merge_rows(int n, int d, const float *o, size_t o_stride, const float *lse,
                        size_t lse_stride, void *out, kva_dtype dtype, float *lse_out) {
  float m = -INFINITY;
  for (int j = 0; j < n; j++) {
    float s = lse[(size_t)j * lse_stride];
    if (s > m) m = s;
  }
  if (m == -INFINITY) { /* no keys in any state */
    for (int e = 0; e < d; e++) kva_store_f32(out, (size_t)e, dtype, 0.0f);
    if (lse_out) *lse_out = -INFINITY;
    return;
  }
  float acc[KVA_MLA_HEAD_DIM];
  for (int e = 0; e < d; e++) acc[e] = 0.0f;
  float sum = 0.0f;
  for (int j = 0; j < n; j++) {
    float s = lse[(size_t)j * lse_stride];
    if (s == -INFINITY) continue; /* its O row may be anything; it weighs 0 */
    float w = expf(s - m);
    const float *row = o + (size_t)j * o_stride;
    sum += w;
    for (int e = 0; e < d; e++) acc[e] += w * row[e];
  }
  float inv = 1.0f / sum; /* sum >= 1: the largest state has weight 1 */
  for (int e = 0; e < d; e++) kva_store_f32(out, (size_t)e, dtype, acc[e] * inv);
  if (lse_out) *lse_out = m + logf(sum);
}

kva_status kva_cpu_merge_states(kva_context *ctx, int num_tokens, int num_heads, int head_dim,
                                kva_dtype dtype, const void *v_a, const float *s_a,
                                const void *v_b, const float *s_b, void *v_out, float *s_out) {
  (void)ctx;
  /* both inputs of a row are read into f32 before its output is written, so
   * v_out/s_out may alias a's (or b's) buffers */
  float rows[2 * KVA_MLA_HEAD_DIM];
  size_t esz = kva_dtype_size(dtype), nrows = (size_t)num_tokens * (size_t)num_heads;
  for (size_t i = 0; i < nrows; i++) {
    size_t base = i * (size_t)head_dim;
    for (int e = 0; e < head_dim; e++) {
      rows[e] = kva_load_f32(v_a, base + (size_t)e, dtype);
      rows[head_dim + e] = kva_load_f32(v_b, base + (size_t)e, dtype);
    }
    float lses[2] = {s_a[i], s_b[i]}, lse;
    kva_cpu_merge_rows(2, head_dim, rows, (size_t)head_dim, lses, 1, (char *)v_out + base * esz,
                       dtype, &lse);
    if (s_out) s_out[i] = lse;
  }
  return KVA_OK;
}

void kva_cpu_combine_request(const kva_plan *p, int r, int hq, int dv, void *o, float *lse,
                             kva_dtype dtype) {
  int nsplit = p->split_indptr[r + 1] - p->split_indptr[r];
  if (nsplit <= 1) return;
  const float *po = (const float *)p->partial_o, *pl = (const float *)p->partial_lse;
  size_t esz = kva_dtype_size(dtype);
  int nt = p->num_new[r];
  for (int t = 0; t < nt; t++)
    for (int h = 0; h < hq; h++) {
      size_t row0 = (size_t)p->split_row_offset[r] + (size_t)t;
      size_t out = ((size_t)p->cu_seqlens_q[r] + t) * hq + h;
      float s;
      /* split j's row is row0 + j * nt */
      kva_cpu_merge_rows(nsplit, dv, po + (row0 * hq + h) * dv, (size_t)nt * hq * dv,
                         pl + row0 * hq + h, (size_t)nt * hq, (char *)o + out * dv * esz, dtype,
                         &s);
      if (lse) lse[out] = s;
    }
}
