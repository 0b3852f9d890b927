/* dp_eval.c: the quality evaluator of KV compression. It prefills real text,
 * compresses the cache with every scorer x keep ratio, teacher-forces the
 * continuation (perplexity, KL from the full cache, top-1 agreement) and
 * checks greedy agreement on chat prompts; tables go to stdout and, with
 * --markdown, into a marked section of a document (docs/dualpath.md).
 * Compaction goes through kv_migrate, the function the daemon's KV manager
 * migrates with, on a cache of the daemon's default type (f16; --kv-type).
 * This file holds the options, the model's opening and the document; the
 * tables are in eval_*.c (dp_eval.h lists them). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "kvcache/manager.h"
#include "model/chat_template.h"
#include "tools/dp_eval.h"
#include "tools/kv_sim.h"


static int die(const char *what, int rc, const char *err)
{
    fprintf(stderr, "dp-eval: %s: %s (%s)\n", what, err ? err : "", dp_strerror(rc));
    return 1;
}

/* Replaces the section between this tag's markers in path (appending it when
 * absent, creating the file when missing). */
static int write_markdown(const char *path, const char *tag, const char *body)
{
    char begin[128], end[128];
    snprintf(begin, sizeof begin, "<!-- dp-eval:%s:begin -->\n", tag);
    snprintf(end, sizeof end, "<!-- dp-eval:%s:end -->\n", tag);
    char *old = NULL;
    size_t old_n = 0;
    FILE *f = fopen(path, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, 0, SEEK_SET);
        old = malloc((size_t)(sz > 0 ? sz : 0) + 1);
        if (!old || fread(old, 1, (size_t)sz, f) != (size_t)sz) {
            fclose(f);
            free(old);
            return DP_EIO;
        }
        old[sz] = 0;
        old_n = (size_t)sz;
        fclose(f);
    }
    char *b = old ? strstr(old, begin) : NULL;
    char *e = b ? strstr(b, end) : NULL;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *w = fopen(tmp, "wb");
    if (!w) {
        free(old);
        return DP_EIO;
    }
    if (b && e) {
        fwrite(old, 1, (size_t)(b - old), w);
        fputs(begin, w);
        fputs(body, w);
        fputs(end, w);
        char *rest = e + strlen(end);
        fwrite(rest, 1, old_n - (size_t)(rest - old), w);
    } else {
        if (old) {
            fwrite(old, 1, old_n, w);
            if (old_n && old[old_n - 1] != '\n')
                fputc('\n', w);
            fputc('\n', w);
        }
        fputs(begin, w);
        fputs(body, w);
        fputs(end, w);
    }
    free(old);
    if (fclose(w) != 0 || rename(tmp, path) != 0)
        return DP_EIO;
    return 0;
}

static void machine_line(sbuf *s, const ev *e)
{
    char model[256] = "unknown CPU", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    int cores = 0;
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "model name", 10) && model[0] == 'u') {
                const char *c = strchr(line, ':');
                if (c) {
                    snprintf(model, sizeof model, "%s", c + 2);
                    model[strcspn(model, "\n")] = 0;
                }
            }
            if (!strncmp(line, "processor", 9))
                cores++;
        }
        fclose(f);
    }
    sb_printf(s, "Machine: %s, %d logical CPUs, backend `%s` with %d thread(s).\n\n", model, cores,
              e->be->ops->name, e->be->n_threads);
}

/* ---- options ------------------------------------------------------------------ */

static int parse_list_i(const char *s, int32_t *v, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x <= 0 || x > 1 << 20)
            return -1;
        v[n++] = (int32_t)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *s ? -1 : n;
}

static int parse_list_f(const char *s, float *v, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        double x = strtod(s, &end);
        if (end == s || !(x > 0 && x <= 1))
            return -1;
        v[n++] = (float)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *s ? -1 : n;
}

/* A grid's decode types may also be simulated ones (sim-kivi4, sim-kivi2: kv_sim.h). */
static int parse_grid_type(const char *v)
{
    int t = dp_kv_type_parse(v);
    return t >= 0 ? t : kv_sim_parse(v);
}

