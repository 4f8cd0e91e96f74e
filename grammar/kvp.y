/*
 * kvp.y — the grammar of the .kvp policy language (docs/language.md section 4 gives the
 * same grammar in EBNF; keep the two in step).
 *
 * A pure (reentrant) LALR(1) parser with locations: %define api.pure full, no global
 * state; the scanner handle and the parse state (struct kvp_parse: source, tree, error
 * flags) are parameters. Terminals are CAPITALS, non-terminals lower case. Every node is
 * built with its span (@$). Syntax errors are reported by yyreport_syntax_error in the
 * house format ("unexpected X; expected Y or Z", with LAC so the expected list is exact),
 * and the parser recovers at the end of the statement (`error term`), so one run reports
 * every broken statement. Lists under construction are malloc'd (kvp_list) and freed by
 * %destructor when error recovery discards them; everything else lives in the tree's
 * arena.
 *
 * Conflicts: %expect 0. Fix a new conflict with precedence or by restructuring the rule,
 * never by raising the number.
 */
%require "3.6"
%define api.pure full
%define api.prefix {kvp_yy}
%define api.token.prefix {TOK_}
%define api.location.type {kvp_srcloc}
%locations
%define parse.error custom
%define parse.lac full
%expect 0
%param {yyscan_t scanner}
%parse-param {struct kvp_parse *ps}

%code requires {
#include <stdint.h>

#include "kvp_ast.h"

#ifndef YY_TYPEDEF_YY_SCANNER_T
#define YY_TYPEDEF_YY_SCANNER_T
typedef void *yyscan_t;
#endif

/* State of one parse, shared by the scanner (yyextra) and the parser. */
struct kvp_parse {
	kvp_src *src;
	kvp_file *f;
	uint32_t off;  /* scanner: byte offset of the next token */
	int depth;     /* scanner: ( and [ currently open */
	int last_tok;  /* scanner: the last token returned, 0 at the start */
	int stop;      /* a fatal error happened: the scanner returns end of file */
	int too_deep;  /* an expression deeper than KVP_MAX_DEPTH has been reported */
	int in_body;   /* inside `policy NAME { ... }` */
	uint32_t open_at[KVP_MAX_PARENS + 1]; /* scanner: offsets of the open ( and [ */
};

/* A span from the first to the last symbol of a rule; an empty rule sits at the end of
 * the symbol before it. */
#define YYLLOC_DEFAULT(Cur, Rhs, N)                                              \
	do {                                                                     \
		if (N) {                                                         \
			(Cur) = YYRHSLOC(Rhs, 1);                                \
			(Cur).end = YYRHSLOC(Rhs, N).end;                        \
		} else {                                                         \
			(Cur) = kvp_src_loc(ps->src, YYRHSLOC(Rhs, 0).end,       \
			                    YYRHSLOC(Rhs, 0).end);               \
		}                                                                \
	} while (0)
}

%code {
#include <stdio.h>
#include <string.h>

int kvp_yylex(KVP_YYSTYPE *lval, KVP_YYLTYPE *lloc, yyscan_t scanner);
static void kvp_yyerror(const KVP_YYLTYPE *loc, yyscan_t scanner, struct kvp_parse *ps,
                        const char *msg);

/* Report an expression deeper than KVP_MAX_DEPTH once per file. */
static kvp_expr *depth_checked(struct kvp_parse *ps, kvp_expr *e)
{
	if (e->depth > KVP_MAX_DEPTH && !ps->too_deep) {
		ps->too_deep = 1;
		kvp_src_error(ps->src, e->loc,
		              "expression is nested too deeply (more than %d levels)",
		              KVP_MAX_DEPTH);
	}
	return e;
}

#define BIN(loc, op, a, b) depth_checked(ps, kvp_expr_binary(ps->f, loc, op, a, b))

static kvp_word *words_finish(struct kvp_parse *ps, kvp_list *l, int *n)
{
	void **items = kvp_list_finish(ps->f, l, n);
	kvp_word *w = kvp_arena_alloc(&ps->f->arena, sizeof *w * (size_t)(*n ? *n : 1));
	for (int i = 0; i < *n; i++)
		w[i] = *(kvp_word *)items[i];
	return w;
}

static kvp_word *word_new(struct kvp_parse *ps, const char *s, kvp_srcloc loc, int tag)
{
	kvp_word *w = kvp_arena_alloc(&ps->f->arena, sizeof *w);
	w->s = s;
	w->loc = loc;
	w->tag = tag;
	return w;
}
}

