/* dp_engine_bench.c: the engine without HTTP: output tokens/s at several
 * concurrency levels (fixed prompt and output lengths), and the share of step
 * time spent outside the forward pass (scheduling, sampling, stop checks,
 * events). Not a test: timings vary run to run. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dp.h"
#include "engine/engine.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/loader.h"
#include "model/tokenizer.h"
#include "tools/bench_util.h"

int main(int argc, char **argv)
{
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf", *device = "cpu";
    int32_t plen = 256, olen = 128, threads = 0;
    float temperature = 0.0f, top_p = -1.0f, min_p = 0.0f;
    int32_t top_k = 0;
    bool device_sampling = true;
    int levels[8] = {1, 8, 32, 64}, n_levels = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt")) plen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--output")) olen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--temperature")) temperature = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--top-p")) top_p = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--top-k")) top_k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--min-p")) min_p = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--device-sampling")) device_sampling = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "--concurrency"))
            n_levels = bench_parse_list(argv[i + 1], levels, 8);
        else {
            fprintf(stderr, "usage: dp-engine-bench [--model F] [--device D] [--prompt N] "
                            "[--output N] [--concurrency 1,8,32,64] [--temperature T] [--top-p P]\n"
                            "       [--top-k K] [--min-p P] [--device-sampling 0|1] [--threads N]\n"
                            "top_p defaults to 0.9 when T > 0; --device-sampling 0 samples every row\n"
                            "from its downloaded logits (the engine's device_sampling option)\n");
            return 2;
        }
    }
    int maxc = 1;
    for (int i = 0; i < n_levels; i++)
        if (levels[i] > maxc)
            maxc = levels[i];
    char err[DP_ERRLEN];
    dp_model_files mf;
    const dp_model_open_opts mo = {.path = model, .device = device, .threads = threads,
                                   .max_tokens = 512, .max_out = maxc, .tokenizer = true};
    if (model_open(&mf, &mo, err, sizeof err)) {
        fprintf(stderr, "dp-engine-bench: %s\n", err);
        return 1;
    }
    dp_backend *be = mf.be;
    dp_llama *m = mf.m;
    dp_tokenizer *tok = mf.tok;
    const int32_t vocab = llama_hparams(m)->vocab;
    if (top_p < 0.0f)
        top_p = temperature > 0 ? 0.9f : 1.0f;
    printf("dp-engine-bench: %s, %s backend, prompt %d, output %d tokens, temperature %.2f, "
           "top_p %.2f, top_k %d, min_p %.3f, device sampling %s\n",
           model, be->ops->name, plen, olen, temperature, top_p, top_k, min_p,
           device_sampling ? "on" : "off");
    printf("%-12s %12s %12s %12s %14s %12s %24s\n", "concurrency", "output tok/s", "total tok/s",
           "wall s", "outside fwd", "steps", "sampled cand/fb/row");
    for (int li = 0; li < n_levels; li++) {
        int C = levels[li];
        dp_engine_opts o;
        engine_opts_default(&o);
        o.max_batched_tokens = 512;
        o.max_seqs = maxc;
        o.n_blocks = C * ((plen + olen) / 16 + 2);
        o.device_sampling = device_sampling;
        dp_engine *e;
        if (engine_init(&e, m, tok, &o, NULL, NULL, err, sizeof err) || engine_start(e)) {
            fprintf(stderr, "dp-engine-bench: %s\n", err);
            return 1;
        }
        dp_request_params prm;
        memset(&prm, 0, sizeof prm);
        prm.max_tokens = olen;
        sampling_default(&prm.sampling);
        prm.sampling.temperature = temperature;
        prm.sampling.top_p = top_p;
        prm.sampling.top_k = top_k;
        prm.sampling.min_p = min_p;
        prm.logprobs = -1;
        prm.ignore_eos = true;
        double t0 = dp_now();
        if (bench_submit_random(e, C, plen, vocab, 42, &prm, err, sizeof err)) {
            fprintf(stderr, "dp-engine-bench: %s\n", err);
            return 1;
        }
        const int64_t out_tokens = bench_wait(e, C, NULL, NULL);
        double wall = dp_now() - t0;
        dp_engine_stats st;
        engine_get_stats(e, &st);
        char sampled[64];
        snprintf(sampled, sizeof sampled, "%lld/%lld/%lld", (long long)st.sampled_candidates,
                 (long long)st.sampled_fallback, (long long)st.sampled_full_row);
        printf("%-12d %12.1f %12.1f %12.2f %13.2f%% %12lld %24s\n", C, out_tokens / wall,
               (out_tokens + (double)C * plen) / wall, wall,
               100.0 * (st.busy_seconds - st.forward_seconds) / st.busy_seconds, (long long)st.steps,
               sampled);
        fflush(stdout);
        engine_destroy(e);
    }
    model_close(&mf);
    return 0;
}
