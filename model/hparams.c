/* hparams.c: the {arch}.* metadata keys of a GGUF of a supported
 * architecture (arch.h), checked for presence and sane ranges before any
 * weight is touched. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/dp.h"
#include "kernels/quant.h"
#include "llama.h"

static int get_u32(const dp_gguf *g, const char *arch, const char *suffix, bool required,
                   uint32_t def, uint32_t *out, char *err, size_t errsz)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_u32(g, key, out);
    if (rc == DP_ENOTFOUND && !required) {
        *out = def;
        return 0;
    }
    if (rc == DP_ENOTFOUND)
        return dp_err(err, errsz, DP_EFORMAT, "model: missing metadata key '%s'", key);
    if (rc)
        return dp_err(err, errsz, DP_EFORMAT, "model: metadata key '%s' is not an unsigned integer",
                      key);
    return 0;
}

static int get_f32(const dp_gguf *g, const char *arch, const char *suffix, bool required, float def,
                   float *out, char *err, size_t errsz)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_f32(g, key, out);
    if (rc == DP_ENOTFOUND && !required) {
        *out = def;
        return 0;
    }
    if (rc == DP_ENOTFOUND)
        return dp_err(err, errsz, DP_EFORMAT, "model: missing metadata key '%s'", key);
    if (rc)
        return dp_err(err, errsz, DP_EFORMAT, "model: metadata key '%s' is not a number", key);
    return 0;
}

/* {arch}.attention.sliding_window: the window of an architecture with
 * sliding-window layers (arch.h swa_period), required there. Other files
 * that name one (Phi-3's, some Mistral conversions) are run with full
 * attention, as llama.cpp runs them: said, not hidden. */
static int sliding_window_load(dp_hparams *hp, const dp_gguf *g, char *err, size_t errsz)
{
    char key[128];
    uint32_t swa = 0;
    snprintf(key, sizeof key, "%s.attention.sliding_window", hp->arch);
    const bool has = gguf_get_u32(g, key, &swa) == 0 && swa > 0;
    if (hp->desc->swa_period > 0) {
        if (!has)
            return dp_err(err, errsz, DP_EFORMAT, "model: missing metadata key '%s'", key);
        if (swa > (uint32_t)hp->n_ctx_train)
            swa = (uint32_t)hp->n_ctx_train; /* a window past the context is no window */
        hp->swa_window = (int32_t)swa;
        return 0;
    }
    if (has)
        dp_log(DP_LOG_WARN, "model: %s = %u is not applied: every layer attends to the whole "
               "context, as llama.cpp runs these models (the same below the window)", key, swa);
    return 0;
}

/* LongRoPE (Phi-3 and Phi-4-mini's 128k models): two sets of per-pair
 * factors, the long ones where the served context passes the original
 * one (llama_set_context), with the attention factor rope_load reads. */
static int longrope_load(dp_hparams *hp, const dp_gguf *g, char *err, size_t errsz)
{
    const dp_gguf_tensor *lf = gguf_find_tensor(g, "rope_factors_long.weight");
    const dp_gguf_tensor *sf = gguf_find_tensor(g, "rope_factors_short.weight");
    if (!lf && !sf)
        return 0;
    const dp_gguf_tensor *ts[2] = {lf, sf};
    for (int i = 0; i < 2; i++)
        if (!ts[i] || ts[i]->type != DP_TYPE_F32 || ts[i]->n_dims != 1 ||
            ts[i]->ne[0] != (uint64_t)hp->n_rot / 2)
            return dp_err(err, errsz, DP_EFORMAT, "model: LongRoPE needs rope_factors_long.weight "
                          "and rope_factors_short.weight, %d F32 factors each", hp->n_rot / 2);
    if (hp->rope_freqs)
        return dp_err(err, errsz, DP_EFORMAT, "model: rope_freqs.weight and LongRoPE factors "
                      "together");
    hp->longrope = true;
    return 0;
}

/* YaRN (rope.scaling.type = yarn; Qwen 2.5 and Qwen 3's long-context
 * settings), as llama.cpp runs it for these architectures: each pair's
 * angle mixes the interpolated one (times 1 / factor) and the original by a
 * ramp over the pairs between the correction dims of beta 32 and 1 at the
 * original context, and cos and sin are scaled by 1 + 0.1 ln(factor). The
 * dims are computed in float as llama.cpp computes them (a pair on the
 * boundary goes the same way). */
static void yarn_set(dp_hparams *hp, float factor)
{
    const float pi = 3.14159265358979323846f, n = (float)hp->n_rot;
    const float lo = floorf(n * logf((float)hp->n_ctx_orig / (32.0f * 2.0f * pi)) /
                            (2.0f * logf(hp->rope_base)));
    const float hi = ceilf(n * logf((float)hp->n_ctx_orig / (1.0f * 2.0f * pi)) /
                           (2.0f * logf(hp->rope_base)));
    hp->yarn_ext = 1.0f;
    hp->yarn_lo = lo > 0.0f ? lo : 0.0f;
    hp->yarn_hi = hi < n - 1.0f ? hi : n - 1.0f;
    hp->rope_mscale *= 1.0f + 0.1f * logf(factor);
}

