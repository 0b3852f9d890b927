/* stop.h: stop-string matching over streamed text. Text that could still be
 * the start of a stop string is held back, so a client never sees part of a
 * stop string, even when it spans several tokens. */
#ifndef DP_SCHED_STOP_H
#define DP_SCHED_STOP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dp_stop {
    const char *const *stops;  /* borrowed */
    int n_stops;
    char *held;                /* text not yet released */
    size_t n_held, cap;
    bool muted;                /* matches are not stops for now (vLLM's min_tokens);
                                * text is still held back as usual */
} dp_stop;

void stop_init(dp_stop *s, const char *const *stops, int n_stops);
void stop_destroy(dp_stop *s);

/* Appends text; sets *out (malloc'd, NUL-terminated) to what may be released
 * now. Returns 1 when a stop string matched (*out then ends before it, or
 * includes it with include_stop), 0 otherwise, negative on allocation
 * failure. */
int stop_push(dp_stop *s, const char *text, size_t len, bool include_stop, char **out,
              size_t *out_len);
/* Releases whatever is held (at the end of generation). */
int stop_flush(dp_stop *s, char **out, size_t *out_len);

#endif
