/* Pieces of `kvattn check` shared by the MHA sweep (check.c) and its MLA
 * cases (check_mla.c). */
#ifndef KVA_CHECK_COMMON_H
#define KVA_CHECK_COMMON_H

#include "cli_common.h"

/* Tolerances (see README): O rel error vs the stored-KV reference by Q/O
 * dtype; LSE abs error (an f32 output whatever the Q/O dtype); fp8 end to end
 * for logits up to twice the default scale 1/sqrt(d). e4m3's rounding of K
 * moves each logit in proportion to the logit scale, so for sharper logits
 * the fp8 bound grows with sm_scale * sqrt(d) / 2 (measured: worst 0.038 at
 * the default scale, 0.053 at 2.5-3.6x over 1000 fp8 cases). */
#define TOL_O_F32 1e-5
#define TOL_O_16 1e-2
#define TOL_LSE_F32 1e-5
#define TOL_LSE_16 1e-4
#define TOL_FP8_E2E 5e-2

typedef struct {
  double o, lse, fp8, store; /* worst errors seen (store: in units of the allowed error) */
} worst_errors;

/* Half a step of dtype's grid at |x| (scaled for fp8): the most a correctly
 * rounded store may move x. Saturated fp8 values may move to +-448 * scale. */
double check_allowed_store_error(float x, kva_dtype t, float scale);

/* fp8 end to end: rel error e2 of out against the reference on unquantized
 * K/V (ref2, n values), against TOL_FP8_E2E grown for sharp logits
 * (sm_scale 0 = 1/sqrt(d)); prints a FAIL line naming `what` and returns 1
 * when it is exceeded. Records the worst error; *e2_out gets e2. */
int check_fp8_end_to_end(const char *desc, const char *what, const double *ref2,
                         const float *out, size_t n, float sm_scale, int d, worst_errors *worst,
                         double *e2_out);

/* Draws and runs one random MLA decode case; 0 pass, 1 fail (message printed). */
int check_mla_case(kva_context *ctx, cli_rng *r, int small, int verbose, worst_errors *worst);

#endif
