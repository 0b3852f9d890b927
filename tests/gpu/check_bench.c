/* check_bench.c: the 7B-shaped benchmark of the GPU check (decode at several
 * batch sizes, a long prefill, kv_compact), each figure against the device's
 * own limit, and the memory plan that sizes its KV store from the memory the
 * device has free once the model is loaded (--plan: the same plan for a
 * given memory size, computed without a device). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "kernels/quant.h"
#include "model/llama.h"

#include "check_common.h"

#define CU(call)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess)                                                                  \
            die(EXIT_SETUP, "%s", cudaGetErrorString(e_));                                     \
    } while (0)

/* Device-to-device copy rate, counting read + write bytes (what a kernel
 * streaming weights sees as its ceiling). */
static double measure_bandwidth(size_t bytes)
{
    void *a, *b;
    CU(cudaMalloc(&a, bytes));
    CU(cudaMalloc(&b, bytes));
    CU(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    const int iters = 10;
    CU(cudaEventRecord(e0, 0));
    for (int i = 0; i < iters; i++)
        CU(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0));
    CU(cudaEventRecord(e1, 0));
    CU(cudaEventSynchronize(e1));
    float ms;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes * iters / (ms * 1e-3);
}

/* fp16 GEMM with f32 accumulation and output, the configuration the backend
 * uses, at a large square shape. */
static double measure_gemm(int n)
{
    void *a, *b, *c;
    CU(cudaMalloc(&a, (size_t)n * n * 2));
    CU(cudaMalloc(&b, (size_t)n * n * 2));
    CU(cudaMalloc(&c, (size_t)n * n * 4));
    CU(cudaMemset(a, 0, (size_t)n * n * 2));
    CU(cudaMemset(b, 0, (size_t)n * n * 2));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        die(EXIT_SETUP, "%s", "cublasCreate failed");
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    const int iters = 20;
    for (int i = -3; i < iters; i++) {
        if (i == 0)
            CU(cudaEventRecord(e0, 0));
        if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16F, n, b, CUDA_R_16F,
                         n, &zero, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
            die(EXIT_SETUP, "%s", "cublasGemmEx failed");
    }
    CU(cudaEventRecord(e1, 0));
    CU(cudaEventSynchronize(e1));
    float ms;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return 2.0 * n * (double)n * n * iters / (ms * 1e-3);
}

/* ---- sizes and the memory plan ----------------------------------------------------- */

/* The benchmark's sizes: the real one, and a miniature that exercises the
 * same code in seconds (--bench-small, for the emulator). */
typedef struct bench_cfg {
    const char *shape;
    size_t bw_bytes;
    int gemm_n;
    int32_t prompt;         /* the prefill case, and the activations' token budget */
    int32_t ctx, steps;     /* decode: context before the timed steps, steps timed */
    int32_t batches[4];     /* decode batch sizes, ascending */
    int32_t cmp_seqs, cmp_slots, cmp_keep;
} bench_cfg;

enum { BENCH_BT = 16, BENCH_WARM = 2, N_BATCHES = 4 };

/* ctx 480: with the 10 steps run each decode sequence fills 31 blocks of 16
 * (490 of 496 slots), so batch 256 takes 7936 blocks, 62 GiB of f16 KV at
 * 7B, and fits an 80 GiB device beside 12.6 GiB of weights. */
static const bench_cfg BENCH_FULL = {"7b", (size_t)4 << 30, 8192, 2048, 480, 8,
                                     {1, 16, 64, 256}, 16, 2048, 1024};
static const bench_cfg BENCH_SMALL = {"tiny", (size_t)1 << 20, 64, 64, 32, 2,
                                      {1, 2, 3, 4}, 2, 64, 32};

/* What a dry plan assumes the CUDA runtime takes before any allocation of
 * ours (context, module images, cuBLAS handle and workspace); a real run
 * measures the free memory after the load instead. */
#define PLAN_CONTEXT ((size_t)1 << 30)
/* Left free after the KV store: scratch that grows at first use (fp16
 * activation copies, attention partials, top-k buffers) and recorded steps. */
