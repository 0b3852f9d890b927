/* fuzz_jinja.c: model/jinja.c, which renders templates that HTTP clients
 * send (chat_template): an input is a template, optionally followed by
 * "\n@@ctx\n" and a JSON object for the context (else a fixed conversation).
 * Parse and render under tight limits must never crash, leak or overrun;
 * an error must name itself in one non-empty message. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api/jv_json.h"
#include "common/dp.h"
#include "model/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char sep[] = "\n@@ctx\n";

static jv *msg(const char *role, const char *content)
{
    jv *m = jv_dict();
    jv_dict_set(m, "role", jv_str(role));
    jv_dict_set(m, "content", jv_str(content));
    return m;
}

static jv *fixed_ctx(void)
{
    jv *c = jv_dict(), *ms = jv_list();
    jv_list_push(ms, msg("system", " Be brief. "));
    jv_list_push(ms, msg("user", "Hi <there> & 'you' x\xC3\xA9\xE4\xB8\x96"));
    jv_list_push(ms, msg("assistant", "Hello\nworld"));
    jv_list_push(ms, msg("user", "bad \xff\xfe utf-8"));
    jv_dict_set(c, "messages", ms);
    jv_dict_set(c, "add_generation_prompt", jv_bool(true));
    jv_dict_set(c, "bos_token", jv_str("<s>"));
    jv_dict_set(c, "eos_token", jv_str("</s>"));
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *src = (const char *)data;
    size_t tlen = size;
    jv *ctx = NULL;
    const char *at = memmem(src, size, sep, sizeof sep - 1);
    if (at) {
        tlen = (size_t)(at - src);
        size_t off = tlen + sizeof sep - 1;
        cJSON *j = cJSON_ParseWithLength(src + off, size - off);
        long left = LONG_MAX;
        if (cJSON_IsObject(j)) ctx = jv_from_json(j, 16, &left);
        cJSON_Delete(j);
    }
    if (!ctx) ctx = fixed_ctx();
    char err[DP_ERRLEN];
    jinja_tmpl *t = NULL;
    int rc = jinja_parse(src, tlen, &t, err, sizeof err);
    if (rc) {
        if (t || !err[0] || strchr(err, '\n') == err) abort();
    } else {
        /* Small limits, so that each run is quick and the limits are hit. */
        jinja_opts o = {.max_output = 1 << 16, .max_iters = 5000, .max_depth = 16, .now = 1700000000};
        char *out = NULL;
        size_t n = 0;
        rc = jinja_render_opts(t, ctx, &o, &out, &n, err, sizeof err);
        if (rc == 0) {
            if (!out || strlen(out) > n || n > o.max_output) abort();
        } else {
            /* raise_exception may raise an empty message; every other error names itself. */
            if (out || (rc != DP_EINVAL && !err[0])) abort();
        }
        free(out);
        jinja_free(t);
    }
    jv_unref(ctx);
    return 0;
}
