/* dp_dualpath_bench.c: the memory and concurrency benchmark of the dual path.
 * With the same fixed KV memory, runs the engine with dualpath off (full
 * caches) and on (the daemon's defaults: one arena for prompts and compacted
 * caches), and reports per prompt length: KV bytes
 * per sequence, the largest number of sequences held at once without a
 * preemption, output tokens/s at that load, and the migration overhead as a
 * share of step time. Not a test: timings vary run to run. */
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
#include "sched/path.h"
#include "tools/bench_util.h"

typedef struct outcome {
    int32_t max_running;        /* before the first preemption */
    int64_t preemptions;
    double out_tps;
    double wall;
    double kv_bytes_per_seq;
    double migration_share;
    double mean_migration_ms;
    int64_t kept, evicted;
} outcome;

/* The most sequences running at once before the first preemption. */
static void track_running(dp_engine *e, void *ud)
{
    outcome *out = ud;
    dp_engine_stats st;
    engine_get_stats(e, &st);
    if (st.preemptions == 0 && st.running > out->max_running)
        out->max_running = st.running;
}

static int run(dp_llama *m, const dp_tokenizer *tok, const dp_engine_opts *o, int n_req, int plen,
               int olen, outcome *out)
{
    char err[DP_ERRLEN];
    dp_engine *e;
    if (engine_init(&e, m, tok, o, NULL, NULL, err, sizeof err) || engine_start(e)) {
        fprintf(stderr, "dp-dualpath-bench: %s\n", err);
        return 1;
    }
    dp_request_params prm;
    memset(&prm, 0, sizeof prm);
    prm.max_tokens = olen;
    sampling_default(&prm.sampling);
    prm.sampling.temperature = 0;
    prm.logprobs = -1;
    prm.ignore_eos = true;
    double t0 = dp_now();
    if (bench_submit_random(e, n_req, plen, llama_hparams(m)->vocab, 7, &prm, err, sizeof err)) {
        fprintf(stderr, "dp-dualpath-bench: %s\n", err);
        return 1;
    }
    memset(out, 0, sizeof *out);
    const int64_t tokens = bench_wait(e, n_req, track_running, out);
    out->wall = dp_now() - t0;
    dp_engine_stats st;
    engine_get_stats(e, &st);
    out->preemptions = st.preemptions;
    out->out_tps = tokens / out->wall;
    out->migration_share = st.busy_seconds > 0 ? st.migration_seconds / st.busy_seconds : 0;
    out->mean_migration_ms =
        st.migration_batches ? 1e3 * st.migration_seconds / (double)st.migrations : 0;
    out->kept = st.tokens_kept;
    out->evicted = st.tokens_evicted;
    engine_destroy(e);
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = "models/SmolLM2-135M-Instruct.Q4_1.gguf", *device = "cpu";
    double kv_mb = 512, keep = 0.5;
    int olen = 64, n_req = 0, threads = 0;
    int plens[4] = {512, 2048}, n_plens = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--kv-mb")) kv_mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--keep-ratio")) keep = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--output")) olen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--requests")) n_req = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompts"))
            n_plens = bench_parse_list(argv[i + 1], plens, 4);
        else {
            fprintf(stderr, "usage: dp-dualpath-bench [--model F] [--kv-mb MB] [--keep-ratio R] "
                            "[--prompts 512,2048] [--output N] [--requests N]\n");
            return 2;
        }
    }
    char err[DP_ERRLEN];
    dp_model_files mf;
    const dp_model_open_opts mo = {.path = model, .device = device, .threads = threads,
                                   .max_tokens = 512, .max_out = 64, .tokenizer = true};
    if (model_open(&mf, &mo, err, sizeof err)) {
        fprintf(stderr, "dp-dualpath-bench: %s\n", err);
        return 1;
    }
    dp_backend *be = mf.be;
    dp_llama *m = mf.m;
    dp_tokenizer *tok = mf.tok;
    dp_kv_layout l1 = llama_kv_layout(m, 16, 1);
    const double bytes_per_token = (double)be->ops->kv_bytes_per_block(be, &l1) / 16.0;
    const int64_t kv_bytes = (int64_t)(kv_mb * 1024 * 1024);
    printf("dp-dualpath-bench: %s, %s backend, KV memory %.0f MiB (%.1f KiB per token), output %d "
           "tokens, keep_ratio %.2f\n\n",
           model, be->ops->name, kv_mb, bytes_per_token / 1024, olen, keep);
    printf("| prompt | dualpath | KV bytes/seq | max concurrent (no preemption) | preemptions | "
           "output tok/s | migration share | migration ms/seq |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int pi = 0; pi < n_plens; pi++) {
        int plen = plens[pi];
        outcome off, on;
        dp_engine_opts o;
        engine_opts_default(&o);
        o.max_seqs = 64;
        o.kv_bytes = kv_bytes;
        o.dualpath = false;
        /* Enough requests to fill the larger of the two configurations. */
        int reqs = n_req > 0 ? n_req : 64;
        if (run(m, tok, &o, reqs, plen, olen, &off))
            return 1;
        off.kv_bytes_per_seq = bytes_per_token * (plen + olen);
        o.dualpath = true;
        o.compress.keep_ratio = (float)keep;
        if (run(m, tok, &o, reqs, plen, olen, &on))
            return 1;
        dp_compress_opts co = o.compress;
        on.kv_bytes_per_seq = bytes_per_token * (compress_n_keep(&co, plen) + olen);
        printf("| %d | off | %.1f MiB | %d | %lld | %.1f | - | - |\n", plen,
               off.kv_bytes_per_seq / 1048576, off.max_running, (long long)off.preemptions,
               off.out_tps);
        printf("| %d | on | %.1f MiB | %d | %lld | %.1f | %.2f%% | %.2f |\n", plen,
               on.kv_bytes_per_seq / 1048576, on.max_running, (long long)on.preemptions, on.out_tps,
               100 * on.migration_share, on.mean_migration_ms);
        printf("| %d | on/off | %.2fx (-%.0f%%) | %.2fx | | %.2fx | | |\n", plen,
               on.kv_bytes_per_seq / off.kv_bytes_per_seq,
               100 * (1 - on.kv_bytes_per_seq / off.kv_bytes_per_seq),
               (double)on.max_running / (off.max_running ? off.max_running : 1),
               on.out_tps / off.out_tps);
        fflush(stdout);
    }
    /* The path detector's decision: host arithmetic per sequence per step. */
    {
        dp_path_detector pd;
        dp_path_opts po;
        path_opts_default(&po);
        po.early_switch = true;
        path_init(&pd);
        path_set(&pd, DP_PS_PREFILL);
        pd.last_change = 0.2f;
        const int N = 5000000;
        volatile int sink = 0;
        double t0 = dp_now();
        for (int i = 0; i < N; i++)
            sink += path_decide(&pd, &po, 256 + (i & 1023), 4096) != DP_STAY;
        double ns = (dp_now() - t0) / N * 1e9;
        printf("\npath detector: %.1f ns per decision (target: under 5 us per sequence per step)\n", ns);
        (void)sink;
    }
    model_close(&mf);
    return 0;
}