#define PLAN_HEADROOM ((size_t)1 << 30)

enum { CASE_PREFILL = N_BATCHES, CASE_COMPACT, N_CASES };

typedef struct bench_plan {
    size_t total;           /* device memory */
    size_t weights, acts;   /* the model's (measured, or computed for a dry plan) */
    size_t free_after_load; /* measured, or total - context - weights - acts */
    size_t blk_bytes;       /* one KV block, every layer, K and V */
    int32_t need[N_CASES];  /* blocks each case needs */
    int32_t n_blocks;       /* the store: what every case needs, or what fits */
    bool dry;
} bench_plan;

static int32_t blocks_per_seq(const bench_cfg *bc)
{
    return (bc->ctx + BENCH_WARM + bc->steps + BENCH_BT - 1) / BENCH_BT;
}

static int32_t max_batch(const bench_cfg *bc) { return bc->batches[N_BATCHES - 1]; }

static void plan_make(bench_plan *p, const bench_cfg *bc)
{
    const int32_t bps = blocks_per_seq(bc);
    int32_t want = 0;
    for (int i = 0; i < N_BATCHES; i++)
        p->need[i] = bc->batches[i] * bps;
    p->need[CASE_PREFILL] = bc->prompt / BENCH_BT;
    p->need[CASE_COMPACT] = bc->cmp_seqs * (bc->cmp_slots / BENCH_BT + bc->cmp_keep / BENCH_BT);
    for (int i = 0; i < N_CASES; i++)
        want = p->need[i] > want ? p->need[i] : want;
    const size_t budget = p->free_after_load > PLAN_HEADROOM ? p->free_after_load - PLAN_HEADROOM : 0;
    const size_t fit = p->blk_bytes ? budget / p->blk_bytes : 0;
    p->n_blocks = (size_t)want < fit ? want : (int32_t)fit;
}

static bool plan_fits(const bench_plan *p, int c) { return p->need[c] <= p->n_blocks; }

static double gib(size_t b) { return (double)b / (double)((size_t)1 << 30); }

/* Prints the plan; returns how many cases it skips. */
static int plan_print(const bench_plan *p, const bench_cfg *bc)
{
    printf("  memory plan (%s): device %.2f GiB; weights %.2f GiB, activations %.2f GiB",
           p->dry ? "computed for the given size" : "measured", gib(p->total), gib(p->weights),
           gib(p->acts));
    if (p->dry)
        printf(", runtime %.2f GiB (assumed)", gib(PLAN_CONTEXT));
    printf("\n  %.2f GiB free after the load, %.2f GiB kept free for scratch; KV store %d blocks "
           "x %.2f MiB = %.2f GiB\n", gib(p->free_after_load), gib(PLAN_HEADROOM), p->n_blocks,
           (double)p->blk_bytes / (1 << 20), gib((size_t)p->n_blocks * p->blk_bytes));
    int skipped = 0;
    for (int c = 0; c < N_CASES; c++) {
        char name[32];
        if (c < N_BATCHES)
            snprintf(name, sizeof name, "decode batch %d", bc->batches[c]);
        else
            snprintf(name, sizeof name, "%s", c == CASE_PREFILL ? "prefill" : "kv_compact");
        const bool fits = plan_fits(p, c);
        skipped += !fits;
        printf("    %-20s %7d blocks  %.2f GiB  %s\n", name, p->need[c],
               gib((size_t)p->need[c] * p->blk_bytes), fits ? "fits" : "skipped (memory)");
    }
    return skipped;
}

static void shape_hparams(const dp_synth_shape *sh, dp_hparams *hp)
{
    memset(hp, 0, sizeof *hp);
    hp->n_layers = (int32_t)sh->n_layers;
    hp->dim = (int32_t)sh->dim;
    hp->n_heads = (int32_t)sh->n_heads;
    hp->n_kv_heads = (int32_t)sh->n_kv_heads;
    hp->head_dim = (int32_t)(sh->dim / sh->n_heads);
    hp->ffn = (int32_t)sh->ffn;
    hp->vocab = (int32_t)sh->vocab;
    hp->tied_output = sh->tied;
}

