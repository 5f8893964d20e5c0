/* Merging partial attention states by their LSE (FlashInfer's merge_state). */
#include <math.h>
#include <stdlib.h>

#include "core/dtype.h"
#include "cpu/cpu_internal.h"

void kva_cpu_merge_rows(int n, int d, const float *const *rows, const float *lses, void *out,
                        kva_dtype dtype, float *lse_out) {
  float m = -INFINITY;
  for (int j = 0; j < n; j++)
    if (lses[j] > m) m = lses[j];
  if (m == -INFINITY) { /* no keys anywhere */
    for (int e = 0; e < d; e++) kva_store_f32(out, (size_t)e, dtype, 0.0f);
    if (lse_out) *lse_out = -INFINITY;
    return;
  }
  float sum = 0.0f, w[64];
  float acc[KVA_MLA_HEAD_DIM];
  for (int e = 0; e < d; e++) acc[e] = 0.0f;
  for (int j0 = 0; j0 < n; j0 += 64) {
    int nj = n - j0 < 64 ? n - j0 : 64;
    for (int j = 0; j < nj; j++) {
      w[j] = lses[j0 + j] == -INFINITY ? 0.0f : expf(lses[j0 + j] - m);
      sum += w[j];
      if (w[j] != 0.0f)
        for (int e = 0; e < d; e++) acc[e] += w[j] * rows[j0 + j][e];
    }
  }
  float inv = 1.0f / sum;
  for (int e = 0; e < d; e++) kva_store_f32(out, (size_t)e, dtype, acc[e] * inv);
  if (lse_out) *lse_out = m + logf(sum);
}

kva_status kva_cpu_merge_states(kva_context *ctx, int num_tokens, int num_heads, int head_dim,
                                kva_dtype dtype, const void *v_a, const float *s_a,
                                const void *v_b, const float *s_b, void *v_out, float *s_out) {
  (void)ctx;
  float *ra = (float *)malloc((size_t)head_dim * 2 * sizeof(float));
  if (!ra) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_merge_states: out of host memory");
  float *rb = ra + head_dim;
  size_t esz = kva_dtype_size(dtype);
  for (int t = 0; t < num_tokens; t++)
    for (int h = 0; h < num_heads; h++) {
      size_t i = (size_t)t * num_heads + h, base = i * (size_t)head_dim;
      for (int e = 0; e < head_dim; e++) {
        ra[e] = kva_load_f32(v_a, base + e, dtype);
        rb[e] = kva_load_f32(v_b, base + e, dtype);
      }
      const float *rows[2] = {ra, rb};
      float lses[2] = {s_a[i], s_b[i]};
      float lse;
      kva_cpu_merge_rows(2, head_dim, rows, lses, (char *)v_out + base * esz, dtype, &lse);
      if (s_out) s_out[i] = lse;
    }
  free(ra);
  return KVA_OK;
}
