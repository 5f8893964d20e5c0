/* Double-precision reference attention: plain loops, no SIMD, no threads.
 * Used by tests and `kvattn check` only; never by the library. */
#ifndef KVA_REFERENCE_H
#define KVA_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "kvattn.h"

/* q [total_q, hq, d]; k[r], v[r] dense [kv_len_r, hkv, d] (already
 * dequantized) with kv_len_r = num_cached[r] + num_new[r]; o [total_q, hq, d];
 * lse [total_q, hq] or NULL. Semantics as docs/design.md. */
void kva_ref_attention(int num_requests, const int32_t *num_cached, const int32_t *num_new,
                       int num_qo_heads, int num_kv_heads, int head_dim,
                       const kva_attn_params *params, const float *q, const float *const *k,
                       const float *const *v, double *o, double *lse);

/* MLA (one latent KV head): q [total_q, hq, 576]; latent[r] dense
 * [kv_len_r, 576] (dequantized); K is the whole latent, V its first 512 dims;
 * o [total_q, hq, 512]; lse [total_q, hq] or NULL. sm_scale 0 = 1/sqrt(576). */
void kva_ref_mla_attention(int num_requests, const int32_t *num_cached, const int32_t *num_new,
                           int num_qo_heads, const kva_attn_params *params, const float *q,
                           const float *const *latent, double *o, double *lse);

/* ||out - ref|| / ||ref||; +inf if out holds a NaN/inf. */
double kva_ref_rel_error(const double *ref, const float *out, size_t n);
/* max |out - ref| over finite ref entries (-inf must match -inf); +inf on mismatch. */
double kva_ref_max_abs_error(const double *ref, const float *out, size_t n);

/* Dense f32 K/V of positions [0, len) of a request, read from the pool on any
 * device. *k and *v are malloc'ed (v NULL for MLA); caller frees. */
kva_status kva_ref_read_request_kv(const kva_pool *pool, const kva_req_table *table, int slot,
                                   int layer, int len, float **k, float **v);

#endif
