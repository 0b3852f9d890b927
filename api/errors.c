/* errors.c: formatting of OpenAI error objects. Every failure path of the API
 * ends here, so the shape is the same for 400s and 503s alike. */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

static void set_v(dp_api_err *e, int status, const char *type, const char *code,
                  const char *param, const char *fmt, va_list ap)
{
    e->status = status;
    e->type = type;
    e->code = code;
    e->allow = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
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
