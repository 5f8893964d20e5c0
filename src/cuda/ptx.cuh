/* Inline PTX used by the CUDA kernels (sm_90a): cp.async, ldmatrix,
 * mma.sync, conversions, fast math, and (last) the wgmma/async-proxy
 * helpers. Each wrapper is one instruction (or a short fixed sequence) so the
 * kernels read as plain C. Shared-memory operands are 32-bit shared-window
 * addresses (kva_smem_u32). Add new helpers at the end. */
#ifndef KVA_CUDA_PTX_CUH
#define KVA_CUDA_PTX_CUH

#include <stdint.h>

/* ---- addresses ----------------------------------------------------------- */

static __device__ __forceinline__ uint32_t kva_smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* %tid.x re-read (volatile): keeps values derived from it from being hoisted
 * and held in registers across a loop. */
static __device__ __forceinline__ uint32_t kva_tid_x_volatile(void) {
  uint32_t t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

/* ---- cp.async (sm_80+) ---------------------------------------------------- */

/* 16 bytes global -> shared, L1 bypass. src_bytes 0 zero-fills the 16 bytes
 * without reading (src must still be a valid address). */
static __device__ __forceinline__ void kva_cp_async_16(uint32_t dst, const void *src,
                                                       int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
/* The same with the zero-fill as a predicate (ignore-src): one compare
 * instead of the src-size arithmetic in the producer's hot loop. */
static __device__ __forceinline__ void kva_cp_async_16_zfill(uint32_t dst, const void *src,
                                                             int zero_fill) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.s32 p, %2, 0;\n"
      " cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(dst),
      "l"(src), "r"(zero_fill)
      : "memory");
}
/* 16 bytes, no zero-fill (the address is always read). */
static __device__ __forceinline__ void kva_cp_async_16_all(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
/* L2 eviction policies (fraction 1.0) for the .L2::cache_hint forms. */
#define KVA_L2_POLICY(name, priority)                                                   \
  static __device__ __forceinline__ uint64_t name(void) {                               \
    uint64_t p;                                                                         \
    asm volatile("createpolicy.fractional.L2::" priority ".b64 %0, 1.0;\n" : "=l"(p)); \
    return p;                                                                           \
  }
KVA_L2_POLICY(kva_l2_evict_last, "evict_last")
KVA_L2_POLICY(kva_l2_evict_first, "evict_first")
KVA_L2_POLICY(kva_l2_evict_normal, "evict_normal")
#undef KVA_L2_POLICY
/* kva_cp_async_16 with an L2 eviction policy. */
static __device__ __forceinline__ void kva_cp_async_16_hint(uint32_t dst, const void *src,
                                                            int src_bytes, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(src_bytes), "l"(pol)
               : "memory");
}
static __device__ __forceinline__ void kva_st_f32x2_hint(float *p, float x, float y, uint64_t pol) {
  asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(p), "f"(x), "f"(y),
               "l"(pol)
               : "memory");
}
static __device__ __forceinline__ float4 kva_ldcg_f32x4_hint(const float *p, uint64_t pol) {
  float4 v;
  asm volatile("ld.global.cg.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p), "l"(pol));
  return v;
}
/* Drops a 128-byte L2 line without writing it back (its contents become
 * indeterminate): for scratch that has been read for the last time. */
static __device__ __forceinline__ void kva_discard_l2_128(const void *p) {
  asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(p) : "memory");
}
/* A 64-bit value the compiler must keep in one register pair (so that an
 * address add is one IMAD.WIDE, not a uniform-register add per use). */
