/* test_cpu_backend.c: every CPU backend op against a plain double-precision
 * reference on seeded random inputs, with outputs poisoned (NaN) beforehand so
 * an element the op forgot to write is caught. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "kernels/quant.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/topk.h"
#include "t.h"

static uint64_t rs = 0x1234567;
static float frand(void) /* uniform in [-1, 1) */
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 11) * 0x1.0p-53) * 2.0f - 1.0f;
}

static void poison(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
}

static double rel_err(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Random weights of a type, as raw blocks (scales kept finite and small). */
static void *make_weight(uint32_t type, int64_t rows, int64_t cols, size_t *nbytes)
{
    uint64_t rb;
    CHECK(quant_row_bytes(type, (uint64_t)cols, &rb) == 0);
    *nbytes = rb * (size_t)rows;
    uint8_t *w = malloc(*nbytes);
    CHECK(w != NULL);
    if (type == DP_TYPE_F32) {
        for (int64_t i = 0; i < rows * cols; i++)
            ((float *)w)[i] = frand() * 0.1f;
    } else if (type == DP_TYPE_F16) {
        for (int64_t i = 0; i < rows * cols; i++)
            ((uint16_t *)w)[i] = dp_f32_to_fp16(frand() * 0.1f);
    } else if (type == DP_TYPE_Q8_0) { /* block: f16 d, 32 x int8 */
        for (size_t o = 0; o < *nbytes; o += 34) {
            uint16_t d = dp_f32_to_fp16(0.001f + 0.01f * fabsf(frand()));
            memcpy(w + o, &d, 2);
            for (int i = 0; i < 32; i++)
                w[o + 2 + i] = (uint8_t)(int8_t)(frand() * 127);
        }
    } else if (type == DP_TYPE_Q4_1) { /* block: f16 d, f16 m, 16 bytes of nibbles */
        for (size_t o = 0; o < *nbytes; o += 20) {
            uint16_t d = dp_f32_to_fp16(0.01f * fabsf(frand())), m = dp_f32_to_fp16(-0.08f * fabsf(frand()));
            memcpy(w + o, &d, 2);
            memcpy(w + o + 2, &m, 2);
            for (int i = 0; i < 16; i++) {
                if (i == 8)
                    frand(); /* (bytes 8-15 of a fresh draw: no two vectors alike) */
                w[o + 4 + i] = (uint8_t)(rs >> (i % 8 * 8));
            }
            frand();
        }
    } else if (type == DP_TYPE_Q4_0) { /* block: f16 d, 16 bytes of nibbles (q - 8) */
        for (size_t o = 0; o < *nbytes; o += 18) {
            uint16_t d = dp_f32_to_fp16(0.01f * fabsf(frand()));
            memcpy(w + o, &d, 2);
            for (int i = 0; i < 16; i++) {
                if (i == 8)
                    frand();
                w[o + 2 + i] = (uint8_t)(rs >> (i % 8 * 8));
            }
            frand();
        }
    } else if (type == DP_TYPE_Q5_0 || type == DP_TYPE_Q5_1) {
        /* block: f16 d, (Q5_1: f16 m,) 32 high bits, 16 bytes of nibbles */
        const size_t bb = type == DP_TYPE_Q5_0 ? 22 : 24, h = bb - 20;
        for (size_t o = 0; o < *nbytes; o += bb) {
            uint16_t d = dp_f32_to_fp16(0.005f * fabsf(frand())), m = dp_f32_to_fp16(-0.08f * fabsf(frand()));
            memcpy(w + o, &d, 2);
            if (type == DP_TYPE_Q5_1)
                memcpy(w + o + 2, &m, 2);
            uint32_t qh = (uint32_t)(rs >> 17);
            frand();
            memcpy(w + o + h, &qh, 4);
            for (int i = 0; i < 16; i++) {
                if (i == 8)
                    frand();
                w[o + h + 4 + i] = (uint8_t)(rs >> (i % 8 * 8));
            }
            frand();
        }
    } else if (type == DP_TYPE_Q4_K || type == DP_TYPE_Q5_K) {
        /* f16 d, dmin, 12 bytes of 6-bit scales, (Q5_K: 32 of high bits,) 128 of nibbles */
        const size_t bb = type == DP_TYPE_Q4_K ? 144 : 176;
        for (size_t o = 0; o < *nbytes; o += bb) {
            uint16_t d = dp_f32_to_fp16(0.001f * fabsf(frand())), dm = dp_f32_to_fp16(0.002f * fabsf(frand()));
            memcpy(w + o, &d, 2);
            memcpy(w + o + 2, &dm, 2);
            for (size_t i = 4; i < bb; i++, frand())
                w[o + i] = (uint8_t)(rs >> 23);
        }
    } else if (type == DP_TYPE_IQ4_NL || type == DP_TYPE_IQ4_XS) {
        /* f16 d, (IQ4_XS: 2 + 4 bytes of 6-bit scales,) nibbles */
        const size_t bb = type == DP_TYPE_IQ4_NL ? 18 : 136;
        for (size_t o = 0; o < *nbytes; o += bb) {
            uint16_t d = dp_f32_to_fp16((type == DP_TYPE_IQ4_NL ? 0.001f : 0.00003f) * fabsf(frand()));
            memcpy(w + o, &d, 2);
            for (size_t i = 2; i < bb; i++, frand())
                w[o + i] = (uint8_t)(rs >> 23);
        }
    } else if (type == DP_TYPE_Q2_K) { /* scale/min bytes[16], qs[64], f16 d, dmin */
        for (size_t o = 0; o < *nbytes; o += 84) {
            for (int i = 0; i < 80; i++, frand())
                w[o + i] = (uint8_t)(rs >> 23);
            uint16_t d = dp_f32_to_fp16(0.002f * fabsf(frand())), dm = dp_f32_to_fp16(0.002f * fabsf(frand()));
            memcpy(w + o + 80, &d, 2);
            memcpy(w + o + 82, &dm, 2);
        }
    } else if (type == DP_TYPE_Q3_K) { /* hmask[32], qs[64], 6-bit scales[12], f16 d */
        for (size_t o = 0; o < *nbytes; o += 110) {
            for (int i = 0; i < 108; i++, frand())
                w[o + i] = (uint8_t)(rs >> 23);
            uint16_t d = dp_f32_to_fp16(0.0005f * fabsf(frand()));
            memcpy(w + o + 108, &d, 2);
        }
    } else if (type == DP_TYPE_Q6_K) { /* ql[128], qh[64], int8 scales[16], f16 d */
        for (size_t o = 0; o < *nbytes; o += 210) {
            for (int i = 0; i < 208; i++, frand())
                w[o + i] = (uint8_t)(rs >> 23);
            uint16_t d = dp_f32_to_fp16(0.0002f * fabsf(frand()));
            memcpy(w + o + 208, &d, 2);
        }
    } else {
        CHECK(!"unexpected type");
    }
    return w;
}

/* x as the integer matmul sees it: per 32 values, d = max|x| / 127 and
 * x' = d * round(x / d) (the kernel's rule, written out again here). */
static void q8_roundtrip(const float *x, float *out, int64_t n)
{
    for (int64_t b = 0; b + 32 <= n; b += 32) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fabsf(x[b + i]) > amax ? fabsf(x[b + i]) : amax;
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++)
            out[b + i] = d * (float)(int)nearbyintf(x[b + i] * id);
    }
}

