/* dp_eval.c: the quality evaluator of KV compression. It prefills real text,
 * compresses the cache with every scorer x keep ratio, teacher-forces the
 * continuation (perplexity, KL from the full cache, top-1 agreement) and
 * checks greedy agreement on chat prompts; tables go to stdout and, with
 * --markdown, into a marked section of a document (docs/dualpath.md).
 * Compaction goes through kv_migrate, the function the daemon's KV manager
 * migrates with, on a cache of the daemon's default type (f16; --kv-type). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "kvcache/manager.h"
#include "model/chat_template.h"
#include "tools/dp_eval.h"
#include "tools/kv_sim.h"


static int die(const char *what, int rc, const char *err)
{
    fprintf(stderr, "dp-eval: %s: %s (%s)\n", what, err ? err : "", dp_strerror(rc));
    return 1;
}

/* ---- forward helpers ---------------------------------------------------- */

/* Prefills tokens [0, n) of one sequence into stores[si] (slot = position),
 * in steps of at most CHUNK tokens split evenly so that the last step holds
 * at least n_cap tokens, whose queries are captured (copied to e->q_host).
 * last_logits, if set, receives the logits of the last token. */
static int prefill(ev *e, dp_kv_store *const *stores, uint8_t si, const int32_t *table,
                   int32_t max_blocks, const int32_t *tokens, int32_t n, int32_t n_cap,
                   float *last_logits)
{
    int32_t steps = (n + CHUNK - 1) / CHUNK, done = 0;
    for (int32_t s = 0; s < steps; s++) {
        int32_t len = (n - done) / (steps - s);
        for (int32_t i = 0; i < len; i++) {
            e->bt_tokens[i] = tokens[done + i];
            e->bt_pos[i] = e->bt_slot[i] = done + i;
            e->bt_seq[i] = 0;
        }
        bool last = s == steps - 1;
        int32_t cap = last ? (n_cap < len ? n_cap : len) : 0;
        for (int32_t i = 0; i < cap; i++)
            e->bt_cap[i] = len - cap + i;
        e->bt_out[0] = len - 1;
        dp_batch b = {.n_tokens = len, .tokens = e->bt_tokens, .pos = e->bt_pos, .seq = e->bt_seq,
                      .slot = e->bt_slot, .n_seqs = 1, .seq_store = &si, .block_tables = table,
                      .max_blocks = max_blocks, .n_out = last && last_logits ? 1 : 0,
                      .out_tokens = e->bt_out, .n_capture = cap, .capture_tokens = e->bt_cap};
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
static int32_t argmax(const float *row, int32_t n)
{
    int32_t am = 0;
    for (int32_t v = 1; v < n; v++)
        if (row[v] > row[am])
            am = v;
    return am;
}

/* An exempt layers' store beside a decode store of layout lb (NULL
 * without exempt layers): the same blocks, of the first layers only. */
static int exempt_store(ev *e, const dp_kv_layout *lb, dp_kv_store **out)
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
static void with_exempt(ev *e, dp_batch *b, const uint8_t *xsi, const int32_t *tables,
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
static int teacher_force_cap(ev *e, dp_kv_store *const *stores, uint8_t si, const int32_t *table,
                             int32_t max_blocks, int32_t n_keep, int32_t pos0, const int32_t *tokens,
                             int32_t n, int32_t n_cap)
{
    for (int32_t i = 0; i < n; i++) {
        e->bt_tokens[i] = tokens[i];
        e->bt_pos[i] = pos0 + i;
        e->bt_slot[i] = n_keep + i;
        e->bt_seq[i] = 0;
        e->bt_out[i] = i;
    }
    for (int32_t i = 0; i < n_cap; i++)
        e->bt_cap[i] = n - n_cap + i;
    dp_batch b = {.n_tokens = n, .tokens = e->bt_tokens, .pos = e->bt_pos, .seq = e->bt_seq,
                  .slot = e->bt_slot, .n_seqs = 1, .seq_store = &si, .block_tables = table,
                  .max_blocks = max_blocks, .n_out = n, .out_tokens = e->bt_out,
                  .n_capture = n_cap, .capture_tokens = e->bt_cap,
                  .seq_sealed = e->g_sealed, .seq_roff = e->g_roff};
    /* Exempt layers (stores[2], the table's blocks there): position p at
     * slot p, as the daemon's exempt tables hold them. */
    static const uint8_t xsi = 2;
    if (si == 1 && stores[2])
        with_exempt(e, &b, &xsi, table, max_blocks);
    return llama_forward(e->m, &b, stores, e->logits);
}

/* ... without capturing any query. */
static int teacher_force(ev *e, dp_kv_store *const *stores, uint8_t si, const int32_t *table,
                         int32_t max_blocks, int32_t n_keep, int32_t pos0, const int32_t *tokens,
                         int32_t n)
{
    return teacher_force_cap(e, stores, si, table, max_blocks, n_keep, pos0, tokens, n, 0);
}

/* Uploads the captured queries of n_cap tokens for the attention scorer. */
static int queries_to_backend(ev *e, int32_t n_cap)
{
    return e->be->ops->upload(e->be, e->q_dev, e->q_host,
                              (size_t)e->hp->n_layers * (size_t)n_cap * (size_t)e->qd * sizeof(float));
}

/* ---- metrics ------------------------------------------------------------- */

/* log-softmax of one row into out; returns the argmax. */
static int32_t log_softmax(const float *x, int32_t n, double *out)
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

/* Reference log-probabilities and argmaxes of the full cache, per row. */
typedef struct ref_rows {
    double *lp;      /* [n][vocab] */
    double *p;       /* exp(lp) */
    int32_t *am;
    int32_t n;
} ref_rows;

/* Rows for n predictions (all NULL when memory ran out). */
static ref_rows ref_rows_new(int32_t n, int32_t vocab)
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

static void ref_rows_free(ref_rows *r)
{
    free(r->lp);
    free(r->p);
    free(r->am);
}

static void acc_add(acc *a, const ref_rows *ref, const float *logits, int32_t vocab,
                    const int32_t *targets, double *scratch)
{
    for (int32_t i = 0; i < ref->n; i++) {
        int32_t am = log_softmax(logits + (size_t)i * vocab, vocab, scratch);
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

static double acc_ppl(const acc *a) { return exp(a->nll / (double)a->n); }
static double acc_kl(const acc *a) { return a->kl / (double)a->n; }
static double acc_top1(const acc *a) { return (double)a->agree / (double)a->n; }

static void mean_std(const double *x, int n, double *mean, double *sd)
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

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...)
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

/* ---- teacher-forced evaluation at one prefill length ---------------------- */

/* Window w of o->windows over the text: prefills its P context tokens into
 * store A (stores[0], table) capturing the last n_cap queries (uploaded for
 * SnapKV), teacher-forces its C continuation tokens in A itself (slots >= P
 * are never read by a compaction, which copies slots < P only) and fills ref
 * with the whole cache's predictions, added to *full. *cont and *targets:
 * the continuation and the tokens it predicts. */
static int window_reference(ev *e, dp_kv_store *const *stores, const int32_t *table, int32_t nb,
                            const int32_t *text, int32_t n_text, int32_t P, int w, int32_t n_cap,
                            float *ref_logits, ref_rows *ref, double *scratch, acc *full,
                            const int32_t **cont, const int32_t **targets)
{
    const opts *o = e->o;
    const int32_t C = o->cont;
    const int32_t span = n_text - (P + C + 1) - o->offset;
    const int32_t off = o->offset + (o->windows > 1 && span > 0
                                         ? (int32_t)((int64_t)span * w / (o->windows - 1)) : 0);
    *cont = text + off + P;
    *targets = text + off + P + 1;
    int rc;
    if ((rc = prefill(e, stores, 0, table, nb, text + off, P, n_cap, NULL)) ||
        (rc = queries_to_backend(e, n_cap)) ||
        (rc = teacher_force(e, stores, 0, table, nb, P, P, *cont, C)))
        return rc;
    memcpy(ref_logits, e->logits, (size_t)C * e->vocab * sizeof(float));
    for (int32_t i = 0; i < C; i++)
        ref->am[i] = log_softmax(ref_logits + (size_t)i * e->vocab, e->vocab, ref->lp + (size_t)i * e->vocab);
    for (size_t i = 0; i < (size_t)C * e->vocab; i++)
        ref->p[i] = exp(ref->lp[i]);
    acc_add(full, ref, ref_logits, e->vocab, *targets, scratch);
    return 0;
}

typedef struct tf_result {
    /* [scorer][ratio][seed] */
    acc a[N_SCORERS][MAX_RATIOS][MAX_SEEDS];
    acc full;
    int32_t n_keep[MAX_RATIOS];
    int bit_identical;  /* keep-all compaction == uncompressed cache */
    double seconds;
} tf_result;

static int n_seeds_of(const opts *o, int sc) { return sc == DP_SCORER_RANDOM ? o->seeds : 1; }

static int eval_prefill(ev *e, const int32_t *text, int32_t n_text, int32_t P, tf_result *r)
{
    const opts *o = e->o;
    const int32_t C = o->cont;
    if ((int64_t)P + C + 1 > n_text) {
        fprintf(stderr, "dp-eval: the text has %d tokens, fewer than P + %d + 1 = %d\n", n_text, C,
                P + C + 1);
        return DP_EINVAL;
    }
    double t0 = dp_now();
    memset(r, 0, sizeof *r);
    r->bit_identical = 1;
    /* Store A: the prefill (P slots) plus room for the uncompressed
     * continuation; store B: the compacted cache plus the continuation. */
    int32_t nb = (P + C + BT - 1) / BT;
    dp_kv_layout la = llama_kv_layout(e->m, BT, nb), lb;
    la.type = o->kv_type;
    lb = la;
    lb.type = o->dkv_type;
    dp_kv_store *stores[DP_KV_MAX_STORES] = {NULL, NULL};
    int32_t *table = malloc((size_t)nb * sizeof *table);
    float *ref_logits = malloc((size_t)C * e->vocab * sizeof(float));
    double *scratch = malloc((size_t)e->vocab * sizeof(double));
    ref_rows ref = ref_rows_new(C, e->vocab);
    int rc = DP_ENOMEM;
    if (!table || !ref_logits || !scratch || !ref.lp)
        goto out;
    if ((rc = e->be->ops->kv_create(e->be, &la, &stores[0])) ||
        (rc = e->be->ops->kv_create(e->be, &lb, &stores[1])))
        goto out;
    for (int32_t i = 0; i < nb; i++)
        table[i] = i;
    for (int32_t i = 0; i < o->n_ratios; i++) {
        dp_compress_opts co = {DP_SCORER_KNORM, o->ratios[i], o->sinks, o->window, 0, 0};
        r->n_keep[i] = compress_n_keep(&co, P);
    }
    int32_t n_cap = o->window < DP_MAX_CAPTURE ? o->window : DP_MAX_CAPTURE;
    if (n_cap > P)
        n_cap = P;

    for (int w = 0; w < o->windows; w++) {
        const int32_t *cont, *targets;
        if ((rc = window_reference(e, stores, table, nb, text, n_text, P, w, n_cap, ref_logits, &ref,
                                   scratch, &r->full, &cont, &targets)))
            goto out2;

        for (int ri = 0; ri < o->n_ratios; ri++) {
            int32_t n_keep = r->n_keep[ri];
            for (int sc = 0; sc < N_SCORERS; sc++) {
                for (int sd = 0; sd < n_seeds_of(o, sc); sd++) {
                    /* Keep-all is the same set for every scorer: run once. */
                    if (n_keep == P && (sc > 0 || sd > 0))
                        continue;
                    dp_compress_opts co = {(dp_scorer)sc, o->ratios[ri], o->sinks, o->window,
                                           (uint64_t)sd + 1, 0};
                    dp_kv_move mv = {.co = &co, .src = table, .n_src_blocks = (P + BT - 1) / BT,
                                     .n_slots = P, .dst = table, .n_dst_blocks = nb,
                                     .n_keep = n_keep, .q = e->q_dev,
                                     .q_stride = (int64_t)n_cap * e->qd, .n_q = n_cap};
                    if ((rc = kv_migrate(&e->mig, stores[0], stores[1], &mv, 1)) ||
                        (rc = teacher_force(e, stores, 1, table, nb, n_keep, P, cont, C)))
                        goto out2;
                    if (n_keep == P &&
                        memcmp(e->logits, ref_logits, (size_t)C * e->vocab * sizeof(float)) != 0)
                        r->bit_identical = 0;
                    acc_add(&r->a[sc][ri][sd], &ref, e->logits, e->vocab, targets, scratch);
                }
            }
            fprintf(stderr, "dp-eval: P=%d window %d/%d (offset %d): keep %.2f done, %.0f s\n", P,
                    w + 1, o->windows, (int)(cont - text) - P, o->ratios[ri], dp_now() - t0);
        }
    }
    /* Fill the keep-all cells of the other scorers with the one run. */
    for (int ri = 0; ri < o->n_ratios; ri++)
        if (r->n_keep[ri] == P)
            for (int sc = 0; sc < N_SCORERS; sc++)
                for (int sd = 0; sd < n_seeds_of(o, sc); sd++)
                    r->a[sc][ri][sd] = r->a[0][ri][0];
    rc = 0;
    r->seconds = dp_now() - t0;
out2:
out:
    if (stores[0])
        e->be->ops->kv_destroy(e->be, stores[0]);
    if (stores[1])
        e->be->ops->kv_destroy(e->be, stores[1]);
    free(table);
    free(ref_logits);
    free(scratch);
    ref_rows_free(&ref);
    return rc;
}

/* ---- a decode budget: recompression during a long continuation ------------ */

/* The engine under decode_budget = B: the prompt migrates to at most
 * compress_budget_keep(B) slots; each decode step appends a slot; when the
 * cache reaches B slots it is recompressed to compress_budget_keep(B) by
 * kv_migrate with the scorer, SnapKV scoring with the last `window` decode
 * queries summed by compressor_accumulate (the engine's capture: the queries
 * of the tokens at slots >= B - window). Here the tokens between two
 * recompressions are teacher-forced in one forward (causal, so each gets the
 * logits it would get one step at a time), their last queries captured. */
#define BUDGET_SCORERS 3
static const dp_scorer budget_scorers[BUDGET_SCORERS] = {DP_SCORER_SNAPKV, DP_SCORER_KNORM,
                                                        DP_SCORER_RECENT};

typedef struct budget_result {
    acc full;
    acc off;                            /* the migration alone (no budget) */
    acc a[8][BUDGET_SCORERS];           /* [budget][scorer] */
    int64_t recompressions[8][BUDGET_SCORERS];
    double slots[8];                    /* mean slots held per prediction */
    double slots_full;                  /* ... by the whole cache */
    double slots_off;                   /* ... by the migration alone */
    int32_t keep0[8];                   /* slots kept at the migration */
    double seconds;
} budget_result;

/* One continuation of C tokens over a cache migrated from store A (P slots,
 * table ta) into store B, recompressed at budget B_ (0: never). */
static int budget_run(ev *e, dp_kv_store *const *stores, const int32_t *ta, int32_t nba,
                      int32_t *tb[2], int32_t nbb, int32_t P, const dp_compress_opts *co,
                      int32_t n_cap, int32_t budget, const int32_t *cont, const int32_t *targets,
                      const ref_rows *ref, double *scratch, acc *out, int64_t *recs, double *slots)
{
    const opts *o = e->o;
    const int32_t C = o->cont;
    const int32_t bkeep = budget > 0 ? compress_budget_keep(budget, o->sinks + o->window) : P;
    int32_t n_keep = compress_n_keep(co, P);
    if (n_keep > bkeep)
        n_keep = bkeep;
    dp_kv_move mv = {.co = co, .src = ta, .n_src_blocks = nba, .n_slots = P, .dst = tb[0],
                     .n_dst_blocks = nbb, .n_keep = n_keep, .q = e->q_dev,
                     .q_stride = (int64_t)n_cap * e->qd, .n_q = n_cap};
    int rc = kv_migrate(&e->mig, stores[0], stores[1], &mv, 1);
    if (rc)
        return rc;
    dp_attn_acc aq;
    attn_acc_init(&aq);
    int cur = 0;
    int32_t n_slots = n_keep;
    for (int32_t done = 0; rc == 0 && done < C;) {
        int32_t len = C - done;
        if (budget > 0 && n_slots + len > budget)
            len = budget - n_slots;
        const bool full = budget > 0 && n_slots + len == budget && done + len < C;
        int32_t cap = 0;
        if (full && co->scorer == DP_SCORER_SNAPKV)
            cap = o->window < len ? o->window : len;
        if (cap > DP_MAX_CAPTURE)
            cap = DP_MAX_CAPTURE;
        if ((rc = teacher_force_cap(e, stores, 1, tb[cur], nbb, n_slots, P + done, cont + done, len,
                                    cap)))
            break;
        ref_rows part = {ref->lp + (size_t)done * e->vocab, ref->p + (size_t)done * e->vocab,
                         ref->am + done, len};
        acc_add(out, &part, e->logits, e->vocab, targets + done, scratch);
        for (int32_t i = 0; i < len; i++)
            *slots += n_slots + i + 1;
        n_slots += len;
        done += len;
        if (!full)
            continue;
        const float *q = llama_captured_queries(e->m);
        for (int32_t j = 0; rc == 0 && j < cap; j++)
            rc = compressor_accumulate(&e->mig.comp, &aq, stores[1], tb[cur], q + (size_t)j * e->qd,
                                       (int64_t)cap * e->qd, n_slots - cap + j);
        dp_kv_move rv = {.co = co, .src = tb[cur], .n_src_blocks = nbb, .n_slots = n_slots,
                         .dst = tb[1 - cur], .n_dst_blocks = nbb, .n_keep = bkeep,
                         .attn = aq.n_q > 0 ? &aq : NULL};
        if (rc == 0 && (rc = kv_migrate(&e->mig, stores[1], stores[1], &rv, 1)) == 0) {
            if (co->scorer == DP_SCORER_SNAPKV && rv.scorer != DP_SCORER_SNAPKV)
                rc = DP_EINVAL; /* it would not be SnapKV's table */
            attn_acc_reset(&aq);
            cur = 1 - cur;
            n_slots = bkeep;
            (*recs)++;
        }
    }
    attn_acc_destroy(&aq);
    return rc;
}

static int eval_budget(ev *e, const int32_t *text, int32_t n_text, int32_t P, budget_result *r)
{
    const opts *o = e->o;
    const int32_t C = o->cont;
    if ((int64_t)P + C + 1 > n_text) {
        fprintf(stderr, "dp-eval: the text has %d tokens, fewer than P + %d + 1 = %d\n", n_text, C,
                P + C + 1);
        return DP_EINVAL;
    }
    double t0 = dp_now();
    memset(r, 0, sizeof *r);
    const int32_t nba = (P + C + BT - 1) / BT, nbb = (P + C + BT) / BT + 1;
    dp_kv_layout la = llama_kv_layout(e->m, BT, nba), lb;
    la.type = o->kv_type;
    lb = la;
    lb.n_blocks = 2 * nbb;
    lb.type = o->dkv_type;
    dp_kv_store *stores[DP_KV_MAX_STORES] = {NULL, NULL};
    int32_t *ta = malloc((size_t)nba * sizeof *ta), *tbm = malloc((size_t)2 * nbb * sizeof *tbm);
    float *ref_logits = malloc((size_t)C * e->vocab * sizeof(float));
    double *scratch = malloc((size_t)e->vocab * sizeof(double));
    ref_rows ref = ref_rows_new(C, e->vocab);
    int rc = DP_ENOMEM;
    if (!ta || !tbm || !ref_logits || !scratch || !ref.lp)
        goto out;
    if ((rc = e->be->ops->kv_create(e->be, &la, &stores[0])) ||
        (rc = e->be->ops->kv_create(e->be, &lb, &stores[1])))
        goto out;
    for (int32_t i = 0; i < nba; i++)
        ta[i] = i;
    for (int32_t i = 0; i < 2 * nbb; i++)
        tbm[i] = i;
    int32_t *tb[2] = {tbm, tbm + nbb};
    int32_t n_cap = o->window < DP_MAX_CAPTURE ? o->window : DP_MAX_CAPTURE;
    if (n_cap > P)
        n_cap = P;
    for (int w = 0; w < o->windows; w++) {
        const int32_t *cont, *targets;
        if ((rc = window_reference(e, stores, ta, nba, text, n_text, P, w, n_cap, ref_logits, &ref,
                                   scratch, &r->full, &cont, &targets)))
            goto out;
        for (int32_t i = 0; i < C; i++)
            r->slots_full += P + i + 1;
        dp_compress_opts co = {DP_SCORER_SNAPKV, o->keep, o->sinks, o->window, 1, 0};
        double sl = 0;
        int64_t nrec = 0;
        if ((rc = budget_run(e, stores, ta, nba, tb, nbb, P, &co, n_cap, 0, cont, targets, &ref,
                             scratch, &r->off, &nrec, &sl)))
            goto out;
        r->slots_off += sl;
        for (int bi = 0; bi < o->n_budgets; bi++) {
            for (int k = 0; k < BUDGET_SCORERS; k++) {
                co.scorer = budget_scorers[k];
                sl = 0;
                if ((rc = budget_run(e, stores, ta, nba, tb, nbb, P, &co, n_cap, o->budgets[bi],
                                     cont, targets, &ref, scratch, &r->a[bi][k],
                                     &r->recompressions[bi][k], &sl)))
                    goto out;
                if (k == 0)
                    r->slots[bi] += sl;
            }
            int32_t k0 = compress_n_keep(&co, P), bk = compress_budget_keep(o->budgets[bi],
                                                                             o->sinks + o->window);
            r->keep0[bi] = k0 < bk ? k0 : bk;
            fprintf(stderr, "dp-eval: budget: P=%d window %d/%d, budget %d done, %.0f s\n", P, w + 1,
                    o->windows, o->budgets[bi], dp_now() - t0);
        }
    }
    rc = 0;
    r->seconds = dp_now() - t0;
out:
    if (stores[0])
        e->be->ops->kv_destroy(e->be, stores[0]);
    if (stores[1])
        e->be->ops->kv_destroy(e->be, stores[1]);
    free(ta);
    free(tbm);
    free(ref_logits);
    free(scratch);
    ref_rows_free(&ref);
    return rc;
}

static void report_budget(sbuf *s, const opts *o, int32_t P, const budget_result *r)
{
    const int32_t C = o->cont;
    sb_printf(s, "### P = %d, %d tokens teacher-forced after it\n\n", P, C);
    sb_printf(s, "%d window(s), %ld predictions in all; the prompt migrates at keep %.2f (at most "
                 "what a recompression keeps); full-cache perplexity %.2f, mean %.0f slots held "
                 "per prediction; %.0f s.\n\n",
              o->windows, r->full.n, o->keep, acc_ppl(&r->full), r->slots_full / (double)r->full.n,
              r->seconds);
    sb_printf(s, "| decode budget | kept at migration | mean slots held (of full) | scorer | "
                 "recompressions per window | perplexity | KL nats/token | top-1 %% |\n");
    sb_printf(s, "|---|---|---|---|---|---|---|---|\n");
    dp_compress_opts co = {DP_SCORER_SNAPKV, o->keep, o->sinks, o->window, 1, 0};
    sb_printf(s, "| off | %d | %.0f (%.2f) | snapkv | 0 | %.2f | %.4f | %.1f |\n",
              compress_n_keep(&co, P), r->slots_off / (double)r->full.n,
              r->slots_off / r->slots_full, acc_ppl(&r->off), acc_kl(&r->off),
              100.0 * acc_top1(&r->off));
    for (int bi = 0; bi < o->n_budgets; bi++)
        for (int k = 0; k < BUDGET_SCORERS; k++) {
            const acc *a = &r->a[bi][k];
            double held = r->slots[bi] / (double)r->full.n;
            sb_printf(s, "| %d | %d | %.0f (%.2f) | %s | %.1f | %.2f | %.4f | %.1f |\n",
                      o->budgets[bi], r->keep0[bi], held, r->slots[bi] / r->slots_full,
                      scorer_name(budget_scorers[k]),
                      (double)r->recompressions[bi][k] / o->windows, acc_ppl(a), acc_kl(a),
                      100.0 * acc_top1(a));
        }
    sb_printf(s, "\n");
}

/* ---- greedy agreement on chat prompts ------------------------------------- */

static const char *const QUESTIONS[] = {
    "Summarize this section in three sentences.",
    "What does this section say about the conditions for distributing copies?",
    "List the obligations this text places on someone who conveys the program.",
    "Explain this passage in plain English for someone who is not a lawyer.",
    "What rights does this section give to the person who receives the program?",
    "Which terms are defined here, and what do they mean?",
    "What happens, according to this text, if someone violates the license?",
    "Rewrite the first paragraph of this passage in simpler words.",
    "What does this text say about patents?",
    "Who is this text addressed to, and what does it ask of them?",
    "What is the main purpose of this section?",
    "List the conditions mentioned in this passage.",
    "Does this passage say anything about warranties? Answer briefly.",
    "What must be provided along with the object code, according to this text?",
    "Give a one-sentence title for this section.",
    "What does this section say about source code?",
    "Name three things this passage allows and three it forbids.",
    "Is there anything in this text about modifying the program? Explain.",
    "What would a software company need to know from this section?",
    "Summarize the key points of this passage as a bulleted list.",
};
#define N_QUESTIONS ((int)(sizeof QUESTIONS / sizeof QUESTIONS[0]))


typedef struct chat_result {
    int identical[N_SCORERS][MAX_RATIOS][MAX_SEEDS];
    double prefix[N_SCORERS][MAX_RATIOS][MAX_SEEDS];   /* mean matching prefix length */
    double kept[MAX_RATIOS];                           /* mean kept fraction */
    double mean_len;
    int n;
    double seconds;
} chat_result;

/* The passage prompts of the greedy check: 300..700-token passages spread
 * over the text, each with a question. *msgs: n user messages (free each). */
static int chat_passages(ev *e, const int32_t *text, int32_t n_text, int n, char ***msgs, char *err,
                         size_t errsz)
{
    char **m = calloc((size_t)n, sizeof *m);
    if (!m)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        int32_t plen = 300 + (int32_t)((i * 211) % 401);
        if (plen > n_text)
            plen = n_text;
        int32_t off = (int32_t)((int64_t)(n_text - plen) * i / (n > 1 ? n - 1 : 1));
        char *passage = NULL;
        size_t plen_bytes;
        int rc = tokenizer_decode(e->tok, text + off, (size_t)plen, false, &passage, &plen_bytes);
        const char *q = QUESTIONS[i % N_QUESTIONS];
        size_t mlen = plen_bytes + strlen(q) + 64;
        if (!rc && !(m[i] = malloc(mlen)))
            rc = DP_ENOMEM;
        if (rc) {
            free(passage);
            for (int k = 0; k < i; k++)
                free(m[k]);
            free(m);
            return dp_err(err, errsz, rc, "cannot build the chat prompts");
        }
        snprintf(m[i], mlen, "Here is a passage from a software license:\n\n%s\n\n%s", passage, q);
        free(passage);
    }
    *msgs = m;
    return 0;
}

/* The acknowledgement between a document and its question (chat_build). */
static const char ACK[] = "I have read it. Ask me about it.";

/* Tokenizes one conversation of a chat set into cs->prompt[i], cs->len[i]
 * and cs->split[i] (dp_eval.h chat_build). With agnostic, the text up to
 * the end of the first message is tokenized on its own, as the daemon
 * tokenizes a turn, and the rest after it. */
static int chat_tokenize(ev *e, const dp_chat_template *ct, const char *msg, const char *question,
                         bool agnostic, chat_set *cs, int i, char *err, size_t errsz)
{
    dp_chat_msg m[3] = {{"user", msg}, {"assistant", ACK}, {"user", question}};
    char *full = NULL, *pre = NULL;
    int rc = chat_template_apply(ct, m, question ? 3 : 1, true, &full, err, errsz);
    if (!rc && question && agnostic)
        rc = chat_template_apply(ct, m, 1, false, &pre, err, errsz);
    size_t n_pre = 0, n_rest = 0, lp = pre ? strlen(pre) : 0;
    int32_t *rest = NULL;
    if (!rc && pre && strncmp(full, pre, lp) != 0)
        rc = dp_err(err, errsz, DP_EINVAL, "the chat template does not render a conversation as "
                    "its first turn followed by the rest");
    if (!rc)
        rc = tokenizer_encode(e->tok, pre ? pre : full, pre ? lp : strlen(full),
                              tokenizer_add_bos(e->tok), true, &cs->prompt[i], &n_pre);
    if (!rc && pre)
        rc = tokenizer_encode(e->tok, full + lp, strlen(full + lp), false, true, &rest, &n_rest);
    int32_t *all = NULL;
    if (!rc && n_rest > 0 && !(all = realloc(cs->prompt[i], (n_pre + n_rest) * sizeof *all)))
        rc = DP_ENOMEM;
    if (all) {
        memcpy(all + n_pre, rest, n_rest * sizeof *all);
        cs->prompt[i] = all;
    }
    cs->len[i] = (int32_t)(n_pre + n_rest);
    cs->split[i] = (int32_t)n_pre;
    free(rest);
    free(full);
    free(pre);
    return rc;
}

/* See dp_eval.h. Store A holds the split tokens of each prompt (its last
 * window's queries captured there); store B the compacted prompt, the rest
 * of the prompt and gen tokens. first[i]: the first greedy token when the
 * whole prompt is compacted (-1: read after the compaction, chat_generate). */
int chat_build(ev *e, char *const *msgs, char *const *questions, bool agnostic, int n, int32_t gen,
               int32_t btype, chat_set *cs, char *err, size_t errsz)
{
    const opts *o = e->o;
    memset(cs, 0, sizeof *cs);
    cs->n = n;
    cs->gen = gen;
    cs->len = calloc((size_t)n, sizeof(int32_t));
    cs->split = calloc((size_t)n, sizeof(int32_t));
    cs->base_a = calloc((size_t)n, sizeof(int32_t));
    cs->base_b = calloc((size_t)n, sizeof(int32_t));
    cs->first = calloc((size_t)n, sizeof(int32_t));
    cs->prompt = calloc((size_t)n, sizeof(int32_t *));
    cs->q = calloc((size_t)n, sizeof(float *));
    if (!cs->len || !cs->split || !cs->base_a || !cs->base_b || !cs->first || !cs->prompt || !cs->q)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    dp_chat_template ct;
    int rc = chat_template_init_model(&ct, NULL, 0, &e->g, e->tok, err, errsz);
    if (rc)
        return rc;
    int32_t blocks_a = 0, blocks_b = 0;
    for (int i = 0; i < n && !rc; i++) {
        if ((rc = chat_tokenize(e, &ct, msgs[i], questions ? questions[i] : NULL, agnostic, cs, i,
                                err, errsz)))
            break;
        int32_t na = (cs->split[i] + BT - 1) / BT, nbb = (cs->len[i] + gen + BT - 1) / BT;
        cs->base_a[i] = blocks_a;
        cs->base_b[i] = blocks_b;
        blocks_a += na;
        blocks_b += nbb;
        if (na > cs->max_blocks_a)
            cs->max_blocks_a = na;
        if (nbb > cs->max_blocks_b)
            cs->max_blocks_b = nbb;
    }
    chat_template_destroy(&ct);
    if (rc)
        return rc;
    cs->table_a = calloc((size_t)n * cs->max_blocks_a, sizeof(int32_t));
    cs->table_b = calloc((size_t)n * cs->max_blocks_b, sizeof(int32_t));
    if (!cs->table_a || !cs->table_b)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        for (int32_t b = 0; b < (cs->split[i] + BT - 1) / BT; b++)
            cs->table_a[(size_t)i * cs->max_blocks_a + b] = cs->base_a[i] + b;
        for (int32_t b = 0; b < (cs->len[i] + gen + BT - 1) / BT; b++)
            cs->table_b[(size_t)i * cs->max_blocks_b + b] = cs->base_b[i] + b;
    }
    dp_kv_layout la = llama_kv_layout(e->m, BT, blocks_a), lb = llama_kv_layout(e->m, BT, blocks_b);
    la.type = o->kv_type;
    lb.type = btype;
    if ((rc = e->be->ops->kv_create(e->be, &la, &cs->stores[0])) ||
        (rc = e->be->ops->kv_create(e->be, &lb, &cs->stores[1])))
        return dp_err(err, errsz, rc, "cannot allocate the chat KV stores");
    /* Prefill each prompt's split once, keeping its queries and, where that
     * is the whole prompt, its first token. */
    cs->n_cap = o->window < DP_MAX_CAPTURE ? o->window : DP_MAX_CAPTURE;
    size_t qn = (size_t)e->hp->n_layers * (size_t)cs->n_cap * (size_t)e->qd;
    for (int i = 0; i < n; i++) {
        if (cs->split[i] < cs->n_cap)
            return dp_err(err, errsz, DP_EINVAL, "chat prompt %d is shorter than the window", i);
        if ((rc = prefill(e, cs->stores, 0, cs->table_a + (size_t)i * cs->max_blocks_a, cs->max_blocks_a,
                          cs->prompt[i], cs->split[i], cs->n_cap, e->logits + (size_t)e->vocab)))
            return dp_err(err, errsz, rc, "chat prefill failed");
        cs->first[i] = cs->split[i] == cs->len[i] ? argmax(e->logits + (size_t)e->vocab, e->vocab) : -1;
        if (!(cs->q[i] = malloc(qn * sizeof(float))))
            return dp_err(err, errsz, DP_ENOMEM, "out of memory");
        memcpy(cs->q[i], e->q_host, qn * sizeof(float));
    }
    return 0;
}

/* Frees the compacted store (and its exempt layers' store). */
static void chat_drop_btype(ev *e, chat_set *cs)
{
    if (!cs->gt && cs->stores[1])
        e->be->ops->kv_destroy(e->be, cs->stores[1]);
    if (cs->stores[2])
        e->be->ops->kv_destroy(e->be, cs->stores[2]);
    cs->stores[1] = cs->stores[2] = NULL;
}

void chat_destroy(ev *e, chat_set *cs)
{
    for (int i = 0; i < cs->n; i++) {
        if (cs->prompt)
            free(cs->prompt[i]);
        if (cs->q)
            free(cs->q[i]);
    }
    chat_drop_btype(e, cs);
    if (cs->gt) {
        gtab_destroy(cs->gt, e);
        free(cs->gt);
    }
    for (int s = 0; s < DP_KV_MAX_STORES; s++)
        if (cs->stores[s])
            e->be->ops->kv_destroy(e->be, cs->stores[s]);
    free(cs->len);
    free(cs->split);
    free(cs->base_a);
    free(cs->base_b);
    free(cs->first);
    free(cs->prompt);
    free(cs->q);
    free(cs->table_a);
    free(cs->table_b);
}

/* Reads tokens [split, len) of chat prompt i after its compacted split
 * (slots n_keep..), in steps of at most CHUNK tokens, and returns the
 * greedy token after them: what a resumed turn does with its new text. */
static int chat_read_rest(ev *e, chat_set *cs, int i, int32_t n_keep, const uint8_t *x_store,
                          const int32_t *row, int32_t *first)
{
    /* (A grouped type's row: its groups, then its residual; e->g_*: its arrays.) */
    const int32_t *table = row ? row : cs->table_b + (size_t)i * cs->max_blocks_b;
    static const uint8_t si = 1;
    for (int32_t done = cs->split[i]; done < cs->len[i];) {
        int32_t n = cs->len[i] - done < CHUNK ? cs->len[i] - done : CHUNK;
        for (int32_t k = 0; k < n; k++) {
            e->bt_tokens[k] = cs->prompt[i][done + k];
            e->bt_pos[k] = done + k;
            e->bt_slot[k] = n_keep + done - cs->split[i] + k;
            e->bt_seq[k] = 0;
        }
        e->bt_out[0] = n - 1;
        dp_batch b = {.n_tokens = n, .tokens = e->bt_tokens, .pos = e->bt_pos, .seq = e->bt_seq,
                      .slot = e->bt_slot, .n_seqs = 1, .seq_store = &si, .block_tables = table,
                      .max_blocks = cs->max_blocks_b, .n_out = 1, .out_tokens = e->bt_out,
                      .seq_sealed = e->g_sealed, .seq_roff = e->g_roff};
        if (cs->stores[2])
            with_exempt(e, &b, x_store, table, cs->max_blocks_b);
        int rc = llama_forward(e->m, &b, cs->stores, e->logits);
        if (rc)
            return rc;
        done += n;
    }
    *first = argmax(e->logits, e->vocab);
    return 0;
}

/* Compresses every chat prompt's split with one option set (n_keep per
 * prompt from keep_ratio), reads the rest of each prompt after it, and
 * generates gen greedy tokens for all of them in lockstep, one token per
 * live sequence per step. After an end-of-generation token a sequence
 * stops and its output is padded with that token. */
static int chat_generate(ev *e, chat_set *cs, const dp_compress_opts *co, int32_t *out, double *kept)
{
    const int32_t L = e->hp->n_layers, n = cs->n;
    int32_t *n_keep = calloc((size_t)n, sizeof(int32_t)), *slot0 = calloc((size_t)n, sizeof(int32_t));
    int32_t *sim_done = calloc((size_t)n, sizeof(int32_t));
    uint8_t *seq_store = malloc((size_t)n), *x_store = malloc((size_t)n);
    bool *live = calloc((size_t)n, sizeof(bool));
    kv_sim sim = {0};
    /* A grouped type: each sequence's row and arrays (eval_grouped.c). */
    gtab *gt = cs->gt;
    gseq *gs = gt ? calloc((size_t)n, sizeof *gs) : NULL;
    int32_t *grows = gt ? malloc((size_t)n * cs->max_blocks_b * sizeof *grows) : NULL;
    int32_t *gsealed = gt ? calloc((size_t)n, sizeof *gsealed) : NULL;
    int32_t *groff = gt ? calloc((size_t)n, sizeof *groff) : NULL;
    int rc = DP_ENOMEM;
    if (!n_keep || !slot0 || !sim_done || !seq_store || !x_store || !live ||
        (gt && (!gs || !grows || !gsealed || !groff)))
        goto out;
    if (gt)
        gt->next = gt->n_ident;
    /* A simulated type: whole groups rounded after the migration and as
     * generated tokens fill them (kv_sim.h). */
    if (cs->sim_type &&
        (rc = kv_sim_init(&sim, e->be, cs->stores[1], cs->sim_type, e->o->kivi_group)))
        goto out;
    memset(x_store, 2, (size_t)n);
    *kept = 0;
    for (int i = 0; i < n; i++) {
        const int32_t *tb = cs->table_b + (size_t)i * cs->max_blocks_b;
        n_keep[i] = compress_n_keep(co, cs->split[i]);
        slot0[i] = n_keep[i] + cs->len[i] - cs->split[i];
        *kept += (double)n_keep[i] / cs->split[i] / n;
        /* One sequence per call: its queries are the ones on the device. */
        memcpy(e->q_host, cs->q[i], (size_t)L * cs->n_cap * e->qd * sizeof(float));
        dp_kv_move mv = {.co = co, .src = cs->table_a + (size_t)i * cs->max_blocks_a,
                         .n_src_blocks = (cs->split[i] + BT - 1) / BT, .n_slots = cs->split[i],
                         .dst = tb, .n_dst_blocks = (cs->len[i] + cs->gen + BT - 1) / BT,
                         .n_keep = n_keep[i], .q = e->q_dev,
                         .q_stride = (int64_t)cs->n_cap * e->qd, .n_q = cs->n_cap};
        if (cs->stores[2]) { /* exempt layers: every prompt token */
            mv.xdst = mv.dst;
            mv.n_xdst_blocks = mv.n_dst_blocks;
        }
        kv_migrator_set_exempt(&e->mig, cs->stores[2]);
        int32_t first = cs->first[i];
        if (gt) { /* sealed after the migration, and again after the rest is read */
            gs[i].row = grows + (size_t)i * cs->max_blocks_b;
            gtab_start(gt, &gs[i], tb, mv.n_dst_blocks);
            e->g_sealed = &gs[i].sealed;
            e->g_roff = &gs[i].roff;
        }
        if ((rc = queries_to_backend(e, cs->n_cap)) ||
            (rc = kv_migrate(&e->mig, cs->stores[0], gt ? gt->arena : cs->stores[1], &mv, 1)) ||
            (cs->sim_type && (rc = kv_sim_fill(&sim, tb, n_keep[i], &sim_done[i]))) ||
            (gt && (rc = gtab_seal(gt, e, &gs[i], n_keep[i]))) ||
            (first < 0 && (rc = chat_read_rest(e, cs, i, n_keep[i], x_store,
                                               gt ? gs[i].row : NULL, &first))) ||
            (cs->sim_type && (rc = kv_sim_fill(&sim, tb, slot0[i], &sim_done[i]))) ||
            (gt && (rc = gtab_seal(gt, e, &gs[i], slot0[i]))))
            goto out;
        e->g_sealed = e->g_roff = NULL;
        seq_store[i] = 1;
        live[i] = true;
        out[(size_t)i * cs->gen] = first;
        if (tokenizer_is_eog(e->tok, first))
            live[i] = false;
    }
    for (int32_t t = 1; t < cs->gen; t++) {
        int32_t nt = 0;
        for (int i = 0; i < n; i++) {
            if (!live[i]) {
                out[(size_t)i * cs->gen + t] = out[(size_t)i * cs->gen + t - 1];
                continue;
            }
            e->bt_tokens[nt] = out[(size_t)i * cs->gen + t - 1];
            e->bt_pos[nt] = cs->len[i] + t - 1;
            e->bt_slot[nt] = slot0[i] + t - 1;
            e->bt_seq[nt] = i;
            e->bt_out[nt] = nt;
            nt++;
        }
        if (nt == 0)
            continue;
        for (int i = 0; gt && i < n; i++) {
            gsealed[i] = gs[i].sealed;
            groff[i] = gs[i].roff;
        }
        dp_batch b = {.n_tokens = nt, .tokens = e->bt_tokens, .pos = e->bt_pos, .seq = e->bt_seq,
                      .slot = e->bt_slot, .n_seqs = n, .seq_store = seq_store,
                      .block_tables = gt ? grows : cs->table_b, .max_blocks = cs->max_blocks_b,
                      .n_out = nt, .out_tokens = e->bt_out, .seq_sealed = gt ? gsealed : NULL,
                      .seq_roff = gt ? groff : NULL};
        if (cs->stores[2])
            with_exempt(e, &b, x_store, cs->table_b, cs->max_blocks_b);
        if ((rc = llama_forward(e->m, &b, cs->stores, e->logits)))
            goto out;
        for (int32_t k = 0; k < nt; k++) {
            int i = e->bt_seq[k];
            int32_t am = argmax(e->logits + (size_t)k * e->vocab, e->vocab);
            out[(size_t)i * cs->gen + t] = am;
            if (tokenizer_is_eog(e->tok, am))
                live[i] = false;
            if (cs->sim_type &&
                (rc = kv_sim_fill(&sim, cs->table_b + (size_t)i * cs->max_blocks_b, slot0[i] + t,
                                  &sim_done[i])))
                goto out;
            if (gt && (rc = gtab_seal(gt, e, &gs[i], slot0[i] + t)))
                goto out;
        }
    }
    rc = 0;
out:
    if (cs->sim_type)
        kv_sim_destroy(&sim);
    e->g_sealed = e->g_roff = NULL;
    free(gs);
    free(grows);
    free(gsealed);
    free(groff);
    free(sim_done);
    kv_migrator_set_exempt(&e->mig, NULL);
    free(n_keep);
    free(slot0);
    free(seq_store);
    free(x_store);
    free(live);
    return rc;
}

/* Length of the common prefix of two greedy outputs of n tokens. */
static int32_t same_prefix(const int32_t *a, const int32_t *b, int32_t n)
{
    int32_t k = 0;
    while (k < n && a[k] == b[k])
        k++;
    return k;
}

static int eval_chat(ev *e, const int32_t *text, int32_t n_text, chat_result *r, int32_t **ref_out,
                     char *err, size_t errsz)
{
    const opts *o = e->o;
    double t0 = dp_now();
    chat_set cs;
    memset(r, 0, sizeof *r);
    memset(&cs, 0, sizeof cs);
    char **msgs = NULL;
    int rc = chat_passages(e, text, n_text, o->chat, &msgs, err, errsz);
    if (!rc) {
        rc = chat_build(e, msgs, NULL, false, o->chat, o->gen, o->dkv_type, &cs, err, errsz);
        for (int i = 0; i < o->chat; i++)
            free(msgs[i]);
        free(msgs);
    }
    size_t nout = (size_t)o->chat * o->gen;
    int32_t *ref = malloc(nout * sizeof *ref), *got = malloc(nout * sizeof *got);
    if (!rc && (!ref || !got))
        rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
    if (rc)
        goto out;
    r->n = o->chat;
    for (int i = 0; i < cs.n; i++)
        r->mean_len += (double)cs.len[i] / cs.n;
    fprintf(stderr, "dp-eval: chat: %d prompts prefilled (mean %.0f tokens), %.0f s\n", cs.n,
            r->mean_len, dp_now() - t0);
    /* The reference: every token kept, through the same compaction path. */
    dp_compress_opts full = {DP_SCORER_RECENT, 1.0f, o->sinks, o->window, 0, 0};
    double kept;
    if ((rc = chat_generate(e, &cs, &full, ref, &kept))) {
        rc = dp_err(err, errsz, rc, "chat generation failed");
        goto out;
    }
    for (int ri = 0; ri < o->n_ratios; ri++) {
        for (int sc = 0; sc < N_SCORERS; sc++)
            for (int sd = 0; sd < n_seeds_of(o, sc); sd++) {
                dp_compress_opts co = {(dp_scorer)sc, o->ratios[ri], o->sinks, o->window, (uint64_t)sd + 1, 0};
                bool all = true;
                for (int i = 0; i < cs.n; i++)
                    all = all && compress_n_keep(&co, cs.len[i]) == cs.len[i];
                if (all) {
                    memcpy(got, ref, nout * sizeof *got);
                    kept = 1.0;
                } else if ((rc = chat_generate(e, &cs, &co, got, &kept))) {
                    rc = dp_err(err, errsz, rc, "chat generation failed");
                    goto out;
                }
                r->kept[ri] = kept;
                int ident = 0;
                double pre = 0;
                for (int i = 0; i < cs.n; i++) {
                    int32_t k = same_prefix(got + (size_t)i * o->gen, ref + (size_t)i * o->gen, o->gen);
                    ident += k == o->gen;
                    pre += (double)k / cs.n;
                }
                r->identical[sc][ri][sd] = ident;
                r->prefix[sc][ri][sd] = pre;
            }
        fprintf(stderr, "dp-eval: chat: keep %.2f done, %.0f s\n", o->ratios[ri], dp_now() - t0);
    }
    r->seconds = dp_now() - t0;
    if (ref_out) {
        *ref_out = ref;
        ref = NULL;
    }
out:
    chat_destroy(e, &cs);
    free(ref);
    free(got);
    return rc;
}

/* ---- the decode-type grid (--grid) ----------------------------------------- */


static dp_compress_opts grid_opts(const opts *o, int ri)
{
    return (dp_compress_opts){o->scorer, o->ratios[ri], o->sinks, o->window, 1, 0};
}

/* A decode type's name, and the store that holds it (a simulated type's
 * rounded values in f32). */
static const char *dt_name(int t) { return kv_sim_is(t) ? kv_sim_name(t) : dp_kv_type_name(t); }
static int dt_store(int t) { return kv_sim_is(t) ? DP_KV_F32 : t; }

/* teacher_force over a grouped type (g; its kept slots [0, n_keep) just
 * migrated into the arena through table): whole groups are sealed, then the
 * continuation runs in chunks that each fill the open group, sealed before
 * the next chunk reads it, as the manager seals at every growth. The logits
 * of all C tokens land in e->logits (buf: C rows of scratch). */
static int teacher_force_grouped(ev *e, gtab *g, dp_kv_store *const *stores, const int32_t *table,
                                 int32_t nb, int32_t n_keep, int32_t P, const int32_t *cont,
                                 int32_t C, float *buf)
{
    int32_t *row = malloc((size_t)nb * sizeof *row);
    if (!row)
        return DP_ENOMEM;
    gseq s = {.row = row};
    gtab_start(g, &s, table, nb);
    dp_kv_store *st[DP_KV_MAX_STORES];
    memcpy(st, stores, sizeof st);
    st[1] = g->view;
    e->g_sealed = &s.sealed;
    e->g_roff = &s.roff;
    g->next = g->n_ident; /* (each window seals its groups afresh) */
    int rc = gtab_seal(g, e, &s, n_keep);
    for (int32_t i = 0; rc == 0 && i < C;) {
        const int32_t slots = n_keep + i;
        int32_t len = gtab_next_seal(g, &s) - slots;
        if (len > C - i)
            len = C - i;
        if ((rc = teacher_force(e, st, 1, s.row, nb, slots, P + i, cont + i, len)))
            break;
        memcpy(buf + (size_t)i * e->vocab, e->logits, (size_t)len * e->vocab * sizeof(float));
        i += len;
        rc = gtab_seal(g, e, &s, n_keep + i);
    }
    e->g_sealed = e->g_roff = NULL;
    if (!rc)
        memcpy(e->logits, buf, (size_t)C * e->vocab * sizeof(float));
    free(row);
    return rc;
}

/* Bytes per token of a decode type in the daemon's arena: an arena block
 * holds BT tokens in the prefill path's type and as many of the decode
 * type as fit in the same bytes (kvcache/manager.c). */
static void grid_bytes(ev *e, grid_result *g)
{
    dp_kv_layout pl = llama_kv_layout(e->m, BT, 1), dl = pl;
    pl.type = DP_KV_F16;
    const size_t blk = e->be->ops->kv_bytes_per_block(e->be, &pl);
    for (int t = 0; t < e->o->n_dtypes; t++) {
        if (kv_sim_is(e->o->dtypes[t])) {
            g->dbt[t] = 0;
            g->bytes[t] = kv_sim_bytes(e->o->dtypes[t], e->o->kivi_group);
            continue;
        }
        dl.type = e->o->dtypes[t];
        if (dp_kv_type_grouped(dl.type)) { /* a group per arena block (eval_grouped.c) */
            g->dbt[t] = kv_mgr_group_tokens(e->be, &dl, blk);
            g->bytes[t] = g->dbt[t] ? (double)BT / g->dbt[t] : 0;
            continue;
        }
        dl.block_tokens = 1;
        size_t per = e->be->ops->kv_bytes_per_block(e->be, &dl);
        g->dbt[t] = per ? (int32_t)(blk / per) : 0;
        g->bytes[t] = g->dbt[t] ? (double)BT / g->dbt[t] : 0;
    }
}

/* The early switch as the engine runs it (engine.c, DP_COMPACT_EARLY then
 * DP_COMPACT_PROMPT_END): the prompt's first o->early tokens, whole on the
 * prefill path in store a, move whole into the decode type (store b, the
 * same kv_migrate keeping every slot); the rest of the prompt is computed
 * there, over them, its last queries captured; the prompt's end compacts
 * the decode path to co's keep ratio (b into b2, SnapKV over those
 * queries), and the continuation is teacher-forced over it. The logits
 * land in e->logits. */
static int early_switch_tf(ev *e, dp_kv_store *a, dp_kv_store *b, dp_kv_store *b2,
                           const int32_t *table, int32_t nb, const int32_t *prompt, int32_t P,
                           int32_t n_cap, const dp_compress_opts *co, const int32_t *cont,
                           int32_t C)
{
    const int32_t S = e->o->early;
    dp_compress_opts all = *co;
    all.keep_ratio = 1.0f;
    dp_kv_move mv = {.co = &all, .src = table, .n_src_blocks = (S + BT - 1) / BT, .n_slots = S,
                     .dst = table, .n_dst_blocks = nb, .n_keep = S};
    int rc = kv_migrate(&e->mig, a, b, &mv, 1);
    dp_kv_store *st[DP_KV_MAX_STORES] = {a, b, NULL};
    /* The rest of the prompt on the decode path, in chunks as prefill() cuts
     * them; the last one's last n_cap queries captured. */
    static const uint8_t si = 1;
    for (int32_t done = S; rc == 0 && done < P;) {
        int32_t len = P - done < CHUNK ? P - done : CHUNK;
        const bool last = done + len == P;
        const int32_t cap = last ? (n_cap < len ? n_cap : len) : 0;
        for (int32_t i = 0; i < len; i++) {
            e->bt_tokens[i] = prompt[done + i];
            e->bt_pos[i] = e->bt_slot[i] = done + i;
            e->bt_seq[i] = 0;
        }
        for (int32_t i = 0; i < cap; i++)
            e->bt_cap[i] = len - cap + i;
        dp_batch bb = {.n_tokens = len, .tokens = e->bt_tokens, .pos = e->bt_pos,
                       .seq = e->bt_seq, .slot = e->bt_slot, .n_seqs = 1, .seq_store = &si,
                       .block_tables = table, .max_blocks = nb, .n_out = 0,
                       .out_tokens = e->bt_out, .n_capture = cap, .capture_tokens = e->bt_cap};
        rc = llama_forward(e->m, &bb, st, e->logits);
        if (rc == 0 && cap > 0)
            rc = e->be->ops->download(e->be, e->q_host, llama_captured_queries(e->m),
                                      (size_t)e->hp->n_layers * (size_t)cap * (size_t)e->qd *
                                          sizeof(float));
        done += len;
    }
    if (rc == 0)
        rc = queries_to_backend(e, n_cap);
    const int32_t n_keep = compress_n_keep(co, P);
    dp_kv_move end = {.co = co, .src = table, .n_src_blocks = (P + BT - 1) / BT, .n_slots = P,
                      .dst = table, .n_dst_blocks = nb, .n_keep = n_keep, .q = e->q_dev,
                      .q_stride = (int64_t)n_cap * e->qd, .n_q = n_cap};
    if (rc == 0)
        rc = kv_migrate(&e->mig, b, b2, &end, 1);
    dp_kv_store *st2[DP_KV_MAX_STORES] = {a, b2, NULL};
    if (rc == 0)
        rc = teacher_force(e, st2, 1, table, nb, n_keep, P, cont, C);
    return rc;
}

/* teacher_force over a simulated type in stores[1] (its kept slots
 * [0, n_keep) just migrated, exact): the whole groups of the kept slots are
 * rounded, then the continuation runs in chunks that each fill the open
 * group, which is rounded before the next chunk reads it, as a kernel
 * keeping the residual exact until its group fills would. The logits of
 * all C tokens land in e->logits (buf: C rows of scratch). */
static int teacher_force_sim(ev *e, dp_kv_store *const *stores, const int32_t *table, int32_t nb,
                             int32_t n_keep, int32_t P, const int32_t *cont, int32_t C, int type,
                             float *buf)
{
    kv_sim sim;
    int32_t done = 0;
    int rc = kv_sim_init(&sim, e->be, stores[1], type, e->o->kivi_group);
    if (!rc)
        rc = kv_sim_fill(&sim, table, n_keep, &done);
    for (int32_t i = 0; rc == 0 && i < C;) {
        const int32_t slots = n_keep + i;
        int32_t len = sim.group - (slots - done);
        if (len > C - i)
            len = C - i;
        if ((rc = teacher_force(e, stores, 1, table, nb, slots, P + i, cont + i, len)))
            break;
        memcpy(buf + (size_t)i * e->vocab, e->logits, (size_t)len * e->vocab * sizeof(float));
        i += len;
        rc = kv_sim_fill(&sim, table, n_keep + i, &done);
    }
    if (!rc)
        memcpy(e->logits, buf, (size_t)C * e->vocab * sizeof(float));
    kv_sim_destroy(&sim);
    return rc;
}

static int grid_tf(ev *e, const int32_t *text, int32_t n_text, int pi, grid_result *g)
{
    const opts *o = e->o;
    const int32_t P = o->prefill[pi], C = o->cont;
    if ((int64_t)P + C + 1 > n_text)
        return DP_EINVAL;
    int32_t nb = (P + C + BT - 1) / BT;
    dp_kv_layout la = llama_kv_layout(e->m, BT, nb);
    la.type = o->kv_type;
    dp_kv_store *a = NULL, *b[MAX_DTYPES] = {NULL}, *x[MAX_DTYPES] = {NULL},
                *b2[MAX_DTYPES] = {NULL};
    gtab gt[MAX_DTYPES];
    memset(gt, 0, sizeof gt);
    float *sim_logits = NULL;
    int32_t *table = malloc((size_t)nb * sizeof *table);
    float *ref_logits = malloc((size_t)C * e->vocab * sizeof(float));
    double *scratch = malloc((size_t)e->vocab * sizeof(double));
    ref_rows ref = ref_rows_new(C, e->vocab);
    int rc = DP_ENOMEM;
    if (!table || !ref_logits || !scratch || !ref.lp)
        goto out;
    if ((rc = e->be->ops->kv_create(e->be, &la, &a)))
        goto out;
    if (!(sim_logits = malloc((size_t)C * e->vocab * sizeof(float))))
        goto out;
    for (int t = 0; t < o->n_dtypes; t++) {
        dp_kv_layout lb = la;
        lb.type = dt_store(o->dtypes[t]);
        if (dp_kv_type_grouped(lb.type)) { /* migrations into its arena, read through its view */
            if ((rc = gtab_init(&gt[t], e, &la, nb)))
                goto out;
            b[t] = gt[t].arena;
            continue;
        }
        if ((rc = e->be->ops->kv_create(e->be, &lb, &b[t])) || (rc = exempt_store(e, &lb, &x[t])) ||
            (o->early > 0 && (rc = e->be->ops->kv_create(e->be, &lb, &b2[t]))))
            goto out;
    }
    for (int32_t i = 0; i < nb; i++)
        table[i] = i;
    int32_t n_cap = o->window < DP_MAX_CAPTURE ? o->window : DP_MAX_CAPTURE;
    if (n_cap > P)
        n_cap = P;
    for (int w = 0; w < o->windows; w++) {
        const int32_t *cont, *targets;
        dp_kv_store *sa[DP_KV_MAX_STORES] = {a, NULL};
        if ((rc = window_reference(e, sa, table, nb, text, n_text, P, w, n_cap, ref_logits, &ref,
                                   scratch, &g->full[pi], &cont, &targets)))
            goto out;
        for (int t = 0; t < o->n_dtypes; t++)
            for (int ri = 0; ri < o->n_ratios; ri++) {
                dp_compress_opts co = grid_opts(o, ri);
                int32_t n_keep = compress_n_keep(&co, P);
                g->c[t][ri].n_keep[pi] = n_keep;
                dp_kv_store *st[DP_KV_MAX_STORES] = {a, b[t], x[t]};
                if (gt[t].view && o->early > 0) {
                    rc = DP_EUNSUPPORTED; /* (a grouped type never switches early) */
                    goto out;
                }
                dp_kv_move mv = {.co = &co, .src = table, .n_src_blocks = (P + BT - 1) / BT,
                                 .n_slots = P, .dst = table, .n_dst_blocks = nb, .n_keep = n_keep,
                                 .q = e->q_dev, .q_stride = (int64_t)n_cap * e->qd, .n_q = n_cap,
                                 .xdst = x[t] ? table : NULL, .n_xdst_blocks = nb};
                kv_migrator_set_exempt(&e->mig, x[t]);
                rc = kv_migrate(&e->mig, a, b[t], &mv, 1);
                kv_migrator_set_exempt(&e->mig, NULL);
                if (rc)
                    goto out;
                if (kv_sim_is(o->dtypes[t]))
                    rc = teacher_force_sim(e, st, table, nb, n_keep, P, cont, C, o->dtypes[t],
                                           sim_logits);
                else if (gt[t].view)
                    rc = teacher_force_grouped(e, &gt[t], st, table, nb, n_keep, P, cont, C,
                                               sim_logits);
                else
                    rc = teacher_force(e, st, 1, table, nb, n_keep, P, cont, C);
                if (rc)
                    goto out;
                acc_add(&g->c[t][ri].tf[pi], &ref, e->logits, e->vocab, targets, scratch);
                if (o->early > 0 && o->early < P) {
                    if ((rc = early_switch_tf(e, a, b[t], b2[t], table, nb, cont - P, P, n_cap, &co,
                                              cont, C)))
                        goto out;
                    g->ce[t][ri].n_keep[pi] = n_keep;
                    acc_add(&g->ce[t][ri].tf[pi], &ref, e->logits, e->vocab, targets, scratch);
                }
            }
        fprintf(stderr, "dp-eval: grid: P=%d window %d/%d done\n", P, w + 1, o->windows);
    }
    rc = 0;
out:
    if (a)
        e->be->ops->kv_destroy(e->be, a);
    free(sim_logits);
    for (int t = 0; t < MAX_DTYPES; t++) {
        if (gt[t].arena)
            gtab_destroy(&gt[t], e);
        else if (b[t])
            e->be->ops->kv_destroy(e->be, b[t]);
        if (x[t])
            e->be->ops->kv_destroy(e->be, x[t]);
        if (b2[t])
            e->be->ops->kv_destroy(e->be, b2[t]);
    }
    free(table);
    free(ref_logits);
    free(scratch);
    ref_rows_free(&ref);
    return rc;
}

/* The compacted store of a chat set, again with another type. */
static int chat_set_btype(ev *e, chat_set *cs, int32_t type)
{
    dp_kv_layout lb = *e->be->ops->kv_layout(e->be, cs->gt ? cs->gt->arena : cs->stores[1]);
    cs->sim_type = kv_sim_is(type) ? type : 0;
    type = dt_store(type);
    const dp_kv_layout *cur = e->be->ops->kv_layout(e->be, cs->stores[1]);
    if (cur->type == type && (cs->stores[2] != NULL) == (e->o->exempt > 0 && !cs->gt))
        return 0;
    chat_drop_btype(e, cs);
    if (cs->gt) { /* (its arena's identity blocks are the set's B blocks) */
        lb.n_blocks = cs->gt->n_ident;
        gtab_destroy(cs->gt, e);
        free(cs->gt);
        cs->gt = NULL;
    }
    if (dp_kv_type_grouped(type)) {
        /* Migrations into its arena, read through its view (no exempt
         * layers with a grouped type, as in the daemon). */
        if (!(cs->gt = calloc(1, sizeof *cs->gt)))
            return DP_ENOMEM;
        int rc = gtab_init(cs->gt, e, &lb, lb.n_blocks);
        cs->stores[1] = rc ? NULL : cs->gt->view;
        return rc;
    }
    lb.type = type;
    int rc = e->be->ops->kv_create(e->be, &lb, &cs->stores[1]);
    return rc ? rc : exempt_store(e, &lb, &cs->stores[2]);
}

/* Greedy generation of every cell over one chat set; ref: the full cache's
 * (every token kept, f16, through the same compaction: bit-identical to the
 * uncompressed cache). score(i, got) reads the outputs. */
int grid_generate(ev *e, chat_set *cs, grid_result *g, grid_score_fn score, int32_t *ref, void *ud)
{
    const opts *o = e->o;
    size_t nout = (size_t)cs->n * cs->gen;
    int32_t *got = malloc(nout * sizeof *got);
    if (!got)
        return DP_ENOMEM;
    double kept;
    dp_compress_opts full = {DP_SCORER_RECENT, 1.0f, o->sinks, o->window, 0, 0};
    int rc = chat_set_btype(e, cs, o->kv_type);
    if (!rc)
        rc = chat_generate(e, cs, &full, ref, &kept);
    for (int t = 0; t < o->n_dtypes && !rc; t++) {
        if ((rc = chat_set_btype(e, cs, o->dtypes[t])))
            break;
        for (int ri = 0; ri < o->n_ratios && !rc; ri++) {
            dp_compress_opts co = grid_opts(o, ri);
            if (!(rc = chat_generate(e, cs, &co, got, &kept)))
                score(e, cs, ref, got, &g->c[t][ri], ud);
        }
    }
    free(got);
    return rc;
}

static void score_chat(ev *e, const chat_set *cs, const int32_t *ref, const int32_t *got, grid_cell *c,
                       void *ud)
{
    for (int i = 0; i < cs->n; i++) {
        int32_t k = same_prefix(got + (size_t)i * cs->gen, ref + (size_t)i * cs->gen, cs->gen);
        c->chat_ident += k == cs->gen;
        c->chat_prefix += (double)k / cs->n;
    }
}

/* The greedy check's noise floor: the whole cache (f16, every token kept)
 * with each prompt generated alone instead of all in one batch. Answers
 * that differ here differ for reasons other than compression (numerics that
 * depend on the batch), so the chat column is read against this. */
static int grid_noise_floor(ev *e, chat_set *cs, const int32_t *ref, grid_result *g)
{
    const opts *o = e->o;
    int32_t *got = malloc((size_t)cs->gen * sizeof *got);
    if (!got)
        return DP_ENOMEM;
    dp_compress_opts full = {DP_SCORER_RECENT, 1.0f, o->sinks, o->window, 0, 0};
    int rc = chat_set_btype(e, cs, o->kv_type);
    for (int i = 0; i < cs->n && !rc; i++) {
        /* A one-prompt set over the same stores and tables. */
        chat_set one = *cs;
        one.n = 1;
        one.len = cs->len + i;
        one.split = cs->split + i;
        one.base_a = cs->base_a + i;
        one.base_b = cs->base_b + i;
        one.first = cs->first + i;
        one.prompt = cs->prompt + i;
        one.q = cs->q + i;
        one.table_a = cs->table_a + (size_t)i * cs->max_blocks_a;
        one.table_b = cs->table_b + (size_t)i * cs->max_blocks_b;
        double kept;
        if ((rc = chat_generate(e, &one, &full, got, &kept)))
            break;
        int32_t k = same_prefix(got, ref + (size_t)i * cs->gen, cs->gen);
        g->noise_ident += k == cs->gen;
        g->noise_prefix += (double)k / cs->n;
    }
    free(got);
    return rc;
}

static int grid_chat(ev *e, const int32_t *text, int32_t n_text, grid_result *g, char *err, size_t errsz)
{
    const opts *o = e->o;
    char **msgs = NULL;
    chat_set cs;
    memset(&cs, 0, sizeof cs);
    int rc = chat_passages(e, text, n_text, o->chat, &msgs, err, errsz);
    if (rc)
        return rc;
    rc = chat_build(e, msgs, NULL, false, o->chat, o->gen, o->kv_type, &cs, err, errsz);
    for (int i = 0; i < o->chat; i++)
        free(msgs[i]);
    free(msgs);
    int32_t *ref = rc ? NULL : malloc((size_t)o->chat * o->gen * sizeof *ref);
    if (!rc && !ref)
        rc = DP_ENOMEM;
    if (!rc)
        rc = grid_generate(e, &cs, g, score_chat, ref, NULL);
    if (!rc)
        rc = grid_noise_floor(e, &cs, ref, g);
    g->chat_n = o->chat;
    for (int i = 0; i < cs.n; i++)
        g->chat_len += (double)cs.len[i] / cs.n;
    free(ref);
    chat_destroy(e, &cs);
    return rc ? dp_err(err, errsz, rc, "chat evaluation failed") : 0;
}

/* Blocks of the exempt layers an arena block holds (kvcache/manager.c). */
static int32_t e_fold(const opts *o, const grid_result *g)
{
    return g->n_layers / o->exempt;
}

/* The rule that chooses a default from the grid: a cell qualifies when its
 * KL is at most RULE_KL and its top-1 at least RULE_TOP1 at every --prefill
 * length, and each retrieval column (passkey, needles aware and agnostic,
 * per length) is within noise of the whole cache's: at most two binomial
 * standard errors of the whole cache's rate below it, and never more than
 * one answer below where that rate is 0 or 1. Among those, the fewest
 * bytes per token wins (then the lower KL). */
#define RULE_KL 0.01
#define RULE_TOP1 0.94

static bool within_noise(int hits, int full, int n)
{
    double p = (double)full / n, margin = 2.0 * sqrt(n * p * (1.0 - p));
    if (margin < 1.0)
        margin = 1.0;
    return hits >= full - margin;
}

static bool rule_holds(const opts *o, const grid_result *g, const grid_cell *c, double *kl_max)
{
    bool ok = true;
    *kl_max = 0;
    for (int pi = 0; pi < o->n_prefill; pi++) {
        double kl = acc_kl(&c->tf[pi]);
        *kl_max = kl > *kl_max ? kl : *kl_max;
        ok = ok && kl <= RULE_KL && acc_top1(&c->tf[pi]) >= RULE_TOP1;
    }
    for (int li = 0; li < o->n_passkey; li++)
        ok = ok && within_noise(c->pk_hits[li], g->pk_full[li], o->depths);
    for (int li = 0; li < o->n_niah; li++)
        for (int m = 0; m < 2; m++)
            ok = ok && within_noise(c->niah_hits[li][m], g->niah_full[li][m], o->trials);
    return ok;
}

/* At P = o->prefill[pi]. A grouped type's count its lead and its residual
 * (the newest tokens) in f16, as the manager seals its groups there. */
static double cell_bytes(const opts *o, const grid_result *g, int t, const grid_cell *c, int pi)
{
    const int32_t n = c->n_keep[pi];
    if (dp_kv_type_grouped(o->dtypes[t]) && g->dbt[t] > 0) {
        const int32_t sealed = kv_mgr_group_sealed(BT, g->dbt[t], n);
        return ((double)dp_kv_group_rstart(BT, g->dbt[t], sealed) * BT + (n - sealed)) /
               o->prefill[pi];
    }
    double kept = (double)n / o->prefill[pi];
    return kept * g->bytes[t] + (o->exempt > 0 ? g->bytes[t] / e_fold(o, g) : 0.0);
}

/* The most bytes over the prefill lengths. */
static double cell_bytes_max(const opts *o, const grid_result *g, int t, const grid_cell *c)
{
    double b = 0;
    for (int pi = 0; pi < o->n_prefill; pi++) {
        const double x = cell_bytes(o, g, t, c, pi);
        b = x > b ? x : b;
    }
    return b;
}

static void report_rule(sbuf *s, const opts *o, const grid_result *g)
{
    int bt = -1, br = -1;
    double best_bytes = 0, best_kl = 0;
    for (int t = 0; t < o->n_dtypes; t++)
        for (int ri = 0; ri < o->n_ratios; ri++) {
            double kl, b = cell_bytes_max(o, g, t, &g->c[t][ri]);
            if (!rule_holds(o, g, &g->c[t][ri], &kl))
                continue;
            if (bt < 0 || b < best_bytes - 1e-9 || (b < best_bytes + 1e-9 && kl < best_kl))
                bt = t, br = ri, best_bytes = b, best_kl = kl;
        }
    sb_printf(s, "Rule (KL <= %.2f nats/token and top-1 >= %.0f %% at every P, every retrieval "
                 "column within two standard errors of the whole cache's, fewest bytes at the "
                 "P that needs most): ",
              RULE_KL, 100.0 * RULE_TOP1);
    if (bt < 0)
        sb_printf(s, "no cell qualifies.\n\n");
    else
        sb_printf(s, "%s at keep %.1f, %.3f of f16's bytes per prompt token (KL %.4f).\n\n",
                  dt_name(o->dtypes[bt]), o->ratios[br], best_bytes, best_kl);
}

static void report_grid(sbuf *s, const opts *o, const grid_result *g)
{
    if (o->exempt > 0)
        sb_printf(s, "### Decode-path KV type x keep ratio (%s), the first %d layers exempt\n\n",
                  scorer_name(o->scorer), o->exempt);
    else
        sb_printf(s, "### Decode-path KV type x keep ratio (%s)\n\n", scorer_name(o->scorer));
    sb_printf(s, "Bytes: KV bytes per prompt token kept on the decode path at each P, relative "
                 "to the whole f16 cache (kept fraction x the type's bytes per token in the "
                 "arena: an arena block holds %d f16 tokens", BT);
    for (int t = 0; t < o->n_dtypes; t++)
        if (kv_sim_is(o->dtypes[t]))
            sb_printf(s, "; %s simulated: K per channel over %d slots in %d bits and V per token "
                         "over 32 channels in %d bits, an f16 scale and minimum per group, the "
                         "newest slots exact until their group fills (%.3f of f16's bytes)",
                      dt_name(o->dtypes[t]), o->kivi_group, kv_sim_kbits(o->dtypes[t]),
                      kv_sim_vbits(o->dtypes[t]), g->bytes[t]);
        else if (dp_kv_type_grouped(o->dtypes[t]))
            sb_printf(s, ", a group of %d %s tokens (K per channel and V per token over %d "
                         "channels, 4 bits with an f16 scale and minimum; counted with a "
                         "sequence's first %d tokens and newest %d-%d in f16, as the manager "
                         "seals them)",
                      g->dbt[t], dp_kv_type_name(o->dtypes[t]), KIVI_VGROUP, BT,
                      kv_mgr_group_recent(BT), kv_mgr_group_recent(BT) + g->dbt[t] - 1);
        else if (o->dtypes[t] != DP_KV_F16)
            sb_printf(s, ", %d %s tokens", g->dbt[t], dp_kv_type_name(o->dtypes[t]));
    if (o->exempt > 0)
        sb_printf(s, "; plus every token of the %d exempt layers, %d of their blocks in an arena "
                     "block", o->exempt, e_fold(o, g));
    sb_printf(s, "). KL (nats/token) and top-1 (%%) against the whole cache, teacher-forced "
                 "(%d window(s) x %d tokens per P).", o->windows, o->cont);
    if (o->chat > 0)
        sb_printf(s, " Chat: of %d prompts (%.0f tokens on average), those whose %d greedy tokens "
                     "equal the whole cache's / mean identical prefix.", g->chat_n, g->chat_len,
                  o->gen);
    if (o->n_passkey > 0)
        sb_printf(s, " Passkey: keys given back (a 5-7 digit key at %d depths), with the whole "
                     "cache's own score in the header.", o->depths);
    if (o->n_niah > 0)
        sb_printf(s, " Needles: of %d prompts per length (mean length in tokens in the header), "
                     "those answered with the asked value; %d needles (a 7-digit number for a "
                     "word) at spread depths of the text, one asked for, the question read "
                     "before the compaction (aware) or after it (agnostic, as a parked turn's "
                     "next question is); the whole cache's own score in the header.",
                  o->trials, o->needles);
    sb_printf(s, " %.0f s.\n\n", g->seconds);
    if (o->chat > 0)
        sb_printf(s, "Chat noise floor: the whole cache with each prompt generated alone instead "
                     "of all %d in one batch gives %d/%d identical answers (mean identical prefix "
                     "%.1f of %d tokens).\n\n",
                  g->chat_n, g->noise_ident, g->chat_n, g->noise_prefix, o->gen);
    sb_printf(s, "| decode type | keep |");
    for (int pi = 0; pi < o->n_prefill; pi++)
        sb_printf(s, " bytes P=%d |", o->prefill[pi]);
    for (int pi = 0; pi < o->n_prefill; pi++)
        sb_printf(s, " KL P=%d | top-1 P=%d |", o->prefill[pi], o->prefill[pi]);
    if (o->chat > 0)
        sb_printf(s, " chat |");
    for (int li = 0; li < o->n_passkey; li++)
        sb_printf(s, " passkey %d (full %d/%d) |", o->passkey[li], g->pk_full[li], o->depths);
    for (int li = 0; li < o->n_niah; li++)
        for (int m = 0; m < 2; m++)
            sb_printf(s, " needles %.0f %s (full %d/%d) |", g->niah_len[li], m ? "agnostic" : "aware",
                      g->niah_full[li][m], o->trials);
    sb_printf(s, "\n|---|---|");
    for (int pi = 0; pi < o->n_prefill; pi++)
        sb_printf(s, "---|---|---|");
    if (o->chat > 0)
        sb_printf(s, "---|");
    for (int li = 0; li < o->n_passkey + 2 * o->n_niah; li++)
        sb_printf(s, "---|");
    sb_printf(s, "\n");
    for (int t = 0; t < o->n_dtypes; t++)
        for (int ri = 0; ri < o->n_ratios; ri++) {
            const grid_cell *c = &g->c[t][ri];
            sb_printf(s, "| %s | %.1f |", dt_name(o->dtypes[t]), o->ratios[ri]);
            for (int pi = 0; pi < o->n_prefill; pi++)
                sb_printf(s, " %.3f |", cell_bytes(o, g, t, c, pi));
            for (int pi = 0; pi < o->n_prefill; pi++)
                sb_printf(s, " %.4f | %.1f |", acc_kl(&c->tf[pi]), 100.0 * acc_top1(&c->tf[pi]));
            if (o->chat > 0)
                sb_printf(s, " %d/%d / %.1f |", c->chat_ident, g->chat_n, c->chat_prefix);
            for (int li = 0; li < o->n_passkey; li++)
                sb_printf(s, " %d/%d |", c->pk_hits[li], o->depths);
            for (int li = 0; li < o->n_niah; li++)
                for (int m = 0; m < 2; m++)
                    sb_printf(s, " %d/%d |", c->niah_hits[li][m], o->trials);
            sb_printf(s, "\n");
        }
    if (o->early > 0) /* the early switch: teacher-forced columns only */
        for (int t = 0; t < o->n_dtypes; t++)
            for (int ri = 0; ri < o->n_ratios; ri++) {
                const grid_cell *c = &g->ce[t][ri];
                double kept = (double)c->n_keep[0] / o->prefill[0];
                sb_printf(s, "| %s, switched at %d | %.1f | %.3f |", dt_name(o->dtypes[t]),
                          o->early, o->ratios[ri], kept * g->bytes[t]);
                for (int pi = 0; pi < o->n_prefill; pi++)
                    sb_printf(s, " %.4f | %.1f |", acc_kl(&c->tf[pi]), 100.0 * acc_top1(&c->tf[pi]));
                if (o->chat > 0)
                    sb_printf(s, " - |");
                for (int li = 0; li < o->n_passkey + 2 * o->n_niah; li++)
                    sb_printf(s, " - |");
                sb_printf(s, "\n");
            }
    sb_printf(s, "\n");
    report_rule(s, o, g);
}

static int run_grid(ev *e, const int32_t *text, int32_t n_text, sbuf *md, char *err, size_t errsz)
{
    const opts *o = e->o;
    grid_result *g = calloc(1, sizeof *g);
    if (!g)
        return DP_ENOMEM;
    double t0 = dp_now();
    grid_bytes(e, g);
    g->n_layers = e->hp->n_layers;
    int rc = 0;
    for (int pi = 0; pi < o->n_prefill && !rc; pi++)
        if ((rc = grid_tf(e, text, n_text, pi, g)))
            rc = dp_err(err, errsz, rc, "teacher-forced evaluation at P = %d failed", o->prefill[pi]);
    if (!rc && o->chat > 0)
        rc = grid_chat(e, text, n_text, g, err, errsz);
    for (int li = 0; li < o->n_passkey && !rc; li++)
        rc = grid_passkey(e, li, g, err, errsz);
    for (int li = 0; li < o->n_niah && !rc; li++)
        rc = grid_niah(e, text, n_text, li, g, err, errsz);
    g->seconds = dp_now() - t0;
    if (!rc)
        report_grid(md, o, g);
    free(g);
    return rc;
}

/* ---- report ---------------------------------------------------------------- */

static void cell(sbuf *s, const opts *o, const tf_result *r, int sc, int ri, int what)
{
    double x[MAX_SEEDS];
    int ns = n_seeds_of(o, sc);
    for (int k = 0; k < ns; k++) {
        const acc *a = &r->a[sc][ri][k];
        x[k] = what == 0 ? acc_ppl(a) : what == 1 ? acc_kl(a) : 100.0 * acc_top1(a);
    }
    double m, sd;
    mean_std(x, ns, &m, &sd);
    const char *fmt = what == 0 ? "%.2f" : what == 1 ? "%.4f" : "%.1f";
    sb_printf(s, " ");
    sb_printf(s, fmt, m);
    if (ns > 1 && sd > 0) {
        sb_printf(s, " ± ");
        sb_printf(s, fmt, sd);
    }
    sb_printf(s, " |");
}

static void table_header(sbuf *s, const opts *o, const int32_t *n_keep, const double *kept)
{
    sb_printf(s, "| scorer |");
    for (int ri = 0; ri < o->n_ratios; ri++) {
        if (n_keep)
            sb_printf(s, " %.1f (%d) |", o->ratios[ri], n_keep[ri]);
        else
            sb_printf(s, " %.1f (%.2f) |", o->ratios[ri], kept[ri]);
    }
    sb_printf(s, "\n|---|");
    for (int ri = 0; ri < o->n_ratios; ri++)
        sb_printf(s, "---|");
    sb_printf(s, "\n");
}

static void report_tf(sbuf *s, const opts *o, int32_t P, const tf_result *r)
{
    static const char *const what[] = {"Perplexity (lower is better)",
                                       "KL(full ‖ compressed), nats per token (lower is better)",
                                       "Top-1 agreement with the full cache, % (higher is better)"};
    sb_printf(s, "### P = %d\n\n", P);
    sb_printf(s, "%d window(s) of %d context tokens, %ld teacher-forced predictions in all; "
                 "full-cache perplexity %.2f; keep-all compaction %s the uncompressed cache; "
                 "%.0f s.\n\n",
              o->windows, P, r->full.n, acc_ppl(&r->full),
              r->bit_identical ? "gives logits bit-identical to" : "gives logits DIFFERENT from",
              r->seconds);
    for (int w = 0; w < 3; w++) {
        sb_printf(s, "%s; columns: keep ratio (tokens kept of %d)\n\n", what[w], P);
        table_header(s, o, r->n_keep, NULL);
        for (int sc = 0; sc < N_SCORERS; sc++) {
            sb_printf(s, "| %s%s |", scorer_name((dp_scorer)sc),
                      sc == DP_SCORER_RANDOM && o->seeds > 1 ? " (mean ± sd)" : "");
            for (int ri = 0; ri < o->n_ratios; ri++)
                cell(s, o, r, sc, ri, w);
            sb_printf(s, "\n");
        }
        sb_printf(s, "\n");
    }
}

static void report_chat(sbuf *s, const opts *o, const chat_result *r)
{
    sb_printf(s, "### Greedy agreement on %d chat prompts\n\n", r->n);
    sb_printf(s, "Prompts of %.0f tokens on average (a 300–700-token passage of the text and a "
                 "question, in the model's chat template); %d greedy tokens each; cell: prompts "
                 "whose %d tokens are identical to the full cache / mean length of the identical "
                 "prefix. Columns: keep ratio (mean fraction kept, with the sinks + window floor). "
                 "%.0f s.\n\n",
              r->mean_len, o->gen, o->gen, r->seconds);
    table_header(s, o, NULL, r->kept);
    for (int sc = 0; sc < N_SCORERS; sc++) {
        sb_printf(s, "| %s%s |", scorer_name((dp_scorer)sc),
                  sc == DP_SCORER_RANDOM && o->seeds > 1 ? " (mean ± sd)" : "");
        for (int ri = 0; ri < o->n_ratios; ri++) {
            int ns = n_seeds_of(o, sc);
            double id[MAX_SEEDS], pre[MAX_SEEDS], m1, s1, m2, s2;
            for (int k = 0; k < ns; k++) {
                id[k] = r->identical[sc][ri][k];
                pre[k] = r->prefix[sc][ri][k];
            }
            mean_std(id, ns, &m1, &s1);
            mean_std(pre, ns, &m2, &s2);
            if (ns > 1 && (s1 > 0 || s2 > 0))
                sb_printf(s, " %.1f ± %.1f / %.1f ± %.1f |", m1, s1, m2, s2);
            else
                sb_printf(s, " %.0f/%d / %.1f |", m1, r->n, m2);
        }
        sb_printf(s, "\n");
    }
    sb_printf(s, "\n");
}

/* Replaces the section between this tag's markers in path (appending it when
 * absent, creating the file when missing). */
static int write_markdown(const char *path, const char *tag, const char *body)
{
    char begin[128], end[128];
    snprintf(begin, sizeof begin, "<!-- dp-eval:%s:begin -->\n", tag);
    snprintf(end, sizeof end, "<!-- dp-eval:%s:end -->\n", tag);
    char *old = NULL;
    size_t old_n = 0;
    FILE *f = fopen(path, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, 0, SEEK_SET);
        old = malloc((size_t)(sz > 0 ? sz : 0) + 1);
        if (!old || fread(old, 1, (size_t)sz, f) != (size_t)sz) {
            fclose(f);
            free(old);
            return DP_EIO;
        }
        old[sz] = 0;
        old_n = (size_t)sz;
        fclose(f);
    }
    char *b = old ? strstr(old, begin) : NULL;
    char *e = b ? strstr(b, end) : NULL;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *w = fopen(tmp, "wb");
    if (!w) {
        free(old);
        return DP_EIO;
    }
    if (b && e) {
        fwrite(old, 1, (size_t)(b - old), w);
        fputs(begin, w);
        fputs(body, w);
        fputs(end, w);
        char *rest = e + strlen(end);
        fwrite(rest, 1, old_n - (size_t)(rest - old), w);
    } else {
        if (old) {
            fwrite(old, 1, old_n, w);
            if (old_n && old[old_n - 1] != '\n')
                fputc('\n', w);
            fputc('\n', w);
        }
        fputs(begin, w);
        fputs(body, w);
        fputs(end, w);
    }
    free(old);
    if (fclose(w) != 0 || rename(tmp, path) != 0)
        return DP_EIO;
    return 0;
}

static void machine_line(sbuf *s, const ev *e)
{
    char model[256] = "unknown CPU", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    int cores = 0;
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "model name", 10) && model[0] == 'u') {
                const char *c = strchr(line, ':');
                if (c) {
                    snprintf(model, sizeof model, "%s", c + 2);
                    model[strcspn(model, "\n")] = 0;
                }
            }
            if (!strncmp(line, "processor", 9))
                cores++;
        }
        fclose(f);
    }
    sb_printf(s, "Machine: %s, %d logical CPUs, backend `%s` with %d thread(s).\n\n", model, cores,
              e->be->ops->name, e->be->n_threads);
}