static __device__ __forceinline__ const unsigned char *kva_opaque_ptr(const unsigned char *p) {
  const unsigned char *r;
  asm("mov.b64 %0, %1;" : "=l"(r) : "l"(p));
  return r;
}
static __device__ __forceinline__ void kva_cp_async_commit(void) {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until at most N of this thread's committed groups are pending. */
template <int N>
static __device__ __forceinline__ void kva_cp_async_wait(void) {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- ldmatrix / mma.sync -------------------------------------------------- */

/* Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
 * lane t receives row t/4, elements 2(t%4), 2(t%4)+1 of each (r[i]). */
static __device__ __forceinline__ void kva_ldmatrix_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
/* Same, transposed: lane t receives rows 2(t%4), 2(t%4)+1 of column t/4. */
static __device__ __forceinline__ void kva_ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
/* Four 8x8 b16 matrices stored transposed (sm_90): lane t holds row t/4,
 * elements 2(t%4), 2(t%4)+1 of matrix i in r[i] (an mma fragment); lanes
 * 8i..8i+7 give the addresses (16-byte aligned) that take columns 0..7 of
 * matrix i, eight elements each. */
static __device__ __forceinline__ void kva_stmatrix_x4_trans(uint32_t addr, const uint32_t r[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
/* c += A (16x16, row) * B (16x8, col), f32 accumulate. */
static __device__ __forceinline__ void kva_mma_f16(float c[4], const uint32_t a[4], uint32_t b0,
                                                   uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void kva_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0,
                                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- conversions ---------------------------------------------------------- */

/* (lo, hi) -> packed pair, round to nearest even; lo in the low half. */
static __device__ __forceinline__ uint32_t kva_pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
static __device__ __forceinline__ uint32_t kva_pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
/* Two fp8 e4m3 (low byte first) -> f16x2 (exact). */
static __device__ __forceinline__ uint32_t kva_cvt_e4m3x2_f16x2(uint16_t x) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(x));
  return r;
}
/* The low / high two bytes of x (e4m3, low byte first) -> f16x2 (exact);
 * the halves taken with a mov.b32 split, which ptxas can fold into the
 * conversion's operand instead of a shift. */
static __device__ __forceinline__ uint32_t kva_cvt_e4m3x2_f16x2_lo(uint32_t x) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}\n"
      : "=r"(r)
      : "r"(x));
  return r;
}
static __device__ __forceinline__ uint32_t kva_cvt_e4m3x2_f16x2_hi(uint32_t x) {
  uint32_t r;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n"
      : "=r"(r)
      : "r"(x));
  return r;
}
/* f16x2 -> bf16x2 through f32 (exact for values from e4m3). */
static __device__ __forceinline__ uint32_t kva_f16x2_to_bf16x2(uint32_t h) {
  uint32_t r;
  asm("{\n.reg .f16 lo, hi;\n.reg .f32 flo, fhi;\nmov.b32 {lo, hi}, %1;\n"
      "cvt.f32.f16 flo, lo;\ncvt.f32.f16 fhi, hi;\ncvt.rn.bf16x2.f32 %0, fhi, flo;\n}\n"
      : "=r"(r)
      : "r"(h));
  return r;
}

/* Byte permute: result byte i = byte sel[4i+3:4i] of the 8-byte value {b, a}
 * (a = bytes 0-3). */
static __device__ __forceinline__ uint32_t kva_prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
/* Two e4m3 (low byte first) -> bf16x2, exact (through f16x2). */
static __device__ __forceinline__ uint32_t kva_cvt_e4m3x2_bf16x2(uint16_t x) {
  return kva_f16x2_to_bf16x2(kva_cvt_e4m3x2_f16x2(x));
}

/* ---- warp shuffles ---------------------------------------------------------- */

static __device__ __forceinline__ float kva_shfl_xor_f32(float v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
/* max / sum over the 4 lanes of a quad (lanes 4g..4g+3: one mma row) */
static __device__ __forceinline__ float kva_quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
static __device__ __forceinline__ float kva_quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
static __device__ __forceinline__ float kva_warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}
static __device__ __forceinline__ float kva_warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

/* ---- fast math ------------------------------------------------------------ */

/* 2^x (relative error ~2^-22; -inf -> +0). */
static __device__ __forceinline__ float kva_ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}
/* 1/x (inf -> 0). */
static __device__ __forceinline__ float kva_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

/* ---- wgmma and the async proxy (sm_90a) ----------------------------------- */