/* Weight bytes on the CUDA backend: matrices (the embedding too) in fp16,
 * norm vectors in f32. */
static size_t shape_weight_bytes(const dp_hparams *hp)
{
    const double hd = hp->head_dim;
    const double mats = (double)hp->n_layers * ((double)hp->dim * hp->n_heads * hd * 2 +
                                                (double)hp->dim * hp->n_kv_heads * hd * 2 +
                                                3.0 * hp->dim * hp->ffn) +
                        (double)hp->vocab * hp->dim * (hp->tied_output ? 1 : 2);
    const double norms = (2.0 * hp->n_layers + 1) * hp->dim;
    return (size_t)(2 * mats + 4 * norms);
}

/* The same model as a Q4_K_M file from llama-quantize: Q6_K for the output
 * head (the embedding when tied), and for attn_v and ffn_down in the layers
 * llama.cpp gives more bits (the first and last eighth, and every third
 * between); Q4_K for every other matrix. The CUDA backend keeps these
 * blocks as the file has them (kernels/cuda/cuda_wquant.cu). */
static size_t qk_bytes(uint32_t type, double rows, double cols)
{
    uint64_t rb;
    if (quant_row_bytes(type, (uint64_t)cols, &rb))
        die(EXIT_SETUP, "%s", "no K-quant row size for this shape");
    return (size_t)(rows * (double)rb);
}

static size_t shape_weight_bytes_q4km(const dp_hparams *hp)
{
    const int32_t n = hp->n_layers, hd = hp->head_dim;
    size_t b = qk_bytes(hp->tied_output ? DP_TYPE_Q6_K : DP_TYPE_Q4_K, hp->vocab, hp->dim);
    if (!hp->tied_output)
        b += qk_bytes(DP_TYPE_Q6_K, hp->vocab, hp->dim);
    for (int32_t i = 0; i < n; i++) {
        const bool more = i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        const uint32_t vt = more ? DP_TYPE_Q6_K : DP_TYPE_Q4_K;
        b += qk_bytes(DP_TYPE_Q4_K, (double)hp->n_heads * hd, hp->dim) * 2; /* q, o */
        b += qk_bytes(DP_TYPE_Q4_K, (double)hp->n_kv_heads * hd, hp->dim);  /* k */
        b += qk_bytes(vt, (double)hp->n_kv_heads * hd, hp->dim);            /* v */
        b += qk_bytes(DP_TYPE_Q4_K, hp->ffn, hp->dim) * 2;                  /* gate, up */
        b += qk_bytes(vt, hp->dim, hp->ffn);                                /* down */
    }
    return b + (size_t)(4 * (2.0 * n + 1) * hp->dim);
}

/* The CUDA backend's block: f16 K and V rows of every layer and KV head. */
static size_t shape_block_bytes(const dp_hparams *hp)
{
    return 2 * (size_t)hp->n_layers * (size_t)hp->n_kv_heads * BENCH_BT * (size_t)hp->head_dim * 2;
}

/* The plan for a device of total bytes, from the shape alone. */
static void plan_dry(bench_plan *p, const bench_cfg *bc, size_t total, bool q4km)
{
    dp_synth_shape sh;
    dp_hparams hp;
    if (synth_shape_preset(bc->shape, &sh))
        die(EXIT_SETUP, "no %s preset", bc->shape);
    shape_hparams(&sh, &hp);
    memset(p, 0, sizeof *p);
    p->dry = true;
    p->total = total;
    p->weights = q4km ? shape_weight_bytes_q4km(&hp) : shape_weight_bytes(&hp);
    p->acts = llama_activation_bytes(&hp, bc->prompt, max_batch(bc), false);
    const size_t used = PLAN_CONTEXT + p->weights + p->acts;
    p->free_after_load = total > used ? total - used : 0;
    p->blk_bytes = shape_block_bytes(&hp);
    plan_make(p, bc);
}

