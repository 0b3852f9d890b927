/* guard.c: API keys and CORS origins (see guard.h). */
#include "guard.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/dp.h"

#define GUARD_MAX_KEYS 4096
#define GUARD_MAX_KEY_LEN 512

static void free_list(char **v, int n)
{
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static char *trim(char *s)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

/* Reads path into a fresh key list. */
static int load_keys(const char *path, char ***out, int *n_out, char *err, size_t errsz)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return dp_err(err, errsz, DP_EIO, "api_key_file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & S_IROTH))
        dp_log(DP_LOG_WARN, "api_key_file %s is readable by every user (chmod 600 it)", path);
    char **keys = NULL;
    int n = 0, cap = 0, line = 0, rc = 0;
    char buf[GUARD_MAX_KEY_LEN + 64];
    while (fgets(buf, sizeof buf, f)) {
        line++;
        size_t len = strlen(buf);
        if (len == sizeof buf - 1 && buf[len - 1] != '\n' && !feof(f)) {
            rc = dp_err(err, errsz, DP_EINVAL, "api_key_file %s:%d: the line is too long", path, line);
            break;
        }
        char *k = trim(buf);
        if (!*k || *k == '#')
            continue;
        bool ok = strlen(k) <= GUARD_MAX_KEY_LEN;
        for (const char *p = k; ok && *p; p++)
            ok = *p > 0x20 && *p < 0x7f;
        if (!ok) {
            rc = dp_err(err, errsz, DP_EINVAL,
                        "api_key_file %s:%d: a key is printable ASCII without spaces, at most %d "
                        "characters", path, line, GUARD_MAX_KEY_LEN);
            break;
        }
        if (n == GUARD_MAX_KEYS) {
            rc = dp_err(err, errsz, DP_EINVAL, "api_key_file %s: more than %d keys", path,
                        GUARD_MAX_KEYS);
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nk = realloc(keys, (size_t)cap * sizeof *nk);
            if (!nk) {
                rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
                break;
            }
            keys = nk;
        }
        if (!(keys[n] = strdup(k))) {
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
            break;
        }
        n++;
    }
    if (!rc && ferror(f))
        rc = dp_err(err, errsz, DP_EIO, "api_key_file %s: read error", path);
    fclose(f);
    if (!rc && n == 0)
        rc = dp_err(err, errsz, DP_EINVAL, "api_key_file %s has no keys (one per line)", path);
    if (rc) {
        free_list(keys, n);
        return rc;
    }
    *out = keys;
    *n_out = n;
    return 0;
}

static int parse_origins(dp_guard *g, const char *cors, char *err, size_t errsz)
{
    char *copy = strdup(cors ? cors : "");
    if (!copy)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    int rc = 0;
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *o = trim(t);
        if (!*o)
            continue;
        if (!strcmp(o, "*")) {
            g->any_origin = true;
            continue;
        }
        /* An origin is scheme://host[:port], no path: what browsers send. */
        const char *sep = strstr(o, "://");
        if (!sep || sep == o || !sep[3] || strchr(sep + 3, '/')) {
            rc = dp_err(err, errsz, DP_EINVAL,
                        "cors_origins: '%.100s' is not an origin like https://app.example:8443", o);
            break;
        }
        char **no = realloc(g->origins, (size_t)(g->n_origins + 1) * sizeof *no);
        if (!no || !(no[g->n_origins] = strdup(o))) {
            if (no)
                g->origins = no;
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
            break;
        }
        g->origins = no;
        g->n_origins++;
    }
    free(copy);
    return rc;
}

int guard_init(dp_guard *g, const char *key_file, const char *cors, char *err, size_t errsz)
{
    memset(g, 0, sizeof *g);
    int rc = parse_origins(g, cors, err, errsz);
    if (!rc && key_file && *key_file) {
        g->key_path = strdup(key_file);
        rc = g->key_path ? load_keys(key_file, &g->keys, &g->n_keys, err, errsz)
                         : dp_err(err, errsz, DP_ENOMEM, "out of memory");
    }
    if (rc)
        guard_destroy(g);
    return rc;
}

int guard_reload(dp_guard *g, char *err, size_t errsz)
{
    if (!g->key_path)
        return 0;
    char **keys = NULL;
    int n = 0;
    int rc = load_keys(g->key_path, &keys, &n, err, errsz);
    if (rc)
        return rc;
    free_list(g->keys, g->n_keys);
    g->keys = keys;
    g->n_keys = n;
    return 0;
}

void guard_destroy(dp_guard *g)
{
    free_list(g->keys, g->n_keys);
    free_list(g->origins, g->n_origins);
    free(g->key_path);
    memset(g, 0, sizeof *g);
}

/* Compares the whole token with every key: no early exit on a byte, a
 * length or a key, so the time says nothing about the keys. */
static bool key_eq(const char *key, const unsigned char *tok, size_t tl)
{
    size_t kl = strlen(key);
    unsigned diff = kl != tl;
    for (size_t i = 0; i < tl; i++) {
        unsigned char k = i < kl ? (unsigned char)key[i] : 0;
        diff |= (unsigned)(k ^ tok[i]);
    }
    return diff == 0;
}

bool guard_check(const dp_guard *g, const char *auth)
{
    if (!g->key_path)
        return true;
    if (!auth || strncasecmp(auth, "Bearer ", 7))
        return false;
    const char *t = auth + 7;
    while (*t == ' ')
        t++;
    size_t tl = strlen(t);
    while (tl && t[tl - 1] == ' ')
        tl--;
    if (tl == 0 || tl > GUARD_MAX_KEY_LEN)
        return false;
    bool ok = false;
    for (int i = 0; i < g->n_keys; i++)
        ok |= key_eq(g->keys[i], (const unsigned char *)t, tl);
    return ok;
}

const char *guard_cors_origin(const dp_guard *g, const char *origin)
{
    if (!origin || !*origin)
        return NULL;
    if (g->any_origin)
        return "*";
    /* Scheme and host are case-insensitive; browsers send them lower-case. */
    for (int i = 0; i < g->n_origins; i++)
        if (!strcasecmp(g->origins[i], origin))
            return origin;
    return NULL;
}
