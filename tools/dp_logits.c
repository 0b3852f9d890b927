/* dp_logits.c: prints the CPU (or any backend's) last-position logits of a
 * token list and the greedy continuation, as JSON, for the reference check
 * in tests/model/test_logits.py. --teacher FILE instead writes the logits at
 * every position of the list (teacher forcing; raw f32, [n][vocab]) for the
 * accuracy check of the default matmul path. --exact runs the CPU's exact
 * f32 matmul instead of the int8-activation one. --tokenize FILE instead
 * prints the ids of each line's text (the hex of its bytes), BOS as the
 * model adds it, as JSON arrays: the tokenizer beside a reference's. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/loader.h"
#include "tools/generate.h"

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

/* The logits at every position of ids, 16 positions per step (the model's
 * max_out), into a raw f32 file. */
static int teacher_force(dp_llama *m, const int32_t *ids, int32_t n, const char *path, char *err,
                         size_t errsz)
{
    dp_backend *be = llama_backend(m);
    const int32_t vocab = llama_hparams(m)->vocab, bt = 16, nblk = (n + bt - 1) / bt;
    dp_kv_layout l = llama_kv_layout(m, bt, nblk);
    dp_kv_store *kv;
    if (be->ops->kv_create(be, &l, &kv))
        return dp_err(err, errsz, DP_ENOMEM, "no memory for %d tokens of KV", n);
    dp_kv_store *stores[DP_KV_MAX_STORES] = {kv, NULL};
    int32_t *table = malloc((size_t)nblk * sizeof *table);
    float *logits = malloc((size_t)16 * (size_t)vocab * sizeof *logits);
    FILE *f = fopen(path, "wb");
    int rc = 0;
    if (!table || !logits || !f) {
        rc = dp_err(err, errsz, DP_EIO, "cannot write %s", path);
        goto out;
    }
    for (int32_t i = 0; i < nblk; i++)
        table[i] = i;
    for (int32_t p0 = 0; p0 < n && !rc; p0 += 16) {
        const int32_t c = n - p0 < 16 ? n - p0 : 16;
        int32_t pos[16], seq[16] = {0}, outs[16];
        uint8_t ss[1] = {0};
        for (int32_t i = 0; i < c; i++) {
            pos[i] = p0 + i;
            outs[i] = i;
        }
        dp_batch b = {.n_tokens = c, .tokens = (int32_t *)ids + p0, .pos = pos, .seq = seq,
                      .slot = pos, .n_seqs = 1, .seq_store = ss, .block_tables = table,
                      .max_blocks = nblk, .n_out = c, .out_tokens = outs};
        rc = llama_forward(m, &b, stores, logits);
        if (rc)
            dp_err(err, errsz, rc, "forward failed at position %d", p0);
        else if (fwrite(logits, sizeof(float) * (size_t)vocab, (size_t)c, f) != (size_t)c)
            rc = dp_err(err, errsz, DP_EIO, "cannot write %s", path);
    }
out:
    if (f && fclose(f) && !rc)
        rc = dp_err(err, errsz, DP_EIO, "cannot write %s", path);
    free(table);
    free(logits);
    be->ops->kv_destroy(be, kv);
    return rc;
}

static int tokenize_lines(const char *model, const char *path)
{
    char err[DP_ERRLEN];
    dp_gguf g;
    dp_tokenizer *t = NULL;
    FILE *f = fopen(path, "r");
    if (!f || gguf_open(&g, model, err, sizeof err)) {
        fprintf(stderr, "dp-logits: cannot open %s\n", f ? model : path);
        return 1;
    }
    int rc = tokenizer_init_gguf(&t, &g, err, sizeof err);
    static char line[1 << 20], text[1 << 19];
    while (!rc && fgets(line, sizeof line, f)) {
        size_t n = 0;
        for (char *p = line; p[0] && p[1] && p[0] != '\n' && n < sizeof text; p += 2) {
            unsigned v;
            if (sscanf(p, "%2x", &v) != 1)
                break;
            text[n++] = (char)v;
        }
        int32_t *ids = NULL;
        size_t k = 0;
        if ((rc = tokenizer_encode(t, text, n, true, false, &ids, &k)))
            break;
        printf("[");
        for (size_t i = 0; i < k; i++)
            printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
        free(ids);
    }
    if (rc)
        fprintf(stderr, "dp-logits: tokenizer: %s\n", rc == DP_EFORMAT ? err : dp_strerror(rc));
    tokenizer_destroy(t);
    gguf_close(&g);
    fclose(f);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--model") && !strcmp(argv[3], "--tokenize"))
        return tokenize_lines(argv[2], argv[4]);
    const char *model = NULL, *tokens = NULL, *device = "cpu";
    const char *teacher = NULL;
    int steps = 32;
    bool exact = false;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--exact")) {
            exact = true;
            i--;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "dp-logits: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--teacher"))
            teacher = argv[i + 1];
        else if (!strcmp(argv[i], "--model"))
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
        fprintf(stderr, "usage: dp-logits --model FILE --tokens 1,2,3 [--steps N] [--device D] [--exact]\n"
                        "                 [--teacher OUT.f32]\n"
                        "       dp-logits --model FILE --tokenize HEXLINES\n");
        return 2;
    }
    int32_t *ids, n;
    if (parse_tokens(tokens, &ids, &n)) {
        fprintf(stderr, "dp-logits: bad --tokens list\n");
        return 2;
    }
    char err[DP_ERRLEN];
    dp_model_files mf;
    dp_gen gen;
    const dp_model_open_opts mo = {.path = model, .device = device, .max_tokens = 256, .max_out = 16};
    if (model_open(&mf, &mo, err, sizeof err) ||
        (!teacher && gen_init(&gen, mf.m, 16, (n + steps) / 16 + 2, err, sizeof err))) {
        fprintf(stderr, "dp-logits: %s\n", err);
        return 1;
    }
    dp_backend *be = mf.be;
    dp_llama *m = mf.m;
    /* The context of this run as tools/llama_logits.cpp sizes llama.cpp's
     * (n + steps + 16, which llama.cpp pads to a multiple of 256):
     * LongRoPE's factors depend on it. */
    llama_set_context(m, (n + steps + 16 + 255) / 256 * 256);
    if (be->ops->set_exact)
        be->ops->set_exact(be, exact);
    if (be->ops->kernel_level)
        fprintf(stderr, "dp-logits: cpu kernels %s, %s matmul\n", be->ops->kernel_level(be),
                exact ? "exact f32" : "int8-activation");
    if (teacher) {
        int rc = teacher_force(m, ids, n, teacher, err, sizeof err);
        if (rc)
            fprintf(stderr, "dp-logits: %s\n", err);
        model_close(&mf);
        free(ids);
        return rc ? 1 : 0;
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
    model_close(&mf);
    free(logits);
    free(out);
    free(ids);
    return 0;
}
