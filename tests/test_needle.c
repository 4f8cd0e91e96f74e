/*
 * test_needle: passkey and needle-in-a-haystack prompt builders and scorers
 * (runtime/eval/rt_needle.c).
 *
 * Model-free cases: the scorers on hand-written generations, the seed -> passkey map
 * against values from the Python re-implementation of the PRNG
 * (tests/golden/stats/make_golden.py's Rng), haystack reading (plain, gzip, errors), and the
 * builders with a synthetic byte-level tokenizer written with gguf_writer: exact lengths,
 * needle tokens at the reported place, depth within one filler repeat, sentence-end
 * placement for NIAH, the multi-key needles' texts and places against the slot rule computed
 * here, the multi-instruction prompt's system message, filler and question, its keyword
 * checks and its score against the full cache's checks on hand-counted cases, error cases.
 * Model cases (env KVRT_MODEL = the SmolLM2 GGUF): for 1024, 2048 and 4096 tokens and
 * depths 0/25/50/75/100, plain and ChatML: context + question == requested length, the
 * decoded needle/filler/question texts are the published strings, the needle is within
 * one filler repeat of the requested depth, plain passkey prompts are the tokenizer's own
 * canonical tokenization of their text, and NIAH prompts from coreutils.info.gz (or
 * GPL-3) put the needle where an independent re-implementation of the placement rule
 * (last '.' token within RT_NIAH_MAX_BACK tokens before the depth, else a line end) says.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rt_text.h"
#include "eval/rt_needle.h"
#include "model/rt_model.h"
#include "policy/rt_seq.h"
#include "policy/rt_span.h"
#include "support/gguf_writer.h"
#include "support/check_run.h"

/* ---- scorers ------------------------------------------------------------------------- */

START_TEST(test_score_passkey)
{
	ck_assert_int_eq(rt_needle_score_passkey("12345", 12345), 1);
	ck_assert_int_eq(rt_needle_score_passkey(" 12345. Remember it.", 12345), 1);
	ck_assert_int_eq(rt_needle_score_passkey("The pass key is 12345 and 7", 12345), 1);
	ck_assert_int_eq(rt_needle_score_passkey("1234", 12345), 0);
	ck_assert_int_eq(rt_needle_score_passkey("123456", 12345), 0);
	ck_assert_int_eq(rt_needle_score_passkey("012345", 12345), 0);
	ck_assert_int_eq(rt_needle_score_passkey("key 7, then 12345", 12345), 0);
	ck_assert_int_eq(rt_needle_score_passkey("no digits here", 12345), 0);
	ck_assert_int_eq(rt_needle_score_passkey("", 1), 0);
	ck_assert_int_eq(rt_needle_score_passkey("1 2345", 12345), 0);
	ck_assert_int_eq(rt_needle_score_passkey("x50000y", 50000), 1);
}
END_TEST

START_TEST(test_score_niah)
{
	ck_assert_int_eq(rt_needle_score_niah(" eat a sandwich and sit in Dolores Park."), 1);
	ck_assert_int_eq(rt_needle_score_niah("SANDWICH in dolores park"), 1);
	ck_assert_int_eq(rt_needle_score_niah("eat a sandwich"), 0);
	ck_assert_int_eq(rt_needle_score_niah("go to Dolores Park"), 0);
	ck_assert_int_eq(rt_needle_score_niah("Dolores  Park sandwich"), 0);
	ck_assert_int_eq(rt_needle_score_niah(""), 0);
	rt_needle_prompt p = {0};
	p.kind = RT_NEEDLE_PASSKEY;
	p.passkey = 42;
	ck_assert_int_eq(rt_needle_score(&p, "42"), 1);
	ck_assert_int_eq(rt_needle_score(&p, "sandwich Dolores Park"), 0);
	p.kind = RT_NEEDLE_NIAH;
	ck_assert_int_eq(rt_needle_score(&p, "42"), 0);
	ck_assert_int_eq(rt_needle_score(&p, "a sandwich in Dolores Park"), 1);
}
END_TEST

START_TEST(test_passkey_seed)
{
	/* 1 + Rng(seed).below(50000) from tests/golden/stats/make_golden.py */
	ck_assert_uint_eq(rt_needle_passkey_for_seed(0), 16421);
	ck_assert_uint_eq(rt_needle_passkey_for_seed(1), 29558);
	ck_assert_uint_eq(rt_needle_passkey_for_seed(2), 29576);
	ck_assert_uint_eq(rt_needle_passkey_for_seed(42), 8743);
	ck_assert_uint_eq(rt_needle_passkey_for_seed(1024), 46223);
	int distinct = 0;
	uint32_t seen[200];
	for (int s = 0; s < 200; s++) {
		uint32_t k = rt_needle_passkey_for_seed((uint64_t)s);
		ck_assert(k >= 1 && k <= 50000);
		int dup = 0;
		for (int j = 0; j < s; j++)
			dup |= seen[j] == k;
		distinct += !dup;
		seen[s] = k;
	}
	ck_assert_int_ge(distinct, 195);
}
END_TEST

