/* test_manager_prop.c: a randomized property test of the KV manager. Many
 * sequences are driven through the calls the scheduler and the engine make
 * (admit, grow and commit a prompt in chunks, migrate at its end, decode,
 * recompress under a decode budget, swap out and back in, park a finished
 * turn and resume it with the conversation's next one, keep a reply, free)
 * in a random order, on several managers: dualpath off, one arena of one
 * type, a quantized decode type, exempt layers, split pools, a decode
 * budget, a grouped decode type (whole groups sealed from a residual),
 * sliding-window layers apart (kvcache/swa.h; without the prefix cache,
 * parked turns and swap, which do not carry them). After every call the
 * bookkeeping must add up:
 *   - each block's reference count equals the tables that hold it (live,
 *     swapped-in and parked sequences, exempt tables) plus the decode-pool
 *     shares that name it (dprefix.h), and the free count equals the blocks
 *     nobody references;
 *   - the decode promises of the sequences add up to the manager's, and the
 *     blocks that are free or that dropping parked turns would free cover them;
 *   - the swap space's bytes are those of the swapped-out and spilled copies;
 *   - the sliding pool's reference counts are the live entries of the
 *     sequences' sliding tables, which hold no more than a window and a
 *     chunk, cover the positions computed, and whose promises add up to
 *     the pool's and fit in its free blocks;
 * and when everything has ended, every block but the parked turns' is free
 * and nothing is promised. The seed is fixed (DP_PROP_SEED overrides it,
 * DP_PROP_STEPS the length) so that a failure reproduces. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "kvcache/manager.h"
#include "t.h"

enum { BT = 16, N_SEQ = 10, N_CONV = 6, SYS = 40, MAX_TOK = 1024 };
/* Sliding layers apart: their window, and a step's tokens at most. */
enum { SWA_WINDOW = 48, SWA_CHUNK = 32 };

typedef struct setup {
    const char *name;
    bool dual;
    dp_kv_type dtype;       /* the decode path's type */
    int32_t n_blocks;       /* the arena (or the prefill pool) */
    int32_t n_dblocks;      /* split pools: the decode pool's blocks (0: one arena) */
    int32_t exempt;
    int32_t budget;         /* decode budget (0: none) */
    float keep;             /* the keep ratio (0: 0.5) */
    int32_t swa_blocks;     /* sliding layers apart: their pool's blocks (0: none) */
} setup;

typedef enum { FREE, WAITING, RUNNING } state;

typedef struct pseq {
    dp_kv_seq kv;
    state st;
    int32_t tok[MAX_TOK];
    int32_t n_tokens, n_prompt, n_computed, max_new, conv;
} pseq;

typedef struct conv {
    int32_t tok[MAX_TOK];
    int32_t n;              /* 0: no turn has ended */
    bool busy;              /* a turn of it is live */
} conv;

typedef struct world {
    const setup *su;
    dp_backend *be;
    dp_kv_mgr m;
    pseq s[N_SEQ];
    conv c[N_CONV];
    uint64_t rng;
    int64_t ops[12];        /* calls made, by kind (printed) */
} world;

enum { OP_ADMIT, OP_PREFILL, OP_MIGRATE, OP_DECODE, OP_RECOMPRESS, OP_SWAP_OUT, OP_RECOMPUTE,
       OP_PARK, OP_RESUME, OP_REPLY, OP_CANCEL, OP_N };
static const char *const OP_NAMES[OP_N] = {"admit", "prefill", "migrate", "decode", "recompress",
                                          "swap-out", "recompute", "park", "resume", "reply",
                                          "cancel"};

static uint32_t rnd(world *w, uint32_t n)
{
    w->rng = w->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((w->rng >> 33) % n);
}

/* ---- the invariants --------------------------------------------------------- */

static void count_table(int32_t *cnt, const dp_block_table *t)
{
    for (int32_t b = 0; b < t->n_blocks; b++)
        cnt[t->blocks[b]]++;
}

static void count_seq(const dp_kv_mgr *m, int32_t *pcnt, int32_t *dcnt, const dp_kv_seq *kv)
{
    count_table(kv->path == DP_PATH_DECODE ? dcnt : pcnt, &kv->table);
    count_table(dcnt, &kv->xtable);
    (void)m;
}

