/* Device copy of a plan: one block of int32 at fixed offsets (sized by the
 * plan's capacities at init), filled in pinned staging and uploaded by one
 * cudaMemcpyAsync per step. The page table is last so only its used rows
 * travel. Fixed addresses let CUDA graphs replay with new batches. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"

static size_t take(size_t *off, size_t n) {
  size_t at = *off;
  *off += (n + 3) & ~(size_t)3; /* 16-byte aligned arrays */
  return at;
}

typedef struct {
  size_t hdr, cu_q, cu_k, cache, num_new, out_loc, q_req, dec, ext, split_indptr, split_rows,
      sched, order, page_table;
} meta_layout;

static meta_layout layout_of(const kva_plan *p) {
  size_t B = (size_t)p->cfg.max_batch, Q = (size_t)p->cfg.max_q_tokens,
         W = (size_t)p->cfg.num_workers, off = 0;
  meta_layout m;
  m.hdr = take(&off, sizeof(kva_plan_header) / 4);
  m.cu_q = take(&off, B + 1);
  m.cu_k = take(&off, B + 1);
  m.cache = take(&off, B);
  m.num_new = take(&off, B);
  m.out_loc = take(&off, Q);
  m.q_req = take(&off, Q);
  m.dec = take(&off, B);
  m.ext = take(&off, B);
  m.split_indptr = take(&off, B + 1);
  m.split_rows = take(&off, B + 1);
  m.sched = take(&off, W * sizeof(kva_split_work) / 4);
  m.order = take(&off, B);
  m.page_table = take(&off, B * (size_t)p->max_pages_per_req);
  return m;
}

kva_status kva_cuda_plan_init(kva_plan *plan) {
  kva_cuda_plan *cp = (kva_cuda_plan *)calloc(1, sizeof(*cp));
  if (!cp) return kva_set_error(KVA_ERR_OUT_OF_MEMORY, "kva_plan_create: out of host memory");
  plan->backend_plan = cp;
  meta_layout m = layout_of(plan);
  cp->meta_ints = m.page_table + (size_t)plan->cfg.max_batch * plan->max_pages_per_req;
  cp->page_table_off = m.page_table;
  cudaError_t e = cudaMalloc((void **)&cp->d_meta, cp->meta_ints * 4);
  if (e == cudaSuccess) e = cudaMallocHost((void **)&cp->h_meta, cp->meta_ints * 4);
  /* split counters, then the decode kernel's tile counters (one block) */
  const size_t sem_bytes = (size_t)plan->cfg.max_batch * plan->cfg.num_qo_heads * 4 * 2;
  if (e == cudaSuccess) e = cudaMalloc((void **)&cp->d_split_sem, sem_bytes);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&cp->upload_done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cudaGetLastError();
    kva_cuda_plan_free(plan);
    return kva_set_error(KVA_ERR_OUT_OF_MEMORY,
                         "kva_plan_create: device metadata of %zu bytes: %s", cp->meta_ints * 4,
                         cudaGetErrorString(e));
  }
  memset(cp->h_meta, 0, cp->meta_ints * 4);
  int32_t *d = cp->d_meta;
  cp->d_hdr = (kva_plan_header *)(d + m.hdr);
  cp->d_cu_seqlens_q = d + m.cu_q;
  cp->d_cu_seqlens_k = d + m.cu_k;
  cp->d_cache_seqlens = d + m.cache;
  cp->d_num_new = d + m.num_new;
  cp->d_out_cache_loc = d + m.out_loc;
  cp->d_q_req = d + m.q_req;
  cp->d_decode_reqs = d + m.dec;
  cp->d_extend_reqs = d + m.ext;
  cp->d_split_indptr = d + m.split_indptr;
  cp->d_split_row_offset = d + m.split_rows;
  cp->d_split_schedule = (kva_split_work *)(d + m.sched);
  cp->d_sched_order = d + m.order;
  cp->d_page_table = d + m.page_table;
  cp->d_tile_claim = cp->d_split_sem + (size_t)plan->cfg.max_batch * plan->cfg.num_qo_heads;
  /* the whole block once, so kernels captured before any batch read zeros */
  cudaStream_t s = kva_cuda_state_of(plan->ctx)->stream;
  e = cudaMemcpyAsync(cp->d_meta, cp->h_meta, cp->meta_ints * 4, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaMemsetAsync(cp->d_split_sem, 0, sem_bytes, s);
  if (e == cudaSuccess) e = cudaEventRecord(cp->upload_done, s);
  if (e != cudaSuccess) {
    kva_status st = kva_cuda_error(e, "plan metadata upload", __FILE__, __LINE__);
    kva_cuda_plan_free(plan); /* the planner frees only what a successful init made */
    return st;
  }
  cp->upload_pending = 1;
  kva_status st = kva_cuda_extend_plan_init(plan); /* the extend path's tile schedule */
  if (st != KVA_OK) kva_cuda_plan_free(plan);
  return st;
}

