/* llama.h: the LLaMA-family model: hyperparameters from GGUF metadata, weights
 * on a backend, and the one batched forward pass over paged KV. */
#ifndef DP_MODEL_LLAMA_H
#define DP_MODEL_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "arch.h"
#include "gguf.h"
#include "kernels/backend.h"

typedef struct dp_hparams {
    char arch[32];          /* general.architecture ("llama", "qwen2", "gemma3", ...) */
    const dp_arch *desc;    /* what the architecture changes (arch.h) */
    int32_t n_layers;
    int32_t dim;            /* embedding length */
    int32_t n_heads;
    int32_t n_kv_heads;     /* < n_heads with GQA */
    int32_t head_dim;       /* attention.key_length, else dim / n_heads */
    int32_t ffn;            /* feed-forward length */
    int32_t n_ctx_train;    /* context length the model was trained for */
    int32_t vocab;
    int32_t n_rot;          /* rotary dims per head */
    float rope_base;
    float rope_freq_scale; /* 1 / linear scaling factor */
    bool rope_freqs;        /* rope_freqs.weight: per-frequency factors (Llama 3) */
    bool longrope;          /* rope_factors_short/long.weight (Phi-3's 128k models): the
                               long ones where the served context passes n_ctx_orig */
    int32_t n_ctx_orig;     /* rope.scaling.original_context_length (n_ctx_train without) */
    float rope_mscale;      /* cos and sin times it: rope.scaling.attn_factor (1 without),
                               with YaRN times 1 + 0.1 ln(factor) */
    float yarn_ext;         /* YaRN's extrapolation mix (1), 0 without YaRN */
    float yarn_lo, yarn_hi; /* YaRN's correction dims: the pairs its ramp runs over */
    float rms_eps;
    bool tied_output;       /* no output.weight: the embedding table projects */
    int32_t swa_window;     /* > 0: the sliding-window layers' window (tokens); 0: none */
    float attn_scale;       /* the attention's score scale (1 / sqrt(head_dim) but where an
                               architecture says otherwise) */
} dp_hparams;

/* The window of layer l: hp->swa_window on a sliding-window layer, else 0. */
static inline int32_t hparams_layer_window(const dp_hparams *hp, int32_t l)
{
    const int32_t p = hp->desc ? hp->desc->swa_period : 0;
    return hp->swa_window > 0 && p > 0 && (l + 1) % p != 0 ? hp->swa_window : 0;
}

/* Reads and checks hyperparameters ({arch}.* keys); the message names a
 * missing or out-of-range key. */
int hparams_load(dp_hparams *hp, const dp_gguf *g, char *err, size_t errsz);

typedef struct dp_llama dp_llama;

/* Loads the weights onto be and sizes activations for up to max_tokens tokens
 * and max_out logit rows per step. */
int llama_init(dp_llama **out, const dp_gguf *g, dp_backend *be, int32_t max_tokens,
               int32_t max_out, char *err, size_t errsz);
/* llama_init with flags: DP_LLAMA_NO_CAPTURE allocates no query capture
 * buffer (llama_capture_capacity 0: a batch with n_capture > 0 is refused),
 * for callers that never migrate (a benchmark: 1 GiB on a 7B model). */
#define DP_LLAMA_NO_CAPTURE 1u
int llama_init_ex(dp_llama **out, const dp_gguf *g, dp_backend *be, int32_t max_tokens,
                  int32_t max_out, unsigned flags, char *err, size_t errsz);
/* Bytes of the activation buffers llama_init allocates for these limits
 * (capture: with the query capture buffer), for memory plans made before
 * a load; the backend's own scratch is not included. */
size_t llama_activation_bytes(const dp_hparams *hp, int32_t max_tokens, int32_t max_out, bool capture);
void llama_destroy(dp_llama *m);

const dp_hparams *llama_hparams(const dp_llama *m);
/* The context the model serves a sequence at most: with LongRoPE, past
 * rope.scaling.original_context_length the long factors rotate, else the
 * short ones (llama.cpp's choice, by its n_ctx). Until called: short. */
void llama_set_context(dp_llama *m, int32_t n_ctx);
dp_backend *llama_backend(const dp_llama *m);
int32_t llama_max_tokens(const dp_llama *m);
int32_t llama_max_out(const dp_llama *m);
/* The map of a batch that keeps the sliding-window layers in a store of
 * their own (backend.h layer_map; NULL: the model has none, or no global
 * layer beside them), and how many they are: the main stores then need
 * the other layers only. */
const int32_t *llama_kv_layer_map(const dp_llama *m);
int32_t llama_swa_layers(const dp_llama *m);
/* The model layers of the main stores' layers where the sliding ones are
 * apart: layer j is the model's first + j * step (Gemma 3: 5, 11, 17, ...);
 * 0 and 1 for a model without sliding layers. Captured queries of the
 * global layers are then every step-th layer's, from the first. */
void llama_global_layers(const dp_llama *m, int32_t *first, int32_t *step);
/* Layout of a KV store that fits this model, with the given block geometry. */
dp_kv_layout llama_kv_layout(const dp_llama *m, int32_t block_tokens, int32_t n_blocks);

/* Queries one sequence keeps for attention-mass scoring (SnapKV's
 * observation window, at most): its prompt's last DP_MAX_CAPTURE tokens. */
#define DP_MAX_CAPTURE 64
/* Queries one step can capture (dp_batch.capture_tokens): enough for every
 * sequence of the step to capture its whole window, min(max_tokens,
 * max_out * DP_MAX_CAPTURE). A per-step cap smaller than that starved every
 * prompt but the first few ending in a step, which then fell back to key
 * norms without a word. */
int32_t llama_capture_capacity(const dp_llama *m);

/* Backend buffer holding, after a forward with n_capture > 0, the captured
 * post-RoPE queries: [n_layers][n_capture][n_heads * head_dim]. */
const float *llama_captured_queries(const dp_llama *m);

/* One step: runs the batch, writing K/V into its slots, and copies the logits
 * of the batch's out_tokens to the host array logits [n_out * vocab]. */
int llama_forward(dp_llama *m, const dp_batch *b, dp_kv_store *const *stores, float *logits);
/* The same step, but instead of the logits only sampling inputs come back:
 * per out_token, the k best candidates, the row's max and its weight sum at
 * temperature[o] (backend.h, logits_topk: host arrays temperature and
 * mask_rows [n_out], ids/vals [n_out * k], row_max/row_sum [n_out]; rows
 * flagged in mask_rows get mask_ids set to -inf first). DP_EUNSUPPORTED when
 * the backend lacks the op. */
int llama_forward_topk(dp_llama *m, const dp_batch *b, dp_kv_store *const *stores, int32_t k,
                       const float *temperature, const int32_t *mask_ids, int32_t n_mask,
                       const uint8_t *mask_rows, int32_t *ids, float *vals, float *row_max,
                       float *row_sum);
/* The full logits of the last step's first n_out rows (the fallback when the
 * candidates of llama_forward_topk do not cover what the sampler needs; rows
 * it masked come back masked), or of rows [first, first + n). */
int llama_download_logits(dp_llama *m, int32_t n_out, float *logits);
int llama_download_rows(dp_llama *m, int32_t first, int32_t n, float *logits);

#endif
