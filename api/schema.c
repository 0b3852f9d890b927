/* schema.c: JSON Schema, regular expressions and choice lists to GBNF.
 *
 * The output is GBNF text for sched/grammar.c, one rule per line. Literals
 * and classes are written with escapes only for what is not printable ASCII
 * (\xHH below U+0080, \uHHHH up to U+FFFF, raw UTF-8 above), and the
 * characters a GBNF parser might read as syntax (" \ ] ^ - inside classes)
 * as \xHH, so the text means the same to any reasonable GBNF reader.
 *
 * JSON Schema: which documents a grammar admits.
 *  - Between tokens, whitespace is bounded (rule ws: one space or tab, or a
 *    newline and up to 20 spaces or tabs, enough for pretty-printed output)
 *    so that a small model cannot spend its whole budget on whitespace. No
 *    whitespace before or after the document.
 *  - Properties come in schema order: required ones always, optional ones
 *    optional (2 rules per property, whatever is skipped). Without
 *    additionalProperties (or with false) no other property is generated;
 *    with true or a schema, extra members follow the declared ones. An extra
 *    key never equals a declared name: when properties are declared, extra
 *    keys are written without escapes (so "n\u0061me" cannot smuggle in
 *    "name") and a trie of the declared names excludes them.
 *  - {"type": "object"} with neither properties nor additionalProperties is
 *    any object (what such a schema means; nobody asks for {} alone).
 *  - Without "type", the type is inferred from the keywords present (an
 *    object for properties, ...); with none, any JSON value. A validator
 *    would accept other types there too: the grammar admits a subset.
 *  - Integers have at most 16 digits, fractions at most 16 and exponents at
 *    most 3, so a number always ends. Integer bounds (minimum, maximum and
 *    the exclusive forms, draft 4's boolean ones too) are exact ranges of
 *    decimal numerals; number bounds must be integers and give numbers
 *    without exponent. multipleOf is refused.
 *  - Strings count code points (an escape is one); format date, time,
 *    date-time (RFC 3339, uppercase T and Z, up to 6 fraction digits, no
 *    leap second) and uuid have grammars; other formats are plain strings,
 *    as validators do not check format unless asked to. A pattern is
 *    matched against the whole content even without ^ and $ (JSON Schema
 *    searches for it anywhere; generating only full matches is a subset and
 *    gives the model a usable constraint). Patterns may not be combined with
 *    length limits or a checked format.
 *  - enum and const are their values' compact JSON serialisation, filtered by
 *    "type" when both are given. oneOf is treated as anyOf: its branches must
 *    be disjoint for that to be exact (they are in the usual uses:
 *    discriminated unions and X-or-null).
 *  - $ref: local JSON pointers ("#", "#/$defs/X", "#/definitions/X", ...);
 *    each target becomes one rule, so recursion is a rule reference.
 *
 * Regular expressions: the syntax common to ECMA-262 (JSON Schema's dialect)
 * and Python's re (what vLLM's users and the jsonschema package run), and
 * for classes what both engines agree on: . is any character but \n \r
 * U+2028 U+2029; \d \w \s generate what both match (ASCII digits and word
 * characters, the white space both know), \D \W \S and negated classes
 * only what neither matches. Refused: backreferences, lookarounds, named
 * groups, \b \B \A \Z, inline flags, \p{..}, lazy and possessive
 * quantifiers, ^ or $ anywhere but at the ends (where they change nothing:
 * a sentence is a whole match). Inside a JSON string (a schema's pattern)
 * the expression must not need " \ or a control character, which would
 * have to be escaped there: . and negated classes exclude them, and a
 * literal or class that has nothing else is refused. */
#include "schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

/* ---- growable string -------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_reserve(sbuf *b, size_t add)
{
    if (b->oom)
        return;
    if (b->n + add + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 128;
    while (cap < b->n + add + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void sb_putn(sbuf *b, const char *s, size_t n)
{
    sb_reserve(b, n);
    if (b->oom)
        return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

static void sb_putc(sbuf *b, char c) { sb_putn(b, &c, 1); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    if ((size_t)k < sizeof tmp) {
        sb_putn(b, tmp, (size_t)k);
        return;
    }
    sb_reserve(b, (size_t)k);
    if (b->oom)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

static const char *sb_str(const sbuf *b) { return b->p ? b->p : ""; }

static void sb_free(sbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Hands the text to the caller: 0, or DP_ENOMEM (the buffer is freed). */
static int sb_take(sbuf *b, char **out, char *err, size_t errsz)
{
    if (!b->oom && !b->p)
        sb_reserve(b, 0);
    if (b->oom) {
        sb_free(b);
        return dp_err(err, errsz, DP_ENOMEM, "out of memory writing a grammar");
    }
    b->p[b->n] = 0;
    *out = b->p;
    memset(b, 0, sizeof *b);
    return 0;
}

/* ---- UTF-8 and GBNF escaping ------------------------------------------ */

/* Decodes one code point at s[*i] (n bytes): false on invalid UTF-8
 * (overlong forms and surrogates included). */
static bool utf8_next(const char *s, size_t n, size_t *i, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    if (k >= n)
        return false;
    uint32_t c = u[k];
    int len;
    uint32_t min;
    if (c < 0x80) {
        *cp = c;
        *i = k + 1;
        return true;
    } else if ((c & 0xE0) == 0xC0) {
        len = 2, c &= 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, c &= 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, c &= 0x07, min = 0x10000;
    } else {
        return false;
    }
    if (k + (size_t)len > n)
        return false;
    for (int j = 1; j < len; j++) {
        if ((u[k + (size_t)j] & 0xC0) != 0x80)
            return false;
        c = (c << 6) | (u[k + (size_t)j] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return false;
    *cp = c;
    *i = k + (size_t)len;
    return true;
}

static void put_utf8(sbuf *b, uint32_t cp)
{
    char t[4];
    size_t n;
    if (cp < 0x80) {
        t[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6)), t[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)), t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)), t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), t[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    }
    sb_putn(b, t, n);
}

/* Non-ASCII and control characters as escapes, shared by literals and
 * classes; returns false for printable ASCII (the caller decides). */
static bool put_escaped_cp(sbuf *b, uint32_t cp)
{
    if (cp == '\n')
        sb_puts(b, "\\n");
    else if (cp == '\t')
        sb_puts(b, "\\t");
    else if (cp == '\r')
        sb_puts(b, "\\r");
    else if (cp < 0x20 || cp == 0x7F)
        sb_printf(b, "\\x%02X", (unsigned)cp);
    else if (cp >= 0x80 && cp <= 0xFFFF)
        sb_printf(b, "\\u%04X", (unsigned)cp);
    else if (cp > 0xFFFF)
        put_utf8(b, cp);   /* beyond \uHHHH: the grammar reads UTF-8 */
    else
        return false;
    return true;
}

/* One character inside a "..." literal. */
static void lit_cp(sbuf *b, uint32_t cp)
{
    if (put_escaped_cp(b, cp))
        return;
    if (cp == '"' || cp == '\\')
        sb_putc(b, '\\');
    sb_putc(b, (char)cp);
}

/* One character inside a [...] class. */
static void class_cp(sbuf *b, uint32_t cp)
{
    if (put_escaped_cp(b, cp))
        return;
    if (cp == '"' || cp == '\\' || cp == ']' || cp == '[' || cp == '^' || cp == '-')
        sb_printf(b, "\\x%02X", (unsigned)cp);
    else
        sb_putc(b, (char)cp);
}

/* A "..." literal of n bytes of UTF-8: false when they are not UTF-8. */
static bool put_literal(sbuf *b, const char *s, size_t n)
{
    sb_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        if (!utf8_next(s, n, &i, &cp))
            return false;
        lit_cp(b, cp);
    }
    sb_putc(b, '"');
    return true;
}

/* ---- code point sets (character classes) ------------------------------ */

#define CP_MAX 0x10FFFFu

typedef struct {
    uint32_t lo, hi;
} cprange;

typedef struct {
    cprange *r;
    int n, cap;
    bool oom;
} cpset;

static void cps_add(cpset *s, uint32_t lo, uint32_t hi)
{
    if (s->oom)
        return;
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        cprange *r = realloc(s->r, (size_t)cap * sizeof *r);
        if (!r) {
            s->oom = true;
            return;
        }
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n].lo = lo;
    s->r[s->n].hi = hi;
    s->n++;
}

static int cmp_range(const void *a, const void *b)
{
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges overlapping or adjacent ranges. */
static void cps_norm(cpset *s)
{
    if (s->n < 2)
        return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cmp_range);
    int k = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi)
                s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
}

/* The complement within 0..U+10FFFF (s normalised). */
static void cps_invert(cpset *s)
{
    cpset t = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next)
            cps_add(&t, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (next <= CP_MAX)
        cps_add(&t, next, CP_MAX);
    t.oom |= s->oom;
    free(s->r);
    *s = t;
}

/* Removes lo..hi (s normalised; stays normalised). */
static void cps_remove(cpset *s, uint32_t lo, uint32_t hi)
{
    cpset t = {0};
    for (int i = 0; i < s->n; i++) {
        cprange r = s->r[i];
        if (r.hi < lo || r.lo > hi) {
            cps_add(&t, r.lo, r.hi);
            continue;
        }
        if (r.lo < lo)
            cps_add(&t, r.lo, lo - 1);
        if (r.hi > hi)
            cps_add(&t, hi + 1, r.hi);
    }
    t.oom |= s->oom;
    free(s->r);
    *s = t;
}

/* What a JSON string may hold unescaped: no ", no \, no control character. */
static void cps_json_only(cpset *s)
{
    cps_remove(s, 0, 0x1F);
    cps_remove(s, '"', '"');
    cps_remove(s, '\\', '\\');
}

static bool cps_single(const cpset *s) { return s->n == 1 && s->r[0].lo == s->r[0].hi; }

static void class_ranges(sbuf *b, const cpset *s)
{
    for (int i = 0; i < s->n; i++) {
        class_cp(b, s->r[i].lo);
        if (s->r[i].hi != s->r[i].lo) {
            if (s->r[i].hi != s->r[i].lo + 1)
                sb_putc(b, '-');
            class_cp(b, s->r[i].hi);
        }
    }
}

/* Writes a normalised non-empty set as a GBNF term: a literal for one
 * character, a class, or a negated class when the set reaches U+10FFFF
 * (whose positive form would need escapes beyond \uHHHH). */
static void put_cpset(sbuf *b, const cpset *s)
{
    if (cps_single(s)) {
        sb_putc(b, '"');
        lit_cp(b, s->r[0].lo);
        sb_putc(b, '"');
        return;
    }
    if (s->r[s->n - 1].hi == CP_MAX) {
        cpset c = {0};
        for (int i = 0; i < s->n; i++)
            cps_add(&c, s->r[i].lo, s->r[i].hi);
        cps_invert(&c);
        if (c.oom) {
            b->oom = true;
        } else if (c.n == 0) {
            sb_putc(b, '.');
        } else {
            sb_puts(b, "[^");
            class_ranges(b, &c);
            sb_putc(b, ']');
        }
        free(c.r);
        return;
    }
    sb_putc(b, '[');
    class_ranges(b, s);
    sb_putc(b, ']');
}

/* Class escapes. A pattern may be checked by an ECMA-262 engine (what JSON
 * Schema specifies) or by Python's re (the jsonschema package, vLLM's
 * users), where \d \w \s are Unicode-wide. So each escape has two sets: the
 * characters it surely matches in both (what \d and [\d] generate: ASCII
 * digits and word characters, the white space both agree on) and those it
 * may match in either; a complement (\D, [^\d]) is taken of the latter, so
 * nothing generated is refused by either engine. */
