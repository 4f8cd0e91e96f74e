/*
 * rt_outpath: checks, before a command does any model work, that each file it will write
 * at the end (--json, --csv, --plot, --svg, --dump, --logits) can be written, so a typo
 * in a path fails in a second instead of after the whole run. Nothing is created or
 * truncated: an existing path must be writable and not a directory; a new path needs an
 * existing, writable directory. (A path can still fail later, e.g. on a full disk.)
 * rt_outpath_write then writes such a file whole at the end.
 */
#ifndef RT_OUTPATH_H
#define RT_OUTPATH_H

#include "base/rt_util.h"

/* 0 when path can be opened for writing as described above; -1 with one line
 * "PATH: reason" in err ("out/r.json: directory 'out' does not exist",
 * "results: is a directory", "/proc/x: cannot write: Permission denied"). */
int rt_outpath_check(const char *path, rt_err *err);

/* Creates or truncates path and writes data[0..n) to it (the caller keeps data). 0, or
 * -1 with err "PATH: cannot open for writing: REASON" or "PATH: write failed: REASON"
 * (a short write or a failed close, e.g. a full disk). */
int rt_outpath_write(const char *path, const char *data, size_t n, rt_err *err);

#endif