/* ---- options ------------------------------------------------------------------ */

static int parse_list_i(const char *s, int32_t *v, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x <= 0 || x > 1 << 20)
            return -1;
        v[n++] = (int32_t)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *s ? -1 : n;
}

static int parse_list_f(const char *s, float *v, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        double x = strtod(s, &end);
        if (end == s || !(x > 0 && x <= 1))
            return -1;
        v[n++] = (float)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *s ? -1 : n;
}

/* A grid's decode types may also be simulated ones (sim-kivi4, sim-kivi2: kv_sim.h). */
static int parse_grid_type(const char *v)
{
    int t = dp_kv_type_parse(v);
    return t >= 0 ? t : kv_sim_parse(v);
}

static int parse_kv_types(const char *s, int *v)
{
    int n = 0;
    char buf[64];
    while (*s && n < MAX_DTYPES) {
        size_t k = strcspn(s, ",");
        if (k == 0 || k >= sizeof buf)
            return -1;
        memcpy(buf, s, k);
        buf[k] = 0;
        if ((v[n++] = parse_grid_type(buf)) < 0)
            return -1;
        s += k + (s[k] == ',');
    }
    return *s ? -1 : n;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: dp-eval [--model FILE] [--text FILE] [--prefill 512,2048] [--cont 256]\n"
            "               [--offset TOKENS] [--windows N] [--ratios 1,0.7,0.5,0.3,0.2,0.1]\n"
            "               [--seeds 5] [--sinks 4] [--window 32] [--chat 20] [--gen 64]\n"
            "               [--threads N] [--device cpu] [--kv-type f16|f32]\n"
            "               [--decode-kv-type f16|f32|q8_0|q4_0]\n"
            "               [--grid [--decode-kv-types f16,q8_0,q4_0,kivi4,sim-kivi2,sim-kivi4v8] [--kivi-group 32]\n"
            "                       [--scorer snapkv]\n"
            "                       [--passkey 512,1024,2048,4096] [--depths 10] [--exempt N] [--early S]\n"
            "                       [--niah 1024,2048,4096,6144] [--trials 12] [--needles 4]]\n"
            "               [--budget 128,256,512 [--keep 0.5]]   (decode-budget tables)\n"
            "               [--markdown FILE [--tag NAME]]\n");
}

