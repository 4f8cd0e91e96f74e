/*
 * test_cuda_host: the CPU-side checks of the CUDA backend, run by `make cuda` on every
 * machine (no GPU needed). For every policy of policies/ (their C units and CUDA units
 * are both linked in), on synthetic stores of the grouped-query shapes 9/3 and 4/1:
 *
 *   observe   the CUDA unit's fused attention + observe functor, run by its CPU reference
 *             (attend_ref: the kernel's maths in host loops), and the C unit's observe fed
 *             the same probabilities and outputs must leave bit-identical statistics and
 *             per-head state after every step (the independent reference is the C
 *             emitter's code, compiled by the C compiler from the same IR);
 *   compress  for the policies whose compress runs on the device, the CUDA pipeline's
 *             CPU reference (compress_ref over the emitted score functor, the host layer
 *             budgets of compress_cfg) must keep exactly the entries the C compress keeps.
 *
 *   errors    the classes of the backend's errors, which the server maps to HTTP statuses:
 *             device memory exhausted (cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED)
 *             is RT_ERR_RESOURCE, another failed call RT_ERR_INTERNAL (the rt_cuda_check.h
 *             path every call takes), a bad sequence size RT_ERR_INPUT; no device call.
 *
 * Exit status 0 when all agree; the first disagreement is printed with its place.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k_attn.cuh"
#include "k_compact.cuh"
#include "cuda/rt_cuda_compress.cuh"

extern "C" {
#include "cuda/rt_cuda.h"
#include "k_compress.h"
#include "model/rt_model.h"
}

extern "C" const struct rt_cuda_backend kvp_cuda_backend;

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

struct store { /* the device layout, on the host */
	float *k, *v, *count, *log_count, *P, *q, *o, *score, *qs, *pooled;
	int32_t *pos, *nb, *dst, *n_new;
	uint16_t *span;
	uint8_t *stats, *state, *flags;
};

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

static int fail(const char *pol, const char *what, int l, int j, int i)
{
	printf("test_cuda_host: policy %s: %s differ at layer %d kv head %d entry %d\n", pol, what, l, j, i);
	return 1;
}

/* The device layout of a store of H heads of cap entries (head_dim hd, qd query floats,
 * G query heads per KV head) and its statistic and state bytes, on the host; zeroed. */
static void store_alloc(struct store *s, int H, int32_t cap, int hd, int qd, int G, const rt_kv *kv)
{
	const size_t c = (size_t)cap;
	s->k = (float *)calloc((size_t)H * c * hd, 4);
	s->v = (float *)calloc((size_t)H * c * hd, 4);
	s->count = (float *)calloc((size_t)H * c, 4);
	s->log_count = (float *)calloc((size_t)H * c, 4);
	s->P = (float *)calloc((size_t)G * c, 4);
	s->q = (float *)calloc((size_t)qd, 4);
	s->o = (float *)calloc((size_t)qd, 4);
	s->score = (float *)calloc((size_t)H * c, 4);
	s->qs = (float *)calloc((size_t)H * G * c, 4);
	s->pooled = (float *)calloc((size_t)H * c, 4);
	s->pos = (int32_t *)calloc((size_t)H * c, 4);
	s->nb = (int32_t *)calloc((size_t)H, 4);
	s->dst = (int32_t *)calloc((size_t)H * c, 4);
	s->n_new = (int32_t *)calloc((size_t)H, 4);
	s->span = (uint16_t *)calloc((size_t)H * c, 2);
	s->stats = (uint8_t *)calloc((size_t)H * c * (kv->stat_bytes + 1), 1);
	s->state = (uint8_t *)calloc((size_t)H * (kv->state_bytes + 1), 1);
	s->flags = (uint8_t *)calloc((size_t)H * c, 1);
}

static void store_free(struct store *s)
{
	free(s->k); free(s->v); free(s->count); free(s->log_count); free(s->P); free(s->q); free(s->o);
	free(s->score); free(s->qs); free(s->pooled); free(s->pos); free(s->nb); free(s->dst); free(s->n_new);
	free(s->span); free(s->stats); free(s->state); free(s->flags);
}

