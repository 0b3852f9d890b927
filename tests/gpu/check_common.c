/* check_common.c: what every part of the GPU checks shares: the seeded
 * random stream, buffers on a backend, the comparison report, host batches
 * and synthetic models built in memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "model/llama.h"
#include "tools/synth_gguf.h"

#include "check_common.h"

uint64_t g_rs;
int g_failed;
int g_checks;

uint64_t rnd64(void)
{
    g_rs ^= g_rs << 13;
    g_rs ^= g_rs >> 7;
    g_rs ^= g_rs << 17;
    return g_rs;
}

float frand(void) /* uniform in [-1, 1) */
{
    return (float)((rnd64() >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
}

void fill(float *p, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * amp;
}

void die(int code, const char *fmt, const char *msg)
{
    fprintf(stderr, "check_kernels: ");
    fprintf(stderr, fmt, msg);
    fprintf(stderr, "\n");
    exit(code);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die(EXIT_SETUP, "%s", "out of host memory");
    return p;
}

/* ---- buffers on a backend --------------------------------------------------- */

float *dev_alloc(dp_backend *be, size_t n)
{
    float *p = be->ops->alloc(be, n * sizeof(float));
    if (!p)
        die(EXIT_SETUP, "%s: out of backend memory", be->ops->name);
    return p;
}

void dev_put(dp_backend *be, float *d, const float *h, size_t n)
{
    if (be->ops->upload(be, d, h, n * sizeof(float)))
        die(EXIT_SETUP, "%s: upload failed", be->ops->name);
}

void dev_get(dp_backend *be, float *h, const float *d, size_t n)
{
    if (be->ops->download(be, h, d, n * sizeof(float)))
        die(EXIT_CHECK, "%s: download failed (an op failed, see the log above)", be->ops->name);
}

/* Fills a backend buffer with NaN, so an element an op forgets to write shows. */
void dev_poison(dp_backend *be, float *d, size_t n)
{
    float *h = xmalloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    dev_put(be, d, h, n);
    free(h);
}

float *dev_from(dp_backend *be, const float *h, size_t n)
{
    float *d = dev_alloc(be, n);
    dev_put(be, d, h, n);
    return d;
}

/* ---- comparison ------------------------------------------------------------------ */

void report(const char *op, const char *what, const float *ref, const float *got, size_t n,
                   double tol)
{
    double num = 0, den = 0;
    size_t nan_got = 0, nan_ref = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            nan_got++;
            continue;
        }
        if (!isfinite(ref[i])) {
            nan_ref++;
            continue;
        }
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    double rel = sqrt(num / (den > 0 ? den : 1));
    bool ok = nan_got == 0 && nan_ref == 0 && rel <= tol;
    g_checks++;
    if (!ok)
        g_failed++;
    printf("  %-12s %-46s rel %.2e (tol %.0e)%s%s\n", op, what, rel, tol,
           nan_got ? "  NON-FINITE in cuda output" : (nan_ref ? "  NON-FINITE in cpu output" : ""),
           ok ? "  ok" : "  FAIL");
    if (nan_got)
        printf("  %-12s %zu of %zu elements not finite\n", "", nan_got, n);
}

/* ---- a batch on both backends ------------------------------------------------------ */

uint8_t *block_image(dp_backend *be, dp_kv_store *kv, int32_t block, size_t *bytes)
{
    dp_kv_layout one = *be->ops->kv_layout(be, kv);
    one.n_blocks = 1;
    *bytes = be->ops->kv_bytes_per_block(be, &one);
    uint8_t *img = xmalloc(*bytes);
    uint8_t *tmp = be->ops->host_alloc ? be->ops->host_alloc(be, *bytes) : img;
    if (!tmp || be->ops->kv_block_read(be, kv, block, tmp))
        die(EXIT_CHECK, "%s: kv_block_read failed", be->ops->name);
    dev_wait(be);
    if (tmp != img) {
        memcpy(img, tmp, *bytes);
        be->ops->host_free(be, tmp);
    }
    return img;
}

void report_same_bytes(const char *op, const char *what, const void *a, const void *b, size_t n)
{
    const bool same = n && memcmp(a, b, n) == 0;
    g_checks++;
    g_failed += !same;
    printf("  %-12s %-46s %s\n", op, what, same ? "identical  ok" : "DIFFERENT  FAIL");
}

void shuffle_ids(int32_t *a, int32_t n)
{
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)(rnd64() % (uint64_t)(i + 1)), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

void dev_wait(dp_backend *be)
{
    float *wait_dev = be->ops->alloc(be, sizeof(float)), wait_host;
    if (!wait_dev || be->ops->download(be, &wait_host, wait_dev, sizeof wait_host))
        die(EXIT_CHECK, "%s: waiting for queued copies failed", be->ops->name);
    be->ops->free(be, wait_dev);
}

void kv_write_host(dp_backend *be, dp_kv_store *const *st, int32_t layer, const float *k,
                   const float *v, size_t nkv)
{
    float *dk = dev_from(be, k, nkv), *dv = dev_from(be, v, nkv);
    be->ops->kv_write(be, st, layer, dk, dv);
    be->ops->free(be, dk);
    be->ops->free(be, dv);
}

void hbatch_alloc(hbatch *b, int32_t n_tokens, int32_t n_seqs, int32_t max_blocks)
{
    memset(b, 0, sizeof *b);
    b->n_tokens = n_tokens;
    b->n_seqs = n_seqs;
    b->max_blocks = max_blocks;
    b->tokens = xmalloc((size_t)n_tokens * sizeof(int32_t));
    b->pos = xmalloc((size_t)n_tokens * sizeof(int32_t));
    b->seq = xmalloc((size_t)n_tokens * sizeof(int32_t));
    b->slot = xmalloc((size_t)n_tokens * sizeof(int32_t));
    b->out_tokens = xmalloc((size_t)n_tokens * sizeof(int32_t));
    b->tables = calloc((size_t)n_seqs * (size_t)max_blocks, sizeof(int32_t));
    b->seq_store = calloc((size_t)n_seqs, 1);
    if (!b->tables || !b->seq_store)
        die(EXIT_SETUP, "%s", "out of host memory");
    for (int32_t i = 0; i < n_tokens; i++) {
        b->tokens[i] = 0;
        b->pos[i] = i;
        b->seq[i] = 0;
        b->slot[i] = 0;
        b->out_tokens[i] = i;
    }
}

void hbatch_free(hbatch *b)
{
    free(b->tokens);
    free(b->pos);
    free(b->seq);
    free(b->slot);
    free(b->out_tokens);
    free(b->tables);
    free(b->seq_store);
}

void hbatch_set(dp_backend *be, const hbatch *h)
{
    dp_batch b = {.n_tokens = h->n_tokens, .tokens = h->tokens, .pos = h->pos, .seq = h->seq,
                  .slot = h->slot, .n_seqs = h->n_seqs, .seq_store = h->seq_store,
                  .block_tables = h->tables, .max_blocks = h->max_blocks, .n_out = h->n_out,
                  .out_tokens = h->out_tokens, .seq_sealed = h->seq_sealed,
                  .seq_roff = h->seq_roff};
    if (be->ops->batch_set(be, &b))
        die(EXIT_SETUP, "%s: batch_set failed", be->ops->name);
}

/* ---- synthetic models ------------------------------------------------------------------
 * A LLaMA of a preset shape with seeded random weights, written to memory and
 * opened: every check and the benchmark use one, so nothing is downloaded. */

void synth_open(synth_model *sm, const char *preset, uint64_t seed, uint32_t type)
{
    char err[DP_ERRLEN] = "out of memory", msg[DP_ERRLEN + 64];
    if (synth_shape_preset(preset, &sm->sh)) {
        snprintf(msg, sizeof msg, "no %s preset", preset);
        die(EXIT_SETUP, "%s", msg);
    }
    gguf_writer w;
    size_t size;
    int rc = gguf_writer_init(&w);
    if (!rc) {
        /* The buffer is the writer's output, independent of the writer. */
        rc = synth_llama_build(&w, &sm->sh, seed, type, err, sizeof err);
        if (!rc)
            rc = gguf_writer_finish_mem(&w, &sm->buf, &size);
        gguf_writer_destroy(&w);
    }
    if (!rc && (rc = gguf_open_mem(&sm->g, sm->buf, size, err, sizeof err)))
        free(sm->buf);
    if (rc) {
        snprintf(msg, sizeof msg, "%s synthetic model: %s", preset, err);
        die(EXIT_SETUP, "%s", msg);
    }
}

void synth_close(synth_model *sm)
{
    gguf_close(&sm->g);
    free(sm->buf);
}

void model_kv_open(dp_backend *be, const dp_gguf *g, int32_t max_tokens, int32_t max_out, int32_t bt,
                   int32_t n_blocks, dp_llama **m, dp_kv_store **stores)
{
    char err[DP_ERRLEN];
    if (llama_init(m, g, be, max_tokens, max_out, err, sizeof err))
        die(EXIT_SETUP, "llama_init: %s", err);
    dp_kv_layout l = llama_kv_layout(*m, bt, n_blocks);
    for (int i = 0; i < DP_KV_MAX_STORES; i++)
        stores[i] = NULL;
    if (be->ops->kv_create(be, &l, &stores[0]))
        die(EXIT_SETUP, "%s", "kv_create failed");
}

void model_kv_close(dp_backend *be, dp_llama *m, dp_kv_store **stores)
{
    be->ops->kv_destroy(be, stores[0]);
    llama_destroy(m);
}

/* rows of a weight: quantized from random values where synth_quantize_row
 * writes the type, else (IQ4_NL, IQ4_XS) random bytes under a small f16
 * scale at the start of each block. */
uint8_t *weight_make(uint32_t type, int64_t rows, int64_t cols, float amp)
{
    uint64_t rb;
    if (quant_row_bytes(type, (uint64_t)cols, &rb))
        die(EXIT_SETUP, "%s", "bad weight shape");
    uint8_t *raw = xmalloc((size_t)rb * (size_t)rows);
    float *row = xmalloc((size_t)cols * sizeof *row);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *o = raw + (size_t)r * rb;
        fill(row, (size_t)cols, amp);
        const int rc = synth_quantize_row(type, row, o, cols);
        if (rc == DP_EUNSUPPORTED && (type == DP_TYPE_IQ4_NL || type == DP_TYPE_IQ4_XS)) {
            const size_t bb = quant_block_bytes(type);
            for (size_t i = 0; i < rb; i++)
                o[i] = (uint8_t)(rnd64() >> 56);
            for (size_t i = 0; i < rb; i += bb) {
                const uint16_t d = dp_f32_to_fp16(amp * (type == DP_TYPE_IQ4_NL ? 0.01f : 0.0003f));
                memcpy(o + i, &d, 2);
            }
        } else if (rc) {
            die(EXIT_SETUP, "%s", "synth_quantize_row failed");
        }
    }
    free(row);
    return raw;
}