%union {
	struct { double v; const char *text; } num;
	const char *str;
	kvp_expr *expr;
	kvp_stmt *stmt;
	kvp_list *list;
	int ival;
}

%token <str> IDENT "identifier"
%token <num> NUMBER "number"
%token <num> PERCENT "percentage"
%token <str> STRING "string"
%token NL "end of line"
%token POLICY "policy" PARAM "param" CONST "const" STAT "stat" SCORE "score"
%token BUDGET "budget" GROUP "group" LAYERS "layers" ALLOCATE "allocate" POOL "pool"
%token KEEP "keep" ACTION "action" COMPRESS "compress" POSITIONS "positions"
%token SEGMENT "segment" TREE "tree" PRECISION "precision"
%token OVER "over" ALL "all" LAST "last" PROMPT "prompt" TAIL "tail"
%token EVERY "every" WHEN "when" AT "at" PER "per" TO "to"
%token AND "and" OR "or" NOT "not"
%token ENTRIES "entries" TOKENS "tokens" STEPS "steps" STEP "step"
%token EQ "==" NE "!=" LE "<=" GE ">="

%type <expr> expr primary arg target
%type <stmt> stmt last_stmt
%type <list> stmts args group_mods
%type <ival> setting unit

%destructor { kvp_list_free($$); } <list>

%left OR
%left AND
%precedence NOT
%nonassoc '<' '>' LE GE EQ NE
%left '+' '-'
%left '*' '/'
%precedence UMINUS

%%

file:
    policy
  | policy NL
  ;

policy:
    POLICY IDENT '{'
      {
	ps->f->name = $2;
	ps->f->name_loc = @2;
	ps->f->lbrace = @3;
	ps->in_body = 1;
      }
    stmts last_stmt '}'
      {
	ps->in_body = 0;
	ps->f->loc = @$;
	kvp_list *l = $6 ? kvp_list_push($5, $6) : $5;
	ps->f->stmts = (kvp_stmt **)kvp_list_finish(ps->f, l, &ps->f->n_stmts);
      }
  ;

/* statements end with a newline or ';'; the last one may end at the '}' */
stmts:
    %empty                { $$ = kvp_list_new(); }
  | stmts stmt term       { $$ = kvp_list_push($1, $2); }
  | stmts error term      { $$ = $1; yyerrok; }
  ;

last_stmt:
    %empty                { $$ = NULL; }
  | stmt                  { $$ = $1; }
  ;

term: NL | ';' ;

