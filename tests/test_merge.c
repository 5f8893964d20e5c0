/* kva_merge_states on the CPU against double math (FlashInfer merge_state):
 * f32/f16/bf16 states, -inf LSEs on either or both sides, output aliasing
 * input a (and b), s_out NULL, argument errors; and the n-way merge the
 * split-KV combine uses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "cpu/cpu_internal.h"
#include "testutil.h"

static tu_rng g_rng = {0x6d65726765ull};

static float uni(void) { return tu_uniform(&g_rng); }

/* A random LSE; every fifth is -inf (no keys). */
static float rand_lse(void) { return tu_int(&g_rng, 0, 4) == 0 ? -INFINITY : uni() * 8.0f; }

/* Merged row and LSE in double from the inputs as stored (dtype-rounded). */
static void merge_ref(int d, const double *va, double sa, const double *vb, double sb, double *out,
                      double *s) {
  double m = sa > sb ? sa : sb;
  if (m == -INFINITY) {
    for (int e = 0; e < d; e++) out[e] = 0.0;
    *s = -INFINITY;
    return;
  }
  double wa = sa == -INFINITY ? 0.0 : exp(sa - m), wb = sb == -INFINITY ? 0.0 : exp(sb - m);
  for (int e = 0; e < d; e++) out[e] = (wa * va[e] + wb * vb[e]) / (wa + wb);
  *s = m + log(wa + wb);
}

/* alias: 0 separate output, 1 output = a, 2 output = b */
static void merge_case(kva_context *ctx, kva_dtype t, int tokens, int heads, int d, int alias,
                       int with_s_out) {
  size_t rows = (size_t)tokens * heads, n = rows * d, esz = kva_dtype_size(t);
  void *va = malloc(n * esz), *vb = malloc(n * esz), *vo = malloc(n * esz);
  float *sa = (float *)malloc(rows * 4), *sb = (float *)malloc(rows * 4),
        *so = (float *)malloc(rows * 4);
  double *da = (double *)malloc(n * 8), *db = (double *)malloc(n * 8), *want = (double *)malloc(n * 8);
  double *ws = (double *)malloc(rows * 8);
  for (size_t i = 0; i < n; i++) {
    kva_store_f32(va, i, t, uni() * 3.0f);
    kva_store_f32(vb, i, t, uni() * 3.0f);
    kva_store_f32(vo, i, t, NAN);
    da[i] = kva_load_f32(va, i, t);
    db[i] = kva_load_f32(vb, i, t);
  }
  for (size_t r = 0; r < rows; r++) {
    sa[r] = rand_lse();
    sb[r] = rand_lse();
    so[r] = NAN;
    merge_ref(d, da + r * d, sa[r], db + r * d, sb[r], want + r * d, &ws[r]);
  }
  void *out = alias == 1 ? va : alias == 2 ? vb : vo;
  float *s_out = !with_s_out ? NULL : alias == 1 ? sa : alias == 2 ? sb : so;
  kva_status st = kva_merge_states(ctx, tokens, heads, d, t, va, sa, vb, sb, out, s_out);
  CHECK(st == KVA_OK, "merge_states: %s", kva_last_error());
  double tol = t == KVA_F32 ? 2e-6 : t == KVA_F16 ? 1e-3 : 8e-3; /* relative, per element */
  size_t bad = 0, bad_s = 0, first = 0;
  for (size_t r = 0; r < rows; r++) {
    double scale = 0;
    for (int e = 0; e < d; e++) scale = fmax(scale, fabs(want[r * d + e]));
    for (int e = 0; e < d; e++) {
      double got = kva_load_f32(out, r * d + e, t);
      if (!(fabs(got - want[r * d + e]) <= tol * scale + 1e-30)) {
        if (!bad) first = r * d + e;
        bad++;
      }
    }
    if (s_out) {
      double g = s_out[r];
      int ok = isinf(ws[r]) ? (isinf(g) && g < 0) : fabs(g - ws[r]) <= 2e-6 * (1 + fabs(ws[r]));
      bad_s += !ok;
    }
  }
  CHECK(bad == 0, "%s %dx%dx%d alias %d: %zu of %zu elements wrong, first %zu got %g want %g",
        kva_dtype_name(t), tokens, heads, d, alias, bad, n, first,
        (double)kva_load_f32(out, first, t), want[first]);
  CHECK(bad_s == 0, "%s %dx%dx%d alias %d: %zu LSEs wrong", kva_dtype_name(t), tokens, heads, d,
        alias, bad_s);
  if (!with_s_out && alias == 0) {
    size_t touched = 0;
    for (size_t r = 0; r < rows; r++) touched += !isnan(so[r]);
    CHECK(touched == 0, "s_out NULL but %zu LSE slots of an unrelated buffer changed", touched);
  }
  free(va), free(vb), free(vo), free(sa), free(sb), free(so), free(da), free(db), free(want),
      free(ws);
}

