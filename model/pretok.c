/* pretok.c: the pre-tokenizers (pretok.h). */
#include "pretok.h"

#include <stdio.h>

#include "common/dp.h"
#include "unicode.h"

/* The names tokenizer.ggml.pre gives each pre-tokenizer: one table for the
 * lookup and for the message that lists them. */
static const struct {
    const char *name;
    int kind;
} k_pre[] = {
    {"default", PRE_GPT2},         {"gpt2", PRE_GPT2},           {"gpt-2", PRE_GPT2},
    {"smollm", PRE_SMOLLM},        {"llama3", PRE_LLAMA3},       {"llama-bpe", PRE_LLAMA3},
    {"llama-v3", PRE_LLAMA3},      {"falcon3", PRE_LLAMA3},      {"qwen2", PRE_QWEN2},
    {"deepseek-r1-qwen", PRE_QWEN2}, {"megrez", PRE_QWEN2},      {"dbrx", PRE_DBRX},
    {"smaug-bpe", PRE_DBRX},
};
#define N_PRE (sizeof k_pre / sizeof k_pre[0])

int pretok_from_name(dp_gguf_str s, bool present)
{
    if (!present)
        return PRE_GPT2;
    for (size_t i = 0; i < N_PRE; i++)
        if (gguf_str_eq(s, k_pre[i].name))
            return k_pre[i].kind;
    return -1;
}

void pretok_names(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_PRE && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", k_pre[i].name);
}

uint8_t pretok_flags(uint32_t c)
{
    uint8_t f = 0;
    if (!DP_UNI_IS_INVALID(c)) {
        dp_ucat cat = unicode_category(c);
        if (cat == DP_UCAT_LETTER) f = CF_L;
        else if (cat == DP_UCAT_NUMBER) f = CF_N;
        if (unicode_is_space(c)) f |= CF_WS;
    }
    return f;
}

/* The matchers return the end (exclusive) of the match at i, i < end. The
 * regex sees only [i, end): lookahead stops at the segment's end, as when
 * a pre-tokenizer sequence applies the regex to each earlier split. */
static bool ascii_eq_ci(uint32_t c, char lower, bool ci)
{
    return c == (uint32_t)lower || (ci && c == (uint32_t)(lower - 'a' + 'A'));
}

static size_t match_contraction(const uint32_t *cp, size_t i, size_t end, bool ci)
{
    if (cp[i] != '\'' || i + 1 >= end) return 0;
    uint32_t c1 = cp[i + 1];
    if (ascii_eq_ci(c1, 's', ci) || ascii_eq_ci(c1, 't', ci) || ascii_eq_ci(c1, 'm', ci) ||
        ascii_eq_ci(c1, 'd', ci))
        return i + 2;
    if (i + 2 < end) {
        uint32_t c2 = cp[i + 2];
        if ((ascii_eq_ci(c1, 'r', ci) && ascii_eq_ci(c2, 'e', ci)) ||
            (ascii_eq_ci(c1, 'v', ci) && ascii_eq_ci(c2, 'e', ci)) ||
            (ascii_eq_ci(c1, 'l', ci) && ascii_eq_ci(c2, 'l', ci)))
            return i + 3;
    }
    return 0;
}

/* \s+(?!\S)|\s+ at i (cp[i] is whitespace): a run that reaches the end is
 * taken whole; one followed by a non-space gives up its last char to the next
 * word, unless it is a single char. */
static size_t match_space_run(const uint8_t *fl, size_t i, size_t end)
{
    size_t k = i;
    while (k < end && (fl[k] & CF_WS)) k++;
    if (k == end) return end;
    return k - i >= 2 ? k - 1 : k;
}

static size_t match_gpt2(const uint32_t *cp, const uint8_t *fl, size_t i, size_t end)
{
    size_t k = match_contraction(cp, i, end, false);
    if (k) return k;
    size_t j = i + (cp[i] == ' ' && i + 1 < end);
    if (fl[j] & CF_L) {
        while (j < end && (fl[j] & CF_L)) j++;
        return j;
    }
    if (fl[j] & CF_N) {
        while (j < end && (fl[j] & CF_N)) j++;
        return j;
    }
    if (CF_OTHER(fl[j])) {
        while (j < end && CF_OTHER(fl[j])) j++;
        return j;
    }
    return match_space_run(fl, i, end);
}

/* Llama 3's pre-tokenizer; Qwen 2's is the same with digits one at a time
 * (max_digits 1, not 3). */
static size_t match_llama3(const uint32_t *cp, const uint8_t *fl, size_t i, size_t end,
                           size_t max_digits)
{
    size_t k = match_contraction(cp, i, end, true);
    if (k) return k;
    uint32_t c = cp[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    size_t j = i;
    if (c != '\r' && c != '\n' && !(fl[i] & (CF_L | CF_N)) && i + 1 < end && (fl[i + 1] & CF_L)) j = i + 1;
    if (fl[j] & CF_L) {
        while (j < end && (fl[j] & CF_L)) j++;
        return j;
    }
    /* \p{N}{1,3} (Qwen 2: \p{N}) */
    if (fl[i] & CF_N) {
        j = i;
        while (j < end && j < i + max_digits && (fl[j] & CF_N)) j++;
        return j;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    j = i + (c == ' ' && i + 1 < end);
    if (CF_OTHER(fl[j])) {
        while (j < end && CF_OTHER(fl[j])) j++;
        while (j < end && (cp[j] == '\r' || cp[j] == '\n')) j++;
        return j;
    }
    /* \s*[\r\n]+: through the last \r or \n of the whitespace run. */
    size_t last_nl = 0;
    bool nl = false;
    for (k = i; k < end && (fl[k] & CF_WS); k++) {
        if (cp[k] == '\r' || cp[k] == '\n') {
            last_nl = k;
            nl = true;
        }
    }
    if (nl) return last_nl + 1;
    return match_space_run(fl, i, end);
}

size_t pretok_match(int kind, const uint32_t *cp, const uint8_t *fl, size_t i, size_t end)
{
    if (kind == PRE_LLAMA3 || kind == PRE_DBRX)
        return match_llama3(cp, fl, i, end, 3);
    if (kind == PRE_QWEN2)
        return match_llama3(cp, fl, i, end, 1);
    return match_gpt2(cp, fl, i, end);
}
