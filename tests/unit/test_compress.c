/* test_compress.c: the decode-path migration on the CPU backend against scalar
 * references: n_keep, each scorer's selection, kv_compact's per-head gather
 * (and nothing else written), and keep-all giving bit-identical logits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/cpu/cpu_internal.h"
#include "kvcache/compress.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "t.h"

/* A V row of an f32 store (the tests fill and read the stores directly). */
static float *vrow_f32(const dp_kv_store *kv, int32_t layer, int32_t block, int32_t head, int32_t tok)
{
    return (float *)kv->v + kv_vrow_off(kv, layer, block, head, tok);
}
#include "tools/kv_sim.h"
#include "tools/synth_gguf.h"

static uint64_t rs = 12345;
static uint32_t urand(uint32_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}
static float frand(void) { return (float)urand(1u << 24) / (float)(1u << 23) - 1.0f; }

/* A random permutation of 0..n-1: block tables that are not the identity. */
static void shuffle(int32_t *v, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        v[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)urand((uint32_t)i + 1), t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

#define L 3
#define HKV 2
#define HQ 4
#define HD 8
#define BTK 4

typedef struct cand {
    float s;
    int32_t slot;
} cand;

/* Higher score first; ties to the later slot (the documented rule). */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->s != y->s)
        return x->s > y->s ? -1 : 1;
    return y->slot - x->slot;
}

static int int_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Reference selection for one row of scores: sinks, window, then the best
 * middle slots by `score(i)`, ascending. */
static void ref_select(const float *score, int32_t n, int32_t S, int32_t W, int32_t n_keep, int32_t *out)
{
    int32_t s = S < n_keep ? S : n_keep, w = W < n_keep - s ? W : n_keep - s, k = 0;
    cand *c = malloc((size_t)n * sizeof *c);
    int32_t m = 0;
    for (int32_t i = s; i < n - w; i++)
        c[m++] = (cand){score[i], i};
    qsort(c, (size_t)m, sizeof *c, cand_cmp);
    for (int32_t i = 0; i < s; i++)
        out[k++] = i;
    for (int32_t i = 0; i < n_keep - s - w; i++)
        out[k++] = c[i].slot;
    for (int32_t i = n - w; i < n; i++)
        out[k++] = i;
    qsort(out, (size_t)k, sizeof *out, int_cmp);
    free(c);
}

static void check_n_keep(void)
{
    dp_compress_opts o = {DP_SCORER_KNORM, 0.5f, 4, 32, 0, 0};
    CHECK_EQ_INT(compress_n_keep(&o, 100), 50);
    CHECK_EQ_INT(compress_n_keep(&o, 101), 51); /* ceil */
    o.keep_ratio = 0.1f;
    CHECK_EQ_INT(compress_n_keep(&o, 512), 52);
    CHECK_EQ_INT(compress_n_keep(&o, 100), 36); /* the sinks + window floor */
    CHECK_EQ_INT(compress_n_keep(&o, 20), 20);  /* never more than there is */
    o.keep_ratio = 0.7f;
    CHECK_EQ_INT(compress_n_keep(&o, 10), 10);
    CHECK_EQ_INT(compress_n_keep(&o, 1000), 700); /* 0.7f * 1000 is 699.99998 in float */
    o.keep_ratio = 0.1f;
    CHECK_EQ_INT(compress_n_keep(&o, 1700), 170); /* 0.1f * 1700 is 170.0000025 */
    o.keep_ratio = 1.0f;
    for (int32_t n = 1; n < 3000; n += 37)
        CHECK_EQ_INT(compress_n_keep(&o, n), n);
    /* The formula, over many shapes: min(n, max(S + W, ceil(r n))). */
    float ratios[] = {0.1f, 0.2f, 0.3f, 0.5f, 0.7f, 0.9f};
    for (size_t r = 0; r < sizeof ratios / sizeof ratios[0]; r++)
        for (int32_t S = 0; S <= 8; S += 4)
            for (int32_t W = 0; W <= 64; W += 32)
                for (int32_t n = 1; n < 2100; n += 13) {
                    dp_compress_opts q = {DP_SCORER_KNORM, ratios[r], S, W, 0, 0};
                    /* ceil of r n, where r n is taken as exact when float
                     * rounding of r alone puts it just above an integer
                     * (0.1f * 170 = 17.0000003 keeps 17, not 18). */
                    int64_t want = (int64_t)ceil((double)ratios[r] * n - 1e-4);
                    if (want < S + W)
                        want = S + W;
                    if (want > n)
                        want = n;
                    CHECK_MSG(compress_n_keep(&q, n) == want, "r %g S %d W %d n %d: %d != %lld",
                              (double)ratios[r], S, W, n, compress_n_keep(&q, n), (long long)want);
                }
}

