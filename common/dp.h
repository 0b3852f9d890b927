/* dp.h: error codes, error-message and logging helpers shared by every folder.
 * It depends on nothing, so every layer of DESIGN.md's table may include it. */
#ifndef DP_COMMON_DP_H
#define DP_COMMON_DP_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* Functions return 0 or one of these (negative). */
enum {
    DP_OK = 0,
    DP_EINVAL = -1,        /* bad argument or bad input */
    DP_ENOMEM = -2,        /* allocation failed */
    DP_EIO = -3,           /* open/read/mmap failed */
    DP_EFORMAT = -4,       /* malformed file or data */
    DP_EUNSUPPORTED = -5,  /* well-formed but not supported */
    DP_ENOSPC = -6,        /* a pool or buffer is full */
    DP_ERANGE = -7,        /* value out of range */
    DP_ENOTFOUND = -8,     /* key, tensor or token missing */
    DP_EDEVICE = -9,       /* the device is lost for good: only a restart recovers */
};

const char *dp_strerror(int code);

/* Formats a one-line message into err (if err != NULL) and returns code. */
int dp_err(char *err, size_t errsz, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

enum dp_log_level { DP_LOG_ERROR = 0, DP_LOG_WARN = 1, DP_LOG_INFO = 2, DP_LOG_DEBUG = 3 };

void dp_log_set_level(int level);
int dp_log_get_level(void);
void dp_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DP_ERRLEN 256

/* Monotonic clock in seconds, for benchmarks and logs. */
double dp_now(void);

#endif