static const uint32_t space_both[][2] = {
    {0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};
static const uint32_t space_either[][2] = {   /* + Python's \x1C-\x1F \x85, ECMA's U+FEFF */
    {0x09, 0x0D}, {0x1C, 0x20}, {0x85, 0x85}, {0xA0, 0xA0}, {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
    {0xFEFF, 0xFEFF},
};
/* Non-ASCII characters Python's str.isdigit() accepts (a superset of its
 * \d, Unicode 15). */
static const uint32_t digit_unicode[][2] = {
    {0xB2, 0xB3}, {0xB9, 0xB9}, {0x660, 0x669}, {0x6F0, 0x6F9}, {0x7C0, 0x7C9}, {0x966, 0x96F},
    {0x9E6, 0x9EF}, {0xA66, 0xA6F}, {0xAE6, 0xAEF}, {0xB66, 0xB6F}, {0xBE6, 0xBEF},
    {0xC66, 0xC6F}, {0xCE6, 0xCEF}, {0xD66, 0xD6F}, {0xDE6, 0xDEF}, {0xE50, 0xE59},
    {0xED0, 0xED9}, {0xF20, 0xF29}, {0x1040, 0x1049}, {0x1090, 0x1099}, {0x1369, 0x1371},
    {0x17E0, 0x17E9}, {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A89},
    {0x1A90, 0x1A99}, {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59},
    {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2460, 0x2468}, {0x2474, 0x247C},
    {0x2488, 0x2490}, {0x24EA, 0x24EA}, {0x24F5, 0x24FD}, {0x24FF, 0x24FF}, {0x2776, 0x277E},
    {0x2780, 0x2788}, {0x278A, 0x2792}, {0xA620, 0xA629}, {0xA8D0, 0xA8D9}, {0xA900, 0xA909},
    {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9}, {0xFF10, 0xFF19},
    {0x104A0, 0x104A9}, {0x10A40, 0x10A43}, {0x10D30, 0x10D39}, {0x10E60, 0x10E68},
    {0x11052, 0x1105A}, {0x11066, 0x1106F}, {0x110F0, 0x110F9}, {0x11136, 0x1113F},
    {0x111D0, 0x111D9}, {0x112F0, 0x112F9}, {0x11450, 0x11459}, {0x114D0, 0x114D9},
    {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x11730, 0x11739}, {0x118E0, 0x118E9},
    {0x11950, 0x11959}, {0x11C50, 0x11C59}, {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9},
    {0x16A60, 0x16A69}, {0x16AC0, 0x16AC9}, {0x16B50, 0x16B59}, {0x1D7CE, 0x1D7FF},
    {0x1E140, 0x1E149}, {0x1E2F0, 0x1E2F9}, {0x1E950, 0x1E959}, {0x1F100, 0x1F10A},
    {0x1FBF0, 0x1FBF9},
};

/* \d \w \s (lower case l) as surely (either = false) or maybe matched. */
static void cps_escape_base(cpset *t, char l, bool either)
{
    if (l == 'd') {
        cps_add(t, '0', '9');
        for (size_t i = 0; either && i < sizeof digit_unicode / sizeof digit_unicode[0]; i++)
            cps_add(t, digit_unicode[i][0], digit_unicode[i][1]);
    } else if (l == 'w') {
        cps_add(t, '0', '9');
        cps_add(t, 'A', 'Z');
        cps_add(t, '_', '_');
        cps_add(t, 'a', 'z');
        if (either)   /* Python's \w: letters and digits of every script */
            cps_add(t, 0x80, CP_MAX);
    } else if (either) {
        for (size_t i = 0; i < sizeof space_either / sizeof space_either[0]; i++)
            cps_add(t, space_either[i][0], space_either[i][1]);
    } else {
        for (size_t i = 0; i < sizeof space_both / sizeof space_both[0]; i++)
            cps_add(t, space_both[i][0], space_both[i][1]);
    }
    cps_norm(t);
}

/* Adds \d \w \s or (upper case) their complements: the characters surely
 * matched (either = false) or maybe matched. */
static void cps_add_escape_class(cpset *s, char e, bool either)
{
    cpset t = {0};
    char l = (char)(e | 0x20);
    bool neg = e != l;
    /* The complement of what is maybe matched is surely not matched. */
    cps_escape_base(&t, l, neg ? !either : either);
    if (neg)
        cps_invert(&t);
    for (int i = 0; i < t.n; i++)
        cps_add(s, t.r[i].lo, t.r[i].hi);
    s->oom |= t.oom;
    free(t.r);
}

/* ---- regular expressions ---------------------------------------------- */

#define RX_MAX_DEPTH 100
#define RX_MAX_REPEAT 10000

typedef struct {
    const char *s;
    size_t n, i;
    bool json;   /* inside a JSON string: see the top of the file */
    int depth;
    char *err;
    size_t errsz;
    int rc;      /* first error */
} rx_t;

static bool rx_fail(rx_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool rx_fail(rx_t *r, const char *fmt, ...)
{
    if (r->rc)
        return false;
    char msg[DP_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->rc = dp_err(r->err, r->errsz, DP_EINVAL, "regex: %s (at offset %zu)", msg, r->i);
    return false;
}

static bool rx_isdigit(char c) { return c >= '0' && c <= '9'; }

static int rx_hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* k hex digits at s[i]: the value, or -1. */
static long rx_hexn(rx_t *r, size_t at, int k)
{
    long v = 0;
    if (at + (size_t)k > r->n)
        return -1;
    for (int j = 0; j < k; j++) {
        int h = rx_hex(r->s[at + (size_t)j]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

/* An escape after the backslash at r->i (r->i is at the backslash). Sets
 * either *cls (a class escape letter: d D w W s S) or *cp. in_class: \b is
 * a backspace there and a word boundary outside. */
static bool rx_escape(rx_t *r, bool in_class, char *cls, uint32_t *cp)
{
    size_t at = r->i + 1;
    *cls = 0;
    if (at >= r->n)
        return rx_fail(r, "trailing backslash");
    char c = r->s[at];
    r->i = at + 1;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        *cls = c;
        return true;
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case '0':
        if (at + 1 < r->n && rx_isdigit(r->s[at + 1]))
            return rx_fail(r, "octal escapes are not supported");
        *cp = 0;
        return true;
    case 'x': {
        long v = rx_hexn(r, at + 1, 2);
        if (v < 0)
            return rx_fail(r, "\\x needs two hex digits");
        r->i = at + 3;
        *cp = (uint32_t)v;
        return true;
    }
    case 'u': {
        long v;
        if (at + 1 < r->n && r->s[at + 1] == '{') {
            size_t k = at + 2;
            v = 0;
            while (k < r->n && rx_hex(r->s[k]) >= 0 && v <= (long)CP_MAX)
                v = v * 16 + rx_hex(r->s[k++]);
            if (k == at + 2 || k >= r->n || r->s[k] != '}' || v > (long)CP_MAX)
                return rx_fail(r, "bad \\u{...} escape");
            r->i = k + 1;
        } else {
            v = rx_hexn(r, at + 1, 4);
            if (v < 0)
                return rx_fail(r, "\\u needs four hex digits");
            r->i = at + 5;
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return rx_fail(r, "surrogate code points are not supported");
        *cp = (uint32_t)v;
        return true;
    }
    case 'U': {
        long v = rx_hexn(r, at + 1, 8);
        if (v < 0 || v > (long)CP_MAX || (v >= 0xD800 && v <= 0xDFFF))
            return rx_fail(r, "\\U needs eight hex digits of a code point");
        r->i = at + 9;
        *cp = (uint32_t)v;
        return true;
    }
    case 'b':
        if (in_class) {
            *cp = 8;
            return true;
        }
        return rx_fail(r, "word boundaries (\\b) are not supported");
    case 'B':
        return rx_fail(r, "word boundaries (\\B) are not supported");
    case 'A': case 'Z': case 'z': case 'G':
        return rx_fail(r, "anchor \\%c is not supported (use ^ and $ at the ends)", c);
    case 'p': case 'P':
        return rx_fail(r, "unicode property classes (\\%c) are not supported", c);
    case 'k':
        return rx_fail(r, "named backreferences are not supported");
    case 'c':
        return rx_fail(r, "control escapes (\\c) are not supported");
    default:
        if (c >= '1' && c <= '9')
            return rx_fail(r, "backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return rx_fail(r, "unknown escape \\%c", c);
        if ((unsigned char)c >= 0x80) {
            r->i = at;
            if (!utf8_next(r->s, r->n, &r->i, cp))
                return rx_fail(r, "invalid UTF-8");
            return true;
        }
        *cp = (uint32_t)(unsigned char)c;
        return true;
    }
}

/* A [...] class at r->i into s (normalised): what is surely matched, or
 * for a negated class the complement of what may be. */
static bool rx_class(rx_t *r, cpset *s)
{
    r->i++;
    bool neg = false;
    if (r->i < r->n && r->s[r->i] == '^') {
        neg = true;
        r->i++;
    }
    cpset maybe = {0};
    bool first = true, ok = true;
    for (;;) {
        if (r->i >= r->n) {
            ok = rx_fail(r, "unterminated character class");
            break;
        }
        char c = r->s[r->i];
        if (c == ']' && !first) {
            r->i++;
            break;
        }
        first = false;
        uint32_t lo;
        char cls = 0;
        if (c == '\\') {
            if (!(ok = rx_escape(r, true, &cls, &lo)))
                break;
        } else if (!utf8_next(r->s, r->n, &r->i, &lo)) {
            ok = rx_fail(r, "invalid UTF-8");
            break;
        }
        if (cls) {
            cps_add_escape_class(s, cls, false);
            cps_add_escape_class(&maybe, cls, true);
            continue;
        }
        uint32_t hi = lo;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            if (r->s[r->i] == '\\') {
                if (!(ok = rx_escape(r, true, &cls, &hi)))
                    break;
                if (cls) {
                    ok = rx_fail(r, "a class escape cannot end a range");
                    break;
                }
            } else if (!utf8_next(r->s, r->n, &r->i, &hi)) {
                ok = rx_fail(r, "invalid UTF-8");
                break;
            }
            if (hi < lo) {
                ok = rx_fail(r, "bad character range");
                break;
            }
        }
        cps_add(s, lo, hi);
        cps_add(&maybe, lo, hi);
    }
    if (ok && neg) {
        cps_norm(&maybe);
        cps_invert(&maybe);
        free(s->r);
        *s = maybe;
        maybe = (cpset){0};
    }
    free(maybe.r);
    cps_norm(s);
    return ok;
}

/* A quantifier at r->i: true with *lo and *hi (-1: unbounded) when there is
 * one; r->i moves past it. A '{' that does not start {m}, {m,}, {m,n} or
 * {,n} is a literal, as in Python. */
static bool rx_quant(rx_t *r, long *lo, long *hi)
{
    if (r->i >= r->n)
        return false;
    char c = r->s[r->i];
    if (c == '*' || c == '+' || c == '?') {
        *lo = c == '+';
        *hi = c == '?' ? 1 : -1;
        r->i++;
        return true;
    }
    if (c != '{')
        return false;
    size_t k = r->i + 1;
    long a = -1, b = -1;
    bool comma = false;
    while (k < r->n && rx_isdigit(r->s[k])) {
        a = (a < 0 ? 0 : a) * 10 + (r->s[k++] - '0');
        if (a > RX_MAX_REPEAT * 10L)
            a = RX_MAX_REPEAT * 10L;
    }
    if (k < r->n && r->s[k] == ',') {
        comma = true;
        k++;
        while (k < r->n && rx_isdigit(r->s[k])) {
            b = (b < 0 ? 0 : b) * 10 + (r->s[k++] - '0');
            if (b > RX_MAX_REPEAT * 10L)
                b = RX_MAX_REPEAT * 10L;
        }
    }
    if (k >= r->n || r->s[k] != '}' || (a < 0 && b < 0))
        return false;
    if (a < 0)
        a = 0;
    if (!comma)
        b = a;
    *lo = a;
    *hi = b;
    r->i = k + 1;
    return true;
}

/* Whether only the end of the expression can follow r->s[at] (closing
 * parentheses, or alternatives that are skipped): where $ is harmless. */
static bool rx_at_end(const rx_t *r, size_t at)
{
    while (at < r->n) {
        char c = r->s[at];
        if (c == ')') {
            at++;
            continue;
        }
        if (c != '|')
            return false;
        /* Skip the rest of this alternative list at this level. */
        int depth = 0;
        at++;
        while (at < r->n) {
            c = r->s[at];
            if (c == '\\') {
                at += 2;
                continue;
            }
            if (c == '[') {
                at++;
                if (at < r->n && r->s[at] == '^')
                    at++;
                if (at < r->n && r->s[at] == ']')
                    at++;
                while (at < r->n && r->s[at] != ']')
                    at += r->s[at] == '\\' ? 2 : 1;
                at++;
                continue;
            }
            if (c == '(')
                depth++;
            if (c == ')') {
                if (depth == 0)
                    break;
                depth--;
            }
            at++;
        }
    }
    return true;
}

static void rx_postfix(sbuf *b, long lo, long hi)
{
    if (lo == 0 && hi < 0)
        sb_putc(b, '*');
    else if (lo == 1 && hi < 0)
        sb_putc(b, '+');
    else if (lo == 0 && hi == 1)
        sb_putc(b, '?');
    else if (hi < 0)
        sb_printf(b, "{%ld,}", lo);
    else if (lo == hi)
        sb_printf(b, "{%ld}", lo);
    else
        sb_printf(b, "{%ld,%ld}", lo, hi);
}

/* What a parsed piece (an alternative list, a sequence, an item) is: its
 * GBNF text, whether it matches the empty string, and, when it does, a
 * text for its non-empty strings if one is known. The grammar refuses
 * x* for a nullable x (the repetition would be left-recursive), so (a|)*
 * is written ("a")*, and ((a?)(b?))* as ("a" "b"? | "b")*; a nullable
 * piece without that text cannot be repeated without bound. */
typedef struct {
    sbuf text, ne;
    bool empty;      /* matches only the empty string (text is empty) */
    bool nullable;
    bool has_ne;
} rxp;

static void rxp_free(rxp *x)
{
    sb_free(&x->text);
    sb_free(&x->ne);
}

static bool rx_alt(rx_t *r, rxp *out, bool at_start);

/* Writes b's text joined by spaces; parts from..n-1. */
static void join_items(sbuf *out, const rxp *it, int from, int n)
{
    for (int j = from; j < n; j++) {
        if (out->n)
            sb_putc(out, ' ');
        sb_puts(out, sb_str(&it[j].text));
        if (it[j].text.oom)
            out->oom = true;
    }
}

/* One quantified atom into *it; at is the atom's text, nullable whether it
 * matches the empty string, ne (when given) its non-empty text. */
static bool rx_item(rx_t *r, rxp *it, const char *at, bool nullable, const char *ne, long lo,
                    long hi)
{
    bool quant = !(lo == 1 && hi == 1);
    if (!nullable) {
        sb_puts(&it->text, at);
        if (quant)
            rx_postfix(&it->text, lo, hi);
        it->nullable = lo == 0;
        if (it->nullable) {   /* non-empty: at least one */
            it->has_ne = true;
            sb_puts(&it->ne, at);
            if (hi != 1)
                rx_postfix(&it->ne, 1, hi);
        }
        return true;
    }
    it->nullable = true;
    if (ne) {
        /* x{lo,hi} = x'{0,hi} when x is nullable; its non-empty part x'{1,hi}. */
        sb_printf(&it->text, "(%s)", ne);
        rx_postfix(&it->text, 0, hi);
        it->has_ne = true;
        sb_printf(&it->ne, "(%s)", ne);
        if (hi != 1)
            rx_postfix(&it->ne, 1, hi);
        return true;
    }
    if (hi < 0)
        return rx_fail(r, "unbounded repetition of a group that can match the empty string "
                          "is not supported");
    sb_puts(&it->text, at);
    if (quant)
        rx_postfix(&it->text, lo, hi);
    return true;
}

/* One alternative: a sequence of quantified atoms up to | or ) or the end.
 * Single characters without a quantifier are merged into one literal. */
static bool rx_seq(rx_t *r, rxp *out, bool at_start)
{
    rxp *items = NULL;
    int n = 0, cap = 0;
    sbuf lit = {0};
    bool ok = true;
#define RX_PUSH()                                                                  \
    do {                                                                           \
        if (n == cap) {                                                            \
            int c2 = cap ? cap * 2 : 8;                                            \
            rxp *t2 = realloc(items, (size_t)c2 * sizeof *items);                  \
            if (!t2) {                                                             \
                ok = false;                                                        \
                r->rc = dp_err(r->err, r->errsz, DP_ENOMEM, "out of memory");      \
                break;                                                             \
            }                                                                      \
            items = t2;                                                            \
            cap = c2;                                                              \
        }                                                                          \
        memset(&items[n], 0, sizeof items[n]);                                     \
        n++;                                                                       \
    } while (0)
#define RX_FLUSH()                                                                 \
    do {                                                                           \
        if (lit.n) {                                                               \
            RX_PUSH();                                                             \
            if (!ok)                                                               \
                break;                                                             \
            sb_printf(&items[n - 1].text, "\"%s\"", sb_str(&lit));                 \
            lit.n = 0;                                                             \
        }                                                                          \
    } while (0)
    while (ok && r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        char c = r->s[r->i];
        if (c == '^') {
            if (!at_start) {
                ok = rx_fail(r, "^ is only supported at the start");
                break;
            }
            r->i++;
            continue;
        }
        if (c == '$') {
            if (!rx_at_end(r, r->i + 1)) {
                ok = rx_fail(r, "$ is only supported at the end");
                break;
            }
            r->i++;
            continue;
        }
        rxp group = {0};
        bool is_group = false, is_set = false;
        cpset set = {0};
        long lo, hi;
        if (c == '(') {
            size_t at = r->i;
            r->i++;
            if (r->i < r->n && r->s[r->i] == '?') {
                const char *p = r->s + r->i;
                size_t left = r->n - r->i;
                if (left >= 2 && p[1] == ':') {
                    r->i += 2;
                } else {
                    r->i = at;
                    if (left >= 2 && (p[1] == '=' || p[1] == '!'))
                        ok = rx_fail(r, "lookahead is not supported");
                    else if (left >= 3 && p[1] == '<' && (p[2] == '=' || p[2] == '!'))
                        ok = rx_fail(r, "lookbehind is not supported");
                    else if (left >= 3 && p[1] == 'P' && p[2] == '=')
                        ok = rx_fail(r, "backreferences are not supported");
                    else if (left >= 2 && (p[1] == '<' || p[1] == 'P' || p[1] == '\''))
                        ok = rx_fail(r, "named groups are not supported");
                    else if (left >= 2 && p[1] == '#')
                        ok = rx_fail(r, "comments are not supported");
                    else
                        ok = rx_fail(r, "inline flags and (?...) groups are not supported");
                    break;
                }
            }
            if (++r->depth > RX_MAX_DEPTH) {
                ok = rx_fail(r, "groups nested too deeply");
                break;
            }
            is_group = true;
            ok = rx_alt(r, &group, at_start);
            r->depth--;
            if (ok && (r->i >= r->n || r->s[r->i] != ')')) {
                r->i = at;
                ok = rx_fail(r, "missing )");
            }
            if (ok)
                r->i++;
        } else if (c == '[') {
            is_set = true;
            ok = rx_class(r, &set);
        } else if (c == '.') {
            is_set = true;
            cps_add(&set, '\n', '\n');
            cps_add(&set, '\r', '\r');
            cps_add(&set, 0x2028, 0x2029);
            cps_norm(&set);
            cps_invert(&set);
            r->i++;
        } else if (c == '\\') {
            char cls;
            uint32_t cp;
            is_set = true;
            ok = rx_escape(r, false, &cls, &cp);
            if (ok && cls)
                cps_add_escape_class(&set, cls, false);
            else if (ok)
                cps_add(&set, cp, cp);
            cps_norm(&set);
        } else if (c == '*' || c == '+' || c == '?') {
            ok = rx_fail(r, "nothing to repeat");
        } else if (c == '{' && rx_quant(r, &lo, &hi)) {
            ok = rx_fail(r, "nothing to repeat");
        } else {
            uint32_t cp;
            is_set = true;
            if (!utf8_next(r->s, r->n, &r->i, &cp))
                ok = rx_fail(r, "invalid UTF-8");
            else
                cps_add(&set, cp, cp);
        }
        if (ok && is_set) {
            if (set.oom) {
                ok = false;
                r->rc = dp_err(r->err, r->errsz, DP_ENOMEM, "out of memory");
            } else if (r->json) {
                cps_json_only(&set);
                if (set.n == 0)
                    ok = rx_fail(r, "the pattern needs a '\"', '\\' or control character, "
                                    "which must be escaped inside a JSON string: not supported");
            } else if (set.n == 0) {
                ok = rx_fail(r, "empty character class");
            }
        }
        /* Quantifier. */
        lo = hi = 1;
        if (ok && rx_quant(r, &lo, &hi)) {
            if (r->i < r->n && r->s[r->i] == '?')
                ok = rx_fail(r, "lazy quantifiers are not supported");
            else if (r->i < r->n && r->s[r->i] == '+')
                ok = rx_fail(r, "possessive quantifiers are not supported");
            else if (hi >= 0 && hi < lo)
                ok = rx_fail(r, "bad repetition bounds");
            else if (lo > RX_MAX_REPEAT || hi > RX_MAX_REPEAT)
                ok = rx_fail(r, "repetition count above %d", RX_MAX_REPEAT);
            else {
                long l2, h2;
                size_t save = r->i;
                if (rx_quant(r, &l2, &h2))
                    ok = rx_fail(r, "multiple repeat");
                r->i = save;
            }
        }
        bool skip = hi == 0 || (is_group && group.empty);   /* matches only "" */
        if (ok && !skip) {
            if (is_set && lo == 1 && hi == 1 && cps_single(&set)) {
                lit_cp(&lit, set.r[0].lo);
            } else {
                RX_FLUSH();
                if (ok)
                    RX_PUSH();
                if (ok) {
                    sbuf at = {0};
                    if (is_set)
                        put_cpset(&at, &set);
                    else
                        sb_printf(&at, "(%s)", sb_str(&group.text));
                    sbuf ne = {0};
                    if (is_group && group.nullable && group.has_ne)
                        sb_puts(&ne, sb_str(&group.ne));
                    ok = rx_item(r, &items[n - 1], sb_str(&at), is_group && group.nullable,
                                 is_group && group.has_ne ? sb_str(&ne) : NULL, lo, hi);
                    if (at.oom || ne.oom || group.text.oom || group.ne.oom)
                        items[n - 1].text.oom = true;
                    sb_free(&at);
                    sb_free(&ne);
                }
            }
        }
        at_start = false;
        free(set.r);
        rxp_free(&group);
    }
    if (ok)
        RX_FLUSH();
#undef RX_FLUSH
#undef RX_PUSH
    if (lit.oom)
        out->text.oom = true;
    sb_free(&lit);
    if (ok) {
        join_items(&out->text, items, 0, n);
        out->empty = n == 0;
        out->nullable = true;
        out->has_ne = true;
        for (int j = 0; j < n; j++) {
            out->nullable &= items[j].nullable;
            out->has_ne &= items[j].has_ne;
        }
        /* Non-empty strings of a nullable I1 .. Ik: some first Ij is
         * non-empty, those before it empty: the union of Ij' Ij+1 .. Ik. */
        if (out->nullable && !out->empty && out->has_ne) {
            for (int j = 0; j < n; j++) {
                if (j)
                    sb_puts(&out->ne, " | ");
                sb_puts(&out->ne, sb_str(&items[j].ne));
                sbuf rest = {0};
                join_items(&rest, items, j + 1, n);
                if (rest.n)
                    sb_printf(&out->ne, " %s", sb_str(&rest));
                if (rest.oom || items[j].ne.oom)
                    out->ne.oom = true;
                sb_free(&rest);
            }
        }
        if (!out->nullable || out->empty)
            out->has_ne = false;
    }
    for (int j = 0; j < n; j++)
        rxp_free(&items[j]);
    free(items);
    return ok;
}

/* Alternatives; an empty one makes the whole optional. */
static bool rx_alt(rx_t *r, rxp *out, bool at_start)
{
    bool any_empty = false, ok = true, ne_known = true, any_nullable = false;
    int nonempty = 0;
    sbuf alts = {0}, ne = {0};
    for (;;) {
        rxp seq = {0};
        ok = rx_seq(r, &seq, at_start);
        if (ok) {
            if (seq.empty) {
                any_empty = true;
            } else {
                if (nonempty++) {
                    sb_puts(&alts, " | ");
                    sb_puts(&ne, " | ");
                }
                sb_puts(&alts, sb_str(&seq.text));
                /* the non-empty strings of this alternative */
                if (!seq.nullable)
                    sb_puts(&ne, sb_str(&seq.text));
                else if (seq.has_ne)
                    sb_puts(&ne, sb_str(&seq.ne));
                else
                    ne_known = false;
                any_nullable |= seq.nullable;
            }
        }
        if (seq.text.oom || seq.ne.oom)
            alts.oom = true;
        rxp_free(&seq);
        if (!ok || r->i >= r->n || r->s[r->i] != '|')
            break;
        r->i++;
    }
    if (ok && nonempty) {
        if (any_empty) {
            sb_printf(&out->text, "(%s)?", sb_str(&alts));
        } else {
            sb_puts(&out->text, sb_str(&alts));
        }
        out->nullable = any_empty || any_nullable;
        out->has_ne = out->nullable && ne_known;
        if (out->has_ne)
            sb_puts(&out->ne, sb_str(&ne));
    }
    if (alts.oom || ne.oom)
        out->text.oom = true;
    sb_free(&alts);
    sb_free(&ne);
    out->empty = nonempty == 0;
    if (out->empty)
        out->nullable = true;
    return ok;
}

/* The whole expression into out (a sequence, possibly with top-level |:
 * the caller parenthesises it where needed); *empty when it matches only
 * the empty string. */
static int regex_expr(const char *re, size_t len, bool json, sbuf *out, bool *empty, char *err,
                      size_t errsz)
{
    rx_t r = {.s = re, .n = len, .json = json, .err = err, .errsz = errsz};
    if (!re)
        return dp_err(err, errsz, DP_EINVAL, "regex: missing");
    rxp x = {0};
    bool ok = rx_alt(&r, &x, true);
    if (ok && r.i < r.n)   /* a ')' without its '(' */
        ok = rx_fail(&r, "unbalanced )");
    *empty = x.empty;
    sb_puts(out, sb_str(&x.text));
    if (x.text.oom)
        out->oom = true;
    rxp_free(&x);
    if (!ok)
        return r.rc ? r.rc : DP_EINVAL;
    if (out->oom)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    return 0;
}

int regex_to_gbnf(const char *re, size_t len, char **out, char *err, size_t errsz)
{
    *out = NULL;
    sbuf e = {0};
    bool empty;
    int rc = regex_expr(re, len, false, &e, &empty, err, errsz);
    if (rc) {
        sb_free(&e);
        return rc;
    }
    if (empty) {
        sb_free(&e);
        return dp_err(err, errsz, DP_EINVAL, "regex: matches only the empty string");
    }
    sbuf g = {0};
    sb_puts(&g, "root ::= ");
    sb_puts(&g, sb_str(&e));
    sb_putc(&g, '\n');
    if (e.oom)
        g.oom = true;
    sb_free(&e);
    return sb_take(&g, out, err, errsz);
}

/* ---- choices ---------------------------------------------------------- */

int choice_to_gbnf(const char *const *choices, int n, char **out, char *err, size_t errsz)
{
    *out = NULL;
    if (!choices || n <= 0)
        return dp_err(err, errsz, DP_EINVAL, "guided_choice: no choices");
    sbuf alts = {0};
    bool any_empty = false;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!choices[i]) {
            sb_free(&alts);
            return dp_err(err, errsz, DP_EINVAL, "guided_choice: choice %d is missing", i);
        }
        size_t len = strlen(choices[i]);
        if (len == 0) {
            any_empty = true;
            continue;
        }
        if (k++)
            sb_puts(&alts, " | ");
        if (!put_literal(&alts, choices[i], len)) {
            sb_free(&alts);
            return dp_err(err, errsz, DP_EINVAL, "guided_choice: choice %d is not UTF-8", i);
        }
    }
    if (k == 0) {
        sb_free(&alts);
        return dp_err(err, errsz, DP_EINVAL, "guided_choice: only empty choices");
    }
    sbuf g = {0};
    sb_puts(&g, "root ::= ");
    if (any_empty)
        sb_putc(&g, '(');
    sb_puts(&g, sb_str(&alts));
    if (any_empty)
        sb_puts(&g, ")?");
    sb_putc(&g, '\n');
    if (alts.oom)
        g.oom = true;
    sb_free(&alts);
    return sb_take(&g, out, err, errsz);
}

/* ---- JSON Schema ------------------------------------------------------ */

/* Shared rules, written once at the end for those used. */
enum {
    NEED_WS = 1 << 0,
    NEED_CHAR = 1 << 1,
    NEED_STRING = 1 << 2,
    NEED_INT = 1 << 3,
    NEED_NUMBER = 1 << 4,
    NEED_VALUE = 1 << 5,
    NEED_OBJECT = 1 << 6,
    NEED_ARRAY = 1 << 7,
    NEED_KEYCHAR = 1 << 8,
    NEED_DATE = 1 << 9,
    NEED_TIME = 1 << 10,
    NEED_DATETIME = 1 << 11,
    NEED_UUID = 1 << 12,
    NEED_FRAC = 1 << 13,
};

static const struct {
    unsigned bit;
    const char *text;
} shared_rules[] = {
    {NEED_WS, "ws ::= ([ \\t] | \"\\n\" [ \\t]{0,20})?\n"},
    /* \u escapes of surrogates are left out: a pair is one character to a
     * validator but two here (minLength), and a lone one is no character. */
    {NEED_CHAR, "json-char ::= [^\\x22\\x5C\\x00-\\x1F] | \"\\\\\" ([\\x22\\x5C/bfnrt] | \"u\" "
                "([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))\n"},
    {NEED_KEYCHAR, "json-keychar ::= [^\\x22\\x5C\\x00-\\x1F]\n"},
    {NEED_STRING, "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"},
    {NEED_INT, "json-int ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"},
    {NEED_FRAC, "json-frac ::= \".\" [0-9]{1,16}\n"},
    {NEED_NUMBER, "json-number ::= json-int json-frac? ([eE] [+\\x2D]? [0-9]{1,3})?\n"},
    {NEED_VALUE, "json-value ::= json-object | json-array | json-string | json-number | "
                 "\"true\" | \"false\" | \"null\"\n"},
    {NEED_OBJECT, "json-object ::= \"{\" ws (json-string ws \":\" ws json-value (ws \",\" ws "
                  "json-string ws \":\" ws json-value)* ws)? \"}\"\n"},
    {NEED_ARRAY, "json-array ::= \"[\" ws (json-value (ws \",\" ws json-value)* ws)? \"]\"\n"},
    {NEED_DATE, "fmt-year ::= \"000\" [1-9] | \"00\" [1-9] [0-9] | \"0\" [1-9] [0-9]{2} | "
                "[1-9] [0-9]{3}\n"
                "fmt-leap4 ::= \"0\" [48] | [2468] [048] | [13579] [26]\n"
                "fmt-leap ::= [0-9]{2} fmt-leap4 | fmt-leap4 \"00\"\n"
                "fmt-d28 ::= \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]\n"
                "fmt-date ::= fmt-year \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (fmt-d28 | \"29\" "
                "| \"3\" [01]) | (\"0\" [469] | \"11\") \"-\" (fmt-d28 | \"29\" | \"30\") | "
                "\"02-\" fmt-d28) | fmt-leap \"-02-29\"\n"},
    {NEED_TIME, "fmt-hour ::= [01] [0-9] | \"2\" [0-3]\n"
                "fmt-time ::= fmt-hour \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                "(\"Z\" | [+\\x2D] fmt-hour \":\" [0-5] [0-9])\n"},
    {NEED_DATETIME, "fmt-date-time ::= fmt-date \"T\" fmt-time\n"},
    {NEED_UUID, "fmt-uuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                "[0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}\n"},
};

static unsigned need_closure(unsigned need)
{
    if (need & NEED_VALUE)
        need |= NEED_OBJECT | NEED_ARRAY | NEED_STRING | NEED_NUMBER;
    if (need & NEED_OBJECT)
        need |= NEED_STRING | NEED_WS | NEED_VALUE;
    if (need & NEED_ARRAY)
        need |= NEED_WS | NEED_VALUE;
    if (need & NEED_VALUE)
        need |= NEED_OBJECT | NEED_ARRAY | NEED_STRING | NEED_NUMBER;
    if (need & NEED_NUMBER)
        need |= NEED_INT | NEED_FRAC;
    if (need & NEED_STRING)
        need |= NEED_CHAR;
    if (need & NEED_DATETIME)
        need |= NEED_DATE | NEED_TIME;
    return need;
}

static void put_shared(sbuf *b, unsigned need)
{
    need = need_closure(need);
    for (size_t i = 0; i < sizeof shared_rules / sizeof shared_rules[0]; i++)
        if (need & shared_rules[i].bit)
            sb_puts(b, shared_rules[i].text);
}

int schema_json_object_gbnf(char **out, char *err, size_t errsz)
{
    *out = NULL;
    sbuf g = {0};
    sb_puts(&g, "root ::= json-object\n");
    put_shared(&g, NEED_OBJECT);
    return sb_take(&g, out, err, errsz);
}

#define S_MAX_DEPTH 64
#define S_PATH 512
#define S_NAME 64
#define S_MAX_DIGITS 16
#define S_MAX_REPEAT 100000
static const int64_t S_MAXV = 9999999999999999LL;   /* 16 digits */

typedef struct {
    const cJSON *target;
    char name[S_NAME];
} sref;

typedef struct {
    sbuf rules;
    const cJSON *root;
    int nrule;
    sref *refs;
    int nrefs, caprefs;
    unsigned need;
    int depth;
    char *perr;
    size_t perrsz;
    char *err;
    size_t errsz;
} sctx;

/* A dotted path; a very long one is cut (it only names things in messages). */
static void path_join(char *dst, size_t n, const char *path, const char *key)
{
    size_t k = 0;
    for (const char *q = path; *q && k + 1 < n; q++)
        dst[k++] = *q;
    if (*path && k + 1 < n)
        dst[k++] = '.';
    for (const char *q = key; *q && k + 1 < n; q++)
        dst[k++] = *q;
    if (n)
        dst[k] = 0;
}

/* DP_EINVAL naming path.kw: the message is fmt followed by " at <path>". */
static int s_fail(sctx *c, const char *path, const char *kw, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int s_fail(sctx *c, const char *path, const char *kw, const char *fmt, ...)
{
    char msg[DP_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->perr && c->perrsz) {
        if (kw && *kw)
            path_join(c->perr, c->perrsz, path, kw);
        else
            snprintf(c->perr, c->perrsz, "%s", path);
    }
    return dp_err(c->err, c->errsz, DP_EINVAL, "%s at %s", msg, *path ? path : "the top level");
}

static int s_oom(sctx *c)
{
    return dp_err(c->err, c->errsz, DP_ENOMEM, "out of memory converting a JSON Schema");
}

/* A fresh rule name, with a hint from the schema path for readability. */
static void new_name(sctx *c, const char *hint, char *name)
{
    int k = snprintf(name, S_NAME, "r%d", c->nrule++);
    const char *h = strrchr(hint, '.');
    h = h ? h + 1 : hint;
    if (!*h)
        return;
    name[k++] = '-';
    for (int j = 0; h[j] && k < 24; j++) {
        char ch = h[j];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        name[k++] = ok ? ch : '-';
    }
    name[k] = 0;
}

static void put_rule(sctx *c, const char *name, const sbuf *body)
{
    sb_puts(&c->rules, name);
    sb_puts(&c->rules, " ::= ");
    sb_puts(&c->rules, sb_str(body));
    sb_putc(&c->rules, '\n');
    if (body->oom)
        c->rules.oom = true;
}

static const char *const annotations[] = {
    "title", "description", "default", "examples", "example", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "strict", "name", "$defs", "definitions",
    "discriminator",
};

static bool is_annotation(const char *k)
{
    if (k[0] == 'x' && k[1] == '-')   /* vendor extensions */
        return true;
    for (size_t i = 0; i < sizeof annotations / sizeof annotations[0]; i++)
        if (!strcmp(k, annotations[i]))
            return true;
    return false;
}

enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_INTEGER = 8, T_NUMBER = 16, T_BOOLEAN = 32,
       T_NULL = 64 };

static const struct {
    const char *kw;
    int kind;   /* the type it applies to; 0: not type-specific */
} keywords[] = {
    {"type", 0}, {"enum", 0}, {"const", 0}, {"anyOf", 0}, {"oneOf", 0}, {"allOf", 0},
    {"$ref", 0},
    {"properties", T_OBJECT}, {"required", T_OBJECT}, {"additionalProperties", T_OBJECT},
    {"items", T_ARRAY}, {"prefixItems", T_ARRAY}, {"additionalItems", T_ARRAY},
    {"minItems", T_ARRAY}, {"maxItems", T_ARRAY},
    {"minLength", T_STRING}, {"maxLength", T_STRING}, {"pattern", T_STRING},
    {"format", T_STRING},
    {"minimum", T_NUMBER}, {"maximum", T_NUMBER}, {"exclusiveMinimum", T_NUMBER},
    {"exclusiveMaximum", T_NUMBER},
};

/* The keyword's kind, 0 for a general one, -1 when unsupported. */
static int keyword_kind(const char *k)
{
    for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
        if (!strcmp(k, keywords[i].kw))
            return keywords[i].kind;
    return -1;
}

static int gen(sctx *c, const cJSON *s, const char *path, char *name);

/* Reads a non-negative integer keyword: 0 (found or not, *v set when found),
 * or an error. */
static int get_count(sctx *c, const cJSON *s, const char *path, const char *kw, bool *has,
                     long *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, kw);
    *has = false;
    if (!x)
        return 0;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble))
        return s_fail(c, path, kw, "'%s' must be a non-negative integer", kw);
    if (x->valuedouble > S_MAX_REPEAT)
        return s_fail(c, path, kw, "'%s' above %d is not supported", kw, S_MAX_REPEAT);
    *has = true;
    *v = (long)x->valuedouble;
    return 0;
}

/* A JSON value as a literal of its compact serialisation. */
static int put_json_literal(sctx *c, sbuf *e, const cJSON *v, const char *path, const char *kw)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t)
        return s_oom(c);
    bool ok = put_literal(e, t, strlen(t));
    free(t);
    if (!ok)
        return s_fail(c, path, kw, "a value of '%s' is not UTF-8", kw);
    return 0;
}

/* Quoted JSON text of a property name, as a literal. */
static int put_key_literal(sctx *c, sbuf *e, const char *key, const char *path)
{
    cJSON *k = cJSON_CreateString(key);
    if (!k)
        return s_oom(c);
    int rc = put_json_literal(c, e, k, path, "properties");
    cJSON_Delete(k);
    return rc;
}

static bool value_has_type(const cJSON *v, int types)
{
    if (cJSON_IsString(v))
        return types & T_STRING;
    if (cJSON_IsNumber(v))
        return (types & T_NUMBER) ||
               ((types & T_INTEGER) && v->valuedouble == floor(v->valuedouble) &&
                fabs(v->valuedouble) < 1e300);
    if (cJSON_IsBool(v))
        return types & T_BOOLEAN;
    if (cJSON_IsNull(v))
        return types & T_NULL;
    if (cJSON_IsObject(v))
        return types & T_OBJECT;
    if (cJSON_IsArray(v))
        return types & T_ARRAY;
    return false;
}

/* "type": a string or a non-empty array of type names, into *types. */
static int get_types(sctx *c, const cJSON *s, const char *path, int *types)
{
    static const char *const names[] = {"object", "array", "string", "integer", "number",
                                        "boolean", "null"};
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    *types = 0;
    if (!t)
        return 0;
    const cJSON *one = t;
    bool arr = cJSON_IsArray(t);
    if (arr) {
        one = t->child;
        if (!one)
            return s_fail(c, path, "type", "'type' must not be an empty array");
    }
    for (; one; one = arr ? one->next : NULL) {
        int bit = 0;
        if (cJSON_IsString(one))
            for (int i = 0; i < 7; i++)
                if (!strcmp(one->valuestring, names[i]))
                    bit = 1 << i;
        if (!bit)
            return s_fail(c, path, "type", "unsupported 'type' value");
        *types |= bit;
    }
    return 0;
}

/* enum and const, filtered by type when given. */
static int gen_enum(sctx *c, const cJSON *s, const char *path, int types, sbuf *e)
{
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en && (!cJSON_IsArray(en) || !en->child))
        return s_fail(c, path, "enum", "'enum' must be a non-empty array");
    int k = 0;
    if (cn) {
        bool in_enum = !en;
        for (const cJSON *v = en ? en->child : NULL; v && !in_enum; v = v->next)
            in_enum = cJSON_Compare(v, cn, true);
        if (in_enum && (!types || value_has_type(cn, types))) {
            int rc = put_json_literal(c, e, cn, path, "const");
            if (rc)
                return rc;
            k++;
        }
    } else {
        for (const cJSON *v = en->child; v; v = v->next) {
            if (types && !value_has_type(v, types))
                continue;
            if (k++)
                sb_puts(e, " | ");
            int rc = put_json_literal(c, e, v, path, "enum");
            if (rc)
                return rc;
        }
    }
    if (!k)
        return s_fail(c, path, cn ? "const" : "enum",
                      "no value of '%s' satisfies the schema", cn ? "const" : "enum");
    return 0;
}

/* ---- numbers ---------------------------------------------------------- */

static void digit_class(sbuf *e, int a, int b)
{
    if (a == b)
        sb_printf(e, "\"%d\"", a);
    else if (b == a + 1)
        sb_printf(e, "[%d%d]", a, b);
    else
        sb_printf(e, "[%d-%d]", a, b);
}

static bool all_of(const char *s, int n, char d)
{
    for (int i = 0; i < n; i++)
        if (s[i] != d)
            return false;
    return true;
}

/* Digit strings of length n from lo to hi (same length, lo <= hi). */
static void same_len(sbuf *e, const char *lo, const char *hi, int n)
{
    if (n == 0)
        return;
    if (all_of(lo, n, '0') && all_of(hi, n, '9')) {
        sb_puts(e, "[0-9]");
        if (n > 1)
            sb_printf(e, "{%d}", n);
        return;
    }
    if (lo[0] == hi[0]) {
        sb_printf(e, "\"%c\"", lo[0]);
        if (n > 1) {
            sb_putc(e, ' ');
            same_len(e, lo + 1, hi + 1, n - 1);
        }
        return;
    }
    /* lo[0] then [lo+1, 9..9]; the digits between then anything; hi[0] then
     * [0..0, hi+1]. A first or last part that is "anything" joins the middle. */
    int a = lo[0] - '0', b = hi[0] - '0';
    int mid_lo = a + 1, mid_hi = b - 1;
    bool lo_full = all_of(lo + 1, n - 1, '0'), hi_full = all_of(hi + 1, n - 1, '9');
    if (lo_full)
        mid_lo = a;
    if (hi_full)
        mid_hi = b;
    int k = 0;
    sb_putc(e, '(');
    if (!lo_full) {
        sb_printf(e, "\"%c\" ", lo[0]);
        char nines[S_MAX_DIGITS + 1];
        memset(nines, '9', sizeof nines);
        same_len(e, lo + 1, nines, n - 1);
        k++;
    }
    if (mid_lo <= mid_hi) {
        if (k++)
            sb_puts(e, " | ");
        digit_class(e, mid_lo, mid_hi);
        if (n > 1) {
            sb_puts(e, " [0-9]");
            if (n > 2)
                sb_printf(e, "{%d}", n - 1);
        }
    }
    if (!hi_full) {
        if (k++)
            sb_puts(e, " | ");
        sb_printf(e, "\"%c\" ", hi[0]);
        char zeros[S_MAX_DIGITS + 1];
        memset(zeros, '0', sizeof zeros);
        same_len(e, zeros, hi + 1, n - 1);
    }
    sb_putc(e, ')');
}

static int64_t pow10i(int k)
{
    int64_t p = 1;
    while (k-- > 0)
        p *= 10;
    return p;
}

/* Alternatives (joined by " | ", appended after *k earlier ones) for the
 * decimal numerals without leading zeros from a to b, 0 <= a <= b <= S_MAXV. */
static void digits_range(sbuf *e, int64_t a, int64_t b, int *k)
{
    for (int len = 1; len <= S_MAX_DIGITS; len++) {
        int64_t first = len == 1 ? 0 : pow10i(len - 1), last = pow10i(len) - 1;
        int64_t lo = a > first ? a : first, hi = b < last ? b : last;
        if (lo > hi)
            continue;
        if (*k)
            sb_puts(e, " | ");
        (*k)++;
        if (len > 1 && lo == first && hi == last) {
            /* Whole lengths len..len2 at once. */
            int len2 = len;
            while (len2 < S_MAX_DIGITS && b >= pow10i(len2 + 1) - 1)
                len2++;
            sb_puts(e, "[1-9] [0-9]");
            if (len2 == len)
                sb_printf(e, "{%d}", len - 1);
            else
                sb_printf(e, "{%d,%d}", len - 1, len2 - 1);
            len = len2;
            continue;
        }
        char ls[24], hs[24];
        snprintf(ls, sizeof ls, "%lld", (long long)lo);
        snprintf(hs, sizeof hs, "%lld", (long long)hi);
        same_len(e, ls, hs, len);
    }
}

typedef struct {
    bool has_lo, lo_excl, has_hi, hi_excl;
    double lo, hi;
} nbounds;

static int get_bounds(sctx *c, const cJSON *s, const char *path, nbounds *nb)
{
    memset(nb, 0, sizeof *nb);
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    const cJSON *emn = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum");
    const cJSON *emx = cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum");
    if (cJSON_GetObjectItemCaseSensitive(s, "multipleOf"))
        return s_fail(c, path, "multipleOf", "unsupported JSON Schema keyword 'multipleOf'");
    const cJSON *chk[] = {mn, mx};
    const char *names[] = {"minimum", "maximum"};
    for (int i = 0; i < 2; i++)
        if (chk[i] && !cJSON_IsNumber(chk[i]))
            return s_fail(c, path, names[i], "'%s' must be a number", names[i]);
    if (mn) {
        nb->has_lo = true;
        nb->lo = mn->valuedouble;
    }
    if (mx) {
        nb->has_hi = true;
        nb->hi = mx->valuedouble;
    }
    /* Draft 4: a boolean modifies minimum/maximum; later drafts: a bound. */
    if (emn) {
        if (cJSON_IsBool(emn)) {
            if (!mn && cJSON_IsTrue(emn))
                return s_fail(c, path, "exclusiveMinimum",
                              "boolean 'exclusiveMinimum' without 'minimum'");
            nb->lo_excl = cJSON_IsTrue(emn);
        } else if (cJSON_IsNumber(emn)) {
            if (!nb->has_lo || emn->valuedouble >= nb->lo) {
                nb->has_lo = true;
                nb->lo = emn->valuedouble;
                nb->lo_excl = true;
            }
        } else {
            return s_fail(c, path, "exclusiveMinimum", "'exclusiveMinimum' must be a number");
        }
    }
    if (emx) {
        if (cJSON_IsBool(emx)) {
            if (!mx && cJSON_IsTrue(emx))
                return s_fail(c, path, "exclusiveMaximum",
                              "boolean 'exclusiveMaximum' without 'maximum'");
            nb->hi_excl = cJSON_IsTrue(emx);
        } else if (cJSON_IsNumber(emx)) {
            if (!nb->has_hi || emx->valuedouble <= nb->hi) {
                nb->has_hi = true;
                nb->hi = emx->valuedouble;
                nb->hi_excl = true;
            }
        } else {
            return s_fail(c, path, "exclusiveMaximum", "'exclusiveMaximum' must be a number");
        }
    }
    return 0;
}

/* The keyword that set a bound, for messages. */
static const char *bound_kw(const cJSON *s, bool lower)
{
    const char *ex = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, ex);
    return x && cJSON_IsNumber(x) ? ex : lower ? "minimum" : "maximum";
}