stmt:
    PARAM IDENT '=' expr
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_PARAM, @$);
	$$->name = $2; $$->name_loc = @2; $$->value = $4;
      }
  | CONST IDENT '=' expr
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_CONST, @$);
	$$->name = $2; $$->name_loc = @2; $$->value = $4;
      }
  | STAT IDENT '=' expr
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_STAT, @$);
	$$->name = $2; $$->name_loc = @2; $$->value = $4;
	$$->window = KVP_W_DEFAULT;
      }
  | STAT IDENT '=' expr OVER ALL
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_STAT, @$);
	$$->name = $2; $$->name_loc = @2; $$->value = $4;
	$$->window = KVP_W_ALL;
	$$->window_loc = kvp_src_loc(ps->src, @5.off, @6.end);
      }
  | STAT IDENT '=' expr OVER LAST expr
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_STAT, @$);
	$$->name = $2; $$->name_loc = @2; $$->value = $4;
	$$->window = KVP_W_LAST; $$->window_len = $7;
	$$->window_loc = kvp_src_loc(ps->src, @5.off, @7.end);
      }
  | STAT IDENT '=' expr OVER PROMPT TAIL expr
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_STAT, @$);
	$$->name = $2; $$->name_loc = @2; $$->value = $4;
	$$->window = KVP_W_PROMPT_TAIL; $$->window_len = $8;
	$$->window_loc = kvp_src_loc(ps->src, @5.off, @8.end);
      }
  | setting '=' expr
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_SETTING, @$);
	$$->setting = (kvp_setting)$1; $$->name_loc = @1; $$->value = $3;
      }
  /* setting = expr IDENT expr: the budget's floor, `budget = 20% min 64 tokens` (IDENT is
   * `min`, checked by sema with the setting) */
  | setting '=' expr IDENT expr
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_SETTING, @$);
	$$->setting = (kvp_setting)$1; $$->name_loc = @1; $$->value = $3; $$->target = $5;
	kvp_list *l = kvp_list_push(kvp_list_new(), word_new(ps, $4, @4, 0));
	$$->words = words_finish(ps, l, &$$->n_words);
      }
  | GROUP '=' IDENT group_mods
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_GROUP, @$);
	$$->name_loc = @1;
	kvp_list *l = kvp_list_new();
	kvp_list_push(l, word_new(ps, $3, @3, 0));
	for (int i = 0; i < $4->n; i++)
		kvp_list_push(l, $4->items[i]);
	kvp_list_free($4);
	$$->words = words_finish(ps, l, &$$->n_words);
      }
  | KEEP IDENT
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_KEEP, @$);
	$$->name_loc = @1;
	kvp_list *l = kvp_list_push(kvp_list_new(), word_new(ps, $2, @2, 0));
	$$->words = words_finish(ps, l, &$$->n_words);
      }
  | KEEP IDENT expr
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_KEEP, @$);
	$$->name_loc = @1; $$->value = $3;
	kvp_list *l = kvp_list_push(kvp_list_new(), word_new(ps, $2, @2, 0));
	$$->words = words_finish(ps, l, &$$->n_words);
      }
  /* keep IDENT expr over all: the singleton floor chosen over every head (IDENT = singletons) */
  | KEEP IDENT expr OVER ALL
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_KEEP, @$);
	$$->name_loc = @1; $$->value = $3;
	$$->window = KVP_W_ALL;
	$$->window_loc = kvp_src_loc(ps->src, @4.off, @5.end);
	kvp_list *l = kvp_list_push(kvp_list_new(), word_new(ps, $2, @2, 0));
	$$->words = words_finish(ps, l, &$$->n_words);
      }
  | COMPRESS EVERY STEP target
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_COMPRESS, @$);
	$$->name_loc = @1; $$->trigger = KVP_T_EVERY_STEP;
	$$->trigger_loc = kvp_src_loc(ps->src, @2.off, @3.end); $$->target = $4;
      }
  | COMPRESS EVERY expr target
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_COMPRESS, @$);
	$$->name_loc = @1; $$->trigger = KVP_T_EVERY; $$->value = $3;
	$$->trigger_loc = kvp_src_loc(ps->src, @2.off, @3.end); $$->target = $4;
      }
  | COMPRESS WHEN expr target
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_COMPRESS, @$);
	$$->name_loc = @1; $$->trigger = KVP_T_WHEN; $$->value = $3;
	$$->trigger_loc = kvp_src_loc(ps->src, @2.off, @3.end); $$->target = $4;
      }
  | COMPRESS AT PROMPT IDENT target
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_COMPRESS, @$);
	$$->name_loc = @1; $$->trigger = KVP_T_AT;
	$$->trigger_loc = kvp_src_loc(ps->src, @2.off, @4.end); $$->target = $5;
	kvp_list *l = kvp_list_push(kvp_list_new(), word_new(ps, $4, @4, 0));
	$$->words = words_finish(ps, l, &$$->n_words);
      }
  | COMPRESS PER IDENT expr target
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_COMPRESS, @$);
	$$->name_loc = @1; $$->trigger = KVP_T_PER; $$->value = $4;
	$$->trigger_loc = kvp_src_loc(ps->src, @2.off, @4.end); $$->target = $5;
	kvp_list *l = kvp_list_push(kvp_list_new(), word_new(ps, $3, @3, 0));
	$$->words = words_finish(ps, l, &$$->n_words);
      }
  | COMPRESS PER PROMPT IDENT expr target
      {
	$$ = kvp_stmt_new(ps->f, KVP_S_COMPRESS, @$);
	$$->name_loc = @1; $$->trigger = KVP_T_PER; $$->value = $5;
	$$->trigger_loc = kvp_src_loc(ps->src, @2.off, @5.end); $$->target = $6;
	kvp_list *l = kvp_list_push(kvp_list_new(), word_new(ps, $4, @4, 0));
	kvp_list_push(l, word_new(ps, "prompt", @3, 0));
	$$->words = words_finish(ps, l, &$$->n_words);
      }
  ;

/* setting = score | budget | layers | allocate | pool | positions | action | segment | tree
 *         | precision
 * (segment, tree: GraceKV's segmentation and prototypes, docs/language.md section 7.7;
 * precision: the storage tiers of the kept entries, section 7.8) */
