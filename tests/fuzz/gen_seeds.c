/*
 * gen_seeds: writes the generated seeds of fuzz_gguf into DIR/gguf: tiny llama models
 * (tests/support/tiny_model.c) with F32, Q8_0 and Q4_1 weights and grouped-query shapes
 * 4/1 and 9/3, each small enough (a few KB) for libFuzzer to mutate quickly.
 * Usage: gen_seeds DIR (run by `make fuzz-build`).
 */
#include <stdio.h>
#include <sys/stat.h>

#include "model/rt_gguf.h"
#include "tiny_model.h"

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_seeds DIR\n");
		return 2;
	}
	static const struct {
		const char *name;
		tiny_model_cfg cfg;
	} seeds[] = {
		{ "f32-2x1.gguf", { 1, 8, 2, 1, 16, 40, 16, 10000, 1, RT_GGML_F32 } },
		{ "q8_0-4x1.gguf", { 1, 32, 4, 1, 32, 40, 16, 10000, 2, RT_GGML_Q8_0 } },
		{ "q4_1-4x1.gguf", { 1, 32, 4, 1, 32, 40, 16, 10000, 3, RT_GGML_Q4_1 } },
		{ "f32-9x3.gguf", { 2, 18, 9, 3, 8, 300, 32, 10000, 4, RT_GGML_F32 } },
	};
	char path[4096];
	snprintf(path, sizeof path, "%s/gguf", argv[1]);
	mkdir(path, 0777);
	for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
		snprintf(path, sizeof path, "%s/gguf/%s", argv[1], seeds[i].name);
		if (tiny_model_write(&seeds[i].cfg, path) != 0) {
			fprintf(stderr, "gen_seeds: cannot write %s\n", path);
			return 1;
		}
	}
	return 0;
}
