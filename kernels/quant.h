/* quant.h: the GGML tensor types (numbering as in GGUF files), their block
 * geometry, and reference dequantization to f32. Owned by kernels/ because the
 * backends read quantized weights directly; model/ uses it for tensor sizes. */
#ifndef DP_KERNELS_QUANT_H
#define DP_KERNELS_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* Values are the on-disk GGML type ids. */
typedef enum dp_dtype {
    DP_TYPE_F32 = 0,
    DP_TYPE_F16 = 1,
    DP_TYPE_Q4_0 = 2,
    DP_TYPE_Q4_1 = 3,
    DP_TYPE_Q5_0 = 6,
    DP_TYPE_Q5_1 = 7,
    DP_TYPE_Q8_0 = 8,
    DP_TYPE_Q8_1 = 9,
    DP_TYPE_Q2_K = 10,
    DP_TYPE_Q3_K = 11,
    DP_TYPE_Q4_K = 12,
    DP_TYPE_Q5_K = 13,
    DP_TYPE_Q6_K = 14,
    DP_TYPE_Q8_K = 15,
    DP_TYPE_IQ2_XXS = 16,
    DP_TYPE_IQ2_XS = 17,
    DP_TYPE_IQ3_XXS = 18,
    DP_TYPE_IQ1_S = 19,
    DP_TYPE_IQ4_NL = 20,
    DP_TYPE_IQ3_S = 21,
    DP_TYPE_IQ2_S = 22,
    DP_TYPE_IQ4_XS = 23,
    DP_TYPE_I8 = 24,
    DP_TYPE_I16 = 25,
    DP_TYPE_I32 = 26,
    DP_TYPE_I64 = 27,
    DP_TYPE_F64 = 28,
    DP_TYPE_IQ1_M = 29,
    DP_TYPE_BF16 = 30,
    DP_TYPE_COUNT = 40, /* upper bound for table sizes; ids >= this are unknown */
} dp_dtype;

/* Name of a type id ("Q4_1"), or "unknown(N)" style text in a static buffer
 * for ids the project does not know. */
const char *quant_type_name(uint32_t type);

/* True when the id is a type whose block geometry is known (so a file using
 * it can be sized and validated), whether or not it can be dequantized. */
bool quant_type_known(uint32_t type);

/* True when quant_dequant_row supports the type. */
bool quant_type_supported(uint32_t type);

/* Elements per block (1 for plain types) and bytes per block. 0 if unknown. */
uint32_t quant_block_elems(uint32_t type);
uint32_t quant_block_bytes(uint32_t type);

/* Bytes of n elements of the type. Returns 0 on success; DP_EINVAL when n is
 * not a multiple of the block size or the type is unknown; DP_ERANGE on
 * overflow. */
int quant_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes);

/* Dequantizes n elements (a multiple of the block size) from src into dst.
 * Returns 0, or DP_EUNSUPPORTED / DP_EINVAL. */
int quant_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);
/* The 16 levels an IQ4_NL / IQ4_XS nibble indexes (times the block's scale). */
extern const int8_t quant_iq4nl_levels[16];

/* Quantizes n f32 values (a multiple of 32) into Q8_0 or Q4_0 blocks, the
 * formats quant_dequant_row reads (the KV cache's quantized rows). Returns
 * 0, or DP_EUNSUPPORTED for other types / DP_EINVAL. */
int quant_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);

/* Asymmetric quantization of n values at a stride, bits (1..8) per value,
 * in place: each becomes m + q * d, q in [0, 2^bits - 1], the minimum m and
 * the scale d = (max - m) / (2^bits - 1) rounded to f16 first (as they are
 * stored), q the nearest level. KIVI's rounding (Liu et al. 2024: keys per
 * channel over a group of tokens, values per token over groups of
 * channels); tools/dp-eval measures what it costs before a kernel keeps it. */
void quant_asym_roundtrip(float *x, int32_t n, int32_t stride, int bits);

/* KIVI4, the decode path's 4-bit KV type (Liu et al. 2024): a block is one
 * group of g tokens (g even) of one KV head. Keys are quantized per channel
 * over the group, values per token over groups of 64 channels, each with an
 * f16 scale d and minimum m (value = m + q * d, q in 0..15, min/max
 * rounding as quant_asym_roundtrip). Layouts, per head:
 *   K: d[head_dim] f16, m[head_dim] f16, then per channel g/2 bytes of
 *      codes, token 2j in the low nibble and 2j + 1 in the high one;
 *   V: per token, (d, m) f16 pairs for each 64 channels, then head_dim / 2
 *      bytes of codes, channel 2i low, 2i + 1 high.
 * Keys need the whole group before their scales exist, which is why a
 * group is written once, when it is full (the newest tokens stay in the
 * arena's own type until then: the residual). */
#define KIVI_VGROUP 64
static inline size_t kivi_k_bytes(int32_t head_dim, int32_t g)
{
    return (size_t)head_dim * 4 + (size_t)head_dim * (size_t)(g / 2);
}
static inline size_t kivi_vrow_bytes(int32_t head_dim)
{
    return (size_t)head_dim / KIVI_VGROUP * 4 + (size_t)head_dim / 2;
}
static inline size_t kivi_v_bytes(int32_t head_dim, int32_t g)
{
    return (size_t)g * kivi_vrow_bytes(head_dim);
}
/* k, v: g rows of head_dim f32 values (row t = token t) into one head's
 * K and V blocks. */
void kivi_quant_k(const float *k, int32_t g, int32_t head_dim, uint8_t *dst);
void kivi_quant_vrow(const float *v, int32_t head_dim, uint8_t *dst);
/* Tokens [t0, t0 + n) of a K block back as f32 rows (row stride head_dim),
 * and one V row. */
void kivi_dequant_k(const uint8_t *src, int32_t g, int32_t head_dim, int32_t t0, int32_t n,
                    float *rows);
void kivi_dequant_vrow(const uint8_t *src, int32_t head_dim, float *dst);

/* IEEE half and bfloat16 conversions (round to nearest even on the way in). */
float dp_fp16_to_f32(uint16_t h);
uint16_t dp_f32_to_fp16(float f);
float dp_bf16_to_f32(uint16_t h);
uint16_t dp_f32_to_bf16(float f);

#endif