static int gen_integer(sctx *c, const cJSON *s, const char *path, sbuf *e)
{
    nbounds nb;
    int rc = get_bounds(c, s, path, &nb);
    if (rc)
        return rc;
    if (!nb.has_lo && !nb.has_hi) {
        c->need |= NEED_INT;
        sb_puts(e, "json-int");
        return 0;
    }
    /* Inclusive integer bounds, clamped to the 16 digits generated. */
    int64_t lo = -S_MAXV, hi = S_MAXV;
    if (nb.has_lo) {
        double v = nb.lo_excl ? floor(nb.lo) + 1 : ceil(nb.lo);
        if (v > (double)S_MAXV)
            return s_fail(c, path, bound_kw(s, true), "'%s' beyond 16 digits is not supported",
                          bound_kw(s, true));
        if (v > (double)-S_MAXV)
            lo = (int64_t)v;
    }
    if (nb.has_hi) {
        double v = nb.hi_excl ? ceil(nb.hi) - 1 : floor(nb.hi);
        if (v < (double)-S_MAXV)
            return s_fail(c, path, bound_kw(s, false), "'%s' beyond 16 digits is not supported",
                          bound_kw(s, false));
        if (v < (double)S_MAXV)
            hi = (int64_t)v;
    }
    if (lo > hi)
        return s_fail(c, path, bound_kw(s, true), "no integer satisfies the bounds");
    int k = 0;
    sb_putc(e, '(');
    if (hi >= 0)
        digits_range(e, lo > 0 ? lo : 0, hi, &k);
    if (lo < 0) {
        if (k++)
            sb_puts(e, " | ");
        int k2 = 0;
        sb_puts(e, "\"-\" (");
        digits_range(e, hi < 0 ? -hi : 1, -lo, &k2);
        sb_putc(e, ')');
    }
    sb_putc(e, ')');
    return 0;
}

