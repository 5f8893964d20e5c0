/* Launcher of the warp-specialized extend kernel (extend_ws.cuh): head_dim
 * 128, f16/bf16 Q with same-type KV; the default for those shapes
 * (KVA_EXTEND_KERNEL=ws or unset at plan creation). */
#include "cuda/extend_ws.cuh"

template <int QT>
static kva_status ws_launch(const kva_ext_args *a, int num_sms, int max_items, int *grid,
                            cudaStream_t stream) {
  const int smem = KVA_WS_SMEM;
  if (*grid <= 0) {
    KVA_CUDA_TRY(cudaFuncSetAttribute(kva_ext_ws_kernel<QT>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    KVA_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kva_ext_ws_kernel<QT>,
                                                               KVA_WS_THREADS, (size_t)smem));
    if (per_sm < 1)
      return kva_set_error(KVA_ERR_DEVICE,
                           "kva_attention: the warp-specialized extend kernel cannot be resident "
                           "(%d bytes of shared memory)",
                           smem);
    *grid = num_sms * per_sm;
  }
  int g = *grid < max_items ? *grid : max_items;
  if (g < 1) g = 1;
  kva_ext_ws_kernel<QT><<<g, KVA_WS_THREADS, smem, stream>>>(*a);
  KVA_CUDA_LAUNCH_CHECK("kva_ext_ws_kernel");
  return KVA_OK;
}

kva_status kva_ext_launch_ws(const kva_ext_args *a, kva_dtype qt, int num_sms, int max_items,
                             int grid_cache[2], cudaStream_t stream) {
  return qt == KVA_F16 ? ws_launch<KVA_F16>(a, num_sms, max_items, &grid_cache[0], stream)
                       : ws_launch<KVA_BF16>(a, num_sms, max_items, &grid_cache[1], stream);
}
