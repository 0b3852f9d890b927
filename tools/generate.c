/* generate.c: the static-batch driver: block tables from the pool, prompt
 * chunks packed into steps, lockstep decoding, and blocks returned at the end
 * (the continuous scheduler replaces this for serving). */
#include "generate.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/batch.h"

int gen_init(dp_gen *g, dp_llama *m, int32_t block_tokens, int32_t n_blocks, char *err,
             size_t errsz)
{
    return gen_init_kv(g, m, block_tokens, n_blocks, DP_KV_F32, err, errsz);
}

int gen_init_kv(dp_gen *g, dp_llama *m, int32_t block_tokens, int32_t n_blocks, int32_t kv_type,
                char *err, size_t errsz)
{
    memset(g, 0, sizeof *g);
    g->model = m;
    dp_backend *be = llama_backend(m);
    dp_kv_layout l = llama_kv_layout(m, block_tokens, n_blocks);
    l.type = kv_type;
    int rc = kv_pool_init(&g->pool, n_blocks, block_tokens);
    if (rc)
        return dp_err(err, errsz, rc, "kv pool: bad geometry (%d blocks of %d tokens)", n_blocks,
                      block_tokens);
    if ((rc = be->ops->kv_create(be, &l, &g->store))) {
        kv_pool_destroy(&g->pool);
        return dp_err(err, errsz, rc, "kv store: cannot create %d blocks of %d tokens in %s",
                      n_blocks, block_tokens, dp_kv_type_name(kv_type));
    }
    const dp_hparams *hp = llama_hparams(m);
    const size_t O = (size_t)llama_max_out(m);
    g->logits = malloc(O * (size_t)hp->vocab * sizeof(float));
    if (be->ops->logits_topk) {
        /* Decode steps end in the device's candidates (sampler.h: the same
         * tokens as from the rows). */
        g->c_k = hp->vocab < SAMPLER_CANDIDATES ? hp->vocab : SAMPLER_CANDIDATES;
        g->c_ids = malloc(O * (size_t)g->c_k * sizeof *g->c_ids);
        g->c_vals = malloc(O * (size_t)g->c_k * sizeof *g->c_vals);
        g->c_max = malloc(O * sizeof *g->c_max);
        g->c_sum = malloc(O * sizeof *g->c_sum);
        g->c_temp = malloc(O * sizeof *g->c_temp);
        g->c_pd = malloc(O * sizeof *g->c_pd);
        if (!g->c_ids || !g->c_vals || !g->c_max || !g->c_sum || !g->c_temp || !g->c_pd) {
            gen_destroy(g);
            return dp_err(err, errsz, DP_ENOMEM, "out of memory");
        }
    }
    if (!g->logits || sampler_init(&g->sampler, hp->vocab)) {
        gen_destroy(g);
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    }
    return 0;
}

void gen_destroy(dp_gen *g)
{
    if (g->store)
        llama_backend(g->model)->ops->kv_destroy(llama_backend(g->model), g->store);
    kv_pool_destroy(&g->pool);
    sampler_destroy(&g->sampler);
    free(g->logits);
    free(g->c_ids);
    free(g->c_vals);
    free(g->c_max);
    free(g->c_sum);
    free(g->c_temp);
    free(g->c_pd);
    memset(g, 0, sizeof *g);
}

typedef struct seq_state {
    dp_block_table table;
    dp_rng rng;
    int32_t n_done;     /* prompt tokens already run */
    int32_t last;       /* last sampled token */
    bool finished;
} seq_state;

static int take_token(dp_gen_seq *sq, seq_state *st, int32_t si, int32_t t,
                      const dp_tokenizer *tok, dp_gen_token_cb cb, void *ud)
{
    sq->out[sq->n_out++] = t;
    st->last = t;
    if (cb)
        cb(ud, si, t);
    if (sq->n_out >= sq->max_new || (sq->stop_at_eog && tok && tokenizer_is_eog(tok, t)))
        st->finished = true;
    return 0;
}

