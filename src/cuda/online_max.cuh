/* The running row max of the online softmax, shared by the prefill and MLA
 * kernels. The max kept for a row moves only when a tile's max exceeds it
 * by more than KVA_MAX_SLACK_LOG2 (base-2 logits): until then the tile's
 * exponentials are taken against the stale max, so p <= 2^8 (exact in f16
 * and bf16, far inside f32 sums) and O and the row sum need no rescale.
 * LSE = m + log2(l) holds for any m, so the result is the same; only how
 * often O is rescaled changes (FlashAttention-4's conditional rescale). */
#ifndef KVA_CUDA_ONLINE_MAX_CUH
#define KVA_CUDA_ONLINE_MAX_CUH

#define KVA_MAX_SLACK_LOG2 8.0f

/* The new running max given the old one (-inf before any key) and the
 * tile's max (-inf when every key of the row is masked). */
static __device__ __forceinline__ float kva_online_max(float m, float tile_max) {
  return tile_max > m + KVA_MAX_SLACK_LOG2 ? tile_max : m;
}

#endif
