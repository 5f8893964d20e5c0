/* Emulated PTX for the decode kernel (test-only): the extend emulator's
 * helpers plus the ones the decode kernel adds. */
#pragma once
#include "../../emu/cuda/ptx.cuh"

/* one kernel at a time here: dependent-launch control is a no-op */
static inline void kva_griddep_launch_dependents(void) {}
static inline void kva_griddep_wait(void) {}

static inline uint32_t kva_prmt(uint32_t a, uint32_t b, uint32_t sel) {
  const uint64_t v = (uint64_t)a | ((uint64_t)b << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; i++) {
    const uint32_t n = (sel >> (4 * i)) & 0xfu;
    uint32_t byte = (uint32_t)(v >> (8 * (n & 7))) & 0xffu;
    if (n & 8) byte = (byte & 0x80u) ? 0xffu : 0u; /* sign replicate */
    r |= byte << (8 * i);
  }
  return r;
}
static inline uint32_t kva_cvt_e4m3x2_bf16x2(uint16_t x) {
  return kva_f16x2_to_bf16x2(kva_cvt_e4m3x2_f16x2(x));
}
static inline float kva_quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
static inline float kva_quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
static inline float kva_warp_max(float v) {
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}
