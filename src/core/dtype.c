/* Element types: sizes and names. */
#include "core/internal.h"

size_t kva_dtype_size(kva_dtype dtype) {
  switch (dtype) {
    case KVA_F32: return 4;
    case KVA_F16:
    case KVA_BF16: return 2;
    case KVA_FP8_E4M3: return 1;
  }
  return 0;
}

const char *kva_dtype_name(kva_dtype dtype) {
  switch (dtype) {
    case KVA_F32: return "f32";
    case KVA_F16: return "f16";
    case KVA_BF16: return "bf16";
    case KVA_FP8_E4M3: return "fp8";
  }
  return "unknown";
}
