#include "cpu/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct kva_threadpool {
  int n;  /* threads including the caller */
  pthread_t *threads;
  pthread_mutex_t run_mu; /* one job at a time when callers share a context */
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  unsigned long generation;
  int stop;
  /* current job */
  kva_task_fn fn;
  void *arg;
  int num_tasks;
  atomic_int next;
  int busy; /* workers still inside the job */
};

typedef struct {
  kva_threadpool *tp;
  int index;
} worker_arg;

static void drain(kva_threadpool *tp, int thread) {
  for (;;) {
    int t = atomic_fetch_add(&tp->next, 1);
    if (t >= tp->num_tasks) break;
    tp->fn(tp->arg, t, thread);
  }
}

static void *worker(void *p) {
  worker_arg *wa = (worker_arg *)p;
  kva_threadpool *tp = wa->tp;
  int index = wa->index;
  free(wa);
  unsigned long seen = 0;
  pthread_mutex_lock(&tp->mu);
  for (;;) {
    while (!tp->stop && tp->generation == seen) pthread_cond_wait(&tp->wake, &tp->mu);
    if (tp->stop) break;
    seen = tp->generation;
    pthread_mutex_unlock(&tp->mu);
    drain(tp, index);
    pthread_mutex_lock(&tp->mu);
    if (--tp->busy == 0) pthread_cond_signal(&tp->done);
  }
  pthread_mutex_unlock(&tp->mu);
  return NULL;
}

kva_threadpool *kva_threadpool_create(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  kva_threadpool *tp = (kva_threadpool *)calloc(1, sizeof(*tp));
  if (!tp) return NULL;
  tp->n = num_threads;
  pthread_mutex_init(&tp->run_mu, NULL);
  pthread_mutex_init(&tp->mu, NULL);
  pthread_cond_init(&tp->wake, NULL);
  pthread_cond_init(&tp->done, NULL);
  atomic_init(&tp->next, 0);
  tp->threads = (pthread_t *)calloc((size_t)num_threads, sizeof(pthread_t));
  if (!tp->threads) {
    pthread_mutex_destroy(&tp->run_mu);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->wake);
    pthread_cond_destroy(&tp->done);
    free(tp);
    return NULL;
  }
  for (int i = 1; i < num_threads; i++) {
    worker_arg *wa = (worker_arg *)malloc(sizeof(*wa));
    if (wa) {
      wa->tp = tp;
      wa->index = i;
    }
    if (!wa || pthread_create(&tp->threads[i], NULL, worker, wa) != 0) {
      free(wa);
      tp->n = i; /* keep the threads we have */
      break;
    }
  }
  return tp;
}

void kva_threadpool_destroy(kva_threadpool *tp) {
  if (!tp) return;
  pthread_mutex_lock(&tp->mu);
  tp->stop = 1;
  pthread_cond_broadcast(&tp->wake);
  pthread_mutex_unlock(&tp->mu);
  for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
  pthread_mutex_destroy(&tp->run_mu);
  pthread_mutex_destroy(&tp->mu);
  pthread_cond_destroy(&tp->wake);
  pthread_cond_destroy(&tp->done);
  free(tp->threads);
  free(tp);
}

int kva_threadpool_size(const kva_threadpool *tp) { return tp ? tp->n : 1; }

void kva_threadpool_run(kva_threadpool *tp, int num_tasks, kva_task_fn fn, void *arg) {
  if (num_tasks <= 0) return;
  if (tp->n == 1 || num_tasks == 1) {
    for (int t = 0; t < num_tasks; t++) fn(arg, t, 0);
    return;
  }
  pthread_mutex_lock(&tp->run_mu);
  pthread_mutex_lock(&tp->mu);
  tp->fn = fn;
  tp->arg = arg;
  tp->num_tasks = num_tasks;
  atomic_store(&tp->next, 0);
  tp->busy = tp->n - 1;
  tp->generation++;
  pthread_cond_broadcast(&tp->wake);
  pthread_mutex_unlock(&tp->mu);
  drain(tp, 0);
  pthread_mutex_lock(&tp->mu);
  while (tp->busy > 0) pthread_cond_wait(&tp->done, &tp->mu);
  pthread_mutex_unlock(&tp->mu);
  pthread_mutex_unlock(&tp->run_mu);
}
