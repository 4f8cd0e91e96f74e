/*
 * gpu_check: the device checks of the CUDA backend (scripts/gpu_check.sh runs them; they
 * need an NVIDIA GPU and say so, exit 1, without one).
 *
 *   gpu_check --kernels
 *       RMSNorm, RoPE, SwiGLU and the attention kernel against their CPU references
 *       (runtime/cuda/rt_cuda_kernels.cuh, kernels/k_attn.cuh) on random data, and the
 *       decode attention's memory bandwidth (keys + values read per step over the
 *       kernel time, as a share of the device's peak)
 *   gpu_check --equiv MODEL TEXT [TOKENS]
 *       for every policy compiled in: the text's first TOKENS (512) tokens through the
 *       CPU exact path (rt_seq) and the GPU (rt_cuda_seq, f32 weights); max |logit
 *       difference| over every row, and how the kept positions of every (layer, KV head)
 *       differ at the end. Pass: logits within 1e-3, equal counts per head, at most 1% of
 *       entries swapped (near-ties, see equiv), and a second GPU run bit-identical.
 *   gpu_check --bench MODEL
 *       prefill tokens/s (512 tokens in chunks of 256) and decode tokens/s (128 steps)
 *       of the full cache, f32 and f16 weights
 * Each prints one table row per line ("|"-separated) for scripts/gpu_check.sh.
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/rt_cuda_check.h"
#include "cuda/rt_cuda_kernels.cuh"
#include "k_attn.cuh"

extern "C" {
#include "cuda/rt_cuda.h"
#include "model/rt_gguf.h"
#include "model/rt_tokenizer.h"
#include "policy/rt_seq.h"
}

extern "C" const struct rt_cuda_backend kvp_cuda_backend;
extern "C" const struct kvp_policy *const kvp_registry[];
extern "C" const int kvp_registry_count;

#define CK(x)                                                                                 \
	do {                                                                                      \
		cudaError_t e_ = (x);                                                                 \
		if (e_ != cudaSuccess) {                                                              \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
			exit(1);                                                                          \
		}                                                                                     \
	} while (0)

static float frand(void)
{
	return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
}

static float *dup_dev(const float *h, size_t n)
{
	float *d;
	CK(cudaMalloc((void **)&d, n * 4));
	CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
	return d;
}

static double max_diff(const float *a, const float *d_b, size_t n)
{
	float *b = (float *)malloc(n * 4);
	CK(cudaMemcpy(b, d_b, n * 4, cudaMemcpyDeviceToHost));
	double m = 0;
	for (size_t i = 0; i < n; i++)
		m = fmax(m, fabs((double)a[i] - b[i]));
	free(b);
	return m;
}

static int check_kernels(double peak)
{
	const int C = 64, E = 576, hd = 64, nh = 9, nkv = 3, G = 3;
	const size_t n = (size_t)C * E;
	float *x = (float *)malloc(n * 4), *w = (float *)malloc(E * 4), *y = (float *)malloc(n * 4);
	for (size_t i = 0; i < n; i++)
		x[i] = frand();
	for (int i = 0; i < E; i++)
		w[i] = frand();
	float *dx = dup_dev(x, n), *dw = dup_dev(w, E), *dy;
	CK(cudaMalloc((void **)&dy, n * 4));
	rt_cu_rmsnorm<<<C, K_CU_THREADS>>>(dy, dx, dw, E, 1e-5f);
	CK(cudaDeviceSynchronize());
	rt_cu_rmsnorm_ref(y, x, w, C, E, 1e-5f);
	printf("| kernel rmsnorm | max abs diff %.3g | %s |\n", max_diff(y, dy, n), max_diff(y, dy, n) < 1e-5 ? "ok" : "FAIL");
	int bad = max_diff(y, dy, n) >= 1e-5;
	const size_t nq = (size_t)C * nh * hd;
	float *q = (float *)malloc(nq * 4), *cs;
	for (size_t i = 0; i < nq; i++)
		q[i] = frand();
	float *dq = dup_dev(q, nq);
	CK(cudaMalloc((void **)&cs, (size_t)C * hd * 4));
	rt_cu_rope_table<<<rt_cu_blocks((size_t)C * hd / 2, 256), 256>>>(cs, C, 1000, hd, 100000.0f);
	rt_cu_rope<<<rt_cu_blocks((size_t)C * nh * hd / 2, 256), 256>>>(dq, cs, C, nh, hd, hd);
	CK(cudaDeviceSynchronize());
	rt_cu_rope_ref(q, C, 1000, nh, hd, hd, 100000.0f);
	double dr = max_diff(q, dq, nq);
	printf("| kernel rope | max abs diff %.3g | %s |\n", dr, dr < 1e-5 ? "ok" : "FAIL");
	bad |= dr >= 1e-5;
	float *u = (float *)malloc(n * 4);
	for (size_t i = 0; i < n; i++)
		u[i] = frand(), x[i] = 4 * frand();
	float *du = dup_dev(u, n);
	CK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
	rt_cu_swiglu<<<rt_cu_blocks(n, 256), 256>>>(dx, du, n);
	CK(cudaDeviceSynchronize());
	rt_cu_swiglu_ref(x, u, n);
	double ds = max_diff(x, dx, n);
	printf("| kernel swiglu | max abs diff %.3g | %s |\n", ds, ds < 1e-5 ? "ok" : "FAIL");
	bad |= ds >= 1e-5;
	/* attention: one layer, 3 KV heads of N entries, one decode row */
	const int32_t N = 4096;
	const size_t kvn = (size_t)nkv * N * hd;
	float *K = (float *)malloc(kvn * 4), *V = (float *)malloc(kvn * 4), *lc = (float *)calloc((size_t)nkv * N, 4);
	for (size_t i = 0; i < kvn; i++)
		K[i] = frand(), V[i] = frand();
	int32_t nb[3] = { N - 1, N - 1, N - 1 }, *dnb;
	CK(cudaMalloc((void **)&dnb, sizeof nb));
	CK(cudaMemcpy(dnb, nb, sizeof nb, cudaMemcpyHostToDevice));
	float *dK = dup_dev(K, kvn), *dV = dup_dev(V, kvn), *dlc = dup_dev(lc, (size_t)nkv * N), *dout, *dscr;
	CK(cudaMalloc((void **)&dout, (size_t)nh * hd * 4));
	CK(cudaMalloc((void **)&dscr, k_cu_attn_scratch_floats(nkv, G, N, 1, 0) * 4));
	struct k_cu_attn_args a;
	memset(&a, 0, sizeof a);
	a.q = dq; a.out = dout; a.k = dK; a.v = dV; a.log_count = dlc; a.nb = dnb; a.scratch = dscr;
	a.cap = N; a.hd = hd; a.G = G; a.n_kv_head = nkv; a.n_layer = 1; a.C = 1; a.pos0 = N - 1;
	a.scale = 1.0f / sqrtf((float)hd);
	CK(k_cu_attn_launch<k_cu_obs_none>(&a, 0));
	CK(cudaDeviceSynchronize());
	float *hq = (float *)malloc((size_t)nh * hd * 4), *ho = (float *)malloc((size_t)nh * hd * 4);
	float *P = (float *)malloc((size_t)G * N * 4);
	CK(cudaMemcpy(hq, dq, (size_t)nh * hd * 4, cudaMemcpyDeviceToHost));
	struct k_cu_attn_args h = a;
	h.q = hq; h.out = ho; h.k = K; h.v = V; h.log_count = lc; h.nb = nb;
	for (int j = 0; j < nkv; j++)
		k_cu_attn_ref<k_cu_obs_none>(h, j, 0, P);
	double da = max_diff(ho, dout, (size_t)nh * hd);
	printf("| kernel attention (4096 entries) | max abs diff %.3g | %s |\n", da, da < 1e-4 ? "ok" : "FAIL");
	bad |= da >= 1e-4;
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	const int reps = 200;
	CK(cudaEventRecord(e0));
	for (int i = 0; i < reps; i++)
		k_cu_attn_launch<k_cu_obs_none>(&a, 0);
	CK(cudaEventRecord(e1));
	CK(cudaEventSynchronize(e1));
	float ms = 0;
	CK(cudaEventElapsedTime(&ms, e0, e1));
	const double bytes = 2.0 * kvn * 4; /* keys and values read once per step */
	const double gbps = bytes * reps / (ms * 1e-3) / 1e9;
	printf("| attention decode bandwidth (3 KV heads x 4096 entries) | %.1f GB/s | %.1f%% of peak %.0f GB/s |\n",
	       gbps, peak > 0 ? 100.0 * gbps / peak : 0.0, peak);
	return bad;
}

