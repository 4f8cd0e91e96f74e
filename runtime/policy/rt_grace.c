/*
 * rt_grace: the GraceKV compression core (arXiv 2608.07001); see rt_grace.h for the
 * model and docs/gracekv.md for every definition and its source tag ([S] secondary
 * source, [D] ours). Layout of this file: RoPE and prototypes, segmentation, the heap,
 * then compression in five passes — validate and budget, relevance (direct + multi-hop),
 * singleton floor and segment trees, the Add/Split competition, materialisation.
 */
#include "policy/rt_grace.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/rt_rope.h"

/* ---- RoPE (model/rt_rope) ------------------------------------------------------------- */

void rt_grace_rope(float *x, int d, int n_rot, float base, int32_t pos)
{
	RT_ASSERT(n_rot >= 0 && n_rot <= d && n_rot % 2 == 0);
	rt_rope_by_f32(x, n_rot, base, (double)pos);
}

void rt_grace_unrope(float *x, int d, int n_rot, float base, int32_t pos)
{
	RT_ASSERT(n_rot >= 0 && n_rot <= d && n_rot % 2 == 0);
	rt_rope_by_f32(x, n_rot, base, -(double)pos);
}

/* Un-rotate the key k[d] at position pos into out[d] (double), in double throughout.
 * cs: [n_rot] cos, sin of this position's angles (the table of rope_table), or NULL. */
static void unrope_d(const float *k, int d, int n_rot, float base, int32_t pos, const double *cs,
                     double *out)
{
	for (int i = 0; i < d; i++)
		out[i] = k[i];
	if (cs)
		rt_rope_rotate_f64(out, n_rot, cs);
	else
		rt_rope_by_f64(out, n_rot, base, -(double)pos);
}

/* cos, sin of the un-rotation angle -pos·base^(-2i/n_rot) for n positions P[0..n):
 * cs [n × n_rot], the same double values unrope_d computes without a table. */
static void rope_table(double *cs, const int32_t *P, int32_t n, int n_rot, float base)
{
	for (int32_t e = 0; e < n; e++)
		rt_rope_cs_f64(cs + (size_t)e * n_rot, -(double)P[e], n_rot, base, NULL);
}

static void prototype(const float *K, const float *V, const int32_t *P, const float *w,
                      const int32_t *idx, int n, int d, int n_rot, float base, const double *cs,
                      int key_mode, int count_mode, float *k_out, float *v_out,
                      int32_t *pos_out, float *count_out, double *coherence_out, double *work)
{
	RT_ASSERT(n >= 1);
	if (n == 1) {
		memcpy(k_out, K + (size_t)idx[0] * d, (size_t)d * sizeof(float));
		memcpy(v_out, V + (size_t)idx[0] * d, (size_t)d * sizeof(float));
		*pos_out = P[idx[0]];
		*count_out = 1.0f;
		if (coherence_out)
			*coherence_out = 1.0;
		return;
	}
	double *ksum = work, *kt = work + d;
	int64_t psum = 0;
	double norm_sum = 0.0, wsum = 0.0;
	for (int i = 0; i < d; i++)
		ksum[i] = 0.0;
	for (int j = 0; j < n; j++) {
		int32_t e = idx[j];
		psum += P[e];
		if (key_mode == RT_GRACE_KEY_POST)
			for (int i = 0; i < d; i++)
				kt[i] = K[(size_t)e * d + i];
		else
			unrope_d(K + (size_t)e * d, d, n_rot, base, P[e], cs ? cs + (size_t)e * n_rot : NULL, kt);
		double nn = 0.0;
		for (int i = 0; i < d; i++) {
			ksum[i] += kt[i];
			nn += kt[i] * kt[i];
		}
		norm_sum += sqrt(nn);
		if (w)
			wsum += w[e];
	}
	/* p = floor(mean + 1/2), exact in integers */
	int64_t p = (2 * psum + n) / (2 * (int64_t)n);
	if (2 * psum + n < 0 && (2 * psum + n) % (2 * (int64_t)n) != 0)
		p--;
	double mnorm = 0.0;
	for (int i = 0; i < d; i++) {
		double m = ksum[i] / n;
		mnorm += m * m;
		k_out[i] = (float)m;
	}
	mnorm = sqrt(mnorm);
	if (key_mode != RT_GRACE_KEY_POST)
		rt_grace_rope(k_out, d, n_rot, base, (int32_t)p);
	double coh = mnorm / (norm_sum / n + 1e-12);
	double m = count_mode == RT_GRACE_COUNT_N ? (double)n : (double)n * coh * coh;
	m = m < 1.0 ? 1.0 : m > n ? n : m;
	/* value: relevance-weighted, beta = 0.1 · mean w smooths toward the plain mean */
	double beta = 0.1 * wsum / n;
	int plain = !w || !(wsum > 0.0);
	double *vs = kt, den = 0.0;
	for (int i = 0; i < d; i++)
		vs[i] = 0.0;
	for (int j = 0; j < n; j++) {
		int32_t e = idx[j];
		double c = plain ? 1.0 : (double)w[e] + beta;
		const float *v = V + (size_t)e * d;
		for (int i = 0; i < d; i++)
			vs[i] += c * v[i];
		den += c;
	}
	for (int i = 0; i < d; i++)
		v_out[i] = (float)(vs[i] / den);
	*pos_out = (int32_t)p;
	*count_out = (float)m;
	if (coherence_out)
		*coherence_out = coh;
}

void rt_grace_prototype(const float *K, const float *V, const int32_t *P, const float *w,
                        const int32_t *idx, int n, int d, int n_rot, float base,
                        float *k_out, float *v_out, int32_t *pos_out, float *count_out,
                        double *coherence_out, double *work)
{
	prototype(K, V, P, w, idx, n, d, n_rot, base, NULL, RT_GRACE_KEY_UNROPE,
	          RT_GRACE_COUNT_COHERENCE, k_out, v_out, pos_out, count_out,
	          coherence_out, work);
}

/* ---- segmentation --------------------------------------------------------------------- */

void rt_grace_seg_params_default(rt_grace_seg_params *sp)
{
	memset(sp, 0, sizeof *sp);
	sp->min_len = 16;
	sp->max_len = 128;
	sp->target_len = 64;
	sp->lambda_stab = 0.5;
	sp->lambda_s = 1.0;
	sp->lambda_len = 4.0;
	sp->cut_cost = 3.0;
	sp->n_win = 3;
	sp->win[0] = 2;
	sp->win[1] = 4;
	sp->win[2] = 8;
}

