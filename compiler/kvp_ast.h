/*
 * kvp_ast: the abstract syntax tree of one .kvp file, exactly as written (before any
 * name resolution). Every node carries its source span (kvp_srcloc). All nodes, strings
 * and arrays live in one arena owned by the kvp_file and are freed together by
 * kvp_file_free (PostgreSQL's memory-context discipline); nothing in the tree is freed
 * on its own. The parser (grammar/kvp.y) builds the tree with the constructors below;
 * kvp_parse is the entry point that runs scanner + parser over a kvp_src.
 */
#ifndef KVP_AST_H
#define KVP_AST_H

#include <stddef.h>

#include "kvp_src.h"

/* Limits that keep every later (recursive) pass bounded. */
#define KVP_MAX_IDENT 64   /* bytes of an identifier */
#define KVP_MAX_NUMBER 32  /* bytes of a number literal */
#define KVP_MAX_STRING 1024 /* bytes of a string literal (a file path) */
#define KVP_MAX_PARENS 64  /* nesting of ( ) and [ ] */
#define KVP_MAX_DEPTH 256  /* depth of an expression tree */

/* ---- arena ---------------------------------------------------------------------- */

typedef struct kvp_arena_block kvp_arena_block;
typedef struct kvp_arena {
	kvp_arena_block *head;
} kvp_arena;

/* Zeroed, 16-byte aligned memory that lives until kvp_arena_free (aborts on OOM). */
void *kvp_arena_alloc(kvp_arena *a, size_t n);

/* Grows a realloc'ed array of *cap items of elem bytes: *cap doubles (to first when 0) and
 * the moved array is returned; prints "kvpc: out of memory" and aborts when realloc fails.
 * The caller owns the result (free it), as it owned items. */
void *kvp_grow(void *items, int *cap, int first, size_t elem);
char *kvp_arena_strndup(kvp_arena *a, const char *s, size_t n);
void kvp_arena_free(kvp_arena *a);

/* ---- expressions ---------------------------------------------------------------- */

typedef enum kvp_unit_lit {
	KVP_LIT_NONE = 0, /* a bare number: takes the unit its context needs */
	KVP_LIT_ENTRIES,  /* 2048 entries */
	KVP_LIT_TOKENS,   /* 4 tokens */
	KVP_LIT_STEPS,    /* 400 steps */
	KVP_LIT_PERCENT,  /* 20% (a ratio; num holds 0.2) */
} kvp_unit_lit;

typedef enum kvp_expr_kind {
	KVP_E_NUM,     /* num, unit, text */
	KVP_E_NAME,    /* name */
	KVP_E_CALL,    /* name(args): args[i] may be KVP_E_ARG */
	KVP_E_ARG,     /* name = a (named argument, only inside a call) */
	KVP_E_UNARY,   /* op a */
	KVP_E_BINARY,  /* a op b */
	KVP_E_LIST,    /* [args] */
	KVP_E_BUDGET,  /* the keyword `budget` used as a value */
	KVP_E_ENTRIES, /* the keyword `entries` used as a value */
	KVP_E_STR,     /* "text": name holds the bytes between the quotes (a file path) */
} kvp_expr_kind;

typedef enum kvp_op {
	KVP_ASTOP_NEG,  /* -a */
	KVP_ASTOP_NOT,  /* not a */
	KVP_ASTOP_ADD,  /* + */
	KVP_ASTOP_SUB,  /* - */
	KVP_ASTOP_MUL,  /* * */
	KVP_ASTOP_DIV,  /* / */
	KVP_ASTOP_LT,   /* < */
	KVP_ASTOP_LE,   /* <= */
	KVP_ASTOP_GT,   /* > */
	KVP_ASTOP_GE,   /* >= */
	KVP_ASTOP_EQ,   /* == */
	KVP_ASTOP_NE,   /* != */
	KVP_ASTOP_AND,  /* and */
	KVP_ASTOP_OR,   /* or */
	KVP_ASTOP_COUNT_
} kvp_op;

