/* compress.c: scoring through the backend, then per-(layer, head) top-k
 * selection on the host. Forced tokens (sinks, window) are marked first; the
 * remaining budget goes to the best-scoring middle tokens. */
#include "compress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

struct score_ix {
    float score; /* higher = more important */
    int32_t slot;
};

const char *scorer_name(dp_scorer s)
{
    switch (s) {
    case DP_SCORER_KNORM: return "knorm";
    case DP_SCORER_KNORM_HIGH: return "knorm_high";
    case DP_SCORER_SNAPKV: return "snapkv";
    case DP_SCORER_RECENT: return "recent";
    case DP_SCORER_RANDOM: return "random";
    }
    return "?";
}

int scorer_parse(const char *name, dp_scorer *out)
{
    for (int s = 0; s <= DP_SCORER_RANDOM; s++)
        if (strcmp(name, scorer_name((dp_scorer)s)) == 0) {
            *out = (dp_scorer)s;
            return 0;
        }
    return DP_EINVAL;
}

static int32_t n_keep_of(float ratio, int32_t sinks, int32_t window, int32_t n)
{
    /* The ratio is a float: 0.1f * 170 is 17.0000003, which must keep 17, not
     * 18. Its relative error is below 1e-7, so discount 1e-6 of the product. */
    double x = (double)ratio * n;
    int64_t k = (int64_t)ceil(x - x * 1e-6);
    if (k < (int64_t)sinks + window)
        k = (int64_t)sinks + window;
    return k > n ? n : (int32_t)k;
}

int32_t compress_n_keep(const dp_compress_opts *o, int32_t n)
{
    if (o->prefix <= o->sinks)
        return n_keep_of(o->keep_ratio, o->sinks, o->window, n);
    if (n <= o->prefix)
        return n;
    /* The prefix is kept as it is; the rest is compressed as a sequence of
     * its own (its sinks are in the prefix). */
    return o->prefix + n_keep_of(o->keep_ratio, 0, o->window, n - o->prefix);
}

int compressor_init(dp_compressor *c, dp_backend *be, int32_t n_layers, int32_t n_kv_heads,
                    int32_t n_heads, int32_t head_dim)
{
    memset(c, 0, sizeof *c);
    c->be = be;
    c->n_layers = n_layers;
    c->n_kv_heads = n_kv_heads;
    c->n_heads = n_heads;
    c->head_dim = head_dim;
    return 0;
}

void compressor_destroy(dp_compressor *c)
{
    if (c->dev_scores)
        c->be->ops->free(c->be, c->dev_scores);
    free(c->host_scores);
    free(c->ix);
    memset(c, 0, sizeof *c);
}

static int reserve(dp_compressor *c, int32_t n_slots)
{
    size_t need = (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)n_slots;
    if (need > c->cap) {
        if (c->dev_scores)
            c->be->ops->free(c->be, c->dev_scores);
        free(c->host_scores);
        c->dev_scores = c->be->ops->alloc(c->be, need * sizeof(float));
        c->host_scores = malloc(need * sizeof(float));
        c->cap = c->dev_scores && c->host_scores ? need : 0;
        if (!c->cap)
            return DP_ENOMEM;
    }
    if ((size_t)n_slots > c->ix_cap) {
        struct score_ix *ix = realloc(c->ix, (size_t)n_slots * sizeof *ix);
        if (!ix)
            return DP_ENOMEM;
        c->ix = ix;
        c->ix_cap = (size_t)n_slots;
    }
    return 0;
}

static int ix_better(const struct score_ix *a, const struct score_ix *b)
{
    /* Ties go to the later token: recency is the safer guess. */
    return a->score != b->score ? a->score > b->score : a->slot > b->slot;
}

