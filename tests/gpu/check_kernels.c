/* check_kernels.c: the CUDA backend against the CPU reference, op by op on
 * fresh random data; greedy generation on both (check_generate.c); then a
 * 7B-shaped benchmark with each figure's ratio to the device's physical
 * limit.
 *
 * Exit status: 0 all checks passed, 1 a check failed, 2 set-up error,
 * 3 no usable CUDA device (tests/gpu/check.sh relies on 3).
 *
 *   check_kernels [--seed N] [--no-bench] [--bench-only] [--bench-small] [--self-test]
 *                 [--faults] [--plan SIZE]
 *
 * The seed is 1 unless --seed gives another: a run repeats the last one.
 * --plan SIZE prints the benchmark's memory plan for a device of SIZE (80GiB,
 * 141GiB: check_bench.c) without a device, and exits 0 when every case fits.
 * --bench-small runs the benchmark code on a tiny model with tiny sizes (its
 * figures mean nothing; it checks the code path, e.g. under the emulator).
 * --self-test runs the comparisons with the CPU backend on both sides (no GPU
 * needed): it checks this program's own plumbing on a machine without one. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "kernels/quant.h"
#include "kernels/topk.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "tools/synth_gguf.h"

#include "check_common.h"

/* ---- op checks ----------------------------------------------------------------------- */

/* Types the CUDA backend keeps in their blocks (cuda_wquant.cu). */
static const uint32_t KEPT[] = {DP_TYPE_Q4_0, DP_TYPE_Q4_1, DP_TYPE_Q5_0,   DP_TYPE_Q5_1,
                                DP_TYPE_Q8_0, DP_TYPE_Q2_K, DP_TYPE_Q3_K,   DP_TYPE_Q4_K,
                                DP_TYPE_Q5_K, DP_TYPE_Q6_K, DP_TYPE_IQ4_NL, DP_TYPE_IQ4_XS};

/* A block-type weight on the CUDA backend takes its file size (the bytes
 * mem_usage counts), not its fp16 expansion. */
static void check_weight_bytes(dp_backend *be, uint32_t type, int64_t rows, int64_t cols, const void *raw)
{
    if (strcmp(be->ops->name, "cuda") != 0 || !be->ops->mem_usage)
        return;
    bool is_kept = false;
    for (size_t i = 0; i < sizeof KEPT / sizeof KEPT[0]; i++)
        is_kept |= KEPT[i] == type;
    uint64_t rb;
    if (quant_row_bytes(type, (uint64_t)cols, &rb))
        die(EXIT_SETUP, "%s", "bad weight shape");
    const size_t want = is_kept ? (size_t)rows * (size_t)rb : (size_t)rows * (size_t)cols * 2;
    size_t w0, w1, a;
    char err[DP_ERRLEN];
    dp_weight w;
    be->ops->mem_usage(be, &w0, &a);
    if (be->ops->weight_load(be, &w, type, rows, cols, raw, err, sizeof err))
        die(EXIT_SETUP, "weight_load: %s", err);
    be->ops->mem_usage(be, &w1, &a);
    be->ops->weight_free(be, &w);
    const bool ok = w1 - w0 == want;
    g_checks++;
    g_failed += !ok;
    printf("  %-12s %-46s %zu bytes on the device, %s %zu%s\n", "weight size", quant_type_name(type),
           w1 - w0, is_kept ? "file size" : "fp16", want, ok ? "  ok" : "  FAIL");
}

/* The CUDA backend's GEMV serves up to 8 rows (cuda_internal.h CUDA_WQ_GEMV_MAX). */
#define CUDA_WQ_GEMV_MAX_ROWS 8

static void check_matmul(dp_backend *be[2])
{
    /* m = 1 .. 8: the quantized types' GEMV (one, four or eight rows per
     * launch); 9 and more: their fp16 slabs and the GEMM. */
    const uint32_t types[] = {DP_TYPE_F32,  DP_TYPE_Q4_1, DP_TYPE_Q8_0, DP_TYPE_F16,
                              DP_TYPE_Q4_0, DP_TYPE_Q5_0, DP_TYPE_Q5_1, DP_TYPE_Q4_K,
                              DP_TYPE_Q5_K, DP_TYPE_Q6_K, DP_TYPE_Q2_K, DP_TYPE_Q3_K,
                              DP_TYPE_IQ4_NL, DP_TYPE_IQ4_XS};
    const int64_t shapes[][2] = {{96, 256}, {1000, 512}};
    const int32_t ms[] = {1, 3, 8, 9, 64, 300};
    /* The types after the first four run the large shape at the GEMV's
     * widest batch and the GEMM's narrowest only: the emulator's warp
     * shuffles are slow, and the small shape covers every path. */
    const size_t n_full = 4;
    char err[DP_ERRLEN], what[96];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t rows = shapes[si][0], cols = shapes[si][1];
            uint8_t *raw = weight_make(types[ti], rows, cols, 0.1f);
            if (si == 0)
                check_weight_bytes(be[1], types[ti], rows, cols, raw);
            dp_weight w[2];
            for (int b = 0; b < 2; b++)
                if (be[b]->ops->weight_load(be[b], &w[b], types[ti], rows, cols, raw, err, sizeof err))
                    die(EXIT_SETUP, "weight_load: %s", err);
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                const int32_t m = ms[mi];
                if (ti >= n_full && si > 0 && m != CUDA_WQ_GEMV_MAX_ROWS && m != CUDA_WQ_GEMV_MAX_ROWS + 1)
                    continue;
                float *x = xmalloc((size_t)m * (size_t)cols * sizeof *x);
                fill(x, (size_t)m * (size_t)cols, 1.0f);
                float *y[2];
                for (int b = 0; b < 2; b++) {
                    float *dx = dev_from(be[b], x, (size_t)m * (size_t)cols);
                    float *dy = dev_alloc(be[b], (size_t)m * (size_t)rows);
                    dev_poison(be[b], dy, (size_t)m * (size_t)rows);
                    be[b]->ops->matmul(be[b], dy, dx, &w[b], m);
                    y[b] = xmalloc((size_t)m * (size_t)rows * sizeof(float));
                    dev_get(be[b], y[b], dy, (size_t)m * (size_t)rows);
                    be[b]->ops->free(be[b], dx);
                    be[b]->ops->free(be[b], dy);
                }
                snprintf(what, sizeof what, "%s [%lld x %lld] m=%d", quant_type_name(types[ti]),
                         (long long)rows, (long long)cols, m);
                report("matmul", what, y[0], y[1], (size_t)m * (size_t)rows, TOL_GEMM);
                free(y[0]);
                free(y[1]);
                free(x);
            }
            for (int b = 0; b < 2; b++)
                be[b]->ops->weight_free(be[b], &w[b]);
            free(raw);
        }
}

