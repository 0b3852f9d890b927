/* test_config.c: conf/: the option table, the config file and flag parsers,
 * their error messages, precedence, printing round trips and the example file.
 * `test_config --print-example` regenerates conf/dualpathd.conf. */
#include "t.h"

#include <unistd.h>

#include "common/dp.h"
#include "conf/config.h"

#define EXAMPLE_PATH "conf/dualpathd.conf"

static char tmp_path[64];

/* Writes text to a fresh temporary file; returns its path (valid until the
 * next call). */
static const char *write_tmp(const char *text)
{
    if (tmp_path[0])
        unlink(tmp_path);
    snprintf(tmp_path, sizeof tmp_path, "/tmp/dp_test_config_XXXXXX");
    int fd = mkstemp(tmp_path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    CHECK(f != NULL);
    CHECK(fputs(text, f) >= 0);
    CHECK(fclose(f) == 0);
    return tmp_path;
}

/* Loads text as a config file over the defaults; returns the code, err set. */
static int load_text(dp_config *c, const char *text, char *err, size_t errsz)
{
    CHECK(config_defaults(c) == 0);
    return config_load_file(c, write_tmp(text), true, err, errsz);
}

/* The file fails with exactly "PATH:" + expected. */
static void check_file_error(const char *text, const char *expected)
{
    dp_config c;
    char err[DP_ERRLEN], want[DP_ERRLEN + 64];
    int rc = load_text(&c, text, err, sizeof err);
    CHECK_MSG(rc < 0, "'%s' loaded", text);
    snprintf(want, sizeof want, "%s:%s", tmp_path, expected);
    CHECK_MSG(!strcmp(err, want), "got '%s', want '%s'", err, want);
    config_destroy(&c);
}

static int parse_argv(dp_config *c, dp_config_cli *cli, char *err, size_t errsz, int argc,
                      const char **args)
{
    char *argv[32];
    CHECK(argc < 31);
    argv[0] = (char *)"dualpathd";
    for (int i = 0; i < argc; i++)
        argv[i + 1] = (char *)args[i];
    argv[argc + 1] = NULL;
    return config_parse_args(c, argc + 1, argv, cli, err, errsz);
}

#define ARGS(...) (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)), \
                  (const char *[]){__VA_ARGS__}

static void check_flag_error(const char *expected, int argc, const char **args)
{
    dp_config c;
    dp_config_cli cli = {0};
    char err[DP_ERRLEN];
    CHECK(config_defaults(&c) == 0);
    int rc = parse_argv(&c, &cli, err, sizeof err, argc, args);
    CHECK_MSG(rc < 0, "flags accepted, want '%s'", expected);
    CHECK_MSG(!strcmp(err, expected), "got '%s', want '%s'", err, expected);
    config_destroy(&c);
}

static char *print_to_string(const dp_config *c, bool example)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    if (example)
        config_print_example(f);
    else
        config_print(c, f);
    CHECK(fclose(f) == 0);
    CHECK(text != NULL);
    return text;
}

static void test_table_and_defaults(void)
{
    char err[DP_ERRLEN];
    CHECK_MSG(config_check_table(err, sizeof err) == 0, "%s", err);
    dp_config c;
    CHECK(config_defaults(&c) == 0);
    CHECK(!strcmp(c.model, "/var/lib/dualpath/models/model.gguf"));
    CHECK(!strcmp(c.model_name, ""));
    CHECK(!strcmp(c.chat_template, ""));
    CHECK(!strcmp(c.device, "auto"));
    CHECK(!strcmp(c.listen, "127.0.0.1:8080"));
    CHECK(c.prefix_cache);
    CHECK_EQ_INT(c.drain_timeout_ms, 30000);
    CHECK_EQ_INT(c.threads, 0);
    CHECK_EQ_INT(c.max_body_bytes, 1 << 20);
    CHECK_EQ_INT(c.max_connections, 256);
    CHECK_EQ_INT(c.request_timeout_ms, 600000);
    CHECK_EQ_INT(c.max_queue, 256);
    CHECK_EQ_INT(c.log_level, DP_LOG_INFO);
    CHECK_EQ_INT(c.max_batched_tokens, 512);
    CHECK_EQ_INT(c.max_seqs, 64);
    CHECK_EQ_INT(c.context_length, 0);
    CHECK_EQ_INT(c.block_tokens, 16);
    CHECK_EQ_INT(c.decode_block_tokens, 16);
    CHECK_EQ_INT(c.kv_memory, (uint64_t)1 << 30);
    CHECK(c.prefill_pool_fraction == 0.25);
    CHECK(c.dualpath && c.watchdog && !c.early_switch);
    CHECK_EQ_INT(c.scorer, DP_CONF_SCORER_SNAPKV);
    CHECK(c.keep_ratio == 1.0);
    CHECK_EQ_INT(c.sink_tokens, 4);
    CHECK_EQ_INT(c.window_tokens, 32);
    CHECK_EQ_INT(c.decode_budget, 0);
    CHECK_EQ_INT(c.host_tier_bytes, 0);
    CHECK_EQ_INT(c.swap_space, (uint64_t)4 << 30);
    CHECK(c.gpu_memory_fraction == 0.9);
    CHECK_EQ_INT(c.default_max_tokens, 0);
    CHECK_MSG(config_validate(&c, err, sizeof err) == 0, "%s", err);

    char name[64];
    CHECK(!strcmp(config_model_name(&c, name, sizeof name), "model"));
    free(c.model);
    c.model = strdup("llama-3.2-1b.Q8_0.GGUF");
    CHECK(c.model);
    CHECK(!strcmp(config_model_name(&c, name, sizeof name), "llama-3.2-1b.Q8_0"));
    free(c.model_name);
    c.model_name = strdup("llama");
    CHECK(c.model_name);
    CHECK(!strcmp(config_model_name(&c, name, sizeof name), "llama"));
    CHECK(!strcmp(config_model_name(&c, name, 3), "ll"));
    config_destroy(&c);
    CHECK(c.model == NULL);
    config_destroy(&c); /* twice is harmless */
}

