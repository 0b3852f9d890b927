/* bench_util.c: see bench_util.h. */
#include "bench_util.h"

#include <stdlib.h>
#include <unistd.h>

#include "common/dp.h"

int bench_parse_list(const char *s, int *out, int max)
{
    int n = 0;
    for (char *p = (char *)s; *p && n < max;) {
        out[n++] = (int)strtol(p, &p, 10);
        if (*p == ',')
            p++;
    }
    return n;
}

int bench_submit_random(dp_engine *e, int n, int plen, int32_t vocab, uint64_t seed,
                        const dp_request_params *prm, char *err, size_t errsz)
{
    uint64_t x = seed;
    for (int r = 0; r < n; r++) {
        int32_t *p = malloc((size_t)plen * sizeof *p);
        if (!p)
            return dp_err(err, errsz, DP_ENOMEM, "out of memory");
        for (int32_t i = 0; i < plen; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL; /* an LCG: cheap, fixed */
            p[i] = (int32_t)((x >> 33) % (uint64_t)vocab);
        }
        dp_request_params q = *prm;
        q.sampling.seed = (uint64_t)r;
        dp_request *req = request_new(p, plen, &q);
        int rc = engine_submit(e, req, err, errsz);
        request_unref(req);
        if (rc)
            return rc;
    }
    return 0;
}

int64_t bench_wait(dp_engine *e, int n, void (*poll)(dp_engine *e, void *ud), void *ud)
{
    int finished = 0;
    int64_t tokens = 0;
    while (finished < n) {
        dp_event *ev = engine_take_events(e);
        if (poll)
            poll(e, ud);
        if (!ev)
            usleep(500);
        for (dp_event *q = ev; q; q = q->next)
            if (q->kind == DP_EV_FINISH) {
                finished++;
                tokens += q->completion_tokens;
            }
        event_free_list(ev);
    }
    return tokens;
}
