/* arch.h: the architectures the forward pass runs, each a description of
 * what differs from LLaMA (which tensors exist, how RoPE rotates), never a
 * copy of the forward pass. An architecture not listed is refused at
 * start-up by name. */
#ifndef DP_MODEL_ARCH_H
#define DP_MODEL_ARCH_H

#include <stdbool.h>
#include <stdint.h>

typedef struct dp_arch {
    const char *name;  /* general.architecture, and the prefix of its keys */
    bool rope_neox;    /* RoPE rotates halves (x[i], x[i + n_rot/2]), not adjacent pairs */
    bool qkv_bias;     /* blk.N.attn_{q,k,v}.bias are added after the projections */
    bool qk_norm;      /* blk.N.attn_{q,k}_norm.weight: RMSNorm over each head before RoPE */
    bool fused;        /* blk.N.attn_qkv.weight holds Q, K and V (rows in that order) where
                          the file has it, and blk.N.ffn_up.weight the gate then the up
                          projection (2 x ffn rows, no ffn_gate) */
    bool gemma;        /* Gemma's block: the embedding scaled by sqrt(dim), RMSNorm after
                          attention and after the FFN (blk.N.post_attention_norm,
                          post_ffw_norm) before each residual add, GELU (tanh) gating. Its
                          norms' (1 + w) is in the file's weights already. */
    int32_t swa_period;    /* > 0: layers come in runs of swa_period, the last of each
                              run global and the others sliding-window layers of
                              {arch}.attention.sliding_window tokens */
    float rope_base_swa;   /* the sliding-window layers' RoPE base (no scaling), where
                              swa_period > 0 */
} dp_arch;

/* The description of general.architecture = name; NULL when not supported. */
const dp_arch *arch_find(const char *name);
/* "llama, qwen2, qwen3, phi3": for messages. */
const char *arch_names(void);

#endif
