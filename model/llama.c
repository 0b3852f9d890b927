/* llama.c: the forward pass. It loads the weights onto a backend and runs
 * one batched forward step, top to bottom: LLaMA's, with the variations an
 * architecture's description asks for (arch.h: Q/K/V biases, per-head Q/K
 * norms, NeoX RoPE, Llama 3's RoPE factors, Gemma's scaled embedding, extra
 * norms, GELU gating and sliding-window layers). */
#include "llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/quant.h"

typedef struct layer_w {
    dp_weight attn_norm, wq, wk, wv, wo;
    dp_weight bq, bk, bv;         /* desc->qkv_bias */
    dp_weight q_norm, k_norm;     /* desc->qk_norm: [head_dim] */
    dp_weight ffn_norm, w_gate, w_up, w_down;
    dp_weight post_attn_norm, post_ffn_norm; /* desc->gemma */
} layer_w;

struct dp_llama {
    dp_hparams hp;
    dp_backend *be;
    int32_t max_tokens, max_out;
    bool capture;           /* false: no query capture buffer (llama_init_ex) */
    dp_weight tok_embd, out_norm, output;
    layer_w *layers;
    /* RoPE factors in backend memory, each set owned: Llama 3's
     * (hp.rope_freqs) or LongRoPE's two (hp.longrope). rope_ff points at
     * the set in use (llama_set_context picks LongRoPE's). */
    float *rope_freqs, *rope_long, *rope_short;
    const float *rope_ff;
    /* Activations, sized for max_tokens. */
    float *x, *xn, *q, *k, *v, *att, *tmp, *gate, *up, *outx, *logits, *capture_q;
    uint8_t *used;          /* during llama_init: which of the file's tensors it loaded */
    /* Sliding-window layers kept apart (backend.h layer_map): global layer
     * l is layer layer_map[l] of the main stores, sliding layer l layer
     * -1 - layer_map[l] of the sliding store; NULL: no sliding layers. */
    int32_t *layer_map;
    int32_t n_swa;
    int32_t g_first, g_step;  /* the global layers: g_first, g_first + g_step, ... */
    /* A decode step padded for the backend (backend.h step_pad): host
     * arrays, grown on demand. */
    int32_t *pad_i32;
    uint8_t *pad_store;
    size_t pad_cap_i32, pad_cap_store;
};

const dp_hparams *llama_hparams(const dp_llama *m) { return &m->hp; }
dp_backend *llama_backend(const dp_llama *m) { return m->be; }
int32_t llama_max_tokens(const dp_llama *m) { return m->max_tokens; }
int32_t llama_max_out(const dp_llama *m) { return m->max_out; }
static int32_t capture_rows(int32_t max_tokens, int32_t max_out)
{
    int64_t c = (int64_t)max_out * DP_MAX_CAPTURE;
    return c < max_tokens ? (int32_t)c : max_tokens;
}

int32_t llama_capture_capacity(const dp_llama *m)
{
    return m->capture ? capture_rows(m->max_tokens, m->max_out) : 0;
}
const float *llama_captured_queries(const dp_llama *m) { return m->capture_q; }

const int32_t *llama_kv_layer_map(const dp_llama *m) { return m->layer_map; }
int32_t llama_swa_layers(const dp_llama *m) { return m->n_swa; }
void llama_global_layers(const dp_llama *m, int32_t *first, int32_t *step)
{
    *first = m->layer_map ? m->g_first : 0;
    *step = m->layer_map ? m->g_step : 1;
}

dp_kv_layout llama_kv_layout(const dp_llama *m, int32_t block_tokens, int32_t n_blocks)
{
    dp_kv_layout l = {m->hp.n_layers, m->hp.n_kv_heads, m->hp.head_dim, block_tokens, n_blocks,
                      DP_KV_F32, 0};
    return l;
}

/* Loads rows [row0, row0 + rows) of tensor `name`, checking it is
 * [cols, total] in GGUF order (ne[0] = cols): a fused tensor's part. */
