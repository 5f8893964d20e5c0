/* Launcher of the warp-specialized extend kernel (extend_ws.cuh): head_dim
 * 128, f16/bf16 Q with same-type KV; the default for those shapes
 * (KVA_EXTEND_KERNEL=ws or unset at plan creation). */
#include "cuda/extend_ws.cuh"
#include "cuda/extend_launch.cuh"

template <int QT>
static kva_status ws_launch(const kva_ext_args *a, int num_sms, int max_items, int *grid,
                            cudaStream_t stream) {
  return ext_launch_persistent(kva_ext_ws_kernel<QT>, KVA_WS_THREADS, KVA_WS_SMEM, "warp-specialized extend kernel", 128, a, num_sms,
                               max_items, grid, stream);
}

kva_status kva_ext_launch_ws(const kva_ext_args *a, kva_dtype qt, int num_sms, int max_items,
                             int grid_cache[2], cudaStream_t stream) {
  return qt == KVA_F16 ? ws_launch<KVA_F16>(a, num_sms, max_items, &grid_cache[0], stream)
                       : ws_launch<KVA_BF16>(a, num_sms, max_items, &grid_cache[1], stream);
}
