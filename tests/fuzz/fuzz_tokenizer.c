/* fuzz_tokenizer.c: any bytes encode to ids in the vocabulary and decode
 * back to the same bytes (byte-level BPE loses nothing when special tokens
 * are not parsed); with special tokens parsed, encoding still succeeds, and
 * the streaming detokenizer emits valid UTF-8 only. */
#include <stdint.h>
#include <string.h>

#include "fuzz_model.h"
#include "model/unicode.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_model_init();
    return 0;
}

static bool utf8_ok(const unsigned char *s, size_t n)
{
    return unicode_utf8_valid(s, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    int32_t nv = tokenizer_n_vocab(fuzz_tok);
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tokenizer_encode(fuzz_tok, text, size, false, special, &ids, &n))
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= nv)
                abort();
        char *out = NULL;
        size_t len = 0;
        if (tokenizer_decode(fuzz_tok, ids, n, true, &out, &len))
            abort();
        if (!special && (len != size || memcmp(out, data, size)))
            abort();
        free(out);
        /* The streaming detokenizer, token by token. */
        dp_detok d;
        detok_init(&d, false);
        for (size_t i = 0; i < n; i++) {
            char buf[256];
            int k = detok_push(&d, fuzz_tok, ids[i], buf, sizeof buf);
            if (k < 0 || (size_t)k > sizeof buf || !utf8_ok((unsigned char *)buf, (size_t)k))
                abort();
        }
        char tail[64];
        int k = detok_flush(&d, tail, sizeof tail);
        if (k < 0 || !utf8_ok((unsigned char *)tail, (size_t)k))
            abort();
        free(ids);
    }
    return 0;
}