/* ---- haystack files ------------------------------------------------------------------ */

START_TEST(test_info_body)
{
	const char info[] = "preamble\n\x1f\nFile: x.info,  Node: Top\n* Menu:\n"
	                    "\x1f\nFile: x.info,  Node: Intro\nProse.\n\x1f\nmore";
	size_t off = rt_needle_info_body(info, sizeof(info) - 1);
	ck_assert_str_eq(info + off, "File: x.info,  Node: Intro\nProse.\n\x1f\nmore");
	ck_assert_uint_eq(rt_needle_info_body("plain text", 10), 0);
	ck_assert_uint_eq(rt_needle_info_body("a\x1f\nb", 4), 0);
	ck_assert_uint_eq(rt_needle_info_body("\x1f\n\x1f\n", 4), 4);
	ck_assert_uint_eq(rt_needle_info_body("\x1f\n\x1f", 3), 0);
}
END_TEST

/* ---- synthetic byte-level tokenizer ----------------------------------------------------- */

static void byte_sym(int b, char out[4])
{
	int n = 0, cp = -1;
	for (int x = 0; x < 256; x++) {
		int keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
		int c = keep ? x : 256 + n++;
		if (x == b)
			cp = c;
	}
	memset(out, 0, 4);
	if (cp < 0x80) {
		out[0] = (char)cp;
	} else {
		out[0] = (char)(0xC0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3F));
	}
}

/* Vocabulary: 3 control tokens, the 256 byte symbols (id 3 + byte), "ĠT", "ĠTh", "ĠThe". */
static rt_tokenizer *syn_tokenizer(void)
{
	static const char *const merges[] = {"Ġ T", "ĠT h", "ĠTh e"};
	const char *toks[262];
	int32_t types[262];
	char syms[256][4];
	toks[0] = "<|endoftext|>";
	toks[1] = "<|im_start|>";
	toks[2] = "<|im_end|>";
	for (int i = 0; i < 3; i++)
		types[i] = 3;
	for (int b = 0; b < 256; b++) {
		byte_sym(b, syms[b]);
		toks[3 + b] = syms[b];
		types[3 + b] = 1;
	}
	toks[259] = "ĠT";
	toks[260] = "ĠTh";
	toks[261] = "ĠThe";
	types[259] = types[260] = types[261] = 1;
	gw *w = gw_init();
	gw_kv_str(w, "general.architecture", "llama");
	gw_kv_str(w, "tokenizer.ggml.model", "gpt2");
	gw_kv_str(w, "tokenizer.ggml.pre", "smollm");
	gw_kv_str_arr(w, "tokenizer.ggml.tokens", toks, 262);
	gw_kv_i32_arr(w, "tokenizer.ggml.token_type", types, 262);
	gw_kv_str_arr(w, "tokenizer.ggml.merges", merges, 3);
	gw_kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
	/* SmolLM2's template (its default system message included), as the real file has */
	gw_kv_str(w, "tokenizer.chat_template",
	          "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
	          "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
	          "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
	          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
	          "{{ '<|im_start|>assistant\n' }}{% endif %}");
	char path[] = "/tmp/test_needle_tok_......";
	memset(path + strlen(path) - 6, 'X', 6); /* mkstemp's template suffix */
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(gw_write(w, path), 0);
	gw_free(w);
	rt_err err = {0};
	rt_gguf *g = rt_gguf_open(path, &err);
	ck_assert_msg(g != NULL, "%s", err.msg);
	rt_tokenizer *t = rt_tokenizer_init(g, &err);
	ck_assert_msg(t != NULL, "%s", err.msg);
	rt_gguf_close(g);
	unlink(path);
	return t;
}

/* Decode ids[n] into a heap string. */
static char *decode(const rt_tokenizer *t, const int32_t *ids, int64_t n)
{
	size_t cap = 64, len = 0;
	char *s = malloc(cap);
	for (int64_t i = 0; i < n; i++) {
		char b[512];
		int l = rt_token_to_bytes(t, ids[i], b, sizeof(b));
		ck_assert(l >= 0 && l < (int)sizeof(b));
		while (len + (size_t)l + 1 > cap)
			s = realloc(s, cap *= 2);
		memcpy(s + len, b, (size_t)l);
		len += (size_t)l;
	}
	s[len] = '\0';
	return s;
}

static int32_t *tokenize(const rt_tokenizer *t, const char *s, int special, int64_t *n)
{
	rt_err err = {0};
	int64_t k = rt_tokenize(t, s, strlen(s), special, NULL, 0, &err);
	ck_assert_int_ge(k, 0);
	int32_t *ids = malloc((size_t)(k + 1) * sizeof(int32_t));
	ck_assert_int_eq(rt_tokenize(t, s, strlen(s), special, ids, k, &err), k);
	*n = k;
	return ids;
}

