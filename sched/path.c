/* path.c: the path detector's state machine and its early-switch signals.
 * Everything here is plain arithmetic over a few numbers per sequence. */
#include "path.h"

#include <stdlib.h>
#include <string.h>

const char *path_state_name(dp_path_state s)
{
    static const char *n[] = {"waiting", "prefill", "decode", "preempted"};
    return (unsigned)s <= DP_PS_PREEMPTED ? n[s] : "?";
}

bool path_transition_ok(dp_path_state from, dp_path_state to)
{
    switch (from) {
    case DP_PS_WAITING: return to == DP_PS_PREFILL;
    case DP_PS_PREFILL: return to == DP_PS_DECODE || to == DP_PS_PREEMPTED;
    case DP_PS_DECODE:
        /* PREFILL again: a new turn rebuilds the full cache. */
        return to == DP_PS_PREFILL || to == DP_PS_PREEMPTED;
    /* DECODE again: a compact cache swapped back in as it was. */
    case DP_PS_PREEMPTED: return to == DP_PS_WAITING || to == DP_PS_DECODE;
    }
    return false;
}

void path_opts_default(dp_path_opts *o)
{
    o->early_switch = false;
    o->stable_change = 0.05f;
    o->repetitive = 0.5f;
    o->ngram = 4;
    o->min_tokens = 256;
}

void path_init(dp_path_detector *p)
{
    p->state = DP_PS_WAITING;
    p->repetition = -1.0f;
    p->last_change = -1.0f;
}

bool path_set(dp_path_detector *p, dp_path_state to)
{
    if (!path_transition_ok(p->state, to))
        return false;
    p->state = to;
    return true;
}

float path_repetition(const int32_t *tokens, int32_t n, int32_t ngram)
{
    if (ngram < 1 || n < ngram + 1)
        return 0.0f;
    int32_t grams = n - ngram + 1;
    /* Open addressing over 64-bit n-gram hashes, table at most half full. */
    uint32_t cap = 64;
    while (cap < (uint32_t)grams * 2)
        cap <<= 1;
    uint64_t *tab = calloc(cap, sizeof *tab);
    if (!tab)
        return 0.0f;
    int32_t repeats = 0;
    for (int32_t i = 0; i < grams; i++) {
        uint64_t h = 1469598103934665603ULL;
        for (int32_t j = 0; j < ngram; j++) {
            h ^= (uint64_t)(uint32_t)tokens[i + j];
            h *= 1099511628211ULL;
        }
        h |= 1; /* 0 marks an empty slot */
        uint32_t at = (uint32_t)(h ^ (h >> 32)) & (cap - 1);
        while (tab[at] && tab[at] != h)
            at = (at + 1) & (cap - 1);
        if (tab[at] == h)
            repeats++;
        else
            tab[at] = h;
    }
    free(tab);
    return (float)repeats / (float)grams;
}

float path_kept_change(const int32_t *prev, int32_t k_prev, const int32_t *cur, int32_t k_cur,
                       int32_t rows)
{
    if (k_prev <= 0 || rows <= 0)
        return 1.0f;
    double total = 0.0;
    for (int32_t r = 0; r < rows; r++) {
        const int32_t *a = prev + (size_t)r * (size_t)k_prev, *b = cur + (size_t)r * (size_t)k_cur;
        int32_t i = 0, j = 0, common = 0;
        while (i < k_prev && j < k_cur) { /* both ascending: a merge */
            if (a[i] == b[j])
                common++, i++, j++;
            else if (a[i] < b[j])
                i++;
            else
                j++;
        }
        total += 1.0 - (double)common / k_prev;
    }
    return (float)(total / rows);
}

static bool is_repetitive(const dp_path_detector *p, const dp_path_opts *o)
{
    return p->repetition >= 0.0f && p->repetition >= o->repetitive;
}

bool path_may_switch(const dp_path_detector *p, const dp_path_opts *o, int32_t n_computed,
                     int32_t n_prompt)
{
    return p->state == DP_PS_PREFILL && o->early_switch && n_computed < n_prompt &&
           n_computed >= o->min_tokens;
}

bool path_switches_at_min(const dp_path_detector *p, const dp_path_opts *o)
{
    return o->early_switch && is_repetitive(p, o);
}

bool path_wants_stability(const dp_path_detector *p, const dp_path_opts *o, int32_t n_computed,
                          int32_t n_prompt)
{
    return path_may_switch(p, o, n_computed, n_prompt) && !is_repetitive(p, o);
}

dp_path_decision path_decide(dp_path_detector *p, const dp_path_opts *o, int32_t n_computed,
                             int32_t n_prompt)
{
    if (p->state != DP_PS_PREFILL)
        return DP_STAY;
    if (n_computed >= n_prompt)
        return DP_SWITCH_PROMPT_DONE;
    if (!path_may_switch(p, o, n_computed, n_prompt))
        return DP_STAY;
    if (is_repetitive(p, o))
        return DP_SWITCH_REPETITIVE;
    if (p->last_change >= 0.0f && p->last_change < o->stable_change)
        return DP_SWITCH_STABLE;
    return DP_STAY;
}
