/* sdnotify.c - the sd_notify datagram (see sdnotify.h). */
#include "daemon/sdnotify.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int sd_notify_send(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un a;
    socklen_t alen;
    size_t n;
    int fd;
    ssize_t w;

    if (!path || (path[0] != '/' && path[0] != '@'))
        return 0;
    n = strlen(path);
    if (n >= sizeof a.sun_path)
        return -1;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, path, n);
    if (path[0] == '@')
        a.sun_path[0] = '\0'; /* the abstract namespace */
    alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    w = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&a, alen);
    close(fd);
    return w < 0 ? -1 : 1;
}
