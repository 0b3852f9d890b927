/* serve.c: the serving mode: model, tokenizer and chat template, the engine
 * thread, the HTTP API on a libuv loop, and signals (SIGTERM/SIGINT drain
 * then exit, SIGHUP reloads the log level), and systemd's notify protocol:
 * STATUS while loading, READY=1 once listening, a watchdog gated on the
 * engine's heartbeat, STOPPING=1 when draining starts. */
#include "serve.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uv.h>

#include "api/server.h"
#include "common/dp.h"
#include "kernels/backend.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "notify.h"

void serve_opts_default(dp_serve_opts *o)
{
    memset(o, 0, sizeof *o);
    o->device = "auto";
    server_opts_default(&o->api);
    o->drain_timeout_s = 30.0;
    o->log_level = DP_LOG_INFO;
    o->watchdog = true;
    o->cuda_graphs = true;
    engine_opts_default(&o->engine);
}

typedef struct serve_ctx {
    const dp_serve_opts *o;
    uv_loop_t loop;
    uv_signal_t sig_term, sig_int, sig_hup;
    bool signals_open;
    dp_server *srv;
    dp_engine *engine;
    bool stopping;
    bool stopped;
    int log_level;
    /* systemd watchdog: beats only while the engine's heartbeat advances. */
    uv_timer_t wd_timer;
    bool wd_open;
    uint64_t wd_usec;
    uint64_t wd_last_hb;
    double wd_last_progress;
    bool wd_stalled;
    /* TEST HOOK: DUALPATHD_DEBUG_STALL_AFTER_S stalls the engine. */
    uv_timer_t stall_timer;
    bool stall_open;
    char status_line[320];   /* STATUS= while serving */
    /* Loading runs on its own thread while the loop answers /health (503). */
    uv_thread_t loader;
    uv_async_t load_done;
    bool load_open;
    bool loading;
    int load_rc;
    char load_err[2 * DP_ERRLEN + 64];
    dp_gguf *g;
    const dp_tokenizer *tok;
    dp_backend *be;
    dp_llama *m;
    const char *name;
    char where[300];
    double t0;
    int exit_status;
} serve_ctx;

static void on_closed(uv_handle_t *h)
{
    (void)h;
}

/* The engine loop bumps its heartbeat every iteration (every 250 ms when
 * idle), so a heartbeat that stands still means a hung engine thread: then no
 * WATCHDOG=1 goes out and systemd restarts us after WatchdogSec. The timer
 * ticks at a quarter of the interval so that a healthy engine is seen within
 * half of it. */
static void on_watchdog(uv_timer_t *t)
{
    serve_ctx *c = t->data;
    dp_engine_stats st;
    engine_get_stats(c->engine, &st);
    double now = dp_now();
    if (st.heartbeat != c->wd_last_hb) {
        c->wd_last_hb = st.heartbeat;
        c->wd_last_progress = now;
        if (c->wd_stalled) {
            c->wd_stalled = false;
            dp_log(DP_LOG_WARN, "watchdog: the engine makes progress again");
            notify_sendf("STATUS=%s", c->status_line);
        }
        notify_send("WATCHDOG=1");
        return;
    }
    if (!c->wd_stalled && now - c->wd_last_progress >= (double)c->wd_usec * 0.5e-6) {
        c->wd_stalled = true;
        dp_log(DP_LOG_ERROR, "watchdog: no engine heartbeat for %.1f s; withholding WATCHDOG=1",
               now - c->wd_last_progress);
        notify_send("STATUS=engine stalled: no heartbeat");
    }
}

static void watchdog_start(serve_ctx *c)
{
    c->wd_usec = notify_watchdog_usec();
    if (!c->wd_usec)
        return;
    if (!c->o->watchdog) {
        dp_log(DP_LOG_WARN, "watchdog: WATCHDOG_USEC is set but watchdog = false: not answering it");
        return;
    }
    uint64_t ms = c->wd_usec / 4000;
    if (ms < 1)
        ms = 1;
    dp_engine_stats st;
    engine_get_stats(c->engine, &st);
    c->wd_last_hb = st.heartbeat;
    c->wd_last_progress = dp_now();
    uv_timer_init(&c->loop, &c->wd_timer);
    c->wd_timer.data = c;
    c->wd_open = true;
    notify_send("WATCHDOG=1");
    uv_timer_start(&c->wd_timer, on_watchdog, ms, ms);
    dp_log(DP_LOG_INFO, "watchdog: every %.3f s while the engine's heartbeat advances "
           "(WATCHDOG_USEC=%llu)", (double)ms / 1000.0, (unsigned long long)c->wd_usec);
}

