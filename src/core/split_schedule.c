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
#include <stdlib.h>

#include "core/internal.h"

#define KVA_SPLIT_OVERHEAD 2

/* A worker with nothing to do (begin > end), and a worker's first chunk. */
static void work_idle(kva_split_work *wk, int num_requests) {
  wk->begin_req = num_requests;
  wk->end_req = num_requests - 1;
  wk->begin_pos = wk->end_pos = wk->begin_split = 0;
}
static void work_begin(kva_split_work *wk, int req, int64_t pos, int split) {
  wk->begin_req = req;
  wk->begin_pos = (int32_t)pos;
  wk->begin_split = split;
}

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
    if (idx >= num_requests) {
      work_idle(wk, num_requests);
      continue;
    }
    work_begin(wk, idx, blk * block, split);
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

/* ---- packed order ------------------------------------------------------
 *
 * The walk above cuts about one request per worker: wherever a worker's
 * payload ends inside a request. Every cut costs a chunk's partial rows,
 * written and read back by the merge, and a Q load; a request longer than
 * a payload that starts late in a worker spans three workers and is merged
 * from global memory at the end of the step. With MLA's 64-row tiles that
 * traffic is ~5% of the latents at N(L, L/2) lengths.
 *
 * Here the workers walk the requests in an order of their own (order[],
 * written here; work[] indexes positions in it): longest first, a request
 * that does not fit a fresh worker starts that worker and is cut at its
 * payload, the rest of a cut request starts the next worker, and the room
 * left in a worker is filled with the longest requests that still fit
 * whole. Only when none fits is the longest left cut there. Simulated on
 * b=128, N(L, L/2), 132 workers: 113 cuts -> 61 (L=4096, 64 rows), requests
 * of three or more chunks 16 -> 4, the same maximum load.
 *
 * The same coverage argument holds (a worker that cuts spends exactly its
 * payload, one that stops has at most `overhead` left); if the walk still
 * did not finish, the in-order schedule is returned (order = identity). */

static int64_t sched_find(int32_t *nxt, int64_t j) { /* first untaken >= j (path halving) */
  while (nxt[j] != j) {
    nxt[j] = nxt[nxt[j]];
    j = nxt[j];
  }
  return j;
}

static int cmp_key_desc(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* keys[0..m) = the nonempty requests' ids, longest first (ties: lower index
 * first); *total = the sum of blocks x per_block + per_chunk over them.
 * Returns m. */
static int longest_first(int n, const int32_t *kv_len, int block, int64_t per_block,
                         int64_t per_chunk, int64_t *keys, int64_t *total) {
  int m = 0;
  *total = 0;
  for (int r = 0; r < n; r++)
    if (kv_len[r] > 0) {
      const int64_t b = ((int64_t)kv_len[r] + block - 1) / block;
      keys[m++] = (b << 31) | (int64_t)(INT32_MAX - r);
      *total += b * per_block + per_chunk;
    }
  qsort(keys, (size_t)m, sizeof(int64_t), cmp_key_desc);
  for (int j = 0; j < m; j++) keys[j] = INT32_MAX - (keys[j] & INT32_MAX); /* now request ids */
  return m;
}

/* One packed walk at `payload` over keys[0..m) (request ids, longest first);
 * returns 1 if it covered every request within num_workers workers. */
