/* dp_eval.h: what the files of the quality evaluator (dp-eval) share: its
 * options, the evaluation context, chat sets (prompts prefilled once, then
 * compacted and generated once per grid cell) and the decode-type grid.
 * One file per table family:
 *   dp_eval.c        options, opening the model, the document's section
 *   eval_forward.c   prefill / teacher-force, metrics, the report buffer
 *   eval_tf.c        teacher-forced tables per scorer x keep ratio, and
 *                    the decode budget's
 *   eval_chat.c      chat sets and the greedy-agreement table
 *   eval_grid.c      the decode-type x keep-ratio grid (--grid)
 *   eval_grouped.c   grouped decode types' tables
 *   eval_retrieval.c the grid's retrieval columns (passkey, multi-key
 *                    needles in real text, the question seen before or
 *                    after compaction) */
#ifndef DP_TOOLS_DP_EVAL_H
#define DP_TOOLS_DP_EVAL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dp.h"
#include "kernels/batch.h"
#include "kvcache/compress.h"
#include "kvcache/migrate.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/loader.h"
#include "model/tokenizer.h"

#define BT 16          /* block tokens of both stores */
#define CHUNK 512      /* prefill tokens per step */
#define MAX_RATIOS 16
#define MAX_SEEDS 16
#define N_SCORERS (DP_SCORER_RANDOM + 1)
#define MAX_DTYPES 8   /* decode types of one grid (simulated ones included) */
#define MAX_LENS 8     /* prompt lengths of one retrieval column set */

typedef struct opts {
    const char *model, *text, *device, *markdown, *tag;
    int32_t prefill[8];
    int n_prefill;
    int32_t cont;        /* teacher-forced tokens */
    int32_t offset;      /* first window's token offset in the text */
    int windows;         /* context windows averaged per P */
    float ratios[MAX_RATIOS];
    int n_ratios;
    int seeds;           /* random scorer: seeds 1..seeds */
    int32_t sinks, window;
    int chat;            /* chat prompts (0: skip the greedy check) */
    int32_t gen;         /* greedy tokens per chat prompt */
    int threads;
    int kv_type;         /* dp_kv_type of the prefill store (and the decode store's default) */
    int dkv_type;        /* dp_kv_type of the compacted (decode-path) store */
    bool grid;           /* the decode-type x keep-ratio table instead (--grid) */
    int dtypes[MAX_DTYPES]; /* dp_kv_type, or a simulated type (tools/kv_sim.h) */
    int n_dtypes;
    int32_t kivi_group;  /* simulated KIVI: key group in slots */
    int32_t passkey[MAX_LENS]; /* --grid: passkey prompt lengths */
    int n_passkey;
    int depths;          /* passkey depths per length */
    int32_t niah[MAX_LENS]; /* --grid: multi-key needle prompt lengths (real text) */
    int n_niah;
    int trials;          /* needle prompts per length (and per mode) */
    int needles;         /* needles per prompt, one of them asked for */
    dp_scorer scorer;    /* --grid: the scorer (the daemon's default) */
    int32_t budgets[8];  /* --budget: decode budgets evaluated (their own tables) */
    int n_budgets;
    float keep;          /* --budget: the keep ratio of the prompt's migration */
    int32_t exempt;      /* --grid: exempt layers (the first layers keep every token) */
    int32_t early;       /* --grid: also the early switch at this many prompt tokens (0: no) */
} opts;

typedef struct acc {
    double nll, kl;
    long agree, n;
} acc;

