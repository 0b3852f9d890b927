/* report.c: summaries and output formats of dp-loadgen. The JSON keys follow vLLM's
 * benchmark_serving.py where one exists, so existing dashboards can read them. */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

static void add_reason(lg_report *rep, const lg_result *r)
{
    for (int i = 0; i < rep->n_reasons; i++)
        if (strcmp(rep->reasons[i].reason, r->reason) == 0) {
            rep->reasons[i].count++;
            return;
        }
    if (rep->n_reasons == LG_MAX_REASONS) {
        rep->other_reasons++;
        return;
    }
    lg_reason_count *rc = &rep->reasons[rep->n_reasons++];
    snprintf(rc->reason, sizeof rc->reason, "%s", r->reason);
    snprintf(rc->example, sizeof rc->example, "%s", r->error ? r->error : "");
    rc->count = 1;
}

int lg_report_compute(const lg_run_result *rr, const lg_slo *slo, lg_report *rep)
{
    memset(rep, 0, sizeof *rep);
    lg_samples ttft, tpot, itl, e2el;
    lg_samples_init(&ttft);
    lg_samples_init(&tpot);
    lg_samples_init(&itl);
    lg_samples_init(&e2el);
    int rc = 0;
    for (size_t i = 0; i < rr->n && rc == 0; i++) {
        const lg_result *r = &rr->res[i];
        rep->all_requests++;
        if (r->prompt_tokens >= 0)
            rep->all_server_prompt_tokens += r->prompt_tokens;
        if (r->completion_tokens >= 0)
            rep->all_server_completion_tokens += r->completion_tokens;
        if (r->prompt_tokens < 0 || r->completion_tokens < 0)
            rep->all_without_usage++;
        if (r->warmup) {
            rep->warmup_requests++;
            continue;
        }
        if (!r->ok) {
            rep->failed++;
            add_reason(rep, r);
            continue;
        }
        rep->completed++;
        if (r->prompt_tokens >= 0 && r->completion_tokens >= 0)
            rep->with_usage++;
        else
            rep->without_usage++;
        rep->total_input_tokens += lg_result_input_tokens(r);
        rep->total_output_tokens += lg_result_output_tokens(r);
        if (r->ttft >= 0)
            rc |= lg_samples_add(&ttft, r->ttft * 1e3);
        if (r->tpot >= 0)
            rc |= lg_samples_add(&tpot, r->tpot * 1e3);
        for (size_t k = 0; k < r->n_itl; k++)
            rc |= lg_samples_add(&itl, r->itl[k] * 1e3);
        rc |= lg_samples_add(&e2el, r->e2e * 1e3);
        if (slo && lg_slo_active(slo) &&
            lg_slo_met(slo, r->ttft >= 0 ? r->ttft * 1e3 : -1, r->tpot >= 0 ? r->tpot * 1e3 : 0,
                       r->e2e * 1e3))
            rep->good++;
    }
    rep->incomplete = rr->incomplete;
    rep->incomplete_chunks = rr->incomplete_chunks;
    rep->duration = rr->duration;
    rep->max_concurrency = rr->concurrency_seen;
    if (rep->duration > 0) {
        rep->request_throughput = (double)rep->completed / rep->duration;
        rep->input_throughput = (double)rep->total_input_tokens / rep->duration;
        rep->output_throughput = (double)rep->total_output_tokens / rep->duration;
        rep->streamed_output_throughput =
            (double)(rep->total_output_tokens + (int64_t)rep->incomplete_chunks) / rep->duration;
        rep->total_token_throughput = rep->input_throughput + rep->output_throughput;
        rep->goodput = (double)rep->good / rep->duration;
    }
    lg_samples_summarize(&ttft, &rep->ttft);
    lg_samples_summarize(&tpot, &rep->tpot);
    lg_samples_summarize(&itl, &rep->itl);
    lg_samples_summarize(&e2el, &rep->e2el);
    lg_samples_destroy(&ttft);
    lg_samples_destroy(&tpot);
    lg_samples_destroy(&itl);
    lg_samples_destroy(&e2el);
    return rc ? DP_ENOMEM : 0;
}