int bench_plan_dry(size_t total_bytes, bool small)
{
    const bench_cfg *bc = small ? &BENCH_SMALL : &BENCH_FULL;
    bench_plan p;
    plan_dry(&p, bc, total_bytes, false);
    printf("benchmark memory plan (%s-shaped synthetic model, fp16 weights, no capture buffer)\n",
           bc->shape);
    const int skipped = plan_print(&p, bc);
    printf("  %s\n", skipped ? "some cases do not fit" : "every case fits");
    if (small) /* the tiny shape's rows are shorter than a K-quant block */
        return skipped ? 1 : 0;
    /* The same shape as users download it: its blocks stay their size, and
     * what they do not take goes to the KV store. */
    bench_plan q;
    plan_dry(&q, bc, total_bytes, true);
    printf("the same model as Q4_K_M (weights at their file size on the device)\n");
    const int skipped_q = plan_print(&q, bc);
    const size_t kv_max = q.free_after_load > PLAN_HEADROOM ? q.free_after_load - PLAN_HEADROOM : 0;
    printf("  %s; room for %zu KV blocks (%.2f GiB) against %zu with fp16 weights\n",
           skipped_q ? "some cases do not fit" : "every case fits", kv_max / q.blk_bytes,
           gib(kv_max / q.blk_bytes * q.blk_bytes),
           (p.free_after_load > PLAN_HEADROOM ? p.free_after_load - PLAN_HEADROOM : 0) / p.blk_bytes);
    return skipped || skipped_q ? 1 : 0;
}

/* ---- the cases ----------------------------------------------------------------------- */

typedef struct bench_ctx {
    const bench_cfg *bc;
    dp_backend *gpu;
    dp_llama *m;
    dp_kv_store *stores[DP_KV_MAX_STORES];
    float *logits;
    hbatch hb;
    double bw, flops;
    double weight_bytes, kv_bytes_per_slot, matmul_params;
} bench_ctx;

static void skipped_row(const char *name, const bench_plan *p, int c)
{
    printf("  %-24s %12s %12s %8s   skipped (memory): needs %d blocks, the store has %d\n", name,
           "-", "-", "-", p->need[c], p->n_blocks);
}

/* Decode steps at batch B: op by op, then recorded and replayed (the
 * default); the same slots are rewritten. */
static void bench_decode(bench_ctx *x, int32_t B)
{
    const bench_cfg *bc = x->bc;
    const int32_t bps = blocks_per_seq(bc), ctx = bc->ctx, steps = bc->steps;
    const int32_t vocab = llama_hparams(x->m)->vocab;
    hbatch *hb = &x->hb;
    dp_batch b = {.n_tokens = B, .tokens = hb->tokens, .pos = hb->pos, .seq = hb->seq,
                  .slot = hb->slot, .n_seqs = B, .seq_store = hb->seq_store,
                  .block_tables = hb->tables, .max_blocks = bps, .n_out = B,
                  .out_tokens = hb->out_tokens};
    for (int32_t i = 0; i < B; i++) {
        hb->seq[i] = i;
        hb->out_tokens[i] = i;
        for (int32_t j = 0; j < bps; j++)
            hb->tables[(size_t)i * bps + j] = i * bps + j;
    }
    double t_mode[2] = {0, 0}, kv_read = 0;
    dp_backend *gpu = x->gpu;
    for (int graphs = 0; graphs < 2; graphs++) {
        if (gpu->ops->step_graphs)
            gpu->ops->step_graphs(gpu, graphs ? DP_GRAPHS_ON : DP_GRAPHS_OFF, NULL);
        else if (graphs)
            break;
        kv_read = 0;
        for (int32_t s = 0; s < BENCH_WARM + steps; s++) {
            for (int32_t i = 0; i < B; i++) {
                hb->tokens[i] = (int32_t)(rnd64() % (uint64_t)vocab);
                hb->pos[i] = hb->slot[i] = ctx + s;
            }
            double a = dp_now();
            if (llama_forward(x->m, &b, x->stores, x->logits))
                die(EXIT_CHECK, "%s", "decode step failed");
            if (s >= BENCH_WARM) {
                t_mode[graphs] += dp_now() - a;
                kv_read += (double)B * (ctx + s + 1) * x->kv_bytes_per_slot;
            }
        }
    }
    const double t = t_mode[1] > 0 ? t_mode[1] : t_mode[0];
    const double tps = (double)B * steps / t;
    const double limit = (double)B * steps / ((x->weight_bytes * steps + kv_read) / x->bw);
    char name[32], notes[160];
    snprintf(name, sizeof name, "decode batch %d", B);
    snprintf(notes, sizeof notes, "ctx %d; %.1f GB weights + %.1f GB KV per step; step %.2f ms, "
             "eager %.2f ms (graphs x%.2f)", ctx, x->weight_bytes / 1e9, kv_read / steps / 1e9,
             1e3 * t / steps, 1e3 * t_mode[0] / steps, t_mode[1] > 0 ? t_mode[0] / t_mode[1] : 1.0);
    printf("  %-24s %12.1f %12.1f %7.1f%%   %s\n", name, tps, limit, 100.0 * tps / limit, notes);
}