/* Every weight type at batch sizes on both sides of the kernels' thresholds,
 * on both matmul paths. exact: against the f64 product with the dequantized
 * weights. int8 (the default, on a level with integer kernels): against the
 * f64 product with the activations rounded as the kernel rounds them, so the
 * kernel's own error is held to f32 rounding; its distance from the exact
 * product (the price of int8 activations) is printed. */
static void test_matmul(dp_backend *be)
{
    uint32_t types[] = {DP_TYPE_F32,  DP_TYPE_F16,  DP_TYPE_Q8_0, DP_TYPE_Q4_1, DP_TYPE_Q4_0,
                        DP_TYPE_Q5_0, DP_TYPE_Q5_1, DP_TYPE_Q4_K, DP_TYPE_Q5_K, DP_TYPE_Q6_K,
                        DP_TYPE_IQ4_NL, DP_TYPE_IQ4_XS, DP_TYPE_Q2_K, DP_TYPE_Q3_K};
    int32_t ms[] = {1, 3, 4, 7, 8, 9, 33, 70};
    /* 64, 48 and 384 rows: Q4_1 repacked in groups of 8 (the avx2 and avx512
     * levels). 257 and 384 rows: tiles of more than 16 rows at decode
     * batches with 2 threads (cpu_matmul.c, dot_tile), 384's a repacked 48. */
    int64_t shapes[][2] = {{100, 64}, {64, 96}, {257, 128}, {48, 64}, {384, 64}};
    const bool was_exact = be->ops->get_exact(be);
    for (int mode = 0; mode < 2; mode++) {
        be->ops->set_exact(be, mode == 0);
        double worst_q = 0;
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                /* (The K types' rows are super-blocks of 256 columns.) */
                const bool kq = types[ti] == DP_TYPE_Q4_K || types[ti] == DP_TYPE_Q5_K ||
                                types[ti] == DP_TYPE_Q6_K || types[ti] == DP_TYPE_IQ4_XS ||
                                types[ti] == DP_TYPE_Q2_K || types[ti] == DP_TYPE_Q3_K;
                int64_t rows = shapes[si][0], cols = kq ? 256 * (1 + (int64_t)(si % 2)) : shapes[si][1];
                /* (Q5, K and IQ4 have only the repacked kernel: rows in groups of 8.) */
                const bool q5 = types[ti] == DP_TYPE_Q5_0 || types[ti] == DP_TYPE_Q5_1 || kq ||
                                types[ti] == DP_TYPE_IQ4_NL;
                const bool int8 = mode == 1 && strcmp(be->ops->kernel_level(be), "baseline") != 0 &&
                                  (types[ti] == DP_TYPE_Q8_0 || types[ti] == DP_TYPE_Q4_1 ||
                                   types[ti] == DP_TYPE_Q4_0 || (q5 && rows % 8 == 0));
                size_t nb;
                void *raw = make_weight(types[ti], rows, cols, &nb);
                dp_weight w;
                char err[DP_ERRLEN];
                CHECK(be->ops->weight_load(be, &w, types[ti], rows, cols, raw, err, sizeof err) == 0);
                float *wf = malloc((size_t)(rows * cols) * sizeof *wf);
                CHECK(quant_dequant_row(types[ti], raw, wf, rows * cols) == 0);
                for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                    int32_t m = ms[mi];
                    float *x = be->ops->alloc(be, (size_t)(m * cols) * 4);
                    float *xq = malloc((size_t)(m * cols) * 4);
                    float *y = be->ops->alloc(be, (size_t)(m * rows) * 4);
                    double *ref = malloc((size_t)(m * rows) * sizeof *ref);
                    double *ref_x = malloc((size_t)(m * rows) * sizeof *ref_x);
                    for (int64_t i = 0; i < m * cols; i++)
                        x[i] = frand();
                    if (int8)
                        q8_roundtrip(x, xq, m * cols);
                    else
                        memcpy(xq, x, (size_t)(m * cols) * 4);
                    poison(y, (size_t)(m * rows));
                    be->ops->matmul(be, y, x, &w, m);
                    for (int32_t i = 0; i < m; i++)
                        for (int64_t r = 0; r < rows; r++) {
                            double s = 0, sx = 0;
                            for (int64_t k = 0; k < cols; k++) {
                                s += (double)xq[i * cols + k] * wf[r * cols + k];
                                sx += (double)x[i * cols + k] * wf[r * cols + k];
                            }
                            ref[i * rows + r] = s;
                            ref_x[i * rows + r] = sx;
                        }
                    double e = rel_err(y, ref, (size_t)(m * rows));
                    CHECK_MSG(e < 1e-5, "matmul (%s) %s %lldx%lld m=%d rel err %g",
                              int8 ? "int8" : "exact", quant_type_name(types[ti]), (long long)rows,
                              (long long)cols, m, e);
                    if (int8) {
                        double eq = rel_err(y, ref_x, (size_t)(m * rows));
                        worst_q = eq > worst_q ? eq : worst_q;
                    }
                    be->ops->free(be, x);
                    be->ops->free(be, y);
                    free(xq);
                    free(ref);
                    free(ref_x);
                }
                be->ops->weight_free(be, &w);
                free(wf);
                free(raw);
            }
        if (mode == 1 && !strcmp(be->ops->kernel_level(be), "baseline"))
            printf("matmul on the baseline kernels (no integer path): exact path matches its reference\n");
        else if (mode == 1)
            printf("matmul on the %s kernels: exact and int8 paths match their references; "
                   "int8 activations move the product by <= %.2g rel L2\n",
                   be->ops->kernel_level(be), worst_q);
    }
    be->ops->set_exact(be, was_exact);
}