static void on_debug_stall(uv_timer_t *t)
{
    serve_ctx *c = t->data;
    dp_log(DP_LOG_WARN, "serve: DUALPATHD_DEBUG_STALL_AFTER_S: stalling the engine (test hook)");
    engine_debug_stall(c->engine);
}

/* TEST HOOK: DUALPATHD_DEBUG_STALL_AFTER_S=N makes the engine thread hang N
 * seconds after READY=1, for the watchdog test. Not a configuration key. */
static void debug_stall_start(serve_ctx *c)
{
    const char *v = getenv("DUALPATHD_DEBUG_STALL_AFTER_S");
    if (!v || !*v)
        return;
    char *end;
    double s = strtod(v, &end);
    if (*end || !(s >= 0 && s < 1e6)) {
        dp_log(DP_LOG_WARN, "serve: ignoring DUALPATHD_DEBUG_STALL_AFTER_S='%s'", v);
        return;
    }
    uv_timer_init(&c->loop, &c->stall_timer);
    c->stall_timer.data = c;
    c->stall_open = true;
    uv_timer_start(&c->stall_timer, on_debug_stall, (uint64_t)(s * 1000.0), 0);
}

static void timers_close(serve_ctx *c)
{
    if (c->wd_open) {
        uv_close((uv_handle_t *)&c->wd_timer, on_closed);
        c->wd_open = false;
    }
    if (c->stall_open) {
        uv_close((uv_handle_t *)&c->stall_timer, on_closed);
        c->stall_open = false;
    }
}

/* Loading a big model can outlast TimeoutStartSec: ask for more time before
 * each long phase (2 min + 1 s per 50 MiB of model file). */
