/* test_stop.c: stop strings over streamed text: a stop split across two
 * tokens, several stops, a stop that is a prefix of the text without
 * matching, and text held back never leaking a partial stop string. */
#include <stdlib.h>
#include <string.h>

#include "sched/stop.h"
#include "t.h"

/* Feeds pieces; returns everything released, and whether a stop hit. */
static char *feed(const char *const *stops, int n_stops, const char *const *pieces, int n,
                  bool include, bool *hit, int *hit_at)
{
    dp_stop s;
    stop_init(&s, stops, n_stops);
    size_t cap = 1024, len = 0;
    char *all = calloc(cap, 1);
    *hit = false;
    *hit_at = -1;
    for (int i = 0; i < n && !*hit; i++) {
        char *out;
        size_t ol;
        int rc = stop_push(&s, pieces[i], strlen(pieces[i]), include, &out, &ol);
        CHECK(rc >= 0);
        /* Whatever is released must never end with the start of a stop
         * string while no stop has hit (it would show a partial stop). */
        memcpy(all + len, out, ol);
        len += ol;
        free(out);
        if (rc == 1) {
            *hit = true;
            *hit_at = i;
        }
    }
    if (!*hit) {
        char *out;
        size_t ol;
        CHECK(stop_flush(&s, &out, &ol) == 0);
        memcpy(all + len, out, ol);
        len += ol;
        free(out);
    }
    all[len] = 0;
    stop_destroy(&s);
    return all;
}

int main(void)
{
    bool hit;
    int at;
    char *t;
    {   /* A stop string split across two tokens: "END" = "EN" + "D". */
        const char *stops[] = {"END"};
        const char *p[] = {"Hello wor", "ld. EN", "D more", "text"};
        t = feed(stops, 1, p, 4, false, &hit, &at);
        CHECK(hit);
        CHECK_EQ_INT(at, 2);
        CHECK(strcmp(t, "Hello world. ") == 0);
        free(t);
        t = feed(stops, 1, p, 4, true, &hit, &at);
        CHECK(strcmp(t, "Hello world. END") == 0);
        free(t);
    }
    {   /* Held text is not released while it may still be a stop: after
         * "ld. EN" only "ld. " may come out. */
        const char *stops[] = {"END"};
        dp_stop s;
        stop_init(&s, stops, 1);
        char *out;
        size_t ol;
        CHECK(stop_push(&s, "ab E", 4, false, &out, &ol) == 0);
        CHECK(strcmp(out, "ab ") == 0);
        free(out);
        CHECK(stop_push(&s, "N", 1, false, &out, &ol) == 0);
        CHECK_EQ_INT(ol, 0);
        free(out);
        CHECK(stop_push(&s, "x", 1, false, &out, &ol) == 0); /* "ENx": not a stop */
        CHECK(strcmp(out, "ENx") == 0);
        free(out);
        stop_destroy(&s);
    }
    {   /* Several stops: the earliest in the text wins, whatever the list order. */
        const char *stops[] = {"\n\n", "Observation:", "###"};
        const char *p[] = {"Thought: x", "###y\n", "\nObservation:"};
        t = feed(stops, 3, p, 3, false, &hit, &at);
        CHECK(hit);
        CHECK_EQ_INT(at, 1);
        CHECK(strcmp(t, "Thought: x") == 0);
        free(t);
        const char *q[] = {"a\n", "\nb###"};
        t = feed(stops, 3, q, 2, false, &hit, &at);
        CHECK(hit);
        CHECK(strcmp(t, "a") == 0);
        free(t);
    }
    {   /* A stop that is a prefix of generated text without matching: "Paris"
         * vs text "Par" + "ty": everything is released, nothing lost. */
        const char *stops[] = {"Paris"};
        const char *p[] = {"The Par", "ty is over. Pa", "ri"};
        t = feed(stops, 1, p, 3, false, &hit, &at);
        CHECK(!hit);
        CHECK(strcmp(t, "The Party is over. Pari") == 0);
        free(t);
    }
    {   /* Overlapping candidates: stops "aab" in "aaab". */
        const char *stops[] = {"aab"};
        const char *p[] = {"a", "a", "a", "b"};
        t = feed(stops, 1, p, 4, false, &hit, &at);
        CHECK(hit);
        CHECK(strcmp(t, "a") == 0);
        free(t);
    }
    {   /* Multi-byte UTF-8 around a stop. */
        const char *stops[] = {"é!"};
        const char *p[] = {"caf", "é", "!", "x"};
        t = feed(stops, 1, p, 4, false, &hit, &at);
        CHECK(hit);
        CHECK(strcmp(t, "caf") == 0);
        free(t);
    }
    {   /* No stops: everything passes straight through. */
        const char *p[] = {"one ", "two"};
        t = feed(NULL, 0, p, 2, false, &hit, &at);
        CHECK(!hit);
        CHECK(strcmp(t, "one two") == 0);
        free(t);
    }
    {   /* Muted (min_tokens not reached): a whole stop string passes as text,
         * a partial one is still held; once unmuted the next one stops. */
        const char *stops[] = {", "};
        dp_stop st;
        stop_init(&st, stops, 1);
        st.muted = true;
        char *o = NULL;
        size_t n = 0;
        CHECK(stop_push(&st, "1, 2,", 5, false, &o, &n) == 0);
        CHECK(strcmp(o, "1, 2") == 0); /* "," held: it may start ", " */
        free(o);
        st.muted = false;
        CHECK(stop_push(&st, " 3", 2, false, &o, &n) == 1);
        CHECK(n == 0 && strcmp(o, "") == 0);
        free(o);
        stop_destroy(&st);
    }
    T_DONE("stop");
}
