/* test_kv_kivi.c: the kivi4 KV type (kernels/quant.h): its format's
 * rounding bounds, and the CPU backend's grouped store (a view of an f16
 * arena): whole groups written by kv_compact, the residual written by
 * kv_write in the arena's blocks, attention over both against a
 * double-precision reference that reads what the format stores. Run at
 * every kernel level (test.sh sets DP_CPU_LEVEL). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/backend.h"
#include "kernels/quant.h"
#include "t.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rs >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}
static float f16r(float x) { return dp_fp16_to_f32(dp_f32_to_fp16(x)); }

/* Every value comes back within half a step (plus the f16 rounding of the
 * minimum) of its group's range / 15, keys per channel, values per 64
 * channels; an outlier channel widens only its own keys' steps. */
static void test_format(void)
{
    enum { G = 56, HD = 128 };
    static float k[G * HD], v[G * HD], kr[G * HD], vr[HD];
    for (int t = 0; t < G; t++)
        for (int c = 0; c < HD; c++) {
            k[t * HD + c] = frand() * (c == 7 ? 40.0f : 1.0f) + (c == 9 ? 5.0f : 0.0f);
            v[t * HD + c] = frand() * (c < 64 ? 1.0f : 0.01f);
        }
    uint8_t kb[HD * 4 + HD * G / 2], vb[HD / KIVI_VGROUP * 4 + HD / 2];
    CHECK(kivi_k_bytes(HD, G) == (size_t)HD * 4 + (size_t)HD * G / 2);
    kivi_quant_k(k, G, HD, kb);
    kivi_dequant_k(kb, G, HD, 0, G, kr);
    for (int c = 0; c < HD; c++) {
        float lo = k[c], hi = k[c];
        for (int t = 1; t < G; t++) {
            lo = fminf(lo, k[t * HD + c]);
            hi = fmaxf(hi, k[t * HD + c]);
        }
        const float step = (hi - lo) / 15.0f;
        for (int t = 0; t < G; t++)
            CHECK(fabsf(kr[t * HD + c] - k[t * HD + c]) <= 0.5f * step * 1.01f + fabsf(lo) * 1e-3f);
        if (c != 7) /* the outlier channel's steps stay its own */
            CHECK(step < 0.2f);
    }
    /* A partial read is the same values. */
    float part[3 * HD];
    kivi_dequant_k(kb, G, HD, 5, 3, part);
    CHECK(!memcmp(part, kr + 5 * HD, sizeof part));
    for (int t = 0; t < 4; t++) {
        kivi_quant_vrow(v + t * HD, HD, vb);
        kivi_dequant_vrow(vb, HD, vr);
        for (int c0 = 0; c0 < HD; c0 += KIVI_VGROUP) {
            float lo = INFINITY, hi = -INFINITY;
            for (int c = c0; c < c0 + KIVI_VGROUP; c++) {
                lo = fminf(lo, v[t * HD + c]);
                hi = fmaxf(hi, v[t * HD + c]);
            }
            for (int c = c0; c < c0 + KIVI_VGROUP; c++)
                CHECK(fabsf(vr[c] - v[t * HD + c]) <= 0.5f * (hi - lo) / 15.0f * 1.01f + fabsf(lo) * 1e-3f);
        }
    }
}

enum { NL = 2, NKV = 2, NH = 6, HD = 64, BT = 16, NB = 64, MAXT = 200 };

typedef struct seqdata {
    float K[MAXT][NKV * HD], V[MAXT][NKV * HD]; /* as written (f16-rounded) */
    float Kq[MAXT][NKV * HD], Vq[MAXT][NKV * HD]; /* as the store holds them */
} seqdata;

/* Writes rows [lo, hi) of one sequence into a store through kv_write
 * (slot t for token t), with the grouped arrays given. */