static void check_rmsnorm(dp_backend *be[2])
{
    /* The last: Qwen 3's per-head norm of q (7 tokens x 16 heads of 128),
     * in place as the model runs it. */
    const int32_t cases[][3] = {{37, 576, 0}, {3, 4096, 0}, {1, 64, 0}, {7 * 16, 128, 1}};
    char err[DP_ERRLEN], what[64];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int32_t n = cases[ci][0], dim = cases[ci][1];
        const bool in_place = cases[ci][2] != 0;
        const size_t ne = (size_t)n * (size_t)dim;
        float *wv = xmalloc((size_t)dim * sizeof *wv), *x = xmalloc(ne * sizeof *x), *o[2];
        for (int32_t d = 0; d < dim; d++)
            wv[d] = 1.0f + 0.2f * frand();
        fill(x, ne, 3.0f);
        for (int b = 0; b < 2; b++) {
            dp_weight w;
            if (be[b]->ops->weight_load(be[b], &w, DP_TYPE_F32, 1, dim, wv, err, sizeof err))
                die(EXIT_SETUP, "weight_load: %s", err);
            float *dx = dev_from(be[b], x, ne), *dout = in_place ? dx : dev_alloc(be[b], ne);
            if (!in_place)
                dev_poison(be[b], dout, ne);
            be[b]->ops->rmsnorm(be[b], dout, dx, &w, n, dim, 1e-5f);
            o[b] = xmalloc(ne * sizeof(float));
            dev_get(be[b], o[b], dout, ne);
            be[b]->ops->free(be[b], dx);
            if (!in_place)
                be[b]->ops->free(be[b], dout);
            be[b]->ops->weight_free(be[b], &w);
        }
        snprintf(what, sizeof what, "n=%d dim=%d%s", n, dim, in_place ? " in place" : "");
        report("rmsnorm", what, o[0], o[1], ne, TOL_EW);
        free(o[0]);
        free(o[1]);
        free(wv);
        free(x);
    }
}

/* rmsnorm leaves an fp16 copy of its output for the matmuls that follow
 * (CUDA: one conversion launch fewer per matmul). The copy must serve every
 * matmul of the normalized rows and must be forgotten as soon as the buffer
 * changes: here the buffer is rewritten by an upload, then by an add, and
 * last a matmul of other rows (which converts those) writes it. */