/* One prompt of bc->prompt tokens in one step, three runs after a warm-up. */
static void bench_prefill(bench_ctx *x)
{
    const int32_t prompt = x->bc->prompt;
    const int32_t vocab = llama_hparams(x->m)->vocab;
    hbatch *hb = &x->hb;
    dp_batch b = {.n_tokens = prompt, .tokens = hb->tokens, .pos = hb->pos, .seq = hb->seq,
                  .slot = hb->slot, .n_seqs = 1, .seq_store = hb->seq_store,
                  .block_tables = hb->tables, .max_blocks = prompt / BENCH_BT, .n_out = 1,
                  .out_tokens = hb->out_tokens};
    for (int32_t i = 0; i < prompt; i++) {
        hb->tokens[i] = (int32_t)(rnd64() % (uint64_t)vocab);
        hb->pos[i] = hb->slot[i] = i;
        hb->seq[i] = 0;
    }
    for (int32_t j = 0; j < prompt / BENCH_BT; j++)
        hb->tables[j] = j;
    hb->out_tokens[0] = prompt - 1;
    double t = 0;
    const int runs = 3;
    for (int r = -1; r < runs; r++) {
        double a = dp_now();
        if (llama_forward(x->m, &b, x->stores, x->logits))
            die(EXIT_CHECK, "%s", "prefill step failed");
        if (r >= 0)
            t += dp_now() - a;
    }
    const double tps = (double)prompt * runs / t;
    const double limit = x->flops / (2.0 * x->matmul_params);
    char notes[96], name[32];
    snprintf(notes, sizeof notes, "%d-token prompt; limit = GEMM rate / (2 x %.2fB params)", prompt,
             x->matmul_params / 1e9);
    snprintf(name, sizeof name, "prefill %d", prompt);
    printf("  %-24s %12.1f %12.1f %7.1f%%   %s\n", name, tps, limit, 100.0 * tps / limit, notes);
}

/* cmp_seqs prefill sequences of cmp_slots tokens keep cmp_keep rows per
 * (layer, head), copied within the benchmark store into disjoint blocks (the
 * engine copies between pools; the bytes are the same). The time includes
 * the host's validation and upload of the keep lists. */
