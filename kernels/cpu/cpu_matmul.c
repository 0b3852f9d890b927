/* cpu_matmul.c: y = x . W^T over weights kept in their file type (Q4_1, Q8_0,
 * f16, ...). Rows of W are dequantized tile by tile into per-thread scratch, so
 * the quantized bytes are read once per step for the whole batch. The kernels
 * themselves are the dispatched level's (cpu_kern.c); this file chooses the
 * path and splits the rows into tasks. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "cpu_internal.h"
#include "kernels/quant.h"

/* Batches up to this many rows use the dot-product path; above it, sgemm wins
 * (measured by tools/dp-bench: sgemm's packing overhead dominates below ~8). */
#define SMALL_M 16
#define TILE_SMALL 16
#define TILE_LARGE 64

int cpu_weight_load(dp_backend *be, dp_weight *w, uint32_t type, int64_t rows, int64_t cols,
                    const void *src, char *err, size_t errsz)
{
    memset(w, 0, sizeof *w);
    if (!quant_type_supported(type))
        return dp_err(err, errsz, DP_EUNSUPPORTED, "weight type %s is not supported",
                      quant_type_name(type));
    uint64_t row_bytes;
    int rc = quant_row_bytes(type, (uint64_t)cols, &row_bytes);
    if (rc)
        return dp_err(err, errsz, rc, "weight row of %lld %s elements has no valid size",
                      (long long)cols, quant_type_name(type));
    size_t nbytes = (size_t)row_bytes * (size_t)rows;
    /* Repacked where the level's integer kernel reads it so. */
    const cpu_kern *k = cpu_of(be)->k;
    const bool x8 = k->x8 && cpu_x8_type(type) && rows % 8 == 0 && cols % cpu_x8_cols(type) == 0 &&
                    cols <= CPU_X8_MAX_COLS;
    if (x8) /* (the K types' decoded scales take a little more) */
        nbytes = cpu_x8_bytes(type, rows, cols);
    size_t alloc = (nbytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, alloc ? alloc : 64);
    if (!p)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory for a %zu-byte weight", nbytes);
    if (x8) {
        cpu_x8_pack(type, src, rows, cols, p);
        w->layout = CPU_LAYOUT_X8;
    } else {
        memcpy(p, src, nbytes);
    }
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->data = p;
    w->nbytes = nbytes;
    return 0;
}

void cpu_weight_free(dp_backend *be, dp_weight *w)
{
    free(w->data);
    memset(w, 0, sizeof *w);
}

static size_t weight_row_bytes(const dp_weight *w)
{
    return w->nbytes / (size_t)w->rows;
}

/* Q5's fifth bits (Q5_0, Q5_1, Q5_K) in a 32-byte vector beside the
 * nibbles (cpu_internal.h): column c of row j at byte 4 j + c % 4, bit 2 k
 * for column 4 k + c % 4 (a low nibble of chunk k), bit 2 k + 1 for column
 * 16 + 4 k + c % 4 (its high nibble). */
static uint8_t *x8_q5h_at(uint8_t *h, int j, int c, int *bit)
{
    *bit = c < 16 ? 2 * (c / 4) : 2 * ((c - 16) / 4) + 1;
    return h + 4 * j + c % 4;
}

/* Where Q5_0's and Q5_1's fifth bits start in the file's block (after d,
 * and m), or -1 for the other 32-column types. Their place in the packed
 * block is x8_at's of that byte for row 0: the 32 bytes from there. */
static int x8_q5h_file(uint32_t type)
{
    return type == DP_TYPE_Q5_0 ? 2 : type == DP_TYPE_Q5_1 ? 4 : -1;
}

/* Where byte i of a file block (scalars first, then quant bytes) goes in
 * the packed block of its group, for row j (Q5's fifth bits: x8_q5h_at). */
static size_t x8_at(uint32_t type, int j, int i)
{
    const int ns = cpu_x8_scalars(type);
    if (i < 2 * ns) /* scalar i / 2, byte i % 2 */
        return (size_t)(16 * (i / 2) + 2 * j + i % 2);
    const int q = i - 2 * ns;
    return (size_t)(16 * ns + 32 * (q / 4) + 4 * j + q % 4);
}

