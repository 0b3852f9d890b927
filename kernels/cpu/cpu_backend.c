/* cpu_backend.c: the CPU implementation of backend.h (all but matmul and
 * attention, which have their own files): memory, KV stores, batch metadata
 * and the element-wise ops. "Device" memory is host memory here. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dp.h"
#include "cpu_internal.h"
#include "kernels/quant.h"
#include "kernels/topk.h"

#define TILE_LARGE_ROWS 64

static void *cpu_alloc(dp_backend *be, size_t bytes)
{
    size_t n = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, n ? n : 64);
}

static void cpu_free(dp_backend *be, void *p) { free(p); }

static int cpu_copy(dp_backend *be, void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return 0;
}

static void free_scratch(float **s, int n)
{
    if (!s)
        return;
    for (int i = 0; i < n; i++)
        free(s[i]);
    free(s);
}

static int grow_scratch(float ***s, size_t *have, size_t want, int n_threads)
{
    if ((want <= *have && *s) || n_threads <= 0)
        return 0;
    if (!*s) {
        *s = calloc((size_t)n_threads, sizeof **s);
        if (!*s)
            return DP_ENOMEM;
    }
    for (int i = 0; i < n_threads; i++) {
        float *p = aligned_alloc(64, ((want * sizeof(float)) + 63) & ~(size_t)63);
        if (!p)
            return DP_ENOMEM;
        free((*s)[i]);
        (*s)[i] = p;
    }
    *have = want;
    return 0;
}

int cpu_scratch_reserve(cpu_backend *c, size_t w_elems, size_t s_elems)
{
    int n = threadpool_size(c->tp);
    int rc = grow_scratch(&c->wscratch, &c->wscratch_elems, w_elems, n);
    if (!rc)
        rc = grow_scratch(&c->sscratch, &c->sscratch_elems, s_elems, n);
    return rc;
}

static int weight_load(dp_backend *be, dp_weight *w, uint32_t type, int64_t rows, int64_t cols,
                       const void *src, char *err, size_t errsz)
{
    cpu_backend *c = cpu_of(be);
    int rc = cpu_weight_load(be, w, type, rows, cols, src, err, errsz);
    if (rc)
        return rc;
    size_t tile = (size_t)TILE_LARGE_ROWS * (size_t)cols;
    if (cpu_scratch_reserve(c, tile > c->wscratch_elems ? tile : c->wscratch_elems,
                            c->sscratch_elems ? c->sscratch_elems : 4096)) {
        cpu_weight_free(be, w);
        return dp_err(err, errsz, DP_ENOMEM, "out of memory for matmul scratch");
    }
    return 0;
}

static size_t kv_block_bytes(dp_backend *be, const dp_kv_layout *l)
{
    /* Quantized rows are read through a tile of at most 256 values per row
     * (cpu_kern.c); real models' heads are 64..256. */
    if (dp_kv_type_quantized(l->type) && l->head_dim > 256)
        return 0;
    if (l->type == DP_KV_KIVI4)
        return l->block_tokens % 2 || l->block_tokens > 256 || l->head_dim % KIVI_VGROUP
                   ? 0
                   : 2 * (size_t)l->n_layers * (size_t)l->n_kv_heads * cpu_kivi_head_bytes(l);
    return 2 * (size_t)l->n_layers * (size_t)l->n_kv_heads * (size_t)l->block_tokens *
           cpu_kv_row_bytes(l->type, l->head_dim);
}

/* The fields of a store that follow from its layout (blk_bytes: its own). */
static void kv_init_fields(dp_kv_store *kv, const dp_kv_layout *l)
{
    kv->l = *l;
    kv->qtype = l->type == DP_KV_Q8_0 ? DP_TYPE_Q8_0 : l->type == DP_KV_Q4_0 ? DP_TYPE_Q4_0 : 0;
    kv->es = l->type == DP_KV_F16 ? 2 : l->type == DP_KV_F32 ? sizeof(float) : 0;
    kv->row_bytes = cpu_kv_row_bytes(l->type, l->head_dim);
    kv->blk_bytes = (size_t)l->n_kv_heads * (size_t)l->block_tokens * kv->row_bytes;
    kv->kivi = l->type == DP_KV_KIVI4;
    if (kv->kivi)
        kv->blk_bytes = (size_t)l->n_kv_heads * cpu_kivi_head_bytes(l);
}