static void test_elementwise(dp_backend *be)
{
    const int32_t n = 37, dim = 96;
    float *x = be->ops->alloc(be, n * dim * 4), *o = be->ops->alloc(be, n * dim * 4);
    float *y = be->ops->alloc(be, n * dim * 4);
    double *ref = malloc(n * dim * sizeof *ref);
    float wv[96];
    for (int i = 0; i < dim; i++)
        wv[i] = 1.0f + 0.5f * frand();
    dp_weight w;
    char err[DP_ERRLEN];
    CHECK(be->ops->weight_load(be, &w, DP_TYPE_F32, 1, dim, wv, err, sizeof err) == 0);
    for (int i = 0; i < n * dim; i++) {
        x[i] = frand() * 3;
        y[i] = frand();
    }
    /* rmsnorm */
    poison(o, n * dim);
    be->ops->rmsnorm(be, o, x, &w, n, dim, 1e-5f);
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int d = 0; d < dim; d++)
            ss += (double)x[i * dim + d] * x[i * dim + d];
        double inv = 1.0 / sqrt(ss / dim + 1e-5);
        for (int d = 0; d < dim; d++)
            ref[i * dim + d] = x[i * dim + d] * inv * wv[d];
    }
    CHECK(rel_err(o, ref, n * dim) < 1e-6);
    /* swiglu */
    poison(o, n * dim);
    be->ops->swiglu(be, o, x, y, n * dim);
    for (int i = 0; i < n * dim; i++)
        ref[i] = x[i] / (1.0 + exp(-(double)x[i])) * y[i];
    CHECK(rel_err(o, ref, n * dim) < 1e-6);
    /* geglu: GELU's tanh form */
    poison(o, n * dim);
    be->ops->geglu(be, o, x, y, n * dim);
    for (int i = 0; i < n * dim; i++) {
        const double g = x[i];
        ref[i] = 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * y[i];
    }
    CHECK(rel_err(o, ref, n * dim) < 1e-6);
    /* scale */
    memcpy(o, x, (size_t)(n * dim) * sizeof *o);
    be->ops->scale(be, o, 2.5f, n * dim);
    for (int i = 0; i < n * dim; i++)
        ref[i] = 2.5 * x[i];
    CHECK(rel_err(o, ref, n * dim) < 1e-7);
    /* add */
    for (int i = 0; i < n * dim; i++)
        ref[i] = (double)x[i] + y[i];
    be->ops->add(be, x, y, n * dim);
    CHECK(rel_err(x, ref, n * dim) < 1e-7);
    be->ops->weight_free(be, &w);
    be->ops->free(be, x);
    be->ops->free(be, y);
    be->ops->free(be, o);
    free(ref);
}

/* A batch of three sequences: one mid-prompt chunk, one decoding, one whole
 * prompt, on shuffled blocks; checks embed, rope, kv_write, attention and
 * gather against a dense reference. With an f16 store the reference reads
 * K and V rounded to f16 (what kv_write stores), with a q8_0 / q4_0 store
 * each head's rows quantized and dequantized, so the bound is the same. */