/* ---- table ---- */

static void line_s(FILE *f, const char *k, const char *v) { fprintf(f, "%-40s %s\n", k, v); }
static void line_i(FILE *f, const char *k, long long v) { fprintf(f, "%-40s %lld\n", k, v); }
static void line_f(FILE *f, const char *k, double v) { fprintf(f, "%-40s %.2f\n", k, v); }

static void title(FILE *f, const char *t)
{
    int pad = 50 - (int)strlen(t) - 2;
    int l = pad / 2, r = pad - l;
    fprintf(f, "%.*s %s %.*s\n", l, "==================================================", t, r,
            "==================================================");
}

static void print_summary(FILE *f, const char *name, const char *unit, const lg_summary *s)
{
    char k[64];
    title(f, name);
    if (s->n == 0) {
        snprintf(k, sizeof k, "%s (%s):", name, unit);
        line_s(f, k, "n/a");
        return;
    }
    const char *short_name = strstr(name, "(") ? name : name;
    struct {
        const char *what;
        double v;
    } rows[] = {{"Mean", s->mean}, {"Median", s->median}, {"P90", s->p90}, {"P99", s->p99},
                {"Max", s->max}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        snprintf(k, sizeof k, "%s %s (%s):", rows[i].what, short_name, unit);
        line_f(f, k, rows[i].v);
    }
}

void lg_report_print(FILE *f, const lg_report *rep, const lg_report_meta *m,
                     const lg_run_result *rr)
{
    char v[256];
    title(f, "Serving Benchmark Result");
    if (m->label && *m->label)
        line_s(f, "Label:", m->label);
    snprintf(v, sizeof v, "%s%s (%s)", m->base_url, m->endpoint, m->stream ? "stream" : "no stream");
    line_s(f, "Target:", v);
    line_s(f, "Model:", m->model ? m->model : "(server default)");
    snprintf(v, sizeof v, "%s, input %s, output %s%s", m->workload, m->input_len, m->output_len,
             m->ignore_eos ? " (ignore_eos)" : "");
    line_s(f, "Workload:", v);
    if (m->rate > 0)
        snprintf(v, sizeof v, "%.2f req/s (%s), max concurrency %s", m->rate,
                 m->burstiness == 1.0 ? "Poisson" : "gamma", m->concurrency > 0 ? "" : "unlimited");
    else
        snprintf(v, sizeof v, "closed loop, max concurrency ");
    if (m->concurrency > 0)
        snprintf(v + strlen(v), sizeof v - strlen(v), "%d", m->concurrency);
    line_s(f, "Load:", v);
    line_i(f, "Successful requests:", (long long)rep->completed);
    line_i(f, "Failed requests:", (long long)rep->failed);
    if (rep->incomplete)
        line_i(f, "Incomplete (stopped at time limit):", (long long)rep->incomplete);
    if (rr->time_limited)
        line_s(f, "Stopped by:", "time limit");
    else if (rr->interrupted)
        line_s(f, "Stopped by:", "interrupt (SIGINT)");
    line_i(f, "Max concurrency seen:", rep->max_concurrency);
    line_f(f, "Benchmark duration (s):", rep->duration);
    line_i(f, "Total input tokens:", rep->total_input_tokens);
    line_i(f, "Total generated tokens:", rep->total_output_tokens);
    if (rep->completed) {
        if (rep->without_usage == 0)
            snprintf(v, sizeof v, "server usage (all %zu requests)", rep->with_usage);
        else if (rep->with_usage == 0)
            snprintf(v, sizeof v, "NO server usage: output = %s, input = words sent",
                     m->stream ? "content chunks" : "1 per reply");
        else
            snprintf(v, sizeof v, "server usage for %zu, estimated for %zu", rep->with_usage,
                     rep->without_usage);
        line_s(f, "Token counts from:", v);
    }
    line_f(f, "Request throughput (req/s):", rep->request_throughput);
    if (lg_slo_active(&m->slo))
        line_f(f, "Request goodput (req/s):", rep->goodput);
    line_f(f, "Input token throughput (tok/s):", rep->input_throughput);
    line_f(f, "Output token throughput (tok/s):", rep->output_throughput);
    if (rep->incomplete)
        line_f(f, "Streamed output incl. incomplete (tok/s):", rep->streamed_output_throughput);
    line_f(f, "Total token throughput (tok/s):", rep->total_token_throughput);
    print_summary(f, "TTFT", "ms", &rep->ttft);
    print_summary(f, "TPOT", "ms", &rep->tpot);
    print_summary(f, "ITL", "ms", &rep->itl);
    print_summary(f, "E2EL", "ms", &rep->e2el);
    if (lg_slo_active(&m->slo)) {
        title(f, "Goodput");
        if (m->slo.ttft_ms > 0)
            line_f(f, "SLO TTFT (ms):", m->slo.ttft_ms);
        if (m->slo.tpot_ms > 0)
            line_f(f, "SLO TPOT (ms):", m->slo.tpot_ms);
        if (m->slo.e2el_ms > 0)
            line_f(f, "SLO E2EL (ms):", m->slo.e2el_ms);
        snprintf(v, sizeof v, "%zu of %zu", rep->good, rep->completed);
        line_s(f, "Requests within SLO:", v);
    }
    if (rep->n_reasons) {
        title(f, "Failures by reason");
        for (int i = 0; i < rep->n_reasons; i++) {
            const lg_reason_count *rc = &rep->reasons[i];
            fprintf(f, "%-24s %6d  %s\n", rc->reason, rc->count, rc->example);
        }
        if (rep->other_reasons)
            fprintf(f, "%-24s %6d\n", "(other reasons)", rep->other_reasons);
    }
    fprintf(f, "==================================================\n");
}

