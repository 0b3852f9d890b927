/* tokenizer_private.h: the tokenizer's state, shared by the two files that
 * own it (tokenizer.c builds it and encodes, detok.c decodes). Nobody else
 * includes it: the rest of the program uses tokenizer.h. */
#ifndef DP_MODEL_TOKENIZER_PRIVATE_H
#define DP_MODEL_TOKENIZER_PRIVATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* Per-token flags. */
enum { TF_EOG = 1 };

typedef struct merge_ent {
    uint64_t key;  /* (left id << 32 | right id) + 1; 0 marks an empty slot */
    int32_t rank;
    int32_t id;    /* the merged token */
} merge_ent;

struct dp_tokenizer {
    dp_tok_kind kind;
    int pre;
    bool ignore_merges;     /* Llama-3: a word that is a token is not merged */
    bool add_bos;
    bool add_space_prefix;  /* SPM */
    int32_t n_vocab;
    int32_t bos, eos, eot, unk;

    char *text;             /* token texts, each NUL-terminated */
    size_t *text_off;
    uint32_t *text_len;
    uint8_t *type;
    uint8_t *flags;
    float *scores;          /* SPM merge priority; NULL means all 0 */
    char *dec;              /* each token's decoded bytes */
    size_t *dec_off;
    uint32_t *dec_len;
    size_t max_dec_len;

    int32_t *hmap;          /* text -> id, open addressing */
    size_t hmask;
    merge_ent *mtab;        /* (left, right) -> rank, merged id */
    size_t mmask;

    int32_t byte_tok[256];  /* BPE: the token of each byte's mapped char; SPM: <0xNN> */
    char bl_enc[256][2];    /* GPT-2 bytes_to_unicode, as UTF-8 */
    uint8_t bl_len[256];

    int32_t *specials;      /* control/user-defined ids, for parse_special */
    size_t n_user_defined;  /* of them user-defined: matched in any text */
    size_t n_specials;
    bool special_first[256];
};

#endif
