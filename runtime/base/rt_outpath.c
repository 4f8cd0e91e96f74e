/*
 * rt_outpath: the up-front check of output paths (see rt_outpath.h), with stat(2) and
 * access(2) only, so it has no side effect on the file system.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/rt_outpath.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int rt_outpath_check(const char *path, rt_err *err)
{
	if (!path || !*path)
		return rt_err_set(err, "(empty path): not a file name");
	struct stat st;
	if (stat(path, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return rt_err_set(err, "%s: is a directory", path);
		if (access(path, W_OK) != 0)
			return rt_err_set(err, "%s: cannot write: %s", path, strerror(errno));
		return 0;
	}
	if (errno != ENOENT)
		return rt_err_set(err, "%s: %s", path, strerror(errno));
	if (path[strlen(path) - 1] == '/')
		return rt_err_set(err, "%s: names a directory, not a file", path);
	/* the directory part: everything before the last '/', "/" for "/x", "." for "x" */
	const char *slash = strrchr(path, '/');
	size_t dl = slash ? (size_t)(slash - path) : 0;
	char *dir = malloc(dl + 2);
	if (!dir)
		return rt_err_set(err, "%s: out of memory", path);
	if (!slash)
		strcpy(dir, ".");
	else if (dl == 0)
		strcpy(dir, "/");
	else
		memcpy(dir, path, dl), dir[dl] = '\0';
	int rc = 0;
	if (stat(dir, &st) != 0)
		rc = errno == ENOENT ? rt_err_set(err, "%s: directory '%s' does not exist", path, dir)
		                     : rt_err_set(err, "%s: directory '%s': %s", path, dir, strerror(errno));
	else if (!S_ISDIR(st.st_mode))
		rc = rt_err_set(err, "%s: '%s' is not a directory", path, dir);
	else if (access(dir, W_OK | X_OK) != 0)
		rc = rt_err_set(err, "%s: cannot create a file in '%s': %s", path, dir, strerror(errno));
	free(dir);
	return rc;
}

int rt_outpath_write(const char *path, const char *data, size_t n, rt_err *err)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return rt_err_set(err, "%s: cannot open for writing: %s", path, strerror(errno));
	int bad = fwrite(data, 1, n, f) != n;
	if (fclose(f) != 0 || bad)
		return rt_err_set(err, "%s: write failed: %s", path, strerror(errno));
	return 0;
}