/* ---- JSON ---- */

static bool add_summary(cJSON *o, const char *name, const lg_summary *s)
{
    char k[64];
    struct {
        const char *p;
        double v;
    } rows[] = {{"mean", s->mean}, {"median", s->median}, {"p90", s->p90}, {"p99", s->p99},
                {"max", s->max},   {"min", s->min},       {"std", s->stddev}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        snprintf(k, sizeof k, "%s_%s_ms", rows[i].p, name);
        if (!cJSON_AddNumberToObject(o, k, s->n ? rows[i].v : 0))
            return false;
    }
    snprintf(k, sizeof k, "%s_samples", name);
    return cJSON_AddNumberToObject(o, k, (double)s->n) != NULL;
}

static cJSON *prom_json(const lg_prom *p)
{
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; o && i < p->n; i++)
        if (!cJSON_AddNumberToObject(o, p->s[i].key, isfinite(p->s[i].value) ? p->s[i].value : 0)) {
            cJSON_Delete(o);
            return NULL;
        }
    return o;
}

static bool add_scrape(cJSON *root, const lg_report_meta *m)
{
    if (!m->metrics_before && !m->metrics_after)
        return true;
    cJSON *s = cJSON_AddObjectToObject(root, "metrics_scrape");
    if (!s)
        return false;
    lg_prom before = {0}, after = {0};
    bool ok = true;
    if (m->metrics_before) {
        ok &= cJSON_AddStringToObject(s, "before_raw", m->metrics_before) != NULL;
        ok &= lg_prom_parse(m->metrics_before, &before) == 0;
    }
    if (m->metrics_after) {
        ok &= cJSON_AddStringToObject(s, "after_raw", m->metrics_after) != NULL;
        ok &= lg_prom_parse(m->metrics_after, &after) == 0;
    }
    cJSON *b = prom_json(&before), *a = prom_json(&after), *d = cJSON_CreateObject();
    ok &= b && a && d;
    for (size_t i = 0; ok && i < after.n; i++) {
        const lg_prom_sample *pb = lg_prom_find(&before, after.s[i].key);
        double delta = after.s[i].value - (pb ? pb->value : 0);
        if (isfinite(delta) && !cJSON_AddNumberToObject(d, after.s[i].key, delta))
            ok = false;
    }
    if (b)
        cJSON_AddItemToObject(s, "before", b);
    if (a)
        cJSON_AddItemToObject(s, "after", a);
    if (d)
        cJSON_AddItemToObject(s, "delta", d);
    lg_prom_destroy(&before);
    lg_prom_destroy(&after);
    return ok;
}

