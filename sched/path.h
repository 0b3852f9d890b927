/* path.h: the path detector: a per-sequence state machine
 * (WAITING -> PREFILL -> DECODE, DECODE -> PREFILL on a new turn, any
 * running state -> PREEMPTED under memory pressure; a finished sequence is
 * freed with its detector) and the decision of when a sequence leaves the
 * prefill path: path_decide, the one trigger of a switch, asked at every
 * prompt chunk's end. By default that is when its prompt is done;
 * optionally earlier, when the importance ranking has stopped changing
 * between prefill chunks or the prompt is highly repetitive. A
 * decision is host arithmetic on numbers gathered elsewhere: it never touches
 * the device and costs well under a microsecond. */
#ifndef DP_SCHED_PATH_H
#define DP_SCHED_PATH_H

#include <stdbool.h>
#include <stdint.h>

typedef enum dp_path_state {
    DP_PS_WAITING = 0,
    DP_PS_PREFILL,
    DP_PS_DECODE,
    DP_PS_PREEMPTED,
} dp_path_state;

const char *path_state_name(dp_path_state s);
/* True when from -> to is a transition of the state machine. */
bool path_transition_ok(dp_path_state from, dp_path_state to);

typedef struct dp_path_opts {
    bool early_switch;        /* allow switching before the prompt is done */
    float stable_change;      /* switch when the kept set changes less than this (0.05 = 5%) */
    float repetitive;         /* switch when this share of the prompt's n-grams repeat */
    int32_t ngram;            /* n for the repetition measure */
    int32_t min_tokens;       /* computed prompt tokens before any early switch */
} dp_path_opts;

void path_opts_default(dp_path_opts *o);

typedef struct dp_path_detector {
    dp_path_state state;
    float repetition;         /* share of repeated n-grams in the prompt, -1: not measured */
    float last_change;        /* kept-set change between the last two chunks, -1: none yet */
} dp_path_detector;

void path_init(dp_path_detector *p);
/* Moves to `to`; returns false (and stays) on an invalid transition. */
bool path_set(dp_path_detector *p, dp_path_state to);

/* Share of the n-grams of tokens[0..n) that occurred earlier in the same
 * prompt (0: no repeats; near 1: a loop). O(n) with a small hash set. */
float path_repetition(const int32_t *tokens, int32_t n, int32_t ngram);

/* Change between two kept sets per row (rows of k ascending slot lists, the
 * previous computed over fewer tokens): the mean share of the previous set
 * no longer kept. */
float path_kept_change(const int32_t *prev, int32_t k_prev, const int32_t *cur, int32_t k_cur,
                       int32_t rows);

typedef enum dp_path_decision {
    DP_STAY = 0,
    DP_SWITCH_PROMPT_DONE,
    DP_SWITCH_STABLE,
    DP_SWITCH_REPETITIVE,
} dp_path_decision;

/* Decides at a chunk boundary whether a prefill-path sequence switches now
 * (DP_SWITCH_PROMPT_DONE: its prompt is done; the others: early). */
dp_path_decision path_decide(dp_path_detector *p, const dp_path_opts *o, int32_t n_computed,
                             int32_t n_prompt);

/* Whether a prompt chunk ending at n_computed may end in an early switch
 * (its last queries are then captured: the switch scores with them). */
bool path_may_switch(const dp_path_detector *p, const dp_path_opts *o, int32_t n_computed,
                     int32_t n_prompt);
/* Whether the detector switches the prompt at its first chunk end past
 * min_tokens whatever the kept set does (a repetitive prompt): admission
 * can count on it. */
bool path_switches_at_min(const dp_path_detector *p, const dp_path_opts *o);
/* Whether path_decide at n_computed reads the kept-set change: the one
 * signal that costs work on the cache (a selection over it), so it is
 * measured only then, not at every chunk. */
bool path_wants_stability(const dp_path_detector *p, const dp_path_opts *o, int32_t n_computed,
                          int32_t n_prompt);

#endif