static void bench_compact(bench_ctx *x)
{
    dp_backend *gpu = x->gpu;
    const dp_hparams *hp = llama_hparams(x->m);
    const bench_cfg *bc = x->bc;
    const int32_t n_seqs = bc->cmp_seqs, n_slots = bc->cmp_slots, n_keep = bc->cmp_keep;
    const int32_t nsb = n_slots / BENCH_BT, ndb = n_keep / BENCH_BT;
    const size_t per = (size_t)hp->n_layers * hp->n_kv_heads * n_keep;
    int32_t *tables = xmalloc((size_t)n_seqs * (nsb + ndb) * sizeof(int32_t));
    int32_t *keep = xmalloc((size_t)n_seqs * per * sizeof(int32_t));
    dp_compact_seq *cs = xmalloc((size_t)n_seqs * sizeof *cs);
    for (int32_t i = 0; i < n_seqs * (nsb + ndb); i++)
        tables[i] = i;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t *kp = keep + (size_t)i * per;
        for (size_t lh = 0; lh < per / n_keep; lh++) {
            int32_t k = 0;
            for (int32_t sl = 0; sl < n_slots && k < n_keep; sl++)
                if ((int64_t)(rnd64() % (uint64_t)(n_slots - sl)) < n_keep - k)
                    kp[lh * n_keep + k++] = sl;
        }
        cs[i] = (dp_compact_seq){tables + (size_t)i * nsb, nsb,
                                 tables + (size_t)n_seqs * nsb + (size_t)i * ndb, ndb, n_keep, kp};
    }
    float *sync_buf = dev_alloc(gpu, 1);
    dp_kv_store *kv = x->stores[0];
    double t = 0;
    for (int r = 0; r < 3; r++) {
        double a = dp_now();
        if (gpu->ops->kv_compact(gpu, kv, kv, cs, n_seqs))
            die(EXIT_CHECK, "%s", "kv_compact failed");
        if (gpu->ops->download(gpu, x->logits, sync_buf, sizeof(float)))
            die(EXIT_CHECK, "%s", "kv_compact: sync failed");
        if (r > 0)
            t += dp_now() - a;
    }
    t /= 2;
    const double moved = 2.0 * 2.0 * (double)n_seqs * per * hp->head_dim * 2.0; /* K+V, read+write */
    char notes[192];
    snprintf(notes, sizeof notes, "%.2f ms per migrated sequence (%d seqs x %d of %d rows per "
             "head; %.2f GB moved in %.1f ms, incl. host)", t * 1e3 / n_seqs, n_seqs, n_keep,
             n_slots, moved / 1e9, t * 1e3);
    printf("  %-24s %7.0f GB/s %7.0f GB/s %7.1f%%   %s\n", "kv_compact", moved / t / 1e9,
           x->bw / 1e9, 100.0 * moved / t / x->bw, notes);
    gpu->ops->free(gpu, sync_buf);
    free(tables);
    free(keep);
    free(cs);
}

/* ---- quantized weights ---------------------------------------------------------------
 * The matmul of one 7B FFN-shaped weight (ffn x dim; tiny: 96 x 256) in
 * each block type users download, against the same shape in fp16: the
 * GEMV's read rate at 1 and 8 activation rows (bytes of the weight over the
 * call's time, against the measured bandwidth) and the slab GEMM's rate at
 * the prompt's rows (against cuBLAS's fp16 rate). Weights only: no KV, no
 * other op, so this is the kernels' own limit. */
