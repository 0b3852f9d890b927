/* plan.c: the start-up memory plan: the KV arena's bytes (given, or what
 * the device has left), the decode path's type under "auto", the pools'
 * layouts, and the context length they can hold. */
#include "engine_private.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dp.h"

/* ---- start-up memory plan -------------------------------------------------
 * Device memory is planned once, in this order: the weights and the
 * activations for max_batched_tokens (both allocated by llama_init, before
 * the engine exists), then the two KV pools, which split what is left. With
 * kv_bytes 0 (auto) "what is left" is gpu_memory_fraction of the device's
 * total memory less everything in use now (this process's weights,
 * activations and context, and any other process), less a reserve for the
 * backend's scratch buffers that grow at first use (fp16 copies of
 * activations, attention partials, scoring rows, the BLAS workspace). */

#define ENGINE_KV_AUTO_HOST ((int64_t)1 << 30)
#define ENGINE_KV_RESERVE ((int64_t)256 << 20)
#define MIB(x) ((double)(x) / (1024.0 * 1024.0))

static int plan_kv_bytes(dp_backend *be, double fraction, int64_t *out, char *err, size_t errsz)
{
    size_t free_b = 0, total_b = 0;
    if (!be->ops->mem_info || be->ops->mem_info(be, &free_b, &total_b) || total_b == 0) {
        *out = ENGINE_KV_AUTO_HOST;
        dp_log(DP_LOG_INFO, "engine: kv_memory auto: %s backend reports no device memory; "
               "using %.0f MiB", be->ops->name, MIB(*out));
        return 0;
    }
    if (fraction <= 0.0 || fraction > 1.0)
        return dp_err(err, errsz, DP_EINVAL, "engine: gpu_memory_fraction %g is not in (0, 1]",
                      fraction);
    const int64_t used = (int64_t)(total_b - (free_b < total_b ? free_b : total_b));
    const int64_t budget = (int64_t)(fraction * (double)total_b);
    const int64_t kv = budget - used - ENGINE_KV_RESERVE;
    dp_log(DP_LOG_INFO, "engine: kv_memory auto: %.0f MiB = %.2f x %.0f MiB total - %.0f MiB in "
           "use - %.0f MiB reserve", MIB(kv > 0 ? kv : 0), fraction, MIB(total_b), MIB(used),
           MIB(ENGINE_KV_RESERVE));
    if (kv <= 0)
        return dp_err(err, errsz, DP_ENOMEM,
                      "engine: no device memory left for the KV cache (%.0f MiB in use of %.0f "
                      "MiB, gpu_memory_fraction %g); raise gpu_memory_fraction or set kv_memory",
                      MIB(used), MIB(total_b), fraction);
    *out = kv;
    return 0;
}

/* The decode path's "auto" where the backend keeps quantized decode types
 * and they were measured there (kv_quant_default: the CPU's; CUDA's have not
 * run on a device yet), over an f16 cache: kivi4 (K per channel and V per
 * token in 4-bit groups, the lead and the newest tokens f16; 0.30-0.38 of the
 * f16 bytes at KL 0.007-0.008 nats/token, needles and multi-turn recall as
 * the whole cache: docs/dualpath.md), else q8_0 (0.53 at KL 0.0045); where
 * the manager refuses kivi4 with the other settings, engine_init takes q8_0
 * (decode_auto_fallback), and on a model whose sliding-window layers keep
 * every token (swa_full: a grouped sequence's slots are not positions,
 * engine.c check_opts; apart, only the global layers take the decode
 * type). An f32 cache asked for exactness and keeps its type. */
static dp_kv_type decode_auto_type(dp_backend *be, const dp_kv_layout *l, const dp_engine_opts *o,
                                   bool sliding)
{
    if (o->kv_type != DP_KV_F16 || !be->ops->kv_view || !be->ops->kv_quant_default)
        return (dp_kv_type)o->kv_type;
    dp_kv_layout q = *l;
    q.n_blocks = 1;
    q.type = DP_KV_KIVI4;
    if (!sliding && be->ops->kv_bytes_per_block(be, &q))
        return DP_KV_KIVI4;
    q.type = DP_KV_Q8_0;
    return be->ops->kv_bytes_per_block(be, &q) ? DP_KV_Q8_0 : (dp_kv_type)o->kv_type;
}

/* auto's kivi4 becomes q8_0 where the manager would refuse it (a decode
 * pool of its own, a decode budget, exempt layers, a block no group fits
 * in: kv_mgr_check_grouped) or the path detector may switch early (a
 * grouped prompt is compacted once, at its end): no combination of
 * settings keeps the daemon from starting. */
