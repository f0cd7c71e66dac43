/* sql-peek.c - see sql-peek.h. */
#include "tests/sql-peek.h"

#include <sqlite3.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int64_t test_sql_int(const char *db, const char *fmt, ...)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    va_list ap;
    char *sql;
    va_start(ap, fmt);
    sql = sqlite3_vmprintf(fmt, ap);
    va_end(ap);
    if (sql && sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(h, 2000);
        if (sqlite3_prepare_v2(h, sql, -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
            v = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    sqlite3_close(h);
    sqlite3_free(sql);
    return v;
}

char *test_sql_text(const char *db, int writable, const char *sql)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    char *v = NULL;
    if (sqlite3_open_v2(db, &h, writable ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY, NULL) ==
        SQLITE_OK) {
        sqlite3_busy_timeout(h, 2000);
        if (sqlite3_prepare_v2(h, sql, -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
            v = strdup((const char *)sqlite3_column_text(st, 0));
    }
    sqlite3_finalize(st);
    sqlite3_close(h);
    return v;
}