static void check_norm_matmul(dp_backend *be[2])
{
    const int32_t n = 9, dim = 256, rows = 96;
    char err[DP_ERRLEN];
    uint64_t rb;
    if (quant_row_bytes(DP_TYPE_F16, (uint64_t)dim, &rb))
        die(EXIT_SETUP, "%s", "bad matmul shape");
    uint8_t *raw = xmalloc((size_t)rb * rows), *sq = xmalloc((size_t)rb * dim);
    float *row = xmalloc((size_t)dim * sizeof *row);
    for (int32_t r = 0; r < rows; r++) {
        fill(row, (size_t)dim, 0.1f);
        if (synth_quantize_row(DP_TYPE_F16, row, raw + (size_t)r * rb, dim))
            die(EXIT_SETUP, "%s", "synth_quantize_row failed");
    }
    for (int32_t r = 0; r < dim; r++) {
        fill(row, (size_t)dim, 0.1f);
        if (synth_quantize_row(DP_TYPE_F16, row, sq + (size_t)r * rb, dim))
            die(EXIT_SETUP, "%s", "synth_quantize_row failed");
    }
    const size_t ne = (size_t)n * dim, ny = (size_t)n * rows;
    float *x = xmalloc(ne * sizeof *x), *x2 = xmalloc(ne * sizeof *x2), *wv = xmalloc(dim * sizeof *wv);
    fill(x, ne, 3.0f);
    fill(x2, ne, 2.0f);
    for (int32_t d = 0; d < dim; d++)
        wv[d] = 1.0f + 0.2f * frand();
    float *y[2][5];
    for (int b = 0; b < 2; b++) {
        dp_weight w, nw, ws;
        if (be[b]->ops->weight_load(be[b], &w, DP_TYPE_F16, rows, dim, raw, err, sizeof err) ||
            be[b]->ops->weight_load(be[b], &ws, DP_TYPE_F16, dim, dim, sq, err, sizeof err) ||
            be[b]->ops->weight_load(be[b], &nw, DP_TYPE_F32, 1, dim, wv, err, sizeof err))
            die(EXIT_SETUP, "weight_load: %s", err);
        float *dx = dev_from(be[b], x, ne), *dn = dev_alloc(be[b], ne), *dy = dev_alloc(be[b], ny);
        const dp_backend_ops *op = be[b]->ops;
        for (int k = 0; k < 5; k++)
            y[b][k] = xmalloc(ny * sizeof(float));
        op->rmsnorm(be[b], dn, dx, &nw, n, dim, 1e-5f);
        op->matmul(be[b], dy, dn, &w, n); /* from the fused copy */
        dev_get(be[b], y[b][0], dy, ny);
        op->matmul(be[b], dy, dn, &w, n); /* again: the copy still holds */
        dev_get(be[b], y[b][1], dy, ny);
        dev_put(be[b], dn, x2, ne);        /* the buffer changes behind it */
        op->matmul(be[b], dy, dn, &w, n);
        dev_get(be[b], y[b][2], dy, ny);
        op->add(be[b], dn, dx, (int64_t)ne); /* and again, by an op */
        op->matmul(be[b], dy, dn, &w, n);
        dev_get(be[b], y[b][3], dy, ny);
        op->rmsnorm(be[b], dn, dx, &nw, n, dim, 1e-5f);
        op->matmul(be[b], dn, dx, &ws, n); /* dn written by a matmul of dx */
        op->matmul(be[b], dy, dn, &w, n);
        dev_get(be[b], y[b][4], dy, ny);
        op->free(be[b], dx);
        op->free(be[b], dn);
        op->free(be[b], dy);
        op->weight_free(be[b], &w);
        op->weight_free(be[b], &ws);
        op->weight_free(be[b], &nw);
    }
    const char *whats[5] = {"rmsnorm then matmul (fp16 copy reused)", "a second matmul of the same rows",
                            "after an upload into the rows", "after an add into the rows",
                            "after a matmul wrote the rows"};
    for (int k = 0; k < 5; k++) {
        report("norm+matmul", whats[k], y[0][k], y[1][k], ny, TOL_GEMM);
        free(y[0][k]);
        free(y[1][k]);
    }
    free(raw);
    free(sq);
    free(row);
    free(x);
    free(x2);
    free(wv);
}

/* logits_topk: ids, values, the row max and the row sum must equal the CPU
 * reference exactly (the same total order on the same floats; the sum adds
 * integer weights, so its order does not matter), and the masked rows of
 * the logits buffer must read -inf at the masked ids afterwards, nothing
 * else changed. Rows have their own temperatures (a greedy one, <= 0, counts
 * as 1); rows: random logits, heavy ties (ids decide), NaN and -inf entries,
 * and a row of nothing but -inf. */