static void decode_auto_fallback(dp_backend *be, const dp_engine_opts *o, dp_kv_mgr_opts *ko)
{
    if (o->decode_kv_type != ENGINE_DECODE_KV_AUTO || !dp_kv_type_grouped(ko->decode.type))
        return;
    if (o->early_switch || kv_mgr_check_grouped(be, ko, NULL, 0))
        ko->decode.type = DP_KV_Q8_0;
}

/* The layout of a pool's store: the model's geometry, the configured type
 * (the decode path's auto: decode_auto_type). */
static dp_kv_layout kv_layout_of(dp_backend *be, const dp_llama *m, const dp_engine_opts *o,
                                 int32_t block_tokens, int32_t n_blocks, bool decode)
{
    dp_kv_layout l = llama_kv_layout(m, block_tokens, n_blocks);
    l.type = o->kv_type;
    if (decode && o->decode_kv_type >= 0)
        l.type = o->decode_kv_type;
    else if (decode && o->decode_kv_type == ENGINE_DECODE_KV_AUTO)
        l.type = decode_auto_type(be, &l, o, llama_hparams(m)->swa_window > 0 &&
                                                 (o->swa_full || !llama_kv_layer_map(m)));
    return l;
}

bool eng_swa_apart(const dp_engine *e, const dp_engine_opts *o)
{
    return llama_hparams(e->model)->swa_window > 0 && !o->swa_full && llama_kv_layer_map(e->model);
}

/* A model's sliding-window layers kept at their window (kvcache/swa.h;
 * not swa_full): the main pools keep the global layers only, and the
 * sliding layers' pool gets what max_seqs sequences hold at their window,
 * and a step's chunk (never more is held), but at most the share of
 * kv_bytes those layers would have in a whole cache: so the global layers
 * never hold fewer tokens than a whole cache would, and the sliding ones
 * never fewer at once. Parked turns carry a sequence's sliding table; the
 * prefix cache and the swap space do not yet: off for such a model, and
 * said so. */
static int plan_swa(dp_engine *e, const dp_engine_opts *o, dp_kv_mgr_opts *ko, char *err,
                    size_t errsz)
{
    const dp_hparams *hp = llama_hparams(e->model);
    const int32_t n_swa = llama_swa_layers(e->model), bt = o->block_tokens;
    ko->prefill.n_layers -= n_swa;
    ko->decode.n_layers -= n_swa;
    ko->n_layers -= n_swa;
    ko->swa = llama_kv_layout(e->model, bt, 1);
    ko->swa.n_layers = n_swa;
    ko->swa.type = o->kv_type;
    ko->swa_window = hp->swa_window;
    ko->swa_chunk = o->max_batched_tokens;
    const size_t per = e->be->ops->kv_bytes_per_block(e->be, &ko->swa);
    if (!per)
        return dp_err(err, errsz, DP_EUNSUPPORTED, "engine: the %s backend keeps no %s block of "
                      "%d sliding-window layers", e->be->ops->name, dp_kv_type_name(o->kv_type),
                      n_swa);
    int64_t blocks = (int64_t)o->max_seqs * swa_span_blocks(hp->swa_window, bt, 1) +
                     swa_span_blocks(hp->swa_window, bt, o->max_batched_tokens);
    if (ko->kv_bytes > 0) {
        const int64_t share = (int64_t)((double)ko->kv_bytes * n_swa / hp->n_layers / (double)per);
        if (blocks > share)
            blocks = share;
        ko->kv_bytes -= blocks * (int64_t)per;
    }
    ko->swa.n_blocks = blocks > INT32_MAX ? INT32_MAX : (int32_t)blocks;
    const bool dropped = o->prefix_cache || (e->dual && o->swap_bytes > 0);
    ko->prefix_cache = ko->reuse_replies = false;
    ko->swap_bytes = 0;
    dp_log(DP_LOG_INFO, "engine: %s keeps its %d sliding-window layers (of %d) at their window of "
           "%d tokens%s", hp->arch, n_swa, hp->n_layers, hp->swa_window,
           dropped ? "; the prefix cache and the swap space are off for them (swa_full = true "
                     "keeps every token and them)" : "");
    return 0;
}

/* The context a request may use is what the KV memory can hold for one
 * sequence (as llama.cpp's -c and vLLM's max_model_len are): otherwise a chat
 * request without max_tokens (max_tokens = the rest of the context) could
 * never be admitted and would be refused, however short. The test is the
 * manager's need formula at both extremes: the longest prompt with one token
 * to generate, and a one-token prompt generating the rest (a sequence too
 * long to migrate runs whole, so dualpath never caps the context lower than
 * off in one arena). */