/* The fused attention's arguments over store s (one query row per step: C = 1). */
static void attn_args(struct k_cu_attn_args *a, struct store *s, const struct rt_run *run,
                      const struct kvp_policy *p, const rt_kv *kv, int32_t cap, int L, int NKV,
                      int G, int hd, int32_t T)
{
	memset(a, 0, sizeof *a);
	a->q = s->q;
	a->out = s->o;
	a->k = s->k;
	a->v = s->v;
	a->pos = s->pos;
	a->count = s->count;
	a->log_count = s->log_count;
	a->stats = s->stats;
	a->state = s->state;
	a->nb = s->nb;
	a->stat_bytes = kv->stat_bytes;
	a->state_bytes = kv->state_bytes;
	a->cap = cap;
	a->hd = hd;
	a->G = G;
	a->n_kv_head = NKV;
	a->n_layer = L;
	a->C = 1;
	a->scale = 1.0f / sqrtf((float)hd);
	a->prompt_len = T;
	for (int i = 0; i < p->n_params && i < K_CU_MAX_PARAMS; i++)
		a->P.v[i] = run->ctx.params[i];
}

/* T decode steps: each appends a random key and value to every head of both stores, then
 * for every layer and KV head runs the CUDA unit's attend_ref (into s) and the C unit's
 * observe (into kv) on the same probabilities; the statistics and per-head state must
 * agree bit for bit after every step. Returns 0, or 1 after printing the first
 * disagreement. */
static int observe_steps(const struct kvp_cuda_policy *cp, struct rt_run *run, rt_kv *kv,
                         struct store *s, struct k_cu_attn_args *a, float *probs, int32_t cap,
                         int32_t T, int L, int NKV, int G, int hd)
{
	const struct kvp_policy *p = cp->host;
	const int H = L * NKV, qd = NKV * G * hd;
	const size_t c = (size_t)cap;
	int bad = 0;
	float kb[64], vb[64];
	for (int t = 0; t < T && !bad; t++) {
		for (int hi = 0; hi < H; hi++) {
			for (int d = 0; d < hd; d++)
				kb[d] = frand(), vb[d] = frand();
			rt_kv_head *h = &kv->heads[hi];
			const int32_t e = h->n;
			rt_kv_append(kv, h, kb, vb, t);
			const size_t o = (size_t)hi * c + e;
			memcpy(s->k + o * hd, kb, (size_t)hd * 4);
			memcpy(s->v + o * hd, vb, (size_t)hd * 4);
			s->pos[o] = t;
			s->count[o] = 1.0f;
			s->log_count[o] = 0.0f;
			memset(s->stats + o * kv->stat_bytes, 0, kv->stat_bytes);
		}
		run->ctx.seen = t;
		for (int l = 0; l < L; l++) {
			for (int i = 0; i < qd; i++)
				s->q[i] = 3.0f * frand();
			a->layer = l;
			a->pos0 = t;
			for (int j = 0; j < NKV; j++) {
				const int hi = l * NKV + j;
				cp->attend_ref(a, j, 0, s->P);
				const int32_t lim = s->nb[hi] + 1;
				for (int g = 0; g < G; g++)
					memcpy(probs + (size_t)g * lim, s->P + (size_t)g * c, (size_t)lim * 4);
				if (p->observe) {
					struct kvp_obs ob = { t, lim, G, probs, s->o + (size_t)j * G * hd };
					p->observe(&run->ctx, kv, l, j, &ob);
				}
				rt_kv_head *h = &kv->heads[hi];
				if (memcmp(h->stats, s->stats + (size_t)hi * c * kv->stat_bytes, (size_t)lim * kv->stat_bytes))
					for (int32_t i = 0; i < lim && !bad; i++)
						if (memcmp(h->stats + i * kv->stat_bytes,
						           s->stats + ((size_t)hi * c + i) * kv->stat_bytes, kv->stat_bytes))
							bad = fail(p->name, "statistics", l, j, i);
				if (!bad && kv->state_bytes &&
				    memcmp(h->state, s->state + (size_t)hi * kv->state_bytes, kv->state_bytes))
					bad = fail(p->name, "per-head state", l, j, -1);
			}
		}
		for (int hi = 0; hi < H; hi++)
			s->nb[hi]++;
	}
	return bad;
}