static int load_w_rows(dp_llama *m, const dp_gguf *g, const char *name, int64_t total,
                       int64_t row0, int64_t rows, int64_t cols, dp_weight *w, char *err,
                       size_t errsz)
{
    const dp_gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        return dp_err(err, errsz, DP_EFORMAT, "model: missing tensor '%s'", name);
    if (m->used)
        m->used[t - g->tensors] = 1;
    bool vec = total == 1;
    uint64_t ne1 = t->n_dims >= 2 ? t->ne[1] : 1;
    if (t->ne[0] != (uint64_t)cols || ne1 != (uint64_t)total || t->n_dims > (vec ? 1u : 2u))
        return dp_err(err, errsz, DP_EFORMAT,
                      "model: tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", name,
                      (unsigned long long)t->ne[0], (unsigned long long)ne1, (long long)cols,
                      (long long)total);
    if (vec && t->type != DP_TYPE_F32)
        return dp_err(err, errsz, DP_EUNSUPPORTED, "model: norm tensor '%s' is %s, expected F32",
                      name, quant_type_name(t->type));
    if (!quant_type_supported(t->type))
        return dp_err(err, errsz, DP_EUNSUPPORTED,
                      "model: tensor '%s' has type %s, which is not supported", name,
                      quant_type_name(t->type));
    uint64_t row_bytes = 0;
    if (quant_row_bytes(t->type, (uint64_t)cols, &row_bytes))
        return dp_err(err, errsz, DP_EFORMAT, "model: tensor '%s': bad row size", name);
    const uint8_t *data = (const uint8_t *)t->data + (size_t)row0 * (size_t)row_bytes;
    char werr[DP_ERRLEN];
    int rc = m->be->ops->weight_load(m->be, w, t->type, rows, cols, data, werr, sizeof werr);
    if (rc)
        return dp_err(err, errsz, rc, "model: tensor '%s': %s", name, werr);
    return 0;
}

/* Loads tensor `name`, checking it is [cols, rows] in GGUF order (ne[0] = cols). */
static int load_w(dp_llama *m, const dp_gguf *g, const char *name, int64_t rows, int64_t cols,
                  dp_weight *w, char *err, size_t errsz)
{
    return load_w_rows(m, g, name, rows, 0, rows, cols, w, err, errsz);
}

static void free_w(dp_llama *m, dp_weight *w)
{
    if (w->data)
        m->be->ops->weight_free(m->be, w);
}

void llama_destroy(dp_llama *m)
{
    if (!m)
        return;
    dp_backend *be = m->be;
    free_w(m, &m->tok_embd);
    free_w(m, &m->out_norm);
    free_w(m, &m->output);
    if (m->layers) {
        for (int32_t l = 0; l < m->hp.n_layers; l++) {
            layer_w *L = &m->layers[l];
            dp_weight *ws[] = {&L->attn_norm, &L->wq,     &L->wk,     &L->wv,     &L->wo,
                               &L->bq,        &L->bk,     &L->bv,     &L->q_norm, &L->k_norm,
                               &L->ffn_norm,  &L->w_gate, &L->w_up,   &L->w_down,
                               &L->post_attn_norm, &L->post_ffn_norm};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
                free_w(m, ws[i]);
        }
        free(m->layers);
    }
    free(m->pad_i32);
    free(m->pad_store);
    free(m->used);
    free(m->layer_map);
    float *factors[] = {m->rope_freqs, m->rope_long, m->rope_short};
    for (size_t i = 0; i < sizeof factors / sizeof factors[0]; i++)
        if (factors[i])
            be->ops->free(be, factors[i]);
    float *bufs[] = {m->x, m->xn, m->q, m->k, m->v, m->att, m->tmp, m->gate, m->up, m->outx, m->logits, m->capture_q};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            be->ops->free(be, bufs[i]);
    free(m);
}

/* The activation buffers: one table for llama_init_ex, which allocates
 * them, and llama_activation_bytes, which plans memory before a load. */
enum { ACT_X, ACT_XN, ACT_Q, ACT_K, ACT_V, ACT_ATT, ACT_TMP, ACT_GATE, ACT_UP, ACT_OUTX, ACT_LOGITS,
       ACT_CAPTURE, ACT_N };

static void act_floats(const dp_hparams *hp, int32_t max_tokens, int32_t max_out, bool capture,
                       size_t n[ACT_N])
{
    const size_t T = (size_t)max_tokens, qd = (size_t)hp->n_heads * (size_t)hp->head_dim;
    const size_t kvd = (size_t)hp->n_kv_heads * (size_t)hp->head_dim;
    n[ACT_X] = n[ACT_XN] = n[ACT_TMP] = T * (size_t)hp->dim;
    n[ACT_Q] = n[ACT_ATT] = T * qd;
    n[ACT_K] = n[ACT_V] = T * kvd;
    n[ACT_GATE] = n[ACT_UP] = T * (size_t)hp->ffn;
    n[ACT_OUTX] = (size_t)max_out * (size_t)hp->dim;
    n[ACT_LOGITS] = (size_t)max_out * (size_t)hp->vocab;
    n[ACT_CAPTURE] = capture ? (size_t)hp->n_layers * (size_t)capture_rows(max_tokens, max_out) * qd : 0;
}

