/* test_swa.c: sliding-window layers kept at their window, in a store of
 * their own (backend.h layer_map), give the logits of the whole cache bit
 * for bit. Two sequences of a synthetic Gemma 3 (six sliding layers of
 * window 8, one global) run in lock step, in random chunks, once over one
 * store that keeps every token of every layer, once with the global layer
 * in a store of one layer and the sliding layers in a small store whose
 * blocks are given back as soon as every later token's window has passed
 * them. A given-back block is filled with NaN, then taken by the other
 * sequence: a read of anything outside the window shows in the logits.
 * Also: the forward pass refuses a sliding table missing a block inside a
 * window, a map that is not the model's, and exempt layers beside it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "t.h"
#include "tools/synth_gguf.h"

#define BT 4          /* tokens per block */
#define NSEQ 2
#define MAXB 32       /* table entries per sequence */
#define W_BLOCKS 12   /* the sliding store: room for both windows and a chunk each */
#define MAX_CHUNK 6

static uint64_t rs = 7;
static uint32_t urand(uint32_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

typedef struct sliding {
    int32_t free[W_BLOCKS], n_free;
    int32_t table[NSEQ * MAXB];
    int32_t lo[NSEQ], hi[NSEQ]; /* live entries [lo, hi) */
    void *nan_block;
} sliding;

static void sliding_give_back(dp_backend *be, dp_kv_store *ws, sliding *w, int32_t s, int32_t j)
{
    int32_t *e = &w->table[s * MAXB + j];
    CHECK(be->ops->kv_block_write(be, ws, *e, w->nan_block) == 0);
    w->free[w->n_free++] = *e;
    *e = -1;
}

/* Blocks for positions [0, end) of sequence s, and none wholly before
 * the window of its token at position `first` (the step's first). */
static void sliding_fit(dp_backend *be, dp_kv_store *ws, sliding *w, int32_t s, int32_t first,
                        int32_t end, int32_t window)
{
    while (w->hi[s] * BT < end) {
        CHECK(w->n_free > 0);
        w->table[s * MAXB + w->hi[s]++] = w->free[--w->n_free];
    }
    while ((w->lo[s] + 1) * BT <= first + 1 - window)
        sliding_give_back(be, ws, w, s, w->lo[s]++);
}

static void run_type(const dp_gguf *g, dp_kv_type type)
{
    char err[DP_ERRLEN];
    dp_backend *be;
    CHECK(backend_create(&be, "cpu", 2, err, sizeof err) == 0);
    dp_llama *m;
    CHECK_MSG(llama_init(&m, g, be, NSEQ * MAX_CHUNK, NSEQ * MAX_CHUNK, err, sizeof err) == 0,
              "%s", err);
    const dp_hparams *hp = llama_hparams(m);
    const int32_t window = hp->swa_window, n_swa = llama_swa_layers(m);
    const int32_t *map = llama_kv_layer_map(m);
    CHECK(window == 8 && n_swa == 6 && map && map[5] == 0 && map[0] == -1 && map[6] == -6);

    dp_kv_layout whole = llama_kv_layout(m, BT, NSEQ * MAXB), main = whole, wl = whole;
    whole.type = main.type = wl.type = type;
    main.n_layers = hp->n_layers - n_swa;
    wl.n_layers = n_swa;
    wl.n_blocks = W_BLOCKS;
    dp_kv_store *sw = NULL, *sm = NULL, *ss = NULL;
    CHECK(be->ops->kv_create(be, &whole, &sw) == 0);
    CHECK(be->ops->kv_create(be, &main, &sm) == 0);
    CHECK(be->ops->kv_create(be, &wl, &ss) == 0);
    dp_kv_store *st_whole[DP_KV_MAX_STORES] = {sw}, *st_split[DP_KV_MAX_STORES] = {sm};
    st_split[3] = ss;

    sliding w = {.n_free = 0};
    const size_t wbytes = be->ops->kv_bytes_per_block(be, &wl);
    w.nan_block = malloc(wbytes);
    memset(w.nan_block, 0xff, wbytes); /* NaN in f32 and in f16 */
    for (int32_t b = 0; b < W_BLOCKS; b++) {
        w.free[w.n_free++] = W_BLOCKS - 1 - b;
        CHECK(be->ops->kv_block_write(be, ss, b, w.nan_block) == 0);
    }
    for (int32_t i = 0; i < NSEQ * MAXB; i++)
        w.table[i] = -1;

    const int32_t len[NSEQ] = {MAXB * BT - 3, 70};
    int32_t *toks[NSEQ], done[NSEQ] = {0};
    int32_t main_table[NSEQ * MAXB];
    for (int32_t s = 0; s < NSEQ; s++) {
        toks[s] = malloc((size_t)len[s] * sizeof(int32_t));
        for (int32_t i = 0; i < len[s]; i++)
            toks[s][i] = (int32_t)urand((uint32_t)hp->vocab);
        for (int32_t j = 0; j < MAXB; j++)
            main_table[s * MAXB + j] = s * MAXB + j;
    }
    const int32_t T = NSEQ * MAX_CHUNK;
    int32_t tk[NSEQ * MAX_CHUNK], pos[NSEQ * MAX_CHUNK], seq[NSEQ * MAX_CHUNK], out[NSEQ * MAX_CHUNK];
    uint8_t store0[NSEQ] = {0};
    float *la = malloc((size_t)T * (size_t)hp->vocab * sizeof(float));
    float *lb = malloc((size_t)T * (size_t)hp->vocab * sizeof(float));
    int steps = 0, held_max = 0;
    while (done[0] < len[0] || done[1] < len[1]) {
        int32_t n = 0, ns = 0, seq_of[NSEQ];
        for (int32_t s = 0; s < NSEQ; s++) {
            if (done[s] >= len[s])
                continue;
            int32_t c = 1 + (int32_t)urand(MAX_CHUNK);
            if (c > len[s] - done[s])
                c = len[s] - done[s];
            sliding_fit(be, ss, &w, s, done[s], done[s] + c, window);
            for (int32_t k = 0; k < c; k++) {
                tk[n] = toks[s][done[s] + k];
                pos[n] = done[s] + k;
                seq[n] = ns;
                n++;
            }
            seq_of[ns++] = s;
            done[s] += c;
        }
        for (int32_t i = 0; i < n; i++)
            out[i] = i;
        /* Tables of the step's sequences, in step order. */
        int32_t mt[NSEQ * MAXB], wt[NSEQ * MAXB];
        for (int32_t q = 0; q < ns; q++) {
            memcpy(mt + q * MAXB, main_table + seq_of[q] * MAXB, MAXB * sizeof(int32_t));
            memcpy(wt + q * MAXB, w.table + seq_of[q] * MAXB, MAXB * sizeof(int32_t));
        }
        dp_batch b = {.n_tokens = n, .tokens = tk, .pos = pos, .seq = seq, .slot = pos,
                      .n_seqs = ns, .seq_store = store0, .block_tables = mt, .max_blocks = MAXB,
                      .n_out = n, .out_tokens = out};
        CHECK_EQ_INT(llama_forward(m, &b, st_whole, la), 0);
        b.layer_map = map;
        b.w_store = 3;
        b.w_block_tables = wt;
        b.w_max_blocks = MAXB;
        CHECK_EQ_INT(llama_forward(m, &b, st_split, lb), 0);
        CHECK_MSG(memcmp(la, lb, (size_t)n * (size_t)hp->vocab * sizeof(float)) == 0,
                  "%s: step %d: the split stores' logits differ from the whole cache's",
                  dp_kv_type_name(type), steps);
        steps++;
        if (W_BLOCKS - w.n_free > held_max)
            held_max = W_BLOCKS - w.n_free;
    }
    /* The windows moved on: blocks went back and were taken again. */
    CHECK(w.lo[0] > 20 && w.lo[1] > 10);
    printf("swa %s: %d steps bit-identical; sliding blocks given back %d and %d, %d held at "
           "most (%d tokens of %d)\n", dp_kv_type_name(type), steps, w.lo[0], w.lo[1], held_max,
           held_max * BT, len[0] + len[1]);

    /* Refusals: a hole inside a window, a map not the model's, exempt
     * layers beside the map. */
    {
        int32_t t1 = toks[0][0], p1 = len[0], s1 = 0, o1 = 0;
        sliding_fit(be, ss, &w, 0, p1, p1 + 1, window);
        int32_t wt[MAXB];
        memcpy(wt, w.table, sizeof wt);
        dp_batch b = {.n_tokens = 1, .tokens = &t1, .pos = &p1, .seq = &s1, .slot = &p1,
                      .n_seqs = 1, .seq_store = store0, .block_tables = main_table,
                      .max_blocks = MAXB, .n_out = 1, .out_tokens = &o1, .layer_map = map,
                      .w_store = 3, .w_block_tables = wt, .w_max_blocks = MAXB};
        CHECK_EQ_INT(llama_forward(m, &b, st_split, lb), 0);
        wt[(p1 + 1 - window) / BT] = -1;
        CHECK_EQ_INT(llama_forward(m, &b, st_split, lb), DP_EINVAL);
        memcpy(wt, w.table, sizeof wt);
        int32_t other[7];
        memcpy(other, map, sizeof other);
        b.layer_map = other;
        CHECK_EQ_INT(llama_forward(m, &b, st_split, lb), DP_EINVAL);
        b.layer_map = map;
        b.n_exempt = 1;
        b.x_slot = &p1;
        b.x_seq_store = store0;
        b.x_block_tables = main_table;
        b.x_max_blocks = MAXB;
        CHECK_EQ_INT(llama_forward(m, &b, st_split, lb), DP_EINVAL);
        /* Without the map, the one-layer store cannot serve the model. */
        b.n_exempt = 0;
        b.layer_map = NULL;
        CHECK_EQ_INT(llama_forward(m, &b, st_split, lb), DP_EINVAL);
    }

    for (int32_t s = 0; s < NSEQ; s++)
        free(toks[s]);
    free(la);
    free(lb);
    free(w.nan_block);
    be->ops->kv_destroy(be, sw);
    be->ops->kv_destroy(be, sm);
    be->ops->kv_destroy(be, ss);
    llama_destroy(m);
    backend_destroy(be);
}

int main(void)
{
    dp_synth_shape sh;
    CHECK(synth_shape_preset("tiny-gemma3", &sh) == 0);
    gguf_writer gw;
    char err[DP_ERRLEN];
    CHECK(gguf_writer_init(&gw) == 0);
    CHECK_MSG(synth_llama_build(&gw, &sh, 5, DP_TYPE_F32, err, sizeof err) == 0, "%s", err);
    void *buf;
    size_t size;
    CHECK(gguf_writer_finish_mem(&gw, &buf, &size) == 0);
    dp_gguf g;
    CHECK_MSG(gguf_open_mem(&g, buf, size, err, sizeof err) == 0, "%s", err);
    run_type(&g, DP_KV_F32);
    run_type(&g, DP_KV_F16);
    run_type(&g, DP_KV_Q8_0);
    gguf_close(&g);
    free(buf);
    gguf_writer_destroy(&gw);
    T_DONE("swa");
}