int gen_run(dp_gen *g, dp_gen_seq *seqs, int32_t n, const dp_tokenizer *tok, dp_gen_token_cb cb,
            void *ud, char *err, size_t errsz)
{
    dp_llama *m = g->model;
    const dp_hparams *hp = llama_hparams(m);
    const int32_t T = llama_max_tokens(m), O = llama_max_out(m);
    int rc = 0;
    if (n <= 0)
        return 0;
    seq_state *st = calloc((size_t)n, sizeof *st);
    dp_batch_buf bb = {0};
    int32_t *out_seq = NULL; /* the sequence of each output row */
    int32_t max_blocks = 1;
    for (int32_t i = 0; i < n; i++) {
        if (seqs[i].n_prompt < 1 || seqs[i].max_new < 0) {
            rc = dp_err(err, errsz, DP_EINVAL, "sequence %d: empty prompt", i);
            goto out;
        }
        int32_t nb = kv_pool_blocks_for(&g->pool, (int64_t)seqs[i].n_prompt + seqs[i].max_new);
        if (nb > max_blocks)
            max_blocks = nb;
    }
    bool bb_ok = batch_buf_init(&bb, T, T, n, 0) == 0 &&
                 batch_buf_tables(&bb, (size_t)n * (size_t)max_blocks, 0) == 0;
    out_seq = malloc((size_t)T * sizeof(int32_t));
    if (!st || !bb_ok || !out_seq) {
        rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
        goto out;
    }
    for (int32_t i = 0; i < n; i++) {
        kv_table_init(&st[i].table);
        rng_seed(&st[i].rng, seqs[i].sampling.seed);
        seqs[i].n_out = 0;
        if (seqs[i].max_new == 0)
            st[i].finished = true;
        if ((rc = kv_table_reserve(&st[i].table, &g->pool,
                                   (int64_t)seqs[i].n_prompt + seqs[i].max_new))) {
            rc = dp_err(err, errsz, rc, "kv pool full: sequence %d needs %d blocks, %d free", i,
                        kv_pool_blocks_for(&g->pool, (int64_t)seqs[i].n_prompt + seqs[i].max_new),
                        kv_pool_n_free(&g->pool));
            goto out;
        }
        memset(bb.tables + (size_t)i * max_blocks, 0, (size_t)max_blocks * sizeof(int32_t));
        memcpy(bb.tables + (size_t)i * max_blocks, st[i].table.blocks,
               (size_t)st[i].table.n_blocks * sizeof(int32_t));
    }
    dp_kv_store *stores[DP_KV_MAX_STORES] = {g->store, NULL};
    dp_batch b = {.tokens = bb.tokens, .pos = bb.pos, .seq = bb.seq, .slot = bb.slot,
                  .n_seqs = n, .seq_store = bb.store, .block_tables = bb.tables,
                  .max_blocks = max_blocks, .out_tokens = bb.out};

    /* Prefill: pack prompt chunks until the step's budget is used. */
    int32_t cur = 0;
    while (cur < n) {
        double t0 = dp_now();
        int32_t nt = 0, no = 0;
        for (int32_t i = cur; i < n && nt < T && no < O; i++) {
            dp_gen_seq *sq = &seqs[i];
            while (st[i].n_done < sq->n_prompt && nt < T) {
                int32_t p = st[i].n_done++;
                bb.tokens[nt] = sq->prompt[p];
                bb.pos[nt] = p;
                bb.slot[nt] = p;
                bb.seq[nt] = i;
                nt++;
            }
            if (st[i].n_done == sq->n_prompt) {
                out_seq[no] = i;
                bb.out[no++] = nt - 1;
            }
        }
        b.n_tokens = nt;
        b.n_out = no;
        if ((rc = llama_forward(m, &b, stores, g->logits))) {
            rc = dp_err(err, errsz, rc, "forward pass failed during prefill");
            goto out;
        }
        for (int32_t o = 0; o < no; o++) {
            int32_t i = out_seq[o];
            const float *row = g->logits + (size_t)o * hp->vocab;
            if (seqs[i].prompt_logits)
                memcpy(seqs[i].prompt_logits, row, (size_t)hp->vocab * sizeof(float));
            if (!st[i].finished)
                take_token(&seqs[i], &st[i], i,
                           sampler_sample(&g->sampler, &seqs[i].sampling, &st[i].rng, row), tok,
                           cb, ud);
        }
        while (cur < n && st[cur].n_done == seqs[cur].n_prompt)
            cur++;
        g->t_prefill += dp_now() - t0;
        g->n_prefill_tokens += nt;
    }

    /* Decode: every live sequence advances one token per step. */
    for (;;) {
        double t0 = dp_now();
        int32_t nt = 0;
        for (int32_t i = 0; i < n && nt < T && nt < O; i++) {
            if (st[i].finished)
                continue;
            int32_t p = seqs[i].n_prompt + seqs[i].n_out - 1;
            bb.tokens[nt] = st[i].last;
            bb.pos[nt] = p;
            bb.slot[nt] = p;
            bb.seq[nt] = i;
            out_seq[nt] = i;
            bb.out[nt] = nt;
            nt++;
        }
        if (nt == 0)
            break;
        b.n_tokens = nt;
        b.n_out = nt;
        for (int32_t o = 0; o < nt && g->c_ids; o++)
            g->c_temp[o] = seqs[out_seq[o]].sampling.temperature;
        rc = g->c_ids ? llama_forward_topk(m, &b, stores, g->c_k, g->c_temp, NULL, 0, NULL,
                                           g->c_ids, g->c_vals, g->c_max, g->c_sum)
                      : llama_forward(m, &b, stores, g->logits);
        if (rc) {
            rc = dp_err(err, errsz, rc, "forward pass failed during decode");
            goto out;
        }
        bool have_rows = !g->c_ids;
        for (int32_t o = 0; o < nt; o++) {
            int32_t i = out_seq[o], t;
            const float *row = g->logits + (size_t)o * hp->vocab;
            if (!g->c_ids) {
                t = sampler_sample(&g->sampler, &seqs[i].sampling, &st[i].rng, row);
            } else {
                const size_t at = (size_t)o * (size_t)g->c_k;
                t = sampler_sample_candidates(&seqs[i].sampling, &st[i].rng, g->c_ids + at,
                                              g->c_vals + at, g->c_k, hp->vocab, g->c_max[o],
                                              g->c_sum[o], &g->c_pd[o]);
                if (t == DP_SAMPLE_UNDECIDED) {
                    /* The step's rows, downloaded once, for every undecided row. */
                    if (!have_rows && (rc = llama_download_logits(m, nt, g->logits))) {
                        rc = dp_err(err, errsz, rc, "logits download failed during decode");
                        goto out;
                    }
                    have_rows = true;
                    t = sampler_sample_rest(&g->sampler, &seqs[i].sampling, &g->c_pd[o], row);
                }
            }
            take_token(&seqs[i], &st[i], i, t, tok, cb, ud);
        }
        g->t_decode += dp_now() - t0;
        g->n_decode_tokens += nt;
    }
out:
    if (st)
        for (int32_t i = 0; i < n; i++)
            kv_table_destroy(&st[i].table, &g->pool);
    free(st);
    batch_buf_destroy(&bb);
    free(out_seq);
    return rc;
}