size_t llama_activation_bytes(const dp_hparams *hp, int32_t max_tokens, int32_t max_out, bool capture)
{
    size_t n[ACT_N], sum = 0;
    act_floats(hp, max_tokens, max_out, capture, n);
    for (int i = 0; i < ACT_N; i++)
        sum += n[i] * sizeof(float);
    return sum;
}

/* A set of RoPE factors (hparams checked it: n_rot / 2 F32 values), in
 * backend memory for the rope op. */
static int load_factors(dp_llama *m, const dp_gguf *g, const char *name, float **out, char *err,
                        size_t errsz)
{
    const dp_gguf_tensor *t = gguf_find_tensor(g, name);
    const size_t bytes = (size_t)(m->hp.n_rot / 2) * sizeof(float);
    if (m->used)
        m->used[t - g->tensors] = 1;
    if (!(*out = m->be->ops->alloc(m->be, bytes)))
        return dp_err(err, errsz, DP_ENOMEM, "out of memory for the RoPE factors");
    int rc = m->be->ops->upload(m->be, *out, t->data, bytes);
    return rc ? dp_err(err, errsz, rc, "model: uploading %s failed", name) : 0;
}

/* Every tensor of the file is one the architecture's description loaded:
 * a tensor it does not know (a bias, a norm, a layer of another design)
 * would be a model run without part of itself. llama.cpp refuses such a
 * file too ("wrong number of tensors"). */
static int check_all_used(dp_llama *m, const dp_gguf *g, char *err, size_t errsz)
{
    uint64_t n = 0, first = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (!m->used[i] && n++ == 0)
            first = i;
    free(m->used);
    m->used = NULL;
    if (!n)
        return 0;
    const dp_gguf_str nm = g->tensors[first].name;
    char more[48] = "";
    if (n > 1)
        snprintf(more, sizeof more, " (and %llu more)", (unsigned long long)(n - 1));
    return dp_err(err, errsz, DP_EUNSUPPORTED,
                  "model: tensor '%.*s'%s is not part of architecture '%s' as implemented here: "
                  "refusing the file rather than running without it",
                  (int)(nm.len > 96 ? 96 : nm.len), nm.ptr, more, m->hp.arch);
}

/* Llama 3's factors, or LongRoPE's two sets (the short ones in use until
 * llama_set_context says the context passes the original one). */
static int load_rope_factors(dp_llama *m, const dp_gguf *g, char *err, size_t errsz)
{
    int rc = 0;
    if (m->hp.rope_freqs)
        rc = load_factors(m, g, "rope_freqs.weight", &m->rope_freqs, err, errsz);
    if (!rc && m->hp.longrope)
        rc = load_factors(m, g, "rope_factors_long.weight", &m->rope_long, err, errsz);
    if (!rc && m->hp.longrope)
        rc = load_factors(m, g, "rope_factors_short.weight", &m->rope_short, err, errsz);
    m->rope_ff = m->hp.longrope ? m->rope_short : m->rope_freqs;
    return rc;
}

void llama_set_context(dp_llama *m, int32_t n_ctx)
{
    if (m->hp.longrope)
        m->rope_ff = n_ctx > m->hp.n_ctx_orig ? m->rope_long : m->rope_short;
}

int llama_init(dp_llama **out, const dp_gguf *g, dp_backend *be, int32_t max_tokens,
               int32_t max_out, char *err, size_t errsz)
{
    return llama_init_ex(out, g, be, max_tokens, max_out, 0, err, errsz);
}

