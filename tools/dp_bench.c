/* dp_bench.c: forward-pass throughput of a model on one backend: prefill
 * tokens/s and decode tokens/s at several batch sizes, beside the machine's
 * measured memory bandwidth and GEMM rate, so each figure's ratio to its
 * physical limit is visible; and the migration copy of a prompt into the
 * decode path. Not a test: timings vary run to run. */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dp.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/loader.h"
#include "tools/generate.h"

/* Read bandwidth with every core streaming its own share of a 512 MiB
 * buffer: what a decode step does with the weights. */
typedef struct bw_arg {
    const float *p;
    size_t n;
    double sum;
} bw_arg;

static void *bw_read(void *a)
{
    bw_arg *b = a;
    float acc[16] = {0};
    for (size_t i = 0; i + 16 <= b->n; i += 16)
        for (int j = 0; j < 16; j++)
            acc[j] += b->p[i + j];
    double s = 0;
    for (int j = 0; j < 16; j++)
        s += acc[j];
    b->sum = s;
    return NULL;
}

static double measure_bandwidth(int threads)
{
    size_t n = ((size_t)512 << 20) / sizeof(float);
    float *a = malloc(n * sizeof *a);
    if (!a || threads < 1 || threads > 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(i & 7);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        pthread_t th[64];
        bw_arg args[64];
        size_t per = n / (size_t)threads;
        double t0 = dp_now();
        for (int t = 0; t < threads; t++) {
            args[t] = (bw_arg){a + (size_t)t * per, per, 0};
            pthread_create(&th[t], NULL, bw_read, &args[t]);
        }
        for (int t = 0; t < threads; t++)
            pthread_join(th[t], NULL);
        double bw = (double)(per * (size_t)threads * sizeof(float)) / (dp_now() - t0);
        if (bw > best)
            best = bw;
    }
    free(a);
    return best;
}

