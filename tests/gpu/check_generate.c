/* check_generate.c: whole decode runs, CUDA against the CPU: greedy
 * generation teacher-forced by the CPU's tokens, and recorded decode steps
 * (CUDA graphs) against eager issue, bit for bit. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "kernels/quant.h"
#include "kernels/topk.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "tools/synth_gguf.h"

#include "check_common.h"

/* ---- greedy generation, teacher-forced ---------------------------------------------
 * The CPU generates GEN_NEW tokens per sequence greedily (its own argmax at
 * each step); CUDA runs the same steps fed the CPU's tokens, and its argmax
 * must equal the CPU's at every decision where the CPU's best two logits are
 * more than GEN_MARGIN row standard deviations apart. Fed its own tokens,
 * one fp16-vs-f32 near tie would make every later token differ; fed the
 * CPU's, a near tie costs that one decision, which is counted apart and
 * cannot fail the check (the seed alone fixes the model and prompts, so a
 * rerun sees the same ties). */

enum { GEN_SEQS = 4, GEN_NEW = 32, GEN_BT = 16, GEN_BPS = 5 };
#define GEN_MARGIN 0.05

static void row_stats(const float *x, int32_t n, int32_t *best, float *gap)
{
    int32_t b = 0;
    double s = 0, s2 = 0;
    for (int32_t i = 0; i < n; i++) {
        b = x[i] > x[b] ? i : b;
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    float second = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (i != b && x[i] > second)
            second = x[i];
    const double var = s2 / n - (s / n) * (s / n);
    *best = b;
    *gap = (float)((x[b] - second) / sqrt(var > 0 ? var : 1e-30));
}

/* Runs the prompts then GEN_NEW - 1 decode steps on be. forced NULL: each
 * step's input is this backend's own argmax (written to tokens); otherwise
 * forced[s][j] is the input. Every decision's logits go to logits
 * [GEN_NEW][GEN_SEQS][vocab]. */
static void gen_forced(dp_backend *be, const dp_gguf *g, int32_t *const prompts[GEN_SEQS],
                       const int32_t lens[GEN_SEQS], const int32_t (*forced)[GEN_NEW],
                       int32_t (*tokens)[GEN_NEW], float *logits)
{
    dp_llama *m;
    dp_kv_store *stores[DP_KV_MAX_STORES];
    model_kv_open(be, g, 64, GEN_SEQS, GEN_BT, GEN_SEQS * GEN_BPS, &m, stores);
    const int32_t vocab = llama_hparams(m)->vocab;
    hbatch hb;
    hbatch_alloc(&hb, 64, GEN_SEQS, GEN_BPS);
    for (int32_t s = 0; s < GEN_SEQS; s++)
        for (int32_t j = 0; j < GEN_BPS; j++)
            hb.tables[s * GEN_BPS + j] = s * GEN_BPS + j;
    for (int32_t step = 0; step < GEN_NEW; step++) {
        int32_t n = 0;
        for (int32_t s = 0; s < GEN_SEQS; s++) {
            if (step == 0) {
                for (int32_t j = 0; j < lens[s]; j++, n++) {
                    hb.tokens[n] = prompts[s][j];
                    hb.pos[n] = hb.slot[n] = j;
                    hb.seq[n] = s;
                }
            } else {
                hb.tokens[n] = forced ? forced[s][step - 1] : tokens[s][step - 1];
                hb.pos[n] = hb.slot[n] = lens[s] + step - 1;
                hb.seq[n] = s;
                n++;
            }
            hb.out_tokens[s] = n - 1;
        }
        dp_batch b = {.n_tokens = n, .tokens = hb.tokens, .pos = hb.pos, .seq = hb.seq,
                      .slot = hb.slot, .n_seqs = GEN_SEQS, .seq_store = hb.seq_store,
                      .block_tables = hb.tables, .max_blocks = GEN_BPS, .n_out = GEN_SEQS,
                      .out_tokens = hb.out_tokens};
        float *lg = logits + (size_t)step * GEN_SEQS * vocab;
        if (llama_forward(m, &b, stores, lg))
            die(EXIT_CHECK, "%s: generation step failed", be->ops->name);
        for (int32_t s = 0; s < GEN_SEQS; s++) {
            float gap;
            row_stats(lg + (size_t)s * vocab, vocab, &tokens[s][step], &gap);
        }
    }
    hbatch_free(&hb);
    model_kv_close(be, m, stores);
}

/* required: the check counts (a disagreement at a decisive step fails it);
 * otherwise it is reported only. */
int check_generation(dp_backend *be[2], const char *preset, uint64_t seed, uint32_t type,
                     bool required)
{
    /* A stream of its own, from the seed alone: the model and prompts do
     * not change when checks before this one draw more numbers. */
    const uint64_t saved = g_rs;
    g_rs = (seed ^ 0x6a09e667f3bcc908ull) * 0x9e3779b97f4a7c15ull + type;
    if (!g_rs)
        g_rs = 1;
    synth_model sm;
    synth_open(&sm, preset, rnd64(), type);
    const int32_t vocab = (int32_t)sm.sh.vocab;
    const int32_t lens[GEN_SEQS] = {5, 17, 33, 1};
    int32_t *prompts[GEN_SEQS];
    for (int i = 0; i < GEN_SEQS; i++) {
        prompts[i] = xmalloc((size_t)lens[i] * sizeof(int32_t));
        for (int32_t j = 0; j < lens[i]; j++)
            prompts[i][j] = (int32_t)(rnd64() % (uint64_t)(vocab - 3));
    }
    const size_t nl = (size_t)GEN_NEW * GEN_SEQS * vocab;
    float *lg[2] = {xmalloc(nl * sizeof(float)), xmalloc(nl * sizeof(float))};
    int32_t cpu_tok[GEN_SEQS][GEN_NEW], dev_tok[GEN_SEQS][GEN_NEW];
    gen_forced(be[0], &sm.g, prompts, lens, NULL, cpu_tok, lg[0]);
    gen_forced(be[1], &sm.g, prompts, lens, (const int32_t(*)[GEN_NEW])cpu_tok, dev_tok, lg[1]);
    int decisive = 0, agree = 0, ties = 0, tie_agree = 0;
    float min_gap_miss = INFINITY;
    for (int32_t step = 0; step < GEN_NEW; step++)
        for (int32_t s = 0; s < GEN_SEQS; s++) {
            int32_t best;
            float gap;
            row_stats(lg[0] + ((size_t)step * GEN_SEQS + s) * vocab, vocab, &best, &gap);
            const bool same = dev_tok[s][step] == cpu_tok[s][step];
            if (gap > GEN_MARGIN) {
                decisive++;
                agree += same;
                if (!same && gap < min_gap_miss)
                    min_gap_miss = gap;
            } else {
                ties++;
                tie_agree += same;
            }
        }
    /* How far the logits along the CPU's path are apart (information: the
     * op checks above hold the tolerances). */
    double num = 0, den = 0;
    for (size_t i = 0; i < nl; i++) {
        const double d = (double)lg[1][i] - lg[0][i];
        num += d * d;
        den += (double)lg[0][i] * lg[0][i];
    }
    const bool ok = agree == decisive;
    g_checks++;
    if (required && !ok)
        g_failed++;
    char what[96];
    snprintf(what, sizeof what, "%s %s, %d seqs x %d greedy, teacher-forced", preset,
             quant_type_name(type), GEN_SEQS, GEN_NEW);
    printf("  %-12s %-46s argmax agrees %d/%d decisive (gap > %.2f std), %d/%d near ties; "
           "logits rel %.1e%s", "generate", what, agree, decisive, GEN_MARGIN, tie_agree, ties,
           sqrt(num / (den > 0 ? den : 1)), required ? "" : " (report only)");
    if (!ok)
        printf("; smallest gap missed %.3f", min_gap_miss);
    printf("%s\n", ok ? "  ok" : (required ? "  FAIL" : "  differs"));
    for (int i = 0; i < GEN_SEQS; i++)
        free(prompts[i]);
    free(lg[0]);
    free(lg[1]);
    synth_close(&sm);
    g_rs = saved;
    return ok;
}

/* ---- recorded decode steps (CUDA graphs) --------------------------------------------
 * One script of steps (prefills, then decode steps whose batch, block-table
 * width and context bucket change, a larger prefill in the middle that grows
 * the scratch buffers and so retires every recording) runs on fresh CUDA
 * backends with recording off, on, and recording at first sight (whose first
 * recordings must be abandoned and issued again). The logits of every step
 * must be the same bits whatever the policy, and the counters must show that
 * each path was taken. */

enum { GR_SEQS = 5, GR_BT = 16, GR_BPS = 12, GR_STEPS = 44, GR_MAXT = 128 };

typedef struct gr_step {
    int32_t n;             /* tokens */
    int32_t seqs[GR_MAXT]; /* sequence of each token */
    int32_t toks[GR_MAXT];
} gr_step;

/* The script: fixed by the seed, the same for every run. */
static int32_t gr_script(gr_step *st, int32_t vocab)
{
    int32_t n = 0;
    const int32_t first[4] = {4, 16, 32, 2};
    /* The first token of sequences 0-3: a decode-shaped step on a fresh
     * backend (recording it at once must be abandoned: scratch buffers grow). */
    st[n].n = 4;
    for (int s = 0; s < 4; s++)
        st[n].seqs[s] = s;
    n++;
    /* The rest of their prompts in one step (54 tokens). */
    st[n].n = 0;
    for (int s = 0; s < 4; s++)
        for (int32_t j = 0; j < first[s]; j++)
            st[n].seqs[st[n].n++] = s;
    n++;
    for (int32_t d = 0; d < GR_STEPS; d++) {
        if (d == 20) {
            /* Sequence 4 arrives: a 120-token prefill, large enough to grow
             * the fp16 activation scratch (a retirement of every recording). */
            st[n].n = 120;
            for (int32_t j = 0; j < 120; j++)
                st[n].seqs[j] = 4;
            n++;
        }
        int32_t active = d < 10 ? 4 : d < 20 ? 3 : 5;
        if (d % 7 == 6)
            active = 2; /* a shape seen once in a while */
        st[n].n = active;
        for (int32_t s = 0; s < active; s++)
            st[n].seqs[s] = s;
        n++;
    }
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = 0; j < st[i].n; j++)
            st[i].toks[j] = (int32_t)(rnd64() % (uint64_t)vocab);
    return n;
}

