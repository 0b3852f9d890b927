/* tokenizer.h: text <-> token ids from a GGUF file's tokenizer.ggml.* metadata:
 * byte-level BPE ("gpt2" family, with the file's pre-tokenizer) and
 * SentencePiece-style ("llama": scores, byte fallback), plus streaming
 * detokenization that only ever emits complete UTF-8. */
#ifndef DP_MODEL_TOKENIZER_H
#define DP_MODEL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "gguf.h"

typedef struct dp_tokenizer dp_tokenizer;

typedef enum dp_tok_kind { DP_TOK_BPE = 1, DP_TOK_SPM = 2 } dp_tok_kind;

/* Token attributes from tokenizer.ggml.token_type (GGUF numbering). */
enum {
    DP_TOKTYPE_NORMAL = 1,
    DP_TOKTYPE_UNKNOWN = 2,
    DP_TOKTYPE_CONTROL = 3,
    DP_TOKTYPE_USER_DEFINED = 4,
    DP_TOKTYPE_UNUSED = 5,
    DP_TOKTYPE_BYTE = 6,
};

/* Builds the tokenizer; the GGUF may be closed afterwards (all data copied). */
int tokenizer_init_gguf(dp_tokenizer **out, const dp_gguf *g, char *err, size_t errsz);
void tokenizer_destroy(dp_tokenizer *t);

dp_tok_kind tokenizer_kind(const dp_tokenizer *t);
int32_t tokenizer_n_vocab(const dp_tokenizer *t);
int32_t tokenizer_bos(const dp_tokenizer *t);   /* -1 if none */
int32_t tokenizer_eos(const dp_tokenizer *t);   /* -1 if none */
/* End-of-turn token: <|im_end|>, <|eot_id|>, <|end|> ... when the vocabulary
 * has one, else -1. */
int32_t tokenizer_eot(const dp_tokenizer *t);
bool tokenizer_add_bos(const dp_tokenizer *t);  /* tokenizer.ggml.add_bos_token */
/* True for EOS, EOT and other end-of-generation control tokens. */
bool tokenizer_is_eog(const dp_tokenizer *t, int32_t id);
bool tokenizer_is_special(const dp_tokenizer *t, int32_t id);
/* Id of an exact token text (e.g. "<|im_start|>"), or -1. */
int32_t tokenizer_find(const dp_tokenizer *t, const char *text);

/* Encodes len bytes of text (any bytes, invalid UTF-8 included). With
 * parse_special, control token texts in the input map to their ids; without
 * it they are plain text. User-defined tokens' texts (Gemma's runs of
 * spaces) map to their ids in either case, as llama.cpp's. add_bos prepends BOS when the
 * vocabulary has one. *out is malloc'd; the caller frees it. */
int tokenizer_encode(const dp_tokenizer *t, const char *text, size_t len, bool add_bos,
                     bool parse_special, int32_t **out, size_t *n_out);

/* The bytes a token stands for (byte-level decoding and SentencePiece's
 * U+2581 -> space and <0xNN> byte tokens applied). Control tokens give their
 * text when render_special, else nothing. Returns the byte count (which may
 * exceed cap; only cap bytes are written), or a negative code for a bad id. */
int tokenizer_token_bytes(const dp_tokenizer *t, int32_t id, bool render_special, char *buf,
                          size_t cap);

/* Decodes a whole sequence into a malloc'd NUL-terminated string. */
int tokenizer_decode(const dp_tokenizer *t, const int32_t *ids, size_t n, bool render_special,
                     char **out, size_t *out_len);

/* Streaming detokenizer: holds back bytes of an incomplete UTF-8 sequence
 * until a later token completes it. Invalid sequences are flushed as U+FFFD. */
typedef struct dp_detok {
    unsigned char pending[8];
    size_t n_pending;
    bool render_special;
    bool first;        /* SPM: strip the leading space of the first piece */
} dp_detok;

void detok_init(dp_detok *d, bool render_special);
/* Appends the text that token id completes to out (cap bytes); returns the
 * number of bytes written (never more than cap; cap >= 64 always suffices for
 * one token's worth plus pending bytes when the vocab's longest piece fits),
 * or a negative code. */
int detok_push(dp_detok *d, const dp_tokenizer *t, int32_t id, char *out, size_t cap);
/* Flushes what remains at end of stream (incomplete bytes become U+FFFD). */
int detok_flush(dp_detok *d, char *out, size_t cap);

#endif