/* Tokens of the first `want` tokens of a text file. */
static int32_t *text_tokens(const rt_tokenizer *tk, const char *path, int want, int *got)
{
	rt_err err = { "" };
	size_t len = 0;
	char *s = rt_read_file(path, &len, &err);
	if (!s) {
		fprintf(stderr, "gpu_check: %s\n", err.msg);
		exit(1);
	}
	int64_t n = rt_tokenize(tk, s, len, 0, NULL, 0, &err);
	int32_t *ids = (int32_t *)malloc((size_t)(n > 0 ? n : 1) * 4);
	if (n < 0 || rt_tokenize(tk, s, len, 0, ids, n, &err) != n) {
		fprintf(stderr, "gpu_check: %s: %s\n", path, err.msg);
		exit(1);
	}
	free(s);
	*got = n < want ? (int)n : want;
	return ids;
}

static rt_model *load(const char *path, rt_tokenizer **tk)
{
	rt_err err = { "" };
	rt_gguf *g = rt_gguf_open(path, &err);
	rt_model_opts mo;
	memset(&mo, 0, sizeof mo);
	mo.exact = 1; /* the CPU exact path, and the f32 weights the device takes */
	rt_model *m = g ? rt_model_load_opts(g, &mo, &err) : NULL;
	if (m && tk)
		*tk = rt_tokenizer_init(g, &err);
	if (!m || (tk && !*tk)) {
		fprintf(stderr, "gpu_check: %s\n", err.msg);
		exit(1);
	}
	rt_gguf_close(g);
	return m;
}