setting:
    SCORE      { $$ = KVP_SET_SCORE; }
  | BUDGET     { $$ = KVP_SET_BUDGET; }
  | LAYERS     { $$ = KVP_SET_LAYERS; }
  | ALLOCATE   { $$ = KVP_SET_ALLOCATE; }
  | POOL       { $$ = KVP_SET_POOL; }
  | POSITIONS  { $$ = KVP_SET_POSITIONS; }
  | ACTION     { $$ = KVP_SET_ACTION; }
  | SEGMENT    { $$ = KVP_SET_SEGMENT; }
  | TREE       { $$ = KVP_SET_TREE; }
  | PRECISION  { $$ = KVP_SET_PRECISION; }
  ;

/* group = REDUCER [over layer] [before pool | after pool] */
group_mods:
    %empty                    { $$ = kvp_list_new(); }
  | group_mods OVER IDENT     { $$ = kvp_list_push($1, word_new(ps, $3, @3, KVP_WORD_OVER)); }
  | group_mods IDENT POOL     { $$ = kvp_list_push($1, word_new(ps, $2, @2, KVP_WORD_POOL)); }
  ;

target:
    %empty          { $$ = NULL; }
  | TO expr         { $$ = $2; }
  ;

expr:
    expr OR expr    { $$ = BIN(@$, KVP_ASTOP_OR, $1, $3); }
  | expr AND expr   { $$ = BIN(@$, KVP_ASTOP_AND, $1, $3); }
  | NOT expr        { $$ = depth_checked(ps, kvp_expr_unary(ps->f, @$, KVP_ASTOP_NOT, $2)); }
  | expr '<' expr   { $$ = BIN(@$, KVP_ASTOP_LT, $1, $3); }
  | expr '>' expr   { $$ = BIN(@$, KVP_ASTOP_GT, $1, $3); }
  | expr LE expr    { $$ = BIN(@$, KVP_ASTOP_LE, $1, $3); }
  | expr GE expr    { $$ = BIN(@$, KVP_ASTOP_GE, $1, $3); }
  | expr EQ expr    { $$ = BIN(@$, KVP_ASTOP_EQ, $1, $3); }
  | expr NE expr    { $$ = BIN(@$, KVP_ASTOP_NE, $1, $3); }
  | expr '+' expr   { $$ = BIN(@$, KVP_ASTOP_ADD, $1, $3); }
  | expr '-' expr   { $$ = BIN(@$, KVP_ASTOP_SUB, $1, $3); }
  | expr '*' expr   { $$ = BIN(@$, KVP_ASTOP_MUL, $1, $3); }
  | expr '/' expr   { $$ = BIN(@$, KVP_ASTOP_DIV, $1, $3); }
  | '-' expr %prec UMINUS
                    { $$ = depth_checked(ps, kvp_expr_unary(ps->f, @$, KVP_ASTOP_NEG, $2)); }
  | primary
  ;

primary:
    NUMBER          { $$ = kvp_expr_num(ps->f, @$, $1.v, KVP_LIT_NONE, $1.text); }
  | NUMBER unit     { $$ = kvp_expr_num(ps->f, @$, $1.v, (kvp_unit_lit)$2, $1.text); }
  | PERCENT         { $$ = kvp_expr_num(ps->f, @$, $1.v, KVP_LIT_PERCENT, $1.text); }
  | IDENT           { $$ = kvp_expr_name(ps->f, @$, $1); }
  | STRING          { $$ = kvp_expr_str(ps->f, @$, $1); }
  | IDENT '(' ')'   { $$ = kvp_expr_call(ps->f, @$, $1, @1, NULL, 0); }
  | IDENT '(' args ')'
      {
	int n;
	kvp_expr **a = (kvp_expr **)kvp_list_finish(ps->f, $3, &n);
	$$ = depth_checked(ps, kvp_expr_call(ps->f, @$, $1, @1, a, n));
      }
  | LAST '(' args ')'
      {
	int n;
	kvp_expr **a = (kvp_expr **)kvp_list_finish(ps->f, $3, &n);
	$$ = depth_checked(ps, kvp_expr_call(ps->f, @$, "last", @1, a, n));
      }
  | BUDGET          { $$ = kvp_expr_keyword(ps->f, @$, KVP_E_BUDGET); }
  | ENTRIES         { $$ = kvp_expr_keyword(ps->f, @$, KVP_E_ENTRIES); }
  | '(' expr ')'    { $$ = $2; }
  | '[' args ']'
      {
	int n;
	kvp_expr **a = (kvp_expr **)kvp_list_finish(ps->f, $2, &n);
	$$ = depth_checked(ps, kvp_expr_list(ps->f, @$, a, n));
      }
  ;