size_t rt_grace_segment_work(int32_t n, int n_embd, int n_hid, int n_win)
{
	size_t N = n > 0 ? (size_t)n : 1;
	return (N + 1) * (size_t)(n_embd > 0 ? n_embd : 1) +
	       N * (size_t)(n_hid > 0 ? n_hid : 1) * (size_t)(n_win > 0 ? n_win : 1) + 6 * N + 4;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Robust z-score of x[0..m) into out: (x - median) / (1.4826 · MAD); a zero MAD falls back
 * to 1.2533 · mean absolute deviation, and to all zeros when that is zero too. */
static void robust_z(const double *x, int32_t m, double *out, double *tmp)
{
	if (m <= 0)
		return;
	memcpy(tmp, x, (size_t)m * sizeof(double));
	qsort(tmp, (size_t)m, sizeof(double), cmp_double);
	double med = m % 2 ? tmp[m / 2] : 0.5 * (tmp[m / 2 - 1] + tmp[m / 2]);
	double mean_abs = 0.0;
	for (int32_t i = 0; i < m; i++) {
		tmp[i] = fabs(x[i] - med);
		mean_abs += tmp[i];
	}
	mean_abs /= m;
	qsort(tmp, (size_t)m, sizeof(double), cmp_double);
	double mad = m % 2 ? tmp[m / 2] : 0.5 * (tmp[m / 2 - 1] + tmp[m / 2]);
	double scale = 1.4826 * mad;
	if (!(scale > 1e-12))
		scale = 1.2533 * mean_abs;
	for (int32_t i = 0; i < m; i++)
		out[i] = scale > 1e-12 ? (x[i] - med) / scale : 0.0;
}

int rt_grace_segment(const rt_grace_seg_params *sp, int32_t n, int n_embd, int n_hid,
                     const float *const *hid, const float *surprisal, double *work,
                     float *boundary, int32_t *seg_start, rt_err *err)
{
	if (n < 1)
		return rt_err_set(err, "gracekv segment: %d tokens (need at least 1)", (int)n);
	if (sp->min_len < 1 || sp->max_len < sp->min_len || sp->target_len < 1 || sp->n_win < 1 ||
	    sp->n_win > 4 || n_embd < 1 || n_hid < 1 || !hid)
		return rt_err_set(err, "gracekv segment: bad parameters (lengths %d..%d target %d, %d windows, %d layers of %d dims)",
		                  sp->min_len, sp->max_len, sp->target_len, sp->n_win, n_hid, n_embd);
	for (int w = 0; w < sp->n_win; w++)
		if (sp->win[w] < 1)
			return rt_err_set(err, "gracekv segment: window %d has size %d", w, sp->win[w]);
	for (int l = 0; l < n_hid; l++)
		if (!hid[l])
			return rt_err_set(err, "gracekv segment: hidden states of layer %d missing", l);
	if (boundary)
		for (int32_t i = 0; i < n; i++)
			boundary[i] = 0.0f;
	if (n < sp->min_len || n == 1) {
		seg_start[0] = 0;
		return 1;
	}
	const size_t E = (size_t)n_embd, N = (size_t)n;
	const int nk = n_hid * sp->n_win;
	double *ps = work;                      /* [(n+1) × E] prefix sums */
	double *kap = ps + (N + 1) * E;         /* [nk × n] */
	double *kf = kap + (size_t)nk * N;      /* [n] */
	double *za = kf + N, *zb = za + N, *tmp = zb + N; /* [n] each */
	double *f = tmp + N;                    /* [n + 1] */
	double *arg = f + N + 1;                /* [n + 1] */
	for (int l = 0; l < n_hid; l++) {
		const float *h = hid[l];
		for (size_t e = 0; e < E; e++)
			ps[e] = 0.0;
		for (size_t i = 0; i < N; i++)
			for (size_t e = 0; e < E; e++)
				ps[(i + 1) * E + e] = ps[i * E + e] + h[i * E + e];
		for (int w = 0; w < sp->n_win; w++) {
			double *kp = kap + (size_t)(l * sp->n_win + w) * N;
			for (int32_t i = 0; i < n; i++) {
				int32_t a0 = i - sp->win[w] + 1 < 0 ? 0 : i - sp->win[w] + 1;
				int32_t b1 = i + sp->win[w] > n - 1 ? n - 1 : i + sp->win[w];
				kp[i] = 0.0;
				if (i == n - 1)
					continue;
				double dot = 0.0, na = 0.0, nb = 0.0;
				for (size_t e = 0; e < E; e++) {
					double hi = h[(size_t)i * E + e];
					double mm = (ps[(size_t)(i + 1) * E + e] - ps[(size_t)a0 * E + e]) / (i + 1 - a0);
					double mp = (ps[(size_t)(b1 + 1) * E + e] - ps[(size_t)(i + 1) * E + e]) / (b1 - i);
					double x = hi - mm, y = mp - hi;
					dot += x * y;
					na += x * x;
					nb += y * y;
				}
				if (na > 1e-24 && nb > 1e-24)
					kp[i] = 1.0 - dot / sqrt(na * nb);
			}
		}
	}
	for (size_t i = 0; i < N; i++) {
		double s = 0.0, s2 = 0.0;
		for (int k = 0; k < nk; k++)
			s += kap[(size_t)k * N + i];
		s /= nk;
		for (int k = 0; k < nk; k++) {
			double dd = kap[(size_t)k * N + i] - s;
			s2 += dd * dd;
		}
		kf[i] = s - sp->lambda_stab * sqrt(s2 / nk);
	}
	/* cut i lies between tokens i and i+1 (i = 0..n-2) */
	robust_z(kf, n - 1, za, tmp);
	for (int32_t i = 0; i + 1 < n; i++)
		zb[i] = 0.0;
	if (surprisal && sp->lambda_s != 0.0) {
		for (int32_t i = 0; i + 1 < n; i++)
			kf[i] = surprisal[i + 1];
		robust_z(kf, n - 1, zb, tmp);
	}
	double *b = kf;
	for (int32_t i = 0; i + 1 < n; i++) {
		b[i] = za[i] + sp->lambda_s * zb[i];
		if (boundary)
			boundary[i] = (float)b[i];
	}
	/* DP over segment ends: f[j] = best score of tokens [0, j) cut into valid segments */
	const double T = sp->target_len;
	f[0] = 0.0;
	for (int32_t j = 1; j <= n; j++) {
		f[j] = -INFINITY;
		arg[j] = -1;
		int32_t hi = sp->max_len < j ? sp->max_len : j;
		for (int32_t len = hi; len >= sp->min_len; len--) {
			int32_t i = j - len;
			if (f[i] == -INFINITY)
				continue;
			double pen = (len - T) / T;
			double val = f[i] + (i > 0 ? b[i - 1] - sp->cut_cost : 0.0) - sp->lambda_len * pen * pen;
			if (val > f[j]) {
				f[j] = val;
				arg[j] = i;
			}
		}
	}
	if (f[n] == -INFINITY)
		return rt_err_set(err, "gracekv segment: %d tokens cannot be cut into segments of %d..%d",
		                  (int)n, sp->min_len, sp->max_len);
	int32_t k = 0;
	for (int32_t j = n; j > 0; j = (int32_t)arg[j])
		seg_start[k++] = (int32_t)arg[j];
	for (int32_t i = 0; i < k / 2; i++) {
		int32_t t = seg_start[i];
		seg_start[i] = seg_start[k - 1 - i];
		seg_start[k - 1 - i] = t;
	}
	return k;
}

/* ---- heap ---------------------------------------------------------------------------- */

int rt_grace_item_before(const rt_grace_item *x, const rt_grace_item *y)
{
	double ux = isnan(x->u) ? -INFINITY : x->u, uy = isnan(y->u) ? -INFINITY : y->u;
	if (ux != uy)
		return ux > uy;
	if (x->layer != y->layer)
		return x->layer < y->layer;
	if (x->kv_head != y->kv_head)
		return x->kv_head < y->kv_head;
	if (x->pos != y->pos)
		return x->pos < y->pos;
	return x->id < y->id;
}

void rt_grace_heap_push(rt_grace_heap *h, const rt_grace_item *it)
{
	RT_ASSERT(h->n < h->cap);
	int32_t i = h->n++;
	while (i > 0) {
		int32_t p = (i - 1) / 2;
		if (!rt_grace_item_before(it, &h->a[p]))
			break;
		h->a[i] = h->a[p];
		i = p;
	}
	h->a[i] = *it;
}

int rt_grace_heap_pop(rt_grace_heap *h, rt_grace_item *out)
{
	if (h->n == 0)
		return 0;
	*out = h->a[0];
	rt_grace_item last = h->a[--h->n];
	int32_t i = 0;
	for (;;) {
		int32_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && rt_grace_item_before(&h->a[c + 1], &h->a[c]))
			c++;
		if (!rt_grace_item_before(&h->a[c], &last))
			break;
		h->a[i] = h->a[c];
		i = c;
	}
	if (h->n > 0)
		h->a[i] = last;
	return 1;
}

