/* test_manager.c: the KV manager's accounting without a backend: the one
 * need formula, admission and growth in one arena shared by both paths
 * (the decode promises of others are never taken), the fallback of a
 * sequence too long to migrate to running whole, and split pools; with the
 * CPU backend, the decode-pool share of a prefix kept whole and of a whole
 * compaction (dprefix.h). */
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "kvcache/manager.h"
#include "t.h"

enum { BT = 16 };

static const dp_compress_opts CO = {DP_SCORER_SNAPKV, 0.5f, 4, 4, 0, 0};

static void mgr(dp_kv_mgr *m, bool dual, int32_t n_blocks, int32_t n_dblocks)
{
    dp_kv_mgr_opts o = {.prefill = {.block_tokens = BT, .n_blocks = n_blocks},
                        .decode = {.block_tokens = BT, .n_blocks = n_dblocks},
                        .dual = dual, .prefill_fraction = 0.25};
    char err[128];
    CHECK_MSG(kv_mgr_init(m, NULL, &o, err, sizeof err) == 0, "%s", err);
}

static void test_need(void)
{
    dp_kv_mgr m;
    mgr(&m, true, 64, 0);
    CHECK(m.shared);
    dp_kv_seq whole, dual;
    kv_seq_init(&whole, false, &CO);
    kv_seq_init(&dual, true, &CO);
    dp_kv_need n = kv_mgr_need(&m, &whole, 100, 30); /* 130 tokens whole */
    CHECK_EQ_INT(n.prefill, 9);
    CHECK_EQ_INT(n.decode, 0);
    n = kv_mgr_need(&m, &dual, 100, 30); /* the prompt, then 50 kept + 30 */
    CHECK_EQ_INT(n.prefill, 7);
    CHECK_EQ_INT(n.decode, 5);
    n = kv_mgr_need(&m, &dual, 6, 0); /* below the floor sinks + window: all kept */
    CHECK_EQ_INT(n.decode, 1);
    /* A prefix of 32 kept whole: 32 + 34 of the other 68 kept, + 30; its
     * two blocks stay the prefill path's (by reference) in one arena. */
    dp_kv_seq pre;
    dp_compress_opts co = CO;
    co.prefix = 32;
    kv_seq_init(&pre, true, &co);
    CHECK_EQ_INT(compress_n_keep(&co, 100), 66);
    CHECK_EQ_INT(compress_n_keep(&co, 20), 20);
    n = kv_mgr_need(&m, &pre, 100, 30);
    CHECK_EQ_INT(n.prefill, 7);
    CHECK_EQ_INT(n.decode, 6 - 2);
    kv_seq_destroy(&pre);
    kv_seq_destroy(&whole);
    kv_seq_destroy(&dual);
    kv_mgr_destroy(&m);
}

static void test_shared_arena(void)
{
    dp_kv_mgr m;
    mgr(&m, true, 20, 0);
    int32_t toks[200];
    for (int i = 0; i < 200; i++)
        toks[i] = i;
    dp_kv_seq a, b, c;
    kv_seq_init(&a, true, &CO);
    kv_seq_init(&b, false, &CO);
    kv_seq_init(&c, true, &CO);
    int32_t reused = -1;
    /* a: 7 prompt blocks, and a promise of 5 (50 kept + one block). */
    CHECK(kv_mgr_admit(&m, &a, toks, 100, 1, false, &reused) == 0);
    CHECK_EQ_INT(reused, 0);
    CHECK_EQ_INT(a.table.n_blocks, 7);
    CHECK_EQ_INT(m.decode_reserved, 5);
    /* b (whole): 101 slots in 7 blocks of the 8 not promised. */
    CHECK(kv_mgr_admit(&m, &b, toks, 100, 1, true, &reused) == 0);
    CHECK_EQ_INT(kv_pool_n_free(&m.pool), 6);
    /* c needs 7 + 5 (+ the watermark): refused, nothing taken. */
    CHECK(kv_mgr_admit(&m, &c, toks, 100, 1, true, &reused) == DP_ENOSPC);
    CHECK_EQ_INT(c.table.n_blocks, 0);
    CHECK_EQ_INT(kv_pool_n_free(&m.pool), 6);
    /* b grows into the one block nobody was promised, then stops. */
    kv_mgr_commit(&m, &b, toks, 100);
    CHECK(kv_mgr_grow(&m, &b, 13) == 0); /* 113 slots: an 8th block */
    kv_mgr_commit(&m, &b, toks, 13);
    CHECK(kv_mgr_grow(&m, &b, 16) == DP_ENOSPC); /* a 9th would take a's promise */
    /* Freed, everything comes back. */
    kv_mgr_free(&m, &a);
    kv_mgr_free(&m, &b);
    CHECK_EQ_INT(m.decode_reserved, 0);
    CHECK_EQ_INT(kv_pool_n_free(&m.pool), 20);
    /* A preempted prefill-path sequence has nothing to swap: it is freed. */
    CHECK(kv_mgr_admit(&m, &c, toks, 100, 1, false, &reused) == 0);
    CHECK(kv_mgr_swap_out(&m, &c) == DP_ENOSPC);
    CHECK_EQ_INT(kv_pool_n_free(&m.pool), 20);
    CHECK_EQ_INT(m.decode_reserved, 0);
    kv_seq_destroy(&a);
    kv_seq_destroy(&b);
    kv_seq_destroy(&c);
    kv_mgr_destroy(&m);
}

