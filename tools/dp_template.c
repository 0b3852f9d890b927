/* dp_template.c: renders a chat template file with messages from JSON, as the
 * daemon does; the bridge the golden test (tests/model/test_templates.py) uses. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api/jv_json.h"
#include "common/dp.h"
#include "model/chat_template.h"

static void usage(void)
{
    fprintf(stderr, "usage: dp-template TEMPLATE_FILE MESSAGES_JSON [--kwargs JSON] [--tools JSON]\n"
                    "                   [--no-generation-prompt] [--continue] [--bos S] [--eos S]\n"
                    "                   [--keep-bos] [--now EPOCH]\n"
                    "MESSAGES_JSON and the JSON options are JSON text, or a file name ('-': stdin).\n");
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    while (b) {
        if (n + 1 >= cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
        }
        size_t r = fread(b + n, 1, cap - n - 1, f);
        if (r == 0) break;
        n += r;
    }
    if (f != stdin) fclose(f);
    if (b) b[n] = '\0';
    *len = n;
    return b;
}

/* JSON text, or the contents of the file it names. */
static cJSON *json_arg(const char *s)
{
    const char *p = s;
    while (*p == ' ' || *p == '\n' || *p == '\t') p++;
    if (*p == '[' || *p == '{') return cJSON_Parse(s);
    size_t n;
    char *t = read_all(s, &n);
    if (!t) return NULL;
    cJSON *j = cJSON_Parse(t);
    free(t);
    return j;
}

int main(int argc, char **argv)
{
    const char *tfile = NULL, *mjson = NULL, *kwargs = NULL, *tools = NULL, *bos = "", *eos = "";
    bool gen = true, keep_bos = false, cont = false;
    long long now = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool more = i + 1 < argc;
        if (!strcmp(a, "--kwargs") && more)
            kwargs = argv[++i];
        else if (!strcmp(a, "--tools") && more)
            tools = argv[++i];
        else if (!strcmp(a, "--bos") && more)
            bos = argv[++i];
        else if (!strcmp(a, "--eos") && more)
            eos = argv[++i];
        else if (!strcmp(a, "--now") && more)
            now = strtoll(argv[++i], NULL, 10);
        else if (!strcmp(a, "--no-generation-prompt"))
            gen = false;
        else if (!strcmp(a, "--continue"))
            cont = true;
        else if (!strcmp(a, "--keep-bos"))
            keep_bos = true;
        else if (a[0] == '-' && a[1] == '-') {
            usage();
            return 2;
        } else if (!tfile)
            tfile = a;
        else if (!mjson)
            mjson = a;
        else {
            usage();
            return 2;
        }
    }
    if (!tfile || !mjson) {
        usage();
        return 2;
    }
    dp_log_set_level(DP_LOG_WARN);
    size_t tlen;
    char *src = read_all(tfile, &tlen);
    if (!src) {
        fprintf(stderr, "dp-template: cannot read %s: %s\n", tfile, strerror(errno));
        return 1;
    }
    char err[DP_ERRLEN] = "";
    dp_chat_template ct;
    if (chat_template_init(&ct, src, tlen, bos, eos, err, sizeof err)) {
        fprintf(stderr, "dp-template: %s\n", err);
        free(src);
        return 1;
    }
    free(src);
    ct.keep_bos = keep_bos; /* the rendering exactly as jinja2's */
    ct.now = (time_t)now;
    int status = 1;
    cJSON *jm = json_arg(mjson), *jk = kwargs ? json_arg(kwargs) : NULL, *jt = tools ? json_arg(tools) : NULL;
    /* The daemon's conversion (api/jv_json.c), at its depth and without its
     * bound on the number of values: these files are the test's own. */
    long left = LONG_MAX;
    jv *m = jm ? jv_from_json(jm, 64, &left) : NULL, *k = jk ? jv_from_json(jk, 64, &left) : NULL,
       *t = jt ? jv_from_json(jt, 64, &left) : NULL;
    if (!m || (kwargs && !k) || (tools && !t)) {
        fprintf(stderr, "dp-template: bad JSON in the messages, --kwargs or --tools\n");
        goto out;
    }
    char *out = NULL;
    int rc = chat_template_render(&ct, m,
                                  cont  ? DP_CHAT_END_CONTINUE
                                  : gen ? DP_CHAT_END_GENERATE
                                        : DP_CHAT_END_NONE,
                                  k, t, &out, err, sizeof err);
    if (rc) {
        fprintf(stderr, "dp-template: %s\n", err);
        goto out;
    }
    fwrite(out, 1, strlen(out), stdout);
    free(out);
    status = 0;
out:
    jv_unref(m);
    jv_unref(k);
    jv_unref(t);
    cJSON_Delete(jm);
    cJSON_Delete(jk);
    cJSON_Delete(jt);
    chat_template_destroy(&ct);
    return status;
}
