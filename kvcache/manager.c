/* manager.c: the KV manager's start-up and shutdown: the pools' sizes (one
 * arena or two), the decode types kept as views of the arena, the exempt
 * layers, and the objects that hang off the pools (prefix cache, host tier,
 * swap space, migrator, shares). The rest of the manager, by concern:
 * mgr_admit.c (needs, promises, admission, freeing), mgr_grow.c (growth,
 * naming, grouped types' sealing), mgr_parked.c (finished turns kept for
 * the next: stored, found, resumed, evicted), mgr_moves.c (migration,
 * recompression, reply write-back) and mgr_swap.c (a preempted sequence's
 * cache moved to host memory and back). The only policies here are a
 * cache's own, applied when an allocation needs room, as vLLM's block pool
 * evicts cached blocks: the prefix cache's least recently used blocks and
 * the oldest parked turns go first. Who is admitted or preempted is the
 * scheduler's call (sched_schedule), which sequences migrate and with which
 * queries the engine's. */
#include "mgr_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

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

void kv_seq_init_request(dp_kv_seq *kv, const dp_kv_request *r)
{
    kv_seq_init(kv, r && r->dual, r ? &r->copts : NULL);
    if (!r)
        return;
    kv->whole_if_room = r->whole_if_room;
    kv->exempt = r->exempt;
    kv->dt = r->dt;
    kv->early_end = r->early_end;
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
    swa_tab_destroy(&kv->w);
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
    return n > 0 && n < DP_KV_STORE_SWA ? n : DP_KV_STORE_SWA;
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

void kv_mgr_dtype_names(const dp_kv_mgr *m, char *buf, size_t size)
{
    if (size == 0)
        return;
    buf[0] = '\0';
    for (int i = 0; i < m->n_dt; i++)
        snprintf(buf + strlen(buf), size - strlen(buf), "%s%s", i ? ", " : "",
                 dp_kv_type_name(m->dt[i].type));
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

/* Bytes of a block of each path's layout (l, dl: one block each); a type
 * the backend cannot keep at this head size is refused. */
static int init_block_bytes(dp_kv_mgr *m, const dp_kv_mgr_opts *o, const dp_kv_layout *l,
                            const dp_kv_layout *dl, char *err, size_t errsz)
{
    dp_backend *be = m->be;
    m->prefill_block_bytes = be->ops->kv_bytes_per_block(be, l);
    m->decode_block_bytes = o->dual ? be->ops->kv_bytes_per_block(be, dl) : 0;
    if (!m->prefill_block_bytes || (o->dual && !m->decode_block_bytes)) {
        const dp_kv_layout *bad = m->prefill_block_bytes ? dl : l;
        return dp_err(err, errsz, DP_EUNSUPPORTED, "engine: the %s backend cannot keep a KV "
                      "cache of type %s with head_dim %d", be->ops->name,
                      dp_kv_type_name(bad->type), bad->head_dim);
    }
    return 0;
}

/* One arena unless the decode path's blocks differ in size or its pool's
 * size is given. A decode type other than the prefill path's (a quantized
 * decode pool) shares the arena through a view of it: a decode block is an
 * arena block read as that type, holding as many tokens as fit in its
 * bytes (dl->block_tokens, m->dbt). */
static int init_geometry(dp_kv_mgr *m, const dp_kv_mgr_opts *o, dp_kv_layout *dl, char *err,
                         size_t errsz)
{
    dp_backend *be = m->be;
    const bool typed = o->decode.type != o->prefill.type;
    if (o->dual && typed && be && !be->ops->kv_view)
        return dp_err(err, errsz, DP_EUNSUPPORTED, "engine: the %s backend keeps the decode "
                      "path in the prefill path's KV type only (decode_kv_type %s, "
                      "kv_cache_type %s)", be->ops->name, dp_kv_type_name(o->decode.type),
                      dp_kv_type_name(o->prefill.type));
    m->shared = o->dual && o->decode.n_blocks <= 0 &&
                (typed ? be && be->ops->kv_view
                       : o->decode.block_tokens == o->prefill.block_tokens);
    m->dpool = m->shared ? &m->pool : &m->dpool_own;
    const bool grouped = o->dual && dp_kv_type_grouped(o->decode.type);
    int rc;
    if (grouped && (rc = kv_mgr_check_grouped(be, o, err, errsz)))
        return rc;
    /* A grouped type's migrations write the arena's type (it seals whole
     * groups from them), by reference like the arena's own. */
    m->by_ref = m->shared && (!typed || grouped);
    m->share_front = o->dual && !m->by_ref && be;
    m->dbt = o->decode.block_tokens;
    if (m->shared && grouped) {
        dl->block_tokens = kv_mgr_group_tokens(be, dl, m->prefill_block_bytes);
        m->dbt = o->prefill.block_tokens; /* a table's unit: the residual's blocks */
        m->decode_block_bytes = m->prefill_block_bytes;
    } else if (m->shared && typed) {
        dl->block_tokens = 1;
        size_t per_token = be->ops->kv_bytes_per_block(be, dl);
        m->dbt = (int32_t)(m->prefill_block_bytes / per_token);
        if (m->dbt < 1)
            return dp_err(err, errsz, DP_EINVAL, "engine: a %s decode token does not fit in a KV "
                          "block of %d tokens; raise block_tokens", dp_kv_type_name(dl->type),
                          o->prefill.block_tokens);
        dl->block_tokens = m->dbt;
        m->decode_block_bytes = be->ops->kv_bytes_per_block(be, dl);
    }
    return 0;
}

/* The pools and their stores: the arena (l), and the decode path's, a view
 * of it, the arena itself or a pool of its own (dl); *n_dblocks its blocks. */
static int init_pools(dp_kv_mgr *m, const dp_kv_mgr_opts *o, dp_kv_layout *l, dp_kv_layout *dl,
                      int32_t *n_dblocks, char *err, size_t errsz)
{
    dp_backend *be = m->be;
    const bool typed = o->decode.type != o->prefill.type;
    int32_t n_blocks;
    plan_blocks(m, o, &n_blocks, n_dblocks);
    if (n_blocks < 1 || (o->dual && !m->shared && *n_dblocks < 1))
        return dp_err(err, errsz, DP_EINVAL, "engine: KV memory holds no block of %d tokens",
                      o->prefill.block_tokens);
    l->n_blocks = n_blocks;
    int rc;
    if ((rc = kv_pool_init(&m->pool, n_blocks, o->prefill.block_tokens)) ||
        (be && (rc = be->ops->kv_create(be, l, &m->store))))
        return dp_err(err, errsz, rc, "engine: cannot allocate a KV pool of %d blocks of %d "
                      "tokens", n_blocks, o->prefill.block_tokens);
    if (o->dual && m->shared && typed) {
        dl->n_blocks = *n_dblocks = n_blocks;
        if (be && (rc = be->ops->kv_view(be, m->store, dl, &m->dstore)))
            return dp_err(err, errsz, rc, "engine: cannot view the KV arena as %s blocks of %d "
                          "tokens", dp_kv_type_name(dl->type), dl->block_tokens);
    } else if (o->dual && m->shared) {
        m->dstore = m->store;
        *n_dblocks = n_blocks;
        m->decode_block_bytes = m->prefill_block_bytes;
    } else if (o->dual) {
        dl->n_blocks = *n_dblocks;
        if ((rc = kv_pool_init(m->dpool, *n_dblocks, o->decode.block_tokens)) ||
            (be && (rc = be->ops->kv_create(be, dl, &m->dstore))))
            return dp_err(err, errsz, rc, "engine: cannot allocate a decode pool of %d blocks "
                          "of %d tokens", *n_dblocks, o->decode.block_tokens);
    }
    return 0;
}

/* What hangs off the decode pool: its types, the server type's
 * recompression scratch, the exempt layers' views and the shares. */
static int init_decode_types(dp_kv_mgr *m, const dp_kv_mgr_opts *o, const dp_kv_layout *l,
                             const dp_kv_layout *dl, int32_t n_dblocks, char *err, size_t errsz)
{
    dp_backend *be = m->be;
    int rc;
    if ((rc = dtypes_init(m, dl, l)))
        return dp_err(err, errsz, rc, "out of memory");
    /* The server's decode type's recompression scratch, now and once (its
     * bytes are inside kv_bytes: plan_blocks); a type a request asks for
     * takes its own at its first staged recompression. */
    const int32_t scratch = budget_scratch_blocks(m, m->dt[0].bt);
    if (be && scratch > 0 && (rc = mgr_scratch_reserve(m, &m->dt[0], scratch)))
        return dp_err(err, errsz, rc, "engine: cannot allocate the decode budget's "
                      "recompression scratch (%d blocks)", scratch);
    if (o->dual && o->exempt_layers > 0 && be &&
        (rc = exempt_init(m, o->exempt_layers, n_dblocks, err, errsz)))
        return rc;
    /* Each share (a prefix kept whole, a kept share) holds a decode block at
     * least, and lives while a sequence holds it: two per running sequence
     * at most. */
    if (o->dual && be &&
        (rc = dprefix_init(&m->dpx, m->dpool, m->dbt, n_dblocks < 1024 ? n_dblocks : 1024)))
        return dp_err(err, errsz, rc, "out of memory");
    return 0;
}

/* The migrator and the swap space. Preempted compact caches wait in the
 * swap space (swap_bytes, allocated here once, as vLLM's swap_space): each
 * waiting sequence holds at most its own cache, and a refused swap-out
 * falls back to a recompute that may change the sequence's continuation.
 * In one arena the copies are of arena blocks, whatever type reads them. */
static int init_moves(dp_kv_mgr *m, const dp_kv_mgr_opts *o, char *err, size_t errsz)
{
    dp_backend *be = m->be;
    int rc;
    if ((rc = kv_migrator_init(&m->mig, be, o->n_layers, o->n_kv_heads, o->n_heads, o->head_dim)))
        return dp_err(err, errsz, rc, "out of memory");
    dp_kv_store *ss = m->shared ? m->store : m->dstore;
    rc = o->swap_bytes > 0 ? kv_swap_init(&m->swap, be, ss, m->dpool, (size_t)o->swap_bytes)
                           : DP_EINVAL;
    if (rc == DP_ENOMEM)
        return dp_err(err, errsz, rc, "cannot allocate a swap space of %lld bytes (swap_space)",
                      (long long)o->swap_bytes);
    if (rc && o->swap_bytes > 0)
        dp_log(DP_LOG_WARN, "kvcache: a swap space of %lld bytes holds no block of %zu bytes: "
               "preempted sequences are recomputed", (long long)o->swap_bytes,
               be->ops->kv_bytes_per_block(be, be->ops->kv_layout(be, ss)));
    m->has_swap = rc == 0;
    return 0;
}

/* The prefix cache, its host tier, and a grouped type's shared groups. */
static int init_prefix_cache(dp_kv_mgr *m, const dp_kv_mgr_opts *o, char *err, size_t errsz)
{
    dp_backend *be = m->be;
    const bool grouped = o->dual && dp_kv_type_grouped(o->decode.type);
    int rc;
    if (o->host_tier_bytes > 0 && be) {
        /* Pinned where the backend has it: spills and restores then run
         * asynchronously on its stream (kvcache/host.h). */
        dp_host_alloc ha = {mgr_host_alloc, mgr_host_free, be};
        if ((rc = host_tier_init(&m->host, (size_t)o->host_tier_bytes, m->prefill_block_bytes,
                                 (size_t)o->prefill.block_tokens * sizeof(int32_t),
                                 be->ops->host_alloc && be->ops->host_free ? &ha : NULL)))
            return dp_err(err, errsz, rc, "engine: cannot allocate a %lld-byte host tier",
                          (long long)o->host_tier_bytes);
        m->has_host = true;
    }
    if ((rc = prefix_init(&m->pc, &m->pool, be, m->store, m->has_host ? &m->host : NULL)))
        return dp_err(err, errsz, rc, "out of memory");
    m->has_pc = true;
    if (grouped && be && (rc = gshare_init(&m->gs, m->dpool)))
        return dp_err(err, errsz, rc, "out of memory");
    if (grouped && be &&
        !(m->held_stamp = calloc((size_t)m->dpool->n_blocks, sizeof *m->held_stamp)))
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    return 0;
}

/* Room for the parked turns' list and their count's scratch. */
static int init_parked(dp_kv_mgr *m, const dp_kv_mgr_opts *o, char *err, size_t errsz)
{
    m->parked = calloc((size_t)o->max_parked, sizeof *m->parked);
    m->park_cnt = calloc((size_t)m->dpool->n_blocks, sizeof *m->park_cnt);
    if (!m->parked || !m->park_cnt)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    m->max_parked = o->max_parked;
    return 0;
}

/* The sliding-window layers' store and pool (swa.h). Parked turns carry a
 * sequence's sliding table (its window at the turn's end); the prefix
 * cache, the swap space and the exempt layers do not yet: the engine keeps
 * them off beside it. */
static int init_swa(dp_kv_mgr *m, const dp_kv_mgr_opts *o, char *err, size_t errsz)
{
    const dp_kv_layout *l = &o->swa;
    if (o->swa_window < 1 || o->swa_chunk < 1 || l->n_blocks < 1 ||
        l->block_tokens != o->prefill.block_tokens || dp_kv_type_grouped(l->type))
        return dp_err(err, errsz, DP_EINVAL, "kvcache: bad sliding-window layout (window %d, "
                      "chunk %d, %d blocks of %d tokens)", o->swa_window, o->swa_chunk,
                      l->n_blocks, l->block_tokens);
    if (o->exempt_layers > 0 || o->prefix_cache || (o->dual && o->swap_bytes > 0))
        return dp_err(err, errsz, DP_EUNSUPPORTED, "kvcache: sliding-window layers kept at their "
                      "window go without exempt layers, the prefix cache and a swap space");
    int rc = swa_init(&m->swa, m->be, l, o->swa_window, o->swa_chunk);
    if (rc)
        return dp_err(err, errsz, rc, "kvcache: cannot allocate the sliding-window layers' "
                      "cache (%d blocks)", l->n_blocks);
    /* One sequence alone must always be able to run a step. */
    const int32_t one = swa_blocks_at(&m->swa, o->swa_chunk);
    if (one > l->n_blocks) {
        swa_destroy(&m->swa, m->be);
        return dp_err(err, errsz, DP_EINVAL, "kvcache: the sliding-window layers' cache holds "
                      "%d blocks, one sequence's window and chunk take %d", l->n_blocks, one);
    }
    m->has_swa = true;
    m->swa_block_bytes = m->be ? m->be->ops->kv_bytes_per_block(m->be, l) : 0;
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
    int32_t n_dblocks = 0;
    int rc;
    if ((be && (rc = init_block_bytes(m, o, &l, &dl, err, errsz))) ||
        (rc = init_geometry(m, o, &dl, err, errsz)) ||
        (rc = init_pools(m, o, &l, &dl, &n_dblocks, err, errsz)) ||
        (rc = init_decode_types(m, o, &l, &dl, n_dblocks, err, errsz)) ||
        (o->dual && be && (rc = init_moves(m, o, err, errsz))) ||
        (o->prefix_cache && (rc = init_prefix_cache(m, o, err, errsz))) ||
        (o->dual && o->max_parked > 0 && (rc = init_parked(m, o, err, errsz))) ||
        (o->swa.n_layers > 0 && (rc = init_swa(m, o, err, errsz)))) {
        kv_mgr_destroy(m);
        return rc;
    }
    return 0;
}

void kv_mgr_destroy(dp_kv_mgr *m)
{
    while (m->n_parked > 0)
        mgr_park_drop(m, m->n_parked - 1);
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
    if (m->has_swa)
        swa_destroy(&m->swa, m->be);
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

/* ---- the plan, said at start-up ------------------------------------------ */

#define MIB(x) ((double)(x) / (1024.0 * 1024.0))

static void log_memory_plan(const dp_kv_mgr *m)
{
    dp_backend *be = m->be;
    const double pm = MIB((double)m->pool.n_blocks * (double)m->prefill_block_bytes);
    const double dm = m->dual ? MIB((double)m->dpool->n_blocks * (double)m->decode_block_bytes) : 0;
    if (m->shared && m->dstore != m->store) {
        const dp_kv_layout *pl = be->ops->kv_layout(be, m->store);
        const dp_kv_layout *dl = be->ops->kv_layout(be, m->dstore);
        dp_log(DP_LOG_INFO, "engine: memory plan (%s): one KV arena of %d blocks (%.0f MiB) for "
               "both paths: a block holds %d tokens in %s on the prefill path, %d in %s on the "
               "decode path", be->ops->name, m->pool.n_blocks, pm, pl->block_tokens,
               dp_kv_type_name(pl->type), dl->block_tokens, dp_kv_type_name(dl->type));
        return;
    }
    if (m->shared) {
        dp_log(DP_LOG_INFO, "engine: memory plan (%s): one KV arena of %d blocks x %d tokens "
               "(%.0f MiB) for both paths", be->ops->name, m->pool.n_blocks, m->pool.block_tokens,
               pm);
        return;
    }
    char model[96] = "";
    if (be->ops->mem_usage) {
        size_t wb = 0, ab = 0;
        be->ops->mem_usage(be, &wb, &ab);
        snprintf(model, sizeof model, "weights %.0f MiB, activations %.0f MiB; ", MIB(wb),
                 MIB(ab));
    }
    dp_log(DP_LOG_INFO, "engine: memory plan (%s): %sprefill pool %d blocks x %d tokens (%.0f MiB)"
           ", decode pool %d blocks x %d tokens (%.0f MiB)", be->ops->name, model, m->pool.n_blocks,
           m->pool.block_tokens, pm, m->dual ? m->dpool->n_blocks : 0,
           m->dual ? m->dbt : 0, dm);
}

/* Host memory beside the KV arena: it counts in the machine's memory (on
 * the CPU, the same RAM as the arena), so it is said at start-up. */
static void log_host_plan(const dp_kv_mgr *m)
{
    if (!m->has_swap && !m->has_host)
        return;
    dp_log(DP_LOG_INFO, "engine: host memory: swap space %.0f MiB%s, host tier %.0f MiB",
           m->has_swap ? MIB((double)m->swap.cap_bytes) : 0.0,
           m->has_swap ? (m->swap.pinned ? " (pinned)" : "") : " (none: preempted sequences are "
                                                                "recomputed)",
           m->has_host ? MIB((double)m->host.cap * (double)m->host.block_bytes) : 0.0);
}

void kv_mgr_log_plan(const dp_kv_mgr *m)
{
    if (!m->be)
        return;
    log_memory_plan(m);
    if (m->has_swa) {
        const dp_kv_layout *l = m->be->ops->kv_layout(m->be, m->swa.store);
        dp_log(DP_LOG_INFO, "engine: memory plan: the %d sliding-window layers apart, %d blocks x "
               "%d tokens (%.0f MiB): a sequence holds its last %d tokens of them, at most %d "
               "blocks; the other layers' KV above", l->n_layers, m->swa.pool.n_blocks,
               m->swa.pool.block_tokens,
               MIB((double)m->swa.pool.n_blocks * (double)m->swa_block_bytes), m->swa.window,
               swa_blocks_at(&m->swa, 1));
    }
    log_host_plan(m);
}
