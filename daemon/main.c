/* main.c: dualpathd's entry point: configuration (defaults < config file <
 * flags, conf/), then one of two modes: serving the OpenAI API (the default)
 * or a one-shot completion (--prompt). */
#include <stdio.h>
#include <string.h>

#include "api/guard.h"
#include "api/server.h"
#include "common/dp.h"
#include "conf/config.h"
#include "oneshot.h"
#include "serve.h"

#define DP_VERSION "0.1.0"

/* Engine options from the configuration. */
static void engine_from_config(const dp_config *c, dp_engine_opts *e)
{
    engine_opts_default(e);
    e->max_batched_tokens = c->max_batched_tokens;
    e->max_seqs = c->max_seqs;
    e->block_tokens = c->block_tokens;
    e->kv_bytes = (int64_t)c->kv_memory;
    e->context_length = c->context_length;
    e->max_queue = c->max_queue;
    e->dualpath = c->dualpath;
    e->prefill_fraction = c->prefill_pool_fraction;
    e->decode_block_tokens = c->decode_block_tokens;
    e->compress.scorer = (dp_scorer)c->scorer;
    e->compress.keep_ratio = (float)c->keep_ratio;
    e->compress.sinks = c->sink_tokens;
    e->compress.window = c->window_tokens;
    e->decode_budget = c->decode_budget;
    e->early_switch = c->early_switch;
    e->early_min_tokens = c->early_switch_min_tokens;
    e->reuse_replies = c->reuse_replies;
    e->resume_turns = c->resume_turns;
    e->exempt_layers = c->exempt_layers;
    e->compress_turns = c->compress_turns; /* the enum's order is ENGINE_TURNS_* */
    e->prefix_cache = c->prefix_cache;
    e->swa_full = c->swa_full;
    e->kv_type = c->kv_cache_type;
    /* The enum's order: auto, same, then the dp_kv_type values. */
    e->decode_kv_type = c->decode_kv_type == 0   ? ENGINE_DECODE_KV_AUTO
                        : c->decode_kv_type == 1 ? ENGINE_DECODE_KV_SAME
                                                 : c->decode_kv_type - 2;
    e->host_tier_bytes = (int64_t)c->host_tier_bytes;
    e->swap_bytes = (int64_t)c->swap_space;
    e->gpu_memory_fraction = c->gpu_memory_fraction;
}

/* HTTP API options from the configuration; host, port and unix_path come
 * from config_parse_listen() and must outlive the server. */
static void api_from_config(const dp_config *c, const char *host, int port, const char *unix_path,
                            dp_server_opts *a)
{
    server_opts_default(a);
    a->host = host;
    a->port = port;
    a->unix_path = unix_path;
    a->max_body = (size_t)c->max_body_bytes;
    a->conn_limit = (unsigned)c->max_connections;
    a->per_ip_limit = c->max_connections_per_ip > 0
                          ? (unsigned)c->max_connections_per_ip
                          : (unsigned)(c->max_connections - c->max_connections / 8);
    a->header_timeout_s = (double)c->header_timeout_ms / 1000.0;
    a->body_timeout_s = (double)c->body_timeout_ms / 1000.0;
    a->idle_timeout_s = (double)c->idle_timeout_ms / 1000.0;
    a->request_timeout_s = (double)c->request_timeout_ms / 1000.0;
    a->default_max_tokens = c->default_max_tokens;
    a->keep_system = c->keep_system_prompt;
    a->api_key_file = c->api_key_file;
    a->health_public = c->health_public;
    a->metrics_public = c->metrics_public;
    a->cors_origins = c->cors_origins;
}

static int serve_from_config(const dp_config *c, bool verbose)
{
    dp_serve_opts so;
    serve_opts_default(&so);
    char host[256], unix_path[256], err[DP_ERRLEN];
    int port;
    if (config_parse_listen(c->listen, host, sizeof host, &port, unix_path, sizeof unix_path, err,
                            sizeof err)) {
        fprintf(stderr, "dualpathd: listen: %s\n", err);
        return 2;
    }
    so.model = c->model;
    so.device = c->device;
    so.threads = c->threads;
    so.cuda_graphs = c->cuda_graphs;
    so.exact_matmul = c->exact_matmul;
    so.verbose = verbose;
    so.log_level = verbose ? DP_LOG_DEBUG : c->log_level;
    so.model_name = c->model_name[0] ? c->model_name : NULL;
    so.chat_template = c->chat_template;
    so.drain_timeout_s = (double)c->drain_timeout_ms / 1000.0;
    so.watchdog = c->watchdog;
    api_from_config(c, host, port, unix_path, &so.api);
    engine_from_config(c, &so.engine);
    return serve_run(&so);
}

