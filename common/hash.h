/* hash.h: SipHash-2-4, a keyed hash: without the key nobody can choose inputs
 * that collide. Used where a hash names something another client could be
 * served (the prefix cache's block names). */
#ifndef DP_COMMON_HASH_H
#define DP_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct dp_hash_key {
    uint64_t k0, k1;
} dp_hash_key;

/* A key from the kernel's random source (getrandom); a time- and
 * address-derived one if that fails. */
dp_hash_key hash_key_random(void);
/* SipHash-2-4 of len bytes at data under key (the reference algorithm's
 * output, byte order little-endian). */
uint64_t dp_siphash(const dp_hash_key *key, const void *data, size_t len);

#endif
