/* metrics.c: Prometheus text format 0.0.4. Names carry the dualpath_ prefix,
 * base units (seconds) and _total on counters, so promtool's lint passes. */
#include "metrics.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double k_latency_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16,
                                          0.32,  0.64,   1.28,  2.56, 5.12, 10.24, 20.48, 40.96,
                                          81.92};
static const double k_itl_bounds[] = {0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05,
                                      0.075, 0.1,   0.15,  0.2,  0.3,   0.5,  1.0,  2.5};

static void hist_init(dp_hist *h, const double *b, int n)
{
    memset(h, 0, sizeof *h);
    h->bounds = b;
    h->n_bounds = n < DP_HIST_MAX_BUCKETS - 1 ? n : DP_HIST_MAX_BUCKETS - 1;
}

void metrics_init(dp_metrics *m)
{
    memset(m, 0, sizeof *m);
    hist_init(&m->ttft, k_latency_bounds, (int)(sizeof k_latency_bounds / sizeof *k_latency_bounds));
    hist_init(&m->e2e, k_latency_bounds, (int)(sizeof k_latency_bounds / sizeof *k_latency_bounds));
    hist_init(&m->itl, k_itl_bounds, (int)(sizeof k_itl_bounds / sizeof *k_itl_bounds));
}

void hist_observe(dp_hist *h, double v)
{
    if (v != v || v < 0)
        v = 0;
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    h->counts[i]++;  /* i == n_bounds: the +Inf bucket */
    h->count++;
    h->sum += v;
}

void metrics_count_response(dp_metrics *m, int status)
{
    for (int i = 0; i < m->n_codes; i++)
        if (m->codes[i] == status) {
            m->code_counts[i]++;
            return;
        }
    if (m->n_codes < DP_METRICS_MAX_CODES) {
        m->codes[m->n_codes] = status;
        m->code_counts[m->n_codes++] = 1;
    }
}

typedef struct tbuf {
    char *p;
    size_t n, cap;
    int oom;
} tbuf;