/* Checks common to every passkey prompt. unit_max bounds the filler repeat in tokens. */
static void check_passkey(const rt_tokenizer *t, const rt_needle_prompt *p, int64_t n_tokens,
                          double depth, int chat)
{
	ck_assert_int_eq(p->kind, RT_NEEDLE_PASSKEY);
	ck_assert_int_eq(p->n_ctx + p->n_question, n_tokens);
	/* the needle tokens are where reported and decode to the published needle */
	char want[160];
	snprintf(want, sizeof(want), " The pass key is %u. Remember it. %u is the pass key.",
	         p->passkey, p->passkey);
	char *nd = decode(t, p->ctx + p->needle_pos, p->needle_len);
	ck_assert_str_eq(nd, want);
	free(nd);
	ck_assert_str_eq(p->answer, (snprintf(want, sizeof(want), "%u", p->passkey), want));
	/* depth: within one filler repeat of depth% of the filler */
	ck_assert_int_eq(p->hay_tokens, p->n_ctx - p->hay_start - p->needle_len);
	double target = p->hay_start + depth / 100.0 * (double)p->hay_tokens;
	ck_assert_msg(fabs((double)p->needle_pos - target) <= (double)p->unit,
	              "N=%lld depth %g: needle at %lld, target %.1f, unit %lld",
	              (long long)n_tokens, depth, (long long)p->needle_pos, target,
	              (long long)p->unit);
	/* filler before the needle is whole repeats of the filler text */
	int64_t pre = p->needle_pos - p->hay_start;
	ck_assert_int_eq(pre % p->unit, 0);
	char *fill = decode(t, p->ctx + p->hay_start, pre);
	size_t fl = strlen(RT_PASSKEY_FILLER);
	ck_assert_uint_eq(strlen(fill), (size_t)(pre / p->unit) * fl);
	for (int64_t r = 0; r < pre / p->unit; r++)
		ck_assert(!strncmp(fill + r * fl, RT_PASSKEY_FILLER, fl));
	free(fill);
	/* instruction and question texts */
	char *head = decode(t, p->ctx, p->hay_start);
	char *q = decode(t, p->question, p->n_question);
	if (chat) {
		ck_assert(!strncmp(head, "<|im_start|>system\n", 19));
		ck_assert(strstr(head, "<|im_start|>user\n" RT_PASSKEY_INSTRUCTION) != NULL);
		ck_assert_str_eq(q, "\nWhat is the pass key?<|im_end|>\n<|im_start|>assistant\n"
		                    "The pass key is");
	} else {
		ck_assert_str_eq(head, RT_PASSKEY_INSTRUCTION);
		ck_assert_str_eq(q, "\nWhat is the pass key? The pass key is");
	}
	free(head);
	free(q);
}

START_TEST(test_syn_passkey)
{
	rt_tokenizer *t = syn_tokenizer();
	const int64_t lens[] = {400, 517, 1000};
	const double depths[] = {0, 10, 25, 50, 75, 90, 100};
	for (int c = 0; c < 2; c++)
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 7; j++) {
				rt_needle_prompt p;
				rt_err err = {0};
				ck_assert_msg(rt_needle_passkey(t, lens[i], depths[j], (uint64_t)(i * 7 + j),
				                                c, &p, &err) == 0, "%s", err.msg);
				/* byte-level: a repeat is its bytes, with " The" merged (4 times) */
				ck_assert_int_eq(p.unit, (int64_t)strlen(RT_PASSKEY_FILLER) - 4 * 3);
				check_passkey(t, &p, lens[i], depths[j], c);
				ck_assert_uint_eq(p.passkey, rt_needle_passkey_for_seed((uint64_t)(i * 7 + j)));
				rt_needle_prompt_free(&p);
			}
	/* depth 0: the needle follows the instruction directly */
	rt_needle_prompt p;
	rt_err err = {0};
	ck_assert_int_eq(rt_needle_passkey(t, 700, 0, 5, 0, &p, &err), 0);
	ck_assert_int_eq(p.needle_pos, p.hay_start);
	rt_needle_prompt_free(&p);
	/* errors */
	ck_assert_int_eq(rt_needle_passkey(t, 100, 50, 1, 0, &p, &err), -1);
	ck_assert_msg(!strncmp(err.msg, "passkey: 100 tokens is too short; the fixed parts take ",
	                       55), "%s", err.msg);
	ck_assert_ptr_null(p.ctx);
	ck_assert_int_eq(rt_needle_passkey(t, 1000, 101, 1, 0, &p, &err), -1);
	ck_assert_str_eq(err.msg, "passkey: depth 101% outside [0, 100]");
	ck_assert_int_eq(rt_needle_passkey(t, 1000, NAN, 1, 0, &p, &err), -1);
	rt_tokenizer_free(t);
}
END_TEST

/* Multi-key: lengths, every needle's text and place computed here from the slot rule
 * (needle j at the filler-repeat boundary nearest D + 25·j percent, less 100 above 100,
 * needles at one boundary in j order), the question, the answer and the distractor rule. */