typedef struct kvp_expr kvp_expr;
struct kvp_expr {
	kvp_expr_kind kind;
	kvp_srcloc loc;        /* the whole expression */
	int depth;             /* 1 + depth of the deepest operand */
	kvp_op op;             /* UNARY, BINARY */
	double num;            /* NUM: the value (percent already divided by 100) */
	kvp_unit_lit unit;     /* NUM */
	const char *text;      /* NUM: the literal as written (without the unit word) */
	const char *name;      /* NAME, CALL (callee), ARG (argument name), STR (the text) */
	kvp_srcloc name_loc;   /* CALL, ARG: the name's span */
	kvp_expr *a, *b;       /* UNARY: a; BINARY: a, b; ARG: a = the value */
	kvp_expr **args;       /* CALL, LIST: [n_args] */
	int n_args;
};

/* ---- statements ----------------------------------------------------------------- */

typedef enum kvp_stmt_kind {
	KVP_S_PARAM,    /* param name = value */
	KVP_S_CONST,    /* const name = value */
	KVP_S_STAT,     /* stat name = value [over ...] */
	KVP_S_SETTING,  /* setting = value (score, budget, layers, allocate, pool, positions,
	                   action) */
	KVP_S_GROUP,    /* group = words... */
	KVP_S_KEEP,     /* keep word [value] */
	KVP_S_COMPRESS, /* compress trigger [to target] */
} kvp_stmt_kind;

typedef enum kvp_setting {
	KVP_SET_SCORE,
	KVP_SET_BUDGET,
	KVP_SET_LAYERS,
	KVP_SET_ALLOCATE,
	KVP_SET_POOL,
	KVP_SET_POSITIONS,
	KVP_SET_ACTION,
	KVP_SET_SEGMENT,
	KVP_SET_TREE,
	KVP_SET_PRECISION, /* precision = tiers(...) (docs/language.md section 7.8) */
	KVP_SET_COUNT_
} kvp_setting;

typedef enum kvp_window_kind {
	KVP_W_DEFAULT = 0, /* no `over` clause */
	KVP_W_ALL,         /* over all */
	KVP_W_LAST,        /* over last W steps */
	KVP_W_PROMPT_TAIL, /* over prompt tail W tokens */
} kvp_window_kind;

typedef enum kvp_trigger_kind {
	KVP_T_EVERY_STEP, /* every step */
	KVP_T_EVERY,      /* every N steps */
	KVP_T_WHEN,       /* when COND */
	KVP_T_AT,         /* at prompt end */
	KVP_T_PER,        /* per block N (words: "block"), per prompt block N (words: "block",
	                     "prompt") */
} kvp_trigger_kind;

/* A bare word with its span (group reducer and modifiers, keep kinds, trigger words).
 * tag: how a group modifier was written. */
enum { KVP_WORD_PLAIN = 0, KVP_WORD_OVER = 1 /* over WORD */, KVP_WORD_POOL = 2 /* WORD pool */ };
typedef struct kvp_word {
	const char *s;
	kvp_srcloc loc;
	int tag;
} kvp_word;

typedef struct kvp_stmt {
	kvp_stmt_kind kind;
	kvp_srcloc loc;          /* the whole statement */
	const char *name;        /* PARAM, CONST, STAT: the defined name */
	kvp_srcloc name_loc;     /* PARAM, CONST, STAT: the name; SETTING, GROUP, KEEP,
	                            COMPRESS: the leading keyword */
	kvp_setting setting;     /* SETTING */
	kvp_expr *value;         /* PARAM, CONST, STAT, SETTING; KEEP: the argument (or
	                            NULL); COMPRESS: the trigger's argument (or NULL) */
	kvp_window_kind window;  /* STAT; KEEP: KVP_W_ALL for `keep singletons N over all` */
	kvp_expr *window_len;    /* STAT: W of `over last W` / `over prompt tail W` */
	kvp_srcloc window_loc;   /* STAT: the `over ...` clause */
	kvp_word *words;         /* GROUP: reducer then modifiers; KEEP: the kind;
	                            COMPRESS (AT): the two words; SETTING: the word before
	                            target (`min`), or none */
	int n_words;
	kvp_trigger_kind trigger; /* COMPRESS */
	kvp_srcloc trigger_loc;  /* COMPRESS: the trigger words */
	kvp_expr *target;        /* COMPRESS: `to T`; SETTING (budget): the floor of
	                            `budget = B min F`; or NULL */
} kvp_stmt;

