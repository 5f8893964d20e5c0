/* Tensor-map encoding for TMA loads (see tma.h). */
#include "cuda/tma.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include "core/internal.h"

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn;
static pthread_once_t encode_once = PTHREAD_ONCE_INIT;

static void encode_lookup(void) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                       &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    encode_fn = (PFN_cuTensorMapEncodeTiled_v12000)fn;
  (void)cudaGetLastError(); /* a failed lookup leaves no sticky error */
}

kva_status kva_tma_encode_16bit_3d(CUtensorMap *map, const void *base, const uint64_t dims[3],
                                   const uint64_t strides[2], const uint32_t box[3]) {
  return kva_tma_encode_16bit_3d_opts(map, base, dims, strides, box, 128, 256);
}

kva_status kva_tma_encode_16bit_3d_opts(CUtensorMap *map, const void *base,
                                        const uint64_t dims[3], const uint64_t strides[2],
                                        const uint32_t box[3], int swizzle, int l2_promotion) {
  pthread_once(&encode_once, encode_lookup);
  const CUtensorMapSwizzle sw = swizzle == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                : swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                : swizzle == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                : CU_TENSOR_MAP_SWIZZLE_NONE;
  const CUtensorMapL2promotion pr = l2_promotion == 256   ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                                    : l2_promotion == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                    : l2_promotion == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                                                          : CU_TENSOR_MAP_L2_PROMOTION_NONE;
  if (!encode_fn)
    return kva_set_error(KVA_ERR_DEVICE, "TMA: the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t gdim[3] = {dims[0], dims[1], dims[2]};
  const cuuint64_t gstride[2] = {strides[0], strides[1]};
  const cuuint32_t bdim[3] = {box[0], box[1], box[2]};
  const cuuint32_t estride[3] = {1, 1, 1};
  const CUresult r =
      encode_fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, (void *)base, gdim, gstride, bdim, estride,
                CU_TENSOR_MAP_INTERLEAVE_NONE, sw, pr, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return kva_set_error(KVA_ERR_DEVICE,
                         "TMA: cuTensorMapEncodeTiled failed (%d) for dims %llu x %llu x %llu, "
                         "box %u x %u x %u",
                         (int)r, (unsigned long long)dims[0], (unsigned long long)dims[1],
                         (unsigned long long)dims[2], box[0], box[1], box[2]);
  return KVA_OK;
}