static bool kv_layout_ok(dp_backend *be, const dp_kv_layout *l)
{
    return l->n_layers > 0 && l->n_kv_heads > 0 && l->head_dim > 0 && l->head_dim <= 1024 &&
           l->block_tokens > 0 && l->n_blocks > 0 && l->type >= 0 && l->type < DP_KV_TYPE_COUNT &&
           kv_block_bytes(be, l) > 0;
}

/* Makes every page of p resident. A volatile store per page: the compiler
 * would turn malloc + memset(0) into calloc, whose pages stay unmapped. */
static void prefault(void *p, size_t n)
{
    volatile char *q = p;
    for (size_t i = 0; i < n; i += 4096)
        q[i] = 0;
}

static int kv_create(dp_backend *be, const dp_kv_layout *l, dp_kv_store **out)
{
    /* A grouped type's residual lives in the arena it views. */
    if (!kv_layout_ok(be, l) || dp_kv_type_grouped(l->type))
        return DP_EINVAL;
    dp_kv_store *kv = calloc(1, sizeof *kv);
    if (!kv)
        return DP_ENOMEM;
    kv_init_fields(kv, l);
    size_t half = kv_block_bytes(be, l) / 2 * (size_t)l->n_blocks;
    /* Written once here, as llama.cpp clears its KV buffer: the memory plan
     * logged at start-up is resident from the start (lazily touched pages
     * would make resident memory creep up over hours of serving, which reads
     * as a leak), and a machine without the memory fails now, not mid-run. */
    kv->k = calloc(1, half);
    kv->v = calloc(1, half);
    if (!kv->k || !kv->v) {
        free(kv->k);
        free(kv->v);
        free(kv);
        return DP_ENOMEM;
    }
    prefault(kv->k, half);
    prefault(kv->v, half);
    *out = kv;
    return 0;
}

static int kv_view(dp_backend *be, dp_kv_store *base, const dp_kv_layout *l, dp_kv_store **out)
{
    const dp_kv_layout *b = &base->l;
    if (!kv_layout_ok(be, l) || l->n_kv_heads != b->n_kv_heads || l->head_dim != b->head_dim)
        return DP_EINVAL;
    /* The same geometry, or folded (backend.h): the stride arithmetic
     * ((layer * n_blocks + block) * blk_bytes) then lands view layer j,
     * block b + s * base blocks, on base layer j * G + s, block b. */
    const bool same = l->n_layers == b->n_layers && l->n_blocks == b->n_blocks;
    const bool folded = l->n_layers < b->n_layers &&
                        (int64_t)l->n_blocks == (int64_t)b->n_blocks * (b->n_layers / l->n_layers);
    if (!same && !folded)
        return DP_EINVAL;
    dp_kv_store *kv = calloc(1, sizeof *kv);
    if (!kv)
        return DP_ENOMEM;
    kv_init_fields(kv, l);
    /* f32 / f16 index K and V by element: the base's stride must divide. */
    if (kv->blk_bytes > base->blk_bytes || (kv->es && base->blk_bytes % kv->es) ||
        (kv->kivi && (!same || !base->es))) {
        free(kv);
        return DP_EINVAL;
    }
    kv->base = base;
    if (kv->kivi)
        kv->l.base_tokens = b->block_tokens;
    kv->blk_bytes = base->blk_bytes;
    kv->view = true;
    kv->k = base->k;
    kv->v = base->v;
    *out = kv;
    return 0;
}

static void kv_destroy(dp_backend *be, dp_kv_store *kv)
{
    if (!kv)
        return;
    if (!kv->view) {
        free(kv->k);
        free(kv->v);
    }
    free(kv);
}

static const dp_kv_layout *kv_get_layout(dp_backend *be, const dp_kv_store *kv)
{
    return &kv->l;
}

