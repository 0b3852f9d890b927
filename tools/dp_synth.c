/* dp_synth.c: the dp-synth command: writes a synthetic LLaMA GGUF (seeded
 * random weights, byte-level BPE vocabulary) of a preset or custom shape. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "tools/synth_gguf.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dp-synth --out FILE [--shape tiny|tiny32|7b|smollm] [--layers N] [--dim N] [--heads N]\n"
            "                [--kv-heads N] [--ffn N] [--vocab N] [--ctx N] [--rope-base F] [--tied|--untied]\n"
            "                [--type f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k]\n"
            "                [--seed S]\n");
}

static int parse_u32(const char *opt, const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end || !*s || v > UINT32_MAX || s[0] == '-') {
        fprintf(stderr, "dp-synth: %s: bad number '%s'\n", opt, s);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *type = "f16";
    uint64_t seed = 1;
    dp_synth_shape sh;
    synth_shape_preset("tiny", &sh);
    /* The shape goes first so that later flags override it whatever the order. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
            if (synth_shape_preset(argv[i + 1], &sh) != 0) {
                fprintf(stderr, "dp-synth: unknown shape '%s' (tiny, tiny32, 7b, smollm)\n", argv[i + 1]);
                return 2;
            }
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t *u = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--tied") == 0) {
            sh.tied = true;
            continue;
        } else if (strcmp(a, "--untied") == 0) {
            sh.tied = false;
            continue;
        }
        if (!v) {
            fprintf(stderr, "dp-synth: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--out") == 0) out = v;
        else if (strcmp(a, "--shape") == 0) continue;
        else if (strcmp(a, "--type") == 0) type = v;
        else if (strcmp(a, "--layers") == 0) u = &sh.n_layers;
        else if (strcmp(a, "--dim") == 0) u = &sh.dim;
        else if (strcmp(a, "--heads") == 0) u = &sh.n_heads;
        else if (strcmp(a, "--kv-heads") == 0) u = &sh.n_kv_heads;
        else if (strcmp(a, "--ffn") == 0) u = &sh.ffn;
        else if (strcmp(a, "--vocab") == 0) u = &sh.vocab;
        else if (strcmp(a, "--ctx") == 0) u = &sh.ctx;
        else if (strcmp(a, "--rope-base") == 0) {
            char *end;
            sh.rope_base = strtof(v, &end);
            if (*end || !*v || !(sh.rope_base > 0)) {
                fprintf(stderr, "dp-synth: --rope-base: bad number '%s'\n", v);
                return 2;
            }
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            seed = strtoull(v, &end, 0);
            if (errno || *end || !*v) {
                fprintf(stderr, "dp-synth: --seed: bad number '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "dp-synth: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (u && parse_u32(a, v, u) != 0)
            return 2;
    }
    if (!out) {
        usage(stderr);
        return 2;
    }
    uint32_t wt;
    if (strcmp(type, "f32") == 0) wt = DP_TYPE_F32;
    else if (strcmp(type, "f16") == 0) wt = DP_TYPE_F16;
    else if (strcmp(type, "bf16") == 0) wt = DP_TYPE_BF16;
    else if (strcmp(type, "q8_0") == 0) wt = DP_TYPE_Q8_0;
    else if (strcmp(type, "q4_1") == 0) wt = DP_TYPE_Q4_1;
    else if (strcmp(type, "q4_0") == 0) wt = DP_TYPE_Q4_0;
    else if (strcmp(type, "q5_0") == 0) wt = DP_TYPE_Q5_0;
    else if (strcmp(type, "q5_1") == 0) wt = DP_TYPE_Q5_1;
    else if (strcmp(type, "q2_k") == 0) wt = DP_TYPE_Q2_K;
    else if (strcmp(type, "q3_k") == 0) wt = DP_TYPE_Q3_K;
    else if (strcmp(type, "q4_k") == 0) wt = DP_TYPE_Q4_K;
    else if (strcmp(type, "q5_k") == 0) wt = DP_TYPE_Q5_K;
    else if (strcmp(type, "q6_k") == 0) wt = DP_TYPE_Q6_K;
    else {
        fprintf(stderr, "dp-synth: unknown type '%s' (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, "
                "q3_k, q4_k, q5_k, q6_k)\n", type);
        return 2;
    }
    char err[DP_ERRLEN];
    double t0 = dp_now();
    if (synth_llama_write(out, &sh, seed, wt, err, sizeof err) != 0) {
        fprintf(stderr, "dp-synth: %s\n", err);
        return 1;
    }
    printf("dp-synth: wrote %s: %u layers, dim %u, %u/%u heads, ffn %u, vocab %u, ctx %u, %s%s, seed %llu "
           "(%.1f s)\n",
           out, sh.n_layers, sh.dim, sh.n_heads, sh.n_kv_heads, sh.ffn, sh.vocab, sh.ctx, type,
           sh.tied ? ", tied" : "", (unsigned long long)seed, dp_now() - t0);
    return 0;
}