static __device__ __forceinline__ void kva_wgmma_fence(void) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void kva_wgmma_commit(void) {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
static __device__ __forceinline__ void kva_wgmma_wait(void) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Programmatic dependent launch: a kernel launched with the programmatic
 * stream serialization attribute may start once every CTA of the kernel
 * before it called launch_dependents (or exited); wait blocks until that
 * kernel completed and its memory is visible. */
static __device__ __forceinline__ void kva_griddep_launch_dependents(void) {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
static __device__ __forceinline__ void kva_griddep_wait(void) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
/* Atomic add with acquire-release semantics at GPU scope; the old value.
 * After a __syncthreads, thread 0's release covers the whole CTA's writes
 * (cumulativity), and its acquire followed by a __syncthreads orders the
 * CTA's later reads after the writes it observed: no fence per thread. */
static __device__ __forceinline__ int kva_atom_add_acq_rel_gpu(int *p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
/* Load with acquire semantics at GPU scope (pairs with a release). */
static __device__ __forceinline__ int kva_ld_acquire_gpu(const int *p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
/* Nanoseconds, one clock for all SMs (timelines across CTAs). */
static __device__ __forceinline__ unsigned long long kva_globaltimer(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
static __device__ __forceinline__ unsigned kva_smid(void) {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(s));
  return s;
}
/* Makes this thread's generic-proxy shared writes (st.shared, cp.async)
 * visible to the async proxy (wgmma operands). */
static __device__ __forceinline__ void kva_fence_proxy_async_smem(void) {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#define KVA_WGMMA_D64                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define KVA_WGMMA_OUT64(d)                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

/* D (64x128 f32 per warpgroup; warp w holds rows 16w.., element 4j+e at row
 * g + 8(e>>1), column 8j + 2t + (e&1)) = A (64x16, smem descriptor, K-major)
 * * B (16x128, smem descriptor, K-major) + (scale_d ? D : 0). */
static __device__ __forceinline__ void kva_wgmma_m64n128k16_ss_bf16(float d[64], uint64_t desc_a,
                                                                    uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KVA_WGMMA_D64
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : KVA_WGMMA_OUT64(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
static __device__ __forceinline__ void kva_wgmma_m64n128k16_ss_f16(float d[64], uint64_t desc_a,
                                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " KVA_WGMMA_D64
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : KVA_WGMMA_OUT64(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
/* Same shape at N = 64 (32 accumulators, columns 8j + 2t + (e&1), j < 8):
 * MLA's S = Q K^T over a 64-key tile. */
#define KVA_WGMMA_D32                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define KVA_WGMMA_OUT32(d)                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
static __device__ __forceinline__ void kva_wgmma_m64n64k16_ss_bf16(float d[32], uint64_t desc_a,
                                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " KVA_WGMMA_D32
      ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : KVA_WGMMA_OUT32(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
static __device__ __forceinline__ void kva_wgmma_m64n64k16_ss_f16(float d[32], uint64_t desc_a,
                                                                  uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " KVA_WGMMA_D32
      ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : KVA_WGMMA_OUT32(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
/* Same shape with A (64x16) from registers (mma.sync A-fragment layout per
 * warp) and B K-major: MLA v9's S with Q's latent columns in registers. */
static __device__ __forceinline__ void kva_wgmma_m64n64k16_rs_bf16(float d[32], const uint32_t a[4],
                                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " KVA_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : KVA_WGMMA_OUT32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
static __device__ __forceinline__ void kva_wgmma_m64n64k16_rs_f16(float d[32], const uint32_t a[4],
                                                                  uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " KVA_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : KVA_WGMMA_OUT32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
/* N = 32 (16 accumulators, j < 4): MLA's half-K partial S over 32 keys. */
#define KVA_WGMMA_D16 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define KVA_WGMMA_OUT16(d)                                                                        \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15])
static __device__ __forceinline__ void kva_wgmma_m64n32k16_ss_bf16(float d[16], uint64_t desc_a,
                                                                   uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " KVA_WGMMA_D16
      ", %16, %17, p, 1, 1, 0, 0;\n}\n"
      : KVA_WGMMA_OUT16(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
static __device__ __forceinline__ void kva_wgmma_m64n32k16_ss_f16(float d[16], uint64_t desc_a,
                                                                  uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " KVA_WGMMA_D16
      ", %16, %17, p, 1, 1, 0, 0;\n}\n"
      : KVA_WGMMA_OUT16(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
/* MLA v10's keys-as-M shapes (f16, N = 16 or 32 query rows): A from
 * registers (K for S^T = K Q^T, V^T for O^T += V^T P^T), B K-major. */
#define KVA_WGMMA_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define KVA_WGMMA_OUT8(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
static __device__ __forceinline__ void kva_wgmma_m64n16k16_rs_f16(float d[8], const uint32_t a[4],
                                                                  uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " KVA_WGMMA_D8
      ", {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : KVA_WGMMA_OUT8(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
static __device__ __forceinline__ void kva_wgmma_m64n32k16_rs_f16(float d[16], const uint32_t a[4],
                                                                  uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " KVA_WGMMA_D16
      ", {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : KVA_WGMMA_OUT16(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
/* D += A (64x16 from registers, mma.sync A-fragment layout per warp) * B
 * (16x128, smem descriptor, MN-major: transposed). */
static __device__ __forceinline__ void kva_wgmma_m64n128k16_rs_bf16_tb(float d[64],
                                                                       const uint32_t a[4],
                                                                       uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KVA_WGMMA_D64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : KVA_WGMMA_OUT64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}
static __device__ __forceinline__ void kva_wgmma_m64n128k16_rs_f16_tb(float d[64],
                                                                      const uint32_t a[4],
                                                                      uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " KVA_WGMMA_D64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : KVA_WGMMA_OUT64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}


/* D += A (64x16, smem descriptor, K-major) * B (16xN, smem descriptor,
 * MN-major: transposed) at N = 248 (124 accumulators, columns 8j + 2t +
 * (e&1), j < 31) and N = 8 (4): MLA v9's P V over 248 of a warpgroup's
 * 256 columns of O, and the 8 left over, which warpgroup 0 takes. */
static __device__ __forceinline__ void kva_wgmma_m64n248k16_ss_bf16_tb(float d[124], uint64_t desc_a,
                                                                   uint64_t desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n248k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123}, %124, %125, 1, 1, 1, 0, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123])
               : "l"(desc_a), "l"(desc_b));
}
static __device__ __forceinline__ void kva_wgmma_m64n248k16_ss_f16_tb(float d[124], uint64_t desc_a,
                                                                   uint64_t desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n248k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123}, %124, %125, 1, 1, 1, 0, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123])
               : "l"(desc_a), "l"(desc_b));
}
static __device__ __forceinline__ void kva_wgmma_m64n8k16_ss_bf16_tb(float d[4], uint64_t desc_a,
                                                                 uint64_t desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(desc_a), "l"(desc_b));
}
static __device__ __forceinline__ void kva_wgmma_m64n8k16_ss_f16_tb(float d[4], uint64_t desc_a,
                                                                 uint64_t desc_b) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 1;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(desc_a), "l"(desc_b));
}

/* Register fences: the compiler must assume x is read and rewritten here,
 * so no use of a wgmma accumulator (or A operand) moves across the
 * wgmma.wait_group that makes it valid (CUTLASS's fence_operand). */
static __device__ __forceinline__ void kva_reg_fence_f32(float *x) {
  asm volatile("" : "+f"(*x)::"memory");
}
static __device__ __forceinline__ void kva_reg_fence_u32(uint32_t *x) {
  asm volatile("" : "+r"(*x)::"memory");
}

/* A branch on `never` (a value that is never nonzero, computed last by the
 * code that must stay before what follows): ptxas does not schedule
 * instructions across it, e.g. a wgmma wait above the softmax. */
static __device__ __forceinline__ void kva_sched_fence_on(int never) {
  if (never) asm volatile("nanosleep.u32 0;\n" ::: "memory");
}

/* ---- mbarriers, named barriers, register reallocation (sm_90a) ------------ */

/* 64-bit mbarrier in shared memory at `bar`, `count` arrivals per phase.
 * Make the init visible (a CTA barrier) before any other thread uses it. */
static __device__ __forceinline__ void kva_mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* One arrival (release, CTA scope): this thread's earlier writes are seen by
 * a thread whose wait observes the phase completion. */
static __device__ __forceinline__ void kva_mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* `count` arrivals at once (sm_90): one thread stands for many. */
static __device__ __forceinline__ void kva_mbar_arrive_cnt(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Same when pred != 0 (predicated, no branch: usable while wgmmas are in
 * flight without breaking ptxas's wgmma pipeline analysis). */
static __device__ __forceinline__ void kva_mbar_arrive_if(uint32_t bar, int pred) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(
          bar),
      "r"(pred)
      : "memory");
}
/* Waits (acquire, CTA scope) until the phase of parity `parity` completed:
 * on a fresh barrier parity 1 returns at once, parity 0 waits for phase 0. */
static __device__ __forceinline__ void kva_mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nKVA_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra KVA_MBAR_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
/* Arrival on `bar` triggered once every cp.async this thread issued before
 * it has landed; .noinc: the arrival is one of the barrier's init count. */
static __device__ __forceinline__ void kva_cp_async_mbar_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
/* Waits for all of this thread's cp.async (committed or not). */
static __device__ __forceinline__ void kva_cp_async_wait_all(void) {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}
/* TMA (cp.async.bulk.tensor) with mbarrier transaction counts. One
 * arrival that also expects `bytes` more to land on `bar` in this phase
 * (issue it before the loads it covers). */
static __device__ __forceinline__ void kva_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
/* Box of the 3-D tensor map `map` (a __grid_constant__ kernel parameter) at
 * coordinates (c0, c1, c2), innermost first, into smem at dst; completes
 * its bytes on `bar`. Out-of-range coordinates land as zeros. */
static __device__ __forceinline__ void kva_tma_load_3d(uint32_t dst, const void *map, int c0, int c1,
                                                       int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
/* As kva_tma_load_3d, multicast: the box lands at the same smem offset
 * in every CTA of the cluster named in cta_mask, completing on each one's
 * barrier at bar. */
static __device__ __forceinline__ void kva_tma_load_3d_multicast(uint32_t dst, const void *map,
                                                                 int c0, int c1, int c2,
                                                                 uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask)
      : "memory");
}
/* A 1-D bulk copy of `bytes` (a multiple of 16) from global src into smem
 * at dst, completing its bytes on `bar`. */
static __device__ __forceinline__ void kva_bulk_load(uint32_t dst, const void *src, unsigned bytes,
                                                     uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
/* Every thread of every CTA of the cluster arrives and waits. */
static __device__ __forceinline__ void kva_cluster_sync(void) {
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void kva_tma_prefetch_map(const void *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
/* A box of a 3-D tensor map into L2 (no smem, no completion). */
static __device__ __forceinline__ void kva_tma_prefetch_l2_3d(const void *map, int c0, int c1,
                                                              int c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(map),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
/* Bulk prefetch of [p, p + bytes) into L2 (16-byte aligned, bytes % 16 == 0). */
static __device__ __forceinline__ void kva_bulk_prefetch_l2(const void *p, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}
/* The 128-byte line at p into L2. */
static __device__ __forceinline__ void kva_prefetch_l2(const void *p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
/* Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads (a
 * multiple of 32): sync waits for the count, arrive only counts. */
static __device__ __forceinline__ void kva_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
static __device__ __forceinline__ void kva_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
/* Warpgroup register reallocation (every warp of the warpgroup executes it). */
template <int N>
static __device__ __forceinline__ void kva_setmaxnreg_inc(void) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
static __device__ __forceinline__ void kva_setmaxnreg_dec(void) {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* ---- wgmma shapes of the warp-specialized extend kernel at head_dim 64
 * and 256 (extend_ws.cuh): O += P V with P from registers, V MN-major. --- */
/* N = 64 (32 accumulators, columns 8j + 2t + (e&1), j < 8). */
static __device__ __forceinline__ void kva_wgmma_m64n64k16_rs_bf16_tb(float d[32],
                                                                      const uint32_t a[4],
                                                                      uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " KVA_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : KVA_WGMMA_OUT32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}
static __device__ __forceinline__ void kva_wgmma_m64n64k16_rs_f16_tb(float d[32],
                                                                     const uint32_t a[4],
                                                                     uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " KVA_WGMMA_D32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : KVA_WGMMA_OUT32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}
/* N = 256 (128 accumulators, j < 32). */
#define KVA_WGMMA_D128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define KVA_WGMMA_OUT128(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
static __device__ __forceinline__ void kva_wgmma_m64n256k16_rs_bf16_tb(float d[128],
                                                                       const uint32_t a[4],
                                                                       uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " KVA_WGMMA_D128
      ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : KVA_WGMMA_OUT128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}
static __device__ __forceinline__ void kva_wgmma_m64n256k16_rs_f16_tb(float d[128],
                                                                      const uint32_t a[4],
                                                                      uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " KVA_WGMMA_D128
      ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : KVA_WGMMA_OUT128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}
/* ---- MLA v5 (mla_kernel_v5.cuh) ------------------------------------------ */

/* D += A (64x16, smem descriptor, K-major) * B (16x256, smem descriptor,
 * MN-major: transposed); MLA v5's P V with P shared through smem, one
 * warpgroup's 256 columns of O at once. */
static __device__ __forceinline__ void kva_wgmma_m64n256k16_ss_bf16_tb(float d[128], uint64_t desc_a,
                                                                       uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " KVA_WGMMA_D128
      ", %128, %129, p, 1, 1, 0, 1;\n}\n"
      : KVA_WGMMA_OUT128(d)
      : "l"(desc_a), "l"(desc_b), "n"(1));
}
static __device__ __forceinline__ void kva_wgmma_m64n256k16_ss_f16_tb(float d[128], uint64_t desc_a,
                                                                      uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " KVA_WGMMA_D128
      ", %128, %129, p, 1, 1, 0, 1;\n}\n"
      : KVA_WGMMA_OUT128(d)
      : "l"(desc_a), "l"(desc_b), "n"(1));
}

/* Half of it (N = 128, 64 accumulators): one instruction's registers fit
 * under 128 a thread (ptxas sizes each instruction to the launch's count,
 * before any setmaxnreg: a 512-thread kernel's m64n256 does not compile). */
static __device__ __forceinline__ void kva_wgmma_m64n128k16_ss_f16_tb(float d[64], uint64_t desc_a,
                                                                      uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " KVA_WGMMA_D64
      ", %64, %65, p, 1, 1, 0, 1;\n}\n"
      : KVA_WGMMA_OUT64(d)
      : "l"(desc_a), "l"(desc_b), "n"(1));
}

/* ---- bulk stores, the mbarrier-init fence (bench/ probes) ---------------- */

/* A 1-D bulk copy of `bytes` (a multiple of 16) from smem at src to global
 * dst, in this thread's current bulk group (generic smem writes before it
 * need kva_fence_proxy_async_smem). */
static __device__ __forceinline__ void kva_bulk_store(void *dst, uint32_t src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
static __device__ __forceinline__ void kva_bulk_commit(void) {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/* Until this thread's bulk groups have read their smem (it may be reused). */
static __device__ __forceinline__ void kva_bulk_wait_read(void) {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
/* Until this thread's bulk groups are complete. */
static __device__ __forceinline__ void kva_bulk_wait(void) {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
/* mbarrier inits visible to the async proxy (before TMA completes on them). */
static __device__ __forceinline__ void kva_fence_mbar_init(void) {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

#endif /* KVA_CUDA_PTX_CUH */
