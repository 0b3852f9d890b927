/* synth_gguf.h: a small GGUF writer (in memory or streamed to a file) and, on
 * top of it, a seeded synthetic LLaMA model with a byte-level BPE tokenizer. */
#ifndef DP_TOOLS_SYNTH_GGUF_H
#define DP_TOOLS_SYNTH_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "kernels/quant.h"
#include "model/gguf.h"

/* ---- writer ------------------------------------------------------------
 * Metadata is serialized as it is added; tensors are recorded as infos with
 * either a private copy of their data or a fill callback, so the header can be
 * computed first and the data streamed tensor by tensor (a 13 GB model never
 * sits in memory). Adders return 0 or a DP_E* code; the first error is also
 * kept in `err` and makes finish/write fail, so callers may check once. The
 * writer writes what it is told (it checks sizes, not names or metadata), so
 * tests can build unusual files with it. */

/* Fills n_rows rows (each ne[0] elements of the tensor's type, encoded) from
 * row `row0` into dst. Returns 0 or a DP_E* code. Rows are requested in
 * increasing order, in chunks of any size. */
typedef int (*gguf_fill_fn)(void *ctx, uint64_t row0, uint64_t n_rows, void *dst);

typedef struct gguf_writer_tensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[DP_GGUF_MAX_DIMS];
    uint64_t row_bytes;
    uint64_t n_rows;
    uint64_t nbytes;
    uint64_t offset;    /* assigned when the layout is computed */
    void *data;         /* private copy, or NULL when fill is set */
    gguf_fill_fn fill;
    void *fill_ctx;     /* private copy of the caller's context */
} gguf_writer_tensor;

typedef struct gguf_writer {
    uint32_t version;   /* 3 unless set */
    uint64_t alignment; /* follows a general.alignment u32 key; 32 otherwise */
    uint8_t *kv;        /* serialized metadata */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    gguf_writer_tensor *tensors;
    uint64_t n_tensors, tensors_cap;
    int err;            /* first error, sticky */
} gguf_writer;

int gguf_writer_init(gguf_writer *w);
void gguf_writer_destroy(gguf_writer *w);

/* Version number written to the header (2 and 3 share one layout). */
void gguf_writer_set_version(gguf_writer *w, uint32_t version);
/* Adds general.alignment (u32) and uses it for the data layout. */
int gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment);

int gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_add_i8(gguf_writer *w, const char *key, int8_t v);
int gguf_writer_add_u16(gguf_writer *w, const char *key, uint16_t v);
int gguf_writer_add_i16(gguf_writer *w, const char *key, int16_t v);
int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_add_i64(gguf_writer *w, const char *key, int64_t v);
int gguf_writer_add_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_add_f64(gguf_writer *w, const char *key, double v);
int gguf_writer_add_bool(gguf_writer *w, const char *key, bool v);
int gguf_writer_add_str(gguf_writer *w, const char *key, const char *v);
/* A string value with an explicit length (may hold NULs). */
int gguf_writer_add_str_n(gguf_writer *w, const char *key, const char *v, size_t len);

/* Arrays. add_arr takes n elements of a fixed-size type (dp_gguf_vtype: not
 * STRING/ARRAY), in the host's (little-endian) layout. */
int gguf_writer_add_arr(gguf_writer *w, const char *key, uint32_t elem_type, uint64_t n, const void *elems);
int gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
int gguf_writer_add_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
int gguf_writer_add_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n);
/* Any value, given as its value type and already-serialized bytes (used for
 * nested arrays and for hand-made edge cases). */
int gguf_writer_add_raw(gguf_writer *w, const char *key, uint32_t type, const void *value, size_t len);

/* A tensor (ne[0] contiguous), with data of the exact size its type gives
 * (copied; NULL means zeros). */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const uint64_t *ne,
                           const void *data);
/* A tensor whose data comes from fill() when written; ctx_size bytes at ctx
 * are copied and the copy is handed to fill. */
