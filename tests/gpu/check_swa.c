/* check_swa.c: sliding-window layers in a store of their own (backend.h
 * layer_map) on the CUDA backend. A synthetic Gemma 3 (six window layers of
 * 8 tokens, one global) runs two sequences in lock step, in random chunks,
 * on each backend: once over one store of every layer, once with the
 * global layer in a store of its own and the sliding layers in a small
 * store whose blocks go back (filled with NaN) as soon as no later window
 * reads them, and are taken again by the other sequence. CUDA's split
 * logits must be its whole cache's byte for byte (the window reads the
 * same keys in the same order) and the CPU's within tolerance. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_common.h"
#include "model/llama.h"

#define SW_BT 4
#define SW_SEQS 2
#define SW_MAXB 32
#define SW_BLOCKS 12
#define SW_CHUNK 6
#define SW_STEPS 64

/* The schedule both backends run: per step, each sequence's chunk (0:
 * none). */
typedef struct sw_plan {
    int32_t chunk[SW_STEPS][SW_SEQS];
    int32_t n_steps;
    int32_t len[SW_SEQS];
    int32_t *toks[SW_SEQS];
} sw_plan;

typedef struct sw_pool {
    int32_t free[SW_BLOCKS], n_free;
    int32_t table[SW_SEQS * SW_MAXB];
    int32_t lo[SW_SEQS], hi[SW_SEQS];
    void *nan_block;
} sw_pool;

static void sw_fit(dp_backend *be, dp_kv_store *ws, sw_pool *w, int32_t s, int32_t first,
                   int32_t end, int32_t window)
{
    while (w->hi[s] * SW_BT < end) {
        if (w->n_free == 0)
            die(EXIT_SETUP, "%s", "swa: the sliding pool is too small");
        w->table[s * SW_MAXB + w->hi[s]++] = w->free[--w->n_free];
    }
    while ((w->lo[s] + 1) * SW_BT <= first + 1 - window) {
        int32_t *e = &w->table[s * SW_MAXB + w->lo[s]++];
        if (be->ops->kv_block_write(be, ws, *e, w->nan_block))
            die(EXIT_SETUP, "%s", "swa: kv_block_write failed");
        w->free[w->n_free++] = *e;
        *e = -1;
    }
}

/* Runs the plan on be: logits of every step's tokens, whole cache (lw)
 * and split (ls), [step][token][vocab] each. */
static void sw_run(dp_backend *be, const dp_gguf *g, const sw_plan *p, float *lw, float *ls)
{
    char err[DP_ERRLEN];
    dp_llama *m;
    if (llama_init(&m, g, be, SW_SEQS * SW_CHUNK, SW_SEQS * SW_CHUNK, err, sizeof err))
        die(EXIT_SETUP, "llama_init: %s", err);
    const dp_hparams *hp = llama_hparams(m);
    const int32_t n_swa = llama_swa_layers(m), window = hp->swa_window, V = hp->vocab;
    dp_kv_layout whole = llama_kv_layout(m, SW_BT, SW_SEQS * SW_MAXB), main = whole, wl = whole;
    whole.type = main.type = wl.type = DP_KV_F16;
    main.n_layers -= n_swa;
    wl.n_layers = n_swa;
    wl.n_blocks = SW_BLOCKS;
    dp_kv_store *sw = NULL, *sm = NULL, *ss = NULL;
    if (be->ops->kv_create(be, &whole, &sw) || be->ops->kv_create(be, &main, &sm) ||
        be->ops->kv_create(be, &wl, &ss))
        die(EXIT_SETUP, "%s", "swa: kv_create failed");
    dp_kv_store *st_whole[DP_KV_MAX_STORES] = {sw}, *st_split[DP_KV_MAX_STORES] = {sm};
    st_split[DP_KV_MAX_STORES - 1] = ss;
    sw_pool w = {.n_free = 0};
    const size_t wbytes = be->ops->kv_bytes_per_block(be, &wl);
    w.nan_block = xmalloc(wbytes);
    memset(w.nan_block, 0xff, wbytes);
    for (int32_t b = 0; b < SW_BLOCKS; b++) {
        w.free[w.n_free++] = SW_BLOCKS - 1 - b;
        if (be->ops->kv_block_write(be, ss, b, w.nan_block))
            die(EXIT_SETUP, "%s", "swa: kv_block_write failed");
    }
    for (int32_t i = 0; i < SW_SEQS * SW_MAXB; i++)
        w.table[i] = -1;
    int32_t main_table[SW_SEQS * SW_MAXB], done[SW_SEQS] = {0};
    for (int32_t i = 0; i < SW_SEQS * SW_MAXB; i++)
        main_table[i] = i;
    const int32_t T = SW_SEQS * SW_CHUNK;
    int32_t tk[SW_SEQS * SW_CHUNK], pos[SW_SEQS * SW_CHUNK], seq[SW_SEQS * SW_CHUNK],
        out[SW_SEQS * SW_CHUNK];
    uint8_t store0[SW_SEQS] = {0};
    for (int32_t k = 0; k < p->n_steps; k++) {
        int32_t n = 0, ns = 0, mt[SW_SEQS * SW_MAXB], wt[SW_SEQS * SW_MAXB];
        for (int32_t s = 0; s < SW_SEQS; s++) {
            const int32_t c = p->chunk[k][s];
            if (!c)
                continue;
            sw_fit(be, ss, &w, s, done[s], done[s] + c, window);
            for (int32_t j = 0; j < c; j++) {
                tk[n] = p->toks[s][done[s] + j];
                pos[n] = done[s] + j;
                seq[n++] = ns;
            }
            memcpy(mt + ns * SW_MAXB, main_table + s * SW_MAXB, SW_MAXB * sizeof(int32_t));
            memcpy(wt + ns * SW_MAXB, w.table + s * SW_MAXB, SW_MAXB * sizeof(int32_t));
            ns++;
            done[s] += c;
        }
        for (int32_t i = 0; i < n; i++)
            out[i] = i;
        dp_batch b = {.n_tokens = n, .tokens = tk, .pos = pos, .seq = seq, .slot = pos,
                      .n_seqs = ns, .seq_store = store0, .block_tables = mt,
                      .max_blocks = SW_MAXB, .n_out = n, .out_tokens = out};
        float *a = lw + (size_t)k * T * V, *c = ls + (size_t)k * T * V;
        if (llama_forward(m, &b, st_whole, a))
            die(EXIT_CHECK, "%s", "swa: the whole cache's step failed");
        b.layer_map = llama_kv_layer_map(m);
        b.w_store = DP_KV_MAX_STORES - 1;
        b.w_block_tables = wt;
        b.w_max_blocks = SW_MAXB;
        if (llama_forward(m, &b, st_split, c))
            die(EXIT_CHECK, "%s", "swa: the split stores' step failed");
    }
    free(w.nan_block);
    be->ops->kv_destroy(be, sw);
    be->ops->kv_destroy(be, sm);
    be->ops->kv_destroy(be, ss);
    llama_destroy(m);
}

