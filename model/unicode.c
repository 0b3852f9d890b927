/* unicode.c: UTF-8 decoding with maximal-subpart error handling, and code
 * point classification by binary search over the generated run table. */
#include "unicode.h"
#include "unicode_tables.h"

/* Number of bytes a lead byte announces and the allowed range of the second
 * byte (the ranges exclude overlongs, surrogates and > U+10FFFF, per Unicode
 * Table 3-7). need 0 means the byte can start no sequence. */
static int utf8_lead(unsigned char b, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b < 0xC2) return 0;
    if (b < 0xE0) return 2;
    if (b < 0xF0) {
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F;
        return 3;
    }
    if (b < 0xF5) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* How many leading bytes of s[0..len) are a valid prefix of one sequence
 * (stops at the first byte that breaks it); *need gets the full length. */
static size_t utf8_prefix(const unsigned char *s, size_t len, int *need)
{
    unsigned char lo, hi;
    int n = utf8_lead(s[0], &lo, &hi);
    *need = n;
    if (n <= 1) return n == 1 ? 1 : 0;
    size_t i = 1;
    while (i < (size_t)n && i < len) {
        unsigned char c = s[i];
        if (c < lo || c > hi) break;
        lo = 0x80;
        hi = 0xBF;
        i++;
    }
    return i;
}

size_t unicode_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
    int need;
    size_t got = utf8_prefix(s, len, &need);
    if (need == 0 || got < (size_t)need) {
        *cp = DP_UNI_INVALID_BASE + s[0];
        return got ? got : 1;
    }
    uint32_t v;
    switch (need) {
    case 1: v = s[0]; break;
    case 2: v = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); break;
    case 3: v = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); break;
    default:
        v = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
            ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        break;
    }
    *cp = v;
    return (size_t)need;
}

size_t unicode_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp < 0x110000) {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

bool unicode_utf8_is_incomplete(const unsigned char *s, size_t len)
{
    if (len == 0) return false;
    int need;
    size_t got = utf8_prefix(s, len, &need);
    return need > 1 && got == len && len < (size_t)need;
}

bool unicode_utf8_valid(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        uint32_t cp;
        i += unicode_utf8_decode(s + i, len - i, &cp);
        if (DP_UNI_IS_INVALID(cp)) return false;
    }
    return true;
}

/* ASCII classes, so the common case needs no search. */
static const unsigned char ascii_cat[128] = {
    ['0'] = DP_UCAT_NUMBER, ['1'] = DP_UCAT_NUMBER, ['2'] = DP_UCAT_NUMBER, ['3'] = DP_UCAT_NUMBER,
    ['4'] = DP_UCAT_NUMBER, ['5'] = DP_UCAT_NUMBER, ['6'] = DP_UCAT_NUMBER, ['7'] = DP_UCAT_NUMBER,
    ['8'] = DP_UCAT_NUMBER, ['9'] = DP_UCAT_NUMBER, [' '] = DP_UCAT_SEP,
    ['!'] = DP_UCAT_PUNCT, ['"'] = DP_UCAT_PUNCT, ['#'] = DP_UCAT_PUNCT, ['%'] = DP_UCAT_PUNCT,
    ['&'] = DP_UCAT_PUNCT, ['\''] = DP_UCAT_PUNCT, ['('] = DP_UCAT_PUNCT, [')'] = DP_UCAT_PUNCT,
    ['*'] = DP_UCAT_PUNCT, [','] = DP_UCAT_PUNCT, ['-'] = DP_UCAT_PUNCT, ['.'] = DP_UCAT_PUNCT,
    ['/'] = DP_UCAT_PUNCT, [':'] = DP_UCAT_PUNCT, [';'] = DP_UCAT_PUNCT, ['?'] = DP_UCAT_PUNCT,
    ['@'] = DP_UCAT_PUNCT, ['['] = DP_UCAT_PUNCT, ['\\'] = DP_UCAT_PUNCT, [']'] = DP_UCAT_PUNCT,
    ['_'] = DP_UCAT_PUNCT, ['{'] = DP_UCAT_PUNCT, ['}'] = DP_UCAT_PUNCT,
    ['$'] = DP_UCAT_SYMBOL, ['+'] = DP_UCAT_SYMBOL, ['<'] = DP_UCAT_SYMBOL, ['='] = DP_UCAT_SYMBOL,
    ['>'] = DP_UCAT_SYMBOL, ['^'] = DP_UCAT_SYMBOL, ['`'] = DP_UCAT_SYMBOL, ['|'] = DP_UCAT_SYMBOL,
    ['~'] = DP_UCAT_SYMBOL,
};

dp_ucat unicode_category(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return DP_UCAT_LETTER;
        return (dp_ucat)ascii_cat[cp];
    }
    if (cp >= 0x110000) return DP_UCAT_OTHER;
    /* Last run whose start is <= cp. */
    size_t lo = 0, hi = sizeof dp_ucat_runs / sizeof dp_ucat_runs[0];
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((dp_ucat_runs[mid] >> 3) <= cp) lo = mid;
        else hi = mid;
    }
    return (dp_ucat)(dp_ucat_runs[lo] & 7);
}

bool unicode_is_space(uint32_t cp)
{
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    size_t n = sizeof dp_uspace_ranges / sizeof dp_uspace_ranges[0];
    for (size_t i = 0; i < n; i++) {
        if (cp < dp_uspace_ranges[i][0]) return false;
        if (cp <= dp_uspace_ranges[i][1]) return true;
    }
    return false;
}

const char *unicode_version(void)
{
    return DP_UNICODE_VERSION;
}