static int packed_walk(int n, const int32_t *kv_len, int block, int num_workers, int slack,
                       int64_t o, int64_t payload, kva_split_work *work, int32_t *split_indptr,
                       int32_t *order, const int64_t *keys, int m, int32_t *nxt) {
#define BLOCKS(r) (((int64_t)kv_len[r] + block - 1) / block)
  for (int r = 0; r < n; r++) split_indptr[r + 1] = 0; /* chunk counts, for now */
  for (int j = 0; j <= m; j++) nxt[j] = j;
  int pos = 0;            /* requests placed in order[] */
  int carry = -1;         /* request cut by the previous worker, at order[pos - 1] */
  int64_t carry_blk = 0;  /* its first block not yet assigned */
  int carry_split = 0;    /* its chunks so far */
  for (int w = 0; w < num_workers; w++) {
    kva_split_work *wk = &work[w];
    if (carry < 0 && sched_find(nxt, 0) >= m) {
      work_idle(wk, n);
      continue;
    }
    int64_t remain = payload;
    const int fresh = carry < 0;
    if (!fresh) { /* the rest of the cut request starts this worker */
      const int64_t left = BLOCKS(carry) - carry_blk;
      work_begin(wk, pos - 1, carry_blk * block, carry_split);
      if (remain + slack < left + o) { /* cut again: the whole worker */
        carry_blk += remain - o;
        carry_split++;
        wk->end_req = pos - 1;
        wk->end_pos = (int32_t)(carry_blk * block);
        continue;
      }
      remain -= left + o;
      split_indptr[carry + 1] = carry_split + 1;
      wk->end_req = pos - 1;
      wk->end_pos = kv_len[carry];
      carry = -1;
    }
    /* a fresh worker whose longest request left does not fit: that request
     * starts it and is cut at its payload (the cut below) */
    int fresh_long = 0;
    if (fresh) {
      work_begin(wk, pos, 0, 0);
      wk->end_req = -1; /* set below: a fresh worker always takes a request */
      fresh_long = remain + slack < BLOCKS(keys[sched_find(nxt, 0)]) + o;
    }
    for (;;) {
      /* the longest request that fits whole: keys[] is longest first */
      int64_t j = m;
      if (!fresh_long) {
        int lo = 0, hi = m;
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (BLOCKS(keys[mid]) + o <= remain + slack) hi = mid; else lo = mid + 1;
        }
        j = sched_find(nxt, lo);
      }
      if (j < m) {
        const int r = (int)keys[j];
        nxt[j] = (int32_t)j + 1;
        order[pos++] = r;
        remain -= BLOCKS(r) + o;
        split_indptr[r + 1] = 1;
        wk->end_req = pos - 1;
        wk->end_pos = kv_len[r];
        continue;
      }
      j = sched_find(nxt, 0);
      if (remain > o && j < m) { /* none fits: cut the longest left here */
        const int r = (int)keys[j];
        nxt[j] = (int32_t)j + 1;
        order[pos++] = r;
        carry = r;
        carry_blk = remain - o;
        carry_split = 1;
        wk->end_req = pos - 1;
        wk->end_pos = (int32_t)(carry_blk * block);
      }
      break;
    }
  }
#undef BLOCKS
  if (carry >= 0 || sched_find(nxt, 0) < m) return 0;
  for (int r = 0; r < n; r++) /* empty requests last, in no worker's range */
    if (kv_len[r] <= 0) order[pos++] = r;
  return 1;
}

int kva_split_schedule_packed(int num_requests, const int32_t *kv_len, int block, int num_workers,
                              int slack, int overhead, kva_split_work *work,
                              int32_t *split_indptr, int32_t *order, int64_t *keys,
                              int32_t *nxt) {
  if (block < 1) block = 1;
  if (slack < 0) slack = 0;
  if (num_requests < 0) num_requests = 0;
  const int n = num_requests;
  if (num_workers < 1 || !work || !split_indptr || !order || !keys || !nxt ||
      (n > 0 && !kv_len)) {
    for (int r = 0; order && r < n; r++) order[r] = r;
    return kva_split_schedule(n, kv_len, NULL, block, num_workers, slack, work, split_indptr);
  }
  const int64_t o = overhead > 0 ? overhead : KVA_SPLIT_OVERHEAD;
  int64_t total;
  const int m = longest_first(n, kv_len, block, 1, o, keys, &total);
  /* The in-order walk's payload always covers the batch (see the top). With
   * slack, workers that keep requests whole run past it and the walk would
   * end early, leaving the last workers idle (measured on the H100: 6 of 132
   * at h64 varlen): walk the smallest payload that still covers it. */
  const int64_t share = (total + num_workers - 1) / num_workers;
  const int64_t top = share + o;
  int64_t lo = share - slack > o + 1 ? share - slack : o + 1, hi = top;
  while (lo < hi) { /* walks are not strictly monotone in payload; top always covers */
    const int64_t mid = (lo + hi) / 2;
    if (packed_walk(n, kv_len, block, num_workers, slack, o, mid, work, split_indptr, order, keys, m,
                    nxt))
      hi = mid;
    else
      lo = mid + 1;
  }
  if (!packed_walk(n, kv_len, block, num_workers, slack, o, lo, work, split_indptr, order, keys, m,
                   nxt) &&
      !packed_walk(n, kv_len, block, num_workers, slack, o, top, work, split_indptr, order, keys, m,
                   nxt)) { /* not reached (see above): in order instead */
    for (int r = 0; r < n; r++) order[r] = r;
    return kva_split_schedule(n, kv_len, NULL, block, num_workers, slack, work, split_indptr);
  }
  split_indptr[0] = 0;
  for (int r = 0; r < n; r++) split_indptr[r + 1] += split_indptr[r];
  return split_indptr[n];
}

