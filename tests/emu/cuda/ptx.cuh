/* emulated PTX helpers (test-only) */
#pragma once
#include "emu_cuda.h"
uint32_t kva_smem_u32(const void *p);
void kva_cp_async_16(uint32_t dst, const void *src, int src_bytes);
static inline void kva_cp_async_16_zfill(uint32_t dst, const void *src, int zero_fill) {
  kva_cp_async_16(dst, src, zero_fill ? 0 : 16);
}
static inline void kva_cp_async_16_all(uint32_t dst, const void *src) { kva_cp_async_16(dst, src, 16); }
static inline const unsigned char *kva_opaque_ptr(const unsigned char *p) { return p; }
static inline uint64_t kva_l2_evict_last(void) { return 1; }
static inline uint64_t kva_l2_evict_first(void) { return 2; }
static inline uint64_t kva_l2_evict_normal(void) { return 0; }
static inline void kva_cp_async_16_hint(uint32_t dst, const void *src, int src_bytes, uint64_t) {
  kva_cp_async_16(dst, src, src_bytes);
}
static inline void kva_st_f32x2_hint(float *p, float x, float y, uint64_t) { p[0] = x; p[1] = y; }
static inline float4 kva_ldcg_f32x4_hint(const float *p, uint64_t) { return *(const float4 *)p; }
/* discard: the line's contents become indeterminate, so NaN (a read after
 * it fails the comparison) */
static inline void kva_discard_l2_128(const void *p) {
  float *f = (float *)p;
  for (int i = 0; i < 32; i++) f[i] = __builtin_nanf("");
}
void kva_cp_async_commit(void);
void emu_cp_async_wait(int n);
template <int N> static inline void kva_cp_async_wait(void) { emu_cp_async_wait(N); }
void kva_ldmatrix_x4(uint32_t r[4], uint32_t a);
void kva_ldmatrix_x4_trans(uint32_t r[4], uint32_t a);
void kva_stmatrix_x4_trans(uint32_t a, const uint32_t r[4]);
void kva_mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
void kva_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
uint32_t kva_pack_f16x2(float lo, float hi);
uint32_t kva_pack_bf16x2(float lo, float hi);
static inline float kva_ex2(float x) { return exp2f(x); }
static inline float kva_rcp(float x) { return 1.0f / x; }
uint32_t kva_cvt_e4m3x2_f16x2(uint16_t x);
static inline uint32_t kva_cvt_e4m3x2_f16x2_lo(uint32_t x) { return kva_cvt_e4m3x2_f16x2((uint16_t)(x & 0xffffu)); }
static inline uint32_t kva_cvt_e4m3x2_f16x2_hi(uint32_t x) { return kva_cvt_e4m3x2_f16x2((uint16_t)(x >> 16)); }
uint32_t kva_f16x2_to_bf16x2(uint32_t h);
uint32_t kva_tid_x_volatile(void);
static inline void kva_wgmma_fence(void) {}
static inline void kva_sched_fence_on(int) {}
void kva_wgmma_commit(void);
void emu_wgmma_wait(int n);
template <int N> static inline void kva_wgmma_wait(void) { emu_wgmma_wait(N); }
void kva_fence_proxy_async_smem(void);
/* mbarriers (phases, arrival counts), cp.async-triggered arrivals (land
 * later, then arrive), named barriers with thread counts, setmaxnreg */
void kva_mbar_init(uint32_t bar, uint32_t count);
void kva_mbar_arrive(uint32_t bar);
void kva_mbar_arrive_cnt(uint32_t bar, uint32_t count);
static inline void kva_mbar_arrive_if(uint32_t bar, int pred) { if (pred) kva_mbar_arrive(bar); }
void kva_mbar_wait(uint32_t bar, uint32_t parity);
void kva_cp_async_mbar_arrive_noinc(uint32_t bar);
void kva_cp_async_wait_all(void);
/* TMA: boxes of a 3-D tensor map (encoded by the emulator's
 * kva_tma_encode_16bit_3d) land at a random later point, swizzled, and
 * complete their bytes on the mbarrier (async proxy: no fence needed) */
