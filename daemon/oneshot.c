/* oneshot.c: the one-shot command: everything from GGUF to printed text in
 * one pass, streaming the completion as complete UTF-8 pieces. */
#include "oneshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "sched/generate.h"
#include "serve.h"

typedef struct print_ctx {
    const dp_tokenizer *tok;
    dp_detok detok;
} print_ctx;

static void print_token(void *ud, int32_t seq, int32_t token)
{
    print_ctx *p = ud;
    char buf[512];
    int n = detok_push(&p->detok, p->tok, token, buf, sizeof buf);
    if (n > 0) {
        fwrite(buf, 1, (size_t)n, stdout);
        fflush(stdout);
    }
}

int oneshot_run(const dp_oneshot_opts *o)
{
    char err[DP_ERRLEN];
    dp_gguf g;
    dp_tokenizer *tok = NULL;
    dp_backend *be = NULL;
    dp_llama *m = NULL;
    dp_gen gen;
    bool gen_ok = false;
    char *text = NULL;
    int32_t *ids = NULL, *out = NULL;
    size_t n_ids = 0;
    int status = 1;
    double t0 = dp_now();

    if (gguf_open(&g, o->model, err, sizeof err)) {
        fprintf(stderr, "dualpathd: cannot load model %s: %s\n", o->model, err);
        return 1;
    }
    if (tokenizer_init_gguf(&tok, &g, err, sizeof err)) {
        fprintf(stderr, "dualpathd: model %s: tokenizer: %s\n", o->model, err);
        goto done;
    }
    if (backend_create(&be, o->device, o->threads, err, sizeof err)) {
        fprintf(stderr, "dualpathd: %s\n", err);
        goto done;
    }
    if (be->ops->set_exact && o->exact_matmul)
        be->ops->set_exact(be, true);
    const char *prompt = o->prompt;
    if (o->chat) {
        dp_chat_template ct;
        if (serve_chat_template(&ct, o->chat_template, &g, tok, err, sizeof err)) {
            fprintf(stderr, "dualpathd: chat template: %s\n", err);
            goto done;
        }
        dp_chat_msg msg = {"user", o->prompt};
        int rc = chat_template_apply(&ct, &msg, 1, true, &text, err, sizeof err);
        chat_template_destroy(&ct);
        if (rc) {
            fprintf(stderr, "dualpathd: chat template: %s\n", err);
            goto done;
        }
        prompt = text;
    }
    if (tokenizer_encode(tok, prompt, strlen(prompt), tokenizer_add_bos(tok), o->chat, &ids,
                         &n_ids) || n_ids == 0) {
        fprintf(stderr, "dualpathd: the prompt encodes to no tokens\n");
        goto done;
    }
    int32_t max_new = o->max_tokens;
    if (llama_init(&m, &g, be, 512, 64, err, sizeof err)) {
        fprintf(stderr, "dualpathd: cannot load model %s: %s\n", o->model, err);
        goto done;
    }
    const dp_hparams *hp = llama_hparams(m);
    if ((int64_t)n_ids + max_new > hp->n_ctx_train) {
        fprintf(stderr, "dualpathd: prompt (%zu tokens) + max tokens (%d) exceeds the context (%d)\n",
                n_ids, max_new, hp->n_ctx_train);
        goto done;
    }
    const int32_t bt = 16;
    int32_t n_blocks = (int32_t)((n_ids + (size_t)max_new + bt - 1) / bt) + 1;
    if (gen_init(&gen, m, bt, n_blocks, err, sizeof err)) {
        fprintf(stderr, "dualpathd: %s\n", err);
        goto done;
    }
    gen_ok = true;
    if (o->verbose)
        fprintf(stderr, "dualpathd: %s backend, %d layers, %zu prompt tokens, loaded in %.2f s\n",
                be->ops->name, hp->n_layers, n_ids, dp_now() - t0);
    out = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof *out);
    if (!out)
        goto done;
    dp_gen_seq sq = {.prompt = ids, .n_prompt = (int32_t)n_ids, .max_new = max_new,
                     .stop_at_eog = true, .out = out};
    sampling_default(&sq.sampling);
    sq.sampling.temperature = o->temperature;
    sq.sampling.top_k = o->top_k;
    sq.sampling.top_p = o->top_p;
    sq.sampling.min_p = o->min_p;
    sq.sampling.seed = o->seed;
    print_ctx pc = {.tok = tok};
    detok_init(&pc.detok, false);
    if (gen_run(&gen, &sq, 1, tok, print_token, &pc, err, sizeof err)) {
        fprintf(stderr, "\ndualpathd: %s\n", err);
        goto done;
    }
    char tail[64];
    int nt = detok_flush(&pc.detok, tail, sizeof tail);
    if (nt > 0)
        fwrite(tail, 1, (size_t)nt, stdout);
    fputc('\n', stdout);
    if (o->verbose)
        fprintf(stderr, "dualpathd: prefill %lld tokens in %.3f s, decode %lld tokens in %.3f s (%.1f tok/s)\n",
                (long long)gen.n_prefill_tokens, gen.t_prefill, (long long)gen.n_decode_tokens,
                gen.t_decode, gen.t_decode > 0 ? gen.n_decode_tokens / gen.t_decode : 0.0);
    status = 0;
done:
    if (gen_ok)
        gen_destroy(&gen);
    llama_destroy(m);
    backend_destroy(be);
    tokenizer_destroy(tok);
    gguf_close(&g);
    free(text);
    free(ids);
    free(out);
    return status;
}