static void check_pool(const char *what, const dp_kv_pool *p, const int32_t *cnt)
{
    int32_t nfree = 0;
    for (int32_t b = 0; b < p->n_blocks; b++) {
        CHECK_MSG((int64_t)p->refcnt[b] == cnt[b], "%s block %d: %u references, %d holders", what,
                  b, p->refcnt[b], cnt[b]);
        nfree += p->refcnt[b] == 0;
    }
    CHECK_EQ_INT(p->n_free, nfree);
}

/* A grouped decode-path sequence: whole groups below its slot count, and
 * a table that covers them and its residual. */
static void check_grouped(const dp_kv_mgr *m, const dp_kv_seq *kv)
{
    const int32_t g = m->dt[kv->dt].group;
    if (g <= 0 || kv->path != DP_PATH_DECODE) {
        CHECK(kv->sealed == 0 && kv->roff == 0);
        return;
    }
    const int32_t bt = m->dt[kv->dt].bt, r = kv->n_slots - kv->sealed;
    CHECK(dp_kv_group_sealed_ok(bt, g, kv->sealed) && kv->sealed <= kv->n_slots);
    CHECK(kv->roff >= 0 && kv->roff < bt);
    CHECK(kv->sealed > 0 || kv->roff == 0); /* (the lead starts the residual) */
    if (kv->swapped.slots)
        return;
    CHECK(kv->table.n_blocks >=
          dp_kv_group_rstart(bt, g, kv->sealed) + (r > 0 ? (kv->roff + r + bt - 1) / bt : 0));
}

/* The gauge of decode blocks held (kv_mgr_held_blocks): each sequence's
 * own blocks, a kivi4 group that several running tables hold counted once. */
static void check_held(world *w)
{
    dp_kv_mgr *m = &w->m;
    int32_t *occ = calloc((size_t)m->dpool->n_blocks, sizeof *occ);
    CHECK(occ);
    int32_t held = 0, want = 0;
    kv_mgr_held_begin(m);
    for (int i = 0; i < N_SEQ; i++) {
        const dp_kv_seq *kv = &w->s[i].kv;
        if (w->s[i].st == FREE || kv->path != DP_PATH_DECODE || kv->swapped.slots)
            continue;
        held += kv_mgr_held_blocks(m, kv);
        want += kv->table.n_blocks + kv->xtable.n_blocks - kv->ref_blocks;
        const int32_t g = m->dt[kv->dt].group;
        if (g <= 0 || kv->sealed <= 0)
            continue;
        int32_t k = dp_kv_group_rstart(m->dt[kv->dt].bt, g, kv->sealed);
        for (int32_t j = 1; j < k && j < kv->table.n_blocks; j++) {
            const int32_t b = kv->table.blocks[j];
            want -= m->dpool->refcnt[b] > 1 && occ[b]++ > 0; /* a second holder */
        }
    }
    CHECK_EQ_INT(held, want);
    free(occ);
}

static void check_swa(world *w)
{
    dp_kv_mgr *m = &w->m;
    int32_t *cnt = calloc((size_t)m->swa.pool.n_blocks, sizeof *cnt);
    CHECK(cnt != NULL);
    int64_t promised = 0;
    for (int i = 0; i < N_SEQ; i++) {
        const pseq *q = &w->s[i];
        if (q->st == FREE)
            continue;
        const dp_kv_wtab *t = kv_seq_wtab(&q->kv);
        for (int32_t j = 0; j < t->lo; j++)
            CHECK_EQ_INT(t->blocks[j], -1);
        for (int32_t j = t->lo; j < t->n; j++)
            cnt[t->blocks[j]]++;
        CHECK_MSG(t->n - t->lo <= swa_blocks_at(&m->swa, SWA_CHUNK), "%d sliding blocks held",
                  t->n - t->lo);
        CHECK(t->promise >= 0);
        promised += t->promise;
        if (q->st == RUNNING) {
            /* Its positions computed, and the blocks the next token reads. */
            CHECK_EQ_INT(t->pos, q->n_computed);
            CHECK(t->pos < t->prompt || t->promise == 0); /* its prompt done: no promise */
            /* A prompt holds and is promised its peak at most. */
            CHECK(t->pos >= t->prompt || swa_held(t) + t->promise <= t->peak);
            CHECK((int64_t)t->lo * BT <= (t->pos + 1 - SWA_WINDOW > 0 ? t->pos + 1 - SWA_WINDOW : 0));
        } else {
            CHECK_EQ_INT(t->n, 0);
        }
    }
    for (int32_t i = 0; i < m->n_parked; i++) { /* parked turns hold their window */
        const dp_kv_wtab *t = kv_seq_wtab(&m->parked[i].kv);
        for (int32_t j = t->lo; j < t->n; j++)
            cnt[t->blocks[j]]++;
        CHECK_EQ_INT(t->promise, 0);
        CHECK_EQ_INT(t->pos, m->parked[i].n);
    }
    check_pool("sliding pool", &m->swa.pool, cnt);
    CHECK_EQ_INT(m->swa.reserved, promised);
    CHECK(m->swa.reserved <= kv_pool_n_free(&m->swa.pool));
    free(cnt);
}