START_TEST(test_syn_multikey)
{
	static const char *const labels[4] = {"north", "south", "east", "west"};
	rt_tokenizer *t = syn_tokenizer();
	const int64_t lens[] = {1000, 1500};
	const double depths[] = {0, 30, 50, 100};
	for (int c = 0; c < 2; c++)
		for (int i = 0; i < 2; i++)
			for (int k = 0; k < 4; k++) {
				const uint64_t seed = (uint64_t)(i * 4 + k + 3);
				rt_needle_prompt p;
				rt_err err = {0};
				ck_assert_msg(rt_needle_multikey(t, lens[i], depths[k], seed, c, &p, &err) == 0,
				              "%s", err.msg);
				ck_assert_int_eq(p.kind, RT_NEEDLE_MULTIKEY);
				ck_assert_int_eq(p.n_ctx + p.n_question, lens[i]);
				ck_assert_uint_eq(p.keys[0], rt_needle_passkey_for_seed(seed * 4));
				ck_assert_uint_eq(p.passkey, p.keys[0]);
				int64_t nn[4], slot[4], F = p.hay_tokens, unit = p.unit;
				char want[4][200];
				for (int j = 0; j < 4; j++) {
					for (int q = 0; q < j; q++)
						ck_assert_uint_ne(p.keys[q], p.keys[j]);
					const char *lb = labels[(seed + (uint64_t)j) % 4];
					snprintf(want[j], sizeof want[j], " The pass key of the %s door is %u. "
					         "Remember it. %u is the pass key of the %s door.", lb, p.keys[j],
					         p.keys[j], lb);
					nn[j] = (int64_t)strlen(want[j]) - 3 * (strstr(want[j], " The ") != NULL);
					double d = depths[k] + 25.0 * j;
					d = d > 100 ? d - 100 : d;
					slot[j] = (int64_t)llround(d / 100.0 * (double)F / (double)unit) * unit;
					while (slot[j] > F)
						slot[j] -= unit;
				}
				/* byte-level: " The" is one token, so a needle is its bytes less 3 */
				int64_t total = 0;
				for (int j = 0; j < 4; j++)
					total += nn[j];
				ck_assert_int_eq(p.n_ctx, p.hay_start + F + total);
				for (int j = 0; j < 4; j++) {
					int64_t pos = p.hay_start + slot[j];
					for (int q = 0; q < 4; q++)
						if (slot[q] < slot[j] || (slot[q] == slot[j] && q < j))
							pos += nn[q];
					ck_assert_int_eq(p.key_pos[j], pos);
					char *nd = decode(t, p.ctx + pos, nn[j]);
					ck_assert_str_eq(nd, want[j]);
					free(nd);
				}
				ck_assert_int_eq(p.needle_pos, p.key_pos[0]);
				char *q = decode(t, p.question, p.n_question);
				char wq[200];
				const char *asked = labels[seed % 4];
				if (c)
					snprintf(wq, sizeof wq, "\nWhat is the pass key of the %s door?<|im_end|>\n"
					         "<|im_start|>assistant\nThe pass key of the %s door is", asked, asked);
				else
					snprintf(wq, sizeof wq, "\nWhat is the pass key of the %s door? The pass key "
					         "of the %s door is", asked, asked);
				ck_assert_str_eq(q, wq);
				free(q);
				/* the asked key scores, a distractor's does not */
				char g[64];
				snprintf(g, sizeof g, " %u.\n", p.keys[0]);
				ck_assert_int_eq(rt_needle_score(&p, g), 1);
				snprintf(g, sizeof g, " %u.\n", p.keys[2]);
				ck_assert_int_eq(rt_needle_score(&p, g), 0);
				rt_needle_prompt_free(&p);
			}
	rt_needle_prompt p;
	rt_err err = {0};
	ck_assert_int_eq(rt_needle_multikey(t, 150, 50, 1, 0, &p, &err), -1);
	ck_assert_msg(!strncmp(err.msg, "multikey: 150 tokens is too short", 33), "%s", err.msg);
	ck_assert_int_eq(rt_needle_multikey(t, 1000, -1, 1, 0, &p, &err), -1);
	ck_assert_str_eq(err.msg, "multikey: depth -1% outside [0, 100]");
	rt_tokenizer_free(t);
}
END_TEST

/* Multi-instruction: the system message with the drawn words, whole filler repeats, the
 * question in the template, exact lengths; every word of the lists drawn over 64 seeds. */
