/* eval_forward.c: what every table of dp-eval runs on: prefilling and
 * teacher-forcing one sequence through the forward pass (its batches built
 * in the context's dp_batch_buf), query capture for the scorers, the
 * full-cache reference rows and the accumulated metrics (NLL, KL, top-1),
 * and the report's text buffer. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/dp_eval.h"

/* ---- forward helpers ---------------------------------------------------- */

/* Prefills tokens [0, n) of one sequence into stores[si] (slot = position),
 * in steps of at most CHUNK tokens split evenly so that the last step holds
 * at least n_cap tokens, whose queries are captured (copied to e->q_host).
 * last_logits, if set, receives the logits of the last token. */
int ev_prefill(ev *e, dp_kv_store *const *stores, uint8_t si, const int32_t *table,
               int32_t max_blocks, const int32_t *tokens, int32_t n, int32_t n_cap,
               float *last_logits)
{
    int32_t steps = (n + CHUNK - 1) / CHUNK, done = 0;
    for (int32_t s = 0; s < steps; s++) {
        int32_t len = (n - done) / (steps - s);
        for (int32_t i = 0; i < len; i++) {
            e->bb.tokens[i] = tokens[done + i];
            e->bb.pos[i] = e->bb.slot[i] = done + i;
            e->bb.seq[i] = 0;
        }
        bool last = s == steps - 1;
        int32_t cap = last ? (n_cap < len ? n_cap : len) : 0;
        for (int32_t i = 0; i < cap; i++)
            e->bb.capture[i] = len - cap + i;
        e->bb.out[0] = len - 1;
        dp_batch b = {.n_tokens = len, .tokens = e->bb.tokens, .pos = e->bb.pos, .seq = e->bb.seq,
                      .slot = e->bb.slot, .n_seqs = 1, .seq_store = &si, .block_tables = table,
                      .max_blocks = max_blocks, .n_out = last && last_logits ? 1 : 0,
                      .out_tokens = e->bb.out, .n_capture = cap, .capture_tokens = e->bb.capture};
        int rc = llama_forward(e->m, &b, stores, e->logits);
        if (rc)
            return rc;
        if (cap > 0 && (rc = e->be->ops->download(e->be, e->q_host, llama_captured_queries(e->m),
                                                  (size_t)e->hp->n_layers * (size_t)cap *
                                                      (size_t)e->qd * sizeof(float))))
            return rc;
        if (last && last_logits)
            memcpy(last_logits, e->logits, (size_t)e->vocab * sizeof(float));
        done += len;
    }
    return 0;
}

/* The greedy token of one row of logits. */
int32_t ev_argmax(const float *row, int32_t n)
{
    int32_t am = 0;
    for (int32_t v = 1; v < n; v++)
        if (row[v] > row[am])
            am = v;
    return am;
}

/* An exempt layers' store beside a decode store of layout lb (NULL
 * without exempt layers): the same blocks, of the first layers only. */
int ev_exempt_store(ev *e, const dp_kv_layout *lb, dp_kv_store **out)
{
    *out = NULL;
    if (e->o->exempt <= 0)
        return 0;
    dp_kv_layout xl = *lb;
    xl.n_layers = e->o->exempt;
    return e->be->ops->kv_create(e->be, &xl, out);
}

/* Points the batch's exempt layers (backend.h n_exempt) at store index
 * *xsi: each token at its position's slot in the sequence's table. */
void ev_with_exempt(ev *e, dp_batch *b, const uint8_t *xsi, const int32_t *tables,
                    int32_t max_blocks)
{
    b->n_exempt = e->o->exempt;
    b->x_slot = b->pos;
    b->x_seq_store = xsi;
    b->x_block_tables = tables;
    b->x_max_blocks = max_blocks;
}

/* Teacher-forces n tokens after a cache of n_keep slots holding positions
 * [0, pos0): token i goes to slot n_keep + i at position pos0 + i. The
 * logits of all n tokens land in e->logits. */
int ev_teacher_force_cap(ev *e, dp_kv_store *const *stores, uint8_t si, const int32_t *table,
                         int32_t max_blocks, int32_t n_keep, int32_t pos0, const int32_t *tokens,
                         int32_t n, int32_t n_cap)
{
    for (int32_t i = 0; i < n; i++) {
        e->bb.tokens[i] = tokens[i];
        e->bb.pos[i] = pos0 + i;
        e->bb.slot[i] = n_keep + i;
        e->bb.seq[i] = 0;
        e->bb.out[i] = i;
    }
    for (int32_t i = 0; i < n_cap; i++)
        e->bb.capture[i] = n - n_cap + i;
    dp_batch b = {.n_tokens = n, .tokens = e->bb.tokens, .pos = e->bb.pos, .seq = e->bb.seq,
                  .slot = e->bb.slot, .n_seqs = 1, .seq_store = &si, .block_tables = table,
                  .max_blocks = max_blocks, .n_out = n, .out_tokens = e->bb.out,
                  .n_capture = n_cap, .capture_tokens = e->bb.capture,
                  .seq_sealed = e->g_sealed, .seq_roff = e->g_roff};
    /* Exempt layers (stores[2], the table's blocks there): position p at
     * slot p, as the daemon's exempt tables hold them. */
    static const uint8_t xsi = 2;
    if (si == 1 && stores[2])
        ev_with_exempt(e, &b, &xsi, table, max_blocks);
    return llama_forward(e->m, &b, stores, e->logits);
}

