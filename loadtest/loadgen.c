/* loadgen.c: main of dp-loadgen: options, model discovery, /metrics scraping around
 * the run, and the reports. The load itself is runner.c's. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "http_client.h"
#include "report.h"
#include "runner.h"
#include "stats.h"
#include "workload.h"

enum {
    OPT_BASE_URL = 1000, OPT_API, OPT_ENDPOINT, OPT_MODEL, OPT_API_KEY, OPT_STREAM, OPT_NO_STREAM,
    OPT_NO_USAGE, OPT_RATE, OPT_BURST, OPT_WARMUP, OPT_TIMEOUT, OPT_WORKLOAD, OPT_INPUT,
    OPT_OUTPUT, OPT_PROMPT_FILE, OPT_PREFIX_LEN, OPT_NUM_PREFIXES, OPT_TURNS, OPT_IGNORE_EOS,
    OPT_MIN_TOKENS, OPT_TEMP, OPT_EXTRA, OPT_SEED, OPT_SLO_TTFT, OPT_SLO_TPOT, OPT_SLO_E2EL,
    OPT_JSON, OPT_TSV, OPT_LABEL, OPT_SCRAPE, OPT_METRICS_PATH, OPT_PROGRESS, OPT_NO_PROGRESS,
    OPT_VERSION, OPT_NO_MAX_TOKENS, OPT_QUESTION,
};

static const struct option k_opts[] = {
    {"base-url", required_argument, NULL, OPT_BASE_URL},
    {"api", required_argument, NULL, OPT_API},
    {"endpoint", required_argument, NULL, OPT_ENDPOINT},
    {"model", required_argument, NULL, OPT_MODEL},
    {"api-key", required_argument, NULL, OPT_API_KEY},
    {"stream", no_argument, NULL, OPT_STREAM},
    {"no-stream", no_argument, NULL, OPT_NO_STREAM},
    {"no-usage", no_argument, NULL, OPT_NO_USAGE},
    {"num-requests", required_argument, NULL, 'n'},
    {"concurrency", required_argument, NULL, 'c'},
    {"rate", required_argument, NULL, OPT_RATE},
    {"burstiness", required_argument, NULL, OPT_BURST},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"duration", required_argument, NULL, 't'},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"workload", required_argument, NULL, OPT_WORKLOAD},
    {"input-len", required_argument, NULL, OPT_INPUT},
    {"output-len", required_argument, NULL, OPT_OUTPUT},
    {"no-max-tokens", no_argument, NULL, OPT_NO_MAX_TOKENS},
    {"prompt-file", required_argument, NULL, OPT_PROMPT_FILE},
    {"prefix-len", required_argument, NULL, OPT_PREFIX_LEN},
    {"num-prefixes", required_argument, NULL, OPT_NUM_PREFIXES},
    {"turns", required_argument, NULL, OPT_TURNS},
    {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
    {"min-tokens", no_argument, NULL, OPT_MIN_TOKENS},
    {"temperature", required_argument, NULL, OPT_TEMP},
    {"extra-body", required_argument, NULL, OPT_EXTRA},
    {"question", required_argument, NULL, OPT_QUESTION},
    {"seed", required_argument, NULL, OPT_SEED},
    {"slo-ttft-ms", required_argument, NULL, OPT_SLO_TTFT},
    {"slo-tpot-ms", required_argument, NULL, OPT_SLO_TPOT},
    {"slo-e2el-ms", required_argument, NULL, OPT_SLO_E2EL},
    {"json", required_argument, NULL, OPT_JSON},
    {"tsv", required_argument, NULL, OPT_TSV},
    {"label", required_argument, NULL, OPT_LABEL},
    {"scrape-metrics", no_argument, NULL, OPT_SCRAPE},
    {"metrics-path", required_argument, NULL, OPT_METRICS_PATH},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f)
{
    fputs(
        "usage: dp-loadgen [options]\n"
        "Load generator and benchmark client for any OpenAI-compatible server\n"
        "(vLLM, llama.cpp's llama-server, dualpathd). Plain HTTP/1.1 only.\n"
        "\n"
        "Target:\n"
        "  --base-url URL        server root, or root + /v1 (default http://127.0.0.1:8080)\n"
        "  --api completions|chat  request shape: prompt or messages (default completions)\n"
        "  --endpoint PATH       override the path (default /v1/completions or\n"
        "                        /v1/chat/completions; without /v1 when the base URL ends in /v1)\n"
        "  --model NAME          model field (default: first id of GET /v1/models; none if that fails)\n"
        "  --api-key KEY         send 'Authorization: Bearer KEY' (default $OPENAI_API_KEY if set)\n"
        "  --stream, --no-stream SSE streaming or one JSON reply (default --stream)\n"
        "  --no-usage            do not send stream_options.include_usage (default: sent)\n"
        "\n"
        "Load shape:\n"
        "  -n, --num-requests N  measured requests (default 100; 0 = until --duration). For the\n"
        "                        chat workload: turns in all, i.e. ceil(N / turns) sessions\n"
        "  -c, --concurrency N   max requests in flight (default 1 without --rate, unlimited\n"
        "                        with --rate; 0 = unlimited)\n"
        "  --rate R              arrivals per second, Poisson or gamma gaps (default 0 = closed loop:\n"
        "                        a new request as soon as one finishes)\n"
        "  --burstiness B        gamma shape of the gaps; 1 = Poisson, < 1 burstier (default 1)\n"
        "  --warmup N            requests sent first and not counted (default 0)\n"
        "  -t, --duration S      time limit of the whole run in seconds; requests still in flight\n"
        "                        are reported as incomplete (default 0 = none)\n"
        "  --timeout S           per-request timeout in seconds (default 300)\n"
        "  --seed N              random seed for prompts, lengths and arrivals (default 1)\n"
        "\n"
        "Workload:\n"
        "  --workload KIND       random: random words (N words ~ N tokens)\n"
        "                        file: one prompt per line of --prompt-file, in order\n"
        "                        corpus: windows of --input-len words from --prompt-file\n"
        "                        prefix: one of --num-prefixes shared prefixes + random suffix\n"
        "                        (--api chat: the prefix is the system message)\n"
        "                        chat: multi-turn sessions; each turn resends the conversation\n"
        "                        (default random)\n"
        "  --input-len SPEC      prompt (or suffix / user turn) length: N, A:B (uniform) or\n"
        "                        @FILE (one length per line) (default 256)\n"
        "  --output-len SPEC     max_tokens, same forms (default 128)\n"
        "  --no-max-tokens       send no max_tokens: replies end where the server's default\n"
        "                        does (chat clients rarely set one; default off)\n"
        "  --prompt-file FILE    text for the file and corpus workloads\n"
        "  --prefix-len N        words in each shared prefix (default 512)\n"
        "  --num-prefixes N      distinct shared prefixes (default 1)\n"
        "  --turns N             user turns per chat session (default 5)\n"
        "  --ignore-eos          send \"ignore_eos\": true so that replies have max_tokens tokens\n"
        "                        (vLLM, llama-server; default off)\n"
        "  --min-tokens          also send \"min_tokens\" = max_tokens (vLLM; default off)\n"
        "  --temperature T       sampling temperature; < 0 = not sent (default 0)\n"
        "  --extra-body JSON     object merged into every request body (default none)\n"
        "  --question TEXT       appended to every prompt after a blank line: a document, then\n"
        "                        what is asked about it (random, file, corpus; prefix with\n"
        "                        completions; default none)\n"
        "\n"
        "Results:\n"
        "  --slo-ttft-ms X       goodput SLO on time to first token (default none)\n"
        "  --slo-tpot-ms X       goodput SLO on time per output token (default none)\n"
        "  --slo-e2el-ms X       goodput SLO on end-to-end latency (default none)\n"
        "  --json FILE           full results as JSON ('-' = stdout) (default none)\n"
        "  --tsv FILE            append one summary line (header when new) (default none)\n"
        "  --label TEXT          name of this run in the reports (default none)\n"
        "  --scrape-metrics      GET the server's /metrics before and after; store both in the\n"
        "                        JSON and print deltas of *tokens*/*requests* counters (default off)\n"
        "  --metrics-path PATH   path of the metrics, at the server root (default /metrics)\n"
        "  --progress            live progress on stderr (default: only when stderr is a tty)\n"
        "  --no-progress         never show progress\n"
        "  -q, --quiet           no table on stdout\n"
        "  -h, --help            this text\n"
        "  --version             version\n"
        "\n"
        "Exit status: 0 when the run happened (failed requests are results, see the table),\n"
        "1 when it could not run, 2 on bad options.\n",
        f);
}