/* Fills slots [0, n) of a sequence with random K and V. */
static void fill_random(dp_kv_store *kv, const int32_t *table, int32_t n)
{
    for (int32_t l = 0; l < L; l++)
        for (int32_t h = 0; h < HKV; h++)
            for (int32_t s = 0; s < n; s++) {
                float k[HD], v[HD];
                float scale = 0.2f + 2.0f * (float)urand(1000) / 1000.0f; /* spread the norms */
                for (int32_t d = 0; d < HD; d++) {
                    k[d] = scale * frand();
                    v[d] = frand();
                }
                kv_kput(kv, l, table[s / BTK], h, s % BTK, k);
                kv_vput(kv, l, table[s / BTK], h, s % BTK, v);
            }
}

/* For an f32 and an f16 store: the kernels read either in place, and score
 * the 5 x 2 (query, head) pairs in tiles (4 or 8 with a remainder, one
 * pair with a shorter causal limit among them). */
static void check_selection(dp_backend *be, dp_kv_type type)
{
    const int32_t n = 37, NB = 16;
    dp_kv_layout lay = {L, HKV, HD, BTK, NB, type, 0};
    dp_kv_store *kv;
    CHECK(be->ops->kv_create(be, &lay, &kv) == 0);
    int32_t perm[16], table[16];
    shuffle(perm, NB);
    memcpy(table, perm, sizeof table);
    fill_random(kv, table, n);
    dp_compressor c;
    CHECK(compressor_init(&c, be, L, HKV, HQ, HD) == 0);

    /* Scalar key norms and attention mass. */
    float knorm[L][HKV][37], attn[L][HKV][37];
    for (int32_t l = 0; l < L; l++)
        for (int32_t h = 0; h < HKV; h++)
            for (int32_t s = 0; s < n; s++) {
                float k[HD];
                kv_kget(kv, l, table[s / BTK], h, s % BTK, k);
                double ss = 0;
                for (int32_t d = 0; d < HD; d++)
                    ss += (double)k[d] * k[d];
                knorm[l][h][s] = (float)sqrt(ss);
            }
    enum { NQ = 5 };
    float q[L][NQ][HQ * HD];
    int32_t q_slot[NQ] = {20, 33, 34, 35, 36}; /* one query that sees only part of the cache */
    for (int32_t l = 0; l < L; l++)
        for (int32_t i = 0; i < NQ; i++)
            for (int32_t d = 0; d < HQ * HD; d++)
                q[l][i][d] = 2.0f * frand();
    const float scale = 1.0f / sqrtf((float)HD);
    for (int32_t l = 0; l < L; l++)
        for (int32_t h = 0; h < HKV; h++) {
            double acc[37] = {0};
            for (int32_t i = 0; i < NQ; i++)
                for (int32_t g = 0; g < HQ / HKV; g++) {
                    const float *qh = q[l][i] + (h * (HQ / HKV) + g) * HD;
                    double e[37], mx = -1e30, sum = 0;
                    for (int32_t s = 0; s <= q_slot[i]; s++) {
                        float k[HD];
                        kv_kget(kv, l, table[s / BTK], h, s % BTK, k);
                        double dot = 0;
                        for (int32_t d = 0; d < HD; d++)
                            dot += (double)qh[d] * k[d];
                        e[s] = dot * scale;
                        if (e[s] > mx)
                            mx = e[s];
                    }
                    for (int32_t s = 0; s <= q_slot[i]; s++)
                        sum += (e[s] = exp(e[s] - mx));
                    for (int32_t s = 0; s <= q_slot[i]; s++)
                        acc[s] += e[s] / sum;
                }
            for (int32_t s = 0; s < n; s++)
                attn[l][h][s] = (float)acc[s];
        }

    const int32_t S = 4, W = 6;
    int32_t keep[L * HKV * 37], ref[37];
    for (int sc = 0; sc <= DP_SCORER_RANDOM; sc++) {
        for (int32_t n_keep = 1; n_keep <= n; n_keep++) {
            dp_compress_opts o = {(dp_scorer)sc, 0.5f, S, W, 7, 0};
            memset(keep, 0xff, sizeof keep);
            CHECK(compressor_select(&c, &o, kv, table, n, &q[0][0][0], NQ * HQ * HD, q_slot, NQ, n_keep,
                                    keep) == 0);
            for (int32_t l = 0; l < L; l++)
                for (int32_t h = 0; h < HKV; h++) {
                    const int32_t *k = keep + ((size_t)l * HKV + h) * n_keep;
                    const float *bs = c.host_scores + ((size_t)l * HKV + h) * n;
                    /* Ascending, distinct, in range; sinks and window always kept. */
                    for (int32_t i = 0; i < n_keep; i++) {
                        CHECK(k[i] >= 0 && k[i] < n);
                        if (i)
                            CHECK(k[i] > k[i - 1]);
                    }
                    int32_t fs = S < n_keep ? S : n_keep, fw = W < n_keep - fs ? W : n_keep - fs;
                    for (int32_t i = 0; i < fs; i++)
                        CHECK_EQ_INT(k[i], i);
                    for (int32_t i = 0; i < fw; i++)
                        CHECK_EQ_INT(k[n_keep - fw + i], n - fw + i);
                    float sc_row[37];
                    for (int32_t s = 0; s < n; s++) {
                        switch (sc) {
                        case DP_SCORER_KNORM:
                            CHECK_NEAR(bs[s], knorm[l][h][s], 1e-5);
                            sc_row[s] = -bs[s];
                            break;
                        case DP_SCORER_KNORM_HIGH:
                            CHECK_NEAR(bs[s], knorm[l][h][s], 1e-5);
                            sc_row[s] = bs[s];
                            break;
                        case DP_SCORER_SNAPKV: {
                            CHECK_NEAR(bs[s], attn[l][h][s], 1e-4);
                            /* Max-pooled over +-DP_SNAPKV_POOL neighbours. */
                            float v = bs[s];
                            for (int32_t d = -DP_SNAPKV_POOL; d <= DP_SNAPKV_POOL; d++)
                                if (s + d >= 0 && s + d < n && bs[s + d] > v)
                                    v = bs[s + d];
                            sc_row[s] = v;
                            break;
                        }
                        case DP_SCORER_RECENT:
                            sc_row[s] = (float)s;
                            break;
                        default:
                            sc_row[s] = 0;
                        }
                    }
                    if (sc == DP_SCORER_RANDOM)
                        continue;
                    ref_select(sc_row, n, S, W, n_keep, ref);
                    CHECK_MSG(memcmp(k, ref, (size_t)n_keep * sizeof *k) == 0,
                              "%s: layer %d head %d n_keep %d differs from the reference",
                              scorer_name((dp_scorer)sc), l, h, n_keep);
                }
            if (sc == DP_SCORER_RECENT)
                for (int32_t i = 0; i < n_keep; i++) {
                    int32_t fs = S < n_keep ? S : n_keep;
                    CHECK_EQ_INT(keep[i], i < fs ? i : n - (n_keep - i));
                }
            if (sc == DP_SCORER_RANDOM && n_keep > S + W && n_keep < n - 2) {
                /* Seeded: the same seed repeats, another seed differs. */
                int32_t again[L * HKV * 37];
                CHECK(compressor_select(&c, &o, kv, table, n, NULL, 0, NULL, 0, n_keep, again) == 0);
                CHECK(memcmp(again, keep, (size_t)L * HKV * n_keep * sizeof *keep) == 0);
                o.seed = 8;
                CHECK(compressor_select(&c, &o, kv, table, n, NULL, 0, NULL, 0, n_keep, again) == 0);
                CHECK(memcmp(again, keep, (size_t)L * HKV * n_keep * sizeof *keep) != 0);
                /* Heads choose different sets. */
                CHECK(memcmp(keep, keep + n_keep, (size_t)n_keep * sizeof *keep) != 0);
            }
        }
        /* keep_ratio 1.0 keeps everything, in order. */
        dp_compress_opts all = {(dp_scorer)sc, 1.0f, S, W, 3, 0};
        int32_t nk = compress_n_keep(&all, n);
        CHECK_EQ_INT(nk, n);
        CHECK(compressor_select(&c, &all, kv, table, n, &q[0][0][0], NQ * HQ * HD, q_slot, NQ, nk, keep) == 0);
        for (int32_t r = 0; r < L * HKV; r++)
            for (int32_t s = 0; s < n; s++)
                CHECK_EQ_INT(keep[r * n + s], s);
    }
    /* SnapKV without queries falls back to key norms. */
    dp_compress_opts sk = {DP_SCORER_SNAPKV, 0.5f, S, W, 0, 0}, kn = sk;
    kn.scorer = DP_SCORER_KNORM;
    int32_t k2[L * HKV * 37];
    CHECK(compressor_select(&c, &sk, kv, table, n, NULL, 0, NULL, 0, 20, keep) == 0);
    CHECK(compressor_select(&c, &kn, kv, table, n, NULL, 0, NULL, 0, 20, k2) == 0);
    CHECK(memcmp(keep, k2, (size_t)L * HKV * 20 * sizeof *keep) == 0);
    CHECK(compressor_select(&c, &kn, kv, table, n, NULL, 0, NULL, 0, 0, k2) == DP_EINVAL);
    CHECK(compressor_select(&c, &kn, kv, table, n, NULL, 0, NULL, 0, n + 1, k2) == DP_EINVAL);

    /* Decode queries summed one at a time, as the engine scores them at
     * their steps (slots 20, 33..36: the sums grow their rows twice), give
     * the attention mass of all of them, and the scored selection is
     * SnapKV's over those sums. */
    dp_attn_acc acc;
    attn_acc_init(&acc);
    CHECK(compressor_select_scored(&c, &sk, &acc, n, 20, keep) == DP_EINVAL); /* nothing summed */
    float qone[L][HQ * HD];
    for (int32_t i = 0; i < NQ; i++) {
        for (int32_t l = 0; l < L; l++)
            memcpy(qone[l], q[l][i], sizeof qone[l]);
        CHECK(compressor_accumulate(&c, &acc, kv, table, &qone[0][0], HQ * HD, q_slot[i]) == 0);
    }
    CHECK_EQ_INT(acc.n_q, NQ);
    CHECK_EQ_INT(acc.n_slots, n);
    CHECK(acc.cap >= n);
    for (int32_t l = 0; l < L; l++)
        for (int32_t h = 0; h < HKV; h++)
            for (int32_t s = 0; s < n; s++)
                CHECK_NEAR(acc.sum[((size_t)l * HKV + h) * (size_t)acc.cap + (size_t)s],
                           attn[l][h][s], 1e-4);
    for (int32_t n_keep = 1; n_keep <= n; n_keep++) {
        CHECK(compressor_select_scored(&c, &sk, &acc, n, n_keep, keep) == 0);
        for (int32_t r = 0; r < L * HKV; r++) {
            const float *bs = acc.sum + (size_t)r * (size_t)acc.cap;
            float sc_row[37];
            for (int32_t s = 0; s < n; s++) {
                float v = bs[s];
                for (int32_t d = -DP_SNAPKV_POOL; d <= DP_SNAPKV_POOL; d++)
                    if (s + d >= 0 && s + d < n && bs[s + d] > v)
                        v = bs[s + d];
                sc_row[s] = v;
            }
            ref_select(sc_row, n, S, W, n_keep, ref);
            CHECK_MSG(memcmp(keep + (size_t)r * n_keep, ref, (size_t)n_keep * sizeof *keep) == 0,
                      "scored snapkv: row %d n_keep %d differs from the reference", r, n_keep);
        }
    }
    /* Slots the sums do not cover (the cache grew after the last query)
     * score nothing: the window keeps them. */
    acc.n_slots = 30;
    CHECK(compressor_select_scored(&c, &sk, &acc, n, 20, keep) == 0);
    for (int32_t r = 0; r < L * HKV; r++) {
        const float *bs = acc.sum + (size_t)r * (size_t)acc.cap;
        float sc_row[37];
        for (int32_t s = 0; s < n; s++) {
            float v = s < 30 ? bs[s] : 0.0f;
            for (int32_t d = -DP_SNAPKV_POOL; d <= DP_SNAPKV_POOL; d++)
                if (s + d >= 0 && s + d < n && (s + d < 30 ? bs[s + d] : 0.0f) > v)
                    v = s + d < 30 ? bs[s + d] : 0.0f;
            sc_row[s] = v;
        }
        ref_select(sc_row, n, S, W, 20, ref);
        CHECK(memcmp(keep + (size_t)r * 20, ref, 20 * sizeof *keep) == 0);
    }
    attn_acc_reset(&acc);
    CHECK_EQ_INT(acc.n_q, 0);
    CHECK(compressor_select_scored(&c, &sk, &acc, n, 20, keep) == DP_EINVAL);
    attn_acc_destroy(&acc);
    compressor_destroy(&c);
    be->ops->kv_destroy(be, kv);
    printf("selection (%s store): knorm, knorm_high, snapkv, recent match the references for "
           "every n_keep; random is seeded; decode queries summed one by one match SnapKV's mass\n",
           dp_kv_type_name(type));
}

