/* arch.c: the architecture table (arch.h). */
#include "arch.h"

#include <string.h>

/* llama: LLaMA 1-3 (Llama 3's per-frequency RoPE factors come with the
 * file's rope_freqs.weight), Mistral 7B, SmolLM. qwen2: Qwen 2 and 2.5 and
 * the DeepSeek-R1 distills of them. qwen3: Qwen 3 (dense). phi3: Phi-3,
 * Phi-3.5 and Phi-4 (their fused tensors; LongRoPE for the 128k ones, in
 * hparams.c and llama.c). gemma3:
 * Gemma 3's text models, five sliding-window layers to one global (as
 * llama.cpp and the reference implementation lay them out; the files do
 * not say it), the local layers at RoPE base 10000. */
static const dp_arch k_archs[] = {
    {.name = "llama"},
    {.name = "qwen2", .rope_neox = true, .qkv_bias = true},
    {.name = "qwen3", .rope_neox = true, .qk_norm = true},
    {.name = "phi3", .rope_neox = true, .fused = true},
    {.name = "gemma3", .rope_neox = true, .qk_norm = true, .gemma = true, .swa_period = 6,
     .rope_base_swa = 10000.0f},
};

const dp_arch *arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
        if (!strcmp(k_archs[i].name, name))
            return &k_archs[i];
    return NULL;
}

const char *arch_names(void)
{
    return "llama, qwen2, qwen3, phi3, gemma3";
}