int lg_report_write_json(const char *path, const lg_report *rep, const lg_report_meta *m,
                         const lg_run_result *rr, char *err, size_t errsz)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    bool ok = true;
    cJSON *cfg = cJSON_AddObjectToObject(root, "config");
    ok &= cfg != NULL;
    if (cfg) {
        ok &= !!cJSON_AddStringToObject(cfg, "label", m->label ? m->label : "");
        ok &= !!cJSON_AddStringToObject(cfg, "base_url", m->base_url);
        ok &= !!cJSON_AddStringToObject(cfg, "endpoint", m->endpoint);
        ok &= !!cJSON_AddStringToObject(cfg, "model", m->model ? m->model : "");
        ok &= !!cJSON_AddStringToObject(cfg, "workload", m->workload);
        ok &= !!cJSON_AddStringToObject(cfg, "input_len", m->input_len);
        ok &= !!cJSON_AddStringToObject(cfg, "output_len", m->output_len);
        ok &= !!cJSON_AddBoolToObject(cfg, "stream", m->stream);
        ok &= !!cJSON_AddBoolToObject(cfg, "ignore_eos", m->ignore_eos);
        ok &= !!cJSON_AddNumberToObject(cfg, "max_concurrency", m->concurrency);
        ok &= !!cJSON_AddNumberToObject(cfg, "num_requests", m->num_requests);
        ok &= !!cJSON_AddNumberToObject(cfg, "warmup", m->warmup);
        ok &= !!cJSON_AddNumberToObject(cfg, "turns", m->turns);
        ok &= !!cJSON_AddNumberToObject(cfg, "request_rate", m->rate);
        ok &= !!cJSON_AddNumberToObject(cfg, "burstiness", m->burstiness);
        ok &= !!cJSON_AddNumberToObject(cfg, "time_limit_s", m->duration_limit);
        ok &= !!cJSON_AddNumberToObject(cfg, "request_timeout_s", m->timeout);
        ok &= !!cJSON_AddNumberToObject(cfg, "slo_ttft_ms", m->slo.ttft_ms);
        ok &= !!cJSON_AddNumberToObject(cfg, "slo_tpot_ms", m->slo.tpot_ms);
        ok &= !!cJSON_AddNumberToObject(cfg, "slo_e2el_ms", m->slo.e2el_ms);
    }
    ok &= !!cJSON_AddNumberToObject(root, "date_unix", rr->wall_start);
    ok &= !!cJSON_AddNumberToObject(root, "duration", rep->duration);
    ok &= !!cJSON_AddNumberToObject(root, "completed", (double)rep->completed);
    ok &= !!cJSON_AddNumberToObject(root, "failed", (double)rep->failed);
    ok &= !!cJSON_AddNumberToObject(root, "incomplete", (double)rep->incomplete);
    ok &= !!cJSON_AddBoolToObject(root, "time_limited", rr->time_limited);
    ok &= !!cJSON_AddBoolToObject(root, "interrupted", rr->interrupted);
    ok &= !!cJSON_AddNumberToObject(root, "max_concurrency_seen", rep->max_concurrency);
    ok &= !!cJSON_AddNumberToObject(root, "keepalive_retries", (double)rr->retries);
    ok &= !!cJSON_AddNumberToObject(root, "total_input_tokens", (double)rep->total_input_tokens);
    ok &= !!cJSON_AddNumberToObject(root, "total_output_tokens", (double)rep->total_output_tokens);
    ok &= !!cJSON_AddNumberToObject(root, "request_throughput", rep->request_throughput);
    ok &= !!cJSON_AddNumberToObject(root, "request_goodput", rep->goodput);
    ok &= !!cJSON_AddNumberToObject(root, "good_requests", (double)rep->good);
    ok &= !!cJSON_AddNumberToObject(root, "input_throughput", rep->input_throughput);
    ok &= !!cJSON_AddNumberToObject(root, "output_throughput", rep->output_throughput);
    ok &= !!cJSON_AddNumberToObject(root, "streamed_output_throughput",
                                    rep->streamed_output_throughput);
    ok &= !!cJSON_AddNumberToObject(root, "total_token_throughput", rep->total_token_throughput);
    ok &= add_summary(root, "ttft", &rep->ttft);
    ok &= add_summary(root, "tpot", &rep->tpot);
    ok &= add_summary(root, "itl", &rep->itl);
    ok &= add_summary(root, "e2el", &rep->e2el);
    ok &= !!cJSON_AddStringToObject(root, "token_source",
                                    rep->without_usage == 0 ? "usage"
                                    : rep->with_usage == 0  ? "chunks"
                                                            : "mixed");
    ok &= !!cJSON_AddNumberToObject(root, "requests_with_usage", (double)rep->with_usage);
    ok &= !!cJSON_AddNumberToObject(root, "requests_without_usage", (double)rep->without_usage);
    cJSON *all = cJSON_AddObjectToObject(root, "all_requests_totals");
    ok &= all != NULL;
    if (all) {
        /* What the server should have counted: warm-up and failed requests included. */
        ok &= !!cJSON_AddNumberToObject(all, "requests", (double)rep->all_requests);
        ok &= !!cJSON_AddNumberToObject(all, "warmup_requests", (double)rep->warmup_requests);
        ok &= !!cJSON_AddNumberToObject(all, "requests_without_usage", (double)rep->all_without_usage);
        ok &= !!cJSON_AddNumberToObject(all, "server_prompt_tokens", (double)rep->all_server_prompt_tokens);
        ok &= !!cJSON_AddNumberToObject(all, "server_completion_tokens",
                                        (double)rep->all_server_completion_tokens);
    }
    cJSON *fr = cJSON_AddObjectToObject(root, "failures_by_reason");
    cJSON *fe = cJSON_AddObjectToObject(root, "failure_examples");
    ok &= fr && fe;
    for (int i = 0; ok && i < rep->n_reasons; i++) {
        ok &= !!cJSON_AddNumberToObject(fr, rep->reasons[i].reason, rep->reasons[i].count);
        ok &= !!cJSON_AddStringToObject(fe, rep->reasons[i].reason, rep->reasons[i].example);
    }
    cJSON *fs = cJSON_AddObjectToObject(root, "failures_by_status");
    ok &= fs != NULL;
    for (size_t i = 0; ok && i < rr->n; i++) {
        const lg_result *r = &rr->res[i];
        if (r->ok || r->warmup)
            continue;
        char k[16];
        snprintf(k, sizeof k, "%d", r->status);
        cJSON *c = cJSON_GetObjectItemCaseSensitive(fs, k);
        if (c)
            cJSON_SetNumberValue(c, c->valuedouble + 1);
        else
            ok &= !!cJSON_AddNumberToObject(fs, k, 1);
    }
    cJSON *reqs = cJSON_AddArrayToObject(root, "requests");
    ok &= reqs != NULL;
    for (size_t i = 0; ok && i < rr->n; i++) {
        const lg_result *r = &rr->res[i];
        cJSON *o = cJSON_CreateObject();
        if (!o) {
            ok = false;
            break;
        }
        cJSON_AddItemToArray(reqs, o);
        ok &= !!cJSON_AddNumberToObject(o, "id", (double)r->id);
        ok &= !!cJSON_AddBoolToObject(o, "warmup", r->warmup);
        ok &= !!cJSON_AddBoolToObject(o, "ok", r->ok);
        ok &= !!cJSON_AddNumberToObject(o, "status", r->status);
        if (!r->ok) {
            ok &= !!cJSON_AddStringToObject(o, "reason", r->reason);
            ok &= !!cJSON_AddStringToObject(o, "error", r->error ? r->error : "");
        }
        ok &= !!cJSON_AddNumberToObject(o, "start_s", r->start);
        ok &= !!cJSON_AddNumberToObject(o, "ttft_ms", r->ttft >= 0 ? r->ttft * 1e3 : -1);
        ok &= !!cJSON_AddNumberToObject(o, "tpot_ms", r->tpot >= 0 ? r->tpot * 1e3 : -1);
        ok &= !!cJSON_AddNumberToObject(o, "e2el_ms", r->e2e * 1e3);
        ok &= !!cJSON_AddNumberToObject(o, "prompt_tokens", r->prompt_tokens);
        ok &= !!cJSON_AddNumberToObject(o, "completion_tokens", r->completion_tokens);
        ok &= !!cJSON_AddNumberToObject(o, "chunks", r->chunks);
        ok &= !!cJSON_AddNumberToObject(o, "prompt_words", r->prompt_words);
        ok &= !!cJSON_AddNumberToObject(o, "max_tokens", r->max_tokens);
        if (r->session >= 0) {
            ok &= !!cJSON_AddNumberToObject(o, "session", (double)r->session);
            ok &= !!cJSON_AddNumberToObject(o, "turn", r->turn);
        }
        cJSON *itl = cJSON_AddArrayToObject(o, "itl_ms");
        ok &= itl != NULL;
        for (size_t k = 0; ok && k < r->n_itl; k++) {
            cJSON *x = cJSON_CreateNumber(r->itl[k] * 1e3);
            if (!x)
                ok = false;
            else
                cJSON_AddItemToArray(itl, x);
        }
    }
    ok &= add_scrape(root, m);
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory building the JSON report");
    FILE *f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
    if (!f) {
        free(text);
        return dp_err(err, errsz, DP_EIO, "cannot write %s: %s", path, strerror(errno));
    }
    bool bad = fputs(text, f) < 0 || fputc('\n', f) < 0;
    free(text);
    if (f != stdout)
        bad |= fclose(f) != 0;
    if (bad)
        return dp_err(err, errsz, DP_EIO, "cannot write %s", path);
    return 0;
}