static void extend_start_timeout(const char *model)
{
    struct stat st;
    uint64_t usec = 120ull * 1000000ull;
    if (model && stat(model, &st) == 0 && st.st_size > 0)
        usec += (uint64_t)st.st_size / (50ull << 20) * 1000000ull;
    notify_sendf("EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)usec);
}

/* Runs once no request is left (or the drain timed out). */
static void on_drained(void *ud)
{
    serve_ctx *c = ud;
    if (c->stopped)
        return;
    c->stopped = true;
    dp_log(DP_LOG_INFO, "serve: stopping");
    notify_send("STATUS=stopping");
    timers_close(c);
    server_stop_http(c->srv);
    if (c->engine)
        engine_stop(c->engine);
    server_close(c->srv);
    if (c->load_open) {
        uv_close((uv_handle_t *)&c->load_done, on_closed);
        c->load_open = false;
    }
    if (c->signals_open) {
        uv_close((uv_handle_t *)&c->sig_term, on_closed);
        uv_close((uv_handle_t *)&c->sig_int, on_closed);
        uv_close((uv_handle_t *)&c->sig_hup, on_closed);
        c->signals_open = false;
    }
}

static void on_signal(uv_signal_t *h, int signum)
{
    serve_ctx *c = h->data;
    if (signum == SIGHUP) {
        dp_log_set_level(c->log_level);
        dp_log(DP_LOG_INFO, "serve: SIGHUP: log level re-applied (%d)", c->log_level);
        server_reload(c->srv);
        return;
    }
    if (c->loading) {
        /* The loader thread cannot be interrupted: stop when it returns. */
        c->stopping = true;
        dp_log(DP_LOG_INFO, "serve: %s while loading: stopping once loading ends", strsignal(signum));
        notify_send("STOPPING=1\nSTATUS=stopping after loading");
        return;
    }
    if (c->stopping) {
        /* A second TERM/INT: stop now. */
        dp_log(DP_LOG_WARN, "serve: second %s: stopping without waiting", strsignal(signum));
        on_drained(c);
        return;
    }
    c->stopping = true;
    dp_log(DP_LOG_INFO, "serve: %s: draining (up to %.0f s)", strsignal(signum),
           c->o->drain_timeout_s);
    notify_send("STOPPING=1\nSTATUS=draining");
    server_drain(c->srv, c->o->drain_timeout_s, on_drained, c);
}

/* The loader thread: backend, weights, engine (KV pools). Nothing here
 * touches the loop; completion is signalled through load_done. */
static void load_main(void *arg)
{
    serve_ctx *c = arg;
    const dp_serve_opts *o = c->o;
    /* TEST HOOK: DUALPATHD_DEBUG_LOAD_HOLD=PATH holds loading while PATH
     * exists, so that a test observes /health answering 503 "loading" for
     * as long as it needs, and lets loading go on by removing the file. */
    const char *hold = getenv("DUALPATHD_DEBUG_LOAD_HOLD");
    while (hold && *hold && access(hold, F_OK) == 0)
        uv_sleep(10);
    notify_sendf("STATUS=starting the %s backend", o->device);
    c->load_rc = backend_create(&c->be, o->device, o->threads, c->load_err, sizeof c->load_err);
    if (!c->load_rc) {
        if (c->be->ops->step_graphs)
            c->be->ops->step_graphs(c->be, o->cuda_graphs ? DP_GRAPHS_ON : DP_GRAPHS_OFF, NULL);
        if (c->be->ops->set_exact && o->exact_matmul)
            c->be->ops->set_exact(c->be, true);
        notify_sendf("STATUS=loading weights (%s backend)", c->be->ops->name);
        extend_start_timeout(o->model);
        char e2[DP_ERRLEN];
        /* Rows beyond one per sequence: prompt logprobs (engine.h). */
        int32_t max_out = o->engine.max_seqs + DP_ENGINE_SCORE_ROWS;
        if (max_out > o->engine.max_batched_tokens)
            max_out = o->engine.max_batched_tokens;
        c->load_rc = llama_init(&c->m, c->g, c->be, o->engine.max_batched_tokens, max_out, e2,
                                sizeof e2);
        if (c->load_rc)
            snprintf(c->load_err, sizeof c->load_err, "cannot load model %.200s: %s", o->model, e2);
        else /* the backend holds its own copy of every weight */
            gguf_drop_tensor_pages(c->g);
    }
    if (!c->load_rc) {
        notify_send("STATUS=starting the engine");
        c->load_rc = engine_init(&c->engine, c->m, c->tok, &o->engine, server_engine_notify, c->srv,
                                 c->load_err, sizeof c->load_err);
    }
    uv_async_send(&c->load_done);
}

/* The backend lost its device (a sticky CUDA error): every request has
 * failed and nothing more can run in this process, so drain what is left
 * to say and exit non-zero; systemd's Restart=on-failure starts a fresh one. */
static void on_device_lost(void *ud)
{
    serve_ctx *c = ud;
    c->exit_status = 1;
    dp_log(DP_LOG_ERROR, "serve: the device is lost: exiting with status 1 to be restarted");
    if (c->stopping)
        return;
    c->stopping = true;
    notify_send("STOPPING=1\nSTATUS=device lost: exiting to be restarted");
    server_drain(c->srv, c->o->drain_timeout_s, on_drained, c);
}

/* On the loop thread when loading ends: start serving, or stop. */
static void on_loaded(uv_async_t *a)
{
    serve_ctx *c = a->data;
    uv_thread_join(&c->loader);
    c->loading = false;
    uv_close((uv_handle_t *)&c->load_done, on_closed);
    c->load_open = false;
    if (c->load_rc || c->stopping) {
        if (c->load_rc) {
            fprintf(stderr, "dualpathd: %s\n", c->load_err);
            c->exit_status = 1;
        } else {
            c->exit_status = 0;
        }
        on_drained(c); /* closes the server and the signals; the loop ends */
        return;
    }
    server_set_engine(c->srv, c->engine);
    server_on_device_lost(c->srv, on_device_lost, c);
    const dp_backend_ops *bo = c->be->ops;
    const char *kern = bo->kernel_level ? bo->kernel_level(c->be) : bo->name;
    const char *mm = bo->get_exact ? (bo->get_exact(c->be) ? "exact" : "int8") : "f32";
    server_set_build_info(c->srv, bo->name, kern, mm);
    if (engine_start(c->engine)) {
        fprintf(stderr, "dualpathd: cannot start the engine thread\n");
        c->exit_status = 1;
        on_drained(c);
        return;
    }
    dp_log(DP_LOG_INFO,
           "serve: model '%s' (%s backend, %s kernels, %s matmul, context %d) loaded in %.2f s; "
           "serving on %s",
           c->name, bo->name, kern, mm, engine_context_length(c->engine), dp_now() - c->t0, c->where);
    snprintf(c->status_line, sizeof c->status_line, "serving '%s' on %s", c->name, c->where);
    notify_sendf("READY=1\nSTATUS=%s", c->status_line);
    watchdog_start(c);
    debug_stall_start(c);
    /* TEST HOOK: DUALPATHD_DEBUG_DEVICE_LOST=1 makes the first step fail as
     * if the device were lost, for the test of what the daemon does then. */
    const char *lose = getenv("DUALPATHD_DEBUG_DEVICE_LOST");
    if (lose && !strcmp(lose, "1")) {
        dp_log(DP_LOG_WARN, "serve: DUALPATHD_DEBUG_DEVICE_LOST: the first step loses the "
               "device (test hook)");
        engine_debug_device_lost(c->engine);
    }
}

static char *default_name(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf"))
        n -= 5;
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, b, n);
        s[n] = 0;
    }
    return s;
}

