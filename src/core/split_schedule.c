/* Split-KV schedule for decode requests, after FlashMLA's get_mla_metadata.
 *
 * Cost model, in units of `block` KV tokens:
 *   cost(r)  = ceil(kv_len[r] / block) + KVA_SPLIT_OVERHEAD per chunk of r
 *   payload  = ceil(sum_r (blocks(r) + overhead) / N) + overhead per worker
 * Workers walk the (request, block) sequence in order; a worker takes whole
 * requests while they fit its remaining payload and otherwise cuts the
 * current request at a block boundary and hands the rest to the next worker.
 *
 * Overhead = 2 blocks: a chunk pays a pipeline fill (its first KV block is not
 * overlapped with compute), a Q load and a partial O/LSE write plus its share
 * of the combine, together about two blocks of streaming time. This keeps
 * short requests whole and only splits where a long request would leave
 * workers idle. (FlashMLA uses 5 with 64-token blocks on wider machines.)
 *
 * Slack: a worker may run up to `slack` blocks past its payload to keep a
 * request whole. A cut costs more than the overhead of one chunk: the
 * chunks' partial rows are written and read back by the merge, which grows
 * with the request's query rows x value dims (MLA at 64 rows: ~5 blocks of
 * streaming time). Without slack a batch of equal requests that nearly fits
 * one per worker (128 x 8192 keys on 132 workers) had every request cut one
 * block short, and paid 128 merges to save one block each.
 *
 * q_len is ignored: decode is memory bound (every query row of a request
 * reuses the same KV block), so a block costs about the same for 1..8 rows.
 *
 * Coverage: a worker that cuts spends exactly `payload`; one that stops
 * before a request that does not fit (and cannot be cut) has at most
 * `overhead` left. With c cuts the work is T + c*overhead, and N busy workers
 * spend at least c*payload + (N-c)*(payload-overhead) >= T + c*overhead, so
 * the walk always finishes within N workers (taking more than that only
 * leaves less for the rest). Each worker spends at most `payload + slack`
 * (chunk blocks + overhead per chunk): the load-balance bound. */
#include "core/internal.h"

#define KVA_SPLIT_OVERHEAD 2

int kva_split_schedule(int num_requests, const int32_t *kv_len, const int32_t *q_len, int block,
                       int num_workers, int slack, kva_split_work *work, int32_t *split_indptr) {
  (void)q_len;
  if (block < 1) block = 1;
  if (slack < 0) slack = 0;
  if (num_requests < 0) num_requests = 0;
  if (split_indptr) split_indptr[0] = 0;
  if (num_workers < 1 || !work || !split_indptr || (num_requests > 0 && !kv_len)) {
    for (int r = 0; split_indptr && r < num_requests; r++) split_indptr[r + 1] = 0;
    return 0;
  }

  const int64_t o = KVA_SPLIT_OVERHEAD;
  int64_t total = 0;
  for (int r = 0; r < num_requests; r++)
    if (kv_len[r] > 0) total += ((int64_t)kv_len[r] + block - 1) / block + o;
  const int64_t payload = (total + num_workers - 1) / num_workers + o;

  int idx = 0;          /* current request */
  int64_t blk = 0;      /* first block of idx not yet assigned */
  int split = 0;        /* chunks of idx already assigned */
  int32_t cum = 0;      /* splits of requests before idx */
  /* Zero-length requests get zero splits and are never a worker's first or
   * last request (consumers skip those between, seeing split count 0). */
#define SKIP_EMPTY()                                                \
  while (idx < num_requests && kv_len[idx] <= 0) split_indptr[++idx] = cum

  SKIP_EMPTY();
  for (int w = 0; w < num_workers; w++) {
    kva_split_work *wk = &work[w];
    if (idx >= num_requests) { /* idle */
      wk->begin_req = num_requests;
      wk->end_req = num_requests - 1;
      wk->begin_pos = wk->end_pos = wk->begin_split = 0;
      continue;
    }
    wk->begin_req = idx;
    wk->begin_pos = (int32_t)(blk * block);
    wk->begin_split = split;
    int64_t remain = payload;
    int last = idx;
    int32_t last_end = 0;
    while (idx < num_requests) {
      int64_t nblk = ((int64_t)kv_len[idx] + block - 1) / block;
      int64_t left = nblk - blk;
      if (remain + slack >= left + o) { /* the rest of idx fits (with the slack) */
        remain -= left + o;
        last = idx;
        last_end = kv_len[idx];
        cum += split + 1;
        split_indptr[++idx] = cum;
        blk = 0;
        split = 0;
        SKIP_EMPTY();
      } else {
        if (remain > o) { /* cut idx at a block boundary: remain - o < left */
          blk += remain - o;
          last = idx;
          last_end = (int32_t)(blk * block);
          split++;
        }
        break;
      }
    }
    wk->end_req = last;
    wk->end_pos = last_end;
  }
  /* Unreachable by the argument above; kept so that split_indptr is always
   * fully written (a logic error then shows up as uncovered keys in tests
   * rather than as garbage offsets). */
  while (idx < num_requests) {
    cum += split;
    split = 0;
    split_indptr[++idx] = cum;
  }
#undef SKIP_EMPTY
  return cum;
}