static void check(world *w)
{
    dp_kv_mgr *m = &w->m;
    const bool split = m->dpool != &m->pool;
    int32_t *pcnt = calloc((size_t)m->pool.n_blocks, sizeof *pcnt);
    int32_t *dcnt = split ? calloc((size_t)m->dpool->n_blocks, sizeof *dcnt) : pcnt;
    CHECK(pcnt && dcnt);
    int64_t promised = 0, swapped = 0;
    for (int i = 0; i < N_SEQ; i++) {
        if (w->s[i].st == FREE)
            continue;
        check_grouped(m, &w->s[i].kv);
        count_seq(m, pcnt, dcnt, &w->s[i].kv);
        /* (A negative promise would lower the others'.) */
        CHECK_MSG(w->s[i].kv.decode_reserve >= 0, "a promise of %d decode blocks",
                  w->s[i].kv.decode_reserve);
        promised += w->s[i].kv.decode_reserve;
        swapped += w->s[i].kv.swapped.n_blocks;
    }
    for (int32_t i = 0; i < m->n_parked; i++) {
        check_grouped(m, &m->parked[i].kv);
        count_seq(m, pcnt, dcnt, &m->parked[i].kv);
        promised += m->parked[i].kv.decode_reserve;
        swapped += m->parked[i].kv.swapped.n_blocks;
    }
    /* The swap space holds the copies of swapped-out and spilled caches. */
    if (m->has_swap) {
        CHECK_EQ_INT(m->swap.used_bytes, swapped * (int64_t)m->swap.block_bytes);
        CHECK_EQ_INT(kv_pool_n_used(&m->swap.slots), swapped);
    }
    for (int32_t i = 0; m->dpx.e && i < m->dpx.max_entries; i++) {
        const dp_dprefix_entry *x = &m->dpx.e[i];
        if (x->name)
            for (int32_t b = 0; b < x->n_slots / m->dpx.block_tokens; b++)
                dcnt[x->blocks[b]]++;
    }
    check_held(w);
    if (m->has_swa)
        check_swa(w);
    check_pool("prefill pool", &m->pool, pcnt);
    if (split)
        check_pool("decode pool", m->dpool, dcnt);
    CHECK_EQ_INT(m->decode_reserved, promised);
    CHECK_MSG(kv_pool_n_free(m->dpool) + kv_mgr_parked_blocks(m) >= m->decode_reserved,
              "free %d + parked %d < promised %d", kv_pool_n_free(m->dpool),
              kv_mgr_parked_blocks(m), m->decode_reserved);
    free(pcnt);
    if (split)
        free(dcnt);
}

/* ---- the calls, as the scheduler and the engine make them ---------------------- */

static bool others_running(const world *w, const pseq *q)
{
    for (int i = 0; i < N_SEQ; i++)
        if (&w->s[i] != q && w->s[i].st == RUNNING)
            return true;
    return false;
}

static void new_token(world *w, pseq *q)
{
    if (q->n_tokens < MAX_TOK)
        q->tok[q->n_tokens++] = 3000 + (int32_t)rnd(w, 5000);
}

/* A new request: a new conversation (half of them behind one system prompt)
 * or the next turn of one whose last turn ended. */