void check_swa(dp_backend *be[2])
{
    synth_model sm;
    synth_open(&sm, "tiny-gemma3", 11, DP_TYPE_F16);
    sw_plan p = {.len = {SW_MAXB * SW_BT - 3, 70}};
    for (int32_t s = 0; s < SW_SEQS; s++) {
        p.toks[s] = xmalloc((size_t)p.len[s] * sizeof(int32_t));
        for (int32_t i = 0; i < p.len[s]; i++)
            p.toks[s][i] = (int32_t)(rnd64() % sm.sh.vocab);
    }
    int32_t done[SW_SEQS] = {0};
    while ((done[0] < p.len[0] || done[1] < p.len[1]) && p.n_steps < SW_STEPS) {
        for (int32_t s = 0; s < SW_SEQS; s++) {
            int32_t c = done[s] < p.len[s] ? 1 + (int32_t)(rnd64() % SW_CHUNK) : 0;
            if (c > p.len[s] - done[s])
                c = p.len[s] - done[s];
            p.chunk[p.n_steps][s] = c;
            done[s] += c;
        }
        p.n_steps++;
    }
    const size_t n = (size_t)p.n_steps * SW_SEQS * SW_CHUNK * sm.sh.vocab;
    float *cw = xmalloc(n * sizeof(float)), *cs = xmalloc(n * sizeof(float));
    float *gw = xmalloc(n * sizeof(float)), *gs = xmalloc(n * sizeof(float));
    memset(cw, 0, n * sizeof(float));
    memset(cs, 0, n * sizeof(float));
    memset(gw, 0, n * sizeof(float));
    memset(gs, 0, n * sizeof(float));
    sw_run(be[0], &sm.g, &p, cw, cs);
    sw_run(be[1], &sm.g, &p, gw, gs);
    char what[96];
    snprintf(what, sizeof what, "tiny-gemma3, %d steps: split = whole (cuda)", p.n_steps);
    report_same_bytes("swa", what, gw, gs, n * sizeof(float));
    snprintf(what, sizeof what, "tiny-gemma3, %d steps: split = whole (cpu)", p.n_steps);
    report_same_bytes("swa", what, cw, cs, n * sizeof(float));
    report("swa", "tiny-gemma3 split logits, cuda against cpu", cs, gs, n, TOL_GEMM * 10);
    free(cw);
    free(cs);
    free(gw);
    free(gs);
    for (int32_t s = 0; s < SW_SEQS; s++)
        free(p.toks[s]);
    synth_close(&sm);
}