/* A prompt whose whole cache and compressed copy cannot both fit runs whole:
 * dualpath never caps the context below what dualpath off serves. */
static void test_too_long_to_migrate(void)
{
    dp_kv_mgr m;
    mgr(&m, true, 10, 0);
    int32_t toks[160] = {0};
    dp_kv_seq s;
    kv_seq_init(&s, true, &CO);
    CHECK(!kv_mgr_fits(&m, kv_mgr_need(&m, &s, 150, 1)));
    CHECK(kv_mgr_can_fit(&m, &s, 150, 1));
    CHECK(!kv_mgr_can_fit(&m, &s, 160, 1));
    int32_t reused;
    CHECK(kv_mgr_admit(&m, &s, toks, 150, 1, false, &reused) == 0);
    CHECK(!s.dual);
    CHECK_EQ_INT(s.table.n_blocks, 10);
    CHECK_EQ_INT(m.decode_reserved, 0);
    kv_mgr_free(&m, &s);
    kv_seq_destroy(&s);
    kv_mgr_destroy(&m);
}

/* Split pools (the decode pool's size given): each path counts its own. */
static void test_split(void)
{
    dp_kv_mgr m;
    mgr(&m, true, 8, 6);
    CHECK(!m.shared);
    CHECK(m.dpool != &m.pool);
    dp_kv_seq s;
    kv_seq_init(&s, true, &CO);
    CHECK(kv_mgr_fits(&m, kv_mgr_need(&m, &s, 100, 30)));  /* 7 + 5 */
    dp_compress_opts co = CO;
    co.prefix = 32; /* copied with split pools: 66 + 30 in 6 blocks */
    dp_kv_seq pre;
    kv_seq_init(&pre, true, &co);
    CHECK_EQ_INT(kv_mgr_need(&m, &pre, 100, 30).decode, 6);
    kv_seq_destroy(&pre);
    CHECK(!kv_mgr_fits(&m, kv_mgr_need(&m, &s, 100, 60))); /* 7 + 7 > 6 */
    int32_t toks[100] = {0}, reused;
    CHECK(kv_mgr_admit(&m, &s, toks, 100, 1, false, &reused) == 0);
    CHECK_EQ_INT(kv_pool_n_free(&m.pool), 1);
    CHECK_EQ_INT(kv_pool_n_free(m.dpool), 6); /* promised, not taken */
    CHECK_EQ_INT(m.decode_reserved, 5);
    kv_mgr_free(&m, &s);
    CHECK_EQ_INT(m.decode_reserved, 0);
    kv_seq_destroy(&s);
    kv_mgr_destroy(&m);
}


/* The CPU backend and a manager over one arena of 64 blocks of the given
 * prefill type (2 layers, 1 KV head of 32 values), its decode path q8_0
 * through a view of it. */