static const float POISON = -777.25f;

static void poison(dp_kv_store *kv)
{
    size_t n = (size_t)kv->l.n_layers * kv->l.n_blocks * kv->l.n_kv_heads * kv->l.block_tokens * kv->l.head_dim;
    for (size_t i = 0; i < n; i++)
        ((float *)kv->k)[i] = ((float *)kv->v)[i] = POISON;
}

static void check_compact(dp_backend *be)
{
    /* Two sequences compacted at once into one destination store with
     * smaller blocks and scrambled tables; every other row stays poisoned. */
    const int32_t n[2] = {37, 21}, NBS = 16, DBT = 2, NBD = 40;
    dp_kv_layout ls = {L, HKV, HD, BTK, NBS, DP_KV_F32, 0}, ld = {L, HKV, HD, DBT, NBD, DP_KV_F32, 0};
    dp_kv_store *src, *dst;
    CHECK(be->ops->kv_create(be, &ls, &src) == 0);
    CHECK(be->ops->kv_create(be, &ld, &dst) == 0);
    int32_t sperm[16], dperm[40];
    shuffle(sperm, NBS);
    shuffle(dperm, NBD);
    const int32_t *stab[2] = {sperm, sperm + 10}; /* 10 and 6 source blocks */
    const int32_t *dtab[2] = {dperm, dperm + 20}; /* 20 and 15 destination blocks */
    const int32_t n_dst_blocks[2] = {20, 15};
    fill_random(src, stab[0], n[0]);
    fill_random(src, stab[1], n[1]);
    poison(dst);
    dp_compressor c;
    CHECK(compressor_init(&c, be, L, HKV, HQ, HD) == 0);
    int32_t keep0[L * HKV * 37], keep1[L * HKV * 21];
    int32_t *keep[2] = {keep0, keep1}, nk[2] = {17, 9};
    dp_compress_opts o = {DP_SCORER_KNORM, 0.5f, 2, 3, 0, 0};
    dp_compact_seq cs[2];
    for (int i = 0; i < 2; i++) {
        CHECK(compressor_select(&c, &o, src, stab[i], n[i], NULL, 0, NULL, 0, nk[i], keep[i]) == 0);
        cs[i] = (dp_compact_seq){stab[i], (n[i] + BTK - 1) / BTK, dtab[i], n_dst_blocks[i], nk[i], keep[i]};
    }
    CHECK(memcmp(keep0, keep0 + nk[0], (size_t)nk[0] * sizeof(int32_t)) != 0); /* heads differ */
    /* A bad index is refused before anything is written. */
    keep1[5] = 6 * BTK;
    CHECK(be->ops->kv_compact(be, src, dst, cs, 2) == DP_EINVAL);
    for (size_t i = 0; i < (size_t)L * NBD * HKV * DBT * HD; i++)
        CHECK(((float *)dst->k)[i] == POISON && ((float *)dst->v)[i] == POISON);
    CHECK(compressor_select(&c, &o, src, stab[1], n[1], NULL, 0, NULL, 0, nk[1], keep[1]) == 0);
    CHECK(be->ops->kv_compact(be, src, dst, cs, 2) == 0);
    /* Mark what was expected to be written, check it, then check the rest. */
    char *written = calloc((size_t)L * NBD * HKV * DBT, 1);
    for (int i = 0; i < 2; i++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t h = 0; h < HKV; h++)
                for (int32_t s = 0; s < nk[i]; s++) {
                    int32_t from = keep[i][((size_t)l * HKV + h) * nk[i] + s];
                    int32_t db = dtab[i][s / DBT];
                    float sk[HD], dk[HD];
                    kv_kget(src, l, stab[i][from / BTK], h, from % BTK, sk);
                    kv_kget(dst, l, db, h, s % DBT, dk);
                    const float *sv = vrow_f32(src, l, stab[i][from / BTK], h, from % BTK);
                    CHECK(memcmp(dk, sk, HD * sizeof(float)) == 0);
                    CHECK(memcmp(vrow_f32(dst, l, db, h, s % DBT), sv, HD * sizeof(float)) == 0);
                    written[(((size_t)l * NBD + db) * HKV + h) * DBT + s % DBT] = 1;
                }
    for (size_t r = 0; r < (size_t)L * NBD * HKV * DBT; r++)
        if (!written[r])
            for (int32_t d = 0; d < HD; d++)
                /* K is transposed inside a block ([head_dim][token]). */
                CHECK(((float *)dst->k)[(r / DBT) * DBT * HD + (size_t)d * DBT + r % DBT] == POISON &&
                      ((float *)dst->v)[r * HD + d] == POISON);
    free(written);
    compressor_destroy(&c);
    be->ops->kv_destroy(be, src);
    be->ops->kv_destroy(be, dst);
    printf("compact: 2 sequences, every kept row in its head's slot, nothing else written\n");
}

