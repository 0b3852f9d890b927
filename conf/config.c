/* config.c: the option table (every key, once) and everything driven by it:
 * defaults, the config file and flag parsers, validation, help, printing. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/dp.h"

/* ---------------------------------------------------------------- the table */

enum {
    GROUP_MODEL,
    GROUP_SERVER,
    GROUP_SCHED,
    GROUP_KV,
    GROUP_DUALPATH,
    GROUP_COUNT,
};

static const char *const group_titles[GROUP_COUNT] = {
    "Model",
    "Server",
    "Scheduler",
    "KV cache",
    "Dual path: what survives the prefill -> decode switch",
};

enum { OPT_POW2 = 1 };

typedef struct opt_desc {
    const char *name;          /* file key, with underscores */
    dp_config_type type;
    size_t offset;
    const char *def;           /* written as config_print() would write it */
    double min, max;           /* numbers: checked when min < max */
    const char *const *values; /* ENUM */
    int (*check)(const char *s, char *err, size_t errsz);
    unsigned flags;
    int group;
    const char *metavar;
    const char *help;          /* one line; [folder] says who reads it */
} opt_desc;

static const char *const log_levels[] = {"error", "warn", "info", "debug", NULL};
/* Indexed by dp_kv_type. */
static const char *const kv_types[] = {"f32", "f16", "q8_0", "q4_0", NULL};
/* "same", then dp_kv_type + 1. */
static const char *const decode_kv_types[] = {"auto", "same", "f32", "f16", "q8_0", "q4_0", "kivi4", NULL};
static const char *const turn_modes[] = {"auto", "always", "never", NULL};
static const char *const scorers[] = {"knorm", "knorm_high", "snapkv", "recent", "random", NULL};

static int check_device(const char *s, char *err, size_t errsz);
static int check_listen(const char *s, char *err, size_t errsz);
static int check_origins(const char *s, char *err, size_t errsz);

#define KIB 1024.0
#define MIB (1024.0 * KIB)
#define GIB (1024.0 * MIB)
#define TIB (1024.0 * GIB)
#define F(field) offsetof(dp_config, field)