/* Runs the script; out gets every step's logits, in order. */
static void gr_run(dp_backend *be, const dp_gguf *g, int policy, const gr_step *st, int32_t n_steps,
                   float *out, dp_graph_stats *stats)
{
    dp_llama *m;
    dp_kv_store *stores[DP_KV_MAX_STORES];
    model_kv_open(be, g, GR_MAXT, GR_MAXT, GR_BT, GR_SEQS * GR_BPS, &m, stores);
    const int32_t vocab = llama_hparams(m)->vocab;
    if (be->ops->step_graphs)
        be->ops->step_graphs(be, policy, NULL);
    int32_t len[GR_SEQS] = {0};
    hbatch hb;
    hbatch_alloc(&hb, GR_MAXT, GR_SEQS, GR_BPS);
    size_t off = 0;
    for (int32_t i = 0; i < n_steps; i++) {
        const gr_step *s = &st[i];
        /* Batch sequences are the distinct sequences in order of appearance. */
        int32_t bseq[GR_SEQS], nb = 0, width = 1;
        for (int32_t j = 0; j < s->n; j++) {
            if (j == 0 || s->seqs[j] != s->seqs[j - 1])
                bseq[nb++] = s->seqs[j];
            hb.tokens[j] = s->toks[j];
            hb.seq[j] = nb - 1;
            hb.pos[j] = hb.slot[j] = len[s->seqs[j]]++;
            hb.out_tokens[j] = j;
            if (hb.slot[j] / GR_BT + 1 > width)
                width = hb.slot[j] / GR_BT + 1;
        }
        for (int32_t b = 0; b < nb; b++)
            for (int32_t k = 0; k < width; k++)
                hb.tables[b * width + k] = bseq[b] * GR_BPS + k;
        dp_batch b = {.n_tokens = s->n, .tokens = hb.tokens, .pos = hb.pos, .seq = hb.seq,
                      .slot = hb.slot, .n_seqs = nb, .seq_store = hb.seq_store,
                      .block_tables = hb.tables, .max_blocks = width, .n_out = s->n,
                      .out_tokens = hb.out_tokens};
        if (llama_forward(m, &b, stores, out + off))
            die(EXIT_CHECK, "%s", "graph script: a step failed");
        off += (size_t)s->n * vocab;
    }
    if (be->ops->step_graphs)
        be->ops->step_graphs(be, -1, stats);
    hbatch_free(&hb);
    model_kv_close(be, m, stores);
}