int serve_chat_template(dp_chat_template *ct, const char *conf, const dp_gguf *g,
                        const dp_tokenizer *tok, char *err, size_t errsz)
{
    const char *src = NULL, *from = "the model";
    size_t len = 0;
    char *file = NULL;
    if (conf && conf[0] && (strstr(conf, "{%") || strstr(conf, "{{"))) {
        src = conf;
        len = strlen(conf);
        from = "the configuration";
    } else if (conf && conf[0]) {
        FILE *f = fopen(conf, "rb");
        if (!f)
            return dp_err(err, errsz, DP_EIO, "cannot open %s: %s", conf, strerror(errno));
        size_t cap = 0;
        for (;;) {
            char *nb = len + 4096 > cap ? realloc(file, cap = (cap + 4096) * 2) : file;
            if (!nb) {
                fclose(f);
                free(file);
                return dp_err(err, errsz, DP_ENOMEM, "out of memory");
            }
            file = nb;
            size_t r = fread(file + len, 1, cap - len, f);
            len += r;
            if (r == 0)
                break;
        }
        bool bad = ferror(f);
        fclose(f);
        if (bad) {
            free(file);
            return dp_err(err, errsz, DP_EIO, "cannot read %s", conf);
        }
        src = file;
        from = conf;
    } else {
        dp_gguf_str s = {0};
        gguf_get_str(g, "tokenizer.chat_template", &s);
        src = s.ptr;
        len = s.len;
    }
    char perr[DP_ERRLEN];
    int rc = chat_template_init_model(ct, src ? src : "", len, g, tok, perr, sizeof perr);
    free(file);
    if (rc)
        return dp_err(err, errsz, rc, "%s (from %s)", perr, from);
    if (len)
        dp_log(DP_LOG_INFO, "chat template from %s (%zu bytes, %s family)", from, len,
               chat_format_name(ct->format));
    return 0;
}