static void check_topk(dp_backend *be[2])
{
    if (!be[0]->ops->logits_topk || !be[1]->ops->logits_topk) {
        printf("  %-12s %s\n", "logits_topk", "not in this build");
        return;
    }
    const struct { int32_t n, vocab, k; float temp[5]; } cases[] = {
        {3, 49152, 256, {0.8f, 1.0f, 0.3f}},
        {4, 1000, 1, {1.0f, 0.0f, 2.0f, 0.7f}},
        {2, 300, 256, {0.3f, 1.7f}},
        {5, 4096, 40, {1.5f, 0.5f, -1.0f, 1.0f, 0.9f}}};
    const int32_t mask_ids[] = {2, 9, 11, 5000000, -3}; /* out of range ids are ignored */
    char what[96];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int32_t n = cases[ci].n, vocab = cases[ci].vocab, k = cases[ci].k;
        const size_t ne = (size_t)n * vocab, nk = (size_t)n * k;
        float *x = xmalloc(ne * sizeof *x);
        fill(x, ne, 8.0f);
        if (n > 1) /* row 1: few distinct values, so ties must rank by id */
            for (int32_t i = 0; i < vocab; i++)
                x[(size_t)vocab + i] = (float)(int)(4.0f * frand());
        x[5] = NAN;
        x[7] = -INFINITY;
        x[9] = 40.0f; /* the max until the mask takes it */
        x[vocab - 1] = 30.0f;
        if (n > 3) /* row 3: nothing but -inf */
            for (int32_t i = 0; i < vocab; i++)
                x[(size_t)3 * vocab + i] = -INFINITY;
        uint8_t mask_rows[5] = {1, 0, 0, 1, 1}; /* row 0 loses its max */
        int32_t *ids[2];
        float *vals[2], *mx[2], *sum[2], *after[2];
        for (int b = 0; b < 2; b++) {
            ids[b] = xmalloc(nk * sizeof(int32_t));
            vals[b] = xmalloc(nk * sizeof(float));
            mx[b] = xmalloc((size_t)n * sizeof(float));
            sum[b] = xmalloc((size_t)n * sizeof(float));
            after[b] = xmalloc(ne * sizeof(float));
            float *dx = dev_from(be[b], x, ne);
            if (be[b]->ops->logits_topk(be[b], dx, n, vocab, k, cases[ci].temp, mask_ids, 5,
                                        mask_rows, ids[b], vals[b], mx[b], sum[b]) ||
                be[b]->ops->download(be[b], after[b], dx, ne * sizeof(float)))
                die(EXIT_CHECK, "%s: logits_topk failed", be[b]->ops->name);
            be[b]->ops->free(be[b], dx);
        }
        bool same = memcmp(ids[0], ids[1], nk * sizeof(int32_t)) == 0 &&
                    memcmp(vals[0], vals[1], nk * sizeof(float)) == 0 &&
                    memcmp(mx[0], mx[1], (size_t)n * sizeof(float)) == 0 &&
                    memcmp(sum[0], sum[1], (size_t)n * sizeof(float)) == 0 &&
                    memcmp(after[0], after[1], ne * sizeof(float)) == 0;
        /* The reference itself: descending from the max, the masked ids
         * gone, and the sum is the definition's (kernels/topk.h) in the
         * plainest order. */
        for (int32_t r = 0; r < n && same; r++) {
            const float *row = after[0] + (size_t)r * vocab;
            for (int32_t i = 1; i < k; i++)
                if (vals[0][(size_t)r * k + i] > vals[0][(size_t)r * k + i - 1])
                    same = false;
            for (int32_t j = 0; j < 3 && mask_rows[r]; j++)
                same = same && row[mask_ids[j]] == -INFINITY;
            const float T = cases[ci].temp[r] > 0.0f ? cases[ci].temp[r] : 1.0f;
            const float inv_t = 1.0f / T, m = mx[0][r];
            uint64_t w = 0;
            for (int32_t i = 0; i < vocab && isfinite(m); i++)
                w += dp_topk_weight((row[i] - m) * inv_t);
            same = same && sum[0][r] == (isfinite(m) ? dp_topk_sum_float(w) : 0.0f) &&
                   (m == -INFINITY || vals[0][(size_t)r * k] == m);
        }
        same = same && memcmp(after[0] + vocab, x + vocab, (size_t)vocab * sizeof(float)) == 0;
        snprintf(what, sizeof what, "%d rows x %d, k=%d: ids, values, max, sum, mask", n, vocab, k);
        g_checks++;
        g_failed += !same;
        printf("  %-12s %-46s %s\n", "logits_topk", what, same ? "identical  ok" : "DIFFERENT  FAIL");
        for (int b = 0; b < 2; b++) {
            free(ids[b]);
            free(vals[b]);
            free(mx[b]);
            free(sum[b]);
            free(after[b]);
        }
        free(x);
    }
}

static void check_rope(dp_backend *be[2])
{
    struct {
        int32_t n, n_heads, n_kv, hd, n_rot;
        float base, scale;
        bool neox;
        int32_t max_pos;
        bool factors; /* Llama 3's per-pair factors (rope_freqs) */
        bool yarn;    /* YaRN's mix (Qwen's long-context setting) */
    } cases[] = {
        {33, 4, 2, 64, 64, 10000.0f, 1.0f, false, 4096, false, false},
        {17, 8, 8, 128, 128, 500000.0f, 1.0f, false, 120000, false, false},
        {9, 6, 2, 128, 64, 10000.0f, 0.25f, true, 30000, false, false},
        {21, 8, 2, 64, 64, 500000.0f, 1.0f, false, 100000, true, false},
        {5, 4, 4, 128, 128, 1000000.0f, 1.0f, true, 30000, true, false},
        {13, 4, 2, 128, 128, 1000000.0f, 0.25f, true, 120000, false, true},
    };
    char what[96];
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int32_t n = cases[ci].n, hd = cases[ci].hd;
        const size_t nq = (size_t)n * cases[ci].n_heads * hd, nk = (size_t)n * cases[ci].n_kv * hd;
        hbatch hb;
        hbatch_alloc(&hb, n, 1, 1);
        for (int32_t i = 0; i < n; i++)
            hb.pos[i] = (int32_t)(rnd64() % (uint64_t)cases[ci].max_pos);
        float *q = xmalloc(nq * sizeof *q), *k = xmalloc(nk * sizeof *k);
        fill(q, nq, 1.0f);
        fill(k, nk, 1.0f);
        float *oq[2], *ok[2];
        /* Factors as Llama 3's are shaped: 1 for the fast pairs, up to 8 for
         * the slow ones. */
        const int32_t half = cases[ci].n_rot / 2;
        float *ff = xmalloc((size_t)half * sizeof *ff);
        for (int32_t d = 0; d < half; d++)
            ff[d] = 1.0f + 7.0f * (float)d / (float)half + 0.1f * frand();
        for (int b = 0; b < 2; b++) {
            hbatch_set(be[b], &hb);
            float *dq = dev_from(be[b], q, nq), *dk = dev_from(be[b], k, nk);
            float *dff = cases[ci].factors ? dev_from(be[b], ff, (size_t)half) : NULL;
            /* (With factors, LongRoPE's attention factor too; with a
             * scale, YaRN's mix over pairs 3..20.) */
            const bool yarn = cases[ci].yarn;
            dp_rope_params rp = {cases[ci].n_rot, cases[ci].base, cases[ci].scale, cases[ci].neox,
                                 dff, cases[ci].factors ? 1.19f : 1.0f, yarn ? 1.0f : 0.0f,
                                 3.0f, 20.0f};
            be[b]->ops->rope(be[b], dq, dk, n, cases[ci].n_heads, cases[ci].n_kv, hd, &rp);
            if (dff)
                be[b]->ops->free(be[b], dff);
            oq[b] = xmalloc(nq * sizeof(float));
            ok[b] = xmalloc(nk * sizeof(float));
            dev_get(be[b], oq[b], dq, nq);
            dev_get(be[b], ok[b], dk, nk);
            be[b]->ops->free(be[b], dq);
            be[b]->ops->free(be[b], dk);
        }
        snprintf(what, sizeof what, "q hd=%d n_rot=%d %s pos<%d%s", hd, cases[ci].n_rot,
                 cases[ci].neox ? "neox" : "pairs", cases[ci].max_pos,
                 cases[ci].factors ? " factors" : cases[ci].yarn ? " yarn" : "");
        report("rope", what, oq[0], oq[1], nq, TOL_EW);
        snprintf(what, sizeof what, "k hd=%d n_rot=%d %s pos<%d%s", hd, cases[ci].n_rot,
                 cases[ci].neox ? "neox" : "pairs", cases[ci].max_pos,
                 cases[ci].factors ? " factors" : cases[ci].yarn ? " yarn" : "");
        report("rope", what, ok[0], ok[1], nk, TOL_EW);
        for (int b = 0; b < 2; b++) {
            free(oq[b]);
            free(ok[b]);
        }
        free(q);
        free(k);
        free(ff);
        hbatch_free(&hb);
    }
}

