/*
 * rt_decode: the one decode loop of the command line, used by `run` (streamed to standard
 * output, greedy or sampled), the needle trials of `needle` and `ab --task needle`
 * (rt_needle_trial, greedy) and the tests. serve steps its sequences in its scheduler
 * (runtime/serve/rt_serve_sched.c) with the same sampler.
 */
#ifndef RT_DECODE_H
#define RT_DECODE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "eval/rt_sample.h"
#include "model/rt_tokenizer.h"
#include "policy/rt_seq.h"
#include "base/rt_util.h"

/* Generate up to n_gen tokens on s after `logits`, the [n_vocab] row of the last token fed
 * (overwritten with each new token's row): each step takes the argmax (lowest id on
 * ties) when smp is NULL, else rt_sample(smp) (temperature, top-k, top-p; its generator
 * advances; temperature 0 is the same argmax), stops at an end-of-generation token, and otherwise feeds it back (RT_LOGITS_LAST)
 * unless it was the last one or the model's context_length or the store's capacity is
 * reached. Each token's bytes go to out as they are produced (NULL: nowhere; flushed per
 * token) and are appended to text[cap] (NUL-terminated; a piece that does not fit is left
 * out; cap 0: no text). Returns the tokens generated, or -1 with err set (rt_seq_feed's
 * errors). */
int64_t rt_decode(rt_seq *s, const rt_tokenizer *tk, rt_sampler *smp, float *logits,
                  int64_t n_gen, char *text, size_t cap, FILE *out, rt_err *err);

#endif