static int parse_double(const char *s, double lo, double *out)
{
    char *e;
    double v = strtod(s, &e);
    if (e == s || *e || !(v >= lo) || isnan(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_int(const char *s, long lo, int *out)
{
    char *e;
    long v = strtol(s, &e, 10);
    if (e == s || *e || v < lo || v > 100000000)
        return -1;
    *out = (int)v;
    return 0;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Asks /v1/models for a default model id; NULL when there is none. */
static char *discover_model(const lg_url *u, const char *headers)
{
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    char err[DP_ERRLEN];
    const char *path = ends_with(u->prefix, "/v1") ? "/models" : "/v1/models";
    if (lg_http_fetch(u, path, headers, 10.0, &status, &body, &len, err, sizeof err)) {
        fprintf(stderr, "dp-loadgen: no model list (%s); sending no model field\n", err);
        return NULL;
    }
    char *id = NULL;
    cJSON *root = status == 200 ? cJSON_ParseWithLength(body, len) : NULL;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    const cJSON *first = cJSON_IsArray(data) ? cJSON_GetArrayItem(data, 0) : NULL;
    const cJSON *jid = cJSON_GetObjectItemCaseSensitive(first, "id");
    if (cJSON_IsString(jid))
        id = strdup(jid->valuestring);
    else
        fprintf(stderr, "dp-loadgen: GET %s gave HTTP %d without a model id; sending no model field\n",
                path, status);
    cJSON_Delete(root);
    free(body);
    return id;
}

static char *scrape(const lg_url *u, const char *path, const char *headers)
{
    lg_url root = *u;
    root.prefix[0] = '\0'; /* /metrics lives at the server root, not under /v1 */
    int status = 0;
    char *body = NULL;
    char err[DP_ERRLEN];
    if (lg_http_fetch(&root, path, headers, 10.0, &status, &body, NULL, err, sizeof err)) {
        fprintf(stderr, "dp-loadgen: metrics scrape failed: %s\n", err);
        return NULL;
    }
    if (status != 200) {
        fprintf(stderr, "dp-loadgen: metrics scrape: HTTP %d\n", status);
        free(body);
        return NULL;
    }
    return body;
}

static void print_deltas(FILE *f, const char *before, const char *after)
{
    lg_prom b = {0}, a = {0};
    if (!before || !after || lg_prom_parse(before, &b) || lg_prom_parse(after, &a)) {
        fprintf(f, "(no /metrics deltas: a scrape failed)\n");
        lg_prom_destroy(&b);
        lg_prom_destroy(&a);
        return;
    }
    fprintf(f, "============== Server /metrics deltas =============\n");
    int shown = 0;
    for (size_t i = 0; i < a.n; i++) {
        if (!lg_prom_interesting(a.s[i].key))
            continue;
        const lg_prom_sample *pb = lg_prom_find(&b, a.s[i].key);
        fprintf(f, "%-60s %.0f\n", a.s[i].key, a.s[i].value - (pb ? pb->value : 0));
        shown++;
    }
    if (!shown)
        fprintf(f, "(no counter names contain \"tokens\" or \"requests\")\n");
    fprintf(f, "==================================================\n");
    lg_prom_destroy(&b);
    lg_prom_destroy(&a);
}

int main(int argc, char **argv)
{
    const char *base_url = "http://127.0.0.1:8080", *endpoint = NULL, *model = NULL;
    const char *api_key = getenv("OPENAI_API_KEY");
    const char *json_path = NULL, *tsv_path = NULL, *label = NULL, *metrics_path = "/metrics";
    const char *input_spec = "256", *output_spec = "128";
    bool chat_api = false, stream = true, usage_opt = true, scrape_metrics = false, quiet = false;
    int progress = -1, concurrency = -1;
    lg_run_opts ro = {.num_requests = 100, .burstiness = 1.0, .timeout_s = 300, .seed = 1};
    lg_workload_opts wo = {.kind = LG_WL_RANDOM, .prefix_len = 512, .num_prefixes = 1, .turns = 5,
                           .temperature = 0, .seed = 1};
    lg_slo slo = {0};
    int c;
    while ((c = getopt_long(argc, argv, "n:c:t:qh", k_opts, NULL)) != -1) {
        bool bad = false;
        switch (c) {
        case OPT_BASE_URL: base_url = optarg; break;
        case OPT_API:
            if (strcmp(optarg, "chat") == 0)
                chat_api = true;
            else if (strcmp(optarg, "completions") == 0)
                chat_api = false;
            else
                bad = true;
            break;
        case OPT_ENDPOINT: endpoint = optarg; break;
        case OPT_MODEL: model = optarg; break;
        case OPT_API_KEY: api_key = optarg; break;
        case OPT_STREAM: stream = true; break;
        case OPT_NO_STREAM: stream = false; break;
        case OPT_NO_USAGE: usage_opt = false; break;
        case 'n': bad = parse_int(optarg, 0, &ro.num_requests) != 0; break;
        case 'c': bad = parse_int(optarg, 0, &concurrency) != 0; break;
        case OPT_RATE: bad = parse_double(optarg, 0, &ro.rate) != 0; break;
        case OPT_BURST: bad = parse_double(optarg, 1e-3, &ro.burstiness) != 0; break;
        case OPT_WARMUP: bad = parse_int(optarg, 0, &ro.warmup) != 0; break;
        case 't': bad = parse_double(optarg, 0, &ro.duration_s) != 0; break;
        case OPT_TIMEOUT: bad = parse_double(optarg, 1e-3, &ro.timeout_s) != 0; break;
        case OPT_WORKLOAD:
            if (strcmp(optarg, "random") == 0) wo.kind = LG_WL_RANDOM;
            else if (strcmp(optarg, "file") == 0) wo.kind = LG_WL_FILE;
            else if (strcmp(optarg, "corpus") == 0) wo.kind = LG_WL_CORPUS;
            else if (strcmp(optarg, "prefix") == 0) wo.kind = LG_WL_PREFIX;
            else if (strcmp(optarg, "chat") == 0) wo.kind = LG_WL_CHAT;
            else bad = true;
            break;
        case OPT_INPUT: input_spec = optarg; break;
        case OPT_OUTPUT: output_spec = optarg; break;
        case OPT_PROMPT_FILE: wo.prompt_file = optarg; break;
        case OPT_PREFIX_LEN: bad = parse_int(optarg, 1, &wo.prefix_len) != 0; break;
        case OPT_NUM_PREFIXES: bad = parse_int(optarg, 1, &wo.num_prefixes) != 0; break;
        case OPT_TURNS: bad = parse_int(optarg, 1, &wo.turns) != 0; break;
        case OPT_IGNORE_EOS: wo.ignore_eos = true; break;
        case OPT_NO_MAX_TOKENS: wo.no_max_tokens = true; break;
        case OPT_MIN_TOKENS: wo.min_tokens = true; break;
        case OPT_TEMP: wo.temperature = strtod(optarg, NULL); break;
        case OPT_EXTRA: wo.extra_body = optarg; break;
        case OPT_QUESTION: wo.question = optarg; break;
        case OPT_SEED: {
            char *e;
            unsigned long long s = strtoull(optarg, &e, 10);
            bad = e == optarg || *e;
            ro.seed = wo.seed = s;
            break;
        }
        case OPT_SLO_TTFT: bad = parse_double(optarg, 0, &slo.ttft_ms) != 0; break;
        case OPT_SLO_TPOT: bad = parse_double(optarg, 0, &slo.tpot_ms) != 0; break;
        case OPT_SLO_E2EL: bad = parse_double(optarg, 0, &slo.e2el_ms) != 0; break;
        case OPT_JSON: json_path = optarg; break;
        case OPT_TSV: tsv_path = optarg; break;
        case OPT_LABEL: label = optarg; break;
        case OPT_SCRAPE: scrape_metrics = true; break;
        case OPT_METRICS_PATH: metrics_path = optarg; break;
        case OPT_PROGRESS: progress = 1; break;
        case OPT_NO_PROGRESS: progress = 0; break;
        case 'q': quiet = true; break;
        case 'h': usage(stdout); return 0;
        case OPT_VERSION: puts("dp-loadgen 0.1.0"); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "dp-loadgen: bad value for an option: %s\n", optarg ? optarg : "");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dp-loadgen: unexpected argument %s (see --help)\n", argv[optind]);
        return 2;
    }
    char err[DP_ERRLEN];
    if (lg_url_parse(&ro.url, base_url, err, sizeof err)) {
        fprintf(stderr, "dp-loadgen: %s\n", err);
        return 2;
    }
    if (lg_len_dist_parse(&wo.input, input_spec, err, sizeof err) ||
        lg_len_dist_parse(&wo.output, output_spec, err, sizeof err)) {
        fprintf(stderr, "dp-loadgen: %s\n", err);
        lg_len_dist_destroy(&wo.input);
        return 2;
    }
    if (ro.num_requests == 0 && ro.duration_s <= 0) {
        fprintf(stderr, "dp-loadgen: -n 0 (unlimited) needs a time limit (-t)\n");
        lg_len_dist_destroy(&wo.input);
        lg_len_dist_destroy(&wo.output);
        return 2;
    }
    ro.concurrency = concurrency >= 0 ? concurrency : (ro.rate > 0 ? 0 : 1);
    if (!endpoint)
        endpoint = ends_with(ro.url.prefix, "/v1") ? (chat_api ? "/chat/completions" : "/completions")
                                                   : (chat_api ? "/v1/chat/completions" : "/v1/completions");
    char auth[1024] = "";
    if (api_key && *api_key)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", api_key);
    ro.path = endpoint;
    ro.extra_headers = auth[0] ? auth : NULL;
    ro.stream = stream;
    ro.turns = wo.kind == LG_WL_CHAT ? wo.turns : 1;
    ro.progress = progress >= 0 ? progress == 1 : isatty(2);
    char *found_model = model ? NULL : discover_model(&ro.url, ro.extra_headers);
    wo.model = model ? model : found_model;
    wo.chat_api = chat_api;
    wo.stream = stream;
    wo.include_usage = usage_opt;

    char in_desc[64], out_desc[64];
    lg_len_dist_describe(&wo.input, in_desc, sizeof in_desc);
    lg_len_dist_describe(&wo.output, out_desc, sizeof out_desc);
    lg_workload w;
    if (lg_workload_init(&w, &wo, err, sizeof err)) {
        fprintf(stderr, "dp-loadgen: %s\n", err);
        free(found_model);
        return 2;
    }
    char *before = scrape_metrics ? scrape(&ro.url, metrics_path, ro.extra_headers) : NULL;
    lg_run_result rr;
    int rc = lg_run_execute(&ro, &w, &rr, err, sizeof err);
    if (rc) {
        fprintf(stderr, "dp-loadgen: %s\n", err);
        lg_run_result_destroy(&rr);
        lg_workload_destroy(&w);
        free(before);
        free(found_model);
        return 1;
    }
    char *after = scrape_metrics ? scrape(&ro.url, metrics_path, ro.extra_headers) : NULL;
    static const char *const kinds[] = {"random", "file", "corpus", "prefix", "chat"};
    char wl_desc[96];
    if (wo.kind == LG_WL_CHAT)
        snprintf(wl_desc, sizeof wl_desc, "chat (%d turns)", wo.turns);
    else if (wo.kind == LG_WL_PREFIX)
        snprintf(wl_desc, sizeof wl_desc, "prefix (%d x %d words)", wo.num_prefixes, wo.prefix_len);
    else
        snprintf(wl_desc, sizeof wl_desc, "%s", kinds[wo.kind]);
    lg_report_meta meta = {
        .label = label, .base_url = base_url, .endpoint = endpoint, .model = wo.model,
        .workload = wl_desc, .input_len = in_desc, .output_len = out_desc, .stream = stream,
        .ignore_eos = wo.ignore_eos, .concurrency = ro.concurrency, .num_requests = ro.num_requests,
        .warmup = ro.warmup, .turns = ro.turns, .rate = ro.rate, .burstiness = ro.burstiness,
        .duration_limit = ro.duration_s, .timeout = ro.timeout_s, .slo = slo,
        .metrics_before = before, .metrics_after = after,
    };
    lg_report rep;
    int out_rc = 0;
    if (lg_report_compute(&rr, &slo, &rep)) {
        fprintf(stderr, "dp-loadgen: out of memory computing the report\n");
        out_rc = 1;
    } else {
        if (!quiet) {
            lg_report_print(stdout, &rep, &meta, &rr);
            if (scrape_metrics)
                print_deltas(stdout, before, after);
        }
        if (json_path && lg_report_write_json(json_path, &rep, &meta, &rr, err, sizeof err)) {
            fprintf(stderr, "dp-loadgen: %s\n", err);
            out_rc = 1;
        }
        if (tsv_path && lg_report_append_tsv(tsv_path, &rep, &meta, err, sizeof err)) {
            fprintf(stderr, "dp-loadgen: %s\n", err);
            out_rc = 1;
        }
    }
    fflush(stdout);
    lg_run_result_destroy(&rr);
    lg_workload_destroy(&w);
    free(before);
    free(after);
    free(found_model);
    return out_rc;
}