/* Magnitudes m (no sign, no exponent) with L <(=) m <(=) U, integers
 * 0 <= L, U <= S_MAXV; alternatives appended after *k earlier ones. */
static void magnitudes(sbuf *e, int64_t L, bool lexcl, bool has_u, int64_t U, bool uexcl, int *k)
{
    int64_t a = lexcl ? L + 1 : L, b = has_u ? U - 1 : S_MAXV;
    if (a <= b) {
        if (*k)
            sb_puts(e, " | ");
        (*k)++;
        int k2 = 0;
        sb_putc(e, '(');
        digits_range(e, a, b, &k2);
        sb_puts(e, ") json-frac?");
    }
    if (lexcl && (!has_u || U > L)) {   /* L itself with a fraction that is not zero */
        if ((*k)++)
            sb_puts(e, " | ");
        sb_printf(e, "\"%lld.\" [0-9]{0,15} [1-9]", (long long)L);
    }
    if (has_u && !uexcl && (U > L || (U == L && !lexcl))) {   /* U with a zero fraction */
        if ((*k)++)
            sb_puts(e, " | ");
        sb_printf(e, "\"%lld\" (\".\" \"0\"{1,16})?", (long long)U);
    }
}

static int gen_number(sctx *c, const cJSON *s, const char *path, sbuf *e)
{
    nbounds nb;
    int rc = get_bounds(c, s, path, &nb);
    if (rc)
        return rc;
    if (!nb.has_lo && !nb.has_hi) {
        c->need |= NEED_NUMBER;
        sb_puts(e, "json-number");
        return 0;
    }
    /* Integer bounds only; beyond 16 digits a bound is no bound (or none
     * of the numbers generated fits). */
    int64_t lo = 0, hi = 0;
    if (nb.has_lo) {
        if (nb.lo != floor(nb.lo))
            return s_fail(c, path, bound_kw(s, true),
                          "unsupported JSON Schema keyword '%s' with a value that is not an "
                          "integer (for type number)", bound_kw(s, true));
        if (nb.lo >= (double)S_MAXV)
            return s_fail(c, path, bound_kw(s, true), "'%s' beyond 16 digits is not supported",
                          bound_kw(s, true));
        if (nb.lo <= (double)-S_MAXV)
            nb.has_lo = false;
        else
            lo = (int64_t)nb.lo;
    }
    if (nb.has_hi) {
        if (nb.hi != floor(nb.hi))
            return s_fail(c, path, bound_kw(s, false),
                          "unsupported JSON Schema keyword '%s' with a value that is not an "
                          "integer (for type number)", bound_kw(s, false));
        if (nb.hi <= (double)-S_MAXV)
            return s_fail(c, path, bound_kw(s, false), "'%s' beyond 16 digits is not supported",
                          bound_kw(s, false));
        if (nb.hi >= (double)S_MAXV)
            nb.has_hi = false;
        else
            hi = (int64_t)nb.hi;
    }
    if (nb.has_lo && nb.has_hi && (lo > hi || (lo == hi && (nb.lo_excl || nb.hi_excl))))
        return s_fail(c, path, bound_kw(s, true), "no number satisfies the bounds");
    c->need |= NEED_FRAC;
    int k = 0;
    sb_putc(e, '(');
    /* x >= 0 */
    if (!nb.has_hi || hi > 0 || (hi == 0 && !nb.hi_excl)) {
        bool lpos = nb.has_lo && lo >= 0;
        magnitudes(e, lpos ? lo : 0, lpos && nb.lo_excl, nb.has_hi, hi, nb.hi_excl, &k);
    }
    /* x < 0: x = -m with m > 0 */
    if (!nb.has_lo || lo < 0) {
        int k2 = 0;
        sbuf neg = {0};
        if (nb.has_hi && hi < 0)
            magnitudes(&neg, -hi, nb.hi_excl, nb.has_lo, -lo, nb.lo_excl, &k2);
        else
            magnitudes(&neg, 0, true, nb.has_lo, -lo, nb.lo_excl, &k2);
        if (k2) {
            if (k++)
                sb_puts(e, " | ");
            sb_puts(e, "\"-\" (");
            sb_puts(e, sb_str(&neg));
            sb_putc(e, ')');
        }
        if (neg.oom)
            e->oom = true;
        sb_free(&neg);
    }
    sb_putc(e, ')');
    if (!k)
        return s_fail(c, path, bound_kw(s, true), "no number satisfies the bounds");
    return 0;
}

