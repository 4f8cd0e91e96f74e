/*
 * rt_cli_input: what the commands read before any model work — texts, models, tokens,
 * thread counts, the SHA-256 of the inputs for the JSON records; see rt_cli_input.h.
 */
#include "cli/rt_cli_input.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rt_sha256.h"
#include "base/rt_text.h"
#include "cli/rt_cli_opts.h"

char *rt_cli_read_text(const char *path, size_t *len)
{
	rt_err err = { "" };
	char *s = rt_text_read(path, len, &err);
	if (!s)
		rt_cli_fail(&err);
	return s;
}

int32_t *rt_cli_tokenize(const rt_tokenizer *tk, const char *what, const char *s, size_t len,
                             int special, int64_t *n)
{
	rt_err err = { "" };
	int64_t cnt = rt_tokenize_prompt(tk, s, len, special, NULL, 0, &err);
	if (cnt < 0) {
		fprintf(stderr, "%s: %s: %s\n", rt_cli_prog, what, err.msg);
		return NULL;
	}
	int32_t *ids = malloc((size_t)(cnt ? cnt : 1) * sizeof *ids);
	if (!ids) {
		fprintf(stderr, "%s: %s: out of memory for %lld tokens\n", rt_cli_prog, what, (long long)cnt);
		return NULL;
	}
	if (rt_tokenize_prompt(tk, s, len, special, ids, cnt, &err) != cnt) {
		fprintf(stderr, "%s: %s: %s\n", rt_cli_prog, what,
		        err.msg[0] ? err.msg : "tokenizer count changed");
		free(ids);
		return NULL;
	}
	*n = cnt;
	return ids;
}

/* Threads when --threads is not given: the exact path keeps OpenBLAS's own default
 * (OPENBLAS_NUM_THREADS or every core), the fast path takes every online core. */
static int default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

int rt_cli_open_model(const char *path, const rt_cli_opts *o, rt_gguf **g, rt_tokenizer **tk,
                      rt_model **m)
{
	rt_err err = { "" };
	*g = rt_gguf_open(path, &err);
	if (!*g)
		return rt_cli_fail(&err), -1;
	if (tk && !(*tk = rt_tokenizer_init(*g, &err)))
		return rt_cli_fail(&err), -1;
	if (!m)
		return 0;
	rt_model_opts mo = { .exact = o->exact, .threads = o->threads > 0 ? (int)o->threads : 0,
		             .kv_type = rt_cli_kv_type(o), .f32_act = o->f32_act };
	if (!o->exact && o->threads <= 0)
		mo.threads = default_threads();
	if (!(*m = rt_model_load_opts(*g, &mo, &err)))
		return rt_cli_fail(&err), -1;
	return 0;
}

void rt_cli_threads(long t)
{
	if (t > 0)
		openblas_set_num_threads((int)t);
}


/* Hex SHA-256 of a file into out[65]; out = "" when it cannot be read (then omitted). */
void rt_cli_file_sha256(const char *path, char out[65])
{
	rt_err err = { "" };
	if (rt_sha256_file(path, out, &err) != 0)
		out[0] = 0;
}

void rt_cli_buf_sha256(const void *p, size_t n, char out[65])
{
	rt_sha256 c;
	rt_sha256_init(&c);
	rt_sha256_update(&c, p, n);
	rt_sha256_hex(&c, out);
}

/* The model of --model and the tokens of the text (len bytes) for ppl and keepmap: *n
 * tokens in *ids (caller frees), *use = min(n, --ctx or the model's context_length). Returns
 * 0, or -1 after printing the error with *rc the exit status (usage error: --ctx beyond the
 * model's context_length, --prompt beyond the tokens fed). */
int rt_cli_open_text_model(const rt_cli_opts *o, const char *text, size_t len,
                           rt_cli_text_model *tm, int *rc)
{
	rt_gguf *g = NULL;
	*rc = EXIT_FAILURE;
	if (rt_cli_open_model(o->model, o, &g, &tm->tk, &tm->m) < 0) {
		rt_gguf_close(g);
		return -1;
	}
	rt_gguf_close(g);
	if (o->ctx > tm->m->hp.n_ctx) {
		fprintf(stderr, "%s: %s: --ctx %ld exceeds the model's context_length %d\n", rt_cli_prog,
		        o->model, o->ctx, (int)tm->m->hp.n_ctx);
		*rc = RT_CLI_USAGE;
		return -1;
	}
	if (!(tm->ids = rt_cli_tokenize(tm->tk, o->text, text, len, 0, &tm->n)))
		return -1;
	tm->use = o->ctx ? o->ctx : tm->m->hp.n_ctx;
	if (tm->use > tm->n)
		tm->use = tm->n;
	/* a prompt longer than what is fed would size a ratio budget on tokens that never
	 * come (and a prompt-end trigger would never fire) */
	if (o->prompt_len > tm->use) {
		fprintf(stderr, "%s: --prompt %ld: only %lld tokens are fed (%s); the prompt is at "
		        "most that\n", rt_cli_prog, o->prompt_len, (long long)tm->use,
		        tm->use == tm->n ? "the whole text" : "--ctx, or the model's context_length");
		*rc = RT_CLI_USAGE;
		return -1;
	}
	return 0;
}

void rt_cli_text_model_free(rt_cli_text_model *tm)
{
	free(tm->ids);
	rt_model_free(tm->m);
	rt_tokenizer_free(tm->tk);
	*tm = (rt_cli_text_model){ 0 };
}

