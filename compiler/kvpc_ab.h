/*
 * kvpc_ab: the front of the A/B comparison. `kvpc ab A.kvp B.kvp --model M --text FILE
 * [...]` builds (cached, kvpc_build.h) both policies into one binary and hands the
 * comparison to that binary's `ab` command (runtime/eval/rt_ab.h documents its options).
 */
#ifndef KVPC_AB_H
#define KVPC_AB_H

/* `kvpc ab A.kvp B.kvp --model M --text FILE [options]` (argv excludes "ab"): builds
 * (cached) both policies into one binary and executes `BIN ab --a NAME --b NAME ...` with
 * the remaining options. The text and the --json/--csv/--plot paths are checked before the
 * build. Returns only on error (1 build or output error, 2 usage error) or for --help (0). */
int kvpc_cmd_ab(int argc, char **argv);

#endif
