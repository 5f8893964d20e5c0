/* Argument validation of errors, dtypes, contexts, memory helpers, pools,
 * the allocator and the request table: every bad argument gets its specific
 * status, a message naming it, and changes nothing. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h" /* kva_set_error */
#include "testutil.h"

/* the last error names the argument (or phrase) */
#define CHECK_MSG(needle)                                                                   \
  CHECK(strstr(kva_last_error(), needle) != NULL, "message \"%s\" does not mention \"%s\"", \
        kva_last_error(), needle)

static void test_status_names(void) {
  const kva_status all[] = {KVA_OK,
                            KVA_ERR_NULL_ARGUMENT,
                            KVA_ERR_INVALID_ARGUMENT,
                            KVA_ERR_UNSUPPORTED,
                            KVA_ERR_OUT_OF_RANGE,
                            KVA_ERR_OUT_OF_PAGES,
                            KVA_ERR_OUT_OF_MEMORY,
                            KVA_ERR_DOUBLE_FREE,
                            KVA_ERR_CAPACITY,
                            KVA_ERR_WORKSPACE_TOO_SMALL,
                            KVA_ERR_NO_DEVICE,
                            KVA_ERR_DEVICE,
                            KVA_ERR_STATE,
                            KVA_ERR_INTERNAL};
  int n = (int)(sizeof(all) / sizeof(all[0]));
  for (int i = 0; i < n; i++) {
    const char *s = kva_strerror(all[i]);
    CHECK(s && strncmp(s, "KVA_", 4) == 0, "kva_strerror(%d) = %s", (int)all[i], s ? s : "NULL");
    for (int j = 0; j < i; j++)
      CHECK(strcmp(s, kva_strerror(all[j])) != 0, "statuses %d and %d share the name %s", i, j, s);
  }
  CHECK(strcmp(kva_strerror(KVA_ERR_OUT_OF_PAGES), "KVA_ERR_OUT_OF_PAGES") == 0, "name of OUT_OF_PAGES");
  CHECK(strcmp(kva_strerror(KVA_OK), "KVA_OK") == 0, "name of OK");
  const char *unknown = kva_strerror((kva_status)12345);
  CHECK(unknown != NULL && strstr(unknown, "UNKNOWN") != NULL, "unknown status name %s",
        unknown ? unknown : "NULL");
  /* wrapping the previous message in a new one (same buffer as argument) */
  CHECK(kva_set_error(KVA_ERR_DEVICE, "inner %d", 42) == KVA_ERR_DEVICE, "set_error returns its status");
  kva_set_error(KVA_ERR_DEVICE, "outer: %s", kva_last_error());
  CHECK(strcmp(kva_last_error(), "outer: inner 42") == 0, "wrapped message \"%s\"", kva_last_error());
  char longer[700];
  memset(longer, 'x', sizeof(longer) - 1);
  longer[sizeof(longer) - 1] = '\0';
  kva_set_error(KVA_ERR_INTERNAL, "%s", longer);
  CHECK(strlen(kva_last_error()) > 100 && strlen(kva_last_error()) < sizeof(longer) - 1,
        "long messages are cut, not overflowed (%zu)", strlen(kva_last_error()));
}

static void test_dtypes(void) {
  CHECK(kva_dtype_size(KVA_F32) == 4 && kva_dtype_size(KVA_F16) == 2 && kva_dtype_size(KVA_BF16) == 2 &&
            kva_dtype_size(KVA_FP8_E4M3) == 1,
        "dtype sizes");
  CHECK(kva_dtype_size((kva_dtype)9) == 0, "size of an unknown dtype");
  CHECK(!strcmp(kva_dtype_name(KVA_F32), "f32") && !strcmp(kva_dtype_name(KVA_F16), "f16") &&
            !strcmp(kva_dtype_name(KVA_BF16), "bf16") && !strcmp(kva_dtype_name(KVA_FP8_E4M3), "fp8"),
        "dtype names");
  CHECK(kva_dtype_name((kva_dtype)9) != NULL, "name of an unknown dtype");
}