/* A projection's bias added to each row (Qwen 2's Q, K and V). */
static void check_add_bias(dp_backend *be[2])
{
    const int32_t n = 13, cols = 896;
    const size_t ne = (size_t)n * cols;
    char err[DP_ERRLEN];
    float *bv = xmalloc((size_t)cols * sizeof *bv), *y = xmalloc(ne * sizeof *y), *o[2];
    fill(bv, (size_t)cols, 2.0f);
    fill(y, ne, 3.0f);
    for (int b = 0; b < 2; b++) {
        dp_weight w;
        if (be[b]->ops->weight_load(be[b], &w, DP_TYPE_F32, 1, cols, bv, err, sizeof err))
            die(EXIT_SETUP, "weight_load: %s", err);
        float *dy = dev_from(be[b], y, ne);
        be[b]->ops->add_bias(be[b], dy, &w, n, cols);
        o[b] = xmalloc(ne * sizeof(float));
        dev_get(be[b], o[b], dy, ne);
        be[b]->ops->free(be[b], dy);
        be[b]->ops->weight_free(be[b], &w);
    }
    report("add_bias", "n=13 cols=896", o[0], o[1], ne, TOL_EW);
    free(o[0]);
    free(o[1]);
    free(bv);
    free(y);
}

static void check_elementwise(dp_backend *be[2])
{
    const size_t n = 100003;
    float *a = xmalloc(n * sizeof *a), *c = xmalloc(n * sizeof *c), *o[2];
    fill(a, n, 6.0f);
    fill(c, n, 2.0f);
    static const char *const names[] = {"add", "swiglu", "swiglu", "geglu", "scale"};
    static const char *const what[] = {"n=100003", "n=100003", "n=100003 in place",
                                       "n=100003 in place", "n=100003 x 25.3"};
    for (int op = 0; op < 5; op++) {
        for (int b = 0; b < 2; b++) {
            float *da = dev_from(be[b], a, n), *dc = dev_from(be[b], c, n), *dout = da;
            if (op == 0) {
                be[b]->ops->add(be[b], da, dc, (int64_t)n);
            } else if (op == 1) {
                dout = dev_alloc(be[b], n);
                dev_poison(be[b], dout, n);
                be[b]->ops->swiglu(be[b], dout, da, dc, (int64_t)n);
            } else if (op == 2) {
                be[b]->ops->swiglu(be[b], da, da, dc, (int64_t)n); /* in place, as the model does */
            } else if (op == 3) {
                be[b]->ops->geglu(be[b], da, da, dc, (int64_t)n); /* Gemma's, in place */
            } else {
                be[b]->ops->scale(be[b], da, 25.3f, (int64_t)n); /* Gemma's embedding scale */
            }
            o[b] = xmalloc(n * sizeof(float));
            dev_get(be[b], o[b], dout, n);
            if (dout != da)
                be[b]->ops->free(be[b], dout);
            be[b]->ops->free(be[b], da);
            be[b]->ops->free(be[b], dc);
        }
        report(names[op], what[op], o[0], o[1], n, TOL_EW);
        free(o[0]);
        free(o[1]);
    }
    free(a);
    free(c);
}

