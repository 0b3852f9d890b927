/* stop.c: the earliest stop string in held + new text wins; otherwise the
 * longest suffix that is a proper prefix of some stop string stays held. The
 * held text never contains a whole stop string, so searching it again is
 * correct, and it is at most the longest stop string long. */
#include "stop.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

void stop_init(dp_stop *s, const char *const *stops, int n_stops)
{
    memset(s, 0, sizeof *s);
    s->stops = stops;
    s->n_stops = n_stops;
}

void stop_destroy(dp_stop *s)
{
    free(s->held);
    memset(s, 0, sizeof *s);
}

static int emit(const char *p, size_t n, char **out, size_t *out_len)
{
    char *o = malloc(n + 1);
    if (!o)
        return DP_ENOMEM;
    memcpy(o, p, n);
    o[n] = 0;
    *out = o;
    *out_len = n;
    return 0;
}

int stop_push(dp_stop *s, const char *text, size_t len, bool include_stop, char **out,
              size_t *out_len)
{
    if (s->n_held + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < s->n_held + len + 1)
            cap *= 2;
        char *h = realloc(s->held, cap);
        if (!h)
            return DP_ENOMEM;
        s->held = h;
        s->cap = cap;
    }
    memcpy(s->held + s->n_held, text, len);
    s->n_held += len;
    s->held[s->n_held] = 0;
    const char *buf = s->held;
    size_t n = s->n_held;

    /* Earliest match of any stop string (the longest when two start at once). */
    size_t best = (size_t)-1, best_len = 0;
    for (int i = 0; !s->muted && i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        if (sl == 0 || sl > n)
            continue;
        const char *hit = memmem(buf, n, s->stops[i], sl);
        if (hit && ((size_t)(hit - buf) < best || ((size_t)(hit - buf) == best && sl > best_len))) {
            best = (size_t)(hit - buf);
            best_len = sl;
        }
    }
    if (best != (size_t)-1) {
        int rc = emit(buf, best + (include_stop ? best_len : 0), out, out_len);
        s->n_held = 0;
        return rc ? rc : 1;
    }
    /* Longest suffix of buf that is a proper prefix of a stop string (so
     * what stays held never holds a whole one, muted or not). */
    size_t keep = 0;
    for (int i = 0; i < s->n_stops; i++) {
        size_t sl = strlen(s->stops[i]);
        for (size_t k = (sl - 1 < n ? sl - 1 : n); k > keep; k--)
            if (memcmp(buf + n - k, s->stops[i], k) == 0) {
                keep = k;
                break;
            }
    }
    int rc = emit(buf, n - keep, out, out_len);
    if (rc)
        return rc;
    memmove(s->held, s->held + (n - keep), keep);
    s->n_held = keep;
    s->held[keep] = 0;
    return 0;
}

int stop_flush(dp_stop *s, char **out, size_t *out_len)
{
    int rc = emit(s->held ? s->held : "", s->n_held, out, out_len);
    s->n_held = 0;
    return rc;
}
