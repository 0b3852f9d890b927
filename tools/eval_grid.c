/* eval_grid.c: the decode-type x keep-ratio grid (--grid): for each type
 * the daemon can decode in (and simulated ones) at each keep ratio, the
 * teacher-forced metrics, greedy chat agreement, passkey and multi-key
 * needle retrieval, bytes per token, and the rule that picks the default. */
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
        if ((rc = ev_teacher_force(e, st, 1, s.row, nb, slots, P + i, cont + i, len)))
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
    /* The rest of the prompt on the decode path, in chunks as ev_prefill() cuts
     * them; the last one's last n_cap queries captured. */
    static const uint8_t si = 1;
    for (int32_t done = S; rc == 0 && done < P;) {
        int32_t len = P - done < CHUNK ? P - done : CHUNK;
        const bool last = done + len == P;
        const int32_t cap = last ? (n_cap < len ? n_cap : len) : 0;
        for (int32_t i = 0; i < len; i++) {
            e->bb.tokens[i] = prompt[done + i];
            e->bb.pos[i] = e->bb.slot[i] = done + i;
            e->bb.seq[i] = 0;
        }
        for (int32_t i = 0; i < cap; i++)
            e->bb.capture[i] = len - cap + i;
        dp_batch bb = {.n_tokens = len, .tokens = e->bb.tokens, .pos = e->bb.pos,
                       .seq = e->bb.seq, .slot = e->bb.slot, .n_seqs = 1, .seq_store = &si,
                       .block_tables = table, .max_blocks = nb, .n_out = 0,
                       .out_tokens = e->bb.out, .n_capture = cap, .capture_tokens = e->bb.capture};
        rc = llama_forward(e->m, &bb, st, e->logits);
        if (rc == 0 && cap > 0)
            rc = e->be->ops->download(e->be, e->q_host, llama_captured_queries(e->m),
                                      (size_t)e->hp->n_layers * (size_t)cap * (size_t)e->qd *
                                          sizeof(float));
        done += len;
    }
    if (rc == 0)
        rc = ev_queries_to_backend(e, n_cap);
    const int32_t n_keep = compress_n_keep(co, P);
    dp_kv_move end = {.co = co, .src = table, .n_src_blocks = (P + BT - 1) / BT, .n_slots = P,
                      .dst = table, .n_dst_blocks = nb, .n_keep = n_keep, .q = e->q_dev,
                      .q_stride = (int64_t)n_cap * e->qd, .n_q = n_cap};
    if (rc == 0)
        rc = kv_migrate(&e->mig, b, b2, &end, 1);
    dp_kv_store *st2[DP_KV_MAX_STORES] = {a, b2, NULL};
    if (rc == 0)
        rc = ev_teacher_force(e, st2, 1, table, nb, n_keep, P, cont, C);
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
        if ((rc = ev_teacher_force(e, stores, 1, table, nb, slots, P + i, cont + i, len)))
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
    ref_window rw;
    const int rw_rc = ref_window_init(&rw, C, e->vocab);
    int rc = DP_ENOMEM;
    if (!table || rw_rc)
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
        if ((rc = e->be->ops->kv_create(e->be, &lb, &b[t])) || (rc = ev_exempt_store(e, &lb, &x[t])) ||
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
        if ((rc = ev_window_reference(e, sa, table, nb, text, n_text, P, w, n_cap, rw.logits, &rw.ref,
                                   rw.scratch, &g->full[pi], &cont, &targets)))
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
                    rc = ev_teacher_force(e, st, 1, table, nb, n_keep, P, cont, C);
                if (rc)
                    goto out;
                acc_add(&g->c[t][ri].tf[pi], &rw.ref, e->logits, e->vocab, targets, rw.scratch);
                if (o->early > 0 && o->early < P) {
                    if ((rc = early_switch_tf(e, a, b[t], b2[t], table, nb, cont - P, P, n_cap, &co,
                                              cont, C)))
                        goto out;
                    g->ce[t][ri].n_keep[pi] = n_keep;
                    acc_add(&g->ce[t][ri].tf[pi], &rw.ref, e->logits, e->vocab, targets, rw.scratch);
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
    ref_window_free(&rw);
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
    return rc ? rc : ev_exempt_store(e, &lb, &cs->stores[2]);
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
        int32_t k = ev_same_prefix(got + (size_t)i * cs->gen, ref + (size_t)i * cs->gen, cs->gen);
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
        int32_t k = ev_same_prefix(got, ref + (size_t)i * cs->gen, cs->gen);
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

int run_grid(ev *e, const int32_t *text, int32_t n_text, sbuf *md, char *err, size_t errsz)
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