static void test_file_syntax(void)
{
    dp_config c;
    char err[DP_ERRLEN];
    const char *text =
        "# a comment\n"
        "\n"
        "   \t\n"
        "max_seqs=8\n"
        "  max_batched_tokens   =   1024   # trailing comment\n"
        "model = \"/models/a b#c.gguf\"   # quoted: '#' and spaces kept\n"
        "model_name = plain name  \n"
        "listen = \"[::1]:9000\"\n"
        "kv_memory = 2GiB\n"
        "host_tier_bytes = 1.5G\n"
        "swap_space = 256MiB\n"
        "max_body_bytes = 512KiB\n"
        "request_timeout = 500ms\n"
        "dualpath = off\n"
        "watchdog = No\n"
        "early_switch = 1\n"
        "scorer = snapkv\n"
        "log_level = debug\n"
        "keep_ratio = 0.25\n"
        "device = cuda:1\n"
        "prefix_cache = off\n"
        "drain_timeout = 5s\n"
        "model-name = \"esc \\\"q\\\" \\\\ \\t\"\r\n" /* dashes, escapes, CRLF */
        "threads = 4\r\n"
        "threads = 6\n" /* duplicate: the last wins, with a warning */
        "context_length = 4096";                 /* no final newline */
    CHECK_MSG(load_text(&c, text, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(c.max_seqs, 8);
    CHECK_EQ_INT(c.max_batched_tokens, 1024);
    CHECK(!strcmp(c.model, "/models/a b#c.gguf"));
    CHECK(!strcmp(c.model_name, "esc \"q\" \\ \t"));
    CHECK(!strcmp(c.listen, "[::1]:9000"));
    CHECK_EQ_INT(c.kv_memory, (uint64_t)2 << 30);
    CHECK_EQ_INT(c.host_tier_bytes, (uint64_t)3 << 29);
    CHECK_EQ_INT(c.swap_space, (uint64_t)256 << 20);
    CHECK_EQ_INT(c.max_body_bytes, 512 << 10);
    CHECK_EQ_INT(c.request_timeout_ms, 500);
    CHECK(!c.dualpath && !c.watchdog && c.early_switch);
    CHECK_EQ_INT(c.scorer, DP_CONF_SCORER_SNAPKV);
    CHECK_EQ_INT(c.log_level, DP_LOG_DEBUG);
    CHECK(c.keep_ratio == 0.25);
    CHECK(!strcmp(c.device, "cuda:1"));
    CHECK(!c.prefix_cache);
    CHECK_EQ_INT(c.drain_timeout_ms, 5000);
    CHECK_EQ_INT(c.threads, 6);
    CHECK_EQ_INT(c.context_length, 4096);
    config_destroy(&c);

    /* chat_template: a path, or the template itself (quoted: it may hold '#'). */
    CHECK_MSG(load_text(&c, "chat_template = \"{%- for m in messages %}{{ m.content }}{# c #}{% endfor %}\"\n",
                        err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(c.chat_template, "{%- for m in messages %}{{ m.content }}{# c #}{% endfor %}"));
    config_destroy(&c);
    CHECK_MSG(load_text(&c, "chat_template = /etc/dualpath/chat.jinja\n", err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(c.chat_template, "/etc/dualpath/chat.jinja"));
    config_destroy(&c);

    /* An unquoted value ends at '#'; an empty string is allowed. */
    CHECK_MSG(load_text(&c, "model = a#b\nmodel_name =\n", err, sizeof err) == 0, "%s",
              err);
    CHECK(!strcmp(c.model, "a"));
    CHECK(!strcmp(c.model_name, ""));
    config_destroy(&c);

    /* A missing default file is fine; a missing given file is not. */
    CHECK(config_defaults(&c) == 0);
    CHECK(config_load_file(&c, "/nonexistent/dualpathd.conf", false, err, sizeof err) == 0);
    int rc = config_load_file(&c, "/nonexistent/dualpathd.conf", true, err, sizeof err);
    CHECK(rc == DP_ENOTFOUND);
    CHECK_MSG(strstr(err, "/nonexistent/dualpathd.conf") == err, "%s", err);
    /* A directory is not a missing file: it is an error even as the default. */
    CHECK(config_load_file(&c, "/", false, err, sizeof err) == DP_EIO);
    config_destroy(&c);
}

static void test_file_errors(void)
{
    check_file_error("# ok\nbogus_key = 1\n", "2: bogus_key: unknown key");
    check_file_error("max_seq = 1\n", "1: max_seq: unknown key (did you mean max_seqs?)");
    check_file_error("\n\nmax_seqs = 0\n", "3: max_seqs: 0 is out of range [1, 4096]");
    check_file_error("max_seqs = 5000\n", "1: max_seqs: 5000 is out of range [1, 4096]");
    check_file_error("max_seqs = 12x\n", "1: max_seqs: '12x' is not an integer");
    check_file_error("max_seqs = 1.5\n", "1: max_seqs: '1.5' is not an integer");
    check_file_error("max_seqs = 99999999999\n", "1: max_seqs: 99999999999 is out of range");
    check_file_error("max_seqs =\n", "1: max_seqs: empty value");
    check_file_error("max_seqs 12\n", "1: max_seqs: expected '=' after the key");
    check_file_error("max_seqs\n", "1: max_seqs: expected '=' after the key");
    check_file_error("= 12\n", "1: expected 'key = value'");
    check_file_error("scorer = h2o\n",
                     "1: scorer: 'h2o' is not one of knorm, knorm_high, snapkv, recent, random");
    check_file_error("log_level = verbose\n",
                     "1: log_level: 'verbose' is not one of error, warn, info, debug");
    check_file_error("kv_memory = 2XB\n",
                     "1: kv_memory: '2XB': unknown size suffix 'XB' (use B, KiB, MiB, GiB or TiB)");
    check_file_error("kv_memory = GiB\n",
                     "1: kv_memory: 'GiB' is not a size (e.g. 1024, 512KiB, 2GiB, 1.5G)");
    check_file_error("kv_memory = -1\n",
                     "1: kv_memory: '-1' is not a size (e.g. 1024, 512KiB, 2GiB, 1.5G)");
    check_file_error("kv_memory = 65TiB\n", "1: kv_memory: 65TiB is out of range [0, 64TiB]");
    check_file_error("kv_memory = 99999999999999999999\n",
                     "1: kv_memory: 99999999999999999999 is too large");
    check_file_error("kv_memory = 99999999999T\n", "1: kv_memory: 99999999999T is too large");
    check_file_error("request_timeout = 5 parsecs\n",
                     "1: request_timeout: '5 parsecs': unknown duration unit 'parsecs' "
                     "(use ms, s, min or h)");
    check_file_error("request_timeout = 2d\n",
                     "1: request_timeout: '2d': unknown duration unit 'd' (use ms, s, min or h)");
    check_file_error("request_timeout = 25h\n",
                     "1: request_timeout: 25h is out of range [0s, 24h]");
    check_file_error("model = \"abc\n", "1: model: unterminated quoted value");
    check_file_error("model = \"abc\\\n", "1: model: unterminated quoted value");
    check_file_error("model = \"a\\qb\"\n", "1: model: unknown escape '\\q' in a quoted value");
    check_file_error("model = \"a\" b\n", "1: model: unexpected text after the closing quote");
    check_file_error("dualpath = maybe\n",
                     "1: dualpath: 'maybe' is not a boolean (true|false|on|off|yes|no|1|0)");
    check_file_error("keep_ratio = 1.5\n", "1: keep_ratio: 1.5 is out of range [0, 1]");
    check_file_error("keep_ratio = nan\n", "1: keep_ratio: 'nan' is not a number");
    check_file_error("keep_ratio = half\n", "1: keep_ratio: 'half' is not a number");
    check_file_error("block_tokens = 24\n", "1: block_tokens: 24 is not a power of two");
    check_file_error("block_tokens = 512\n", "1: block_tokens: 512 is out of range [1, 256]");
    check_file_error("device = gpu\n", "1: device: 'gpu' is not auto, cpu, cuda or cuda:N");
    check_file_error("device = cuda:x\n", "1: device: 'cuda:x' is not auto, cpu, cuda or cuda:N");
    check_file_error("listen = 8080\n",
                     "1: listen: '8080': expected HOST:PORT, [IPv6]:PORT or unix:/PATH");
    check_file_error("exempt_layers = 0,1\n", "1: exempt_layers: '0,1' is not an integer");
    check_file_error("exempt_heads = 2\n", "1: exempt_heads: unknown key");
}

static const char *prompt;
static bool chat, verbose;
static int max_tokens = 128;
static double temperature = 0.8;
static uint64_t seed;
static const dp_config_flag oneshot_flags[] = {
    {"prompt", DP_CONF_STRING, &prompt, 0, 0, NULL, "TEXT", "complete TEXT and exit"},
    {"chat", DP_CONF_BOOL, &chat, 0, 0, NULL, NULL, "apply the chat template"},
    {"max-tokens", DP_CONF_INT, &max_tokens, 0, 1 << 20, NULL, NULL, "tokens (default 128)"},
    {"temperature", DP_CONF_FLOAT, &temperature, 0, 100, NULL, "T", "0 = greedy (default 0.8)"},
    {"seed", DP_CONF_U64, &seed, 0, 0, NULL, NULL, "sampling seed (default 0)"},
    {"verbose", DP_CONF_BOOL, &verbose, 0, 0, NULL, NULL, "timings on stderr"},
};

static void test_flags(void)
{
    dp_config c;
    dp_config_cli cli = {.extra = oneshot_flags, .n_extra = 6};
    char err[DP_ERRLEN];
    CHECK(config_defaults(&c) == 0);
    int rc = parse_argv(&c, &cli, err, sizeof err,
                        ARGS("--max-seqs", "8", "--max_batched_tokens=1024", "--no-dualpath",
                             "--early-switch", "--watchdog=off", "--kv-memory", "512MiB",
                             "--scorer=recent", "--model", "/m.gguf", "--prompt", "--hello",
                             "--chat", "--max-tokens=5", "--temperature", "0", "--seed",
                             "18446744073709551615", "--no-verbose", "--listen", "unix:/run/d.sock",
                             "--request-timeout", "30s", "--config", "/x.conf", "--check-config"));
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(c.max_seqs, 8);
    CHECK_EQ_INT(c.max_batched_tokens, 1024);
    CHECK(!c.dualpath && c.early_switch && !c.watchdog);
    CHECK_EQ_INT(c.kv_memory, (uint64_t)512 << 20);
    CHECK_EQ_INT(c.scorer, DP_CONF_SCORER_RECENT);
    CHECK(!strcmp(c.model, "/m.gguf"));
    CHECK(!strcmp(c.listen, "unix:/run/d.sock"));
    CHECK_EQ_INT(c.request_timeout_ms, 30000);
    CHECK(prompt && !strcmp(prompt, "--hello")); /* a value may start with dashes */
    CHECK(chat && !verbose);
    CHECK_EQ_INT(max_tokens, 5);
    CHECK(temperature == 0);
    CHECK(seed == UINT64_MAX);
    CHECK(cli.config_path && !strcmp(cli.config_path, "/x.conf"));
    CHECK(cli.check_config && !cli.help && !cli.version && !cli.print_config);

    /* Meta flags reset on each parse; -h, -V and the hidden example. */
    CHECK(parse_argv(&c, &cli, err, sizeof err, ARGS("-h", "-V", "--print-config")) == 0);
    CHECK(cli.help && cli.version && cli.print_config && !cli.check_config && !cli.config_path);
    CHECK(parse_argv(&c, &cli, err, sizeof err, ARGS("--print-example-config", "--")) == 0);
    CHECK(cli.print_example);
    CHECK(parse_argv(&c, &cli, err, sizeof err, ARGS("--dualpath=yes", "--chat=false")) == 0);
    CHECK(c.dualpath && !chat);
    config_destroy(&c);

    check_flag_error("--max-seqs: 0 is out of range [1, 4096]", ARGS("--max-seqs", "0"));
    check_flag_error("--max-seqs: 0 is out of range [1, 4096]", ARGS("--max_seqs=0"));
    check_flag_error("--max-seqs: missing value", ARGS("--max-seqs"));
    check_flag_error("--max-seqs: empty value", ARGS("--max-seqs="));
    check_flag_error("--max-seq: unknown option (did you mean --max-seqs?)",
                     ARGS("--max-seq", "3"));
    check_flag_error("--frobnicate: unknown option (see --help)", ARGS("--frobnicate"));
    check_flag_error("--prompt: unknown option (see --help)", ARGS("--prompt", "x"));
    check_flag_error("--no-max-seqs: unknown option (see --help)", ARGS("--no-max-seqs"));
    check_flag_error("--no-dualpath: takes no value", ARGS("--no-dualpath=1"));
    check_flag_error("--dualpath: 'maybe' is not a boolean (true|false|on|off|yes|no|1|0)",
                     ARGS("--dualpath=maybe"));
    check_flag_error("unexpected argument 'false' (see --help)", ARGS("--dualpath", "false"));
    check_flag_error("unexpected argument 'x' (see --help)", ARGS("--", "x"));
    check_flag_error("unexpected argument '-v' (see --help)", ARGS("-v"));
    check_flag_error("--kv-memory: '1QB': unknown size suffix 'QB' (use B, KiB, MiB, GiB or TiB)",
                     ARGS("--kv-memory=1QB"));
    check_flag_error("--scorer: 'x' is not one of knorm, knorm_high, snapkv, recent, random",
                     ARGS("--scorer", "x"));
    check_flag_error("--config: missing value", ARGS("--config"));

    /* The caller's flags have their own checks and messages. */
    dp_config_cli cli2 = {.extra = oneshot_flags, .n_extra = 6};
    CHECK(config_defaults(&c) == 0);
    CHECK(parse_argv(&c, &cli2, err, sizeof err, ARGS("--temperature", "101")) < 0);
    CHECK_MSG(!strcmp(err, "--temperature: 101 is out of range [0, 100]"), "%s", err);
    CHECK(parse_argv(&c, &cli2, err, sizeof err, ARGS("--seed", "-1")) < 0);
    CHECK_MSG(!strcmp(err, "--seed: '-1' is not a non-negative integer"), "%s", err);
    /* A caller's flag may not shadow a config key. */
    const dp_config_flag clash[] = {
        {"max_seqs", DP_CONF_INT, &max_tokens, 0, 0, NULL, NULL, "x"}};
    dp_config_cli cli3 = {.extra = clash, .n_extra = 1};
    CHECK(parse_argv(&c, &cli3, err, sizeof err, ARGS("--chat")) == DP_EINVAL);
    CHECK_MSG(!strcmp(err, "--max_seqs: defined twice"), "%s", err);
    config_destroy(&c);
}

static void test_precedence(void)
{
    dp_config c;
    dp_config_cli cli = {.extra = oneshot_flags, .n_extra = 6};
    char err[DP_ERRLEN];
    char path[64];
    write_tmp("max_seqs = 10\nthreads = 3\nscorer = snapkv\n");
    snprintf(path, sizeof path, "%s", tmp_path);

    /* defaults < file < flags, and --config is found wherever it is. */
    int rc = config_main_load(&c, 6,
                              (char *[]){"dualpathd", "--max-seqs", "20", "--config", path,
                                         "--scorer=random", NULL},
                              &cli, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(c.max_seqs, 20);
    CHECK_EQ_INT(c.threads, 3);
    CHECK_EQ_INT(c.scorer, DP_CONF_SCORER_RANDOM);
    CHECK_EQ_INT(c.max_batched_tokens, 512);
    config_destroy(&c);

    char arg[96];
    snprintf(arg, sizeof arg, "--config=%s", path);
    rc = config_main_load(&c, 2, (char *[]){"dualpathd", arg, NULL}, &cli, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(c.max_seqs, 10);
    config_destroy(&c);

    /* A missing --config file is an error naming it; --config '' reads none. */
    rc = config_main_load(&c, 3, (char *[]){"dualpathd", "--config", "/nonexistent.conf", NULL},
                          &cli, err, sizeof err);
    CHECK(rc == DP_ENOTFOUND);
    CHECK_MSG(strstr(err, "/nonexistent.conf: ") == err, "%s", err);
    config_destroy(&c);
    rc = config_main_load(&c, 3, (char *[]){"dualpathd", "--config", "", NULL}, &cli, err,
                          sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(c.max_seqs, 64);
    config_destroy(&c);

    /* A bad file: the error names it; --help still works with it. */
    write_tmp("\nmax_seqs = 0\n");
    snprintf(path, sizeof path, "%s", tmp_path);
    rc = config_main_load(&c, 3, (char *[]){"dualpathd", "--config", path, NULL}, &cli, err,
                          sizeof err);
    CHECK(rc == DP_ERANGE);
    char want[160];
    snprintf(want, sizeof want, "%s:2: max_seqs: 0 is out of range [1, 4096]", path);
    CHECK_MSG(!strcmp(err, want), "%s", err);
    config_destroy(&c);
    rc = config_main_load(&c, 4, (char *[]){"dualpathd", "--config", path, "--help", NULL}, &cli,
                          err, sizeof err);
    CHECK(rc == 0 && cli.help);
    config_destroy(&c);
    /* A bad flag is reported before the file is read. */
    rc = config_main_load(&c, 4, (char *[]){"dualpathd", "--config", path, "--bogus", NULL}, &cli,
                          err, sizeof err);
    CHECK_MSG(rc < 0 && !strcmp(err, "--bogus: unknown option (see --help)"), "%s", err);
    config_destroy(&c);

    /* Cross-key validation runs last: flags can fix the file. */
    write_tmp("prefill_pool_fraction = 1\n");
    snprintf(path, sizeof path, "%s", tmp_path);
    rc = config_main_load(&c, 3, (char *[]){"dualpathd", "--config", path, NULL}, &cli, err,
                          sizeof err);
    CHECK(rc == DP_EINVAL && strstr(err, "prefill_pool_fraction: ") == err);
    config_destroy(&c);
    rc = config_main_load(&c, 4, (char *[]){"dualpathd", "--config", path, "--no-dualpath", NULL},
                          &cli, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    config_destroy(&c);
}

static void test_round_trip(void)
{
    dp_config a, b;
    char err[DP_ERRLEN];
    CHECK(config_defaults(&a) == 0);
    /* Every type away from its default, with awkward values. */
    const char *text = "model = \"/odd/pa th/\\\"quoted\\\" \\\\ back\\tslash.gguf\"\n"
                       "model_name = \"#not a comment\"\n"
                       "listen = \"[::]:0\"\n"
                       "max_body_bytes = 1000001\n"
                       "kv_memory = 1.5GiB\n"
                       "host_tier_bytes = 3TiB\n"
                       "request_timeout = 1.5s\n"
                       "keep_ratio = 0.1\n"
                       "gpu_memory_fraction = 0.333333333333333315\n"
                       "dualpath = false\n"
                       "log_level = error\n"
                       "scorer = knorm_high\n"
                       "prefix_cache = no\n"
                       "threads = 7\n";
    CHECK_MSG(config_load_file(&a, write_tmp(text), true, err, sizeof err) == 0, "%s", err);
    char *printed = print_to_string(&a, false);
    CHECK(config_defaults(&b) == 0);
    CHECK(config_equal(&a, &a) && !config_equal(&a, &b));
    CHECK_MSG(config_load_file(&b, write_tmp(printed), true, err, sizeof err) == 0, "%s\n%s", err,
              printed);
    CHECK_MSG(config_equal(&a, &b), "round trip differs:\n%s", printed);
    CHECK(strstr(printed, "kv_memory = 1536MiB\n"));
    CHECK(strstr(printed, "request_timeout = 1500ms\n"));
    CHECK(strstr(printed, "keep_ratio = 0.1\n"));
    CHECK(strstr(printed, "max_body_bytes = 1000001\n"));
    /* Printed twice, the same text. */
    char *again = print_to_string(&b, false);
    CHECK(!strcmp(printed, again));
    free(again);
    free(printed);
    config_destroy(&b);

    /* The defaults' print also names every key exactly once. */
    CHECK(config_defaults(&b) == 0);
    printed = print_to_string(&b, false);
    CHECK(strstr(printed, "max_seqs = 64\n"));
    CHECK(strstr(printed, "request_timeout = 10min\n"));
    CHECK(strstr(printed, "kv_memory = 1GiB\n"));
    CHECK(strstr(printed, "model = \"/var/lib/dualpath/models/model.gguf\"\n"));
    free(printed);
    config_destroy(&a);
    config_destroy(&b);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s (run from the source root)", path);
    char *text = NULL;
    size_t len = 0, cap = 0, n;
    char buf[4096];
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            text = realloc(text, cap);
            CHECK(text != NULL);
        }
        memcpy(text + len, buf, n);
        len += n;
    }
    fclose(f);
    CHECK(text != NULL);
    text[len] = '\0';
    return text;
}

static void test_example_file(void)
{
    char *gen = print_to_string(NULL, true);
    char *committed = read_file(EXAMPLE_PATH);
    CHECK_MSG(!strcmp(gen, committed),
              "%s differs from the option table: regenerate it with "
              "build/tests/unit/test_config --print-example > %s",
              EXAMPLE_PATH, EXAMPLE_PATH);

    /* As is, it is all comments: it parses to the defaults. */
    dp_config c, d;
    char err[DP_ERRLEN];
    CHECK(config_defaults(&d) == 0);
    CHECK_MSG(load_text(&c, committed, err, sizeof err) == 0, "%s", err);
    CHECK(config_equal(&c, &d));
    config_destroy(&c);

    /* Uncommented, every key is set, to its default. */
    size_t len = strlen(committed), keys = 0;
    char *un = malloc(len + 1);
    CHECK(un != NULL);
    char *o = un;
    for (const char *p = committed; *p;) {
        const char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p) + 1 : strlen(p);
        bool is_key = p[0] == '#' && (p[1] >= 'a' && p[1] <= 'z') && memchr(p, '=', ll);
        if (is_key) {
            p++, ll--;
            keys++;
        }
        memcpy(o, p, ll);
        o += ll;
        p += ll;
    }
    *o = '\0';
    CHECK_MSG(load_text(&c, un, err, sizeof err) == 0, "%s", err);
    CHECK(config_equal(&c, &d));
    char *printed = print_to_string(&d, false);
    size_t lines = 0;
    for (const char *p = printed; *p; p++)
        lines += *p == '=';
    CHECK_EQ_INT(keys, lines); /* every key appears */
    free(printed);
    free(un);
    config_destroy(&c);
    config_destroy(&d);
    free(gen);
    free(committed);
}

static void test_help(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    config_print_help(f, "dualpathd");
    config_print_flags_help(f, "One-shot mode", oneshot_flags, 6);
    CHECK(fclose(f) == 0);
    CHECK(strstr(text, "usage: dualpathd "));
    CHECK(strstr(text, "  --max-batched-tokens N        int in [16, 65536], default 512\n"));
    CHECK(strstr(text, "tokens per engine step"));
    CHECK(strstr(text, "--[no-]dualpath"));
    CHECK(strstr(text, "knorm|knorm_high|snapkv|recent|random, default snapkv"));
    CHECK(strstr(text, "size in [0, 64TiB], default 1GiB"));
    CHECK(strstr(text, "--block-tokens N              int in [1, 256], a power of two"));
    CHECK(strstr(text, "--prompt TEXT"));
    CHECK(strstr(text, "--print-config"));
    CHECK(strstr(text, "--check-config"));
    CHECK(!strstr(text, "print-example")); /* hidden */
    /* Every key of the printed config has a flag in the help. */
    dp_config c;
    CHECK(config_defaults(&c) == 0);
    char *printed = print_to_string(&c, false);
    for (char *line = strtok(printed, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#' || !line[0])
            continue;
        char flag[64] = "--";
        size_t i = 2;
        for (const char *p = line; *p && *p != ' ' && i < 63; p++)
            flag[i++] = *p == '_' ? '-' : *p;
        flag[i] = '\0';
        char bool_flag[80];
        snprintf(bool_flag, sizeof bool_flag, "--[no-]%s ", flag + 2);
        strcat(flag, " ");
        CHECK_MSG(strstr(text, flag) || strstr(text, bool_flag), "%s missing from --help", flag);
    }
    /* No line is wider than a terminal. */
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        CHECK_MSG(strlen(line) <= 100, "help line too long: %s", line);
    free(printed);
    free(text);
    config_destroy(&c);
}

static void test_values(void)
{
    char err[DP_ERRLEN];
    uint64_t v;
    CHECK(config_parse_size("1024", &v, err, sizeof err) == 0 && v == 1024);
    CHECK(config_parse_size("2GiB", &v, err, sizeof err) == 0 && v == (uint64_t)2 << 30);
    CHECK(config_parse_size("512MiB", &v, err, sizeof err) == 0 && v == (uint64_t)512 << 20);
    CHECK(config_parse_size("1.5G", &v, err, sizeof err) == 0 && v == (uint64_t)3 << 29);
    CHECK(config_parse_size("64k", &v, err, sizeof err) == 0 && v == 65536);
    CHECK(config_parse_size("1 MB", &v, err, sizeof err) == 0 && v == 1 << 20);
    CHECK(config_parse_size("10b", &v, err, sizeof err) == 0 && v == 10);
    CHECK(config_parse_size(".5K", &v, err, sizeof err) == 0 && v == 512);
    CHECK(config_parse_size("16TiB", &v, err, sizeof err) == 0 && v == (uint64_t)16 << 40);
    CHECK(config_parse_size("18446744073709551615", &v, err, sizeof err) == 0 && v == UINT64_MAX);
    CHECK(config_parse_size("18446744073709551616", &v, err, sizeof err) == DP_ERANGE);
    CHECK(config_parse_size("", &v, err, sizeof err) == DP_EINVAL);
    CHECK(config_parse_size("1.5.3", &v, err, sizeof err) == DP_EINVAL);
    CHECK(config_parse_size(" 1", &v, err, sizeof err) == DP_EINVAL);
    CHECK(config_parse_size("inf", &v, err, sizeof err) == DP_EINVAL);
    CHECK(config_parse_size("0x10", &v, err, sizeof err) == DP_EINVAL);
    CHECK(config_parse_size("16777216T", &v, err, sizeof err) == DP_ERANGE);

    int64_t ms;
    CHECK(config_parse_duration("30s", &ms, err, sizeof err) == 0 && ms == 30000);
    CHECK(config_parse_duration("500ms", &ms, err, sizeof err) == 0 && ms == 500);
    CHECK(config_parse_duration("10", &ms, err, sizeof err) == 0 && ms == 10000);
    CHECK(config_parse_duration("2min", &ms, err, sizeof err) == 0 && ms == 120000);
    CHECK(config_parse_duration("2m", &ms, err, sizeof err) == 0 && ms == 120000);
    CHECK(config_parse_duration("1.5h", &ms, err, sizeof err) == 0 && ms == 5400000);
    CHECK(config_parse_duration("0", &ms, err, sizeof err) == 0 && ms == 0);
    CHECK(config_parse_duration("-1s", &ms, err, sizeof err) == DP_EINVAL);
    CHECK(config_parse_duration("1y", &ms, err, sizeof err) == DP_EINVAL);

    int list[8], n;
    CHECK(config_parse_int_list("", list, 8, &n, err, sizeof err) == 0 && n == 0);
    CHECK(config_parse_int_list("  ", list, 8, &n, err, sizeof err) == 0 && n == 0);
    CHECK(config_parse_int_list("0,1", list, 8, &n, err, sizeof err) == 0 && n == 2 &&
          list[0] == 0 && list[1] == 1);
    CHECK(config_parse_int_list(" 3 , 17,5 ", list, 8, &n, err, sizeof err) == 0 && n == 3 &&
          list[0] == 3 && list[1] == 17 && list[2] == 5);
    CHECK(config_parse_int_list("1,2,3", list, 2, &n, err, sizeof err) == DP_ERANGE);
    CHECK(config_parse_int_list("-1", list, 8, &n, err, sizeof err) == DP_EINVAL);
    CHECK(config_parse_int_list("1,,2", list, 8, &n, err, sizeof err) == DP_EINVAL);
    CHECK(config_parse_int_list("70000", list, 8, &n, err, sizeof err) == DP_ERANGE);
}

static void check_listen(const char *s, const char *host, int port, const char *unix_path)
{
    char h[64], u[128], err[DP_ERRLEN];
    int p;
    int rc = config_parse_listen(s, h, sizeof h, &p, u, sizeof u, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", s, err);
    CHECK_MSG(!strcmp(h, host) && p == port && !strcmp(u, unix_path), "%s -> '%s' %d '%s'", s, h,
              p, u);
}

static void check_listen_bad(const char *s, const char *expected)
{
    char h[64], u[128], err[DP_ERRLEN];
    int p;
    int rc = config_parse_listen(s, h, sizeof h, &p, u, sizeof u, err, sizeof err);
    CHECK_MSG(rc < 0, "%s accepted", s);
    CHECK_MSG(strstr(err, expected), "%s: got '%s', want '%s'", s, err, expected);
}

static void test_listen(void)
{
    check_listen("127.0.0.1:8080", "127.0.0.1", 8080, "");
    check_listen("0.0.0.0:80", "0.0.0.0", 80, "");
    check_listen("localhost:80", "localhost", 80, "");
    check_listen("my-host.example.com:65535", "my-host.example.com", 65535, "");
    check_listen("[::1]:8080", "::1", 8080, "");
    check_listen("[::]:0", "::", 0, "");
    check_listen("[fe80::1:2]:443", "fe80::1:2", 443, "");
    check_listen("unix:/run/dualpath/d.sock", "", -1, "/run/dualpath/d.sock");

    check_listen_bad("127.0.0.1", "expected HOST:PORT");
    check_listen_bad("127.0.0.1:", "missing port");
    check_listen_bad("127.0.0.1:65536", "port 65536 is out of range [0, 65535]");
    check_listen_bad("127.0.0.1:99999999999999", "out of range");
    check_listen_bad("127.0.0.1:80a", "port '80a' is not a number");
    check_listen_bad("127.0.0.1:-1", "port '-1' is not a number");
    check_listen_bad(":8080", "missing host");
    check_listen_bad("300.1.2.3:80", "'300.1.2.3' is not an IPv4 address");
    check_listen_bad("bad_host:80", "'bad_host' is not a host name");
    check_listen_bad("-x:80", "is not a host name");
    check_listen_bad("::1:8080", "needs brackets");
    check_listen_bad("[::1]8080", "expected ':PORT' after ']'");
    check_listen_bad("[::1:8080", "missing ']'");
    check_listen_bad("[nope]:80", "'nope' is not an IPv6 address");
    check_listen_bad("unix:", "empty socket path");
    char longpath[200] = "unix:/";
    memset(longpath + 6, 'a', 150);
    longpath[156] = '\0';
    check_listen_bad(longpath, "socket path is longer than 107 bytes");
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--print-example")) {
        config_print_example(stdout);
        return 0;
    }
    /* The duplicate-key warning is expected; keep the output to failures. */
    dp_log_set_level(DP_LOG_ERROR);
    test_table_and_defaults();
    test_values();
    test_listen();
    test_file_syntax();
    test_file_errors();
    test_flags();
    test_precedence();
    test_round_trip();
    test_help();
    test_example_file();
    if (tmp_path[0])
        unlink(tmp_path);
    T_DONE("config");
}