/* ---- Q4_K and Q6_K per super-block of 8 rows (cpu_internal.h) ---- */

/* Q4_K's eight 6-bit (scale, min) pairs packed in 12 bytes, both ways. */
static void q4k_scales_get(const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
            m[j] = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
        }
    }
}

static void q4k_scales_put(const uint8_t *sc, const uint8_t *m, uint8_t *q)
{
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
}

/* Nibble of element e (0..255) of a Q4_K block's quants, and its setter:
 * sub-block s = e / 32 is the low (even s) or high nibbles of 32 bytes. */
static int q4k_nib(const uint8_t *qs, int e)
{
    const uint8_t b = qs[32 * (e / 64) + e % 32];
    return (e / 32) % 2 ? b >> 4 : b & 0x0f;
}

static void q4k_set(uint8_t *qs, int e, int v)
{
    uint8_t *b = &qs[32 * (e / 64) + e % 32];
    *b = (e / 32) % 2 ? (uint8_t)((*b & 0x0f) | (v << 4)) : (uint8_t)((*b & 0xf0) | v);
}

/* Value + 32 (0..63) of element e of a Q6_K block, and its setter. */
static int q6k_val(const uint8_t *b, int e)
{
    const int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
    const uint8_t lb = b[64 * h + l + 32 * (k & 1)], hb = b[128 + 32 * h + l];
    return ((k < 2 ? lb & 0x0f : lb >> 4) | (((hb >> (2 * k)) & 3) << 4));
}

static void q6k_set(uint8_t *b, int e, int v)
{
    const int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
    uint8_t *lb = &b[64 * h + l + 32 * (k & 1)], *hb = &b[128 + 32 * h + l];
    *lb = k < 2 ? (uint8_t)((*lb & 0xf0) | (v & 0x0f)) : (uint8_t)((*lb & 0x0f) | ((v & 0x0f) << 4));
    *hb = (uint8_t)((*hb & ~(3 << (2 * k))) | (((v >> 4) & 3) << (2 * k)));
}

/* Q2_K and Q3_K (cpu_internal.h): the 2-bit value of element e of a file
 * block's qs (64 bytes: byte 32 (e / 128) + e % 32 at bits 2 ((e / 32) % 4)),
 * and its setter. */
static int q2k_val(const uint8_t *qs, int e)
{
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}

static void q2k_set(uint8_t *qs, int e, int v)
{
    qs[32 * (e / 128) + e % 32] |= (uint8_t)(v << (2 * ((e / 32) % 4)));
}

/* The packed byte of element e (column c of sub-block s) of row j, and the
 * shift of its 2 bits. */
static uint8_t *q2k_at(uint8_t *qs0, int stride, int j, int e, int *sh)
{
    const int s = e / 32, c = e % 32, t = c / 4;
    *sh = 2 * (t % 4);
    return qs0 + stride * s + 32 * (t / 4) + 4 * j + c % 4;
}

/* Q2_K (d, dmin at 80 and 82 of the file's block, scale/min bytes at 0,
 * qs at 16) and Q3_K (hmask at 0, qs at 32, packed 6-bit scales at 96, d at
 * 108). The file's third bit of Q3_K element e: hmask byte e % 32, bit e / 32. */
