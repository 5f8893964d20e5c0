/* Launcher of the wgmma extend kernel without warp specialization (head_dim
 * 128, f16/bf16 Q with same-type KV), chosen by a plan created with
 * KVA_EXTEND_KERNEL=wgmma; the warp-specialized kernel is the default. */
#include "cuda/extend_wgmma.cuh"

template <int QT>
static kva_status wg_launch(const kva_ext_args *a, int num_sms, int max_items, int *grid,
                            cudaStream_t stream) {
  const int smem = KVA_WG_SMEM;
  if (*grid <= 0) {
    KVA_CUDA_TRY(cudaFuncSetAttribute(kva_ext_wg_kernel<QT>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    KVA_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kva_ext_wg_kernel<QT>,
                                                               KVA_WG_THREADS, (size_t)smem));
    if (per_sm < 1)
      return kva_set_error(KVA_ERR_DEVICE,
                           "kva_attention: the wgmma extend kernel cannot be resident (%d bytes "
                           "of shared memory)",
                           smem);
    *grid = num_sms * per_sm;
  }
  int g = *grid < max_items ? *grid : max_items;
  if (g < 1) g = 1;
  kva_ext_wg_kernel<QT><<<g, KVA_WG_THREADS, smem, stream>>>(*a);
  KVA_CUDA_LAUNCH_CHECK("kva_ext_wg_kernel");
  return KVA_OK;
}

kva_status kva_ext_launch_wgmma(const kva_ext_args *a, kva_dtype qt, int num_sms, int max_items,
                                int grid_cache[2], cudaStream_t stream) {
  return qt == KVA_F16 ? wg_launch<KVA_F16>(a, num_sms, max_items, &grid_cache[0], stream)
                       : wg_launch<KVA_BF16>(a, num_sms, max_items, &grid_cache[1], stream);
}