int llama_init_ex(dp_llama **out, const dp_gguf *g, dp_backend *be, int32_t max_tokens,
                  int32_t max_out, unsigned flags, char *err, size_t errsz)
{
    if (max_tokens < 1 || max_out < 1 || max_out > max_tokens)
        return dp_err(err, errsz, DP_EINVAL, "model: bad batch limits (%d tokens, %d outputs)",
                      max_tokens, max_out);
    dp_llama *m = calloc(1, sizeof *m);
    if (!m)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    m->be = be;
    m->max_tokens = max_tokens;
    m->max_out = max_out;
    m->capture = !(flags & DP_LLAMA_NO_CAPTURE);
    int rc = hparams_load(&m->hp, g, err, errsz);
    if (rc)
        goto fail;
    const dp_hparams *hp = &m->hp;
    const int64_t qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    m->used = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, 1);
    if (hp->swa_window > 0)
        m->layer_map = calloc((size_t)hp->n_layers, sizeof *m->layer_map);
    if (!m->layers || !m->used || (hp->swa_window > 0 && !m->layer_map)) {
        rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
        goto fail;
    }
    for (int32_t l = 0, ng = 0; m->layer_map && l < hp->n_layers; l++)
        m->layer_map[l] = hparams_layer_window(hp, l) > 0 ? -1 - m->n_swa++ : ng++;
    /* The global layers come every swa_period-th (hparams_layer_window). */
    m->g_first = hp->desc && hp->desc->swa_period > 0 ? hp->desc->swa_period - 1 : 0;
    m->g_step = hp->desc && hp->desc->swa_period > 0 ? hp->desc->swa_period : 1;
    if (m->layer_map && m->n_swa == hp->n_layers) { /* nothing to keep apart from */
        free(m->layer_map);
        m->layer_map = NULL;
        m->n_swa = 0;
    }
    if ((rc = load_w(m, g, "token_embd.weight", hp->vocab, hp->dim, &m->tok_embd, err, errsz)) ||
        (rc = load_w(m, g, "output_norm.weight", 1, hp->dim, &m->out_norm, err, errsz)))
        goto fail;
    if (!hp->tied_output &&
        (rc = load_w(m, g, "output.weight", hp->vocab, hp->dim, &m->output, err, errsz)))
        goto fail;
    for (int32_t l = 0; l < hp->n_layers; l++) {
        layer_w *L = &m->layers[l];
        char name[96];
#define LW(field, suffix, rows, cols)                                                  \
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, suffix);                        \
    if ((rc = load_w(m, g, name, rows, cols, &L->field, err, errsz)))                  \
        goto fail;
#define LB(field, suffix, cols)                                                        \
    snprintf(name, sizeof name, "blk.%d.%s.bias", l, suffix);                          \
    if ((rc = load_w(m, g, name, 1, cols, &L->field, err, errsz)))                     \
        goto fail;
        LW(attn_norm, "attn_norm", 1, hp->dim);
        snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
        if (hp->desc->fused && gguf_find_tensor(g, name)) {
            /* Phi-3's fused projection: Q's rows, then K's, then V's. */
            const int64_t all = qd + 2 * kvd;
            if ((rc = load_w_rows(m, g, name, all, 0, qd, hp->dim, &L->wq, err, errsz)) ||
                (rc = load_w_rows(m, g, name, all, qd, kvd, hp->dim, &L->wk, err, errsz)) ||
                (rc = load_w_rows(m, g, name, all, qd + kvd, kvd, hp->dim, &L->wv, err, errsz)))
                goto fail;
        } else {
            LW(wq, "attn_q", qd, hp->dim);
            LW(wk, "attn_k", kvd, hp->dim);
            LW(wv, "attn_v", kvd, hp->dim);
        }
        LW(wo, "attn_output", hp->dim, qd);
        if (hp->desc->qkv_bias) {
            LB(bq, "attn_q", qd);
            LB(bk, "attn_k", kvd);
            LB(bv, "attn_v", kvd);
        }
        if (hp->desc->qk_norm) {
            LW(q_norm, "attn_q_norm", 1, hp->head_dim);
            LW(k_norm, "attn_k_norm", 1, hp->head_dim);
        }
        LW(ffn_norm, "ffn_norm", 1, hp->dim);
        if (hp->desc->fused) {
            /* Phi-3's ffn_up: the gate's rows, then the up projection's. */
            snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
            const int64_t all = 2 * (int64_t)hp->ffn;
            if ((rc = load_w_rows(m, g, name, all, 0, hp->ffn, hp->dim, &L->w_gate, err, errsz)) ||
                (rc = load_w_rows(m, g, name, all, hp->ffn, hp->ffn, hp->dim, &L->w_up, err,
                                  errsz)))
                goto fail;
        } else {
            LW(w_gate, "ffn_gate", hp->ffn, hp->dim);
            LW(w_up, "ffn_up", hp->ffn, hp->dim);
        }
        LW(w_down, "ffn_down", hp->dim, hp->ffn);
        if (hp->desc->gemma) {
            LW(post_attn_norm, "post_attention_norm", 1, hp->dim);
            LW(post_ffn_norm, "post_ffw_norm", 1, hp->dim);
        }