/* Ordered by group: --help, --print-config and the example file follow it. */
static const opt_desc options[] = {
    /* name, type, offset, default, min, max, values, check, flags, group, metavar, help */
    {"model", DP_CONF_STRING, F(model), "\"/var/lib/dualpath/models/model.gguf\"", 0, 0, NULL,
     NULL, 0, GROUP_MODEL, "PATH", "GGUF model file, LLaMA family [model]"},
    {"model_name", DP_CONF_STRING, F(model_name), "\"\"", 0, 0, NULL, NULL, 0, GROUP_MODEL,
     "NAME", "name served as the OpenAI \"model\"; \"\" = the model file's name [api]"},
    {"chat_template", DP_CONF_STRING, F(chat_template), "\"\"", 0, 0, NULL, NULL, 0, GROUP_MODEL,
     "PATH|TEMPLATE", "chat template file, or Jinja text (with \"{%\" or \"{{\"); \"\" = the model's [model]"},
    {"device", DP_CONF_STRING, F(device), "\"auto\"", 0, 0, NULL, check_device, 0, GROUP_MODEL,
     "auto|cpu|cuda|cuda:N", "compute device; auto = the first GPU, else the CPU [kernels]"},
    {"threads", DP_CONF_INT, F(threads), "0", 0, 1024, NULL, NULL, 0, GROUP_MODEL, NULL,
     "CPU backend threads; 0 = all cores [kernels]"},
    {"exact_matmul", DP_CONF_BOOL, F(exact_matmul), "false", 0, 0, NULL, NULL, 0, GROUP_MODEL, NULL,
     "CPU: f32 matmuls on the dequantized weights instead of int8 activations (slower) [kernels]"},
    {"cuda_graphs", DP_CONF_BOOL, F(cuda_graphs), "true", 0, 0, NULL, NULL, 0, GROUP_MODEL, NULL,
     "CUDA: record decode steps once per shape and replay them (fewer launches) [kernels]"},
    {"context_length", DP_CONF_INT, F(context_length), "0", 0, 1 << 20, NULL, NULL, 0,
     GROUP_MODEL, NULL, "longest sequence (prompt + output) in tokens; 0 = the model's [model]"},

    {"listen", DP_CONF_STRING, F(listen), "\"127.0.0.1:8080\"", 0, 0, NULL, check_listen, 0,
     GROUP_SERVER, "HOST:PORT", "HTTP address: HOST:PORT, [IPv6]:PORT or unix:/PATH [api]"},
    {"max_body_bytes", DP_CONF_SIZE, F(max_body_bytes), "1MiB", KIB, GIB, NULL, NULL, 0,
     GROUP_SERVER, NULL, "largest request body; larger ones get 413 [api]"},
    {"max_connections", DP_CONF_INT, F(max_connections), "256", 1, 65536, NULL, NULL, 0,
     GROUP_SERVER, NULL, "open HTTP connections at most [api]"},
    {"max_connections_per_ip", DP_CONF_INT, F(max_connections_per_ip), "0", 0, 65536, NULL, NULL,
     0, GROUP_SERVER, NULL,
     "connections from one address at most; 0 = 7/8 of max_connections (proxy: raise it) [api]"},
    {"header_timeout", DP_CONF_DURATION, F(header_timeout_ms), "10s", 0, 86400000.0, NULL, NULL,
     0, GROUP_SERVER, NULL,
     "a new connection's request headers must be in within this; 0 = no deadline [api]"},
    {"body_timeout", DP_CONF_DURATION, F(body_timeout_ms), "10s", 0, 86400000.0, NULL, NULL, 0,
     GROUP_SERVER, NULL, "a request body stalling this long (or under 1 KiB/s after it) is dropped; 0 = off [api]"},
    {"idle_timeout", DP_CONF_DURATION, F(idle_timeout_ms), "1min", 0, 86400000.0, NULL, NULL, 0,
     GROUP_SERVER, NULL,
     "idle keep-alive or non-reading clients are closed after this; 0 = never [api]"},
    {"request_timeout", DP_CONF_DURATION, F(request_timeout_ms), "10min", 0, 86400000.0, NULL,
     NULL, 0, GROUP_SERVER, NULL,
     "a completion running longer is cancelled (504 or an error event); 0 = never [api]"},
    {"api_key_file", DP_CONF_STRING, F(api_key_file), "\"\"", 0, 0, NULL, NULL, 0, GROUP_SERVER,
     "PATH", "API keys, one per line (reloaded on SIGHUP) for Authorization: Bearer; \"\" = none "
     "[api]"},
    {"health_public", DP_CONF_BOOL, F(health_public), "true", 0, 0, NULL, NULL, 0, GROUP_SERVER,
     NULL, "/health answers without an API key [api]"},
    {"metrics_public", DP_CONF_BOOL, F(metrics_public), "true", 0, 0, NULL, NULL, 0,
     GROUP_SERVER, NULL, "/metrics answers without an API key [api]"},
    {"cors_origins", DP_CONF_STRING, F(cors_origins), "\"\"", 0, 0, NULL, check_origins, 0,
     GROUP_SERVER, "ORIGINS",
     "browser origins allowed (CORS): \"*\" or a comma-separated list; \"\" = none [api]"},
    {"drain_timeout", DP_CONF_DURATION, F(drain_timeout_ms), "30s", 0, 86400000.0, NULL, NULL, 0,
     GROUP_SERVER, NULL, "on SIGTERM, how long running requests may finish [daemon]"},
    {"max_queue", DP_CONF_INT, F(max_queue), "256", 0, 1 << 20, NULL, NULL, 0, GROUP_SERVER,
     NULL, "requests waiting for admission before new ones get 429; 0 = no limit [api, sched]"},
    {"default_max_tokens", DP_CONF_INT, F(default_max_tokens), "0", 0, 1 << 20, NULL, NULL, 0,
     GROUP_SERVER, NULL,
     "max_tokens when a request sets none; 0 = rest of context (chat), 16 (completions) [api]"},
    {"log_level", DP_CONF_ENUM, F(log_level), "info", 0, 0, log_levels, NULL, 0, GROUP_SERVER,
     NULL, "least important message logged [daemon]"},
    {"watchdog", DP_CONF_BOOL, F(watchdog), "true", 0, 0, NULL, NULL, 0, GROUP_SERVER, NULL,
     "ping systemd's watchdog while the engine makes progress [daemon]"},

    {"max_batched_tokens", DP_CONF_INT, F(max_batched_tokens), "512", 16, 65536, NULL, NULL, 0,
     GROUP_SCHED, NULL, "tokens per engine step, prefill chunks and decodes together [sched]"},
    {"max_seqs", DP_CONF_INT, F(max_seqs), "64", 1, 4096, NULL, NULL, 0, GROUP_SCHED, NULL,
     "sequences per engine step [sched]"},

    {"kv_memory", DP_CONF_SIZE, F(kv_memory), "1GiB", 0, 64 * TIB, NULL, NULL, 0, GROUP_KV,
     NULL, "KV cache memory, both pools; 0 = auto (CUDA: gpu_memory_fraction; CPU: 1GiB) "
     "[kvcache]"},
    {"gpu_memory_fraction", DP_CONF_FLOAT, F(gpu_memory_fraction), "0.9", 0.01, 1, NULL, NULL,
     0, GROUP_KV, NULL, "share of GPU memory the daemon may use at most [kernels, kvcache]"},
    {"prefill_pool_fraction", DP_CONF_FLOAT, F(prefill_pool_fraction), "0.25", 0.01, 1, NULL,
     NULL, 0, GROUP_KV, NULL,
     "prefill pool's share of kv_memory when decode_block_tokens differs (else one arena) "
     "[kvcache]"},
    {"block_tokens", DP_CONF_INT, F(block_tokens), "16", 1, 256, NULL, NULL, OPT_POW2, GROUP_KV,
     NULL, "tokens per prefill-pool block, a power of two [kvcache]"},
    {"decode_block_tokens", DP_CONF_INT, F(decode_block_tokens), "16", 1, 256, NULL, NULL,
     OPT_POW2, GROUP_KV, NULL, "tokens per decode-pool block, a power of two [kvcache]"},
    {"host_tier_bytes", DP_CONF_SIZE, F(host_tier_bytes), "0", 0, 64 * TIB, NULL, NULL, 0,
     GROUP_KV, NULL, "host memory keeping evicted prefixes for later turns; 0 = off [kvcache]"},
    {"swap_space", DP_CONF_SIZE, F(swap_space), "4GiB", 0, 64 * TIB, NULL, NULL, 0, GROUP_KV,
     NULL, "host memory for preempted decode-path caches, taken at start-up; 0 = recompute "
     "[kvcache]"},
    {"prefix_cache", DP_CONF_BOOL, F(prefix_cache), "true", 0, 0, NULL, NULL, 0, GROUP_KV, NULL,
     "reuse prefill blocks of earlier prompts (the next turn of a chat) [kvcache]"},
    {"swa_full", DP_CONF_BOOL, F(swa_full), "false", 0, 0, NULL, NULL, 0, GROUP_KV, NULL,
     "sliding-window layers keep every token: the prefix cache and swap serve them "
     "[kvcache]"},
    {"kv_cache_type", DP_CONF_ENUM, F(kv_cache_type), "f16", 0, 0, kv_types, NULL, 0, GROUP_KV, NULL,
     "KV cache type: f16 as llama.cpp, f32 exact (CUDA: f16); q8_0, q4_0: no dualpath "
     "[kernels]"},

    {"dualpath", DP_CONF_BOOL, F(dualpath), "true", 0, 0, NULL, NULL, 0, GROUP_DUALPATH, NULL,
     "compress the KV cache when a sequence moves to decoding [sched, kvcache]"},
    {"scorer", DP_CONF_ENUM, F(scorer), "snapkv", 0, 0, scorers, NULL, 0, GROUP_DUALPATH, NULL,
     "importance scorer (see docs/dualpath.md: snapkv measured best) [kvcache]"},
    {"decode_kv_type", DP_CONF_ENUM, F(decode_kv_type), "auto", 0, 0, decode_kv_types, NULL, 0,
     GROUP_DUALPATH, NULL, "decode-path KV type; auto: kivi4 (4-bit groups) on the CPU, else q8_0 "
     "or same [kvcache]"},
    {"keep_ratio", DP_CONF_FLOAT, F(keep_ratio), "1", 0, 1, NULL, NULL, 0, GROUP_DUALPATH,
     NULL, "share of the prompt's tokens kept, sinks and window included [kvcache]"},
    {"sink_tokens", DP_CONF_INT, F(sink_tokens), "4", 0, 1024, NULL, NULL, 0, GROUP_DUALPATH,
     NULL, "first tokens always kept (attention sinks) [kvcache]"},
    {"window_tokens", DP_CONF_INT, F(window_tokens), "32", 0, 65536, NULL, NULL, 0,
     GROUP_DUALPATH, NULL, "last prompt tokens always kept [kvcache]"},
    {"keep_system_prompt", DP_CONF_BOOL, F(keep_system_prompt), "true", 0, 0, NULL, NULL, 0,
     GROUP_DUALPATH, NULL,
     "a chat's system prompt stays whole on the decode path, shared [api, kvcache]"},
    {"decode_budget", DP_CONF_INT, F(decode_budget), "0", 0, 1 << 24, NULL, NULL, 0,
     GROUP_DUALPATH, NULL, "decode-path slots per sequence past a kept prefix; reaching it recompresses; 0 = off [kvcache]"},
    {"early_switch", DP_CONF_BOOL, F(early_switch), "false", 0, 0, NULL, NULL, 0,
     GROUP_DUALPATH, NULL, "switch before the prompt ends once the ranking is stable or the prompt repeats itself [sched]"},
    {"early_switch_min_tokens", DP_CONF_INT, F(early_switch_min_tokens), "256", 1, 1 << 24, NULL, NULL, 0,
     GROUP_DUALPATH, NULL, "prompt tokens computed on the prefill path before an early switch [sched]"},
    {"reuse_replies", DP_CONF_BOOL, F(reuse_replies), "true", 0, 0, NULL, NULL, 0,
     GROUP_DUALPATH, NULL,
     "a reply's K/V (as computed on the decode path) serve the next turn [kvcache]"},
    {"resume_turns", DP_CONF_BOOL, F(resume_turns), "true", 0, 0, NULL, NULL, 0,
     GROUP_DUALPATH, NULL,
     "the next chat turn continues the compact cache its previous turn left [kvcache]"},
    {"exempt_layers", DP_CONF_INT, F(exempt_layers), "0", 0, 4096, NULL, NULL, 0,
     GROUP_DUALPATH, NULL,
     "the decode path keeps every token in the first N layers (in the decode KV type) [kvcache]"},
    {"compress_turns", DP_CONF_ENUM, F(compress_turns), "auto", 0, 0, turn_modes, NULL, 0,
     GROUP_DUALPATH, NULL,
     "chat turns after an earlier reply: auto = compressed when memory binds or others run [kvcache]"},
};