/* ---- compression --------------------------------------------------------------------- */

void rt_grace_params_default(rt_grace_params *p)
{
	memset(p, 0, sizeof *p);
	p->x = 8.0;
	p->recent = 32;
	p->floor = 0;
	p->lambda_z = 1.0;
	p->lambda_m = 1.0;
	p->lambda_graph = 0.3;
	p->hops = 2;
	p->hop_seeds = 8;
	p->hop_decay = 0.5;
	p->seg_len = 64;
}

enum { ACT_ADD = RT_GRACE_ADD, ACT_BIN = RT_GRACE_SPLIT_BINARY, ACT_SAL = RT_GRACE_SPLIT_SALIENT };

/* A tree node: members [a, b) of its head's member list, in the frontier or not. */
typedef struct gnode {
	int32_t a, b, lg, frontier;
	double D, Ddrop, R;
} gnode;

/* An action; a salient split also carries its binary alternative (used when the budget
 * left is one entry). */
typedef struct gact {
	int32_t node, kind, cost, cut, bcut;
	double delta, dch[3], bdelta, bdch[2];
} gact;

typedef struct fcand {
	float val;
	int32_t lg, e;
} fcand;

typedef struct ordk {
	int32_t pos, anchor, slot;
} ordk;

struct rt_grace_scratch {
	float *R;          /* [LG × C] relevance per entry */
	double *sbar, *dflow, *dnext; /* [C] */
	float *row;        /* [C] */
	uint8_t *sel;      /* [C] */
	int32_t *mem;      /* [LG × C] member entry indices per head */
	int32_t *nmem;     /* [LG] */
	int32_t *segb;     /* [LG × (C + 1)] segment starts in member indices, closed by nmem */
	int32_t *nseg;     /* [LG] */
	uint8_t *isfloor;  /* [LG × C] */
	fcand *fc;         /* [LG × C] */
	gnode *nodes;      /* [2 × LG × C] */
	gact *acts;        /* [3 × LG × C] */
	rt_grace_item *heap; /* [3 × LG × C] */
	double *cq, *zall; /* [LG × maxq] max context logit, Σ exp(logit - max) per probe row */
	float *E;          /* [LG × C × maxq] exp(logit - cq) / zall per entry and probe row
	                      (row stride nq of the head; 0 outside the context) */
	float *logit;      /* [maxq × C] one head's probe logits */
	float *Mq;         /* [maxq × d] numerators of one range */
	double *Zq;        /* [maxq] */
	double *cs;        /* [C × n_rot] un-rotation table of the entries' positions */
	int32_t *owner;    /* [LG × C] */
	float *ktmp, *vtmp; /* [d] */
	double *dwork;     /* [3 × d] */
	float *sk, *sv;    /* [C × d] staging of one head */
	int32_t *spos;     /* [C] */
	float *scnt, *slc; /* [C] */
	uint16_t *sspan;   /* [C] */
	uint8_t *sstat;    /* [C × stat_bytes] */
	ordk *ord;         /* [C] */
	rt_grace_item *lheap; /* [3 × C] one head's heap (coverage floor phase) */
	int64_t *hspent;   /* [LG] entries the coverage floor phase gave each head */
	int64_t n_nodes, n_acts;
	/* per call */
	const rt_kv *kv;
	const rt_grace_params *p;
	const rt_grace_input *in;
	int32_t n;
};

static size_t al64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* Sizes of the scratch blocks for a store shape (n_sizes entries, the first being the
 * scratch header); each block is 64-byte aligned in the single area. */
enum { N_SIZES = 31 };

static int scratch_sizes(const rt_kv *kv, int n_rot, int32_t max_probe, size_t *sizes)
{
	const size_t LG = (size_t)kv->n_layer * kv->n_kv_head, C = (size_t)kv->cap, d = (size_t)kv->head_dim;
	size_t maxq = (size_t)max_probe * kv->group;
	if (maxq < 1)
		maxq = 1;
	const size_t v[] = {
		sizeof(struct rt_grace_scratch),
		LG * C * sizeof(float),                        /* R */
		3 * C * sizeof(double), C * sizeof(float), C,  /* sbar.., row, sel */
		LG * C * sizeof(int32_t), LG * sizeof(int32_t), /* mem, nmem */
		LG * (C + 1) * sizeof(int32_t), LG * sizeof(int32_t), /* segb, nseg */
		LG * C, LG * C * sizeof(fcand),                /* isfloor, fc */
		2 * LG * C * sizeof(gnode), 3 * LG * C * sizeof(gact), 3 * LG * C * sizeof(rt_grace_item),
		2 * LG * maxq * sizeof(double), LG * maxq * C * sizeof(float), maxq * C * sizeof(float),
		LG * C * sizeof(int32_t),
		maxq * d * sizeof(float), maxq * sizeof(double), C * (size_t)(n_rot > 0 ? n_rot : 1) * sizeof(double),
		2 * d * sizeof(float), 3 * d * sizeof(double),
		2 * C * d * sizeof(float), C * sizeof(int32_t), 2 * C * sizeof(float),
		C * sizeof(uint16_t), C * kv->stat_bytes + 1, C * sizeof(ordk),
		3 * C * sizeof(rt_grace_item), LG * sizeof(int64_t),
	};
	RT_ASSERT(sizeof v / sizeof v[0] == N_SIZES);
	memcpy(sizes, v, sizeof v);
	return N_SIZES;
}

static int check_shape(const rt_kv *kv, int n_rot, float rope_base, int32_t max_probe, rt_err *err)
{
	if (!kv || kv->n_layer <= 0 || kv->n_kv_head <= 0 || kv->group <= 0 || kv->head_dim <= 0 ||
	    kv->cap <= 0)
		return rt_err_set(err, "gracekv: invalid KV store shape");
	if (n_rot < 0 || n_rot > kv->head_dim || n_rot % 2 || !(rope_base > 0.0f))
		return rt_err_set(err, "gracekv: bad RoPE (n_rot %d of head_dim %d, base %g)", n_rot,
		                  kv->head_dim, (double)rope_base);
	if (max_probe < 0)
		return rt_err_set(err, "gracekv: max_probe %d is negative", (int)max_probe);
	return 0;
}

size_t rt_grace_bytes(const rt_kv *kv, int n_rot, int32_t max_probe)
{
	size_t sizes[N_SIZES];
	if (!kv || kv->n_layer <= 0 || kv->n_kv_head <= 0 || kv->group <= 0 || kv->head_dim <= 0 ||
	    kv->cap <= 0 || max_probe < 0)
		return 0;
	int ns = scratch_sizes(kv, n_rot, max_probe, sizes);
	size_t total = 64; /* room to align a caller's area */
	for (int i = 0; i < ns; i++) {
		if (sizes[i] > SIZE_MAX / 4 - total)
			return SIZE_MAX;
		total += al64(sizes[i]);
	}
	return total;
}

