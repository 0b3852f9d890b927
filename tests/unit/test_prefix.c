/* test_prefix.c: the prefix cache cannot be poisoned. SipHash-2-4 gives the
 * reference algorithm's outputs; a block whose name matches but whose tokens
 * do not (a collision, forged here since a keyed name cannot be crafted) is
 * refused, not served; names depend on the process's secret key; an honest
 * hit takes the block back. */
#include <string.h>

#include "common/dp.h"
#include "common/hash.h"
#include "kvcache/prefix.h"
#include "t.h"

static void test_siphash_vectors(void)
{
    /* From the SipHash paper's reference implementation (vectors.h): key
     * 00..0f, message 00..(len-1). */
    dp_hash_key k = {0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL};
    uint8_t msg[64];
    for (int i = 0; i < 64; i++)
        msg[i] = (uint8_t)i;
    CHECK(dp_siphash(&k, msg, 0) == 0x726fdb47dd0e0e31ULL);
    CHECK(dp_siphash(&k, msg, 1) == 0x74f839c593dc67fdULL);
    CHECK(dp_siphash(&k, msg, 8) == 0x93f5f5799a932462ULL);
    CHECK(dp_siphash(&k, msg, 15) == 0xa129ca6149be45e5ULL);
    CHECK(dp_siphash(&k, msg, 63) == 0x958a324ceb064572ULL);
    dp_hash_key r1 = hash_key_random(), r2 = hash_key_random();
    CHECK(r1.k0 != r2.k0 || r1.k1 != r2.k1);
}

int main(void)
{
    test_siphash_vectors();
    enum { BT = 4 };
    dp_kv_pool pool;
    CHECK(kv_pool_init(&pool, 8, BT) == 0);
    dp_prefix_cache pc, other;
    CHECK(prefix_init(&pc, &pool, NULL, NULL, NULL) == 0);
    const int32_t honest[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int32_t victim[4] = {40, 41, 42, 43};
    const int32_t forged[4] = {90, 91, 92, 93};

    /* A sequence's two blocks, named and freed (they stay named in the LRU). */
    dp_block_table t;
    kv_table_init(&t);
    CHECK(kv_table_reserve(&t, &pool, 8) == 0);
    uint64_t h0 = prefix_chain(&pc, 0, honest, BT);
    uint64_t h1 = prefix_chain(&pc, h0, honest + BT, BT);
    CHECK(h0 != h1);
    prefix_register(&pc, t.blocks[0], h0, honest);
    prefix_register(&pc, t.blocks[1], h1, honest + BT);
    int32_t b0 = t.blocks[0], b1 = t.blocks[1];
    kv_table_release(&t, &pool);

    /* An honest hit takes both blocks back. */
    int32_t from_host;
    uint64_t last;
    CHECK_EQ_INT(prefix_match(&pc, honest, 8, &t, &from_host, &last), 8);
    CHECK_EQ_INT(t.blocks[0], b0);
    CHECK_EQ_INT(t.blocks[1], b1);
    CHECK(last == h1);
    kv_table_release(&t, &pool);

    /* A block named as the victim's first block would be, holding other
     * tokens (what a hash collision would produce): the victim's prompt is
     * not served from it. */
    CHECK(kv_table_reserve(&t, &pool, 4) == 0);
    int32_t bad = t.blocks[0];
    prefix_register(&pc, bad, prefix_chain(&pc, 0, victim, BT), forged);
    kv_table_release(&t, &pool);
    int64_t refused0 = pc.refused;
    CHECK_EQ_INT(prefix_match(&pc, victim, 4, &t, &from_host, &last), 0);
    CHECK_EQ_INT(t.n_blocks, 0);
    CHECK_EQ_INT(pc.refused, refused0 + 1);

    /* Names are keyed per process (per cache here): another key, other names. */
    dp_kv_pool pool2;
    CHECK(kv_pool_init(&pool2, 8, BT) == 0);
    CHECK(prefix_init(&other, &pool2, NULL, NULL, NULL) == 0);
    CHECK(prefix_chain(&other, 0, honest, BT) != h0);
    prefix_destroy(&other);
    kv_pool_destroy(&pool2);

    kv_table_destroy(&t, &pool);
    prefix_destroy(&pc);
    kv_pool_destroy(&pool);
    T_DONE("prefix");
}