START_TEST(test_syn_instruct)
{
	static const char *const lists[3][4] = {{"Zorblax", "Quimby", "Marlowe", "Bexley"},
	                                        {"tortoise", "parrot", "hedgehog", "llama"},
	                                        {"Lisbon", "Oslo", "Cairo", "Lima"}};
	rt_tokenizer *t = syn_tokenizer();
	int seen[3][4] = {{0}};
	for (uint64_t seed = 0; seed < 64; seed++) {
		rt_needle_prompt p;
		rt_err err = {0};
		const int64_t len = 500 + (int64_t)seed;
		ck_assert_msg(rt_needle_instruct(t, len, seed, &p, &err) == 0, "%s", err.msg);
		ck_assert_int_eq(p.kind, RT_NEEDLE_INSTRUCT);
		ck_assert_int_eq(p.n_ctx + p.n_question, len);
		for (int i = 0; i < 3; i++) {
			int f = -1;
			for (int w = 0; w < 4; w++)
				if (!strcmp(p.words[i], lists[i][w]))
					f = w;
			ck_assert_int_ge(f, 0);
			seen[i][f] = 1;
		}
		char want[400];
		snprintf(want, sizeof want, "<|im_start|>system\nFollow these three instructions in "
		         "every answer. 1. Say that your name is %s. 2. Mention your pet %s. 3. Mention "
		         "the city of %s.<|im_end|>\n<|im_start|>user\n", p.words[0], p.words[1],
		         p.words[2]);
		char *head = decode(t, p.ctx, p.hay_start);
		ck_assert_str_eq(head, want);
		free(head);
		/* the system span: exactly the system message's tokens (the template's around it
		 * not counted, as serve marks a chat's) */
		char *sys = decode(t, p.ctx + p.sys_pos, p.sys_len);
		snprintf(want, sizeof want, RT_INSTRUCT_SYSTEM, p.words[0], p.words[1], p.words[2]);
		ck_assert_str_eq(sys, want);
		free(sys);
		head = decode(t, p.ctx, p.sys_pos);
		ck_assert_str_eq(head, "<|im_start|>system\n");
		free(head);
		ck_assert_int_eq(p.hay_tokens, p.n_ctx - p.hay_start);
		char *fill = decode(t, p.ctx + p.hay_start, p.hay_tokens);
		size_t fl = strlen(RT_PASSKEY_FILLER);
		for (size_t o = 0; o < strlen(fill); o += fl)
			ck_assert(!strncmp(fill + o, RT_PASSKEY_FILLER,
			                   strlen(fill) - o < fl ? strlen(fill) - o : fl));
		free(fill);
		char *q = decode(t, p.question, p.n_question);
		ck_assert_str_eq(q, "\nTell me about yourself.<|im_end|>\n<|im_start|>assistant\n");
		free(q);
		snprintf(want, sizeof want, "%s; %s; %s", p.words[0], p.words[1], p.words[2]);
		ck_assert_str_eq(p.answer, want);
		rt_needle_prompt_free(&p);
	}
	for (int i = 0; i < 3; i++)
		for (int w = 0; w < 4; w++)
			ck_assert_msg(seen[i][w], "list %d word %d never drawn", i, w);
	rt_needle_prompt p;
	rt_err err = {0};
	ck_assert_int_eq(rt_needle_instruct(t, 40, 1, &p, &err), -1);
	ck_assert_msg(!strncmp(err.msg, "instruct: 40 tokens is too short", 32), "%s", err.msg);
	rt_tokenizer_free(t);
}
END_TEST

/* Multi-instruction checks on hand-written answers, and the score against the full
 * cache's checks (hand-counted). */
START_TEST(test_instruct_score)
{
	rt_needle_prompt p;
	memset(&p, 0, sizeof p);
	p.kind = RT_NEEDLE_INSTRUCT;
	strcpy(p.words[0], "Zorblax");
	strcpy(p.words[1], "tortoise");
	strcpy(p.words[2], "Lisbon");
	ck_assert_uint_eq(rt_needle_instruct_checks(&p, "I am ZORBLAX, and my Tortoise sleeps."), 3);
	ck_assert_uint_eq(rt_needle_instruct_checks(&p, "Greetings from lisbon."), 4);
	ck_assert_uint_eq(rt_needle_instruct_checks(&p, "Zorb the tortois of Lisb"), 0);
	ck_assert_int_eq(rt_needle_score(&p, "Zorblax, tortoise, Lisbon"), 1);
	ck_assert_int_eq(rt_needle_score(&p, "Zorblax, tortoise"), 0);
	int f = 0, fr = 0;
	ck_assert_int_eq(rt_needle_instruct_vs_ref(3, 1, &f, &fr), 1); /* more than the full cache */
	ck_assert_int_eq(f, 1);
	ck_assert_int_eq(fr, 1);
	ck_assert_int_eq(rt_needle_instruct_vs_ref(2, 3, &f, &fr), 0); /* the name lost */
	ck_assert_int_eq(f, 2);
	ck_assert_int_eq(fr, 3);
	ck_assert_int_eq(rt_needle_instruct_vs_ref(7, 0, &f, &fr), 1); /* nothing to follow */
	ck_assert_int_eq(rt_needle_instruct_vs_ref(0, 5, &f, &fr), 0);
	ck_assert_int_eq(f, 2);
	ck_assert_int_eq(fr, 5);
}
END_TEST