static void write_rows(dp_backend *be, dp_kv_store *const *stores, const float (*K)[NKV * HD],
                       const float (*V)[NKV * HD], const int32_t *table, int32_t max_blocks,
                       int32_t lo, int32_t hi, const int32_t *sealed, const int32_t *roff)
{
    const int32_t n = hi - lo;
    int32_t tok[MAXT], pos[MAXT], seq[MAXT], slot[MAXT];
    uint8_t st = 0;
    for (int32_t i = 0; i < n; i++) {
        tok[i] = 1;
        pos[i] = slot[i] = lo + i;
        seq[i] = 0;
    }
    dp_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 1,
                  .seq_store = &st, .block_tables = table, .max_blocks = max_blocks,
                  .seq_sealed = sealed, .seq_roff = roff};
    CHECK(be->ops->batch_set(be, &b) == 0);
    float *k = be->ops->alloc(be, (size_t)n * NKV * HD * 4), *v = be->ops->alloc(be, (size_t)n * NKV * HD * 4);
    memcpy(k, K[lo], (size_t)n * sizeof K[0]);
    memcpy(v, V[lo], (size_t)n * sizeof V[0]);
    for (int32_t layer = 0; layer < NL; layer++)
        be->ops->kv_write(be, stores, layer, k, v);
    be->ops->free(be, k);
    be->ops->free(be, v);
}

/* A sequence of n slots: its lead (the prompt's first arena block, whole)
 * (with_lead) and `groups` whole groups compacted from a prompt written to
 * the arena (sealed: the lead's and the groups' slots), the rest
 * written as a residual from roff on; then a step of the last `last` tokens
 * (queries at their slots) attends, and is compared with the reference. */
