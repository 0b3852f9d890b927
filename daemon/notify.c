/* notify.c: the sd_notify protocol written out: a datagram on an AF_UNIX
 * socket whose path is $NOTIFY_SOCKET ('@' = the abstract namespace). */
#include "notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/dp.h"

bool notify_enabled(void)
{
    const char *p = getenv("NOTIFY_SOCKET");
    return p && *p;
}

int notify_send(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || n >= sizeof sa.sun_path) {
        dp_log(DP_LOG_DEBUG, "notify: NOTIFY_SOCKET '%s' is not a usable AF_UNIX address", path);
        return DP_EINVAL;
    }
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@')
        sa.sun_path[0] = 0; /* abstract: the name is not NUL-terminated */
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        dp_log(DP_LOG_DEBUG, "notify: socket: %s", strerror(errno));
        return DP_EIO;
    }
    ssize_t r;
    do
        r = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (const struct sockaddr *)&sa, len);
    while (r < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (r < 0) {
        dp_log(DP_LOG_DEBUG, "notify: send to %s: %s", path, strerror(e));
        return DP_EIO;
    }
    return 1;
}

int notify_sendf(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return notify_send(buf);
}

static bool parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || s[0] == '-')
        return false;
    *out = v;
    return true;
}

uint64_t notify_watchdog_usec(void)
{
    uint64_t usec, pid;
    if (!parse_u64(getenv("WATCHDOG_USEC"), &usec) || usec == 0)
        return 0;
    /* WATCHDOG_PID names the process that must ping; when it is set and is
     * not us (a wrapper exec'd us under another pid), the beats are not ours. */
    const char *p = getenv("WATCHDOG_PID");
    if (p && *p && (!parse_u64(p, &pid) || pid != (uint64_t)getpid()))
        return 0;
    return usec;
}
