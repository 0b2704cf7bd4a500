/* A persistent thread pool that survives a busy machine. Workers are started once and wait
 * between jobs; the caller takes part in every job.
 *
 * A job is n_items independent items. Each of its T threads owns one contiguous range of them
 * (so it streams through neighbouring memory and can prefetch its next item) and claims its
 * items one by one; a thread whose range is done claims the items left in the others'. So the
 * caller never waits for a worker that has not started: whatever a late or descheduled worker
 * has not claimed, the caller runs itself, and it waits only for items already running.
 * Which thread runs an item is therefore not fixed: results must not depend on it.
 *
 * Waiting: a worker that took part in a job spins a bounded time for the next one, yielding
 * its CPU on every round, then sleeps; workers that a job does not include sleep at once and
 * are not woken by it.
 *
 * The threads: in a process that has an OpenMP runtime loaded when a job first needs threads
 * (torch loads one: vLLM, transformers), a job runs on the calling thread's OpenMP team instead
 * of the pool's own workers, the same claims on other threads, so that the model's operators
 * and attention take turns on one set of threads: two sets, each spinning after its work, took
 * the same CPUs from each other. INT8ATTN_POOL=own keeps the pool's own workers. */
#ifndef I8A_POOL_H
#define I8A_POOL_H

#include <stddef.h>

#define I8A_MAX_THREADS 256

/* Run items [begin, end) in order, on thread `worker` (< the job's thread count). `next` is
 * the item this thread will probably run after them, a prefetch hint (n_items: none). */
typedef void (*i8a_task_fn)(void *ctx, size_t begin, size_t end, size_t next, size_t worker);

/* Run every item of [0, n_items) exactly once, on at most n_threads threads, and return when
 * all have run. Falls back to the calling thread alone when n_threads <= 1, when threads cannot
 * be started, or when the pool is busy with another caller's job. Returns the thread count the
 * job was split for. */
size_t i8a_pool_run(size_t n_items, size_t n_threads, i8a_task_fn fn, void *ctx);

/* Whether jobs run on the process's OpenMP team (chosen once, at the first call of this or of a
 * job on threads). */
int i8a_pool_uses_openmp(void);

/* CPUs this process may run on (its affinity mask), at least 1. */
size_t i8a_cpus_available(void);

#endif