#define N_OPTIONS (sizeof options / sizeof options[0])

/* ------------------------------------------------------------ small helpers */

static int check_device(const char *s, char *err, size_t errsz)
{
    if (!strcmp(s, "auto") || !strcmp(s, "cpu") || !strcmp(s, "cuda"))
        return 0;
    if (!strncmp(s, "cuda:", 5) && isdigit((unsigned char)s[5])) {
        char *end;
        long n = strtol(s + 5, &end, 10);
        if (!*end && n >= 0 && n < 256)
            return 0;
    }
    return dp_err(err, errsz, DP_EINVAL, "'%s' is not auto, cpu, cuda or cuda:N", s);
}

/* The same rule as the server's (api/guard.c): scheme://host[:port] each. */
static int check_origins(const char *s, char *err, size_t errsz)
{
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n && isspace((unsigned char)*p))
            p++, n--;
        while (n && isspace((unsigned char)p[n - 1]))
            n--;
        if (n && !(n == 1 && *p == '*')) {
            char o[256];
            if (n >= sizeof o)
                return dp_err(err, errsz, DP_EINVAL, "an origin is longer than 255 bytes");
            memcpy(o, p, n);
            o[n] = 0;
            const char *sep = strstr(o, "://");
            if (!sep || sep == o || !sep[3] || strchr(sep + 3, '/'))
                return dp_err(err, errsz, DP_EINVAL,
                              "'%s' is not an origin like https://app.example:8443 (or *)", o);
        }
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

static int check_listen(const char *s, char *err, size_t errsz)
{
    char host[256], path[256];
    int port;
    return config_parse_listen(s, host, sizeof host, &port, path, sizeof path, err, errsz);
}


/* Keys match with '-' and '_' alike, so that --max-seqs finds max_seqs. */
static bool name_eq(const char *a, size_t alen, const char *b)
{
    size_t i = 0;
    for (; i < alen && b[i]; i++) {
        char x = a[i] == '-' ? '_' : a[i], y = b[i] == '-' ? '_' : b[i];
        if (x != y)
            return false;
    }
    return i == alen && !b[i];
}

static const opt_desc *find_option(const char *name, size_t len)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (name_eq(name, len, options[i].name))
            return &options[i];
    return NULL;
}

static size_t edit_distance(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b), row[64];
    if (alen >= 63 || blen >= 63)
        return 99;
    for (size_t j = 0; j <= blen; j++)
        row[j] = j;
    for (size_t i = 1; i <= alen; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= blen; j++) {
            size_t up = row[j];
            char x = a[i - 1] == '-' ? '_' : a[i - 1], y = b[j - 1];
            size_t best = diag + (x != y);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[blen];
}

/* The nearest key, for "unknown key" messages; "" when none is close. */
static const char *suggest(const char *name, size_t len)
{
    const char *best = NULL;
    size_t bestd = 3;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        size_t d = edit_distance(name, len, options[i].name);
        if (d < bestd) {
            bestd = d;
            best = options[i].name;
        }
    }
    return best;
}

static void flag_name(const char *key, char *out, size_t outsz)
{
    size_t i = 0;
    if (outsz < 3)
        return;
    out[i++] = '-';
    out[i++] = '-';
    for (; *key && i + 1 < outsz; key++)
        out[i++] = *key == '_' ? '-' : *key;
    out[i] = '\0';
}

/* ---------------------------------------------------------- value formatting */

