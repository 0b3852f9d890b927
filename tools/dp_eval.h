/* dp_eval.h: what the files of the quality evaluator (dp-eval) share: its
 * options, the evaluation context, chat sets (prompts prefilled once, then
 * compacted and generated once per grid cell) and the decode-type grid.
 * dp_eval.c holds the teacher-forced and chat checks and the reports;
 * eval_retrieval.c the retrieval checks (passkey, multi-key needles in real
 * text, the question seen before or after compaction). */
#ifndef DP_TOOLS_DP_EVAL_H
#define DP_TOOLS_DP_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dp.h"
#include "kvcache/compress.h"
#include "kvcache/migrate.h"
#include "model/gguf.h"
#include "model/llama.h"
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
    dp_gguf g;
    dp_backend *be;
    dp_llama *m;
    dp_tokenizer *tok;
    const dp_hparams *hp;
    dp_kv_migrator mig; /* the manager's migration (kvcache/migrate.h) */
    int32_t vocab, qd;
    float *q_dev;    /* backend copy of the captured queries */
    float *q_host;   /* [n_layers][DP_MAX_CAPTURE][qd] */
    int32_t *bt_tokens, *bt_pos, *bt_seq, *bt_slot, *bt_out, *bt_cap;
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