/* ... without capturing any query. */
int ev_teacher_force(ev *e, dp_kv_store *const *stores, uint8_t si, const int32_t *table,
                     int32_t max_blocks, int32_t n_keep, int32_t pos0, const int32_t *tokens,
                     int32_t n)
{
    return ev_teacher_force_cap(e, stores, si, table, max_blocks, n_keep, pos0, tokens, n, 0);
}

/* Uploads the captured queries of n_cap tokens for the attention scorer. */
int ev_queries_to_backend(ev *e, int32_t n_cap)
{
    return e->be->ops->upload(e->be, e->q_dev, e->q_host,
                              (size_t)e->hp->n_layers * (size_t)n_cap * (size_t)e->qd * sizeof(float));
}

/* ---- metrics ------------------------------------------------------------- */

/* log-softmax of one row into out; returns the argmax. */
int32_t ev_log_softmax(const float *x, int32_t n, double *out)
{
    int32_t am = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[am])
            am = i;
    double mx = x[am], sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    for (int32_t i = 0; i < n; i++)
        out[i] = (double)x[i] - lse;
    return am;
}

/* Rows for n predictions (all NULL when memory ran out). */
ref_rows ref_rows_new(int32_t n, int32_t vocab)
{
    ref_rows r = {malloc((size_t)n * vocab * sizeof(double)), malloc((size_t)n * vocab * sizeof(double)),
                  malloc((size_t)n * sizeof(int32_t)), n};
    if (!r.lp || !r.p || !r.am) {
        free(r.lp);
        free(r.p);
        free(r.am);
        r = (ref_rows){NULL, NULL, NULL, n};
    }
    return r;
}

void ref_rows_free(ref_rows *r)
{
    free(r->lp);
    free(r->p);
    free(r->am);
}

int ref_window_init(ref_window *w, int32_t n, int32_t vocab)
{
    w->logits = malloc((size_t)n * vocab * sizeof(float));
    w->scratch = malloc((size_t)vocab * sizeof(double));
    w->ref = ref_rows_new(n, vocab);
    if (w->logits && w->scratch && w->ref.lp)
        return 0;
    ref_window_free(w);
    return DP_ENOMEM;
}

void ref_window_free(ref_window *w)
{
    free(w->logits);
    free(w->scratch);
    ref_rows_free(&w->ref);
    w->logits = NULL;
    w->scratch = NULL;
    w->ref = (ref_rows){NULL, NULL, NULL, 0};
}

void acc_add(acc *a, const ref_rows *ref, const float *logits, int32_t vocab,
             const int32_t *targets, double *scratch)
{
    for (int32_t i = 0; i < ref->n; i++) {
        int32_t am = ev_log_softmax(logits + (size_t)i * vocab, vocab, scratch);
        const double *rp = ref->lp + (size_t)i * vocab, *pp = ref->p + (size_t)i * vocab;
        double kl = 0;
        for (int32_t v = 0; v < vocab; v++)
            kl += pp[v] * (rp[v] - scratch[v]);
        a->kl += kl > 0 ? kl : 0;
        a->nll -= scratch[targets[i]];
        a->agree += am == ref->am[i];
        a->n++;
    }
}

void ev_mean_std(const double *x, int n, double *mean, double *sd)
{
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++)
        ss += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
}

/* ---- growable text buffer for the report ---------------------------------- */

void sb_printf(sbuf *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    if (s->n + (size_t)k + 1 > s->cap) {
        size_t cap = (s->cap ? s->cap * 2 : 4096) + (size_t)k;
        char *p = realloc(s->p, cap);
        if (!p)
            return;
        s->p = p;
        s->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(s->p + s->n, s->cap - s->n, fmt, ap);
    va_end(ap);
    s->n += (size_t)k;
}

void sb_flush(sbuf *s)
{
    if (s->n > s->shown)
        fwrite(s->p + s->shown, 1, s->n - s->shown, stdout);
    s->shown = s->n;
    fflush(stdout);
}
