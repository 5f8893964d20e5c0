/* Host launcher of the warp-specialized extend kernel, one head dim per
 * translation unit (extend_ws.cu: 128, extend_ws_d64.cu, extend_ws_d256.cu). */
#ifndef KVA_CUDA_EXTEND_WS_LAUNCH_CUH
#define KVA_CUDA_EXTEND_WS_LAUNCH_CUH

#include "cuda/extend_launch.cuh"
#include "cuda/extend_ws.cuh"

template <int D, int QT>
static kva_status ws_launch(const kva_ext_args *a, int num_sms, int max_items, int *grid,
                            cudaStream_t stream) {
  static int optin[KVA_CUDA_OPTIN_DEVICES]; /* per instantiation */
  return ext_launch_persistent(kva_ext_ws_kernel<D, QT>, optin, KVA_WS_THREADS, KVA_WS_SMEM(D),
                               "warp-specialized extend kernel", D, a, num_sms, max_items, grid,
                               stream);
}

/* Body of kva_ext_launch_ws_dN: grid_cache[2] = (f16, bf16). */
#define KVA_WS_DEFINE_LAUNCH(D)                                                              \
  kva_status kva_ext_launch_ws_d##D(const kva_ext_args *a, kva_dtype qt, int num_sms,        \
                                    int max_items, int grid_cache[2], cudaStream_t stream) { \
    return qt == KVA_F16 ? ws_launch<D, KVA_F16>(a, num_sms, max_items, &grid_cache[0], stream) \
                         : ws_launch<D, KVA_BF16>(a, num_sms, max_items, &grid_cache[1], stream); \
  }

#endif /* KVA_CUDA_EXTEND_WS_LAUNCH_CUH */