static void x8k_row23(uint32_t type, uint8_t *o, int j, uint8_t *f, bool pack)
{
    const bool q3 = type == DP_TYPE_Q3_K;
    const int stride = q3 ? 96 : 64;
    uint8_t *qs0 = o + (q3 ? CPU_X8K_Q3_QS : CPU_X8K_Q2_QS), *fq = f + (q3 ? 32 : 16);
    if (!q3) {
        if (pack) {
            memcpy(o + 2 * j, f + 80, 2);
            memcpy(o + 16 + 2 * j, f + 82, 2);
        } else {
            memcpy(f + 80, o + 2 * j, 2);
            memcpy(f + 82, o + 16 + 2 * j, 2);
        }
        for (int g = 0; g < 16; g++) {
            if (pack)
                o[32 + 8 * g + j] = f[g];
            else
                f[g] = o[32 + 8 * g + j];
        }
    } else {
        uint8_t *sb = f + 96;
        if (pack)
            memcpy(o + 2 * j, f + 108, 2);
        else
            memcpy(f + 108, o + 2 * j, 2);
        for (int g = 0; g < 16; g++) {
            if (pack) {
                const int lo = g < 8 ? sb[g] & 0x0f : sb[g - 8] >> 4;
                const int hi = (sb[8 + (g & 3)] >> (2 * (g >> 2))) & 3;
                o[16 + 8 * g + j] = (uint8_t)(int8_t)((lo | hi << 4) - 32);
            } else {
                const int v = (int)(int8_t)o[16 + 8 * g + j] + 32;
                sb[g < 8 ? g : g - 8] |= (uint8_t)((v & 0x0f) << (g < 8 ? 0 : 4));
                sb[8 + (g & 3)] |= (uint8_t)((v >> 4) << (2 * (g >> 2)));
            }
        }
    }
    for (int e = 0; e < 256; e++) {
        int sh;
        uint8_t *b = q2k_at(qs0, stride, j, e, &sh);
        uint8_t *h = qs0 + stride * (e / 32) + 64 + 4 * j + (e % 32) / 8;
        if (pack) {
            *b |= (uint8_t)(q2k_val(fq, e) << sh);
            if (q3)
                *h |= (uint8_t)(((f[e % 32] >> (e / 32)) & 1) << (e % 8));
        } else {
            q2k_set(fq, e, (*b >> sh) & 3);
            if (q3)
                f[e % 32] |= (uint8_t)(((*h >> (e % 8)) & 1) << (e / 32));
        }
    }
}

/* One super-block of row j (file block f) into (pack: f is only read) or
 * out of the packed block o (unpack: f starts zeroed). */
