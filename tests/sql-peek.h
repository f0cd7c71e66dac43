/*
 * sql-peek.h - the tests' look into a metrics database from outside: each
 * call opens a connection of its own (the writer's view is not trusted),
 * waits up to 2 s for locks, runs one statement, reads the first column
 * of its first row and closes.
 */
#ifndef DG_TESTS_SQL_PEEK_H
#define DG_TESTS_SQL_PEEK_H

#include <stdint.h>

/* The integer the statement (printf-style) gives, or -1 on any error or a
 * NULL.  Read-only. */
int64_t test_sql_int(const char *db, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The text the statement gives (malloc'd), or NULL.  writable opens the
 * database read-write, which lets SQLite recover a journal a killed
 * writer left behind (PRAGMA integrity_check after a SIGKILL). */
char *test_sql_text(const char *db, int writable, const char *sql);

#endif