static void start(world *w, pseq *q)
{
    const setup *su = w->su;
    /* Whole prompts on a grouped type: a system prompt long enough for
     * whole groups (kvcache/gshare.h shares them). */
    const int32_t sys = dp_kv_type_grouped(su->dtype) && su->keep == 1.0f ? 4 * SYS : SYS;
    int ci = (int)rnd(w, N_CONV);
    conv *c = &w->c[ci];
    if (c->busy)
        return;
    dp_compress_opts co = {DP_SCORER_KNORM, su->keep > 0 ? su->keep : 0.5f, 4, 8, 0, 0};
    int32_t n = 0;
    if (c->n > 0 && c->n + 80 < MAX_TOK - 64 && rnd(w, 3) > 0) { /* its next turn */
        memcpy(q->tok, c->tok, (size_t)c->n * sizeof *q->tok);
        n = c->n;
        /* Now and then the client sends the reply back shorter than it was
         * generated (a template renders it otherwise): the match ends
         * inside the parked cache. */
        if (rnd(w, 2) == 0)
            n -= (int32_t)rnd(w, n < 64 ? (uint64_t)n / 2 + 1 : 64);
    } else {
        c->n = 0;
        if (rnd(w, 2)) { /* the shared system prompt */
            for (; n < sys; n++)
                q->tok[n] = 10 + n;
            co.prefix = sys;
        }
    }
    int32_t add = 8 + (int32_t)rnd(w, 120);
    for (int32_t k = 0; k < add; k++)
        q->tok[n++] = 200 + (int32_t)rnd(w, 2000);
    if (c->n > 0 && n > sys && q->tok[0] == 10)
        co.prefix = sys;
    q->n_tokens = q->n_prompt = n;
    q->n_computed = 0;
    q->max_new = 1 + (int32_t)rnd(w, 60);
    q->conv = ci;
    c->busy = true;
    kv_seq_init(&q->kv, su->dual, &co);
    q->kv.whole_if_room = c->n > 0;
    q->st = WAITING;
}

static void admit(world *w, pseq *q)
{
    const bool swapped = q->kv.swapped.slots != NULL;
    int32_t reused = 0;
    const bool busy = others_running(w, q);
    CHECK(!swapped || kv_mgr_admit(&w->m, &q->kv, q->tok, q->n_tokens, 1, busy, &reused) == DP_EINVAL);
    if (swapped ? kv_mgr_swap_in(&w->m, &q->kv, busy) != 0
                : kv_mgr_admit(&w->m, &q->kv, q->tok, q->n_tokens, 1, busy, &reused) != 0)
        return;
    if (!swapped)
        q->n_computed = reused;
    q->st = RUNNING;
    w->ops[q->kv.path == DP_PATH_DECODE && !swapped && reused > 0 ? OP_RESUME : OP_ADMIT]++;
}

static void end_seq(world *w, pseq *q, bool finished)
{
    conv *c = &w->c[q->conv];
    if (finished && q->st == RUNNING) {
        if (kv_mgr_park(&w->m, &q->kv, q->tok, q->n_computed))
            w->ops[OP_PARK]++;
        else {
            kv_mgr_keep_reply(&w->m, &q->kv, q->tok, q->n_computed);
            w->ops[OP_REPLY]++;
        }
        memcpy(c->tok, q->tok, (size_t)q->n_tokens * sizeof *c->tok);
        c->n = q->n_tokens;
    } else {
        kv_seq_forget_reply(&q->kv);
        c->n = 0;
        w->ops[OP_CANCEL]++;
    }
    kv_mgr_free(&w->m, &q->kv);
    kv_seq_destroy(&q->kv);
    c->busy = false;
    q->st = FREE;
}

static void compact(world *w, pseq *q, int32_t n_keep, int32_t pos, int op)
{
    dp_kv_migration g = {.kv = &q->kv, .tokens = q->tok, .n_keep = n_keep, .pos = pos,
                         .share_kept = op == OP_MIGRATE && rnd(w, 2)};
    kv_mgr_migrate(&w->m, &g, 1);
    if (g.rc == 0)
        w->ops[op]++;
    if (g.lost)
        end_seq(w, q, false);
}

/* One step of a running sequence: a chunk of its prompt (or recompute),
 * compacted where it ends; or one decode token. */