typedef struct ev {
    const opts *o;
    dp_model_files mf;  /* the model opened whole; be, m, tok and g are its */
    dp_gguf *g;
    dp_backend *be;
    dp_llama *m;
    dp_tokenizer *tok;
    const dp_hparams *hp;
    dp_kv_migrator mig; /* the manager's migration (kvcache/migrate.h) */
    int32_t vocab, qd;
    float *q_dev;    /* backend copy of the captured queries */
    float *q_host;   /* [n_layers][DP_MAX_CAPTURE][qd] */
    dp_batch_buf bb; /* one sequence's batches: CHUNK tokens (or more), DP_MAX_CAPTURE captures */
    float *logits;   /* [max_out * vocab] */
    /* A grouped decode type's batch arrays (dp_batch seq_sealed, seq_roff;
     * NULL: none), included by every batch dp-eval builds. */
    const int32_t *g_sealed, *g_roff;
} ev;

typedef struct chat_set {
    int n;
    int32_t gen;            /* greedy tokens per prompt */
    int32_t *len, *base_a, *base_b, *first; /* prompt length, first block in A / B, first token */
    int32_t *split;         /* tokens compacted before the rest is read (len: all of them) */
    int32_t max_blocks_a, max_blocks_b, n_cap;
    int32_t **prompt;
    float **q;              /* captured queries per prompt (host) */
    int32_t *table_a, *table_b; /* [n][max_blocks] */
    dp_kv_store *stores[DP_KV_MAX_STORES];
    int sim_type;           /* the compacted store holds a simulated type (0: none) */
    struct gtab *gt;        /* a grouped type: stores[1] is its view (NULL: none) */
} chat_set;

/* One row of the grid: a decode-path KV type at a keep ratio, the
 * configured scorer. */
typedef struct grid_cell {
    acc tf[8];              /* teacher-forced, per --prefill length */
    int32_t n_keep[8];
    int chat_ident;
    double chat_prefix;
    int pk_hits[MAX_LENS];  /* passkey prompts answered, per length */
    int niah_hits[MAX_LENS][2]; /* needles given back, per length, query-aware / -agnostic */
} grid_cell;

typedef struct grid_result {
    grid_cell c[MAX_DTYPES][MAX_RATIOS];
    grid_cell ce[MAX_DTYPES][MAX_RATIOS]; /* --early: switched early (teacher-forced only) */
    int noise_ident;        /* the whole cache, each prompt alone vs all in one batch */
    double noise_prefix;
    acc full[8];
    int pk_full[MAX_LENS];  /* the uncompressed cache's own passkey hits */
    int niah_full[MAX_LENS][2]; /* ... and needle hits */
    double niah_len[MAX_LENS]; /* mean needle prompt length in tokens */
    double bytes[MAX_DTYPES]; /* bytes per token relative to the f16 prefill path */
    int32_t dbt[MAX_DTYPES];  /* tokens per arena block on the decode path (0: simulated) */
    double chat_len, seconds;
    int chat_n;
    int32_t n_layers;
} grid_result;

/* ---- forward passes and metrics (eval_forward.c) --------------------------- */

/* Reference log-probabilities and argmaxes of the full cache, per row. */
typedef struct ref_rows {
    double *lp;      /* [n][vocab] */
    double *p;       /* exp(lp) */
    int32_t *am;
    int32_t n;
} ref_rows;

typedef struct sbuf {
    char *p;
    size_t n, cap;
    size_t shown; /* bytes already printed (sb_flush) */
} sbuf;

void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints what was appended since the last flush (a full run takes a while:
 * each table shows as soon as it exists). */
void sb_flush(sbuf *s);

/* Prefills tokens [0, n) of one sequence into stores[si] (slot = position),
 * in steps of at most CHUNK tokens; the last step's n_cap tokens have their
 * queries captured (e->q_host); last_logits, if set, gets the last token's. */
int ev_prefill(ev *e, dp_kv_store *const *stores, uint8_t si, const int32_t *table,
               int32_t max_blocks, const int32_t *tokens, int32_t n, int32_t n_cap,
               float *last_logits);
/* Teacher-forces n tokens after n_keep slots holding positions [0, pos0):
 * token i to slot n_keep + i at pos0 + i, capturing the last n_cap queries;
 * every token's logits land in e->logits. */