/* ---- strings ---------------------------------------------------------- */

static int gen_string(sctx *c, const cJSON *s, const char *path, sbuf *e)
{
    bool has_min, has_max;
    long mn = 0, mx = 0;
    int rc = get_count(c, s, path, "minLength", &has_min, &mn);
    if (!rc)
        rc = get_count(c, s, path, "maxLength", &has_max, &mx);
    if (rc)
        return rc;
    if (has_max && mx < (has_min ? mn : 0))
        return s_fail(c, path, "maxLength", "'maxLength' below 'minLength'");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    if (pat && !cJSON_IsString(pat))
        return s_fail(c, path, "pattern", "'pattern' must be a string");
    if (fmt && !cJSON_IsString(fmt))
        return s_fail(c, path, "format", "'format' must be a string");
    /* Formats with a grammar; any other is a plain string (validators check
     * format only when asked to, and no client relies on it). */
    static const struct {
        const char *name, *rule;
        unsigned bit;
    } formats[] = {
        {"date", "fmt-date", NEED_DATE},
        {"time", "fmt-time", NEED_TIME},
        {"date-time", "fmt-date-time", NEED_DATETIME},
        {"uuid", "fmt-uuid", NEED_UUID},
    };
    int f = -1;
    for (int i = 0; fmt && i < 4; i++)
        if (!strcmp(fmt->valuestring, formats[i].name))
            f = i;
    if (pat || f >= 0) {
        const char *what = pat ? "pattern" : "format";
        if (has_min || has_max)
            return s_fail(c, path, has_min ? "minLength" : "maxLength",
                          "unsupported JSON Schema keyword '%s' together with '%s'",
                          has_min ? "minLength" : "maxLength", what);
        if (pat && f >= 0)
            return s_fail(c, path, "format",
                          "unsupported JSON Schema keyword 'format' (%s) together with 'pattern'",
                          fmt->valuestring);
    }
    if (pat) {
        sbuf re = {0};
        bool empty;
        char msg[DP_ERRLEN];
        rc = regex_expr(pat->valuestring, strlen(pat->valuestring), true, &re, &empty, msg,
                        sizeof msg);
        if (rc == DP_EINVAL) {
            sb_free(&re);
            return s_fail(c, path, "pattern", "unsupported 'pattern': %s", msg);
        }
        if (rc) {
            sb_free(&re);
            return s_oom(c);
        }
        sb_puts(e, "\"\\\"\" ");
        if (!empty) {
            sb_putc(e, '(');
            sb_puts(e, sb_str(&re));
            sb_puts(e, ") ");
        }
        sb_puts(e, "\"\\\"\"");
        if (re.oom)
            e->oom = true;
        sb_free(&re);
        return 0;
    }
    if (f >= 0) {
        c->need |= formats[f].bit;
        sb_printf(e, "\"\\\"\" %s \"\\\"\"", formats[f].rule);
        return 0;
    }
    if (!has_min && !has_max) {
        c->need |= NEED_STRING;
        sb_puts(e, "json-string");
        return 0;
    }
    c->need |= NEED_CHAR;
    sb_puts(e, "\"\\\"\" ");
    if (has_max && mx == 0) {
        /* nothing between the quotes */
    } else {
        sb_puts(e, "json-char");
        rx_postfix(e, has_min ? mn : 0, has_max ? mx : -1);
        sb_putc(e, ' ');
    }
    sb_puts(e, "\"\\\"\"");
    return 0;
}