static void step(world *w, pseq *q)
{
    dp_kv_mgr *m = &w->m;
    dp_kv_seq *kv = &q->kv;
    const bool decode = q->n_tokens - q->n_computed == 1 && q->n_computed >= q->n_prompt;
    int32_t n = decode ? 1 : 1 + (int32_t)rnd(w, (uint32_t)(q->n_tokens - q->n_computed));
    if (w->su->swa_blocks && n > SWA_CHUNK) /* (the scheduler's chunk at most) */
        n = SWA_CHUNK;
    if (kv_mgr_grow(m, kv, n) != 0) {
        /* No room: it yields its own blocks, as the scheduler's last resort. */
        if (kv_mgr_swap_out(m, kv) == 0)
            w->ops[OP_SWAP_OUT]++;
        else {
            q->n_computed = 0;
            w->ops[OP_RECOMPUTE]++;
        }
        q->st = WAITING;
        return;
    }
    kv_mgr_commit(m, kv, q->tok, n);
    q->n_computed += n;
    w->ops[decode ? OP_DECODE : OP_PREFILL]++;
    if (q->n_computed < q->n_tokens)
        return;
    /* A prompt's end: the migration, or a resumed turn's compaction on the
     * decode path; a decode step past the budget: a recompression. */
    if (!decode && kv->path == DP_PATH_PREFILL && kv->dual && m->dual)
        compact(w, q, kv_mgr_migration_keep(m, kv, kv->n_slots), 0, OP_MIGRATE);
    else if (!decode && kv->path == DP_PATH_DECODE) {
        int32_t k = kv_mgr_prompt_end_keep(m, kv, q->n_prompt);
        if (k < kv->n_slots)
            compact(w, q, k, q->n_computed, OP_MIGRATE);
    } else if (decode && kv_mgr_over_budget(m, kv))
        compact(w, q, kv_mgr_budget_keep(m, kv), 0, OP_RECOMPRESS);
    if (q->st != RUNNING)
        return;
    if (q->n_tokens - q->n_prompt >= q->max_new || q->n_tokens >= MAX_TOK - 1)
        end_seq(w, q, true);
    else
        new_token(w, q);
}

static void act(world *w)
{
    pseq *q = &w->s[rnd(w, N_SEQ)];
    uint32_t r = rnd(w, 100);
    switch (q->st) {
    case FREE:
        start(w, q);
        break;
    case WAITING:
        if (r < 95)
            admit(w, q);
        else
            end_seq(w, q, false);
        break;
    case RUNNING:
        if (r < 90)
            step(w, q);
        else if (r < 97) { /* preempted for someone else */
            if (kv_mgr_swap_out(&w->m, &q->kv) == 0)
                w->ops[OP_SWAP_OUT]++;
            else {
                q->n_computed = 0;
                w->ops[OP_RECOMPUTE]++;
            }
            q->st = WAITING;
        } else
            end_seq(w, q, r < 99);
        break;
    }
}

/* ---- the managers ------------------------------------------------------------ */

