/*
 * rt_cmd: the commands of the shared command line (runtime/cli/rt_cli.c dispatches to
 * them), one file each: rt_cmd_info.c, rt_cmd_ppl.c, rt_cmd_needle.c, rt_cmd_run.c,
 * rt_cmd_tokenize.c, rt_cmd_bench.c, rt_cmd_keepmap.c, rt_cmd_serve.c, rt_cmd_ab.c,
 * rt_cmd_tune.c, over the one option table of rt_cli_opts.h. argv[0] is the command's name;
 * each returns the exit status (0 success, 1 runtime error, 2 usage error) and answers
 * -h/--help with its man page and --version.
 */
#ifndef RT_CMD_H
#define RT_CMD_H

int rt_cmd_info(int argc, char **argv);
int rt_cmd_ppl(int argc, char **argv);
int rt_cmd_needle(int argc, char **argv);
int rt_cmd_run(int argc, char **argv);
int rt_cmd_tokenize(int argc, char **argv);
int rt_cmd_bench(int argc, char **argv);
int rt_cmd_keepmap(int argc, char **argv);
int rt_cmd_serve(int argc, char **argv);
int rt_cmd_ab(int argc, char **argv);
int rt_cmd_tune(int argc, char **argv);

#endif