int ev_teacher_force_cap(ev *e, dp_kv_store *const *stores, uint8_t si, const int32_t *table,
                         int32_t max_blocks, int32_t n_keep, int32_t pos0, const int32_t *tokens,
                         int32_t n, int32_t n_cap);
int ev_teacher_force(ev *e, dp_kv_store *const *stores, uint8_t si, const int32_t *table,
                     int32_t max_blocks, int32_t n_keep, int32_t pos0, const int32_t *tokens,
                     int32_t n);
/* Uploads the captured queries of n_cap tokens for the attention scorer. */
int ev_queries_to_backend(ev *e, int32_t n_cap);
/* An exempt layers' store beside a decode store of layout lb (NULL without
 * exempt layers), and a batch's exempt arrays pointed at store *xsi. */
int ev_exempt_store(ev *e, const dp_kv_layout *lb, dp_kv_store **out);
void ev_with_exempt(ev *e, dp_batch *b, const uint8_t *xsi, const int32_t *tables,
                    int32_t max_blocks);
int32_t ev_argmax(const float *row, int32_t n);
/* log-softmax of one row into out; returns the argmax. */
int32_t ev_log_softmax(const float *x, int32_t n, double *out);
/* Rows for n predictions (all NULL when memory ran out). */
ref_rows ref_rows_new(int32_t n, int32_t vocab);
void ref_rows_free(ref_rows *r);
/* What a teacher-forced window's reference needs: the whole cache's n rows
 * of logits, a row of scratch and the reference rows (ev_window_reference). */
typedef struct ref_window {
    float *logits;
    double *scratch;
    ref_rows ref;
} ref_window;
/* DP_ENOMEM with every member NULL when one is missing. */
int ref_window_init(ref_window *w, int32_t n, int32_t vocab);
void ref_window_free(ref_window *w);
/* Adds ref->n predictions (logits) against the reference rows to a. */
void acc_add(acc *a, const ref_rows *ref, const float *logits, int32_t vocab,
             const int32_t *targets, double *scratch);
static inline double acc_ppl(const acc *a) { return exp(a->nll / (double)a->n); }
static inline double acc_kl(const acc *a) { return a->kl / (double)a->n; }
static inline double acc_top1(const acc *a) { return (double)a->agree / (double)a->n; }
void ev_mean_std(const double *x, int n, double *mean, double *sd);
/* Length of the common prefix of two greedy outputs of n tokens. */
int32_t ev_same_prefix(const int32_t *a, const int32_t *b, int32_t n);

/* ---- the tables (each appends its markdown to md and prints it) ------------- */

/* Teacher-forced, per scorer x keep ratio, at every --prefill length. */
int run_tf(ev *e, const int32_t *text, int32_t n_text, sbuf *md);
/* Recompression under each --budget, at every --prefill length. */
int run_budget(ev *e, const int32_t *text, int32_t n_text, sbuf *md);
/* Greedy agreement on --chat prompts. */
int run_chat(ev *e, const int32_t *text, int32_t n_text, sbuf *md, char *err, size_t errsz);
/* The decode-type grid (--grid). */
int run_grid(ev *e, const int32_t *text, int32_t n_text, sbuf *md, char *err, size_t errsz);
/* The full-cache reference of teacher-forcing window w at prompt length P
 * (eval_tf.c; the grid's teacher-forced columns use it too). */
int ev_window_reference(ev *e, dp_kv_store *const *stores, const int32_t *table, int32_t nb,
                        const int32_t *text, int32_t n_text, int32_t P, int w, int32_t n_cap,
                        float *ref_logits, ref_rows *ref, double *scratch, acc *full,
                        const int32_t **cont, const int32_t **targets);
/* Random-scorer seeds of scorer sc (1 for the others). */
int n_seeds_of(const opts *o, int sc);
/* A header row of keep-ratio columns (n_keep or kept, whichever is set). */
void tf_table_header(sbuf *s, const opts *o, const int32_t *n_keep, const double *kept);

