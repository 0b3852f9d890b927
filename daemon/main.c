/* main.c: dualpathd's entry point: command-line parsing and dispatch. The
 * one-shot mode (--prompt) generates one completion and exits. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "common/dp.h"
#include "oneshot.h"

#define DP_VERSION "0.1.0"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dualpathd --model FILE --prompt TEXT [options]\n"
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
            "  --verbose            timings and model facts on stderr\n"
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
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},     {"prompt", required_argument, 0, 'p'},
        {"chat", no_argument, 0, 'c'},            {"max-tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, 't'}, {"top-k", required_argument, 0, 'k'},
        {"top-p", required_argument, 0, 'P'},     {"min-p", required_argument, 0, 'M'},
        {"seed", required_argument, 0, 's'},      {"device", required_argument, 0, 'd'},
        {"threads", required_argument, 0, 'j'},   {"verbose", no_argument, 0, 'v'},
        {"version", no_argument, 0, 'V'},         {"help", no_argument, 0, 'h'},
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
        fprintf(stderr, "dualpathd: --prompt TEXT is required: this build serves one-shot "
                        "completions only (see --help)\n");
        return 2;
    }
    return oneshot_run(&o);
}