static void check_embed_gather(dp_backend *be[2])
{
    const uint32_t types[] = {DP_TYPE_F16,  DP_TYPE_Q8_0, DP_TYPE_F32,    DP_TYPE_Q4_0,
                              DP_TYPE_Q4_1, DP_TYPE_Q5_0, DP_TYPE_Q5_1,   DP_TYPE_Q4_K,
                              DP_TYPE_Q5_K, DP_TYPE_Q6_K, DP_TYPE_Q2_K,   DP_TYPE_Q3_K,
                              DP_TYPE_IQ4_NL, DP_TYPE_IQ4_XS};
    const int64_t vocab = 300, dim = 256;
    const int32_t n = 50;
    char err[DP_ERRLEN], what[64];
    hbatch hb;
    hbatch_alloc(&hb, n, 1, 1);
    for (int32_t i = 0; i < n; i++)
        hb.tokens[i] = (int32_t)(rnd64() % (uint64_t)vocab);
    hb.n_out = 13;
    for (int32_t i = 0; i < hb.n_out; i++)
        hb.out_tokens[i] = (int32_t)(rnd64() % (uint64_t)n);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint8_t *raw = weight_make(types[ti], vocab, dim, 1.0f);
        float *o[2];
        for (int b = 0; b < 2; b++) {
            dp_weight w;
            if (be[b]->ops->weight_load(be[b], &w, types[ti], vocab, dim, raw, err, sizeof err))
                die(EXIT_SETUP, "weight_load: %s", err);
            hbatch_set(be[b], &hb);
            float *dout = dev_alloc(be[b], (size_t)n * dim);
            dev_poison(be[b], dout, (size_t)n * dim);
            be[b]->ops->embed(be[b], &w, dout, n);
            o[b] = xmalloc((size_t)n * dim * sizeof(float));
            dev_get(be[b], o[b], dout, (size_t)n * dim);
            be[b]->ops->free(be[b], dout);
            be[b]->ops->weight_free(be[b], &w);
        }
        snprintf(what, sizeof what, "%s table [%lld x %lld] n=%d", quant_type_name(types[ti]),
                 (long long)vocab, (long long)dim, n);
        /* Block types are dequantized on the device with the CPU's
         * operations: the same bits. */
        const bool blocks = types[ti] != DP_TYPE_F16 && types[ti] != DP_TYPE_F32;
        report("embed", what, o[0], o[1], (size_t)n * dim, blocks ? 0.0 : TOL_EW);
        free(o[0]);
        free(o[1]);
        free(raw);
    }
    /* gather_rows */
    const int32_t gdim = 80;
    float *x = xmalloc((size_t)n * gdim * sizeof *x), *o[2];
    fill(x, (size_t)n * gdim, 1.0f);
    for (int b = 0; b < 2; b++) {
        hbatch_set(be[b], &hb);
        float *dx = dev_from(be[b], x, (size_t)n * gdim);
        float *dout = dev_alloc(be[b], (size_t)hb.n_out * gdim);
        dev_poison(be[b], dout, (size_t)hb.n_out * gdim);
        be[b]->ops->gather_rows(be[b], dout, dx, gdim);
        o[b] = xmalloc((size_t)hb.n_out * gdim * sizeof(float));
        dev_get(be[b], o[b], dout, (size_t)hb.n_out * gdim);
        be[b]->ops->free(be[b], dx);
        be[b]->ops->free(be[b], dout);
    }
    snprintf(what, sizeof what, "n_out=%d of %d, dim %d", hb.n_out, n, gdim);
    report("gather_rows", what, o[0], o[1], (size_t)hb.n_out * gdim, 0.0);
    free(o[0]);
    free(o[1]);
    free(x);
    hbatch_free(&hb);
}

static void check_forward_topk(dp_backend *be[2])
{
    synth_model sm;
    synth_open(&sm, "tiny", rnd64(), DP_TYPE_F16);
    const dp_synth_shape sh = sm.sh;
    const dp_gguf *g = &sm.g;
    enum { NT = 9, K = 32, NOUT = 2 };
    const float temp[NOUT] = {0.7f, 1.3f};
    const uint8_t mask_rows[NOUT] = {0, 1};
    hbatch hb;
    hbatch_alloc(&hb, NT, 2, 1);
    for (int32_t i = 0; i < NT; i++) {
        hb.tokens[i] = (int32_t)(rnd64() % (sh.vocab - 3));
        hb.seq[i] = i < 5 ? 0 : 1;
        hb.pos[i] = hb.slot[i] = i < 5 ? i : i - 5;
    }
    hb.tables[0] = 0;
    hb.tables[1] = 1;
    const int32_t outs[NOUT] = {4, NT - 1};
    dp_batch b = {.n_tokens = NT, .tokens = hb.tokens, .pos = hb.pos, .seq = hb.seq,
                  .slot = hb.slot, .n_seqs = 2, .seq_store = hb.seq_store,
                  .block_tables = hb.tables, .max_blocks = 1, .n_out = NOUT, .out_tokens = outs};
    for (int bi = 0; bi < 2; bi++) {
        dp_llama *m;
        dp_kv_store *stores[DP_KV_MAX_STORES];
        model_kv_open(be[bi], g, 64, 8, 16, 2, &m, stores);
        const int32_t vocab = llama_hparams(m)->vocab;
        float *ref = xmalloc((size_t)NOUT * vocab * sizeof(float));
        float *again = xmalloc((size_t)NOUT * vocab * sizeof(float));
        int32_t ids[NOUT * K];
        float vals[NOUT * K], mx[NOUT], sum[NOUT];
        if (llama_forward(m, &b, stores, ref))
            die(EXIT_CHECK, "%s: forward failed", be[bi]->ops->name);
        int32_t mask_id[1] = {0};
        for (int32_t i = 1; i < vocab; i++)
            mask_id[0] = ref[vocab + i] > ref[vocab + mask_id[0]] ? i : mask_id[0];
        if (llama_forward_topk(m, &b, stores, K, temp, mask_id, 1, mask_rows, ids, vals, mx, sum) ||
            llama_download_logits(m, NOUT, again))
            die(EXIT_CHECK, "%s: forward failed", be[bi]->ops->name);
        ref[vocab + mask_id[0]] = -INFINITY;
        bool ok = memcmp(ref, again, (size_t)NOUT * vocab * sizeof(float)) == 0;
        double sum_err = 0;
        for (int32_t r = 0; r < NOUT && ok; r++) {
            const float *x = ref + (size_t)r * vocab;
            const int32_t *ri = ids + r * K;
            const float *rv = vals + r * K;
            float m_ref = -INFINITY;
            int32_t above = 0;
            for (int32_t i = 0; i < vocab; i++) {
                m_ref = x[i] > m_ref ? x[i] : m_ref;
                above += x[i] > rv[K - 1];
            }
            double sd = 0;
            uint64_t wsum = 0;
            for (int32_t i = 0; i < vocab; i++) {
                sd += exp(((double)x[i] - m_ref) / temp[r]);
                wsum += dp_topk_weight((x[i] - m_ref) * (1.0f / temp[r]));
            }
            const double e = fabs(sd - sum[r]) / sd;
            sum_err = e > sum_err ? e : sum_err;
            ok = mx[r] == m_ref && rv[0] == m_ref && above < K && sum[r] == dp_topk_sum_float(wsum);
            for (int32_t i = 0; i < K && ok; i++)
                ok = ri[i] >= 0 && ri[i] < vocab && x[ri[i]] == rv[i] && (i == 0 || rv[i] <= rv[i - 1]);
        }
        ok = ok && sum_err < 1e-5;
        g_checks++;
        g_failed += !ok;
        printf("  %-12s %-46s %s\n", "forward_topk",
               bi ? "cuda: candidates of the step's own logits" : "cpu: candidates of the step's own logits",
               ok ? "consistent  ok" : "INCONSISTENT  FAIL");
        free(ref);
        free(again);
        model_kv_close(be[bi], m, stores);
    }
    hbatch_free(&hb);
    synth_close(&sm);
}

