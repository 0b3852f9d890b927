/* unicode.h: UTF-8 decoding/encoding and the Unicode classes (letter, number,
 * punctuation, White_Space ...) that the tokenizer's pre-tokenizers ask about. */
#ifndef DP_MODEL_UNICODE_H
#define DP_MODEL_UNICODE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* Major general-category groups. Unassigned, Cc, Cf, Cs, Co and invalid bytes
 * are DP_UCAT_OTHER. */
typedef enum dp_ucat {
    DP_UCAT_OTHER = 0,
    DP_UCAT_LETTER = 1,  /* \p{L} */
    DP_UCAT_NUMBER = 2,  /* \p{N} */
    DP_UCAT_PUNCT = 3,   /* \p{P} */
    DP_UCAT_SYMBOL = 4,  /* \p{S} */
    DP_UCAT_MARK = 5,    /* \p{M} */
    DP_UCAT_SEP = 6,     /* \p{Z} */
} dp_ucat;

/* An invalid byte b decodes to DP_UNI_INVALID_BASE + b: outside Unicode, so it
 * is never a letter, number or space, and the byte can be recovered. */
#define DP_UNI_INVALID_BASE 0x110000u
#define DP_UNI_IS_INVALID(cp) ((cp) >= DP_UNI_INVALID_BASE)

/* Decodes the code point at s[0..len) (len >= 1). Returns the bytes it spans.
 * Valid UTF-8 only: overlongs, surrogates and values above U+10FFFF are
 * invalid. On invalid input *cp = DP_UNI_INVALID_BASE + s[0] and the return
 * value is the length of the maximal subpart (the longest prefix of a valid
 * sequence, at least 1, as Unicode's "U+FFFD substitution of maximal
 * subparts" practice and Python's errors="replace" count it). */
size_t unicode_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp);

/* Writes cp as UTF-8 (1-4 bytes) and returns the length; 0 for a value that
 * is not a Unicode scalar value. */
size_t unicode_utf8_encode(uint32_t cp, char out[4]);

/* True when s[0..len) is a proper prefix of some valid UTF-8 sequence (so more
 * bytes could still complete it). len 0 gives false. */
bool unicode_utf8_is_incomplete(const unsigned char *s, size_t len);

/* True when s[0..len) is entirely valid UTF-8. */
bool unicode_utf8_valid(const unsigned char *s, size_t len);

dp_ucat unicode_category(uint32_t cp);
bool unicode_is_space(uint32_t cp);  /* White_Space, as regex \s in Unicode mode */

static inline bool unicode_is_letter(uint32_t cp) { return unicode_category(cp) == DP_UCAT_LETTER; }
static inline bool unicode_is_number(uint32_t cp) { return unicode_category(cp) == DP_UCAT_NUMBER; }

/* The Unicode version the tables were generated from. */
const char *unicode_version(void);

#endif