/* RoPE's scaling: linear (a position scale), YaRN, Llama 3's per-pair
 * factors (rope_freqs.weight: a pair's angle is divided by its factor),
 * LongRoPE's; the attention factor (rope.scaling.attn_factor) by which
 * cos and sin are scaled. Other kinds are refused rather than run subtly
 * wrong. */
static int rope_load(dp_hparams *hp, const dp_gguf *g, char *err, size_t errsz)
{
    char key[128];
    hp->rope_freq_scale = 1.0f;
    hp->rope_mscale = 1.0f;
    hp->n_ctx_orig = hp->n_ctx_train;
    uint32_t orig;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", hp->arch);
    /* (It may exceed context_length, in a file whose context was cut:
     * YaRN's dims still follow it, as llama.cpp's do.) */
    if (gguf_get_u32(g, key, &orig) == 0) {
        if (orig < 1 || orig > (1u << 24))
            return dp_err(err, errsz, DP_EFORMAT, "model: %s = %u is out of range [1, %u]", key,
                          orig, 1u << 24);
        hp->n_ctx_orig = (int32_t)orig;
    }
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", hp->arch);
    float af;
    if (gguf_get_f32(g, key, &af) == 0) {
        if (!(af > 0.0f && af < 16.0f))
            return dp_err(err, errsz, DP_EFORMAT, "model: %s = %g is out of range", key, af);
        hp->rope_mscale = af;
    }
    dp_gguf_str stype;
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    const bool has_type = gguf_get_str(g, key, &stype) == 0;
    const bool yarn = has_type && gguf_str_eq(stype, "yarn");
    float factor = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", hp->arch);
    if (gguf_get_f32(g, key, &factor) != 0) {
        snprintf(key, sizeof key, "%s.rope.scale_linear", hp->arch);
        if (gguf_get_f32(g, key, &factor) != 0)
            factor = 0.0f;
    }
    if (has_type && !yarn && !gguf_str_eq(stype, "none") && !gguf_str_eq(stype, "linear"))
        return dp_err(err, errsz, DP_EUNSUPPORTED, "model: rope scaling type '%.*s' is not supported",
                      (int)(stype.len > 32 ? 32 : stype.len), stype.ptr);
    if (factor != 0.0f && (!has_type || !gguf_str_eq(stype, "none"))) {
        if (!(factor >= 1.0f && factor <= 1024.0f))
            return dp_err(err, errsz, DP_EFORMAT, "model: rope scaling factor %g is out of range", factor);
        hp->rope_freq_scale = 1.0f / factor;
    }
    if (yarn)
        yarn_set(hp, factor > 0.0f ? factor : 1.0f);
    const dp_gguf_tensor *rf = gguf_find_tensor(g, "rope_freqs.weight");
    if (rf && (rf->type != DP_TYPE_F32 || rf->n_dims != 1 || rf->ne[0] != (uint64_t)hp->n_rot / 2))
        return dp_err(err, errsz, DP_EFORMAT,
                      "model: rope_freqs.weight must be %d F32 factors (one per rotated pair)",
                      hp->n_rot / 2);
    hp->rope_freqs = rf != NULL;
    return longrope_load(hp, g, err, errsz);
}

#define RANGE(v, lo, hi, name)                                                             \
    do {                                                                                   \
        if ((int64_t)(v) < (lo) || (int64_t)(v) > (hi))                                    \
            return dp_err(err, errsz, DP_EFORMAT, "model: %s.%s = %lld is out of range [%lld, %lld]", \
                          hp->arch, name, (long long)(v), (long long)(lo), (long long)(hi)); \
    } while (0)