static void format_double(double v, char *buf, size_t bufsz)
{
    /* The shortest form that reads back as the same double, without an
     * exponent where one is not needed (100, not 1e+02). */
    int shortest = 17;
    for (int prec = 17; prec >= 1; prec--) {
        snprintf(buf, bufsz, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            shortest = prec;
    }
    for (int prec = shortest; prec <= 17; prec++) {
        snprintf(buf, bufsz, "%.*g", prec, v);
        if (strtod(buf, NULL) == v && !strchr(buf, 'e'))
            return;
    }
    snprintf(buf, bufsz, "%.*g", shortest, v);
}

static void format_size(uint64_t v, char *buf, size_t bufsz)
{
    static const char *const sfx[] = {"TiB", "GiB", "MiB", "KiB"};
    for (int i = 0; i < 4 && v; i++) {
        int sh = 40 - 10 * i;
        if (v % ((uint64_t)1 << sh) == 0) {
            snprintf(buf, bufsz, "%" PRIu64 "%s", v >> sh, sfx[i]);
            return;
        }
    }
    snprintf(buf, bufsz, "%" PRIu64, v);
}

static void format_duration(int64_t ms, char *buf, size_t bufsz)
{
    if (ms != 0 && ms % 3600000 == 0)
        snprintf(buf, bufsz, "%" PRId64 "h", ms / 3600000);
    else if (ms != 0 && ms % 60000 == 0)
        snprintf(buf, bufsz, "%" PRId64 "min", ms / 60000);
    else if (ms % 1000 == 0)
        snprintf(buf, bufsz, "%" PRId64 "s", ms / 1000);
    else
        snprintf(buf, bufsz, "%" PRId64 "ms", ms);
}

/* A bound of the table, in the type's own notation. */
static void format_bound(dp_config_type t, double v, char *buf, size_t bufsz)
{
    switch (t) {
    case DP_CONF_SIZE: format_size((uint64_t)v, buf, bufsz); break;
    case DP_CONF_DURATION: format_duration((int64_t)v, buf, bufsz); break;
    case DP_CONF_FLOAT: format_double(v, buf, bufsz); break;
    default: snprintf(buf, bufsz, "%.0f", v); break;
    }
}

static void print_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        switch (*s) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default: fputc(*s, f); break;
        }
    }
    fputc('"', f);
}

/* Writes the value at p as the file syntax reads it (strings quoted). */
static void print_value(FILE *f, dp_config_type t, const char *const *values, const void *p)
{
    char buf[64];
    switch (t) {
    case DP_CONF_STRING: {
        const char *s = *(const char *const *)p;
        print_quoted(f, s ? s : "");
        return;
    }
    case DP_CONF_INT: fprintf(f, "%d", *(const int *)p); return;
    case DP_CONF_U64: fprintf(f, "%" PRIu64, *(const uint64_t *)p); return;
    case DP_CONF_FLOAT: format_double(*(const double *)p, buf, sizeof buf); break;
    case DP_CONF_BOOL: fputs(*(const bool *)p ? "true" : "false", f); return;
    case DP_CONF_SIZE: format_size(*(const uint64_t *)p, buf, sizeof buf); break;
    case DP_CONF_DURATION: format_duration(*(const int64_t *)p, buf, sizeof buf); break;
    case DP_CONF_ENUM: fputs(values[*(const int *)p], f); return;
    }
    fputs(buf, f);
}

/* ------------------------------------------------------------ value parsing */

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "on", "yes", "1"};
    static const char *const no[] = {"false", "off", "no", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) {
            *out = true;
            return 0;
        }
        if (!strcasecmp(s, no[i])) {
            *out = false;
            return 0;
        }
    }
    return DP_EINVAL;
}

static int check_range(dp_config_type t, const char *s, double v, double min, double max,
                       char *err, size_t errsz)
{
    if (!(min < max) || (v >= min && v <= max))
        return 0;
    char lo[32], hi[32];
    format_bound(t, min, lo, sizeof lo);
    format_bound(t, max, hi, sizeof hi);
    return dp_err(err, errsz, DP_ERANGE, "%s is out of range [%s, %s]", s, lo, hi);
}

/* Parses s as type t into dst. A STRING is strdup'd into a char * when owned
 * (dp_config) and pointed to when not (a caller's flag: s lives in argv). The
 * message names the value only; the caller adds where it came from. */
