/* threadpool.c: persistent workers that spin briefly, then sleep, between runs.
 * A decode step issues a few hundred small parallel ops, so a condvar wake per
 * op would cost more than the op; spinning a short while keeps them cheap.
 *
 * The caller never waits for a worker to *notice* a job, only for claimed
 * tasks to finish: on a busy machine a descheduled worker would otherwise
 * stall every op by a whole time slice. Tasks are claimed with a CAS on one
 * word holding (job generation, next index), so a late worker can never claim
 * a task of a job it did not load; jobs alternate between two slots, and a
 * slot is reused only when no worker still holds it. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#ifdef __x86_64__
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "common/dp.h"

#define SPIN_ITERS 4000  /* a few tens of microseconds before a worker sleeps */
#define YIELD_AFTER 2000 /* caller spins this long, then yields its core */

typedef struct job_slot {
    dp_task_fn fn;
    void *ctx;
    int64_t n_tasks;
    atomic_int_fast64_t done;
    atomic_int refs; /* workers inside this slot */
} job_slot;

struct dp_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_slot slots[2];
    /* (generation << 32) | next task index; generation 0 means "no job yet". */
    atomic_uint_fast64_t state;
    atomic_int sleepers;
    atomic_bool stop;
    uint32_t gen; /* caller's last generation */
};

struct worker_arg {
    dp_threadpool *tp;
    int id;
};

/* Claims and runs tasks of generation g while they last. */
static void run_tasks(dp_threadpool *tp, uint32_t g, job_slot *js, int id)
{
    uint64_t s = atomic_load_explicit(&tp->state, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(s >> 32) != g || (int64_t)(s & 0xffffffffu) >= js->n_tasks)
            return;
        if (!atomic_compare_exchange_weak_explicit(&tp->state, &s, s + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        js->fn(js->ctx, (int64_t)(s & 0xffffffffu), id);
        atomic_fetch_add_explicit(&js->done, 1, memory_order_release);
        s = atomic_load_explicit(&tp->state, memory_order_acquire);
    }
}

static void *worker_main(void *p)
{
    struct worker_arg *wa = p;
    dp_threadpool *tp = wa->tp;
    int id = wa->id;
    free(wa);
    uint32_t seen = 0;
    for (;;) {
        uint64_t s;
        int spins = 0;
        while ((uint32_t)((s = atomic_load_explicit(&tp->state, memory_order_acquire)) >> 32) == seen) {
            if (atomic_load_explicit(&tp->stop, memory_order_relaxed))
                return NULL;
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->sleepers, 1);
            while ((uint32_t)(atomic_load(&tp->state) >> 32) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            atomic_fetch_sub(&tp->sleepers, 1);
            pthread_mutex_unlock(&tp->mu);
            spins = 0;
        }
        uint32_t g = (uint32_t)(s >> 32);
        seen = g;
        job_slot *js = &tp->slots[g & 1];
        atomic_fetch_add_explicit(&js->refs, 1, memory_order_acq_rel);
        /* Only run the job if it is still the current one after taking a
         * reference: otherwise the caller may be refilling this slot. */
        if ((uint32_t)(atomic_load_explicit(&tp->state, memory_order_acquire) >> 32) == g)
            run_tasks(tp, g, js, id);
        atomic_fetch_sub_explicit(&js->refs, 1, memory_order_release);
    }
}

int threadpool_init(dp_threadpool **out, int n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    dp_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp)
        return DP_ENOMEM;
    tp->n_threads = 1;
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
            threadpool_destroy(tp);
            return DP_ENOMEM;
        }
        wa->tp = tp;
        wa->id = i;
        if (pthread_create(&tp->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            threadpool_destroy(tp);
            return DP_ENOMEM;
        }
        tp->n_threads = i + 1;
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

static void wait_until(atomic_int_fast64_t *v, int64_t target, bool ge)
{
    for (int spins = 0;; spins++) {
        int64_t x = atomic_load_explicit(v, memory_order_acquire);
        if (ge ? x >= target : x <= target)
            return;
        if (spins < YIELD_AFTER)
            cpu_relax();
        else
            sched_yield(); /* the worker we wait for may need this core */
    }
}

void threadpool_run(dp_threadpool *tp, dp_task_fn fn, void *ctx, int64_t n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (tp->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    uint32_t g = ++tp->gen;
    if (g == 0)
        g = ++tp->gen; /* generation 0 is reserved for "no job" */
    job_slot *js = &tp->slots[g & 1];
    /* Workers still holding this slot from two jobs ago only check the
     * generation and leave; wait for them before refilling it. */
    for (int spins = 0; atomic_load_explicit(&js->refs, memory_order_acquire) > 0; spins++)
        spins < YIELD_AFTER ? cpu_relax() : (void)sched_yield();
    js->fn = fn;
    js->ctx = ctx;
    js->n_tasks = n_tasks;
    atomic_store_explicit(&js->done, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->state, (uint64_t)g << 32, memory_order_release);
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
    run_tasks(tp, g, js, 0);
    wait_until(&js->done, n_tasks, true);
}
