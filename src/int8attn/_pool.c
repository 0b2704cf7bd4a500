#include "_pool.h"

#if defined(__unix__) || defined(__APPLE__)
#define I8A_POOL_PTHREADS 1
#endif

#ifdef I8A_POOL_PTHREADS

#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How long a worker that took part in a job waits for the next one before it sleeps, yielding
 * its CPU on every round: a decode loop (one call per layer, the model's other work between
 * calls) finds its workers awake, and a machine whose CPUs are taken gives them away at once.
 * The caller waits for running items this long before it sleeps. No PAUSE on x86: under KVM a
 * PAUSE loop trips pause-loop exiting and the hypervisor deschedules the vCPU. */
#define I8A_SPIN_NS 200000
#define I8A_CALLER_SPIN_NS 50000

/* A worker's stack at least: a kernel keeps up to 20 KiB on it (the tiled K pass's tiles of
 * 16 rows at the largest head dim, a chunk's row pointers). */
#define I8A_WORKER_STACK ((size_t)512 << 10)

/* A job is published as one word: seq << 32 | (threads - 1) << 24 | units. A thread that read
 * the word knows the job's ranges without reading anything the next job may overwrite. Items
 * are claimed in units: one item each, or blocks of items when a job has more than
 * I8A_MAX_UNITS of them. */
#define I8A_MAX_UNITS ((1u << 24) - 1)

static uint64_t job_word(uint32_t seq, size_t threads, size_t units)
{
    return (uint64_t)seq << 32 | (uint64_t)(threads - 1) << 24 | units;
}

static uint32_t word_seq(uint64_t w) { return (uint32_t)(w >> 32); }
static size_t word_threads(uint64_t w) { return (size_t)((w >> 24) & 0xff) + 1; }
static size_t word_units(uint64_t w) { return (size_t)(w & I8A_MAX_UNITS); }

/* The first unit of range r of a job of `units` units over t threads. */
static size_t range_start(size_t units, size_t r, size_t t) { return units * r / t; }

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* One round of a bounded spin: yields the CPU, and returns 1 once `ns` have passed since the
 * first round (call with *until = 0 first). */
static int spin_expired(uint64_t *until, unsigned *rounds, uint64_t ns)
{
    sched_yield();
    if ((++*rounds & 15) != 0)
        return 0;
    const uint64_t t = now_ns();
    if (*until == 0)
        *until = t + ns;
    return t >= *until;
}

typedef struct {
    _Alignas(64) atomic_ullong next;    /* seq << 32 | the range's next unclaimed unit */
} claim_slot;

typedef struct {
    _Alignas(64) pthread_mutex_t mu;    /* guards this worker's sleep */
    pthread_cond_t wake;
    atomic_int asleep;
    uint32_t seen_at_start;             /* the job seq when the worker was created */
} worker_slot;

static struct {
    pthread_mutex_t run;                /* one job at a time */
    pthread_mutex_t mu;                 /* guards the caller's sleep */
    pthread_cond_t done_cv;
    atomic_int caller_asleep;
    atomic_ullong job;                  /* the job word, published last */
    atomic_size_t done;                 /* units of the job that have finished */
    /* the job's task: written before its claims are armed, read only after a claim */
    i8a_task_fn fn;
    void *ctx;
    size_t n_items, block;
    size_t started;                     /* worker threads created */
    claim_slot claims[I8A_MAX_THREADS];
    worker_slot workers[I8A_MAX_THREADS];
} pool = {.run = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
          .done_cv = PTHREAD_COND_INITIALIZER};

static void wake_worker(size_t w)
{
    worker_slot *s = &pool.workers[w];
    if (atomic_load(&s->asleep)) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_signal(&s->wake);
        pthread_mutex_unlock(&s->mu);
    }
}

/* Wakes spread as a binary tree: each thread that joins a job wakes up to two more, so no one
 * thread makes every wake-up call. A job's threads are 0 .. t-1, so children of a thread in
 * the job are in it when their index is below t. */
static void wake_children(size_t me, uint64_t word)
{
    const size_t t = word_threads(word);
    for (size_t c = 2 * me + 1; c <= 2 * me + 2 && c < t; c++)
        wake_worker(c);
}

