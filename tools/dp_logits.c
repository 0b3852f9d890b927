/* dp_logits.c: prints the CPU (or any backend's) last-position logits of a
 * token list and the greedy continuation, as JSON, for the reference check
 * in tests/model/test_logits.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "sched/generate.h"

static int parse_tokens(const char *s, int32_t **out, int32_t *n)
{
    int32_t cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v)
        return -1;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > INT32_MAX) {
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            free(v);
            return -1;
        }
    }
    *out = v;
    *n = k;
    return k > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *tokens = NULL, *device = "cpu";
    int steps = 32;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens"))
            tokens = argv[i + 1];
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else {
            fprintf(stderr, "dp-logits: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!model || !tokens || steps < 0) {
        fprintf(stderr, "usage: dp-logits --model FILE --tokens 1,2,3 [--steps N] [--device D]\n");
        return 2;
    }
    int32_t *ids, n;
    if (parse_tokens(tokens, &ids, &n)) {
        fprintf(stderr, "dp-logits: bad --tokens list\n");
        return 2;
    }
    char err[DP_ERRLEN];
    dp_gguf g;
    dp_backend *be;
    dp_llama *m;
    dp_gen gen;
    if (gguf_open(&g, model, err, sizeof err) || backend_create(&be, device, 0, err, sizeof err) ||
        llama_init(&m, &g, be, 256, 16, err, sizeof err) ||
        gen_init(&gen, m, 16, (n + steps) / 16 + 2, err, sizeof err)) {
        fprintf(stderr, "dp-logits: %s\n", err);
        return 1;
    }
    const dp_hparams *hp = llama_hparams(m);
    float *logits = malloc((size_t)hp->vocab * sizeof *logits);
    int32_t *out = malloc((size_t)(steps + 1) * sizeof *out);
    if (!logits || !out)
        return 1;
    dp_gen_seq sq = {.prompt = ids, .n_prompt = n, .max_new = steps, .out = out,
                     .prompt_logits = logits};
    sq.sampling.temperature = 0.0f;
    if (gen_run(&gen, &sq, 1, NULL, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "dp-logits: %s\n", err);
        return 1;
    }
    printf("{\"logits_last\": [");
    for (int32_t i = 0; i < hp->vocab; i++)
        printf("%s%.9g", i ? ", " : "", logits[i]);
    printf("], \"greedy\": [");
    for (int32_t i = 0; i < sq.n_out; i++)
        printf("%s%d", i ? ", " : "", out[i]);
    printf("]}\n");
    gen_destroy(&gen);
    llama_destroy(m);
    backend_destroy(be);
    gguf_close(&g);
    free(logits);
    free(out);
    free(ids);
    return 0;
}