/* kva_last_error is per thread: a new thread starts with "", its errors stay its own. */
static char thread_saw_initial[64], thread_saw_after[256];
static void *error_thread(void *arg) {
  (void)arg;
  snprintf(thread_saw_initial, sizeof(thread_saw_initial), "%s", kva_last_error());
  kva_pool_alloc_pages(NULL, 1, NULL);
  snprintf(thread_saw_after, sizeof(thread_saw_after), "%s", kva_last_error());
  return NULL;
}
static void test_thread_local(void) {
  kva_context_create(NULL, NULL);
  char mine[256];
  snprintf(mine, sizeof(mine), "%s", kva_last_error());
  CHECK(strstr(mine, "kva_context_create") != NULL, "main thread message: %s", mine);
  pthread_t th;
  CHECK(pthread_create(&th, NULL, error_thread, NULL) == 0, "pthread_create");
  pthread_join(th, NULL);
  CHECK(thread_saw_initial[0] == '\0', "new thread starts with \"%s\"", thread_saw_initial);
  CHECK(strstr(thread_saw_after, "kva_pool_alloc_pages") != NULL, "thread message: %s", thread_saw_after);
  CHECK(strcmp(kva_last_error(), mine) == 0, "another thread's error replaced ours: %s", kva_last_error());
}

