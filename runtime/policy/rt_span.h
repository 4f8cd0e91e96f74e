/*
 * rt_span: the protected spans the runtime marks, by name. A policy's `keep span NAME`
 * keeps the entries of the span called NAME whole (docs/language.md, section 2); kvpc
 * accepts only the names below (compiler/kvp_sema.c), since any other name would be marked
 * by no caller and protect nothing. Who marks each (rt_seq_set_span_names, rt_seq_span):
 *   system    the system message of a chat request (runtime/serve)
 *   pinned    a message or prompt segment a request sends with "protect": true
 *             (runtime/serve)
 *   question  the question after the context in needle's and tune's passkey trials
 *             (runtime/cli/rt_cmd_needle.c, runtime/eval/rt_tune.c)
 * A new span is a new row here and a caller that marks it.
 */
#ifndef RT_SPAN_H
#define RT_SPAN_H

#define RT_SPAN_NAMES { "system", "pinned", "question" }
#define RT_N_SPAN_NAMES 3

#endif
