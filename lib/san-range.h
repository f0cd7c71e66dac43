/* san-range.h - hot loops that the sanitizers check a range at a time.
 *
 * AddressSanitizer and ThreadSanitizer check every load and store, and
 * UBSan every index and pointer sum, and in an inner product that is most
 * of the work: under ASan the CPU backend's dot products ran about thirty
 * times slower than in the plain build, and the daemon tests spent their
 * time there.  A function marked DG_SAN_RANGE_CHECKED is compiled without
 * that instrumentation; its caller (which stays instrumented) declares
 * each whole byte range the function will read or write with
 * dg_san_read() or dg_san_write(), once, before calling it.
 *
 *   ASan: a range with a bad byte in it (outside its block, freed, a
 *         redzone) gets ASan's ordinary report of that byte and the
 *         program stops, as a load of it in the loop would have.
 *   TSan: the range is recorded as read or written at the call, so a
 *         race with another thread's access to it is reported as one in
 *         the loop would have been.
 *   Neither: both are nothing.
 *
 * Only for loops whose every access lies in ranges their caller can name
 * before they start.  UBSan's checks of the loop's arithmetic are given
 * up with it. */
#ifndef DG_SAN_RANGE_H
#define DG_SAN_RANGE_H

#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#define DG_SAN_ADDRESS 1
#elif defined(__SANITIZE_THREAD__)
#define DG_SAN_THREAD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DG_SAN_ADDRESS 1
#elif __has_feature(thread_sanitizer)
#define DG_SAN_THREAD 1
#endif
#endif

#if defined(DG_SAN_ADDRESS)
#include <sanitizer/asan_interface.h>

#define DG_SAN_RANGE_CHECKED __attribute__((no_sanitize("address", "undefined")))

/* That the n bytes at p may be accessed; if one may not, it is loaded
 * through an instrumented access, so that ASan reports it. */
static inline void dg_san_read(const void *p, size_t n)
{
    const volatile char *bad = __asan_region_is_poisoned((void *)(size_t)p, n);
    if (bad)
        (void)*bad;
}

static inline void dg_san_write(void *p, size_t n)
{
    dg_san_read(p, n);
}
#elif defined(DG_SAN_THREAD)
/* (exported by the TSan runtime, not declared in its public header) */
void __tsan_read_range(void *addr, unsigned long size);
void __tsan_write_range(void *addr, unsigned long size);

#define DG_SAN_RANGE_CHECKED __attribute__((no_sanitize("thread", "undefined")))

static inline void dg_san_read(const void *p, size_t n)
{
    __tsan_read_range((void *)(size_t)p, n);
}

static inline void dg_san_write(void *p, size_t n)
{
    __tsan_write_range(p, n);
}
#else
#define DG_SAN_RANGE_CHECKED
static inline void dg_san_read(const void *p, size_t n)
{
    (void)p;
    (void)n;
}

static inline void dg_san_write(void *p, size_t n)
{
    (void)p;
    (void)n;
}
#endif

#endif