static void bench_wquant(dp_backend *gpu, const bench_cfg *bc, double bw, double flops)
{
    const bool small = bc == &BENCH_SMALL;
    const int64_t rows = small ? 96 : 11008, cols = small ? 256 : 4096;
    const uint32_t types[] = {DP_TYPE_F16, DP_TYPE_Q8_0, DP_TYPE_Q4_0, DP_TYPE_Q4_K,
                              DP_TYPE_Q5_K, DP_TYPE_Q6_K, DP_TYPE_IQ4_XS};
    const int32_t ms[3] = {1, 8, bc->prompt};
    const int reps = small ? 2 : 20;
    char err[DP_ERRLEN];
    printf("\nquantized weights: one %lld x %lld matmul per call (best of %d calls)\n",
           (long long)rows, (long long)cols, reps);
    printf("  %-7s %9s  %9s %7s %6s  %9s %7s %6s  %9s %8s %6s\n", "type", "MiB", "m=1 us", "GB/s",
           "%bw", "m=8 us", "GB/s", "%bw", "m=prompt", "TFLOP/s", "%gemm");
    float *x = xmalloc((size_t)bc->prompt * (size_t)cols * sizeof *x);
    fill(x, (size_t)bc->prompt * (size_t)cols, 1.0f);
    float *dx = dev_from(gpu, x, (size_t)bc->prompt * (size_t)cols);
    float *dy = dev_alloc(gpu, (size_t)bc->prompt * (size_t)rows);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint8_t *raw = weight_make(types[ti], rows, cols, 0.1f);
        dp_weight w;
        if (gpu->ops->weight_load(gpu, &w, types[ti], rows, cols, raw, err, sizeof err))
            die(EXIT_SETUP, "weight_load: %s", err);
        free(raw);
        double us[3];
        for (int k = 0; k < 3; k++) {
            double best = INFINITY;
            for (int r = -1; r < reps; r++) {
                dev_wait(gpu);
                const double a = dp_now();
                gpu->ops->matmul(gpu, dy, dx, &w, ms[k]);
                dev_wait(gpu);
                const double t = dp_now() - a;
                if (r >= 0 && t < best)
                    best = t;
            }
            us[k] = best * 1e6;
        }
        const double bytes = (double)w.nbytes;
        const double tf = 2.0 * (double)rows * (double)cols * ms[2] / (us[2] * 1e-6);
        printf("  %-7s %9.1f  %9.1f %7.0f %5.0f%%  %9.1f %7.0f %5.0f%%  %9.1f %8.1f %5.0f%%\n",
               quant_type_name(types[ti]), bytes / (1 << 20), us[0], bytes / us[0] / 1e3,
               100.0 * bytes / (us[0] * 1e-6) / bw, us[1], bytes / us[1] / 1e3,
               100.0 * bytes / (us[1] * 1e-6) / bw, us[2], tf / 1e12, 100.0 * tf / flops);
        gpu->ops->weight_free(gpu, &w);
    }
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dy);
    free(x);
}

/* ---- the run ------------------------------------------------------------------------- */

/* The store of the plan; a device that refuses it (fragmentation, memory
 * another process took since) gets one a tenth smaller, a few times, and the
 * cases are planned again for what was had. */
static dp_kv_store *plan_store(dp_backend *gpu, dp_llama *m, bench_plan *p)
{
    for (int tries = 0; tries < 4 && p->n_blocks > 0; tries++) {
        dp_kv_layout l = llama_kv_layout(m, BENCH_BT, p->n_blocks);
        dp_kv_store *kv;
        if (!gpu->ops->kv_create(gpu, &l, &kv))
            return kv;
        printf("  kv_create of %d blocks failed; trying %d\n", p->n_blocks, p->n_blocks / 10 * 9);
        p->n_blocks = p->n_blocks / 10 * 9;
    }
    return NULL;
}