static void test_grouped(dp_backend *be, int32_t n, bool with_lead, int32_t groups, int32_t roff,
                         int32_t last)
{
    dp_kv_layout al = {NL, NKV, HD, BT, NB, DP_KV_F16, 0};
    dp_kv_store *arena, *kivi;
    CHECK(be->ops->kv_create(be, &al, &arena) == 0);
    /* The largest even group whose block fits in an arena block. */
    const size_t ablk = be->ops->kv_bytes_per_block(be, &(dp_kv_layout){NL, NKV, HD, BT, 1, DP_KV_F16, 0});
    int32_t G = 2;
    while (be->ops->kv_bytes_per_block(be, &(dp_kv_layout){NL, NKV, HD, G + 2, 1, DP_KV_KIVI4, 0}) <= ablk)
        G += 2;
    CHECK(G == 56); /* head_dim 64: 4 * 64 + 64 * 28 bytes of K = 32 f16 rows */
    CHECK(be->ops->kv_bytes_per_block(be, &(dp_kv_layout){NL, NKV, HD, 55, 1, DP_KV_KIVI4, 0}) == 0);
    dp_kv_layout kl = {NL, NKV, HD, G, NB, DP_KV_KIVI4, 0};
    CHECK(be->ops->kv_create(be, &kl, &kivi) == DP_EINVAL); /* only a view */
    CHECK(be->ops->kv_view(be, arena, &kl, &kivi) == 0);
    const int32_t lead = with_lead ? BT : 0, sealed = lead + groups * G;
    CHECK(n > sealed && n - last >= sealed && n <= MAXT);
    static seqdata d;
    for (int32_t t = 0; t < n; t++)
        for (int32_t i = 0; i < NKV * HD; i++) {
            /* An outlier channel in the keys, as real models have. */
            const float kx = frand() * (i % HD == 3 ? 8.0f : 1.0f);
            d.K[t][i] = d.Kq[t][i] = f16r(kx);
            d.V[t][i] = d.Vq[t][i] = f16r(frand());
        }
    /* The prompt's lead and whole groups: prefilled into arena blocks 0..,
     * then the groups compacted (every slot kept) into kivi blocks taken
     * from the end; the lead stays in block 0. */
    int32_t ptable[MAXT / BT + 1], table[16];
    const int32_t pblocks = (sealed + BT - 1) / BT;
    for (int32_t b = 0; b < pblocks; b++)
        ptable[b] = b;
    dp_kv_store *stores[DP_KV_MAX_STORES] = {arena, kivi};
    write_rows(be, stores, (const float (*)[NKV * HD])d.K, (const float (*)[NKV * HD])d.V, ptable,
               pblocks, 0, sealed, NULL, NULL);
    table[0] = 0;
    for (int32_t g = 0; g < groups; g++)
        table[(lead > 0) + g] = NB - 1 - g;
    const int32_t nk = sealed - lead;
    int32_t *keep = malloc(sizeof(int32_t) * NL * NKV * (size_t)(nk + 1));
    for (int32_t i = 0; i < NL * NKV; i++)
        for (int32_t s = 0; s < nk; s++)
            keep[i * nk + s] = lead + s;
    dp_compact_seq cq = {ptable, pblocks, table + (lead > 0), groups, nk, keep};
    CHECK(groups == 0 || be->ops->kv_compact(be, arena, kivi, &cq, 1) == 0);
    /* A partial group is refused. */
    dp_compact_seq bad = cq;
    bad.n_keep = nk - 1;
    CHECK(nk < 2 || be->ops->kv_compact(be, arena, kivi, &bad, 1) == DP_EINVAL);
    /* Nor is a grouped store a compaction's source (its residual is elsewhere). */
    dp_compact_seq back = {table + (lead > 0), groups, ptable, pblocks, nk, keep};
    CHECK(nk < 1 || be->ops->kv_compact(be, kivi, arena, &back, 1) == DP_EUNSUPPORTED);
    free(keep);
    for (int32_t g = 0; g < groups; g++)
        for (int32_t h = 0; h < NKV; h++) {
            float kg[56 * HD], kr[56 * HD];
            uint8_t kb[4 * HD + HD * 28], vb[HD];
            const int32_t t0 = lead + g * G; /* (the lead's rows stay as written) */
            for (int32_t t = 0; t < G; t++)
                memcpy(kg + t * HD, d.K[t0 + t] + h * HD, sizeof(float) * HD);
            kivi_quant_k(kg, G, HD, kb);
            kivi_dequant_k(kb, G, HD, 0, G, kr);
            for (int32_t t = 0; t < G; t++) {
                memcpy(d.Kq[t0 + t] + h * HD, kr + t * HD, sizeof(float) * HD);
                kivi_quant_vrow(d.V[t0 + t] + h * HD, HD, vb);
                kivi_dequant_vrow(vb, HD, d.Vq[t0 + t] + h * HD);
            }
        }
    /* The residual: arena blocks after the lead and the groups in the
     * table, from roff. */
    const int32_t rblocks = (roff + n - sealed + BT - 1) / BT, r0 = (lead > 0) + groups;
    CHECK(r0 == dp_kv_group_rstart(BT, G, sealed));
    for (int32_t b = 0; b < rblocks; b++)
        table[r0 + b] = pblocks + b; /* (the prompt's other arena blocks are free again) */
    const int32_t max_blocks = r0 + rblocks;
    const int32_t sl[1] = {sealed}, ro[1] = {roff};
    write_rows(be, stores + 1, (const float (*)[NKV * HD])d.K, (const float (*)[NKV * HD])d.V,
               table, max_blocks, sealed, n - last, sl, ro);
    /* The step: the last tokens written and attended, layer 1. */
    int32_t tok[MAXT], pos[MAXT], seq[MAXT], slot[MAXT];
    uint8_t st = 0;
    for (int32_t i = 0; i < last; i++) {
        tok[i] = 1;
        pos[i] = slot[i] = n - last + i;
        seq[i] = 0;
    }
    dp_batch b = {.n_tokens = last, .tokens = tok, .pos = pos, .seq = seq, .slot = slot,
                  .n_seqs = 1, .seq_store = &st, .block_tables = table, .max_blocks = max_blocks,
                  .seq_sealed = sl, .seq_roff = ro};
    CHECK(be->ops->batch_set(be, &b) == 0);
    float *k = be->ops->alloc(be, (size_t)last * NKV * HD * 4), *v = be->ops->alloc(be, (size_t)last * NKV * HD * 4);
    float *q = be->ops->alloc(be, (size_t)last * NH * HD * 4), *o = be->ops->alloc(be, (size_t)last * NH * HD * 4);
    memcpy(k, d.K[n - last], (size_t)last * sizeof d.K[0]);
    memcpy(v, d.V[n - last], (size_t)last * sizeof d.V[0]);
    for (size_t i = 0; i < (size_t)last * NH * HD; i++)
        q[i] = frand();
    for (size_t i = 0; i < (size_t)last * NH * HD; i++)
        o[i] = NAN;
    be->ops->kv_write(be, stores + 1, 1, k, v);
    be->ops->attention(be, stores + 1, 1, o, q, NH, 0.125f, 0);
    double worst = 0;
    for (int32_t i = 0; i < last; i++)
        for (int32_t h = 0; h < NH; h++) {
            const int32_t kh = h / (NH / NKV);
            const float *qi = q + ((size_t)i * NH + h) * HD;
            double sc[MAXT], mx = -1e30, sum = 0;
            for (int32_t t = 0; t <= slot[i]; t++) {
                double x = 0;
                for (int32_t e = 0; e < HD; e++)
                    x += (double)qi[e] * d.Kq[t][kh * HD + e];
                sc[t] = x * 0.125;
                mx = sc[t] > mx ? sc[t] : mx;
            }
            for (int32_t t = 0; t <= slot[i]; t++)
                sum += (sc[t] = exp(sc[t] - mx));
            for (int32_t e = 0; e < HD; e++) {
                double r = 0;
                for (int32_t t = 0; t <= slot[i]; t++)
                    r += sc[t] / sum * d.Vq[t][kh * HD + e];
                const double err = fabs(o[((size_t)i * NH + h) * HD + e] - r);
                worst = err > worst ? err : worst;
            }
        }
    CHECK(worst < 1e-4);
    /* The residual's rows are the arena's: the prompt's f16 values. */
    be->ops->free(be, k);
    be->ops->free(be, v);
    be->ops->free(be, q);
    be->ops->free(be, o);
    /* Block copies (swap) move a group's bytes whole. */
    const size_t kb = be->ops->kv_bytes_per_block(be, &(dp_kv_layout){NL, NKV, HD, G, 1, DP_KV_KIVI4, 0});
    uint8_t *img = malloc(kb), *img2 = malloc(kb);
    if (groups > 0) {
        CHECK(be->ops->kv_block_read(be, kivi, table[1], img) == 0);
        CHECK(be->ops->kv_block_write(be, kivi, 0, img) == 0);
        CHECK(be->ops->kv_block_read(be, kivi, 0, img2) == 0);
        CHECK(!memcmp(img, img2, kb));
    }
    free(img);
    free(img2);
    be->ops->kv_destroy(be, kivi);
    be->ops->kv_destroy(be, arena);
}

int main(void)
{
    test_format();
    for (int threads = 1; threads <= 2; threads++) {
        dp_backend *be;
        char err[DP_ERRLEN];
        CHECK(backend_create(&be, "cpu", threads, err, sizeof err) == 0);
        test_grouped(be, 150, true, 2, 0, 1);  /* a decode step, residual from its block's start */
        test_grouped(be, 150, true, 2, 11, 5); /* a chunk, the residual starting mid-block */
        test_grouped(be, 80, true, 1, 15, 4);  /* a residual crossing one arena block */
        test_grouped(be, 30, true, 0, 0, 3);   /* the lead and no group (a resumed turn's) */
        test_grouped(be, 20, false, 0, 0, 20); /* nothing sealed yet */
        backend_destroy(be);
    }
    T_DONE("kv_kivi");
}
