/* errors.c: formatting of OpenAI error objects. Every failure path of the API
 * ends here, so the shape is the same for 400s and 503s alike. */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one
 * (overlong forms, surrogates and code points above U+10FFFF included). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0], min;
    size_t k;
    if (c < 0x80)
        return 1;
    if ((c & 0xe0) == 0xc0)
        k = 2, min = 0x80, c &= 0x1f;
    else if ((c & 0xf0) == 0xe0)
        k = 3, min = 0x800, c &= 0x0f;
    else if ((c & 0xf8) == 0xf0)
        k = 4, min = 0x10000, c &= 0x07;
    else
        return 0;
    if (k > n)
        return 0;
    for (size_t j = 1; j < k; j++) {
        if ((s[j] & 0xc0) != 0x80)
            return 0;
        c = (c << 6) | (s[j] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    return k;
}

/* Messages quote client strings (a role, a model name, a URL) cut at a byte
 * count, so they may hold invalid or split UTF-8; a JSON body must not. Bad
 * bytes become U+FFFD, and the copy ends on a character boundary. */
static void utf8_copy(char *dst, size_t cap, const char *src)
{
    const unsigned char *s = (const unsigned char *)src;
    size_t n = strlen(src), i = 0, w = 0;
    while (i < n) {
        size_t k = utf8_seq(s + i, n - i);
        const char *p = k ? src + i : "\xef\xbf\xbd";
        size_t len = k ? k : 3;
        if (w + len >= cap)
            break;
        memcpy(dst + w, p, len);
        w += len;
        i += k ? k : 1;
    }
    dst[w] = 0;
}

static void set_v(dp_api_err *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, va_list ap)
{
    char raw[sizeof e->message];
    e->status = status;
    e->type = type;
    e->code = code;
    e->allow = NULL;
    snprintf(raw, sizeof raw, "%s", param ? param : "");
    utf8_copy(e->param, sizeof e->param, raw);
    vsnprintf(raw, sizeof raw, fmt, ap);
    utf8_copy(e->message, sizeof e->message, raw);
}

int api_err_set(dp_api_err *e, int status, const char *type, const char *code, const char *param,
                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_v(e, status, type, code, param, fmt, ap);
    va_end(ap);
    return -1;
}

int api_err_invalid(dp_api_err *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_v(e, 400, "invalid_request_error", NULL, param, fmt, ap);
    va_end(ap);
    return -1;
}

char *api_err_body(const dp_api_err *e, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    char *s = NULL;
    if (!o)
        goto out;
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (e->code)
        cJSON_AddStringToObject(o, "code", e->code);
    else
        cJSON_AddNullToObject(o, "code");
    s = cJSON_PrintUnformatted(root);
out:
    cJSON_Delete(root);
    if (s && len)
        *len = strlen(s);
    return s;
}