/* Partial selection: moves the k best of ix[0..n) to the front. */
static void select_best(struct score_ix *ix, int32_t n, int32_t k)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi && k > 0 && k < n) {
        struct score_ix pivot = ix[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (ix_better(&ix[i], &pivot))
                i++;
            while (ix_better(&pivot, &ix[j]))
                j--;
            if (i <= j) {
                struct score_ix t = ix[i];
                ix[i++] = ix[j];
                ix[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

static int cmp_int(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

/* Chooses the kept slots of every row from c->host_scores (scorer sc). */
static void select_rows(dp_compressor *c, const dp_compress_opts *o, dp_scorer sc, int32_t n_slots,
                        int32_t n_keep, int32_t *keep)
{
    const int32_t rows = c->n_layers * c->n_kv_heads;
    /* Forced tokens: the first sinks (or the whole prefix) and the last
     * window (bounded by n_keep). */
    int32_t sinks = compress_front(o, n_keep);
    int32_t window = o->window < n_keep - sinks ? o->window : n_keep - sinks;
    int32_t mid_lo = sinks, mid_hi = n_slots - window; /* middle: [mid_lo, mid_hi) */
    int32_t take = n_keep - sinks - window;
    for (int32_t r = 0; r < rows; r++) {
        const float *s = c->host_scores + (size_t)r * (size_t)n_slots;
        int32_t *out = keep + (size_t)r * (size_t)n_keep, n = 0;
        for (int32_t i = 0; i < sinks; i++)
            out[n++] = i;
        if (take > 0) {
            int32_t m = 0;
            for (int32_t i = mid_lo; i < mid_hi; i++) {
                float v;
                switch (sc) {
                case DP_SCORER_KNORM: v = -s[i]; break;
                case DP_SCORER_KNORM_HIGH: v = s[i]; break;
                case DP_SCORER_SNAPKV: {
                    /* Max-pool over neighbours (SnapKV's clustering): a
                     * token next to an attended one is kept with it, so a
                     * number or a name survives whole (see DP_SNAPKV_POOL). */
                    v = s[i];
                    for (int32_t d = -DP_SNAPKV_POOL; d <= DP_SNAPKV_POOL; d++)
                        if (i + d >= 0 && i + d < n_slots && s[i + d] > v)
                            v = s[i + d];
                    break;
                }
                case DP_SCORER_RECENT: v = (float)i; break;
                default: v = (float)(mix(o->seed ^ ((uint64_t)r << 32) ^ (uint64_t)i) >> 40); break;
                }
                c->ix[m++] = (struct score_ix){v, i};
            }
            select_best(c->ix, m, take);
            for (int32_t i = 0; i < take; i++)
                out[n++] = c->ix[i].slot;
        }
        for (int32_t i = mid_hi; i < n_slots; i++)
            out[n++] = i;
        qsort(out + sinks, (size_t)(n - sinks), sizeof *out, cmp_int);
    }
}

int compressor_select(dp_compressor *c, const dp_compress_opts *o, const dp_kv_store *kv,
                      const int32_t *table, int32_t n_slots, const float *q,
                      int64_t q_layer_stride, const int32_t *q_slot, int32_t n_q, int32_t n_keep,
                      int32_t *keep)
{
    if (n_keep < 1 || n_keep > n_slots)
        return DP_EINVAL;
    const int32_t rows = c->n_layers * c->n_kv_heads;
    if (n_keep == n_slots) { /* everything stays (an early switch): nothing to score */
        for (int32_t r = 0; r < rows; r++)
            for (int32_t s = 0; s < n_slots; s++)
                keep[(size_t)r * (size_t)n_keep + (size_t)s] = s;
        return 0;
    }
    int rc = reserve(c, n_slots);
    if (rc)
        return rc;
    dp_scorer sc = o->scorer;
    if (sc == DP_SCORER_SNAPKV && n_q == 0)
        sc = DP_SCORER_KNORM;
    if (sc == DP_SCORER_KNORM || sc == DP_SCORER_KNORM_HIGH || sc == DP_SCORER_SNAPKV) {
        if (sc == DP_SCORER_SNAPKV)
            c->be->ops->kv_score_attn(c->be, kv, table, n_slots, q, q_layer_stride, q_slot, n_q,
                                      c->n_heads, 1.0f / sqrtf((float)c->head_dim), c->dev_scores);
        else
            c->be->ops->kv_score_knorm(c->be, kv, table, n_slots, c->dev_scores);
        if ((rc = c->be->ops->download(c->be, c->host_scores, c->dev_scores,
                                       (size_t)rows * (size_t)n_slots * sizeof(float))))
            return rc;
    }
    select_rows(c, o, sc, n_slots, n_keep, keep);
    return 0;
}

void attn_acc_destroy(dp_attn_acc *a)
{
    free(a->sum);
    attn_acc_init(a);
}

/* Room for n slots per row, the sums kept (rows re-strided). */
static int acc_reserve(dp_attn_acc *a, int32_t rows, int32_t n)
{
    if (n <= a->cap)
        return 0;
    int32_t cap = a->cap > 0 ? a->cap : 16;
    while (cap < n)
        cap *= 2;
    float *s = calloc((size_t)rows * (size_t)cap, sizeof *s);
    if (!s)
        return DP_ENOMEM;
    for (int32_t r = 0; a->sum && r < rows; r++)
        memcpy(s + (size_t)r * (size_t)cap, a->sum + (size_t)r * (size_t)a->cap,
               (size_t)a->n_slots * sizeof *s);
    free(a->sum);
    a->sum = s;
    a->cap = cap;
    return 0;
}

int compressor_accumulate(dp_compressor *c, dp_attn_acc *a, const dp_kv_store *kv,
                          const int32_t *table, const float *q, int64_t q_layer_stride,
                          int32_t q_slot)
{
    const int32_t rows = c->n_layers * c->n_kv_heads, n = q_slot + 1;
    int rc = reserve(c, n);
    if (rc == 0)
        rc = acc_reserve(a, rows, n);
    if (rc)
        return rc;
    c->be->ops->kv_score_attn(c->be, kv, table, n, q, q_layer_stride, &q_slot, 1, c->n_heads,
                              1.0f / sqrtf((float)c->head_dim), c->dev_scores);
    if ((rc = c->be->ops->download(c->be, c->host_scores, c->dev_scores,
                                   (size_t)rows * (size_t)n * sizeof(float))))
        return rc;
    for (int32_t r = 0; r < rows; r++) {
        float *d = a->sum + (size_t)r * (size_t)a->cap;
        const float *s = c->host_scores + (size_t)r * (size_t)n;
        /* Slots the sums did not cover yet start from zero. */
        for (int32_t i = a->n_slots; i < n; i++)
            d[i] = 0.0f;
        for (int32_t i = 0; i < n; i++)
            d[i] += s[i];
    }
    if (n > a->n_slots)
        a->n_slots = n;
    a->n_q++;
    return 0;
}

int compressor_select_scored(dp_compressor *c, const dp_compress_opts *o, const dp_attn_acc *a,
                             int32_t n_slots, int32_t n_keep, int32_t *keep)
{
    if (n_keep < 1 || n_keep > n_slots || a->n_q == 0)
        return DP_EINVAL;
    int rc = reserve(c, n_slots);
    if (rc)
        return rc;
    const int32_t rows = c->n_layers * c->n_kv_heads;
    const int32_t have = a->n_slots < n_slots ? a->n_slots : n_slots;
    for (int32_t r = 0; r < rows; r++) {
        float *d = c->host_scores + (size_t)r * (size_t)n_slots;
        memcpy(d, a->sum + (size_t)r * (size_t)a->cap, (size_t)have * sizeof *d);
        for (int32_t i = have; i < n_slots; i++)
            d[i] = 0.0f;
    }
    select_rows(c, o, DP_SCORER_SNAPKV, n_slots, n_keep, keep);
    return 0;
}