int main(int argc, char **argv)
{
    opts o = {.model = "models/SmolLM2-135M-Instruct.Q4_1.gguf",
              .text = "/usr/share/common-licenses/GPL-3",
              .device = "cpu",
              .tag = "tables",
              .prefill = {512, 2048},
              .n_prefill = 2,
              .cont = 256,
              .windows = 1,
              .ratios = {1.0f, 0.7f, 0.5f, 0.3f, 0.2f, 0.1f},
              .n_ratios = 6,
              .seeds = 5,
              .sinks = 4,
              .window = 32,
              .chat = 20,
              .gen = 64,
              .kv_type = DP_KV_F16,
              .dkv_type = -1,
              .dtypes = {DP_KV_F16, DP_KV_Q8_0, DP_KV_Q4_0},
              .n_dtypes = 3,
              .kivi_group = 32,
              .passkey = {512, 1024, 2048, 4096},
              .n_passkey = 4,
              .depths = 10,
              .niah = {1024, 2048, 4096, 6144},
              .n_niah = 4,
              .trials = 12,
              .needles = 4,
              .scorer = DP_SCORER_SNAPKV,
              .keep = 0.5f};
    bool ratios_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "--grid")) {
            o.grid = true;
            continue;
        }
        if (!v) {
            usage();
            return 2;
        }
        i++;
        int bad = 0;
        if (!strcmp(a, "--model"))
            o.model = v;
        else if (!strcmp(a, "--text"))
            o.text = v;
        else if (!strcmp(a, "--device"))
            o.device = v;
        else if (!strcmp(a, "--markdown"))
            o.markdown = v;
        else if (!strcmp(a, "--tag"))
            o.tag = v;
        else if (!strcmp(a, "--prefill"))
            bad = (o.n_prefill = parse_list_i(v, o.prefill, 8)) <= 0;
        else if (!strcmp(a, "--ratios"))
            bad = (o.n_ratios = parse_list_f(v, o.ratios, MAX_RATIOS)) <= 0, ratios_set = true;
        else if (!strcmp(a, "--decode-kv-type"))
            bad = (o.dkv_type = dp_kv_type_parse(v)) < 0;
        else if (!strcmp(a, "--decode-kv-types"))
            bad = (o.n_dtypes = parse_kv_types(v, o.dtypes)) <= 0;
        else if (!strcmp(a, "--passkey"))
            bad = !strcmp(v, "0") ? (o.n_passkey = 0, 0) : (o.n_passkey = parse_list_i(v, o.passkey, MAX_LENS)) <= 0;
        else if (!strcmp(a, "--niah"))
            bad = !strcmp(v, "0") ? (o.n_niah = 0, 0) : (o.n_niah = parse_list_i(v, o.niah, MAX_LENS)) <= 0;
        else if (!strcmp(a, "--trials"))
            bad = (o.trials = atoi(v)) < 1 || o.trials > 64;
        else if (!strcmp(a, "--needles"))
            bad = (o.needles = atoi(v)) < 1 || o.needles > 8;
        else if (!strcmp(a, "--depths"))
            bad = (o.depths = atoi(v)) < 1 || o.depths > 16;
        else if (!strcmp(a, "--scorer")) {
            bad = 1;
            for (int sc = 0; sc < N_SCORERS; sc++)
                if (!strcmp(v, scorer_name((dp_scorer)sc)))
                    o.scorer = (dp_scorer)sc, bad = 0;
        }
        else if (!strcmp(a, "--budget"))
            bad = (o.n_budgets = parse_list_i(v, o.budgets, 8)) <= 0;
        else if (!strcmp(a, "--keep"))
            bad = !((o.keep = (float)atof(v)) > 0 && o.keep <= 1);
        else if (!strcmp(a, "--exempt"))
            bad = (o.exempt = atoi(v)) < 0;
        else if (!strcmp(a, "--early"))
            bad = (o.early = atoi(v)) < 0;
        else if (!strcmp(a, "--kivi-group"))
            bad = (o.kivi_group = atoi(v)) <= 0 || o.kivi_group % BT;
        else if (!strcmp(a, "--cont"))
            bad = (o.cont = atoi(v)) < 1;
        else if (!strcmp(a, "--offset"))
            bad = (o.offset = atoi(v)) < 0;
        else if (!strcmp(a, "--windows"))
            bad = (o.windows = atoi(v)) < 1;
        else if (!strcmp(a, "--seeds"))
            bad = (o.seeds = atoi(v)) < 1 || o.seeds > MAX_SEEDS;
        else if (!strcmp(a, "--sinks"))
            bad = (o.sinks = atoi(v)) < 0;
        else if (!strcmp(a, "--window"))
            bad = (o.window = atoi(v)) < 0;
        else if (!strcmp(a, "--chat"))
            bad = (o.chat = atoi(v)) < 0;
        else if (!strcmp(a, "--gen"))
            bad = (o.gen = atoi(v)) < 1;
        else if (!strcmp(a, "--threads"))
            bad = (o.threads = atoi(v)) < 0;
        else if (!strcmp(a, "--kv-type"))
            bad = !strcmp(v, "f16") ? (o.kv_type = DP_KV_F16, 0)
                  : !strcmp(v, "f32") ? (o.kv_type = DP_KV_F32, 0) : 1;
        else {
            fprintf(stderr, "dp-eval: unknown option %s\n", a);
            usage();
            return 2;
        }
        if (bad) {
            fprintf(stderr, "dp-eval: bad value for %s: %s\n", a, v);
            return 2;
        }
    }

    if (o.dkv_type < 0)
        o.dkv_type = o.kv_type;
    for (int t = 0; t < o.n_dtypes; t++)
        if (kv_sim_is(o.dtypes[t]) && (o.exempt > 0 || o.early > 0 || strcmp(o.device, "cpu"))) {
            fprintf(stderr, "dp-eval: simulated types (%s) run on the cpu device, without --exempt "
                    "and --early\n", kv_sim_name(o.dtypes[t]));
            return 2;
        }
    for (int i = 0; i < o.n_budgets; i++)
        if (o.budgets[i] <= o.sinks + o.window) {
            fprintf(stderr, "dp-eval: a decode budget must exceed sinks + window (%d)\n",
                    o.sinks + o.window);
            return 2;
        }
    if (o.grid && !ratios_set) {
        static const float grid_ratios[] = {1.0f, 0.7f, 0.5f, 0.3f};
        memcpy(o.ratios, grid_ratios, sizeof grid_ratios);
        o.n_ratios = 4;
    }
    char err[DP_ERRLEN] = "";
    ev e = {.o = &o};
    int rc;
    if ((rc = gguf_open(&e.g, o.model, err, sizeof err)))
        return die(o.model, rc, err);
    if ((rc = tokenizer_init_gguf(&e.tok, &e.g, err, sizeof err)))
        return die("tokenizer", rc, err);
    if ((rc = backend_create(&e.be, o.device, o.threads, err, sizeof err)))
        return die("backend", rc, err);
    int32_t max_tokens = CHUNK > o.cont ? CHUNK : o.cont;
    if (o.chat > max_tokens)
        max_tokens = o.chat;
    if ((rc = llama_init(&e.m, &e.g, e.be, max_tokens, o.cont > o.chat ? o.cont : (o.chat > 2 ? o.chat : 2),
                         err, sizeof err)))
        return die("model", rc, err);
    e.hp = llama_hparams(e.m);
    if (o.exempt > 0 && (!o.grid || o.exempt > e.hp->n_layers)) {
        fprintf(stderr, "dp-eval: --exempt takes a layer count up to the model's %d, with --grid\n",
                e.hp->n_layers);
        return 2;
    }
    e.vocab = e.hp->vocab;
    e.qd = e.hp->n_heads * e.hp->head_dim;
    size_t qn = (size_t)e.hp->n_layers * DP_MAX_CAPTURE * (size_t)e.qd;
    e.q_host = malloc(qn * sizeof(float));
    e.q_dev = e.be->ops->alloc(e.be, qn * sizeof(float));
    e.logits = malloc((size_t)llama_max_out(e.m) * e.vocab * sizeof(float));
    e.bt_tokens = malloc((size_t)max_tokens * sizeof(int32_t));
    e.bt_pos = malloc((size_t)max_tokens * sizeof(int32_t));
    e.bt_seq = malloc((size_t)max_tokens * sizeof(int32_t));
    e.bt_slot = malloc((size_t)max_tokens * sizeof(int32_t));
    e.bt_out = malloc((size_t)max_tokens * sizeof(int32_t));
    e.bt_cap = malloc((size_t)DP_MAX_CAPTURE * sizeof(int32_t));
    if (!e.q_host || !e.q_dev || !e.logits || !e.bt_tokens || !e.bt_pos || !e.bt_seq || !e.bt_slot ||
        !e.bt_out || !e.bt_cap)
        return die("memory", DP_ENOMEM, "out of memory");
    if ((rc = kv_migrator_init(&e.mig, e.be, e.hp->n_layers, e.hp->n_kv_heads, e.hp->n_heads,
                               e.hp->head_dim)))
        return die("compressor", rc, "");

    /* The text, tokenized once. */
    FILE *f = fopen(o.text, "rb");
    if (!f)
        return die(o.text, DP_EIO, "cannot open");
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz)
        return die(o.text, DP_EIO, "cannot read");
    fclose(f);
    int32_t *text;
    size_t n_text;
    if ((rc = tokenizer_encode(e.tok, buf, (size_t)sz, tokenizer_add_bos(e.tok), false, &text, &n_text)))
        return die("tokenize", rc, "");
    free(buf);
    fprintf(stderr, "dp-eval: %s: %zu tokens; model %s: %d layers, %d KV heads, head dim %d\n", o.text,
            n_text, o.model, e.hp->n_layers, e.hp->n_kv_heads, e.hp->head_dim);

    sbuf md = {0};
    sb_printf(&md, "Produced by `");
    for (int i = 0; i < argc; i++)
        sb_printf(&md, "%s%s", i ? " " : "", argv[i]);
    sb_printf(&md, "` (text `%s`, %zu tokens; model `%s`; sinks %d, window %d, random seeds 1..%d).\n",
              o.text, n_text, o.model, o.sinks, o.window, o.seeds);
    machine_line(&md, &e);

    if (o.grid) {
        if ((rc = run_grid(&e, text, (int32_t)n_text, &md, err, sizeof err)))
            return die("grid", rc, err);
        fwrite(md.p, 1, md.n, stdout);
        o.n_prefill = 0;
        o.chat = 0;
    }
    if (o.n_budgets > 0) {
        for (int pi = 0; pi < o.n_prefill; pi++) {
            budget_result *r = calloc(1, sizeof *r);
            if (!r)
                return die("memory", DP_ENOMEM, "");
            if ((rc = eval_budget(&e, text, (int32_t)n_text, o.prefill[pi], r)))
                return die("decode-budget evaluation", rc, "");
            size_t from = md.n;
            report_budget(&md, &o, o.prefill[pi], r);
            free(r);
            fwrite(md.p + (pi ? from : 0), 1, md.n - (pi ? from : 0), stdout);
            fflush(stdout);
        }
        o.n_prefill = 0;
        o.chat = 0;
    }
    for (int pi = 0; pi < o.n_prefill; pi++) {
        tf_result *r = calloc(1, sizeof *r);
        if (!r)
            return die("memory", DP_ENOMEM, "");
        if ((rc = eval_prefill(&e, text, (int32_t)n_text, o.prefill[pi], r)))
            return die("teacher-forced evaluation", rc, "");
        size_t from = md.n;
        report_tf(&md, &o, o.prefill[pi], r);
        free(r);
        /* Each table is printed as soon as it exists: a full run takes a while. */
        fwrite(md.p + (pi ? from : 0), 1, md.n - (pi ? from : 0), stdout);
        fflush(stdout);
    }
    if (o.chat > 0) {
        chat_result *cr = calloc(1, sizeof *cr);
        if (!cr)
            return die("memory", DP_ENOMEM, "");
        if ((rc = eval_chat(&e, text, (int32_t)n_text, cr, NULL, err, sizeof err)))
            return die("chat evaluation", rc, err);
        size_t from = md.n;
        report_chat(&md, &o, cr);
        free(cr);
        fwrite(md.p + (o.n_prefill ? from : 0), 1, md.n - (o.n_prefill ? from : 0), stdout);
    }
    if (o.markdown && (rc = write_markdown(o.markdown, o.tag, md.p)))
        return die(o.markdown, rc, "cannot write");

    free(md.p);
    free(text);
    kv_migrator_destroy(&e.mig);
    e.be->ops->free(e.be, e.q_dev);
    free(e.q_host);
    free(e.logits);
    free(e.bt_tokens);
    free(e.bt_pos);
    free(e.bt_seq);
    free(e.bt_slot);
    free(e.bt_out);
    free(e.bt_cap);
    llama_destroy(e.m);
    tokenizer_destroy(e.tok);
    backend_destroy(e.be);
    gguf_close(&e.g);
    return 0;
}