/* ---- errors the backend survives, and those it does not ------------------------------
 * Needs the emulator (tests/gpu/emu_runtime.cpp), which can make the next
 * launch fail: a recoverable error (an over-sized launch) fails its step
 * only, and the next step gives the logits an untroubled one gives; a sticky
 * one (an illegal address) makes every later step report DP_EDEVICE. */
void emu_inject_error(int err, int sticky) __attribute__((weak));

static void check_faults(dp_backend *be)
{
    if (!emu_inject_error) {
        printf("  faults: not on a device (needs the emulator)\n");
        return;
    }
    synth_model sm;
    synth_open(&sm, "tiny", rnd64(), DP_TYPE_F16);
    enum { NT = 6 };
    hbatch hb;
    hbatch_alloc(&hb, NT, 1, 1);
    for (int32_t i = 0; i < NT; i++) {
        hb.tokens[i] = (int32_t)(rnd64() % (sm.sh.vocab - 3));
        hb.pos[i] = hb.slot[i] = i;
    }
    const int32_t outs[1] = {NT - 1};
    dp_batch b = {.n_tokens = NT, .tokens = hb.tokens, .pos = hb.pos, .seq = hb.seq,
                  .slot = hb.slot, .n_seqs = 1, .seq_store = hb.seq_store,
                  .block_tables = hb.tables, .max_blocks = 1, .n_out = 1, .out_tokens = outs};
    dp_llama *m;
    dp_kv_store *stores[DP_KV_MAX_STORES];
    model_kv_open(be, &sm.g, 64, 8, 16, 1, &m, stores);
    const int32_t vocab = llama_hparams(m)->vocab;
    float *ref = xmalloc((size_t)vocab * sizeof(float)), *got = xmalloc((size_t)vocab * sizeof(float));
    int rc0 = llama_forward(m, &b, stores, ref);
    emu_inject_error(cudaErrorLaunchOutOfResources, 0);
    int rc1 = llama_forward(m, &b, stores, got);
    int rc2 = llama_forward(m, &b, stores, got);
    bool same = rc2 == 0 && memcmp(ref, got, (size_t)vocab * sizeof(float)) == 0;
    bool ok = rc0 == 0 && rc1 == DP_EIO && same;
    g_checks++;
    g_failed += !ok;
    printf("  %-12s %-46s %s\n", "faults", "recoverable: that step fails, the next is right",
           ok ? "ok" : "FAIL");
    if (!ok)
        printf("    forward returned %d, %d (want %d), %d; logits %s\n", rc0, rc1, DP_EIO, rc2,
               same ? "equal" : "differ");
    emu_inject_error(cudaErrorIllegalAddress, 1);
    int rc3 = llama_forward(m, &b, stores, got);
    int rc4 = llama_forward(m, &b, stores, got);
    ok = rc3 == DP_EDEVICE && rc4 == DP_EDEVICE;
    g_checks++;
    g_failed += !ok;
    printf("  %-12s %-46s %s\n", "faults", "sticky: the device is lost, every step says so",
           ok ? "ok" : "FAIL");
    if (!ok)
        printf("    forward returned %d, %d (want %d)\n", rc3, rc4, DP_EDEVICE);
    free(ref);
    free(got);
    model_kv_close(be, m, stores);
    hbatch_free(&hb);
    synth_close(&sm);
}

