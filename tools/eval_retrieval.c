/* eval_retrieval.c: dp-eval's retrieval checks, each a column of the
 * decode-type grid (dp_eval.h): passkey retrieval in repeated filler, and
 * several needles in the evaluated real text, the question read before the
 * compaction (query-aware) or after it (query-agnostic, as a parked turn's
 * next question is). Every check greedily generates through the grid's
 * cells and counts the answers that contain what was asked for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/dp_eval.h"

/* One step of a 64-bit LCG: the prompts are the same on every run. */
static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 20;
}

/* Passkey retrieval (Mohtashami & Jaggi's task): a 5-7 digit key stated once
 * at one of `depths` depths in filler text, the model asked to repeat it;
 * an answer counts when its first tokens contain the key. */
#define PK_GEN 16
static const char PK_FILLER[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";

typedef struct pk_ctx {
    int li;             /* length index */
    char keys[16][12];
    int *full_hits;
} pk_ctx;

/* Whether the first n_gen greedy tokens (up to an end of generation)
 * contain key. */
static bool answered(ev *e, const int32_t *toks, int32_t n_gen, const char *key)
{
    char *txt = NULL;
    size_t n = 0;
    int32_t len = 0;
    while (len < n_gen && !tokenizer_is_eog(e->tok, toks[len]))
        len++;
    if (tokenizer_decode(e->tok, toks, (size_t)len, false, &txt, &n) != 0)
        return false;
    bool hit = strstr(txt, key) != NULL;
    free(txt);
    return hit;
}

static void score_pk(ev *e, const chat_set *cs, const int32_t *ref, const int32_t *got, grid_cell *c,
                     void *ud)
{
    pk_ctx *p = ud;
    for (int i = 0; i < cs->n; i++) {
        bool hit = answered(e, got + (size_t)i * cs->gen, PK_GEN, p->keys[i]);
        c->pk_hits[p->li] += hit;
        if (getenv("DP_EVAL_VERBOSE")) {
            char *txt = NULL;
            size_t n = 0;
            if (tokenizer_decode(e->tok, got + (size_t)i * cs->gen, PK_GEN, false, &txt, &n) == 0)
                fprintf(stderr, "dp-eval: passkey %s %s: %.*s\n", p->keys[i], hit ? "hit" : "miss",
                        (int)strcspn(txt, "\n"), txt);
            free(txt);
        }
    }
}

int grid_passkey(ev *e, int li, grid_result *g, char *err, size_t errsz)
{
    const opts *o = e->o;
    const int32_t L = o->passkey[li];
    const int n = o->depths;
    int32_t *ft = NULL;
    size_t nft = 0;
    int rc = tokenizer_encode(e->tok, PK_FILLER, strlen(PK_FILLER), false, false, &ft, &nft);
    free(ft);
    if (rc || nft == 0)
        return dp_err(err, errsz, rc ? rc : DP_EINVAL, "cannot tokenize the filler");
    /* About 60 tokens go to the instructions, the key and the template. */
    int reps = (int)((L - 60) / (int32_t)nft);
    if (reps < 1)
        reps = 1;
    pk_ctx p = {.li = li};
    char **msgs = calloc((size_t)n, sizeof *msgs);
    if (!msgs)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    uint64_t x = 0x5eed0000u + (uint64_t)L;
    for (int i = 0; i < n && !rc; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int digits = 5 + (int)((x >> 33) % 3);
        uint64_t lo = 1, k;
        for (int d = 1; d < digits; d++)
            lo *= 10;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        k = lo + (x >> 20) % (9 * lo);
        snprintf(p.keys[i], sizeof p.keys[i], "%llu", (unsigned long long)k);
        int at = n > 1 ? reps * i / (n - 1) : 0;
        size_t cap = (size_t)reps * sizeof PK_FILLER + 512;
        char *m = malloc(cap);
        if (!m) {
            rc = DP_ENOMEM;
            break;
        }
        size_t w = (size_t)snprintf(m, cap, "There is an important pass key hidden inside a lot of "
                                    "irrelevant text. Find it and memorize it. I will quiz you about "
                                    "the pass key.\n\n");
        for (int r = 0; r <= reps; r++) {
            if (r == at)
                w += (size_t)snprintf(m + w, cap - w, "The pass key is %s. Remember it. %s is the "
                                      "pass key. ", p.keys[i], p.keys[i]);
            if (r < reps)
                w += (size_t)snprintf(m + w, cap - w, "%s", PK_FILLER);
        }
        snprintf(m + w, cap - w, "\n\nWhat is the pass key?");
        msgs[i] = m;
    }
    chat_set cs;
    memset(&cs, 0, sizeof cs);
    int32_t *ref = NULL;
    if (!rc)
        rc = chat_build(e, msgs, NULL, false, n, PK_GEN, o->kv_type, &cs, err, errsz);
    for (int i = 0; i < n; i++)
        free(msgs[i]);
    free(msgs);
    if (!rc && !(ref = malloc((size_t)n * PK_GEN * sizeof *ref)))
        rc = DP_ENOMEM;
    if (!rc)
        rc = grid_generate(e, &cs, g, score_pk, ref, &p);
    if (!rc)
        for (int i = 0; i < n; i++)
            g->pk_full[li] += answered(e, ref + (size_t)i * PK_GEN, PK_GEN, p.keys[i]);
    if (!rc) {
        double mean = 0;
        for (int i = 0; i < n; i++)
            mean += (double)cs.len[i] / n;
        fprintf(stderr, "dp-eval: grid: passkey %d (prompts of %.0f tokens): full cache %d/%d\n", L,
                mean, g->pk_full[li], n);
    }
    free(ref);
    chat_destroy(e, &cs);
    return rc ? dp_err(err, errsz, rc, "passkey evaluation failed") : 0;
}


/* ---- multi-key needles in real text ---------------------------------------- */

/* Needles "The special magic number for <key> is <value>." at evenly spread
 * depths of a passage of the evaluated text (real prose, no sentence said
 * twice), the model asked for one of them while the others distract (the
 * multi-key task of RULER). Trial t asks needle t % needles and rotates the
 * depth each needle holds, so every depth is asked. */
#define NIAH_GEN 32
#define NIAH_MAX_NEEDLES 8
static const char *const NIAH_KEYS[] = {
    "apple",  "harbor", "violet", "copper",  "lantern", "meadow", "falcon", "glacier",
    "orchid", "saddle", "walnut", "canyon",  "pepper",  "quartz", "ember",  "thimble",
};
#define N_NIAH_KEYS ((int)(sizeof NIAH_KEYS / sizeof NIAH_KEYS[0]))

typedef struct niah_ctx {
    int li, mode;       /* length index; 0 query-aware, 1 query-agnostic */
    char (*values)[12]; /* the value asked for, per trial */
} niah_ctx;

/* The first sentence or line boundary at or after byte at of s (its end
 * if none): a needle goes there so that no sentence of the text is cut. */
static size_t boundary(const char *s, size_t n, size_t at)
{
    for (size_t i = at; i + 1 < n; i++)
        if ((s[i] == '.' && s[i + 1] == ' ') || s[i] == '\n')
            return i + 1;
    return n;
}

/* Trial t's document (a passage of about plen tokens at offset off of the
 * text, needles inserted) and question. */
static int niah_prompt(ev *e, const int32_t *text, int32_t off, int32_t plen, int t, int needles,
                       uint64_t *x, char **doc, char **question, char value[12])
{
    char *passage = NULL;
    size_t n = 0;
    int rc = tokenizer_decode(e->tok, text + off, (size_t)plen, false, &passage, &n);
    if (rc)
        return rc;
    char vals[NIAH_MAX_NEEDLES][12];
    int key0 = (t * needles) % N_NIAH_KEYS;
    for (int k = 0; k < needles; k++)
        snprintf(vals[k], sizeof vals[k], "%llu", (unsigned long long)(1000000 + lcg(x) % 9000000));
    size_t cap = n + (size_t)needles * 96 + 512, w = 0, from = 0;
    char *m = malloc(cap);
    if (!m) {
        free(passage);
        return DP_ENOMEM;
    }
    w += (size_t)snprintf(m, cap, "Read the following text carefully. Hidden in it are special "
                          "magic numbers, each for a different word. Memorize them: I will ask you "
                          "about them.\n\n");
    for (int d = 0; d < needles; d++) { /* depth d holds needle (d + t) % needles */
        int k = (d + t) % needles;
        size_t at = boundary(passage, n, n * (2 * (size_t)d + 1) / (2 * (size_t)needles));
        w += (size_t)snprintf(m + w, cap - w, "%.*s The special magic number for %s is %s.",
                              (int)(at - from), passage + from, NIAH_KEYS[(key0 + k) % N_NIAH_KEYS],
                              vals[k]);
        from = at;
    }
    snprintf(m + w, cap - w, "%.*s", (int)(n - from), passage + from);
    free(passage);
    int asked = t % needles;
    size_t qcap = 128;
    char *q = malloc(qcap);
    if (!q) {
        free(m);
        return DP_ENOMEM;
    }
    snprintf(q, qcap, "What is the special magic number for %s? Answer with the number only.",
             NIAH_KEYS[(key0 + asked) % N_NIAH_KEYS]);
    memcpy(value, vals[asked], 12);
    *doc = m;
    *question = q;
    return 0;
}

static void score_niah(ev *e, const chat_set *cs, const int32_t *ref, const int32_t *got,
                       grid_cell *c, void *ud)
{
    (void)ref;
    niah_ctx *p = ud;
    for (int i = 0; i < cs->n; i++)
        c->niah_hits[p->li][p->mode] += answered(e, got + (size_t)i * cs->gen, NIAH_GEN, p->values[i]);
}

int grid_niah(ev *e, const int32_t *text, int32_t n_text, int li, grid_result *g, char *err,
              size_t errsz)
{
    const opts *o = e->o;
    const int32_t L = o->niah[li];
    const int n = o->trials;
    /* About 50 tokens go to the instructions and the template, 16 to a needle. */
    int32_t plen = L - 50 - 16 * o->needles;
    if (plen < 64 || plen >= n_text)
        return dp_err(err, errsz, DP_EINVAL, "needle prompts of %d tokens need a text of more "
                      "than %d tokens (it has %d)", L, plen, n_text);
    char **docs = calloc((size_t)n, sizeof *docs), **qs = calloc((size_t)n, sizeof *qs);
    char (*values)[12] = calloc((size_t)n, sizeof *values);
    int32_t *ref = malloc((size_t)n * NIAH_GEN * sizeof *ref);
    int rc = docs && qs && values && ref ? 0 : DP_ENOMEM;
    uint64_t x = 0x4e1a0000u + (uint64_t)L;
    for (int t = 0; t < n && !rc; t++) {
        int32_t off = 1 + (int32_t)((int64_t)(n_text - 1 - plen) * t / (n > 1 ? n - 1 : 1));
        rc = niah_prompt(e, text, off, plen, t, o->needles, &x, &docs[t], &qs[t], values[t]);
    }
    for (int mode = 0; mode < 2 && !rc; mode++) {
        chat_set cs;
        memset(&cs, 0, sizeof cs);
        niah_ctx p = {.li = li, .mode = mode, .values = values};
        rc = chat_build(e, docs, qs, mode == 1, n, NIAH_GEN, o->kv_type, &cs, err, errsz);
        if (!rc)
            rc = grid_generate(e, &cs, g, score_niah, ref, &p);
        for (int t = 0; t < n && !rc; t++)
            g->niah_full[li][mode] += answered(e, ref + (size_t)t * NIAH_GEN, NIAH_GEN, values[t]);
        if (!rc && mode == 0) {
            for (int t = 0; t < n; t++)
                g->niah_len[li] += (double)cs.len[t] / n;
        }
        if (!rc)
            fprintf(stderr, "dp-eval: grid: %d needles, prompts of %.0f tokens, %s: full cache %d/%d\n",
                    o->needles, g->niah_len[li], mode ? "query-agnostic" : "query-aware",
                    g->niah_full[li][mode], n);
        chat_destroy(e, &cs);
    }
    for (int t = 0; t < n; t++) {
        if (docs)
            free(docs[t]);
        if (qs)
            free(qs[t]);
    }
    free(docs);
    free(qs);
    free(values);
    free(ref);
    return rc ? dp_err(err, errsz, rc, "needle evaluation failed") : 0;
}