static int parse_value(dp_config_type t, const char *s, double min, double max,
                       const char *const *values, unsigned flags, void *dst, bool owned,
                       char *err, size_t errsz)
{
    char *end;
    if (t != DP_CONF_STRING && !*s)
        return dp_err(err, errsz, DP_EINVAL, "empty value");
    switch (t) {
    case DP_CONF_STRING:
        if (owned) {
            char *copy = strdup(s);
            if (!copy)
                return dp_err(err, errsz, DP_ENOMEM, "out of memory");
            free(*(char **)dst);
            *(char **)dst = copy;
        } else {
            *(const char **)dst = s;
        }
        return 0;
    case DP_CONF_INT: {
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (*end || isspace((unsigned char)*s))
            return dp_err(err, errsz, DP_EINVAL, "'%s' is not an integer", s);
        if (errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
            return dp_err(err, errsz, DP_ERANGE, "%s is out of range", s);
        int rc = check_range(t, s, (double)v, min, max, err, errsz);
        if (rc)
            return rc;
        if ((flags & OPT_POW2) && (v <= 0 || (v & (v - 1))))
            return dp_err(err, errsz, DP_EINVAL, "%s is not a power of two", s);
        *(int *)dst = (int)v;
        return 0;
    }
    case DP_CONF_U64: {
        if (!isdigit((unsigned char)*s))
            return dp_err(err, errsz, DP_EINVAL, "'%s' is not a non-negative integer", s);
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (*end)
            return dp_err(err, errsz, DP_EINVAL, "'%s' is not a non-negative integer", s);
        if (errno == ERANGE)
            return dp_err(err, errsz, DP_ERANGE, "%s is out of range", s);
        int rc = check_range(t, s, (double)v, min, max, err, errsz);
        if (rc)
            return rc;
        *(uint64_t *)dst = v;
        return 0;
    }
    case DP_CONF_FLOAT: {
        errno = 0;
        double v = strtod(s, &end);
        if (*end || isspace((unsigned char)*s) || !isfinite(v))
            return dp_err(err, errsz, DP_EINVAL, "'%s' is not a number", s);
        int rc = check_range(t, s, v, min, max, err, errsz);
        if (rc)
            return rc;
        *(double *)dst = v;
        return 0;
    }
    case DP_CONF_BOOL:
        if (parse_bool(s, (bool *)dst))
            return dp_err(err, errsz, DP_EINVAL,
                          "'%s' is not a boolean (true|false|on|off|yes|no|1|0)", s);
        return 0;
    case DP_CONF_SIZE: {
        uint64_t v;
        int rc = config_parse_size(s, &v, err, errsz);
        if (!rc)
            rc = check_range(t, s, (double)v, min, max, err, errsz);
        if (!rc)
            *(uint64_t *)dst = v;
        return rc;
    }
    case DP_CONF_DURATION: {
        int64_t v;
        int rc = config_parse_duration(s, &v, err, errsz);
        if (!rc)
            rc = check_range(t, s, (double)v, min, max, err, errsz);
        if (!rc)
            *(int64_t *)dst = v;
        return rc;
    }
    case DP_CONF_ENUM: {
        for (int i = 0; values[i]; i++) {
            if (!strcasecmp(s, values[i])) {
                *(int *)dst = i;
                return 0;
            }
        }
        char list[256];
        size_t n = 0;
        list[0] = '\0';
        for (int i = 0; values[i] && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", values[i]);
        return dp_err(err, errsz, DP_EINVAL, "'%s' is not one of %s", s, list);
    }
    }
    return dp_err(err, errsz, DP_EINVAL, "unknown option type");
}

static int option_set(dp_config *c, const opt_desc *o, const char *s, char *err, size_t errsz)
{
    void *dst = (char *)c + o->offset;
    if (o->check) {
        int rc = o->check(s, err, errsz);
        if (rc)
            return rc;
    }
    return parse_value(o->type, s, o->min, o->max, o->values, o->flags, dst, true, err, errsz);
}

/* ----------------------------------------------------------------- lifecycle */

/* A table default, as written, without its quotes: "\"auto\"" -> auto. */
static int default_text(const opt_desc *o, char *buf, size_t bufsz)
{
    const char *d = o->def;
    size_t len = strlen(d);
    if (o->type == DP_CONF_STRING) {
        if (len < 2 || d[0] != '"' || d[len - 1] != '"')
            return DP_EINVAL;
        d++;
        len -= 2;
    }
    if (len >= bufsz)
        return DP_ERANGE;
    memcpy(buf, d, len);
    buf[len] = '\0';
    return 0;
}

int config_defaults(dp_config *c)
{
    memset(c, 0, sizeof *c);
    int first = 0;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        char buf[256], msg[DP_ERRLEN];
        int rc = default_text(&options[i], buf, sizeof buf);
        if (!rc)
            rc = option_set(c, &options[i], buf, msg, sizeof msg);
        if (rc && !first)
            first = rc;
    }
    /* A failed strdup leaves its string NULL: report it, since readers rely on
     * every string being set after a successful return. */
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (options[i].type == DP_CONF_STRING && !*(char **)((char *)c + options[i].offset))
            first = first ? first : DP_ENOMEM;
    return first;
}

void config_destroy(dp_config *c)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (options[i].type != DP_CONF_STRING)
            continue;
        char **p = (char **)((char *)c + options[i].offset);
        free(*p);
        *p = NULL;
    }
}

bool config_equal(const dp_config *a, const dp_config *b)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const char *pa = (const char *)a + options[i].offset;
        const char *pb = (const char *)b + options[i].offset;
        switch (options[i].type) {
        case DP_CONF_STRING: {
            const char *sa = *(const char *const *)pa, *sb = *(const char *const *)pb;
            if (strcmp(sa ? sa : "", sb ? sb : ""))
                return false;
            break;
        }
        case DP_CONF_INT:
        case DP_CONF_ENUM:
            if (*(const int *)pa != *(const int *)pb)
                return false;
            break;
        case DP_CONF_U64:
        case DP_CONF_SIZE:
            if (*(const uint64_t *)pa != *(const uint64_t *)pb)
                return false;
            break;
        case DP_CONF_DURATION:
            if (*(const int64_t *)pa != *(const int64_t *)pb)
                return false;
            break;
        case DP_CONF_FLOAT:
            if (*(const double *)pa != *(const double *)pb)
                return false;
            break;
        case DP_CONF_BOOL:
            if (*(const bool *)pa != *(const bool *)pb)
                return false;
            break;
        }
    }
    return true;
}

int config_check_table(char *err, size_t errsz)
{
    dp_config c;
    int rc = 0;
    memset(&c, 0, sizeof c);
    for (size_t i = 0; i < N_OPTIONS && !rc; i++) {
        const opt_desc *o = &options[i];
        char buf[256], msg[DP_ERRLEN];
        if (i && o->group < options[i - 1].group)
            rc = dp_err(err, errsz, DP_EINVAL, "%s: out of group order", o->name);
        else if (find_option(o->name, strlen(o->name)) != o)
            rc = dp_err(err, errsz, DP_EINVAL, "%s: duplicate key", o->name);
        else if (strchr(o->name, '-') || !o->help || strchr(o->help, '\n'))
            rc = dp_err(err, errsz, DP_EINVAL, "%s: bad name or help", o->name);
        else if ((o->type == DP_CONF_ENUM) != (o->values != NULL))
            rc = dp_err(err, errsz, DP_EINVAL, "%s: values for enums only", o->name);
        else if (default_text(o, buf, sizeof buf))
            rc = dp_err(err, errsz, DP_EINVAL, "%s: default must be quoted", o->name);
        else if (option_set(&c, o, buf, msg, sizeof msg))
            rc = dp_err(err, errsz, DP_EINVAL, "%s: default %s: %s", o->name, o->def, msg);
        if (rc)
            break;
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (!f) {
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
            break;
        }
        print_value(f, o->type, o->values, (char *)&c + o->offset);
        fclose(f);
        if (!text)
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
        else if (strcmp(text, o->def))
            rc = dp_err(err, errsz, DP_EINVAL, "%s: default %s prints as %s", o->name, o->def,
                        text);
        free(text);
    }
    config_destroy(&c);
    return rc;
}