int gguf_writer_add_tensor_fill(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                const uint64_t *ne, gguf_fill_fn fill, const void *ctx, size_t ctx_size);

/* The whole file in one malloc'd buffer (caller frees). */
int gguf_writer_finish_mem(gguf_writer *w, void **buf, size_t *size);
/* Streams the file to path (written to path.tmp, then renamed). */
int gguf_writer_write_file(gguf_writer *w, const char *path);

/* ---- synthetic LLaMA ---------------------------------------------------- */

typedef struct dp_synth_shape {
    uint32_t n_layers;
    uint32_t dim;        /* embedding length */
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t ffn;        /* feed-forward length */
    uint32_t vocab;      /* >= 260: 256 byte tokens, merges, 3 special tokens */
    uint32_t ctx;
    float rope_base;
    bool tied;           /* true: no output.weight (the embedding is reused) */
    /* The architecture's variations (model/arch.h), all zero for LLaMA: */
    const char *arch;    /* general.architecture: NULL "llama", "qwen2" (Q/K/V biases),
                            "qwen3" (per-head Q/K norms), "phi3" (fused QKV, gate/up),
                            "gemma3" (Q/K norms, post-norms, sliding-window layers) */
    uint32_t head_dim;   /* 0: dim / n_heads; else written as attention.key_length */
    bool rope_freqs;     /* rope_freqs.weight (Llama 3's per-pair factors, 1..8) */
    uint32_t sliding_window; /* "gemma3": attention.sliding_window (required there) */
    uint32_t yarn_orig;      /* > 0: rope.scaling.type yarn, factor ctx / this, and
                                rope.scaling.original_context_length this */
    uint32_t longrope_orig;  /* > 0: LongRoPE (Phi-3's 128k models): rope_factors_long and
                                _short.weight, rope.scaling.original_context_length = this
                                and its attn_factor, sqrt(1 + ln(ctx / orig) / ln(orig)) */
} dp_synth_shape;

/* "tiny" (2 layers, dim 64, 4 heads, 2 kv heads, ffn 128, vocab 512, ctx 256,
 * untied), "smollm" (SmolLM2-135M's shape, tied) or "7b" (LLaMA-2 7B);
 * "tiny-llama3", "tiny-qwen2", "tiny-qwen3", "tiny-phi3" and "tiny-gemma3":
 * tiny in each architecture's layout (qwen3 with heads of 32; gemma3 with 7
 * layers, the sixth global, the others windows of 8 tokens). */
int synth_shape_preset(const char *name, dp_synth_shape *out);

/* Encodes n floats (a multiple of the block size) as F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K or Q6_K with round-to-nearest (plain
 * scales, no search). DP_EUNSUPPORTED for other types. */
int synth_quantize_row(uint32_t type, const float *x, void *dst, int64_t n);

/* Token layout of the synthetic vocabulary: ids 0..255 are the byte tokens
 * (GPT-2 byte-to-unicode characters, id = byte value), then merges, then
 * <|endoftext|> (vocab-3, also bos), <|im_start|> (vocab-2) and <|im_end|>
 * (vocab-1, eos). */
#define SYNTH_TOK_ENDOFTEXT(vocab) ((vocab) - 3)
#define SYNTH_TOK_IM_START(vocab) ((vocab) - 2)
#define SYNTH_TOK_IM_END(vocab) ((vocab) - 1)

/* Adds the metadata (LLaMA hyper-parameters, tokenizer, ChatML template) and
 * the tensors (generated on write from the seed) to w. weight_type is used for
 * the 2-D weights; norms are F32. */
int synth_llama_build(gguf_writer *w, const dp_synth_shape *shape, uint64_t seed, uint32_t weight_type, char *err,
                      size_t errsz);

/* synth_llama_build + gguf_writer_write_file. */
int synth_llama_write(const char *path, const dp_synth_shape *shape, uint64_t seed, uint32_t weight_type, char *err,
                      size_t errsz);

#endif