kva_split_chunk kva_split_work_chunk(const kva_split_work *work, int pos, int32_t kv_len) {
  kva_split_chunk c;
  c.k0 = pos == work->begin_req ? work->begin_pos : 0;
  c.k1 = pos == work->end_req ? work->end_pos : kv_len;
  c.split = pos == work->begin_req ? work->begin_split : 0;
  return c;
}

/* ---- costed walk --------------------------------------------------------
 *
 * The packed walk prices every chunk alike (`overhead`) and lets a worker run
 * `slack` past its payload. On the H100 the kernels' timelines fit a CTA's
 * end to blocks plus what each chunk's end costs (scripts/mla_cost_model.py,
 * 64 query rows, in blocks of streaming: chunk 2.4, partial write 1.2, the
 * two-chunk merge 1.8, a merge of three or more chunks 6.9), and the step
 * ends with the workers that ran past their payload or merged a long request
 * last. This walk charges each worker exactly what its chunks will cost it,
 * in 1/KVA_SPLIT_COST_UNIT blocks, against one capacity T (the smallest that
 * covers the batch, found by bisection):
 *  - a cut at a worker's end leaves the rest to start the next worker, and is
 *    made only if that rest ends there early (a margin before the head's
 *    end) and leaves at least min_head blocks here, so the cut request has
 *    two chunks: the rest writes partial rows and the head, ending last,
 *    merges them before its write. A cut that would leave a third chunk is
 *    not made; the worker's room stays empty;
 *  - a request longer than a fresh worker's T starts that worker; if its rest
 *    cannot end early in the next worker, every chunk that ends late (at a
 *    worker's end) is charged the merge from global memory, since whichever
 *    of them ends last merges that way.
 *  - requests stay whole when that needs at most `slack` blocks more
 *    capacity than cutting (128 x 8192 keys on 66 workers: 64 cuts for 2%
 *    of capacity measured 3-7% slower than none).
 * Order and work[] as the packed walk (longest first; positions in order[]).
 * Measured on the H100 against the packed walk (MLA, b=128, N(L, L/2)
 * lengths; docs/performance.md, "Eighteenth session"): -2.6 to -2.9% time
 * on the 64-row varlen rows, -0.5 to -2% at 16 and 32 rows; v5's batches of
 * 128 query rows measured 0-2.4% slower and keep the packed walk. */

typedef struct costed_walk {
  int n, m, block, num_workers, cuts; /* cuts 0: requests stay whole */
  const int32_t *kv_len;
  const int64_t *keys; /* request ids, longest first */
  const kva_split_costs *c;
  kva_split_work *work;
  int32_t *split_indptr, *order, *nxt;
  /* walk state: requests placed in order[]; the request cut by the last
   * worker (-1: none), its first block not yet placed and chunks so far */
  int pos, carry, carry_split;
  int64_t carry_blk;
} costed_walk;

/* Key j placed at the end of worker wk: whole (head 0) or its first `head`
 * blocks, the rest carried to the next worker. */
