/* threadpool.c: persistent workers that spin briefly, then sleep, between runs.
 * A decode step issues a few hundred small parallel ops, so a condvar wake per
 * op would cost more than the op; spinning a short while keeps them cheap. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <immintrin.h>

#include "common/dp.h"

#define SPIN_ITERS 20000

struct dp_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Current job, published by bumping gen. */
    dp_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t next;
    atomic_int busy;           /* workers still inside the current job */
    atomic_uint gen;
    atomic_bool stop;
};

struct worker_arg {
    dp_threadpool *tp;
    int id;
};

static void run_tasks(dp_threadpool *tp, int id)
{
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&tp->next, 1, memory_order_relaxed);
        if (t >= tp->n_tasks)
            break;
        tp->fn(tp->ctx, t, id);
    }
}

static void *worker_main(void *p)
{
    struct worker_arg *wa = p;
    dp_threadpool *tp = wa->tp;
    int id = wa->id;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&tp->gen, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < SPIN_ITERS) {
                _mm_pause();
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->gen) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop))
            return NULL;
        seen = g;
        run_tasks(tp, id);
        atomic_fetch_sub_explicit(&tp->busy, 1, memory_order_release);
    }
}

int threadpool_init(dp_threadpool **out, int n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    dp_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp)
        return DP_ENOMEM;
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    if (n_threads > 1) {
        tp->threads = calloc((size_t)n_threads - 1, sizeof *tp->threads);
        if (!tp->threads) {
            threadpool_destroy(tp);
            return DP_ENOMEM;
        }
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            tp->n_threads = i;
            threadpool_destroy(tp);
            return DP_ENOMEM;
        }
        wa->tp = tp;
        wa->id = i;
        if (pthread_create(&tp->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            tp->n_threads = i;
            threadpool_destroy(tp);
            return DP_ENOMEM;
        }
    }
    *out = tp;
    return 0;
}

void threadpool_destroy(dp_threadpool *tp)
{
    if (!tp)
        return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, true);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n_threads; i++)
        pthread_join(tp->threads[i - 1], NULL);
    free(tp->threads);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp);
}

int threadpool_size(const dp_threadpool *tp) { return tp->n_threads; }

void threadpool_run(dp_threadpool *tp, dp_task_fn fn, void *ctx, int64_t n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (tp->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_tasks = n_tasks;
    atomic_store_explicit(&tp->next, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->busy, tp->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    run_tasks(tp, 0);
    while (atomic_load_explicit(&tp->busy, memory_order_acquire) > 0)
        _mm_pause();
}
