/* Builds without the CUDA backend: no backend to hand out. */
#include "core/internal.h"

#ifndef KVA_WITH_CUDA
const kva_backend *kva_cuda_backend_get(void) { return NULL; }
#else
typedef int kva_cuda_present; /* keeps the translation unit non-empty */
#endif