/* The CUDA pipeline's CPU reference (compress_ref over the emitted score functor, the
 * host layer budgets of compress_cfg) against the C compress on the same store: the same
 * number of entries kept in every head, the same positions. Returns 0, or 1 after
 * printing the first disagreement. */
static int compress_compare(const struct kvp_cuda_policy *cp, struct rt_run *run, rt_kv *kv,
                            struct store *s, int32_t cap, int L, int NKV, int G, int hd,
                            int *n_cmp, long *n_evicted, int *n_refused)
{
	const struct kvp_policy *p = cp->host;
	const int H = L * NKV;
	const size_t c = (size_t)cap;
	rt_err err = { "" };
	int bad = 0;
	struct k_compress_cfg cfg;
	cp->compress_cfg(&run->ctx, kv, &cfg);
	double lb[64];
	if (rt_cuda_compress_plan(&run->ctx, kv, &cfg, lb, &err) != 0) {
		/* a budget the device refuses: the C compress must refuse it with the same words */
		rt_err ce = { "" };
		if (p->compress(&run->ctx, kv, &ce) != 0 && !strcmp(ce.msg, err.msg)) {
			(*n_refused)++;
			return 0;
		}
		printf("test_cuda_host: %s: the device budget is refused (%s), the C compress says '%s'\n",
		       p->name, err.msg, ce.msg);
		return 1;
	}
	struct k_cu_compress_args ca;
	memset(&ca, 0, sizeof ca);
	ca.k = s->k;
	ca.v = s->v;
	ca.pos = s->pos;
	ca.count = s->count;
	ca.span = s->span;
	ca.stats = s->stats;
	ca.n = s->nb;
	ca.stat_bytes = kv->stat_bytes;
	ca.cap = cap;
	ca.hd = hd;
	ca.n_kv_head = NKV;
	ca.n_layer = L;
	ca.group = G;
	ca.lb = lb;
	ca.score = s->score;
	ca.qs = s->qs;
	ca.pooled = s->pooled;
	ca.flags = s->flags;
	ca.dst = s->dst;
	ca.n_new = s->n_new;
	rt_cuda_compress_conf(&ca, &run->ctx, &cfg, kv, p->n_params);
	for (int hi = 0; hi < H; hi++)
		cp->compress_ref(&ca, (size_t)hi);
	if (p->compress(&run->ctx, kv, &err) != 0) {
		printf("test_cuda_host: %s: C compress: %s\n", p->name, err.msg);
		bad = 1;
	}
	for (int hi = 0; hi < H && !bad; hi++) {
		const rt_kv_head *h = &kv->heads[hi];
		if (s->n_new[hi] != h->n) {
			printf("test_cuda_host: policy %s: head %d keeps %d entries on the device path, %d in C\n",
			       p->name, hi, s->n_new[hi], h->n);
			bad = 1;
			break;
		}
		/* the kept sets compared by position: the C compaction (rt_kv_head_evict)
		 * moves tail entries into evicted slots, the device one gathers in order */
		int32_t *dp = (int32_t *)malloc(sizeof(int32_t) * (size_t)(h->n + 1));
		int32_t *cpos = (int32_t *)malloc(sizeof(int32_t) * (size_t)(h->n + 1));
		int32_t nd = 0;
		for (int32_t i = 0; i < s->nb[hi] && nd <= h->n; i++)
			if (s->dst[(size_t)hi * c + i] >= 0)
				dp[nd++] = s->pos[(size_t)hi * c + i];
		memcpy(cpos, h->pos, sizeof(int32_t) * (size_t)h->n);
		qsort(dp, (size_t)nd, sizeof *dp, cmp_i32);
		qsort(cpos, (size_t)h->n, sizeof *cpos, cmp_i32);
		for (int32_t i = 0; i < h->n && !bad; i++)
			if (nd != h->n || dp[i] != cpos[i])
				bad = fail(p->name, "kept sets", hi / NKV, hi % NKV, i);
		free(dp);
		free(cpos);
	}
	if (!bad)
		(*n_cmp)++;
	for (int hi = 0; hi < H; hi++)
		*n_evicted += s->nb[hi] - s->n_new[hi];
	return bad;
}