static void tb_printf(tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(tbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = b->cap * 2 + (size_t)k + 1;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

static void family(tbuf *b, const char *name, const char *type, const char *help)
{
    tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist_render(tbuf *b, const char *name, const char *help, const dp_hist *h)
{
    family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        tb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    tb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    tb_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

/* ---- the engine's statistics: one table ---------------------------------- */

/* What a series reads: a field of dp_engine_stats, of its type. */
typedef enum { SRC_I32, SRC_I64, SRC_F64, SRC_BOOL } metric_src;
enum { ONLY_DUAL = 1, ONLY_SWA = 2 };
typedef struct metric_series {
    const char *labels;       /* "" or {name="value"} */
    size_t off;               /* offsetof(dp_engine_stats, ...) */
    metric_src src;
    int only;                 /* ONLY_DUAL: where a decode pool exists; ONLY_SWA: where
                               * the sliding-window layers are apart; 0: always */
} metric_series;
typedef struct metric_def {
    const char *name, *type, *help;
    metric_series series[4];  /* the first with labels NULL ends them */
} metric_def;

#define I32(f) offsetof(dp_engine_stats, f), SRC_I32, 0
#define I64(f) offsetof(dp_engine_stats, f), SRC_I64, 0
#define F64(f) offsetof(dp_engine_stats, f), SRC_F64, 0
#define BOOL(f) offsetof(dp_engine_stats, f), SRC_BOOL, 0
#define I32_DUAL(f) offsetof(dp_engine_stats, f), SRC_I32, ONLY_DUAL
#define I32_SWA(f) offsetof(dp_engine_stats, f), SRC_I32, ONLY_SWA

/* Every family whose series are fields of the engine's statistics (per-
 * scorer and per-kind counters and the histograms are rendered below). */
static const metric_def k_engine_metrics[] = {
    {"dualpath_kv_blocks_used", "gauge",
     "KV cache blocks in use, per pool (sliding: a model's sliding-window layers, kept "
     "apart at their window).",
     {{"{pool=\"prefill\"}", I32(kv.blocks_used)},
      {"{pool=\"decode\"}", I32_DUAL(kv.decode_blocks_used)},
      {"{pool=\"sliding\"}", I32_SWA(kv.swa_blocks_used)}}},
    {"dualpath_kv_blocks_capacity", "gauge",
     "KV cache blocks in the pool, per pool (with one arena for both paths, each "
     "reports the arena's size; see dualpath_kv_arena_shared).",
     {{"{pool=\"prefill\"}", I32(kv.blocks_total)},
      {"{pool=\"decode\"}", I32_DUAL(kv.decode_blocks_total)},
      {"{pool=\"sliding\"}", I32_SWA(kv.swa_blocks_total)}}},
    {"dualpath_kv_arena_shared", "gauge",
     "1 when the prefill and decode paths draw on one arena of blocks.",
     {{"", BOOL(kv.shared)}}},
    {"dualpath_kv_block_tokens", "gauge",
     "Tokens per KV cache block, per pool.",
     {{"{pool=\"prefill\"}", I32(kv.block_tokens)},
      {"{pool=\"decode\"}", I32_DUAL(kv.decode_block_tokens)}}},
    {"dualpath_decode_path_sequences", "gauge",
     "Sequences whose compacted KV cache lives in the decode pool.",
     {{"", I32(kv.seqs_on_decode_path)}}},
    {"dualpath_tokens_kept_total", "counter",
     "Prompt tokens kept in the decode pool at migrations.",
     {{"", I64(tokens_kept)}}},
    {"dualpath_tokens_in_place_total", "counter",
     "Of the kept tokens, those the decode path took by reference, not copied: a "
     "prefix kept whole in its prefill blocks (one arena of one type) or in the "
     "decode blocks another request's migration copied it into, or the whole decode "
     "blocks of the compaction of the same prompt (n > 1, identical requests).",
     {{"", I64(tokens_in_place)}}},
    {"dualpath_kept_shares_total", "counter",
     "Migrations that took the compaction of a running request with the same prompt "
     "(n > 1, identical requests) by reference, copying only its last partial block.",
     {{"", I64(kv.kept_shares)}}},
    {"dualpath_tokens_evicted_total", "counter",
     "Prompt tokens dropped from the device at migrations.",
     {{"", I64(tokens_evicted)}}},
    {"dualpath_swaps_total", "counter",
     "Preempted decode-path caches copied to host memory (out) and restored (in).",
     {{"{direction=\"out\"}", I64(kv.swap_outs)},
      {"{direction=\"in\"}", I64(kv.swap_ins)}}},
    {"dualpath_swap_bytes", "gauge",
     "Host memory held by swapped-out decode-path caches.",
     {{"", I64(kv.swap_bytes)}}},
    {"dualpath_swap_space_bytes", "gauge",
     "Host memory of the swap space, allocated at start-up (swap_space; 0: none).",
     {{"", I64(kv.swap_space_bytes)}}},
    {"dualpath_parked_host_bytes", "gauge",
     "Host memory of the swap space held by kept turns' caches (given up first when a "
     "preempted sequence needs it).",
     {{"", I64(kv.parked_host_bytes)}}},
    {"dualpath_decode_recomputes_total", "counter",
     "Decode-path preemptions recomputed from their tokens (the swap space was full).",
     {{"", I64(kv.decode_recomputes)}}},
    {"dualpath_recompressions_staged_total", "counter",
     "Recompressions that found no free blocks for their new table and went through a "
     "scratch copy (they never wait for memory).",
     {{"", I64(kv.recompressions_staged)}}},
    {"dualpath_kv_groups_sealed_total", "counter",
     "Groups of a grouped decode-path KV type (kivi4) written once whole: the newest "
     "tokens wait in the arena's type until their group is full.",
     {{"", I64(kv.groups_sealed)}}},
    {"dualpath_kv_groups_shared_total", "counter",
     "Of those groups, the ones another sequence had sealed from the same prompt rows "
     "(a shared system prompt, n > 1): one copy held by both.",
     {{"", I64(kv.groups_shared)}}},
    {"dualpath_decode_queries_missed_total", "counter",
     "Decode queries a SnapKV recompression had to go without (no capture room in a "
     "step, or no memory for the sums): it scored with the others.",
     {{"", I64(decode_queries_missed)}}},
    {"dualpath_early_switches_total", "counter",
     "Sequences switched to the decode path before their prompt ended.",
     {{"", I64(early_switches)}}},
    {"dualpath_early_signals_total", "counter",
     "Kept-set selections the early switch's stability signal made at prompt chunk "
     "ends (only past early_switch's minimum and for prompts not already repetitive).",
     {{"", I64(early_signals)}}},
    {"dualpath_early_switch_tokens_total", "counter",
     "Prompt tokens on the prefill path (computed or from the prefix cache) at the "
     "early switches (over dualpath_early_switches_total: the mean switch point).",
     {{"", I64(early_switch_tokens)}}},
    {"dualpath_rebuilds_total", "counter",
     "Admissions that took back the KV cache of a cached prefix (an earlier turn).",
     {{"", I64(kv.rebuilds)}}},
    {"dualpath_reply_blocks_kept_total", "counter",
     "Blocks of finished decode-path replies written back for the next turn.",
     {{"", I64(kv.reply_blocks_kept)}}},
    {"dualpath_exempt_blocks", "gauge",
     "Decode-path KV blocks the exempt layers' tables hold (every token of the first "
     "exempt_layers layers; part of dualpath_kv_blocks_used{pool=\"decode\"}).",
     {{"", I32(kv.exempt_blocks)}}},
    {"dualpath_parked_turns", "gauge",
     "Finished turns whose compact KV cache is kept for the conversation's next turn.",
     {{"", I32(kv.parked_turns)}}},
    {"dualpath_parked_blocks", "gauge",
     "KV blocks only those kept turns hold (cached like the prefix cache's: not "
     "counted in dualpath_kv_blocks_used, dropped when blocks run short).",
     {{"", I32(kv.parked_blocks)}}},
    {"dualpath_turns_parked_total", "counter",
     "Finished decode-path turns whose compact KV cache was kept for a next turn.",
     {{"", I64(kv.turns_parked)}}},
    {"dualpath_turns_resumed_total", "counter",
     "Requests that continued a kept turn's compact KV cache instead of recomputing "
     "it.",
     {{"", I64(kv.turns_resumed)}}},
    {"dualpath_resumed_tokens_total", "counter",
     "Prompt tokens those requests took from the kept cache (not computed again).",
     {{"", I64(kv.resumed_tokens)}}},
    {"dualpath_parked_evictions_total", "counter",
     "Kept turns' caches dropped (oldest first): the swap space had no room for them, "
     "or more turns were kept than the daemon keeps.",
     {{"", I64(kv.parked_evictions)}}},
    {"dualpath_parked_spills_total", "counter",
     "Kept turns' caches moved to the swap space (host memory) to make room; their "
     "next turn copies them back.",
     {{"", I64(kv.parked_spills)}}},
    {"dualpath_parked_restores_total", "counter",
     "Kept turns' caches copied back from the swap space by their next turn.",
     {{"", I64(kv.parked_restores)}}},
    {"dualpath_rebuild_tokens_total", "counter",
     "Prompt tokens whose KV cache was taken back instead of recomputed, by source; "
     "recomputed tokens count in dualpath_engine_prefill_tokens_total.",
     {{"{source=\"prefix_cache\"}", I64(kv.rebuild_prefix_tokens)},
      {"{source=\"host\"}", I64(kv.rebuild_host_tokens)}}},
    {"dualpath_host_tier_spilled_blocks_total", "counter",
     "Prefill blocks copied to the host tier when evicted from the device.",
     {{"", I64(kv.host_spilled_blocks)}}},
    {"dualpath_host_tier_blocks_capacity", "gauge",
     "Blocks the host tier holds at most (0: no host tier).",
     {{"", I64(kv.host_tier_blocks)}}},
    {"dualpath_requests_running", "gauge",
     "Sequences being prefilled or decoded.",
     {{"", I32(running)}}},
    {"dualpath_requests_running_peak", "gauge",
     "Most sequences running at once since the daemon started.",
     {{"", I32(running_peak)}}},
    {"dualpath_requests_waiting", "gauge",
     "Sequences queued or preempted.",
     {{"", I32(waiting)}}},
    {"dualpath_engine_prefill_tokens_total", "counter",
     "Tokens prefilled by the engine, recomputation included.",
     {{"", I64(prompt_tokens)}}},
    {"dualpath_engine_steps_total", "counter",
     "Scheduler steps run.",
     {{"", I64(steps)}}},
    {"dualpath_engine_busy_seconds_total", "counter",
     "Time spent inside steps.",
     {{"", F64(busy_seconds)}}},
    {"dualpath_engine_graph_steps_total", "counter",
     "Decode steps recorded as CUDA graphs, replayed from one, and recordings given "
     "up (always 0 on the CPU backend).",
     {{"{event=\"recorded\"}", I64(graph_recorded)},
      {"{event=\"replayed\"}", I64(graph_replayed)},
      {"{event=\"abandoned\"}", I64(graph_abandoned)}}},
    {"dualpath_engine_sampled_rows_total", "counter",
     "Tokens sampled, by source: device candidates, candidates then the full row, the "
     "full row alone.",
     {{"{source=\"candidates\"}", I64(sampled_candidates)},
      {"{source=\"fallback\"}", I64(sampled_fallback)},
      {"{source=\"full_row\"}", I64(sampled_full_row)}}},
    {"dualpath_preemptions_total", "counter",
     "Sequences preempted under memory pressure.",
     {{"", I64(preemptions)}}},
    {"dualpath_grammar_masks_total", "counter",
     "Constrained decoding: token masks by source (computed: a walk of the vocabulary "
     "trie; cached: a mask of the same state, from any request with the same grammar; "
     "skipped: the token sampled from the unmasked row continued the grammar)",
     {{"{source=\"computed\"}", I64(grammar_masks_computed)},
      {"{source=\"cached\"}", I64(grammar_masks_cached)},
      {"{source=\"skipped\"}", I64(grammar_masks_skipped)}}},
    {"dualpath_grammar_seconds_total", "counter",
     "Constrained decoding: time spent masking logits",
     {{"", F64(grammar_seconds)}}},
    {"dualpath_failed_steps_total", "counter",
     "Forward passes that failed and failed their sequences (the device was fine).",
     {{"", I64(failed_steps)}}},
};

static void series_render(tbuf *b, const char *name, const metric_series *m,
                          const dp_engine_stats *st)
{
    const char *p = (const char *)st + m->off;
    int32_t i32;
    int64_t i64;
    double f64;
    bool v;
    switch (m->src) {
    case SRC_I32:
        memcpy(&i32, p, sizeof i32);
        tb_printf(b, "%s%s %d\n", name, m->labels, i32);
        break;
    case SRC_I64:
        memcpy(&i64, p, sizeof i64);
        tb_printf(b, "%s%s %lld\n", name, m->labels, (long long)i64);
        break;
    case SRC_F64:
        memcpy(&f64, p, sizeof f64);
        tb_printf(b, "%s%s %.9g\n", name, m->labels, f64);
        break;
    case SRC_BOOL:
        memcpy(&v, p, sizeof v);
        tb_printf(b, "%s%s %d\n", name, m->labels, v ? 1 : 0);
        break;
    }
}

static void engine_metrics_render(tbuf *b, const dp_engine_stats *st)
{
    const bool dual = st->kv.decode_blocks_total > 0, swa = st->kv.swa_blocks_total > 0;
    for (size_t i = 0; i < sizeof k_engine_metrics / sizeof *k_engine_metrics; i++) {
        const metric_def *d = &k_engine_metrics[i];
        family(b, d->name, d->type, d->help);
        for (const metric_series *m = d->series; m->labels; m++)
            if ((m->only != ONLY_DUAL || dual) && (m->only != ONLY_SWA || swa))
                series_render(b, d->name, m, st);
    }
}

/* The engine's migration histogram holds per-bucket counts (the last one is
 * +Inf); Prometheus wants cumulative buckets. */
static void migration_hist_render(tbuf *b, const dp_engine_stats *st)
{
    const char *name = "dualpath_migration_seconds";
    family(b, name, "histogram",
           "Time of one compaction batch (migrations and recompressions) on the engine thread.");
    int64_t cum = 0;
    for (int i = 0; i < DP_MIGRATION_BUCKETS; i++) {
        cum += st->migration_hist[i];
        tb_printf(b, "%s_bucket{le=\"%g\"} %lld\n", name, dp_migration_bucket_bounds[i],
                  (long long)cum);
    }
    cum += st->migration_hist[DP_MIGRATION_BUCKETS];
    /* +Inf must equal _count; the engine bumps both under one lock, but keep
     * the exposition consistent even if a snapshot ever disagrees. */
    if (cum < st->migration_batches)
        cum = st->migration_batches;
    tb_printf(b, "%s_bucket{le=\"+Inf\"} %lld\n", name, (long long)cum);
    tb_printf(b, "%s_sum %.9g\n%s_count %lld\n", name, st->migration_seconds, name, (long long)cum);
}

/* The dual path's counters by scorer and by compaction kind, and its
 * migration histogram (its scalars are in k_engine_metrics). */
static void dualpath_render(tbuf *b, const dp_engine_stats *st)
{
    family(b, "dualpath_migrations_total", "counter",
           "Sequences moved from the prefill path to the decode path, by the scorer used.");
    for (int i = 0; i < DP_N_SCORERS; i++)
        tb_printf(b, "dualpath_migrations_total{scorer=\"%s\"} %lld\n", scorer_name((dp_scorer)i),
                  (long long)st->migrations_by_scorer[i]);
    family(b, "dualpath_scorer_fallbacks_total", "counter",
           "Compactions that wanted SnapKV but had no captured queries (scored by key norm).");
    for (int i = 0; i < DP_N_COMPACTIONS; i++)
        tb_printf(b, "dualpath_scorer_fallbacks_total{kind=\"%s\"} %lld\n", dp_compaction_names[i],
                  (long long)st->scorer_fallbacks[i]);
    family(b, "dualpath_recompressions_total", "counter",
           "Decode-path caches compacted again on reaching the decode budget, by the scorer "
           "used (SnapKV scores with the sequence's last window of decode queries).");
    for (int i = 0; i < DP_N_SCORERS; i++)
        tb_printf(b, "dualpath_recompressions_total{scorer=\"%s\"} %lld\n",
                  scorer_name((dp_scorer)i), (long long)st->recompressions_by_scorer[i]);
    migration_hist_render(b, st);
}

/* Label values here are ours (version, backend) or the model name the
 * operator chose: escape what the format requires anyway. */
static void label_value(tbuf *b, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\' || *s == '"')
            tb_printf(b, "\\%c", *s);
        else if (*s == '\n')
            tb_printf(b, "\\n");
        else
            tb_printf(b, "%c", *s);
    }
}

char *metrics_render(const dp_metrics *m, const dp_engine_stats *st, const dp_metrics_info *info,
                     size_t *len)
{
    static const char *reasons[5] = {"none", "stop", "length", "cancelled", "error"};
    tbuf b = {.cap = 8192};
    b.p = malloc(b.cap);
    if (!b.p)
        return NULL;
    b.p[0] = 0;

    family(&b, "dualpath_build_info", "gauge", "Build and model facts; the value is always 1.");
    tb_printf(&b, "dualpath_build_info{version=\"");
    label_value(&b, info->version);
    tb_printf(&b, "\",backend=\"");
    label_value(&b, info->backend);
    tb_printf(&b, "\",kernels=\"");
    label_value(&b, info->kernels ? info->kernels : "unknown");
    tb_printf(&b, "\",matmul=\"");
    label_value(&b, info->matmul ? info->matmul : "unknown");
    tb_printf(&b, "\",model=\"");
    label_value(&b, info->model);
    tb_printf(&b, "\"} 1\n");

    family(&b, "dualpath_draining", "gauge", "1 while the daemon drains before shutdown.");
    tb_printf(&b, "dualpath_draining %d\n", info->draining ? 1 : 0);
    family(&b, "dualpath_http_connections", "gauge", "Open HTTP connections (this scrape's included).");
    tb_printf(&b, "dualpath_http_connections %u\n", info->connections);


    family(&b, "dualpath_requests_finished_total", "counter",
           "Engine requests finished, by finish reason.");
    for (int i = 1; i < 5; i++)
        tb_printf(&b, "dualpath_requests_finished_total{reason=\"%s\"} %llu\n", reasons[i],
                  (unsigned long long)m->finished[i]);

    family(&b, "dualpath_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
    tb_printf(&b, "dualpath_prompt_tokens_total %llu\n", (unsigned long long)m->prompt_tokens);
    family(&b, "dualpath_generation_tokens_total", "counter",
           "Tokens generated for finished requests.");
    tb_printf(&b, "dualpath_generation_tokens_total %llu\n",
              (unsigned long long)m->generation_tokens);

    engine_metrics_render(&b, st);
    dualpath_render(&b, st);

    hist_render(&b, "dualpath_time_to_first_token_seconds",
                "Time from arrival to the first generated token.", &m->ttft);
    hist_render(&b, "dualpath_inter_token_latency_seconds",
                "Mean time between generated tokens, one sample per request.", &m->itl);
    hist_render(&b, "dualpath_e2e_request_latency_seconds",
                "Time from arrival to the last token.", &m->e2e);

    family(&b, "dualpath_http_responses_total", "counter", "HTTP responses sent, by status code.");
    bool self_seen = !info->answering;
    for (int i = 0; i < m->n_codes; i++) {
        bool self = m->codes[i] == info->answering;
        self_seen |= self;
        tb_printf(&b, "dualpath_http_responses_total{code=\"%d\"} %llu\n", m->codes[i],
                  (unsigned long long)m->code_counts[i] + self);
    }
    if (!self_seen && m->n_codes < DP_METRICS_MAX_CODES) /* (a full table drops it) */
        tb_printf(&b, "dualpath_http_responses_total{code=\"%d\"} 1\n", info->answering);
    family(&b, "dualpath_http_timeouts_total", "counter",
           "Connections closed by a deadline (header, body, idle) and completions cancelled by "
           "request_timeout (request).");
    static const char *const tk[DP_TIMEOUT_KINDS] = {"header", "body", "idle"};
    for (int i = 0; i < DP_TIMEOUT_KINDS; i++)
        tb_printf(&b, "dualpath_http_timeouts_total{kind=\"%s\"} %llu\n", tk[i],
                  (unsigned long long)m->conn_timeouts[i]);
    tb_printf(&b, "dualpath_http_timeouts_total{kind=\"request\"} %llu\n",
              (unsigned long long)m->request_timeouts);
    family(&b, "dualpath_http_auth_failures_total", "counter",
           "Requests refused for a missing or wrong API key (401).");
    tb_printf(&b, "dualpath_http_auth_failures_total %llu\n", (unsigned long long)m->auth_failures);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len)
        *len = b.n;
    return b.p;
}