/* Checks common to every NIAH prompt. */
static void check_niah(const rt_tokenizer *t, const rt_needle_prompt *p, int64_t n_tokens,
                       double depth, int chat, int64_t *max_back)
{
	ck_assert_int_eq(p->kind, RT_NEEDLE_NIAH);
	ck_assert_int_eq(p->n_ctx + p->n_question, n_tokens);
	char *nd = decode(t, p->ctx + p->needle_pos, p->needle_len);
	ck_assert_str_eq(nd, "\n" RT_NIAH_NEEDLE "\n");
	free(nd);
	ck_assert_int_eq(p->hay_tokens, p->n_ctx - p->hay_start - p->needle_len);
	int64_t want = p->hay_start + (int64_t)llround(depth / 100.0 * (double)p->hay_tokens);
	ck_assert_int_eq(p->target_pos, want);
	ck_assert_int_le(p->needle_pos, want);
	if (depth == 100.0) {
		ck_assert_int_eq(p->needle_pos + p->needle_len, p->n_ctx);
	} else {
		/* Oracle for the documented rule on the haystack tokens around the needle: the
		 * last '.'-ending token at or before the target within RT_NIAH_MAX_BACK tokens
		 * (or the haystack start), else the last newline-ending token, else the target. */
		int64_t H = p->hay_tokens, w = want - p->hay_start;
		int32_t *hay = malloc((size_t)H * sizeof(int32_t));
		int64_t pre = p->needle_pos - p->hay_start;
		memcpy(hay, p->ctx + p->hay_start, (size_t)pre * sizeof(int32_t));
		memcpy(hay + pre, p->ctx + p->needle_pos + p->needle_len,
		       (size_t)(H - pre) * sizeof(int32_t));
		int64_t lim = w > RT_NIAH_MAX_BACK ? w - RT_NIAH_MAX_BACK : 0, ins = -1;
		for (int64_t k = w; k >= lim && ins < 0; k--) {
			char b[256];
			int l = k ? rt_token_to_bytes(t, hay[k - 1], b, sizeof(b)) : 0;
			while (l > 0 && (b[l - 1] == ' ' || b[l - 1] == '\n' || b[l - 1] == '\t'))
				l--;
			if (k == 0 || (l > 0 && b[l - 1] == '.'))
				ins = k;
		}
		for (int64_t k = w; k >= lim && ins < 0; k--) {
			char b[256];
			int l = rt_token_to_bytes(t, hay[k - 1], b, sizeof(b));
			if (l > 0 && b[l - 1] == '\n')
				ins = k;
		}
		if (ins < 0)
			ins = w;
		ck_assert_int_eq(p->needle_pos, p->hay_start + ins);
		free(hay);
	}
	if (want - p->needle_pos > *max_back)
		*max_back = want - p->needle_pos;
	char *q = decode(t, p->question, p->n_question);
	if (chat)
		ck_assert_str_eq(q, "\n" RT_NIAH_QUESTION "<|im_end|>\n<|im_start|>assistant\n"
		                    RT_NIAH_PRIME);
	else
		ck_assert_str_eq(q, "\n\n" RT_NIAH_QUESTION " " RT_NIAH_PRIME);
	free(q);
	ck_assert_str_eq(p->answer, "sandwich; Dolores Park");
}

START_TEST(test_syn_niah)
{
	rt_tokenizer *t = syn_tokenizer();
	/* sentences of varying length, with control bytes and invalid UTF-8 to be cleaned */
	size_t cap = 200000, len = 0;
	char *hay = malloc(cap);
	for (int i = 0; len < cap - 200; i++)
		len += (size_t)snprintf(hay + len, cap - len, "Sentence %d has %.*s words.%s ", i,
		                        i % 7 + 1, "aaaaaaa", i % 11 == 0 ? "\x1f\xff\n" : "");
	int64_t max_back = 0;
	const double depths[] = {0, 25, 50, 75, 100};
	for (int c = 0; c < 2; c++)
		for (int j = 0; j < 5; j++) {
			rt_needle_prompt p;
			rt_err err = {0};
			ck_assert_msg(rt_needle_niah(t, hay, len, 1500, depths[j], c, &p, &err) == 0, "%s",
			              err.msg);
			check_niah(t, &p, 1500, depths[j], c, &max_back);
			for (int64_t i = 0; i < p.n_ctx; i++) /* cleaned: no 0x1f, no raw 0xff */
				ck_assert(p.ctx[i] != 3 + 0x1f && p.ctx[i] != 3 + 0xff);
			rt_needle_prompt_free(&p);
		}
	/* sentences here are < 40 bytes, one token each */
	ck_assert_int_lt(max_back, 40);
	/* a haystack shorter than needed is repeated */
	rt_needle_prompt p;
	rt_err err = {0};
	const char *tiny = "Short text. Only two sentences.";
	ck_assert_int_eq(rt_needle_niah(t, tiny, strlen(tiny), 600, 50, 0, &p, &err), 0);
	check_niah(t, &p, 600, 50, 0, &max_back);
	rt_needle_prompt_free(&p);
	/* errors */
	ck_assert_int_eq(rt_needle_niah(t, hay, len, 50, 50, 0, &p, &err), -1);
	ck_assert_msg(!strncmp(err.msg, "niah: 50 tokens is too short", 28), "%s", err.msg);
	ck_assert_int_eq(rt_needle_niah(t, hay, 0, 600, 50, 0, &p, &err), -1);
	ck_assert_str_eq(err.msg, "niah: empty haystack text");
	ck_assert_int_eq(rt_needle_niah(t, hay, len, 600, -1, 0, &p, &err), -1);
	ck_assert_str_eq(err.msg, "niah: depth -1% outside [0, 100]");
	free(hay);
	rt_tokenizer_free(t);
}
END_TEST