static void x8k_row(uint32_t type, uint8_t *o, int j, uint8_t *f, bool pack)
{
    if (type == DP_TYPE_Q2_K || type == DP_TYPE_Q3_K) {
        x8k_row23(type, o, j, f, pack);
        return;
    }
    if (type == DP_TYPE_Q4_K || type == DP_TYPE_Q5_K) {
        /* (Q5_K's file block: d, dmin, scales, then 32 bytes of high bits.) */
        const bool q5 = type == DP_TYPE_Q5_K;
        uint8_t sc[8], m[8];
        uint8_t *qs = o + (q5 ? CPU_X8K_Q5_QS : CPU_X8K_Q4_QS), *fq = f + (q5 ? 48 : 16);
        if (pack) {
            memcpy(o + 2 * j, f, 2);
            memcpy(o + 16 + 2 * j, f + 2, 2);
            q4k_scales_get(f + 4, sc, m);
            for (int s = 0; s < 8; s++) {
                o[32 + 8 * s + j] = sc[s];
                o[96 + 8 * s + j] = m[s];
            }
        } else {
            memcpy(f, o + 2 * j, 2);
            memcpy(f + 2, o + 16 + 2 * j, 2);
            for (int s = 0; s < 8; s++) {
                sc[s] = o[32 + 8 * s + j];
                m[s] = o[96 + 8 * s + j];
            }
            q4k_scales_put(sc, m, f + 4);
        }
        /* Sub-block s as a Q4_0 block: byte i holds columns i and 16 + i;
         * Q5_K's fifth bit of column c: bit s of the file's byte c. */
        for (int e = 0; e < 256; e++) {
            const int s = e / 32, c = e % 32, i = c % 16;
            uint8_t *b = qs + 128 * s + 32 * (i / 4) + 4 * j + i % 4;
            int bit;
            uint8_t *h = x8_q5h_at(o + CPU_X8K_Q4_QS + 32 * s, j, c, &bit);
            if (pack) {
                *b = c < 16 ? (uint8_t)((*b & 0xf0) | q4k_nib(fq, e))
                            : (uint8_t)((*b & 0x0f) | (q4k_nib(fq, e) << 4));
                if (q5)
                    *h |= (uint8_t)(((f[16 + c] >> s) & 1) << bit);
            } else {
                q4k_set(fq, e, c < 16 ? *b & 0x0f : *b >> 4);
                if (q5)
                    f[16 + c] |= (uint8_t)(((*h >> bit) & 1) << s);
            }
        }
        return;
    }
    if (type == DP_TYPE_IQ4_XS) { /* d, scales_h (2 bytes), scales_l (4), qs (128) */
        if (pack) {
            memcpy(o + 2 * j, f, 2);
            const unsigned sh = (unsigned)(f[2] | (f[3] << 8));
            for (int s = 0; s < 8; s++) {
                const int ls = ((f[4 + s / 2] >> (4 * (s % 2))) & 0x0f) | (int)(((sh >> (2 * s)) & 3) << 4);
                o[16 + 8 * s + j] = (uint8_t)(int8_t)(ls - 32);
            }
        } else {
            memcpy(f, o + 2 * j, 2);
            unsigned sh = 0;
            for (int s = 0; s < 8; s++) {
                const int ls = (int)(int8_t)o[16 + 8 * s + j] + 32;
                f[4 + s / 2] |= (uint8_t)((ls & 0x0f) << (4 * (s % 2)));
                sh |= (unsigned)(ls >> 4) << (2 * s);
            }
            f[2] = (uint8_t)sh;
            f[3] = (uint8_t)(sh >> 8);
        }
        /* Each sub-block's 16 bytes are Q4_0's: byte i holds columns i, 16 + i. */
        for (int s = 0; s < 8; s++)
            for (int i = 0; i < 16; i++) {
                uint8_t *b = o + CPU_X8K_IQ4_QS + 128 * s + 32 * (i / 4) + 4 * j + i % 4;
                if (pack)
                    *b = f[8 + 16 * s + i];
                else
                    f[8 + 16 * s + i] = *b;
            }
        return;
    }
    /* Q6_K: d at 208 of the file's block, scales at 192. */
    if (pack) {
        memcpy(o + 2 * j, f + 208, 2);
        for (int h = 0; h < 16; h++)
            o[16 + 8 * h + j] = f[192 + h];
    } else {
        memcpy(f + 208, o + 2 * j, 2);
        for (int h = 0; h < 16; h++)
            f[192 + h] = o[16 + 8 * h + j];
    }
    /* Column c = 16 half + 4 k + i (i < 4) of sub-block s: its nibble in
     * byte 4 j + i of vector k (as Q4_0's), its top 2 bits in byte 4 j + i
     * of top-bit vector k / 2, at bit 4 (k % 2) + 2 half. */
    for (int e = 0; e < 256; e++) {
        const int s = e / 32, c = e % 32, half = c / 16, k = c % 16 / 4, i = c % 4;
        uint8_t *blk = o + CPU_X8K_Q6_QS + 192 * s;
        uint8_t *b = blk + 32 * k + 4 * j + i;
        uint8_t *h = blk + 128 + 32 * (k / 2) + 4 * j + i;
        const int sh = 4 * (k % 2) + 2 * half;
        if (pack) {
            const int v = q6k_val(f, e);
            *b = c < 16 ? (uint8_t)((*b & 0xf0) | (v & 0x0f)) : (uint8_t)((*b & 0x0f) | ((v & 0x0f) << 4));
            *h = (uint8_t)(*h | ((v >> 4) << sh));
        } else {
            q6k_set(f, e, (c < 16 ? *b & 0x0f : *b >> 4) | (((*h >> sh) & 3) << 4));
        }
    }
}

