/*
 * kvp_ast: arena, node constructors and spellings for the .kvp syntax tree (kvp_ast.h).
 * Constructors compute each expression's depth so the parser can refuse trees deeper
 * than KVP_MAX_DEPTH before any recursive pass walks them.
 */
#include "kvp_ast.h"

/* the generated parser and scanner headers (build/gen) */
#include "kvp.tab.h"
#define YYSTYPE KVP_YYSTYPE
#define YYLTYPE KVP_YYLTYPE
#include "kvp.lex.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvp_arena_block {
	kvp_arena_block *next;
	size_t used, cap;
	_Alignas(16) unsigned char data[];
};

#define ARENA_BLOCK (64u << 10)

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "kvpc: out of memory (%zu bytes)\n", n);
		abort();
	}
	return p;
}

void *kvp_grow(void *items, int *cap, int first, size_t elem)
{
	*cap = *cap ? 2 * *cap : first;
	void *p = realloc(items, elem * (size_t)*cap);
	if (!p) {
		fprintf(stderr, "kvpc: out of memory\n");
		abort();
	}
	return p;
}

void *kvp_arena_alloc(kvp_arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	kvp_arena_block *b = a->head;
	if (!b || b->cap - b->used < n) {
		size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
		b = xmalloc(sizeof *b + cap);
		b->cap = cap;
		b->used = 0;
		b->next = a->head;
		a->head = b;
	}
	void *p = b->data + b->used;
	b->used += n;
	memset(p, 0, n);
	return p;
}

char *kvp_arena_strndup(kvp_arena *a, const char *s, size_t n)
{
	char *d = kvp_arena_alloc(a, n + 1);
	memcpy(d, s, n);
	d[n] = '\0';
	return d;
}

void kvp_arena_free(kvp_arena *a)
{
	kvp_arena_block *b = a->head;
	while (b) {
		kvp_arena_block *next = b->next;
		free(b);
		b = next;
	}
	a->head = NULL;
}

kvp_file *kvp_parse(kvp_src *src)
{
	kvp_arena arena = {0};
	kvp_file *f = kvp_arena_alloc(&arena, sizeof *f);
	f->arena = arena;
	f->src = src;
	if (kvp_src_check_bytes(src) != 0)
		return f;
	struct kvp_parse ps;
	memset(&ps, 0, sizeof ps);
	ps.src = src;
	ps.f = f;
	yyscan_t scanner;
	if (kvp_yylex_init_extra(&ps, &scanner) != 0) {
		fprintf(stderr, "kvpc: cannot initialise the scanner\n");
		abort();
	}
	YY_BUFFER_STATE buf = kvp_yy_scan_bytes(src->text, (int)src->len, scanner);
	kvp_yyparse(scanner, &ps);
	kvp_yy_delete_buffer(buf, scanner);
	kvp_yylex_destroy(scanner);
	return f;
}

void kvp_file_free(kvp_file *f)
{
	if (!f)
		return;
	free(f->comments);
	kvp_arena arena = f->arena;
	kvp_arena_free(&arena); /* f itself lives in the arena */
}

/* ---- expressions ---------------------------------------------------------------- */

static kvp_expr *expr_new(kvp_file *f, kvp_expr_kind kind, kvp_srcloc loc)
{
	kvp_expr *e = kvp_arena_alloc(&f->arena, sizeof *e);
	e->kind = kind;
	e->loc = loc;
	e->depth = 1;
	return e;
}

static int deeper(int d, const kvp_expr *e)
{
	return e && e->depth + 1 > d ? e->depth + 1 : d;
}

kvp_expr *kvp_expr_num(kvp_file *f, kvp_srcloc loc, double v, kvp_unit_lit unit,
                       const char *text)
{
	kvp_expr *e = expr_new(f, KVP_E_NUM, loc);
	e->num = v;
	e->unit = unit;
	e->text = text;
	return e;
}

kvp_expr *kvp_expr_name(kvp_file *f, kvp_srcloc loc, const char *name)
{
	kvp_expr *e = expr_new(f, KVP_E_NAME, loc);
	e->name = name;
	e->name_loc = loc;
	return e;
}

kvp_expr *kvp_expr_keyword(kvp_file *f, kvp_srcloc loc, kvp_expr_kind kind)
{
	return expr_new(f, kind, loc);
}

kvp_expr *kvp_expr_str(kvp_file *f, kvp_srcloc loc, const char *text)
{
	kvp_expr *e = expr_new(f, KVP_E_STR, loc);
	e->name = text;
	e->name_loc = loc;
	return e;
}

kvp_expr *kvp_expr_unary(kvp_file *f, kvp_srcloc loc, kvp_op op, kvp_expr *a)
{
	kvp_expr *e = expr_new(f, KVP_E_UNARY, loc);
	e->op = op;
	e->a = a;
	e->depth = deeper(1, a);
	return e;
}

kvp_expr *kvp_expr_binary(kvp_file *f, kvp_srcloc loc, kvp_op op, kvp_expr *a, kvp_expr *b)
{
	kvp_expr *e = expr_new(f, KVP_E_BINARY, loc);
	e->op = op;
	e->a = a;
	e->b = b;
	e->depth = deeper(deeper(1, a), b);
	return e;
}