static void cw_place(costed_walk *cw, kva_split_work *wk, int64_t j, int64_t head) {
  const int r = (int)cw->keys[j];
  cw->nxt[j] = (int32_t)j + 1;
  cw->order[cw->pos++] = r;
  wk->end_req = cw->pos - 1;
  if (head > 0) {
    cw->carry = r;
    cw->carry_blk = head;
    cw->carry_split = 1;
    wk->end_pos = (int32_t)(head * cw->block);
  } else {
    cw->split_indptr[r + 1] = 1;
    wk->end_pos = cw->kv_len[r];
  }
}

static int64_t cw_blocks(const costed_walk *cw, int r) {
  return ((int64_t)cw->kv_len[r] + cw->block - 1) / cw->block;
}

/* first untaken key index whose request has at most `limit` blocks (m: none) */
static int64_t cw_longest_within(const costed_walk *cw, int64_t limit) {
  int lo = 0, hi = cw->m;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (cw_blocks(cw, (int)cw->keys[mid]) <= limit) hi = mid; else lo = mid + 1;
  }
  return sched_find(cw->nxt, lo);
}

static int costed_walk_at(costed_walk *cw, int64_t T) {
  const int64_t U = KVA_SPLIT_COST_UNIT;
  const kva_split_costs *c = cw->c;
  const int n = cw->n, m = cw->m;
  /* the last chunk of a cut request, at a worker's start, must have written
   * its partial rows before the head's key loop ends (at T - merge): then
   * the head merges them before its own write; else both write and the last
   * merges from global memory (measured: 12 us at 64 rows, at the step's
   * end), `margin` earlier for the spread of CTA ends. */
  const int64_t tail_max = T - c->merge - c->margin - c->chunk - c->partial; /* U x blocks */
  const int64_t min_head = c->min_head > 1 ? c->min_head : 1;
  for (int r = 0; r < n; r++) cw->split_indptr[r + 1] = 0; /* chunk counts, for now */
  for (int j = 0; j <= m; j++) cw->nxt[j] = j;
  cw->pos = 0;
  cw->carry = -1;
  for (int w = 0; w < cw->num_workers; w++) {
    kva_split_work *wk = &cw->work[w];
    int64_t load = 0;
    if (cw->carry >= 0) {
      const int carry = cw->carry;
      const int64_t left = cw_blocks(cw, carry) - cw->carry_blk;
      work_begin(wk, cw->pos - 1, cw->carry_blk * cw->block, cw->carry_split);
      wk->end_req = cw->pos - 1;
      if (left * U > tail_max) { /* ends late: charged the merge from global memory */
        const int64_t take = (T - c->chunk - c->merge_many) / U;
        if (take < 1) return 0;
        if (take < left) { /* a middle chunk: the whole worker */
          cw->carry_blk += take;
          cw->carry_split++;
          wk->end_pos = (int32_t)(cw->carry_blk * cw->block);
          continue;
        }
        load = left * U + c->chunk + c->merge_many;
      } else {
        load = left * U + c->chunk + c->partial; /* ends early, writes partial rows */
      }
      cw->split_indptr[carry + 1] = cw->carry_split + 1;
      wk->end_pos = cw->kv_len[carry];
      cw->carry = -1;
    } else {
      const int64_t j = sched_find(cw->nxt, 0);
      if (j >= m) {
        work_idle(wk, n);
        continue;
      }
      work_begin(wk, cw->pos, 0, 0);
      const int64_t b = cw_blocks(cw, (int)cw->keys[j]);
      if (b * U + c->chunk > T) { /* too long for a fresh worker: its head is the worker */
        if (!cw->cuts) return 0;
        int64_t head = (T - c->chunk - c->merge) / U;
        if (head < 1) return 0;
        if ((b - head) * U > tail_max) head = (T - c->chunk - c->merge_many) / U;
        if (head < 1 || head >= b) return 0;
        cw_place(cw, wk, j, head);
        continue;
      }
    }
    for (;;) { /* whole requests, longest first, while one fits */
      const int64_t room = T - load - c->chunk;
      const int64_t j = room >= U ? cw_longest_within(cw, room / U) : m;
      if (j >= m) break;
      load += cw_blocks(cw, (int)cw->keys[j]) * U + c->chunk;
      cw_place(cw, wk, j, 0);
    }
    /* the room left: the head of the longest request whose rest ends early
     * in the next worker */
    const int64_t head = (T - load - c->chunk - c->merge) / U;
    if (cw->cuts && head >= min_head && tail_max >= 0) {
      const int64_t j = cw_longest_within(cw, head + tail_max / U);
      if (j < m) cw_place(cw, wk, j, head);
    }
  }
  if (cw->carry >= 0 || sched_find(cw->nxt, 0) < m) return 0;
  for (int r = 0; r < n; r++)
    if (cw->kv_len[r] <= 0) cw->order[cw->pos++] = r;
  return 1;
}