static dp_backend *q8_mgr(dp_kv_mgr *m, dp_kv_type type)
{
    char err[128];
    dp_backend *be;
    CHECK(backend_create(&be, "cpu", 1, err, sizeof err) == 0);
    dp_kv_mgr_opts o = {
        .prefill = {.n_layers = 2, .n_kv_heads = 1, .head_dim = 32, .block_tokens = BT,
                    .n_blocks = 64, .type = type},
        .dual = true, .prefill_fraction = 0.25,
        .n_layers = 2, .n_kv_heads = 1, .n_heads = 2, .head_dim = 32,
        /* for sequences with early_end set (test_early_plan) */
        .early_min = 32, .early_chunk = 64,
    };
    o.decode = o.prefill;
    o.decode.n_blocks = 0;
    o.decode.type = DP_KV_Q8_0;
    CHECK_MSG(kv_mgr_init(m, be, &o, err, sizeof err) == 0, "%s", err);
    return be;
}

/* A q8_0 decode path in one f16 arena cannot hold prefill blocks: a's
 * migration copies its 100-token prefix's whole decode blocks and names
 * them; b, admitted while a holds them, is promised that many blocks fewer
 * and joins the share at once, so the share outlives a (freed before b
 * migrates) and b's migration takes those very blocks. When b ends too,
 * every block and promise comes back. */
static void test_decode_share(void)
{
    dp_kv_mgr m;
    dp_backend *be = q8_mgr(&m, DP_KV_F16);
    CHECK(m.shared && !m.by_ref && m.share_front);
    const int32_t dbt = m.dbt, s = 100 / dbt * dbt;
    CHECK(dbt > BT && s >= dbt);
    int32_t ta[140], tb[140];
    for (int i = 0; i < 140; i++) {
        ta[i] = i < 100 ? i : 1000 + i;
        tb[i] = i < 100 ? i : 2000 + i;
    }
    dp_compress_opts co = CO;
    co.prefix = 100;
    dp_kv_seq a, b;
    kv_seq_init(&a, true, &co);
    kv_seq_init(&b, true, &co);
    int32_t reused;
    CHECK(kv_mgr_admit(&m, &a, ta, 140, 1, false, &reused) == 0);
    kv_mgr_commit(&m, &a, ta, 140);
    const int32_t keep = compress_n_keep(&co, 140);
    dp_kv_migration g = {.kv = &a, .tokens = ta, .n_keep = keep};
    CHECK_EQ_INT(kv_mgr_migrate(&m, &g, 1), 1);
    CHECK_EQ_INT(g.n_ref, 0); /* the first copies */
    CHECK(share_held(a.dshare) && a.ref_blocks == s / dbt);
    CHECK_EQ_INT(m.dpx.live_blocks, s / dbt);
    /* b: promised its compressed size less the share, plus a block. */
    const int32_t before = m.decode_reserved;
    CHECK(kv_mgr_admit(&m, &b, tb, 140, 1, true, &reused) == 0);
    CHECK(share_held(b.dshare));
    CHECK_EQ_INT(dprefix_slots(&m.dpx, share_id(b.dshare)), s);
    CHECK_EQ_INT(m.decode_reserved - before, (keep + dbt + dbt - 1) / dbt - s / dbt);
    CHECK(share_eq(b.dshare, a.dshare));
    int32_t shared[8];
    memcpy(shared, a.table.blocks, (size_t)(s / dbt) * sizeof *shared);
    kv_mgr_free(&m, &a); /* the share stays: b was admitted on it */
    CHECK_EQ_INT(m.dpx.live_blocks, s / dbt);
    kv_mgr_commit(&m, &b, tb, 140);
    g = (dp_kv_migration){.kv = &b, .tokens = tb, .n_keep = keep};
    CHECK_EQ_INT(kv_mgr_migrate(&m, &g, 1), 1);
    CHECK_EQ_INT(g.n_ref, s);
    CHECK(memcmp(b.table.blocks, shared, (size_t)(s / dbt) * sizeof *shared) == 0);
    kv_mgr_free(&m, &b);
    CHECK_EQ_INT(m.dpx.live_blocks, 0);
    CHECK_EQ_INT(m.decode_reserved, 0);
    CHECK_EQ_INT(kv_pool_n_free(&m.pool), m.pool.n_blocks);
    kv_seq_destroy(&a);
    kv_seq_destroy(&b);
    kv_mgr_destroy(&m);
    backend_destroy(be);
}

/* Fills each of t's first n blocks with floats from seed (a prompt's K/V
 * computed by hand): equal seeds give equal caches. */
