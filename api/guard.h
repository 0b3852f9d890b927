/* guard.h: who may call the API: API keys (a file of keys, reloaded on
 * SIGHUP, compared in constant time against "Authorization: Bearer KEY") and
 * the browser origins allowed by CORS. No I/O beyond reading the key file. */
#ifndef DP_API_GUARD_H
#define DP_API_GUARD_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dp_guard {
    char *key_path;     /* NULL: no authentication */
    char **keys;
    int n_keys;
    char **origins;     /* allowed Origin values, exact */
    int n_origins;
    bool any_origin;    /* cors_origins = "*" */
} dp_guard;

/* key_file: NULL or "" for none, else a file of one key per line (blank lines
 * and '#' comments skipped); a file without keys is an error, so that a
 * mistake never turns authentication off. cors: "" none, "*" any, or
 * comma-separated origins ("https://a.example, http://localhost:3000"). */
int guard_init(dp_guard *g, const char *key_file, const char *cors, char *err, size_t errsz);
/* Reads the key file again; on any error the keys in use stay. */
int guard_reload(dp_guard *g, char *err, size_t errsz);
void guard_destroy(dp_guard *g);

static inline bool guard_auth_on(const dp_guard *g)
{
    return g->key_path != NULL;
}

/* True when the Authorization header value carries one of the keys. The time
 * taken depends only on the presented token's length, never on a key. */
bool guard_check(const dp_guard *g, const char *authorization);

/* The Access-Control-Allow-Origin value for a request's Origin header, or
 * NULL when it may not read the response. */
const char *guard_cors_origin(const dp_guard *g, const char *origin);
static inline bool guard_cors_on(const dp_guard *g)
{
    return g->any_origin || g->n_origins > 0;
}

#endif
