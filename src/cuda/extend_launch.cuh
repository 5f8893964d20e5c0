/* Host launchers of the extend kernels; included by extend_dN.cu (one head
 * dim per translation unit so that the builds run in parallel),
 * extend_wgmma.cu and extend_ws.cu. */
#ifndef KVA_CUDA_EXTEND_LAUNCH_CUH
#define KVA_CUDA_EXTEND_LAUNCH_CUH

#include "cuda/extend_kernel.cuh"

/* Host launcher of an extend kernel (any of the three): opts into its
 * smem (optin: the kernel's table, see kva_cuda_smem_optin) and sizes the
 * persistent grid once (cached in *grid), then launches it over at most
 * max_items CTAs (*launch from ext_grid_size). */
static inline kva_status ext_grid_size(const void *kernel, int *optin, int threads, int smem,
                                       const char *what, int head_dim, int num_sms,
                                       int max_items, int *grid, int *launch) {
  if (*grid <= 0) {
    KVA_CUDA_TRY(kva_cuda_smem_optin((const void *)kernel, smem, optin));
    int per_sm = 0;
    KVA_CUDA_TRY(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, (size_t)smem));
    if (per_sm < 1)
      return kva_set_error(KVA_ERR_DEVICE,
                           "kva_attention: the %s (head_dim %d) cannot be resident (%d bytes of "
                           "shared memory)",
                           what, head_dim, smem);
    *grid = num_sms * per_sm;
  }
  *launch = *grid < max_items ? *grid : max_items;
  if (*launch < 1) *launch = 1;
  return KVA_OK;
}
static inline kva_status ext_launch_persistent(void (*kernel)(kva_ext_args), int *optin,
                                               int threads, int smem, const char *what,
                                               int head_dim, const kva_ext_args *a, int num_sms,
                                               int max_items, int *grid, cudaStream_t stream) {
  int g = 1;
  const kva_status st = ext_grid_size((const void *)kernel, optin, threads, smem, what, head_dim,
                                      num_sms, max_items, grid, &g);
  if (st != KVA_OK) return st;
  kernel<<<g, threads, smem, stream>>>(*a);
  KVA_CUDA_LAUNCH_CHECK(what);
  return KVA_OK;
}

/* One mma.sync instantiation. */
template <int D, int QT, int KV8>
static kva_status ext_launch(const kva_ext_args *a, int num_sms, int max_items, int *grid,
                             cudaStream_t stream) {
  static int optin[KVA_CUDA_OPTIN_DEVICES]; /* per instantiation */
  return ext_launch_persistent(kva_ext_kernel<D, QT, KV8>, optin, KVA_EXT_THREADS,
                               KVA_EXT_SMEM(D, KV8), "mma.sync extend kernel", D, a, num_sms,
                               max_items, grid, stream);
}

/* Body of kva_ext_launch_dN: picks the (Q type, fp8) instantiation. */
#define KVA_EXT_DEFINE_LAUNCH(D)                                                             \
  kva_status kva_ext_launch_d##D(const kva_ext_args *a, kva_dtype qt, int kv8, int num_sms,  \
                                 int max_items, int grid_cache[4], cudaStream_t stream) {    \
    if (qt == KVA_F16)                                                                       \
      return kv8 ? ext_launch<D, KVA_F16, 1>(a, num_sms, max_items, &grid_cache[1], stream)  \
                 : ext_launch<D, KVA_F16, 0>(a, num_sms, max_items, &grid_cache[0], stream); \
    return kv8 ? ext_launch<D, KVA_BF16, 1>(a, num_sms, max_items, &grid_cache[3], stream)   \
               : ext_launch<D, KVA_BF16, 0>(a, num_sms, max_items, &grid_cache[2], stream);  \
  }

#endif /* KVA_CUDA_EXTEND_LAUNCH_CUH */
