/* manager.c: the KV manager's accounting (pool sizes, needs, reservations,
 * growth, the prefix cache's naming) and its moves (migration, swap). No
 * policy lives here: who is admitted or preempted is the scheduler's call,
 * which sequences migrate and with which queries is the engine's. */
#include "manager.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* Parked turns (below) give their blocks back wherever blocks run short. */
static void park_drop(dp_kv_mgr *m, int32_t i);
static bool park_reclaim(dp_kv_mgr *m, int32_t need);
static int scratch_reserve(dp_kv_mgr *m, dp_kv_dtype *d, int32_t n);
int32_t kv_mgr_parked_blocks(dp_kv_mgr *m);

void kv_seq_init(dp_kv_seq *kv, bool dual, const dp_compress_opts *co)
{
    memset(kv, 0, sizeof *kv);
    kv->dual = dual;
    if (co)
        kv->copts = *co;
    kv->path = DP_PATH_PREFILL;
    kv->exempt = true;
    kv_table_init(&kv->table);
    kv_table_init(&kv->xtable);
}

void kv_seq_destroy(dp_kv_seq *kv)
{
    attn_acc_destroy(&kv->attn);
    free(kv->warm);
    kv->warm = NULL;
    free(kv->table.blocks);
    kv_table_init(&kv->table);
    free(kv->xtable.blocks);
    kv_table_init(&kv->xtable);
}

/* ---- start-up: pool sizes and the objects that hang off them ------------- */

static void *mgr_host_alloc(void *ud, size_t bytes)
{
    dp_backend *be = ud;
    return be->ops->host_alloc(be, bytes);
}

static void mgr_host_free(void *ud, void *p)
{
    dp_backend *be = ud;
    be->ops->host_free(be, p);
}

/* Block counts: explicit, else kv_bytes (one arena), else a split of it. A
 * split prefill pool must hold one prompt of the full context or long
 * prompts could never be admitted: its share is raised to that when the
 * memory allows (the decode pool keeps the rest). */
/* Blocks of bt tokens a staged recompression's kept rows take at most
 * (recompress_staged): the slots a recompression keeps (0 without a decode
 * budget). */
static int32_t budget_scratch_blocks(const dp_kv_mgr *m, int32_t bt)
{
    return m->dual && m->budget_keep > 0 && bt > 0 ? (m->budget_keep + bt - 1) / bt : 0;
}

static void plan_blocks(const dp_kv_mgr *m, const dp_kv_mgr_opts *o, int32_t *n_blocks,
                        int32_t *n_dblocks)
{
    *n_blocks = o->prefill.n_blocks;
    *n_dblocks = o->dual && !m->shared ? o->decode.n_blocks : 0;
    const bool split = o->dual && !m->shared;
    if (!m->be || (*n_blocks > 0 && (!split || *n_dblocks > 0)))
        return;
    const int64_t per = (int64_t)m->prefill_block_bytes, dper = (int64_t)m->decode_block_bytes;
    /* A decode budget's staged recompressions gather their kept rows in a
     * scratch store of budget_scratch_blocks (kv_mgr_init): its bytes come
     * out of kv_bytes, as the arena's do. */
    const int64_t kv_bytes = o->kv_bytes - (int64_t)budget_scratch_blocks(m, m->dbt) * dper;
    double fp = split ? o->prefill_fraction : 1.0;
    if (split && per > 0 && o->kv_bytes > 0) {
        int64_t ctx_blocks = ((int64_t)o->ctx_len + o->prefill.block_tokens - 1) /
                             o->prefill.block_tokens;
        double floor_fp = (double)ctx_blocks * (double)per / (double)kv_bytes;
        if (fp < floor_fp && floor_fp < 0.9)
            fp = floor_fp;
    }
    if (*n_blocks <= 0) {
        int64_t nb = per && kv_bytes > 0 ? (int64_t)((double)kv_bytes * fp) / per : 0;
        *n_blocks = nb > INT32_MAX ? INT32_MAX : (int32_t)nb;
    }
    if (split && *n_dblocks <= 0) {
        int64_t nb = dper && kv_bytes > 0 ? (int64_t)((double)kv_bytes * (1.0 - fp)) / dper : 0;
        *n_dblocks = nb > INT32_MAX ? INT32_MAX : (int32_t)nb;
    }
}

/* Stores a step of the backend may address (kv_mgr_stores' layout). */
static int32_t max_stores(const dp_backend *be)
{
    const int32_t n = be ? be->ops->kv_max_stores : 0;
    return n > 0 && n < DP_KV_MAX_STORES ? n : DP_KV_MAX_STORES;
}

int32_t kv_mgr_group_tokens(dp_backend *be, const dp_kv_layout *l, size_t bytes)
{
    dp_kv_layout g = *l;
    g.n_blocks = 1;
    int32_t best = 0;
    for (g.block_tokens = 2; g.block_tokens <= 256; g.block_tokens += 2) {
        const size_t b = be->ops->kv_bytes_per_block(be, &g);
        if (!b || b > bytes)
            break;
        best = g.block_tokens;
    }
    return best;
}

int kv_mgr_check_grouped(dp_backend *be, const dp_kv_mgr_opts *o, char *err, size_t errsz)
{
    const char *name = dp_kv_type_name(o->decode.type);
    /* (One arena: kv_mgr_init's shared, for a decode type of its own.) */
    const bool one_arena = o->dual && o->decode.n_blocks <= 0 && be && be->ops->kv_view;
    if (!one_arena || o->decode_budget > 0 || o->exempt_layers > 0)
        return dp_err(err, errsz, DP_EUNSUPPORTED, "engine: decode_kv_type %s keeps its groups "
                      "in one KV arena with the prefill path and without %s", name,
                      !one_arena             ? "a decode pool of its own (decode_pool_blocks)"
                      : o->decode_budget > 0 ? "a decode budget (decode_budget)"
                                             : "exempt layers (exempt_layers)");
    dp_kv_layout pl = o->prefill, dl = o->decode;
    pl.n_blocks = dl.n_blocks = 1;
    if (kv_mgr_group_tokens(be, &dl, be->ops->kv_bytes_per_block(be, &pl)) < 2)
        return dp_err(err, errsz, DP_EINVAL, "engine: a %s group does not fit in a KV block of "
                      "%d tokens; raise block_tokens", name, o->prefill.block_tokens);
    return 0;
}

/* dt[0]: the server's decode type (its store and geometry set up by
 * kv_mgr_init); in one arena on a backend with KV views, each other type a
 * request may ask for, read from the same blocks, that holds a token in no
 * more bytes than the prefill path does (a decode copy larger than the
 * prompt it stands for would only cost memory). */
static int dtypes_init(dp_kv_mgr *m, const dp_kv_layout *dl, const dp_kv_layout *pl)
{
    m->dt[0] = (dp_kv_dtype){.type = dl->type, .bt = m->dbt > 0 ? m->dbt : pl->block_tokens,
                             .layout = *dl, .store = m->dstore, .by_ref = m->by_ref,
                             .group = dp_kv_type_grouped(dl->type) ? dl->block_tokens : 0};
    m->dt[0].layout.n_blocks = m->dpool->n_blocks;
    m->n_dt = 1;
    dp_backend *be = m->be;
    if (!be || !m->shared || !be->ops->kv_view)
        return 0;
    dp_kv_layout one = *pl;
    one.block_tokens = one.n_blocks = 1;
    const size_t pper = be->ops->kv_bytes_per_block(be, &one);
    /* (Type i's decode store is stores[DP_PATH_DECODE + 2i]: the backend
     * must address it.) */
    for (int t = 0; t < DP_KV_TYPE_COUNT && DP_PATH_DECODE + 2 * m->n_dt < max_stores(be); t++) {
        if (t == (int)dl->type)
            continue;
        dp_kv_layout l = one;
        l.type = (dp_kv_type)t;
        if (dp_kv_type_grouped(t)) {
            /* A group per arena block, its residual and migrations in the
             * arena's type (an f16 / f32 arena only: the view refuses others). */
            dp_kv_dtype *d = &m->dt[m->n_dt];
            l.block_tokens = kv_mgr_group_tokens(be, &l, m->prefill_block_bytes);
            l.n_blocks = m->dpool->n_blocks;
            if (l.block_tokens < 2 || be->ops->kv_view(be, m->store, &l, &d->store))
                continue;
            d->type = l.type;
            d->bt = pl->block_tokens;
            d->layout = l;
            d->by_ref = true;
            d->group = l.block_tokens;
            m->n_dt++;
            continue;
        }
        const size_t per = be->ops->kv_bytes_per_block(be, &l);
        if (!per || per > pper)
            continue; /* not kept by this backend at this head size, or larger */
        dp_kv_dtype *d = &m->dt[m->n_dt];
        l.block_tokens = (int32_t)(m->prefill_block_bytes / per);
        *d = (dp_kv_dtype){.type = l.type, .bt = l.block_tokens};
        l.n_blocks = m->dpool->n_blocks;
        d->layout = l;
        if (t == (int)pl->type) { /* the arena itself */
            d->store = m->store;
            d->by_ref = true;
        } else {
            int rc = be->ops->kv_view(be, m->store, &l, &d->store);
            if (rc == DP_ENOMEM)
                return rc;
            if (rc)
                continue;
        }
        m->n_dt++;
    }
    return 0;
}

int kv_mgr_dtype(const dp_kv_mgr *m, dp_kv_type type)
{
    for (int i = 0; i < m->n_dt; i++)
        if (m->dt[i].type == type)
            return i;
    return -1;
}

/* The exempt layers' stores: the decode pool's memory folded (backend.h
 * kv_view) so that one decode block holds xfold blocks of the first n
 * layers, in each decode type: a sequence's exempt table costs n / n_layers
 * of a compact table of the same length. */
static int exempt_init(dp_kv_mgr *m, int32_t n, int32_t n_dblocks, char *err, size_t errsz)
{
    dp_backend *be = m->be;
    const int32_t n_layers = m->dt[0].layout.n_layers;
    if (n > n_layers)
        return dp_err(err, errsz, DP_EINVAL, "engine: exempt_layers %d exceeds the model's %d "
                      "layers", n, n_layers);
    if (!m->shared || !be->ops->kv_view || DP_KV_STORE_EXEMPT >= max_stores(be))
        return dp_err(err, errsz, DP_EUNSUPPORTED, "engine: exempt_layers needs one KV arena "
                      "for both paths and a backend whose steps read a third KV store, a view "
                      "of it (the %s backend%s)", be->ops->name,
                      !be->ops->kv_view                        ? " has no KV views"
                      : DP_KV_STORE_EXEMPT >= max_stores(be) ? " reads two stores per step"
                                                             : ", without decode_pool_blocks");
    m->xfold = n_layers / n;
    if ((int64_t)n_dblocks * m->xfold > INT32_MAX)
        return dp_err(err, errsz, DP_EINVAL, "engine: too many KV blocks for exempt layers");
    for (int i = 0; i < m->n_dt && DP_KV_STORE_EXEMPT + 2 * i < max_stores(be); i++) {
        dp_kv_dtype *d = &m->dt[i];
        if (d->group)
            continue; /* (its sequences keep no exempt table) */
        dp_kv_layout xl = d->layout;
        xl.n_layers = n;
        xl.n_blocks = n_dblocks * m->xfold;
        int rc = be->ops->kv_view(be, m->store, &xl, &d->xstore);
        if (rc)
            return dp_err(err, errsz, rc, "engine: cannot view the KV arena as %d exempt layers "
                          "of %s", n, dp_kv_type_name(d->type));
        d->xbt = m->xfold * d->bt;
    }
    m->n_exempt = n;
    return 0;
}

