/* test_forward.c: the forward pass over paged KV is independent of how work is
 * batched: sequences batched together, prompts chunked across steps, small or
 * large blocks, and fragmented block tables all give what a single sequence
 * alone gives. Runs on synthetic models, and on the default model when present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dp.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "tools/generate.h"
#include "t.h"
#include "tools/synth_gguf.h"

#define NSEQ 8
#define NEW 12

static uint64_t rs = 99;
static uint32_t urand(uint32_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

typedef struct run_result {
    int32_t out[NSEQ][NEW];
    float *logits[NSEQ];
} run_result;

/* The matmul path of the runs (see check_model). */
static bool exact_matmul;

static void run(const dp_gguf *g, int threads, int32_t max_tokens, int32_t block_tokens,
                int32_t *const prompts[NSEQ], const int32_t lens[NSEQ], int first, int count,
                int fragment, run_result *r)
{
    char err[DP_ERRLEN];
    dp_backend *be;
    dp_llama *m;
    dp_gen gen;
    CHECK(backend_create(&be, "cpu", threads, err, sizeof err) == 0);
    if (be->ops->set_exact)
        be->ops->set_exact(be, exact_matmul);
    CHECK_MSG(llama_init(&m, g, be, max_tokens, max_tokens < 16 ? max_tokens : 16, err, sizeof err) == 0,
              "%s", err);
    int32_t vocab = llama_hparams(m)->vocab;
    CHECK(gen_init(&gen, m, block_tokens, 4096 / block_tokens + 64, err, sizeof err) == 0);
    /* Fragment the free list: take every block, free them in a shuffled
     * order, so tables get scattered, non-monotonic block ids. */
    if (fragment) {
        int32_t n = gen.pool.n_blocks, *bl = malloc((size_t)n * sizeof *bl);
        for (int32_t i = 0; i < n; i++)
            CHECK(kv_pool_alloc(&gen.pool, &bl[i]) == 0);
        for (int32_t i = n - 1; i > 0; i--) {
            int32_t j = (int32_t)urand((uint32_t)i + 1), t = bl[i];
            bl[i] = bl[j];
            bl[j] = t;
        }
        for (int32_t i = 0; i < n; i++)
            kv_pool_unref(&gen.pool, bl[i]);
        free(bl);
    }
    dp_gen_seq sq[NSEQ];
    memset(sq, 0, sizeof sq);
    for (int i = 0; i < count; i++) {
        int s = first + i;
        sq[i].prompt = prompts[s];
        sq[i].n_prompt = lens[s];
        sq[i].max_new = NEW;
        sq[i].out = r->out[s];
        sq[i].sampling.temperature = 0;
        r->logits[s] = malloc((size_t)vocab * sizeof(float));
        sq[i].prompt_logits = r->logits[s];
    }
    CHECK_MSG(gen_run(&gen, sq, count, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < count; i++)
        CHECK_EQ_INT(sq[i].n_out, NEW);
    CHECK_EQ_INT(kv_pool_n_free(&gen.pool), gen.pool.n_blocks); /* all blocks returned */
    gen_destroy(&gen);
    llama_destroy(m);
    backend_destroy(be);
}

static double rel_l2(const float *a, const float *b, int32_t n)
{
    double num = 0, den = 0;
    for (int32_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

static void free_result(run_result *r)
{
    for (int i = 0; i < NSEQ; i++)
        free(r->logits[i]);
}

/* Compares every configuration with each sequence run alone, unchunked,
 * first on the exact f32 matmul, then on the default one (activations as
 * int8 per 32 values). A different block size changes the order in which
 * attention sums its keys (last-bit differences); int8 rounding can turn
 * those into visible ones, so the default path is held to identity only
 * where the geometry is the alone run's: batching, thread count, chunking
 * and block placement must not change a single bit. */
static void check_model_mode(const dp_gguf *g, const char *what, int32_t vocab, int32_t maxlen,
                             bool exact, bool int8);

/* int8: every matmul's weights have an integer kernel (Q4_x, Q8_0), so the
 * default path is the same arithmetic for any batch (f32 and f16 weights
 * take sgemm above 16 rows: last-bit differences, bounded like the exact
 * path's). */
static void check_model(const dp_gguf *g, const char *what, int32_t vocab, int32_t maxlen, bool int8)
{
    /* The portable level has no integer kernels: its default is exact. */
    char err[DP_ERRLEN];
    dp_backend *be;
    CHECK(backend_create(&be, "cpu", 1, err, sizeof err) == 0);
    int8 = int8 && strcmp(be->ops->kernel_level(be), "baseline") != 0;
    backend_destroy(be);
    uint64_t seed = rs;
    check_model_mode(g, what, vocab, maxlen, true, false);
    rs = seed; /* the same prompts */
    check_model_mode(g, what, vocab, maxlen, false, int8);
}

static void check_model_mode(const dp_gguf *g, const char *what, int32_t vocab, int32_t maxlen,
                             bool exact, bool int8)
{
    exact_matmul = exact;
    int32_t *prompts[NSEQ], lens[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        lens[s] = 1 + (int32_t)urand((uint32_t)maxlen);
        prompts[s] = malloc((size_t)lens[s] * sizeof(int32_t));
        for (int32_t i = 0; i < lens[s]; i++)
            prompts[s][i] = (int32_t)urand((uint32_t)vocab);
    }
    lens[0] = 1; /* a one-token prompt */
    run_result alone = {0};
    for (int s = 0; s < NSEQ; s++)
        run(g, 1, 256, 16, prompts, lens, s, 1, 0, &alone);
    struct {
        int threads, max_tokens, block_tokens, fragment;
        const char *name;
    } cfgs[] = {
        {2, 256, 16, 0, "batched"},
        {2, 256, 4, 1, "batched, 4-token blocks, fragmented"},
        {2, 7, 16, 0, "batched, chunked prefill (7-token steps)"},
        {1, 33, 1, 1, "batched, 1-token blocks, 33-token steps, 1 thread"},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        if (!exact && cfgs[c].block_tokens != 16)
            continue;
        run_result r = {0};
        run(g, cfgs[c].threads, cfgs[c].max_tokens, cfgs[c].block_tokens, prompts, lens, 0, NSEQ,
            cfgs[c].fragment, &r);
        double worst = 0;
        for (int s = 0; s < NSEQ; s++) {
            CHECK_MSG(memcmp(r.out[s], alone.out[s], sizeof r.out[s]) == 0,
                      "%s: %s: sequence %d (%d prompt tokens) differs from its run alone", what,
                      cfgs[c].name, s, lens[s]);
            double e = rel_l2(r.logits[s], alone.logits[s], vocab);
            CHECK_MSG(int8 ? e == 0 : e < 1e-4, "%s: %s: sequence %d logits rel err %g", what,
                      cfgs[c].name, s, e);
            if (e > worst)
                worst = e;
        }
        printf("%s (%s matmul): %s: %d sequences identical to alone (%d tokens each), logits rel err <= %.2g\n",
               what, exact ? "exact" : "int8", cfgs[c].name, NSEQ, NEW, worst);
        free_result(&r);
    }
    free_result(&alone);
    for (int s = 0; s < NSEQ; s++)
        free(prompts[s]);
}

static void check_errors(void)
{
    /* A model missing a tensor, and one with a wrong shape, fail with a message. */
    dp_synth_shape sh;
    CHECK(synth_shape_preset("tiny", &sh) == 0);
    char err[DP_ERRLEN];
    dp_backend *be;
    CHECK(backend_create(&be, "cpu", 1, err, sizeof err) == 0);
    for (int variant = 0; variant < 2; variant++) {
        dp_synth_shape s2 = sh;
        gguf_writer w;
        CHECK(gguf_writer_init(&w) == 0);
        CHECK(synth_llama_build(&w, &s2, 1, DP_TYPE_F32, err, sizeof err) == 0);
        void *buf;
        size_t size;
        CHECK(gguf_writer_finish_mem(&w, &buf, &size) == 0);
        dp_gguf g;
        CHECK(gguf_open_mem(&g, buf, size, err, sizeof err) == 0);
        /* Corrupt metadata the loader must cross-check against the tensors. */
        dp_gguf_tensor *t = (dp_gguf_tensor *)gguf_find_tensor(&g, variant ? "blk.1.ffn_up.weight" : "blk.0.attn_k.weight");
        CHECK(t != NULL);
        if (variant)
            t->ne[1] = 3;                 /* wrong shape */
        else
        {
            t->name.ptr = "renamed.weight"; /* disappears from lookups */
            t->name.len = strlen(t->name.ptr);
        }
        dp_llama *m;
        int rc = llama_init(&m, &g, be, 16, 4, err, sizeof err);
        CHECK(rc != 0);
        CHECK(strchr(err, '\n') == NULL);
        printf("errors: %s\n", err);
        CHECK(strstr(err, variant ? "blk.1.ffn_up.weight" : "blk.0.attn_k.weight") != NULL);
        gguf_close(&g);
        free(buf);
        gguf_writer_destroy(&w);
    }
    backend_destroy(be);
}

/* An architecture the forward pass does not describe is refused by name,
 * and each one it does describe loads its own tensors: a qwen2 file without
 * its Q/K/V biases, a qwen3 one without its per-head norms, a phi3 one
 * without its fused gate/up or a gemma3 one without a post-FFN norm is
 * refused naming the missing tensor (never run as if it were llama); a
 * gemma3 file without its window is refused naming the key. */
static void check_arches(void)
{
    char err[DP_ERRLEN];
    gguf_writer w;
    void *buf;
    size_t size;
    dp_gguf g;
    dp_hparams hp;
    CHECK(gguf_writer_init(&w) == 0);
    gguf_writer_add_str(&w, "general.architecture", "gemma2");
    CHECK(gguf_writer_finish_mem(&w, &buf, &size) == 0);
    CHECK_MSG(gguf_open_mem(&g, buf, size, err, sizeof err) == 0, "%s", err);
    CHECK(hparams_load(&hp, &g, err, sizeof err) == DP_EUNSUPPORTED);
    printf("arches: %s\n", err);
    CHECK(strstr(err, "'gemma2'") && strstr(err, "llama, qwen2, qwen3, phi3, gemma3"));
    gguf_close(&g);
    free(buf);
    gguf_writer_destroy(&w);

    dp_backend *be;
    CHECK(backend_create(&be, "cpu", 1, err, sizeof err) == 0);
    static const struct {
        const char *arch, *drop;
    } cases[] = {{"qwen2", "blk.1.attn_k.bias"}, {"qwen3", "blk.0.attn_q_norm.weight"},
                 {"phi3", "blk.0.ffn_up.weight"}, {"gemma3", "blk.1.post_ffw_norm.weight"},
                 {"llama", "rope_freqs.weight"}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        dp_synth_shape sh;
        CHECK(synth_shape_preset("tiny", &sh) == 0);
        sh.arch = cases[ci].arch;
        sh.rope_freqs = !strcmp(cases[ci].arch, "llama");
        sh.sliding_window = !strcmp(cases[ci].arch, "gemma3") ? 4 : 0;
        CHECK(gguf_writer_init(&w) == 0);
        CHECK_MSG(synth_llama_build(&w, &sh, 3, DP_TYPE_F32, err, sizeof err) == 0, "%s", err);
        CHECK(gguf_writer_finish_mem(&w, &buf, &size) == 0);
        CHECK_MSG(gguf_open_mem(&g, buf, size, err, sizeof err) == 0, "%s", err);
        dp_llama *m;
        /* Whole, it loads. */
        CHECK_MSG(llama_init(&m, &g, be, 16, 4, err, sizeof err) == 0, "%s: %s", cases[ci].arch, err);
        CHECK(!strcmp(llama_hparams(m)->arch, cases[ci].arch));
        /* gemma3: five window layers of each six, the sixth global. */
        CHECK(hparams_layer_window(llama_hparams(m), 0) == (int32_t)sh.sliding_window);
        CHECK(hparams_layer_window(llama_hparams(m), 5) == 0);
        llama_destroy(m);
        dp_gguf_tensor *t = (dp_gguf_tensor *)gguf_find_tensor(&g, cases[ci].drop);
        CHECK(t != NULL);
        if (strcmp(cases[ci].arch, "llama")) {
            /* Without the tensor its description needs, it is refused. */
            t->name.ptr = "renamed.weight";
            t->name.len = strlen(t->name.ptr);
            CHECK(llama_init(&m, &g, be, 16, 4, err, sizeof err) != 0);
            CHECK_MSG(strstr(err, cases[ci].drop) != NULL, "%s", err);
        } else {
            /* Llama 3's factors must be one per rotated pair. */
            t->ne[0] = 3;
            CHECK(llama_init(&m, &g, be, 16, 4, err, sizeof err) == DP_EFORMAT);
            CHECK_MSG(strstr(err, "rope_freqs.weight") != NULL, "%s", err);
        }
        printf("arches: %s\n", err);
        gguf_close(&g);
        free(buf);
        gguf_writer_destroy(&w);
    }
    /* A tensor the architecture does not use (a llama file with an output
     * bias) is refused by name, as llama.cpp refuses it. */
    {
        dp_synth_shape sh;
        CHECK(synth_shape_preset("tiny", &sh) == 0);
        CHECK(gguf_writer_init(&w) == 0);
        CHECK_MSG(synth_llama_build(&w, &sh, 3, DP_TYPE_F32, err, sizeof err) == 0, "%s", err);
        const uint64_t ne[1] = {sh.dim};
        CHECK(gguf_writer_add_tensor(&w, "blk.1.attn_output.bias", DP_TYPE_F32, 1, ne, NULL) == 0);
        CHECK(gguf_writer_finish_mem(&w, &buf, &size) == 0);
        CHECK_MSG(gguf_open_mem(&g, buf, size, err, sizeof err) == 0, "%s", err);
        dp_llama *m;
        CHECK(llama_init(&m, &g, be, 16, 4, err, sizeof err) == DP_EUNSUPPORTED);
        CHECK_MSG(strstr(err, "blk.1.attn_output.bias") != NULL, "%s", err);
        printf("arches: %s\n", err);
        gguf_close(&g);
        free(buf);
        gguf_writer_destroy(&w);
    }
    /* YaRN: factor 4 over 4096 at base 1e6 and 64 rotated dims: the ramp
     * over pairs 6 to 16 (llama.cpp's correction dims), cos and sin times
     * 1 + 0.1 ln 4. */
    {
        dp_synth_shape sh;
        CHECK(synth_shape_preset("tiny-qwen2", &sh) == 0);
        sh.dim = 256;
        sh.ctx = 16384;
        sh.yarn_orig = 4096;
        CHECK(gguf_writer_init(&w) == 0);
        CHECK_MSG(synth_llama_build(&w, &sh, 3, DP_TYPE_F32, err, sizeof err) == 0, "%s", err);
        CHECK(gguf_writer_finish_mem(&w, &buf, &size) == 0);
        CHECK_MSG(gguf_open_mem(&g, buf, size, err, sizeof err) == 0, "%s", err);
        CHECK_MSG(hparams_load(&hp, &g, err, sizeof err) == 0, "%s", err);
        CHECK(hp.yarn_ext == 1.0f && hp.yarn_lo == 6.0f && hp.yarn_hi == 16.0f);
        CHECK(fabsf(hp.rope_mscale - (1.0f + 0.1f * logf(4.0f))) < 1e-6f);
        CHECK(fabsf(hp.rope_freq_scale - 0.25f) < 1e-7f);
        gguf_close(&g);
        free(buf);
        gguf_writer_destroy(&w);
    }
    /* LongRoPE: both sets load; without the short one, refused naming it. */
    {
        dp_synth_shape sh;
        CHECK(synth_shape_preset("tiny-phi3", &sh) == 0);
        sh.longrope_orig = 16;
        CHECK(gguf_writer_init(&w) == 0);
        CHECK_MSG(synth_llama_build(&w, &sh, 3, DP_TYPE_F32, err, sizeof err) == 0, "%s", err);
        CHECK(gguf_writer_finish_mem(&w, &buf, &size) == 0);
        CHECK_MSG(gguf_open_mem(&g, buf, size, err, sizeof err) == 0, "%s", err);
        CHECK(hparams_load(&hp, &g, err, sizeof err) == 0 && hp.longrope && hp.n_ctx_orig == 16);
        CHECK(hp.rope_mscale > 1.0f && hp.rope_mscale < 2.0f);
        dp_gguf_tensor *t = (dp_gguf_tensor *)gguf_find_tensor(&g, "rope_factors_short.weight");
        CHECK(t != NULL);
        t->name.ptr = "renamed.weight";
        t->name.len = strlen(t->name.ptr);
        CHECK(hparams_load(&hp, &g, err, sizeof err) == DP_EFORMAT);
        CHECK_MSG(strstr(err, "rope_factors_short.weight") != NULL, "%s", err);
        printf("arches: %s\n", err);
        gguf_close(&g);
        free(buf);
        gguf_writer_destroy(&w);
    }
    /* gemma3 without attention.sliding_window. */
    {
        dp_synth_shape sh;
        CHECK(synth_shape_preset("tiny-gemma3", &sh) == 0);
        CHECK(gguf_writer_init(&w) == 0);
        CHECK_MSG(synth_llama_build(&w, &sh, 3, DP_TYPE_F32, err, sizeof err) == 0, "%s", err);
        CHECK(gguf_writer_finish_mem(&w, &buf, &size) == 0);
        CHECK_MSG(gguf_open_mem(&g, buf, size, err, sizeof err) == 0, "%s", err);
        CHECK(hparams_load(&hp, &g, err, sizeof err) == 0 && hp.swa_window == 8);
        dp_gguf_kv *kv = (dp_gguf_kv *)gguf_find_kv(&g, "gemma3.attention.sliding_window");
        CHECK(kv != NULL);
        kv->key.ptr = "gemma3.attention.renamed";
        kv->key.len = strlen(kv->key.ptr);
        CHECK(hparams_load(&hp, &g, err, sizeof err) == DP_EFORMAT);
        CHECK_MSG(strstr(err, "gemma3.attention.sliding_window") != NULL, "%s", err);
        printf("arches: %s\n", err);
        gguf_close(&g);
        free(buf);
        gguf_writer_destroy(&w);
    }
    backend_destroy(be);
}

static void check_bad_batch(const dp_gguf *g)
{
    char err[DP_ERRLEN];
    dp_backend *be;
    dp_llama *m;
    dp_kv_store *kv;
    CHECK(backend_create(&be, "cpu", 1, err, sizeof err) == 0);
    CHECK(llama_init(&m, g, be, 8, 2, err, sizeof err) == 0);
    dp_kv_layout l = llama_kv_layout(m, 4, 4);
    CHECK(be->ops->kv_create(be, &l, &kv) == 0);
    dp_kv_store *stores[DP_KV_MAX_STORES] = {kv, NULL};
    int32_t tok[2] = {1, 2}, pos[2] = {0, 1}, seq[2] = {0, 0}, slot[2] = {0, 1}, table[2] = {0, 1};
    int32_t outs[1] = {1};
    uint8_t ss[1] = {0};
    float *logits = malloc((size_t)llama_hparams(m)->vocab * sizeof(float));
    dp_batch b = {.n_tokens = 2, .tokens = tok, .pos = pos, .seq = seq, .slot = slot, .n_seqs = 1,
                  .seq_store = ss, .block_tables = table, .max_blocks = 2, .n_out = 1,
                  .out_tokens = outs};
    CHECK(llama_forward(m, &b, stores, logits) == 0);
    tok[1] = llama_hparams(m)->vocab; /* token out of range */
    CHECK(llama_forward(m, &b, stores, logits) == DP_EINVAL);
    tok[1] = 2;
    table[0] = 4; /* block out of range */
    CHECK(llama_forward(m, &b, stores, logits) == DP_EINVAL);
    table[0] = 0;
    slot[1] = 8; /* past the table */
    CHECK(llama_forward(m, &b, stores, logits) == DP_EINVAL);
    slot[1] = 1;
    ss[0] = 1; /* a store that is not there */
    CHECK(llama_forward(m, &b, stores, logits) == DP_EINVAL);
    ss[0] = 0;
    b.n_tokens = 9; /* over the model's step budget */
    CHECK(llama_forward(m, &b, stores, logits) == DP_EINVAL);
    free(logits);
    be->ops->kv_destroy(be, kv);
    llama_destroy(m);
    backend_destroy(be);
}

int main(void)
{
    dp_synth_shape sh;
    CHECK(synth_shape_preset("tiny", &sh) == 0);
    uint32_t types[] = {DP_TYPE_F32, DP_TYPE_Q4_1, DP_TYPE_Q8_0, DP_TYPE_F16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        for (int tied = 0; tied < 2; tied++) {
            sh.tied = tied;
            gguf_writer w;
            char err[DP_ERRLEN];
            CHECK(gguf_writer_init(&w) == 0);
            CHECK_MSG(synth_llama_build(&w, &sh, 7 + ti, types[ti], err, sizeof err) == 0, "%s", err);
            void *buf;
            size_t size;
            CHECK(gguf_writer_finish_mem(&w, &buf, &size) == 0);
            dp_gguf g;
            CHECK_MSG(gguf_open_mem(&g, buf, size, err, sizeof err) == 0, "%s", err);
            char what[64];
            snprintf(what, sizeof what, "tiny %s%s", quant_type_name(types[ti]), tied ? " tied" : "");
            check_model(&g, what, (int32_t)sh.vocab, 40,
                        types[ti] == DP_TYPE_Q4_1 || types[ti] == DP_TYPE_Q8_0);
            if (ti == 0 && tied == 0)
                check_bad_batch(&g);
            gguf_close(&g);
            free(buf);
            gguf_writer_destroy(&w);
        }
    }
    check_errors();
    check_arches();
    const char *real = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(real, R_OK) == 0 && !getenv("DP_TEST_SYNTHETIC_ONLY")) {
        dp_gguf g;
        char err[DP_ERRLEN];
        CHECK_MSG(gguf_open(&g, real, err, sizeof err) == 0, "%s", err);
        check_model(&g, "SmolLM2-135M", 49152, 48, true);
        gguf_close(&g);
    } else {
        printf("note: %s absent or DP_TEST_SYNTHETIC_ONLY set, real-model batching check skipped\n", real);
    }
    T_DONE("forward");
}
