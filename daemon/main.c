/* main.c: dualpathd's entry point: command-line parsing and dispatch. The
 * one-shot mode (--prompt) generates one completion and exits. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "common/dp.h"
#include "oneshot.h"
#include "serve.h"

#define DP_VERSION "0.1.0"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dualpathd --model FILE [--prompt TEXT] [options]\n"
            "\n"
            "Without --prompt, serves the OpenAI HTTP API until SIGTERM/SIGINT.\n"
            "\n"
            "  --model FILE         GGUF model (LLaMA family)\n"
            "  --prompt TEXT        one-shot mode: print the completion of TEXT and exit\n"
            "  --chat               apply the model's chat template to the prompt (a user turn)\n"
            "  --max-tokens N       tokens to generate (default 128)\n"
            "  --temperature T      0 = greedy (default 0.8)\n"
            "  --top-k N            (default 0 = off)\n"
            "  --top-p P            (default 1.0 = off)\n"
            "  --min-p P            (default 0 = off)\n"
            "  --seed S             sampling seed (default 0)\n"
            "  --device D           auto | cpu | cuda | cuda:N (default auto)\n"
            "  --threads N          CPU threads (default: all cores)\n"
            "  --verbose            timings and model facts on stderr (serving: debug log)\n"
            "serving:\n"
            "  --listen HOST:PORT   (default 127.0.0.1:8080); or --host HOST / --port PORT\n"
            "  --model-name NAME    model id in the API (default: the file name)\n"
            "  --max-queue N        waiting requests before 429 (default 256)\n"
            "  --max-batched-tokens N  tokens per step (default 512)\n"
            "  --max-seqs N         sequences per step (default 64)\n"
            "  --kv-memory BYTES    KV cache size, K/M/G suffixes (default 1G)\n"
            "  --n-blocks N         KV cache size in blocks (overrides --kv-memory)\n"
            "  --context-length N   per-sequence cap (default: the model's)\n"
            "  --drain-timeout S    on SIGTERM, wait this long for running requests (default 30)\n"
            "  --version, --help\n");
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "dualpathd: --%s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    dp_oneshot_opts o = {.device = "auto", .max_tokens = 128, .temperature = 0.8f, .top_p = 1.0f};
    dp_serve_opts so;
    serve_opts_default(&so);
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},     {"prompt", required_argument, 0, 'p'},
        {"chat", no_argument, 0, 'c'},            {"max-tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, 't'}, {"top-k", required_argument, 0, 'k'},
        {"top-p", required_argument, 0, 'P'},     {"min-p", required_argument, 0, 'M'},
        {"seed", required_argument, 0, 's'},      {"device", required_argument, 0, 'd'},
        {"threads", required_argument, 0, 'j'},   {"verbose", no_argument, 0, 'v'},
        {"version", no_argument, 0, 'V'},         {"help", no_argument, 0, 'h'},
        /* serving mode */
        {"listen", required_argument, 0, 'L'},    {"host", required_argument, 0, 'H'},
        {"port", required_argument, 0, 'O'},      {"model-name", required_argument, 0, 'N'},
        {"max-queue", required_argument, 0, 'Q'}, {"max-batched-tokens", required_argument, 0, 'B'},
        {"max-seqs", required_argument, 0, 'S'},  {"kv-memory", required_argument, 0, 'K'},
        {"n-blocks", required_argument, 0, 'b'},  {"context-length", required_argument, 0, 'C'},
        {"drain-timeout", required_argument, 0, 'D'},
        {0, 0, 0, 0},
    };
    int c;
    double v;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *name = optind > 1 ? argv[optind - 1] : "";
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'p': o.prompt = optarg; break;
        case 'c': o.chat = true; break;
        case 'v': o.verbose = true; break;
        case 'd': o.device = optarg; break;
        case 'n':
            if (parse_num("max-tokens", optarg, 0, 1 << 20, &v)) return 2;
            o.max_tokens = (int32_t)v;
            break;
        case 't':
            if (parse_num("temperature", optarg, 0, 100, &v)) return 2;
            o.temperature = (float)v;
            break;
        case 'k':
            if (parse_num("top-k", optarg, 0, 1 << 24, &v)) return 2;
            o.top_k = (int32_t)v;
            break;
        case 'P':
            if (parse_num("top-p", optarg, 0, 1, &v)) return 2;
            o.top_p = (float)v;
            break;
        case 'M':
            if (parse_num("min-p", optarg, 0, 1, &v)) return 2;
            o.min_p = (float)v;
            break;
        case 's':
            if (parse_num("seed", optarg, 0, 18446744073709551615.0, &v)) return 2;
            o.seed = (uint64_t)v;
            break;
        case 'j':
            if (parse_num("threads", optarg, 0, 1024, &v)) return 2;
            o.threads = (int)v;
            break;
        case 'L': {
            const char *colon = strrchr(optarg, ':');
            if (!colon || colon == optarg || parse_num("listen", colon + 1, 0, 65535, &v)) {
                fprintf(stderr, "dualpathd: --listen: '%s' is not HOST:PORT\n", optarg);
                return 2;
            }
            static char host[256];
            size_t hl = (size_t)(colon - optarg);
            if (hl >= sizeof host) return 2;
            memcpy(host, optarg, hl);
            host[hl] = 0;
            if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
                memmove(host, host + 1, hl - 2);
                host[hl - 2] = 0;
            }
            so.host = host;
            so.port = (int)v;
            break;
        }
        case 'H': so.host = optarg; break;
        case 'O':
            if (parse_num("port", optarg, 0, 65535, &v)) return 2;
            so.port = (int)v;
            break;
        case 'N': so.model_name = optarg; break;
        case 'Q':
            if (parse_num("max-queue", optarg, 1, 1 << 24, &v)) return 2;
            so.engine.max_queue = (int32_t)v;
            break;
        case 'B':
            if (parse_num("max-batched-tokens", optarg, 1, 1 << 20, &v)) return 2;
            so.engine.max_batched_tokens = (int32_t)v;
            break;
        case 'S':
            if (parse_num("max-seqs", optarg, 1, 1 << 16, &v)) return 2;
            so.engine.max_seqs = (int32_t)v;
            break;
        case 'K': {
            char *end;
            errno = 0;
            double kv = strtod(optarg, &end);
            double mul = *end == 'K' || *end == 'k' ? 1024.0 : *end == 'M' || *end == 'm' ? 1048576.0
                       : *end == 'G' || *end == 'g' ? 1073741824.0 : 1.0;
            if (mul > 1.0) end++;
            if (errno || end == optarg || *end || kv <= 0 || kv * mul > 1e15) {
                fprintf(stderr, "dualpathd: --kv-memory: '%s' is not a size (e.g. 512M, 2G)\n", optarg);
                return 2;
            }
            so.engine.kv_bytes = (int64_t)(kv * mul);
            break;
        }
        case 'b':
            if (parse_num("n-blocks", optarg, 1, 1 << 30, &v)) return 2;
            so.engine.n_blocks = (int32_t)v;
            break;
        case 'C':
            if (parse_num("context-length", optarg, 1, 1 << 24, &v)) return 2;
            so.engine.context_length = (int32_t)v;
            break;
        case 'D':
            if (parse_num("drain-timeout", optarg, 0, 86400, &v)) return 2;
            so.drain_timeout_s = v;
            break;
        case 'V': printf("dualpathd %s\n", DP_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "dualpathd: unknown or incomplete option '%s' (see --help)\n", name);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dualpathd: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (!o.model) {
        fprintf(stderr, "dualpathd: --model FILE is required (see --help)\n");
        return 2;
    }
    if (!o.prompt) {
        so.model = o.model;
        so.device = o.device;
        so.threads = o.threads;
        so.verbose = o.verbose;
        return serve_run(&so);
    }
    return oneshot_run(&o);
}
