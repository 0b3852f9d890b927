/* workload.h: what dp-loadgen sends: length distributions, prompt sources (random
 * words, a prompt file, a text corpus, shared prefixes, multi-turn chat) and request bodies. */
#ifndef DP_LOADTEST_WORKLOAD_H
#define DP_LOADTEST_WORKLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dp.h"
#include "common/rng.h"

/* ---- random numbers (common/rng.h's generator: reproducible runs) ---- */
double lg_rng_uniform(dp_rng *r);             /* (0, 1] */
uint64_t lg_rng_below(dp_rng *r, uint64_t n); /* [0, n) */
double lg_rng_gamma(dp_rng *r, double shape, double scale);
/* Gap before the next arrival at `rate` req/s: exponential when burstiness == 1
 * (Poisson arrivals), gamma with shape = burstiness otherwise (same mean 1/rate). */
double lg_rng_interarrival(dp_rng *r, double rate, double burstiness);

/* ---- length distributions ---- */

enum { LG_LEN_FIXED, LG_LEN_UNIFORM, LG_LEN_LIST };

typedef struct lg_len_dist {
    int kind;
    int lo, hi;   /* FIXED: lo; UNIFORM: [lo, hi] */
    int *vals;    /* LIST: sampled uniformly */
    size_t n;
} lg_len_dist;

/* "N" fixed, "A:B" uniform in [A, B], "@FILE" one length per line. */
int lg_len_dist_parse(lg_len_dist *d, const char *spec, char *err, size_t errsz);
void lg_len_dist_destroy(lg_len_dist *d);
int lg_len_dist_sample(const lg_len_dist *d, dp_rng *r);
double lg_len_dist_mean(const lg_len_dist *d);
/* Human-readable form for reports ("256", "128:512", "list of 100 (mean 300.5)"). */
void lg_len_dist_describe(const lg_len_dist *d, char *out, size_t outsz);

/* ---- workloads ---- */

enum lg_workload_kind { LG_WL_RANDOM, LG_WL_FILE, LG_WL_CORPUS, LG_WL_PREFIX, LG_WL_CHAT };

typedef struct lg_workload_opts {
    int kind;
    bool chat_api;       /* /v1/chat/completions (messages) instead of /v1/completions (prompt) */
    const char *model;
    bool stream;
    bool include_usage;  /* stream_options.include_usage */
    bool ignore_eos;     /* "ignore_eos": true so that max_tokens is the output length */
    bool no_max_tokens;  /* send no max_tokens: the server's default (chat: the rest of the context) */
    bool min_tokens;     /* also "min_tokens" = max_tokens (vLLM) */
    double temperature;  /* < 0: not sent */
    const char *extra_body; /* JSON object merged into every body, or NULL */
    const char *question;   /* appended to every prompt after a blank line, or NULL */
    const char *prompt_file;
    int prefix_len;      /* LG_WL_PREFIX: words in each shared prefix */
    int num_prefixes;
    int turns;           /* LG_WL_CHAT: user turns per session */
    uint64_t seed;
    lg_len_dist input, output;
} lg_workload_opts;

typedef struct lg_session lg_session;

typedef struct lg_work_item {
    char *body;          /* JSON, malloc'ed */
    size_t body_len;
    int prompt_words;    /* words we sent (≈ tokens); the server's count is authoritative */
    int max_tokens;
    lg_session *session; /* LG_WL_CHAT only */
    int turn;            /* 0-based turn in its session */
    int64_t session_id;  /* -1 outside chat sessions */
} lg_work_item;

typedef struct lg_workload {
    lg_workload_opts o;
    dp_rng rng;
    char *file_text;     /* prompt file / corpus, owned */
    char **lines;        /* LG_WL_FILE: prompts; LG_WL_CORPUS: words */
    size_t n_lines;
    size_t next_line;
    char **prefixes;
    struct cJSON *extra; /* parsed extra_body */
    uint64_t sessions_started;
} lg_workload;

/* Takes ownership of nothing in opts except that input/output are copied (and
 * destroyed by lg_workload_destroy). */
int lg_workload_init(lg_workload *w, const lg_workload_opts *o, char *err, size_t errsz);
void lg_workload_destroy(lg_workload *w);
/* The next independent request (a new session's first turn for chat). */
int lg_workload_next(lg_workload *w, lg_work_item *out);
/* After a chat turn finished: appends the reply and builds the next turn.
 * Returns 0 with *out filled, 1 when the session is over (and freed), or < 0. */
int lg_workload_followup(lg_workload *w, lg_session *s, const char *reply, size_t len,
                         lg_work_item *out);
/* Ends a session early (its turn failed, or the run stopped). */
void lg_workload_session_end(lg_workload *w, lg_session *s);
void lg_work_item_clear(lg_work_item *it);

/* Appends `n` random words (leading space before each but the first if at_start). */
int lg_workload_random_text(dp_rng *r, int n, char **out);

#endif