#undef LW
#undef LB
    }
    if ((rc = load_rope_factors(m, g, err, errsz)) || (rc = check_all_used(m, g, err, errsz)))
        goto fail;
    size_t n[ACT_N];
    act_floats(hp, max_tokens, max_out, m->capture, n);
    float **acts[ACT_N] = {[ACT_X] = &m->x, [ACT_XN] = &m->xn, [ACT_Q] = &m->q, [ACT_K] = &m->k,
                           [ACT_V] = &m->v, [ACT_ATT] = &m->att, [ACT_TMP] = &m->tmp,
                           [ACT_GATE] = &m->gate, [ACT_UP] = &m->up, [ACT_OUTX] = &m->outx,
                           [ACT_LOGITS] = &m->logits, [ACT_CAPTURE] = &m->capture_q};
    for (int i = 0; i < ACT_N; i++) {
        if (!n[i])
            continue;
        *acts[i] = be->ops->alloc(be, n[i] * sizeof(float));
        if (!*acts[i]) {
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory for activations (%d tokens)", max_tokens);
            goto fail;
        }
    }
    *out = m;
    return 0;
fail:
    llama_destroy(m);
    return rc;
}

/* Every block token i attends to through (slot, store, tables) exists:
 * from slot 0, or (window > 0) from its window's first slot. */
static bool check_slots(const dp_kv_layout *const *layouts, const dp_batch *b, int32_t i,
                        const int32_t *slot, int32_t store, const int32_t *tables,
                        int32_t max_blocks, int32_t min_layers, int32_t window)
{
    if (slot[i] < 0 || store >= DP_KV_MAX_STORES)
        return false;
    const dp_kv_layout *l = layouts[store];
    if (!l || l->n_layers < min_layers)
        return false;
    int32_t bi = slot[i] / l->block_tokens;
    if (dp_kv_type_grouped(l->type)) {
        /* Its groups, then its residual (backend.h seq_sealed); a token is
         * written to the residual only. */
        if (!b->seq_sealed || !b->seq_roff || l->base_tokens < 1)
            return false;
        const int32_t sealed = b->seq_sealed[b->seq[i]], roff = b->seq_roff[b->seq[i]];
        if (sealed < 0 || !dp_kv_group_sealed_ok(l->base_tokens, l->block_tokens, sealed) ||
            roff < 0 || roff >= l->base_tokens || slot[i] < sealed)
            return false;
        bi = dp_kv_group_rstart(l->base_tokens, l->block_tokens, sealed) +
             (int32_t)(((int64_t)slot[i] - sealed + roff) / l->base_tokens);
    }
    if (bi >= max_blocks)
        return false;
    const int32_t first = window > 0 && slot[i] + 1 > window ? (slot[i] + 1 - window) / l->block_tokens : 0;
    for (int32_t j = first; j <= bi; j++) {
        int32_t blk = tables[(size_t)b->seq[i] * (size_t)max_blocks + (size_t)j];
        if (blk < 0 || blk >= l->n_blocks)
            return false;
    }
    return true;
}

