/* llama_logits.cpp: llama.cpp's own logits for a token list, for comparing
 * the forward pass with llama.cpp's (tools/arch-vs-llama.sh builds it with
 * g++ against the llama.cpp that tools/llama-cpp.sh builds, a C++ library;
 * it needs that tree's llama.h). Not part of the project's build.
 *
 *   llama-logits MODEL TOKENS(1,2,3) OUT.f32 STEPS
 *
 * Writes the logits at every position of the list (raw f32, [n][vocab]) to
 * OUT.f32, with an f32 KV cache and no flash attention (the exact path),
 * then prints STEPS greedy tokens after the list as a JSON array.
 *
 *   llama-logits --tokenize MODEL HEXFILE
 *
 * prints the ids of each line's text (tokenize_lines). */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "llama.h"

static int decode(struct llama_context *ctx, const llama_token *t, int n, int pos0, int all)
{
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = t[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all || i == n - 1;
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    return rc;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* --tokenize MODEL HEXFILE: each line of HEXFILE the hex of a text's bytes;
 * prints per line the ids llama.cpp gives (BOS as the model adds it, no
 * special-token parsing) as a JSON array. */
static int tokenize_lines(const char *path_model, const char *path_hex)
{
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *model = llama_model_load_from_file(path_model, mp);
    FILE *f = fopen(path_hex, "r");
    if (!model || !f)
        return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    static char line[1 << 20], text[1 << 19];
    static llama_token ids[1 << 19];
    while (fgets(line, sizeof line, f)) {
        size_t n = 0;
        for (char *p = line; p[0] && p[1] && p[0] != '\n'; p += 2) {
            unsigned v;
            sscanf(p, "%2x", &v);
            text[n++] = (char)v;
        }
        const int k = llama_tokenize(vocab, text, (int32_t)n, ids, 1 << 19, true, false);
        printf("[");
        for (int i = 0; i < k; i++)
            printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
    }
    fclose(f);
    llama_model_free(model);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--tokenize"))
        return tokenize_lines(argv[2], argv[3]);
    if (argc != 5) {
        fprintf(stderr, "usage: llama-logits MODEL TOKENS OUT.f32 STEPS\n");
        return 2;
    }
    llama_token toks[4096];
    int n = 0;
    for (char *p = argv[2]; *p && n < 4096;) {
        toks[n++] = (llama_token)strtol(p, &p, 10);
        if (*p == ',')
            p++;
    }
    const int steps = atoi(argv[4]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama-logits: cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + steps + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)(n + 16);
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.n_threads = cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    if (!ctx || decode(ctx, toks, n, 0, 1)) {
        fprintf(stderr, "llama-logits: decode failed\n");
        return 1;
    }
    FILE *f = fopen(argv[3], "wb");
    for (int i = 0; i < n; i++)
        fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)vocab, f);
    fclose(f);
    printf("[");
    llama_token t = (llama_token)argmax(llama_get_logits_ith(ctx, n - 1), vocab);
    for (int s = 0; s < steps; s++) {
        printf("%s%d", s ? ", " : "", t);
        if (s + 1 < steps) {
            if (decode(ctx, &t, 1, n + s, 0))
                return 1;
            t = (llama_token)argmax(llama_get_logits_ith(ctx, -1), vocab);
        }
    }
    printf("]\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