int serve_run(const dp_serve_opts *o)
{
    char err[DP_ERRLEN];
    dp_gguf g;
    dp_tokenizer *tok = NULL;
    dp_backend *be = NULL;
    dp_llama *m = NULL;
    dp_chat_template ct;
    bool ct_ok = false, loop_ok = false;
    char *name = NULL;
    serve_ctx c;
    int status = 1;
    double t0 = dp_now();

    memset(&c, 0, sizeof c);
    c.o = o;
    c.log_level = o->verbose ? DP_LOG_DEBUG : o->log_level;
    dp_log_set_level(c.log_level);
    /* Writes to a vanished client must fail with EPIPE, not kill us. */
    signal(SIGPIPE, SIG_IGN);

    notify_sendf("STATUS=loading model %s", o->model);
    extend_start_timeout(o->model);
    if (gguf_open(&g, o->model, err, sizeof err)) {
        fprintf(stderr, "dualpathd: cannot load model %s: %s\n", o->model, err);
        return 1;
    }
    if (tokenizer_init_gguf(&tok, &g, err, sizeof err)) {
        fprintf(stderr, "dualpathd: model %s: tokenizer: %s\n", o->model, err);
        goto done;
    }
    if (serve_chat_template(&ct, o->chat_template, &g, tok, err, sizeof err)) {
        fprintf(stderr, "dualpathd: model %s: chat template: %s\n", o->model, err);
        goto done;
    }
    ct_ok = true;
    name = o->model_name ? strdup(o->model_name) : default_name(o->model);
    if (!name || uv_loop_init(&c.loop)) {
        fprintf(stderr, "dualpathd: out of memory\n");
        goto done;
    }
    loop_ok = true;
    dp_server_opts so = o->api;
    so.model_name = name;
    so.model_alias = o->model;
    so.backend = o->device;
    if (server_init(&c.srv, &c.loop, &so, tok, &ct, err, sizeof err)) {
        fprintf(stderr, "dualpathd: %s\n", err);
        goto done;
    }
    /* Listen before the weights load: /health answers 503 "loading" meanwhile. */
    if (server_listen(c.srv, err, sizeof err)) {
        fprintf(stderr, "dualpathd: %s\n", err);
        goto done;
    }
    uv_signal_init(&c.loop, &c.sig_term);
    uv_signal_init(&c.loop, &c.sig_int);
    uv_signal_init(&c.loop, &c.sig_hup);
    c.sig_term.data = c.sig_int.data = c.sig_hup.data = &c;
    uv_signal_start(&c.sig_term, on_signal, SIGTERM);
    uv_signal_start(&c.sig_int, on_signal, SIGINT);
    uv_signal_start(&c.sig_hup, on_signal, SIGHUP);
    c.signals_open = true;
    if (so.unix_path && so.unix_path[0]) {
        snprintf(c.where, sizeof c.where, "unix:%s", so.unix_path);
    } else {
        bool v6 = strchr(so.host, ':') != NULL;
        snprintf(c.where, sizeof c.where, "http://%s%s%s:%d", v6 ? "[" : "", so.host,
                 v6 ? "]" : "", server_port(c.srv));
    }
    dp_log(DP_LOG_INFO, "serve: listening on %s; loading the model", c.where);
    c.g = &g;
    c.tok = tok;
    c.name = name;
    c.t0 = t0;
    uv_async_init(&c.loop, &c.load_done, on_loaded);
    c.load_done.data = &c;
    c.load_open = true;
    c.loading = true;
    if (uv_thread_create(&c.loader, load_main, &c)) {
        fprintf(stderr, "dualpathd: cannot start the loader thread\n");
        c.loading = false;
        goto done;
    }
    uv_run(&c.loop, UV_RUN_DEFAULT);
    status = c.stopped ? c.exit_status : 1;
    be = c.be;
    m = c.m;
    dp_log(DP_LOG_INFO, "serve: stopped");
done:
    if (loop_ok) {
        if (c.srv && !c.stopped) {
            /* Failed start: close what exists so the loop can end. */
            c.stopped = true;
            timers_close(&c);
            server_stop_http(c.srv);
            if (c.engine)
                engine_stop(c.engine);
            server_close(c.srv);
            if (c.load_open)
                uv_close((uv_handle_t *)&c.load_done, on_closed);
            if (c.signals_open) {
                uv_close((uv_handle_t *)&c.sig_term, on_closed);
                uv_close((uv_handle_t *)&c.sig_int, on_closed);
                uv_close((uv_handle_t *)&c.sig_hup, on_closed);
            }
        }
        timers_close(&c);
        uv_run(&c.loop, UV_RUN_DEFAULT);
        uv_loop_close(&c.loop);
    }
    engine_destroy(c.engine);
    server_destroy(c.srv);
    free(name);
    llama_destroy(m);
    if (be && be->ops->step_graphs) {
        dp_graph_stats gs;
        be->ops->step_graphs(be, -1, &gs);
        dp_log(DP_LOG_INFO, "%s: %llu decode steps replayed from %llu recordings (%llu abandoned, "
               "%llu dropped)", be->ops->name, (unsigned long long)gs.replayed,
               (unsigned long long)gs.recorded, (unsigned long long)gs.abandoned,
               (unsigned long long)gs.evicted);
    }
    backend_destroy(be);
    if (ct_ok)
        chat_template_destroy(&ct);
    tokenizer_destroy(tok);
    gguf_close(&g);
    return status;
}