int kva_split_schedule_costed(int num_requests, const int32_t *kv_len, int block,
                              int num_workers, int slack, const kva_split_costs *costs,
                              kva_split_work *work, int32_t *split_indptr, int32_t *order,
                              int64_t *keys, int32_t *nxt) {
  if (block < 1) block = 1;
  if (num_requests < 0) num_requests = 0;
  const int n = num_requests;
  /* no prices, or arguments the packed walk handles (and reports) itself */
  if (!costs || costs->chunk < 0 || costs->partial < 0 || costs->merge < 0 ||
      costs->merge_many < 0 || costs->margin < 0 || costs->min_head < 0 || num_workers < 1 ||
      !work || !split_indptr || !order || !keys || !nxt || (n > 0 && !kv_len))
    return kva_split_schedule_packed(n, kv_len, block, num_workers, 0, 0, work, split_indptr,
                                     order, keys, nxt);
  int64_t total;
  const int m = longest_first(n, kv_len, block, KVA_SPLIT_COST_UNIT, costs->chunk, keys, &total);
  costed_walk cw = {n, m, block, num_workers, 1, kv_len, keys, costs, work, split_indptr, order,
                    nxt, 0, -1, 0, 0};
  /* Bisect T (walks are not strictly monotone in T: the last feasible T
   * found is the one walked). T = the mean plus the longest request and its
   * dearest end covers the batch whenever no worker cuts (each worker then
   * holds at least the mean), else T = total does, in one worker. */
  const int64_t longest = m > 0 ? cw_blocks(&cw, (int)keys[0]) : 0;
  int64_t lo = total / num_workers, hi = lo + longest * KVA_SPLIT_COST_UNIT + costs->chunk +
                                          costs->merge_many + KVA_SPLIT_COST_UNIT;
  if (lo < 1) lo = 1;
  if (!costed_walk_at(&cw, hi)) hi = total + costs->merge_many + KVA_SPLIT_COST_UNIT;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (costed_walk_at(&cw, mid)) hi = mid; else lo = mid + 1;
  }
  /* Requests kept whole when that costs at most `slack` blocks of capacity:
   * a cut's merge costs bytes the per-worker prices leave out, so a batch of
   * equal requests on fewer workers (128 x 8192 keys, 66 workers: 64 cuts
   * for 2% of capacity) measured slower cut. */
  const int64_t cut_t = hi;
  cw.cuts = 0;
  lo = total / num_workers;
  hi = cut_t + (int64_t)(slack > 0 ? slack : 0) * KVA_SPLIT_COST_UNIT;
  if (lo < 1) lo = 1;
  if (lo <= hi && costed_walk_at(&cw, hi)) {
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (costed_walk_at(&cw, mid)) hi = mid; else lo = mid + 1;
    }
  } else {
    cw.cuts = 1;
    hi = cut_t;
  }
  if (!costed_walk_at(&cw, hi))
    return kva_split_schedule_packed(n, kv_len, block, num_workers, 0, 0, work, split_indptr,
                                     order, keys, nxt);
  split_indptr[0] = 0;
  for (int r = 0; r < n; r++) split_indptr[r + 1] += split_indptr[r];
  return split_indptr[n];
}
