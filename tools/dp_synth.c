/* dp_synth.c: the dp-synth command: writes a synthetic LLaMA GGUF (seeded
 * random weights, byte-level BPE vocabulary) of a preset or custom shape. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/dp.h"
#include "tools/synth_gguf.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dp-synth --out FILE [--shape tiny|tiny32|7b|smollm] [--layers N] [--dim N] [--heads N]\n"
            "                [--kv-heads N] [--ffn N] [--vocab N] [--ctx N] [--rope-base F] [--tied|--untied]\n"
            "                [--type T] [--seed S] [--arch llama|qwen2|qwen3|phi3|gemma3] [--head-dim N]\n"
            "                [--rope-freqs] [--sliding-window N] [--longrope ORIG_CTX]\n"
            "                [--yarn ORIG_CTX]\n"
            "  --type: the weight type as GGUF names it, any case (default f16; an unknown\n"
            "          name lists the types dp-synth writes)\n");
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

/* The weight types dp-synth writes: every type quant_type_name names (as
 * GGUF spells it, any case) whose rows synth_quantize_row encodes. */
static bool synth_type_ok(uint32_t t)
{
    float x[256] = {0};
    uint8_t row[1024];
    return quant_type_name(t) && synth_quantize_row(t, x, row, 256) == 0;
}

static int synth_type_parse(const char *name, uint32_t *out)
{
    for (uint32_t t = 0; t < 64; t++)
        if (synth_type_ok(t) && strcasecmp(quant_type_name(t), name) == 0) {
            *out = t;
            return 0;
        }
    return -1;
}

static void synth_type_names(char *buf, size_t cap)
{
    size_t n = 0;
    for (uint32_t t = 0; t < 64 && n < cap; t++)
        if (synth_type_ok(t))
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", quant_type_name(t));
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
        } else if (strcmp(a, "--rope-freqs") == 0) {
            sh.rope_freqs = true;
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
        else if (strcmp(a, "--arch") == 0) sh.arch = v;
        else if (strcmp(a, "--head-dim") == 0) u = &sh.head_dim;
        else if (strcmp(a, "--sliding-window") == 0) u = &sh.sliding_window;
        else if (strcmp(a, "--longrope") == 0) u = &sh.longrope_orig;
        else if (strcmp(a, "--yarn") == 0) u = &sh.yarn_orig;
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
    if (synth_type_parse(type, &wt) != 0) {
        char names[256] = "";
        synth_type_names(names, sizeof names);
        fprintf(stderr, "dp-synth: unknown type '%s' (%s)\n", type, names);
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
