/* pretok.h: the pre-tokenizers, the expressions that split text into words
 * before BPE (tokenizer.ggml.pre), written as hand matchers over a
 * fragment's code points and their classes. tokenizer.c runs BPE on what
 * they split. */
#ifndef DP_MODEL_PRETOK_H
#define DP_MODEL_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

/* Pre-tokenizers: which regex splits text into words before BPE. */
enum pre_kind {
    PRE_GPT2 = 0,  /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    PRE_SMOLLM,    /* each \p{N} isolated, then the GPT-2 regex on the rest */
    PRE_LLAMA3,    /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|... */
    PRE_QWEN2,     /* Llama 3's with single digits: ...|\p{N}|... (Qwen 2, 2.5 and 3) */
    PRE_DBRX,      /* Llama 3's expression, merges always applied (Phi-4, DBRX) */
};

/* Code point classes the matchers read (pretok_flags). */
enum { CF_L = 1, CF_N = 2, CF_WS = 4 };
#define CF_OTHER(f) (((f) & (CF_L | CF_N | CF_WS)) == 0)

/* The pre-tokenizer tokenizer.ggml.pre names (present: the key exists;
 * absent: GPT-2's), or -1 for a name not implemented: the tokenizer refuses
 * it, as llama.cpp does, rather than split text as the model never saw. */
int pretok_from_name(dp_gguf_str s, bool present);
/* The names pretok_from_name knows, ", "-separated into buf (for messages). */
void pretok_names(char *buf, size_t cap);
/* c's CF_* classes (none for an invalid byte). */
uint8_t pretok_flags(uint32_t c);
/* The end (exclusive) of kind's match at i, i < end, over code points cp and
 * their classes fl; [i, end) is all the expression sees. PRE_SMOLLM's digit
 * split is the caller's: within a split it matches as GPT-2. */
size_t pretok_match(int kind, const uint32_t *cp, const uint8_t *fl, size_t i, size_t end);

#endif
