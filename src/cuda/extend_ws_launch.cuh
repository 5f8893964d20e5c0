/* Host launcher of the warp-specialized extend kernel, one head dim per
 * translation unit (extend_ws.cu: 128, extend_ws_d64.cu, extend_ws_d256.cu). */
#ifndef KVA_CUDA_EXTEND_WS_LAUNCH_CUH
#define KVA_CUDA_EXTEND_WS_LAUNCH_CUH

#include "cuda/extend_launch.cuh"
#include "cuda/extend_ws.cuh"

/* TMA: the tensor maps in tm (the kernel's TMA instantiation); else the
 * cp.async producer (tm is passed unused). */
template <int D, int QT, int TMA>
static kva_status ws_launch(const kva_ext_args *a, const kva_ext_tma *tm, int num_sms,
                            int max_items, int *grid, cudaStream_t stream) {
  static int optin[KVA_CUDA_OPTIN_DEVICES]; /* per instantiation */
  int g = 1;
  const kva_status st =
      ext_grid_size((const void *)kva_ext_ws_kernel<D, QT, TMA>, optin, KVA_WS_THREADS,
                    KVA_WS_SMEM(D), "warp-specialized extend kernel", D, num_sms, max_items, grid,
                    &g);
  if (st != KVA_OK) return st;
  kva_ext_ws_kernel<D, QT, TMA><<<g, KVA_WS_THREADS, KVA_WS_SMEM(D), stream>>>(*a, *tm);
  KVA_CUDA_LAUNCH_CHECK("warp-specialized extend kernel");
  return KVA_OK;
}

template <int D>
static kva_status ws_launch_d(const kva_ext_args *a, const kva_ext_tma *tm, kva_dtype qt,
                              int num_sms, int max_items, int grid_cache[4], cudaStream_t stream) {
  if (tm != NULL)
    return qt == KVA_F16 ? ws_launch<D, KVA_F16, 1>(a, tm, num_sms, max_items, &grid_cache[2], stream)
                         : ws_launch<D, KVA_BF16, 1>(a, tm, num_sms, max_items, &grid_cache[3], stream);
  kva_ext_tma none;
  memset(&none, 0, sizeof none);
  return qt == KVA_F16 ? ws_launch<D, KVA_F16, 0>(a, &none, num_sms, max_items, &grid_cache[0], stream)
                       : ws_launch<D, KVA_BF16, 0>(a, &none, num_sms, max_items, &grid_cache[1], stream);
}

/* Body of kva_ext_launch_ws_dN. */
#define KVA_WS_DEFINE_LAUNCH(D)                                                                 \
  kva_status kva_ext_launch_ws_d##D(const kva_ext_args *a, const kva_ext_tma *tm, kva_dtype qt, \
                                    int num_sms, int max_items, int grid_cache[4],              \
                                    cudaStream_t stream) {                                      \
    return ws_launch_d<D>(a, tm, qt, num_sms, max_items, grid_cache, stream);                  \
  }

#endif /* KVA_CUDA_EXTEND_WS_LAUNCH_CUH */