void kva_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes);
void kva_tma_load_3d(uint32_t dst, const void *map, int c0, int c1, int c2, uint32_t bar);
void kva_bulk_load(uint32_t dst, const void *src, unsigned bytes, uint32_t bar);
static inline void kva_tma_prefetch_map(const void *) {}
static inline void kva_tma_prefetch_l2_3d(const void *, int, int, int) {}
static inline void kva_prefetch_l2(const void *) {}
/* checked by the emulator that uses it (the MLA one): the range must lie
 * in the latent pool, 16-byte aligned */
void kva_bulk_prefetch_l2(const void *p, unsigned bytes);
void kva_bar_sync(int id, int count);
void kva_bar_arrive(int id, int count);
template <int N> static inline void kva_setmaxnreg_inc(void) {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg range");
}
template <int N> static inline void kva_setmaxnreg_dec(void) {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg range");
}
void kva_wgmma_m64n128k16_ss_bf16(float d[64], uint64_t da, uint64_t db, int scale_d);
void kva_wgmma_m64n128k16_ss_f16(float d[64], uint64_t da, uint64_t db, int scale_d);
void kva_wgmma_m64n32k16_ss_bf16(float d[16], uint64_t da, uint64_t db, int scale_d);
void kva_wgmma_m64n32k16_ss_f16(float d[16], uint64_t da, uint64_t db, int scale_d);
void kva_wgmma_m64n64k16_ss_bf16(float d[32], uint64_t da, uint64_t db, int scale_d);
void kva_wgmma_m64n64k16_ss_f16(float d[32], uint64_t da, uint64_t db, int scale_d);
void kva_wgmma_m64n64k16_rs_bf16(float d[32], const uint32_t a[4], uint64_t db, int scale_d);
void kva_wgmma_m64n64k16_rs_f16(float d[32], const uint32_t a[4], uint64_t db, int scale_d);
void kva_wgmma_m64n248k16_ss_bf16_tb(float d[124], uint64_t da, uint64_t db);
void kva_wgmma_m64n248k16_ss_f16_tb(float d[124], uint64_t da, uint64_t db);
void kva_wgmma_m64n8k16_ss_bf16_tb(float d[4], uint64_t da, uint64_t db);
void kva_wgmma_m64n8k16_ss_f16_tb(float d[4], uint64_t da, uint64_t db);
void kva_wgmma_m64n128k16_rs_bf16_tb(float d[64], const uint32_t a[4], uint64_t db);
void kva_wgmma_m64n128k16_rs_f16_tb(float d[64], const uint32_t a[4], uint64_t db);
void kva_wgmma_m64n64k16_rs_bf16_tb(float d[32], const uint32_t a[4], uint64_t db);
void kva_wgmma_m64n64k16_rs_f16_tb(float d[32], const uint32_t a[4], uint64_t db);
void kva_wgmma_m64n256k16_rs_bf16_tb(float d[128], const uint32_t a[4], uint64_t db);
void kva_wgmma_m64n256k16_rs_f16_tb(float d[128], const uint32_t a[4], uint64_t db);
void kva_wgmma_m64n256k16_ss_bf16_tb(float d[128], uint64_t da, uint64_t db);
void kva_wgmma_m64n256k16_ss_f16_tb(float d[128], uint64_t da, uint64_t db);
void kva_wgmma_m64n128k16_ss_f16_tb(float d[64], uint64_t da, uint64_t db);
void kva_wgmma_m64n16k16_rs_f16(float d[8], const uint32_t a[4], uint64_t db, int scale_d);
void kva_wgmma_m64n32k16_rs_f16(float d[16], const uint32_t a[4], uint64_t db, int scale_d);
static inline void kva_reg_fence_f32(float *) {}
static inline void kva_reg_fence_u32(uint32_t *) {}

/* timeline stamps (cuda/trace.h; a.trace is NULL here) */
static inline unsigned long long kva_globaltimer(void) { return 0; }
static inline unsigned kva_smid(void) { return 0; }