static void test_attention(dp_backend *be, int32_t type, int32_t BT, int32_t HD)
{
    enum { NH = 6, NKV = 2, NB = 40, NL = 2, VOCAB = 50, HDMAX = 512 };
    const int32_t DIM = NH * HD;
    dp_kv_layout l = {NL, NKV, HD, BT, NB, type, 0};
    dp_kv_store *kv;
    CHECK(be->ops->kv_create(be, &l, &kv) == 0);
    CHECK(be->ops->kv_layout(be, kv)->n_blocks == NB);
    int32_t perm[NB];
    for (int i = 0; i < NB; i++)
        perm[i] = i;
    for (int i = NB - 1; i > 0; i--) {
        int j = (int)((frand() + 1) * 0.5f * (i + 1)) % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    /* Sequence lengths after this step, and tokens already cached before it. */
    const int32_t total[3] = {13, 22, 9}, before[3] = {5, 21, 0};
    const int32_t max_blocks = (22 + BT - 1) / BT; /* the longest sequence */
    int32_t tables[3 * 6];
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < max_blocks; b++)
            tables[s * max_blocks + b] = perm[s * max_blocks + b];
    /* Full K/V (post-rope) per sequence, layer 0; earlier tokens are written
     * by an earlier "step" of this same test. */
    static float K[3][32][NKV * HDMAX], V[3][32][NKV * HDMAX], Q[3][32][NH * HDMAX];
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < total[s]; t++) {
            for (int i = 0; i < NKV * HD; i++) {
                K[s][t][i] = frand();
                V[s][t][i] = frand();
            }
            if (type == DP_KV_F16)
                for (int i = 0; i < NKV * HD; i++) {
                    K[s][t][i] = dp_fp16_to_f32(dp_f32_to_fp16(K[s][t][i]));
                    V[s][t][i] = dp_fp16_to_f32(dp_f32_to_fp16(V[s][t][i]));
                }
            if (dp_kv_type_quantized(type)) /* each head's row, as kv_write stores it */
                for (int h = 0; h < NKV; h++) {
                    uint32_t qt = type == DP_KV_Q8_0 ? DP_TYPE_Q8_0 : DP_TYPE_Q4_0;
                    uint8_t qb[HDMAX / 32 * 34];
                    CHECK(quant_quantize_row(qt, K[s][t] + h * HD, qb, HD) == 0);
                    CHECK(quant_dequant_row(qt, qb, K[s][t] + h * HD, HD) == 0);
                    CHECK(quant_quantize_row(qt, V[s][t] + h * HD, qb, HD) == 0);
                    CHECK(quant_dequant_row(qt, qb, V[s][t] + h * HD, HD) == 0);
                }
            for (int i = 0; i < NH * HD; i++)
                Q[s][t][i] = frand();
        }
    dp_kv_store *stores[DP_KV_MAX_STORES] = {kv, NULL};
    uint8_t seq_store[3] = {0, 0, 0};
    for (int phase = 0; phase < 2; phase++) {
        int32_t tokens[64], pos[64], seq[64], slot[64], n = 0;
        for (int s = 0; s < 3; s++) {
            int lo = phase == 0 ? 0 : before[s], hi = phase == 0 ? before[s] : total[s];
            for (int t = lo; t < hi; t++) {
                tokens[n] = (s * 7 + t) % VOCAB;
                pos[n] = t;
                seq[n] = s;
                slot[n] = t;
                n++;
            }
        }
        int32_t outs[3] = {0, 1, 2};
        dp_batch b = {.n_tokens = n, .tokens = tokens, .pos = pos, .seq = seq, .slot = slot,
                      .n_seqs = 3, .seq_store = seq_store, .block_tables = tables,
                      .max_blocks = max_blocks, .n_out = 3, .out_tokens = outs};
        CHECK(be->ops->batch_set(be, &b) == 0);
        float *k = be->ops->alloc(be, (size_t)n * NKV * HD * 4), *v = be->ops->alloc(be, (size_t)n * NKV * HD * 4);
        float *q = be->ops->alloc(be, (size_t)n * NH * HD * 4), *o = be->ops->alloc(be, (size_t)n * NH * HD * 4);
        for (int i = 0; i < n; i++) {
            memcpy(k + (size_t)i * NKV * HD, K[seq[i]][slot[i]], (size_t)NKV * HD * sizeof(float));
            memcpy(v + (size_t)i * NKV * HD, V[seq[i]][slot[i]], (size_t)NKV * HD * sizeof(float));
            memcpy(q + (size_t)i * NH * HD, Q[seq[i]][slot[i]], (size_t)NH * HD * sizeof(float));
        }
        be->ops->kv_write(be, stores, 1, k, v);
        /* Whole, and a sliding window of 5 slots (slot - 5 < t <= slot):
         * tiles past a window's length go token by token. */
        double *ref = malloc((size_t)n * NH * HD * sizeof *ref);
        float *o1 = be->ops->alloc(be, (size_t)NH * HD * 4);
        for (int32_t W = 0; W <= 5; W += 5) {
        CHECK(be->ops->batch_set(be, &b) == 0);
        poison(o, (size_t)n * NH * HD);
        be->ops->attention(be, stores, 1, o, q, NH, 0.125f, W);
        for (int i = 0; i < n; i++) {
            int s = seq[i];
            for (int h = 0; h < NH; h++) {
                int kh = h / (NH / NKV);
                double sc[32], mx = -1e30, sum = 0;
                const int t0 = W > 0 && slot[i] + 1 > W ? slot[i] + 1 - W : 0;
                for (int t = t0; t <= slot[i]; t++) {
                    double d = 0;
                    for (int e = 0; e < HD; e++)
                        d += (double)Q[s][slot[i]][h * HD + e] * K[s][t][kh * HD + e];
                    sc[t] = d * 0.125;
                    if (sc[t] > mx)
                        mx = sc[t];
                }
                for (int t = t0; t <= slot[i]; t++)
                    sum += (sc[t] = exp(sc[t] - mx));
                for (int e = 0; e < HD; e++) {
                    double acc = 0;
                    for (int t = t0; t <= slot[i]; t++)
                        acc += sc[t] / sum * V[s][t][kh * HD + e];
                    ref[((size_t)i * NH + h) * HD + e] = acc;
                }
            }
        }
        if (n > 0)
            CHECK_MSG(rel_err(o, ref, (size_t)n * NH * HD) < 1e-5, "attention phase %d window %d",
                      phase, W);
        /* A prompt's tokens are attended a tile at a time (attend_tile);
         * each token alone in a batch (a task of its own) gives its bits. */
        for (int i = 0; i < n; i++) {
            int32_t out0 = 0;
            dp_batch b1 = {.n_tokens = 1, .tokens = tokens + i, .pos = pos + i, .seq = seq + i,
                           .slot = slot + i, .n_seqs = 3, .seq_store = seq_store,
                           .block_tables = tables, .max_blocks = max_blocks, .n_out = 1,
                           .out_tokens = &out0};
            CHECK(be->ops->batch_set(be, &b1) == 0);
            be->ops->attention(be, stores, 1, o1, q + (size_t)i * NH * HD, NH, 0.125f, W);
            CHECK_MSG(memcmp(o1, o + (size_t)i * NH * HD, (size_t)NH * HD * 4) == 0,
                      "attention: token %d alone differs from its tile (type %d, window %d)", i,
                      type, W);
        }
        }
        be->ops->free(be, o1);
        CHECK(be->ops->batch_set(be, &b) == 0);
        /* rope: adjacent pairs rotated by pos * base^(-2i/n_rot). */
        dp_rope_params rp = {HD, 10000.0f, 1.0f, false, NULL, 1.0f, 0.0f, 0.0f, 0.0f};
        memcpy(q, o, (size_t)n * NH * HD * 4);
        be->ops->rope(be, q, k, n, NH, NKV, HD, &rp);
        for (int i = 0; i < n; i++)
            for (int h = 0; h < NH; h++)
                for (int p = 0; p < HD / 2; p++) {
                    double th = pos[i] * pow(10000.0, -2.0 * p / HD);
                    double x0 = o[((size_t)i * NH + h) * HD + 2 * p], x1 = o[((size_t)i * NH + h) * HD + 2 * p + 1];
                    ref[((size_t)i * NH + h) * HD + 2 * p] = x0 * cos(th) - x1 * sin(th);
                    ref[((size_t)i * NH + h) * HD + 2 * p + 1] = x0 * sin(th) + x1 * cos(th);
                }
        if (n > 0)
            CHECK(rel_err(q, ref, (size_t)n * NH * HD) < 1e-5);
        /* embed + gather */
        static float table[VOCAB * NH * HDMAX];
        for (int i = 0; i < VOCAB * DIM; i++)
            table[i] = frand();
        dp_weight tw;
        char err[DP_ERRLEN];
        CHECK(be->ops->weight_load(be, &tw, DP_TYPE_F32, VOCAB, DIM, table, err, sizeof err) == 0);
        float *e = be->ops->alloc(be, (size_t)n * DIM * 4 + 4), *g = be->ops->alloc(be, 3 * DIM * 4);
        poison(e, (size_t)n * DIM);
        be->ops->embed(be, &tw, e, n);
        for (int i = 0; i < n; i++)
            CHECK(memcmp(e + (size_t)i * DIM, table + (size_t)tokens[i] * DIM, DIM * 4) == 0);
        if (n >= 3) {
            be->ops->gather_rows(be, g, e, DIM);
            for (int i = 0; i < 3; i++)
                CHECK(memcmp(g + i * DIM, e + (size_t)outs[i] * DIM, DIM * 4) == 0);
        }
        be->ops->weight_free(be, &tw);
        be->ops->free(be, e);
        be->ops->free(be, g);
        be->ops->free(be, k);
        be->ops->free(be, v);
        be->ops->free(be, q);
        be->ops->free(be, o);
        free(ref);
    }
    be->ops->kv_destroy(be, kv);
}

/* A quantized view over an f16 arena, as the KV manager makes one: the
 * view's block holds as many tokens as fit in the arena block's bytes, and
 * no more; kv_compact from arena blocks into view blocks quantizes each
 * kept row exactly as quant_quantize_row does (a scalar reference over the
 * f16 values), a compaction within the view moves the bytes unchanged, the
 * view's blocks do not overlap the arena's other blocks, and
 * kv_block_read/write of a view block round-trips its bytes. */