static void cap_context(dp_engine *e)
{
    dp_kv_seq kv;
    kv_seq_init(&kv, e->dual, &e->opts.compress);
    int64_t c = e->ctx_len;
    while (c > 1 && !(kv_mgr_can_fit(&e->kv, &kv, c - 1, 1) && kv_mgr_can_fit(&e->kv, &kv, 1, c - 1)))
        c--;
    kv_seq_destroy(&kv);
    if (c < e->ctx_len) {
        dp_log(DP_LOG_WARN, "engine: context capped at %lld tokens (the model's is %d): that is what "
               "the KV memory holds for one sequence; give more kv_memory for longer ones",
               (long long)c, e->ctx_len);
        e->ctx_len = (int32_t)c;
    }
}

int eng_plan_memory(dp_engine *e, const dp_engine_opts *opts, char *err, size_t errsz)
{
    const dp_hparams *hp = llama_hparams(e->model);
    int64_t kv_bytes = opts->kv_bytes;
    int rc;
    if (kv_bytes <= 0 && (opts->n_blocks <= 0 || (e->dual && opts->n_blocks_decode <= 0)) &&
        (rc = plan_kv_bytes(e->be, opts->gpu_memory_fraction, &kv_bytes, err, errsz)))
        return rc;
    int32_t dbt = opts->decode_block_tokens > 0 ? opts->decode_block_tokens : opts->block_tokens;
    dp_kv_mgr_opts ko = {
        .prefill = kv_layout_of(e->be, e->model, opts, opts->block_tokens, opts->n_blocks, false),
        .decode = kv_layout_of(e->be, e->model, opts, dbt, opts->n_blocks_decode, true),
        .kv_bytes = kv_bytes,
        .dual = e->dual,
        .prefill_fraction = opts->prefill_fraction,
        .ctx_len = e->ctx_len,
        .decode_budget = opts->decode_budget,
        .budget_floor = opts->compress.sinks + opts->compress.window,
        .prefix_cache = opts->prefix_cache,
        .host_tier_bytes = opts->host_tier_bytes,
        .swap_bytes = opts->swap_bytes,
        .reuse_replies = opts->reuse_replies,
        .n_layers = hp->n_layers, .n_kv_heads = hp->n_kv_heads, .n_heads = hp->n_heads,
        .head_dim = hp->head_dim,
        .early_min = e->popts.min_tokens, .early_chunk = opts->max_batched_tokens,
        .max_parked = opts->resume_turns ? ENGINE_MAX_PARKED : 0,
        .exempt_layers = e->dual ? opts->exempt_layers : 0,
    };
    if (eng_swa_apart(e, opts) && (rc = plan_swa(e, opts, &ko, err, errsz)))
        return rc;
    decode_auto_fallback(e->be, opts, &ko);
    /* A grouped type's prompt is compacted once, at its end, where its
     * groups are sealed: it never switches early. */
    if (e->dual && opts->early_switch && dp_kv_type_grouped(ko.decode.type))
        return dp_err(err, errsz, DP_EUNSUPPORTED, "engine: decode_kv_type %s compacts a prompt "
                      "once, at its end, and does not switch early: set early_switch = false or "
                      "another decode_kv_type", dp_kv_type_name(ko.decode.type));
    if ((rc = kv_mgr_init(&e->kv, e->be, &ko, err, errsz)))
        return rc;
    if (kv_mgr_shared(&e->kv) && opts->prefill_fraction != 0.25)
        dp_log(DP_LOG_WARN, "engine: prefill_pool_fraction %g has no effect: both paths share one "
               "KV arena (it splits the memory only when decode_block_tokens differs from "
               "block_tokens with one KV type for both paths)", opts->prefill_fraction);
    const int32_t held = kv_mgr_decode_block_tokens(&e->kv);
    if (kv_mgr_shared(&e->kv) && ko.decode.type != ko.prefill.type &&
        opts->decode_block_tokens != 16 && opts->decode_block_tokens != held)
        dp_log(DP_LOG_WARN, "engine: decode_block_tokens %d has no effect: a %s decode path "
               "holds %d tokens in each block of the shared arena", opts->decode_block_tokens,
               dp_kv_type_name(ko.decode.type), held);
    kv_mgr_log_plan(&e->kv);
    cap_context(e);
    return 0;
}

int32_t eng_kv_layers(const dp_engine *e)
{
    const int32_t n = llama_hparams(e->model)->n_layers;
    return kv_mgr_has_swa(&e->kv) ? n - llama_swa_layers(e->model) : n;
}

const float *eng_kv_queries(const dp_engine *e, int32_t nc, int64_t *layer_stride)
{
    const dp_hparams *hp = llama_hparams(e->model);
    const int64_t per = (int64_t)nc * hp->n_heads * hp->head_dim;
    int32_t first = 0, step = 1;
    if (kv_mgr_has_swa(&e->kv))
        llama_global_layers(e->model, &first, &step);
    *layer_stride = per * step;
    return llama_captured_queries(e->model) + per * first;
}
