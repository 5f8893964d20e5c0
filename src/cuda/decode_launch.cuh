/* Host launcher of the decode kernel instantiations; included by
 * decode_dN.cu, one head dim per translation unit so that builds run in
 * parallel. */
#ifndef KVA_CUDA_DECODE_LAUNCH_CUH
#define KVA_CUDA_DECODE_LAUNCH_CUH

#include "cuda/decode_kernel.cuh"

template <int D, int QT, int KV8, int MT>
static kva_status dec_launch(const kva_dec_args *a, unsigned gx, unsigned gy, cudaStream_t s) {
  const int smem = KVA_DEC_SMEM(D, KV8, MT);
  static int optin[KVA_CUDA_OPTIN_DEVICES]; /* per instantiation */
  KVA_CUDA_TRY(kva_cuda_smem_optin((const void *)kva_dec_kernel<D, QT, KV8, MT>, smem, optin));
  /* a programmatic dependent of whatever kernel precedes it (the KV store) */
  KVA_CUDA_TRY(kva_launch_pdl(kva_dec_kernel<D, QT, KV8, MT>, dim3(gx, gy),
                              dim3(KVA_DEC_THREADS), (size_t)smem, s, *a));
  KVA_CUDA_LAUNCH_CHECK("kva_dec_kernel");
  return KVA_OK;
}

/* Body of kva_dec_launch_dN: picks the (Q type, fp8, m-tiles) instantiation.
 * MT 2 exists up to d=128 (the caller never asks for it at d=256). */
#define KVA_DEC_PICK_MT(D, QT, KV8)                                                \
  (mt == 2 && D <= 128 ? dec_launch<D, QT, KV8, (D <= 128 ? 2 : 1)>(a, gx, gy, stream) \
                       : dec_launch<D, QT, KV8, 1>(a, gx, gy, stream))
#define KVA_DEC_DEFINE_LAUNCH(D)                                                        \
  kva_status kva_dec_launch_d##D(const kva_dec_args *a, kva_dtype qt, int kv8, int mt,  \
                                 unsigned gx, unsigned gy, cudaStream_t stream) {       \
    if (qt == KVA_F16)                                                                  \
      return kv8 ? KVA_DEC_PICK_MT(D, KVA_F16, 1) : KVA_DEC_PICK_MT(D, KVA_F16, 0);     \
    return kv8 ? KVA_DEC_PICK_MT(D, KVA_BF16, 1) : KVA_DEC_PICK_MT(D, KVA_BF16, 0);     \
  }

#endif /* KVA_CUDA_DECODE_LAUNCH_CUH */
