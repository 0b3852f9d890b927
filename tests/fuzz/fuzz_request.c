/* fuzz_request.c: request JSON -> validated request, both endpoints (the
 * first input byte picks one). A valid request must satisfy what the engine
 * relies on; a refusal must be an error an OpenAI client can parse. */
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api/openai.h"
#include "fuzz_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static dp_oai_ctx ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_model_init();
    ctx.tok = fuzz_tok;
    ctx.tmpl = &fuzz_tmpl;
    ctx.model_name = "m";
    ctx.model_alias = "alias";
    ctx.context_length = 256;
    return 0;
}

static void check_ok(const dp_oai_req *r)
{
    int32_t nv = tokenizer_n_vocab(fuzz_tok);
    if (r->n_prompts < 1 || r->n < 1 || r->n > DP_OAI_MAX_N ||
        r->n_prompts * r->n > DP_OAI_MAX_CHOICES)
        abort();
    for (int i = 0; i < r->n_prompts; i++) {
        const dp_oai_prompt *p = &r->prompts[i];
        if (p->n_ids < 1 || p->n_ids >= ctx.context_length || p->max_tokens < 1 ||
            p->n_ids + p->max_tokens > ctx.context_length || !p->text ||
            !oai_utf8_valid(p->text, strlen(p->text)))
            abort();
        for (int k = 0; k < p->n_ids; k++)
            if (p->ids[k] < 0 || p->ids[k] >= nv)
                abort();
    }
    const dp_request_params *q = &r->params;
    if (q->n_stops < 0 || q->n_stops > DP_MAX_STOPS || q->logprobs > DP_MAX_TOP_LOGPROBS)
        abort();
}

static void check_error(const dp_api_err *e)
{
    if (e->status != 400 && e->status != 404 && e->status != 500)
        abort();
    if (!e->message[0] || !oai_utf8_valid(e->message, strlen(e->message)))
        abort();
    size_t n = 0;
    char *body = api_err_body(e, &n);
    if (!body)
        return; /* out of memory */
    cJSON *j = cJSON_ParseWithLength(body, n);
    if (!j || !cJSON_GetObjectItemCaseSensitive(j, "error") || !oai_utf8_valid(body, n))
        abort();
    cJSON_Delete(j);
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    dp_oai_kind kind = data[0] & 1 ? DP_OAI_CHAT : DP_OAI_COMPLETION;
    dp_oai_req r;
    dp_api_err e;
    memset(&e, 0, sizeof e);
    if (oai_parse(&ctx, kind, (const char *)data + 1, size - 1, &r, &e) == 0) {
        check_ok(&r);
        oai_req_free(&r);
    } else {
        check_error(&e);
    }
    return 0;
}
