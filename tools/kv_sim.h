/* kv_sim.h: KV cache types dp-eval measures before a kernel keeps them,
 * simulated on an exact (f32) store: the values are rounded as the type
 * would store them (kernels/quant.h quant_asym_roundtrip) and kept in f32,
 * which attention then reads as the type's kernel would dequantize them.
 *
 * KIVI (Liu et al. 2024): keys quantized per channel over a group of
 * `group` consecutive slots, values per slot over groups of 32 channels,
 * each with its own bits per value and an f16 scale and minimum per group; the newest
 * slots of a sequence stay exact until their group is full (the residual).
 * A group is quantized once, when it fills: kv_sim_fill does it for the
 * groups a sequence's slot count has completed since the last call. */
#ifndef DP_TOOLS_KV_SIM_H
#define DP_TOOLS_KV_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/backend.h"

/* Simulated types sit above the backend's dp_kv_type values: key and
 * value bits (1..8 each) in one int. */
#define KV_SIM_BASE 16
#define KV_SIM_KIVI(kbits, vbits) (KV_SIM_BASE + 16 * (kbits) + (vbits))
static inline bool kv_sim_is(int type) { return type > KV_SIM_BASE; }
static inline int kv_sim_kbits(int type) { return kv_sim_is(type) ? (type - KV_SIM_BASE) / 16 : 0; }
static inline int kv_sim_vbits(int type) { return kv_sim_is(type) ? (type - KV_SIM_BASE) % 16 : 0; }

/* "sim-kivi4" (4-bit keys and values), "sim-kivi4v8" (4-bit keys, 8-bit values):
 * bits 1..8 -> the type; -1 for anything else. */
int kv_sim_parse(const char *name);
/* Its name, as kv_sim_parse reads it (a static buffer: one per call). */
const char *kv_sim_name(int type);
/* Bytes per token relative to f16 K and V (the residual not counted). */
double kv_sim_bytes(int type, int32_t group);

typedef struct kv_sim {
    dp_backend *be;
    dp_kv_store *store;    /* an f32 store */
    int kbits, vbits;
    int32_t group;         /* key group in slots (a multiple of the block size) */
    float *img;            /* one block image (kv_block_read) */
    float *buf;            /* a group's worth of blocks */
} kv_sim;

int kv_sim_init(kv_sim *s, dp_backend *be, dp_kv_store *store, int type, int32_t group);
void kv_sim_destroy(kv_sim *s);
/* Rounds the groups of slots [*done, n_slots) that are whole (table: the
 * sequence's blocks) and advances *done past them. */
int kv_sim_fill(kv_sim *s, const int32_t *table, int32_t n_slots, int32_t *done);

#endif
