/*
 * alloc-wrap.h - the allocation functions a fault injector takes over when
 * the link wraps them (Makefile's FAULT_WRAP: -Wl,--wrap=NAME for each):
 * the program's calls of NAME reach __wrap_NAME, which the injector
 * defines, and __real_NAME is the allocator underneath (libc's, or a
 * sanitizer's).  Used by t-alloc-failures and by failmalloc.c built with
 * DG_FAULT_WRAP.
 */
#ifndef DG_TESTS_FAULT_ALLOC_WRAP_H
#define DG_TESTS_FAULT_ALLOC_WRAP_H

#include <stddef.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_posix_memalign(void **out, size_t align, size_t n);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
int __wrap_posix_memalign(void **out, size_t align, size_t n);

#endif