static int parse_kv_types(const char *s, int *v)
{
    int n = 0;
    char buf[64];
    while (*s && n < MAX_DTYPES) {
        size_t k = strcspn(s, ",");
        if (k == 0 || k >= sizeof buf)
            return -1;
        memcpy(buf, s, k);
        buf[k] = 0;
        if ((v[n++] = parse_grid_type(buf)) < 0)
            return -1;
        s += k + (s[k] == ',');
    }
    return *s ? -1 : n;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: dp-eval [--model FILE] [--text FILE] [--prefill 512,2048] [--cont 256]\n"
            "               [--offset TOKENS] [--windows N] [--ratios 1,0.7,0.5,0.3,0.2,0.1]\n"
            "               [--seeds 5] [--sinks 4] [--window 32] [--chat 20] [--gen 64]\n"
            "               [--threads N] [--device cpu] [--kv-type f16|f32]\n"
            "               [--decode-kv-type f16|f32|q8_0|q4_0]\n"
            "               [--grid [--decode-kv-types f16,q8_0,q4_0,kivi4,sim-kivi2,sim-kivi4v8] [--kivi-group 32]\n"
            "                       [--scorer snapkv]\n"
            "                       [--passkey 512,1024,2048,4096] [--depths 10] [--exempt N] [--early S]\n"
            "                       [--niah 1024,2048,4096,6144] [--trials 12] [--needles 4]]\n"
            "               [--budget 128,256,512 [--keep 0.5]]   (decode-budget tables)\n"
            "               [--markdown FILE [--tag NAME]]\n");
}

/* Reads argv into *out: 1 to run, 0 after --help, 2 on a bad option
 * (said on stderr). */
static int parse_args(int argc, char **argv, opts *out)
{
    opts o = {.model = "models/SmolLM2-135M-Instruct.Q4_1.gguf",
              .text = "/usr/share/common-licenses/GPL-3",
              .device = "cpu",
              .tag = "tables",
              .prefill = {512, 2048},
              .n_prefill = 2,
              .cont = 256,
              .windows = 1,
              .ratios = {1.0f, 0.7f, 0.5f, 0.3f, 0.2f, 0.1f},
              .n_ratios = 6,
              .seeds = 5,
              .sinks = 4,
              .window = 32,
              .chat = 20,
              .gen = 64,
              .kv_type = DP_KV_F16,
              .dkv_type = -1,
              .dtypes = {DP_KV_F16, DP_KV_Q8_0, DP_KV_Q4_0},
              .n_dtypes = 3,
              .kivi_group = 32,
              .passkey = {512, 1024, 2048, 4096},
              .n_passkey = 4,
              .depths = 10,
              .niah = {1024, 2048, 4096, 6144},
              .n_niah = 4,
              .trials = 12,
              .needles = 4,
              .scorer = DP_SCORER_SNAPKV,
              .keep = 0.5f};
    bool ratios_set = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "--grid")) {
            o.grid = true;
            continue;
        }
        if (!v) {
            usage();
            return 2;
        }
        i++;
        int bad = 0;
        if (!strcmp(a, "--model"))
            o.model = v;
        else if (!strcmp(a, "--text"))
            o.text = v;
        else if (!strcmp(a, "--device"))
            o.device = v;
        else if (!strcmp(a, "--markdown"))
            o.markdown = v;
        else if (!strcmp(a, "--tag"))
            o.tag = v;
        else if (!strcmp(a, "--prefill"))
            bad = (o.n_prefill = parse_list_i(v, o.prefill, 8)) <= 0;
        else if (!strcmp(a, "--ratios"))
            bad = (o.n_ratios = parse_list_f(v, o.ratios, MAX_RATIOS)) <= 0, ratios_set = true;
        else if (!strcmp(a, "--decode-kv-type"))
            bad = (o.dkv_type = dp_kv_type_parse(v)) < 0;
        else if (!strcmp(a, "--decode-kv-types"))
            bad = (o.n_dtypes = parse_kv_types(v, o.dtypes)) <= 0;
        else if (!strcmp(a, "--passkey"))
            bad = !strcmp(v, "0") ? (o.n_passkey = 0, 0) : (o.n_passkey = parse_list_i(v, o.passkey, MAX_LENS)) <= 0;
        else if (!strcmp(a, "--niah"))
            bad = !strcmp(v, "0") ? (o.n_niah = 0, 0) : (o.n_niah = parse_list_i(v, o.niah, MAX_LENS)) <= 0;
        else if (!strcmp(a, "--trials"))
            bad = (o.trials = atoi(v)) < 1 || o.trials > 64;
        else if (!strcmp(a, "--needles"))
            bad = (o.needles = atoi(v)) < 1 || o.needles > 8;
        else if (!strcmp(a, "--depths"))
            bad = (o.depths = atoi(v)) < 1 || o.depths > 16;
        else if (!strcmp(a, "--scorer")) {
            bad = 1;
            for (int sc = 0; sc < N_SCORERS; sc++)
                if (!strcmp(v, scorer_name((dp_scorer)sc)))
                    o.scorer = (dp_scorer)sc, bad = 0;
        }
        else if (!strcmp(a, "--budget"))
            bad = (o.n_budgets = parse_list_i(v, o.budgets, 8)) <= 0;
        else if (!strcmp(a, "--keep"))
            bad = !((o.keep = (float)atof(v)) > 0 && o.keep <= 1);
        else if (!strcmp(a, "--exempt"))
            bad = (o.exempt = atoi(v)) < 0;
        else if (!strcmp(a, "--early"))
            bad = (o.early = atoi(v)) < 0;
        else if (!strcmp(a, "--kivi-group"))
            bad = (o.kivi_group = atoi(v)) <= 0 || o.kivi_group % BT;
        else if (!strcmp(a, "--cont"))
            bad = (o.cont = atoi(v)) < 1;
        else if (!strcmp(a, "--offset"))
            bad = (o.offset = atoi(v)) < 0;
        else if (!strcmp(a, "--windows"))
            bad = (o.windows = atoi(v)) < 1;
        else if (!strcmp(a, "--seeds"))
            bad = (o.seeds = atoi(v)) < 1 || o.seeds > MAX_SEEDS;
        else if (!strcmp(a, "--sinks"))
            bad = (o.sinks = atoi(v)) < 0;
        else if (!strcmp(a, "--window"))
            bad = (o.window = atoi(v)) < 0;
        else if (!strcmp(a, "--chat"))
            bad = (o.chat = atoi(v)) < 0;
        else if (!strcmp(a, "--gen"))
            bad = (o.gen = atoi(v)) < 1;
        else if (!strcmp(a, "--threads"))
            bad = (o.threads = atoi(v)) < 0;
        else if (!strcmp(a, "--kv-type"))
            bad = !strcmp(v, "f16") ? (o.kv_type = DP_KV_F16, 0)
                  : !strcmp(v, "f32") ? (o.kv_type = DP_KV_F32, 0) : 1;
        else {
            fprintf(stderr, "dp-eval: unknown option %s\n", a);
            usage();
            return 2;
        }
        if (bad) {
            fprintf(stderr, "dp-eval: bad value for %s: %s\n", a, v);
            return 2;
        }
    }

    if (o.dkv_type < 0)
        o.dkv_type = o.kv_type;
    for (int t = 0; t < o.n_dtypes; t++)
        if (kv_sim_is(o.dtypes[t]) && (o.exempt > 0 || o.early > 0 || strcmp(o.device, "cpu"))) {
            fprintf(stderr, "dp-eval: simulated types (%s) run on the cpu device, without --exempt "
                    "and --early\n", kv_sim_name(o.dtypes[t]));
            return 2;
        }
    for (int i = 0; i < o.n_budgets; i++)
        if (o.budgets[i] <= o.sinks + o.window) {
            fprintf(stderr, "dp-eval: a decode budget must exceed sinks + window (%d)\n",
                    o.sinks + o.window);
            return 2;
        }
    if (o.grid && !ratios_set) {
        static const float grid_ratios[] = {1.0f, 0.7f, 0.5f, 0.3f};
        memcpy(o.ratios, grid_ratios, sizeof grid_ratios);
        o.n_ratios = 4;
    }
    *out = o;
    return 1;
}