/* --------------------------------------------------------------- config file */

/* Splits one line into key and value in place. Returns 1 for a key/value, 0
 * for a blank or comment line, <0 with err set ("KEY: ..." when a key was
 * read). */
static int split_line(char *line, char **key, char **value, char *err, size_t errsz)
{
    char *p = line;
    while (isspace((unsigned char)*p))
        p++;
    if (!*p || *p == '#')
        return 0;
    *key = p;
    while (isalnum((unsigned char)*p) || *p == '_' || *p == '-')
        p++;
    if (p == *key)
        return dp_err(err, errsz, DP_EFORMAT, "expected 'key = value'");
    char *kend = p;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p != '=') {
        *kend = '\0';
        return dp_err(err, errsz, DP_EFORMAT, "%s: expected '=' after the key", *key);
    }
    *kend = '\0';
    p++;
    while (*p == ' ' || *p == '\t')
        p++;

    if (*p == '"') {
        /* Unescape in place: the output never outruns the input. */
        char *out = ++p;
        *value = out;
        for (;;) {
            if (!*p)
                return dp_err(err, errsz, DP_EFORMAT, "%s: unterminated quoted value", *key);
            if (*p == '"')
                break;
            if (*p == '\\') {
                p++;
                switch (*p) {
                case '"': *out++ = '"'; break;
                case '\\': *out++ = '\\'; break;
                case 'n': *out++ = '\n'; break;
                case 'r': *out++ = '\r'; break;
                case 't': *out++ = '\t'; break;
                case '\0':
                    return dp_err(err, errsz, DP_EFORMAT, "%s: unterminated quoted value", *key);
                default:
                    return dp_err(err, errsz, DP_EFORMAT,
                                  "%s: unknown escape '\\%c' in a quoted value", *key, *p);
                }
                p++;
            } else {
                *out++ = *p++;
            }
        }
        *out = '\0';
        p++;
        while (isspace((unsigned char)*p))
            p++;
        if (*p && *p != '#')
            return dp_err(err, errsz, DP_EFORMAT, "%s: unexpected text after the closing quote",
                          *key);
        return 1;
    }

    *value = p;
    char *hash = strchr(p, '#');
    char *end = hash ? hash : p + strlen(p);
    while (end > p && isspace((unsigned char)end[-1]))
        end--;
    *end = '\0';
    return 1;
}

static int load_file(dp_config *c, const char *path, bool must_exist, char *err, size_t errsz)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT && !must_exist)
            return 0;
        return dp_err(err, errsz, errno == ENOENT ? DP_ENOTFOUND : DP_EIO, "%s: %s", path,
                      strerror(errno));
    }
    /* The line each key was last set on, for the duplicate warning. */
    int seen[N_OPTIONS];
    memset(seen, 0, sizeof seen);
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, rc = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = '\0';
        char *key = NULL, *value = NULL, msg[DP_ERRLEN];
        int r = split_line(line, &key, &value, msg, sizeof msg);
        if (r < 0) {
            rc = dp_err(err, errsz, r, "%s:%d: %s", path, lineno, msg);
            break;
        }
        if (r == 0)
            continue;
        const opt_desc *o = find_option(key, strlen(key));
        if (!o) {
            const char *near = suggest(key, strlen(key));
            rc = dp_err(err, errsz, DP_ENOTFOUND, "%s:%d: %s: unknown key%s%s%s", path, lineno,
                        key, near ? " (did you mean " : "", near ? near : "", near ? "?)" : "");
            break;
        }
        size_t idx = (size_t)(o - options);
        if (seen[idx])
            dp_log(DP_LOG_WARN, "%s:%d: %s: set again (first on line %d); the last one wins",
                   path, lineno, o->name, seen[idx]);
        seen[idx] = lineno;
        r = option_set(c, o, value, msg, sizeof msg);
        if (r) {
            rc = dp_err(err, errsz, r, "%s:%d: %s: %s", path, lineno, o->name, msg);
            break;
        }
    }
    if (!rc && ferror(f))
        rc = dp_err(err, errsz, DP_EIO, "%s: read error", path);
    free(line);
    fclose(f);
    return rc;
}

/* ------------------------------------------------------------ command line */

static const dp_config_flag *find_flag(const dp_config_cli *cli, const char *name, size_t len)
{
    for (size_t i = 0; cli && i < cli->n_extra; i++)
        if (name_eq(name, len, cli->extra[i].name))
            return &cli->extra[i];
    return NULL;
}

enum { META_CONFIG, META_HELP, META_VERSION, META_PRINT, META_CHECK, META_EXAMPLE };

static int find_meta(const char *name, size_t len)
{
    static const char *const meta[] = {"config", "help", "version", "print_config",
                                       "check_config", "print_example_config"};
    for (int i = 0; i < 6; i++)
        if (name_eq(name, len, meta[i]))
            return i;
    return -1;
}

