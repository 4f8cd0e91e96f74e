/*
 * rt_pool: the persistent worker pool; see rt_pool.h. A job is published by bumping a
 * generation counter; workers spin on it (pause instruction) for up to SPIN_SECONDS and
 * then sleep on a condition variable. The sleeper count and the generation are sequentially
 * consistent atomics, so a publisher that sees no sleeper after its bump knows every worker
 * will see the new generation before it can go to sleep (the Dekker pairing), and one that
 * sees a sleeper broadcasts under the mutex the sleeper holds until it waits.
 */
#include "base/rt_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

/* How long an idle worker waits actively before it sleeps: the gaps between the jobs of
 * a decode step are microseconds, the gap between two requests is not. The first
 * SPIN_PAUSES checks only pause; later ones also yield the core (sched_yield), so on an
 * oversubscribed machine a waiting thread does not hold a core the working ones need. */
#define SPIN_SECONDS 2e-3
#define SPIN_PAUSES 2048

struct rt_pool {
	int n;                       /* threads in all, the caller included */
	pthread_t *tids;             /* [n - 1] workers */
	pthread_mutex_t run_mu;      /* one rt_pool_run at a time */
	pthread_mutex_t mu;          /* guards sleeping */
	pthread_cond_t cv;
	atomic_uint gen;             /* bumped once per job */
	atomic_int sleepers;         /* workers in (or about to enter) cond_wait */
	atomic_int done;             /* workers finished with the current job */
	atomic_int stop;
	rt_pool_fn fn;               /* the current job (written before gen is bumped) */
	void *arg;
};

typedef struct worker_arg {
	rt_pool *p;
	int ith;
} worker_arg;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Wait until p->gen differs from seen; returns the new generation. */
static unsigned wait_gen(rt_pool *p, unsigned seen)
{
	double t0 = rt_now();
	for (unsigned it = 1;; it++) {
		unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
		if (g != seen)
			return g;
		cpu_relax();
		if (it > SPIN_PAUSES)
			sched_yield();
		if ((it & 63) == 0 && rt_now() - t0 > SPIN_SECONDS)
			break;
	}
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add(&p->sleepers, 1);
	unsigned g;
	while ((g = atomic_load(&p->gen)) == seen)
		pthread_cond_wait(&p->cv, &p->mu);
	atomic_fetch_sub(&p->sleepers, 1);
	pthread_mutex_unlock(&p->mu);
	return g;
}

static void *worker_main(void *v)
{
	worker_arg *wa = v;
	rt_pool *p = wa->p;
	const int ith = wa->ith;
	free(wa);
	/* generation 0 is the pool's state at creation: a job published before this thread
	 * got here has bumped it already and is run at once */
	unsigned seen = 0;
	for (;;) {
		seen = wait_gen(p, seen);
		if (atomic_load(&p->stop))
			break;
		p->fn(p->arg, ith, p->n);
		atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
	}
	return NULL;
}

/* Publish the current fn/arg (or a stop) to the workers. */
static void publish(rt_pool *p)
{
	atomic_fetch_add(&p->gen, 1);
	if (atomic_load(&p->sleepers) > 0) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
	}
}

rt_pool *rt_pool_create(int n_threads, rt_err *err)
{
	if (n_threads < 1 || n_threads > 256) {
		rt_err_set(err, "pool: thread count %d is outside 1..256", n_threads);
		return NULL;
	}
	rt_pool *p = calloc(1, sizeof *p);
	if (!p) {
		rt_err_set(err, "pool: out of memory");
		return NULL;
	}
	p->n = n_threads;
	pthread_mutex_init(&p->run_mu, NULL);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	if (n_threads == 1)
		return p;
	p->tids = calloc((size_t)n_threads - 1, sizeof *p->tids);
	if (!p->tids) {
		rt_pool_free(p);
		rt_err_set(err, "pool: out of memory");
		return NULL;
	}
	for (int i = 1; i < n_threads; i++) {
		worker_arg *wa = malloc(sizeof *wa);
		if (wa) {
			wa->p = p;
			wa->ith = i;
		}
		if (!wa || pthread_create(&p->tids[i - 1], NULL, worker_main, wa) != 0) {
			free(wa);
			p->n = i; /* workers 1..i-1 exist: stop and join those */
			rt_pool_free(p);
			rt_err_set(err, "pool: cannot start thread %d of %d", i, n_threads);
			return NULL;
		}
	}
	return p;
}

void rt_pool_free(rt_pool *p)
{
	if (!p)
		return;
	if (p->tids) {
		atomic_store(&p->stop, 1);
		publish(p);
		for (int i = 1; i < p->n; i++)
			pthread_join(p->tids[i - 1], NULL);
		free(p->tids);
	}
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	pthread_mutex_destroy(&p->run_mu);
	free(p);
}

int rt_pool_threads(const rt_pool *p)
{
	return p ? p->n : 1;
}

void rt_pool_run(rt_pool *p, rt_pool_fn fn, void *arg)
{
	if (!p || p->n == 1) {
		fn(arg, 0, 1);
		return;
	}
	pthread_mutex_lock(&p->run_mu);
	p->fn = fn;
	p->arg = arg;
	atomic_store(&p->done, 0);
	publish(p);
	fn(arg, 0, p->n);
	for (unsigned it = 1; atomic_load_explicit(&p->done, memory_order_acquire) < p->n - 1; it++) {
		cpu_relax();
		if (it > SPIN_PAUSES)
			sched_yield(); /* a worker was descheduled: let it have the core */
	}
	pthread_mutex_unlock(&p->run_mu);
}

void rt_pool_range(long n, int ith, int nth, long *lo, long *hi)
{
	long q = n / nth, r = n % nth;
	*lo = (long)ith * q + (ith < r ? ith : r);
	*hi = *lo + q + (ith < r ? 1 : 0);
}