/* Opens the model (model_open: file, tokenizer, backend, forward pass) and
 * the context's buffers. */
static int ev_open(ev *e, const opts *o, char *err, size_t errsz)
{
    int32_t max_tokens = CHUNK > o->cont ? CHUNK : o->cont;
    if (o->chat > max_tokens)
        max_tokens = o->chat;
    dp_model_open_opts mo = {.path = o->model, .device = o->device, .threads = o->threads,
                             .max_tokens = max_tokens,
                             .max_out = o->cont > o->chat ? o->cont : (o->chat > 2 ? o->chat : 2),
                             .tokenizer = true};
    int rc = model_open(&e->mf, &mo, err, errsz);
    if (rc)
        return rc;
    e->g = &e->mf.g;
    e->tok = e->mf.tok;
    e->be = e->mf.be;
    e->m = e->mf.m;
    e->hp = llama_hparams(e->m);
    e->vocab = e->hp->vocab;
    e->qd = e->hp->n_heads * e->hp->head_dim;
    size_t qn = (size_t)e->hp->n_layers * DP_MAX_CAPTURE * (size_t)e->qd;
    e->q_host = malloc(qn * sizeof(float));
    e->q_dev = e->be->ops->alloc(e->be, qn * sizeof(float));
    e->logits = malloc((size_t)llama_max_out(e->m) * e->vocab * sizeof(float));
    if (!e->q_host || !e->q_dev || !e->logits ||
        batch_buf_init(&e->bb, max_tokens, max_tokens, 1, DP_MAX_CAPTURE))
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    if ((rc = kv_migrator_init(&e->mig, e->be, e->hp->n_layers, e->hp->n_kv_heads, e->hp->n_heads,
                               e->hp->head_dim)))
        return dp_err(err, errsz, rc, "the compressor");
    return 0;
}