/* The exact -inf cases: a only, b only, neither. */
static void infinite_cases(kva_context *ctx) {
  enum { D = 16 };
  float a[3][D], b[3][D], o[3][D];
  float sa[3] = {1.5f, -INFINITY, -INFINITY}, sb[3] = {-INFINITY, -0.25f, -INFINITY}, so[3];
  for (int r = 0; r < 3; r++)
    for (int e = 0; e < D; e++) a[r][e] = uni(), b[r][e] = uni(), o[r][e] = NAN;
  /* b's row 0 and a's row 1 are NaN: with weight 0 they must not leak */
  for (int e = 0; e < D; e++) b[0][e] = NAN, a[1][e] = NAN;
  CHECK_STATUS(kva_merge_states(ctx, 3, 1, D, KVA_F32, a, sa, b, sb, o, so), KVA_OK);
  int ok0 = so[0] == 1.5f, ok1 = so[1] == -0.25f, ok2 = isinf(so[2]) && so[2] < 0;
  for (int e = 0; e < D; e++) {
    ok0 &= o[0][e] == a[0][e];
    ok1 &= o[1][e] == b[1][e];
    ok2 &= o[2][e] == 0.0f;
  }
  CHECK(ok0, "b = -inf: a must pass through unchanged");
  CHECK(ok1, "a = -inf: b must pass through unchanged");
  CHECK(ok2, "both -inf: O 0 and LSE -inf");
}

/* n-way merge (the split-KV combine) against double, strided like partial rows. */
static void merge_rows_cases(void) {
  enum { N = 9, D = 40, STRIDE = 56 };
  for (int it = 0; it < 200; it++) {
    int n = tu_int(&g_rng, 1, N), d = 8 * tu_int(&g_rng, 1, D / 8);
    float o[N * STRIDE], lse[N * 3], out[D], lse_out = NAN;
    double want[D] = {0}, m = -INFINITY, sum = 0;
    for (int j = 0; j < n; j++) {
      lse[j * 3] = rand_lse();
      for (int e = 0; e < d; e++) o[j * STRIDE + e] = uni();
      if (lse[j * 3] > m) m = lse[j * 3];
    }
    for (int j = 0; j < n && m > -INFINITY; j++) {
      if (lse[j * 3] == -INFINITY) continue;
      double w = exp(lse[j * 3] - m);
      sum += w;
      for (int e = 0; e < d; e++) want[e] += w * o[j * STRIDE + e];
    }
    for (int e = 0; e < d; e++) {
      want[e] = sum > 0 ? want[e] / sum : 0.0;
      out[e] = NAN;
    }
    double want_lse = sum > 0 ? m + log(sum) : -INFINITY;
    kva_cpu_merge_rows(n, d, o, STRIDE, lse, 3, out, KVA_F32, &lse_out);
    int bad = 0;
    for (int e = 0; e < d; e++) bad += !(fabs(out[e] - want[e]) <= 2e-6);
    int lse_ok = isinf(want_lse) ? isinf(lse_out) && lse_out < 0
                                 : fabs(lse_out - want_lse) <= 2e-6 * (1 + fabs(want_lse));
    CHECK(bad == 0 && lse_ok, "merge_rows n %d d %d: %d wrong, lse %g want %g", n, d, bad,
          (double)lse_out, want_lse);
  }
}

static void argument_errors(kva_context *ctx) {
  float v[64], s[4];
  for (int i = 0; i < 64; i++) v[i] = uni();
  for (int i = 0; i < 4; i++) s[i] = uni();
  CHECK_STATUS(kva_merge_states(NULL, 1, 1, 8, KVA_F32, v, s, v, s, v, s), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_merge_states(ctx, 1, 1, 8, KVA_F32, NULL, s, v, s, v, s), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_merge_states(ctx, 1, 1, 8, KVA_F32, v, s, v, NULL, v, s), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_merge_states(ctx, 1, 1, 8, KVA_F32, v, s, v, s, NULL, s), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_merge_states(ctx, 0, 1, 8, KVA_F32, v, s, v, s, v, s), KVA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kva_merge_states(ctx, 1, -2, 8, KVA_F32, v, s, v, s, v, s),
               KVA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kva_merge_states(ctx, 1, 1, 0, KVA_F32, v, s, v, s, v, s), KVA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kva_merge_states(ctx, 1, 1, 1024, KVA_F32, v, s, v, s, v, s), KVA_ERR_UNSUPPORTED);
  CHECK_STATUS(kva_merge_states(ctx, 1, 1, 8, KVA_FP8_E4M3, v, s, v, s, v, s),
               KVA_ERR_UNSUPPORTED);
  CHECK_STATUS(kva_merge_states(ctx, 1, 1, 8, (kva_dtype)9, v, s, v, s, v, s),
               KVA_ERR_INVALID_ARGUMENT);
}

int main(void) {
  kva_context_config cc = {KVA_DEVICE_CPU, 2, 0};
  kva_context *ctx = NULL;
  CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_OK);
  if (!ctx) return tu_summary("test_merge");
  static const kva_dtype types[3] = {KVA_F32, KVA_F16, KVA_BF16};
  static const int dims[] = {8, 64, 128, 256, 512, 72};
  for (int it = 0; it < 90; it++) {
    kva_dtype t = types[it % 3];
    int d = dims[tu_int(&g_rng, 0, 5)];
    merge_case(ctx, t, tu_int(&g_rng, 1, 9), tu_int(&g_rng, 1, 6), d, it % 3 == 1 ? 1 : 0,
               it % 5 != 0);
  }
  for (int alias = 0; alias <= 2; alias++)
    for (int k = 0; k < 3; k++) merge_case(ctx, types[k], 5, 4, 64, alias, 1);
  merge_case(ctx, KVA_F32, 3, 2, KVA_MLA_HEAD_DIM, 1, 1); /* the largest head_dim allowed */
  infinite_cases(ctx);
  merge_rows_cases();
  argument_errors(ctx);
  kva_context_destroy(ctx);
  return tu_summary("test_merge");
}