static void test_kv_views(dp_backend *be)
{
    enum { NL = 2, NKV = 2, HD = 64, BT = 16, NB = 8, N = 20 };
    const int32_t qtypes[2] = {DP_KV_Q8_0, DP_KV_Q4_0};
    for (int ti = 0; ti < 2; ti++) {
        const int32_t type = qtypes[ti];
        const uint32_t qt = type == DP_KV_Q8_0 ? DP_TYPE_Q8_0 : DP_TYPE_Q4_0;
        const size_t rb = (size_t)HD / 32 * quant_block_bytes(qt);
        dp_kv_layout al = {NL, NKV, HD, BT, NB, DP_KV_F16, 0};
        dp_kv_store *arena, *view, *bad;
        CHECK(be->ops->kv_create(be, &al, &arena) == 0);
        const size_t ab = be->ops->kv_bytes_per_block(be, &al);
        /* Tokens per view block: what fits in an arena block. */
        const int32_t vbt = (int32_t)(ab / (2 * NL * NKV * rb));
        CHECK(vbt > BT);
        dp_kv_layout vl = {NL, NKV, HD, vbt + 1, NB, type, 0};
        CHECK(be->ops->kv_view(be, arena, &vl, &bad) == DP_EINVAL); /* one token too many */
        vl.block_tokens = vbt;
        CHECK(be->ops->kv_view(be, arena, &vl, &view) == 0);
        CHECK(be->ops->kv_bytes_per_block(be, &vl) == 2 * NL * NKV * (size_t)vbt * rb);
        /* N tokens into arena blocks 0 and 1 through kv_write, every layer. */
        static float K[NL][N][NKV * HD], V[NL][N][NKV * HD];
        int32_t tokens[N], pos[N], seq[N], slot[N], table[2] = {0, 1};
        for (int i = 0; i < N; i++) {
            tokens[i] = 0;
            pos[i] = slot[i] = i;
            seq[i] = 0;
        }
        uint8_t seq_store[1] = {0};
        dp_batch b = {.n_tokens = N, .tokens = tokens, .pos = pos, .seq = seq, .slot = slot,
                      .n_seqs = 1, .seq_store = seq_store, .block_tables = table, .max_blocks = 2};
        CHECK(be->ops->batch_set(be, &b) == 0);
        dp_kv_store *stores[DP_KV_MAX_STORES] = {arena, NULL};
        for (int l = 0; l < NL; l++) {
            for (int i = 0; i < N; i++)
                for (int e = 0; e < NKV * HD; e++) {
                    K[l][i][e] = frand() * 3;
                    V[l][i][e] = frand();
                    /* Rows the vector quantizers must round as the scalar
                     * one does: all zeros (d = 0); a scale of exactly 1 with
                     * every other value halfway between two levels (half
                     * away from zero, not to even); a NaN among them. */
                    if (i == 0)
                        K[l][i][e] = V[l][i][e] = 0.0f;
                    else if (i == 1 || i == 2)
                        K[l][i][e] = V[l][i][e] =
                            e % HD == 0 ? 127.0f : (float)((e * 37) % 253 - 126) + 0.5f;
                    if (i == 2 && e % HD == 5)
                        K[l][i][e] = V[l][i][e] = NAN;
                }
            be->ops->kv_write(be, stores, l, &K[l][0][0], &V[l][0][0]);
        }
        /* Keep vbt + 4 slots per (layer, head) (N distinct tokens, then
         * repeats), a different order per head, into view blocks 3 and 5:
         * both are written, and arena blocks 2, 4 and 6 around them not. */
        const int KEEP = vbt + 4;
        int32_t *keep = malloc((size_t)NL * NKV * (size_t)KEEP * sizeof *keep), dst[2] = {3, 5};
        for (int r = 0; r < NL * NKV; r++)
            for (int j = 0; j < KEEP; j++)
                keep[r * KEEP + j] = (j * 7 + r * 3) % N;
        uint8_t *before = malloc(3 * ab), *blk = malloc(ab), *raw = malloc(ab);
        const int32_t around[3] = {2, 4, 6};
        for (int k = 0; k < 3; k++)
            CHECK(be->ops->kv_block_read(be, arena, around[k], before + (size_t)k * ab) == 0);
        dp_compact_seq cs = {table, 2, dst, 2, KEEP, keep};
        CHECK(be->ops->kv_compact(be, arena, view, &cs, 1) == 0);
        for (int k = 0; k < 3; k++) {
            CHECK(be->ops->kv_block_read(be, arena, around[k], blk) == 0);
            CHECK_MSG(memcmp(before + (size_t)k * ab, blk, ab) == 0, "%s: arena block %d overwritten",
                      dp_kv_type_name(type), around[k]);
        }
        /* The view block's bytes: per layer, K then V, [head][token][row]. */
        const size_t vb = be->ops->kv_bytes_per_block(be, &vl);
        /* View block 3 is arena block 3's memory: each layer's K and V
         * start where the arena's do (the view strides by the arena's
         * block, not its own). */
        CHECK(be->ops->kv_block_read(be, view, 3, blk) == 0);
        CHECK(be->ops->kv_block_read(be, arena, 3, raw) == 0);
        for (int l = 0; l < NL; l++)
            for (int kv = 0; kv < 2; kv++)
                CHECK(memcmp(raw + (size_t)l * ab / NL + (size_t)kv * ab / NL / 2,
                             blk + (size_t)l * vb / NL + (size_t)kv * vb / NL / 2, vb / NL / 2) == 0);
        /* Key norms read through the view: those of the dequantized rows. */
        float *norms = malloc((size_t)NL * NKV * (size_t)KEEP * sizeof *norms);
        be->ops->kv_score_knorm(be, view, dst, KEEP, norms);
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NKV; h++)
                for (int j = 0; j < KEEP; j++) {
                    float row[HD], back[HD];
                    uint8_t qb[HD / 32 * 34];
                    const float *x = K[l][keep[(l * NKV + h) * KEEP + j]];
                    for (int e = 0; e < HD; e++)
                        row[e] = dp_fp16_to_f32(dp_f32_to_fp16(x[h * HD + e]));
                    CHECK(quant_quantize_row(qt, row, qb, HD) == 0);
                    CHECK(quant_dequant_row(qt, qb, back, HD) == 0);
                    double ss = 0;
                    for (int e = 0; e < HD; e++)
                        ss += (double)back[e] * back[e];
                    CHECK_NEAR(norms[((size_t)l * NKV + h) * (size_t)KEEP + (size_t)j], sqrt(ss),
                               1e-4 * sqrt(ss) + 1e-6);
                }
        free(norms);
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < NKV; h++)
                for (int j = 0; j < KEEP && j < vbt; j++) {
                    int from = keep[(l * NKV + h) * KEEP + j];
                    float row[HD];
                    uint8_t want[HD / 32 * 34];
                    for (int kv = 0; kv < 2; kv++) {
                        const float *x = kv ? V[l][from] : K[l][from];
                        for (int e = 0; e < HD; e++) /* the arena holds f16 */
                            row[e] = dp_fp16_to_f32(dp_f32_to_fp16(x[h * HD + e]));
                        CHECK(quant_quantize_row(qt, row, want, HD) == 0);
                        const uint8_t *got = blk + (size_t)l * vb / NL + (size_t)kv * vb / NL / 2 +
                                             ((size_t)h * vbt + j) * rb;
                        CHECK_MSG(memcmp(got, want, rb) == 0, "%s layer %d head %d kept %d %s",
                                  dp_kv_type_name(type), l, h, j, kv ? "V" : "K");
                    }
                }
        /* Within the view (a recompression): bytes move as they are. */
        int32_t keep2[NL * NKV * 4], dst2[1] = {6};
        for (int r = 0; r < NL * NKV; r++)
            for (int j = 0; j < 4; j++)
                keep2[r * 4 + j] = 2 * j + 1;
        dp_compact_seq cs2 = {dst, 2, dst2, 1, 4, keep2};
        CHECK(be->ops->kv_compact(be, view, view, &cs2, 1) == 0);
        uint8_t *blk6 = malloc(vb);
        CHECK(be->ops->kv_block_read(be, view, 6, blk6) == 0);
        for (int l = 0; l < NL; l++)
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < NKV; h++)
                    for (int j = 0; j < 4; j++) {
                        size_t lo = (size_t)l * vb / NL + (size_t)kv * vb / NL / 2;
                        CHECK(memcmp(blk6 + lo + ((size_t)h * vbt + j) * rb,
                                     blk + lo + ((size_t)h * vbt + 2 * j + 1) * rb, rb) == 0);
                    }
        /* Host copies round-trip a view block. */
        CHECK(be->ops->kv_block_write(be, view, 7, blk) == 0);
        uint8_t *back = malloc(vb);
        CHECK(be->ops->kv_block_read(be, view, 7, back) == 0);
        CHECK(memcmp(back, blk, vb) == 0);
        /* Folded (the exempt layers' view): layer 0 of view block
         * 7 + s * NB is layer s of arena block 7. Rows compacted into view
         * block 15 land in arena block 7's layer 1, as the plain view reads
         * them, and nothing else changes. */
        dp_kv_layout fl = {1, NKV, HD, vbt, NB * NL, type, 0};
        dp_kv_store *fold;
        fl.n_blocks = NB * NL + 1;
        CHECK(be->ops->kv_view(be, arena, &fl, &bad) == DP_EINVAL); /* not a fold */
        fl.n_blocks = NB * NL;
        CHECK(be->ops->kv_view(be, arena, &fl, &fold) == 0);
        int32_t fdst[1] = {7 + NB}, fkeep[NKV * 4];
        for (int h = 0; h < NKV; h++)
            for (int j = 0; j < 4; j++)
                fkeep[h * 4 + j] = j * 3 + h;
        CHECK(be->ops->kv_block_read(be, arena, 6, before) == 0);
        CHECK(be->ops->kv_block_read(be, view, 7, back) == 0);
        dp_compact_seq fcs = {table, 2, fdst, 1, 4, fkeep};
        CHECK(be->ops->kv_compact(be, arena, fold, &fcs, 1) == 0);
        CHECK(be->ops->kv_block_read(be, arena, 6, raw) == 0);
        CHECK_MSG(memcmp(before, raw, ab) == 0, "%s: a folded write left its block",
                  dp_kv_type_name(type));
        uint8_t *folded = malloc(vb);
        CHECK(be->ops->kv_block_read(be, view, 7, folded) == 0);
        CHECK(memcmp(folded, back, vb / NL) == 0); /* layer 0 of block 7: unchanged */
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < NKV; h++)
                for (int j = 0; j < 4; j++) {
                    float row[HD];
                    uint8_t want[HD / 32 * 34];
                    const float *x = kv ? V[0][fkeep[h * 4 + j]] : K[0][fkeep[h * 4 + j]];
                    for (int e = 0; e < HD; e++)
                        row[e] = dp_fp16_to_f32(dp_f32_to_fp16(x[h * HD + e]));
                    CHECK(quant_quantize_row(qt, row, want, HD) == 0);
                    const uint8_t *got = folded + vb / NL + (size_t)kv * vb / NL / 2 +
                                         ((size_t)h * vbt + j) * rb;
                    CHECK_MSG(memcmp(got, want, rb) == 0, "%s folded head %d row %d %s",
                              dp_kv_type_name(type), h, j, kv ? "V" : "K");
                }
        free(folded);
        be->ops->kv_destroy(be, fold);
        free(keep);
        free(raw);
        free(before);
        free(blk);
        free(blk6);
        free(back);
        be->ops->kv_destroy(be, view);
        be->ops->kv_destroy(be, arena);
    }
    /* A head_dim the 32-value blocks do not divide has no quantized store. */
    dp_kv_layout odd = {1, 1, 48, 16, 4, DP_KV_Q8_0, 0};
    dp_kv_store *kv;
    CHECK(be->ops->kv_bytes_per_block(be, &odd) == 0);
    CHECK(be->ops->kv_create(be, &odd, &kv) == DP_EINVAL);
}

