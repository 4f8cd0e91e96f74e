/*
 * fuzz_kvpc_check: libFuzzer target for the kvpc front end (`kvpc check` and `kvpc fmt`).
 * Any byte string is a .kvp source: it must produce diagnostics or a checked IR, never a
 * crash, hang, leak or sanitizer report. When it parses, the formatter must be
 * idempotent (fmt(fmt(x)) == fmt(x)) and must keep the file compiling: both are
 * asserted, so the fuzzer also searches for formatter bugs. A policy that compiles is
 * also emitted as C (into memory), which fuzzes the back end's emitter on every IR the
 * front end accepts.
 * Built by `make fuzz` (clang -fsanitize=fuzzer,address,undefined); seeds: policies/
 * and tests/golden/kvp/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvp_emit_c.h"
#include "kvp_fmt.h"
#include "kvp_ir.h"
#include "kvp_sema.h"
#include "kvp_src.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kvp_src *src = kvp_src_from_mem("fuzz.kvp", (const char *)data, size);
	struct kvp_ir ir;
	int compiled = kvp_compile(src, &ir) == 0;
	if (compiled) {
		char *c = NULL;
		size_t len = 0;
		FILE *mem = open_memstream(&c, &len);
		struct kvp_emit_opts opts = { .line_directives = 1, .out_name = "fuzz.c" };
		if (mem) {
			if (kvp_emit_c(&ir, &opts, mem) != 0)
				abort();
			fclose(mem);
		}
		free(c);
		kvp_ir_free(&ir);
	}
	kvp_src_free(src);

	src = kvp_src_from_mem("fuzz.kvp", (const char *)data, size);
	char *once = kvp_fmt_src(src);
	kvp_src_free(src);
	if (once) {
		src = kvp_src_from_mem("fuzz.kvp", once, strlen(once));
		char *twice = kvp_fmt_src(src);
		if (!twice || strcmp(once, twice) != 0) {
			fprintf(stderr, "fmt is not idempotent:\n%s\n---\n%s\n", once,
			        twice ? twice : "(does not parse)");
			abort();
		}
		kvp_src_free(src);
		src = kvp_src_from_mem("fuzz.kvp", once, strlen(once));
		int again = kvp_compile(src, &ir) == 0;
		if (again)
			kvp_ir_free(&ir);
		if (again != compiled) {
			fprintf(stderr, "fmt changed whether the policy compiles:\n%s\n", once);
			abort();
		}
		kvp_src_free(src);
		free(twice);
		free(once);
	}
	return 0;
}
