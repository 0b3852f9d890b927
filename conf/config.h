/* config.h: dualpathd's configuration: the dp_config struct, its defaults, the
 * config file and command-line parsers, validation, --help and --print-config.
 *
 * Precedence: built-in defaults < config file < command-line flags. Every key
 * is described once, in the option table of config.c; a new key is one table
 * row there plus one field here. Keys are written with underscores in the file
 * (max_batched_tokens = 512) and with dashes or underscores on the command
 * line (--max-batched-tokens 512, --max_batched_tokens=512). */
#ifndef DP_CONF_CONFIG_H
#define DP_CONF_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define DP_CONFIG_DEFAULT_PATH "/etc/dualpath/dualpathd.conf"

/* log_level's values are the DP_LOG_* levels of common/dp.h. */

/* scorer's values: which importance scorer picks the kept tokens. */
enum dp_conf_scorer {
    DP_CONF_SCORER_KNORM = 0,      /* low key L2 norm first (the research default) */
    DP_CONF_SCORER_KNORM_HIGH = 1, /* high key norm first: a measured control only */
    DP_CONF_SCORER_SNAPKV = 2,     /* attention from the last prompt queries */
    DP_CONF_SCORER_RECENT = 3,     /* sinks + recent window only */
    DP_CONF_SCORER_RANDOM = 4,     /* the baseline */
};

/* Strings are owned (malloc'd) and never NULL after config_defaults();
 * config_destroy() frees them. Sizes are bytes, durations milliseconds. */
typedef struct dp_config {
    /* Model (model/, kernels/) */
    char *model;
    char *model_name;       /* "" = derived from the model file: config_model_name() */
    char *chat_template;    /* "" = the model's; else a file, or the Jinja text itself */
    char *device;           /* auto | cpu | cuda | cuda:N */
    int threads;            /* 0 = all cores */
    bool cuda_graphs;       /* record and replay decode steps (CUDA) */
    bool exact_matmul;      /* CPU: no int8 activations in matmuls */
    int context_length;     /* 0 = the model's */

    /* Server (api/, daemon/) */
    char *listen;           /* host:port, [v6]:port or unix:/path: config_parse_listen() */
    uint64_t max_body_bytes;
    int max_connections;
    int max_connections_per_ip; /* 0 = 7/8 of max_connections */
    int64_t header_timeout_ms;
    int64_t body_timeout_ms;
    int64_t idle_timeout_ms;
    int64_t request_timeout_ms;
    char *api_key_file;     /* "" = no authentication */
    bool health_public;
    bool metrics_public;
    char *cors_origins;     /* "" none, "*" any, or comma-separated origins */
    int64_t drain_timeout_ms;
    int max_queue;
    int default_max_tokens;
    int log_level;          /* DP_LOG_* */
    bool watchdog;

    /* Scheduler (sched/) */
    int max_batched_tokens;
    int max_seqs;

    /* KV cache (kvcache/) */
    uint64_t kv_memory;
    double gpu_memory_fraction;
    double prefill_pool_fraction;
    int block_tokens;
    int decode_block_tokens;
    uint64_t host_tier_bytes;
    uint64_t swap_space;
    bool prefix_cache;
    bool swa_full;          /* sliding-window layers keep every token (llama.cpp's --swa-full) */
    int kv_cache_type;      /* dp_kv_type: 0 f32, 1 f16, 2 q8_0, 3 q4_0 */

    /* Dual path: what survives the prefill -> decode switch (kvcache/, sched/) */
    bool dualpath;
    int decode_kv_type;     /* 0 = same as kv_cache_type, else dp_kv_type + 1 */
    int scorer;             /* enum dp_conf_scorer */
    double keep_ratio;
    int sink_tokens;
    int window_tokens;
    bool keep_system_prompt;
    int decode_budget;      /* 0 = off */
    bool early_switch;
    int early_switch_min_tokens; /* prompt tokens computed before an early switch */
    bool reuse_replies;
    bool resume_turns;
    int exempt_layers;      /* decode-path layers kept whole (0 = none) */
    int compress_turns;     /* 0 auto, 1 always, 2 never */
} dp_config;

/* Value types, shared by the config table and by caller-defined flags. */
typedef enum dp_config_type {
    DP_CONF_STRING,   /* char * (owned) in dp_config; const char * into argv for a flag */
    DP_CONF_INT,      /* int */
    DP_CONF_U64,      /* uint64_t, a plain integer */
    DP_CONF_FLOAT,    /* double */
    DP_CONF_BOOL,     /* bool */
    DP_CONF_SIZE,     /* uint64_t bytes; accepts 2GiB, 512MiB, 1.5G, 64K, 1024 */
    DP_CONF_DURATION, /* int64_t milliseconds; accepts 500ms, 30s, 5min, 1h; bare = seconds */
    DP_CONF_ENUM,     /* int: the index into values */
} dp_config_type;