void check_graphs(dp_backend *cpu)
{
    char err[DP_ERRLEN];
    synth_model sm;
    synth_open(&sm, "tiny", rnd64(), DP_TYPE_F16);
    const dp_synth_shape sh = sm.sh;
    const dp_gguf *g = &sm.g;
    gr_step *st = xmalloc(GR_STEPS * 2 * sizeof *st);
    const int32_t n_steps = gr_script(st, (int32_t)sh.vocab);
    size_t n_logits = 0;
    for (int32_t i = 0; i < n_steps; i++)
        n_logits += (size_t)st[i].n * sh.vocab;
    const int policies[3] = {DP_GRAPHS_OFF, DP_GRAPHS_ON, DP_GRAPHS_EAGER_RECORD};
    const char *names[3] = {"off", "on", "record at once"};
    float *lg[3];
    dp_graph_stats gs[3];
    for (int p = 0; p < 3; p++) {
        dp_backend *be;
        if (backend_cuda_create(&be, 0, err, sizeof err))
            die(EXIT_SETUP, "cuda backend: %s", err);
        if (!be->ops->step_graphs)
            die(EXIT_SETUP, "%s", "the cuda backend has no step recording");
        lg[p] = xmalloc(n_logits * sizeof(float));
        gr_run(be, g, policies[p], st, n_steps, lg[p], &gs[p]);
        backend_destroy(be);
    }
    for (int p = 1; p < 3; p++) {
        size_t differ = 0;
        double num = 0, den = 0;
        for (size_t i = 0; i < n_logits; i++) {
            if (memcmp(&lg[p][i], &lg[0][i], sizeof(float)) != 0)
                differ++;
            const double d = (double)lg[p][i] - lg[0][i];
            num += d * d;
            den += (double)lg[0][i] * lg[0][i];
        }
        const double rel = sqrt(num / (den > 0 ? den : 1));
        const dp_graph_stats *s = &gs[p];
        /* Every path must have been taken: replays, and (record at once)
         * abandoned recordings; the mid-script prefill retires recordings. */
        bool paths = s->recorded > 0 && s->replayed > 0 && s->evicted > 0 &&
                     (policies[p] != DP_GRAPHS_EAGER_RECORD || s->abandoned > 0);
        /* Bits are expected; a device library that picked another GEMM
         * algorithm inside a capture would still be within rounding. */
        bool ok = paths && (differ == 0 || rel < 1e-5);
        g_checks++;
        if (!ok)
            g_failed++;
        char what[128];
        snprintf(what, sizeof what, "%d steps, recording %s vs off", n_steps, names[p]);
        printf("  %-12s %-46s %s (rel %.1e); recorded %llu, replayed %llu, abandoned %llu, "
               "evicted %llu%s\n",
               "graphs", what, differ ? "logits differ" : "identical bits", rel,
               (unsigned long long)s->recorded, (unsigned long long)s->replayed,
               (unsigned long long)s->abandoned, (unsigned long long)s->evicted,
               ok ? "  ok" : (paths ? "  FAIL" : "  FAIL: a path was not taken"));
    }
    /* The CUDA backend pads decode batches of 3 and 5 sequences (step_pad):
     * the real rows must still match the CPU, which pads nothing. */
    {
        float *ref = xmalloc(n_logits * sizeof(float));
        dp_graph_stats none;
        gr_run(cpu, g, DP_GRAPHS_OFF, st, n_steps, ref, &none);
        char what[96];
        snprintf(what, sizeof what, "%d steps, padded batches: cuda vs cpu logits", n_steps);
        report("graphs", what, ref, lg[1], n_logits, TOL_ATT);
        free(ref);
    }
    if (gs[0].recorded || gs[0].replayed) {
        g_checks++;
        g_failed++;
        printf("  %-12s recording off still recorded steps  FAIL\n", "graphs");
    }
    for (int p = 0; p < 3; p++)
        free(lg[p]);
    free(st);
    synth_close(&sm);
}
