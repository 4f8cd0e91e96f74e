/*
 * rt_span: the protected spans the runtime marks, by name. A policy's `keep span NAME`
 * keeps the entries of the span called NAME whole (docs/language.md, section 2); kvpc
 * accepts only the names below (compiler/kvp_sema.c), since any other name would be marked
 * by no caller and protect nothing. Who marks each (rt_seq_set_span_names, rt_seq_span,
 * rt_seq_span_range):
 *   system    the system message of a chat request (runtime/serve), of `run --chat
 *             --system` (runtime/cli/rt_cmd_run.c), and of needle's multi-instruction
 *             prompt, by position (runtime/eval/rt_needle.c)
 *   pinned    a message or prompt segment a request sends with "protect": true
 *             (runtime/serve)
 *   question  the question after the context in needle's and tune's passkey trials
 *             (runtime/cli/rt_cmd_needle.c, runtime/eval/rt_tune.c)
 * A new span is a new row here and a caller that marks it. Every sequence that marks spans
 * names them with rt_seq_use_spans (runtime/policy/rt_seq.h), so a span has one id in
 * the whole runtime: RT_SPAN_<ROW>.
 */
#ifndef RT_SPAN_H
#define RT_SPAN_H

#include <stdint.h>

#include "k_abi.h"

/* One row per span: X(ID, "name"); the ids are the rows' order from 1. */
#define RT_SPANS(X) X(SYSTEM, "system") X(PINNED, "pinned") X(QUESTION, "question")

enum rt_span_id {
	RT_SPAN_NONE = 0, /* an entry in no span */
#define RT_SPAN_ID_(id, name) RT_SPAN_##id,
	RT_SPANS(RT_SPAN_ID_)
#undef RT_SPAN_ID_
	RT_SPAN_END
};

/* The names, as an initializer (the compiler's list of the names it accepts). */
#define RT_SPAN_NAME_(id, name) name,
#define RT_SPAN_NAMES { RT_SPANS(RT_SPAN_NAME_) }
#define RT_N_SPAN_NAMES (RT_SPAN_END - 1)

/* What a sequence marks the entries it appends with (rt_seq_span, rt_seq_span_range):
 * the current id, and a range of token positions [lo, hi) whose entries get range_id
 * instead. The range lets a caller mark a span inside a prompt fed in one piece, so that
 * marking does not cut the prefill's chunks (which moves a fast-path forward's rounding
 * and with it a small model's answers). */
typedef struct rt_span_mark {
	uint16_t cur;      /* span id of the entries appended next (0: none) */
	uint16_t range_id; /* span id of those at positions [lo, hi); 0: no range */
	int64_t lo, hi;
} rt_span_mark;

/* The span id of an entry appended at token position pos. The one rule, for the host's
 * append hook (runtime/policy/rt_seq.c) and the CUDA append kernel
 * (runtime/cuda/rt_cuda_kernels.cuh). */
K_HD uint16_t rt_span_mark_at(rt_span_mark m, int64_t pos)
{
	return m.range_id && pos >= m.lo && pos < m.hi ? m.range_id : m.cur;
}

#endif