/* ---- real model tokenizer ----------------------------------------------------------------- */

static rt_tokenizer *g_tok;

static void model_setup(void)
{
	rt_err err = {0};
	rt_gguf *g = rt_gguf_open(getenv("KVRT_MODEL"), &err);
	if (!g) {
		fprintf(stderr, "test_needle: %s\n", err.msg);
		return;
	}
	g_tok = rt_tokenizer_init(g, &err);
	if (!g_tok)
		fprintf(stderr, "test_needle: %s\n", err.msg);
	rt_gguf_close(g);
}

static void model_teardown(void)
{
	rt_tokenizer_free(g_tok);
	g_tok = NULL;
}

static int n_lengths(void)
{
	const char *s = getenv("KVRT_SANITIZED");
	return s && *s == '1' ? 1 : 3;
}

static const int64_t LENS[3] = {1024, 2048, 4096};
static const double DEPTHS[5] = {0, 25, 50, 75, 100};

START_TEST(test_model_passkey)
{
	ck_assert_msg(g_tok != NULL, "tokenizer did not load");
	for (int c = 0; c < 2; c++)
		for (int i = 0; i < n_lengths(); i++)
			for (int j = 0; j < 5; j++) {
				rt_needle_prompt p;
				rt_err err = {0};
				uint64_t seed = (uint64_t)LENS[i] * 1000 + (uint64_t)DEPTHS[j];
				ck_assert_msg(rt_needle_passkey(g_tok, LENS[i], DEPTHS[j], seed, c, &p, &err) ==
				              0, "%s", err.msg);
				ck_assert_int_eq(p.unit, 24); /* measured: 24 SmolLM2 tokens per repeat */
				check_passkey(g_tok, &p, LENS[i], DEPTHS[j], c);
				/* the prompt is the canonical tokenization of its own text */
				int32_t *all = malloc((size_t)LENS[i] * sizeof(int32_t));
				memcpy(all, p.ctx, (size_t)p.n_ctx * sizeof(int32_t));
				memcpy(all + p.n_ctx, p.question, (size_t)p.n_question * sizeof(int32_t));
				char *text = decode(g_tok, all, LENS[i]);
				int64_t n2;
				int32_t *re = tokenize(g_tok, text, c, &n2);
				ck_assert_int_eq(n2, LENS[i]);
				ck_assert(memcmp(re, all, (size_t)n2 * sizeof(int32_t)) == 0);
				free(re);
				free(text);
				free(all);
				rt_needle_prompt_free(&p);
			}
}
END_TEST

START_TEST(test_model_niah)
{
	ck_assert_msg(g_tok != NULL, "tokenizer did not load");
	const char *paths[] = {"/usr/share/info/coreutils.info.gz",
	                       "/usr/share/common-licenses/GPL-3"};
	char *hay = NULL;
	size_t len = 0;
	const char *used = NULL;
	for (int k = 0; k < 2 && !hay; k++) {
		rt_err err = {0};
		if (access(paths[k], R_OK) == 0 && (hay = rt_text_read(paths[k], &len, &err)))
			used = paths[k];
	}
	if (!hay) {
		fprintf(stderr, "test_needle: no haystack text found, NIAH model case skipped\n");
		return;
	}
	size_t body = rt_needle_info_body(hay, len);
	if (strstr(used, "coreutils.info"))
		ck_assert_msg(!strncmp(hay + body, "File: coreutils.info,  Node: Introduction", 41),
		              "Info body starts with %.60s", hay + body);
	int64_t max_back = 0;
	for (int b = 0; b < 2; b++)
		for (int c = 0; c < 2; c++)
			for (int i = 0; i < n_lengths(); i++)
				for (int j = 0; j < 5; j++) {
					rt_needle_prompt p;
					rt_err err = {0};
					size_t off = b ? body : 0;
					ck_assert_msg(rt_needle_niah(g_tok, hay + off, len - off, LENS[i],
					                             DEPTHS[j], c, &p, &err) == 0, "%s", err.msg);
					check_niah(g_tok, &p, LENS[i], DEPTHS[j], c, &max_back);
					rt_needle_prompt_free(&p);
				}
	fprintf(stderr, "test_needle: NIAH on %s: needle at most %lld tokens before the "
	        "requested depth\n", used, (long long)max_back);
	ck_assert_int_le(max_back, RT_NIAH_MAX_BACK);
	free(hay);
}
END_TEST

