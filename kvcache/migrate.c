/* migrate.c: scoring, selection and the path-aware copy of a migration
 * batch. Selection runs per sequence on the host; the copy is one backend
 * call for the whole batch. */
#include "migrate.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

#define MIGRATE_MAX_Q 64 /* DP_MAX_CAPTURE: queries a sequence is scored with */

int kv_migrator_init(dp_kv_migrator *m, dp_backend *be, int32_t n_layers, int32_t n_kv_heads,
                     int32_t n_heads, int32_t head_dim)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    return compressor_init(&m->comp, be, n_layers, n_kv_heads, n_heads, head_dim);
}

void kv_migrator_destroy(dp_kv_migrator *m)
{
    if (m->comp.be)
        compressor_destroy(&m->comp);
    free(m->keep);
    free(m->xkeep);
    memset(m, 0, sizeof *m);
}

int32_t *kv_migrator_keep(dp_kv_migrator *m, size_t n)
{
    if (n > m->keep_cap) {
        int32_t *k = realloc(m->keep, n * sizeof *k);
        if (!k)
            return NULL;
        m->keep = k;
        m->keep_cap = n;
    }
    return m->keep;
}

/* Removes the first n_ref entries of each row of keep[rows][n_keep] (the
 * slots held by reference, which a forced front keeps as 0..n_ref-1),
 * packing the rows to n_keep - n_ref entries. */
static int drop_ref_slots(int32_t *keep, size_t rows, int32_t n_keep, int32_t n_ref, bool front)
{
    const size_t w = (size_t)(n_keep - n_ref);
    for (size_t r = 0; r < rows; r++) {
        const int32_t *row = keep + r * (size_t)n_keep;
        if (front && row[n_ref - 1] != n_ref - 1)
            return DP_EINVAL; /* not a whole front: cannot happen */
        memmove(keep + r * w, row + n_ref, w * sizeof *keep);
    }
    return 0;
}

/* The exempt layers of the moves with an xdst: every slot, in order, into
 * the exempt store (one kv_compact call; cs is scratch for n entries). */
static int migrate_exempt(dp_kv_migrator *m, const dp_kv_store *src, const dp_kv_move *mv,
                          int32_t n, dp_compact_seq *cs)
{
    if (!m->xstore)
        return 0;
    const dp_kv_layout *xl = m->be->ops->kv_layout(m->be, m->xstore);
    const size_t rows = (size_t)xl->n_layers * (size_t)xl->n_kv_heads;
    int32_t k = 0, most = 0;
    for (int32_t i = 0; i < n; i++)
        if (mv[i].xdst && mv[i].n_slots > most)
            most = mv[i].n_slots;
    if (most == 0)
        return 0;
    if (rows * (size_t)most > m->xkeep_cap) {
        int32_t *p = realloc(m->xkeep, rows * (size_t)most * sizeof *p);
        if (!p)
            return DP_ENOMEM;
        m->xkeep = p;
        m->xkeep_cap = rows * (size_t)most;
    }
    for (int32_t i = 0; i < n; i++) {
        if (!mv[i].xdst)
            continue;
        cs[k++] = (dp_compact_seq){mv[i].src, mv[i].n_src_blocks, mv[i].xdst, mv[i].n_xdst_blocks,
                                   mv[i].n_slots, NULL};
    }
    int rc = 0;
    /* One call per move, each with the identity list of its own length
     * ([rows][n_slots]); a migration step moves few sequences. */
    for (int32_t i = 0; rc == 0 && i < k; i++) {
        const int32_t ns = cs[i].n_keep;
        for (size_t r = 0; r < rows; r++)
            for (int32_t s = 0; s < ns; s++)
                m->xkeep[r * (size_t)ns + (size_t)s] = s;
        cs[i].keep = m->xkeep;
        rc = m->be->ops->kv_compact(m->be, src, m->xstore, &cs[i], 1);
    }
    return rc;
}

int kv_migrate(dp_kv_migrator *m, const dp_kv_store *src, dp_kv_store *dst, dp_kv_move *mv,
               int32_t n)
{
    if (n <= 0)
        return 0;
    const size_t per_keep = (size_t)m->comp.n_layers * (size_t)m->comp.n_kv_heads;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        /* Slots held by reference are a forced front, or any leading run of
         * a move that keeps every slot (kept in order). */
        if (mv[i].n_keep < 1 || mv[i].n_keep > mv[i].n_slots || mv[i].n_ref < 0 ||
            mv[i].n_ref >= mv[i].n_keep ||
            (!mv[i].keep_given && mv[i].n_keep < mv[i].n_slots &&
             mv[i].n_ref > compress_front(mv[i].co, mv[i].n_keep)))
            return DP_EINVAL;
        total += per_keep * (size_t)mv[i].n_keep;
    }
    dp_compact_seq *cs = malloc((size_t)n * sizeof *cs);
    int rc = cs && kv_migrator_keep(m, total) ? 0 : DP_ENOMEM;
    size_t at = 0;
    for (int32_t i = 0; rc == 0 && i < n; i++) {
        dp_kv_move *v = &mv[i];
        int32_t nq = v->q ? v->n_q : 0, qslot[MIGRATE_MAX_Q];
        if (nq > MIGRATE_MAX_Q)
            nq = MIGRATE_MAX_Q; /* the last ones: the capture keeps the prompt's end */
        if (nq > v->n_slots)
            nq = v->n_slots;
        const float *q = nq ? v->q + (size_t)(v->n_q - nq) * (size_t)m->comp.n_heads *
                                         (size_t)m->comp.head_dim
                            : NULL;
        for (int32_t j = 0; j < nq; j++)
            qslot[j] = v->n_slots - nq + j;
        int32_t *keep = m->keep + at;
        if (v->keep_given) {
            v->scorer = v->co->scorer;
            memcpy(keep, v->keep_given, per_keep * (size_t)v->n_keep * sizeof *keep);
        } else if (v->co->scorer == DP_SCORER_SNAPKV && v->attn && v->attn->n_q > 0) {
            v->scorer = DP_SCORER_SNAPKV;
            rc = compressor_select_scored(&m->comp, v->co, v->attn, v->n_slots, v->n_keep, keep);
        } else {
            /* compressor_select scores SnapKV by key norm without queries
             * (and scores nothing when every slot stays). */
            v->scorer = v->co->scorer == DP_SCORER_SNAPKV && nq == 0 && v->n_keep < v->n_slots
                            ? DP_SCORER_KNORM
                            : v->co->scorer;
            rc = compressor_select(&m->comp, v->co, src, v->src, v->n_slots, q, v->q_stride, qslot,
                                   nq, v->n_keep, keep);
        }
        if (rc == 0 && v->keep_out)
            memcpy(v->keep_out, keep, per_keep * (size_t)v->n_keep * sizeof *keep);
        at += per_keep * (size_t)v->n_keep;
        if (rc == 0 && v->n_ref > 0)
            rc = drop_ref_slots(keep, per_keep, v->n_keep, v->n_ref, !v->keep_given);
        cs[i] = (dp_compact_seq){v->src, v->n_src_blocks, v->dst, v->n_dst_blocks,
                                 v->n_keep - v->n_ref, keep};
    }
    if (rc == 0)
        rc = m->be->ops->kv_compact(m->be, src, dst, cs, n);
    if (rc == 0)
        rc = migrate_exempt(m, src, mv, n, cs);
    free(cs);
    return rc;
}