kvp_expr *kvp_expr_call(kvp_file *f, kvp_srcloc loc, const char *name, kvp_srcloc name_loc,
                        kvp_expr **args, int n_args)
{
	kvp_expr *e = expr_new(f, KVP_E_CALL, loc);
	e->name = name;
	e->name_loc = name_loc;
	e->args = args;
	e->n_args = n_args;
	for (int i = 0; i < n_args; i++)
		e->depth = deeper(e->depth, args[i]);
	return e;
}

kvp_expr *kvp_expr_arg(kvp_file *f, kvp_srcloc loc, const char *name, kvp_srcloc name_loc,
                       kvp_expr *value)
{
	kvp_expr *e = expr_new(f, KVP_E_ARG, loc);
	e->name = name;
	e->name_loc = name_loc;
	e->a = value;
	e->depth = deeper(1, value);
	return e;
}

kvp_expr *kvp_expr_list(kvp_file *f, kvp_srcloc loc, kvp_expr **items, int n)
{
	kvp_expr *e = expr_new(f, KVP_E_LIST, loc);
	e->args = items;
	e->n_args = n;
	for (int i = 0; i < n; i++)
		e->depth = deeper(e->depth, items[i]);
	return e;
}

kvp_stmt *kvp_stmt_new(kvp_file *f, kvp_stmt_kind kind, kvp_srcloc loc)
{
	kvp_stmt *s = kvp_arena_alloc(&f->arena, sizeof *s);
	s->kind = kind;
	s->loc = loc;
	s->name_loc = loc;
	return s;
}

void kvp_file_add_comment(kvp_file *f, kvp_srcloc loc, const char *text, size_t n)
{
	if (f->n_comments == f->cap_comments)
		f->comments = kvp_grow(f->comments, &f->cap_comments, 16, sizeof *f->comments);
	kvp_comment *c = &f->comments[f->n_comments++];
	c->loc = loc;
	/* trailing blanks are not part of a comment */
	while (n > 1 && (text[n - 1] == ' ' || text[n - 1] == '\t' || text[n - 1] == '\r'))
		n--;
	c->text = kvp_arena_strndup(&f->arena, text, n);
	c->own_line = 1;
	for (uint32_t i = loc.off; i > 0 && f->src->text[i - 1] != '\n'; i--) {
		char ch = f->src->text[i - 1];
		if (ch != ' ' && ch != '\t' && ch != '\r' && ch != '\f' && ch != '\v') {
			c->own_line = 0;
			break;
		}
	}
}

const char *kvp_op_text(kvp_op op)
{
	static const char *const t[KVP_ASTOP_COUNT_] = {
		[KVP_ASTOP_NEG] = "-", [KVP_ASTOP_NOT] = "not", [KVP_ASTOP_ADD] = "+",
		[KVP_ASTOP_SUB] = "-", [KVP_ASTOP_MUL] = "*", [KVP_ASTOP_DIV] = "/",
		[KVP_ASTOP_LT] = "<", [KVP_ASTOP_LE] = "<=", [KVP_ASTOP_GT] = ">",
		[KVP_ASTOP_GE] = ">=", [KVP_ASTOP_EQ] = "==", [KVP_ASTOP_NE] = "!=",
		[KVP_ASTOP_AND] = "and", [KVP_ASTOP_OR] = "or",
	};
	return (unsigned)op < KVP_ASTOP_COUNT_ ? t[op] : "?";
}

const char *kvp_setting_text(kvp_setting s)
{
	static const char *const t[KVP_SET_COUNT_] = {
		[KVP_SET_SCORE] = "score", [KVP_SET_BUDGET] = "budget",
		[KVP_SET_LAYERS] = "layers", [KVP_SET_ALLOCATE] = "allocate",
		[KVP_SET_POOL] = "pool", [KVP_SET_POSITIONS] = "positions",
		[KVP_SET_ACTION] = "action", [KVP_SET_SEGMENT] = "segment", [KVP_SET_TREE] = "tree",
		[KVP_SET_PRECISION] = "precision",
	};
	return (unsigned)s < KVP_SET_COUNT_ ? t[s] : "?";
}

const char *kvp_unit_lit_text(kvp_unit_lit u)
{
	switch (u) {
	case KVP_LIT_ENTRIES: return "entries";
	case KVP_LIT_TOKENS: return "tokens";
	case KVP_LIT_STEPS: return "steps";
	case KVP_LIT_PERCENT: return "%";
	default: return "";
	}
}

/* ---- lists ------------------------------------------------------------------------ */

kvp_list *kvp_list_new(void)
{
	kvp_list *l = xmalloc(sizeof *l);
	l->items = NULL;
	l->n = l->cap = 0;
	return l;
}

kvp_list *kvp_list_push(kvp_list *l, void *item)
{
	if (l->n == l->cap)
		l->items = kvp_grow(l->items, &l->cap, 8, sizeof(void *));
	l->items[l->n++] = item;
	return l;
}

void kvp_list_free(kvp_list *l)
{
	if (!l)
		return;
	free(l->items);
	free(l);
}

void **kvp_list_finish(kvp_file *f, kvp_list *l, int *n)
{
	*n = l ? l->n : 0;
	void **out = NULL;
	if (*n) {
		out = kvp_arena_alloc(&f->arena, sizeof(void *) * (size_t)*n);
		memcpy(out, l->items, sizeof(void *) * (size_t)*n);
	}
	kvp_list_free(l);
	return out;
}
