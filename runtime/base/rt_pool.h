/*
 * rt_pool: one persistent pool of worker threads for the fast forward pass (matmul rows,
 * attention per KV head, RoPE and norms). A job is a function called once on each of the
 * pool's n threads with its index ith in 0..n-1 (the calling thread is ith 0) and n; the
 * call returns when every thread has returned from it (a barrier), so consecutive jobs
 * never overlap. Between jobs the workers spin for a short while (a decode step issues a
 * few hundred small jobs, and a futex wake-up costs more than most of them) and then
 * sleep on a condition variable, so an idle pool costs no CPU. This is the scheme of
 * ggml's CPU thread pool (ggml-org/llama.cpp, ggml/src/ggml-cpu/ggml-cpu.c).
 *
 * A pool serves one caller at a time: rt_pool_run takes a mutex, so two threads that
 * share a pool are serialised, never mixed. A NULL pool runs the job inline (ith 0, n 1).
 */
#ifndef RT_POOL_H
#define RT_POOL_H

#include "base/rt_util.h"

typedef struct rt_pool rt_pool;

/* A job: called with the job's argument, this thread's index and the thread count. */
typedef void (*rt_pool_fn)(void *arg, int ith, int nth);

/* Start a pool of n_threads threads in all (n_threads - 1 workers; 1 starts none).
 * n_threads in 1..256. Returns NULL with err on a bad count or when a thread cannot be
 * created. Caller frees with rt_pool_free. */
rt_pool *rt_pool_create(int n_threads, rt_err *err);
/* Stop and join the workers; NULL is a no-op. */
void rt_pool_free(rt_pool *p);

/* Threads of the pool (1 for NULL). */
int rt_pool_threads(const rt_pool *p);

/* Run fn(arg, ith, n) on every thread of the pool and wait for all of them. */
void rt_pool_run(rt_pool *p, rt_pool_fn fn, void *arg);

/* The share [*lo, *hi) of 0..n that thread ith of nth takes: contiguous, in thread order,
 * sizes differing by at most one (the first n % nth threads take one more). */
void rt_pool_range(long n, int ith, int nth, long *lo, long *hi);

#endif
