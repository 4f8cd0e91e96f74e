/*
 * rt_cmd_tokenize: `tokenize` — the token ids of a text; the man page is help_tokenize
 * below.
 */
#include "cli/rt_cmd.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/rt_cli_input.h"
#include "cli/rt_cli_opts.h"

static const char *const help_tokenize =
	"NAME\n"
	"    {prog} tokenize - print the token ids of a text\n"
	"\n"
	"SYNOPSIS\n"
	"    {prog} tokenize --model MODEL --text FILE [--special]\n"
	"\n"
	"DESCRIPTION\n"
	"    Reads FILE (UTF-8), tokenizes it with MODEL's tokenizer as a prompt (the file's\n"
	"    BOS first when tokenizer.ggml.add_bos_token says so, as llama-tokenize does:\n"
	"    Gemma, Llama, Mistral; SmolLM2 and Qwen add none) and prints the ids on one\n"
	"    line, separated by spaces. Only the tokenizer metadata of MODEL is read; the\n"
	"    weights are not loaded.\n"
	"\n"
	"OPTIONS\n"
	"    -m, --model MODEL  GGUF model file\n"
	"    -t, --text FILE    text to tokenize; must be valid UTF-8\n"
	"    --special          map control-token text such as <|im_start|> to its id\n"
	"                       (default: treat it as plain text)\n"
	"    -h, --help         show this text\n"
	"\n"
	"EXIT STATUS\n"
	"    0 success, 1 runtime error, 2 usage error.\n";

int rt_cmd_tokenize(int argc, char **argv)
{
	static const int opt_ids[] = { 'm', 't', O_SPECIAL, 0 };
	rt_cli_opts o = { 0 };
	int rc = rt_cli_parse("tokenize", help_tokenize, argc, argv, &o, opt_ids,
	                      RT_CLI_NEED_MODEL | RT_CLI_NEED_TEXT);
	if (rc != RT_CLI_GO)
		return rc;
	size_t len;
	char *text = rt_cli_read_text(o.text, &len);
	if (!text)
		return EXIT_FAILURE;
	rt_gguf *g = NULL;
	rt_tokenizer *tk = NULL;
	int32_t *ids = NULL;
	int64_t n = 0;
	rc = EXIT_FAILURE;
	if (rt_cli_open_model(o.model, &o, &g, &tk, NULL) == 0 &&
	    (ids = rt_cli_tokenize(tk, o.text, text, len, o.special, &n))) {
		for (int64_t i = 0; i < n; i++)
			printf(i ? " %d" : "%d", (int)ids[i]);
		putchar('\n');
		rc = fflush(stdout) == 0 ? 0 : EXIT_FAILURE;
	}
	free(ids);
	rt_tokenizer_free(tk);
	rt_gguf_close(g);
	free(text);
	return rc;
}