/* One policy on one shape, under byte ratio br when br > 0 (the compress then counts the
 * budget in f16 entries' bytes, k_bytes_mode, and the f32 store keeps half the entries);
 * returns 0 when CUDA and C agree. */
static int run_policy(const struct kvp_cuda_policy *cp, int L, int NKV, int G, int hd, double br, int *n_cmp,
                      long *n_evicted, long *n_words, int *n_refused)
{
	const struct kvp_policy *p = cp->host;
	/* T: every layer's share of T tokens under Scissorhands' schedule (10% at layer 0) must
	 * hold its 10-token recent window (the budget check refuses less) */
	const int32_t cap = 128, T = 112;
	const int H = L * NKV, qd = NKV * G * hd;
	struct rt_run run;
	rt_kv kv;
	rt_err err = { "" };
	if (rt_run_init(&run, &kv, p, L, NKV, G, hd, cap, T, &err) != 0 ||
	    (br > 0 && rt_run_set_byte_ratio(&run, br, &err) != 0)) {
		printf("test_cuda_host: %s: %s\n", p->name, err.msg);
		return 1;
	}
	struct store s;
	store_alloc(&s, H, cap, hd, qd, G, &kv);
	float *probs = (float *)calloc((size_t)G * cap, 4);
	struct k_cu_attn_args a;
	attn_args(&a, &s, &run, p, &kv, cap, L, NKV, G, hd, T);
	int bad = observe_steps(cp, &run, &kv, &s, &a, probs, cap, T, L, NKV, G, hd);
	for (size_t w = 0; w < (size_t)H * cap * kv.stat_bytes / 4; w++) { /* non-zero words */
		uint32_t x;
		memcpy(&x, s.stats + 4 * w, 4);
		*n_words += x != 0;
	}
	run.ctx.seen = T;
	run.ctx.prompt_done = 1;
	if (!bad && cp->compress_ref)
		bad = compress_compare(cp, &run, &kv, &s, cap, L, NKV, G, hd, n_cmp, n_evicted, n_refused);
	store_free(&s);
	free(probs);
	rt_run_free(&run);
	rt_kv_free(&kv);
	return bad;
}

/* One failed call through rt_cu_failed: err must hold "f.cu:7: CALL: " + the reason and
 * the class want. 0 when it does. */
template <class R>
static int error_class_is(R r, const char *call, enum rt_err_code want)
{
	rt_err e = { "" };
	char head[64];
	snprintf(head, sizeof head, "f.cu:7: %s: ", call);
	if (rt_cu_failed(r, &e, "f.cu", 7, call) == 1 && e.code == want &&
	    !strncmp(e.msg, head, strlen(head)) && e.msg[strlen(head)])
		return 0;
	printf("test_cuda_host: %s failing: class %d (want %d), message '%s'\n", call, (int)e.code,
	       (int)want, e.msg);
	return 1;
}

/* The error classes (see the header): the checked-call path, a success that sets
 * nothing, and rt_cuda_seq_init's size check (before any device call). */
static int check_error_classes(void)
{
	int bad = error_class_is(cudaErrorMemoryAllocation, "cudaMalloc", RT_ERR_RESOURCE);
	bad |= error_class_is(CUBLAS_STATUS_ALLOC_FAILED, "cublasCreate", RT_ERR_RESOURCE);
	bad |= error_class_is(cudaErrorLaunchFailure, "cudaStreamSynchronize", RT_ERR_INTERNAL);
	bad |= error_class_is(CUBLAS_STATUS_EXECUTION_FAILED, "cublasSgemm", RT_ERR_INTERNAL);
	rt_err e = { "" };
	if (rt_cu_failed(cudaSuccess, &e, "f.cu", 7, "cudaFree") != 0 || e.msg[0]) {
		printf("test_cuda_host: a successful call set the error '%s'\n", e.msg);
		bad = 1;
	}
	static rt_model m; /* only its path is read before the size check fails */
	snprintf(m.path, sizeof m.path, "tiny.gguf");
	if (rt_cuda_seq_init(&m, NULL, NULL, 0, 16, -1, &e) != NULL || e.code != RT_ERR_INPUT ||
	    !strstr(e.msg, "tiny.gguf: cuda sequence: invalid capacity 0")) {
		printf("test_cuda_host: capacity 0: class %d (want %d), message '%s'\n", (int)e.code,
		       (int)RT_ERR_INPUT, e.msg);
		bad = 1;
	}
	return bad;
}

