/*
 * kvp_fmt: prints a parsed .kvp tree in canonical form (rules in kvp_fmt.h). The tree
 * holds no comments, so they are woven back in by source offset: every comment is
 * emitted exactly once, either at the end of the line of the statement it follows, or
 * on its own line before the next statement (or before the closing brace / after it).
 */
#include "kvp_fmt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct out {
	FILE *f;
	const kvp_file *file;
	int ci;            /* next comment to emit */
	uint32_t prev_end; /* source offset where the last emitted item ended */
	int first_in_block; /* no blank line before the next item */
} out;

/* precedence of an expression node (higher binds tighter) */
static int prec(const kvp_expr *e)
{
	if (e->kind == KVP_E_BINARY) {
		switch (e->op) {
		case KVP_ASTOP_OR: return 1;
		case KVP_ASTOP_AND: return 2;
		case KVP_ASTOP_ADD:
		case KVP_ASTOP_SUB: return 5;
		case KVP_ASTOP_MUL:
		case KVP_ASTOP_DIV: return 6;
		default: return 4; /* comparisons */
		}
	}
	if (e->kind == KVP_E_UNARY)
		return e->op == KVP_ASTOP_NOT ? 3 : 7;
	return 8;
}

static void put_expr(FILE *f, const kvp_expr *e, int min_prec);

static void put_args(FILE *f, kvp_expr **args, int n)
{
	for (int i = 0; i < n; i++) {
		if (i)
			fputs(", ", f);
		put_expr(f, args[i], 0);
	}
}

static void put_num(FILE *f, const kvp_expr *e)
{
	fputs(e->text, f);
	int one = strcmp(e->text, "1") == 0;
	switch (e->unit) {
	case KVP_LIT_PERCENT: fputc('%', f); break;
	case KVP_LIT_ENTRIES: fputs(one ? " entry" : " entries", f); break;
	case KVP_LIT_TOKENS: fputs(one ? " token" : " tokens", f); break;
	case KVP_LIT_STEPS: fputs(one ? " step" : " steps", f); break;
	default: break;
	}
}

static void put_expr(FILE *f, const kvp_expr *e, int min_prec)
{
	int p = prec(e);
	int paren = p < min_prec;
	if (paren)
		fputc('(', f);
	switch (e->kind) {
	case KVP_E_NUM:
		put_num(f, e);
		break;
	case KVP_E_NAME:
		fputs(e->name, f);
		break;
	case KVP_E_CALL:
		fprintf(f, "%s(", e->name);
		put_args(f, e->args, e->n_args);
		fputc(')', f);
		break;
	case KVP_E_ARG:
		fprintf(f, "%s = ", e->name);
		put_expr(f, e->a, 0);
		break;
	case KVP_E_UNARY:
		if (e->op == KVP_ASTOP_NOT) {
			fputs("not ", f);
			put_expr(f, e->a, 3);
		} else {
			fputc('-', f);
			put_expr(f, e->a, 7);
		}
		break;
	case KVP_E_BINARY: {
		int cmp = p == 4;
		put_expr(f, e->a, cmp ? p + 1 : p);
		fprintf(f, " %s ", kvp_op_text(e->op));
		put_expr(f, e->b, p + 1);
		break;
	}
	case KVP_E_LIST:
		fputc('[', f);
		put_args(f, e->args, e->n_args);
		fputc(']', f);
		break;
	case KVP_E_BUDGET:
		fputs("budget", f);
		break;
	case KVP_E_ENTRIES:
		fputs("entries", f);
		break;
	case KVP_E_STR:
		fprintf(f, "\"%s\"", e->name);
		break;
	}
	if (paren)
		fputc(')', f);
}

/* what put(f, arg) writes, as a malloc'ed string (the caller frees it); NULL when no
 * memory stream can be opened */
static char *fmt_to_string(void (*put)(FILE *f, const void *arg), const void *arg)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	put(f, arg);
	fclose(f);
	return buf;
}

static void put_top_expr(FILE *f, const void *e)
{
	put_expr(f, e, 0);
}

char *kvp_fmt_expr(const kvp_expr *e)
{
	return fmt_to_string(put_top_expr, e);
}