/* logits_topk: per-row temperatures (<= 0 counts as 1) and masks, against a
 * plain sort of the masked rows and the weight sum of kernels/topk.h summed
 * one by one; the masked ids read -inf afterwards, other rows unchanged. */
static void test_logits_topk(dp_backend *be)
{
    enum { N = 6, NV = 3000, K = 64 };
    float *x = be->ops->alloc(be, (size_t)N * NV * sizeof(float));
    static float orig[N * NV], vals[N * K], mx[N], sum[N];
    static int32_t ids[N * K];
    for (int i = 0; i < N * NV; i++)
        orig[i] = i % 7 == 3 ? (float)(int)(4.0f * frand()) : 6.0f * frand();
    orig[NV + 5] = NAN;
    orig[2 * NV + 9] = -INFINITY;
    orig[3 * NV + 11] = 20.0f; /* masked: the max must move */
    for (int i = 0; i < NV; i++)
        orig[5 * NV + i] = -INFINITY;
    memcpy(x, orig, sizeof orig);
    const float temp[N] = {0.8f, 1.0f, 0.0f, 1.3f, -1.0f, 0.5f};
    const uint8_t mask_rows[N] = {0, 1, 0, 1, 0, 1};
    const int32_t mask_ids[3] = {11, 17, NV + 4}; /* out of range: ignored */
    CHECK(be->ops->logits_topk(be, x, N, NV, K, temp, mask_ids, 3, mask_rows, ids, vals, mx,
                               sum) == 0);
    for (int r = 0; r < N; r++) {
        float *want = orig + (size_t)r * NV;
        const float *got = x + (size_t)r * NV;
        if (mask_rows[r])
            want[11] = want[17] = -INFINITY;
        CHECK(memcmp(got, want, NV * sizeof(float)) == 0);
        float m = -INFINITY;
        for (int i = 0; i < NV; i++)
            m = want[i] > m ? want[i] : m;
        m += 0.0f;
        CHECK(mx[r] == m);
        const float inv_t = 1.0f / (temp[r] > 0.0f ? temp[r] : 1.0f);
        uint64_t w = 0;
        for (int i = 0; i < NV && isfinite(m); i++)
            w += dp_topk_weight((want[i] - m) * inv_t);
        CHECK(sum[r] == (isfinite(m) ? dp_topk_sum_float(w) : 0.0f));
        if (isfinite(m))
            CHECK(fabs(sum[r] - (double)w * 0x1p-44) <= 1e-6 * sum[r] && sum[r] >= 1.0f);
        /* Each candidate beats everything after it, and nothing outside beats the last. */
        int32_t above = 0;
        for (int j = 0; j < K; j++) {
            CHECK(vals[r * K + j] == (isnan(want[ids[r * K + j]]) ? -INFINITY : want[ids[r * K + j]]));
            CHECK(j == 0 || dp_topk_key(vals[r * K + j], ids[r * K + j]) <
                                dp_topk_key(vals[r * K + j - 1], ids[r * K + j - 1]));
        }
        for (int i = 0; i < NV; i++)
            above += dp_topk_key(want[i], i) > dp_topk_key(vals[r * K + K - 1], ids[r * K + K - 1]);
        CHECK_EQ_INT(above, K - 1);
    }
    CHECK_EQ_INT(ids[5 * K], 0); /* all -inf: lowest id first */
    CHECK(be->ops->logits_topk(be, x, N, NV, NV + 1, temp, NULL, 0, NULL, ids, vals, mx, sum) ==
          DP_EINVAL);
    be->ops->free(be, x);
}