/* ---- chat sets ------------------------------------------------------------ */

/* Prefills n conversations into store A (type o->kv_type), keeping each
 * one's captured queries; store B (type btype) holds each compacted prompt,
 * what follows it and gen generated tokens. Without questions, a
 * conversation is one user message. With them, it is msgs[i], a short
 * assistant acknowledgement, then questions[i]: compacted whole with the
 * question's queries (query-aware), or, with agnostic, compacted at the end
 * of msgs[i] and the rest read after the compaction, as a parked turn is. */
int chat_build(ev *e, char *const *msgs, char *const *questions, bool agnostic, int n, int32_t gen,
               int32_t btype, chat_set *cs, char *err, size_t errsz);
void chat_destroy(ev *e, chat_set *cs);
/* The greedy check's prompts: n passages of 300..700 tokens spread over the
 * text, each with a question; *msgs: n user messages (free each). */
int chat_passages(ev *e, const int32_t *text, int32_t n_text, int n, char ***msgs, char *err,
                  size_t errsz);
/* Compacts every prompt of cs into store B with co (kept: mean fraction
 * kept), reads the rest after it, and generates cs->gen greedy tokens for
 * all of them in lockstep into out (cs->n x cs->gen). */
int chat_generate(ev *e, chat_set *cs, const dp_compress_opts *co, int32_t *out, double *kept);
/* Frees the compacted store (and its exempt layers' store). */
void chat_drop_btype(ev *e, chat_set *cs);

/* score(cs, ref, got, cell, ud) reads one cell's greedy outputs against
 * the whole cache's. */
typedef void (*grid_score_fn)(ev *e, const chat_set *cs, const int32_t *ref, const int32_t *got,
                              grid_cell *c, void *ud);
/* Generates every grid cell over one chat set; ref receives the whole
 * cache's outputs (cs->n x cs->gen). */
int grid_generate(ev *e, chat_set *cs, grid_result *g, grid_score_fn score, int32_t *ref, void *ud);

/* ---- a grouped decode type (eval_grouped.c) ----------------------------- */

typedef struct gtab {
    dp_kv_store *arena;      /* f16, the identity tables' blocks, then the groups' */
    dp_kv_store *view;       /* the grouped type over it (what batches address) */
    int32_t G, bt;           /* tokens per group; per arena block */
    int32_t n_ident, next, end; /* identity blocks; the next group block; past the last */
    size_t rows;             /* layers x KV heads */
    int32_t *keep;           /* [rows][G]: a seal's kept lists */
} gtab;

/* One sequence: its identity table and its batch row (n_ident entries). */
typedef struct gseq {
    const int32_t *ident;
    int32_t n_ident;
    int32_t *row, n_row;
    int32_t sealed, roff;
} gseq;

/* arena: the identity tables' geometry (its type is taken as f16), with
 * extra_blocks more for groups. */
int gtab_init(gtab *g, ev *e, const dp_kv_layout *arena, int32_t extra_blocks);
void gtab_destroy(gtab *g, ev *e);
/* A sequence just migrated into its identity table (s->row: caller's). */
void gtab_start(const gtab *g, gseq *s, const int32_t *ident, int32_t n_ident);
/* Seals its whole groups of n_slots filled slots and rebuilds its row. */
int gtab_seal(gtab *g, ev *e, gseq *s, int32_t n_slots);
/* The slot count at which its open group is sealed (as the manager seals). */
int32_t gtab_next_seal(const gtab *g, const gseq *s);

/* ---- retrieval (eval_retrieval.c) ----------------------------------------- */

/* Passkey retrieval at o->passkey[li] tokens. */
int grid_passkey(ev *e, int li, grid_result *g, char *err, size_t errsz);
/* Multi-key needles in the real text at o->niah[li] tokens, query-aware
 * and query-agnostic. */
int grid_niah(ev *e, const int32_t *text, int32_t n_text, int li, grid_result *g, char *err,
              size_t errsz);

#endif