/* The backend trusts the batch; a bad index here would be a stray write. */
static int check_batch(const dp_llama *m, const dp_batch *b, dp_kv_store *const *stores)
{
    const dp_kv_layout *layouts[DP_KV_MAX_STORES] = {0};
    for (int i = 0; i < DP_KV_MAX_STORES; i++)
        if (stores[i]) {
            layouts[i] = m->be->ops->kv_layout(m->be, stores[i]);
            /* (A store of fewer layers serves exempt layers only.) */
            if (layouts[i]->n_kv_heads != m->hp.n_kv_heads ||
                layouts[i]->head_dim != m->hp.head_dim || layouts[i]->n_layers > m->hp.n_layers)
                return DP_EINVAL;
        }
    if (b->n_tokens < 1 || b->n_tokens > m->max_tokens || b->n_out < 0 || b->n_out > m->max_out ||
        b->n_seqs < 1 || b->max_blocks < 1 || b->n_exempt < 0 || b->n_exempt > m->hp.n_layers)
        return DP_EINVAL;
    const bool x = b->n_exempt > 0;
    if (x && (!b->x_slot || !b->x_seq_store || !b->x_block_tables || b->x_max_blocks < 1))
        return DP_EINVAL;
    /* Sliding-window layers apart: the model's own map, a store holding
     * them, no exempt layers beside them. */
    const bool w = b->layer_map != NULL;
    int32_t n_global = m->hp.n_layers;
    if (w) {
        if (b->layer_map != m->layer_map || x || b->w_store < 0 ||
            b->w_store >= DP_KV_MAX_STORES || !layouts[b->w_store] || !b->w_block_tables ||
            b->w_max_blocks < 1 || layouts[b->w_store]->n_layers < m->n_swa ||
            dp_kv_type_grouped(layouts[b->w_store]->type))
            return DP_EINVAL;
        n_global -= m->n_swa;
    }
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->hp.vocab || b->seq[i] < 0 ||
            b->seq[i] >= b->n_seqs || b->pos[i] < 0)
            return DP_EINVAL;
        if (!check_slots(layouts, b, i, b->slot, b->seq_store[b->seq[i]], b->block_tables,
                         b->max_blocks, n_global, 0) ||
            (x && !check_slots(layouts, b, i, b->x_slot, b->x_seq_store[b->seq[i]],
                               b->x_block_tables, b->x_max_blocks, b->n_exempt, 0)))
            return DP_EINVAL;
        /* (The sliding view: every sequence in one store, the position as
         * its slot, blocks from the window on.) */
        if (w && !check_slots(layouts, b, i, b->pos, b->w_store, b->w_block_tables,
                              b->w_max_blocks, m->n_swa, m->hp.swa_window))
            return DP_EINVAL;
        /* A window counts slots (backend.h attention): a grouped store's
         * sequence is a compacted one, whose slots are not positions; with
         * the sliding layers apart, only the global layers read it. */
        if (!w && m->hp.swa_window > 0 &&
            dp_kv_type_grouped(layouts[b->seq_store[b->seq[i]]]->type))
            return DP_EUNSUPPORTED;
    }
    for (int32_t i = 0; i < b->n_out; i++)
        if (b->out_tokens[i] < 0 || b->out_tokens[i] >= b->n_tokens)
            return DP_EINVAL;
    if (b->n_capture < 0 || b->n_capture > llama_capture_capacity(m))
        return DP_EINVAL;
    for (int32_t i = 0; i < b->n_capture; i++)
        if (b->capture_tokens[i] < 0 || b->capture_tokens[i] >= b->n_tokens)
            return DP_EINVAL;
    return 0;
}

/* Matmuls of one input: together where the backend can (backend.h
 * matmul_shared), else one by one. */
static void matmul_shared(dp_backend *be, float *const *ys, const float *x,
                          const dp_weight *const *ws, int32_t nw, int32_t n)
{
    if (be->ops->matmul_shared) {
        be->ops->matmul_shared(be, ys, x, ws, nw, n);
        return;
    }
    for (int32_t i = 0; i < nw; i++)
        be->ops->matmul(be, ys[i], x, ws[i], n);
}

