/* dp.c: error strings, error formatting and the stderr logger.
 * One line per event so that journald keeps each message whole. */
#include "dp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int g_log_level = DP_LOG_INFO;

const char *dp_strerror(int code)
{
    switch (code) {
    case DP_OK: return "ok";
    case DP_EINVAL: return "invalid argument";
    case DP_ENOMEM: return "out of memory";
    case DP_EIO: return "i/o error";
    case DP_EFORMAT: return "malformed data";
    case DP_EUNSUPPORTED: return "not supported";
    case DP_ENOSPC: return "no space left in pool";
    case DP_ERANGE: return "value out of range";
    case DP_ENOTFOUND: return "not found";
    case DP_EDEVICE: return "device lost";
    default: return "unknown error";
    }
}

int dp_err(char *err, size_t errsz, int code, const char *fmt, ...)
{
    if (err && errsz) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errsz, fmt, ap);
        va_end(ap);
    }
    return code;
}

void dp_log_set_level(int level) { g_log_level = level; }
int dp_log_get_level(void) { return g_log_level; }

/* True when stderr is the journal stream systemd set up for us
 * (JOURNAL_STREAM = "dev:ino" of that stream): then each line starts with a
 * syslog priority, "<3>" ... "<7>", which journald turns into the level. */
static bool stderr_is_journal(void)
{
    static int cached = -1;
    if (cached < 0) {
        const char *js = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;
        cached = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
                 (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
    }
    return cached == 1;
}

void dp_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    static const int prio[] = {3, 4, 6, 7};
    if (level > g_log_level)
        return;
    int l = level < 0 ? 0 : level > 3 ? 3 : level;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (stderr_is_journal())
        fprintf(stderr, "<%d>dualpathd[%s] %s\n", prio[l], names[l], line);
    else
        fprintf(stderr, "dualpathd[%s] %s\n", names[l], line);
}

double dp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