/* A multi-instruction trial with mark_system marks exactly the system message's tokens
 * (their text decoded is the message, the span's ends the template's own tokens) as span
 * `system` in every sequence of a lockstep pass, as serve marks a chat's, so `keep span
 * system` protects them; without it no entry carries the span. Full-cache sequences keep
 * every entry in order, so entry e is prompt token e. The marking is by position, so the
 * prompt is fed in the same chunks either way: the question's logits are the same bits
 * with and without it (a feed cut at the span's ends moves the fast path's rounding). */
START_TEST(test_model_instruct_system_span)
{
	ck_assert_msg(g_tok != NULL, "tokenizer did not load");
	rt_needle_prompt p;
	rt_err err = {0};
	ck_assert_msg(rt_needle_instruct(g_tok, 160, 7, &p, &err) == 0, "%s", err.msg);
	char want[256];
	snprintf(want, sizeof want, RT_INSTRUCT_SYSTEM, p.words[0], p.words[1], p.words[2]);
	char *sys = decode(g_tok, p.ctx + p.sys_pos, p.sys_len);
	ck_assert_str_eq(sys, want);
	free(sys);
	static const rt_model_opts fast = { .exact = 0, .threads = 1, .kv_type = RT_KV_F16 };
	rt_model *m = rt_model_open(getenv("KVRT_MODEL"), &fast, &err);
	ck_assert_msg(m != NULL, "%s", err.msg);
	const int V = m->hp.n_vocab;
	rt_seq a, b2;
	rt_seq *sp[2] = { &a, &b2 };
	for (int k = 0; k < 2; k++) {
		ck_assert_msg(rt_seq_init(sp[k], m, &rt_policy_full, 200, 16, -1, &err) == 0, "%s",
		              err.msg);
		rt_seq_use_spans(sp[k]);
	}
	rt_seq_batch b;
	ck_assert_msg(rt_seq_batch_init(&b, sp, 2, 16, &err) == 0, "%s", err.msg);
	float *logits = malloc((size_t)2 * V * sizeof *logits), *one = malloc((size_t)V * sizeof *one);
	float *marked = malloc((size_t)2 * V * sizeof *marked);
	rt_needle_answer ans[2];
	for (int mark = 1; mark >= 0; mark--) {
		const rt_needle_how how = { .agnostic = 1, .mark_system = mark, .n_gen = 1 };
		ck_assert_msg(rt_needle_trial(sp, 2, &b, g_tok, &p, &how, logits, one, ans, &err) == 0,
		              "%s", err.msg);
		if (mark)
			memcpy(marked, logits, (size_t)2 * V * sizeof *logits);
		else
			ck_assert_msg(!memcmp(marked, logits, (size_t)2 * V * sizeof *logits),
			              "marking the system span changed the question's logits");
		for (int k = 0; k < 2; k++)
			for (int h = 0; h < m->hp.n_layer * m->hp.n_head_kv; h++) {
				const rt_kv_head *kh = &sp[k]->kv.heads[h];
				ck_assert_int_ge(kh->n, p.n_ctx);
				for (int64_t e = 0; e < p.n_ctx; e++) {
					const int in = e >= p.sys_pos && e < p.sys_pos + p.sys_len;
					ck_assert_msg(kh->span[e] == (mark && in ? RT_SPAN_SYSTEM : 0),
					              "mark %d seq %d head %d entry %lld: span %d", mark, k, h,
					              (long long)e, (int)kh->span[e]);
				}
			}
	}
	free(logits);
	free(marked);
	free(one);
	rt_seq_batch_free(&b);
	rt_seq_free(&a);
	rt_seq_free(&b2);
	rt_model_free(m);
	rt_needle_prompt_free(&p);
}
END_TEST

static Suite *needle_suite(void)
{
	Suite *s = suite_create("needle");
	TCase *tc = tcase_create("core");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_score_passkey);
	tcase_add_test(tc, test_score_niah);
	tcase_add_test(tc, test_passkey_seed);
	tcase_add_test(tc, test_info_body);
	tcase_add_test(tc, test_syn_passkey);
	tcase_add_test(tc, test_syn_niah);
	tcase_add_test(tc, test_syn_multikey);
	tcase_add_test(tc, test_syn_instruct);
	tcase_add_test(tc, test_instruct_score);
	suite_add_tcase(s, tc);
	const char *model = getenv("KVRT_MODEL");
	if (model && *model) {
		TCase *tm = tcase_create("model");
		tcase_set_timeout(tm, 600);
		tcase_add_unchecked_fixture(tm, model_setup, model_teardown);
		tcase_add_test(tm, test_model_passkey);
		tcase_add_test(tm, test_model_niah);
		tcase_add_test(tm, test_model_instruct_system_span);
		suite_add_tcase(s, tm);
	} else {
		fprintf(stderr, "test_needle: KVRT_MODEL not set, real-model cases skipped\n");
	}
	return s;
}

int main(void)
{
	int failed = check_run(needle_suite());
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