unit:
    ENTRIES         { $$ = KVP_LIT_ENTRIES; }
  | TOKENS          { $$ = KVP_LIT_TOKENS; }
  | STEPS           { $$ = KVP_LIT_STEPS; }
  | STEP            { $$ = KVP_LIT_STEPS; }
  ;

args:
    arg             { $$ = kvp_list_push(kvp_list_new(), $1); }
  | args ',' arg    { $$ = kvp_list_push($1, $3); }
  ;

arg:
    expr            { $$ = $1; }
  | IDENT '=' expr  { $$ = kvp_expr_arg(ps->f, @$, $1, @1, $3); }
  ;

%%

/* The spelling of a token kind for messages: keywords and punctuation quoted ('policy',
 * '='), descriptions bare (identifier, end of line). */
static int is_word_symbol(yysymbol_kind_t k)
{
	return k >= YYSYMBOL_POLICY && k <= YYSYMBOL_STEP;
}

/* a token that starts a statement (or ends the body): seeing one inside brackets means
 * a bracket was left open */
static int is_stmt_start(yysymbol_kind_t k)
{
	static const char *const starts[] = {
		"policy", "param", "const", "stat", "score", "budget", "group", "layers",
		"allocate", "pool", "keep", "action", "compress", "positions", "segment", "tree",
		"precision", "'}'",
	};
	const char *s = yysymbol_name(k);
	for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++)
		if (!strcmp(s, starts[i]))
			return 1;
	return k == YYSYMBOL_YYEOF;
}

/* 1 when the parser could start a statement here (a statement keyword is expected). */
static int stmt_expected(const yysymbol_kind_t *exp, int n)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(yysymbol_name(exp[i]), "budget") || !strcmp(yysymbol_name(exp[i]), "param"))
			return 1;
	return 0;
}

static void describe_symbol(yysymbol_kind_t k, char *buf, size_t n)
{
	const char *s = yysymbol_name(k);
	if (k == YYSYMBOL_YYEOF)
		snprintf(buf, n, "end of file");
	else if (k == YYSYMBOL_YYUNDEF || k == YYSYMBOL_YYerror)
		snprintf(buf, n, "invalid token");
	else if (k == YYSYMBOL_IDENT || k == YYSYMBOL_NUMBER || k == YYSYMBOL_PERCENT ||
	         k == YYSYMBOL_STRING || k == YYSYMBOL_NL || s[0] == '\'')
		snprintf(buf, n, "%s", s);
	else
		snprintf(buf, n, "'%s'", s);
}