static void run(const setup *su, uint64_t seed, int64_t steps)
{
    world *w = calloc(1, sizeof *w);
    CHECK(w != NULL);
    w->su = su;
    w->rng = seed;
    char err[256];
    CHECK(backend_create(&w->be, "cpu", 1, err, sizeof err) == 0);
    dp_kv_mgr_opts o = {
        .prefill = {.n_layers = 2, .n_kv_heads = 1, .head_dim = 64, .block_tokens = BT,
                    .n_blocks = su->n_blocks, .type = DP_KV_F16},
        .dual = su->dual, .prefill_fraction = 0.25, .prefix_cache = true, .reuse_replies = true,
        .n_layers = 2, .n_kv_heads = 1, .n_heads = 2, .head_dim = 64,
        .max_parked = su->dual ? 4 : 0, .exempt_layers = su->exempt,
        .decode_budget = su->budget, .budget_floor = 12,
        /* A small swap space: it fills, and a preempted cache is recomputed. */
        .swap_bytes = (int64_t)su->n_blocks * 4096,
    };
    if (su->swa_blocks) {
        o.swa = o.prefill;
        o.swa.n_layers = 3;
        o.swa.n_blocks = su->swa_blocks;
        o.swa_window = SWA_WINDOW;
        o.swa_chunk = SWA_CHUNK;
        o.prefix_cache = o.reuse_replies = false;
        o.swap_bytes = 0;
    }
    o.decode = o.prefill;
    o.decode.type = su->dtype;
    o.decode.n_blocks = su->n_dblocks;
    CHECK_MSG(kv_mgr_init(&w->m, w->be, &o, err, sizeof err) == 0, "%s: %s", su->name, err);
    for (int64_t i = 0; i < steps; i++) {
        act(w);
        check(w);
    }
    for (int i = 0; i < N_SEQ; i++) /* everything ends */
        if (w->s[i].st != FREE)
            end_seq(w, &w->s[i], w->s[i].st == RUNNING);
    check(w);
    CHECK_EQ_INT(w->m.decode_reserved, 0);
    CHECK_EQ_INT(kv_pool_n_used(w->m.dpool), kv_mgr_parked_blocks(&w->m));
    if (su->swa_blocks) {
        int32_t parked = 0;
        for (int32_t i = 0; i < w->m.n_parked; i++)
            parked += swa_held(&w->m.parked[i].kv.w);
        CHECK_EQ_INT(kv_pool_n_used(&w->m.swa.pool), parked);
        CHECK_EQ_INT(w->m.swa.reserved, 0);
    }
    if (w->m.dpool != &w->m.pool)
        CHECK_EQ_INT(kv_pool_n_used(&w->m.pool), 0);
    printf("%s:", su->name);
    for (int k = 0; k < OP_N; k++)
        printf(" %s %lld", OP_NAMES[k], (long long)w->ops[k]);
    printf(", parked at the end %d\n", w->m.n_parked);
    /* A property test whose calls never reach the paths it is about proves
     * nothing: each manager must have migrated, swapped and decoded. */
    CHECK(w->ops[OP_DECODE] > 0 && w->ops[OP_SWAP_OUT] + w->ops[OP_RECOMPUTE] > 0);
    if (su->dual)
        CHECK(w->ops[OP_MIGRATE] > 0 && w->ops[OP_PARK] > 0 && w->ops[OP_RESUME] > 0);
    if (su->budget)
        CHECK(w->ops[OP_RECOMPRESS] > 0);
    if (dp_kv_type_grouped(su->dtype)) {
        printf("%s: groups sealed %lld, %lld of them shared\n", su->name,
               (long long)w->m.sealed_groups, (long long)w->m.gs.hits);
        CHECK(w->m.sealed_groups > 0);
        /* Whole prompts (keep 1) behind the system prompt seal its groups
         * from the same named prefill blocks: some are taken. */
        if (su->keep == 1.0f)
            CHECK(w->m.gs.hits > 0);
    }
    kv_mgr_destroy(&w->m);
    backend_destroy(w->be);
    free(w);
}

int main(void)
{
    const char *se = getenv("DP_PROP_SEED"), *st = getenv("DP_PROP_STEPS");
    uint64_t seed = se ? strtoull(se, NULL, 0) : 20261206;
    int64_t steps = st ? strtoll(st, NULL, 0) : 8000;
    static const setup setups[] = {
        {"dualpath off", false, DP_KV_F16, 48, 0, 0, 0, 0, 0},
        {"one arena, f16", true, DP_KV_F16, 48, 0, 0, 0, 0, 0},
        {"one arena, q8_0 decode", true, DP_KV_Q8_0, 48, 0, 0, 0, 0, 0},
        {"one arena, q8_0 decode, 1 exempt layer", true, DP_KV_Q8_0, 48, 0, 1, 0, 0, 0},
        {"split pools", true, DP_KV_F16, 40, 24, 0, 0, 0, 0},
        {"one arena, q8_0 decode, budget 48", true, DP_KV_Q8_0, 48, 0, 0, 48, 0, 0},
        {"one arena, kivi4 decode", true, DP_KV_KIVI4, 48, 0, 0, 0, 0, 0},
        /* Every token kept: the prompt's blocks taken by reference, more
         * of them than its groups come to. */
        {"one arena, kivi4 decode, keep 1", true, DP_KV_KIVI4, 64, 0, 0, 0, 1.0f, 0},
        /* Sliding layers apart, in a pool smaller than ten windows. */
        {"dualpath off, sliding layers apart", false, DP_KV_F16, 48, 0, 0, 0, 0, 30},
        {"one arena, kivi4 decode, sliding layers apart", true, DP_KV_KIVI4, 64, 0, 0, 0, 0, 30},
        {"one arena, q8_0 decode, budget 48, sliding layers apart", true, DP_KV_Q8_0, 48, 0, 0,
         48, 0, 30},
    };
    for (size_t i = 0; i < sizeof setups / sizeof setups[0]; i++)
        run(&setups[i], seed + i, steps);
    T_DONE("test_manager_prop");
}
