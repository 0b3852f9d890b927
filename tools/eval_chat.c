/* eval_chat.c: chat sets (prompts prefilled once, then compacted and
 * generated once per cell) and the greedy-agreement table: the same greedy
 * answer as the whole cache's, token for token, per scorer x keep ratio. */
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
int chat_passages(ev *e, const int32_t *text, int32_t n_text, int n, char ***msgs, char *err,
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
    int rc = chat_template_init_model(&ct, NULL, 0, e->g, e->tok, err, errsz);
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
        if ((rc = ev_prefill(e, cs->stores, 0, cs->table_a + (size_t)i * cs->max_blocks_a, cs->max_blocks_a,
                          cs->prompt[i], cs->split[i], cs->n_cap, e->logits + (size_t)e->vocab)))
            return dp_err(err, errsz, rc, "chat prefill failed");
        cs->first[i] = cs->split[i] == cs->len[i] ? ev_argmax(e->logits + (size_t)e->vocab, e->vocab) : -1;
        if (!(cs->q[i] = malloc(qn * sizeof(float))))
            return dp_err(err, errsz, DP_ENOMEM, "out of memory");
        memcpy(cs->q[i], e->q_host, qn * sizeof(float));
    }
    return 0;
}

/* Frees the compacted store (and its exempt layers' store). */
void chat_drop_btype(ev *e, chat_set *cs)
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
            e->bb.tokens[k] = cs->prompt[i][done + k];
            e->bb.pos[k] = done + k;
            e->bb.slot[k] = n_keep + done - cs->split[i] + k;
            e->bb.seq[k] = 0;
        }
        e->bb.out[0] = n - 1;
        dp_batch b = {.n_tokens = n, .tokens = e->bb.tokens, .pos = e->bb.pos, .seq = e->bb.seq,
                      .slot = e->bb.slot, .n_seqs = 1, .seq_store = &si, .block_tables = table,
                      .max_blocks = cs->max_blocks_b, .n_out = 1, .out_tokens = e->bb.out,
                      .seq_sealed = e->g_sealed, .seq_roff = e->g_roff};
        if (cs->stores[2])
            ev_with_exempt(e, &b, x_store, table, cs->max_blocks_b);
        int rc = llama_forward(e->m, &b, cs->stores, e->logits);
        if (rc)
            return rc;
        done += n;
    }
    *first = ev_argmax(e->logits, e->vocab);
    return 0;
}

/* Compresses every chat prompt's split with one option set (n_keep per
 * prompt from keep_ratio), reads the rest of each prompt after it, and
 * generates gen greedy tokens for all of them in lockstep, one token per
 * live sequence per step. After an end-of-generation token a sequence
 * stops and its output is padded with that token. */
int chat_generate(ev *e, chat_set *cs, const dp_compress_opts *co, int32_t *out, double *kept)
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
        if ((rc = ev_queries_to_backend(e, cs->n_cap)) ||
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
            e->bb.tokens[nt] = out[(size_t)i * cs->gen + t - 1];
            e->bb.pos[nt] = cs->len[i] + t - 1;
            e->bb.slot[nt] = slot0[i] + t - 1;
            e->bb.seq[nt] = i;
            e->bb.out[nt] = nt;
            nt++;
        }
        if (nt == 0)
            continue;
        for (int i = 0; gt && i < n; i++) {
            gsealed[i] = gs[i].sealed;
            groff[i] = gs[i].roff;
        }
        dp_batch b = {.n_tokens = nt, .tokens = e->bb.tokens, .pos = e->bb.pos, .seq = e->bb.seq,
                      .slot = e->bb.slot, .n_seqs = n, .seq_store = seq_store,
                      .block_tables = gt ? grows : cs->table_b, .max_blocks = cs->max_blocks_b,
                      .n_out = nt, .out_tokens = e->bb.out, .seq_sealed = gt ? gsealed : NULL,
                      .seq_roff = gt ? groff : NULL};
        if (cs->stores[2])
            ev_with_exempt(e, &b, x_store, cs->table_b, cs->max_blocks_b);
        if ((rc = llama_forward(e->m, &b, cs->stores, e->logits)))
            goto out;
        for (int32_t k = 0; k < nt; k++) {
            int i = e->bb.seq[k];
            int32_t am = ev_argmax(e->logits + (size_t)k * e->vocab, e->vocab);
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
int32_t ev_same_prefix(const int32_t *a, const int32_t *b, int32_t n)
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
                    int32_t k = ev_same_prefix(got + (size_t)i * o->gen, ref + (size_t)i * o->gen, o->gen);
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

static void report_chat(sbuf *s, const opts *o, const chat_result *r)
{
    sb_printf(s, "### Greedy agreement on %d chat prompts\n\n", r->n);
    sb_printf(s, "Prompts of %.0f tokens on average (a 300–700-token passage of the text and a "
                 "question, in the model's chat template); %d greedy tokens each; cell: prompts "
                 "whose %d tokens are identical to the full cache / mean length of the identical "
                 "prefix. Columns: keep ratio (mean fraction kept, with the sinks + window floor). "
                 "%.0f s.\n\n",
              r->mean_len, o->gen, o->gen, r->seconds);
    tf_table_header(s, o, NULL, r->kept);
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
            ev_mean_std(id, ns, &m1, &s1);
            ev_mean_std(pre, ns, &m2, &s2);
            if (ns > 1 && (s1 > 0 || s2 > 0))
                sb_printf(s, " %.1f ± %.1f / %.1f ± %.1f |", m1, s1, m2, s2);
            else
                sb_printf(s, " %.0f/%d / %.1f |", m1, r->n, m2);
        }
        sb_printf(s, "\n");
    }
    sb_printf(s, "\n");
}

int run_chat(ev *e, const int32_t *text, int32_t n_text, sbuf *md, char *err, size_t errsz)
{
    chat_result *cr = calloc(1, sizeof *cr);
    if (!cr)
        return DP_ENOMEM;
    int rc = eval_chat(e, text, n_text, cr, NULL, err, errsz);
    if (!rc) {
        report_chat(md, e->o, cr);
        sb_flush(md);
    }
    free(cr);
    return rc;
}