int kv_mgr_init(dp_kv_mgr *m, dp_backend *be, const dp_kv_mgr_opts *o, char *err, size_t errsz)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    m->dual = o->dual;
    m->decode_budget = o->decode_budget;
    m->early_min = o->early_min;
    m->early_chunk = o->early_chunk;
    m->reuse_replies = o->reuse_replies && o->prefix_cache && o->dual;
    if (o->decode_budget > 0)
        m->budget_keep = compress_budget_keep(o->decode_budget, o->budget_floor);
    dp_kv_layout l = o->prefill, dl = o->decode;
    l.n_blocks = dl.n_blocks = 1;
    int rc;
    if (be) {
        m->prefill_block_bytes = be->ops->kv_bytes_per_block(be, &l);
        m->decode_block_bytes = o->dual ? be->ops->kv_bytes_per_block(be, &dl) : 0;
        if (!m->prefill_block_bytes || (o->dual && !m->decode_block_bytes)) {
            const dp_kv_layout *bad = m->prefill_block_bytes ? &dl : &l;
            rc = dp_err(err, errsz, DP_EUNSUPPORTED, "engine: the %s backend cannot keep a KV "
                        "cache of type %s with head_dim %d", be->ops->name,
                        dp_kv_type_name(bad->type), bad->head_dim);
            goto fail;
        }
    }
    /* One arena unless the decode path's blocks differ in size or its
     * pool's size is given. A decode type other than the prefill path's
     * (a quantized decode pool) shares the arena through a view of it: a
     * decode block is an arena block read as that type, holding as many
     * tokens as fit in its bytes. */
    const bool typed = o->decode.type != o->prefill.type;
    if (o->dual && typed && be && !be->ops->kv_view) {
        rc = dp_err(err, errsz, DP_EUNSUPPORTED, "engine: the %s backend keeps the decode path "
                    "in the prefill path's KV type only (decode_kv_type %s, kv_cache_type %s)",
                    be->ops->name, dp_kv_type_name(o->decode.type), dp_kv_type_name(o->prefill.type));
        goto fail;
    }
    m->shared = o->dual && o->decode.n_blocks <= 0 &&
                (typed ? be && be->ops->kv_view
                       : o->decode.block_tokens == o->prefill.block_tokens);
    m->dpool = m->shared ? &m->pool : &m->dpool_own;
    const bool grouped = o->dual && dp_kv_type_grouped(o->decode.type);
    if (grouped && (rc = kv_mgr_check_grouped(be, o, err, errsz)))
        goto fail;
    /* A grouped type's migrations write the arena's type (it seals whole
     * groups from them), by reference like the arena's own. */
    m->by_ref = m->shared && (!typed || grouped);
    m->share_front = o->dual && !m->by_ref && be;
    m->dbt = o->decode.block_tokens;
    if (m->shared && grouped) {
        dl.block_tokens = kv_mgr_group_tokens(be, &dl, m->prefill_block_bytes);
        m->dbt = o->prefill.block_tokens; /* a table's unit: the residual's blocks */
        m->decode_block_bytes = m->prefill_block_bytes;
    } else if (m->shared && typed) {
        dl.block_tokens = 1;
        size_t per_token = be->ops->kv_bytes_per_block(be, &dl);
        m->dbt = (int32_t)(m->prefill_block_bytes / per_token);
        if (m->dbt < 1) {
            rc = dp_err(err, errsz, DP_EINVAL, "engine: a %s decode token does not fit in a KV "
                        "block of %d tokens; raise block_tokens", dp_kv_type_name(dl.type),
                        o->prefill.block_tokens);
            goto fail;
        }
        dl.block_tokens = m->dbt;
        m->decode_block_bytes = be->ops->kv_bytes_per_block(be, &dl);
    }
    int32_t n_blocks, n_dblocks;
    plan_blocks(m, o, &n_blocks, &n_dblocks);
    if (n_blocks < 1 || (o->dual && !m->shared && n_dblocks < 1)) {
        rc = dp_err(err, errsz, DP_EINVAL, "engine: KV memory holds no block of %d tokens",
                    o->prefill.block_tokens);
        goto fail;
    }
    l.n_blocks = n_blocks;
    if ((rc = kv_pool_init(&m->pool, n_blocks, o->prefill.block_tokens)) ||
        (be && (rc = be->ops->kv_create(be, &l, &m->store)))) {
        rc = dp_err(err, errsz, rc, "engine: cannot allocate a KV pool of %d blocks of %d tokens",
                    n_blocks, o->prefill.block_tokens);
        goto fail;
    }
    if (o->dual && m->shared && typed) {
        dl.n_blocks = n_dblocks = n_blocks;
        if (be && (rc = be->ops->kv_view(be, m->store, &dl, &m->dstore))) {
            rc = dp_err(err, errsz, rc, "engine: cannot view the KV arena as %s blocks of %d "
                        "tokens", dp_kv_type_name(dl.type), dl.block_tokens);
            goto fail;
        }
    } else if (o->dual && m->shared) {
        m->dstore = m->store;
        n_dblocks = n_blocks;
        m->decode_block_bytes = m->prefill_block_bytes;
    } else if (o->dual) {
        dl.n_blocks = n_dblocks;
        if ((rc = kv_pool_init(m->dpool, n_dblocks, o->decode.block_tokens)) ||
            (be && (rc = be->ops->kv_create(be, &dl, &m->dstore)))) {
            rc = dp_err(err, errsz, rc,
                        "engine: cannot allocate a decode pool of %d blocks of %d tokens", n_dblocks,
                        o->decode.block_tokens);
            goto fail;
        }
    }
    if ((rc = dtypes_init(m, &dl, &l))) {
        rc = dp_err(err, errsz, rc, "out of memory");
        goto fail;
    }
    /* The server's decode type's recompression scratch, now and once (its
     * bytes are inside kv_bytes: plan_blocks); a type a request asks for
     * takes its own at its first staged recompression. */
    if (be && budget_scratch_blocks(m, m->dt[0].bt) > 0 &&
        (rc = scratch_reserve(m, &m->dt[0], budget_scratch_blocks(m, m->dt[0].bt)))) {
        rc = dp_err(err, errsz, rc, "engine: cannot allocate the decode budget's recompression "
                    "scratch (%d blocks)", budget_scratch_blocks(m, m->dt[0].bt));
        goto fail;
    }
    if (o->dual && o->exempt_layers > 0 && be &&
        (rc = exempt_init(m, o->exempt_layers, n_dblocks, err, errsz)))
        goto fail;
    /* Each share (a prefix kept whole, a kept share) holds a decode block at
     * least, and lives while a sequence holds it: two per running sequence
     * at most. */
    if (o->dual && be &&
        (rc = dprefix_init(&m->dpx, m->dpool, m->dbt, n_dblocks < 1024 ? n_dblocks : 1024))) {
        rc = dp_err(err, errsz, rc, "out of memory");
        goto fail;
    }
    if (o->dual) {
        if (be) {
            if ((rc = kv_migrator_init(&m->mig, be, o->n_layers, o->n_kv_heads, o->n_heads,
                                       o->head_dim))) {
                rc = dp_err(err, errsz, rc, "out of memory");
                goto fail;
            }
            /* Preempted compact caches wait in the swap space (swap_bytes,
             * allocated here once, as vLLM's swap_space): each waiting
             * sequence holds at most its own cache, and a refused swap-out
             * falls back to a recompute that may change the sequence's
             * continuation. In one arena the copies are of arena blocks,
             * whatever type reads them. */
            dp_kv_store *ss = m->shared ? m->store : m->dstore;
            rc = o->swap_bytes > 0 ? kv_swap_init(&m->swap, be, ss, m->dpool, (size_t)o->swap_bytes)
                                   : DP_EINVAL;
            if (rc == DP_ENOMEM) {
                rc = dp_err(err, errsz, rc, "cannot allocate a swap space of %lld bytes "
                            "(swap_space)", (long long)o->swap_bytes);
                goto fail;
            }
            if (rc && o->swap_bytes > 0)
                dp_log(DP_LOG_WARN, "kvcache: a swap space of %lld bytes holds no block of %zu "
                       "bytes: preempted sequences are recomputed", (long long)o->swap_bytes,
                       be->ops->kv_bytes_per_block(be, be->ops->kv_layout(be, ss)));
            m->has_swap = rc == 0;
            rc = 0;
        }
    }
    if (o->prefix_cache) {
        if (o->host_tier_bytes > 0 && be) {
            /* Pinned where the backend has it: spills and restores then run
             * asynchronously on its stream (kvcache/host.h). */
            dp_host_alloc ha = {mgr_host_alloc, mgr_host_free, be};
            if ((rc = host_tier_init(&m->host, (size_t)o->host_tier_bytes, m->prefill_block_bytes,
                                     (size_t)o->prefill.block_tokens * sizeof(int32_t),
                                     be->ops->host_alloc && be->ops->host_free ? &ha : NULL))) {
                rc = dp_err(err, errsz, rc, "engine: cannot allocate a %lld-byte host tier",
                            (long long)o->host_tier_bytes);
                goto fail;
            }
            m->has_host = true;
        }
        if ((rc = prefix_init(&m->pc, &m->pool, be, m->store, m->has_host ? &m->host : NULL))) {
            rc = dp_err(err, errsz, rc, "out of memory");
            goto fail;
        }
        m->has_pc = true;
        if (grouped && be && (rc = gshare_init(&m->gs, m->dpool))) {
            rc = dp_err(err, errsz, rc, "out of memory");
            goto fail;
        }
        if (grouped && be &&
            !(m->held_stamp = calloc((size_t)m->dpool->n_blocks, sizeof *m->held_stamp))) {
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
            goto fail;
        }
    }
    if (o->dual && o->max_parked > 0) {
        m->parked = calloc((size_t)o->max_parked, sizeof *m->parked);
        m->park_cnt = calloc((size_t)m->dpool->n_blocks, sizeof *m->park_cnt);
        if (!m->parked || !m->park_cnt) {
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
            goto fail;
        }
        m->max_parked = o->max_parked;
    }
    return 0;
fail:
    kv_mgr_destroy(m);
    return rc;
}

void kv_mgr_destroy(dp_kv_mgr *m)
{
    while (m->n_parked > 0)
        park_drop(m, m->n_parked - 1);
    free(m->parked);
    free(m->park_cnt);
    free(m->held_stamp);
    for (int i = 0; i < m->n_dt; i++) { /* views before their base */
        dp_kv_dtype *d = &m->dt[i];
        if (d->rscratch)
            m->be->ops->kv_destroy(m->be, d->rscratch);
        if (d->xstore)
            m->be->ops->kv_destroy(m->be, d->xstore);
        if (i > 0 && d->store != m->store)
            m->be->ops->kv_destroy(m->be, d->store);
    }
    if (m->dstore && m->dstore != m->store)
        m->be->ops->kv_destroy(m->be, m->dstore);
    if (m->store)
        m->be->ops->kv_destroy(m->be, m->store);
    if (m->has_swap)
        kv_swap_destroy(&m->swap);
    if (m->has_pc)
        prefix_destroy(&m->pc);
    if (m->has_host)
        host_tier_destroy(&m->host);
    kv_pool_destroy(&m->pool);
    if (m->dpool == &m->dpool_own)
        kv_pool_destroy(&m->dpool_own);
    if (m->mig.be)
        kv_migrator_destroy(&m->mig);
    dprefix_destroy(&m->dpx);
    gshare_destroy(&m->gs);
    memset(m, 0, sizeof *m);
}

/* ---- needs and reservations ---------------------------------------------- */

/* Tokens per decode block of the sequence's decode type. */
static inline int32_t seq_bt(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return m->dt[kv->dt].bt;
}

/* Tokens per group of the sequence's decode type (0: not grouped). */
static inline int32_t seq_group(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return kv->dual ? m->dt[kv->dt].group : 0;
}

/* Decode-path blocks that hold n tokens of the sequence's type. Grouped: at
 * most its lead, its whole groups, a residual of up to a group and the
 * recent window (sealed at the next growth) starting anywhere in its first
 * block, and the group being sealed. */
static int32_t dblocks_for(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n)
{
    const int32_t bt = seq_bt(m, kv), g = seq_group(m, kv);
    if (g > 0) {
        const int64_t w = (int64_t)g + kv_mgr_group_recent(bt), r = n < w ? n : w;
        return (int32_t)(1 + n / g + (bt - 1 + r + bt - 1) / bt + 1);
    }
    return (int32_t)((n + bt - 1) / bt);
}

/* The blocks a table of n slots has in the sequence's layout now: n / bt
 * rounded up, or, grouped on the decode path, its lead and sealed groups
 * and then its residual from roff (dblocks_for bounds what it may come to
 * need). */
static int64_t table_blocks(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n)
{
    const int32_t bt = seq_bt(m, kv), g = seq_group(m, kv);
    if (g > 0 && kv->path == DP_PATH_DECODE) {
        const int64_t r = n - kv->sealed;
        return dp_kv_group_rstart(bt, g, kv->sealed) +
               (r > 0 ? (kv->roff + r + bt - 1) / bt : 0);
    }
    return (n + bt - 1) / bt;
}

/* Decode blocks an exempt table of n positions takes (0: the sequence keeps
 * none). */
static int32_t xblocks_for(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n)
{
    const int32_t xbt = m->dt[kv->dt].xbt;
    return m->n_exempt > 0 && kv->exempt && kv->dual && !seq_group(m, kv)
               ? (int32_t)((n + xbt - 1) / xbt)
               : 0;
}

/* An exempt table's batch row: entry i (xbt / xfold slots) of block
 * i / xfold, folded (backend.h kv_view). */
static void x_ids(const dp_kv_mgr *m, const dp_block_table *t, int32_t *row, int32_t cap)
{
    const int32_t n = t->n_blocks * m->xfold, nb = m->dpool->n_blocks;
    for (int32_t i = 0; i < n && i < cap; i++)
        row[i] = t->blocks[i / m->xfold] + (i % m->xfold) * nb;
}

int32_t kv_mgr_x_row(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t *row, int32_t cap)
{
    x_ids(m, &kv->xtable, row, cap);
    return kv->xtable.n_blocks * m->xfold;
}

/* The whole decode blocks of a compaction's forced front (the prefix kept
 * whole), fewer than n_keep slots so that the copy is never empty. */
static int32_t front_slots(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_keep)
{
    int32_t f = compress_front(&kv->copts, n_keep);
    if (f > n_keep - 1)
        f = n_keep - 1;
    return f > 0 ? f / seq_bt(m, kv) * seq_bt(m, kv) : 0;
}