static int yyreport_syntax_error(const yypcontext_t *ctx, yyscan_t scanner,
                                 struct kvp_parse *ps)
{
	(void)scanner;
	yysymbol_kind_t tok = yypcontext_token(ctx);
	kvp_srcloc loc = *yypcontext_location(ctx);
	if (tok == YYSYMBOL_YYEOF && ps->f->name == NULL && ps->last_tok == 0) {
		kvp_src_error(ps->src, kvp_src_loc(ps->src, 0, 0),
		              "empty policy file; expected 'policy NAME { ... }'");
		return 0;
	}
	char what[160];
	describe_symbol(tok, what, sizeof what);
	if (tok == YYSYMBOL_IDENT || tok == YYSYMBOL_NUMBER || tok == YYSYMBOL_PERCENT ||
	    tok == YYSYMBOL_STRING) {
		size_t l = strlen(what);
		int w = (int)(loc.end - loc.off);
		snprintf(what + l, sizeof what - l, " '%.*s'", w > 40 ? 40 : w,
		         ps->src->text + loc.off);
	}
	enum { MAX_EXPECTED = 64, MAX_LISTED = 4 };
	yysymbol_kind_t exp[MAX_EXPECTED];
	int n = yypcontext_expected_tokens(ctx, exp, MAX_EXPECTED);
	if (n < 0)
		n = 0;
	int expr_start = 0;
	for (int i = 0; i < n; i++)
		expr_start += exp[i] == YYSYMBOL_NUMBER || exp[i] == YYSYMBOL_IDENT ||
		              !strcmp(yysymbol_name(exp[i]), "'('");
	/* after a complete expression many operators are possible: name the likely fix */
	int comma = 0, rparen = 0, rbracket = 0, nl = 0, plus = 0;
	for (int i = 0; i < n; i++) {
		const char *e = yysymbol_name(exp[i]);
		comma |= !strcmp(e, "','");
		rparen |= !strcmp(e, "')'");
		rbracket |= !strcmp(e, "']'");
		nl |= exp[i] == YYSYMBOL_NL;
		plus |= !strcmp(e, "'+'");
	}
	char msg[512];
	int len = snprintf(msg, sizeof msg, "unexpected %s", what);
	const char *tn = yysymbol_name(tok);
	int cmp = !strcmp(tn, "'<'") || !strcmp(tn, "'>'") || !strcmp(tn, "<=") ||
	          !strcmp(tn, ">=") || !strcmp(tn, "==") || !strcmp(tn, "!=");
	if (expr_start == 3) {
		len += snprintf(msg + len, sizeof msg - (size_t)len, "; expected an expression");
	} else if (cmp && plus) {
		len += snprintf(msg + len, sizeof msg - (size_t)len,
		                "; comparisons do not chain (write `a < b and b < c`)");
	} else if (n > MAX_LISTED && plus && comma && (rparen || rbracket)) {
		len += snprintf(msg + len, sizeof msg - (size_t)len, "; expected an operator, ',' or '%c'",
		                rparen ? ')' : ']');
	} else if (n > MAX_LISTED && plus && nl) {
		len += snprintf(msg + len, sizeof msg - (size_t)len,
		                "; expected an operator or the end of the statement");
	} else if (n > 0 && n <= MAX_LISTED) {
		len += snprintf(msg + len, sizeof msg - (size_t)len, "; expected ");
		for (int i = 0; i < n; i++) {
			char e[64];
			describe_symbol(exp[i], e, sizeof e);
			len += snprintf(msg + len, sizeof msg - (size_t)len, "%s%s",
			                i == 0 ? "" : i == n - 1 ? " or " : ", ", e);
		}
	}
	int want_ident = 0;
	for (int i = 0; i < n; i++)
		want_ident |= exp[i] == YYSYMBOL_IDENT;
	if (is_word_symbol(tok) && (want_ident || n == 0))
		len += snprintf(msg + len, sizeof msg - (size_t)len, " ('%s' is a reserved word)",
		                yysymbol_name(tok));
	/* a misspelt statement keyword where a statement starts: "did you mean" */
	if (tok == YYSYMBOL_IDENT && ps->in_body && len < (int)sizeof msg) {
		static const char *const kws[] = {
			"param", "const", "stat", "score", "budget", "group", "layers", "allocate",
			"pool", "keep", "action", "compress", "positions", "segment", "tree",
			"precision",
		};
		char word[65];
		int w = (int)(loc.end - loc.off);
		snprintf(word, sizeof word, "%.*s", w > 64 ? 64 : w, ps->src->text + loc.off);
		int cap = strlen(word) <= 3 ? 1 : 2, best_d = cap + 1;
		const char *best = NULL;
		for (size_t i = 0; i < sizeof kws / sizeof kws[0]; i++) {
			int d = kvp_edit_distance(word, kws[i], cap);
			if (d <= cap && d < best_d && d < (int)strlen(word))
				best_d = d, best = kws[i];
		}
		if (best && stmt_expected(exp, n))
			snprintf(msg + len, sizeof msg - (size_t)len, "; did you mean '%s'?", best);
	}
	kvp_src_error(ps->src, loc, "%s", msg);
	if (ps->depth > 0 && is_stmt_start(tok)) {
		uint32_t at = ps->open_at[ps->depth - 1];
		kvp_src_note(ps->src, kvp_src_loc(ps->src, at, at + 1), "this '%c' is not closed",
		             ps->src->text[at]);
	} else if (tok == YYSYMBOL_YYEOF && ps->in_body)
		kvp_src_note(ps->src, ps->f->lbrace, "the '{' of policy '%s' is not closed",
		             ps->f->name ? ps->f->name : "");
	return 0;
}

static void kvp_yyerror(const KVP_YYLTYPE *loc, yyscan_t scanner, struct kvp_parse *ps,
                        const char *msg)
{
	(void)scanner;
	if (strcmp(msg, "memory exhausted") == 0)
		kvp_src_error(ps->src, *loc,
		              "expression is nested too deeply (the parser stack is full)");
	else
		kvp_src_error(ps->src, *loc, "%s", msg);
	ps->stop = 1;
}