static void fill_blocks(dp_backend *be, dp_kv_mgr *m, const dp_block_table *t, int32_t n,
                        uint32_t seed)
{
    const size_t nf = m->prefill_block_bytes / sizeof(float);
    float *buf = malloc(m->prefill_block_bytes);
    CHECK(buf != NULL);
    for (int32_t b = 0; buf && b < n; b++) {
        for (size_t i = 0; i < nf; i++) {
            seed = seed * 1664525u + 1013904223u;
            buf[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
        }
        CHECK(be->ops->kv_block_write(be, m->store, t->blocks[b], buf) == 0);
    }
    free(buf);
}

/* A kept share (dprefix.h): a, marked share_kept, names the whole decode
 * blocks of its compaction with its kept lists; b, with the same tokens and
 * settings, keeps the same slots without selecting again, takes those
 * blocks and copies only its last partial block; so does c, whose K/V
 * differ (a share is keyed by tokens and settings: equal tokens make equal
 * K/V in the engine). When all end, every block, share and promise comes
 * back. */
static void test_kept_share(void)
{
    dp_kv_mgr m;
    dp_backend *be = q8_mgr(&m, DP_KV_F32);
    const int32_t dbt = m.dbt;
    int32_t tok[140];
    for (int i = 0; i < 140; i++)
        tok[i] = 7 * i + 3;
    dp_compress_opts co = CO;
    co.scorer = DP_SCORER_KNORM; /* from the K/V alone */
    const int32_t keep = compress_n_keep(&co, 140), kslots = (keep - 1) / dbt * dbt;
    CHECK(kslots >= dbt);
    dp_kv_seq s[3];
    const uint32_t seeds[3] = {11, 11, 12};
    int32_t reused;
    for (int i = 0; i < 3; i++) {
        kv_seq_init(&s[i], true, &co);
        CHECK(kv_mgr_admit(&m, &s[i], tok, 140, 1, i > 0, &reused) == 0);
        kv_mgr_commit(&m, &s[i], tok, 140);
        fill_blocks(be, &m, &s[i].table, s[i].table.n_blocks, seeds[i]);
    }
    dp_kv_migration g = {.kv = &s[0], .tokens = tok, .n_keep = keep, .share_kept = true};
    CHECK_EQ_INT(kv_mgr_migrate(&m, &g, 1), 1);
    CHECK_EQ_INT(g.n_ref, 0);
    CHECK(share_held(s[0].kshare));
    CHECK_EQ_INT(m.dpx.live_blocks, kslots / dbt);
    g = (dp_kv_migration){.kv = &s[1], .tokens = tok, .n_keep = keep};
    CHECK_EQ_INT(kv_mgr_migrate(&m, &g, 1), 1);
    CHECK_EQ_INT(g.n_ref, kslots);
    CHECK(share_eq(s[1].kshare, s[0].kshare));
    CHECK(memcmp(s[1].table.blocks, s[0].table.blocks, (size_t)(kslots / dbt) * sizeof(int32_t)) == 0);
    CHECK(s[1].table.blocks[kslots / dbt] != s[0].table.blocks[kslots / dbt]);
    g = (dp_kv_migration){.kv = &s[2], .tokens = tok, .n_keep = keep};
    CHECK_EQ_INT(kv_mgr_migrate(&m, &g, 1), 1);
    CHECK_EQ_INT(g.n_ref, kslots);
    CHECK_EQ_INT(m.kept_shared, 2);
    CHECK_EQ_INT(m.dpx.live_blocks, kslots / dbt);
    /* a ends first: the share lives on for b. */
    kv_mgr_free(&m, &s[0]);
    CHECK_EQ_INT(m.dpx.live_blocks, kslots / dbt);
    kv_mgr_free(&m, &s[1]);
    kv_mgr_free(&m, &s[2]);
    CHECK_EQ_INT(m.dpx.live_blocks, 0);
    CHECK_EQ_INT(m.decode_reserved, 0);
    CHECK_EQ_INT(kv_pool_n_free(&m.pool), m.pool.n_blocks);
    for (int i = 0; i < 3; i++)
        kv_seq_destroy(&s[i]);
    kv_mgr_destroy(&m);
    backend_destroy(be);
}

/* compress_turns = auto: a later chat turn (whole_if_room) runs whole while
 * one arena holds it whole (with 4 blocks of reply) beside what others hold,
 * were promised and protect (the prompts of running turns, kept for their
 * next turns), and is compressed once it would have to take those; a turn
 * not admitted, or preempted, is decided again at its next admission. */
static void test_whole_if_room(void)
{
    dp_kv_mgr m;
    mgr(&m, true, 64, 0);
    int32_t tok[480];
    for (int i = 0; i < 480; i++)
        tok[i] = i;
    dp_kv_seq s[4];
    for (int i = 0; i < 4; i++) {
        kv_seq_init(&s[i], true, &CO);
        s[i].whole_if_room = true;
    }
    int32_t reused;
    /* 100 tokens: 7 blocks, 11 with the reply's 4, of 64: whole. */
    CHECK(kv_mgr_admit(&m, &s[0], tok, 100, 1, false, &reused) == 0);
    CHECK(!s[0].dual);
    CHECK_EQ_INT(m.decode_reserved, 0);
    /* 400 tokens: 26 blocks (29 with the reply) of the 57 left: whole. */
    CHECK(kv_mgr_admit(&m, &s[1], tok + 80, 400, 1, true, &reused) == 0);
    CHECK(!s[1].dual);
    /* 20 of the 31 free blocks protected: 11 left for a turn run whole. */
    int32_t np = 0;
    for (int32_t b = 0; b < m.pool.n_blocks && np < 20; b++)
        if (m.pool.refcnt[b] == 0) {
            kv_pool_protect(&m.pool, b);
            np++;
        }
    CHECK_EQ_INT(m.pool.n_warm, 20);
    /* 120 tokens would take 12 whole: compressed instead (8 prompt blocks,
     * a promise of 5, the watermark: 14 of the 31 free). */
    CHECK(kv_mgr_admit(&m, &s[2], tok + 200, 120, 1, true, &reused) == 0);
    CHECK(s[2].dual);
    CHECK(m.decode_reserved > 0);
    /* 480 tokens fit neither way: not admitted, and still to be decided. */
    CHECK(kv_mgr_admit(&m, &s[3], tok, 480, 1, true, &reused) == DP_ENOSPC);
    CHECK(s[3].dual);
    /* A whole turn preempted (to be recomputed) is decided again too. */
    CHECK(kv_mgr_swap_out(&m, &s[0]) == DP_ENOSPC);
    CHECK(s[0].dual);
    for (int i = 0; i < 4; i++) {
        kv_mgr_free(&m, &s[i]);
        kv_seq_destroy(&s[i]);
    }
    CHECK_EQ_INT(m.decode_reserved, 0);
    kv_mgr_destroy(&m);
}

/* A predicted early switch (kv_seq.early_at): with the q8_0 decode path a
 * 400-token repetitive prompt switching by token 95 (early_min 32, chunks
 * of 64) needs 6 prefill blocks and a promise of 15 decode blocks (its
 * whole prompt and a block, 30 q8_0 tokens each): 21 instead of 25 + 8.
 * Not planned past its prompt (a recompute) nor where it does not pay; an
 * unplanned switch is allowed only when its blocks are free. */
static void test_early_plan(void)
{
    dp_kv_mgr m;
    dp_backend *be = q8_mgr(&m, DP_KV_F16);
    CHECK_EQ_INT(m.dbt, 30);
    static int32_t tok[600];
    for (int i = 0; i < 600; i++)
        tok[i] = i;
    dp_kv_seq a, b, c, d;
    kv_seq_init(&a, true, &CO);
    kv_seq_init(&b, true, &CO);
    kv_seq_init(&c, true, &CO);
    kv_seq_init(&d, false, &CO);
    a.early_end = 400;
    int32_t reused;
    CHECK(kv_mgr_admit(&m, &a, tok, 400, 1, false, &reused) == 0);
    CHECK_EQ_INT(a.early_at, 95);
    CHECK_EQ_INT(a.table.n_blocks, 6);
    CHECK_EQ_INT(m.decode_reserved, 15);
    kv_mgr_commit(&m, &a, tok, 95);
    CHECK(kv_mgr_can_switch_early(&m, &a)); /* from its promise */
    /* A recompute: 100 prompt tokens and 300 generated; the switch point
     * would be past its prompt: nothing planned. */
    b.early_end = 90;
    CHECK(kv_mgr_admit(&m, &b, tok + 100, 400, 1, true, &reused) == 0);
    CHECK_EQ_INT(b.early_at, 0);
    CHECK_EQ_INT(b.table.n_blocks, 25);
    kv_mgr_commit(&m, &b, tok + 100, 300);
    /* b's unplanned switch (300 slots: 10 decode blocks, 8 of them its
     * promise for 200 kept and a block) finds room, until a whole sequence
     * takes the arena's rest. */
    CHECK(kv_mgr_can_switch_early(&m, &b));
    const int32_t left = kv_pool_n_free(&m.pool) - m.decode_reserved;
    CHECK(kv_mgr_admit(&m, &d, tok, left * BT - 1, 1, true, &reused) == 0);
    CHECK(!kv_mgr_can_switch_early(&m, &b));
    CHECK(kv_mgr_can_switch_early(&m, &a));
    kv_mgr_free(&m, &d);
    /* A short prompt: its switch point is past its end. */
    c.early_end = 80;
    CHECK(kv_mgr_admit(&m, &c, tok + 300, 80, 1, true, &reused) == 0);
    CHECK_EQ_INT(c.early_at, 0);
    dp_kv_seq *all[] = {&a, &b, &c, &d};
    for (int i = 0; i < 4; i++) {
        kv_mgr_free(&m, all[i]);
        kv_seq_destroy(all[i]);
    }
    CHECK_EQ_INT(m.decode_reserved, 0);
    CHECK_EQ_INT(kv_pool_n_free(&m.pool), m.pool.n_blocks);
    kv_mgr_destroy(&m);
    backend_destroy(be);
}

/* Sliding-window layers apart (kvcache/swa.h; window 64, chunks of 32 at
 * most, blocks of 16): a sequence holds at most its window and a step's
 * tokens of them however long it runs, a prompt is promised that at
 * admission, its promise goes when the prompt is done, and everything is
 * free again at the end. */
static void test_swa(void)
{
    dp_kv_mgr m;
    dp_kv_mgr_opts o = {.prefill = {.block_tokens = BT, .n_blocks = 256},
                        .decode = {.block_tokens = BT},
                        .swa = {.n_layers = 5, .n_kv_heads = 1, .head_dim = 64,
                                .block_tokens = BT, .n_blocks = 20, .type = DP_KV_F16},
                        .swa_window = 64, .swa_chunk = 32};
    char err[160];
    /* Too small for one sequence's window and chunk (7 blocks), or beside
     * what does not carry its table: refused. */
    o.swa.n_blocks = 6;
    CHECK(kv_mgr_init(&m, NULL, &o, err, sizeof err) == DP_EINVAL);
    o.swa.n_blocks = 20;
    o.prefix_cache = true;
    CHECK(kv_mgr_init(&m, NULL, &o, err, sizeof err) == DP_EUNSUPPORTED);
    o.prefix_cache = false;
    CHECK_MSG(kv_mgr_init(&m, NULL, &o, err, sizeof err) == 0, "%s", err);
    CHECK(kv_mgr_has_swa(&m));
    dp_kv_seq a, b, c;
    kv_seq_init(&a, false, &CO);
    kv_seq_init(&b, false, &CO);
    kv_seq_init(&c, false, &CO);
    /* Need: a 100-token prompt in chunks of 32 holds 7 blocks at most, one
     * token at a time 5; a short sequence no more than its tokens' blocks. */
    CHECK_EQ_INT(kv_mgr_need(&m, &a, 100, 1000).swa, 7);
    CHECK_EQ_INT(kv_mgr_need(&m, &a, 10, 0).swa, 1);
    CHECK_EQ_INT(kv_mgr_need(&m, &a, 10, 100).swa, 5);
    int32_t toks[400] = {0}, reused;
    CHECK(kv_mgr_admit(&m, &a, toks, 100, 1, false, &reused) == 0);
    CHECK_EQ_INT(m.swa.reserved + kv_pool_n_used(&m.swa.pool), 7);
    CHECK_EQ_INT(a.w.n, 2); /* its first chunk's, taken at admission */
    int held_max = 0;
    for (int32_t pos = 0; pos < 400;) {
        const int32_t n = pos < 100 ? (100 - pos < 32 ? 100 - pos : 32) : 1;
        CHECK(kv_mgr_grow(&m, &a, n) == 0);
        const int32_t held = a.w.n - a.w.lo;
        held_max = held > held_max ? held : held_max;
        CHECK_EQ_INT(held, kv_pool_n_used(&m.swa.pool));
        /* Every block the step's first token's window reads is there. */
        for (int32_t j = (pos + 1 - 64 > 0 ? (pos + 1 - 64) / BT : 0); j < a.w.n; j++)
            CHECK(a.w.blocks[j] >= 0);
        kv_mgr_commit(&m, &a, toks, n);
        pos += n;
        CHECK(pos < 100 || m.swa.reserved == 0); /* the prompt done, its promise went */
        CHECK(pos < 100 || held <= 5 + 2);
    }
    CHECK(held_max >= 6 && held_max <= 7); /* (the bound, less where blocks align) */
    CHECK(a.w.lo >= 400 / BT - 5);
    /* Two more prompts: each promised its window and chunk. */
    CHECK(kv_mgr_admit(&m, &b, toks, 100, 1, false, &reused) == 0);
    CHECK(kv_mgr_admit(&m, &c, toks, 100, 1, false, &reused) == 0);
    CHECK_EQ_INT(kv_pool_n_used(&m.swa.pool) + m.swa.reserved, a.w.n - a.w.lo + 7 + 7);
    /* A 32-token prompt takes the last two: a's decode growth, which needs
     * a new block at position 400, waits; once d is gone it finds one. */
    dp_kv_seq d;
    kv_seq_init(&d, false, &CO);
    CHECK(kv_mgr_admit(&m, &d, toks, 32, 1, false, &reused) == 0);
    CHECK_EQ_INT(kv_pool_n_used(&m.swa.pool) + m.swa.reserved, 20);
    CHECK(kv_mgr_grow(&m, &a, 1) == DP_ENOSPC);
    kv_mgr_free(&m, &d);
    kv_seq_destroy(&d);
    CHECK(kv_mgr_grow(&m, &a, 1) == 0);
    kv_mgr_free(&m, &b);
    kv_mgr_free(&m, &c);
    kv_mgr_free(&m, &a);
    CHECK_EQ_INT(kv_pool_n_free(&m.swa.pool), 20);
    CHECK_EQ_INT(m.swa.reserved, 0);
    /* A fourth prompt of 100 finds no room while three hold 19 of 20. */
    dp_kv_seq s[3];
    for (int i = 0; i < 3; i++) {
        kv_seq_init(&s[i], false, &CO);
        CHECK(kv_mgr_admit(&m, &s[i], toks, 100, 1, false, &reused) == (i < 2 ? 0 : DP_ENOSPC));
    }
    for (int i = 0; i < 3; i++) {
        kv_mgr_free(&m, &s[i]);
        kv_seq_destroy(&s[i]);
    }
    CHECK_EQ_INT(kv_pool_n_free(&m.swa.pool), 20);
    /* A prompt longer than its window and chunk keeps its promise: what
     * the window gives back is promised to it again, so prompts admitted
     * later never take the blocks its next chunks need. */
    CHECK(kv_mgr_admit(&m, &a, toks, 300, 1, false, &reused) == 0);
    for (int32_t pos = 0; pos < 300; pos += 32) {
        const int32_t n = 300 - pos < 32 ? 300 - pos : 32;
        for (int i = 0; i < 3 && pos == 96; i++) { /* others take all they may */
            kv_seq_init(&s[i], false, &CO);
            kv_mgr_admit(&m, &s[i], toks, i == 2 ? 16 : 100, 1, false, &reused);
        }
        CHECK_MSG(kv_mgr_grow(&m, &a, n) == 0, "a 300-token prompt's chunk at %d waits", pos);
        CHECK(a.w.n - a.w.lo + a.w.promise <= 7);
        kv_mgr_commit(&m, &a, toks, n);
    }
    CHECK_EQ_INT(a.w.promise, 0);
    for (int i = 0; i < 3; i++) {
        kv_mgr_free(&m, &s[i]);
        kv_seq_destroy(&s[i]);
    }
    kv_mgr_free(&m, &a);
    CHECK_EQ_INT(kv_pool_n_free(&m.swa.pool), 20);
    CHECK_EQ_INT(m.swa.reserved, 0);
    kv_seq_destroy(&a);
    kv_seq_destroy(&b);
    kv_seq_destroy(&c);
    kv_mgr_destroy(&m);
}

int main(void)
{
    test_need();
    test_shared_arena();
    test_too_long_to_migrate();
    test_split();
    test_decode_share();
    test_kept_share();
    test_whole_if_room();
    test_early_plan();
    test_swa();
    T_DONE("manager");
}
