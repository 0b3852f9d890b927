/* request.h: what the HTTP layer hands the engine (a request: prompt tokens
 * and generation parameters) and what comes back (events: text pieces, token
 * ids and log-probabilities, the finish reason and usage). Requests are
 * reference-counted and shared by the two threads; everything else in them is
 * written by one side only, as noted per field. */
#ifndef DP_SCHED_REQUEST_H
#define DP_SCHED_REQUEST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"
#include "sampler.h"

#define DP_MAX_STOPS 8
#define DP_MAX_STOP_IDS 64
#define DP_MAX_TOP_LOGPROBS 20

typedef struct dp_logit_bias {
    int32_t token;
    float bias;
} dp_logit_bias;

typedef struct dp_request_params {
    int32_t max_tokens;           /* generated tokens at most (0: the prompt alone, scored) */
    dp_sampling sampling;         /* temperature, top-k/p, min-p, penalties, seed */
    dp_logit_bias *logit_bias;    /* owned; n_logit_bias entries */
    int32_t n_logit_bias;
    int32_t logprobs;             /* -1: none; 0: chosen token only; k: plus top k */
    bool prompt_logprobs;         /* each prompt token's logprob (after the first), as
                                   * DP_EV_PROMPT_TOKEN events before any other; the
                                   * prompt then runs whole and is computed in full */
    int32_t prompt_top;           /* with prompt_logprobs: plus the top prompt_top */
    dp_grammar *grammar;          /* constrained decoding: a reference owned here; NULL: free text */
    char *stops[DP_MAX_STOPS];    /* owned, NUL-terminated; n_stops used */
    int32_t n_stops;
    int32_t stop_ids[DP_MAX_STOP_IDS]; /* vLLM's stop_token_ids: sampling one ends the output */
    int32_t n_stop_ids;
    int32_t min_tokens;           /* vLLM's: no end-of-generation or stop token, and no stop
                                   * string match, before this many tokens */
    bool ignore_eos;              /* generate exactly max_tokens unless a stop string hits */
    bool include_stop_str;        /* append the matched stop string to the output */
    int32_t priority;             /* lower runs first; FCFS within a priority */
    /* Per-request dual-path override (zero: the server's defaults). */
    int8_t dualpath_mode;         /* DP_DUALPATH_DEFAULT | _ON | _OFF */
    int8_t scorer;                /* 0: default; else dp_scorer + 1 */
    float keep_ratio;             /* 0: default; else (0, 1] */
    int16_t exempt;               /* 0: default; else exempt layers + 1 (the server's, or
                                   * none) */
    int8_t kv_type;               /* the decode path's KV type: 0: the server's; else
                                   * dp_kv_type + 1 */
    int32_t keep_prefix;          /* first prompt tokens kept whole on the decode path
                                   * (the API sets a chat's system prompt here); 0: none */
    bool conversation;            /* a chat turn after an earlier reply (an assistant or
                                   * tool message before the last): its prompt and reply
                                   * serve the next turn */
} dp_request_params;

enum { DP_DUALPATH_DEFAULT = 0, DP_DUALPATH_ON = 1, DP_DUALPATH_OFF = 2 };

typedef enum dp_finish {
    DP_FINISH_NONE = 0,
    DP_FINISH_STOP,      /* EOS/EOT or a stop string */
    DP_FINISH_LENGTH,    /* max_tokens or the context length */
    DP_FINISH_CANCELLED, /* the client went away or the daemon stopped */
    DP_FINISH_ERROR,     /* the engine failed this request (message in the event) */
} dp_finish;

const char *finish_reason_name(dp_finish f);

typedef struct dp_request {
    atomic_int refs;
    atomic_bool cancelled;  /* set by the loop thread; the engine frees the sequence next step */
    uint64_t id;            /* unique per daemon run */
    int32_t *prompt;        /* owned */
    int32_t n_prompt;
    dp_request_params params;
    void *user;             /* the HTTP layer's per-request context (loop thread only) */
    double t_arrival;       /* dp_now() at submission */
    struct dp_event *finish_ev; /* allocated with the request, sent once */
} dp_request;