/* Whether the sequence may share a copy of its prefix in decode blocks
 * (dpx): those are in the server's decode type. */
static inline bool seq_shares(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return m->share_front && kv->dt == 0;
}

/* Whether it may take or name a kept share (dpx, in the server's type's
 * blocks; in any arena, unlike a prefix copy). */
static inline bool seq_keeps_shared(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    return m->dpx.e && kv->dt == 0 && !seq_group(m, kv);
}

/* Leading slots of a compaction to n_keep of n_slots that the new table
 * holds by reference: in one arena of one type, the prefill blocks of its
 * front; elsewhere, on the decode path, the decode-pool share it holds (a
 * migration's share is found by kv_mgr_migrate from its tokens; before it,
 * the share admission found). */
static int32_t ref_slots(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_slots, int32_t n_keep)
{
    if (n_keep < 1 || n_keep > n_slots)
        return 0;
    /* A grouped type keeping a whole prompt takes its blocks as they are
     * (its groups are then sealed from them). */
    if (seq_group(m, kv) > 0 && n_keep == n_slots && kv->path == DP_PATH_PREFILL)
        return (n_keep - 1) / seq_bt(m, kv) * seq_bt(m, kv);
    if (m->dt[kv->dt].by_ref)
        return front_slots(m, kv, n_keep);
    if (!seq_shares(m, kv))
        return 0;
    if (!kv->dshare)
        return 0;
    const int32_t id = kv->dshare - 1, r = dprefix_slots(&m->dpx, id);
    /* On the decode path its table starts with the share's blocks (or holds
     * a kept share's, which start with them). */
    if (kv->path == DP_PATH_DECODE &&
        (kv->ref_blocks * m->dbt < r ||
         memcmp(kv->table.blocks, dprefix_blocks(&m->dpx, id), (size_t)(r / m->dbt) * sizeof(int32_t))))
        return 0;
    return r < n_keep && r <= compress_front(&kv->copts, n_keep) ? r : 0;
}

static void leave_share(dp_kv_mgr *m, dp_kv_seq *kv)
{
    if (kv->dshare)
        dprefix_leave(&m->dpx, kv->dshare - 1);
    kv->dshare = 0;
}

static void leave_kept(dp_kv_mgr *m, dp_kv_seq *kv)
{
    if (kv->kshare)
        dprefix_leave(&m->dpx, kv->kshare - 1);
    kv->kshare = 0;
}

/* A kept share's tag: what chose its slots. Sequences with the same tokens
 * and the same tag have the same K/V and select the same slots, so a taker
 * keeps the share's lists instead of selecting again. The fields are those
 * kv_seq_same_compaction compares; 0 (no share) for the random scorer,
 * seeded per request. */
static uint64_t kept_tag(const dp_compress_opts *co, int32_t n_keep)
{
    if (co->scorer == DP_SCORER_RANDOM)
        return 0;
    uint32_t ratio;
    memcpy(&ratio, &co->keep_ratio, sizeof ratio);
    const uint64_t w[] = {(uint64_t)co->scorer, ratio, (uint64_t)(uint32_t)co->sinks,
                          (uint64_t)(uint32_t)co->window, (uint64_t)(uint32_t)co->prefix,
                          (uint64_t)(uint32_t)n_keep};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        h = (h ^ w[i]) * 0x100000001b3ull;
    return h ? h : 1;
}

/* Slots of a compaction to n_keep that a kept share can hold: its whole
 * decode blocks (of the server's type), fewer than n_keep (the copy is
 * never empty). */
static int32_t kept_slots(const dp_kv_mgr *m, int32_t n_keep)
{
    return n_keep > 0 ? (n_keep - 1) / m->dbt * m->dbt : 0;
}

/* Whether one arena holds kv whole (n_tokens and four blocks of reply, less
 * the blocks its table holds already) beside what others hold, were
 * promised and protect. */
static bool whole_has_room(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_tokens, int32_t extra)
{
    dp_kv_seq whole = *kv;
    whole.dual = false;
    dp_kv_need wn = kv_mgr_need(m, &whole, n_tokens, 4 * (int64_t)m->pool.block_tokens);
    return wn.prefill - kv->table.n_blocks <=
           kv_pool_n_free(&m->pool) - m->pool.n_warm - m->decode_reserved + extra;
}

/* The kept share of tokens[0..n) compacted to n_keep by kv's settings, or -1. */
static int32_t kept_find(dp_kv_mgr *m, const dp_kv_seq *kv, const int32_t *tokens, int32_t n,
                         int32_t n_keep)
{
    const int32_t ks = kept_slots(m, n_keep);
    if (!seq_keeps_shared(m, kv) || !tokens || ks < m->dbt)
        return -1;
    int32_t id = dprefix_find_kept(&m->dpx, tokens, n, kept_tag(&kv->copts, n_keep));
    return id >= 0 && dprefix_slots(&m->dpx, id) == ks && m->dpx.e[id].cols == n_keep ? id : -1;
}

/* Where a predicted early switch happens at the latest for a prompt of
 * n_tokens of which got came from the prefix cache: at the end of the chunk
 * that first passes early_min (0: not before the prompt's end). */
static int32_t early_point(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t got, int32_t n_tokens)
{
    if (kv->early_end <= 0 || m->early_min <= 0 || m->early_chunk <= 0 || seq_group(m, kv) > 0)
        return 0;
    int64_t s = (int64_t)(got > m->early_min - 1 ? got : m->early_min - 1) + m->early_chunk;
    /* Only while its prompt lasts (a recompute's tokens go on past it). */
    return s < n_tokens && s < kv->early_end ? (int32_t)s : 0;
}

/* A promise of decode blocks: never below 0, which would lower the
 * others' (m->decode_reserved). A grouped type's can come to fewer blocks
 * than the prompt's it holds by reference once its groups are sealed, but
 * each seal takes a block before it gives any back: 1 at least. */