/* rt_cuda_seq_init refuses cp with the reason the backend gave (why), as an input error,
 * before it touches the device. 0 when it does. */
static int refusal_matches(const struct kvp_cuda_policy *cp, const char *why)
{
	static rt_model m;
	snprintf(m.path, sizeof m.path, "tiny.gguf");
	rt_err e = { "" };
	if (rt_cuda_seq_init(&m, NULL, cp, 64, 16, -1, &e) == NULL && e.code == RT_ERR_INPUT &&
	    strstr(e.msg, why) && strstr(e.msg, cp->name))
		return 0;
	printf("test_cuda_host: %s: the backend refuses it (%s) but rt_cuda_seq_init says "
	       "class %d, '%s'\n", cp->name, why, (int)e.code, e.msg);
	return 1;
}

int main(void)
{
	const struct rt_cuda_backend *b = &kvp_cuda_backend;
	int bad = 0, n_cmp = 0, n_budget_refused = 0, n_bytes_cmp = 0;
	long n_evicted = 0, n_words = 0;
	const int shapes[2][4] = { { 2, 3, 3, 16 }, { 2, 1, 4, 16 } };
	bad |= check_error_classes();
	int n_run = 0, n_refused = 0;
	for (int i = 0; i < b->n_policies; i++) {
		/* a policy the backend refuses (precision tiers, for one: runtime/kv/rt_kv.h's
		 * tiered store is on the CPU only) has nothing to compare here */
		const struct kvp_policy *hp = b->policies[i]->host;
		const char *why;
		const unsigned no = b->refuses(hp, &why);
		if ((hp->needs & KVP_NEED_TIERS) && !(no & RT_CUDA_NO_STORE)) {
			printf("test_cuda_host: %s sets precision tiers, and the backend does not refuse "
			       "its store\n", hp->name);
			bad = 1;
		}
		if (no)
			bad |= refusal_matches(b->policies[i], why);
		/* a policy whose entries the device store cannot hold (precision tiers) has no
		 * device store to compare; one the device sequence refuses for another reason
		 * still has its kernels compared here */
		if (no & RT_CUDA_NO_STORE) {
			n_refused++;
			continue;
		}
		n_run++;
		for (int sh = 0; sh < 2; sh++)
			bad |= run_policy(b->policies[i], shapes[sh][0], shapes[sh][1], shapes[sh][2], shapes[sh][3], 0,
			                  &n_cmp, &n_evicted, &n_words, &n_budget_refused);
		if (hp->compress) { /* and in bytes: the budget's unit is an f16 entry's bytes */
			const int before = n_cmp;
			bad |= run_policy(b->policies[i], shapes[0][0], shapes[0][1], shapes[0][2], shapes[0][3], 2,
			                  &n_cmp, &n_evicted, &n_words, &n_budget_refused);
			n_bytes_cmp += n_cmp - before;
		}
	}
	if (n_bytes_cmp == 0) { /* the byte-ratio comparison must compare, not only refuse */
		printf("test_cuda_host: no policy was compared under a byte ratio\n");
		bad = 1;
	}
	if (bad)
		return 1;
	printf("cuda: host tests passed: %d policies x 2 shapes (9/3-style 3x3, 4/1; the first at byte ratio 2 too; %d policies whose "
	       "entries the CUDA store cannot hold, not run): CUDA observe == C observe "
	       "bit for bit (%ld non-zero statistic words); device-compress reference == C compress kept sets "
	       "in %d cases (%d at byte ratio 2; %ld entries evicted), the same budget refusal in %d; error classes as documented\n",
	       n_run, n_refused, n_words, n_cmp, n_bytes_cmp, n_evicted, n_budget_refused);
	return 0;
}