static int batch_set(dp_backend *be, const dp_batch *b)
{
    cpu_backend *c = cpu_of(be);
    const bool x = b->n_exempt > 0 && !b->layer_map;
    const size_t nxt = x ? (size_t)b->n_seqs * (size_t)b->x_max_blocks : 0;
    const size_t ngs = b->seq_sealed ? 2 * (size_t)b->n_seqs : 0;
    const size_t nwt = b->layer_map ? (size_t)b->n_seqs * (size_t)b->w_max_blocks : 0;
    size_t need = (size_t)b->n_tokens * (x ? 5 : 4) + (size_t)b->n_seqs * (size_t)b->max_blocks +
                  (size_t)b->n_out + (size_t)(b->n_capture > 0 ? b->n_capture : 0) + nxt + ngs +
                  nwt;
    if (need > c->arrays_cap) {
        int32_t *p = realloc(c->arrays, need * sizeof *p);
        if (!p)
            return DP_ENOMEM;
        c->arrays = p;
        c->arrays_cap = need;
    }
    if ((size_t)b->n_seqs * 3 > c->seq_store_cap) {
        uint8_t *p = realloc(c->seq_store, (size_t)b->n_seqs * 3);
        if (!p)
            return DP_ENOMEM;
        c->seq_store = p;
        c->seq_store_cap = (size_t)b->n_seqs * 3;
    }
    int32_t *a = c->arrays;
    size_t nt = (size_t)b->n_tokens;
    memcpy(a, b->tokens, nt * sizeof *a);
    memcpy(a + nt, b->pos, nt * sizeof *a);
    memcpy(a + 2 * nt, b->seq, nt * sizeof *a);
    memcpy(a + 3 * nt, b->slot, nt * sizeof *a);
    size_t nbt = (size_t)b->n_seqs * (size_t)b->max_blocks;
    memcpy(a + 4 * nt, b->block_tables, nbt * sizeof *a);
    if (b->n_out > 0) /* out_tokens may be NULL then (a step that wants no logits) */
        memcpy(a + 4 * nt + nbt, b->out_tokens, (size_t)b->n_out * sizeof *a);
    if (b->n_capture > 0)
        memcpy(a + 4 * nt + nbt + b->n_out, b->capture_tokens, (size_t)b->n_capture * sizeof *a);
    memcpy(c->seq_store, b->seq_store, (size_t)b->n_seqs);
    c->b = *b;
    c->b.tokens = a;
    c->b.pos = a + nt;
    c->b.seq = a + 2 * nt;
    c->b.slot = a + 3 * nt;
    c->b.block_tables = a + 4 * nt;
    c->b.out_tokens = a + 4 * nt + nbt;
    c->b.capture_tokens = a + 4 * nt + nbt + b->n_out;
    if (b->n_capture < 0)
        c->b.n_capture = 0;
    c->b.seq_store = c->seq_store;
    /* The exempt layers' view of the batch: its own slots, stores and
     * tables, the rest shared (cpu_batch_at). */
    c->bx = c->b;
    if (x) {
        int32_t *xa = a + 4 * nt + nbt + b->n_out + (b->n_capture > 0 ? b->n_capture : 0);
        memcpy(xa, b->x_slot, nt * sizeof *a);
        memcpy(xa + nt, b->x_block_tables, nxt * sizeof *a);
        memcpy(c->seq_store + b->n_seqs, b->x_seq_store, (size_t)b->n_seqs);
        c->bx.slot = xa;
        c->bx.block_tables = xa + nt;
        c->bx.max_blocks = b->x_max_blocks;
        c->bx.seq_store = c->seq_store + b->n_seqs;
    } else {
        c->b.n_exempt = c->bx.n_exempt = 0;
    }
    /* The sliding-window layers' view: a token's slot is its position, its
     * sequence's table the w_ one, every sequence in stores[w_store]. */
    c->bw = c->b;
    c->bw.n_exempt = 0;
    if (nwt) {
        int32_t *wa = a + need - ngs - nwt;
        memcpy(wa, b->w_block_tables, nwt * sizeof *a);
        memset(c->seq_store + 2 * (size_t)b->n_seqs, b->w_store, (size_t)b->n_seqs);
        c->bw.slot = c->b.pos;
        c->bw.block_tables = wa;
        c->bw.max_blocks = b->w_max_blocks;
        c->bw.seq_store = c->seq_store + 2 * (size_t)b->n_seqs;
    }
    if (ngs) {
        int32_t *ga = a + need - ngs;
        memcpy(ga, b->seq_sealed, (size_t)b->n_seqs * sizeof *a);
        memcpy(ga + b->n_seqs, b->seq_roff, (size_t)b->n_seqs * sizeof *a);
        c->b.seq_sealed = c->bx.seq_sealed = ga;
        c->b.seq_roff = c->bx.seq_roff = ga + b->n_seqs;
    } else {
        c->b.seq_sealed = c->bx.seq_sealed = c->b.seq_roff = c->bx.seq_roff = NULL;
    }
    c->bw.seq_sealed = c->bw.seq_roff = NULL; /* (the sliding store is never grouped) */
    /* Attention scratch holds one score per attended slot. */
    int32_t max_slots = 1;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (b->slot[i] + 1 > max_slots)
            max_slots = b->slot[i] + 1;
        if (x && b->x_slot[i] + 1 > max_slots)
            max_slots = b->x_slot[i] + 1;
        if (nwt && b->pos[i] + 1 > max_slots)
            max_slots = b->pos[i] + 1;
    }
    if ((size_t)max_slots > c->sscratch_elems)
        return cpu_scratch_reserve(c, c->wscratch_elems, (size_t)max_slots * 2);
    return 0;
}