int hparams_load(dp_hparams *hp, const dp_gguf *g, char *err, size_t errsz)
{
    memset(hp, 0, sizeof *hp);
    dp_gguf_str arch;
    if (gguf_get_str(g, "general.architecture", &arch))
        return dp_err(err, errsz, DP_EFORMAT, "model: missing metadata key 'general.architecture'");
    if (arch.len >= sizeof hp->arch)
        return dp_err(err, errsz, DP_EUNSUPPORTED, "model: architecture name too long");
    memcpy(hp->arch, arch.ptr, arch.len);
    hp->arch[arch.len] = 0;
    if (!(hp->desc = arch_find(hp->arch)))
        return dp_err(err, errsz, DP_EUNSUPPORTED,
                      "model: architecture '%s' is not supported (supported: %s)", hp->arch,
                      arch_names());

    uint32_t u;
    int rc;
#define U32(field, key, req, def)                                                   \
    if ((rc = get_u32(g, hp->arch, key, req, def, &u, err, errsz)))                  \
        return rc;                                                                  \
    hp->field = (int32_t)(u > INT32_MAX ? INT32_MAX : u);
    U32(n_layers, "block_count", true, 0);
    U32(dim, "embedding_length", true, 0);
    U32(n_heads, "attention.head_count", true, 0);
    U32(n_kv_heads, "attention.head_count_kv", false, (uint32_t)hp->n_heads);
    U32(ffn, "feed_forward_length", true, 0);
    U32(n_ctx_train, "context_length", true, 0);
#undef U32
    RANGE(hp->n_layers, 1, 1024, "block_count");
    RANGE(hp->dim, 1, 1 << 16, "embedding_length");
    RANGE(hp->n_heads, 1, 1024, "attention.head_count");
    RANGE(hp->n_kv_heads, 1, hp->n_heads, "attention.head_count_kv");
    RANGE(hp->ffn, 1, 1 << 20, "feed_forward_length");
    RANGE(hp->n_ctx_train, 1, 1 << 24, "context_length");
    if (hp->n_heads % hp->n_kv_heads)
        return dp_err(err, errsz, DP_EFORMAT,
                      "model: head_count %d is not a multiple of head_count_kv %d", hp->n_heads,
                      hp->n_kv_heads);
    /* A head's size: key_length where the file gives it (Qwen 3, Mistral
     * Nemo: not dim / n_heads); values must be of the same size. At most
     * 1024: what the backends' KV layouts take (the CPU's RoPE too). */
    uint32_t kl = 0, vl = 0;
    if ((rc = get_u32(g, hp->arch, "attention.key_length", false, 0, &kl, err, errsz)) ||
        (rc = get_u32(g, hp->arch, "attention.value_length", false, 0, &vl, err, errsz)))
        return rc;
    if (kl == 0 && hp->dim % hp->n_heads)
        return dp_err(err, errsz, DP_EFORMAT, "model: embedding_length %d is not a multiple of head_count %d",
                      hp->dim, hp->n_heads);
    if (kl)
        RANGE(kl, 2, 1024, "attention.key_length");
    hp->head_dim = kl ? (int32_t)kl : hp->dim / hp->n_heads;
    if (vl && vl != (uint32_t)hp->head_dim)
        return dp_err(err, errsz, DP_EUNSUPPORTED,
                      "model: attention.value_length %u differs from the key size %d (values and "
                      "keys of different sizes are not supported)", vl, hp->head_dim);
    if ((rc = get_u32(g, hp->arch, "rope.dimension_count", false, (uint32_t)hp->head_dim, &u, err, errsz)))
        return rc;
    hp->n_rot = (int32_t)(u > INT32_MAX ? INT32_MAX : u);
    RANGE(hp->n_rot, 2, hp->head_dim, "rope.dimension_count");
    if (hp->n_rot % 2)
        return dp_err(err, errsz, DP_EFORMAT, "model: rope.dimension_count %d is odd", hp->n_rot);
    if ((rc = get_f32(g, hp->arch, "rope.freq_base", false, 10000.0f, &hp->rope_base, err, errsz)))
        return rc;
    if (!(hp->rope_base > 1.0f))
        return dp_err(err, errsz, DP_EFORMAT, "model: rope.freq_base %g must be > 1", hp->rope_base);
    if ((rc = get_f32(g, hp->arch, "attention.layer_norm_rms_epsilon", false, 1e-5f, &hp->rms_eps,
                      err, errsz)))
        return rc;
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f))
        return dp_err(err, errsz, DP_EFORMAT, "model: layer_norm_rms_epsilon %g is out of range",
                      hp->rms_eps);

    if ((rc = rope_load(hp, g, err, errsz)))
        return rc;
    if ((rc = sliding_window_load(hp, g, err, errsz)))
        return rc;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    /* Gemma 3 27B scales queries by its query_pre_attn_scalar, dim / heads
     * (168), not by the head size (128): llama.cpp knows it by its 62
     * layers, as here (the file does not carry the scalar). */
    if (hp->desc->gemma && hp->n_layers == 62)
        hp->attn_scale = 1.0f / sqrtf((float)hp->dim / (float)hp->n_heads);

    const dp_gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return dp_err(err, errsz, DP_EFORMAT, "model: missing tensor 'token_embd.weight'");
    uint32_t vocab;
    if ((rc = get_u32(g, hp->arch, "vocab_size", false, (uint32_t)emb->ne[1], &vocab, err, errsz)))
        return rc;
    if (vocab != emb->ne[1])
        return dp_err(err, errsz, DP_EFORMAT,
                      "model: vocab_size %u does not match token_embd.weight rows %llu", vocab,
                      (unsigned long long)emb->ne[1]);
    hp->vocab = (int32_t)(vocab > INT32_MAX ? INT32_MAX : vocab);
    RANGE(hp->vocab, 1, 1 << 22, "vocab_size");
    hp->tied_output = gguf_find_tensor(g, "output.weight") == NULL;
    return 0;
}
