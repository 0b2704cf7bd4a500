/* The engine's profile counters (_engine.h, I8A_PROF_*): off unless a benchmark asks. */
#if !defined(_POSIX_C_SOURCE) && !defined(_WIN32)
#define _POSIX_C_SOURCE 199309L         /* clock_gettime under -std=c11 */
#endif
#include "internal.h"

#include <time.h>

static atomic_int profile_on;
static _Atomic uint64_t spent[I8A_PROF_PARTS], counted[I8A_PROF_PARTS];

static uint64_t now_ns(void)
{
    struct timespec ts;
#if defined(_WIN32)
    timespec_get(&ts, TIME_UTC);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + 1;     /* never 0 */
}

void i8a_profile(int on)
{
    if (on)
        for (int i = 0; i < I8A_PROF_PARTS; i++) {
            atomic_store_explicit(spent + i, 0, memory_order_relaxed);
            atomic_store_explicit(counted + i, 0, memory_order_relaxed);
        }
    atomic_store_explicit(&profile_on, on != 0, memory_order_release);
}

void i8a_profile_read(uint64_t *ns, uint64_t *count)
{
    for (int i = 0; i < I8A_PROF_PARTS; i++) {
        ns[i] = atomic_load_explicit(spent + i, memory_order_relaxed);
        count[i] = atomic_load_explicit(counted + i, memory_order_relaxed);
    }
}

uint64_t i8a_prof_start(void)
{
    return atomic_load_explicit(&profile_on, memory_order_relaxed) ? now_ns() : 0;
}

void i8a_prof_add(int part, uint64_t t0, uint64_t n)
{
    if (!t0)
        return;
    atomic_fetch_add_explicit(spent + part, now_ns() - t0, memory_order_relaxed);
    atomic_fetch_add_explicit(counted + part, n, memory_order_relaxed);
}