/* Carve the scratch blocks out of mem (64-byte aligned, at least rt_grace_bytes). */
static void carve(rt_grace *g, const rt_kv *kv, int n_rot, float rope_base, int32_t max_probe,
                  uint8_t *m)
{
	const size_t LG = (size_t)kv->n_layer * kv->n_kv_head, C = (size_t)kv->cap, d = (size_t)kv->head_dim;
	size_t maxq = (size_t)max_probe * kv->group;
	if (maxq < 1)
		maxq = 1;
	size_t sizes[N_SIZES];
	int ns = scratch_sizes(kv, n_rot, max_probe, sizes);
	uint8_t *q = m;
	void *ptr[N_SIZES];
	for (int i = 0; i < ns; i++) {
		ptr[i] = q;
		q += al64(sizes[i]);
	}
	struct rt_grace_scratch *s = ptr[0];
	memset(s, 0, sizeof *s);
	int k = 1;
	s->R = ptr[k++];
	s->sbar = ptr[k++];
	s->dflow = s->sbar + C;
	s->dnext = s->dflow + C;
	s->row = ptr[k++];
	s->sel = ptr[k++];
	s->mem = ptr[k++];
	s->nmem = ptr[k++];
	s->segb = ptr[k++];
	s->nseg = ptr[k++];
	s->isfloor = ptr[k++];
	s->fc = ptr[k++];
	s->nodes = ptr[k++];
	s->acts = ptr[k++];
	s->heap = ptr[k++];
	s->cq = ptr[k++];
	s->zall = s->cq + LG * maxq;
	s->E = ptr[k++];
	s->logit = ptr[k++];
	s->owner = ptr[k++];
	s->Mq = ptr[k++];
	s->Zq = ptr[k++];
	s->cs = ptr[k++];
	s->ktmp = ptr[k++];
	s->vtmp = s->ktmp + d;
	s->dwork = ptr[k++];
	s->sk = ptr[k++];
	s->sv = s->sk + C * d;
	s->spos = ptr[k++];
	s->scnt = ptr[k++];
	s->slc = s->scnt + C;
	s->sspan = ptr[k++];
	s->sstat = ptr[k++];
	s->ord = ptr[k++];
	s->lheap = ptr[k++];
	s->hspent = ptr[k++];
	RT_ASSERT(k == ns);
	g->n_layer = kv->n_layer;
	g->n_kv_head = kv->n_kv_head;
	g->group = kv->group;
	g->head_dim = kv->head_dim;
	g->n_rot = n_rot;
	g->rope_base = rope_base;
	g->cap = kv->cap;
	g->max_probe = max_probe;
	g->stat_bytes = kv->stat_bytes;
	g->s = s;
}

int rt_grace_init(rt_grace *g, const rt_kv *kv, int n_rot, float rope_base,
                  int32_t max_probe, rt_err *err)
{
	memset(g, 0, sizeof *g);
	if (check_shape(kv, n_rot, rope_base, max_probe, err))
		return -1;
	size_t total = rt_grace_bytes(kv, n_rot, max_probe);
	if (total == SIZE_MAX)
		return rt_err_set(err, "gracekv: scratch for %d entries per head is too large", (int)kv->cap);
	uint8_t *m = aligned_alloc(64, al64(total));
	if (!m)
		return rt_err_set(err, "gracekv: cannot allocate %zu bytes of scratch", total);
	memset(m, 0, al64(total));
	carve(g, kv, n_rot, rope_base, max_probe, m);
	g->mem = m;
	g->mem_bytes = total;
	g->owns = 1;
	return 0;
}