/* ---- arrays ----------------------------------------------------------- */

/* A rule name for an item schema: absent or true is any value; false is
 * reported as *none. */
static int item_rule(sctx *c, const cJSON *it, const char *path, char *name, bool *none)
{
    *none = false;
    if (!it || cJSON_IsTrue(it)) {
        c->need |= NEED_VALUE;
        strcpy(name, "json-value");
        return 0;
    }
    if (cJSON_IsFalse(it)) {
        *none = true;
        return 0;
    }
    return gen(c, it, path, name);
}

static int gen_array(sctx *c, const cJSON *s, const char *path, sbuf *e)
{
    char p[S_PATH];
    bool has_min, has_max;
    long mn = 0, mx = 0;
    int rc = get_count(c, s, path, "minItems", &has_min, &mn);
    if (!rc)
        rc = get_count(c, s, path, "maxItems", &has_max, &mx);
    if (rc)
        return rc;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const char *prefix_kw = "prefixItems";
    const cJSON *rest = items;
    const char *rest_kw = "items";
    if (items && cJSON_IsArray(items)) {
        /* Draft 4-7 tuples: items is the prefix, additionalItems the rest. */
        if (prefix)
            return s_fail(c, path, "items", "array 'items' together with 'prefixItems'");
        prefix = items;
        prefix_kw = "items";
        rest = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
        rest_kw = "additionalItems";
    } else if (cJSON_GetObjectItemCaseSensitive(s, "additionalItems") && prefix) {
        return s_fail(c, path, "additionalItems", "'additionalItems' together with 'prefixItems'");
    }
    if (prefix && !cJSON_IsArray(prefix))
        return s_fail(c, path, prefix_kw, "'%s' must be an array", prefix_kw);
    int np = prefix ? cJSON_GetArraySize(prefix) : 0;
    char rest_name[S_NAME];
    bool rest_none;
    path_join(p, sizeof p, path, rest_kw);
    rc = item_rule(c, rest, p, rest_name, &rest_none);
    if (rc)
        return rc;
    long lo = has_min ? mn : 0;
    long hi = has_max ? mx : -1;
    if (rest_none && (hi < 0 || hi > np))
        hi = np;
    if (hi >= 0 && lo > hi)
        return s_fail(c, path, has_min ? "minItems" : "maxItems", "no array satisfies the length bounds");
    c->need |= NEED_WS;
    if (hi == 0) {
        sb_puts(e, "\"[\" ws \"]\"");
        return 0;
    }
    /* Positions below np take their prefix schema, later ones the rest.
     * tail(j) is "the items from position j on, each after a comma, given
     * j items so far"; built from the back, each tail nests the next once,
     * so the expression stays linear in np. */
    char (*pname)[S_NAME] = NULL;
    if (np) {
        pname = calloc((size_t)np, sizeof *pname);
        if (!pname)
            return s_oom(c);
        int j = 0;
        for (const cJSON *it = prefix->child; it; it = it->next, j++) {
            char k[32];
            snprintf(k, sizeof k, "%s.%d", prefix_kw, j);
            path_join(p, sizeof p, path, k);
            bool none;
            rc = item_rule(c, it, p, pname[j], &none);
            if (!rc && none)
                rc = s_fail(c, p, "", "a false item schema is not supported");
            if (rc) {
                free(pname);
                return rc;
            }
        }
    }
    sbuf seq = {0};
    if (np) {
        sbuf tail = {0};   /* tail(np): rest items */
        if (!rest_none && (hi < 0 || hi > np)) {
            sb_printf(&tail, "(ws \",\" ws %s)", rest_name);
            rx_postfix(&tail, lo > np ? lo - np : 0, hi < 0 ? -1 : hi - np);
        }
        for (int j = np - 1; j >= 1; j--) {
            sbuf t = {0};
            if (hi >= 0 && j >= hi) {
                sb_free(&tail);
                tail = t;
                continue;
            }
            bool opt = j >= lo;
            sb_printf(&t, "%sws \",\" ws %s", opt ? "(" : "", pname[j]);
            if (tail.n)
                sb_printf(&t, " %s", sb_str(&tail));
            if (opt)
                sb_puts(&t, ")?");
            if (tail.oom)
                t.oom = true;
            sb_free(&tail);
            tail = t;
        }
        sb_puts(&seq, pname[0]);
        if (tail.n)
            sb_printf(&seq, " %s", sb_str(&tail));
        if (tail.oom)
            seq.oom = true;
        sb_free(&tail);
    } else {
        sb_puts(&seq, rest_name);
        if (hi != 1) {
            sb_printf(&seq, " (ws \",\" ws %s)", rest_name);
            rx_postfix(&seq, lo > 1 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
        }
    }
    if (lo > 0)
        sb_printf(e, "\"[\" ws %s ws \"]\"", sb_str(&seq));
    else
        sb_printf(e, "\"[\" ws (%s ws)? \"]\"", sb_str(&seq));
    if (seq.oom)
        e->oom = true;
    sb_free(&seq);
    free(pname);
    return 0;
}

/* ---- objects ---------------------------------------------------------- */

typedef struct {
    uint32_t cp;
    int child;   /* first child node */
    int next;    /* next sibling */
    bool end;    /* a name ends here */
} tnode;

/* Extra keys for an object with declared names: unescaped strings that are
 * none of the names. One rule per trie node: after the prefix so far,
 * either the next character of some name (and on in the trie), or any other
 * character and then anything, or (where the prefix is no name) the end. */
static int key_rules(sctx *c, const cJSON *props, const char *path, char *name)
{
    tnode *t = NULL;
    int n = 0, cap = 0;
#define TNODE_ADD(cp_)                                                         \
    do {                                                                       \
        if (n == cap) {                                                        \
            cap = cap ? cap * 2 : 16;                                          \
            tnode *t2 = realloc(t, (size_t)cap * sizeof *t);                   \
            if (!t2) {                                                         \
                free(t);                                                       \
                return s_oom(c);                                               \
            }                                                                  \
            t = t2;                                                            \
        }                                                                      \
        t[n] = (tnode){.cp = (cp_), .child = -1, .next = -1, .end = false};    \
        n++;                                                                   \
    } while (0)
    TNODE_ADD(0);
    for (const cJSON *p = props->child; p; p = p->next) {
        const char *k = p->string;
        size_t len = strlen(k), i = 0;
        int u = 0;
        bool reachable = true;
        while (i < len) {
            uint32_t cp;
            if (!utf8_next(k, len, &i, &cp)) {
                free(t);
                return s_fail(c, path, "properties", "a property name is not UTF-8");
            }
            if (cp < 0x20 || cp == '"' || cp == '\\') {
                reachable = false;   /* an unescaped key cannot spell it */
                break;
            }
            int ch = t[u].child;
            while (ch >= 0 && t[ch].cp != cp)
                ch = t[ch].next;
            if (ch < 0) {
                TNODE_ADD(cp);
                ch = n - 1;
                t[ch].next = t[u].child;
                t[u].child = ch;
            }
            u = ch;
        }
        if (reachable)
            t[u].end = true;
    }
#undef TNODE_ADD
    int base = c->nrule;
    c->nrule += n;
    c->need |= NEED_KEYCHAR;
    for (int u = 0; u < n; u++) {
        sbuf b = {0};
        cpset other = {0};
        cps_add(&other, 0x20, CP_MAX);
        cps_norm(&other);
        cps_json_only(&other);
        int k = 0;
        for (int ch = t[u].child; ch >= 0; ch = t[ch].next) {
            if (k++)
                sb_puts(&b, " | ");
            sb_putc(&b, '"');
            lit_cp(&b, t[ch].cp);
            sb_printf(&b, "\" r%d-key", base + ch);
            cps_remove(&other, t[ch].cp, t[ch].cp);
        }
        if (other.n) {
            if (k++)
                sb_puts(&b, " | ");
            put_cpset(&b, &other);
            sb_puts(&b, " json-keychar*");
        }
        if (other.oom)
            b.oom = true;
        free(other.r);
        char rn[S_NAME];
        snprintf(rn, sizeof rn, "r%d-key", base + u);
        sbuf line = {0};
        if (!t[u].end) {
            sb_putc(&line, '(');
            sb_puts(&line, sb_str(&b));
            sb_puts(&line, ")?");
        } else {
            sb_puts(&line, sb_str(&b));
        }
        if (b.oom)
            line.oom = true;
        put_rule(c, rn, &line);
        sb_free(&line);
        sb_free(&b);
    }
    free(t);
    snprintf(name, S_NAME, "r%d-key", base);
    return 0;
}

static int gen_object(sctx *c, const cJSON *s, const char *path, sbuf *e)
{
    char p[S_PATH];
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return s_fail(c, path, "properties", "'properties' must be an object");
    if (req) {
        if (!cJSON_IsArray(req))
            return s_fail(c, path, "required", "'required' must be an array");
        for (const cJSON *r = req->child; r; r = r->next) {
            if (!cJSON_IsString(r))
                return s_fail(c, path, "required", "'required' must hold strings");
            if (!props || !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
                return s_fail(c, path, "required",
                              "unsupported: required property '%s' not in 'properties'",
                              r->valuestring);
        }
    }
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return s_fail(c, path, "additionalProperties",
                      "'additionalProperties' must be a boolean or a schema");
    c->need |= NEED_WS;
    if (!props && !addl) {
        c->need |= NEED_OBJECT;
        sb_puts(e, "json-object");
        return 0;
    }
    int n = props ? cJSON_GetArraySize(props) : 0;
    bool extra = addl && !cJSON_IsFalse(addl);
    /* kv[i]: "name" ws ":" ws value */
    sbuf *kv = calloc((size_t)n + 1, sizeof *kv);
    bool *required = calloc((size_t)n + 1, sizeof *required);
    int rc = 0;
    if (!kv || !required) {
        free(kv);
        free(required);
        return s_oom(c);
    }
    int i = 0;
    for (const cJSON *pr = props ? props->child : NULL; pr && !rc; pr = pr->next, i++) {
        char vn[S_NAME];
        char key[S_PATH];
        snprintf(key, sizeof key, "properties.%s", pr->string);
        path_join(p, sizeof p, path, key);
        rc = gen(c, pr, p, vn);
        if (rc)
            break;
        rc = put_key_literal(c, &kv[i], pr->string, path);
        sb_printf(&kv[i], " ws \":\" ws %s", vn);
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (!strcmp(r->valuestring, pr->string))
                required[i] = true;
    }
    if (!rc && extra) {
        char vn[S_NAME], kn[S_NAME];
        path_join(p, sizeof p, path, "additionalProperties");
        if (cJSON_IsTrue(addl)) {
            c->need |= NEED_VALUE;
            strcpy(vn, "json-value");
        } else {
            rc = gen(c, addl, p, vn);
        }
        if (!rc) {
            if (n) {
                rc = key_rules(c, props, path, kn);
                sb_printf(&kv[n], "\"\\\"\" %s \"\\\"\" ws \":\" ws %s", kn, vn);
            } else {
                c->need |= NEED_STRING;
                sb_printf(&kv[n], "json-string ws \":\" ws %s", vn);
            }
        }
    }
    /* From the back: T(i) is "members i.. after some member", one rule each;
     * F(i) is "members i.., the first without comma" (at least one member),
     * needed up to the first required property. */
    char (*tn)[S_NAME] = calloc((size_t)n + 2, sizeof *tn);   /* "" when empty */
    char (*fn)[S_NAME] = calloc((size_t)n + 2, sizeof *fn);
    if (!rc && (!tn || !fn))
        rc = s_oom(c);
    if (!rc) {
        int first_req = n;
        for (int j = 0; j < n; j++)
            if (required[j]) {
                first_req = j;
                break;
            }
        /* T(n): extra members, any number. */
        if (extra) {
            new_name(c, "extra", tn[n]);
            sbuf b = {0};
            sb_printf(&b, "(ws \",\" ws %s)*", sb_str(&kv[n]));
            put_rule(c, tn[n], &b);
            sb_free(&b);
        }
        for (int j = n - 1; j >= 1; j--) {
            sbuf b = {0};
            if (required[j])
                sb_printf(&b, "ws \",\" ws %s", sb_str(&kv[j]));
            else
                sb_printf(&b, "(ws \",\" ws %s)?", sb_str(&kv[j]));
            if (tn[j + 1][0])
                sb_printf(&b, " %s", tn[j + 1]);
            new_name(c, "tail", tn[j]);
            put_rule(c, tn[j], &b);
            sb_free(&b);
        }
        /* F(n): an extra member first. */
        if (extra && first_req == n) {
            new_name(c, "extra-first", fn[n]);
            sbuf b = {0};
            sb_printf(&b, "%s %s", sb_str(&kv[n]), tn[n]);
            put_rule(c, fn[n], &b);
            sb_free(&b);
        }
        int top = first_req < n ? first_req : n - 1;
        for (int j = top; j >= 0; j--) {
            sbuf b = {0};
            sb_puts(&b, sb_str(&kv[j]));
            if (tn[j + 1][0])
                sb_printf(&b, " %s", tn[j + 1]);
            if (!required[j] && fn[j + 1][0])
                sb_printf(&b, " | %s", fn[j + 1]);
            new_name(c, "first", fn[j]);
            put_rule(c, fn[j], &b);
            sb_free(&b);
        }
        if (!fn[0][0])
            sb_puts(e, "\"{\" ws \"}\"");
        else if (first_req < n)
            sb_printf(e, "\"{\" ws %s ws \"}\"", fn[0]);
        else
            sb_printf(e, "\"{\" ws (%s ws)? \"}\"", fn[0]);
    }
    for (int j = 0; j <= n; j++) {
        if (kv[j].oom)
            c->rules.oom = true;
        sb_free(&kv[j]);
    }
    free(kv);
    free(required);
    free(tn);
    free(fn);
    return rc;
}

/* ---- $ref ------------------------------------------------------------- */

/* Resolves a local JSON pointer; *rpath gets the dotted path. NULL when it
 * does not resolve (the error is reported). */
static const cJSON *resolve_ref(sctx *c, const char *ref, const char *path, char *rpath,
                                size_t rsz, int *rc)
{
    *rc = 0;
    rpath[0] = 0;
    if (ref[0] != '#' || (ref[1] && ref[1] != '/')) {
        *rc = s_fail(c, path, "$ref", "unsupported '$ref' (only local references \"#/...\")");
        return NULL;
    }
    const cJSON *cur = c->root;
    const char *q = ref + 1;
    size_t rl = 0;
    while (*q == '/') {
        q++;
        char tok[256];
        size_t k = 0;
        while (*q && *q != '/') {
            char ch = *q++;
            if (ch == '~' && (*q == '0' || *q == '1')) {
                ch = *q++ == '0' ? '~' : '/';
            } else if (ch == '%' && rx_hex(q[0]) >= 0 && q[0] && rx_hex(q[1]) >= 0) {
                ch = (char)(rx_hex(q[0]) * 16 + rx_hex(q[1]));
                q += 2;
            }
            if (k + 1 < sizeof tok)
                tok[k++] = ch;
        }
        tok[k] = 0;
        if (cJSON_IsObject(cur)) {
            cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
        } else if (cJSON_IsArray(cur)) {
            char *end;
            long idx = strtol(tok, &end, 10);
            cur = *tok && !*end && idx >= 0 ? cJSON_GetArrayItem(cur, (int)idx) : NULL;
        } else {
            cur = NULL;
        }
        if (!cur) {
            *rc = s_fail(c, path, "$ref", "'$ref' %s does not resolve", ref);
            return NULL;
        }
        int w = snprintf(rpath + rl, rsz - rl, "%s%s", rl ? "." : "", tok);
        if (w > 0 && (size_t)w < rsz - rl)
            rl += (size_t)w;
    }
    return cur;
}

static int gen_ref(sctx *c, const cJSON *target, const char *tpath, char *name)
{
    for (int i = 0; i < c->nrefs; i++)
        if (c->refs[i].target == target) {
            strcpy(name, c->refs[i].name);
            return 0;
        }
    if (c->nrefs == c->caprefs) {
        int cap = c->caprefs ? c->caprefs * 2 : 8;
        sref *r = realloc(c->refs, (size_t)cap * sizeof *r);
        if (!r)
            return s_oom(c);
        c->refs = r;
        c->caprefs = cap;
    }
    sref *r = &c->refs[c->nrefs++];
    r->target = target;
    new_name(c, *tpath ? tpath : "root", r->name);
    strcpy(name, r->name);
    /* The rule's name is known before its body, so recursion just refers
     * to it. */
    char body_name[S_NAME];
    int rc = gen(c, target, tpath, body_name);
    if (rc)
        return rc;
    sbuf b = {0};
    sb_puts(&b, body_name);
    put_rule(c, name, &b);
    sb_free(&b);
    return 0;
}

/* ---- schemas ---------------------------------------------------------- */

/* Only annotations may accompany a keyword that stands for the whole schema
 * ($ref, allOf, anyOf, oneOf). */
static int only_annotations(sctx *c, const cJSON *s, const char *path, const char *kw)
{
    for (const cJSON *k = s->child; k; k = k->next)
        if (strcmp(k->string, kw) && !is_annotation(k->string))
            return s_fail(c, path, k->string,
                          "unsupported JSON Schema keyword '%s' alongside '%s'", k->string, kw);
    return 0;
}

static int gen_body(sctx *c, const cJSON *s, const char *path, sbuf *e, char *name);

static int gen(sctx *c, const cJSON *s, const char *path, char *name)
{
    if (cJSON_IsTrue(s)) {
        c->need |= NEED_VALUE;
        strcpy(name, "json-value");
        return 0;
    }
    if (cJSON_IsFalse(s))
        return s_fail(c, path, "", "the schema false (nothing is valid) is not supported");
    if (!cJSON_IsObject(s))
        return s_fail(c, path, "", "a schema must be an object or a boolean");
    if (++c->depth > S_MAX_DEPTH) {
        c->depth--;
        return s_fail(c, path, "", "schema nested too deeply");
    }
    sbuf e = {0};
    name[0] = 0;
    int rc = gen_body(c, s, path, &e, name);
    c->depth--;
    if (!rc && !name[0]) {
        new_name(c, path, name);
        put_rule(c, name, &e);
    }
    sb_free(&e);
    if (!rc && c->rules.oom)
        rc = s_oom(c);
    return rc;
}

/* Either sets name (the schema is an existing rule) or writes the body of a
 * new rule into e. */
static int gen_body(sctx *c, const cJSON *s, const char *path, sbuf *e, char *name)
{
    char p[S_PATH];
    int rc;
    int kinds = 0;
    for (const cJSON *k = s->child; k; k = k->next) {
        if (is_annotation(k->string))
            continue;
        int kind = keyword_kind(k->string);
        if (kind < 0)
            return s_fail(c, path, k->string, "unsupported JSON Schema keyword '%s'", k->string);
        kinds |= kind;
    }
    const cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        if ((rc = only_annotations(c, s, path, "$ref")))
            return rc;
        if (!cJSON_IsString(x))
            return s_fail(c, path, "$ref", "'$ref' must be a string");
        char rpath[S_PATH];
        const cJSON *t = resolve_ref(c, x->valuestring, path, rpath, sizeof rpath, &rc);
        if (!t)
            return rc;
        /* A chain of bare $refs that comes back to itself has no sentence
         * and would be a left-recursive rule. */
        const cJSON *hop = t;
        for (int i = 0; i < 64 && cJSON_IsObject(hop); i++) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(hop, "$ref");
            if (!cJSON_IsString(r) || !(hop = resolve_ref(c, r->valuestring, path, p, sizeof p, &rc)))
                break;
            if (hop == t || hop == s)
                return s_fail(c, path, "$ref", "circular '$ref' %s", x->valuestring);
        }
        if (rc)
            return rc;
        return gen_ref(c, t, rpath, name);
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        if ((rc = only_annotations(c, s, path, "allOf")))
            return rc;
        if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) != 1)
            return s_fail(c, path, "allOf", "unsupported 'allOf' with other than one schema");
        path_join(p, sizeof p, path, "allOf.0");
        return gen(c, x->child, p, name);
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (any || one) {
        const char *kw = any ? "anyOf" : "oneOf";
        x = any ? any : one;
        if ((rc = only_annotations(c, s, path, kw)))
            return rc;
        if (!cJSON_IsArray(x) || !x->child)
            return s_fail(c, path, kw, "'%s' must be a non-empty array", kw);
        int i = 0;
        for (const cJSON *b = x->child; b; b = b->next, i++) {
            char key[32], bn[S_NAME];
            snprintf(key, sizeof key, "%s.%d", kw, i);
            path_join(p, sizeof p, path, key);
            if ((rc = gen(c, b, p, bn)))
                return rc;
            if (i)
                sb_puts(e, " | ");
            sb_puts(e, bn);
        }
        if (i == 1)   /* one branch: that branch's rule */
            strcpy(name, sb_str(e));
        return 0;
    }
    int types;
    if ((rc = get_types(c, s, path, &types)))
        return rc;
    if (cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const")) {
        for (const cJSON *k = s->child; k; k = k->next)
            if (keyword_kind(k->string) > 0)
                return s_fail(c, path, k->string,
                              "unsupported JSON Schema keyword '%s' alongside 'enum' or 'const'",
                              k->string);
        return gen_enum(c, s, path, types, e);
    }
    if (!types) {
        /* Inferred from the keywords; none: any value. */
        types = kinds & (T_OBJECT | T_ARRAY | T_STRING | T_NUMBER);
        if (!types) {
            c->need |= NEED_VALUE;
            strcpy(name, "json-value");
            return 0;
        }
    }
    int k = 0;
    const char *single = NULL;   /* the one alternative when it is a plain rule */
    for (int bit = 1; bit <= T_NULL; bit <<= 1) {
        if (!(types & bit))
            continue;
        if (bit == T_INTEGER && (types & T_NUMBER))
            continue;   /* number covers it */
        if (k++)
            sb_puts(e, " | ");
        size_t start = e->n;
        switch (bit) {
        case T_OBJECT: rc = gen_object(c, s, path, e); break;
        case T_ARRAY: rc = gen_array(c, s, path, e); break;
        case T_STRING: rc = gen_string(c, s, path, e); break;
        case T_INTEGER: rc = gen_integer(c, s, path, e); break;
        case T_NUMBER: rc = gen_number(c, s, path, e); break;
        case T_BOOLEAN: sb_puts(e, "\"true\" | \"false\""); break;
        case T_NULL: sb_puts(e, "\"null\""); break;
        }
        if (rc)
            return rc;
        single = e->p + start;
    }
    /* A lone shared rule (json-string, ...) needs no rule of its own. */
    if (k == 1 && single && !strncmp(single, "json-", 5) && !strchr(single, ' '))
        snprintf(name, S_NAME, "%s", single);
    return 0;
}

int schema_to_gbnf(const cJSON *schema, char **out, char *path_err, size_t perrsz, char *err,
                   size_t errsz)
{
    *out = NULL;
    if (path_err && perrsz)
        path_err[0] = 0;
    if (!schema)
        return dp_err(err, errsz, DP_EINVAL, "missing JSON Schema");
    sctx c = {.root = schema, .perr = path_err, .perrsz = perrsz, .err = err, .errsz = errsz};
    char name[S_NAME];
    int rc;
    if (cJSON_IsObject(schema) || cJSON_IsBool(schema))
        rc = gen_ref(&c, schema, "", name);   /* so that "#" refers to it */
    else
        rc = s_fail(&c, "", "", "a schema must be an object or a boolean");
    free(c.refs);
    if (!rc && c.rules.oom)
        rc = s_oom(&c);
    if (rc) {
        sb_free(&c.rules);
        return rc;
    }
    sbuf g = {0};
    sb_printf(&g, "root ::= %s\n", name);
    sb_puts(&g, sb_str(&c.rules));
    put_shared(&g, c.need);
    sb_free(&c.rules);
    return sb_take(&g, out, err, errsz);
}