kva_status kva_cuda_plan_upload(kva_plan *plan) {
  kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  cudaStream_t s = kva_cuda_state_of(plan->ctx)->stream;
  /* staging is rewritten only after the previous upload left it (normally long done) */
  if (cp->upload_pending) KVA_CUDA_TRY(cudaEventSynchronize(cp->upload_done));
  meta_layout m = layout_of(plan);
  int32_t *h = cp->h_meta;
  int n = plan->hdr.num_requests, tq = plan->hdr.total_q;
  memcpy(h + m.hdr, &plan->hdr, sizeof(kva_plan_header));
  memcpy(h + m.cu_q, plan->cu_seqlens_q, (size_t)(n + 1) * 4);
  memcpy(h + m.cu_k, plan->cu_seqlens_k, (size_t)(n + 1) * 4);
  memcpy(h + m.cache, plan->cache_seqlens, (size_t)n * 4);
  memcpy(h + m.num_new, plan->num_new, (size_t)n * 4);
  memcpy(h + m.out_loc, plan->out_cache_loc, (size_t)tq * 4);
  memcpy(h + m.q_req, plan->q_req, (size_t)tq * 4);
  memcpy(h + m.dec, plan->decode_reqs, (size_t)plan->num_decode * 4);
  memcpy(h + m.ext, plan->extend_reqs, (size_t)plan->num_extend * 4);
  memcpy(h + m.split_indptr, plan->split_indptr, (size_t)(n + 1) * 4);
  memcpy(h + m.split_rows, plan->split_row_offset, (size_t)(n + 1) * 4);
  memcpy(h + m.sched, plan->split_schedule, (size_t)plan->cfg.num_workers * sizeof(kva_split_work));
  memcpy(h + m.order, plan->sched_order, (size_t)n * 4);
  size_t pt = (size_t)n * plan->hdr.page_table_stride;
  memcpy(h + m.page_table, plan->page_table, pt * 4);
  KVA_CUDA_TRY(cudaMemcpyAsync(cp->d_meta, h, (m.page_table + pt) * 4, cudaMemcpyHostToDevice, s));
  KVA_CUDA_TRY(cudaEventRecord(cp->upload_done, s));
  cp->upload_pending = 1;
  return kva_cuda_extend_plan(plan);
}

void kva_cuda_plan_free(kva_plan *plan) {
  kva_cuda_plan *cp = kva_cuda_plan_of(plan);
  if (!cp) return;
  kva_cuda_extend_plan_free(plan);
  if (cp->upload_pending) cudaEventSynchronize(cp->upload_done);
  if (cp->upload_done) cudaEventDestroy(cp->upload_done);
  cudaFree(cp->d_meta);
  cudaFree(cp->d_split_sem);
  cudaFreeHost(cp->h_meta);
  free(cp);
  plan->backend_plan = NULL;
}