struct dp_event;

/* Creates a request with refs = 1 taking ownership of prompt (malloc'd). */
dp_request *request_new(int32_t *prompt, int32_t n_prompt, const dp_request_params *p);
void request_ref(dp_request *r);
void request_unref(dp_request *r);
/* Frees what params owns (logit_bias, stops); safe on a zeroed struct. */
void request_params_free(dp_request_params *p);

typedef enum dp_event_kind {
    DP_EV_TOKEN = 1,    /* one generated token (text may be empty while held back) */
    DP_EV_PROMPT_TOKEN, /* prompt_logprobs: prompt token pos (>= 1), its logprob given
                         * the tokens before it, its rank and the top alternatives */
    DP_EV_FINISH,       /* the last event of a request: finish reason and usage */
} dp_event_kind;

typedef struct dp_top_logprob {
    int32_t token;
    float logprob;
} dp_top_logprob;

/* What the dual path did with a sequence's prompt: usage.dualpath, carried
 * as one struct from the engine's finish event to the response (summed
 * over a request's choices). */
typedef struct dp_kv_usage {
    int64_t tokens_kept;      /* prompt tokens kept at the switch to the decode path */
    int64_t tokens_evicted;   /* prompt tokens dropped then (0 without dualpath) */
    int64_t tokens_resumed;   /* prompt tokens continued from the previous turn's compact
                               * cache (kv_mgr_park), not computed again */
    int64_t kv_bytes;         /* the kept tokens' KV bytes on the decode path */
    int64_t kv_bytes_full;    /* the same prompt tokens' bytes whole on the prefill path */
} dp_kv_usage;

static inline void dp_kv_usage_add(dp_kv_usage *sum, const dp_kv_usage *u)
{
    sum->tokens_kept += u->tokens_kept;
    sum->tokens_evicted += u->tokens_evicted;
    sum->tokens_resumed += u->tokens_resumed;
    sum->kv_bytes += u->kv_bytes;
    sum->kv_bytes_full += u->kv_bytes_full;
}

typedef struct dp_event {
    struct dp_event *next;
    dp_event_kind kind;
    dp_request *req;       /* holds a reference, dropped by event_free */
    /* TOKEN and PROMPT_TOKEN */
    int32_t token;
    float logprob;         /* of the chosen token (0 when logprobs are off) */
    int32_t pos;           /* PROMPT_TOKEN: its index in the prompt */
    int32_t rank;          /* PROMPT_TOKEN: 1 + the tokens more likely than it */
    int32_t n_top;
    dp_top_logprob top[DP_MAX_TOP_LOGPROBS];
    /* TOKEN and FINISH: the text released by this event (complete UTF-8, never
     * part of a stop string), owned, NUL-terminated; may be empty. */
    char *text;
    size_t text_len;
    /* TOKEN: its text lies wholly after the output's end (it completed a
     * stop string): counted in usage, not reported in logprobs. */
    bool past_end;
    int64_t text_start;    /* TOKEN (engine only): where its text starts in the generation */
    /* FINISH */
    dp_finish finish;
    int32_t prompt_tokens;
    int32_t completion_tokens;
    int32_t n_preemptions;
    dp_kv_usage usage;         /* usage.dualpath of this sequence */
    char *error;           /* owned message when finish == DP_FINISH_ERROR */
    double t_first_token;  /* dp_now() of the first token (0 if none) */
    double t_finish;
} dp_event;

void event_free(dp_event *ev);
/* The request's FINISH event (allocated by request_new, holding a new
 * reference to r), or NULL when it was taken already. */
dp_event *request_take_finish(dp_request *r);
void event_free_list(dp_event *ev);

#endif
