/* test_pool.c: block pool invariants: allocation until full, reference
 * counts, LRU reuse order, all-or-nothing table growth, nothing leaked; in
 * a debug build, a reference dropped that nobody holds stops the process. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvcache/pool.h"
#include "common/dp.h"
#include "t.h"

/* kv_pool_unref of a free block aborts where asserts are on (a debug or
 * sanitizer build); a release build leaves the block free. */
static void test_unref_of_free_block(void)
{
#ifndef NDEBUG
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dp_kv_pool p;
        if (kv_pool_init(&p, 2, 16) == 0)
            kv_pool_unref(&p, 1);
        _exit(0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "status %d", st);
#else
    dp_kv_pool p;
    CHECK(kv_pool_init(&p, 2, 16) == 0);
    kv_pool_unref(&p, 1);
    CHECK_EQ_INT(kv_pool_n_free(&p), 2);
    CHECK_EQ_INT(p.refcnt[1], 0);
    kv_pool_destroy(&p);
#endif
}

int main(void)
{
    test_unref_of_free_block();
    dp_kv_pool p;
    CHECK(kv_pool_init(&p, 0, 16) == DP_EINVAL);
    CHECK(kv_pool_init(&p, 8, 16) == 0);
    CHECK_EQ_INT(kv_pool_n_free(&p), 8);
    CHECK_EQ_INT(kv_pool_blocks_for(&p, 0), 0);
    CHECK_EQ_INT(kv_pool_blocks_for(&p, 1), 1);
    CHECK_EQ_INT(kv_pool_blocks_for(&p, 16), 1);
    CHECK_EQ_INT(kv_pool_blocks_for(&p, 17), 2);

    int32_t b[8], x;
    for (int i = 0; i < 8; i++) {
        CHECK(kv_pool_alloc(&p, &b[i]) == 0);
        CHECK_EQ_INT(b[i], i); /* fresh pool hands out blocks in order */
    }
    CHECK(kv_pool_alloc(&p, &x) == DP_ENOSPC);
    CHECK_EQ_INT(kv_pool_n_free(&p), 0);

    /* Reference counts: a shared block is freed only by its last owner. */
    kv_pool_ref(&p, b[3]);
    kv_pool_unref(&p, b[3]);
    CHECK_EQ_INT(kv_pool_n_free(&p), 0);
    kv_pool_unref(&p, b[3]);
    CHECK_EQ_INT(kv_pool_n_free(&p), 1);
    /* (A reference dropped again: test_unref_of_free_block.) */

    /* LRU: blocks come back in the order they were freed. */
    kv_pool_unref(&p, b[5]);
    kv_pool_unref(&p, b[1]);
    CHECK(kv_pool_alloc(&p, &x) == 0);
    CHECK_EQ_INT(x, 3);
    CHECK(kv_pool_alloc(&p, &x) == 0);
    CHECK_EQ_INT(x, 5);
    /* Reviving a free block (prefix reuse) takes it out of the free list. */
    kv_pool_ref(&p, b[1]);
    CHECK_EQ_INT(kv_pool_n_free(&p), 0);
    CHECK(kv_pool_alloc(&p, &x) == DP_ENOSPC);
    for (int i = 0; i < 8; i++)
        kv_pool_unref(&p, b[i]);
    CHECK_EQ_INT(kv_pool_n_free(&p), 8);

    /* Tables: growth is all-or-nothing and release returns every block. */
    dp_block_table t1, t2;
    kv_table_init(&t1);
    kv_table_init(&t2);
    CHECK(kv_table_reserve(&t1, &p, 40) == 0); /* 3 blocks */
    CHECK_EQ_INT(t1.n_blocks, 3);
    CHECK(kv_table_reserve(&t1, &p, 48) == 0); /* still 3 */
    CHECK_EQ_INT(t1.n_blocks, 3);
    CHECK(kv_table_reserve(&t2, &p, 16 * 6) == DP_ENOSPC);
    CHECK_EQ_INT(t2.n_blocks, 0);
    CHECK_EQ_INT(kv_pool_n_free(&p), 5);
    CHECK(kv_table_reserve(&t2, &p, 16 * 5) == 0);
    CHECK_EQ_INT(kv_pool_n_free(&p), 0);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++)
            CHECK(t1.blocks[i] != t2.blocks[j]);
    kv_table_destroy(&t1, &p);
    CHECK_EQ_INT(kv_pool_n_free(&p), 3);
    kv_table_destroy(&t2, &p);
    CHECK_EQ_INT(kv_pool_n_free(&p), 8);

    /* Many sequences growing token by token, then released: 0 leaked. */
    dp_block_table ts[4];
    for (int s = 0; s < 4; s++)
        kv_table_init(&ts[s]);
    for (int tok = 1; tok <= 32; tok++)
        for (int s = 0; s < 4; s++)
            CHECK(kv_table_reserve(&ts[s], &p, tok) == 0);
    CHECK_EQ_INT(kv_pool_n_free(&p), 0);
    for (int s = 0; s < 4; s++)
        kv_table_destroy(&ts[s], &p);
    CHECK_EQ_INT(kv_pool_n_free(&p), 8);
    kv_pool_destroy(&p);

    {
        /* Protection: a protected free block is reused only when no other is
         * free; a reuse voids it; unprotecting makes it the most recently freed. */
        CHECK(kv_pool_init(&p, 4, 16) == 0);
        int32_t w[4], y;
        for (int i = 0; i < 4; i++)
            CHECK(kv_pool_alloc(&p, &w[i]) == 0);
        uint32_t g0 = kv_pool_gen(&p, w[0]);
        kv_pool_protect(&p, w[0]);
        for (int i = 0; i < 4; i++)
            kv_pool_unref(&p, w[i]); /* b0 freed first: without protection, reused first */
        CHECK_EQ_INT(kv_pool_n_free(&p), 4);
        for (int i = 1; i < 4; i++) {
            CHECK(kv_pool_alloc(&p, &y) == 0);
            CHECK(y != w[0]);
        }
        CHECK(kv_pool_alloc(&p, &y) == 0); /* only the protected one is left */
        CHECK_EQ_INT(y, w[0]);
        CHECK(kv_pool_gen(&p, w[0]) != g0);
        kv_pool_protect(&p, w[0]);   /* a new protection of the new contents */
        kv_pool_unprotect(&p, w[0], g0); /* the old one is void: no effect */
        CHECK_EQ_INT(p.protect[w[0]], 1);
        kv_pool_unprotect(&p, w[0], kv_pool_gen(&p, w[0]));
        CHECK_EQ_INT(p.protect[w[0]], 0);
        for (int i = 0; i < 4; i++)
            kv_pool_unref(&p, i);
        CHECK_EQ_INT(kv_pool_n_free(&p), 4);
        /* Unprotecting a free block moves it to the tail: reused last. */
        kv_pool_protect(&p, p.head);
        CHECK_EQ_INT(p.n_warm, 1);
        int32_t first = p.whead;
        kv_pool_unprotect(&p, first, kv_pool_gen(&p, first));
        CHECK_EQ_INT(p.tail, first);
        CHECK_EQ_INT(p.whead, -1);
        CHECK_EQ_INT(p.n_warm, 0);
        kv_pool_destroy(&p);
    }
    T_DONE("pool");
}