static void notify_caller(void)
{
    if (atomic_load(&pool.caller_asleep)) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_signal(&pool.done_cv);
        pthread_mutex_unlock(&pool.mu);
    }
}

/* Claim and run units of the job `word`: this thread's own range first, then whatever is left
 * in the others'. A claim succeeds only while the range's counter still carries this job's
 * seq, so a thread that arrives after the job ended claims nothing. The units it ran count as
 * done once it finds nothing left to claim (one shared write per thread, not per unit). */
static void participate(size_t me, uint64_t word)
{
    const uint32_t seq = word_seq(word);
    const size_t t = word_threads(word), units = word_units(word);
    size_t ran = 0;
    for (size_t k = 0; k < t; k++) {
        const size_t r = (me + k) % t, end = range_start(units, r + 1, t);
        atomic_ullong *next = &pool.claims[r].next;
        unsigned long long old = atomic_load_explicit(next, memory_order_acquire);
        while (word_seq(old) == seq && (old & 0xffffffffu) < end) {
            if (!atomic_compare_exchange_weak_explicit(next, &old, old + 1, memory_order_acq_rel,
                                                       memory_order_acquire))
                continue;
            const size_t u = (size_t)(old & 0xffffffffu), b = pool.block, n = pool.n_items;
            const size_t begin = u * b, stop = begin + b < n ? begin + b : n;
            pool.fn(pool.ctx, begin, stop, u + 1 < end ? stop : n, me);
            ran++;
            old = atomic_load_explicit(next, memory_order_acquire);
        }
    }
    if (ran && atomic_fetch_add(&pool.done, ran) + ran == units)
        notify_caller();
}

static void *worker_main(void *arg)
{
    const size_t me = (size_t)arg;
    worker_slot *slot = &pool.workers[me];
    uint32_t seen = slot->seen_at_start;
    int spin = 0;
    uint64_t until = 0;
    unsigned rounds = 0;
    for (;;) {
        const uint64_t word = atomic_load(&pool.job);
        if (word_seq(word) != seen) {
            seen = word_seq(word);
            spin = me < word_threads(word);     /* a job without this worker: park at once */
            if (spin) {
                wake_children(me, word);
                participate(me, word);
            }
            until = 0, rounds = 0;
            continue;
        }
        if (spin && !spin_expired(&until, &rounds, I8A_SPIN_NS))
            continue;
        /* seq_cst, as the caller's store of the job word and its load of `asleep`: either
         * the caller sees this worker asleep (and wakes it) or the worker sees the new job */
        pthread_mutex_lock(&slot->mu);
        atomic_store(&slot->asleep, 1);
        while (word_seq(atomic_load(&pool.job)) == seen)
            pthread_cond_wait(&slot->wake, &slot->mu);
        atomic_store(&slot->asleep, 0);
        pthread_mutex_unlock(&slot->mu);
        spin = 0;
    }
    return NULL;
}

/* The process's OpenMP runtime, when it has one loaded as a job first needs threads (libgomp,
 * as torch loads it, or a runtime with its entry points: libiomp5, LLVM's libomp) and
 * INT8ATTN_POOL is unset or "openmp": GOMP_parallel runs a function on the calling thread's
 * team. Chosen once per process (pthread_once), before a job first runs on threads. */
typedef void (*omp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_thread_num_fn)(void);
static struct {
    pthread_once_t once;
    omp_parallel_fn parallel;           /* NULL: the pool's own threads */
    omp_thread_num_fn thread_num;
} host = {.once = PTHREAD_ONCE_INIT};

/* After fork() only the forking thread exists in the child: forget the workers, and leave an
 * OpenMP team alone (not every runtime survives a fork: the child uses the pool's own). */
static void after_fork_child(void)
{
    pthread_mutex_init(&pool.run, NULL);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.done_cv, NULL);
    atomic_store(&pool.caller_asleep, 0);
    pool.started = 0;
    host.parallel = NULL;
}

static void choose_threads(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
    const char *want = getenv("INT8ATTN_POOL");
    if (want && *want && strcmp(want, "openmp") != 0)
        return;
    omp_parallel_fn par = (omp_parallel_fn)dlsym(RTLD_DEFAULT, "GOMP_parallel");
    omp_thread_num_fn num = (omp_thread_num_fn)dlsym(RTLD_DEFAULT, "omp_get_thread_num");
    if (par && num)
        host.parallel = par, host.thread_num = num;
}