/* Row-parallel helper: small row counts run inline, the pool's wake-up costs
 * more than the work. */
typedef void (*row_fn)(void *ctx, int64_t row);
typedef struct rows_job {
    row_fn fn;
    void *ctx;
    int64_t n;
    int64_t per;
} rows_job;

static void rows_task(void *p, int64_t t, int thread)
{
    rows_job *j = p;
    int64_t end = (t + 1) * j->per < j->n ? (t + 1) * j->per : j->n;
    for (int64_t r = t * j->per; r < end; r++)
        j->fn(j->ctx, r);
}

static void for_rows(cpu_backend *c, row_fn fn, void *ctx, int64_t n, int64_t min_parallel)
{
    if (n < min_parallel) {
        for (int64_t r = 0; r < n; r++)
            fn(ctx, r);
        return;
    }
    int64_t tasks = threadpool_size(c->tp) * 4;
    rows_job j = {fn, ctx, n, (n + tasks - 1) / tasks};
    threadpool_run(c->tp, rows_task, &j, (n + j.per - 1) / j.per);
}

typedef struct embed_ctx {
    cpu_backend *c;
    const dp_weight *table;
    float *out;
} embed_ctx;

static void embed_row(void *p, int64_t i)
{
    embed_ctx *e = p;
    int32_t tok = e->c->b.tokens[i];
    cpu_weight_row(e->table, tok, e->out + (size_t)i * (size_t)e->table->cols);
}

static void cpu_embed(dp_backend *be, const dp_weight *table, float *out, int32_t n)
{
    embed_ctx e = {cpu_of(be), table, out};
    for_rows(e.c, embed_row, &e, n, 16);
}

typedef struct norm_ctx {
    float *out;
    const float *x;
    const float *w;
    int32_t dim;
    float eps;
} norm_ctx;

static void norm_row(void *p, int64_t i)
{
    norm_ctx *c = p;
    const float *x = c->x + (size_t)i * (size_t)c->dim;
    float *o = c->out + (size_t)i * (size_t)c->dim;
    double ss = 0.0;
    for (int32_t d = 0; d < c->dim; d++)
        ss += (double)x[d] * x[d];
    float inv = (float)(1.0 / sqrt(ss / c->dim + c->eps));
    for (int32_t d = 0; d < c->dim; d++)
        o[d] = x[d] * inv * c->w[d];
}

static void cpu_rmsnorm(dp_backend *be, float *out, const float *x, const dp_weight *w, int32_t n,
                        int32_t dim, float eps)
{
    norm_ctx c = {out, x, (const float *)w->data, dim, eps};
    for_rows(cpu_of(be), norm_row, &c, n, 16);
}

typedef struct rope_ctx {
    cpu_backend *c;
    float *q, *k;
    int32_t n_heads, n_kv_heads, head_dim;
    const dp_rope_params *rp;
} rope_ctx;

static void rope_vec(float *x, int32_t n_rot, const float *cs, const float *sn, bool neox)
{
    int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs[i] - x1 * sn[i];
        x[b] = x0 * sn[i] + x1 * cs[i];
    }
}