static void put_stmt(FILE *f, const kvp_stmt *s)
{
	switch (s->kind) {
	case KVP_S_PARAM:
	case KVP_S_CONST:
	case KVP_S_STAT:
		fprintf(f, "%s %s = ",
		        s->kind == KVP_S_PARAM ? "param" : s->kind == KVP_S_CONST ? "const" : "stat",
		        s->name);
		put_expr(f, s->value, 0);
		if (s->kind == KVP_S_STAT) {
			if (s->window == KVP_W_ALL) {
				fputs(" over all", f);
			} else if (s->window == KVP_W_LAST) {
				fputs(" over last ", f);
				put_expr(f, s->window_len, 0);
			} else if (s->window == KVP_W_PROMPT_TAIL) {
				fputs(" over prompt tail ", f);
				put_expr(f, s->window_len, 0);
			}
		}
		break;
	case KVP_S_SETTING:
		fprintf(f, "%s = ", kvp_setting_text(s->setting));
		put_expr(f, s->value, 0);
		if (s->target) {
			fprintf(f, " %s ", s->words[0].s);
			put_expr(f, s->target, 0);
		}
		break;
	case KVP_S_GROUP:
		fprintf(f, "group = %s", s->words[0].s);
		for (int i = 1; i < s->n_words; i++) {
			if (s->words[i].tag == KVP_WORD_OVER)
				fprintf(f, " over %s", s->words[i].s);
			else
				fprintf(f, " %s pool", s->words[i].s);
		}
		break;
	case KVP_S_KEEP:
		fprintf(f, "keep %s", s->words[0].s);
		if (s->value) {
			fputc(' ', f);
			put_expr(f, s->value, 0);
		}
		if (s->window == KVP_W_ALL)
			fputs(" over all", f);
		break;
	case KVP_S_COMPRESS:
		fputs("compress ", f);
		switch (s->trigger) {
		case KVP_T_EVERY_STEP: fputs("every step", f); break;
		case KVP_T_EVERY:
			fputs("every ", f);
			put_expr(f, s->value, 0);
			break;
		case KVP_T_WHEN:
			fputs("when ", f);
			put_expr(f, s->value, 0);
			break;
		case KVP_T_AT: fprintf(f, "at prompt %s", s->words[0].s); break;
		case KVP_T_PER:
			fprintf(f, "per %s%s ", s->n_words > 1 ? "prompt " : "", s->words[0].s);
			put_expr(f, s->value, 0);
			break;
		}
		if (s->target) {
			fputs(" to ", f);
			put_expr(f, s->target, 0);
		}
		break;
	}
}

/* newlines in the source between offsets a and b */
static int newlines(const kvp_file *file, uint32_t a, uint32_t b)
{
	int n = 0;
	for (uint32_t i = a; i < b && i < file->src->len; i++)
		n += file->src->text[i] == '\n';
	return n;
}

/* a blank line before an item starting at off, when the source had one */
static void blank_before(out *o, uint32_t off)
{
	if (!o->first_in_block && newlines(o->file, o->prev_end, off) >= 2)
		fputc('\n', o->f);
	o->first_in_block = 0;
}

/* every not yet emitted comment that starts before off, each on its own line */
static void own_line_comments(out *o, uint32_t off, const char *indent)
{
	const kvp_file *file = o->file;
	while (o->ci < file->n_comments && file->comments[o->ci].loc.off < off) {
		const kvp_comment *c = &file->comments[o->ci++];
		blank_before(o, c->loc.off);
		fprintf(o->f, "%s%s\n", indent, c->text);
		o->prev_end = c->loc.end;
	}
}

/* end the current line, with the comment that follows on the same source line (before
 * offset limit) if there is one */
static void end_line(out *o, uint32_t end, uint32_t limit)
{
	const kvp_file *file = o->file;
	int line, col;
	kvp_src_pos(file->src, end, &line, &col);
	o->prev_end = end;
	if (o->ci < file->n_comments) {
		const kvp_comment *c = &file->comments[o->ci];
		if (c->loc.off < limit && !c->own_line && c->loc.line == line) {
			fprintf(o->f, "  %s", c->text);
			o->prev_end = c->loc.end;
			o->ci++;
		}
	}
	fputc('\n', o->f);
}

static void put_file(FILE *f, const void *arg)
{
	const kvp_file *file = arg;
	out o = { f, file, 0, 0, 1 };
	own_line_comments(&o, file->loc.off, "");
	blank_before(&o, file->loc.off);
	fprintf(f, "policy %s {", file->name);
	uint32_t rbrace = file->loc.end ? file->loc.end - 1 : 0;
	uint32_t first = file->n_stmts ? file->stmts[0]->loc.off : rbrace;
	end_line(&o, file->lbrace.end, first);
	o.first_in_block = 1;
	for (int i = 0; i < file->n_stmts; i++) {
		const kvp_stmt *s = file->stmts[i];
		uint32_t next = i + 1 < file->n_stmts ? file->stmts[i + 1]->loc.off : rbrace;
		/* comments before the statement and inside it go before it */
		own_line_comments(&o, s->loc.end, "    ");
		blank_before(&o, s->loc.off);
		fputs("    ", f);
		put_stmt(f, s);
		end_line(&o, s->loc.end, next);
	}
	o.first_in_block = 1; /* comments before '}' keep their blank lines, not '}' itself */
	if (o.ci < file->n_comments && file->comments[o.ci].loc.off < rbrace)
		o.first_in_block = file->n_stmts == 0;
	own_line_comments(&o, rbrace, "    ");
	fputc('}', f);
	end_line(&o, file->loc.end, (uint32_t)file->src->len + 1);
	own_line_comments(&o, (uint32_t)file->src->len + 1, "");
}

char *kvp_fmt_file(const kvp_file *file)
{
	return fmt_to_string(put_file, file);
}

char *kvp_fmt_src(kvp_src *src)
{
	kvp_file *f = kvp_parse(src);
	char *text = NULL;
	if (src->n_errors == 0 && f->name)
		text = kvp_fmt_file(f);
	kvp_file_free(f);
	return text;
}
