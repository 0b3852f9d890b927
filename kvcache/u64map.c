/* u64map.c: linear probing over a power-of-two table; deletion shifts later
 * members of the probe run back so lookups never need tombstones. */
#include "u64map.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

static uint32_t slot_of(const dp_u64map *m, uint64_t k)
{
    k ^= k >> 31;
    k *= 0x7fb5d329728ea185ULL;
    k ^= k >> 27;
    return (uint32_t)k & m->mask;
}

int u64map_init(dp_u64map *m, uint32_t max_items)
{
    memset(m, 0, sizeof *m);
    uint32_t cap = 16;
    while (cap < max_items * 2 + 2)
        cap <<= 1;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    if (!m->keys || !m->vals) {
        u64map_destroy(m);
        return DP_ENOMEM;
    }
    m->mask = cap - 1;
    return 0;
}

void u64map_destroy(dp_u64map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

int32_t u64map_get(const dp_u64map *m, uint64_t key)
{
    for (uint32_t i = slot_of(m, key);; i = (i + 1) & m->mask) {
        if (m->keys[i] == key)
            return m->vals[i];
        if (!m->keys[i])
            return -1;
    }
}

void u64map_put(dp_u64map *m, uint64_t key, int32_t val)
{
    uint32_t i = slot_of(m, key);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & m->mask;
    if (!m->keys[i])
        m->n++;
    m->keys[i] = key;
    m->vals[i] = val;
}

void u64map_del(dp_u64map *m, uint64_t key)
{
    uint32_t i = slot_of(m, key);
    while (m->keys[i] != key) {
        if (!m->keys[i])
            return;
        i = (i + 1) & m->mask;
    }
    m->keys[i] = 0;
    m->n--;
    /* Shift back every later member of the run that may sit before its home. */
    for (uint32_t j = (i + 1) & m->mask; m->keys[j]; j = (j + 1) & m->mask) {
        uint32_t home = slot_of(m, m->keys[j]);
        /* Move j to i when home is not in the cyclic range (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            m->keys[j] = 0;
            i = j;
        }
    }
}
