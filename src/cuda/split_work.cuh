/* A split-KV worker's chunk on the device: the twin of the host's
 * kva_split_work_chunk (src/core/split_schedule.c), used by both MLA
 * kernels. The decode kernel keeps its own inline form: with this helper
 * its SASS changed in up to 2360 of 6568 instructions (d256), unmeasured,
 * while the MLA kernels' changed in 1-10 setup instructions. */
#ifndef KVA_CUDA_SPLIT_WORK_CUH
#define KVA_CUDA_SPLIT_WORK_CUH

#include "kvattn.h"

/* Worker wk's chunk at schedule position pos (begin_req <= pos <= end_req),
 * a request of kv_len keys: keys [k0, k1), its split number `split`. */
static __device__ __forceinline__ kva_split_chunk kva_split_chunk_at(const kva_split_work &wk,
                                                                     int pos, int kv_len) {
  kva_split_chunk c;
  c.k0 = pos == wk.begin_req ? wk.begin_pos : 0;
  c.k1 = pos == wk.end_req ? wk.end_pos : kv_len;
  c.split = pos == wk.begin_req ? wk.begin_split : 0;
  return c;
}

#endif