void cpu_x8_pack(uint32_t type, const uint8_t *src, int64_t rows, int64_t cols, uint8_t *dst)
{
    if (cpu_x8_kquant(type)) {
        const int64_t nsb = cols / 256;
        const size_t pb = cpu_x8_block(type), fb = quant_block_bytes(type);
        memset(dst, 0, cpu_x8_bytes(type, rows, cols));
        for (int64_t g = 0; g < rows / 8; g++)
            for (int64_t b = 0; b < nsb; b++)
                for (int j = 0; j < 8; j++)
                    x8k_row(type, dst + ((size_t)g * (size_t)nsb + (size_t)b) * pb, j,
                            (uint8_t *)src + ((size_t)(g * 8 + j) * (size_t)nsb + (size_t)b) * fb,
                            true);
        return;
    }
    const int64_t nb = cols / 32;
    const size_t pb = cpu_x8_block(type), fb = pb / 8;
    const int hi = x8_q5h_file(type); /* the file's 4 bytes of fifth bits, or -1 */
    for (int64_t g = 0; g < rows / 8; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = dst + ((size_t)g * (size_t)nb + (size_t)b) * pb;
            if (hi >= 0)
                memset(o + x8_at(type, 0, hi), 0, 32);
            for (int j = 0; j < 8; j++) {
                const uint8_t *s = src + ((size_t)(g * 8 + j) * (size_t)nb + (size_t)b) * fb;
                for (int i = 0; i < (int)fb; i++) {
                    if (hi >= 0 && i >= hi && i < hi + 4)
                        continue;
                    o[x8_at(type, j, i)] = s[i];
                }
                for (int c = 0; hi >= 0 && c < 32; c++) {
                    int bit;
                    uint8_t *h = x8_q5h_at(o + x8_at(type, 0, hi), j, c, &bit);
                    *h |= (uint8_t)(((s[hi + c / 8] >> (c % 8)) & 1) << bit);
                }
            }
        }
}

void cpu_x8_unpack_row(const dp_weight *w, int64_t r, uint8_t *dst)
{
    if (cpu_x8_kquant(w->type)) {
        const int64_t nsb = w->cols / 256, g = r / 8;
        const size_t pb = cpu_x8_block(w->type), fb = quant_block_bytes(w->type);
        memset(dst, 0, (size_t)nsb * fb);
        for (int64_t b = 0; b < nsb; b++)
            x8k_row(w->type, (uint8_t *)w->data + ((size_t)g * (size_t)nsb + (size_t)b) * pb,
                    (int)(r % 8), dst + (size_t)b * fb, false);
        return;
    }
    const int64_t nb = w->cols / 32, g = r / 8;
    const int j = (int)(r % 8), hi = x8_q5h_file(w->type);
    const size_t pb = cpu_x8_block(w->type), fb = pb / 8;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = (const uint8_t *)w->data + ((size_t)g * (size_t)nb + (size_t)b) * pb;
        uint8_t *d = dst + (size_t)b * fb;
        for (int i = 0; i < (int)fb; i++)
            if (hi < 0 || i < hi || i >= hi + 4)
                d[i] = o[x8_at(w->type, j, i)];
        if (hi >= 0) {
            memset(d + hi, 0, 4);
            for (int c = 0; c < 32; c++) {
                int bit;
                const uint8_t *h = x8_q5h_at((uint8_t *)o + x8_at(w->type, 0, hi), j, c, &bit);
                d[hi + c / 8] |= (uint8_t)(((*h >> bit) & 1) << (c % 8));
            }
        }
    }
}

void cpu_weight_row(const dp_weight *w, int64_t r, float *dst)
{
    if (w->layout == CPU_LAYOUT_X8) {
        uint8_t row[CPU_X8_ROW_MAX];
        cpu_x8_unpack_row(w, r, row);
        quant_dequant_row(w->type, row, dst, w->cols);
        return;
    }
    const uint8_t *src = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(w);
    if (w->type == DP_TYPE_F32)
        memcpy(dst, src, (size_t)w->cols * sizeof(float));
    else
        quant_dequant_row(w->type, src, dst, w->cols);
}

typedef struct mm_job {
    cpu_backend *c;
    float *y;
    const float *x;
    const dp_weight *w;
    int32_t m;
    int64_t tile;
    int path;
} mm_job;

