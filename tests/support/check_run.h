/*
 * check_run: the end of every test program's main: run a check suite and count what
 * failed.
 */
#ifndef CHECK_RUN_H
#define CHECK_RUN_H

#include <check.h>

/* Run every test of s (CK_NORMAL; CK_FORK and the other CK_* environment variables still
 * apply), free the runner (and with it s) and return how many tests failed. */
int check_run(Suite *s);

#endif