/* sgemm FLOP/s at a large square shape on all cores. */
static double measure_gemm(int threads)
{
    const int n = 1536;
    float *a = malloc((size_t)n * n * 4), *b = malloc((size_t)n * n * 4), *c = malloc((size_t)n * n * 4);
    if (!a || !b || !c)
        return 0;
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    openblas_set_num_threads(threads);
    double best = 0;
    for (int r = 0; r < 4; r++) {
        double t0 = dp_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double f = 2.0 * n * n * (double)n / (dp_now() - t0);
        if (f > best)
            best = f;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* The migration copy (kv_compact, the daemon's prefill -> decode path) of
 * one MIG_TOKENS-token prompt at keep 0.9, from an f16 prefill arena into a
 * q8_0 decode view (the CPU's default) and into an f16 one, timed against
 * the bytes it reads and writes at the machine's read bandwidth (CPU only). */
#define MIG_TOKENS 1024
/* A step of a fixed linear congruential generator: a value in [-0.5, 0.5)
 * (the benchmarks' inputs, the same at every run). */
static float lcg_sym(uint32_t *x)
{
    *x = *x * 1664525u + 1013904223u;
    return (float)(*x >> 8) / 16777216.0f - 0.5f;
}

/* SnapKV's scoring at a migration (kv_score_attn): the last 32 (the default
 * window) prompt positions' queries (every head, every layer) against the whole
 * n-token prompt in the f16 arena. Reported as ms per prompt, and as the
 * rate of its multiply-adds (queries x keys x head_dim, summed over heads
 * and layers; the causal triangle of the window counted whole). */
static void bench_snapkv(dp_backend *be, const dp_hparams *hp, const dp_kv_store *arena,
                         const int32_t *table, int32_t n)
{
    const int32_t nq = 32, nh = hp->n_heads, hd = hp->head_dim;
    const int64_t qls = (int64_t)nq * nh * hd;
    float *q = malloc((size_t)qls * (size_t)hp->n_layers * sizeof *q);
    float *out = malloc((size_t)hp->n_layers * (size_t)hp->n_kv_heads * (size_t)n * sizeof *out);
    int32_t slot[32];
    if (!q || !out) {
        free(q);
        free(out);
        return;
    }
    uint32_t x = 777;
    for (int64_t i = 0; i < qls * hp->n_layers; i++)
        q[i] = lcg_sym(&x) * 2.0f;
    for (int32_t i = 0; i < nq; i++)
        slot[i] = n - nq + i;
    double best = 1e9;
    for (int it = 0; it < 10; it++) {
        double t0 = dp_now();
        be->ops->kv_score_attn(be, arena, table, n, q, qls, slot, nq, nh, 1.0f / sqrtf((float)hd), out);
        double t = dp_now() - t0;
        best = t < best ? t : best;
    }
    const double fma = (double)nq * n * hd * nh * hp->n_layers;
    printf("%-22s %12.1f %14s %10s  %s (%.2f ms per %d-token prompt, %d queries, %.1f GFMA/s)\n",
           "snapkv score", 1.0 / best, "-", "-", "compute", best * 1e3, n, nq, fma / best / 1e9);
    free(q);
    free(out);
}

static void bench_migration(dp_backend *be, const dp_llama *m, double bw)
{
    /* The CPU's kv_compact returns when the copy is done; a device's may not. */
    if (strcmp(be->ops->name, "cpu") != 0)
        return;
    const dp_hparams *hp = llama_hparams(m);
    const int32_t bt = 16, nb = 2 * MIG_TOKENS / bt + 8, n_src = MIG_TOKENS / bt;
    const int32_t nkeep = MIG_TOKENS * 9 / 10, rows = hp->n_layers * hp->n_kv_heads;
    dp_kv_layout al = llama_kv_layout(m, bt, nb);
    al.type = DP_KV_F16;
    dp_kv_store *arena = NULL;
    const size_t ab = be->ops->kv_bytes_per_block(be, &al);
    uint16_t *blk = malloc(ab);
    int32_t *keep = malloc((size_t)rows * nkeep * sizeof *keep), *src = malloc((size_t)n_src * sizeof *src);
    int32_t *dst = malloc((size_t)(nb - n_src) * sizeof *dst);
    if (!blk || !keep || !src || !dst || be->ops->kv_create(be, &al, &arena)) {
        fprintf(stderr, "dp-bench: migration: out of memory\n");
        goto out;
    }
    uint32_t x = 12345;
    for (int32_t b = 0; b < nb; b++) {
        for (size_t i = 0; i < ab / 2; i++)
            blk[i] = dp_f32_to_fp16(lcg_sym(&x) * 4.0f);
        be->ops->kv_block_write(be, arena, b, blk);
    }
    /* Each (layer, head) keeps its own 9 of every 10 tokens, in order. */
    for (int32_t r = 0; r < rows; r++)
        for (int32_t t = 0, c = 0; t < MIG_TOKENS && c < nkeep; t++)
            if ((t * 7 + r) % 10 != 3)
                keep[(size_t)r * nkeep + c++] = t;
    for (int32_t i = 0; i < n_src; i++)
        src[i] = i;
    for (int32_t i = 0; i < nb - n_src; i++)
        dst[i] = n_src + i;
    const int32_t types[2] = {DP_KV_Q8_0, DP_KV_F16};
    for (int k = 0; k < 2; k++) {
        dp_kv_layout vl = al;
        vl.type = types[k];
        /* As the KV manager's views: as many tokens as fit in an arena block. */
        const size_t row = types[k] == DP_KV_Q8_0 ? (size_t)hp->head_dim / 32 * 34 : (size_t)hp->head_dim * 2;
        vl.block_tokens = (int32_t)(ab / (2 * (size_t)rows * row));
        dp_kv_store *view = NULL;
        if (be->ops->kv_view(be, arena, &vl, &view))
            continue;
        dp_compact_seq cs = {src, n_src, dst, (nkeep + vl.block_tokens - 1) / vl.block_tokens, nkeep, keep};
        double best = 1e9;
        for (int it = 0; it < 10; it++) {
            double t0 = dp_now();
            if (be->ops->kv_compact(be, arena, view, &cs, 1))
                break;
            double t = dp_now() - t0;
            best = t < best ? t : best;
        }
        const double bytes = 2.0 * rows * nkeep * ((double)hp->head_dim * 2 + (double)row);
        const double limit = bw / bytes;
        char name[40];
        snprintf(name, sizeof name, "migrate f16->%s", dp_kv_type_name(types[k]));
        printf("%-22s %12.1f %14.1f %9.1f%%  %s (%.2f ms per %d-token prompt, keep 0.9)\n", name,
               1.0 / best, limit, 100 * (1.0 / best) / limit, "memory", best * 1e3, MIG_TOKENS);
        be->ops->kv_destroy(be, view);
    }
    bench_snapkv(be, hp, arena, src, n_src * bt);
out:
    if (arena)
        be->ops->kv_destroy(be, arena);
    free(blk);
    free(keep);
    free(src);
    free(dst);
}

int main(int argc, char **argv)
{
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf", *device = "cpu";
    int threads = 0, decode_steps = 32, prefill_len = 512;
    /* The KV cache in f16 by default: llama.cpp's default cache type, and
     * the daemon's on its prefill path. */
    int32_t kv_type = DP_KV_F16;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--kv")) {
            kv_type = dp_kv_type_parse(argv[i + 1]);
            if (kv_type < 0 || dp_kv_type_grouped(kv_type)) {
                fprintf(stderr, "dp-bench: --kv: f32, f16, q8_0 or q4_0, not '%s'\n", argv[i + 1]);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) decode_steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prefill")) prefill_len = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: dp-bench [--model F] [--device D] [--threads N] [--steps N] "
                            "[--prefill N] [--kv f32|f16|q8_0|q4_0]\n");
            return 2;
        }
    }
    if (threads <= 0)
        threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double bw = measure_bandwidth(threads);
    double gemm = measure_gemm(threads);

    char err[DP_ERRLEN];
    dp_model_files mf;
    const dp_model_open_opts mo = {.path = model, .device = device, .threads = threads,
                                   .max_tokens = 512, .max_out = 64};
    if (model_open(&mf, &mo, err, sizeof err)) {
        fprintf(stderr, "dp-bench: %s\n", err);
        return 1;
    }
    const dp_gguf *g = &mf.g;
    dp_backend *be = mf.be;
    dp_llama *m = mf.m;
    const dp_hparams *hp = llama_hparams(m);
    /* Bytes one decode step must read: every weight once (the tied embedding
     * table is read whole by the output head), plus the KV. Params for FLOPs. */
    double wbytes = 0, params = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        wbytes += (double)g->tensors[i].nbytes;
        params += (double)g->tensors[i].n_elems;
    }
    if (!hp->tied_output) {
        const dp_gguf_tensor *e = gguf_find_tensor(g, "token_embd.weight");
        wbytes -= (double)e->nbytes; /* only looked up by rows */
        params -= (double)e->n_elems;
    }
    /* KV bytes per token as the backend stores the type (its block's bytes
     * over its tokens). */
    dp_kv_layout kl = llama_kv_layout(m, 16, 1);
    kl.type = kv_type;
    double kv_per_token = (double)be->ops->kv_bytes_per_block(be, &kl) / kl.block_tokens;

    printf("dp-bench: model %s (%s backend, %d threads", model, be->ops->name, threads);
    if (be->ops->kernel_level)
        printf(", %s kernels, %s matmul", be->ops->kernel_level(be),
               be->ops->get_exact(be) ? "exact f32" : "int8-activation");
    printf(", %s KV cache)\n", dp_kv_type_name(kv_type));
    printf("machine: read bandwidth %.1f GB/s, sgemm %.1f GFLOP/s (%d threads)\n",
           bw / 1e9, gemm / 1e9, threads);
    printf("model: %.1f M params, %.1f MB of weights read per decode step\n\n", params / 1e6,
           wbytes / 1e6);
    printf("limit = the roofline: min(read bandwidth / bytes per step, sgemm rate / FLOPs per step)\n");
    printf("%-22s %12s %14s %10s  %s\n", "phase", "tokens/s", "limit tok/s", "ratio", "bound by");

    dp_gen gen;
    int32_t bt = 16;
    /* Prefill: one long prompt, chunked into 512-token steps. */
    {
        int32_t n = prefill_len;
        int32_t *p = malloc((size_t)n * sizeof *p), out[1];
        for (int32_t i = 0; i < n; i++)
            p[i] = (int32_t)((i * 7919u + 13) % (uint32_t)hp->vocab);
        if (gen_init_kv(&gen, m, bt, n / bt + 4, kv_type, err, sizeof err))
            return 1;
        dp_gen_seq sq = {.prompt = p, .n_prompt = n, .max_new = 1, .out = out};
        sq.sampling.temperature = 0;
        gen_run(&gen, &sq, 1, NULL, NULL, NULL, err, sizeof err); /* warm-up */
        gen.t_prefill = 0;
        gen.n_prefill_tokens = 0;
        gen_run(&gen, &sq, 1, NULL, NULL, NULL, err, sizeof err);
        double tps = gen.n_prefill_tokens / gen.t_prefill;
        double limit = gemm / (2.0 * params);
        char name[32];
        snprintf(name, sizeof name, "prefill (%d tokens)", n);
        printf("%-22s %12.1f %14.1f %9.1f%%  %s\n", name, tps, limit, 100 * tps / limit, "GEMM");
        gen_destroy(&gen);
        free(p);
    }
    int batches[] = {1, 8, 32};
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
        int32_t B = batches[bi], plen = 64, steps = decode_steps;
        dp_gen_seq *sq = calloc((size_t)B, sizeof *sq);
        int32_t *prompts = malloc((size_t)B * plen * sizeof *prompts);
        int32_t *outs = malloc((size_t)B * (steps + 1) * sizeof *outs);
        for (int32_t i = 0; i < B * plen; i++)
            prompts[i] = (int32_t)((i * 104729u + 7) % (uint32_t)hp->vocab);
        for (int32_t s = 0; s < B; s++) {
            sq[s].prompt = prompts + s * plen;
            sq[s].n_prompt = plen;
            sq[s].max_new = steps + 1;
            sq[s].out = outs + s * (steps + 1);
            sq[s].sampling.temperature = 0;
        }
        if (gen_init_kv(&gen, m, bt, B * ((plen + steps + 1) / bt + 2), kv_type, err, sizeof err))
            return 1;
        if (gen_run(&gen, sq, B, NULL, NULL, NULL, err, sizeof err)) {
            fprintf(stderr, "dp-bench: %s\n", err);
            return 1;
        }
        double tps = gen.n_decode_tokens / gen.t_decode;
        /* Limit: each step reads the weights once plus each sequence's KV. */
        double step_bytes = wbytes + B * kv_per_token * (plen + steps / 2.0);
        double t_mem = step_bytes / bw, t_flop = 2.0 * params * B / gemm;
        double limit = B / (t_mem > t_flop ? t_mem : t_flop);
        char name[32];
        snprintf(name, sizeof name, "decode batch %d", B);
        printf("%-22s %12.1f %14.1f %9.1f%%  %s\n", name, tps, limit, 100 * tps / limit,
               t_mem > t_flop ? "memory" : "GEMM");
        gen_destroy(&gen);
        free(sq);
        free(prompts);
        free(outs);
    }
    bench_migration(be, m, bw);
    model_close(&mf);
    return 0;
}
