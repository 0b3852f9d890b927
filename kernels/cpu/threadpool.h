/* threadpool.h: the CPU backend's persistent worker threads. A parallel run
 * hands out task indices from an atomic counter; the caller works too. */
#ifndef DP_KERNELS_CPU_THREADPOOL_H
#define DP_KERNELS_CPU_THREADPOOL_H

#include <stdint.h>

typedef struct dp_threadpool dp_threadpool;

/* fn is called once per task index in [0, n_tasks), on any thread; thread is
 * the worker's id in [0, n_threads) (0 is the caller), for per-thread scratch. */
typedef void (*dp_task_fn)(void *ctx, int64_t task, int thread);

int threadpool_init(dp_threadpool **out, int n_threads);
void threadpool_destroy(dp_threadpool *tp);
int threadpool_size(const dp_threadpool *tp);
/* Runs all tasks and returns when every one has finished. */
void threadpool_run(dp_threadpool *tp, dp_task_fn fn, void *ctx, int64_t n_tasks);

#endif