/* Which path a matmul takes: the integer one (activations quantized per 32
 * values) where the level has a kernel for the weight type, else the exact
 * one: fused f32 dot products at small batches, sgemm on decoded tiles above. */
enum { MM_Q8, MM_FUSED, MM_SGEMM };

static void mm_task(void *ctx, int64_t t, int thread)
{
    mm_job *j = ctx;
    const dp_weight *w = j->w;
    const cpu_kern *k = j->c->k;
    const int64_t n = w->rows;
    const int64_t r0 = t * j->tile;
    const int64_t nt = r0 + j->tile <= n ? j->tile : n - r0;
    if (j->path == MM_Q8) {
        k->mm_q8(w, r0, nt, j->c->xq, j->m, j->y);
        return;
    }
    if (j->path != MM_SGEMM) {
        k->mm_f32(w, r0, nt, j->x, j->m, j->y);
        return;
    }
    const float *wt;
    if (w->type == DP_TYPE_F32) {
        wt = (const float *)w->data + (size_t)r0 * (size_t)w->cols;
    } else {
        float *s = j->c->wscratch[thread];
        k->decode_rows(w, r0, nt, s);
        wt = s;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->m, (blasint)nt, (blasint)w->cols, 1.0f,
                j->x, (blasint)w->cols, wt, (blasint)w->cols, 0.0f, j->y + r0, (blasint)n);
}

/* One task per activation row: its quantized blocks. */
static void quant_task(void *ctx, int64_t i, int thread)
{
    mm_job *j = ctx;
    const int64_t kc = j->w->cols;
    j->c->k->quantize_q8(j->x + (size_t)i * (size_t)kc, kc, j->c->xq + (size_t)i * (size_t)(kc / 32));
}

static bool q8_ready(cpu_backend *c, const dp_weight *w, int32_t m)
{
    if (c->exact || !c->k->q8_supports || !c->k->q8_supports(w))
        return false;
    size_t need = (size_t)m * (size_t)(w->cols / 32);
    if (need > c->xq_cap) {
        /* Grown, never shrunk: the largest step's activations. Without
         * memory the exact path still works. */
        void *p = aligned_alloc(64, (need * sizeof(cpu_q8) + 63) & ~(size_t)63);
        if (!p)
            return false;
        free(c->xq);
        c->xq = p;
        c->xq_cap = need;
    }
    return true;
}

/* Rows per task on the dot-product paths. Each task is claimed by one
 * atomic step on a line every thread touches, so tiles of 16 rows cost more
 * in claims than in work at decode batches (the LM head of a 49152-word
 * vocabulary: 3072 claims a token, and one sequence decoded more slowly
 * with 2 threads than with 1). There the tile is the rows over the tasks;
 * up to 4 activation rows are computed in one pass over the weights, a
 * larger batch reads its tile once per 4 rows, so there it stays within
 * DOT_TILE_BYTES of weights, half of the smallest L2 cache of current x86
 * cores (256 KiB; SmolLM2's largest tiles at 2 threads are a quarter of
 * that, a 7B model's would be megabytes). Above DOT_WIDE_M rows (prompt
 * chunks) a tile of 16 is work enough, and the many tiles balance the
 * threads: larger ones prefilled 2-5 % slower. dp-bench at 2 threads,
 * 16-row tiles against these, alternately: decode batch 1 190 -> 336
 * tok/s, batch 8 591 -> 834, batch 32 929 -> 1039. A multiple of 16 rows
 * (the repacked layout's groups are 8). */
#define DOT_TILE_BYTES (128 * 1024)
#define DOT_WIDE_M 32
static int64_t dot_tile(const dp_weight *w, int32_t m, int64_t tasks)
{
    if (m > DOT_WIDE_M)
        return TILE_SMALL;
    int64_t t = w->rows / tasks;
    if (m > 4) {
        const int64_t fit = (int64_t)(DOT_TILE_BYTES / weight_row_bytes(w));
        if (t > fit)
            t = fit;
    }
    t = t / 16 * 16; /* down: at least the tasks asked for */
    return t > TILE_SMALL ? t : TILE_SMALL;
}