int lg_report_append_tsv(const char *path, const lg_report *rep, const lg_report_meta *m,
                         char *err, size_t errsz)
{
    struct stat st;
    bool fresh = stat(path, &st) != 0 || st.st_size == 0;
    FILE *f = fopen(path, "a");
    if (!f)
        return dp_err(err, errsz, DP_EIO, "cannot open %s: %s", path, strerror(errno));
    if (fresh)
        fprintf(f, "label\tconcurrency\trate\tinput_len\toutput_len\tcompleted\tfailed\tincomplete\t"
                   "duration_s\treq_per_s\tinput_tok_per_s\toutput_tok_per_s\tmean_ttft_ms\t"
                   "p50_ttft_ms\tp99_ttft_ms\tmean_tpot_ms\tp99_tpot_ms\tp99_itl_ms\t"
                   "p50_e2el_ms\tp99_e2el_ms\tgoodput\ttoken_source\n");
    fprintf(f, "%s\t%d\t%.3f\t%s\t%s\t%zu\t%zu\t%zu\t%.3f\t%.3f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t"
               "%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.3f\t%s\n",
            m->label && *m->label ? m->label : "-", m->concurrency, m->rate, m->input_len,
            m->output_len, rep->completed, rep->failed, rep->incomplete, rep->duration,
            rep->request_throughput, rep->input_throughput, rep->output_throughput, rep->ttft.mean,
            rep->ttft.median, rep->ttft.p99, rep->tpot.mean, rep->tpot.p99, rep->itl.p99,
            rep->e2el.median, rep->e2el.p99, rep->goodput,
            rep->without_usage == 0 ? "usage" : rep->with_usage == 0 ? "chunks" : "mixed");
    if (fclose(f) != 0)
        return dp_err(err, errsz, DP_EIO, "cannot write %s", path);
    return 0;
}