int rt_grace_init_at(rt_grace *g, const rt_kv *kv, int n_rot, float rope_base,
                     int32_t max_probe, void *mem, size_t len, rt_err *err)
{
	memset(g, 0, sizeof *g);
	if (check_shape(kv, n_rot, rope_base, max_probe, err))
		return -1;
	size_t total = rt_grace_bytes(kv, n_rot, max_probe);
	if (!mem || total == SIZE_MAX || len < total)
		return rt_err_set(err, "gracekv: scratch of %zu bytes given, %zu needed", len, total);
	uint8_t *m = (uint8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
	carve(g, kv, n_rot, rope_base, max_probe, m);
	g->mem = mem;
	g->mem_bytes = len;
	g->owns = 0;
	return 0;
}

void rt_grace_free(rt_grace *g)
{
	if (g->owns)
		free(g->mem);
	memset(g, 0, sizeof *g);
}

/* Probe query rows of head lg: the caller's post-RoPE queries, or the stand-in keys. */
static const float *probes_of(const rt_grace *g, int lg, int32_t *nq, int32_t *first_entry)
{
	const struct rt_grace_scratch *s = g->s;
	const rt_grace_input *in = s->in;
	const size_t d = (size_t)g->head_dim;
	if (in->probe_q) {
		*nq = in->n_probe * g->group;
		*first_entry = -1;
		return in->probe_q + (size_t)lg * (size_t)*nq * d;
	}
	/* stand-ins [D]: the keys of the suffix, else of the recent window */
	int32_t tail = in->suffix > 0 ? in->suffix : s->p->recent;
	int32_t ctx_end = s->n - in->suffix;
	int32_t hi = in->suffix > 0 ? s->n : ctx_end;
	if (tail > g->max_probe)
		tail = g->max_probe;
	if (tail > hi - in->prefix)
		tail = hi - in->prefix;
	if (tail < 0)
		tail = 0;
	*nq = tail;
	*first_entry = hi - tail;
	return s->kv->heads[lg].k + (size_t)(hi - tail) * d;
}

/* M[q] += w[q] · v and Z[q] += w[q] for the nq probe rows, w = E[e, ·] (row stride nq)
 * of one member e with value v[d]. The d-loop is written with 8-float GCC vectors when d is
 * a multiple of 8 and compiled in AVX-512 / AVX2 / baseline clones picked at load. */
typedef float v8f __attribute__((vector_size(32)));

__attribute__((target_clones("avx512f", "avx2", "default")))
static void accum_member(float *M, double *Z, const float *E, int32_t e, int32_t nq,
                         const float *v, int d)
{
	const float *wr = E + (size_t)e * nq;
	if (d % 8 == 0) {
		for (int32_t qi = 0; qi < nq; qi++) {
			const float w = wr[qi];
			float *Mr = M + (size_t)qi * d;
			Z[qi] += w;
			for (int i = 0; i < d; i += 8) {
				v8f a, x;
				memcpy(&a, Mr + i, sizeof a);
				memcpy(&x, v + i, sizeof x);
				a += w * x;
				memcpy(Mr + i, &a, sizeof a);
			}
		}
		return;
	}
	for (int32_t qi = 0; qi < nq; qi++) {
		const float w = wr[qi];
		float *Mr = M + (size_t)qi * d;
		Z[qi] += w;
		for (int i = 0; i < d; i++)
			Mr[i] += w * v[i];
	}
}

/* Distortion D(I) of representing members [a, b) of head lg by one prototype, and
 * D_drop(I) of representing them by nothing (section 9.4 [S]). Per probe row q (weights
 * and sums relative to the row's context mass, so the shift cancels):
 *   Z = Σ e_t, M = Σ e_t v_t, Z~ = m e~, M~ = Z~ v~,
 *   D_q = λ_Z (Z - Z~)²/(Z² + ε) + λ_M ‖M - M~‖²/(‖M‖² + ε),  D = Σ Z D_q / Σ Z. */
static void eval_range(rt_grace *g, int lg, int32_t a, int32_t b, double *D, double *Ddrop)
{
	struct rt_grace_scratch *s = g->s;
	const rt_kv_head *h = &s->kv->heads[lg];
	const int d = g->head_dim;
	const int32_t n = b - a, C = g->cap;
	const int32_t *idx = s->mem + (size_t)lg * C + a;
	const float scale = 1.0f / sqrtf((float)d);
	const double eps = 1e-20;
	float m = 1.0f;
	int32_t pp;
	if (n > 1)
		prototype(h->k, h->v, h->pos, s->R + (size_t)lg * C, idx, n, d, g->n_rot, g->rope_base,
		          g->n_rot > 0 ? s->cs : NULL, s->p->key_mode, s->p->count_mode, s->ktmp,
		          s->vtmp, &pp, &m, NULL, s->dwork);
	int32_t nq, fe;
	const float *Q = probes_of(g, lg, &nq, &fe);
	size_t maxq = (size_t)g->max_probe * g->group;
	if (maxq < 1)
		maxq = 1;
	const double *cq = s->cq + (size_t)lg * maxq, *za = s->zall + (size_t)lg * maxq;
	const float *E = s->E + (size_t)lg * maxq * C;
	float *M = s->Mq;
	double *Zs = s->Zq;
	memset(M, 0, (size_t)nq * d * sizeof(float));
	for (int32_t qi = 0; qi < nq; qi++)
		Zs[qi] = 0.0;
	for (int32_t j = 0; j < n; j++)
		accum_member(M, Zs, E, idx[j], nq, h->v + (size_t)idx[j] * d, d);
	double sw = 0.0, sD = 0.0, sDd = 0.0;
	for (int32_t qi = 0; qi < nq; qi++) {
		if (!(za[qi] > 0.0))
			continue;
		const double Z = Zs[qi];
		const float *Mr = M + (size_t)qi * d;
		double mm = 0.0;
		for (int i = 0; i < d; i++)
			mm += (double)Mr[i] * Mr[i];
		double Dq = 0.0;
		if (n > 1) {
			const float *q = Q + (size_t)qi * d;
			double dot = 0.0;
			for (int i = 0; i < d; i++)
				dot += (double)q[i] * s->ktmp[i];
			double Zt = m * exp(dot * scale - cq[qi]) / za[qi];
			double dm = 0.0;
			for (int i = 0; i < d; i++) {
				double t = Mr[i] - Zt * s->vtmp[i];
				dm += t * t;
			}
			Dq = s->p->lambda_z * (Z - Zt) * (Z - Zt) / (Z * Z + eps) +
			     s->p->lambda_m * dm / (mm + eps);
		}
		double Dd = s->p->lambda_z * Z * Z / (Z * Z + eps) + s->p->lambda_m * mm / (mm + eps);
		sw += Z;
		sD += Z * Dq;
		sDd += Z * Dd;
	}
	*D = sw > 0.0 ? sD / sw : 0.0;
	*Ddrop = sw > 0.0 ? sDd / sw : 0.0;
}

static double range_rel(const rt_grace *g, int lg, int32_t a, int32_t b)
{
	const struct rt_grace_scratch *s = g->s;
	const int32_t *idx = s->mem + (size_t)lg * g->cap;
	const float *R = s->R + (size_t)lg * g->cap;
	double r = 0.0;
	for (int32_t j = a; j < b; j++)
		r += R[idx[j]];
	return r;
}

static double omega_of(const rt_grace *g, int lg)
{
	const rt_grace_input *in = g->s->in;
	return in->omega ? in->omega[lg] : 1.0;
}

static void push_act(rt_grace *g, rt_grace_heap *hp, int32_t id, double u)
{
	struct rt_grace_scratch *s = g->s;
	const gnode *nd = &s->nodes[s->acts[id].node];
	rt_grace_item it = { u, nd->lg / g->n_kv_head, nd->lg % g->n_kv_head,
	                     s->kv->heads[nd->lg].pos[s->mem[(size_t)nd->lg * g->cap + nd->a]], id };
	rt_grace_heap_push(hp, &it);
}

/* Evaluate the split options of node ni (>= 2 members) and push the better one by
 * utility per entry (ties: binary). */
static void offer_split(rt_grace *g, rt_grace_heap *hp, int32_t ni)
{
	struct rt_grace_scratch *s = g->s;
	const gnode nd = s->nodes[ni];
	const int32_t n = nd.b - nd.a, C = g->cap;
	const int32_t *idx = s->mem + (size_t)nd.lg * C;
	const float *R = s->R + (size_t)nd.lg * C;
	const double w = omega_of(g, nd.lg) * nd.R;
	RT_ASSERT(n >= 2);
	/* binary: cut in the middle half at the strongest boundary (ties: lower) [D] */
	int32_t q4 = n / 4 < 1 ? 1 : n / 4;
	int32_t lo = nd.a + q4, hi = nd.b - q4, cut = nd.a + n / 2;
	if (s->in->boundary) {
		cut = lo;
		for (int32_t c = lo + 1; c <= hi; c++)
			if (s->in->boundary[idx[c - 1]] > s->in->boundary[idx[cut - 1]])
				cut = c;
	}
	double D0 = 0.0, D1 = 0.0, dd;
	if (cut - nd.a > 1)
		eval_range(g, nd.lg, nd.a, cut, &D0, &dd);
	if (nd.b - cut > 1)
		eval_range(g, nd.lg, cut, nd.b, &D1, &dd);
	gact *ac = &s->acts[s->n_acts];
	memset(ac, 0, sizeof *ac);
	ac->node = ni;
	ac->kind = ACT_BIN;
	ac->cost = 1;
	ac->cut = cut;
	ac->delta = w * (nd.D - D0 - D1);
	ac->dch[0] = D0;
	ac->dch[1] = D1;
	double ub = ac->delta;
	if (n >= 3) {
		/* salient extraction: the highest-relevance member alone (ties: lower) */
		int32_t sm = nd.a;
		for (int32_t j = nd.a + 1; j < nd.b; j++)
			if (R[idx[j]] > R[idx[sm]])
				sm = j;
		double L = 0.0, Rr = 0.0;
		int nch = 1;
		if (sm - nd.a > 1)
			eval_range(g, nd.lg, nd.a, sm, &L, &dd);
		if (nd.b - sm - 1 > 1)
			eval_range(g, nd.lg, sm + 1, nd.b, &Rr, &dd);
		nch += (sm > nd.a) + (sm + 1 < nd.b);
		double ds = w * (nd.D - L - Rr);
		double us = ds / (nch - 1);
		if (us > ub) {
			ac->bcut = cut;
			ac->bdelta = ac->delta;
			ac->bdch[0] = D0;
			ac->bdch[1] = D1;
			ac->kind = ACT_SAL;
			ac->cost = nch - 1;
			ac->cut = sm;
			ac->delta = ds;
			ac->dch[0] = L;
			ac->dch[1] = 0.0;
			ac->dch[2] = Rr;
			ub = us;
		}
	}
	RT_ASSERT(s->n_acts < 3 * (int64_t)g->n_layer * g->n_kv_head * C);
	push_act(g, hp, (int32_t)s->n_acts++, ub);
}

static int32_t new_node(rt_grace *g, int lg, int32_t a, int32_t b, double D)
{
	struct rt_grace_scratch *s = g->s;
	RT_ASSERT(s->n_nodes < 2 * (int64_t)g->n_layer * g->n_kv_head * g->cap);
	gnode *nd = &s->nodes[s->n_nodes];
	nd->a = a;
	nd->b = b;
	nd->lg = lg;
	nd->frontier = 1;
	nd->D = D;
	nd->Ddrop = 0.0;
	nd->R = range_rel(g, lg, a, b);
	return (int32_t)s->n_nodes++;
}

static int cmp_fcand(const void *a, const void *b)
{
	const fcand *x = a, *y = b;
	if (x->val != y->val)
		return x->val > y->val ? -1 : 1;
	if (x->lg != y->lg)
		return x->lg < y->lg ? -1 : 1;
	return (x->e > y->e) - (x->e < y->e);
}

static int cmp_ord(const void *a, const void *b)
{
	const ordk *x = a, *y = b;
	if (x->pos != y->pos)
		return x->pos < y->pos ? -1 : 1;
	return (x->anchor > y->anchor) - (x->anchor < y->anchor);
}

/* Relevance R [LG × n]: direct (from rel or the probes) normalised over the context per
 * head, mixed with the multi-hop flow (section 9.5 [S], propagation [D]). */
static void relevance(rt_grace *g, int32_t ctx_b, int32_t ctx_e)
{
	struct rt_grace_scratch *s = g->s;
	const rt_grace_input *in = s->in;
	const rt_grace_params *p = s->p;
	const int LG = g->n_layer * g->n_kv_head, d = g->head_dim;
	const int32_t n = s->n, C = g->cap;
	const float scale = 1.0f / sqrtf((float)d);
	size_t maxq = (size_t)g->max_probe * g->group;
	if (maxq < 1)
		maxq = 1;
	for (int lg = 0; lg < LG; lg++) {
		const rt_kv_head *h = &s->kv->heads[lg];
		float *R = s->R + (size_t)lg * C;
		int32_t nq, fe;
		const float *Q = probes_of(g, lg, &nq, &fe);
		for (int32_t t = 0; t < n; t++)
			R[t] = 0.0f;
		float *Eh = s->E + (size_t)lg * maxq * C;
		if (nq > 0 && n > 0)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, n, d, scale, Q, d, h->k, d,
			            0.0f, s->logit, n);
		else
			nq = 0;
		for (int32_t qi = 0; qi < nq; qi++) {
			const float *row = s->logit + (size_t)qi * n;
			/* distortion normaliser over the context */
			double c = -INFINITY, z = 0.0;
			for (int32_t t = ctx_b; t < ctx_e; t++)
				c = row[t] > c ? row[t] : c;
			for (int32_t t = ctx_b; t < ctx_e; t++)
				z += exp(row[t] - c);
			s->cq[(size_t)lg * maxq + qi] = ctx_e > ctx_b ? c : 0.0;
			s->zall[(size_t)lg * maxq + qi] = z;
			/* distortion weights e_t = exp(logit - c) / z, stored [entry × probe row] */
			for (int32_t t = 0; t < n; t++)
				Eh[(size_t)t * nq + qi] = t >= ctx_b && t < ctx_e ? (float)(exp(row[t] - c) / z) : 0.0f;
			if (in->rel)
				continue;
			/* direct relevance: softmax over the visible entries (logit + log count) */
			int32_t ppos = fe >= 0 ? h->pos[fe + qi] :
			               in->probe_pos ? in->probe_pos[qi / g->group] : INT32_MAX;
			int32_t vis = 0;
			while (vis < n && h->pos[vis] <= ppos)
				vis++;
			double mx = -INFINITY, sum = 0.0;
			for (int32_t t = 0; t < vis; t++) {
				double x = (double)row[t] + h->log_count[t];
				mx = x > mx ? x : mx;
			}
			for (int32_t t = 0; t < vis; t++)
				sum += exp((double)row[t] + h->log_count[t] - mx);
			for (int32_t t = 0; t < vis; t++)
				R[t] += (float)(exp((double)row[t] + h->log_count[t] - mx) / sum);
		}
		if (in->rel)
			for (int32_t t = 0; t < n; t++)
				R[t] = in->rel[(size_t)lg * n + t];
		double tot = 0.0;
		for (int32_t t = ctx_b; t < ctx_e; t++)
			tot += R[t] > 0.0f ? R[t] : 0.0f;
		for (int32_t t = 0; t < n; t++) {
			if (t < ctx_b || t >= ctx_e)
				R[t] = 0.0f;
			else if (tot > 0.0)
				R[t] = R[t] > 0.0f ? (float)(R[t] / tot) : 0.0f;
			else
				R[t] = 1.0f / (float)(ctx_e - ctx_b);
		}
	}
	if (!in->hop_attn || !(p->lambda_graph > 0.0) || p->hops < 1 || p->hop_seeds < 1 ||
	    ctx_e <= ctx_b)
		return;
	/* multi-hop: seeds = top tokens of the head-averaged relevance; each hop spreads the
	 * seeds' weight over what they attended to, decayed, excluding selected tokens */
	double *sb = s->sbar, *df = s->dflow, *dn = s->dnext;
	for (int32_t t = 0; t < n; t++) {
		double a = 0.0;
		for (int lg = 0; lg < LG; lg++)
			a += s->R[(size_t)lg * C + t];
		sb[t] = a / LG;
		df[t] = 0.0;
		s->sel[t] = 0;
	}
	int32_t seeds[64];
	double sw[64];
	int K = p->hop_seeds > 64 ? 64 : p->hop_seeds, ns = 0;
	const double *src = sb;
	double decay = 1.0;
	for (int hop = 0; hop <= p->hops; hop++) {
		/* pick the seeds of this hop from src (ties: lower entry) */
		ns = 0;
		for (int k = 0; k < K; k++) {
			int32_t best = -1;
			for (int32_t t = ctx_b; t < ctx_e; t++)
				if (!s->sel[t] && src[t] > 0.0 && (best < 0 || src[t] > src[best]))
					best = t;
			if (best < 0)
				break;
			s->sel[best] = 1;
			seeds[ns] = best;
			sw[ns++] = src[best];
		}
		if (hop == p->hops || ns == 0)
			break;
		decay *= p->hop_decay;
		for (int32_t t = 0; t < n; t++)
			dn[t] = 0.0;
		for (int k = 0; k < ns; k++) {
			in->hop_attn(in->hop_user, seeds[k], s->row);
			for (int32_t t = ctx_b; t < ctx_e && t < seeds[k]; t++)
				if (!s->sel[t] && s->row[t] > 0.0f)
					dn[t] += sw[k] * s->row[t];
		}
		for (int32_t t = ctx_b; t < ctx_e; t++)
			df[t] += decay * dn[t];
		memcpy(sb, dn, (size_t)n * sizeof(double));
		src = sb;
	}
	double tot = 0.0;
	for (int32_t t = ctx_b; t < ctx_e; t++)
		tot += df[t];
	if (!(tot > 0.0))
		return;
	for (int lg = 0; lg < LG; lg++) {
		float *R = s->R + (size_t)lg * C;
		for (int32_t t = ctx_b; t < ctx_e; t++)
			R[t] = (float)((1.0 - p->lambda_graph) * R[t] + p->lambda_graph * df[t] / tot);
	}
}

