/* eval_tf.c: the teacher-forced tables. Each window of the text is
 * prefilled, compacted by every scorer at every keep ratio (through
 * kv_migrate, as the daemon migrates) and its continuation teacher-forced
 * against the whole cache's: perplexity, KL and top-1 agreement. Also the
 * decode budget's table: recompression while a long continuation runs. */
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

/* ---- teacher-forced evaluation at one prefill length ---------------------- */

/* Window w of o->windows over the text: prefills its P context tokens into
 * store A (stores[0], table) capturing the last n_cap queries (uploaded for
 * SnapKV), teacher-forces its C continuation tokens in A itself (slots >= P
 * are never read by a compaction, which copies slots < P only) and fills ref
 * with the whole cache's predictions, added to *full. *cont and *targets:
 * the continuation and the tokens it predicts. */
int ev_window_reference(ev *e, dp_kv_store *const *stores, const int32_t *table, int32_t nb,
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
    if ((rc = ev_prefill(e, stores, 0, table, nb, text + off, P, n_cap, NULL)) ||
        (rc = ev_queries_to_backend(e, n_cap)) ||
        (rc = ev_teacher_force(e, stores, 0, table, nb, P, P, *cont, C)))
        return rc;
    memcpy(ref_logits, e->logits, (size_t)C * e->vocab * sizeof(float));
    for (int32_t i = 0; i < C; i++)
        ref->am[i] = ev_log_softmax(ref_logits + (size_t)i * e->vocab, e->vocab, ref->lp + (size_t)i * e->vocab);
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

int n_seeds_of(const opts *o, int sc) { return sc == DP_SCORER_RANDOM ? o->seeds : 1; }

/* Whether the text holds a window of P context tokens and C to predict. */
static bool text_fits(int32_t n_text, int32_t P, int32_t C)
{
    if ((int64_t)P + C + 1 <= n_text)
        return true;
    fprintf(stderr, "dp-eval: the text has %d tokens, fewer than P + %d + 1 = %d\n", n_text, C,
            P + C + 1);
    return false;
}

static int eval_prefill(ev *e, const int32_t *text, int32_t n_text, int32_t P, tf_result *r)
{
    const opts *o = e->o;
    const int32_t C = o->cont;
    if (!text_fits(n_text, P, C))
        return DP_EINVAL;
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
    ref_window rw;
    const int rw_rc = ref_window_init(&rw, C, e->vocab);
    int rc = DP_ENOMEM;
    if (!table || rw_rc)
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
        if ((rc = ev_window_reference(e, stores, table, nb, text, n_text, P, w, n_cap, rw.logits, &rw.ref,
                                   rw.scratch, &r->full, &cont, &targets)))
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
                        (rc = ev_teacher_force(e, stores, 1, table, nb, n_keep, P, cont, C)))
                        goto out2;
                    if (n_keep == P &&
                        memcmp(e->logits, rw.logits, (size_t)C * e->vocab * sizeof(float)) != 0)
                        r->bit_identical = 0;
                    acc_add(&r->a[sc][ri][sd], &rw.ref, e->logits, e->vocab, targets, rw.scratch);
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
    ref_window_free(&rw);
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
        if ((rc = ev_teacher_force_cap(e, stores, 1, tb[cur], nbb, n_slots, P + done, cont + done, len,
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
    if (!text_fits(n_text, P, C))
        return DP_EINVAL;
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
    ref_window rw;
    const int rw_rc = ref_window_init(&rw, C, e->vocab);
    int rc = DP_ENOMEM;
    if (!ta || !tbm || rw_rc)
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
        if ((rc = ev_window_reference(e, stores, ta, nba, text, n_text, P, w, n_cap, rw.logits, &rw.ref,
                                   rw.scratch, &r->full, &cont, &targets)))
            goto out;
        for (int32_t i = 0; i < C; i++)
            r->slots_full += P + i + 1;
        dp_compress_opts co = {DP_SCORER_SNAPKV, o->keep, o->sinks, o->window, 1, 0};
        double sl = 0;
        int64_t nrec = 0;
        if ((rc = budget_run(e, stores, ta, nba, tb, nbb, P, &co, n_cap, 0, cont, targets, &rw.ref,
                             rw.scratch, &r->off, &nrec, &sl)))
            goto out;
        r->slots_off += sl;
        for (int bi = 0; bi < o->n_budgets; bi++) {
            for (int k = 0; k < BUDGET_SCORERS; k++) {
                co.scorer = budget_scorers[k];
                sl = 0;
                if ((rc = budget_run(e, stores, ta, nba, tb, nbb, P, &co, n_cap, o->budgets[bi],
                                     cont, targets, &rw.ref, rw.scratch, &r->a[bi][k],
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
    ref_window_free(&rw);
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

static void tf_cell(sbuf *s, const opts *o, const tf_result *r, int sc, int ri, int what)
{
    double x[MAX_SEEDS];
    int ns = n_seeds_of(o, sc);
    for (int k = 0; k < ns; k++) {
        const acc *a = &r->a[sc][ri][k];
        x[k] = what == 0 ? acc_ppl(a) : what == 1 ? acc_kl(a) : 100.0 * acc_top1(a);
    }
    double m, sd;
    ev_mean_std(x, ns, &m, &sd);
    const char *fmt = what == 0 ? "%.2f" : what == 1 ? "%.4f" : "%.1f";
    sb_printf(s, " ");
    sb_printf(s, fmt, m);
    if (ns > 1 && sd > 0) {
        sb_printf(s, " ± ");
        sb_printf(s, fmt, sd);
    }
    sb_printf(s, " |");
}

void tf_table_header(sbuf *s, const opts *o, const int32_t *n_keep, const double *kept)
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
        tf_table_header(s, o, r->n_keep, NULL);
        for (int sc = 0; sc < N_SCORERS; sc++) {
            sb_printf(s, "| %s%s |", scorer_name((dp_scorer)sc),
                      sc == DP_SCORER_RANDOM && o->seeds > 1 ? " (mean ± sd)" : "");
            for (int ri = 0; ri < o->n_ratios; ri++)
                tf_cell(s, o, r, sc, ri, w);
            sb_printf(s, "\n");
        }
        sb_printf(s, "\n");
    }
}

/* One table at prompt length P: evaluated, then reported into md. */
typedef int (*table_fn)(ev *e, const int32_t *text, int32_t n_text, int32_t P, sbuf *md);

static int budget_table(ev *e, const int32_t *text, int32_t n_text, int32_t P, sbuf *md)
{
    budget_result *r = calloc(1, sizeof *r);
    int rc = r ? eval_budget(e, text, n_text, P, r) : DP_ENOMEM;
    if (!rc)
        report_budget(md, e->o, P, r);
    free(r);
    return rc;
}

static int tf_table(ev *e, const int32_t *text, int32_t n_text, int32_t P, sbuf *md)
{
    tf_result *r = calloc(1, sizeof *r);
    int rc = r ? eval_prefill(e, text, n_text, P, r) : DP_ENOMEM;
    if (!rc)
        report_tf(md, e->o, P, r);
    free(r);
    return rc;
}

/* fn's table at every --prefill length, each printed as soon as it exists. */
static int each_prefill(ev *e, const int32_t *text, int32_t n_text, sbuf *md, table_fn fn)
{
    for (int pi = 0; pi < e->o->n_prefill; pi++) {
        int rc = fn(e, text, n_text, e->o->prefill[pi], md);
        if (rc)
            return rc;
        sb_flush(md);
    }
    return 0;
}

int run_budget(ev *e, const int32_t *text, int32_t n_text, sbuf *md)
{
    return each_prefill(e, text, n_text, md, budget_table);
}

int run_tf(ev *e, const int32_t *text, int32_t n_text, sbuf *md)
{
    return each_prefill(e, text, n_text, md, tf_table);
}