/* ---- Prometheus ---- */

int lg_prom_parse(const char *text, lg_prom *out)
{
    memset(out, 0, sizeof *out);
    const char *s = text;
    while (s && *s) {
        const char *eol = strchr(s, '\n');
        size_t len = eol ? (size_t)(eol - s) : strlen(s);
        const char *next = eol ? eol + 1 : NULL;
        while (len && (s[len - 1] == '\r' || s[len - 1] == ' '))
            len--;
        if (len == 0 || s[0] == '#') {
            s = next;
            continue;
        }
        /* The key runs to the first space outside {...} (label values may hold spaces). */
        size_t k = 0;
        bool in_braces = false, in_quotes = false;
        for (; k < len; k++) {
            char c = s[k];
            if (in_quotes) {
                if (c == '\\')
                    k++;
                else if (c == '"')
                    in_quotes = false;
            } else if (c == '"' && in_braces) {
                in_quotes = true;
            } else if (c == '{') {
                in_braces = true;
            } else if (c == '}') {
                in_braces = false;
            } else if ((c == ' ' || c == '\t') && !in_braces) {
                break;
            }
        }
        if (k >= len) {
            s = next;
            continue;
        }
        char val[64];
        size_t vs = k;
        while (vs < len && (s[vs] == ' ' || s[vs] == '\t'))
            vs++;
        size_t vl = 0;
        while (vs + vl < len && s[vs + vl] != ' ' && vl + 1 < sizeof val) {
            val[vl] = s[vs + vl];
            vl++;
        }
        val[vl] = '\0';
        char *end;
        double v = strtod(val, &end);
        if (end == val) {
            s = next;
            continue;
        }
        if (out->n == out->cap) {
            size_t nc = out->cap ? out->cap * 2 : 64;
            lg_prom_sample *ns = realloc(out->s, nc * sizeof *ns);
            if (!ns) {
                lg_prom_destroy(out);
                return DP_ENOMEM;
            }
            out->s = ns;
            out->cap = nc;
        }
        char *key = strndup(s, k);
        if (!key) {
            lg_prom_destroy(out);
            return DP_ENOMEM;
        }
        out->s[out->n].key = key;
        out->s[out->n].value = v;
        out->n++;
        s = next;
    }
    return 0;
}

void lg_prom_destroy(lg_prom *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->s[i].key);
    free(p->s);
    memset(p, 0, sizeof *p);
}

const lg_prom_sample *lg_prom_find(const lg_prom *p, const char *key)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->s[i].key, key) == 0)
            return &p->s[i];
    return NULL;
}

bool lg_prom_interesting(const char *key)
{
    size_t nl = strcspn(key, "{");
    char name[256];
    if (nl >= sizeof name)
        nl = sizeof name - 1;
    memcpy(name, key, nl);
    name[nl] = '\0';
    if (nl >= 7 && strcmp(name + nl - 7, "_bucket") == 0)
        return false;
    return strstr(name, "tokens") || strstr(name, "requests");
}
