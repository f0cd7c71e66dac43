/* send-buffer.c - see send-buffer.h. */
#include "daemon/send-buffer.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int dsend_buffer_set(int fd, int bytes)
{
    return setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes) == 0 ? 0 : -errno;
}

int dsend_buffer_probe(int bytes, int *got, struct dg_error *err)
{
    int sv[2], e;
    socklen_t len = sizeof *got;

    *got = 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return dg_error_set(err, DG_E_IO, "send_buffer_bytes: socketpair: %s", strerror(errno));
    e = dsend_buffer_set(sv[0], bytes);
    if (e == 0 && getsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, got, &len) != 0)
        e = -errno;
    close(sv[0]);
    close(sv[1]);
    if (e != 0)
        return dg_error_set(err, DG_E_IO, "send_buffer_bytes %d: SO_SNDBUF: %s", bytes,
                            strerror(-e));
    return 0;
}
