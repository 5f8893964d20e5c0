/* A small persistent pthread pool: run N indexed tasks, claimed dynamically,
 * the calling thread taking part; returns when all are done. */
#ifndef KVA_THREADPOOL_H
#define KVA_THREADPOOL_H

typedef struct kva_threadpool kva_threadpool;
typedef void (*kva_task_fn)(void *arg, int task, int thread);

/* num_threads >= 1 counts the caller; NULL if threads cannot be made. */
kva_threadpool *kva_threadpool_create(int num_threads);
void kva_threadpool_destroy(kva_threadpool *tp);
int kva_threadpool_size(const kva_threadpool *tp);
void kva_threadpool_run(kva_threadpool *tp, int num_tasks, kva_task_fn fn, void *arg);

#endif