/* The path of one weight's matmul and its activations: quantized into
 * c->xq (by the pool unless there are only a few rows) where the integer
 * path takes it. */
static void mm_prepare(cpu_backend *c, mm_job *j)
{
    if (q8_ready(c, j->w, j->m)) {
        j->path = MM_Q8;
        if (j->m < 4) /* waking the pool costs more than the rows */
            for (int32_t i = 0; i < j->m; i++)
                quant_task(j, i, 0);
        else
            threadpool_run(c->tp, quant_task, j, j->m);
    } else if (j->m > SMALL_M) {
        j->path = MM_SGEMM;
        j->tile = TILE_LARGE;
    }
}

/* Rows per task: at least four tiles per thread, so that the last tile to
 * finish does not leave the other threads idle for long (the K and V
 * projections have few rows). Returns the number of tiles. */
static int64_t mm_tiles(cpu_backend *c, mm_job *j)
{
    const dp_weight *w = j->w;
    int64_t want = (int64_t)threadpool_size(c->tp) * 4;
    if (j->path != MM_SGEMM)
        j->tile = dot_tile(w, j->m, want);
    else
        while (j->tile > 16 && (w->rows + j->tile - 1) / j->tile < want)
            j->tile /= 2;
    /* Scratch was sized at weight load time for TILE_LARGE rows of the widest
     * weight, see cpu_scratch_reserve. */
    return (w->rows + j->tile - 1) / j->tile;
}

void cpu_matmul(dp_backend *be, float *y, const float *x, const dp_weight *w, int32_t m)
{
    cpu_backend *c = cpu_of(be);
    mm_job j = {c, y, x, w, m, TILE_SMALL, MM_FUSED};
    mm_prepare(c, &j);
    threadpool_run(c->tp, mm_task, &j, mm_tiles(c, &j));
}

/* Several weights' matmuls over one input (backend.h matmul_shared) as one
 * pool run: their tiles in one list. */
typedef struct mm_shared {
    mm_job j[DP_MATMUL_SHARED_MAX];
    int64_t end[DP_MATMUL_SHARED_MAX]; /* weight i's tiles: [end[i - 1], end[i]) */
} mm_shared;

static void mm_shared_task(void *ctx, int64_t t, int thread)
{
    mm_shared *s = ctx;
    int32_t i = 0;
    while (t >= s->end[i])
        i++;
    mm_task(&s->j[i], t - (i ? s->end[i - 1] : 0), thread);
}

/* The input is quantized once for every weight on the integer path (the
 * same blocks each matmul would make: the format does not depend on the
 * weight type), and one pool run computes every weight's tiles: the Q, K
 * and V projections were three quantizations and three runs (six at a
 * batch of 4 or more), the small K and V ones leaving threads idle at
 * their ends. Each y is what cpu_matmul gives, bit for bit: a row's sums
 * do not depend on the tile it is in. Weights off the integer path (or
 * of different widths) go one at a time. */
void cpu_matmul_shared(dp_backend *be, float *const *ys, const float *x,
                       const dp_weight *const *ws, int32_t n, int32_t m)
{
    cpu_backend *c = cpu_of(be);
    if (n <= 0)
        return;
    bool q8 = n <= DP_MATMUL_SHARED_MAX;
    for (int32_t i = 0; i < n && q8; i++)
        q8 = ws[i]->cols == ws[0]->cols && q8_ready(c, ws[i], m);
    if (!q8) {
        for (int32_t i = 0; i < n; i++)
            cpu_matmul(be, ys[i], x, ws[i], m);
        return;
    }
    mm_shared s;
    for (int32_t i = 0; i < n; i++) {
        s.j[i] = (mm_job){c, ys[i], x, ws[i], m, TILE_SMALL, MM_Q8};
        s.end[i] = (i ? s.end[i - 1] : 0) + mm_tiles(c, &s.j[i]);
    }
    mm_prepare(c, &s.j[0]); /* the one quantization, into c->xq */
    threadpool_run(c->tp, mm_shared_task, &s, s.end[n - 1]);
}
