#include "_pool.h"

#if defined(__unix__) || defined(__APPLE__)
#define I8A_POOL_PTHREADS 1
#endif

#ifdef I8A_POOL_PTHREADS

#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* No PAUSE on x86: under KVM a PAUSE loop trips pause-loop exiting and the hypervisor
 * deschedules the spinning vCPU, which measured here as millisecond stalls of the next job. */
#if defined(__aarch64__)
#define I8A_PAUSE() __asm__ volatile("yield")
#else
#define I8A_PAUSE() ((void)0)
#endif

/* Spin this long before sleeping: long enough that a decode loop (one call per layer, with the
 * model's other work between calls) finds its workers awake, since waking a sleeping thread
 * costs tens of microseconds here; short enough not to hold a core when idle. */
#define I8A_SPIN_NS 1000000

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Spin-wait helper: returns 0 while the caller should keep spinning (call with *until = 0 first). */
static int spin_expired(uint64_t *until, unsigned *count)
{
    I8A_PAUSE();
    if ((++*count & 255) != 0)
        return 0;
    const uint64_t t = now_ns();
    if (*until == 0)
        *until = t + I8A_SPIN_NS;
    return t >= *until;
}

static struct {
    pthread_mutex_t run;          /* one job at a time */
    pthread_mutex_t mu;           /* guards the sleeps below */
    pthread_cond_t wake, done;
    atomic_ullong job;            /* (job number << 16) | threads taking part, published last */
    atomic_size_t busy;           /* workers (not the caller) still in the job */
    atomic_int sleepers;          /* callers/workers asleep on a condition */
    i8a_task_fn fn;
    void *ctx;
    size_t n_items;
    size_t started;               /* worker threads created */
    unsigned long long job_before_start;  /* the job word when the newest worker was created */
} pool = {.run = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

/* Worker w of n takes items [w * items / n, (w + 1) * items / n). */
static void take_items(size_t worker, size_t n)
{
    const size_t begin = pool.n_items * worker / n, end = pool.n_items * (worker + 1) / n;
    if (begin < end)
        pool.fn(pool.ctx, begin, end, worker);
}

/* The job number and its thread count travel in one word: a worker that wakes late, after
 * the job it missed has ended, sees either that job's count (and it was not part of it: the
 * caller waited for every part) or the next job's word, never a mix of the two. */
static void *worker_main(void *arg)
{
    const size_t me = (size_t)arg;
    unsigned long long seen = pool.job_before_start; /* set before pthread_create */
    for (;;) {
        unsigned long long job;
        uint64_t until = 0;
        unsigned count = 0;
        while ((job = atomic_load(&pool.job)) == seen) {
            if (!spin_expired(&until, &count))
                continue;
            pthread_mutex_lock(&pool.mu);
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.job) == seen)
                pthread_cond_wait(&pool.wake, &pool.mu);
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = job;
        if (me < (job & 0xffff)) {
            take_items(me, job & 0xffff);
            if (atomic_fetch_sub_explicit(&pool.busy, 1, memory_order_acq_rel) == 1) {
                pthread_mutex_lock(&pool.mu);
                pthread_cond_signal(&pool.done);
                pthread_mutex_unlock(&pool.mu);
            }
        }
    }
    return NULL;
}

/* After fork() only the forking thread exists in the child: forget the workers. */
static void after_fork_child(void)
{
    pthread_mutex_init(&pool.run, NULL);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    atomic_store(&pool.sleepers, 0);
    pool.started = 0;
}

static size_t start_workers(size_t want)
{
    static int registered = 0;
    if (!registered) {
        pthread_atfork(NULL, NULL, after_fork_child);
        registered = 1;
    }
    pool.job_before_start = atomic_load(&pool.job);
    while (pool.started + 1 < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker_main, (void *)(pool.started + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;
        pool.started++;
    }
    return pool.started + 1;
}

size_t i8a_pool_run(size_t n_items, size_t n_threads, i8a_task_fn fn, void *ctx)
{
    size_t n = n_threads < n_items ? n_threads : n_items;
    if (n > I8A_MAX_THREADS)
        n = I8A_MAX_THREADS;
    if (n <= 1 || pthread_mutex_trylock(&pool.run) != 0) {
        if (n_items)
            fn(ctx, 0, n_items, 0);
        return 1;
    }
    size_t have = start_workers(n);
    n = n < have ? n : have;
    pool.fn = fn, pool.ctx = ctx, pool.n_items = n_items;
    atomic_store_explicit(&pool.busy, n - 1, memory_order_relaxed);
    /* seq_cst, as is the sleepers load after it: a worker going to sleep either is counted
     * there (and woken) or sees the new job word before it sleeps */
    unsigned long long number = (atomic_load(&pool.job) >> 16) + 1;
    atomic_store(&pool.job, (number << 16) | n);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.mu);
    }
    take_items(0, n);
    uint64_t until = 0;
    unsigned count = 0;
    while (atomic_load_explicit(&pool.busy, memory_order_acquire) != 0) {
        if (!spin_expired(&until, &count))
            continue;
        pthread_mutex_lock(&pool.mu);
        while (atomic_load(&pool.busy) != 0)
            pthread_cond_wait(&pool.done, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
    }
    pthread_mutex_unlock(&pool.run);
    return n;
}

size_t i8a_cpus_available(void)
{
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return (size_t)CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (size_t)n : 1;
}

#else /* no pthreads: the calling thread does everything */

size_t i8a_pool_run(size_t n_items, size_t n_threads, i8a_task_fn fn, void *ctx)
{
    (void)n_threads;
    if (n_items)
        fn(ctx, 0, n_items, 0);
    return 1;
}

size_t i8a_cpus_available(void)
{
    return 1;
}

#endif
