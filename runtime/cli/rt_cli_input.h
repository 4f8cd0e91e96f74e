/*
 * rt_cli_input: the command line's input helpers. Every function prints its own error
 * ("PROG: PATH: reason") and returns NULL / -1, so a command only chooses its exit status.
 */
#ifndef RT_CLI_INPUT_H
#define RT_CLI_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include "cli/rt_cli_opts.h"
#include "model/rt_gguf.h"
#include "model/rt_model.h"
#include "model/rt_tokenizer.h"

/* Read a text with the one text loader (base/rt_text: a regular file under its size cap,
 * valid UTF-8; caller frees; *len its bytes), or NULL. */
char *rt_cli_read_text(const char *path, size_t *len);

/* Tokenize s[0..len) as a prompt (the file's BOS first when it adds one:
 * rt_tokenize_prompt; special: map control-token text to its id) into a heap array of *n
 * ids (caller frees), or NULL; what names the text in messages. */
int32_t *rt_cli_tokenize(const rt_tokenizer *tk, const char *what, const char *s, size_t len,
                         int special, int64_t *n);

/* Open the GGUF file path into *g and, when tk / m are not NULL, its tokenizer and the
 * model on the path o->exact asks for with o->threads threads (the fast path defaults to
 * every online core). Returns 0 or -1 (the caller closes *g and frees what was made). */
int rt_cli_open_model(const char *path, const rt_cli_opts *o, rt_gguf **g, rt_tokenizer **tk,
                      rt_model **m);

/* BLAS threads from --threads (t > 0), else left as OPENBLAS_NUM_THREADS says. */
void rt_cli_threads(long t);

/* Hex SHA-256 of a file into out[65]; out = "" when it cannot be read (then omitted). */
void rt_cli_file_sha256(const char *path, char out[65]);

/* Hex SHA-256 of p[0..n) into out[65]. */
void rt_cli_buf_sha256(const void *p, size_t n, char out[65]);

/* What ppl and keepmap work on: the model of --model, its tokenizer and the tokens of the
 * text. Zero-initialise; rt_cli_text_model_free frees what was made. */
typedef struct rt_cli_text_model {
	rt_tokenizer *tk;
	rt_model *m;
	int32_t *ids;   /* [n] the text's tokens */
	int64_t n;
	int64_t use;    /* min(n, --ctx or the model's context_length): the tokens fed */
} rt_cli_text_model;

/* Open --model into tm and tokenize the text (len bytes). Returns 0, or -1 after printing
 * the error with *rc the exit status (usage error: --ctx beyond the model's
 * context_length, --prompt beyond the tokens fed); tm holds what was made either way. */
int rt_cli_open_text_model(const rt_cli_opts *o, const char *text, size_t len,
                           rt_cli_text_model *tm, int *rc);
void rt_cli_text_model_free(rt_cli_text_model *tm);

#endif