struct counts {
	int64_t adds, sbin, ssal;
};

/* Pop and apply actions of heap hp while *left > 0 (section 9.6 [S]): an Add puts its
 * root in the frontier and offers its split, a Split replaces a node by its children and
 * offers theirs (into the same heap). A popped action costing more than is left can only
 * be a 2-entry salient split with 1 entry left: its binary alternative is pushed. */
static void compete(rt_grace *g, rt_grace_heap *hp, int64_t *left, struct counts *cnt)
{
	struct rt_grace_scratch *s = g->s;
	const rt_grace_input *in = s->in;
	rt_grace_item it;
	while (*left > 0 && rt_grace_heap_pop(hp, &it)) {
		gact *ac = &s->acts[it.id];
		gnode *nd = &s->nodes[ac->node];
		if (ac->cost > *left) {
			RT_ASSERT(ac->kind == ACT_SAL);
			gact *alt = &s->acts[s->n_acts];
			memset(alt, 0, sizeof *alt);
			alt->node = ac->node;
			alt->kind = ACT_BIN;
			alt->cost = 1;
			alt->cut = ac->bcut;
			alt->delta = ac->bdelta;
			alt->dch[0] = ac->bdch[0];
			alt->dch[1] = ac->bdch[1];
			push_act(g, hp, (int32_t)s->n_acts++, alt->delta);
			continue;
		}
		*left -= ac->cost;
		if (in->trace)
			in->trace(in->trace_user, (enum rt_grace_action)ac->kind, it.layer, it.kv_head, it.pos,
			          nd->b - nd->a, ac->cost, ac->delta);
		if (ac->kind == ACT_ADD) {
			cnt->adds++;
			nd->frontier = 1;
			if (nd->b - nd->a >= 2)
				offer_split(g, hp, ac->node);
			continue;
		}
		nd->frontier = 0;
		const int32_t a = nd->a, b = nd->b, lg = nd->lg;
		int32_t ch[3], nch = 0;
		if (ac->kind == ACT_BIN) {
			cnt->sbin++;
			ch[nch++] = new_node(g, lg, a, ac->cut, ac->dch[0]);
			ch[nch++] = new_node(g, lg, ac->cut, b, ac->dch[1]);
		} else {
			cnt->ssal++;
			if (ac->cut > a)
				ch[nch++] = new_node(g, lg, a, ac->cut, ac->dch[0]);
			ch[nch++] = new_node(g, lg, ac->cut, ac->cut + 1, 0.0);
			if (ac->cut + 1 < b)
				ch[nch++] = new_node(g, lg, ac->cut + 1, b, ac->dch[2]);
		}
		for (int k = 0; k < nch; k++)
			if (s->nodes[ch[k]].b - s->nodes[ch[k]].a >= 2)
				offer_split(g, hp, ch[k]);
	}
}

