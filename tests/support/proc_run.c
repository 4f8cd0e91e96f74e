/*
 * proc_run: a command in a child process with its output captured (see proc_run.h).
 */
#include "proc_run.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The whole of f from its start, NUL-terminated (heap); NULL when reading fails. */
static char *read_back(FILE *f)
{
	if (fseek(f, 0, SEEK_SET) != 0)
		return NULL;
	size_t n = 0, cap = 4096;
	char *s = malloc(cap);
	while (s) {
		n += fread(s + n, 1, cap - 1 - n, f);
		if (ferror(f))
			break;
		if (n < cap - 1) {
			s[n] = 0;
			return s;
		}
		char *t = realloc(s, cap * 2);
		if (!t)
			break;
		s = t;
		cap *= 2;
	}
	free(s);
	return NULL;
}

/* The child: both streams into the capture files, the alarm set, then execv(argv[0]) (fn
 * NULL) or fn; never returns. */
static void child(proc_main_fn fn, void *user, char *argv[], unsigned limit_s, FILE *fo,
                  FILE *fe)
{
	if (dup2(fileno(fo), 1) < 0 || dup2(fileno(fe), 2) < 0)
		_exit(126);
	fclose(fo);
	fclose(fe);
	alarm(limit_s);
	if (!fn) {
		execv(argv[0], argv);
		fprintf(stderr, "%s: execv: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	int argc = 0;
	while (argv[argc])
		argc++;
	int rc = fn(argc, argv, user);
	fflush(NULL);
	_exit(rc);
}

static int run(proc_main_fn fn, void *user, char *argv[], unsigned limit_s, char **out,
               char **err)
{
	if (out)
		*out = NULL;
	if (err)
		*err = NULL;
	FILE *fo = tmpfile(), *fe = tmpfile();
	if (!fo || !fe) {
		fprintf(stderr, "proc_run: %s: tmpfile: %s\n", argv[0], strerror(errno));
		goto fail;
	}
	fflush(NULL); /* nothing buffered here may be written twice, by the child too */
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "proc_run: %s: fork: %s\n", argv[0], strerror(errno));
		goto fail;
	}
	if (pid == 0)
		child(fn, user, argv, limit_s, fo, fe);
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR) {
			fprintf(stderr, "proc_run: %s: waitpid: %s\n", argv[0], strerror(errno));
			goto fail;
		}
	char *o = out ? read_back(fo) : NULL, *e = err ? read_back(fe) : NULL;
	if ((out && !o) || (err && !e)) {
		fprintf(stderr, "proc_run: %s: cannot read the captured output back\n", argv[0]);
		free(o);
		free(e);
		goto fail;
	}
	if (out)
		*out = o;
	if (err)
		*err = e;
	fclose(fo);
	fclose(fe);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
fail:
	if (fo)
		fclose(fo);
	if (fe)
		fclose(fe);
	return -1;
}

int proc_exec(char *const argv[], unsigned limit_s, char **out, char **err)
{
	return run(NULL, NULL, (char **)argv, limit_s, out, err);
}

int proc_call(proc_main_fn fn, void *user, char *argv[], unsigned limit_s, char **out,
              char **err)
{
	return run(fn, user, argv, limit_s, out, err);
}

int proc_bin_path(const char *name, const char *env, char *buf, size_t cap)
{
	const char *v = env ? getenv(env) : NULL;
	if (v && *v)
		return (size_t)snprintf(buf, cap, "%s", v) < cap ? 0 : -1;
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0)
		return -1;
	exe[n] = 0;
	*strrchr(exe, '/') = 0; /* BUILD/tests */
	char *up = strrchr(exe, '/');
	if (up)
		*up = 0; /* BUILD */
	return (size_t)snprintf(buf, cap, "%s/%s", exe, name) < cap ? 0 : -1;
}