static void ev_close(ev *e)
{
    kv_migrator_destroy(&e->mig);
    if (e->q_dev)
        e->be->ops->free(e->be, e->q_dev);
    free(e->q_host);
    free(e->logits);
    batch_buf_destroy(&e->bb);
    model_close(&e->mf);
}

/* The text, tokenized once. */
static int read_text(ev *e, const char *path, int32_t **text, size_t *n_text, char *err,
                     size_t errsz)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return dp_err(err, errsz, DP_EIO, "%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    bool ok = buf && fread(buf, 1, (size_t)sz, f) == (size_t)sz;
    fclose(f);
    if (!ok) {
        free(buf);
        return dp_err(err, errsz, DP_EIO, "%s: cannot read", path);
    }
    int rc = tokenizer_encode(e->tok, buf, (size_t)sz, tokenizer_add_bos(e->tok), false, text,
                              n_text);
    free(buf);
    return rc ? dp_err(err, errsz, rc, "%s: cannot tokenize", path) : 0;
}

/* The tables the options ask for, in order: the grid alone, or the
 * decode-budget tables alone, or the teacher-forced tables then the chat
 * table. */
static int run_tables(ev *e, const int32_t *text, int32_t n_text, sbuf *md, char *err,
                      size_t errsz)
{
    const opts *o = e->o;
    int rc;
    if (o->grid) {
        if ((rc = run_grid(e, text, n_text, md, err, errsz)))
            return rc;
        sb_flush(md);
        return 0;
    }
    if (o->n_budgets > 0 && (rc = run_budget(e, text, n_text, md)))
        return dp_err(err, errsz, rc, "decode-budget evaluation failed");
    if (o->n_budgets > 0)
        return 0;
    if ((rc = run_tf(e, text, n_text, md)))
        return dp_err(err, errsz, rc, "teacher-forced evaluation failed");
    if (o->chat > 0 && (rc = run_chat(e, text, n_text, md, err, errsz)))
        return rc;
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    int pr = parse_args(argc, argv, &o);
    if (pr != 1)
        return pr;
    char err[DP_ERRLEN] = "";
    ev e = {.o = &o};
    int32_t *text = NULL;
    size_t n_text = 0;
    int rc = ev_open(&e, &o, err, sizeof err);
    /* A sliding-window layer's window counts slots: a compacted or grouped
     * cache would move them off its positions (the engine refuses the same). */
    bool swa_bad = false;
    for (int i = 0; !rc && e.hp->swa_window > 0 && i < o.n_ratios; i++)
        swa_bad |= o.ratios[i] < 1.0f;
    for (int t = 0; !rc && e.hp->swa_window > 0 && o.grid && t < o.n_dtypes; t++)
        swa_bad |= kv_sim_is(o.dtypes[t]) || dp_kv_type_grouped(o.dtypes[t]);
    if (swa_bad) {
        fprintf(stderr, "dp-eval: this model (%s) has sliding-window layers, whose cache is kept "
                "whole: --ratios 1 only, and no grouped or simulated decode types\n", e.hp->arch);
        ev_close(&e);
        return 2;
    }
    if (!rc && o.exempt > 0 && (!o.grid || o.exempt > e.hp->n_layers)) {
        fprintf(stderr, "dp-eval: --exempt takes a layer count up to the model's %d, with --grid\n",
                e.hp->n_layers);
        ev_close(&e);
        return 2;
    }
    if (!rc)
        rc = read_text(&e, o.text, &text, &n_text, err, sizeof err);
    if (rc) {
        ev_close(&e);
        return die("start", rc, err);
    }
    fprintf(stderr, "dp-eval: %s: %zu tokens; model %s: %d layers, %d KV heads, head dim %d\n", o.text,
            n_text, o.model, e.hp->n_layers, e.hp->n_kv_heads, e.hp->head_dim);
    sbuf md = {0};
    sb_printf(&md, "Produced by `");
    for (int i = 0; i < argc; i++)
        sb_printf(&md, "%s%s", i ? " " : "", argv[i]);
    sb_printf(&md, "` (text `%s`, %zu tokens; model `%s`; sinks %d, window %d, random seeds 1..%d).\n",
              o.text, n_text, o.model, o.sinks, o.window, o.seeds);
    machine_line(&md, &e);
    rc = run_tables(&e, text, (int32_t)n_text, &md, err, sizeof err);
    if (!rc && o.markdown && write_markdown(o.markdown, o.tag, md.p))
        rc = dp_err(err, sizeof err, DP_EIO, "%s: cannot write", o.markdown);
    free(md.p);
    free(text);
    ev_close(&e);
    return rc ? die("evaluation", rc, err) : 0;
}