static void rope_row(void *p, int64_t i)
{
    rope_ctx *r = p;
    const dp_rope_params *rp = r->rp;
    float cs[512], sn[512];
    int32_t half = rp->n_rot / 2;
    double pos = (double)r->c->b.pos[i] * rp->freq_scale;
    for (int32_t d = 0; d < half; d++) {
        /* theta_d = pos * base^(-2d/n_rot) / factor_d, in double: positions
         * reach 1e5. */
        double th = pos * pow((double)rp->freq_base, -2.0 * d / rp->n_rot);
        if (rp->freq_factors)
            th /= (double)rp->freq_factors[d];
        if (rp->ext_factor != 0.0f) { /* YaRN: mix with the unscaled angle */
            double y = ((double)d - rp->corr_lo) / fmax(0.001, (double)rp->corr_hi - rp->corr_lo);
            const double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * rp->ext_factor;
            th = th * (1.0 - mix) + th / rp->freq_scale * mix;
        }
        cs[d] = (float)(cos(th) * (double)rp->mscale);
        sn[d] = (float)(sin(th) * (double)rp->mscale);
    }
    for (int32_t h = 0; h < r->n_heads; h++)
        rope_vec(r->q + ((size_t)i * r->n_heads + h) * r->head_dim, rp->n_rot, cs, sn, rp->neox);
    for (int32_t h = 0; h < r->n_kv_heads; h++)
        rope_vec(r->k + ((size_t)i * r->n_kv_heads + h) * r->head_dim, rp->n_rot, cs, sn,
                 rp->neox);
}

static void cpu_rope(dp_backend *be, float *q, float *k, int32_t n, int32_t n_heads,
                     int32_t n_kv_heads, int32_t head_dim, const dp_rope_params *rp)
{
    rope_ctx r = {cpu_of(be), q, k, n_heads, n_kv_heads, head_dim, rp};
    for_rows(r.c, rope_row, &r, n, 8);
}

typedef struct kvw_ctx {
    cpu_backend *c;
    dp_kv_store *const *stores;
    int32_t layer;   /* the model's */
    int32_t kl;      /* its layer in the stores of view */
    const dp_batch *view;
    const float *k, *v;
} kvw_ctx;

/* Writes token i's rows where batch b puts it. */
static void kvw_put(kvw_ctx *w, const dp_batch *b, int64_t i)
{
    int32_t s = b->seq[i];
    const dp_kv_store *kv = w->stores[b->seq_store[s]];
    const dp_kv_layout *l = &kv->l;
    int32_t slot = b->slot[i];
    const int32_t *table = b->block_tables + (size_t)s * (size_t)b->max_blocks;
    int32_t block = table[slot / l->block_tokens];
    size_t row = (size_t)l->n_kv_heads * (size_t)l->head_dim;
    if (kv->kivi) {
        /* A grouped store's new token joins the residual, in the arena's
         * type; the whole group is written later (kv_compact). A slot
         * below the sealed groups is never written. */
        if (!b->seq_sealed || slot < b->seq_sealed[s])
            return;
        int32_t tok;
        kv_kivi_residual(kv, table, b->seq_sealed[s], b->seq_roff[s], slot, &block, &tok);
        slot = tok;
        kv = kv->base;
        l = &kv->l;
    }
    for (int32_t h = 0; h < l->n_kv_heads; h++) {
        kv_kput(kv, w->kl, block, h, slot % l->block_tokens,
                w->k + (size_t)i * row + (size_t)h * l->head_dim);
        kv_vput(kv, w->kl, block, h, slot % l->block_tokens,
                w->v + (size_t)i * row + (size_t)h * l->head_dim);
    }
}

static void kvw_row(void *p, int64_t i)
{
    kvw_ctx *w = p;
    if (w->view == &w->c->bw) {
        kvw_put(w, w->view, i);
        return;
    }
    kvw_put(w, &w->c->b, i);
    /* An exempt layer's token goes to its exempt table too (unless the
     * sequence has none: the same slot). */
    const dp_batch *x = &w->c->bx;
    if (w->layer < x->n_exempt && x->seq_store[x->seq[i]] != w->c->b.seq_store[x->seq[i]])
        kvw_put(w, x, i);
}

static void cpu_kv_write(dp_backend *be, dp_kv_store *const *stores, int32_t layer, const float *k,
                         const float *v)
{
    kvw_ctx w = {cpu_of(be), stores, layer, 0, NULL, k, v};
    w.view = cpu_batch_at(w.c, layer, &w.kl);
    for_rows(w.c, kvw_row, &w, w.c->b.n_tokens, 64);
}