/* On a tiny synthetic model: prefill, then teacher-force a continuation on the
 * uncompressed cache and on a keep-all compaction into another store with a
 * scrambled table: the logits must be bit-identical. A real compression must
 * change them (the check is not vacuous). */
static void check_keep_all_logits(void)
{
    dp_synth_shape sh;
    CHECK(synth_shape_preset("tiny", &sh) == 0);
    gguf_writer w;
    char err[DP_ERRLEN];
    CHECK(gguf_writer_init(&w) == 0);
    CHECK_MSG(synth_llama_build(&w, &sh, 5, DP_TYPE_F32, err, sizeof err) == 0, "%s", err);
    void *buf;
    size_t size;
    CHECK(gguf_writer_finish_mem(&w, &buf, &size) == 0);
    dp_gguf g;
    CHECK_MSG(gguf_open_mem(&g, buf, size, err, sizeof err) == 0, "%s", err);
    dp_backend *be;
    dp_llama *m;
    CHECK(backend_create(&be, "cpu", 2, err, sizeof err) == 0);
    CHECK_MSG(llama_init(&m, &g, be, 64, 16, err, sizeof err) == 0, "%s", err);
    const dp_hparams *hp = llama_hparams(m);
    enum { P = 45, C = 16, NB = 8 }; /* 8-token blocks: P + C fits in 8 */
    dp_kv_layout la = llama_kv_layout(m, 8, NB), lb = llama_kv_layout(m, 8, 2 * NB);
    dp_kv_store *stores[DP_KV_MAX_STORES] = {NULL};
    CHECK(be->ops->kv_create(be, &la, &stores[0]) == 0);
    CHECK(be->ops->kv_create(be, &lb, &stores[1]) == 0);
    int32_t ta[NB], tb[2 * NB], tok[P + C], pos[64], seq[64], slot[64], outs[64], caps[8];
    for (int32_t i = 0; i < NB; i++)
        ta[i] = i;
    shuffle(tb, 2 * NB);
    for (int32_t i = 0; i < P + C; i++)
        tok[i] = (int32_t)urand((uint32_t)hp->vocab);
    /* Prefill P tokens (capturing the last 8 queries). */
    for (int32_t i = 0; i < P; i++) {
        pos[i] = slot[i] = i;
        seq[i] = 0;
    }
    for (int32_t i = 0; i < 8; i++)
        caps[i] = P - 8 + i;
    uint8_t s0 = 0, s1 = 1;
    float *ref = malloc((size_t)C * hp->vocab * sizeof(float)), *got = malloc((size_t)C * hp->vocab * sizeof(float));
    dp_batch b = {.n_tokens = P, .tokens = tok, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 1,
                  .seq_store = &s0, .block_tables = ta, .max_blocks = NB, .n_out = 0, .out_tokens = outs,
                  .n_capture = 8, .capture_tokens = caps};
    CHECK(llama_forward(m, &b, stores, ref) == 0);
    const int32_t qd = hp->n_heads * hp->head_dim;
    float *q = be->ops->alloc(be, (size_t)hp->n_layers * 8 * qd * sizeof(float));
    CHECK(be->ops->download(be, q, llama_captured_queries(m), (size_t)hp->n_layers * 8 * qd * sizeof(float)) == 0);
    int32_t q_slot[8];
    for (int32_t i = 0; i < 8; i++)
        q_slot[i] = P - 8 + i;
    /* Reference: continue in store A at slots P.. */
    for (int32_t i = 0; i < C; i++) {
        pos[i] = slot[i] = P + i;
        outs[i] = i;
    }
    b = (dp_batch){.n_tokens = C, .tokens = tok + P, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 1,
                   .seq_store = &s0, .block_tables = ta, .max_blocks = NB, .n_out = C, .out_tokens = outs};
    CHECK(llama_forward(m, &b, stores, ref) == 0);
    dp_compressor c;
    CHECK(compressor_init(&c, be, hp->n_layers, hp->n_kv_heads, hp->n_heads, hp->head_dim) == 0);
    int32_t *keep = malloc((size_t)hp->n_layers * hp->n_kv_heads * P * sizeof(int32_t));
    for (int sc = 0; sc <= DP_SCORER_RANDOM; sc++)
        for (int half = 0; half < 2; half++) {
            dp_compress_opts o = {(dp_scorer)sc, half ? 0.5f : 1.0f, 4, 8, 1, 0};
            int32_t nk = compress_n_keep(&o, P);
            CHECK(compressor_select(&c, &o, stores[0], ta, P, q, (int64_t)8 * qd, q_slot, 8, nk, keep) == 0);
            dp_compact_seq cs = {ta, (P + 7) / 8, tb, 2 * NB, nk, keep};
            CHECK(be->ops->kv_compact(be, stores[0], stores[1], &cs, 1) == 0);
            for (int32_t i = 0; i < C; i++)
                slot[i] = nk + i; /* pos stays P + i */
            b.seq_store = &s1;
            b.block_tables = tb;
            b.max_blocks = 2 * NB;
            CHECK(llama_forward(m, &b, stores, got) == 0);
            int same = memcmp(got, ref, (size_t)C * hp->vocab * sizeof(float)) == 0;
            CHECK_MSG(same == !half, "%s keep %.1f: logits %s the uncompressed cache's",
                      scorer_name((dp_scorer)sc), (double)o.keep_ratio, same ? "equal" : "differ from");
        }
    printf("keep-all: teacher-forced logits bit-identical to the uncompressed cache (every scorer); "
           "keep 0.5 changes them\n");
    free(keep);
    compressor_destroy(&c);
    be->ops->free(be, q);
    free(ref);
    free(got);
    be->ops->kv_destroy(be, stores[0]);
    be->ops->kv_destroy(be, stores[1]);
    llama_destroy(m);
    backend_destroy(be);
    gguf_close(&g);
    free(buf);
    gguf_writer_destroy(&w);
}