/* The exact path gives a row the same bits whether its weight was repacked
 * (8 rows) or kept in the file's layout (9 rows), rows wider than the 8192
 * values the reference decodes at a time included (pieces summed in the
 * same order on both). */
static void test_exact_wide_rows(dp_backend *be)
{
    enum { COLS = 8192 + 512, M = 3 };
    const uint32_t types[] = {DP_TYPE_Q4_K, DP_TYPE_Q6_K, DP_TYPE_Q5_0, DP_TYPE_Q3_K};
    const bool was_exact = be->ops->get_exact(be);
    be->ops->set_exact(be, true);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t nb;
        void *raw = make_weight(types[t], 9, COLS, &nb);
        dp_weight w8, w9;
        char err[DP_ERRLEN];
        CHECK(be->ops->weight_load(be, &w8, types[t], 8, COLS, raw, err, sizeof err) == 0);
        CHECK(be->ops->weight_load(be, &w9, types[t], 9, COLS, raw, err, sizeof err) == 0);
        float *x = be->ops->alloc(be, (size_t)M * COLS * 4);
        float *y8 = be->ops->alloc(be, (size_t)M * 8 * 4), *y9 = be->ops->alloc(be, (size_t)M * 9 * 4);
        for (int64_t i = 0; i < (int64_t)M * COLS; i++)
            x[i] = frand();
        be->ops->matmul(be, y8, x, &w8, M);
        be->ops->matmul(be, y9, x, &w9, M);
        for (int i = 0; i < M; i++)
            CHECK_MSG(memcmp(y8 + 8 * i, y9 + 9 * i, 8 * sizeof(float)) == 0,
                      "%s: activation row %d differs between the layouts", quant_type_name(types[t]), i);
        be->ops->free(be, x);
        be->ops->free(be, y8);
        be->ops->free(be, y9);
        be->ops->weight_free(be, &w8);
        be->ops->weight_free(be, &w9);
        free(raw);
    }
    be->ops->set_exact(be, was_exact);
    printf("exact matmul, %d-wide rows: repacked and file layouts give the same bits\n", COLS);
}

/* matmul_shared gives each weight what matmul gives it, bit for bit: the
 * weights on the integer path together (mixed types, as a K-quant file's
 * Q, K and V), and a set with a weight off it (F32) or in exact mode one
 * by one. */
static void test_matmul_shared(dp_backend *be)
{
    enum { COLS = 256, NW = 3 };
    const uint32_t sets[3][NW] = {{DP_TYPE_Q4_K, DP_TYPE_Q6_K, DP_TYPE_Q8_0},
                                  {DP_TYPE_Q4_0, DP_TYPE_Q4_0, DP_TYPE_Q5_1},
                                  {DP_TYPE_Q4_1, DP_TYPE_F32, DP_TYPE_IQ4_XS}};
    const int64_t rows[NW] = {40, 24, 72};
    const int32_t ms[] = {1, 3, 5, 33};
    CHECK(be->ops->matmul_shared != NULL);
    const bool was_exact = be->ops->get_exact(be);
    for (int exact = 0; exact <= 1; exact++) {
        be->ops->set_exact(be, exact);
        for (int st = 0; st < 3; st++) {
            dp_weight w[NW];
            const dp_weight *wp[NW];
            float *ys[NW], *ref[NW];
            float *x = be->ops->alloc(be, (size_t)33 * COLS * 4);
            for (int64_t i = 0; i < 33 * COLS; i++)
                x[i] = frand();
            for (int i = 0; i < NW; i++) {
                size_t nb;
                void *raw = make_weight(sets[st][i], rows[i], COLS, &nb);
                char err[DP_ERRLEN];
                CHECK(be->ops->weight_load(be, &w[i], sets[st][i], rows[i], COLS, raw, err,
                                           sizeof err) == 0);
                free(raw);
                wp[i] = &w[i];
                ys[i] = be->ops->alloc(be, (size_t)33 * (size_t)rows[i] * 4);
                ref[i] = be->ops->alloc(be, (size_t)33 * (size_t)rows[i] * 4);
            }
            for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) {
                for (int i = 0; i < NW; i++)
                    be->ops->matmul(be, ref[i], x, &w[i], ms[k]);
                be->ops->matmul_shared(be, ys, x, wp, NW, ms[k]);
                for (int i = 0; i < NW; i++)
                    CHECK_MSG(memcmp(ys[i], ref[i], (size_t)ms[k] * (size_t)rows[i] * 4) == 0,
                              "set %d weight %d (%s) m=%d exact=%d differs from matmul", st, i,
                              quant_type_name(sets[st][i]), ms[k], exact);
            }
            for (int i = 0; i < NW; i++) {
                be->ops->weight_free(be, &w[i]);
                be->ops->free(be, ys[i]);
                be->ops->free(be, ref[i]);
            }
            be->ops->free(be, x);
        }
    }
    be->ops->set_exact(be, was_exact);
    printf("matmul_shared: each weight's bits as from matmul\n");
}

/* Rows of a quantized table read back (embed): at a level that keeps Q4_1,
 * Q4_0, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, Q2_K and Q3_K repacked in
 * groups of 8 rows, each row must come back as
 * the file's row dequantized, bit for bit, whatever its place in its group. */