/* The ops of one step, top to bottom (after batch_set). */
static void issue_step(dp_llama *m, const dp_batch *b, dp_kv_store *const *stores)
{
    const dp_hparams *hp = &m->hp;
    const dp_arch *a = hp->desc;
    const dp_backend_ops *op = m->be->ops;
    dp_backend *be = m->be;
    const int32_t n = b->n_tokens;
    /* [0]: global layers; [1]: sliding-window layers (their own base, no
     * scaling: Gemma 3's local layers). */
    const dp_rope_params rp[2] = {
        {hp->n_rot, hp->rope_base, hp->rope_freq_scale, a->rope_neox, m->rope_ff, hp->rope_mscale,
         hp->yarn_ext, hp->yarn_lo, hp->yarn_hi},
        {hp->n_rot, a->rope_base_swa, 1.0f, a->rope_neox, NULL, 1.0f, 0.0f, 0.0f, 0.0f}};
    const int64_t kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    const int64_t qd = (int64_t)hp->n_heads * hp->head_dim;

    op->embed(be, &m->tok_embd, m->x, n);
    if (a->gemma)
        op->scale(be, m->x, sqrtf((float)hp->dim), (int64_t)n * hp->dim);
    for (int32_t l = 0; l < hp->n_layers; l++) {
        const layer_w *L = &m->layers[l];
        const int32_t window = hparams_layer_window(hp, l);
        /* Attention block. */
        op->rmsnorm(be, m->xn, m->x, &L->attn_norm, n, hp->dim, hp->rms_eps);
        matmul_shared(be, (float *const[]){m->q, m->k, m->v}, m->xn,
                      (const dp_weight *const[]){&L->wq, &L->wk, &L->wv}, 3, n);
        if (a->qkv_bias) {
            op->add_bias(be, m->q, &L->bq, n, (int32_t)qd);
            op->add_bias(be, m->k, &L->bk, n, (int32_t)kvd);
            op->add_bias(be, m->v, &L->bv, n, (int32_t)kvd);
        }
        if (a->qk_norm) { /* each head its own row */
            op->rmsnorm(be, m->q, m->q, &L->q_norm, n * hp->n_heads, hp->head_dim, hp->rms_eps);
            op->rmsnorm(be, m->k, m->k, &L->k_norm, n * hp->n_kv_heads, hp->head_dim, hp->rms_eps);
        }
        op->rope(be, m->q, m->k, n, hp->n_heads, hp->n_kv_heads, hp->head_dim, &rp[window > 0]);
        if (b->n_capture > 0)
            op->capture_rows(be, m->capture_q + (size_t)l * b->n_capture * qd, m->q, (int32_t)qd);
        op->kv_write(be, stores, l, m->k, m->v);
        op->attention(be, stores, l, m->att, m->q, hp->n_heads, hp->attn_scale, window);
        op->matmul(be, m->tmp, m->att, &L->wo, n);
        if (a->gemma)
            op->rmsnorm(be, m->tmp, m->tmp, &L->post_attn_norm, n, hp->dim, hp->rms_eps);
        op->add(be, m->x, m->tmp, (int64_t)n * hp->dim);
        /* Feed-forward block (SwiGLU; Gemma: GELU-gated). */
        op->rmsnorm(be, m->xn, m->x, &L->ffn_norm, n, hp->dim, hp->rms_eps);
        matmul_shared(be, (float *const[]){m->gate, m->up}, m->xn,
                      (const dp_weight *const[]){&L->w_gate, &L->w_up}, 2, n);
        if (a->gemma)
            op->geglu(be, m->gate, m->gate, m->up, (int64_t)n * hp->ffn);
        else
            op->swiglu(be, m->gate, m->gate, m->up, (int64_t)n * hp->ffn);
        op->matmul(be, m->tmp, m->gate, &L->w_down, n);
        if (a->gemma)
            op->rmsnorm(be, m->tmp, m->tmp, &L->post_ffn_norm, n, hp->dim, hp->rms_eps);
        op->add(be, m->x, m->tmp, (int64_t)n * hp->dim);
    }
    if (b->n_out == 0)
        return;
    /* Only the rows whose logits are wanted go through the output head. */
    op->gather_rows(be, m->xn, m->x, hp->dim);
    op->rmsnorm(be, m->outx, m->xn, &m->out_norm, b->n_out, hp->dim, hp->rms_eps);
    op->matmul(be, m->logits, m->outx, hp->tied_output ? &m->tok_embd : &m->output, b->n_out);
}

/* A decode step (one token per sequence, nothing captured) padded to the
 * size the backend asks for (step_pad): padding tokens after the real ones,
 * each its own sequence, slot -1, its output row after the real ones. The
 * real rows' logits stay first, so callers read them as before. Returns b
 * itself when there is nothing to pad (or no room). */
