/* Launcher of the wgmma extend kernel without warp specialization (head_dim
 * 128, f16/bf16 Q with same-type KV), chosen by a plan created with
 * KVA_EXTEND_KERNEL=wgmma; the warp-specialized kernel is the default. */
#include "cuda/extend_wgmma.cuh"
#include "cuda/extend_launch.cuh"

template <int QT>
static kva_status wg_launch(const kva_ext_args *a, int num_sms, int max_items, int *grid,
                            cudaStream_t stream) {
  static int optin[KVA_CUDA_OPTIN_DEVICES]; /* per instantiation */
  return ext_launch_persistent(kva_ext_wg_kernel<QT>, optin, KVA_WG_THREADS, KVA_WG_SMEM,
                               "wgmma extend kernel", 128, a, num_sms, max_items, grid, stream);
}

kva_status kva_ext_launch_wgmma(const kva_ext_args *a, kva_dtype qt, int num_sms, int max_items,
                                int grid_cache[2], cudaStream_t stream) {
  return qt == KVA_F16 ? wg_launch<KVA_F16>(a, num_sms, max_items, &grid_cache[0], stream)
                       : wg_launch<KVA_BF16>(a, num_sms, max_items, &grid_cache[1], stream);
}