static void test_packed_rows(dp_backend *be, uint32_t type)
{
    enum { ROWS = 40, COLS = 256 }; /* (a K type's super-block) */
    size_t nb;
    void *raw = make_weight(type, ROWS, COLS, &nb);
    dp_weight w;
    char err[DP_ERRLEN];
    CHECK(be->ops->weight_load(be, &w, type, ROWS, COLS, raw, err, sizeof err) == 0);
    int32_t tok[ROWS], pos[ROWS], seq[ROWS], slot[ROWS], table[1] = {0};
    uint8_t st[1] = {0};
    for (int i = 0; i < ROWS; i++) {
        tok[i] = (i * 7) % ROWS;
        pos[i] = slot[i] = i;
        seq[i] = 0;
    }
    dp_batch b = {.n_tokens = ROWS, .tokens = tok, .pos = pos, .seq = seq, .slot = slot,
                  .n_seqs = 1, .seq_store = st, .block_tables = table, .max_blocks = 1};
    CHECK(be->ops->batch_set(be, &b) == 0);
    float *e = be->ops->alloc(be, (size_t)ROWS * COLS * 4);
    be->ops->embed(be, &w, e, ROWS);
    float ref[COLS];
    for (int i = 0; i < ROWS; i++) {
        CHECK(quant_dequant_row(type, (const uint8_t *)raw + (size_t)tok[i] * (nb / ROWS), ref,
                                COLS) == 0);
        CHECK_MSG(memcmp(e + (size_t)i * COLS, ref, sizeof ref) == 0, "row %d differs", tok[i]);
    }
    printf("%s rows on the %s kernels (%s layout): all %d read back exactly\n",
           quant_type_name(type), be->ops->kernel_level(be), w.layout ? "repacked" : "file", ROWS);
    be->ops->free(be, e);
    be->ops->weight_free(be, &w);
    free(raw);
}

/* The weights repacked in groups of 8 rows are read by the same kernels at
 * the avx2 and avx512 levels, the latter adding each 4-byte product group
 * into i32 with VNNI where the former sums pairs in i16 first: the integer
 * sums are the same, so the products must be the same bits, at every batch
 * size (on a machine with both levels). */
static void test_x8_levels(void)
{
#ifdef DP_CPU_X86_LEVELS
    const cpu_kern *a = cpu_kern_level("avx2"), *b = cpu_kern_level("avx512");
    if (!a || !b || !a->x8 || !b->x8) {
        printf("repacked matmul, avx2 against avx512: not both on this CPU, skipped\n");
        return;
    }
    enum { ROWS = 48, COLS = 256, M = 9 };
    const uint32_t types[] = {DP_TYPE_Q4_1, DP_TYPE_Q4_0, DP_TYPE_Q8_0, DP_TYPE_Q5_0,
                              DP_TYPE_Q5_1, DP_TYPE_Q4_K, DP_TYPE_Q5_K, DP_TYPE_Q6_K,
                              DP_TYPE_IQ4_NL, DP_TYPE_IQ4_XS, DP_TYPE_Q2_K, DP_TYPE_Q3_K};
    float x[M * COLS];
    for (int i = 0; i < M * COLS; i++)
        x[i] = (float)((i * 7919) % 257 - 128) / 31.0f;
    cpu_q8 xq[M * (COLS / 32)];
    for (int i = 0; i < M; i++)
        a->quantize_q8(x + (size_t)i * COLS, COLS, xq + (size_t)i * (COLS / 32));
    int compared = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t nb;
        uint8_t *raw = make_weight(types[t], ROWS, COLS, &nb);
        const size_t pbytes = cpu_x8_bytes(types[t], ROWS, COLS);
        uint8_t *packed = aligned_alloc(64, (pbytes + 63) & ~(size_t)63);
        cpu_x8_pack(types[t], raw, ROWS, COLS, packed);
        dp_weight w = {.type = types[t], .rows = ROWS, .cols = COLS, .data = packed,
                       .nbytes = pbytes, .layout = CPU_LAYOUT_X8};
        for (int32_t m = 1; m <= M; m++) {
            float ya[M * ROWS], yb[M * ROWS];
            a->mm_q8(&w, 0, ROWS, xq, m, ya);
            b->mm_q8(&w, 0, ROWS, xq, m, yb);
            CHECK_MSG(memcmp(ya, yb, (size_t)m * ROWS * sizeof *ya) == 0,
                      "%s, %d rows: the levels differ", quant_type_name(types[t]), m);
            compared++;
        }
        free(packed);
        free(raw);
    }
    printf("repacked matmul, avx2 against avx512 (VNNI): Q4_1, Q4_0, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, "
           "Q6_K, IQ4_NL, IQ4_XS, Q2_K, Q3_K at 1..%d activation rows, %d products bit-identical\n", M,
           compared);
#endif
}

int main(void)
{
    test_x8_levels();
    for (int threads = 1; threads <= 2; threads++) {
        dp_backend *be;
        char err[DP_ERRLEN];
        CHECK(backend_create(&be, "cpu", threads, err, sizeof err) == 0);
        test_matmul(be);
        test_exact_wide_rows(be);
        test_matmul_shared(be);
        test_packed_rows(be, DP_TYPE_Q4_1);
        test_packed_rows(be, DP_TYPE_Q4_0);
        test_packed_rows(be, DP_TYPE_Q8_0);
        test_packed_rows(be, DP_TYPE_Q5_0);
        test_packed_rows(be, DP_TYPE_Q5_1);
        test_packed_rows(be, DP_TYPE_Q4_K);
        test_packed_rows(be, DP_TYPE_Q5_K);
        test_packed_rows(be, DP_TYPE_Q6_K);
        test_packed_rows(be, DP_TYPE_IQ4_NL);
        test_packed_rows(be, DP_TYPE_IQ4_XS);
        test_packed_rows(be, DP_TYPE_Q2_K);
        test_packed_rows(be, DP_TYPE_Q3_K);
        test_elementwise(be);
        /* Blocks of 4 tokens (partial vector chunks) and of 32 (whole ones,
         * and chunks that start inside a block). */
        for (int32_t bt = 4; bt <= 32; bt *= 8) {
            test_attention(be, DP_KV_F32, bt, 32);
            test_attention(be, DP_KV_F16, bt, 32);
            test_attention(be, DP_KV_Q8_0, bt, 32);
            test_attention(be, DP_KV_Q4_0, bt, 32);
        }
        /* Heads wider than the dequantized tile (256): f32 and f16 stores
         * are read in place. */
        test_attention(be, DP_KV_F32, 32, 512);
        test_attention(be, DP_KV_F16, 32, 512);
        test_kv_views(be);
        test_logits_topk(be);
        backend_destroy(be);
    }
    dp_backend *be;
    char err[DP_ERRLEN];
    CHECK(backend_create(&be, "tpu", 1, err, sizeof err) == DP_EINVAL);
    CHECK(strstr(err, "tpu") != NULL);
    CHECK(backend_create(&be, "cuda:x", 1, err, sizeof err) == DP_EINVAL);
    T_DONE("cpu_backend");
}