static int parse_args(dp_config *c, int argc, char **argv, dp_config_cli *cli, char *err,
                      size_t errsz)
{
    cli->config_path = NULL;
    cli->help = cli->version = cli->print_config = cli->check_config = false;
    cli->print_example = false;
    for (size_t i = 0; i < cli->n_extra; i++) {
        const char *n = cli->extra[i].name;
        if (find_option(n, strlen(n)) || find_meta(n, strlen(n)) >= 0)
            return dp_err(err, errsz, DP_EINVAL, "--%s: defined twice", n);
    }

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h")) {
            cli->help = true;
            continue;
        }
        if (!strcmp(a, "-V")) {
            cli->version = true;
            continue;
        }
        if (!strcmp(a, "--")) {
            if (i + 1 < argc)
                return dp_err(err, errsz, DP_EINVAL, "unexpected argument '%s' (see --help)",
                              argv[i + 1]);
            break;
        }
        if (strncmp(a, "--", 2) != 0)
            return dp_err(err, errsz, DP_EINVAL, "unexpected argument '%s' (see --help)", a);

        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const char *value = eq ? eq + 1 : NULL;

        /* What kind of flag is it: meta, config key, caller's, or --no-X. */
        int meta = find_meta(name, len);
        const opt_desc *o = meta < 0 ? find_option(name, len) : NULL;
        const dp_config_flag *x = meta < 0 && !o ? find_flag(cli, name, len) : NULL;
        bool negated = false;
        if (meta < 0 && !o && !x && len > 3 && !strncmp(name, "no", 2) &&
            (name[2] == '-' || name[2] == '_')) {
            o = find_option(name + 3, len - 3);
            x = o ? NULL : find_flag(cli, name + 3, len - 3);
            negated = (o && o->type == DP_CONF_BOOL) || (x && x->type == DP_CONF_BOOL);
            if (!negated)
                o = NULL, x = NULL;
        }
        char shown[80];
        snprintf(shown, sizeof shown, "--%.*s", (int)(len < 70 ? len : 70), name);
        if (o)
            flag_name(o->name, shown, sizeof shown);
        else if (x)
            snprintf(shown, sizeof shown, "--%s", x->name);

        if (meta < 0 && !o && !x) {
            const char *near = suggest(name, len);
            char hint[80] = "";
            if (near)
                flag_name(near, hint, sizeof hint);
            return dp_err(err, errsz, DP_ENOTFOUND, "%s: unknown option%s%s%s", shown,
                          near ? " (did you mean " : " (see --help)", near ? hint : "",
                          near ? "?)" : "");
        }

        bool is_bool = (o && o->type == DP_CONF_BOOL) || (x && x->type == DP_CONF_BOOL) ||
                       (meta > META_CONFIG);
        if (negated) {
            if (value)
                return dp_err(err, errsz, DP_EINVAL, "--%.*s: takes no value", (int)len, name);
            value = "false";
        } else if (is_bool && !value) {
            value = "true";
        } else if (!value) {
            if (i + 1 >= argc)
                return dp_err(err, errsz, DP_EINVAL, "%s: missing value", shown);
            value = argv[++i];
        }

        char msg[DP_ERRLEN];
        int rc = 0;
        if (meta == META_CONFIG) {
            cli->config_path = value;
        } else if (meta >= 0) {
            bool on;
            if (parse_bool(value, &on))
                return dp_err(err, errsz, DP_EINVAL, "%s: '%s' is not a boolean", shown, value);
            bool *dst[] = {NULL, &cli->help, &cli->version, &cli->print_config,
                           &cli->check_config, &cli->print_example};
            *dst[meta] = on;
        } else if (o) {
            rc = option_set(c, o, value, msg, sizeof msg);
        } else {
            rc = parse_value(x->type, value, x->min, x->max, x->values, 0, x->dst, false, msg,
                             sizeof msg);
        }
        if (rc)
            return dp_err(err, errsz, rc, "%s: %s", shown, msg);
    }
    return 0;
}

/* ------------------------------------------------------- validation, main */

static int validate(const dp_config *c, char *err, size_t errsz)
{
    if (!c->model[0])
        return dp_err(err, errsz, DP_EINVAL, "model: no model file given");
    if (c->dualpath && c->prefill_pool_fraction >= 1.0)
        return dp_err(err, errsz, DP_EINVAL,
                      "prefill_pool_fraction: 1 leaves no memory for the decode pool "
                      "(set dualpath = false to run without one)");
    return 0;
}

/* Messages quote what they refuse (a flag, a value, a key); whatever bytes
 * those held, the message stays one printable line. */
static int one_line(int rc, char *err, size_t errsz)
{
    if (rc && errsz)
        for (char *p = err; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
    return rc;
}

int config_load_file(dp_config *c, const char *path, bool must_exist, char *err, size_t errsz)
{
    return one_line(load_file(c, path, must_exist, err, errsz), err, errsz);
}

int config_parse_args(dp_config *c, int argc, char **argv, dp_config_cli *cli, char *err,
                      size_t errsz)
{
    return one_line(parse_args(c, argc, argv, cli, err, errsz), err, errsz);
}

int config_validate(const dp_config *c, char *err, size_t errsz)
{
    return one_line(validate(c, err, errsz), err, errsz);
}

int config_main_load(dp_config *c, int argc, char **argv, dp_config_cli *cli, char *err,
                     size_t errsz)
{
    int rc = config_defaults(c);
    if (rc)
        return dp_err(err, errsz, rc, "out of memory");
    /* A first pass finds --config wherever it is, and rejects bad flags before
     * the file is read; the second applies the flags over the file. */
    rc = config_parse_args(c, argc, argv, cli, err, errsz);
    if (rc || cli->help || cli->version || cli->print_example)
        return rc;
    config_destroy(c);
    rc = config_defaults(c);
    if (rc)
        return dp_err(err, errsz, rc, "out of memory");
    const char *path = cli->config_path ? cli->config_path : DP_CONFIG_DEFAULT_PATH;
    if (*path) {
        rc = config_load_file(c, path, cli->config_path != NULL, err, errsz);
        if (rc)
            return rc;
    }
    rc = config_parse_args(c, argc, argv, cli, err, errsz);
    if (rc)
        return rc;
    return config_validate(c, err, errsz);
}

/* ----------------------------------------------------------------- printing */

void config_print(const dp_config *c, FILE *f)
{
    int group = -1;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_desc *o = &options[i];
        if (o->group != group) {
            fprintf(f, "%s# %s\n", group < 0 ? "" : "\n", group_titles[o->group]);
            group = o->group;
        }
        fprintf(f, "%s = ", o->name);
        print_value(f, o->type, o->values, (const char *)c + o->offset);
        fputc('\n', f);
    }
}

/* "int, [16, 65536]", "size, [1KiB, 1GiB]", "knorm|snapkv|...", "bool". */
static void describe_type(dp_config_type t, double min, double max, const char *const *values,
                          unsigned flags, char *buf, size_t bufsz)
{
    static const char *const names[] = {"string", "int",  "uint",  "float",
                                        "bool",   "size", "duration", "enum"};
    size_t n = (size_t)snprintf(buf, bufsz, "%s", names[t]);
    if (t == DP_CONF_ENUM) {
        n = 0;
        buf[0] = '\0';
        for (int i = 0; values[i] && n < bufsz; i++)
            n += (size_t)snprintf(buf + n, bufsz - n, "%s%s", i ? "|" : "", values[i]);
    } else if (min < max && n < bufsz) {
        char lo[32], hi[32];
        format_bound(t, min, lo, sizeof lo);
        format_bound(t, max, hi, sizeof hi);
        n += (size_t)snprintf(buf + n, bufsz - n, " in [%s, %s]%s", lo, hi,
                              flags & OPT_POW2 ? ", a power of two" : "");
    }
}