static const dp_batch *pad_step(dp_llama *m, const dp_batch *b, dp_batch *pb)
{
    const dp_backend_ops *op = m->be->ops;
    const int32_t n = b->n_tokens;
    if (!op->step_pad || b->n_out != n || b->n_exempt > 0 || b->layer_map ||
        !dp_batch_is_decode(b))
        return b;
    const int32_t N = op->step_pad(m->be, n);
    if (N <= n || N > m->max_tokens || N > m->max_out)
        return b;
    const size_t mb = (size_t)b->max_blocks;
    const size_t need = 7 * (size_t)N + (size_t)N * mb;
    if (need > m->pad_cap_i32) {
        int32_t *p = realloc(m->pad_i32, need * sizeof *p);
        if (!p)
            return b; /* unpadded is still correct */
        m->pad_i32 = p;
        m->pad_cap_i32 = need;
    }
    if ((size_t)N > m->pad_cap_store) {
        uint8_t *p = realloc(m->pad_store, (size_t)N);
        if (!p)
            return b;
        m->pad_store = p;
        m->pad_cap_store = (size_t)N;
    }
    int32_t *tokens = m->pad_i32, *pos = tokens + N, *seq = pos + N, *slot = seq + N;
    int32_t *out = slot + N, *sealed = out + N, *roff = sealed + N, *tables = roff + N;
    memcpy(tokens, b->tokens, (size_t)n * sizeof *tokens);
    memcpy(pos, b->pos, (size_t)n * sizeof *pos);
    memcpy(seq, b->seq, (size_t)n * sizeof *seq);
    memcpy(slot, b->slot, (size_t)n * sizeof *slot);
    memcpy(out, b->out_tokens, (size_t)n * sizeof *out);
    memcpy(tables, b->block_tables, (size_t)n * mb * sizeof *tables);
    memcpy(m->pad_store, b->seq_store, (size_t)n);
    for (int32_t i = n; i < N; i++) {
        tokens[i] = 0;
        pos[i] = 0;
        seq[i] = i;
        slot[i] = -1;
        out[i] = i;
        m->pad_store[i] = b->seq_store[0]; /* a store that exists; never read */
    }
    memset(tables + (size_t)n * mb, 0, (size_t)(N - n) * mb * sizeof *tables);
    /* Grouped stores' arrays cover every sequence too (a backend reads them
     * for all n_seqs); a padding row's are never used. */
    if (b->seq_sealed) {
        memcpy(sealed, b->seq_sealed, (size_t)n * sizeof *sealed);
        memcpy(roff, b->seq_roff, (size_t)n * sizeof *roff);
        for (int32_t i = n; i < N; i++)
            sealed[i] = roff[i] = 0;
    }
    *pb = *b;
    pb->n_tokens = N;
    pb->n_seqs = N;
    pb->n_out = N;
    pb->tokens = tokens;
    pb->pos = pos;
    pb->seq = seq;
    pb->slot = slot;
    pb->out_tokens = out;
    pb->block_tables = tables;
    pb->seq_store = m->pad_store;
    if (b->seq_sealed) {
        pb->seq_sealed = sealed;
        pb->seq_roff = roff;
    }
    return pb;
}

/* The step up to the output head: the logits of the out_tokens are left in
 * m->logits (backend memory). A backend that records steps (backend.h,
 * step_begin) may replay this one instead of taking its ops again. */
static int forward_to_logits(dp_llama *m, const dp_batch *b, dp_kv_store *const *stores)
{
    const dp_backend_ops *op = m->be->ops;
    dp_backend *be = m->be;
    int rc = check_batch(m, b, stores);
    if (rc)
        return rc;
    dp_batch padded;
    b = pad_step(m, b, &padded);
    if ((rc = op->batch_set(be, b)))
        return rc;
    if (!op->step_begin) {
        issue_step(m, b, stores);
        return 0;
    }
    /* A recording abandoned half-way ran nothing: issue the step again (the
     * backend answers EAGER for this shape from then on). */
    for (int attempt = 0; attempt < 3; attempt++) {
        int mode = op->step_begin(be, m, stores);
        if (mode < 0)
            return mode;
        if (mode != DP_STEP_REPLAYED)
            issue_step(m, b, stores);
        rc = op->step_end(be);
        if (rc != DP_STEP_RETRY)
            return rc;
    }
    return DP_EIO;
}

int llama_forward(dp_llama *m, const dp_batch *b, dp_kv_store *const *stores, float *logits)
{
    int rc = forward_to_logits(m, b, stores);
    if (rc || b->n_out == 0)
        return rc;
    return m->be->ops->download(m->be, logits, m->logits,
                                (size_t)b->n_out * m->hp.vocab * sizeof(float));
}

int llama_forward_topk(dp_llama *m, const dp_batch *b, dp_kv_store *const *stores, int32_t k,
                       const float *temperature, const int32_t *mask_ids, int32_t n_mask,
                       const uint8_t *mask_rows, int32_t *ids, float *vals, float *row_max,
                       float *row_sum)
{
    if (!m->be->ops->logits_topk)
        return DP_EUNSUPPORTED;
    int rc = forward_to_logits(m, b, stores);
    if (rc || b->n_out == 0)
        return rc;
    return m->be->ops->logits_topk(m->be, m->logits, b->n_out, m->hp.vocab, k, temperature,
                                   mask_ids, n_mask, mask_rows, ids, vals, row_max, row_sum);
}

int llama_download_logits(dp_llama *m, int32_t n_out, float *logits)
{
    return llama_download_rows(m, 0, n_out, logits);
}

int llama_download_rows(dp_llama *m, int32_t first, int32_t n, float *logits)
{
    if (first < 0 || n < 0 || first > m->max_out - n)
        return DP_EINVAL;
    const size_t row = (size_t)m->hp.vocab;
    return m->be->ops->download(m->be, logits, m->logits + (size_t)first * row,
                                (size_t)n * row * sizeof(float));
}