static int cmp_i32(const void *a, const void *b)
{
	const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

/* The positions each (layer, KV head) of a store keeps, sorted: H heads, head h's n[h]
 * positions at pos + off[h]. kept_free frees it. */
struct kept {
	int H, n_kv_head;
	int32_t *n;
	long *off;
	int32_t *pos;
};

static void kept_of(struct kept *k, const rt_kv *kv)
{
	k->H = kv->n_layer * kv->n_kv_head;
	k->n_kv_head = kv->n_kv_head;
	k->n = (int32_t *)malloc((size_t)k->H * 4);
	k->off = (long *)malloc((size_t)(k->H + 1) * sizeof(long));
	k->off[0] = 0;
	for (int h = 0; h < k->H; h++)
		k->off[h + 1] = k->off[h] + (k->n[h] = kv->heads[h].n);
	k->pos = (int32_t *)malloc((size_t)(k->off[k->H] + 1) * 4);
	for (int h = 0; h < k->H; h++) {
		memcpy(k->pos + k->off[h], kv->heads[h].pos, (size_t)k->n[h] * 4);
		qsort(k->pos + k->off[h], (size_t)k->n[h], 4, cmp_i32);
	}
}

static void kept_free(struct kept *k)
{
	free(k->n);
	free(k->off);
	free(k->pos);
	memset(k, 0, sizeof *k);
}

/* How two kept sets differ: positions kept by a head of one and not by the same head of
 * the other, both directions, every head; *total: entries of a; *sizes: every head keeps as
 * many in both; *first: the first head that differs, -1 if none. */
static long kept_diff(const struct kept *a, const struct kept *b, long *total, int *sizes, int *first)
{
	long d = 0;
	*total = a->off[a->H];
	*sizes = 1;
	*first = -1;
	for (int h = 0; h < a->H; h++) {
		const int na = a->n[h], nb = b->n[h];
		const int32_t *x = a->pos + a->off[h], *y = b->pos + b->off[h];
		*sizes &= na == nb;
		long common = 0;
		for (int i = 0, j = 0; i < na && j < nb;)
			if (x[i] == y[j])
				common++, i++, j++;
			else if (x[i] < y[j])
				i++;
			else
				j++;
		if (na + nb - 2 * common && *first < 0)
			*first = h;
		d += na + nb - 2 * common;
	}
	return d;
}

/* One policy through the GPU: logits of every row into lg, the kept positions into *k.
 * Returns 0, or -1 with err set. */
static int gpu_run(const rt_model *m, rt_cuda_model *dm, const struct kvp_cuda_policy *cp, const int32_t *tok,
                   int n, float *lg, struct kept *k, rt_err *err)
{
	rt_cuda_seq *g = rt_cuda_seq_init(m, dm, cp, n, 64, n, err);
	const rt_kv *gk = g && rt_cuda_seq_feed(g, tok, n, lg, RT_LOGITS_ALL, err) == 0 ? rt_cuda_seq_kv(g, err) : NULL;
	if (gk)
		kept_of(k, gk);
	rt_cuda_seq_free(g);
	return gk ? 0 : -1;
}

/* The CPU exact path and the GPU compute keys, values and attention with different GEMMs
 * (OpenBLAS, cuBLAS: about 1e-7 relative apart), so an entry whose score is that close to
 * a head's cut-off can be kept by one and evicted by the other: the check asks equal
 * counts per head and at most 1% of entries swapped, beside logits within 1e-3. The
 * selection itself is checked for exact equality on identical scores by k_select_check
 * and, with the observe and compress, by test_cuda_host. The GPU runs twice: its logits and
 * kept sets must repeat bit for bit. */
static int equiv(const char *model, const char *text, int T)
{
	rt_tokenizer *tk = NULL;
	rt_model *m = load(model, &tk);
	int n = 0;
	int32_t *tok = text_tokens(tk, text, T, &n);
	rt_err err = { "" };
	rt_cuda_model *dm = rt_cuda_model_upload(m, RT_CUDA_W_F32, &err);
	if (!dm) {
		fprintf(stderr, "gpu_check: %s\n", err.msg);
		return 1;
	}
	const size_t V = (size_t)m->hp.n_vocab, NV = (size_t)n * V;
	float *lc = (float *)malloc(NV * 4), *lg = (float *)malloc(NV * 4), *lg2 = (float *)malloc(NV * 4);
	int bad = 0;
	printf("| policy | tokens | max abs logit diff | kept sets (CPU vs GPU) | GPU repeat | compress on | result |\n");
	for (int i = 0; i < kvp_registry_count; i++) {
		const struct kvp_policy *p = kvp_registry[i];
		const struct kvp_cuda_policy *cp = strcmp(p->name, "full") ? rt_cuda_policy_find(&kvp_cuda_backend, p) : NULL;
		rt_seq s;
		if (rt_seq_init(&s, m, p, n, 64, n, &err) != 0 || rt_seq_feed(&s, tok, n, lc, RT_LOGITS_ALL, &err) != 0) {
			printf("| %s | %d | - | - | - | - | CPU: %s |\n", p->name, n, err.msg);
			rt_seq_free(&s);
			continue;
		}
		struct kept c, g1, g2;
		memset(&g1, 0, sizeof g1);
		memset(&g2, 0, sizeof g2);
		kept_of(&c, &s.kv);
		if (gpu_run(m, dm, cp, tok, n, lg, &g1, &err) != 0 || gpu_run(m, dm, cp, tok, n, lg2, &g2, &err) != 0) {
			printf("| %s | %d | - | - | - | - | not run on the GPU: %s |\n", p->name, n, err.msg);
			kept_free(&c);
			kept_free(&g1);
			kept_free(&g2);
			rt_seq_free(&s);
			continue;
		}
		double md = 0;
		for (size_t k = 0; k < NV; k++)
			md = fmax(md, fabs((double)lc[k] - lg[k]));
		long total = 0, t2 = 0;
		int sizes = 0, first = -1, s2 = 0, f2 = -1;
		const long d = kept_diff(&c, &g1, &total, &sizes, &first);
		const int repeat = !memcmp(lg, lg2, NV * 4) && kept_diff(&g1, &g2, &t2, &s2, &f2) == 0;
		char kept[160];
		if (!d)
			snprintf(kept, sizeof kept, "equal (%ld entries)", total);
		else
			snprintf(kept, sizeof kept, "%ld of %ld swapped (%.2f%%), counts %s, first at layer %d KV head %d", d / 2,
			         total, 50.0 * d / total, sizes ? "equal" : "DIFFER", first / s.kv.n_kv_head,
			         first % s.kv.n_kv_head);
		const int ok = md <= 1e-3 && sizes && (d == 0 || 50.0 * d / total <= 1.0) && repeat;
		bad |= !ok;
		printf("| %s | %d | %.3g | %s | %s | %s | %s |\n", p->name, n, md, kept, repeat ? "same" : "DIFFERS",
		       cp && cp->compress ? "device" : "host", ok ? "ok" : "FAIL");
		kept_free(&c);
		kept_free(&g1);
		kept_free(&g2);
		rt_seq_free(&s);
	}
	free(lc);
	free(lg);
	free(lg2);
	free(tok);
	rt_cuda_model_free(dm);
	rt_model_free(m);
	rt_tokenizer_free(tk);
	return bad;
}

static int bench(const char *model)
{
	rt_model *m = load(model, NULL);
	const int T = 512, D = 128;
	int32_t *tok = (int32_t *)malloc((size_t)(T + D) * 4);
	for (int i = 0; i < T + D; i++)
		tok[i] = 100 + i % 1000;
	float *lg = (float *)malloc((size_t)m->hp.n_vocab * 4);
	printf("| weights | prefill tok/s (%d) | decode tok/s (%d, after %d) |\n", T, D, T);
	for (int w = 0; w < 2; w++) {
		rt_err err = { "" };
		rt_cuda_model *dm = rt_cuda_model_upload(m, w ? RT_CUDA_W_F16 : RT_CUDA_W_F32, &err);
		rt_cuda_seq *g = dm ? rt_cuda_seq_init(m, dm, NULL, T + D, 256, T, &err) : NULL;
		if (!g) {
			printf("| %s | %s |\n", w ? "f16" : "f32", err.msg);
			return 1;
		}
		double t0 = rt_now();
		if (rt_cuda_seq_feed(g, tok, T, lg, RT_LOGITS_LAST, &err) != 0)
			return printf("| error | %s |\n", err.msg), 1;
		double t1 = rt_now();
		for (int i = 0; i < D; i++)
			if (rt_cuda_seq_feed(g, tok + T + i, 1, lg, RT_LOGITS_LAST, &err) != 0)
				return printf("| error | %s |\n", err.msg), 1;
		double t2 = rt_now();
		printf("| %s | %.0f | %.1f |\n", w ? "f16" : "f32", T / (t1 - t0), D / (t2 - t1));
		rt_cuda_seq_free(g);
		rt_cuda_model_free(dm);
	}
	free(tok);
	free(lg);
	rt_model_free(m);
	return 0;
}

int main(int argc, char **argv)
{
	char name[256];
	double peak = 0;
	rt_err err = { "" };
	if (rt_cuda_probe(name, sizeof name, &peak, &err) < 0) {
		printf("gpu_check: %s\n", err.msg);
		return 1;
	}
	if (argc >= 2 && !strcmp(argv[1], "--kernels"))
		return check_kernels(peak);
	if (argc >= 4 && !strcmp(argv[1], "--equiv"))
		return equiv(argv[2], argv[3], argc >= 5 ? atoi(argv[4]) : 512);
	if (argc >= 3 && !strcmp(argv[1], "--bench"))
		return bench(argv[2]);
	fprintf(stderr, "usage: gpu_check --kernels | --equiv MODEL TEXT [TOKENS] | --bench MODEL\n");
	return 2;
}