/* A command-line flag that is not a config key (the one-shot mode's --prompt,
 * --max-tokens ...): config_parse_args() parses it with the same rules and
 * types and stores it at dst (const char ** for STRING: it points into argv). */
typedef struct dp_config_flag {
    const char *name;          /* "max-tokens" */
    dp_config_type type;
    void *dst;
    double min, max;           /* numbers: checked when min < max */
    const char *const *values; /* ENUM: NULL-terminated */
    const char *metavar;       /* for --help ("TEXT"); NULL: from the type */
    const char *help;          /* one line; say the default here */
} dp_config_flag;

/* Meta flags, filled by config_parse_args(); extra/n_extra are the caller's. */
typedef struct dp_config_cli {
    const dp_config_flag *extra; /* in: the caller's own flags (may be NULL) */
    size_t n_extra;
    const char *config_path;     /* --config FILE (points into argv); NULL: the default */
    bool help;                   /* --help, -h */
    bool version;                /* --version, -V */
    bool print_config;           /* --print-config */
    bool check_config;           /* --check-config */
    bool print_example;          /* --print-example-config (hidden) */
} dp_config_cli;

/* Sets every key to its default. Returns 0 or DP_ENOMEM; in either case the
 * struct may be passed to config_destroy(). */
int config_defaults(dp_config *c);
void config_destroy(dp_config *c);

/* Applies the `key = value` lines of a file over c. A missing file is not an
 * error when !must_exist (the default path). Errors read
 * "PATH:LINE: KEY: what is wrong". On error c may hold some of the file's
 * values. */
int config_load_file(dp_config *c, const char *path, bool must_exist, char *err, size_t errsz);

/* Parses argv[1..] over c. Config keys go to c, the caller's flags (cli->extra)
 * to their dst, meta flags to cli (whose other fields it resets first).
 * Positional arguments are errors. Errors read "--FLAG: what is wrong". */
int config_parse_args(dp_config *c, int argc, char **argv, dp_config_cli *cli, char *err,
                      size_t errsz);

/* Cross-key checks that one key's range cannot express. */
int config_validate(const dp_config *c, char *err, size_t errsz);

/* The whole start-up sequence: defaults, then the file (cli->config_path, or
 * DP_CONFIG_DEFAULT_PATH which may be missing; --config '' reads none), then
 * the flags, then config_validate(). With --help, --version or
 * --print-example-config it reads no file (so help works with a broken
 * config). c is always initialized on return: config_destroy() it. */
int config_main_load(dp_config *c, int argc, char **argv, dp_config_cli *cli, char *err,
                     size_t errsz);

/* Every key as `key = value` lines that config_load_file() reads back into an
 * identical struct. */
void config_print(const dp_config *c, FILE *f);
/* The commented example file (conf/dualpathd.conf): every key at its default. */
void config_print_example(FILE *f);
/* Usage, meta flags and every config key with its type, default and range. */
void config_print_help(FILE *f, const char *prog);
/* A titled --help section for the caller's own flags. */
void config_print_flags_help(FILE *f, const char *title, const dp_config_flag *flags, size_t n);

bool config_equal(const dp_config *a, const dp_config *b);

/* Checks the option table itself (unique names, defaults that parse, are in
 * range and print back as written). For the unit test. */
int config_check_table(char *err, size_t errsz);

/* Value helpers, also used by the table. Errors name the value, not the key. */
int config_parse_size(const char *s, uint64_t *out, char *err, size_t errsz);
int config_parse_duration(const char *s, int64_t *ms, char *err, size_t errsz);
/* "0, 1,5" -> {0, 1, 5}; "" -> none. Values in [0, 65535]. */
int config_parse_int_list(const char *s, int *out, int cap, int *n, char *err, size_t errsz);

/* "127.0.0.1:8080", "localhost:80", "[::1]:8080" -> host (without brackets)
 * and port (0 = any free port); "unix:/run/x.sock" -> unix_path, host "" and
 * port -1. */
int config_parse_listen(const char *s, char *host, size_t hostsz, int *port, char *unix_path,
                        size_t unixsz, char *err, size_t errsz);

/* The served model name: model_name, or the model file's name without its
 * directory and ".gguf". Returns buf. */
const char *config_model_name(const dp_config *c, char *buf, size_t bufsz);

#endif
