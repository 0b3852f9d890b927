/* errors.h: OpenAI-style error bodies ({"error": {message, type, param, code}})
 * and the error kinds the HTTP layer answers with. */
#ifndef DP_API_ERRORS_H
#define DP_API_ERRORS_H

#include <stddef.h>

/* What a failed request becomes on the wire. */
typedef struct dp_api_err {
    int status;          /* HTTP status: 400, 404, 405, 413, 429, 500, 503 */
    const char *type;    /* "invalid_request_error", ... (static string) */
    const char *code;    /* static string or NULL */
    char param[64];      /* empty: null */
    const char *allow; /* 405: the Allow header (static string) */
    char message[512];
} dp_api_err;

/* Fills e; returns -1 so parsers can `return api_err_set(...)`. */
int api_err_set(dp_api_err *e, int status, const char *type, const char *code, const char *param,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Shorthand for 400 invalid_request_error naming param. */
int api_err_invalid(dp_api_err *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* malloc'd JSON body for e, or NULL on allocation failure. */
char *api_err_body(const dp_api_err *e, size_t *len);

#endif
