/* CUDA graph hooks of the backend: stream capture on the context's stream. */
#include "cuda/cuda_internal.h"

kva_status kva_cuda_graph_begin(kva_context *ctx) {
  kva_cuda_state *st = kva_cuda_state_of(ctx);
  if (st->stream == NULL)
    return kva_set_error(KVA_ERR_STATE,
                         "kva_graph_begin_capture: the context uses the legacy default stream, "
                         "which cannot be captured; set a stream with kva_context_set_stream");
  KVA_CUDA_TRY(cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal));
  return KVA_OK;
}

kva_status kva_cuda_graph_end(kva_context *ctx, void **graph) {
  kva_cuda_state *st = kva_cuda_state_of(ctx);
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  KVA_CUDA_TRY(cudaStreamEndCapture(st->stream, &g));
  cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) return kva_cuda_error(e, "cudaGraphInstantiate", __FILE__, __LINE__);
  *graph = (void *)exec;
  return KVA_OK;
}

kva_status kva_cuda_graph_launch(kva_context *ctx, void *graph) {
  KVA_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)graph, kva_cuda_state_of(ctx)->stream));
  return KVA_OK;
}

void kva_cuda_graph_destroy(kva_context *ctx, void *graph) {
  (void)ctx;
  if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}