int i8a_pool_uses_openmp(void)
{
    pthread_once(&host.once, choose_threads);
    return host.parallel != NULL;
}

/* One member of the OpenMP team running job `word` (GOMP_parallel's function). */
static void team_member(void *word)
{
    const uint64_t w = *(const uint64_t *)word;
    const int me = host.thread_num();
    if (me >= 0 && (size_t)me < word_threads(w))
        participate((size_t)me, w);
}

/* Workers 1 .. want-1 exist afterwards, as far as threads can be created; returns how many
 * threads a job can use (workers + the caller). Called with pool.run held. */
static size_t start_workers(size_t want)
{
    while (pool.started + 1 < want) {
        const size_t w = pool.started + 1;
        worker_slot *s = &pool.workers[w];
        pthread_mutex_init(&s->mu, NULL);
        pthread_cond_init(&s->wake, NULL);
        atomic_store(&s->asleep, 0);
        s->seen_at_start = word_seq(atomic_load(&pool.job));
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        size_t stack = 0;                     /* musl's default is 128 KiB */
        if (pthread_attr_getstacksize(&attr, &stack) == 0 && stack < I8A_WORKER_STACK)
            pthread_attr_setstacksize(&attr, I8A_WORKER_STACK);
        const int rc = pthread_create(&t, &attr, worker_main, (void *)w);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;
        pool.started = w;
    }
    return pool.started + 1;
}

/* The caller has claimed everything that was left: wait for the units still running. */
static void wait_done(size_t units)
{
    uint64_t until = 0;
    unsigned rounds = 0;
    while (atomic_load_explicit(&pool.done, memory_order_acquire) != units) {
        if (!spin_expired(&until, &rounds, I8A_CALLER_SPIN_NS))
            continue;
        pthread_mutex_lock(&pool.mu);
        atomic_store(&pool.caller_asleep, 1);
        while (atomic_load(&pool.done) != units)
            pthread_cond_wait(&pool.done_cv, &pool.mu);
        atomic_store(&pool.caller_asleep, 0);
        pthread_mutex_unlock(&pool.mu);
    }
}

size_t i8a_pool_run(size_t n_items, size_t n_threads, i8a_task_fn fn, void *ctx)
{
    size_t n = n_threads < n_items ? n_threads : n_items;
    n = n < I8A_MAX_THREADS ? n : I8A_MAX_THREADS;
    if (n > 1 && pthread_mutex_trylock(&pool.run) == 0) {
        const size_t have = i8a_pool_uses_openmp() ? n : start_workers(n);
        n = n < have ? n : have;
        if (n > 1) {
            const size_t block = (n_items + I8A_MAX_UNITS - 1) / I8A_MAX_UNITS;
            const size_t units = (n_items + block - 1) / block;
            const uint32_t seq = word_seq(atomic_load(&pool.job)) + 1;
            pool.fn = fn, pool.ctx = ctx, pool.n_items = n_items, pool.block = block;
            atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
            for (size_t r = 0; r < n; r++)      /* arming a range publishes the task with it */
                atomic_store_explicit(&pool.claims[r].next,
                                      (uint64_t)seq << 32 | range_start(units, r, n),
                                      memory_order_release);
            uint64_t word = job_word(seq, n, units);
            atomic_store(&pool.job, word);
            if (host.parallel) {            /* the team's threads; what a smaller team left */
                host.parallel(team_member, &word, (unsigned)n, 0);
                participate(0, word);
            } else {
                wake_children(0, word);
                participate(0, word);
            }
            wait_done(units);
            pthread_mutex_unlock(&pool.run);
            return n;
        }
        pthread_mutex_unlock(&pool.run);
    }
    if (n_items)
        fn(ctx, 0, n_items, n_items, 0);
    return 1;
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

int i8a_pool_uses_openmp(void)
{
    return 0;
}

size_t i8a_pool_run(size_t n_items, size_t n_threads, i8a_task_fn fn, void *ctx)
{
    (void)n_threads;
    if (n_items)
        fn(ctx, 0, n_items, n_items, 0);
    return 1;
}

size_t i8a_cpus_available(void)
{
    return 1;
}

#endif