static void test_context(void) {
  kva_context *ctx = (kva_context *)&ctx; /* must be reset to NULL on failure */
  kva_context_config cc = {KVA_DEVICE_CPU, 3, 0};
  CHECK_STATUS(kva_context_create(NULL, &ctx), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("config");
  CHECK_STATUS(kva_context_create(&cc, NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("out");
  cc.num_threads = -1;
  CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("num_threads");
  CHECK(ctx == NULL, "failed create left *out set");
  cc.num_threads = 3;
  cc.device = (kva_device)7;
  CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("device");
  CHECK_STATUS(kva_device_available((kva_device)7), KVA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kva_device_available(KVA_DEVICE_CPU), KVA_OK);
  cc.device = KVA_DEVICE_CUDA;
  cc.cuda_device = -1;
  CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("cuda_device");
  /* CUDA: either usable, or NO_DEVICE with a reason; both entry points agree */
  cc.cuda_device = 0;
  kva_status avail = kva_device_available(KVA_DEVICE_CUDA);
  CHECK(avail == KVA_OK || avail == KVA_ERR_NO_DEVICE, "cuda availability %s", kva_strerror(avail));
  if (avail == KVA_ERR_NO_DEVICE) {
    CHECK_MSG("CUDA");
    CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_ERR_NO_DEVICE);
    CHECK_MSG("CUDA");
    CHECK(ctx == NULL, "failed CUDA create left *out set");
  }

  cc.device = KVA_DEVICE_CPU;
  CHECK_STATUS(kva_context_create(&cc, &ctx), KVA_OK);
  if (!ctx) return;
  CHECK(kva_context_device(ctx) == KVA_DEVICE_CPU, "device");
  CHECK(kva_context_num_workers(ctx) == 3, "workers %d, asked for 3", kva_context_num_workers(ctx));
  CHECK(kva_context_num_workers(NULL) == 0, "workers of NULL");
  CHECK_STATUS(kva_context_set_stream(NULL, NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("ctx");
  CHECK_STATUS(kva_context_set_stream(ctx, NULL), KVA_OK);
  CHECK_STATUS(kva_synchronize(NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_synchronize(ctx), KVA_OK);

  /* memory helpers */
  void *p = &p;
  CHECK_STATUS(kva_malloc(NULL, 16, &p), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_malloc(ctx, 16, NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("out");
  CHECK_STATUS(kva_malloc(ctx, 0, &p), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("bytes");
  CHECK(p == NULL, "failed malloc left *out set");
  CHECK_STATUS(kva_malloc(ctx, 100, &p), KVA_OK);
  float host[25], back[25];
  tu_rng r = {7};
  tu_fill_uniform(&r, host, 25, -3.0f, 3.0f);
  tu_poison(back, 25);
  CHECK_STATUS(kva_copy_to_device(NULL, p, host, 100), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_copy_to_device(ctx, NULL, host, 100), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("dst");
  CHECK_STATUS(kva_copy_to_device(ctx, p, NULL, 100), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("src");
  CHECK_STATUS(kva_copy_to_host(ctx, back, NULL, 100), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_copy_to_host(ctx, NULL, p, 100), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_copy_to_device(ctx, p, host, 100), KVA_OK);
  CHECK_STATUS(kva_copy_to_host(ctx, back, p, 100), KVA_OK);
  CHECK(memcmp(host, back, 100) == 0, "device round trip");
  kva_free(ctx, p);
  kva_free(ctx, NULL);
  kva_free(NULL, NULL);
  kva_context_destroy(ctx);
  kva_context_destroy(NULL);
}

static kva_pool_config good_mha(void) {
  kva_pool_config c = {KVA_LAYOUT_MHA, 2, 16, 4, 2, 64, KVA_F16};
  return c;
}

/* one bad config field: the status and the field's name in the message */
static void bad_config(kva_context *ctx, kva_pool_config c, kva_status want, const char *field) {
  kva_pool *pool = (kva_pool *)&pool;
  kva_status st = kva_pool_create(ctx, &c, &pool);
  CHECK(st == want, "pool {layout %d layers %d pages %d ps %d heads %d dim %d dtype %d} -> %s, want %s (%s)",
        (int)c.layout, c.num_layers, c.num_pages, c.page_size, c.num_kv_heads, c.head_dim,
        (int)c.kv_dtype, kva_strerror(st), kva_strerror(want), kva_last_error());
  CHECK(strstr(kva_last_error(), field) != NULL, "message \"%s\" does not name %s", kva_last_error(), field);
  CHECK(pool == NULL, "failed pool create left *out set");
  if (st == KVA_OK) kva_pool_destroy(pool);
}
static void good_config(kva_context *ctx, kva_pool_config c) {
  kva_pool *pool = NULL;
  kva_status st = kva_pool_create(ctx, &c, &pool);
  CHECK(st == KVA_OK && pool != NULL, "pool {layout %d ps %d heads %d dim %d dtype %d}: %s",
        (int)c.layout, c.page_size, c.num_kv_heads, c.head_dim, (int)c.kv_dtype, kva_last_error());
  if (!pool) return;
  CHECK(kva_pool_num_free_pages(pool) == c.num_pages && kva_pool_check(pool) == KVA_OK, "fresh pool");
  CHECK(memcmp(kva_pool_get_config(pool), &c, sizeof(c)) == 0, "get_config differs from the config");
  kva_pool_destroy(pool);
}

static void test_pool_create(kva_context *ctx) {
  kva_pool_config c = good_mha();
  kva_pool *pool = NULL;
  CHECK_STATUS(kva_pool_create(NULL, &c, &pool), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("ctx");
  CHECK_STATUS(kva_pool_create(ctx, NULL, &pool), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("config");
  CHECK_STATUS(kva_pool_create(ctx, &c, NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("out");

  c = good_mha(); c.layout = (kva_layout)5;     bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "layout");
  c = good_mha(); c.num_layers = 0;             bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "num_layers");
  c = good_mha(); c.num_layers = -3;            bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "num_layers");
  c = good_mha(); c.num_pages = 0;              bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "num_pages");
  c = good_mha(); c.num_pages = -1;             bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "num_pages");
  c = good_mha(); c.page_size = 0;              bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "page_size");
  c = good_mha(); c.page_size = -16;            bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "page_size");
  c = good_mha(); c.page_size = 257;            bad_config(ctx, c, KVA_ERR_UNSUPPORTED, "page_size");
  c = good_mha(); c.num_kv_heads = 0;           bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "num_kv_heads");
  c = good_mha(); c.head_dim = 0;               bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "head_dim");
  c = good_mha(); c.head_dim = -8;              bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "head_dim");
  c = good_mha(); c.head_dim = 12;              bad_config(ctx, c, KVA_ERR_UNSUPPORTED, "head_dim");
  c = good_mha(); c.head_dim = 264;             bad_config(ctx, c, KVA_ERR_UNSUPPORTED, "head_dim");
  c = good_mha(); c.head_dim = 576;             bad_config(ctx, c, KVA_ERR_UNSUPPORTED, "head_dim");
  c = good_mha(); c.kv_dtype = KVA_F32;         bad_config(ctx, c, KVA_ERR_UNSUPPORTED, "kv_dtype");
  c = good_mha(); c.kv_dtype = (kva_dtype)17;   bad_config(ctx, c, KVA_ERR_UNSUPPORTED, "kv_dtype");
  /* slot ids page * page_size + offset must fit int32 */
  c = good_mha(); c.num_pages = 1 << 24; c.page_size = 256;
  bad_config(ctx, c, KVA_ERR_INVALID_ARGUMENT, "num_pages");
  kva_pool_config m = {KVA_LAYOUT_MLA, 1, 8, 16, 1, 576, KVA_BF16};
  c = m; c.head_dim = 512;                      bad_config(ctx, c, KVA_ERR_UNSUPPORTED, "head_dim");
  c = m; c.num_kv_heads = 2;                    bad_config(ctx, c, KVA_ERR_UNSUPPORTED, "num_kv_heads");
  c = m; c.kv_dtype = KVA_F32;                  bad_config(ctx, c, KVA_ERR_UNSUPPORTED, "kv_dtype");

  /* the edges of what is supported */
  c = good_mha(); c.page_size = 1;              good_config(ctx, c);
  c = good_mha(); c.page_size = 256;            good_config(ctx, c);
  c = good_mha(); c.head_dim = 8;               good_config(ctx, c);
  c = good_mha(); c.head_dim = 256;             good_config(ctx, c);
  c = good_mha(); c.kv_dtype = KVA_BF16;        good_config(ctx, c);
  c = good_mha(); c.kv_dtype = KVA_FP8_E4M3;    good_config(ctx, c);
  c = good_mha(); c.num_pages = 1;              good_config(ctx, c);
  good_config(ctx, m);
  c = m; c.kv_dtype = KVA_FP8_E4M3;             good_config(ctx, c);
}

static void test_pool_calls(kva_context *ctx) {
  kva_pool *pool = tu_pool(ctx, KVA_LAYOUT_MHA, 2, 8, 4, 1, 8, KVA_FP8_E4M3);
  kva_pool *mla = tu_pool(ctx, KVA_LAYOUT_MLA, 1, 4, 2, 1, 576, KVA_BF16);
  CHECK(pool && mla, "pools");
  if (!pool || !mla) return;
  CHECK(kva_pool_get_config(NULL) == NULL, "config of NULL");
  kva_pool_destroy(NULL);

  /* scales */
  CHECK_STATUS(kva_pool_set_scale(NULL, 0, 1.0f, 1.0f), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_pool_set_scale(pool, 2, 1.0f, 1.0f), KVA_ERR_OUT_OF_RANGE);
  CHECK_MSG("layer");
  CHECK_STATUS(kva_pool_set_scale(pool, -1, 1.0f, 1.0f), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_pool_set_scale(pool, 0, 0.0f, 1.0f), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("k_scale");
  CHECK_STATUS(kva_pool_set_scale(pool, 0, 1.0f, -2.0f), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("v_scale");
  CHECK_STATUS(kva_pool_set_scale(pool, 0, nanf(""), 1.0f), KVA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kva_pool_set_scale(pool, 0, 1.0f, INFINITY), KVA_ERR_INVALID_ARGUMENT);

  /* buffers */
  void *k = NULL, *v = NULL;
  CHECK_STATUS(kva_pool_get_buffers(NULL, 0, &k, &v), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_pool_get_buffers(pool, 2, &k, &v), KVA_ERR_OUT_OF_RANGE);
  CHECK_MSG("layer");
  CHECK_STATUS(kva_pool_get_buffers(pool, 1, &k, &v), KVA_OK);
  CHECK(k && v && k != v, "MHA buffers %p %p", k, v);
  CHECK_STATUS(kva_pool_get_buffers(mla, 0, &k, &v), KVA_OK);
  CHECK(k && v == NULL, "MLA buffers %p %p", k, v);

  /* fresh pools read back as zeros, scaled by the default 1.0 (under ASan,
   * new memory is 0xbe-filled, so a missing mem_zero shows) */
  int32_t slots[3] = {0, 5, 31};
  float ko[3 * 8], vo[3 * 8];
  tu_poison(ko, 24);
  tu_poison(vo, 24);
  CHECK_STATUS(kva_pool_read_tokens(pool, 1, 3, slots, ko, vo), KVA_OK);
  int zeros = 1;
  for (int i = 0; i < 24; i++) zeros &= ko[i] == 0.0f && vo[i] == 0.0f;
  CHECK(zeros, "fresh pool is not zeroed");
  CHECK_STATUS(kva_pool_read_tokens(NULL, 0, 3, slots, ko, vo), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_pool_read_tokens(pool, 2, 3, slots, ko, vo), KVA_ERR_OUT_OF_RANGE);
  CHECK_MSG("layer");
  CHECK_STATUS(kva_pool_read_tokens(pool, 0, -1, slots, ko, vo), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("count");
  CHECK_STATUS(kva_pool_read_tokens(pool, 0, 3, NULL, ko, vo), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("slots");
  int32_t bad[2] = {3, 32};
  tu_poison(ko, 24);
  CHECK_STATUS(kva_pool_read_tokens(pool, 0, 2, bad, ko, vo), KVA_ERR_OUT_OF_RANGE);
  CHECK_MSG("slots[1]");
  CHECK(isnan(ko[0]), "a failing read wrote k_out");
  bad[1] = -1;
  CHECK_STATUS(kva_pool_read_tokens(pool, 0, 2, bad, ko, vo), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_pool_read_tokens(pool, 0, 0, NULL, NULL, NULL), KVA_OK);

  /* allocator arguments */
  int32_t pages[9];
  CHECK_STATUS(kva_pool_alloc_pages(NULL, 1, pages), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("pool");
  CHECK_STATUS(kva_pool_alloc_pages(pool, 1, NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("pages");
  CHECK_STATUS(kva_pool_alloc_pages(pool, -2, pages), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("count");
  CHECK_STATUS(kva_pool_alloc_pages(pool, 9, pages), KVA_ERR_OUT_OF_PAGES);
  CHECK(kva_pool_num_free_pages(pool) == 8, "failed alloc took pages");
  CHECK_STATUS(kva_pool_alloc_pages(pool, 0, NULL), KVA_OK);
  CHECK_STATUS(kva_pool_ref_page(NULL, 0), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_pool_unref_page(NULL, 0), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_pool_ref_page(pool, 8), KVA_ERR_OUT_OF_RANGE);
  CHECK_MSG("page 8");
  CHECK_STATUS(kva_pool_unref_page(pool, -1), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_pool_unref_page(pool, 3), KVA_ERR_DOUBLE_FREE);
  CHECK_MSG("page 3");
  CHECK_STATUS(kva_pool_ref_page(pool, 3), KVA_ERR_STATE);
  CHECK(kva_pool_page_refcount(pool, 3) == 0 && kva_pool_num_free_pages(pool) == 8, "bad ref changed the pool");
  CHECK(kva_pool_page_refcount(NULL, 0) == -1 && kva_pool_page_refcount(pool, 8) == -1 &&
            kva_pool_page_refcount(pool, -1) == -1,
        "refcount of bad ids");
  CHECK(kva_pool_num_free_pages(NULL) == 0, "free pages of NULL");
  CHECK_STATUS(kva_pool_check(NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_pool_check(pool), KVA_OK);
  kva_pool_destroy(pool);
  kva_pool_destroy(mla);
}

static void test_req_table_args(kva_context *ctx) {
  kva_pool *pool = tu_pool(ctx, KVA_LAYOUT_MHA, 1, 8, 4, 1, 8, KVA_F16);
  if (!pool) return;
  kva_req_table *t = (kva_req_table *)&t;
  CHECK_STATUS(kva_req_table_create(NULL, 4, 16, &t), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("pool");
  CHECK_STATUS(kva_req_table_create(pool, 4, 16, NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("out");
  CHECK_STATUS(kva_req_table_create(pool, 0, 16, &t), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("max_requests");
  CHECK(t == NULL, "failed create left *out set");
  CHECK_STATUS(kva_req_table_create(pool, -1, 16, &t), KVA_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kva_req_table_create(pool, 4, 0, &t), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("max_context_len");
  CHECK_STATUS(kva_req_table_create(pool, 4, -5, &t), KVA_ERR_INVALID_ARGUMENT);
  kva_req_table_destroy(NULL);
  CHECK_STATUS(kva_req_table_create(pool, 4, 16, &t), KVA_OK);
  if (!t) return;
  int s = -1, n = -1;
  CHECK_STATUS(kva_req_alloc(NULL, &s), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_req_alloc(t, NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("slot");
  CHECK(kva_req_num_live(t) == 0, "failed alloc took a slot");
  CHECK_STATUS(kva_req_alloc(t, &s), KVA_OK);
  CHECK_STATUS(kva_req_append(NULL, s, 1), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_req_append(t, s, -1), KVA_ERR_INVALID_ARGUMENT);
  CHECK_MSG("num_tokens");
  CHECK_STATUS(kva_req_append(t, 4, 1), KVA_ERR_OUT_OF_RANGE);
  CHECK_MSG("slot 4");
  CHECK_STATUS(kva_req_append(t, 1, 1), KVA_ERR_STATE);
  CHECK_MSG("slot 1");
  CHECK_STATUS(kva_req_append(t, s, 17), KVA_ERR_CAPACITY);
  CHECK_STATUS(kva_req_append(t, s, 6), KVA_OK);
  CHECK_STATUS(kva_req_fork(NULL, s, 1, &n), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_req_fork(t, s, 1, NULL), KVA_ERR_NULL_ARGUMENT);
  CHECK_MSG("new_slot");
  CHECK_STATUS(kva_req_fork(t, -1, 1, &n), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_req_fork(t, s, 7, &n), KVA_ERR_OUT_OF_RANGE);
  CHECK_MSG("prefix_len");
  CHECK_STATUS(kva_req_truncate(NULL, s, 1), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_req_truncate(t, s, -1), KVA_ERR_OUT_OF_RANGE);
  CHECK_MSG("new_len");
  CHECK_STATUS(kva_req_truncate(t, 9, 0), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_req_release(NULL, s), KVA_ERR_NULL_ARGUMENT);
  CHECK_STATUS(kva_req_release(t, -1), KVA_ERR_OUT_OF_RANGE);
  CHECK_STATUS(kva_req_release(t, 2), KVA_ERR_DOUBLE_FREE);
  CHECK_MSG("slot 2");
  CHECK(n == -1, "failed forks wrote new_slot");
  CHECK(kva_req_len(t, s) == 6 && kva_pool_num_free_pages(pool) == 6, "failed calls changed the request");
  CHECK(kva_req_len(NULL, 0) == -1 && kva_req_len(t, -1) == -1 && kva_req_len(t, 4) == -1 &&
            kva_req_len(t, 3) == -1,
        "len of bad or free slots");
  CHECK(kva_req_tokens(NULL, 0) == NULL && kva_req_tokens(t, 4) == NULL && kva_req_tokens(t, 3) == NULL,
        "tokens of bad or free slots");
  CHECK(kva_req_num_live(NULL) == 0 && kva_req_num_live(t) == 1, "num_live");
  kva_req_table_destroy(t);
  CHECK(kva_pool_num_free_pages(pool) == 8, "destroy kept pages");
  kva_pool_destroy(pool);
}

int main(void) {
  CHECK(kva_last_error() != NULL && kva_last_error()[0] == '\0', "initial message \"%s\"", kva_last_error());
  test_status_names();
  test_dtypes();
  test_thread_local();
  test_context();
  kva_context *ctx = tu_cpu_context(1);
  if (!ctx) return 1;
  test_pool_create(ctx);
  test_pool_calls(ctx);
  test_req_table_args(ctx);
  kva_context_destroy(ctx);
  return tu_summary("test_errors");
}