/* --check-config: what serving would refuse at start-up, short of loading
 * the model: the listen address as serving resolves it, and the API key file. */
static int check_config(const dp_config *c)
{
    char host[256], unix_path[256], err[DP_ERRLEN];
    int port;
    if (config_parse_listen(c->listen, host, sizeof host, &port, unix_path, sizeof unix_path, err,
                            sizeof err) ||
        (!unix_path[0] && server_check_address(host, port, err, sizeof err))) {
        fprintf(stderr, "dualpathd: listen: %s\n", err);
        return 2;
    }
    dp_guard g;
    if (guard_init(&g, c->api_key_file, c->cors_origins, err, sizeof err)) {
        fprintf(stderr, "dualpathd: %s\n", err);
        return 2;
    }
    guard_destroy(&g);
    fprintf(stderr, "dualpathd: configuration OK\n");
    return 0;
}

int main(int argc, char **argv)
{
    /* One-shot flags: not configuration keys, parsed by conf/ with the same rules. */
    const char *prompt = NULL;
    bool chat = false, verbose = false;
    int max_tokens = 128, top_k = 0;
    double temperature = 0.8, top_p = 1.0, min_p = 0.0;
    uint64_t seed = 0;
    const dp_config_flag extra[] = {
        {"prompt", DP_CONF_STRING, &prompt, 0, 0, NULL, "TEXT",
         "one-shot mode: print the completion of TEXT and exit"},
        {"chat", DP_CONF_BOOL, &chat, 0, 0, NULL, NULL,
         "apply the model's chat template to the prompt (a user turn)"},
        {"max-tokens", DP_CONF_INT, &max_tokens, 0, 1 << 20, NULL, NULL,
         "tokens to generate (default 128)"},
        {"temperature", DP_CONF_FLOAT, &temperature, 0, 100, NULL, "T", "0 = greedy (default 0.8)"},
        {"top-k", DP_CONF_INT, &top_k, 0, 1 << 24, NULL, NULL, "default 0 = off"},
        {"top-p", DP_CONF_FLOAT, &top_p, 0, 1, NULL, "P", "default 1 = off"},
        {"min-p", DP_CONF_FLOAT, &min_p, 0, 1, NULL, "P", "default 0 = off"},
        {"seed", DP_CONF_U64, &seed, 0, 0, NULL, "S", "sampling seed (default 0)"},
        {"verbose", DP_CONF_BOOL, &verbose, 0, 0, NULL, NULL,
         "debug logging; timings and model facts on stderr"},
    };
    dp_config_cli cli = {.extra = extra, .n_extra = sizeof extra / sizeof extra[0]};
    dp_config cfg;
    char err[DP_ERRLEN];
    int status = 0;

    if (config_main_load(&cfg, argc, argv, &cli, err, sizeof err) != 0) {
        fprintf(stderr, "dualpathd: %s\n", err);
        status = 2;
    } else if (cli.help) {
        printf("usage: dualpathd [--config FILE] [--KEY VALUE ...]\n"
               "Serves the OpenAI HTTP API on the model until SIGTERM/SIGINT; with --prompt,\n"
               "prints one completion and exits. Every configuration key is also a flag; flags\n"
               "win over the file (default " DP_CONFIG_DEFAULT_PATH ").\n\n");
        config_print_help(stdout, "dualpathd");
        config_print_flags_help(stdout, "One-shot mode", extra, cli.n_extra);
    } else if (cli.version) {
        printf("dualpathd %s\n", DP_VERSION);
    } else if (cli.print_example) {
        config_print_example(stdout);
    } else if (cli.print_config) {
        config_print(&cfg, stdout);
    } else if (cli.check_config) {
        status = check_config(&cfg);
    } else if (prompt) {
        dp_log_set_level(verbose ? DP_LOG_DEBUG : cfg.log_level);
        dp_engine_opts eo;
        engine_from_config(&cfg, &eo);
        dp_oneshot_opts o = {
            .model = cfg.model, .prompt = prompt, .device = cfg.device,
            .max_tokens = max_tokens, .temperature = (float)temperature, .top_k = top_k,
            .top_p = (float)top_p, .min_p = (float)min_p, .seed = seed, .chat = chat,
            .chat_template = cfg.chat_template,
            .threads = cfg.threads, .exact_matmul = cfg.exact_matmul, .verbose = verbose,
            .cuda_graphs = cfg.cuda_graphs, .engine = &eo,
        };
        status = oneshot_run(&o);
    } else {
        status = serve_from_config(&cfg, verbose);
    }
    config_destroy(&cfg);
    return status;
}