enum { EW_ADD, EW_SWIGLU, EW_GEGLU, EW_SCALE };

typedef struct ew_ctx {
    float *out;
    const float *a, *b;
    int64_t n;
    int64_t chunk;
    int op;
    float s; /* EW_SCALE */
} ew_ctx;

/* GELU's tanh form, as Gemma was trained with (and llama.cpp computes,
 * there through an f16 table). */
static inline float gelu_tanh(float x)
{
    const float c = 0.79788456080286535588f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static void ew_chunk(void *p, int64_t t)
{
    ew_ctx *e = p;
    int64_t lo = t * e->chunk, hi = lo + e->chunk < e->n ? lo + e->chunk : e->n;
    switch (e->op) {
    case EW_ADD:
        for (int64_t i = lo; i < hi; i++)
            e->out[i] += e->a[i];
        break;
    case EW_SWIGLU:
        for (int64_t i = lo; i < hi; i++) {
            float g = e->a[i];
            e->out[i] = g / (1.0f + expf(-g)) * e->b[i];
        }
        break;
    case EW_GEGLU:
        for (int64_t i = lo; i < hi; i++)
            e->out[i] = gelu_tanh(e->a[i]) * e->b[i];
        break;
    default:
        for (int64_t i = lo; i < hi; i++)
            e->out[i] *= e->s;
    }
}

static void run_elementwise(cpu_backend *c, ew_ctx *e)
{
    e->chunk = 4096;
    for_rows(c, ew_chunk, e, (e->n + e->chunk - 1) / e->chunk, 4);
}

static void cpu_add(dp_backend *be, float *x, const float *y, int64_t n)
{
    ew_ctx e = {x, y, NULL, n, 0, EW_ADD, 0.0f};
    run_elementwise(cpu_of(be), &e);
}

typedef struct bias_ctx {
    float *y;
    const float *b;
    int32_t cols;
} bias_ctx;

static void bias_row(void *p, int64_t i)
{
    bias_ctx *c = p;
    float *y = c->y + (size_t)i * (size_t)c->cols;
    for (int32_t d = 0; d < c->cols; d++)
        y[d] += c->b[d];
}

static void cpu_add_bias(dp_backend *be, float *y, const dp_weight *b, int32_t n, int32_t cols)
{
    bias_ctx c = {y, (const float *)b->data, cols};
    for_rows(cpu_of(be), bias_row, &c, n, 16);
}

static void cpu_swiglu(dp_backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    ew_ctx e = {out, gate, up, n, 0, EW_SWIGLU, 0.0f};
    run_elementwise(cpu_of(be), &e);
}

static void cpu_geglu(dp_backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    ew_ctx e = {out, gate, up, n, 0, EW_GEGLU, 0.0f};
    run_elementwise(cpu_of(be), &e);
}

static void cpu_scale(dp_backend *be, float *x, float s, int64_t n)
{
    ew_ctx e = {x, NULL, NULL, n, 0, EW_SCALE, s};
    run_elementwise(cpu_of(be), &e);
}

static void cpu_gather_rows(dp_backend *be, float *out, const float *x, int32_t dim)
{
    cpu_backend *c = cpu_of(be);
    for (int32_t i = 0; i < c->b.n_out; i++)
        memcpy(out + (size_t)i * dim, x + (size_t)c->b.out_tokens[i] * dim, (size_t)dim * sizeof(float));
}

static void cpu_capture_rows(dp_backend *be, float *out, const float *x, int32_t dim)
{
    cpu_backend *c = cpu_of(be);
    for (int32_t i = 0; i < c->b.n_capture; i++)
        memcpy(out + (size_t)i * dim, x + (size_t)c->b.capture_tokens[i] * dim,
               (size_t)dim * sizeof(float));
}

static void cpu_destroy(dp_backend *be)
{
    cpu_backend *c = cpu_of(be);
    int n = c->tp ? threadpool_size(c->tp) : 0;
    free_scratch(c->wscratch, n);
    free_scratch(c->sscratch, n);
    threadpool_destroy(c->tp);
    free(c->arrays);
    free(c->seq_store);
    free(c->xq);
    free(c->attn_tiles);
    free(c);
}

/* ---- logits top-k: the reference for backend.h's logits_topk ----------------
 * kernels/topk.c does one row; the sampler runs the same code on a row it
 * holds, so on this backend the two sampling paths see identical numbers. */
typedef struct topk_job {
    float *logits;
    int32_t vocab, k;
    const float *temperature;
    const int32_t *mask_ids;
    int32_t n_mask;
    const uint8_t *mask_rows;
    int32_t *ids;
    float *vals, *row_max, *row_sum;
} topk_job;

static void topk_task(void *ctx, int64_t r, int thread)
{
    const topk_job *j = ctx;
    float *x = j->logits + (size_t)r * (size_t)j->vocab;
    if (j->mask_rows && j->mask_rows[r])
        for (int32_t i = 0; i < j->n_mask; i++)
            if (j->mask_ids[i] >= 0 && j->mask_ids[i] < j->vocab)
                x[j->mask_ids[i]] = -INFINITY;
    const float T = j->temperature[r];
    const float inv_t = T > 0.0f ? 1.0f / T : 1.0f;
    dp_topk_row(x, j->vocab, j->k, inv_t, j->ids + (size_t)r * j->k, j->vals + (size_t)r * j->k,
                j->row_max + r, j->row_sum + r);
}

static int cpu_logits_topk(dp_backend *be, float *logits, int32_t n, int32_t vocab, int32_t k,
                           const float *temperature, const int32_t *mask_ids, int32_t n_mask,
                           const uint8_t *mask_rows, int32_t *ids, float *vals, float *row_max,
                           float *row_sum)
{
    if (n < 1 || k < 1 || k > DP_TOPK_MAX || k > vocab || n_mask < 0 || (n_mask > 0 && !mask_ids))
        return DP_EINVAL;
    topk_job j = {logits, vocab, k, temperature, mask_ids, n_mask, mask_rows,
                  ids,    vals,  row_max, row_sum};
    /* A row is tens of microseconds: rows go to the pool when there are a
     * few (a decode step of a full batch). */
    if (n >= 4)
        threadpool_run(cpu_of(be)->tp, topk_task, &j, n);
    else
        for (int32_t r = 0; r < n; r++)
            topk_task(&j, r, 0);
    return 0;
}

static const char *cpu_kernel_level(dp_backend *be) { return cpu_of(be)->k->name; }

static void cpu_set_exact(dp_backend *be, bool exact) { cpu_of(be)->exact = exact; }

static bool cpu_get_exact(dp_backend *be) { return cpu_of(be)->exact; }

static const dp_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .weight_load = weight_load,
    .weight_free = cpu_weight_free,
    .kv_create = kv_create,
    .kv_view = kv_view,
    .kv_quant_default = true,
    .kv_destroy = kv_destroy,
    .kv_bytes_per_block = kv_block_bytes,
    .kv_layout = kv_get_layout,
    .batch_set = batch_set,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .matmul_shared = cpu_matmul_shared,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .add = cpu_add,
    .add_bias = cpu_add_bias,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .scale = cpu_scale,
    .gather_rows = cpu_gather_rows,
    .capture_rows = cpu_capture_rows,
    .kv_score_knorm = cpu_kv_score_knorm,
    .kv_score_attn = cpu_kv_score_attn,
    .kv_compact = cpu_kv_compact,
    .kv_block_read = cpu_kv_block_read,
    .kv_block_write = cpu_kv_block_write,
    .logits_topk = cpu_logits_topk,
    .kernel_level = cpu_kernel_level,
    .set_exact = cpu_set_exact,
    .get_exact = cpu_get_exact,
};

int backend_cpu_create(dp_backend **out, int n_threads, char *err, size_t errsz)
{
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    c->base.ops = &cpu_ops;
    c->base.n_threads = n_threads;
    c->k = cpu_kern_get();
    c->exact = cpu_exact_get();
    if (threadpool_init(&c->tp, n_threads)) {
        free(c);
        return dp_err(err, errsz, DP_ENOMEM, "cannot start %d CPU threads", n_threads);
    }
    if (cpu_scratch_reserve(c, 4096, 4096)) {
        cpu_destroy(&c->base);
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    }
    /* Our workers split every GEMM themselves; OpenBLAS threads would fight them. */
    openblas_set_num_threads(1);
    *out = &c->base;
    return 0;
}