/* dp-eval's simulated KIVI (tools/kv_sim.h) on an f32 store: kv_sim_fill
 * rounds whole groups only (40 slots with groups of 32: slots 0..31), each
 * key channel of a group and each 32-channel piece of a value row to at
 * most 2^bits levels, within half a step of where it was, and leaves the
 * residual (slots 32..39) and other sequences' blocks exact. */
static void check_kv_sim(dp_backend *be)
{
    enum { SL = 2, SH = 2, SD = 64, SBT = 16, SNB = 6, N = 40, G = 32, BITS = 4 };
    dp_kv_layout lay = {SL, SH, SD, SBT, SNB, DP_KV_F32, 0};
    dp_kv_store *kv;
    CHECK(be->ops->kv_create(be, &lay, &kv) == 0);
    const int32_t table[3] = {4, 1, 3}; /* out of order; blocks 0, 2, 5 are another's */
    const int32_t other[3] = {0, 2, 5};
    static float k0[SL][SH][SNB * SBT][SD], v0[SL][SH][SNB * SBT][SD];
    for (int32_t l = 0; l < SL; l++)
        for (int32_t h = 0; h < SH; h++)
            for (int32_t s = 0; s < SNB * SBT; s++) {
                for (int32_t d = 0; d < SD; d++) {
                    k0[l][h][s][d] = frand() * (d == 7 ? 20.0f : 1.0f); /* an outlier channel */
                    v0[l][h][s][d] = frand();
                }
                const int32_t blk = s < 3 * SBT ? table[s / SBT] : other[(s - 3 * SBT) / SBT];
                kv_kput(kv, l, blk, h, s % SBT, k0[l][h][s]);
                kv_vput(kv, l, blk, h, s % SBT, v0[l][h][s]);
            }
    kv_sim sim;
    int32_t done = 0;
    CHECK(kv_sim_parse("sim-kivi4") == KV_SIM_KIVI(4, 4) && kv_sim_parse("sim-kivi4v8") == KV_SIM_KIVI(4, 8));
    CHECK(kv_sim_parse("sim-kivi9") < 0 && kv_sim_parse("kivi4") < 0 && kv_sim_parse("q4_0") < 0);
    CHECK(!strcmp(kv_sim_name(KV_SIM_KIVI(4, 8)), "sim-kivi4v8"));
    CHECK(kv_sim_init(&sim, be, kv, KV_SIM_KIVI(BITS, BITS), G) == 0);
    CHECK(kv_sim_fill(&sim, table, N, &done) == 0);
    CHECK_EQ_INT(done, G);
    CHECK(kv_sim_fill(&sim, table, N, &done) == 0); /* nothing new is whole */
    CHECK_EQ_INT(done, G);
    for (int32_t l = 0; l < SL; l++)
        for (int32_t h = 0; h < SH; h++) {
            for (int32_t d = 0; d < SD; d++) {
                float lo = k0[l][h][0][d], hi = lo, levels[G];
                int n_levels = 0;
                for (int32_t s = 0; s < G; s++) {
                    lo = k0[l][h][s][d] < lo ? k0[l][h][s][d] : lo;
                    hi = k0[l][h][s][d] > hi ? k0[l][h][s][d] : hi;
                }
                for (int32_t s = 0; s < G; s++) {
                    float row[SD];
                    kv_kget(kv, l, table[s / SBT], h, s % SBT, row);
                    const double step = (hi - lo) / ((1 << BITS) - 1) * 1.002;
                    CHECK(fabs((double)row[d] - k0[l][h][s][d]) <= step / 2 + 1e-3 * fabs((double)lo));
                    int seen = 0;
                    for (int i = 0; i < n_levels; i++)
                        seen |= levels[i] == row[d];
                    if (!seen)
                        levels[n_levels++] = row[d];
                }
                CHECK(n_levels <= 1 << BITS);
            }
            for (int32_t s = 0; s < N; s++) {
                float row[SD];
                kv_kget(kv, l, table[s / SBT], h, s % SBT, row);
                int differ = 0;
                for (int32_t d = 0; d < SD; d++)
                    differ += row[d] != k0[l][h][s][d];
                if (s >= G)
                    CHECK_MSG(differ == 0, "residual slot %d changed", s);
                kv_vget(kv, l, table[s / SBT], h, s % SBT, row);
                for (int32_t d = 0; d < SD; d++)
                    if (s >= G)
                        CHECK(row[d] == v0[l][h][s][d]);
                    else
                        CHECK(fabs((double)row[d] - v0[l][h][s][d]) <= 2.0 / 15 / 2 * 1.01 + 1e-3);
            }
            for (int32_t s = 3 * SBT; s < SNB * SBT; s++) {
                float row[SD];
                kv_kget(kv, l, other[(s - 3 * SBT) / SBT], h, s % SBT, row);
                CHECK(memcmp(row, k0[l][h][s], sizeof row) == 0);
            }
        }
    kv_sim_destroy(&sim);
    be->ops->kv_destroy(be, kv);
    printf("kv_sim: kivi4 rounds the whole group of 32 of 40 slots (keys per channel, values per "
           "32 channels), leaves the residual and other blocks exact\n");
}

int main(void)
{
    check_n_keep();
    char err[DP_ERRLEN];
    dp_backend *be;
    CHECK(backend_create(&be, "cpu", 2, err, sizeof err) == 0);
    check_selection(be, DP_KV_F32);
    check_selection(be, DP_KV_F16);
    check_compact(be);
    check_kv_sim(be);
    backend_destroy(be);
    check_keep_all_logits();
    T_DONE("compress");
}