static const char *default_metavar(dp_config_type t)
{
    switch (t) {
    case DP_CONF_STRING: return "TEXT";
    case DP_CONF_FLOAT: return "X";
    case DP_CONF_SIZE: return "SIZE";
    case DP_CONF_DURATION: return "TIME";
    default: return "N";
    }
}

/* One --help entry: the flag in a column, then what it is, then the help. */
static void print_help_entry(FILE *f, const char *flag, const char *metavar, dp_config_type t,
                             const char *what, const char *help)
{
    char left[128];
    if (t == DP_CONF_BOOL)
        snprintf(left, sizeof left, "--[no-]%s", flag + 2);
    else if (t == DP_CONF_ENUM && !metavar)
        snprintf(left, sizeof left, "%s %s", flag, "VALUE");
    else
        snprintf(left, sizeof left, "%s %s", flag, metavar ? metavar : default_metavar(t));
    if (strlen(left) > 28)
        fprintf(f, "  %s\n  %-28s  %s\n", left, "", what);
    else
        fprintf(f, "  %-28s  %s\n", left, what);
    fprintf(f, "      %s\n", help);
}

void config_print_help(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [--config FILE] [--OPTION VALUE ...]\n"
            "\n"
            "Settings come from built-in defaults, then the config file, then the command\n"
            "line. Every option below is a config-file key of the same name written with\n"
            "underscores (max_batched_tokens = 512); on the command line\n"
            "--max-batched-tokens 512, --max-batched-tokens=512 and --max_batched_tokens 512\n"
            "are the same. Booleans take --NAME, --no-NAME or --NAME=true|false|on|off|yes|no.\n"
            "Sizes take B, KiB, MiB, GiB, TiB (K, M, G, T and KB, MB, GB, TB are the same\n"
            "powers of 1024); durations take ms, s, min, h (a bare number is seconds).\n"
            "\n"
            "General:\n"
            "  --config FILE                 config file (default %s;\n"
            "                                that one may be missing; '' reads none)\n"
            "  --print-config                print the effective configuration as a config\n"
            "                                file and exit\n"
            "  --check-config                validate the configuration; exit 0 if it is valid\n"
            "  --help, -h                    this help\n"
            "  --version, -V                 print the version and exit\n",
            prog, DP_CONFIG_DEFAULT_PATH);
    int group = -1;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_desc *o = &options[i];
        if (o->group != group) {
            fprintf(f, "\n%s:\n", group_titles[o->group]);
            group = o->group;
        }
        char flag[80], type[160], what[256];
        flag_name(o->name, flag, sizeof flag);
        describe_type(o->type, o->min, o->max, o->values, o->flags, type, sizeof type);
        snprintf(what, sizeof what, "%s, default %s", type, o->def);
        print_help_entry(f, flag, o->metavar, o->type, what, o->help);
    }
}

void config_print_flags_help(FILE *f, const char *title, const dp_config_flag *flags, size_t n)
{
    fprintf(f, "\n%s:\n", title);
    for (size_t i = 0; i < n; i++) {
        const dp_config_flag *x = &flags[i];
        char flag[80], type[160];
        snprintf(flag, sizeof flag, "--%s", x->name);
        describe_type(x->type, x->min, x->max, x->values, 0, type, sizeof type);
        print_help_entry(f, flag, x->metavar, x->type, type, x->help);
    }
}

void config_print_example(FILE *f)
{
    fputs("# dualpathd.conf: the dualpathd configuration, read from\n"
          "# " DP_CONFIG_DEFAULT_PATH " or from --config FILE.\n"
          "#\n"
          "# Every key is shown at its default, commented out: uncomment a line to change\n"
          "# it. Each key is also a command-line flag (max_seqs = 8 is --max-seqs 8), and\n"
          "# flags win over this file. `dualpathd --print-config` prints the effective\n"
          "# configuration in this syntax; `dualpathd --check-config` validates it.\n"
          "#\n"
          "# Syntax: key = value, one per line; '#' starts a comment; strings may be\n"
          "# \"quoted\" (with \\\" and \\\\ escapes); booleans are true/false (on/off,\n"
          "# yes/no, 1/0); sizes take B, KiB, MiB, GiB, TiB (1.5GiB); durations take ms,\n"
          "# s, min, h (a bare number is seconds). A key set twice: the last one wins.\n"
          "#\n"
          "# This file is generated from the option table in conf/config.c\n"
          "# (dualpathd --print-example-config); a unit test keeps the two equal.\n",
          f);
    dp_config c;
    int rc = config_defaults(&c);
    int group = -1;
    for (size_t i = 0; i < N_OPTIONS && !rc; i++) {
        const opt_desc *o = &options[i];
        if (o->group != group) {
            fprintf(f, "\n\n# ---- %s\n", group_titles[o->group]);
            group = o->group;
        }
        char type[160];
        describe_type(o->type, o->min, o->max, o->values, o->flags, type, sizeof type);
        fprintf(f, "\n# %s\n# (%s%s%s)\n#%s = ", o->help, type,
                o->type == DP_CONF_STRING && o->metavar ? ": " : "",
                o->type == DP_CONF_STRING && o->metavar ? o->metavar : "", o->name);
        print_value(f, o->type, o->values, (const char *)&c + o->offset);
        fputc('\n', f);
    }
    config_destroy(&c);
}

const char *config_model_name(const dp_config *c, char *buf, size_t bufsz)
{
    const char *name = c->model_name[0] ? c->model_name : c->model;
    size_t len;
    if (!c->model_name[0]) {
        const char *slash = strrchr(name, '/');
        if (slash)
            name = slash + 1;
        len = strlen(name);
        if (len > 5 && !strcasecmp(name + len - 5, ".gguf"))
            len -= 5;
    } else {
        len = strlen(name);
    }
    if (bufsz == 0)
        return buf;
    if (len >= bufsz)
        len = bufsz - 1;
    memcpy(buf, name, len);
    buf[len] = '\0';
    return buf;
}