/* A comment as written: text starts with '#'; own_line when only blanks precede it. */
typedef struct kvp_comment {
	kvp_srcloc loc;
	const char *text;
	int own_line;
} kvp_comment;

typedef struct kvp_file {
	kvp_arena arena;
	kvp_src *src;            /* not owned */
	const char *name;        /* policy name, NULL when the parse failed before it */
	kvp_srcloc name_loc;
	kvp_srcloc loc;          /* `policy NAME {` ... `}` */
	kvp_srcloc lbrace;       /* the '{' (for "opened here" notes) */
	kvp_stmt **stmts;        /* [n_stmts] in source order */
	int n_stmts;
	kvp_comment *comments;   /* [n_comments] in source order (malloc'd, owned) */
	int n_comments, cap_comments;
} kvp_file;

/* Scan and parse src. Always returns a tree (possibly partial); syntax errors are
 * reported into src, so callers test src->n_errors. Free with kvp_file_free. */
kvp_file *kvp_parse(kvp_src *src);
void kvp_file_free(kvp_file *f);

/* ---- constructors used by the parser (all allocate in f->arena) ------------------ */

kvp_expr *kvp_expr_num(kvp_file *f, kvp_srcloc loc, double v, kvp_unit_lit unit,
                       const char *text);
kvp_expr *kvp_expr_name(kvp_file *f, kvp_srcloc loc, const char *name);
kvp_expr *kvp_expr_keyword(kvp_file *f, kvp_srcloc loc, kvp_expr_kind kind);
kvp_expr *kvp_expr_str(kvp_file *f, kvp_srcloc loc, const char *text);
kvp_expr *kvp_expr_unary(kvp_file *f, kvp_srcloc loc, kvp_op op, kvp_expr *a);
kvp_expr *kvp_expr_binary(kvp_file *f, kvp_srcloc loc, kvp_op op, kvp_expr *a,
                          kvp_expr *b);
kvp_expr *kvp_expr_call(kvp_file *f, kvp_srcloc loc, const char *name, kvp_srcloc name_loc,
                        kvp_expr **args, int n_args);
kvp_expr *kvp_expr_arg(kvp_file *f, kvp_srcloc loc, const char *name, kvp_srcloc name_loc,
                       kvp_expr *value);
kvp_expr *kvp_expr_list(kvp_file *f, kvp_srcloc loc, kvp_expr **items, int n);
kvp_stmt *kvp_stmt_new(kvp_file *f, kvp_stmt_kind kind, kvp_srcloc loc);
/* Record the comment text[0..n) found at loc (called by the scanner). */
void kvp_file_add_comment(kvp_file *f, kvp_srcloc loc, const char *text, size_t n);

/* Spelling of an operator ("+", "and", ...), of a setting keyword ("score", ...), of a
 * unit word ("entries", ...; "" for none, "%" for percent). */
const char *kvp_op_text(kvp_op op);
const char *kvp_setting_text(kvp_setting s);
const char *kvp_unit_lit_text(kvp_unit_lit u);

/* Growable pointer list used while parsing (malloc'd; the parser's %destructor frees it
 * on error paths, kvp_list_finish moves it into the arena). */
typedef struct kvp_list {
	void **items;
	int n, cap;
} kvp_list;

kvp_list *kvp_list_new(void);
kvp_list *kvp_list_push(kvp_list *l, void *item);
void kvp_list_free(kvp_list *l);
/* Copy the items into the arena, free the list; returns the array, *n its length. */
void **kvp_list_finish(kvp_file *f, kvp_list *l, int *n);

#endif
