/*
 * kvrt: the command-line front end of libkvrt — a thin wrapper over the shared command
 * line (runtime/cli/rt_cli.h) with only the built-in `full` policy (every token kept: the
 * exact baseline every compression policy is compared against). Commands: info, ppl,
 * needle, run, tokenize, bench; `kvrt COMMAND --help` documents each. Per-deployment
 * binaries built by `kvpc build` run the same command line with their compiled policies.
 * Exit status: 0 success, 1 runtime error, 2 usage error; errors are one line on stderr,
 * "kvrt: PATH: reason".
 */
#include "cli/rt_cli.h"
#include "model/rt_model.h"

int main(int argc, char **argv)
{
	rt_model_blas_setup(argv);
	return rt_cli_main(argc, argv, NULL, 0);
}
