/* Host side of TMA: tensor maps (CUtensorMap) for the kernels' bulk tensor
 * loads, encoded through the driver's cuTensorMapEncodeTiled, reached with
 * cudaGetDriverEntryPointByVersion (no link against libcuda). */
#ifndef KVA_CUDA_TMA_H
#define KVA_CUDA_TMA_H

#include <cuda.h>
#include <stdint.h>

#include "kvattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A 3-D tensor of 16-bit elements at base (16-byte aligned): dims[0] is
 * contiguous, strides[0] and strides[1] are the byte strides of dims 1 and
 * 2 (multiples of 16). Boxes of box[0] x box[1] x box[2] elements with
 * box[0] * 2 == 128 land in smem as box[1] * box[2] rows of 128 bytes
 * under the 128-byte swizzle (wgmma's); coordinates out of range load
 * zeros. */
kva_status kva_tma_encode_16bit_3d(CUtensorMap *map, const void *base, const uint64_t dims[3],
                                   const uint64_t strides[2], const uint32_t box[3]);
/* The same with the swizzle (0, 32, 64 or 128 bytes) and the L2 promotion
 * (0, 64, 128 or 256 bytes) chosen (the one above: 128 and 256). */
kva_status kva_tma_encode_16bit_3d_opts(CUtensorMap *map, const void *base,
                                        const uint64_t dims[3], const uint64_t strides[2],
                                        const uint32_t box[3], int swizzle, int l2_promotion);

#ifdef __cplusplus
}
#endif
#endif /* KVA_CUDA_TMA_H */