int rt_grace_compress(rt_grace *g, rt_kv *kv, const rt_grace_params *p,
                      const rt_grace_input *in, rt_grace_stats *st, rt_err *err)
{
	struct rt_grace_scratch *s = g->s;
	if (!s || kv->n_layer != g->n_layer || kv->n_kv_head != g->n_kv_head ||
	    kv->group != g->group || kv->head_dim != g->head_dim || kv->cap > g->cap ||
	    kv->stat_bytes != g->stat_bytes)
		return rt_err_set(err, "gracekv: KV store shape differs from the one rt_grace_init sized");
	const int LG = g->n_layer * g->n_kv_head, d = g->head_dim;
	const int32_t C = g->cap;
	const int32_t n = kv->heads[0].n;
	const rt_kv_head *h0 = &kv->heads[0];
	for (int lg = 0; lg < LG; lg++) {
		const rt_kv_head *h = &kv->heads[lg];
		if (h->n != n)
			return rt_err_set(err, "gracekv: head (%d, %d) holds %d entries, head (0, 0) holds %d",
			                  lg / g->n_kv_head, lg % g->n_kv_head, (int)h->n, (int)n);
		for (int32_t i = 0; i < n; i++) {
			if (h->pos[i] != h0->pos[i] || (i > 0 && h->pos[i] <= h->pos[i - 1]))
				return rt_err_set(err, "gracekv: head (%d, %d) entry %d: positions differ between heads or do not increase",
				                  lg / g->n_kv_head, lg % g->n_kv_head, (int)i);
			if (h->count[i] != 1.0f)
				return rt_err_set(err, "gracekv: head (%d, %d) entry %d is merged (count %g); compression is one-shot after prefill",
				                  lg / g->n_kv_head, lg % g->n_kv_head, (int)i, (double)h->count[i]);
		}
	}
	if (!(p->x >= 1.0) || !isfinite(p->x))
		return rt_err_set(err, "gracekv: compression factor %g must be a finite number >= 1", p->x);
	if (p->recent < 0 || p->floor < 0 || p->seg_len < 1 || p->hops < 0 || p->hop_seeds < 0)
		return rt_err_set(err, "gracekv: negative recent/floor/hops or segment length < 1");
	if ((p->key_mode != RT_GRACE_KEY_UNROPE && p->key_mode != RT_GRACE_KEY_POST) ||
	    (p->count_mode != RT_GRACE_COUNT_COHERENCE && p->count_mode != RT_GRACE_COUNT_N))
		return rt_err_set(err, "gracekv: unknown key mode %d or count mode %d", p->key_mode,
		                  p->count_mode);
	if (in->prefix < 0 || in->suffix < 0 || (int64_t)in->prefix + in->suffix > n)
		return rt_err_set(err, "gracekv: prefix %d + suffix %d exceed the %d entries", (int)in->prefix,
		                  (int)in->suffix, (int)n);
	if (in->n_probe < 0 || in->n_probe > g->max_probe || (in->probe_q && in->n_probe == 0))
		return rt_err_set(err, "gracekv: %d probe tokens (scratch sized for %d)", (int)in->n_probe,
		                  (int)g->max_probe);
	const int32_t ctx_b = in->prefix, ctx_e = n - in->suffix;
	if (in->seg_start) {
		if (in->n_seg < 1 || in->seg_start[0] != ctx_b)
			return rt_err_set(err, "gracekv: segments must start at the prefix end %d", (int)ctx_b);
		for (int32_t i = 1; i < in->n_seg; i++)
			if (in->seg_start[i] <= in->seg_start[i - 1] || in->seg_start[i] >= ctx_e)
				return rt_err_set(err, "gracekv: segment %d starts at %d (must increase, below %d)",
				                  (int)i, (int)in->seg_start[i], (int)ctx_e);
	}
	/* budget (section 9.2 [S]) */
	const int64_t n_ctx = ctx_e - ctx_b;
	const int64_t r_eff = p->recent < n_ctx ? p->recent : n_ctx;
	const int64_t b_total = (int64_t)floor((double)LG * (double)n_ctx / p->x);
	const int64_t b_recent = (int64_t)LG * r_eff;
	if (b_recent > b_total)
		return rt_err_set(err, "gracekv: the recent window (%d tokens × %d heads = %lld entries) exceeds the budget of %lld entries at x = %g",
		                  (int)r_eff, LG, (long long)b_recent, (long long)b_total, p->x);
	const int32_t tree_e = ctx_e - (int32_t)r_eff;
	/* pinned entries of the tree region (protected spans inside the context): exact and
	 * charged before the floor [D] */
	int64_t n_pin = 0;
	if (in->pin)
		for (int32_t t = ctx_b; t < tree_e; t++)
			n_pin += in->pin[t] != 0;
	const int64_t b_pin = (int64_t)LG * n_pin;
	if (b_recent + b_pin > b_total)
		return rt_err_set(err, "gracekv: the recent window and the pinned entries (%lld + %lld entries) exceed the budget of %lld entries at x = %g",
		                  (long long)b_recent, (long long)b_pin, (long long)b_total, p->x);
	int64_t b_floor = p->floor;
	if (b_floor > b_total - b_recent - b_pin)
		b_floor = b_total - b_recent - b_pin;
	if (b_floor > (int64_t)LG * (tree_e - ctx_b - n_pin))
		b_floor = (int64_t)LG * (tree_e - ctx_b - n_pin);
	const int64_t b_alloc = b_total - b_recent - b_pin - b_floor;
	s->kv = kv;
	s->p = p;
	s->in = in;
	s->n = n;
	s->n_nodes = 0;
	s->n_acts = 0;
	if (g->n_rot > 0)
		rope_table(s->cs, kv->heads[0].pos, n, g->n_rot, g->rope_base);

	relevance(g, ctx_b, ctx_e);

	/* singleton floor: the highest ω·R tokens of the tree region over all heads */
	memset(s->isfloor, 0, (size_t)LG * C);
	if (n_pin > 0)
		for (int lg = 0; lg < LG; lg++)
			for (int32_t t = ctx_b; t < tree_e; t++)
				s->isfloor[(size_t)lg * C + t] = in->pin[t] != 0;
	if (b_floor > 0 && p->floor_each) {
		/* per head [D]: each head its own b_floor / LG best tokens (the remainder to the
		 * lowest heads), so a head with peaked relevance cannot take another's floor */
		for (int lg = 0; lg < LG; lg++) {
			int64_t q = b_floor / LG + (lg < b_floor % LG);
			int64_t nf = 0;
			for (int32_t t = ctx_b; t < tree_e; t++)
				if (!s->isfloor[(size_t)lg * C + t])
					s->fc[nf++] = (fcand){ (float)(omega_of(g, lg) * s->R[(size_t)lg * C + t]), lg, t };
			qsort(s->fc, (size_t)nf, sizeof(fcand), cmp_fcand);
			for (int64_t i = 0; i < q && i < nf; i++)
				s->isfloor[(size_t)lg * C + s->fc[i].e] = 1;
		}
	} else if (b_floor > 0) {
		int64_t nf = 0;
		for (int lg = 0; lg < LG; lg++)
			for (int32_t t = ctx_b; t < tree_e; t++)
				if (!s->isfloor[(size_t)lg * C + t])
					s->fc[nf++] = (fcand){ (float)(omega_of(g, lg) * s->R[(size_t)lg * C + t]), lg, t };
		qsort(s->fc, (size_t)nf, sizeof(fcand), cmp_fcand);
		for (int64_t i = 0; i < b_floor && i < nf; i++)
			s->isfloor[(size_t)s->fc[i].lg * C + s->fc[i].e] = 1;
	}
	/* members and segment ranges per head */
	for (int lg = 0; lg < LG; lg++) {
		int32_t *mem = s->mem + (size_t)lg * C, *sb = s->segb + (size_t)lg * (C + 1);
		int32_t nm = 0, ns = 0, si = 0;
		for (int32_t t = ctx_b; t < tree_e; t++) {
			int32_t st0 = in->seg_start ? -1 : ctx_b + ((t - ctx_b) / p->seg_len) * p->seg_len;
			if (in->seg_start) {
				while (si + 1 < in->n_seg && in->seg_start[si + 1] <= t)
					si++;
				st0 = in->seg_start[si];
			}
			if (s->isfloor[(size_t)lg * C + t])
				continue;
			/* a new segment starts when this member's segment differs from the last one's */
			if (nm == 0 || st0 > mem[nm - 1])
				sb[ns++] = nm;
			mem[nm++] = t;
		}
		sb[ns] = nm;
		s->nmem[lg] = nm;
		s->nseg[lg] = ns;
	}
	/* roots: one Add per (layer, KV head, segment); with a coverage floor each head
	 * first spends its share on its own best actions (own heap), then all compete */
	rt_grace_heap hp = { s->heap, 0, (int32_t)(3 * (int64_t)LG * C) };
	int64_t left = b_alloc;
	struct counts cnt = { 0, 0, 0 };
	const int64_t share = p->head_share > 0.0 ?
	                      (int64_t)floor((p->head_share > 1.0 ? 1.0 : p->head_share) *
	                                     (double)b_alloc / LG) : 0;
	for (int lg = 0; lg < LG; lg++) {
		const int32_t *sb = s->segb + (size_t)lg * (C + 1);
		rt_grace_heap lh = { s->lheap, 0, 3 * C };
		rt_grace_heap *th = share > 0 ? &lh : &hp;
		for (int32_t k = 0; k < s->nseg[lg]; k++) {
			double D = 0.0, Dd = 0.0;
			eval_range(g, lg, sb[k], sb[k + 1], &D, &Dd);
			int32_t ni = new_node(g, lg, sb[k], sb[k + 1], D);
			s->nodes[ni].frontier = 0;
			s->nodes[ni].Ddrop = Dd;
			gact *ac = &s->acts[s->n_acts];
			memset(ac, 0, sizeof *ac);
			ac->node = ni;
			ac->kind = ACT_ADD;
			ac->cost = 1;
			ac->delta = omega_of(g, lg) * s->nodes[ni].R * (Dd - D);
			push_act(g, th, (int32_t)s->n_acts++, ac->delta);
		}
		s->hspent[lg] = 0;
		if (share > 0) {
			int64_t mine = share < left ? share : left;
			int64_t before = mine;
			compete(g, &lh, &mine, &cnt);
			s->hspent[lg] = before - mine;
			left -= before - mine;
			rt_grace_item it;
			while (rt_grace_heap_pop(&lh, &it))
				rt_grace_heap_push(&hp, &it);
		}
	}
	/* the competition (section 9.6 [S]) */
	compete(g, &hp, &left, &cnt);
	const int64_t adds = cnt.adds, sbin = cnt.sbin, ssal = cnt.ssal;
	/* materialise: each head's frontier + exact entries, in position order */
	for (size_t i = 0; i < (size_t)LG * C; i++)
		s->owner[i] = -1;
	for (int64_t i = 0; i < s->n_nodes; i++) {
		const gnode *nd = &s->nodes[i];
		if (nd->frontier)
			for (int32_t j = nd->a; j < nd->b; j++)
				s->owner[(size_t)nd->lg * C + j] = (int32_t)i;
	}
	const size_t sbytes = kv->stat_bytes;
	int64_t protos = 0, entries = 0;
	for (int lg = 0; lg < LG; lg++) {
		rt_kv_head *h = &kv->heads[lg];
		const int32_t *mem = s->mem + (size_t)lg * C;
		int32_t out = 0, j = 0;
		for (int32_t t = 0; t < n; t++) {
			int exact = t < ctx_b || t >= tree_e || s->isfloor[(size_t)lg * C + t];
			int32_t ow = -1;
			if (!exact) {
				RT_ASSERT(j < s->nmem[lg] && mem[j] == t);
				ow = s->owner[(size_t)lg * C + j];
				if (ow < 0 || s->nodes[ow].a != j) {
					j++;
					continue; /* dropped, or inside a prototype already written */
				}
				exact = s->nodes[ow].b - s->nodes[ow].a == 1;
				j++;
			}
			float *ko = s->sk + (size_t)out * d, *vo = s->sv + (size_t)out * d;
			if (exact) {
				memcpy(ko, h->k + (size_t)t * d, (size_t)d * sizeof(float));
				memcpy(vo, h->v + (size_t)t * d, (size_t)d * sizeof(float));
				s->spos[out] = h->pos[t];
				s->scnt[out] = h->count[t];
				s->slc[out] = h->log_count[t];
				s->sspan[out] = h->span[t];
				if (sbytes)
					memcpy(s->sstat + (size_t)out * sbytes, h->stats + (size_t)t * sbytes, sbytes);
			} else {
				const gnode *nd = &s->nodes[ow];
				float m;
				prototype(h->k, h->v, h->pos, s->R + (size_t)lg * C, mem + nd->a, nd->b - nd->a,
				          d, g->n_rot, g->rope_base, g->n_rot > 0 ? s->cs : NULL, p->key_mode,
				          p->count_mode, ko, vo,
				          &s->spos[out], &m, NULL, s->dwork);
				s->scnt[out] = m;
				s->slc[out] = logf(m);
				s->sspan[out] = 0;
				if (sbytes)
					memset(s->sstat + (size_t)out * sbytes, 0, sbytes);
				protos++;
			}
			s->ord[out] = (ordk){ s->spos[out], t, out };
			out++;
		}
		qsort(s->ord, (size_t)out, sizeof(ordk), cmp_ord);
		for (int32_t i = 0; i < out; i++) {
			int32_t sl = s->ord[i].slot;
			memcpy(h->k + (size_t)i * d, s->sk + (size_t)sl * d, (size_t)d * sizeof(float));
			memcpy(h->v + (size_t)i * d, s->sv + (size_t)sl * d, (size_t)d * sizeof(float));
			h->pos[i] = s->spos[sl];
			h->count[i] = s->scnt[sl];
			h->log_count[i] = s->slc[sl];
			h->span[i] = s->sspan[sl];
			if (sbytes)
				memcpy(h->stats + (size_t)i * sbytes, s->sstat + (size_t)sl * sbytes, sbytes);
		}
		h->n = out;
		entries += out;
	}
	if (st) {
		st->n_ctx = n_ctx;
		st->b_total = b_total;
		st->b_recent = b_recent;
		st->b_floor = b_floor;
		st->b_pin = b_pin;
		st->b_alloc = b_alloc;
		st->spent = b_alloc - left;
		st->adds = adds;
		st->splits_binary = sbin;
		st->splits_salient = ssal;
		st->prototypes = protos;
		st->entries = entries;
	}
	return 0;
}
