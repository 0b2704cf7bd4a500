/* A persistent thread pool: workers are started once and wait between jobs (spinning briefly,
 * then sleeping), so a decode pays no thread start. The caller is worker 0 and takes part.
 *
 * A job is n_items independent items, split into one contiguous range per thread (so each
 * thread streams through neighbouring memory and can prefetch its next item). Which thread
 * runs an item depends on the thread count: results must not depend on it. */
#ifndef I8A_POOL_H
#define I8A_POOL_H

#include <stddef.h>

#define I8A_MAX_THREADS 256

/* Run items [begin, end) in order, on thread `worker`. */
typedef void (*i8a_task_fn)(void *ctx, size_t begin, size_t end, size_t worker);

/* Run every item of [0, n_items) once, on at most n_threads threads (worker < n_threads), each
 * thread one contiguous range. Falls back to the calling thread alone when threads cannot be
 * started or the pool is busy with another caller's job. Returns the number of threads used. */
size_t i8a_pool_run(size_t n_items, size_t n_threads, i8a_task_fn fn, void *ctx);

/* CPUs this process may run on (its affinity mask), at least 1. */
size_t i8a_cpus_available(void);

#endif