/* "80GiB", "81559MiB", "141GB", or bytes. */
static size_t parse_size(const char *a)
{
    char *end;
    const double v = strtod(a, &end);
    double mul = 1;
    if (!strcmp(end, "GiB") || !strcmp(end, "G"))
        mul = 1024.0 * 1024 * 1024;
    else if (!strcmp(end, "MiB") || !strcmp(end, "M"))
        mul = 1024.0 * 1024;
    else if (!strcmp(end, "GB"))
        mul = 1e9;
    else if (*end)
        die(EXIT_SETUP, "--plan %s: a size such as 80GiB, 81559MiB or 141GB", a);
    if (!(v > 0))
        die(EXIT_SETUP, "--plan %s: a size such as 80GiB, 81559MiB or 141GB", a);
    return (size_t)(v * mul);
}

int main(int argc, char **argv)
{
    uint64_t seed = CHECK_DEFAULT_SEED;
    bool bench = true, checks = true, self_test = false, bench_small = false, faults = false;
    const char *plan = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--no-bench") == 0)
            bench = false;
        else if (strcmp(argv[i], "--bench-only") == 0)
            checks = false;
        else if (strcmp(argv[i], "--bench-small") == 0)
            bench_small = true;
        else if (strcmp(argv[i], "--self-test") == 0)
            self_test = true, bench = false;
        else if (strcmp(argv[i], "--faults") == 0)
            faults = true, checks = bench = false;
        else if (strcmp(argv[i], "--plan") == 0 && i + 1 < argc)
            plan = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--seed N] [--no-bench] [--bench-only] [--bench-small] "
                    "[--self-test] [--faults] [--plan SIZE]\n", argv[0]);
            return EXIT_SETUP;
        }
    }
    if (plan) /* no device needed */
        return bench_plan_dry(parse_size(plan), bench_small);
    g_rs = seed ? seed : 1;
    char err[DP_ERRLEN];
    dp_backend *be[2];
    if (backend_cpu_create(&be[0], 0, err, sizeof err))
        die(EXIT_SETUP, "cpu backend: %s", err);
    /* The reference is the CPU's exact f32 matmul: its default quantizes the
     * activations to int8 (kernels/cpu/cpu_kern.c), which CUDA does not. */
    be[0]->ops->set_exact(be[0], true);
    if (self_test) {
        if (backend_cpu_create(&be[1], 0, err, sizeof err))
            die(EXIT_SETUP, "cpu backend: %s", err);
        be[1]->ops->set_exact(be[1], true);
    } else if (backend_cuda_create(&be[1], 0, err, sizeof err)) {
        printf("no usable CUDA device: %s\n", err);
        backend_destroy(be[0]);
        return EXIT_NO_DEVICE;
    }
    printf("check_kernels: seed %llu%s (rerun with --seed %llu)%s\n", (unsigned long long)seed,
           seed == CHECK_DEFAULT_SEED ? " (the default)" : "", (unsigned long long)seed,
           self_test ? ", self-test: cpu against cpu" : "");
    if (checks) {
        printf("ops: cuda against the cpu reference (relative L2 error)\n");
        check_matmul(be);
        check_rmsnorm(be);
        check_norm_matmul(be);
        check_rope(be);
        check_add_bias(be);
        check_elementwise(be);
        check_embed_gather(be);
        check_attention(be);
        check_capture(be);
        check_kv_saturate(be);
        check_kvpath(be, DP_KV_F32);
        check_kvpath(be, DP_KV_Q8_0);
        check_kvpath(be, DP_KV_Q4_0);
        check_kivi(be);
        check_topk(be);
        printf("generation: greedy tokens, cpu against cuda\n");
        /* F16 weights: both backends hold the same weights, so only activation
         * and KV rounding differ; the first tokens must agree. */
        check_generation(be, "tiny", seed, DP_TYPE_F16, true);
        /* Each architecture's variations (Llama 3's RoPE factors, Qwen 2's
         * biases, Qwen 3's per-head norms and wide heads, Phi-3's fused
         * tensors, Gemma 3's) on the device. */
        check_generation(be, "tiny-llama3", seed, DP_TYPE_F16, true);
        check_generation(be, "tiny-qwen2", seed, DP_TYPE_F16, true);
        check_generation(be, "tiny-qwen3", seed, DP_TYPE_F16, true);
        check_generation(be, "tiny-phi3", seed, DP_TYPE_F16, true);
        /* Gemma 3's scaled embedding, extra norms, GELU gating and windows
         * of 8 slots (its prompt and tokens slide them). */
        check_generation(be, "tiny-gemma3", seed, DP_TYPE_F16, true);
        /* ... and its sliding layers apart, at their window. */
        check_swa(be);
        /* Quantized weights: the same block values on both sides (the CPU's
         * exact path dequantizes them to f32, the device's GEMV too; its
         * prefill GEMM rounds them to fp16). */
        check_generation(be, "tiny", seed, DP_TYPE_Q8_0, true);
        check_generation(be, "tiny", seed, DP_TYPE_Q4_1, true);
        check_forward_topk(be);
        if (!self_test) {
            printf("recorded decode steps: graphs against eager issue\n");
            check_graphs(be[0]);
        }
        printf("checks: %d, failed: %d\n", g_checks, g_failed);
    }
    if (faults && !self_test) {
        /* Last: the sticky fault leaves the device unusable. */
        printf("faults: the cuda backend's errors (emulated)\n");
        check_faults(be[1]);
        printf("checks: %d, failed: %d\n", g_checks, g_failed);
    }
    int rc = g_failed ? EXIT_CHECK : 0;
    backend_destroy(be[0]);
    if (bench && !self_test)
        bench_run(be[1], bench_small);
    backend_destroy(be[1]);
    return rc;
}
