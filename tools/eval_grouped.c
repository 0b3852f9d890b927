/* eval_grouped.c: a grouped decode type (kivi4) in dp-eval, kept as the KV
 * manager keeps it (kvcache/manager.c seal_groups). A sequence's kept slots
 * are migrated into the arena through its identity table (block i holds
 * slots [16 i, 16 i + 16)), and each whole group of its residual is sealed
 * into a block of the grouped view taken from past the identity tables; its
 * batch row is its lead (the identity table's first block), its groups'
 * blocks, then the identity table's blocks from the residual's start (roff:
 * where that is in the first of them). The
 * residual's rows never move: a token at slot p stays where the identity
 * table put it. */
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "dp_eval.h"
#include "kvcache/manager.h"

int gtab_init(gtab *g, ev *e, const dp_kv_layout *arena, int32_t extra_blocks)
{
    memset(g, 0, sizeof *g);
    dp_kv_layout al = *arena;
    al.type = DP_KV_F16;
    g->n_ident = al.n_blocks;
    g->next = al.n_blocks;
    al.n_blocks += extra_blocks;
    g->end = al.n_blocks;
    int rc = e->be->ops->kv_create(e->be, &al, &g->arena);
    if (rc)
        return rc;
    /* A group per arena block, as the manager sizes it. */
    dp_kv_layout one = al, gl = al;
    one.n_blocks = 1;
    gl.type = DP_KV_KIVI4;
    g->G = kv_mgr_group_tokens(e->be, &gl, e->be->ops->kv_bytes_per_block(e->be, &one));
    gl.block_tokens = g->G;
    g->bt = al.block_tokens;
    g->rows = (size_t)al.n_layers * (size_t)al.n_kv_heads;
    if (g->G < 2 || (rc = e->be->ops->kv_view(e->be, g->arena, &gl, &g->view)) ||
        !(g->keep = malloc(g->rows * (size_t)g->G * sizeof *g->keep))) {
        gtab_destroy(g, e);
        return rc ? rc : g->G < 2 ? DP_EUNSUPPORTED : DP_ENOMEM;
    }
    return 0;
}

void gtab_destroy(gtab *g, ev *e)
{
    if (g->view)
        e->be->ops->kv_destroy(e->be, g->view);
    if (g->arena)
        e->be->ops->kv_destroy(e->be, g->arena);
    free(g->keep);
    memset(g, 0, sizeof *g);
}

void gtab_start(const gtab *g, gseq *s, const int32_t *ident, int32_t n_ident)
{
    s->ident = ident;
    s->n_ident = n_ident;
    s->sealed = s->roff = 0;
    s->n_row = n_ident;
    memcpy(s->row, ident, (size_t)n_ident * sizeof *ident);
}

int32_t gtab_next_seal(const gtab *g, const gseq *s)
{
    return (s->sealed ? s->sealed : g->bt) + g->G + kv_mgr_group_recent(g->bt);
}

int gtab_seal(gtab *g, ev *e, gseq *s, int32_t n_slots)
{
    /* The lead (the identity table's first block) stays whole once a
     * group follows it (backend.h dp_kv_group_lead). */
    const int32_t target = kv_mgr_group_sealed(g->bt, g->G, n_slots);
    if (s->sealed == 0 && target > 0)
        s->sealed = g->bt;
    int32_t k = dp_kv_group_rstart(g->bt, g->G, s->sealed);
    while (s->sealed < target) {
        if (g->next >= g->end)
            return DP_ENOSPC;
        int32_t blk = g->next++;
        for (size_t r = 0; r < g->rows; r++)
            for (int32_t t = 0; t < g->G; t++)
                g->keep[r * (size_t)g->G + (size_t)t] = s->sealed + t;
        const dp_compact_seq cs = {s->ident, s->n_ident, &blk, 1, g->G, g->keep};
        int rc = e->be->ops->kv_compact(e->be, g->arena, g->view, &cs, 1);
        if (rc)
            return rc;
        s->row[k++] = blk; /* (row[0]: the lead, ident[0] since gtab_start) */
        s->sealed += g->G;
    }
    if (s->sealed == 0)
        return 0;
    const int32_t from = s->sealed / g->bt;
    memmove(s->row + k, s->ident + from, (size_t)(s->n_ident - from) * sizeof *s->row);
    s->n_row = k + s->n_ident - from;
    s->roff = s->sealed % g->bt;
    return 0;
}