static int32_t decode_promise(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n)
{
    const int32_t floor = seq_group(m, kv) > 0 ? 1 : 0;
    return n < floor ? floor : n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

dp_kv_need kv_mgr_need(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n_cached, int64_t n_more)
{
    dp_kv_need n = {0, 0};
    if (!m->dual || !kv->dual) {
        n.prefill = kv_pool_blocks_for(&m->pool, n_cached + n_more);
        return n;
    }
    int32_t c = n_cached > INT32_MAX ? INT32_MAX : (int32_t)n_cached;
    if (kv->early_at > 0 && kv->early_at < c && kv->path == DP_PATH_PREFILL) {
        /* Switched early: the prefill path up to the switch, then the whole
         * prompt on the decode path until its end's compaction. */
        /* (What it holds by reference: its front at the earliest switch.) */
        const int32_t e0 = m->early_min < c ? m->early_min : c;
        n.prefill = kv_pool_blocks_for(&m->pool, kv->early_at);
        n.decode = decode_promise(m, kv,
                                  (int64_t)dblocks_for(m, kv, (int64_t)c + n_more) -
                                      ref_slots(m, kv, e0, e0) / seq_bt(m, kv) +
                                      xblocks_for(m, kv, (int64_t)c + n_more));
        return n;
    }
    n.prefill = kv_pool_blocks_for(&m->pool, n_cached);
    const int32_t keep = compress_n_keep(&kv->copts, c);
    int64_t d = (int64_t)keep + n_more;
    if (m->decode_budget > 0 && !seq_group(m, kv)) {
        /* Recompression holds it below the budget, whatever it generates
         * (while it runs, both tables: a copied prefix is in both). */
        int64_t cap = (int64_t)kv_seq_prefix(kv) * (m->dt[kv->dt].by_ref ? 1 : 2) + m->decode_budget +
                      m->budget_keep + 1;
        if (d > cap)
            d = cap;
    }
    /* Blocks it keeps by reference are counted on the prefill path, or
     * are a share's that others hold (a kept share it joined at admission
     * holds more of them than its front). */
    int32_t r = ref_slots(m, kv, c, keep);
    if (kv->kshare && kv->path == DP_PATH_PREFILL && dprefix_slots(&m->dpx, kv->kshare - 1) > r &&
        m->dpx.e[kv->kshare - 1].cols == keep)
        r = dprefix_slots(&m->dpx, kv->kshare - 1);
    /* Exempt layers keep every token, whatever the budget. */
    n.decode = decode_promise(m, kv, (int64_t)dblocks_for(m, kv, d) - r / seq_bt(m, kv) +
                                         xblocks_for(m, kv, (int64_t)c + n_more));
    return n;
}

/* Whether need more decode blocks are there for kv: from its promise
 * (*from_promise of them), the rest from what no one else was promised. */
static bool decode_room(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t need, int32_t *from_promise)
{
    *from_promise = need < kv->decode_reserve ? need : kv->decode_reserve;
    return kv_pool_n_free(m->dpool) - (m->decode_reserved - *from_promise) >= need;
}

bool kv_mgr_can_switch_early(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    /* (A grouped type's prompt is compacted once, at its end.) */
    if (!m->dual || !kv->dual || kv->path != DP_PATH_PREFILL || kv->n_slots < 1 ||
        seq_group(m, kv) > 0)
        return false;
    /* What decode_reserve takes for a table of n_slots (less the front it
     * holds by reference), as the migration will ask. */
    const int32_t need = dblocks_for(m, kv, kv->n_slots) -
                         ref_slots(m, kv, kv->n_slots, kv->n_slots) / seq_bt(m, kv) +
                         xblocks_for(m, kv, kv->n_slots);
    int32_t own;
    /* (Parked turns' blocks are room: the switch takes them back.) */
    return decode_room(m, kv, need, &own) ||
           kv_pool_n_free(m->dpool) - m->decode_reserved + m->parked_blocks >= need - own;
}

bool kv_mgr_can_fit(const dp_kv_mgr *m, const dp_kv_seq *kv, int64_t n_cached, int64_t n_more)
{
    if (kv_mgr_fits(m, kv_mgr_need(m, kv, n_cached, n_more)))
        return true;
    /* Whole only in one arena: there a compressed sequence never needs more
     * than it would whole. With split pools a request admitted compressed
     * might outgrow the decode pool, so it must fit compressed. */
    dp_kv_seq whole = *kv;
    whole.dual = false;
    return m->shared && kv->dual && kv_mgr_fits(m, kv_mgr_need(m, &whole, n_cached, n_more));
}

int32_t kv_mgr_watermark(const dp_kv_mgr *m)
{
    /* About 1 % of the decode pool stays free at admission (vLLM's default
     * watermark), so that sequences just admitted can grow for a while
     * before the pool runs out and someone must be preempted. */
    if (!m->dual)
        return 0;
    int32_t w = m->dpool->n_blocks / 100;
    return w > 0 ? w : 1;
}

/* Takes decode-pool blocks so that t covers n_slots, drawing on kv's promise
 * first (*took: how much of it, for undo_reserve); blocks promised to
 * others are off limits. All or nothing. */
static int decode_reserve_bt(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int64_t n_slots,
                             int32_t bt, int32_t *took)
{
    int32_t need = (int32_t)((n_slots + bt - 1) / bt) - t->n_blocks;
    if (took)
        *took = 0;
    if (need <= 0)
        return 0;
    int32_t from_promise;
    if (!decode_room(m, kv, need, &from_promise) && !park_reclaim(m, need - from_promise))
        return DP_ENOSPC;
    int rc = kv_table_reserve_bt(t, m->dpool, n_slots, bt);
    if (rc)
        return rc;
    kv->decode_reserve -= from_promise;
    m->decode_reserved -= from_promise;
    if (took)
        *took = from_promise;
    return 0;
}

/* A compact table (t) covering n_slots. */
static int decode_reserve(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int64_t n_slots,
                          int32_t *took)
{
    /* A grouped sequence's table on the decode path counts its sealed
     * groups and residual (t is its own table then; a migration's new
     * table is all residual, from its start): reserved in blocks, one
     * "slot" each. */
    if (seq_group(m, kv) > 0 && t == &kv->table && kv->path == DP_PATH_DECODE)
        return decode_reserve_bt(m, kv, t, table_blocks(m, kv, n_slots), 1, took);
    return decode_reserve_bt(m, kv, t, n_slots, seq_bt(m, kv), took);
}

/* The sequence's exempt table covering n positions (none kept: nothing). */
static int x_reserve(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int64_t n, int32_t *took)
{
    if (took)
        *took = 0;
    return xblocks_for(m, kv, n) > 0 ? decode_reserve_bt(m, kv, t, n, m->dt[kv->dt].xbt, took) : 0;
}

/* The blocks of a decode_reserve go back (t destroyed) and its promise with them. */
static void undo_reserve(dp_kv_mgr *m, dp_kv_seq *kv, dp_block_table *t, int32_t took)
{
    kv_table_destroy(t, m->dpool);
    kv->decode_reserve += took;
    m->decode_reserved += took;
}

static void drop_promise(dp_kv_mgr *m, dp_kv_seq *kv)
{
    m->decode_reserved -= kv->decode_reserve;
    kv->decode_reserve = 0;
}

/* Protects the named prompt blocks of a migrating sequence (best effort:
 * without memory for the list they are simply not protected). */
static void protect_prompt(dp_kv_mgr *m, dp_kv_seq *kv)
{
    int32_t n = kv->hashed_blocks < kv->table.n_blocks ? kv->hashed_blocks : kv->table.n_blocks;
    if (n <= 0 || kv->n_warm > 0)
        return;
    struct dp_kv_warm *w = realloc(kv->warm, (size_t)n * sizeof *w);
    if (!w)
        return;
    kv->warm = w;
    for (int32_t i = 0; i < n; i++) {
        const int32_t b = kv->table.blocks[i];
        w[i] = (struct dp_kv_warm){b, kv_pool_gen(&m->pool, b)};
        kv_pool_protect(&m->pool, b);
    }
    kv->n_warm = n;
}

static void unprotect_prompt(dp_kv_mgr *m, dp_kv_seq *kv)
{
    /* Oldest last: the most recently freed is the prompt's first block, the
     * last to be reused among them. */
    for (int32_t i = kv->n_warm - 1; i >= 0; i--)
        kv_pool_unprotect(&m->pool, kv->warm[i].block, kv->warm[i].gen);
    kv->n_warm = 0;
}

static void release_all(dp_kv_mgr *m, dp_kv_seq *kv)
{
    unprotect_prompt(m, kv);
    leave_share(m, kv);
    leave_kept(m, kv);
    kv->mig_pos = kv->mig_keep = kv->exact_from = 0;
    kv->ref_blocks = 0;
    kv->sealed = kv->roff = 0;
    kv->recompressed = false;
    attn_acc_reset(&kv->attn);
    kv_table_release(&kv->table, kv_mgr_pool_of(m, kv));
    kv_table_release(&kv->xtable, m->dpool);
    kv->x_n = 0;
    kv->swapped_x = 0;
    drop_promise(m, kv);
    kv->path = DP_PATH_PREFILL;
    kv->n_slots = 0;
    kv->hashed_blocks = 0;
    kv->chain = 0;
    kv->early_at = 0;
}

/* ---- swap: a decode-path cache as one copy ------------------------------------- */

/* Its blocks in the decode pool (compact and exempt tables). */
static int32_t seq_dblocks(const dp_kv_seq *kv)
{
    return kv->table.n_blocks + kv->xtable.n_blocks;
}

/* Blocks of kv's tables that dropping it gives back: those it does not hold
 * by reference, less its kivi4 groups that other tables hold too
 * (gshare.h: seq_dblocks - ref_blocks counts them as its own). */
static int32_t own_dblocks(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    int32_t n = seq_dblocks(kv) - kv->ref_blocks;
    const int32_t g = seq_group(m, kv);
    if (!m->gs.name || g <= 0 || kv->sealed <= 0)
        return n;
    int32_t k = dp_kv_group_rstart(m->dt[kv->dt].bt, g, kv->sealed);
    k = k < kv->table.n_blocks ? k : kv->table.n_blocks;
    for (int32_t i = 1; i < k; i++) /* (table[0] is the lead) */
        n -= m->dpool->refcnt[kv->table.blocks[i]] > 1;
    return n;
}

void kv_mgr_held_begin(dp_kv_mgr *m)
{
    if (!m->held_stamp)
        return;
    if (++m->held_epoch == 0) { /* wrapped: old marks could match again */
        memset(m->held_stamp, 0, (size_t)m->dpool->n_blocks * sizeof *m->held_stamp);
        m->held_epoch = 1;
    }
}

int32_t kv_mgr_held_blocks(dp_kv_mgr *m, const dp_kv_seq *kv)
{
    int32_t n = seq_dblocks(kv) - kv->ref_blocks;
    const int32_t g = seq_group(m, kv);
    if (!m->held_stamp || g <= 0 || kv->sealed <= 0)
        return n;
    /* Its groups (table[1..k): table[0] is the lead): a shared one is
     * counted by the first of its holders only. */
    int32_t k = dp_kv_group_rstart(m->dt[kv->dt].bt, g, kv->sealed);
    k = k < kv->table.n_blocks ? k : kv->table.n_blocks;
    for (int32_t i = 1; i < k; i++) {
        const int32_t b = kv->table.blocks[i];
        if (m->dpool->refcnt[b] <= 1)
            continue;
        n -= m->held_stamp[b] == m->held_epoch;
        m->held_stamp[b] = m->held_epoch;
    }
    return n;
}

/* Copies a decode-path cache (its compact table, then its exempt table) to
 * the swap space and frees its blocks. */
static int swap_out_seq(dp_kv_mgr *m, dp_kv_seq *kv)
{
    const int32_t nx = kv->xtable.n_blocks;
    if (nx == 0)
        return kv_swap_out(&m->swap, &kv->table, &kv->swapped);
    dp_block_table both;
    kv_table_init(&both);
    if (kv_table_room(&both, seq_dblocks(kv)))
        return DP_ENOMEM;
    memcpy(both.blocks, kv->table.blocks, (size_t)kv->table.n_blocks * sizeof(int32_t));
    memcpy(both.blocks + kv->table.n_blocks, kv->xtable.blocks, (size_t)nx * sizeof(int32_t));
    both.n_blocks = seq_dblocks(kv);
    int rc = kv_swap_out(&m->swap, &both, &kv->swapped);
    if (rc == 0) { /* both's release returned every block */
        kv->table.n_blocks = kv->xtable.n_blocks = 0;
        kv->swapped_x = nx;
    }
    free(both.blocks);
    return rc;
}

/* Brings a cache swap_out_seq saved back, bit for bit, into new blocks;
 * then (n_slots > 0) its compact table covers n_slots and its exempt table
 * x_n + 1, from blocks the caller made room for. (The swap space counts in
 * whole blocks; the tables in the sequence's decode type.) */
static int swap_in_seq(dp_kv_mgr *m, dp_kv_seq *kv, int64_t n_slots)
{
    const int32_t nx = kv->swapped_x, nc = kv->swapped.n_blocks - nx;
    dp_block_table both;
    kv_table_init(&both);
    int rc = kv_table_room(&kv->table, nc);
    if (rc == 0)
        rc = kv_table_room(&kv->xtable, nx);
    if (rc == 0)
        rc = kv_swap_in(&m->swap, &kv->swapped, &both, 0);
    if (rc) {
        free(both.blocks);
        return rc;
    }
    memcpy(kv->table.blocks, both.blocks, (size_t)nc * sizeof(int32_t));
    if (nx > 0) /* (no exempt table: xtable.blocks may be NULL) */
        memcpy(kv->xtable.blocks, both.blocks + nc, (size_t)nx * sizeof(int32_t));
    kv->table.n_blocks = nc;
    kv->xtable.n_blocks = nx;
    kv->swapped_x = 0;
    free(both.blocks);
    if (n_slots > 0) {
        /* (Room made by the caller: cannot fail. Were it to, the next
         * step's growth asks again.) */
        if (kv_table_reserve_bt(&kv->table, m->dpool, table_blocks(m, kv, n_slots), 1) ||
            (nx > 0 && kv_table_reserve_bt(&kv->xtable, m->dpool, (int64_t)kv->x_n + 1,
                                           m->dt[kv->dt].xbt)))
            dp_log(DP_LOG_DEBUG, "kvcache: a swapped-in cache found no block for its next token");
    }
    return 0;
}

/* ---- parked turns ----------------------------------------------------------- */

/* Whether a cache compacted under x serves a sequence compacting under y
 * (the random scorer's seed aside: its selection is as good as any draw). */
static bool same_settings(const dp_compress_opts *x, const dp_compress_opts *y)
{
    return x->scorer == y->scorer && x->keep_ratio == y->keep_ratio && x->sinks == y->sinks &&
           x->window == y->window && x->prefix == y->prefix;
}

/* Takes parked cache i out of the list (its blocks still held). */
static dp_kv_parked park_take(dp_kv_mgr *m, int32_t i)
{
    dp_kv_parked p = m->parked[i];
    m->parked[i] = m->parked[--m->n_parked];
    m->parked_blocks -= seq_dblocks(&p.kv) - p.kv.ref_blocks;
    if (p.kv.dshare)
        dprefix_park(&m->dpx, p.kv.dshare - 1, -1);
    if (p.kv.kshare)
        dprefix_park(&m->dpx, p.kv.kshare - 1, -1);
    return p;
}

/* Puts a cache park_take took back in the list. */
static void park_put(dp_kv_mgr *m, const dp_kv_parked *p)
{
    if (p->kv.dshare)
        dprefix_park(&m->dpx, p->kv.dshare - 1, 1);
    if (p->kv.kshare)
        dprefix_park(&m->dpx, p->kv.kshare - 1, 1);
    m->parked[m->n_parked++] = *p;
    m->parked_blocks += seq_dblocks(&p->kv) - p->kv.ref_blocks;
}

/* Drops parked cache i: its blocks go back to the pool (those a share holds
 * stay the share's). */
static void park_drop(dp_kv_mgr *m, int32_t i)
{
    dp_kv_parked p = park_take(m, i);
    kv_mgr_free(m, &p.kv);
    kv_seq_destroy(&p.kv);
    free(p.tokens);
}

/* The oldest parked cache in device memory (spilled false) or in the swap
 * space (true), or -1. */
static int32_t park_oldest(const dp_kv_mgr *m, bool spilled)
{
    int32_t o = -1;
    for (int32_t i = 0; i < m->n_parked; i++)
        if ((m->parked[i].kv.swapped.slots != NULL) == spilled &&
            (o < 0 || m->parked[i].stamp < m->parked[o].stamp))
            o = i;
    return o;
}

size_t kv_mgr_parked_host_bytes(const dp_kv_mgr *m)
{
    size_t b = 0;
    for (int32_t i = 0; i < m->n_parked; i++)
        b += (size_t)m->parked[i].kv.swapped.n_blocks * m->swap.block_bytes;
    return b;
}

/* Whether a copy of n_blocks fits the swap space once every spilled parked
 * turn has given its host memory back (none is dropped for nothing). */
static bool swap_can_take(const dp_kv_mgr *m, int32_t n_blocks)
{
    return m->swap.used_bytes - kv_mgr_parked_host_bytes(m) + (size_t)n_blocks * m->swap.block_bytes <=
           m->swap.cap_bytes;
}

/* Drops the oldest spilled parked cache: its host memory goes back to the
 * swap space. False when there is none. */
static bool park_drop_spilled(dp_kv_mgr *m)
{
    const int32_t i = park_oldest(m, true);
    if (i < 0)
        return false;
    park_drop(m, i);
    m->park_evictions++;
    return true;
}

/* Parked cache i leaves device memory: copied to the swap space (host
 * memory, making room there by dropping older spilled ones) where there is
 * one, for its next turn to copy back, else dropped. */
static void park_spill(dp_kv_mgr *m, int32_t i)
{
    /* Out of the list while older spilled ones are dropped (which moves
     * entries in it), back in once it is in the swap space. */
    dp_kv_parked p = park_take(m, i);
    int rc = m->has_swap && swap_can_take(m, seq_dblocks(&p.kv)) ? DP_ENOSPC : DP_EUNSUPPORTED;
    while (rc == DP_ENOSPC && (rc = swap_out_seq(m, &p.kv)) == DP_ENOSPC)
        if (!park_drop_spilled(m))
            break;
    if (rc) {
        kv_mgr_free(m, &p.kv);
        kv_seq_destroy(&p.kv);
        free(p.tokens);
        m->park_evictions++;
        return;
    }
    /* Its blocks came back to the pool; shares it held are others' now (it
     * comes back in blocks of its own, as a swapped-in sequence does). */
    leave_share(m, &p.kv);
    leave_kept(m, &p.kv);
    p.kv.ref_blocks = 0;
    park_put(m, &p);
    m->park_spills++;
}

/* Moves the oldest parked caches out of device memory (to the swap space,
 * or dropped) until the decode pool (the arena, when shared) has need
 * blocks beyond those promised; none when even all of them would not make
 * the room (a sequence that cannot fit now leaves the others' caches
 * alone). Whether the room is there. */
static bool park_reclaim(dp_kv_mgr *m, int32_t need)
{
    int32_t have = kv_pool_n_free(m->dpool) - m->decode_reserved;
    if (have >= need || m->n_parked == 0 || (int64_t)have + kv_mgr_parked_blocks(m) < need)
        return have >= need;
    int32_t i;
    while (have < need && (i = park_oldest(m, false)) >= 0) {
        park_spill(m, i);
        have = kv_pool_n_free(m->dpool) - m->decode_reserved;
    }
    return have >= need;
}

bool kv_mgr_park(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_computed)
{
    /* Past its compaction's prompt, slot mig_keep + i holds position
     * mig_pos + i in every head: a prefix of its tokens is a prefix of its
     * slots. */
    if (m->max_parked <= 0 || !m->dual || !kv->dual || kv->path != DP_PATH_DECODE ||
        kv->swapped.slots || kv->recompressed || kv->mig_pos <= 0 || !tokens ||
        n_computed < kv->mig_pos || kv->n_slots != kv->mig_keep + (n_computed - kv->mig_pos) ||
        (kv_seq_has_x(kv) && kv->x_n != n_computed))
        return false;
    int32_t *copy = malloc((size_t)n_computed * sizeof *copy);
    if (!copy)
        return false;
    memcpy(copy, tokens, (size_t)n_computed * sizeof *copy);
    if (m->n_parked == m->max_parked) {
        int32_t o = park_oldest(m, true);
        park_drop(m, o >= 0 ? o : park_oldest(m, false));
        m->park_evictions++;
    }
    /* Its prompt's whole blocks are no longer protected: the parked cache
     * stands for them (both would hold the history twice). */
    unprotect_prompt(m, kv);
    free(kv->warm);
    kv->warm = NULL;
    drop_promise(m, kv);
    attn_acc_destroy(&kv->attn);
    park_put(m, &(dp_kv_parked){*kv, copy, n_computed, ++m->park_clock});
    m->parks++;
    const bool dual = kv->dual, exempt = kv->exempt;
    const uint8_t dt = kv->dt;
    const dp_compress_opts co = kv->copts;
    kv_seq_init(kv, dual, &co); /* the tables moved to the parked cache */
    kv->exempt = exempt;
    kv->dt = dt;
    return true;
}

/* The parked cache that tokens[0..n) continue furthest, or -1, and how far:
 * *len tokens, the whole of its last compaction's prompt at least, at most
 * n - tail where that leaves it (tail >= 1 tokens are left to compute, for
 * SnapKV's window; a new stretch shorter than that is scored with fewer
 * queries rather than computing the history again). */
static int32_t park_find(const dp_kv_mgr *m, const dp_kv_seq *kv, const int32_t *tokens, int32_t n,
                         int32_t tail, int32_t *len)
{
    int32_t best = -1, best_len = 0;
    const int32_t limit = n - (tail > 1 ? tail : 1);
    for (int32_t i = 0; i < m->n_parked; i++) {
        const dp_kv_parked *p = &m->parked[i];
        const int32_t lim = p->n < n - 1 ? p->n : n - 1;
        if (lim < p->kv.mig_pos || !same_settings(&p->kv.copts, &kv->copts) ||
            p->kv.dt != kv->dt || (m->n_exempt > 0 && p->kv.exempt != kv->exempt))
            continue;
        int32_t c = 0;
        while (c < lim && p->tokens[c] == tokens[c])
            c++;
        if (c < p->kv.mig_pos)
            continue;
        if (c > limit)
            c = limit > p->kv.mig_pos ? limit : p->kv.mig_pos;
        if (c > best_len) {
            best = i;
            best_len = c;
        }
    }
    *len = best_len;
    return best;
}

static bool may_resume(const dp_kv_mgr *m, const dp_kv_seq *kv, int32_t n_tokens, int32_t tail)
{
    return m->n_parked > 0 && m->dual && kv->dual && kv->table.n_blocks == 0 && !kv->dshare &&
           !kv->kshare && tail < n_tokens;
}

/* Counts (tally false) or tallies and clears (true) the pool references
 * parked turns hold: their tables' and those of the shares only they hold.
 * A block is theirs alone when they hold all its references. */
static int32_t park_refs(dp_kv_mgr *m, bool tally)
{
    int32_t n = 0;
    /* Parked caches' compact tables, their exempt tables, then shares. */
    for (int32_t i = 0; i < 2 * m->n_parked + m->dpx.max_entries; i++) {
        const int32_t *b;
        int32_t nb;
        if (i < m->n_parked) {
            b = m->parked[i].kv.table.blocks;
            nb = m->parked[i].kv.table.n_blocks;
        } else if (i < 2 * m->n_parked) {
            b = m->parked[i - m->n_parked].kv.xtable.blocks;
            nb = m->parked[i - m->n_parked].kv.xtable.n_blocks;
        } else {
            const dp_dprefix_entry *x = &m->dpx.e[i - 2 * m->n_parked];
            if (!x->name || x->users <= 0 || x->users != x->parked)
                continue;
            b = x->blocks;
            nb = x->n_slots / m->dpx.block_tokens;
        }
        for (int32_t j = 0; j < nb; j++) {
            uint32_t *c = &m->park_cnt[b[j]];
            if (!tally)
                (*c)++;
            else if (*c)
                n += *c == m->dpool->refcnt[b[j]], *c = 0; /* counted once */
        }
    }
    return n;
}

int32_t kv_mgr_parked_blocks(dp_kv_mgr *m)
{
    if (m->n_parked == 0)
        return 0;
    park_refs(m, false);
    return park_refs(m, true);
}

/* Blocks the parked caches would give back, for admission's choice to run
 * a turn whole: the running tally, or where kivi4 groups may be shared
 * between tables (which the tally counts once per holder) the exact count,
 * so that a turn never chooses a room that reclaiming cannot make (it
 * would choose it again at every retry). */
static int32_t parked_room(dp_kv_mgr *m)
{
    return m->gs.name ? kv_mgr_parked_blocks(m) : m->parked_blocks;
}

bool kv_mgr_can_resume(const dp_kv_mgr *m, const dp_kv_seq *kv, const int32_t *tokens, int32_t n,
                       int32_t tail)
{
    int32_t len;
    return may_resume(m, kv, n, tail) && park_find(m, kv, tokens, n, tail, &len) >= 0;
}

/* kv_mgr_admit for a sequence that continues a parked cache: 1 when none
 * matches (admitted as any other), 0 when it took the cache, DP_ENOSPC
 * when the rest of its prompt has no room now (the cache stays parked, cut
 * to what this sequence matched). */
static int park_resume(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_tokens,
                       int32_t tail, bool busy, int32_t *reused)
{
    int32_t c;
    const int32_t i = may_resume(m, kv, n_tokens, tail) ? park_find(m, kv, tokens, n_tokens, tail, &c)
                                                         : -1;
    if (i < 0)
        return 1;
    /* A later chat turn under compress_turns = auto that arrives while
     * nothing else runs (busy: the scheduler's, a burst included), with
     * room for it whole in blocks no one holds (its own parked cache's
     * included), runs whole: the exact history, as with dualpath off; its
     * parked cache is dropped. Under load it continues
     * the compact cache: computing the history again would cost every
     * running sequence its share of the steps, and holding it whole the
     * memory others need (measured in docs/dualpath.md: a rule on memory
     * alone ran nearly every turn whole at 64 MiB, at dualpath off's
     * speed). */
    const dp_kv_seq *pk = &m->parked[i].kv;
    if (kv->whole_if_room && !busy && m->shared &&
        whole_has_room(m, kv, n_tokens, own_dblocks(m, pk))) {
        park_drop(m, i);
        return 1;
    }
    /* Out of the list first, so that making room never drops it; what it
     * holds past the match (a reply the client did not send back as it
     * was generated) goes back to the pool. */
    dp_kv_parked p = park_take(m, i);
    int32_t slots = p.kv.mig_keep + (c - p.kv.mig_pos);
    const int32_t g = seq_group(m, &p.kv);
    if (g > 0 && slots <= p.kv.sealed) {
        /* A grouped cache keeps whole groups: a match that ends inside one
         * keeps the lead and the groups before it and computes the rest
         * again (and no resume where that reaches back into the
         * compaction's slots). A match inside the lead keeps it as a
         * residual (nothing sealed). */
        const int32_t bt = seq_bt(m, &p.kv);
        const int32_t back = slots < bt ? 0 : (slots - bt) % g;
        if (slots - back < p.kv.mig_keep || c - back <= 0) {
            park_put(m, &p);
            return 1;
        }
        slots -= back;
        c -= back;
        p.kv.sealed = slots < bt ? 0 : slots;
        p.kv.roff = 0;
    }
    const int32_t keep_b = (int32_t)table_blocks(m, &p.kv, slots);
    /* (Its exempt layers hold positions 0..c.) */
    const int32_t keep_x = xblocks_for(m, &p.kv, c);
    /* The rest of the prompt and the first generated token, on the decode
     * path; a spilled cache first comes back whole from the swap space. */
    const int32_t total = dblocks_for(m, &p.kv, (int64_t)slots + (n_tokens - c) + 1) +
                          xblocks_for(m, &p.kv, (int64_t)n_tokens + 1);
    const int32_t wm = busy ? kv_mgr_watermark(m) : 0;
    const int32_t spilled = p.kv.swapped.slots ? p.kv.swapped.n_blocks : 0;
    int rc = 0;
    if ((spilled > total ? spilled : total) > m->dpool->n_blocks) {
        /* Its new text does not fit the decode path beside its history:
         * admitted as any other (its prompt whole on the prefill path). */
        park_put(m, &p);
        return 1;
    }
    if (spilled && !park_reclaim(m, (spilled > total ? spilled : total) + wm)) {
        park_put(m, &p); /* not now: it waits in the swap space */
        return DP_ENOSPC;
    }
    if (spilled && (rc = swap_in_seq(m, &p.kv, 0)) != 0) {
        /* (Not for want of room: made above.) Its history is computed again. */
        kv_mgr_free(m, &p.kv);
        kv_seq_destroy(&p.kv);
        free(p.tokens);
        m->park_evictions++;
        return 1;
    }
    if (spilled)
        m->park_restores++;
    for (int32_t b = keep_b; b < p.kv.table.n_blocks; b++)
        kv_pool_unref(m->dpool, p.kv.table.blocks[b]);
    if (p.kv.table.n_blocks > keep_b)
        p.kv.table.n_blocks = keep_b;
    for (int32_t b = keep_x; b < p.kv.xtable.n_blocks; b++)
        kv_pool_unref(m->dpool, p.kv.xtable.blocks[b]);
    if (p.kv.xtable.n_blocks > keep_x)
        p.kv.xtable.n_blocks = keep_x;
    p.kv.n_slots = slots;
    p.kv.x_n = p.kv.xtable.n_blocks > 0 ? c : 0;
    p.n = c;
    const int32_t need = total - keep_b - p.kv.xtable.n_blocks;
    if (!park_reclaim(m, need + wm)) {
        park_put(m, &p);
        return DP_ENOSPC;
    }
    const dp_compress_opts co = kv->copts;
    const bool wir = kv->whole_if_room;
    kv_seq_destroy(kv);
    *kv = p.kv;
    kv->copts = co;
    kv->whole_if_room = wir;
    kv->early_end = kv->early_at = 0;
    kv->hist_slots = slots;
    kv->decode_reserve = need > 0 ? need : 0;
    m->decode_reserved += kv->decode_reserve;
    /* Its tables cover the rest of the prompt now, as an admitted prompt's
     * do (from the promise: cannot fail). */
    if (decode_reserve(m, kv, &kv->table, (int64_t)slots + (n_tokens - c), NULL) != 0 ||
        (kv_seq_has_x(kv) && x_reserve(m, kv, &kv->xtable, n_tokens, NULL) != 0)) {
        release_all(m, kv);
        free(p.tokens);
        return DP_ENOSPC;
    }
    free(p.tokens);
    m->resumes++;
    m->resumed_tokens += c;
    *reused = c;
    return 0;
}

int kv_mgr_admit(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_tokens,
                 int32_t tail, bool busy, int32_t *reused)
{
    /* A swapped-out cache comes back through kv_mgr_swap_in, as it left:
     * admitted from its tokens, its copy would be lost. */
    if (kv->swapped.slots)
        return DP_EINVAL;
    /* The next turn of a conversation whose previous turn's compact cache
     * is parked continues it: nothing of its history is computed again. */
    int rc = park_resume(m, kv, tokens, n_tokens, tail, busy, reused);
    if (rc <= 0)
        return rc;
    /* A prompt that extends an earlier one (the next turn of a conversation,
     * or a recompute after preemption) takes the cached prefix back: from the
     * pool where its blocks are intact, from the host tier where they were
     * spilled; only the rest is computed. */
    int32_t got = 0, from_host = 0;
    /* A later chat turn keeps its prompt whole in the prefix cache for the
     * next turn anyway: a compact copy beside it adds memory, so it runs
     * whole, its reply in place, while the arena has room for that without
     * taking protected blocks or others' promises (four blocks of reply
     * included); only when memory binds does it migrate, for the room.
     * Decided before the prefix match (nothing of it counted as cached), so
     * that a whole turn takes its last window from the cache too; decided
     * again after it, with its cached blocks. Where finished turns park
     * (resume_turns), only while nothing else runs: under load a turn
     * whose parked cache is gone is compressed and parks again, where
     * whole it would hold its whole history, in the prefill type, while
     * the others' turns wait (measured in docs/dualpath.md: a 20-turn run
     * at 64 MiB fell to one sequence running whole beside seven waiting). */
    const bool may_whole = kv->whole_if_room && kv->dual && m->shared &&
                           (!busy || m->max_parked == 0);
    bool went_whole = false;
    if (may_whole && kv->table.n_blocks == 0 &&
        whole_has_room(m, kv, n_tokens, parked_room(m))) {
        kv->dual = false;
        went_whole = true;
        if (tail < n_tokens) /* not a prompt scored whole */
            tail = 1;
    }
    /* The compaction of the same prompt that a running sequence made (n > 1,
     * identical requests): it will keep those slots without selecting, so
     * no window of its own must run for SnapKV (only its last token), and
     * it holds the share from now until it migrates. */
    if (m->dual && kv->dual && !kv->kshare && kv->table.n_blocks == 0) {
        int32_t id = kept_find(m, kv, tokens, n_tokens, kv_mgr_migration_keep(m, kv, n_tokens));
        if (id >= 0) {
            dprefix_join(&m->dpx, id);
            kv->kshare = id + 1;
            if (tail < n_tokens) /* not a prompt scored whole */
                tail = 1;
        }
    }
    if (m->has_pc && kv->table.n_blocks == 0) {
        uint64_t last = 0;
        int32_t limit = n_tokens - (tail > 1 ? tail : 1);
        got = limit > 0 ? prefix_match(&m->pc, tokens, limit, &kv->table, &from_host, &last) : 0;
        kv->hashed_blocks = kv->table.n_blocks;
        kv->chain = last;
    }
    /* A share of its prefix that others hold now is blocks it will not take:
     * it becomes one of the share's users (left again if not admitted, or
     * if it runs whole), so the share outlives whoever holds it now until
     * this sequence migrates. */
    if (seq_shares(m, kv) && kv->dual && !kv->dshare) {
        int32_t s = front_slots(m, kv, compress_n_keep(&kv->copts, n_tokens));
        int32_t share = s > 0 ? dprefix_find(&m->dpx, tokens, s) : -1;
        if (share >= 0) {
            dprefix_join(&m->dpx, share);
            kv->dshare = share + 1;
        }
    }
    if (may_whole && kv->dual && whole_has_room(m, kv, n_tokens, parked_room(m))) {
        kv->dual = false;
        went_whole = true;
        leave_share(m, kv);
        leave_kept(m, kv);
    }
    /* The prompt (or, after a recompute, prompt + output so far) goes to the
     * prefill pool whole, so a running prefill never waits for blocks; with
     * dualpath the decode pool promises its compressed size and a block. */
    if (m->shared && kv->dual &&
        !kv_mgr_fits(m, kv_mgr_need(m, kv, n_tokens, seq_bt(m, kv)))) {
        /* Its prompt and its compressed copy never fit at once: it runs
         * whole, as with dualpath off (kv_mgr_can_fit). */
        kv->dual = false;
        leave_share(m, kv);
        leave_kept(m, kv);
        dp_log(DP_LOG_DEBUG, "kvcache: a %d-token sequence runs whole: too long to migrate in "
               "this memory", n_tokens);
    }
    const bool dual = m->dual && kv->dual;
    dp_kv_need need = kv_mgr_need(m, kv, n_tokens, dual ? seq_bt(m, kv) : 1);
    /* A predicted early switch is planned when it needs less than the
     * switch at the prompt's end (with a quantized decode path it does) and
     * fits at all. */
    kv->early_at = dual && !kv->kshare ? early_point(m, kv, got, n_tokens) : 0;
    if (kv->early_at > 0) {
        dp_kv_need en = kv_mgr_need(m, kv, n_tokens, seq_bt(m, kv));
        if (en.prefill + en.decode < need.prefill + need.decode && kv_mgr_fits(m, en))
            need = en;
        else
            kv->early_at = 0;
    }
    int64_t slots = !dual ? (int64_t)n_tokens + 1 : kv->early_at > 0 ? kv->early_at : n_tokens;
    /* The watermark only applies while others run: an idle server admits
     * anything that fits at all. */
    int32_t wm = dual && busy && need.decode > 0 ? kv_mgr_watermark(m) : 0;
    int32_t need_p = need.prefill - kv->table.n_blocks;
    bool ok;
    if (m->shared) /* one arena: the prompt, its promise and the others' promises */
        ok = park_reclaim(m, need_p + (dual ? need.decode + wm : 0));
    else
        ok = need_p <= kv_pool_n_free(&m->pool) && (!dual || park_reclaim(m, need.decode + wm));
    if (!ok || kv_table_reserve(&kv->table, &m->pool, slots) != 0) {
        /* Not now: the matched blocks go back, still named, for the retry. */
        kv_table_release(&kv->table, &m->pool);
        kv->hashed_blocks = 0;
        kv->chain = 0;
        leave_share(m, kv);
        leave_kept(m, kv);
        if (went_whole)
            kv->dual = true; /* decided again at the next try */
        kv->early_at = 0;
        return DP_ENOSPC;
    }
    kv->path = DP_PATH_PREFILL;
    kv->n_slots = got;
    if (got > 0) {
        m->rebuilds++;
        m->reused_tokens += got;
        m->restored_blocks += from_host;
    }
    kv->decode_reserve = dual ? need.decode : 0;
    m->decode_reserved += kv->decode_reserve;
    *reused = got;
    return 0;
}

/* ---- grouped decode types: whole groups sealed from the residual ---------- */

/* The name of the group of g rows from row roff of res[0..n_res) (gshare.h),
 * 0 where a block it reads is not a named prefill block. */
static uint64_t group_name(const dp_kv_mgr *m, const int32_t *res, int32_t n_res, int32_t roff,
                           int32_t g, int32_t bt)
{
    const int32_t n = (roff + g - 1) / bt + 1;
    uint64_t names[64];
    if (!m->has_pc || !m->gs.name || n > n_res || n > 64)
        return 0;
    for (int32_t i = 0; i < n; i++)
        names[i] = m->pc.block_hash[res[i]];
    return gshare_name(&m->gs, names, n, roff, g);
}

/* The block for the next group of kv's residual (its first g rows from
 * roff, in res[0..n_res)): another sequence's sealed from the same named
 * rows (one more reference), or a new one written by kv_compact (which
 * quantizes the group at once). -1 when there is no room or it failed. */
static int32_t seal_one(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *res, int32_t n_res,
                        uint64_t name)
{
    const dp_kv_dtype *d = &m->dt[kv->dt];
    const int32_t g = seq_group(m, kv);
    int32_t blk = gshare_find(&m->gs, name);
    if (blk >= 0) {
        /* No block taken: the one promised for it goes back. */
        const int32_t p = kv->decode_reserve > 0;
        kv->decode_reserve -= p;
        m->decode_reserved -= p;
        kv_pool_ref(m->dpool, blk);
        m->gs.hits++;
        return blk;
    }
    int32_t from_promise;
    if (!decode_room(m, kv, 1, &from_promise) && !park_reclaim(m, 1 - from_promise))
        return -1;
    const size_t rows = (size_t)m->mig.comp.n_layers * (size_t)m->mig.comp.n_kv_heads;
    int32_t *keep = kv_migrator_keep(&m->mig, rows * (size_t)g);
    if (!keep || kv_pool_alloc(m->dpool, &blk))
        return -1;
    for (size_t r = 0; r < rows; r++)
        for (int32_t t = 0; t < g; t++)
            keep[r * (size_t)g + (size_t)t] = kv->roff + t;
    const dp_compact_seq cs = {res, n_res, &blk, 1, g, keep};
    int rc = m->be->ops->kv_compact(m->be, m->store, d->store, &cs, 1);
    if (rc) {
        dp_log(DP_LOG_ERROR, "kvcache: sealing a %s group failed (%s); it stays in the "
               "residual", dp_kv_type_name(d->type), dp_strerror(rc));
        kv_pool_unref(m->dpool, blk);
        return -1;
    }
    kv->decode_reserve -= from_promise;
    m->decode_reserved -= from_promise;
    gshare_add(&m->gs, name, blk);
    return blk;
}

/* Writes each whole group at the front of a grouped sequence's residual
 * into a block of its type (seal_one), and gives back the residual blocks
 * that no longer hold anything. The lead (table[0], the first arena block)
 * stays as it is once the first group follows it (backend.h
 * dp_kv_group_lead). Best effort: a group that finds no block stays in the
 * residual, read there in the arena's type, until the next growth tries
 * again. */
static void seal_groups(dp_kv_mgr *m, dp_kv_seq *kv)
{
    const int32_t g = seq_group(m, kv);
    if (g <= 0 || !m->be || kv->path != DP_PATH_DECODE)
        return;
    const int32_t bt = m->dt[kv->dt].bt;
    const int32_t w = g + kv_mgr_group_recent(bt); /* a group and the recent window */
    /* Nothing sealed: the residual starts at table[0] from roff 0, so the
     * lead is already in place. */
    if (kv->sealed == 0 && kv->roff == 0 && kv->n_slots >= bt + w)
        kv->sealed = bt;
    while (kv->sealed > 0 && kv->n_slots - kv->sealed >= w) {
        if (kv_table_room(&kv->table, kv->table.n_blocks + 1))
            return;
        const int32_t k = dp_kv_group_rstart(bt, g, kv->sealed), n_res = kv->table.n_blocks - k;
        int32_t *res = kv->table.blocks + k;
        const int32_t blk = seal_one(m, kv, res, n_res, group_name(m, res, n_res, kv->roff, g, bt));
        if (blk < 0)
            return;
        /* The residual blocks the group used up go; the group's block takes
         * the first place after the lead and the other groups. */
        /* (The recent window stays: the residual is never empty here.) */
        const int32_t used = (kv->roff + g) / bt;
        kv->roff = (kv->roff + g) % bt;
        kv->sealed += g;
        m->sealed_groups++;
        for (int32_t i = 0; i < used; i++)
            kv_pool_unref(m->dpool, res[i]);
        memmove(res + 1, res + used, (size_t)(n_res - used) * sizeof *res);
        res[0] = blk;
        kv->table.n_blocks = k + 1 + n_res - used;
        /* Blocks held by reference are the lead (when any is) and then the
         * residual's first ones. */
        const int32_t rref = kv->ref_blocks > 0 ? kv->ref_blocks - 1 : 0;
        kv->ref_blocks -= used < rref ? used : rref;
    }
}

int kv_mgr_grow(dp_kv_mgr *m, dp_kv_seq *kv, int32_t n)
{
    const int64_t slots = (int64_t)kv->n_slots + n;
    if (kv->path == DP_PATH_DECODE) {
        seal_groups(m, kv); /* (its residual's whole groups first: fewer blocks to take) */
        /* Both tables or neither: a compact table grown alone would hold
         * blocks no need counts (a later swap-in would not make room for
         * them). */
        const bool x = kv_seq_has_x(kv);
        int32_t need = (int32_t)table_blocks(m, kv, slots) - kv->table.n_blocks, from_promise;
        if (need < 0)
            need = 0;
        if (x && xblocks_for(m, kv, (int64_t)kv->x_n + n) > kv->xtable.n_blocks)
            need += xblocks_for(m, kv, (int64_t)kv->x_n + n) - kv->xtable.n_blocks;
        if (need > 0 && !decode_room(m, kv, need, &from_promise) &&
            !park_reclaim(m, need - from_promise))
            return DP_ENOSPC;
        const int32_t had = kv->table.n_blocks;
        int32_t took;
        int rc = decode_reserve(m, kv, &kv->table, slots, &took);
        if (rc == 0 && x && (rc = x_reserve(m, kv, &kv->xtable, (int64_t)kv->x_n + n, NULL))) {
            for (int32_t b = had; b < kv->table.n_blocks; b++)
                kv_pool_unref(m->dpool, kv->table.blocks[b]);
            kv->table.n_blocks = had;
            kv->decode_reserve += took;
            m->decode_reserved += took;
        }
        return rc;
    }
    /* In a shared arena the blocks promised to decode paths are not free. */
    if (m->shared && !park_reclaim(m, kv_pool_blocks_for(&m->pool, slots) - kv->table.n_blocks))
        return DP_ENOSPC;
    return kv_table_reserve(&kv->table, &m->pool, slots);
}

/* Names block as the one holding the sequence's next unnamed block of
 * tokens (tokens: the sequence's, from the start), chaining its name. */
static void name_next_block(dp_kv_mgr *m, dp_kv_seq *kv, int32_t block, const int32_t *tokens)
{
    const int32_t bt = m->pool.block_tokens;
    const int32_t *blk = tokens + (size_t)kv->hashed_blocks * bt;
    kv->chain = prefix_chain(&m->pc, kv->chain, blk, bt);
    prefix_register(&m->pc, block, kv->chain, blk);
    kv->hashed_blocks++;
}

void kv_mgr_commit(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n)
{
    kv->n_slots += n;
    if (kv_seq_has_x(kv))
        kv->x_n += n;
    if (!m->has_pc || kv->path != DP_PATH_PREFILL)
        return;
    /* Name the prefill blocks filled so far (slot == position there). */
    const int32_t bt = m->pool.block_tokens;
    while ((kv->hashed_blocks + 1) * bt <= kv->n_slots && kv->hashed_blocks < kv->table.n_blocks)
        name_next_block(m, kv, kv->table.blocks[kv->hashed_blocks], tokens);
}

/* ---- moves ---------------------------------------------------------------- */

#define MIGRATE_BATCH 64

/* Room in a decode type's scratch store for n blocks of its layout. */
static int scratch_reserve(dp_kv_mgr *m, dp_kv_dtype *d, int32_t n)
{
    if (n <= d->rscratch_blocks)
        return 0;
    /* The new store first: where it cannot be had, the one allocated at
     * start-up stays for the recompressions it holds. (A prefix copied
     * rather than held by reference makes a recompression keep more than
     * the budget: the scratch grows then, outside kv_memory.) */
    dp_kv_layout l = d->layout;
    l.n_blocks = n;
    dp_kv_store *s = NULL;
    int rc = m->be->ops->kv_create(m->be, &l, &s);
    if (rc)
        return rc;
    if (d->rscratch)
        m->be->ops->kv_destroy(m->be, d->rscratch);
    d->rscratch = s;
    d->rscratch_blocks = n;
    return 0;
}

/* What a decode-path compaction leaves: at a prompt's end (g->pos), its
 * kept slots stand for the prompt and the reply follows in order, as after
 * a migration; a recompression mixes the reply's positions too. */
static void note_compaction(dp_kv_seq *kv, const dp_kv_migration *g)
{
    if (g->pos > 0) {
        /* The window keeps its last slots whole; they are consecutive
         * positions only as far as the stretch computed since the last
         * compaction (a resumed turn's new text and the reply before it). */
        const int32_t stretch = kv->mig_pos > 0 ? g->pos - kv->mig_pos : g->pos;
        kv->exact_from = g->pos - (stretch < kv->copts.window ? stretch : kv->copts.window);
        kv->mig_pos = g->pos;
        kv->mig_keep = g->n_keep;
        kv->hist_slots = 0;
    } else {
        kv->recompressed = true;
    }
}

/* A recompression whose new table found no free blocks: the kept rows are
 * gathered into the scratch store, the old table is released and the new,
 * smaller one is taken from what it freed, then the rows are copied into it.
 * So a recompression never waits for memory, and a sequence never computes
 * a token over more than its budget: its output does not depend on the load.
 * The rows are the same bytes the direct path would have written. */
static int recompress_staged(dp_kv_mgr *m, dp_kv_migration *g)
{
    dp_kv_seq *kv = g->kv;
    /* A prompt's end on the decode path (a resumed turn) already holds
     * every slot it would keep: without free blocks it keeps its new text
     * whole rather than stage a compaction as long as a context (the
     * scratch holds a decode budget's recompression only). */
    if (g->pos > 0)
        return DP_ENOSPC;
    dp_kv_dtype *d = &m->dt[kv->dt];
    const int32_t nref = ref_slots(m, kv, kv->n_slots, g->n_keep), nb = nref / d->bt;
    const int32_t n_rows = g->n_keep - nref, nblk = dblocks_for(m, kv, n_rows);
    /* Its kept share, if any, goes (its new table holds the front at
     * most): then the blocks it holds alone are what releasing its table
     * frees, and they must cover its new table (some may be held by a
     * kept share others still use). */
    leave_kept(m, kv);
    kv->ref_blocks = nb; /* (a kept share's blocks are its own now) */
    int32_t frees = 0, own;
    for (int32_t b = nb; b < kv->table.n_blocks; b++)
        frees += m->dpool->refcnt[kv->table.blocks[b]] == 1;
    if (nblk > frees && !decode_room(m, kv, nblk - frees, &own))
        return DP_ENOSPC; /* it decodes over its budget until there is room */
    int rc = scratch_reserve(m, d, nblk);
    int32_t *ids = rc ? NULL : malloc((size_t)nblk * sizeof *ids);
    if (!ids) {
        dp_log(DP_LOG_WARN, "kvcache: no memory to recompress a sequence; it decodes over its "
               "budget until there is");
        return rc ? rc : DP_ENOMEM;
    }
    for (int32_t b = 0; b < nblk; b++)
        ids[b] = b;
    const dp_compress_opts co = g->pos > 0 ? kv_seq_prompt_end_opts(kv) : kv->copts;
    dp_kv_move mv = {.co = &co, .src = kv->table.blocks, .n_src_blocks = kv->table.n_blocks,
                     .n_slots = kv->n_slots, .dst = ids, .n_dst_blocks = nblk, .n_keep = g->n_keep,
                     .q = g->q, .q_stride = g->q_stride, .n_q = g->n_q, .n_ref = nref,
                     .attn = &kv->attn};
    kv_migrator_set_exempt(&m->mig, NULL); /* (a recompression: no exempt layers move) */
    if ((rc = kv_migrate(&m->mig, d->store, d->rscratch, &mv, 1))) {
        free(ids);
        return rc;
    }
    /* The new table: the blocks held by reference, then what the old one frees. */
    dp_block_table t;
    kv_table_init(&t);
    for (int32_t b = 0; rc == 0 && b < nb; b++)
        rc = kv_table_push(&t, m->dpool, kv->table.blocks[b]);
    if (rc) {
        kv_table_destroy(&t, m->dpool);
        free(ids);
        return rc;
    }
    kv_table_release(&kv->table, m->dpool);
    free(kv->table.blocks);
    kv->table = t;
    kv->n_slots = nref;
    /* From the blocks it just freed, whatever others were promised (their
     * promises may exceed the free blocks while sequences grow past
     * theirs: the freed ones are its own). */
    if ((rc = kv_table_reserve_bt(&kv->table, m->dpool, g->n_keep, d->bt)) == 0) {
        const size_t rows = (size_t)m->mig.comp.n_layers * (size_t)m->mig.comp.n_kv_heads;
        int32_t *keep = kv_migrator_keep(&m->mig, rows * (size_t)n_rows);
        rc = keep ? 0 : DP_ENOMEM;
        for (size_t r = 0; keep && r < rows; r++)
            for (int32_t s = 0; s < n_rows; s++)
                keep[r * (size_t)n_rows + (size_t)s] = s;
        dp_compact_seq cs = {ids, nblk, kv->table.blocks + nb, kv->table.n_blocks - nb, n_rows,
                             keep};
        if (rc == 0)
            rc = m->be->ops->kv_compact(m->be, d->rscratch, d->store, &cs, 1);
    }
    free(ids);
    if (rc) {
        /* Cannot happen (it needs fewer blocks than it freed): its cache is
         * lost, and the step's owner fails it. */
        dp_log(DP_LOG_ERROR, "kvcache: a staged recompression failed (%s)", dp_strerror(rc));
        kv_table_release(&kv->table, m->dpool);
        leave_share(m, kv);
        leave_kept(m, kv);
        kv->ref_blocks = 0;
        kv->n_slots = 0;
        g->lost = true;
        return rc;
    }
    g->scorer = mv.scorer;
    g->n_ref = nref;
    if (nref == 0)
        leave_share(m, kv);
    note_compaction(kv, g);
    kv->n_slots = g->n_keep;
    kv->ref_blocks = nb;
    attn_acc_reset(&kv->attn);
    m->staged_recompressions++;
    return 0;
}

/* Up to MIGRATE_BATCH sequences, all on path src, all of decode type d. */
static int32_t migrate_batch(dp_kv_mgr *m, dp_kv_migration **mg, int32_t n, dp_path src,
                             dp_kv_dtype *d)
{
    dp_kv_move mv[MIGRATE_BATCH];
    dp_compress_opts cos[MIGRATE_BATCH]; /* each move's options (kv_seq_prompt_end_opts) */
    dp_block_table tables[MIGRATE_BATCH];
    dp_kv_migration *ok[MIGRATE_BATCH], *staged[MIGRATE_BATCH];
    /* share: the decode-pool share a migration holds once it moves (id + 1;
     * negative before the loop names it: -slots); held: its slots. */
    /* kid: the kept share it takes or names (id + 1; 0: none). */
    int32_t took[MIGRATE_BATCH], share[MIGRATE_BATCH], held[MIGRATE_BATCH], kid[MIGRATE_BATCH],
            k = 0, n_staged = 0;
    /* A migration's exempt table (exempt layers), what it took of the
     * promise, and its batch row. */
    dp_block_table xt[MIGRATE_BATCH];
    int32_t xtook[MIGRATE_BATCH], *xrow[MIGRATE_BATCH];
    /* Shares found but not yet joined are pinned (one more user) while
     * blocks are taken: making room may drop parked turns, and with them a
     * share's last user. Unpinned at the end. */
    int32_t pins[2 * MIGRATE_BATCH], n_pins = 0;
    const int32_t rows = m->mig.comp.n_layers * m->mig.comp.n_kv_heads;
    for (int32_t i = 0; i < n; i++) {
        dp_kv_migration *g = mg[i];
        dp_kv_seq *kv = g->kv;
        if (g->n_keep > kv->n_slots)
            g->n_keep = kv->n_slots;
        if (d->group && src == DP_PATH_DECODE) {
            /* A grouped cache is not compacted again (its groups are
             * sealed): a resumed turn's new text stays whole. */
            g->rc = DP_ENOSPC;
            continue;
        }
        kv_table_init(&tables[k]);
        /* The new table starts with the blocks it keeps by reference (one
         * more reference each), then takes decode blocks for the rest: its
         * own leading blocks (in one arena of one type, the prefill blocks
         * of its prefix; on the decode path, a share it holds), or a
         * decode-pool share of its prefix that another sequence copied. */
        int32_t nref = ref_slots(m, kv, kv->n_slots, g->n_keep);
        const int32_t *refb = kv->table.blocks;
        share[k] = 0;
        if (seq_shares(m, kv) && src == DP_PATH_PREFILL) {
            nref = 0;
            int32_t s = g->tokens ? front_slots(m, kv, g->n_keep) : 0;
            /* The share admission joined, unless the front shrank since (an
             * early switch keeps fewer); else one another sequence holds. */
            int32_t id = kv->dshare - 1;
            if (id >= 0 && dprefix_slots(&m->dpx, id) > s) {
                leave_share(m, kv);
                id = -1;
            }
            if (id < 0 && s > 0)
                id = dprefix_find(&m->dpx, g->tokens, s);
            if (id >= 0) {
                nref = dprefix_slots(&m->dpx, id);
                refb = dprefix_blocks(&m->dpx, id);
                share[k] = id + 1;
            } else if (s > 0) {
                share[k] = -s;
            }
        }
        /* Its whole compaction, but for the last partial block, may be one
         * that a sequence with the same tokens made (a kept share): it keeps
         * the same slots and takes those blocks. Else, marked share_kept, it
         * names its own for the next. */
        int32_t kslots = 0, found = -1;
        uint64_t tag = 0;
        const int32_t *keep_given = NULL;
        if (src == DP_PATH_PREFILL && g->tokens && g->n_keep > 0 && seq_keeps_shared(m, kv)) {
            /* The share admission joined is found again, unless its
             * compaction changed since (an early switch keeps fewer). */
            kslots = kept_slots(m, g->n_keep);
            tag = kslots > nref ? kept_tag(&kv->copts, g->n_keep) : 0;
            found = tag ? kept_find(m, kv, g->tokens, kv->n_slots, g->n_keep) : -1;
            if (found >= 0) {
                nref = kslots;
                refb = dprefix_blocks(&m->dpx, found);
                keep_given = dprefix_keep(&m->dpx, found);
                if (share[k] < 0)
                    share[k] = 0; /* its front comes with the kept share's blocks */
            } else {
                found = -1;
                if (!g->share_kept)
                    tag = 0;
            }
        }
        const int32_t nb = nref / d->bt;
        int rc = g->n_keep < 1 ? DP_EINVAL : 0;
        for (int32_t b = 0; rc == 0 && b < nb; b++)
            rc = kv_table_push(&tables[k], m->dpool, refb[b]);
        if (share[k] > 0)
            dprefix_join(&m->dpx, pins[n_pins++] = share[k] - 1);
        if (found >= 0)
            dprefix_join(&m->dpx, pins[n_pins++] = found);
        if (rc == 0)
            rc = decode_reserve(m, kv, &tables[k], g->n_keep, &took[k]);
        if (rc == DP_ENOSPC && src == DP_PATH_DECODE) {
            kv_table_destroy(&tables[k], m->dpool);
            staged[n_staged++] = g; /* after the others, through the scratch */
            continue;
        }
        if (rc) {
            g->rc = rc;
            kv_table_destroy(&tables[k], m->dpool);
            continue;
        }
        /* Its exempt layers keep every slot of the prompt. */
        kv_table_init(&xt[k]);
        xrow[k] = NULL;
        xtook[k] = 0;
        if (src == DP_PATH_PREFILL &&
            ((rc = x_reserve(m, kv, &xt[k], kv->n_slots, &xtook[k])) != 0 ||
             (xt[k].n_blocks > 0 &&
              !(xrow[k] = malloc((size_t)xt[k].n_blocks * (size_t)m->xfold * sizeof(int32_t)))))) {
            g->rc = rc ? rc : DP_ENOMEM;
            undo_reserve(m, kv, &xt[k], xtook[k]);
            undo_reserve(m, kv, &tables[k], took[k]);
            continue;
        }
        if (xrow[k])
            x_ids(m, &xt[k], xrow[k], xt[k].n_blocks * m->xfold);
        /* The first with a prefix names its copy at once, so that the others
         * of this batch take it too (the one backend call below writes it). */
        held[k] = nref;
        if (share[k] > 0) {
            if (!kv->dshare)
                dprefix_join(&m->dpx, share[k] - 1);
            kv->dshare = share[k];
        } else if (share[k] < 0) {
            int32_t id = dprefix_add(&m->dpx, g->tokens, -share[k], tables[k].blocks);
            held[k] = id >= 0 ? -share[k] : 0;
            kv->dshare = id >= 0 ? id + 1 : 0;
        }
        /* So is a kept share: its lists are this call's selection, written
         * before any later move of the call reads them. */
        int32_t *keep_out = NULL;
        kid[k] = 0;
        if (found >= 0) {
            if (kv->kshare != found + 1)
                dprefix_join(&m->dpx, found);
            kid[k] = found + 1;
        } else if (tag) {
            int32_t id = dprefix_add_kept(&m->dpx, g->tokens, kv->n_slots, tag, tables[k].blocks,
                                          kslots, held[k] / d->bt, rows, g->n_keep);
            if (id >= 0) {
                kid[k] = id + 1;
                keep_out = dprefix_keep(&m->dpx, id);
                held[k] = kslots;
            }
        }
        if (src == DP_PATH_PREFILL) { /* a recompression leaves its share once it succeeds */
            if (kv->kshare && kv->kshare != kid[k])
                leave_kept(m, kv); /* joined at admission, not taken */
            kv->kshare = kid[k];
        }
        cos[k] = src == DP_PATH_DECODE && g->pos > 0 ? kv_seq_prompt_end_opts(kv) : kv->copts;
        mv[k] = (dp_kv_move){.co = &cos[k], .src = kv->table.blocks,
                             .n_src_blocks = kv->table.n_blocks, .n_slots = kv->n_slots,
                             .dst = tables[k].blocks + nb, .n_dst_blocks = tables[k].n_blocks - nb,
                             .n_keep = g->n_keep, .q = g->q, .q_stride = g->q_stride, .n_q = g->n_q,
                             .n_ref = nref, .attn = src == DP_PATH_DECODE ? &kv->attn : NULL,
                             .keep_given = keep_given, .keep_out = keep_out, .xdst = xrow[k],
                             .n_xdst_blocks = xt[k].n_blocks * m->xfold};
        g->n_ref = nref;
        ok[k++] = g;
    }
    kv_migrator_set_exempt(&m->mig, d->xstore);
    /* (A grouped type's migration writes its residual: the arena's type.) */
    int rc = k == 0 ? 0 : kv_migrate(&m->mig, src == DP_PATH_PREFILL ? m->store : d->store,
                                     d->group ? m->store : d->store, mv, k);
    if (rc)
        dp_log(DP_LOG_ERROR, "kvcache: migration of %d sequences failed (%s); they keep their "
               "caches", k, dp_strerror(rc));
    for (int32_t i = 0; i < k; i++) {
        dp_kv_migration *g = ok[i];
        dp_kv_seq *kv = g->kv;
        if (rc) {
            g->rc = rc;
            if (src == DP_PATH_PREFILL) { /* a recompression keeps its table */
                leave_kept(m, kv);
                leave_share(m, kv);
            }
            undo_reserve(m, kv, &xt[i], xtook[i]);
            undo_reserve(m, kv, &tables[i], took[i]);
            free(xrow[i]);
            continue;
        }
        free(xrow[i]);
        if (xt[i].n_blocks > 0) {
            free(kv->xtable.blocks); /* (empty on the prefill path) */
            kv->xtable = xt[i];
            kv->x_n = kv->n_slots;
        }
        /* A kept share's scorer is the one that chose its slots (its
         * namer's, recorded here first when both are in this batch). */
        if (kid[i] && mv[i].keep_out)
            m->dpx.e[kid[i] - 1].scorer = (int32_t)mv[i].scorer;
        g->scorer = kid[i] && mv[i].keep_given ? (dp_scorer)m->dpx.e[kid[i] - 1].scorer : mv[i].scorer;
        if (mv[i].keep_given)
            m->kept_shared++;
        if (src == DP_PATH_PREFILL) {
            if (m->has_pc)
                protect_prompt(m, kv);
            kv->mig_pos = kv->n_slots;
            kv->mig_keep = g->n_keep;
            kv->exact_from = kv->mig_pos - kv->copts.window;
            if (kv->early_at > 0 && g->n_keep < kv->n_slots) {
                /* Planned to switch early, compacted at its prompt's end
                 * instead: the promise for its whole prompt on the decode
                 * path is one block again, as any migration's (and its
                 * exempt table's next block). */
                int32_t want = 1 + xblocks_for(m, kv, (int64_t)kv->n_slots + d->bt) -
                               kv->xtable.n_blocks;
                if (want < 1)
                    want = 1;
                if (kv->decode_reserve > want) {
                    m->decode_reserved -= kv->decode_reserve - want;
                    kv->decode_reserve = want;
                }
            }
            if (g->n_keep < kv->n_slots)
                kv->early_at = 0;
        } else {
            note_compaction(kv, g);
            if (g->n_ref == 0)
                leave_share(m, kv); /* its new table holds none of the share's blocks */
            leave_kept(m, kv);
        }
        /* What it held goes back to its pool (named prefill blocks stay
         * cached for the next turn); a recompression's freed blocks are
         * taken again a token at a time, like any other. */
        kv_table_release(&kv->table, kv_mgr_pool_of(m, kv));
        free(kv->table.blocks);
        kv->table = tables[i];
        kv->path = DP_PATH_DECODE;
        kv->n_slots = g->n_keep;
        kv->ref_blocks = held[i] / d->bt;
        attn_acc_reset(&kv->attn); /* its slots were rearranged */
        kv->sealed = kv->roff = 0;
        seal_groups(m, kv);
    }
    for (int32_t i = 0; i < n_pins; i++)
        dprefix_leave(&m->dpx, pins[i]);
    int32_t moved = rc ? 0 : k;
    for (int32_t i = 0; i < n_staged; i++)
        if ((staged[i]->rc = recompress_staged(m, staged[i])) == 0)
            moved++;
    return moved;
}

int kv_mgr_note_query(dp_kv_mgr *m, dp_kv_seq *kv, const float *q, int64_t q_stride, int32_t slot)
{
    if (kv->path != DP_PATH_DECODE || slot < 0 || slot >= kv->n_slots)
        return DP_EINVAL;
    return compressor_accumulate(&m->mig.comp, &kv->attn, m->dt[kv->dt].store, kv->table.blocks, q, q_stride,
                                 slot);
}

int32_t kv_mgr_migrate(dp_kv_mgr *m, dp_kv_migration *mg, int32_t n)
{
    if (!m->dual || !m->be)
        return 0;
    /* Each sequence's source is where it is now: a migrated one is not
     * taken again by the pass over the decode path. */
    for (int32_t i = 0; i < n; i++) {
        mg[i].rc = 1; /* not yet run */
        mg[i].n_ref = 0;
        mg[i].lost = false;
        mg[i].scorer = mg[i].kv->copts.scorer;
    }
    int32_t moved = 0;
    dp_kv_migration *batch[MIGRATE_BATCH];
    /* One backend call per source pool and decode type. */
    for (int src = DP_PATH_PREFILL; src <= DP_PATH_DECODE; src++)
        for (int t = 0; t < m->n_dt; t++) {
            int32_t k = 0;
            for (int32_t i = 0; i < n; i++) {
                if (mg[i].rc != 1 || mg[i].kv->path != (dp_path)src || mg[i].kv->dt != t)
                    continue;
                mg[i].rc = 0;
                batch[k++] = &mg[i];
                if (k == MIGRATE_BATCH) {
                    moved += migrate_batch(m, batch, k, (dp_path)src, &m->dt[t]);
                    k = 0;
                }
            }
            if (k > 0)
                moved += migrate_batch(m, batch, k, (dp_path)src, &m->dt[t]);
        }
    /* A prompt that could not move stays whole on the prefill path for good
     * (it no longer needs the decode pool's promise). */
    for (int32_t i = 0; i < n; i++)
        if (mg[i].rc && mg[i].kv->path == DP_PATH_PREFILL) {
            mg[i].kv->dual = false;
            drop_promise(m, mg[i].kv);
            leave_share(m, mg[i].kv);
            leave_kept(m, mg[i].kv);
        }
    return moved;
}

/* A running sequence's swap-out before parked turns' spills: they give up
 * their host memory (oldest first) when it is short. */
static int swap_out_running(dp_kv_mgr *m, dp_kv_seq *kv)
{
    int rc;
    while ((rc = swap_out_seq(m, kv)) == DP_ENOSPC)
        if (!swap_can_take(m, seq_dblocks(kv)) || !park_drop_spilled(m))
            break;
    return rc;
}

int kv_mgr_swap_out(dp_kv_mgr *m, dp_kv_seq *kv)
{
    if (kv->path == DP_PATH_DECODE && m->has_swap && swap_out_running(m, kv) == 0) {
        /* Path and slots stay: the cache comes back whole (its prefix in
         * blocks of its own). */
        drop_promise(m, kv);
        leave_share(m, kv);
        leave_kept(m, kv);
        kv->ref_blocks = 0;
        return 0;
    }
    if (kv->path == DP_PATH_DECODE) {
        m->decode_recomputes++;
        dp_log(DP_LOG_DEBUG, "kvcache: no swap space: a compact cache will be recomputed");
    }
    release_all(m, kv);
    if (kv->whole_if_room)
        kv->dual = true; /* a later turn: whole or not, decided again at its admission */
    return DP_ENOSPC;
}

int kv_mgr_swap_in(dp_kv_mgr *m, dp_kv_seq *kv, bool busy)
{
    if (!kv->swapped.slots)
        return DP_EINVAL;
    int64_t slots = (int64_t)kv->n_slots + 1;
    /* What the copy holds, or what the next token needs where that is more. */
    const int32_t nx = kv->swapped_x, nc = kv->swapped.n_blocks - nx;
    const int32_t want = (int32_t)table_blocks(m, kv, slots);
    int32_t need = want > nc ? want : nc;
    if (nx) {
        const int32_t x = xblocks_for(m, kv, (int64_t)kv->x_n + 1);
        need += x > nx ? x : nx;
    }
    int32_t wm = busy ? kv_mgr_watermark(m) : 0;
    if (!park_reclaim(m, need + wm))
        return DP_ENOSPC;
    return swap_in_seq(m, kv, slots);
}

void kv_mgr_keep_reply(dp_kv_mgr *m, dp_kv_seq *kv, const int32_t *tokens, int32_t n_computed)
{
    if (!m->reuse_replies || !m->be || kv->path != DP_PATH_DECODE || kv->swapped.slots ||
        kv->recompressed || kv->mig_pos <= 0)
        return;
    /* A request's own decode type writes back only where it loses nothing
     * (the prefill type): the prefix cache serves every request, and one
     * that asked for f16 must not read another's q4_0 rows. */
    if ((kv->dt != 0 && !m->dt[kv->dt].by_ref) || seq_group(m, kv) > 0)
        return; /* (a grouped cache's rows are not where the window's mapping says) */
    /* From the window on, the compact cache holds every position whole, in
     * order: position p is at slot p + off in every head (the window's kept
     * slots are the last of the compaction, the reply's follow them). */
    const int32_t bt = m->pool.block_tokens;
    const int32_t off = kv->mig_keep - kv->mig_pos;
    const int32_t first = kv->hashed_blocks, whole_from = kv->exact_from;
    if (off != 0 && first * bt < whole_from)
        return;
    int32_t nb = n_computed / bt - first;
    /* Only blocks nobody protects or was promised: evicting a protected
     * prompt (this one's included) for a best-effort copy loses more. */
    int32_t avail = kv_pool_n_free(&m->pool) - m->pool.n_warm;
    if (m->shared && kv_pool_n_free(&m->pool) - m->decode_reserved < avail)
        avail = kv_pool_n_free(&m->pool) - m->decode_reserved;
    if (nb > avail)
        nb = avail;
    if (nb <= 0)
        return;
    const size_t rows = (size_t)m->mig.comp.n_layers * (size_t)m->mig.comp.n_kv_heads;
    const size_t n = (size_t)nb * (size_t)bt;
    int32_t *keep = kv_migrator_keep(&m->mig, rows * n);
    if (!keep)
        return;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < n; j++)
            keep[r * n + j] = (int32_t)((size_t)first * (size_t)bt + j) + off;
    dp_block_table t;
    kv_table_init(&t);
    if (kv_table_reserve(&t, &m->pool, (int64_t)n) != 0) {
        kv_table_destroy(&t, &m->pool);
        return;
    }
    dp_compact_seq cs = {kv->table.blocks, kv->table.n_blocks, t.blocks, t.n_blocks, (int32_t)n,
                         keep};
    if (m->be->ops->kv_compact(m->be, m->dt[kv->dt].store, m->store, &cs, 1) == 0) {
        for (int32_t i = 0; i < nb; i++)
            name_next_block(m, kv, t.blocks[i], tokens);
        m->reply_blocks += nb;
    }
    kv_table_destroy(&t, &m->pool); /* free and named: cached for the next turn */
}

void kv_mgr_free(dp_kv_mgr *m, dp_kv_seq *kv)
{
    if (m->has_swap)
        kv_swap_drop(&m->swap, &kv->swapped);
    release_all(m, kv);
}