int bench_run(dp_backend *gpu, bool small)
{
    const bench_cfg *bc = small ? &BENCH_SMALL : &BENCH_FULL;
    char err[DP_ERRLEN];
    printf("\nbenchmark (%s-shaped synthetic model, fp16 weights)\n", bc->shape);
    bench_ctx x = {.bc = bc, .gpu = gpu};
    x.bw = measure_bandwidth(bc->bw_bytes);
    x.flops = measure_gemm(bc->gemm_n);
    printf("  device-to-device bandwidth  %.2f TB/s (cudaMemcpy of %.0f MiB, read + write)\n",
           x.bw / 1e12, (double)bc->bw_bytes / (1 << 20));
    printf("  cuBLAS fp16 GEMM rate       %.0f TFLOP/s (%d^3, f32 accumulate)\n", x.flops / 1e12,
           bc->gemm_n);
    bench_wquant(gpu, bc, x.bw, x.flops);

    double t0 = dp_now();
    synth_model sm;
    synth_open(&sm, bc->shape, 7, DP_TYPE_F16);
    const dp_synth_shape sh = sm.sh;
    double t1 = dp_now();
    /* No capture buffer: nothing here migrates (1 GiB at 7B). */
    if (llama_init_ex(&x.m, &sm.g, gpu, bc->prompt, max_batch(bc), DP_LLAMA_NO_CAPTURE, err,
                      sizeof err))
        die(EXIT_SETUP, "llama_init: %s", err);
    double t2 = dp_now();
    printf("  model: %u layers, dim %u, %u/%u heads, ffn %u, vocab %u: built in %.0f s, loaded in %.1f s\n",
           sh.n_layers, sh.dim, sh.n_heads, sh.n_kv_heads, sh.ffn, sh.vocab, t1 - t0, t2 - t1);
    synth_close(&sm);

    const dp_hparams *hp = llama_hparams(x.m);
    const double hd = hp->head_dim;
    x.matmul_params = hp->n_layers * ((double)hp->dim * (hp->n_heads * hd) * 2 +
                                      (double)hp->dim * (hp->n_kv_heads * hd) * 2 +
                                      3.0 * hp->dim * hp->ffn);
    /* Bytes a decode step must read: every weight once (fp16), plus the KV
     * of every attended slot (fp16 K and V, every layer). */
    x.weight_bytes = 2.0 * (x.matmul_params + (double)hp->dim * hp->vocab);
    x.kv_bytes_per_slot = 2.0 * 2.0 * hp->n_layers * hp->n_kv_heads * hd;

    /* The plan from what is free now, beside the one a dry run computes
     * for this device's size (so that --plan can be trusted on others). */
    bench_plan p = {0}, dry;
    size_t free_b = 0, alloc_b = 0;
    if (!gpu->ops->mem_info || gpu->ops->mem_info(gpu, &free_b, &p.total))
        die(EXIT_SETUP, "%s", "the backend reports no free memory (mem_info)");
    if (gpu->ops->mem_usage)
        gpu->ops->mem_usage(gpu, &p.weights, &alloc_b);
    p.acts = llama_activation_bytes(hp, bc->prompt, max_batch(bc), false);
    p.free_after_load = free_b;
    dp_kv_layout l0 = llama_kv_layout(x.m, BENCH_BT, 1);
    p.blk_bytes = gpu->ops->kv_bytes_per_block(gpu, &l0);
    plan_make(&p, bc);
    plan_dry(&dry, bc, p.total, false);
    plan_print(&p, bc);
    printf("  (a dry plan for %.2f GiB: %.2f GiB free after the load, %d blocks)\n", gib(p.total),
           gib(dry.free_after_load), dry.n_blocks);
    dp_kv_store *kv = plan_store(gpu, x.m, &p);
    if (!kv) {
        printf("  %-24s skipped (memory): no KV store fits\n", "every case");
        llama_destroy(x.m);
        return 0;
    }
    x.stores[0] = kv;
    CU(cudaMallocHost((void **)&x.logits, (size_t)max_batch(bc) * hp->vocab * sizeof(float)));
    const int32_t bps = blocks_per_seq(bc);
    const int32_t pb = bc->prompt / BENCH_BT;
    hbatch_alloc(&x.hb, bc->prompt, max_batch(bc), bps > pb ? bps : pb);

    printf("  %-24s %12s %12s %8s   %s\n", "case", "tokens/s", "limit", "ratio", "notes");
    for (int i = 0; i < N_BATCHES; i++) {
        char name[32];
        snprintf(name, sizeof name, "decode batch %d", bc->batches[i]);
        if (plan_fits(&p, i))
            bench_decode(&x, bc->batches[i]);
        else
            skipped_row(name, &p, i);
    }
    if (plan_fits(&p, CASE_PREFILL))
        bench_prefill(&x);
    else
        skipped_row("prefill", &p, CASE_PREFILL);
    if (!gpu->ops->kv_compact)
        printf("  %-24s %s\n", "kv_compact", "kv_compact: not in this build");
    else if (plan_fits(&p, CASE_COMPACT))
        bench_compact(&x);
    else
        skipped_row("kv_compact", &p, CASE_COMPACT);
    hbatch_free(&x.hb);
    cudaFreeHost(x.logits);
    gpu->ops->kv_destroy(gpu, kv);
    llama_destroy(x.m);
    return 0;
}
