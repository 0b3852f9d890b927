/* kv_sim.c: KIVI-style KV rounding on an f32 store, for dp-eval (kv_sim.h).
 * Works through kv_block_read/kv_block_write, the host tier's copies, into
 * malloc'd memory (not the backend's pinned memory: the copies are then
 * done when they return). A CPU block image holds, per layer, K as
 * [head][dim][token] (the transposed keys) and V as [head][token][dim]. */
#include "kv_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/quant.h"

int kv_sim_parse(const char *name)
{
    int k, v, n = 0;
    if (sscanf(name, "sim-kivi%dv%d%n", &k, &v, &n) == 2 && name[n] == 0) {
        /* 4-bit keys, 8-bit values */
    } else if (sscanf(name, "sim-kivi%d%n", &k, &n) == 1 && name[n] == 0) {
        v = k;
    } else {
        return -1;
    }
    return k >= 1 && k <= 8 && v >= 1 && v <= 8 ? KV_SIM_KIVI(k, v) : -1;
}

const char *kv_sim_name(int type)
{
    static char buf[32];
    const int k = kv_sim_kbits(type), v = kv_sim_vbits(type);
    if (k == v)
        snprintf(buf, sizeof buf, "sim-kivi%d", k);
    else
        snprintf(buf, sizeof buf, "sim-kivi%dv%d", k, v);
    return buf;
}

double kv_sim_bytes(int type, int32_t group)
{
    /* Per channel of a token: K kbits/8 bytes + its share of 4 bytes (scale
     * and minimum) per channel and group; V vbits/8 + 4 bytes per 32
     * channels. */
    const double k = kv_sim_kbits(type) / 8.0 + 4.0 / group, v = kv_sim_vbits(type) / 8.0 + 4.0 / 32.0;
    return (k + v) / 4.0;
}

int kv_sim_init(kv_sim *s, dp_backend *be, dp_kv_store *store, int type, int32_t group)
{
    memset(s, 0, sizeof *s);
    const dp_kv_layout *l = be->ops->kv_layout(be, store);
    /* (The block image's layout is the CPU backend's.) */
    if (!kv_sim_is(type) || strcmp(be->ops->name, "cpu") || l->type != DP_KV_F32 ||
        group % l->block_tokens || l->head_dim % 32)
        return DP_EINVAL;
    dp_kv_layout one = *l;
    one.n_blocks = 1;
    const size_t bytes = be->ops->kv_bytes_per_block(be, &one);
    s->be = be;
    s->store = store;
    s->kbits = kv_sim_kbits(type);
    s->vbits = kv_sim_vbits(type);
    s->group = group;
    s->img = malloc(bytes);
    s->buf = malloc(bytes * (size_t)(group / l->block_tokens));
    return s->img && s->buf ? 0 : DP_ENOMEM;
}

void kv_sim_destroy(kv_sim *s)
{
    free(s->img);
    free(s->buf);
    memset(s, 0, sizeof *s);
}

/* One whole group starting at slot g0: its blocks are read side by side
 * into buf ([block][layer][K|V]), rounded, and written back. */
static int round_group(kv_sim *s, const int32_t *table, int32_t g0)
{
    const dp_kv_layout *l = s->be->ops->kv_layout(s->be, s->store);
    const int32_t bt = l->block_tokens, hd = l->head_dim, nb = s->group / bt;
    const size_t per = (size_t)l->n_kv_heads * bt * hd; /* floats of K (or V) per layer */
    const size_t blk = 2 * per * (size_t)l->n_layers;
    int rc = 0;
    for (int32_t b = 0; b < nb && !rc; b++)
        rc = s->be->ops->kv_block_read(s->be, s->store, table[(g0 + b * bt) / bt],
                                       s->buf + (size_t)b * blk);
    for (int32_t L = 0; L < l->n_layers && !rc; L++)
        for (int32_t h = 0; h < l->n_kv_heads; h++) {
            /* Keys: channel d over the group's slots, across its blocks. */
            float *col = s->img;
            for (int32_t d = 0; d < hd; d++) {
                for (int32_t b = 0; b < nb; b++)
                    memcpy(col + (size_t)b * bt,
                           s->buf + (size_t)b * blk + (size_t)L * 2 * per + ((size_t)h * hd + d) * bt,
                           (size_t)bt * sizeof(float));
                quant_asym_roundtrip(col, s->group, 1, s->kbits);
                for (int32_t b = 0; b < nb; b++)
                    memcpy(s->buf + (size_t)b * blk + (size_t)L * 2 * per + ((size_t)h * hd + d) * bt,
                           col + (size_t)b * bt, (size_t)bt * sizeof(float));
            }
            /* Values: each slot's row in groups of 32 channels. */
            for (int32_t b = 0; b < nb; b++)
                for (int32_t t = 0; t < bt; t++) {
                    float *row = s->buf + (size_t)b * blk + (size_t)L * 2 * per + per +
                                 ((size_t)h * bt + t) * hd;
                    for (int32_t c = 0; c < hd; c += 32)
                        quant_asym_roundtrip(row + c, 32, 1, s->vbits);
                }
        }
    for (int32_t b = 0; b < nb && !rc; b++)
        rc = s->be->ops->kv_block_write(s->be, s->store, table[(g0 + b * bt) / bt],
                                        s->buf + (size_t)b * blk);
    return rc;
}

int kv_sim_fill(kv_sim *s, const int32_t *table, int32_t n_slots, int32_t *done)
{
    int rc = 0;
    while (!rc && *done + s->group <= n_slots) {
        rc = round_group(s, table, *done);
        *done += s->group;
    }
    return rc;
}
