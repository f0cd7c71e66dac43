/*
 * Description: what daemon/send-buffer.c asks of the kernel and reads back
 * (Linux).  A UNIX stream socket asked for a send buffer of B bytes gets
 * twice B where net.core.wmem_max allows B, and twice wmem_max where B
 * passes it (read from /proc/sys/net/core/wmem_max, the kernel's rule in
 * socket(7)); dsend_buffer_set on a socket gives what the probe reads; a
 * bad descriptor is an error, not a silent success.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/send-buffer.h"
#include "tests/harness.h"

/* net.core.wmem_max, or -1 where it cannot be read */
static long long wmem_max(void)
{
    return test_read_ll("/proc/sys/net/core/wmem_max");
}

static int probe_doubles(void)
{
    const long long max = wmem_max();
    static const int asked[] = {4096, 8192, 65536, 212992};
    struct dg_error err;
    if (max < 0)
        return test_skip("no /proc/sys/net/core/wmem_max");
    for (size_t i = 0; i < sizeof asked / sizeof asked[0]; i++) {
        int got = -1;
        const long long want = 2 * (asked[i] < max ? asked[i] : max);
        CHECKF(dsend_buffer_probe(asked[i], &got, &err) == 0, "%s", err.msg);
        CHECKF(got == want, "asked %d, got %d, want %lld (wmem_max %lld)", asked[i], got, want,
               max);
    }
    return 0;
}

static int probe_past_wmem_max(void)
{
    const long long max = wmem_max();
    struct dg_error err;
    int got = -1;
    if (max < 0)
        return test_skip("no /proc/sys/net/core/wmem_max");
    if (max >= 67108864)
        return test_skip("wmem_max %lld is past what send_buffer_bytes may ask", max);
    CHECKF(dsend_buffer_probe((int)max + 1, &got, &err) == 0, "%s", err.msg);
    CHECKF(got == 2 * max, "asked %lld, got %d, want %lld", max + 1, got, 2 * max);
    /* what dgemmad warns of: less than twice what was asked */
    CHECK(got / 2 < (int)max + 1);
    return 0;
}

static int set_is_what_probe_reads(void)
{
    int sv[2], got = -1, probed = -1;
    socklen_t len = sizeof got;
    struct dg_error err;
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    CHECK(dsend_buffer_set(sv[0], 12288) == 0);
    CHECK(getsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &got, &len) == 0);
    close(sv[0]);
    close(sv[1]);
    CHECKF(dsend_buffer_probe(12288, &probed, &err) == 0, "%s", err.msg);
    CHECKF(got == probed && got > 0, "set %d, probed %d", got, probed);
    return 0;
}

static int bad_fd(void)
{
    CHECK(dsend_buffer_set(-1, 8192) == -EBADF);
    return 0;
}

int main(void)
{
    TEST_CASE(probe_doubles);
    TEST_CASE(probe_past_wmem_max);
    TEST_CASE(set_is_what_probe_reads);
    TEST_CASE(bad_fd);
    return test_finish();
}
