/* Atomics for the front end, which must hold without the GIL too (free-threaded CPython).
 *
 * A cache's busy flag: every call that reads or changes a cache takes it first, before it
 * converts or checks a single argument (argument conversion can run Python code, which can let
 * another thread in), and drops it last. A call that finds it taken raises.
 *
 * The active tier and the thread count are module state that any thread may read while one
 * sets them: loads and stores of one word, atomic so that no reader sees half a store. */
#ifndef I8A_GUARD_H
#define I8A_GUARD_H

#include <stddef.h>

#include "_simd/dispatch.h"

#if defined(__GNUC__) || defined(__clang__)

/* 1 when the flag was free and is now taken by the caller, 0 when another holds it. */
static inline int i8a_try_acquire(int *flag)
{
    int expected = 0;
    return __atomic_compare_exchange_n(flag, &expected, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static inline void i8a_release(int *flag)
{
    __atomic_store_n(flag, 0, __ATOMIC_RELEASE);
}

/* Whether the flag is taken (by anyone): the store's methods check that a caller took it. */
static inline int i8a_is_taken(const int *flag)
{
    return __atomic_load_n(flag, __ATOMIC_RELAXED);
}

static inline const i8a_kernels *i8a_load_tier(const i8a_kernels *const *slot)
{
    return __atomic_load_n(slot, __ATOMIC_ACQUIRE);
}

static inline void i8a_store_tier(const i8a_kernels **slot, const i8a_kernels *tier)
{
    __atomic_store_n(slot, tier, __ATOMIC_RELEASE);
}

static inline size_t i8a_load_size(const size_t *slot)
{
    return __atomic_load_n(slot, __ATOMIC_RELAXED);
}

static inline void i8a_store_size(size_t *slot, size_t value)
{
    __atomic_store_n(slot, value, __ATOMIC_RELAXED);
}

#else
#error "int8attn's front end needs GCC or Clang atomics (__atomic builtins)"
#endif

#endif
