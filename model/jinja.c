/* jinja.c: the Jinja2 subset that chat templates use: lexer, parser to an
 * AST, and a bounded renderer with Python's value semantics (jinja.h). */
#include "jinja.h"

#include <ctype.h>
#include <errno.h>
#include <fenv.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dp.h"
#include "unicode.h"

/* ======================================================================
 * values
 * ====================================================================== */

typedef struct node node;

struct jv {
    jv_kind kind;
    int rc; /* < 0: a static value, never freed */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            char *p;
            size_t n;
        } s;
        struct {
            jv **v;
            size_t n, cap;
            bool tuple;
        } l; /* a tuple only prints differently */
        struct {
            jv **k, **v;
            size_t n, cap;
        } d; /* JV_DICT and JV_NAMESPACE */
        struct {
            const node *macro;
            int builtin;
        } c;
    } u;
};

static jv j_undef = {JV_UNDEFINED, -1, {.i = 0}};
static jv j_none = {JV_NONE, -1, {.i = 0}};
static jv j_true = {JV_BOOL, -1, {.b = true}};
static jv j_false = {JV_BOOL, -1, {.b = false}};

enum { B_RAISE = 1, B_STRFTIME, B_NAMESPACE, B_RANGE, B_DICT };
static jv j_b_raise = {JV_CALLABLE, -1, {.c = {NULL, B_RAISE}}};
static jv j_b_strftime = {JV_CALLABLE, -1, {.c = {NULL, B_STRFTIME}}};
static jv j_b_namespace = {JV_CALLABLE, -1, {.c = {NULL, B_NAMESPACE}}};
static jv j_b_range = {JV_CALLABLE, -1, {.c = {NULL, B_RANGE}}};
static jv j_b_dict = {JV_CALLABLE, -1, {.c = {NULL, B_DICT}}};

static jv *jv_new(jv_kind k)
{
    jv *v = calloc(1, sizeof *v);
    if (v) {
        v->kind = k;
        v->rc = 1;
    }
    return v;
}

jv *jv_undefined(void) { return &j_undef; }
jv *jv_none(void) { return &j_none; }
jv *jv_bool(bool b) { return b ? &j_true : &j_false; }

jv *jv_int(int64_t i)
{
    jv *v = jv_new(JV_INT);
    if (v) v->u.i = i;
    return v;
}

jv *jv_float(double f)
{
    jv *v = jv_new(JV_FLOAT);
    if (v) v->u.f = f;
    return v;
}

jv *jv_strn(const char *s, size_t n)
{
    if (!s && n) return NULL;
    jv *v = jv_new(JV_STRING);
    if (!v) return NULL;
    v->u.s.p = malloc(n + 1);
    if (!v->u.s.p) {
        free(v);
        return NULL;
    }
    if (n) memcpy(v->u.s.p, s, n);
    v->u.s.p[n] = '\0';
    v->u.s.n = n;
    return v;
}

jv *jv_str(const char *s) { return s ? jv_strn(s, strlen(s)) : NULL; }
jv *jv_list(void) { return jv_new(JV_LIST); }
jv *jv_dict(void) { return jv_new(JV_DICT); }

jv *jv_ref(jv *v)
{
    if (v && v->rc > 0) v->rc++;
    return v;
}

void jv_unref(jv *v)
{
    if (!v || v->rc < 0 || --v->rc > 0) return;
    switch (v->kind) {
    case JV_STRING: free(v->u.s.p); break;
    case JV_LIST:
        for (size_t i = 0; i < v->u.l.n; i++) jv_unref(v->u.l.v[i]);
        free(v->u.l.v);
        break;
    case JV_DICT:
    case JV_NAMESPACE:
        for (size_t i = 0; i < v->u.d.n; i++) {
            jv_unref(v->u.d.k[i]);
            jv_unref(v->u.d.v[i]);
        }
        free(v->u.d.k);
        free(v->u.d.v);
        break;
    default: break;
    }
    free(v);
}

/* The rendering on this thread, if any: list growth is charged to its
 * budget, so that a template copying big lists in a loop ends with an
 * error instead of running for minutes. */
struct rs;
static _Thread_local struct rs *cur_render;
static bool charge_item(struct rs *r);
static bool sb_within_limit(size_t n);
static bool step(void);

int jv_list_push(jv *l, jv *item)
{
    if (!item || !l || l->kind != JV_LIST) {
        jv_unref(item);
        return item ? DP_EINVAL : DP_ENOMEM;
    }
    if (cur_render && !charge_item(cur_render)) {
        jv_unref(item);
        return DP_ERANGE;
    }
    if (l->u.l.n == l->u.l.cap) {
        size_t nc = l->u.l.cap ? l->u.l.cap * 2 : 4;
        jv **nv = realloc(l->u.l.v, nc * sizeof *nv);
        if (!nv) {
            jv_unref(item);
            return DP_ENOMEM;
        }
        l->u.l.v = nv;
        l->u.l.cap = nc;
    }
    l->u.l.v[l->u.l.n++] = item;
    return 0;
}

static bool jv_eq(const jv *a, const jv *b);

static long dict_find(const jv *d, const jv *key)
{
    /* a linear search: charged (step) in big dicts, which a request can send */
    bool metered = d->u.d.n > 16;
    for (size_t i = 0; i < d->u.d.n && (!metered || step()); i++)
        if (jv_eq(d->u.d.k[i], key)) return (long)i;
    return -1;
}

static long dict_find_str(const jv *d, const char *key, size_t n)
{
    for (size_t i = 0; i < d->u.d.n; i++) {
        const jv *k = d->u.d.k[i];
        if (k->kind == JV_STRING && k->u.s.n == n && memcmp(k->u.s.p, key, n) == 0) return (long)i;
    }
    return -1;
}

/* Takes over key and val. */
static int dict_put(jv *d, jv *key, jv *val)
{
    if (!key || !val || !d || (d->kind != JV_DICT && d->kind != JV_NAMESPACE)) {
        jv_unref(key);
        jv_unref(val);
        return (key && val) ? DP_EINVAL : DP_ENOMEM;
    }
    long at = dict_find(d, key);
    if (at >= 0) {
        jv_unref(key);
        jv_unref(d->u.d.v[at]);
        d->u.d.v[at] = val;
        return 0;
    }
    if (d->u.d.n == d->u.d.cap) {
        size_t nc = d->u.d.cap ? d->u.d.cap * 2 : 4;
        jv **nk = realloc(d->u.d.k, nc * sizeof *nk);
        if (!nk) goto oom;
        d->u.d.k = nk;
        jv **nv = realloc(d->u.d.v, nc * sizeof *nv);
        if (!nv) goto oom;
        d->u.d.v = nv;
        d->u.d.cap = nc;
    }
    d->u.d.k[d->u.d.n] = key;
    d->u.d.v[d->u.d.n++] = val;
    return 0;
oom:
    jv_unref(key);
    jv_unref(val);
    return DP_ENOMEM;
}

int jv_dict_set(jv *d, const char *key, jv *val)
{
    if (!key) {
        jv_unref(val);
        return DP_EINVAL;
    }
    return dict_put(d, jv_str(key), val);
}

int jv_dict_merge(jv *dst, const jv *src)
{
    if (!src || (src->kind != JV_DICT && src->kind != JV_NAMESPACE)) return DP_EINVAL;
    for (size_t i = 0; i < src->u.d.n; i++) {
        int rc = dict_put(dst, jv_ref(src->u.d.k[i]), jv_ref(src->u.d.v[i]));
        if (rc) return rc;
    }
    return 0;
}

jv_kind jv_kind_of(const jv *v) { return v ? v->kind : JV_UNDEFINED; }

jv *jv_dict_get(const jv *d, const char *key)
{
    if (!d || (d->kind != JV_DICT && d->kind != JV_NAMESPACE) || !key) return NULL;
    long at = dict_find_str(d, key, strlen(key));
    return at >= 0 ? d->u.d.v[at] : NULL;
}

size_t jv_len(const jv *v)
{
    if (!v) return 0;
    switch (v->kind) {
    case JV_STRING: return v->u.s.n;
    case JV_LIST: return v->u.l.n;
    case JV_DICT:
    case JV_NAMESPACE: return v->u.d.n;
    default: return 0;
    }
}

const char *jv_string(const jv *v, size_t *len)
{
    if (!v || v->kind != JV_STRING) return NULL;
    if (len) *len = v->u.s.n;
    return v->u.s.p;
}

jv *jv_list_get(const jv *l, size_t i)
{
    return l && l->kind == JV_LIST && i < l->u.l.n ? l->u.l.v[i] : NULL;
}

static size_t string_bytes(const jv *v, int depth)
{
    if (!v || depth > 64) return 0;
    size_t n = 0;
    switch (v->kind) {
    case JV_STRING: return v->u.s.n;
    case JV_LIST:
        for (size_t i = 0; i < v->u.l.n; i++) n += string_bytes(v->u.l.v[i], depth + 1);
        return n;
    case JV_DICT:
    case JV_NAMESPACE:
        for (size_t i = 0; i < v->u.d.n; i++)
            n += string_bytes(v->u.d.k[i], depth + 1) + string_bytes(v->u.d.v[i], depth + 1);
        return n;
    default: return 0;
    }
}

size_t jv_string_bytes(const jv *v) { return string_bytes(v, 0); }

/* ======================================================================
 * growable byte buffer
 * ====================================================================== */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static int sb_add(sbuf *b, const char *s, size_t n)
{
    /* While rendering, no buffer may outgrow the string limit: str() or
     * tojson of a list holding the same big string many times (or of lists
     * of lists sharing items) would otherwise build gigabytes before any
     * caller's size check ran. */
    if (!sb_within_limit(b->n + n)) return DP_ERANGE;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return DP_ENOMEM;
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

static int sb_str(sbuf *b, const char *s) { return sb_add(b, s, strlen(s)); }

static int sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return DP_EINVAL;
    return sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ======================================================================
 * lexer
 * ====================================================================== */

enum {
    T_EOF,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP
};

typedef struct tok {
    int type, line;
    char *s; /* TEXT, NAME, STRING (decoded), OP: malloc'd */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct lexer {
    const char *src;
    size_t len, pos;
    int line;
    tok *t;
    size_t nt, cap;
    char *err;
    size_t errsz;
} lexer;

static int lex_push(lexer *L, int type, int line, const char *s, size_t n)
{
    if (L->nt == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 64;
        tok *nt = realloc(L->t, nc * sizeof *nt);
        if (!nt) return dp_err(L->err, L->errsz, DP_ENOMEM, "jinja: out of memory");
        L->t = nt;
        L->cap = nc;
    }
    tok *t = &L->t[L->nt];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    if (s) {
        t->s = malloc(n + 1);
        if (!t->s) return dp_err(L->err, L->errsz, DP_ENOMEM, "jinja: out of memory");
        memcpy(t->s, s, n);
        t->s[n] = '\0';
        t->n = n;
    }
    L->nt++;
    return 0;
}

static bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static void count_lines(lexer *L, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (L->src[i] == '\n') L->line++;
}

/* Text before a tag: '-' strips all whitespace before it; otherwise
 * lstrip_blocks removes the spaces and tabs before a block or comment tag
 * that starts its line. */
static int lex_text(lexer *L, size_t from, size_t to, char sign, bool lstrip)
{
    size_t end = to;
    if (sign == '-') {
        while (end > from && ws(L->src[end - 1])) end--;
    } else if (sign != '+' && lstrip) {
        size_t l = to;
        while (l > from && L->src[l - 1] != '\n') l--;
        bool line_start = l > from || from == 0 || L->src[from - 1] == '\n';
        if (line_start && l < to) {
            size_t k = l;
            while (k < to && ws(L->src[k]) && L->src[k] != '\n') k++;
            if (k == to) end = l;
        }
    }
    int line = L->line;
    count_lines(L, from, to);
    if (end > from) return lex_push(L, T_TEXT, line, L->src + from, end - from);
    return 0;
}

/* After a tag's end: '-' strips the whitespace after it; trim_blocks drops
 * one newline after a block or comment tag unless '+'. */
static void lex_after(lexer *L, char sign, bool trim)
{
    if (sign == '-') {
        size_t p = L->pos;
        while (p < L->len && ws(L->src[p])) p++;
        count_lines(L, L->pos, p);
        L->pos = p;
    } else if (sign != '+' && trim && L->pos < L->len && L->src[L->pos] == '\n') {
        L->pos++;
        L->line++;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal, decoded as Python's unicode-escape does. */
static int lex_string(lexer *L)
{
    char q = L->src[L->pos];
    int line = L->line;
    size_t p = L->pos + 1;
    sbuf b = {0};
    int rc = 0;
    while (p < L->len && L->src[p] != q) {
        char c = L->src[p];
        if (c == '\n') L->line++;
        if (c != '\\' || p + 1 >= L->len) {
            rc = sb_add(&b, &c, 1);
            p++;
        } else {
            char e = L->src[p + 1];
            p += 2;
            char one = 0;
            switch (e) {
            case 'n': one = '\n'; break;
            case 't': one = '\t'; break;
            case 'r': one = '\r'; break;
            case 'a': one = '\a'; break;
            case 'b': one = '\b'; break;
            case 'f': one = '\f'; break;
            case 'v': one = '\v'; break;
            case '\\': one = '\\'; break;
            case '\'': one = '\''; break;
            case '"': one = '"'; break;
            case '\n': L->line++; continue;
            default: break;
            }
            if (one) {
                rc = sb_add(&b, &one, 1);
            } else if (e >= '0' && e <= '7') {
                unsigned v = (unsigned)(e - '0');
                for (int k = 0; k < 2 && p < L->len && L->src[p] >= '0' && L->src[p] <= '7'; k++)
                    v = v * 8 + (unsigned)(L->src[p++] - '0');
                char o[4];
                rc = sb_add(&b, o, unicode_utf8_encode(v, o));
            } else if (e == 'x' || e == 'u' || e == 'U') {
                int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                uint32_t v = 0;
                for (int k = 0; k < nd; k++) {
                    int h = p < L->len ? hexval(L->src[p]) : -1;
                    if (h < 0) {
                        sb_add(&b, "", 0);
                        free(b.p);
                        return dp_err(L->err, L->errsz, DP_EINVAL,
                                      "jinja: line %d: truncated \\%c escape in a string", line, e);
                    }
                    v = v * 16 + (uint32_t)h;
                    p++;
                }
                if (v > 0x10FFFF) {
                    free(b.p);
                    return dp_err(L->err, L->errsz, DP_EINVAL, "jinja: line %d: bad \\U escape", line);
                }
                char o[4];
                rc = sb_add(&b, o, unicode_utf8_encode(v, o));
            } else {
                char two[2] = {'\\', e};
                rc = sb_add(&b, two, 2);
            }
        }
        if (rc) break;
    }
    if (!rc && p >= L->len) {
        free(b.p);
        return dp_err(L->err, L->errsz, DP_EINVAL, "jinja: line %d: unterminated string", line);
    }
    if (!rc) rc = lex_push(L, T_STRING, line, b.p ? b.p : "", b.n);
    free(b.p);
    L->pos = p + 1;
    return rc ? (rc == DP_ENOMEM ? dp_err(L->err, L->errsz, rc, "jinja: out of memory") : rc) : 0;
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">=", NULL};

/* The tokens of one {{ }} or {% %} tag, up to and including its end. */
static int lex_tag(lexer *L, bool block, char *end_sign)
{
    int depth = 0;
    for (;;) {
        while (L->pos < L->len && ws(L->src[L->pos])) {
            if (L->src[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->len)
            return dp_err(L->err, L->errsz, DP_EINVAL, "jinja: line %d: unclosed %s tag", L->line,
                          block ? "'{%'" : "'{{'");
        const char *s = L->src + L->pos;
        size_t left = L->len - L->pos;
        if (depth == 0) {
            const char *e = block ? "%}" : "}}";
            char sg = 0;
            size_t k = 0;
            if (left >= 3 && (s[0] == '-' || (block && s[0] == '+')) && memcmp(s + 1, e, 2) == 0) {
                sg = s[0];
                k = 3;
            } else if (left >= 2 && memcmp(s, e, 2) == 0) {
                k = 2;
            }
            if (k) {
                L->pos += k;
                *end_sign = sg;
                return lex_push(L, block ? T_BLOCK_END : T_VAR_END, L->line, NULL, 0);
            }
        }
        char c = s[0];
        if (isalpha((unsigned char)c) || c == '_') {
            size_t n = 1;
            while (n < left && (isalnum((unsigned char)s[n]) || s[n] == '_')) n++;
            if (lex_push(L, T_NAME, L->line, s, n)) return DP_ENOMEM;
            L->pos += n;
        } else if (isdigit((unsigned char)c)) {
            bool after_dot = L->nt > 0 && L->t[L->nt - 1].type == T_OP && !strcmp(L->t[L->nt - 1].s, ".");
            size_t n = 0;
            char num[64];
            size_t w = 0;
            bool is_float = false;
            while (n < left && (isdigit((unsigned char)s[n]) ||
                                (s[n] == '_' && n + 1 < left && isdigit((unsigned char)s[n + 1])))) {
                if (s[n] != '_' && w < sizeof num - 1) num[w++] = s[n];
                n++;
            }
            if (!after_dot && n + 1 < left && s[n] == '.' && isdigit((unsigned char)s[n + 1])) {
                is_float = true;
                num[w < sizeof num - 1 ? w++ : w] = '.';
                n++;
                while (n < left && (isdigit((unsigned char)s[n]) || s[n] == '_')) {
                    if (s[n] != '_' && w < sizeof num - 1) num[w++] = s[n];
                    n++;
                }
            }
            if (!after_dot && n < left && (s[n] == 'e' || s[n] == 'E')) {
                size_t m = n + 1;
                if (m < left && (s[m] == '+' || s[m] == '-')) m++;
                if (m < left && isdigit((unsigned char)s[m])) {
                    is_float = true;
                    while (n < m && w < sizeof num - 1) num[w++] = s[n++];
                    while (n < left && isdigit((unsigned char)s[n])) {
                        if (w < sizeof num - 1) num[w++] = s[n];
                        n++;
                    }
                }
            }
            num[w] = '\0';
            if (lex_push(L, is_float ? T_FLOAT : T_INT, L->line, NULL, 0)) return DP_ENOMEM;
            tok *t = &L->t[L->nt - 1];
            if (is_float) {
                t->f = strtod(num, NULL);
            } else {
                errno = 0;
                unsigned long long v = strtoull(num, NULL, 10);
                if (errno || v > INT64_MAX)
                    return dp_err(L->err, L->errsz, DP_EUNSUPPORTED,
                                  "jinja: line %d: integer literal too large", L->line);
                t->i = (int64_t)v;
            }
            L->pos += n;
        } else if (c == '\'' || c == '"') {
            int rc = lex_string(L);
            if (rc) return rc;
        } else {
            size_t n = 0;
            for (int k = 0; ops2[k]; k++)
                if (left >= 2 && memcmp(s, ops2[k], 2) == 0) n = 2;
            if (!n) {
                /* strchr finds the terminator: a NUL byte would pass as an operator */
                if (c == '\0' || !strchr("+-*/%~|.,:()[]{}<>=", c)) {
                    if (isprint((unsigned char)c))
                        return dp_err(L->err, L->errsz, DP_EINVAL, "jinja: line %d: unexpected character '%c'",
                                      L->line, c);
                    return dp_err(L->err, L->errsz, DP_EINVAL,
                                  "jinja: line %d: unexpected byte 0x%02x in a tag", L->line, (unsigned char)c);
                }
                n = 1;
                if (c == '(' || c == '[' || c == '{') depth++;
                if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            }
            if (lex_push(L, T_OP, L->line, s, n)) return DP_ENOMEM;
            L->pos += n;
        }
    }
}

/* {% raw %} ... {% endraw %}: the text in between, untouched. */
static int lex_raw(lexer *L, size_t tag_at)
{
    size_t p = L->pos;
    for (;;) {
        const char *f = memmem(L->src + p, L->len - p, "{%", 2);
        if (!f) {
            L->pos = tag_at;
            return dp_err(L->err, L->errsz, DP_EINVAL, "jinja: line %d: unclosed 'raw' (no 'endraw')",
                          L->line);
        }
        size_t q = (size_t)(f - L->src) + 2;
        char sign = 0;
        if (q < L->len && (L->src[q] == '-' || L->src[q] == '+')) sign = L->src[q++];
        while (q < L->len && ws(L->src[q])) q++;
        if (L->len - q >= 6 && memcmp(L->src + q, "endraw", 6) == 0) {
            q += 6;
            while (q < L->len && ws(L->src[q])) q++;
            char es = 0;
            if (q < L->len && (L->src[q] == '-' || L->src[q] == '+')) es = L->src[q++];
            if (L->len - q >= 2 && memcmp(L->src + q, "%}", 2) == 0) {
                int rc = lex_text(L, L->pos, (size_t)(f - L->src), sign, true);
                if (rc) return rc;
                count_lines(L, (size_t)(f - L->src), q + 2);
                L->pos = q + 2;
                lex_after(L, es, true);
                return 0;
            }
        }
        p = (size_t)(f - L->src) + 2;
    }
}

static int lex_all(lexer *L)
{
    while (L->pos < L->len) {
        const char *s = L->src;
        size_t p = L->pos;
        char kind = 0;
        while (p + 1 < L->len) {
            if (s[p] == '{' && (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#')) {
                kind = s[p + 1];
                break;
            }
            p++;
        }
        if (!kind) return lex_text(L, L->pos, L->len, 0, false);
        char sign = 0;
        if (p + 2 < L->len && (s[p + 2] == '-' || s[p + 2] == '+')) sign = s[p + 2];
        int rc = lex_text(L, L->pos, p, sign, kind != '{');
        if (rc) return rc;
        size_t body = p + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *e = memmem(s + body, L->len - body, "#}", 2);
            if (!e) return dp_err(L->err, L->errsz, DP_EINVAL, "jinja: line %d: unclosed comment", L->line);
            size_t q = (size_t)(e - s);
            char es = q > body && s[q - 1] == '-' ? '-' : 0;
            count_lines(L, p, q + 2);
            L->pos = q + 2;
            lex_after(L, es, true);
            continue;
        }
        if (kind == '%') {
            size_t q = body;
            while (q < L->len && ws(s[q])) q++;
            if (L->len - q >= 3 && memcmp(s + q, "raw", 3) == 0 &&
                (q + 3 >= L->len || !(isalnum((unsigned char)s[q + 3]) || s[q + 3] == '_'))) {
                size_t r = q + 3;
                while (r < L->len && ws(s[r])) r++;
                char es = 0;
                if (r < L->len && s[r] == '-') es = s[r++];
                if (L->len - r >= 2 && memcmp(s + r, "%}", 2) == 0) {
                    count_lines(L, p, r + 2);
                    L->pos = r + 2;
                    lex_after(L, es, false);
                    rc = lex_raw(L, p);
                    if (rc) return rc;
                    continue;
                }
            }
        }
        rc = lex_push(L, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, L->line, NULL, 0);
        if (rc) return rc;
        L->pos = body;
        char es = 0;
        rc = lex_tag(L, kind == '%', &es);
        if (rc) return rc;
        lex_after(L, es, kind == '%');
    }
    return 0;
}

/* ======================================================================
 * AST and parser
 * ====================================================================== */

enum ntype {
    /* statements */
    N_BODY,
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    N_SETBLOCK,
    N_MACRO,
    N_BREAK,
    N_CONTINUE,
    /* expressions */
    N_LIT,
    N_NAME,
    N_ATTR,
    N_ITEM,
    N_SLICE,
    N_CALL,
    N_FILTER,
    N_TEST,
    N_BIN,
    N_CMP,
    N_UNARY,
    N_AND,
    N_OR,
    N_NOT,
    N_COND,
    N_LISTX,
    N_TUPLEX,
    N_DICTX,
};

struct node {
    int type, line, op;
    int h;      /* height of the expression tree under it (tall()) */
    bool neg;   /* N_TEST: 'is not' */
    char *name; /* NAME, ATTR, FILTER, TEST, MACRO, SET/SETBLOCK target */
    char *attr; /* SET: ns.attr */
    jv *lit;    /* N_LIT, N_TEXT */
    node *a, *b, *c, *d;
    node **kids; /* body, positional args, items; MACRO: defaults (NULL: none) */
    size_t nkids, capk;
    char **kwn; /* keyword args */
    node **kwv;
    size_t nkw;
    char **names; /* FOR / SET targets, MACRO params */
    size_t nnames;
};

struct jinja_tmpl {
    node *root;
};

static void node_free(node *n)
{
    if (!n) return;
    free(n->name);
    free(n->attr);
    jv_unref(n->lit);
    node_free(n->a);
    node_free(n->b);
    node_free(n->c);
    node_free(n->d);
    for (size_t i = 0; i < n->nkids; i++) node_free(n->kids[i]);
    free(n->kids);
    for (size_t i = 0; i < n->nkw; i++) {
        free(n->kwn[i]);
        node_free(n->kwv[i]);
    }
    free(n->kwn);
    free(n->kwv);
    for (size_t i = 0; i < n->nnames; i++) free(n->names[i]);
    free(n->names);
    free(n);
}

typedef struct parser {
    tok *t;
    size_t nt, pos;
    char *err;
    size_t errsz;
    int rc;
    int depth, in_loop;
    char **macros; /* names of all macros: calls to other names are checked */
    size_t nmacros;
    struct {
        char *name;
        int line;
    } * calls;
    size_t ncalls;
} parser;

#define PARSE_MAX_DEPTH 128
/* Left-associative chains (a ~ b ~ c ..., x.a.b.c ..., s|trim|trim ...)
 * nest without recursing in the parser, so PARSE_MAX_DEPTH misses them; the
 * tree's height bounds the recursion that evaluates and frees it. */
#define PARSE_MAX_HEIGHT 256

static node *perr(parser *p, int line, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static node *perr(parser *p, int line, int code, const char *fmt, ...)
{
    if (p->rc) return NULL;
    p->rc = code;
    char msg[DP_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->err && p->errsz) snprintf(p->err, p->errsz, "jinja: line %d: %s", line, msg);
    return NULL;
}

static node *oom(parser *p) { return perr(p, p->t[p->pos].line, DP_ENOMEM, "out of memory"); }

static node *mk(parser *p, int type, int line)
{
    node *n = calloc(1, sizeof *n);
    if (!n) return oom(p);
    n->type = type;
    n->line = line;
    return n;
}

/* n's height from its children's; an expression too tall is an error (n freed). */
static node *tall(parser *p, node *n)
{
    if (!n) return NULL;
    int h = 0;
    const node *ch[4] = {n->a, n->b, n->c, n->d};
    for (int i = 0; i < 4; i++)
        if (ch[i] && ch[i]->h > h) h = ch[i]->h;
    for (size_t i = 0; i < n->nkids; i++)
        if (n->kids[i] && n->kids[i]->h > h) h = n->kids[i]->h;
    for (size_t i = 0; i < n->nkw; i++)
        if (n->kwv[i] && n->kwv[i]->h > h) h = n->kwv[i]->h;
    n->h = h + 1;
    if (n->h > PARSE_MAX_HEIGHT) {
        int line = n->line;
        node_free(n);
        return perr(p, line, DP_ERANGE, "expression too long or nested too deeply (more than %d levels)",
                    PARSE_MAX_HEIGHT);
    }
    return n;
}

static bool add_kid(parser *p, node *n, node *k)
{
    if (!k) return false;
    if (n->nkids == n->capk) {
        size_t nc = n->capk ? n->capk * 2 : 4;
        node **nk = realloc(n->kids, nc * sizeof *nk);
        if (!nk) {
            node_free(k);
            oom(p);
            return false;
        }
        n->kids = nk;
        n->capk = nc;
    }
    n->kids[n->nkids++] = k;
    return true;
}

static bool add_name(parser *p, char ***arr, size_t *n, const char *s)
{
    char **na = realloc(*arr, (*n + 1) * sizeof *na);
    if (!na) return oom(p), false;
    *arr = na;
    na[*n] = strdup(s);
    if (!na[*n]) return oom(p), false;
    (*n)++;
    return true;
}

static tok *cur(parser *p) { return &p->t[p->pos]; }
static bool is_op(parser *p, const char *op) { return cur(p)->type == T_OP && !strcmp(cur(p)->s, op); }
static bool is_name(parser *p, const char *s) { return cur(p)->type == T_NAME && !strcmp(cur(p)->s, s); }
static void adv(parser *p)
{
    if (p->pos + 1 < p->nt) p->pos++;
}

static bool accept_op(parser *p, const char *op)
{
    if (!is_op(p, op)) return false;
    adv(p);
    return true;
}

static bool accept_name(parser *p, const char *s)
{
    if (!is_name(p, s)) return false;
    adv(p);
    return true;
}

static const char *tok_desc(const tok *t)
{
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_TEXT: return "text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_STRING: return "a string";
    case T_INT:
    case T_FLOAT: return "a number";
    default: return t->s;
    }
}

static bool expect_op(parser *p, const char *op)
{
    if (accept_op(p, op)) return true;
    perr(p, cur(p)->line, DP_EINVAL, "expected '%s', got %s", op, tok_desc(cur(p)));
    return false;
}

static bool expect_type(parser *p, int type, const char *what)
{
    if (cur(p)->type == type) {
        adv(p);
        return true;
    }
    perr(p, cur(p)->line, DP_EINVAL, "expected %s, got %s", what, tok_desc(cur(p)));
    return false;
}

static const char *const known_filters[] = {
    "trim",   "length",     "count",   "tojson",   "string",     "int",        "float",   "lower",
    "upper",  "capitalize", "title",   "default",  "d",          "join",       "replace", "first",
    "last",   "list",       "reverse", "items",    "selectattr", "rejectattr", "map",     "select",
    "reject", "unique",     "sort",    "dictsort", "indent",     "abs",        "round",   "safe",
    "min",    "max",        "sum",     "attr",     "wordcount",  NULL};
static const char *const known_tests[] = {"defined", "undefined", "none",    "string",      "number",
                                          "integer", "float",     "mapping", "iterable",    "sequence",
                                          "boolean", "true",      "false",   "equalto",     "eq",
                                          "==",      "ne",        "!=",      "lt",          "<",
                                          "le",      "<=",        "gt",      ">",           "ge",
                                          ">=",      "odd",       "even",    "divisibleby", "in",
                                          "sameas",  "callable",  "lower",   "upper",       NULL};
static const char *const known_methods[] = {"strip",    "lstrip", "rstrip", "split", "startswith",
                                            "endswith", "upper",  "lower",  "title", "capitalize",
                                            "replace",  "find",   "count",  "get",   "items",
                                            "keys",     "values", "append", "join",  NULL};
static const char *const known_globals[] = {"raise_exception", "strftime_now", "namespace",
                                            "range",           "dict",         NULL};

static bool in_list(const char *const *l, const char *s)
{
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], s)) return true;
    return false;
}

static node *p_expr(parser *p);
static node *p_or(parser *p);
static node *p_unary(parser *p, bool with_filter);
static node *p_primary(parser *p);
static node *p_postfix(parser *p, node *n);

/* (args): positional and name=value arguments into n's kids/kw. */
static bool p_args(parser *p, node *n)
{
    if (!expect_op(p, "(")) return false;
    while (!is_op(p, ")")) {
        if (n->nkids + n->nkw > 0 && !expect_op(p, ",")) return false;
        if (is_op(p, ")")) break; /* trailing comma */
        if (cur(p)->type == T_NAME && p->pos + 1 < p->nt && p->t[p->pos + 1].type == T_OP &&
            !strcmp(p->t[p->pos + 1].s, "=")) {
            const char *k = cur(p)->s;
            adv(p);
            adv(p);
            char **nn = realloc(n->kwn, (n->nkw + 1) * sizeof *nn);
            if (!nn) return oom(p), false;
            n->kwn = nn;
            node **nv = realloc(n->kwv, (n->nkw + 1) * sizeof *nv);
            if (!nv) return oom(p), false;
            n->kwv = nv;
            n->kwn[n->nkw] = strdup(k);
            n->kwv[n->nkw] = NULL;
            n->nkw++;
            if (!n->kwn[n->nkw - 1]) return oom(p), false;
            n->kwv[n->nkw - 1] = p_expr(p);
            if (!n->kwv[n->nkw - 1]) return false;
        } else {
            if (n->nkw) {
                perr(p, cur(p)->line, DP_EINVAL, "positional argument after a keyword argument");
                return false;
            }
            if (!add_kid(p, n, p_expr(p))) return false;
        }
    }
    return expect_op(p, ")");
}

static bool note_call(parser *p, const char *name, int line)
{
    void *nc = realloc(p->calls, (p->ncalls + 1) * sizeof *p->calls);
    if (!nc) return oom(p), false;
    p->calls = nc;
    p->calls[p->ncalls].name = strdup(name);
    p->calls[p->ncalls].line = line;
    if (!p->calls[p->ncalls].name) return oom(p), false;
    p->ncalls++;
    return true;
}

static node *p_call(parser *p, node *callee)
{
    node *n = mk(p, N_CALL, cur(p)->line);
    if (!n) return node_free(callee), NULL;
    n->a = callee;
    if (callee->type == N_ATTR && !in_list(known_methods, callee->name)) {
        perr(p, callee->line, DP_EUNSUPPORTED, "unknown method '%s'", callee->name);
        node_free(n);
        return NULL;
    }
    if (callee->type == N_NAME && !in_list(known_globals, callee->name) &&
        !note_call(p, callee->name, callee->line)) {
        node_free(n);
        return NULL;
    }
    if (!p_args(p, n)) {
        node_free(n);
        return NULL;
    }
    return n;
}

static node *p_postfix(parser *p, node *n)
{
    while (n && (n = tall(p, n))) {
        int line = cur(p)->line;
        if (accept_op(p, ".")) {
            node *a = mk(p, N_ATTR, line);
            if (!a) return node_free(n), NULL;
            a->a = n;
            n = a;
            if (cur(p)->type == T_NAME) {
                a->name = strdup(cur(p)->s);
                if (!a->name) return node_free(n), oom(p);
                adv(p);
            } else if (cur(p)->type == T_INT) {
                a->type = N_ITEM;
                a->b = mk(p, N_LIT, line);
                if (!a->b || !(a->b->lit = jv_int(cur(p)->i))) return node_free(n), oom(p);
                adv(p);
            } else {
                perr(p, line, DP_EINVAL, "expected an attribute name after '.', got %s", tok_desc(cur(p)));
                return node_free(n), NULL;
            }
        } else if (accept_op(p, "[")) {
            node *s = mk(p, N_ITEM, line);
            if (!s) return node_free(n), NULL;
            s->a = n;
            n = s;
            node *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (is_op(p, ":")) {
                    slice = true;
                    adv(p);
                    if (++np > 2) {
                        perr(p, line, DP_EINVAL, "too many ':' in a slice");
                        break;
                    }
                    continue;
                }
                if (is_op(p, "]")) break;
                if (parts[np]) {
                    perr(p, cur(p)->line, DP_EINVAL, "expected ']' , got %s", tok_desc(cur(p)));
                    break;
                }
                parts[np] = p_expr(p);
                if (!parts[np]) break;
            }
            if (p->rc || !expect_op(p, "]")) {
                for (int k = 0; k < 3; k++) node_free(parts[k]);
                return node_free(n), NULL;
            }
            if (slice) {
                s->type = N_SLICE;
                s->b = parts[0];
                s->c = parts[1];
                s->d = parts[2];
            } else if (!parts[0]) {
                perr(p, line, DP_EINVAL, "empty subscript");
                return node_free(n), NULL;
            } else {
                s->b = parts[0];
            }
        } else if (is_op(p, "(")) {
            n = p_call(p, n);
        } else {
            break;
        }
    }
    return n;
}

static node *p_filter_expr(parser *p, node *n)
{
    while (n && (n = tall(p, n))) {
        int line = cur(p)->line;
        if (accept_op(p, "|")) {
            if (cur(p)->type != T_NAME) {
                perr(p, line, DP_EINVAL, "expected a filter name after '|'");
                return node_free(n), NULL;
            }
            if (!in_list(known_filters, cur(p)->s)) {
                perr(p, line, DP_EUNSUPPORTED, "unknown filter '%s'", cur(p)->s);
                return node_free(n), NULL;
            }
            node *f = mk(p, N_FILTER, line);
            if (!f) return node_free(n), NULL;
            f->a = n;
            n = f;
            if (!(f->name = strdup(cur(p)->s))) return node_free(n), oom(p);
            adv(p);
            if (is_op(p, "(") && !p_args(p, f)) return node_free(n), NULL;
        } else if (accept_name(p, "is")) {
            node *t = mk(p, N_TEST, line);
            if (!t) return node_free(n), NULL;
            t->a = n;
            n = t;
            t->neg = accept_name(p, "not");
            if (cur(p)->type != T_NAME) {
                perr(p, line, DP_EINVAL, "expected a test name after 'is'");
                return node_free(n), NULL;
            }
            if (!in_list(known_tests, cur(p)->s)) {
                perr(p, line, DP_EUNSUPPORTED, "unknown test '%s'", cur(p)->s);
                return node_free(n), NULL;
            }
            if (!(t->name = strdup(cur(p)->s))) return node_free(n), oom(p);
            adv(p);
            tok *c = cur(p);
            if (is_op(p, "(")) {
                if (!p_args(p, t)) return node_free(n), NULL;
            } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                        is_op(p, "[") || is_op(p, "{")) &&
                       !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and") && !is_name(p, "if")) {
                if (!add_kid(p, t, p_postfix(p, p_primary(p)))) return node_free(n), NULL;
            }
        } else if (is_op(p, "(")) {
            n = p_call(p, n);
        } else {
            break;
        }
    }
    return n;
}

static node *p_seq(parser *p, int type, const char *close, int line)
{
    node *n = mk(p, type, line);
    if (!n) return NULL;
    while (!is_op(p, close)) {
        if (n->nkids > 0 && !expect_op(p, ",")) return node_free(n), NULL;
        if (is_op(p, close)) break;
        if (type == N_DICTX) {
            if (!add_kid(p, n, p_expr(p)) || !expect_op(p, ":")) return node_free(n), NULL;
        }
        if (!add_kid(p, n, p_expr(p))) return node_free(n), NULL;
    }
    adv(p);
    return tall(p, n);
}

static node *p_primary(parser *p)
{
    tok *t = cur(p);
    int line = t->line;
    node *n = NULL;
    if (++p->depth > PARSE_MAX_DEPTH) {
        p->depth--;
        return perr(p, line, DP_ERANGE, "expression nested too deeply");
    }
    if (t->type == T_NAME) {
        const char *s = t->s;
        if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "false") || !strcmp(s, "False") ||
            !strcmp(s, "none") || !strcmp(s, "None")) {
            n = mk(p, N_LIT, line);
            if (n)
                n->lit = tolower((unsigned char)s[0]) == 'n' ? &j_none
                                                             : jv_bool(tolower((unsigned char)s[0]) == 't');
        } else {
            n = mk(p, N_NAME, line);
            if (n && !(n->name = strdup(s))) {
                node_free(n);
                n = oom(p);
            }
        }
        adv(p);
    } else if (t->type == T_STRING) {
        sbuf b = {0};
        bool ok = true;
        while (cur(p)->type == T_STRING) { /* adjacent literals concatenate */
            if (sb_add(&b, cur(p)->s, cur(p)->n)) ok = false;
            adv(p);
        }
        n = ok ? mk(p, N_LIT, line) : oom(p);
        if (n && !(n->lit = jv_strn(b.p ? b.p : "", b.n))) {
            node_free(n);
            n = oom(p);
        }
        free(b.p);
    } else if (t->type == T_INT || t->type == T_FLOAT) {
        n = mk(p, N_LIT, line);
        if (n && !(n->lit = t->type == T_INT ? jv_int(t->i) : jv_float(t->f))) {
            node_free(n);
            n = oom(p);
        }
        adv(p);
    } else if (accept_op(p, "(")) {
        if (accept_op(p, ")")) {
            n = mk(p, N_TUPLEX, line);
        } else {
            n = p_expr(p);
            if (n && is_op(p, ",")) {
                node *tu = mk(p, N_TUPLEX, line);
                if (!add_kid(p, tu, n)) {
                    node_free(tu);
                    n = NULL;
                } else {
                    n = tu;
                    while (accept_op(p, ",") && !is_op(p, ")"))
                        if (!add_kid(p, n, p_expr(p))) break;
                }
            }
            if (n && (p->rc || !expect_op(p, ")"))) {
                node_free(n);
                n = NULL;
            }
        }
    } else if (accept_op(p, "[")) {
        n = p_seq(p, N_LISTX, "]", line);
    } else if (accept_op(p, "{")) {
        n = p_seq(p, N_DICTX, "}", line);
    } else {
        n = perr(p, line, DP_EINVAL, "unexpected %s", tok_desc(t));
    }
    p->depth--;
    return tall(p, n);
}

static node *p_unary(parser *p, bool with_filter)
{
    int line = cur(p)->line;
    node *n;
    if (is_op(p, "-") || is_op(p, "+")) {
        int op = cur(p)->s[0];
        adv(p);
        if (++p->depth > PARSE_MAX_DEPTH) {
            p->depth--;
            return perr(p, line, DP_ERANGE, "expression nested too deeply");
        }
        node *x = p_unary(p, false);
        p->depth--;
        if (!x) return NULL;
        n = mk(p, N_UNARY, line);
        if (!n) return node_free(x), NULL;
        n->op = op;
        n->a = x;
        if (!(n = tall(p, n))) return NULL;
    } else {
        n = p_primary(p);
    }
    n = p_postfix(p, n);
    if (with_filter) n = p_filter_expr(p, n);
    return n;
}

static node *bin(parser *p, int type, int op, node *a, node *b, int line)
{
    if (!a || !b) {
        node_free(a);
        node_free(b);
        return NULL;
    }
    node *n = mk(p, type, line);
    if (!n) {
        node_free(a);
        node_free(b);
        return NULL;
    }
    n->op = op;
    n->a = a;
    n->b = b;
    return tall(p, n);
}

static node *p_pow(parser *p)
{
    node *n = p_unary(p, true);
    while (n && is_op(p, "**")) {
        int line = cur(p)->line;
        adv(p);
        n = bin(p, N_BIN, 'P', n, p_unary(p, true), line);
    }
    return n;
}

static node *p_math2(parser *p)
{
    node *n = p_pow(p);
    while (n) {
        int line = cur(p)->line, op;
        if (is_op(p, "*"))
            op = '*';
        else if (is_op(p, "/"))
            op = '/';
        else if (is_op(p, "//"))
            op = 'F';
        else if (is_op(p, "%"))
            op = '%';
        else
            break;
        adv(p);
        n = bin(p, N_BIN, op, n, p_pow(p), line);
    }
    return n;
}

static node *p_concat(parser *p)
{
    node *n = p_math2(p);
    while (n && is_op(p, "~")) {
        int line = cur(p)->line;
        adv(p);
        n = bin(p, N_BIN, '~', n, p_math2(p), line);
    }
    return n;
}

static node *p_math1(parser *p)
{
    node *n = p_concat(p);
    while (n && (is_op(p, "+") || is_op(p, "-"))) {
        int line = cur(p)->line, op = cur(p)->s[0];
        adv(p);
        n = bin(p, N_BIN, op, n, p_concat(p), line);
    }
    return n;
}

static node *p_compare(parser *p)
{
    node *n = p_math1(p);
    bool chained = false;
    while (n) {
        int line = cur(p)->line, op;
        if (is_op(p, "=="))
            op = 'e';
        else if (is_op(p, "!="))
            op = 'n';
        else if (is_op(p, "<"))
            op = '<';
        else if (is_op(p, ">"))
            op = '>';
        else if (is_op(p, "<="))
            op = 'l';
        else if (is_op(p, ">="))
            op = 'g';
        else if (is_name(p, "in"))
            op = 'i';
        else if (is_name(p, "not") && p->pos + 1 < p->nt && p->t[p->pos + 1].type == T_NAME &&
                 !strcmp(p->t[p->pos + 1].s, "in")) {
            op = 'I';
            adv(p);
        } else
            break;
        adv(p);
        node *rhs = p_math1(p);
        if (chained) {
            node_free(n);
            node_free(rhs);
            return perr(p, line, DP_EUNSUPPORTED, "unsupported chained comparison");
        }
        n = bin(p, N_CMP, op, n, rhs, line);
        chained = true;
    }
    return n;
}

static node *p_not(parser *p)
{
    if (is_name(p, "not")) {
        int line = cur(p)->line;
        adv(p);
        if (++p->depth > PARSE_MAX_DEPTH) {
            p->depth--;
            return perr(p, line, DP_ERANGE, "expression nested too deeply");
        }
        node *x = p_not(p);
        p->depth--;
        if (!x) return NULL;
        node *n = mk(p, N_NOT, line);
        if (!n) return node_free(x), NULL;
        n->a = x;
        return tall(p, n);
    }
    return p_compare(p);
}

static node *p_and(parser *p)
{
    node *n = p_not(p);
    while (n && is_name(p, "and")) {
        int line = cur(p)->line;
        adv(p);
        n = bin(p, N_AND, 0, n, p_not(p), line);
    }
    return n;
}

static node *p_or(parser *p)
{
    node *n = p_and(p);
    while (n && is_name(p, "or")) {
        int line = cur(p)->line;
        adv(p);
        n = bin(p, N_OR, 0, n, p_and(p), line);
    }
    return n;
}

static node *p_expr(parser *p)
{
    if (++p->depth > PARSE_MAX_DEPTH) {
        p->depth--;
        return perr(p, cur(p)->line, DP_ERANGE, "expression nested too deeply");
    }
    node *n = p_or(p);
    while (n && (n = tall(p, n)) && is_name(p, "if")) {
        int line = cur(p)->line;
        adv(p);
        node *c = mk(p, N_COND, line);
        if (!c) {
            node_free(n);
            n = NULL;
            break;
        }
        c->b = n;
        n = c;
        c->a = p_or(p);
        if (!c->a) {
            node_free(n);
            n = NULL;
            break;
        }
        if (accept_name(p, "else")) {
            c->c = p_expr(p);
            if (!c->c) {
                node_free(n);
                n = NULL;
                break;
            }
        }
    }
    p->depth--;
    return n;
}

/* An expression, or a tuple of them without parentheses (`a, b`). */
static node *p_tuple(parser *p)
{
    int line = cur(p)->line;
    node *n = p_expr(p);
    if (!n || !is_op(p, ",")) return n;
    node *t = mk(p, N_TUPLEX, line);
    if (!add_kid(p, t, n)) return node_free(t), NULL;
    while (accept_op(p, ",")) {
        if (cur(p)->type == T_BLOCK_END || cur(p)->type == T_VAR_END) break;
        if (!add_kid(p, t, p_expr(p))) return node_free(t), NULL;
    }
    return tall(p, t);
}

/* ---- statements ---- */

static node *p_body(parser *p, const char *const *stops, const char *opener, int open_line, const char **hit);

static bool end_stmt(parser *p) { return expect_type(p, T_BLOCK_END, "end of statement '%}'"); }

static bool p_targets(parser *p, node *n)
{
    bool paren = accept_op(p, "(");
    do {
        if (cur(p)->type != T_NAME) {
            perr(p, cur(p)->line, DP_EINVAL, "expected a variable name, got %s", tok_desc(cur(p)));
            return false;
        }
        if (!add_name(p, &n->names, &n->nnames, cur(p)->s)) return false;
        adv(p);
    } while (accept_op(p, ","));
    return !paren || expect_op(p, ")");
}

static const char *const s_if[] = {"elif", "else", "endif", NULL};
static const char *const s_endif[] = {"endif", NULL};
static const char *const s_for[] = {"else", "endfor", NULL};
static const char *const s_endfor[] = {"endfor", NULL};
static const char *const s_endset[] = {"endset", NULL};
static const char *const s_endmacro[] = {"endmacro", NULL};
static const char *const s_endgen[] = {"endgeneration", NULL};

static node *p_if(parser *p, int line, const char *opener)
{
    node *n = mk(p, N_IF, line);
    if (!n) return NULL;
    const char *hit = NULL;
    if (!(n->a = p_expr(p)) || !end_stmt(p) || !(n->b = p_body(p, s_if, opener, line, &hit)))
        return node_free(n), NULL;
    if (!strcmp(hit, "elif")) {
        /* Each elif nests an if (parsed, rendered and freed recursively):
         * count it, or 100000 elifs overflow the stack. */
        if (++p->depth > PARSE_MAX_DEPTH) {
            p->depth--;
            perr(p, cur(p)->line, DP_ERANGE, "more than %d 'elif' in one 'if'", PARSE_MAX_DEPTH);
            return node_free(n), NULL;
        }
        n->c = p_if(p, cur(p)->line, opener);
        p->depth--;
        if (!n->c) return node_free(n), NULL;
        return n; /* the innermost if consumed endif */
    }
    if (!strcmp(hit, "else")) {
        if (!end_stmt(p) || !(n->c = p_body(p, s_endif, opener, line, &hit))) return node_free(n), NULL;
    }
    if (!end_stmt(p)) return node_free(n), NULL;
    return n;
}

static node *p_stmt(parser *p)
{
    tok *t = cur(p);
    int line = t->line;
    if (t->type != T_NAME) return perr(p, line, DP_EINVAL, "expected a statement name, got %s", tok_desc(t));
    char kw[32];
    snprintf(kw, sizeof kw, "%s", t->s);
    adv(p);
    const char *hit = NULL;
    node *n = NULL;
    if (!strcmp(kw, "if")) return p_if(p, line, "if");
    if (!strcmp(kw, "for")) {
        n = mk(p, N_FOR, line);
        if (!n || !p_targets(p, n)) return node_free(n), NULL;
        if (!accept_name(p, "in")) {
            perr(p, cur(p)->line, DP_EINVAL, "expected 'in' in 'for', got %s", tok_desc(cur(p)));
            return node_free(n), NULL;
        }
        if (!(n->a = p_or(p))) return node_free(n), NULL;
        if (accept_name(p, "if") && !(n->b = p_or(p))) return node_free(n), NULL;
        if (is_name(p, "recursive")) {
            perr(p, line, DP_EUNSUPPORTED, "unsupported 'recursive' loop");
            return node_free(n), NULL;
        }
        if (!end_stmt(p)) return node_free(n), NULL;
        p->in_loop++;
        n->c = p_body(p, s_for, "for", line, &hit);
        p->in_loop--;
        if (!n->c) return node_free(n), NULL;
        if (!strcmp(hit, "else")) {
            if (!end_stmt(p) || !(n->d = p_body(p, s_endfor, "for", line, &hit))) return node_free(n), NULL;
        }
        if (!end_stmt(p)) return node_free(n), NULL;
        return n;
    }
    if (!strcmp(kw, "set")) {
        n = mk(p, N_SET, line);
        if (!n) return NULL;
        if (cur(p)->type != T_NAME) {
            perr(p, cur(p)->line, DP_EINVAL, "expected a variable name after 'set'");
            return node_free(n), NULL;
        }
        if (p->pos + 1 < p->nt && p->t[p->pos + 1].type == T_OP && !strcmp(p->t[p->pos + 1].s, ".")) {
            n->name = strdup(cur(p)->s);
            adv(p);
            adv(p);
            if (cur(p)->type != T_NAME) {
                perr(p, cur(p)->line, DP_EINVAL, "expected an attribute name in 'set'");
                return node_free(n), NULL;
            }
            n->attr = strdup(cur(p)->s);
            adv(p);
            if (!n->name || !n->attr) return node_free(n), oom(p);
        } else if (!p_targets(p, n)) {
            return node_free(n), NULL;
        }
        if (accept_op(p, "=")) {
            if (!(n->a = p_tuple(p)) || !end_stmt(p)) return node_free(n), NULL;
            return n;
        }
        if (n->attr || n->nnames != 1) {
            perr(p, line, DP_EINVAL, "a block 'set' takes one variable name");
            return node_free(n), NULL;
        }
        if (is_op(p, "|")) {
            perr(p, line, DP_EUNSUPPORTED, "unsupported filter on a block 'set'");
            return node_free(n), NULL;
        }
        n->type = N_SETBLOCK;
        if (!end_stmt(p) || !(n->a = p_body(p, s_endset, "set", line, &hit)) || !end_stmt(p))
            return node_free(n), NULL;
        return n;
    }
    if (!strcmp(kw, "macro")) {
        n = mk(p, N_MACRO, line);
        if (!n) return NULL;
        if (cur(p)->type != T_NAME) {
            perr(p, cur(p)->line, DP_EINVAL, "expected a macro name");
            return node_free(n), NULL;
        }
        if (!(n->name = strdup(cur(p)->s)) || !add_name(p, &p->macros, &p->nmacros, cur(p)->s))
            return node_free(n), oom(p);
        adv(p);
        if (!expect_op(p, "(")) return node_free(n), NULL;
        while (!is_op(p, ")")) {
            if (n->nnames > 0 && !expect_op(p, ",")) return node_free(n), NULL;
            if (cur(p)->type != T_NAME) {
                perr(p, cur(p)->line, DP_EINVAL, "expected a parameter name");
                return node_free(n), NULL;
            }
            if (!add_name(p, &n->names, &n->nnames, cur(p)->s)) return node_free(n), NULL;
            adv(p);
            node *def = NULL;
            if (accept_op(p, "=") && !(def = p_expr(p))) return node_free(n), NULL;
            if (def) {
                if (!add_kid(p, n, def)) return node_free(n), NULL;
            } else {
                /* a placeholder keeps kids aligned with names */
                node *none = mk(p, N_LIT, line);
                if (!none) return node_free(n), NULL;
                none->lit = &j_undef;
                if (!add_kid(p, n, none)) return node_free(n), NULL;
            }
        }
        adv(p);
        int saved = p->in_loop;
        p->in_loop = 0;
        bool ok = end_stmt(p) && (n->a = p_body(p, s_endmacro, "macro", line, &hit)) && end_stmt(p);
        p->in_loop = saved;
        if (!ok) return node_free(n), NULL;
        return n;
    }
    if (!strcmp(kw, "generation")) {
        /* Hugging Face's AssistantTracker marks assistant text; rendering is unchanged. */
        if (!end_stmt(p)) return NULL;
        n = p_body(p, s_endgen, "generation", line, &hit);
        if (n && !end_stmt(p)) return node_free(n), NULL;
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        if (!p->in_loop) return perr(p, line, DP_EINVAL, "'%s' outside a loop", kw);
        n = mk(p, kw[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        if (n && !end_stmt(p)) return node_free(n), NULL;
        return n;
    }
    static const char *const enders[] = {"elif",     "else",          "endif",  "endfor", "endset",
                                         "endmacro", "endgeneration", "endraw", NULL};
    if (in_list(enders, kw)) return perr(p, line, DP_EINVAL, "unexpected '%s'", kw);
    return perr(p, line, DP_EUNSUPPORTED, "unknown statement '%s'", kw);
}

/* Statements up to one of stops (then *hit names it, its tag's name
 * consumed, the rest of the tag left to the caller) or the end. */
static node *p_body(parser *p, const char *const *stops, const char *opener, int open_line, const char **hit)
{
    node *body = mk(p, N_BODY, cur(p)->line);
    if (!body) return NULL;
    if (++p->depth > PARSE_MAX_DEPTH) {
        p->depth--;
        node_free(body);
        return perr(p, open_line, DP_ERANGE, "statements nested too deeply");
    }
    *hit = NULL;
    for (;;) {
        tok *t = cur(p);
        if (t->type == T_EOF) {
            if (stops) {
                int last = 0;
                while (stops[last + 1]) last++;
                node_free(body);
                body = perr(p, open_line, DP_EINVAL, "unclosed '%s' (no '%s')", opener, stops[last]);
            }
            break;
        }
        if (t->type == T_TEXT) {
            node *x = mk(p, N_TEXT, t->line);
            if (!x || !(x->lit = jv_strn(t->s, t->n))) {
                node_free(x);
                node_free(body);
                body = oom(p);
                break;
            }
            adv(p);
            if (!add_kid(p, body, x)) {
                node_free(body);
                body = NULL;
                break;
            }
        } else if (t->type == T_VAR_BEGIN) {
            adv(p);
            node *x = mk(p, N_OUT, t->line);
            if (!x || !(x->a = p_tuple(p)) || !expect_type(p, T_VAR_END, "'}}'")) {
                node_free(x);
                node_free(body);
                body = NULL;
                break;
            }
            if (!add_kid(p, body, x)) {
                node_free(body);
                body = NULL;
                break;
            }
        } else if (t->type == T_BLOCK_BEGIN) {
            tok *kw = &p->t[p->pos + 1 < p->nt ? p->pos + 1 : p->pos];
            if (stops && kw->type == T_NAME && in_list(stops, kw->s)) {
                *hit = stops[0];
                for (int i = 0; stops[i]; i++)
                    if (!strcmp(stops[i], kw->s)) *hit = stops[i];
                adv(p);
                adv(p);
                break;
            }
            adv(p);
            node *x = p_stmt(p);
            if (!x || !add_kid(p, body, x)) {
                node_free(body);
                body = NULL;
                break;
            }
        } else {
            node_free(body);
            body = perr(p, t->line, DP_EINVAL, "unexpected %s", tok_desc(t));
            break;
        }
    }
    p->depth--;
    return body;
}

void jinja_free(jinja_tmpl *t)
{
    if (!t) return;
    node_free(t->root);
    free(t);
}

int jinja_parse(const char *src, size_t len, jinja_tmpl **out, char *err, size_t errsz)
{
    *out = NULL;
    if (!src) len = 0;
    /* Jinja normalises newlines and drops one trailing newline
     * (keep_trailing_newline=False). */
    char *s = malloc(len + 1);
    if (!s) return dp_err(err, errsz, DP_ENOMEM, "jinja: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = '\0';
    lexer L = {.src = s, .len = n, .line = 1, .err = err, .errsz = errsz};
    int rc = lex_all(&L);
    if (!rc) rc = lex_push(&L, T_EOF, L.line, NULL, 0);
    free(s);
    node *root = NULL;
    parser p = {.t = L.t, .nt = L.nt, .err = err, .errsz = errsz};
    if (!rc) {
        const char *hit = NULL;
        root = p_body(&p, NULL, NULL, 1, &hit);
        rc = p.rc;
        if (!rc && !root) rc = dp_err(err, errsz, DP_ENOMEM, "jinja: out of memory");
    }
    /* A call of a name that is neither a global nor a macro of this template. */
    for (size_t i = 0; !rc && i < p.ncalls; i++) {
        bool found = false;
        for (size_t k = 0; k < p.nmacros && !found; k++) found = !strcmp(p.macros[k], p.calls[i].name);
        if (!found)
            rc = dp_err(err, errsz, DP_EUNSUPPORTED, "jinja: line %d: unknown function '%s'", p.calls[i].line,
                        p.calls[i].name);
    }
    for (size_t i = 0; i < p.ncalls; i++) free(p.calls[i].name);
    free(p.calls);
    for (size_t i = 0; i < p.nmacros; i++) free(p.macros[i]);
    free(p.macros);
    for (size_t i = 0; i < L.nt; i++) free(L.t[i].s);
    free(L.t);
    if (rc) {
        node_free(root);
        return rc;
    }
    jinja_tmpl *t = calloc(1, sizeof *t);
    if (!t) {
        node_free(root);
        return dp_err(err, errsz, DP_ENOMEM, "jinja: out of memory");
    }
    t->root = root;
    *out = t;
    return 0;
}

/* ======================================================================
 * rendering
 * ====================================================================== */

typedef struct frame {
    jv *vars;
    struct frame *parent;
} frame;

typedef struct rs {
    const jv *ctx;
    frame *top, *root;
    sbuf *out;
    size_t max_output;
    size_t budget; /* bytes of strings that may still be made */
    long iters_left;
    long max_list; /* items of a list an expression makes */
    int depth, max_depth;
    time_t now;
    int rc;
    int ctl; /* 1: break, 2: continue */
    char *err;
    size_t errsz;
    bool sb_over; /* a buffer reached the string limit (sb_within_limit) */
    long steps_left; /* comparisons left (step) */
    long scan_left; /* steps of holds_namespace left */
    long max_ms;     /* wall-clock limit (0: none) */
    struct timespec t_end;
    unsigned ticks;  /* in_time reads the clock every 256th call */
} rs;

/* The wall-clock bound of a render (jinja_opts.max_ms): the count limits
 * bound loops, calls, strings and comparisons, but not every linear scan
 * (a megabyte string's `in` inside a long loop); a template from a request
 * must not hold the thread that renders it for longer than this. */
static bool in_time(rs *r)
{
    if (!r->max_ms || (r->ticks++ & 255u)) return true;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec < r->t_end.tv_sec || (now.tv_sec == r->t_end.tv_sec && now.tv_nsec < r->t_end.tv_nsec);
}

static jv *rfail(rs *r, int line, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static bool step(void)
{
    if (!cur_render) return true;
    if (!in_time(cur_render)) {
        rfail(cur_render, 0, DP_ERANGE, "the rendering took longer than its limit of %ld ms",
              cur_render->max_ms);
        return false;
    }
    if (cur_render->steps_left > 0) {
        cur_render->steps_left--;
        return true;
    }
    rfail(cur_render, 0, DP_ERANGE, "the template compared more values than its limit of %ld",
          (long)cur_render->max_list * 100);
    return false;
}

static bool sb_within_limit(size_t n)
{
    if (!cur_render || n <= cur_render->max_output + 64) return true;
    cur_render->sb_over = true;
    return false;
}

static jv *rfail(rs *r, int line, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static jv *rfail(rs *r, int line, int code, const char *fmt, ...)
{
    if (r->rc) return NULL;
    r->rc = code;
    char msg[DP_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->err && r->errsz) snprintf(r->err, r->errsz, "jinja: line %d: %s", line, msg);
    return NULL;
}

/* A failed buffer append: the string limit (sb_within_limit) or memory. */
static jv *room(rs *r, int line)
{
    if (r->sb_over)
        return rfail(r, line, DP_ERANGE, "a string exceeds the limit of %zu bytes", r->max_output);
    return rfail(r, line, DP_ENOMEM, "out of memory");
}

static bool charge_item(rs *r)
{
    if (r->budget < sizeof(jv *)) {
        rfail(r, 0, DP_ERANGE, "the template made more than its limit of list items");
        return false;
    }
    r->budget -= sizeof(jv *);
    return true;
}

/* Every string a rendering makes is charged to its budget, so that a loop
 * that builds big strings ends with an error. */
static jv *mkstr(rs *r, int line, const char *s, size_t n)
{
    if (n > r->max_output)
        return rfail(r, line, DP_ERANGE, "a string of %zu bytes exceeds the limit of %zu", n, r->max_output);
    if (n > r->budget)
        return rfail(r, line, DP_ERANGE, "the template made more than its limit of string bytes");
    r->budget -= n;
    jv *v = jv_strn(s, n);
    return v ? v : room(r, line);
}

static jv *sb_take(rs *r, int line, sbuf *b)
{
    jv *v = mkstr(r, line, b->p ? b->p : "", b->n);
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
    return v;
}

static const char *type_name(const jv *v)
{
    switch (v->kind) {
    case JV_UNDEFINED: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STRING: return "str";
    case JV_LIST: return "list";
    case JV_DICT: return "dict";
    case JV_NAMESPACE: return "Namespace";
    case JV_CALLABLE: return "function";
    }
    return "?";
}

static bool truthy(const jv *v)
{
    switch (v->kind) {
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STRING: return v->u.s.n > 0;
    case JV_LIST: return v->u.l.n > 0;
    case JV_DICT: return v->u.d.n > 0;
    case JV_NAMESPACE:
    case JV_CALLABLE: return true;
    default: return false;
    }
}

static bool is_num(const jv *v) { return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL; }
static double num_f(const jv *v)
{
    return v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : v->u.b ? 1.0 : 0.0;
}
/* A float beyond int64 (or NaN) saturates: the cast alone is undefined. */
static int64_t f_to_i(double f)
{
    if (isnan(f)) return 0;
    if (f >= 9223372036854775807.0) return INT64_MAX;
    if (f <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)f;
}
static int64_t num_i(const jv *v)
{
    return v->kind == JV_INT ? v->u.i : v->kind == JV_BOOL ? v->u.b : f_to_i(v->u.f);
}

static bool jv_eq(const jv *a, const jv *b)
{
    /* Comparisons are charged (step): 'x in big_list' in a loop, unique
     * of 100000 items, or == of lists sharing items are quadratic or worse. */
    if ((a->kind == JV_LIST || a->kind == JV_DICT || a->kind == JV_NAMESPACE) && !step()) return false;
    if (is_num(a) && is_num(b)) {
        if (a->kind == JV_FLOAT || b->kind == JV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->kind != b->kind) {
        bool ad = a->kind == JV_DICT || a->kind == JV_NAMESPACE,
             bd = b->kind == JV_DICT || b->kind == JV_NAMESPACE;
        if (!(ad && bd)) return false;
    }
    switch (a->kind) {
    case JV_UNDEFINED:
    case JV_NONE: return true;
    case JV_STRING: return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case JV_LIST:
        if (a->u.l.n != b->u.l.n) return false;
        for (size_t i = 0; i < a->u.l.n; i++)
            if (!jv_eq(a->u.l.v[i], b->u.l.v[i])) return false;
        return true;
    case JV_DICT:
    case JV_NAMESPACE:
        if (a->u.d.n != b->u.d.n) return false;
        for (size_t i = 0; i < a->u.d.n; i++) {
            long k = dict_find(b, a->u.d.k[i]);
            if (k < 0 || !jv_eq(a->u.d.v[i], b->u.d.v[k])) return false;
        }
        return true;
    case JV_CALLABLE: return a->u.c.macro == b->u.c.macro && a->u.c.builtin == b->u.c.builtin;
    default: return false;
    }
}

/* ---- Python's str() and repr() ---- */

static int fmt_float(sbuf *b, double f)
{
    if (isnan(f)) return sb_str(b, "nan");
    if (isinf(f)) return sb_str(b, f < 0 ? "-inf" : "inf");
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX; Python writes positional notation for
     * exponents in [-4, 16). */
    char *e = strchr(buf, 'e');
    int exp = atoi(e + 1);
    *e = '\0';
    char digits[24];
    size_t nd = 0;
    bool neg = buf[0] == '-';
    for (char *q = buf + neg; *q; q++)
        if (isdigit((unsigned char)*q)) digits[nd++] = *q;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    sbuf o = {0};
    int rc = 0;
    if (neg) rc |= sb_add(&o, "-", 1);
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            rc |= sb_str(&o, "0.");
            for (int k = 0; k < -exp - 1; k++) rc |= sb_add(&o, "0", 1);
            rc |= sb_add(&o, digits, nd);
        } else {
            for (int k = 0; k <= exp; k++) rc |= sb_add(&o, (size_t)k < nd ? &digits[k] : "0", 1);
            rc |= sb_add(&o, ".", 1);
            if ((size_t)exp + 1 < nd)
                rc |= sb_add(&o, digits + exp + 1, nd - (size_t)exp - 1);
            else
                rc |= sb_add(&o, "0", 1);
        }
    } else {
        rc |= sb_add(&o, digits, 1);
        if (nd > 1) {
            rc |= sb_add(&o, ".", 1);
            rc |= sb_add(&o, digits + 1, nd - 1);
        }
        rc |= sb_printf(&o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    if (!rc) rc = sb_add(b, o.p, o.n);
    free(o.p);
    return rc;
}

static int to_repr(sbuf *b, const jv *v, int depth);

static int to_str(sbuf *b, const jv *v, int depth)
{
    switch (v->kind) {
    case JV_UNDEFINED: return 0;
    case JV_NONE: return sb_str(b, "None");
    case JV_BOOL: return sb_str(b, v->u.b ? "True" : "False");
    case JV_INT: return sb_printf(b, "%" PRId64, v->u.i);
    case JV_FLOAT: return fmt_float(b, v->u.f);
    case JV_STRING: return sb_add(b, v->u.s.p, v->u.s.n);
    case JV_CALLABLE: return sb_str(b, "<function>");
    default: return to_repr(b, v, depth);
    }
}

static int to_repr(sbuf *b, const jv *v, int depth)
{
    int rc = 0;
    if (depth > 64) return sb_str(b, "...");
    switch (v->kind) {
    case JV_STRING: {
        bool sq = memchr(v->u.s.p, '\'', v->u.s.n) != NULL, dq = memchr(v->u.s.p, '"', v->u.s.n) != NULL;
        char q = sq && !dq ? '"' : '\'';
        rc |= sb_add(b, &q, 1);
        for (size_t i = 0; i < v->u.s.n && !rc; i++) { /* !rc: stop at the size limit */
            unsigned char c = (unsigned char)v->u.s.p[i];
            if (c == '\\' || c == (unsigned char)q) {
                char e[2] = {'\\', (char)c};
                rc |= sb_add(b, e, 2);
            } else if (c == '\n')
                rc |= sb_str(b, "\\n");
            else if (c == '\r')
                rc |= sb_str(b, "\\r");
            else if (c == '\t')
                rc |= sb_str(b, "\\t");
            else if (c < 0x20 || c == 0x7f)
                rc |= sb_printf(b, "\\x%02x", c);
            else
                rc |= sb_add(b, (const char *)&c, 1);
        }
        rc |= sb_add(b, &q, 1);
        return rc;
    }
    case JV_LIST:
        rc |= sb_add(b, v->u.l.tuple ? "(" : "[", 1);
        for (size_t i = 0; i < v->u.l.n && !rc; i++) {
            if (i) rc |= sb_str(b, ", ");
            rc |= to_repr(b, v->u.l.v[i], depth + 1);
        }
        if (v->u.l.tuple && v->u.l.n == 1) rc |= sb_add(b, ",", 1);
        return rc | sb_add(b, v->u.l.tuple ? ")" : "]", 1);
    case JV_DICT:
    case JV_NAMESPACE:
        rc |= sb_str(b, v->kind == JV_NAMESPACE ? "<Namespace {" : "{");
        for (size_t i = 0; i < v->u.d.n && !rc; i++) {
            if (i) rc |= sb_str(b, ", ");
            rc |= to_repr(b, v->u.d.k[i], depth + 1);
            rc |= sb_str(b, ": ");
            rc |= to_repr(b, v->u.d.v[i], depth + 1);
        }
        return rc | sb_str(b, v->kind == JV_NAMESPACE ? "}>" : "}");
    case JV_UNDEFINED: return sb_str(b, "Undefined");
    default: return to_str(b, v, depth);
    }
}

/* str(v) as a new string value. */
static jv *str_of(rs *r, int line, jv *v)
{
    if (v->kind == JV_STRING) return jv_ref(v);
    sbuf b = {0};
    if (to_str(&b, v, 0)) {
        free(b.p);
        return room(r, line);
    }
    return sb_take(r, line, &b);
}

/* ---- JSON, as Python's json.dumps ---- */

typedef struct json_opts {
    const char *indent; /* NULL: one line */
    const char *item_sep, *key_sep;
    bool sort_keys, ascii;
} json_opts;

static int json_str(sbuf *b, const char *s, size_t n, bool ascii)
{
    int rc = sb_add(b, "\"", 1);
    for (size_t i = 0; i < n && !rc;) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"':
            rc = sb_str(b, "\\\"");
            i++;
            continue;
        case '\\':
            rc = sb_str(b, "\\\\");
            i++;
            continue;
        case '\n':
            rc = sb_str(b, "\\n");
            i++;
            continue;
        case '\r':
            rc = sb_str(b, "\\r");
            i++;
            continue;
        case '\t':
            rc = sb_str(b, "\\t");
            i++;
            continue;
        case '\b':
            rc = sb_str(b, "\\b");
            i++;
            continue;
        case '\f':
            rc = sb_str(b, "\\f");
            i++;
            continue;
        default: break;
        }
        if (c < 0x20) {
            rc = sb_printf(b, "\\u%04x", c);
            i++;
        } else if (c >= 0x80 && ascii) {
            uint32_t cp;
            size_t l = unicode_utf8_decode((const unsigned char *)s + i, n - i, &cp);
            if (DP_UNI_IS_INVALID(cp)) cp = 0xFFFD;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                rc = sb_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                rc = sb_printf(b, "\\u%04x", cp);
            }
            i += l ? l : 1;
        } else {
            rc = sb_add(b, s + i, 1);
            i++;
        }
    }
    return rc ? rc : sb_add(b, "\"", 1);
}

static int cmp_keys(const void *x, const void *y, void *d);

static int json_dump(rs *r, int line, sbuf *b, const jv *v, const json_opts *o, int level)
{
    if (level > 64) return rfail(r, line, DP_ERANGE, "tojson: nesting too deep"), -1;
    int rc = 0;
    switch (v->kind) {
    case JV_NONE: return sb_str(b, "null");
    case JV_BOOL: return sb_str(b, v->u.b ? "true" : "false");
    case JV_INT: return sb_printf(b, "%" PRId64, v->u.i);
    case JV_FLOAT:
        if (isnan(v->u.f)) return sb_str(b, "NaN");
        if (isinf(v->u.f)) return sb_str(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        return fmt_float(b, v->u.f);
    case JV_STRING: return json_str(b, v->u.s.p, v->u.s.n, o->ascii);
    case JV_LIST:
    case JV_DICT: {
        bool list = v->kind == JV_LIST;
        size_t n = list ? v->u.l.n : v->u.d.n;
        if (n == 0) return sb_str(b, list ? "[]" : "{}");
        size_t *ord = malloc(n * sizeof *ord);
        if (!ord) return DP_ENOMEM;
        for (size_t i = 0; i < n; i++) ord[i] = i;
        if (!list && o->sort_keys) qsort_r(ord, n, sizeof *ord, cmp_keys, (void *)v);
        rc |= sb_add(b, list ? "[" : "{", 1);
        for (size_t i = 0; i < n && !rc && !r->rc; i++) {
            if (i) rc |= sb_str(b, o->indent ? "," : o->item_sep);
            if (o->indent) {
                rc |= sb_add(b, "\n", 1);
                for (int k = 0; k <= level; k++) rc |= sb_str(b, o->indent);
            }
            if (list) {
                rc |= json_dump(r, line, b, v->u.l.v[ord[i]], o, level + 1);
            } else {
                const jv *k = v->u.d.k[ord[i]];
                if (k->kind == JV_STRING) {
                    rc |= json_str(b, k->u.s.p, k->u.s.n, o->ascii);
                } else {
                    sbuf ks = {0};
                    rc |= k->kind == JV_NONE   ? sb_str(&ks, "null")
                          : k->kind == JV_BOOL ? sb_str(&ks, k->u.b ? "true" : "false")
                                               : to_str(&ks, k, 0);
                    rc |= json_str(b, ks.p ? ks.p : "", ks.n, o->ascii);
                    free(ks.p);
                }
                rc |= sb_str(b, o->key_sep);
                rc |= json_dump(r, line, b, v->u.d.v[ord[i]], o, level + 1);
            }
        }
        free(ord);
        if (o->indent) {
            rc |= sb_add(b, "\n", 1);
            for (int k = 0; k < level; k++) rc |= sb_str(b, o->indent);
        }
        rc |= sb_add(b, list ? "]" : "}", 1);
        if (b->n > r->max_output) return rfail(r, line, DP_ERANGE, "tojson: output too large"), -1;
        return rc;
    }
    default: rfail(r, line, DP_EINVAL, "Object of type %s is not JSON serializable", type_name(v)); return -1;
    }
}

/* ---- strings ---- */

static bool py_space(uint32_t cp) { return unicode_is_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

/* Code point count; Python's len(). */
static size_t u_len(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

/* Byte offsets of the code points of s (n + 1 entries, last = n). */
static size_t *u_offsets(const char *s, size_t n, size_t *count)
{
    size_t c = 0;
    size_t *off = malloc((n + 1) * sizeof *off);
    if (!off) return NULL;
    for (size_t i = 0; i < n;) {
        off[c++] = i;
        uint32_t cp;
        size_t l = unicode_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        i += l ? l : 1;
    }
    off[c] = n;
    *count = c;
    return off;
}

/* Strip: chars NULL strips whitespace, else any of the code points in chars. */
static bool in_chars(uint32_t cp, const jv *chars)
{
    if (!chars) return py_space(cp);
    for (size_t i = 0; i < chars->u.s.n;) {
        uint32_t c;
        size_t l = unicode_utf8_decode((const unsigned char *)chars->u.s.p + i, chars->u.s.n - i, &c);
        if (c == cp) return true;
        i += l ? l : 1;
    }
    return false;
}

static jv *do_strip(rs *r, int line, const jv *s, const jv *chars, bool left, bool right)
{
    const unsigned char *u = (const unsigned char *)s->u.s.p;
    size_t n = s->u.s.n, start = 0, end = n;
    if (left) {
        while (start < n) {
            uint32_t cp;
            size_t l = unicode_utf8_decode(u + start, n - start, &cp);
            if (!in_chars(cp, chars)) break;
            start += l ? l : 1;
        }
    }
    if (right) {
        while (end > start) {
            size_t b = end - 1;
            while (b > start && (u[b] & 0xC0) == 0x80) b--;
            uint32_t cp;
            unicode_utf8_decode(u + b, end - b, &cp);
            if (!in_chars(cp, chars)) break;
            end = b;
        }
    }
    return mkstr(r, line, s->u.s.p + start, end - start);
}

static jv *case_map(rs *r, int line, const jv *s, int mode /* 'u' 'l' 'c' 't' */)
{
    jv *o = mkstr(r, line, s->u.s.p, s->u.s.n);
    if (!o) return NULL;
    bool word_start = true, first = true;
    for (size_t i = 0; i < o->u.s.n; i++) {
        char *c = &o->u.s.p[i];
        bool alpha = isalpha((unsigned char)*c) && !((unsigned char)*c & 0x80);
        switch (mode) {
        case 'u': *c = (char)toupper((unsigned char)*c); break;
        case 'l': *c = (char)tolower((unsigned char)*c); break;
        case 'c': *c = (char)(first ? toupper((unsigned char)*c) : tolower((unsigned char)*c)); break;
        case 't':
            if (alpha) *c = (char)(word_start ? toupper((unsigned char)*c) : tolower((unsigned char)*c));
            word_start = !alpha && !((unsigned char)*c & 0x80);
            break;
        default: break;
        }
        if (((unsigned char)*c & 0xC0) != 0x80) first = false;
    }
    return o;
}

static jv *do_replace(rs *r, int line, const jv *s, const jv *old, const jv *new_, int64_t count)
{
    sbuf b = {0};
    int rc = 0;
    const char *p = s->u.s.p, *end = p + s->u.s.n;
    size_t on = old->u.s.n;
    int64_t done = 0;
    if (on == 0) { /* Python inserts new between every code point */
        for (size_t i = 0; i <= s->u.s.n && !rc;) {
            if (count < 0 || done < count) {
                rc |= sb_add(&b, new_->u.s.p, new_->u.s.n);
                done++;
            }
            if (i == s->u.s.n) break;
            size_t j = i + 1;
            while (j < s->u.s.n && ((unsigned char)p[j] & 0xC0) == 0x80) j++;
            rc |= sb_add(&b, p + i, j - i);
            i = j;
            if (b.n > r->max_output) break;
        }
    } else {
        while (p < end && !rc) {
            const char *f = (count < 0 || done < count) ? memmem(p, (size_t)(end - p), old->u.s.p, on) : NULL;
            if (!f) {
                rc |= sb_add(&b, p, (size_t)(end - p));
                break;
            }
            rc |= sb_add(&b, p, (size_t)(f - p));
            rc |= sb_add(&b, new_->u.s.p, new_->u.s.n);
            p = f + on;
            done++;
            if (b.n > r->max_output) break;
        }
    }
    if (rc) {
        free(b.p);
        return room(r, line);
    }
    return sb_take(r, line, &b);
}

static jv *do_split(rs *r, int line, const jv *s, const jv *sep, int64_t maxsplit)
{
    jv *l = jv_list();
    if (!l) return room(r, line);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    int64_t splits = 0;
    if (!sep) {
        const unsigned char *u = (const unsigned char *)p;
        for (;;) {
            while (i < n) { /* skip whitespace */
                uint32_t cp;
                size_t len = unicode_utf8_decode(u + i, n - i, &cp);
                if (!py_space(cp)) break;
                i += len ? len : 1;
            }
            if (i >= n) break;
            size_t st = i;
            if (maxsplit >= 0 && splits >= maxsplit) { /* the rest, as is (Python keeps its trailing space) */
                if (jv_list_push(l, mkstr(r, line, p + st, n - st))) goto fail;
                break;
            }
            while (i < n) {
                uint32_t cp;
                size_t len = unicode_utf8_decode(u + i, n - i, &cp);
                if (py_space(cp)) break;
                i += len ? len : 1;
            }
            if (jv_list_push(l, mkstr(r, line, p + st, i - st))) goto fail;
            splits++;
        }
        return l;
    }
    if (sep->u.s.n == 0) {
        jv_unref(l);
        return rfail(r, line, DP_EINVAL, "empty separator");
    }
    for (;;) {
        const char *f =
            (maxsplit < 0 || splits < maxsplit) ? memmem(p + i, n - i, sep->u.s.p, sep->u.s.n) : NULL;
        size_t e = f ? (size_t)(f - p) : n;
        if (jv_list_push(l, mkstr(r, line, p + i, e - i))) goto fail;
        if (!f) break;
        i = e + sep->u.s.n;
        splits++;
        if (r->iters_left-- <= 0) {
            jv_unref(l);
            return rfail(r, line, DP_ERANGE, "too many loop iterations");
        }
    }
    return l;
fail:
    jv_unref(l);
    return r->rc ? NULL : room(r, line);
}

/* Python's slice index arithmetic (PySlice_AdjustIndices). */
static bool slice_ix(rs *r, int line, const jv *a, const jv *b, const jv *c, int64_t len, int64_t *start,
                     int64_t *stop, int64_t *step)
{
    *step = 1;
    if (c && c->kind != JV_NONE) {
        if (c->kind != JV_INT && c->kind != JV_BOOL)
            return rfail(r, line, DP_EINVAL, "slice indices must be integers"), false;
        *step = num_i(c);
        if (*step == 0) return rfail(r, line, DP_EINVAL, "slice step cannot be zero"), false;
    }
    const jv *bd[2] = {a, b};
    int64_t *out[2] = {start, stop};
    for (int k = 0; k < 2; k++) {
        const jv *x = bd[k];
        if (!x || x->kind == JV_NONE) {
            *out[k] = *step < 0 ? (k == 0 ? len - 1 : -1) : (k == 0 ? 0 : len);
            if (*step < 0 && k == 1) *out[k] = -1 - len; /* marker: before the start */
            continue;
        }
        if (x->kind != JV_INT && x->kind != JV_BOOL)
            return rfail(r, line, DP_EINVAL, "slice indices must be integers"), false;
        int64_t v = num_i(x);
        if (v < 0) {
            v += len;
            if (v < 0) v = *step < 0 ? -1 : 0;
        } else if (v >= len) {
            v = *step < 0 ? len - 1 : len;
        }
        *out[k] = v;
    }
    if (*stop < -1) *stop = -1;
    return true;
}

static jv *do_slice(rs *r, int line, jv *obj, const jv *a, const jv *b, const jv *c)
{
    int64_t start, stop, step;
    if (obj->kind == JV_LIST) {
        if (!slice_ix(r, line, a, b, c, (int64_t)obj->u.l.n, &start, &stop, &step)) return NULL;
        jv *l = jv_list();
        if (!l) return room(r, line);
        /* i += step may overflow with a huge step: stop there (the wrapped
         * index would be read out of bounds). */
        for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
            if (jv_list_push(l, jv_ref(obj->u.l.v[i]))) return jv_unref(l), r->rc ? NULL : room(r, line);
            if (__builtin_add_overflow(i, step, &i)) break;
        }
        return l;
    }
    if (obj->kind == JV_STRING) {
        size_t cnt;
        size_t *off = u_offsets(obj->u.s.p, obj->u.s.n, &cnt);
        if (!off) return room(r, line);
        if (!slice_ix(r, line, a, b, c, (int64_t)cnt, &start, &stop, &step)) return free(off), NULL;
        sbuf s = {0};
        int rc = 0;
        for (int64_t i = start; !rc && (step > 0 ? i < stop : i > stop);) {
            rc |= sb_add(&s, obj->u.s.p + off[i], off[i + 1] - off[i]);
            if (__builtin_add_overflow(i, step, &i)) break; /* as for lists */
        }
        free(off);
        if (rc) return free(s.p), room(r, line);
        return sb_take(r, line, &s);
    }
    if (obj->kind == JV_UNDEFINED) return rfail(r, line, DP_EINVAL, "cannot slice an undefined value");
    return rfail(r, line, DP_EINVAL, "'%s' object is not subscriptable", type_name(obj));
}

/* obj[key] with Jinja's fallbacks: a missing item is undefined. */
static jv *get_item(rs *r, int line, jv *obj, const jv *key)
{
    switch (obj->kind) {
    case JV_DICT:
    case JV_NAMESPACE: {
        long at = dict_find(obj, key);
        return at >= 0 ? jv_ref(obj->u.d.v[at]) : &j_undef;
    }
    case JV_LIST:
        if (key->kind == JV_INT || key->kind == JV_BOOL) {
            int64_t i = num_i(key), n = (int64_t)obj->u.l.n;
            if (i < 0) i += n;
            return i >= 0 && i < n ? jv_ref(obj->u.l.v[i]) : &j_undef;
        }
        return &j_undef;
    case JV_STRING:
        if (key->kind == JV_INT || key->kind == JV_BOOL) {
            size_t cnt;
            size_t *off = u_offsets(obj->u.s.p, obj->u.s.n, &cnt);
            if (!off) return room(r, line);
            int64_t i = num_i(key);
            if (i < 0) i += (int64_t)cnt;
            jv *v = i >= 0 && i < (int64_t)cnt ? mkstr(r, line, obj->u.s.p + off[i], off[i + 1] - off[i])
                                               : &j_undef;
            free(off);
            return v;
        }
        return &j_undef;
    case JV_UNDEFINED: {
        sbuf b = {0};
        to_repr(&b, key, 0);
        rfail(r, line, DP_EINVAL, "'%s' is undefined (an item of an undefined value)", b.p ? b.p : "?");
        free(b.p);
        return NULL;
    }
    default: return &j_undef;
    }
}

/* ---- scopes ---- */

static jv *lookup(rs *r, const char *name)
{
    for (frame *f = r->top; f; f = f->parent) {
        jv *v = jv_dict_get(f->vars, name);
        if (v) return v;
    }
    jv *v = jv_dict_get(r->ctx, name);
    if (v) return v;
    if (!strcmp(name, "raise_exception")) return &j_b_raise;
    if (!strcmp(name, "strftime_now")) return &j_b_strftime;
    if (!strcmp(name, "namespace")) return &j_b_namespace;
    if (!strcmp(name, "range")) return &j_b_range;
    if (!strcmp(name, "dict")) return &j_b_dict;
    return &j_undef;
}

static bool set_var(rs *r, int line, const char *name, jv *v)
{
    if (!v) return false;
    if (jv_dict_set(r->top->vars, name, v)) return room(r, line), false;
    return true;
}

/* ---- evaluation ---- */

static jv *eval(rs *r, const node *n);
static int exec_body(rs *r, const node *body);

typedef struct args {
    jv **pos;
    size_t npos;
    const char *const *kwn; /* borrowed from the node */
    jv **kwv;
    size_t nkw;
} args;

static void args_free(args *a)
{
    for (size_t i = 0; i < a->npos; i++) jv_unref(a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++) jv_unref(a->kwv[i]);
    free(a->pos);
    free(a->kwv);
}

static bool eval_args(rs *r, const node *n, args *a)
{
    memset(a, 0, sizeof *a);
    a->pos = calloc(n->nkids + 1, sizeof *a->pos);
    a->kwv = calloc(n->nkw + 1, sizeof *a->kwv);
    if (!a->pos || !a->kwv) {
        args_free(a);
        return room(r, n->line), false;
    }
    a->kwn = (const char *const *)n->kwn;
    for (size_t i = 0; i < n->nkids; i++) {
        if (!(a->pos[i] = eval(r, n->kids[i]))) return args_free(a), false;
        a->npos++;
    }
    for (size_t i = 0; i < n->nkw; i++) {
        if (!(a->kwv[i] = eval(r, n->kwv[i]))) return args_free(a), false;
        a->nkw++;
    }
    return true;
}

/* Argument i (after `skip` leading ones) or the keyword name; NULL if absent. */
static jv *arg(const args *a, size_t i, const char *name)
{
    if (i < a->npos) return a->pos[i];
    for (size_t k = 0; name && k < a->nkw; k++)
        if (!strcmp(a->kwn[k], name)) return a->kwv[k];
    return NULL;
}

static jv *need_str(rs *r, int line, jv *v, const char *what)
{
    if (v && v->kind == JV_STRING) return v;
    return rfail(r, line, DP_EINVAL, "%s expects a string, got %s", what, v ? type_name(v) : "nothing");
}

static jv *apply_test(rs *r, int line, const char *name, jv *v, jv *const *targs, size_t nargs);
static jv *apply_filter(rs *r, int line, const char *name, jv *v, const args *a);

/* Items of an iterable as a new list (dict: keys; string: characters). */
static jv *iter_list(rs *r, int line, jv *v)
{
    switch (v->kind) {
    case JV_LIST: return jv_ref(v);
    case JV_UNDEFINED: {
        jv *l = jv_list();
        return l ? l : room(r, line);
    }
    case JV_DICT:
    case JV_NAMESPACE: {
        jv *l = jv_list();
        if (!l) return room(r, line);
        for (size_t i = 0; i < v->u.d.n; i++)
            if (jv_list_push(l, jv_ref(v->u.d.k[i]))) return jv_unref(l), room(r, line);
        return l;
    }
    case JV_STRING: {
        jv *l = jv_list();
        if (!l) return room(r, line);
        for (size_t i = 0; i < v->u.s.n;) {
            size_t j = i + 1;
            while (j < v->u.s.n && ((unsigned char)v->u.s.p[j] & 0xC0) == 0x80) j++;
            if (jv_list_push(l, mkstr(r, line, v->u.s.p + i, j - i)))
                return jv_unref(l), r->rc ? NULL : room(r, line);
            i = j;
        }
        return l;
    }
    default: return rfail(r, line, DP_EINVAL, "'%s' object is not iterable", type_name(v));
    }
}

static jv *call_macro(rs *r, int line, const node *m, const args *a)
{
    if (r->depth >= r->max_depth)
        return rfail(r, line, DP_ERANGE, "macro calls nested deeper than %d", r->max_depth);
    /* A call is charged as a loop iteration: a macro that calls itself
     * twice is within the depth limit and still makes 2^depth calls. */
    if (r->iters_left-- <= 0)
        return rfail(r, line, DP_ERANGE, "too many loop iterations and macro calls");
    if (!in_time(r))
        return rfail(r, line, DP_ERANGE, "the rendering took longer than its limit of %ld ms", r->max_ms);
    if (a->npos > m->nnames)
        return rfail(r, line, DP_EINVAL, "macro '%s' takes %zu arguments", m->name, m->nnames);
    frame f = {jv_dict(), r->root};
    if (!f.vars) return room(r, line);
    frame *saved_top = r->top;
    r->top = &f;
    bool ok = true;
    for (size_t i = 0; i < m->nnames && ok; i++) {
        jv *v = i < a->npos ? jv_ref(a->pos[i]) : NULL;
        for (size_t k = 0; !v && k < a->nkw; k++)
            if (!strcmp(a->kwn[k], m->names[i])) v = jv_ref(a->kwv[k]);
        if (!v) v = eval(r, m->kids[i]);
        ok = set_var(r, line, m->names[i], v);
    }
    for (size_t k = 0; ok && k < a->nkw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->nnames; i++) known |= !strcmp(a->kwn[k], m->names[i]);
        if (!known) {
            rfail(r, line, DP_EINVAL, "macro '%s' has no argument '%s'", m->name, a->kwn[k]);
            ok = false;
        }
    }
    sbuf out = {0}, *saved_out = r->out;
    jv *res = NULL;
    if (ok) {
        r->out = &out;
        r->depth++;
        ok = exec_body(r, m->a) == 0;
        r->depth--;
        r->out = saved_out;
    }
    if (ok) res = sb_take(r, line, &out);
    free(out.p);
    r->top = saved_top;
    jv_unref(f.vars);
    return res;
}

static jv *call_builtin(rs *r, int line, int b, const args *a)
{
    switch (b) {
    case B_RAISE: {
        jv *m = arg(a, 0, "message");
        sbuf s = {0};
        if (m) to_str(&s, m, 0);
        if (!r->rc) {
            r->rc = DP_EINVAL;
            snprintf(r->err, r->errsz, "%s", s.p ? s.p : "");
        }
        free(s.p);
        return NULL;
    }
    case B_STRFTIME: {
        jv *f = need_str(r, line, arg(a, 0, NULL), "strftime_now");
        if (!f) return NULL;
        time_t t = r->now ? r->now : time(NULL);
        struct tm tm;
        localtime_r(&t, &tm);
        char buf[256];
        size_t n = strftime(buf, sizeof buf, f->u.s.p, &tm);
        return mkstr(r, line, buf, n);
    }
    case B_NAMESPACE:
    case B_DICT: {
        jv *d = jv_new(b == B_NAMESPACE ? JV_NAMESPACE : JV_DICT);
        if (!d) return room(r, line);
        for (size_t i = 0; i < a->npos; i++) { /* namespace(a_dict) */
            jv *x = a->pos[i];
            if (x->kind != JV_DICT && x->kind != JV_NAMESPACE) {
                jv_unref(d);
                return rfail(r, line, DP_EINVAL, "%s() takes keyword arguments or a dict",
                             b == B_DICT ? "dict" : "namespace");
            }
            for (size_t k = 0; k < x->u.d.n; k++)
                if (dict_put(d, jv_ref(x->u.d.k[k]), jv_ref(x->u.d.v[k]))) return jv_unref(d), room(r, line);
        }
        for (size_t i = 0; i < a->nkw; i++)
            if (jv_dict_set(d, a->kwn[i], jv_ref(a->kwv[i]))) return jv_unref(d), room(r, line);
        return d;
    }
    case B_RANGE: {
        int64_t st = 0, en, step = 1;
        for (size_t i = 0; i < a->npos; i++)
            if (a->pos[i]->kind != JV_INT && a->pos[i]->kind != JV_BOOL)
                return rfail(r, line, DP_EINVAL, "range() takes integers");
        if (a->npos == 1)
            en = num_i(a->pos[0]);
        else if (a->npos >= 2) {
            st = num_i(a->pos[0]);
            en = num_i(a->pos[1]);
            if (a->npos == 3) step = num_i(a->pos[2]);
        } else
            return rfail(r, line, DP_EINVAL, "range() takes 1 to 3 arguments");
        if (step == 0) return rfail(r, line, DP_EINVAL, "range() step must not be zero");
        double cnt =
            step > 0 ? ((double)en - (double)st) / (double)step : ((double)st - (double)en) / (double)-step;
        if (cnt > (double)r->iters_left)
            return rfail(r, line, DP_ERANGE, "range() exceeds the limit of loop iterations");
        jv *l = jv_list();
        if (!l) return room(r, line);
        for (int64_t i = st; step > 0 ? i < en : i > en;) {
            if (jv_list_push(l, jv_int(i))) return jv_unref(l), r->rc ? NULL : room(r, line);
            if (__builtin_add_overflow(i, step, &i)) break; /* range(2**63-2, 2**63-1, 5) */
        }
        return l;
    }
    default: return rfail(r, line, DP_EINVAL, "not callable");
    }
}

static jv *call_method(rs *r, int line, jv *obj, const char *name, const args *a)
{
    jv *x;
    if (obj->kind == JV_STRING) {
        if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
            jv *ch = arg(a, 0, "chars");
            if (ch && ch->kind == JV_NONE) ch = NULL;
            if (ch && !need_str(r, line, ch, name)) return NULL;
            return do_strip(r, line, obj, ch, name[0] != 'r', name[0] != 'l');
        }
        if (!strcmp(name, "split")) {
            jv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
            if (sep && sep->kind == JV_NONE) sep = NULL;
            if (sep && !need_str(r, line, sep, "split")) return NULL;
            return do_split(r, line, obj, sep, mx ? num_i(mx) : -1);
        }
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            jv *p = arg(a, 0, NULL);
            if (!p) return rfail(r, line, DP_EINVAL, "%s() takes an argument", name);
            jv *const *cands = &p;
            size_t nc = 1;
            if (p->kind == JV_LIST) {
                cands = p->u.l.v;
                nc = p->u.l.n;
            }
            for (size_t i = 0; i < nc; i++) {
                jv *c = cands[i];
                if (!need_str(r, line, c, name)) return NULL;
                if (c->u.s.n <= obj->u.s.n &&
                    memcmp(obj->u.s.p + (name[0] == 's' ? 0 : obj->u.s.n - c->u.s.n), c->u.s.p, c->u.s.n) ==
                        0)
                    return &j_true;
            }
            return &j_false;
        }
        if (!strcmp(name, "upper")) return case_map(r, line, obj, 'u');
        if (!strcmp(name, "lower")) return case_map(r, line, obj, 'l');
        if (!strcmp(name, "title")) return case_map(r, line, obj, 't');
        if (!strcmp(name, "capitalize")) return case_map(r, line, obj, 'c');
        if (!strcmp(name, "replace")) {
            jv *o = need_str(r, line, arg(a, 0, NULL), "replace"),
               *nw = o ? need_str(r, line, arg(a, 1, NULL), "replace") : NULL;
            jv *c = arg(a, 2, "count");
            return nw ? do_replace(r, line, obj, o, nw, c ? num_i(c) : -1) : NULL;
        }
        if (!strcmp(name, "find") || !strcmp(name, "count")) {
            jv *sub = need_str(r, line, arg(a, 0, NULL), name);
            if (!sub) return NULL;
            if (name[0] == 'f') {
                const char *f =
                    sub->u.s.n ? memmem(obj->u.s.p, obj->u.s.n, sub->u.s.p, sub->u.s.n) : obj->u.s.p;
                return (x = jv_int(f ? (int64_t)u_len(obj->u.s.p, (size_t)(f - obj->u.s.p)) : -1))
                           ? x
                           : room(r, line);
            }
            int64_t c = 0;
            if (!sub->u.s.n)
                c = (int64_t)u_len(obj->u.s.p, obj->u.s.n) + 1;
            else
                for (const char *p = obj->u.s.p;
                     (p = memmem(p, obj->u.s.n - (size_t)(p - obj->u.s.p), sub->u.s.p, sub->u.s.n));
                     p += sub->u.s.n)
                    c++;
            return (x = jv_int(c)) ? x : room(r, line);
        }
        if (!strcmp(name, "join")) {
            args fa = {.pos = (jv *[]){obj}, .npos = 1};
            return apply_filter(r, line, "join", arg(a, 0, NULL) ? arg(a, 0, NULL) : &j_undef, &fa);
        }
    } else if (obj->kind == JV_DICT || obj->kind == JV_NAMESPACE) {
        if (!strcmp(name, "get")) {
            jv *k = arg(a, 0, NULL), *d = arg(a, 1, NULL);
            if (!k) return rfail(r, line, DP_EINVAL, "get() takes a key");
            long at = dict_find(obj, k);
            return at >= 0 ? jv_ref(obj->u.d.v[at]) : d ? jv_ref(d) : &j_none;
        }
        if (!strcmp(name, "items")) return apply_filter(r, line, "items", obj, &(args){0});
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            jv *l = jv_list();
            if (!l) return room(r, line);
            for (size_t i = 0; i < obj->u.d.n; i++)
                if (jv_list_push(l, jv_ref(name[0] == 'k' ? obj->u.d.k[i] : obj->u.d.v[i])))
                    return jv_unref(l), room(r, line);
            return l;
        }
    } else if (obj->kind == JV_LIST && !strcmp(name, "append")) {
        /* ImmutableSandboxedEnvironment refuses to modify lists. */
        return rfail(r, line, DP_EINVAL, "access to attribute 'append' of 'list' object is unsafe");
    } else if (obj->kind == JV_UNDEFINED) {
        return rfail(r, line, DP_EINVAL, "'%s' called on an undefined value", name);
    }
    return rfail(r, line, DP_EINVAL, "'%s' object has no attribute '%s'", type_name(obj), name);
}

static jv *eval_call(rs *r, const node *n)
{
    args a;
    const node *callee = n->a;
    if (callee->type == N_ATTR) {
        jv *obj = eval(r, callee->a);
        if (!obj) return NULL;
        if (!eval_args(r, n, &a)) return jv_unref(obj), NULL;
        jv *res = call_method(r, n->line, obj, callee->name, &a);
        args_free(&a);
        jv_unref(obj);
        return res;
    }
    jv *f = eval(r, callee);
    if (!f) return NULL;
    if (f->kind != JV_CALLABLE) {
        jv *e = rfail(r, n->line, DP_EINVAL, "%s%s%s is not callable (%s)", callee->type == N_NAME ? "'" : "",
                      callee->type == N_NAME ? callee->name : "the value", callee->type == N_NAME ? "'" : "",
                      f->kind == JV_UNDEFINED ? "undefined" : type_name(f));
        jv_unref(f);
        return e;
    }
    if (!eval_args(r, n, &a)) return jv_unref(f), NULL;
    jv *res = f->u.c.macro ? call_macro(r, n->line, f->u.c.macro, &a)
                           : call_builtin(r, n->line, f->u.c.builtin, &a);
    args_free(&a);
    jv_unref(f);
    return res;
}

static int cmp_order(rs *r, int line, const jv *a, const jv *b, int *out)
{
    if (is_num(a) && is_num(b)) {
        double x = num_f(a), y = num_f(b);
        if (a->kind != JV_FLOAT && b->kind != JV_FLOAT) {
            int64_t i = num_i(a), j = num_i(b);
            *out = i < j ? -1 : i > j;
        } else {
            *out = x < y ? -1 : x > y;
        }
        return 0;
    }
    if (a->kind == JV_STRING && b->kind == JV_STRING) {
        size_t m = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, m);
        *out = c ? (c < 0 ? -1 : 1) : (a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n);
        return 0;
    }
    if (a->kind == JV_LIST && b->kind == JV_LIST) {
        for (size_t i = 0; i < a->u.l.n && i < b->u.l.n; i++) {
            if (jv_eq(a->u.l.v[i], b->u.l.v[i])) continue;
            return cmp_order(r, line, a->u.l.v[i], b->u.l.v[i], out);
        }
        *out = a->u.l.n < b->u.l.n ? -1 : a->u.l.n > b->u.l.n;
        return 0;
    }
    rfail(r, line, DP_EINVAL, "'<' not supported between instances of '%s' and '%s'", type_name(a),
          type_name(b));
    return -1;
}

static jv *contains(rs *r, int line, jv *needle, jv *hay)
{
    switch (hay->kind) {
    case JV_STRING:
        if (needle->kind != JV_STRING)
            return rfail(r, line, DP_EINVAL, "'in <string>' requires string as left operand, not %s",
                         type_name(needle));
        return jv_bool(needle->u.s.n == 0 || memmem(hay->u.s.p, hay->u.s.n, needle->u.s.p, needle->u.s.n));
    case JV_LIST:
        for (size_t i = 0; i < hay->u.l.n && step(); i++) /* charged, see jv_eq */
            if (jv_eq(needle, hay->u.l.v[i])) return &j_true;
        return r->rc ? NULL : &j_false;
    case JV_DICT:
    case JV_NAMESPACE: {
        long at = dict_find(hay, needle);
        return r->rc ? NULL : jv_bool(at >= 0);
    }
    case JV_UNDEFINED: return &j_false;
    default: return rfail(r, line, DP_EINVAL, "argument of type '%s' is not iterable", type_name(hay));
    }
}

static jv *num_result(rs *r, int line, bool as_float, double f, int64_t i)
{
    jv *v = as_float ? jv_float(f) : jv_int(i);
    return v ? v : room(r, line);
}

static jv *binop(rs *r, int line, int op, jv *a, jv *b)
{
    if (op == '~') {
        sbuf s = {0};
        if (to_str(&s, a, 0) || to_str(&s, b, 0)) return free(s.p), room(r, line);
        return sb_take(r, line, &s);
    }
    if (a->kind == JV_UNDEFINED || b->kind == JV_UNDEFINED)
        return rfail(r, line, DP_EINVAL, "an undefined value in an arithmetic expression");
    if (op == '+' && a->kind == JV_STRING && b->kind == JV_STRING) {
        if (a->u.s.n + b->u.s.n > r->max_output)
            return rfail(r, line, DP_ERANGE, "a string exceeds the limit of %zu bytes", r->max_output);
        sbuf s = {0};
        if (sb_add(&s, a->u.s.p, a->u.s.n) || sb_add(&s, b->u.s.p, b->u.s.n)) return free(s.p), room(r, line);
        return sb_take(r, line, &s);
    }
    if (op == '+' && a->kind == JV_LIST && b->kind == JV_LIST) {
        if (a->u.l.n + b->u.l.n > (size_t)r->max_list)
            return rfail(r, line, DP_ERANGE, "a list exceeds the limit of %ld items", r->max_list);
        jv *l = jv_list();
        if (!l) return room(r, line);
        for (size_t i = 0; i < a->u.l.n; i++)
            if (jv_list_push(l, jv_ref(a->u.l.v[i]))) return jv_unref(l), room(r, line);
        for (size_t i = 0; i < b->u.l.n; i++)
            if (jv_list_push(l, jv_ref(b->u.l.v[i]))) return jv_unref(l), room(r, line);
        return l;
    }
    if (op == '*' &&
        ((a->kind == JV_STRING || a->kind == JV_LIST) && (b->kind == JV_INT || b->kind == JV_BOOL))) {
        int64_t k = num_i(b);
        if (a->kind == JV_STRING) {
            if (k > 0 && a->u.s.n > 0 && (uint64_t)k > r->max_output / a->u.s.n)
                return rfail(r, line, DP_ERANGE, "a string exceeds the limit of %zu bytes", r->max_output);
            sbuf s = {0};
            for (int64_t i = 0; i < k; i++)
                if (sb_add(&s, a->u.s.p, a->u.s.n)) return free(s.p), room(r, line);
            return sb_take(r, line, &s);
        }
        if (k > 0 && a->u.l.n > 0 && (uint64_t)k > (uint64_t)r->max_list / a->u.l.n)
            return rfail(r, line, DP_ERANGE, "a list exceeds the limit of %ld items", r->max_list);
        jv *l = jv_list();
        if (!l) return room(r, line);
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < a->u.l.n; j++)
                if (jv_list_push(l, jv_ref(a->u.l.v[j]))) return jv_unref(l), room(r, line);
        return l;
    }
    if (op == '*' && (b->kind == JV_STRING || b->kind == JV_LIST) &&
        (a->kind == JV_INT || a->kind == JV_BOOL))
        return binop(r, line, op, b, a);
    if (op == '%' && a->kind == JV_STRING)
        return rfail(r, line, DP_EUNSUPPORTED, "unsupported string formatting with '%%'");
    if (!is_num(a) || !is_num(b))
        return rfail(r, line, DP_EINVAL, "unsupported operand types for %s: '%s' and '%s'",
                     op == 'F'   ? "//"
                     : op == 'P' ? "**"
                                 : (char[]){(char)op, 0},
                     type_name(a), type_name(b));
    bool fl = a->kind == JV_FLOAT || b->kind == JV_FLOAT;
    double x = num_f(a), y = num_f(b);
    int64_t i = num_i(a), j = num_i(b), res;
    switch (op) {
    case '+':
        if (!fl && __builtin_add_overflow(i, j, &res)) return rfail(r, line, DP_ERANGE, "integer overflow");
        return num_result(r, line, fl, x + y, fl ? 0 : i + j);
    case '-':
        if (!fl && __builtin_sub_overflow(i, j, &res)) return rfail(r, line, DP_ERANGE, "integer overflow");
        return num_result(r, line, fl, x - y, fl ? 0 : i - j);
    case '*':
        if (!fl && __builtin_mul_overflow(i, j, &res)) return rfail(r, line, DP_ERANGE, "integer overflow");
        return num_result(r, line, fl, x * y, fl ? 0 : res);
    case '/':
        if (y == 0) return rfail(r, line, DP_EINVAL, "division by zero");
        return num_result(r, line, true, x / y, 0);
    case 'F':
    case '%':
        if (fl ? y == 0 : j == 0) return rfail(r, line, DP_EINVAL, "integer division or modulo by zero");
        if (fl) {
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return num_result(r, line, true, op == 'F' ? floor((x - m) / y + 0.5) : m, 0);
        } else {
            if (i == INT64_MIN && j == -1) return rfail(r, line, DP_ERANGE, "integer overflow");
            int64_t q = i / j, m = i % j;
            if (m != 0 && ((m < 0) != (j < 0))) {
                q--;
                m += j;
            }
            return num_result(r, line, false, 0, op == 'F' ? q : m);
        }
    case 'P':
        if (!fl && j >= 0) {
            int64_t acc = 1;
            for (int64_t k = 0; k < j; k++) {
                if (__builtin_mul_overflow(acc, i, &acc))
                    return rfail(r, line, DP_ERANGE, "integer overflow");
                if (i == 0 || i == 1) break;
                if (i == -1) { /* no overflow, and no billion steps for (-1) ** 10**9 */
                    acc = (j & 1) ? -1 : 1;
                    break;
                }
            }
            return num_result(r, line, false, 0, acc);
        }
        return num_result(r, line, true, pow(x, y), 0);
    default: return rfail(r, line, DP_EINVAL, "bad operator");
    }
}

static jv *eval(rs *r, const node *n)
{
    jv *a = NULL, *b = NULL, *res = NULL;
    switch (n->type) {
    case N_LIT: return jv_ref(n->lit);
    case N_NAME: return jv_ref(lookup(r, n->name));
    case N_ATTR:
        if (!(a = eval(r, n->a))) return NULL;
        if (a->kind == JV_UNDEFINED) {
            res =
                rfail(r, n->line, DP_EINVAL, "'%s' is undefined (attribute of an undefined value)", n->name);
        } else if (a->kind == JV_DICT || a->kind == JV_NAMESPACE) {
            long at = dict_find_str(a, n->name, strlen(n->name));
            res = at >= 0 ? jv_ref(a->u.d.v[at]) : &j_undef;
        } else {
            res = &j_undef;
        }
        jv_unref(a);
        return res;
    case N_ITEM:
        if (!(a = eval(r, n->a))) return NULL;
        if ((b = eval(r, n->b))) res = get_item(r, n->line, a, b);
        jv_unref(a);
        jv_unref(b);
        return res;
    case N_SLICE: {
        jv *s[3] = {NULL, NULL, NULL};
        const node *sn[3] = {n->b, n->c, n->d};
        if (!(a = eval(r, n->a))) return NULL;
        bool ok = true;
        for (int k = 0; k < 3 && ok; k++)
            if (sn[k]) ok = (s[k] = eval(r, sn[k])) != NULL;
        if (ok) res = do_slice(r, n->line, a, s[0], s[1], s[2]);
        for (int k = 0; k < 3; k++) jv_unref(s[k]);
        jv_unref(a);
        return res;
    }
    case N_CALL: return eval_call(r, n);
    case N_FILTER: {
        if (!(a = eval(r, n->a))) return NULL;
        args fa;
        if (eval_args(r, n, &fa)) {
            res = apply_filter(r, n->line, n->name, a, &fa);
            args_free(&fa);
        }
        jv_unref(a);
        return res;
    }
    case N_TEST: {
        if (!(a = eval(r, n->a))) return NULL;
        args ta;
        if (eval_args(r, n, &ta)) {
            res = apply_test(r, n->line, n->name, a, ta.pos, ta.npos);
            args_free(&ta);
        }
        jv_unref(a);
        if (res && n->neg) res = jv_bool(!truthy(res));
        return res;
    }
    case N_BIN:
        if (!(a = eval(r, n->a))) return NULL;
        if ((b = eval(r, n->b))) res = binop(r, n->line, n->op, a, b);
        jv_unref(a);
        jv_unref(b);
        return res;
    case N_CMP:
        if (!(a = eval(r, n->a))) return NULL;
        if ((b = eval(r, n->b))) {
            int c = 0;
            switch (n->op) {
            case 'e': res = jv_bool(jv_eq(a, b)); break;
            case 'n': res = jv_bool(!jv_eq(a, b)); break;
            case 'i': res = contains(r, n->line, a, b); break;
            case 'I':
                res = contains(r, n->line, a, b);
                if (res) res = jv_bool(!truthy(res));
                break;
            default:
                if (!cmp_order(r, n->line, a, b, &c))
                    res = jv_bool(n->op == '<'   ? c < 0
                                  : n->op == '>' ? c > 0
                                  : n->op == 'l' ? c <= 0
                                                 : c >= 0);
            }
        }
        jv_unref(a);
        jv_unref(b);
        return res;
    case N_UNARY:
        if (!(a = eval(r, n->a))) return NULL;
        if (!is_num(a))
            res = rfail(r, n->line, DP_EINVAL, "bad operand type for unary %c: '%s'", n->op, type_name(a));
        else if (n->op == '+')
            res = a->kind == JV_FLOAT ? jv_float(a->u.f) : jv_int(num_i(a));
        else if (a->kind == JV_FLOAT)
            res = jv_float(-a->u.f);
        else if (num_i(a) == INT64_MIN)
            res = rfail(r, n->line, DP_ERANGE, "integer overflow");
        else
            res = jv_int(-num_i(a));
        if (!res && !r->rc) room(r, n->line);
        jv_unref(a);
        return res;
    case N_NOT:
        if (!(a = eval(r, n->a))) return NULL;
        res = jv_bool(!truthy(a));
        jv_unref(a);
        return res;
    case N_AND:
    case N_OR:
        if (!(a = eval(r, n->a))) return NULL;
        if (truthy(a) == (n->type == N_OR)) return a;
        jv_unref(a);
        return eval(r, n->b);
    case N_COND:
        if (!(a = eval(r, n->a))) return NULL;
        {
            bool t = truthy(a);
            jv_unref(a);
            if (t) return eval(r, n->b);
            return n->c ? eval(r, n->c) : &j_undef;
        }
    case N_LISTX:
    case N_TUPLEX: {
        jv *l = jv_list();
        if (!l) return room(r, n->line);
        l->u.l.tuple = n->type == N_TUPLEX;
        for (size_t i = 0; i < n->nkids; i++) {
            jv *x = eval(r, n->kids[i]);
            if (!x || jv_list_push(l, x)) {
                jv_unref(l);
                return r->rc ? NULL : room(r, n->line);
            }
        }
        return l;
    }
    case N_DICTX: {
        jv *d = jv_dict();
        if (!d) return room(r, n->line);
        for (size_t i = 0; i + 1 < n->nkids; i += 2) {
            jv *k = eval(r, n->kids[i]);
            jv *v = k ? eval(r, n->kids[i + 1]) : NULL;
            if (!k || !v || dict_put(d, k, v)) {
                if (k && !v) jv_unref(k);
                jv_unref(d);
                return r->rc ? NULL : room(r, n->line);
            }
        }
        return d;
    }
    default: return rfail(r, n->line, DP_EINVAL, "bad expression");
    }
}

/* ---- tests ---- */

static jv *apply_test(rs *r, int line, const char *name, jv *v, jv *const *ta, size_t nt)
{
    jv *t0 = nt > 0 ? ta[0] : NULL;
    if (!strcmp(name, "defined")) return jv_bool(v->kind != JV_UNDEFINED);
    if (!strcmp(name, "undefined")) return jv_bool(v->kind == JV_UNDEFINED);
    if (!strcmp(name, "none")) return jv_bool(v->kind == JV_NONE);
    if (!strcmp(name, "string")) return jv_bool(v->kind == JV_STRING);
    if (!strcmp(name, "number")) return jv_bool(is_num(v));
    if (!strcmp(name, "integer")) return jv_bool(v->kind == JV_INT);
    if (!strcmp(name, "float")) return jv_bool(v->kind == JV_FLOAT);
    if (!strcmp(name, "boolean")) return jv_bool(v->kind == JV_BOOL);
    if (!strcmp(name, "true")) return jv_bool(v->kind == JV_BOOL && v->u.b);
    if (!strcmp(name, "false")) return jv_bool(v->kind == JV_BOOL && !v->u.b);
    if (!strcmp(name, "mapping")) return jv_bool(v->kind == JV_DICT);
    if (!strcmp(name, "iterable"))
        return jv_bool(v->kind == JV_STRING || v->kind == JV_LIST || v->kind == JV_DICT ||
                       v->kind == JV_UNDEFINED);
    if (!strcmp(name, "sequence"))
        return jv_bool(v->kind == JV_STRING || v->kind == JV_LIST || v->kind == JV_DICT);
    if (!strcmp(name, "callable")) return jv_bool(v->kind == JV_CALLABLE);
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->kind != JV_STRING) return &j_false;
        bool cased = false;
        for (size_t i = 0; i < v->u.s.n; i++) {
            unsigned char c = (unsigned char)v->u.s.p[i];
            if (isalpha(c) && c < 0x80) {
                cased = true;
                if (name[0] == 'l' ? isupper(c) : islower(c)) return &j_false;
            }
        }
        return jv_bool(cased);
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (!is_num(v) || v->kind == JV_FLOAT)
            return rfail(r, line, DP_EINVAL, "test '%s' needs an integer", name);
        int64_t i = num_i(v);
        if (name[0] == 'o') return jv_bool(i % 2 != 0);
        if (name[0] == 'e') return jv_bool(i % 2 == 0);
        if (!t0 || !is_num(t0) || num_i(t0) == 0)
            return rfail(r, line, DP_EINVAL, "divisibleby needs a non-zero number");
        /* INT64_MIN % -1 traps (SIGFPE); every integer is divisible by -1. */
        if (num_i(t0) == -1) return &j_true;
        return jv_bool(i % num_i(t0) == 0);
    }
    if (!t0) return rfail(r, line, DP_EINVAL, "test '%s' needs an argument", name);
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) return jv_bool(jv_eq(v, t0));
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return jv_bool(!jv_eq(v, t0));
    if (!strcmp(name, "sameas")) {
        if (v->kind != t0->kind) return &j_false;
        if (v->kind == JV_NONE || v->kind == JV_UNDEFINED) return &j_true;
        if (v->kind == JV_BOOL) return jv_bool(v->u.b == t0->u.b);
        return jv_bool(v == t0);
    }
    if (!strcmp(name, "in")) return contains(r, line, v, t0);
    int c;
    if (cmp_order(r, line, v, t0, &c)) return NULL;
    if (!strcmp(name, "lt") || !strcmp(name, "<")) return jv_bool(c < 0);
    if (!strcmp(name, "le") || !strcmp(name, "<=")) return jv_bool(c <= 0);
    if (!strcmp(name, "gt") || !strcmp(name, ">")) return jv_bool(c > 0);
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) return jv_bool(c >= 0);
    return rfail(r, line, DP_EUNSUPPORTED, "unknown test '%s'", name);
}

/* ---- filters ---- */

typedef struct sort_ctx {
    rs *r;
    int line;
    bool fold; /* case-insensitive string comparison */
    int by;    /* dictsort: 0 key, 1 value */
    const char *attr;
    jv **keys;
} sort_ctx;

static int cmp_keys(const void *x, const void *y, void *d)
{
    const jv *v = d;
    const jv *a = v->u.d.k[*(const size_t *)x], *b = v->u.d.k[*(const size_t *)y];
    if (a->kind == JV_STRING && b->kind == JV_STRING) {
        size_t m = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int c = memcmp(a->u.s.p, b->u.s.p, m);
        return c ? c : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
    }
    return 0;
}

static jv *fold_key(rs *r, int line, jv *v, bool fold)
{
    if (fold && v->kind == JV_STRING) return case_map(r, line, v, 'l');
    return jv_ref(v);
}

static jv *attr_of(rs *r, int line, jv *v, const char *attr)
{
    /* "a.b" walks dicts; a number picks a list item */
    jv *cur = jv_ref(v);
    const char *p = attr;
    while (cur && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        jv *next = &j_undef;
        if (cur->kind == JV_DICT || cur->kind == JV_NAMESPACE) {
            long at = dict_find_str(cur, p, n);
            if (at >= 0) next = jv_ref(cur->u.d.v[at]);
        } else if (cur->kind == JV_LIST && n > 0 && isdigit((unsigned char)p[0])) {
            size_t i = (size_t)strtoul(p, NULL, 10);
            if (i < cur->u.l.n) next = jv_ref(cur->u.l.v[i]);
        }
        jv_unref(cur);
        cur = next;
        p += n + (dot ? 1 : 0);
    }
    (void)r;
    (void)line;
    return cur;
}

static int sort_cmp(const void *x, const void *y, void *d)
{
    sort_ctx *s = d;
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    int c = 0;
    if (!s->r->rc && cmp_order(s->r, s->line, s->keys[i], s->keys[j], &c)) c = 0;
    return c ? c : (i > j) - (i < j); /* stable */
}

static jv *sorted(rs *r, int line, jv *l, bool reverse, bool fold, const char *attr, int by)
{
    size_t n = l->u.l.n;
    size_t *ord = malloc((n + 1) * sizeof *ord);
    jv **keys = calloc(n + 1, sizeof *keys);
    jv *out = NULL;
    if (!ord || !keys) goto done;
    for (size_t i = 0; i < n; i++) {
        ord[i] = i;
        jv *k = l->u.l.v[i];
        jv *base = by >= 0 ? (k->kind == JV_LIST && k->u.l.n == 2 ? k->u.l.v[by] : k) : NULL;
        jv *ak = base ? jv_ref(base) : attr ? attr_of(r, line, k, attr) : jv_ref(k);
        if (!ak) goto done;
        keys[i] = fold_key(r, line, ak, fold);
        jv_unref(ak);
        if (!keys[i]) goto done;
    }
    sort_ctx sc = {r, line, fold, by, attr, keys};
    qsort_r(ord, n, sizeof *ord, sort_cmp, &sc);
    if (r->rc) goto done;
    out = jv_list();
    if (!out) goto done;
    for (size_t i = 0; i < n; i++)
        if (jv_list_push(out, jv_ref(l->u.l.v[ord[reverse ? n - 1 - i : i]]))) {
            jv_unref(out);
            out = NULL;
            break;
        }
done:
    for (size_t i = 0; keys && i < n; i++) jv_unref(keys[i]);
    free(keys);
    free(ord);
    if (!out && !r->rc) room(r, line);
    return out;
}

/* select/reject/selectattr/rejectattr: args after the attribute name are
 * the test's name and arguments. */
static jv *select_items(rs *r, int line, jv *seq, const args *a, bool by_attr, bool keep)
{
    /* Jinja selects from a false value (None, "") nothing, without error. */
    jv *l = truthy(seq) ? iter_list(r, line, seq) : jv_list();
    if (!l) return NULL;
    size_t ai = 0;
    const char *attr = NULL;
    if (by_attr) {
        jv *at = need_str(r, line, arg(a, ai++, NULL), "selectattr");
        if (!at) return jv_unref(l), NULL;
        attr = at->u.s.p;
    }
    const char *test = NULL;
    if (ai < a->npos) {
        jv *t = need_str(r, line, a->pos[ai++], "select");
        if (!t) return jv_unref(l), NULL;
        test = t->u.s.p;
        if (!in_list(known_tests, test)) {
            jv_unref(l);
            return rfail(r, line, DP_EUNSUPPORTED, "unknown test '%s'", test);
        }
    }
    jv *out = jv_list();
    if (!out) return jv_unref(l), room(r, line);
    for (size_t i = 0; i < l->u.l.n; i++) {
        jv *it = l->u.l.v[i];
        jv *x = attr ? attr_of(r, line, it, attr) : jv_ref(it);
        if (!x) goto fail;
        jv *t = test ? apply_test(r, line, test, x, a->pos + ai, a->npos - ai) : jv_ref(x);
        jv_unref(x);
        if (!t) goto fail;
        bool ok = truthy(t);
        jv_unref(t);
        if (ok == keep && jv_list_push(out, jv_ref(it))) goto fail;
    }
    jv_unref(l);
    return out;
fail:
    jv_unref(l);
    jv_unref(out);
    return r->rc ? NULL : room(r, line);
}

static jv *indent_filter(rs *r, int line, jv *s, jv *width, bool first, bool blank)
{
    sbuf ind = {0}, o = {0};
    int rc = 0;
    if (width && width->kind == JV_STRING)
        rc |= sb_add(&ind, width->u.s.p, width->u.s.n);
    else
        for (int64_t i = 0; i < (width ? num_i(width) : 4) && i < 1024; i++) rc |= sb_add(&ind, " ", 1);
    if (!ind.p) rc |= sb_add(&ind, "", 0);
    /* Python: (s + "\n").splitlines(), then rejoined with "\n" + indent. */
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    bool first_line = true;
    if (first) rc |= sb_add(&o, ind.p, ind.n);
    while (i <= n) {
        size_t st = i;
        while (i < n && p[i] != '\n' && p[i] != '\r') i++;
        size_t e = i;
        bool last = i >= n;
        if (!last) i += (p[i] == '\r' && i + 1 < n && p[i + 1] == '\n') ? 2 : 1;
        if (last && st == e && !first_line) break; /* the added "\n" ends the last line */
        if (!first_line) {
            rc |= sb_add(&o, "\n", 1);
            if (blank || e > st) rc |= sb_add(&o, ind.p, ind.n);
        }
        rc |= sb_add(&o, p + st, e - st);
        first_line = false;
        if (last) break;
    }
    free(ind.p);
    if (rc) return free(o.p), room(r, line);
    return sb_take(r, line, &o);
}

static jv *apply_filter(rs *r, int line, const char *name, jv *v, const args *a)
{
    jv *x, *res;
    if (!strcmp(name, "safe")) return jv_ref(v);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv *dv = arg(a, 0, "default_value"), *bo = arg(a, 1, "boolean");
        bool use = v->kind == JV_UNDEFINED || (bo && truthy(bo) && !truthy(v));
        if (!use) return jv_ref(v);
        if (dv) return jv_ref(dv);
        return mkstr(r, line, "", 0);
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        int64_t n;
        if (v->kind == JV_STRING)
            n = (int64_t)u_len(v->u.s.p, v->u.s.n);
        else if (v->kind == JV_LIST || v->kind == JV_DICT || v->kind == JV_NAMESPACE ||
                 v->kind == JV_UNDEFINED)
            n = (int64_t)jv_len(v);
        else
            return rfail(r, line, DP_EINVAL, "object of type '%s' has no len()", type_name(v));
        return (x = jv_int(n)) ? x : room(r, line);
    }
    if (!strcmp(name, "tojson")) {
        json_opts o = {NULL, ", ", ": ", false, false};
        jv *ind = arg(a, 0, "indent"), *sk = arg(a, 99, "sort_keys"), *ea = arg(a, 99, "ensure_ascii");
        jv *sep = arg(a, 99, "separators");
        char spaces[64];
        if (ind && ind->kind == JV_INT) {
            int64_t k = ind->u.i < 0 ? 0 : ind->u.i > 32 ? 32 : ind->u.i;
            memset(spaces, ' ', (size_t)k);
            spaces[k] = '\0';
            o.indent = spaces;
        } else if (ind && ind->kind == JV_STRING) {
            o.indent = ind->u.s.p;
        }
        if (o.indent) o.item_sep = ",";
        if (sep && sep->kind == JV_LIST && sep->u.l.n == 2 && sep->u.l.v[0]->kind == JV_STRING &&
            sep->u.l.v[1]->kind == JV_STRING) {
            o.item_sep = sep->u.l.v[0]->u.s.p;
            o.key_sep = sep->u.l.v[1]->u.s.p;
        }
        o.sort_keys = sk && truthy(sk);
        o.ascii = ea && truthy(ea);
        sbuf b = {0};
        int rc = json_dump(r, line, &b, v, &o, 0);
        if (rc || r->rc) {
            free(b.p);
            return r->rc ? NULL : room(r, line);
        }
        return sb_take(r, line, &b);
    }
    if (!strcmp(name, "string")) return str_of(r, line, v);
    if (!strcmp(name, "items")) {
        jv *l = jv_list();
        if (!l) return room(r, line);
        if (v->kind == JV_UNDEFINED) return l;
        if (v->kind != JV_DICT && v->kind != JV_NAMESPACE) {
            jv_unref(l);
            return rfail(r, line, DP_EINVAL, "can only get item pairs from a mapping");
        }
        for (size_t i = 0; i < v->u.d.n; i++) {
            jv *pair = jv_list();
            if (pair) pair->u.l.tuple = true;
            if (!pair || jv_list_push(pair, jv_ref(v->u.d.k[i])) || jv_list_push(pair, jv_ref(v->u.d.v[i])) ||
                jv_list_push(l, pair)) {
                jv_unref(l);
                return room(r, line);
            }
        }
        return l;
    }
    if (!strcmp(name, "list")) {
        jv *it = iter_list(r, line, v);
        if (!it || it != v) return it;
        jv_unref(it);
        jv *l = jv_list();
        if (!l) return room(r, line);
        for (size_t i = 0; i < v->u.l.n; i++)
            if (jv_list_push(l, jv_ref(v->u.l.v[i]))) return jv_unref(l), room(r, line);
        return l;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jv *l = iter_list(r, line, v);
        if (!l) return NULL;
        res = l->u.l.n ? jv_ref(l->u.l.v[name[0] == 'f' ? 0 : l->u.l.n - 1]) : &j_undef;
        jv_unref(l);
        return res;
    }
    if (!strcmp(name, "reverse")) {
        if (v->kind == JV_STRING) {
            sbuf b = {0};
            size_t cnt;
            size_t *off = u_offsets(v->u.s.p, v->u.s.n, &cnt);
            if (!off) return room(r, line);
            int rc = sb_add(&b, "", 0);
            for (size_t i = cnt; i-- > 0;) rc |= sb_add(&b, v->u.s.p + off[i], off[i + 1] - off[i]);
            free(off);
            if (rc) return free(b.p), room(r, line);
            return sb_take(r, line, &b);
        }
        jv *l = iter_list(r, line, v);
        if (!l) return NULL;
        jv *o = jv_list();
        if (!o) return jv_unref(l), room(r, line);
        for (size_t i = l->u.l.n; i-- > 0;)
            if (jv_list_push(o, jv_ref(l->u.l.v[i]))) return jv_unref(l), jv_unref(o), room(r, line);
        jv_unref(l);
        return o;
    }
    if (!strcmp(name, "join")) {
        jv *sep = arg(a, 0, "d"), *at = arg(a, 1, "attribute");
        jv *l = iter_list(r, line, v);
        if (!l) return NULL;
        sbuf b = {0};
        int rc = sb_add(&b, "", 0);
        for (size_t i = 0; i < l->u.l.n && !rc && !r->rc; i++) {
            if (i && sep) rc |= to_str(&b, sep, 0);
            jv *it =
                at && at->kind == JV_STRING ? attr_of(r, line, l->u.l.v[i], at->u.s.p) : jv_ref(l->u.l.v[i]);
            if (!it) break;
            rc |= to_str(&b, it, 0);
            jv_unref(it);
            if (b.n > r->max_output) {
                rfail(r, line, DP_ERANGE, "a string exceeds the limit of %zu bytes", r->max_output);
                break;
            }
        }
        jv_unref(l);
        if (rc || r->rc) return free(b.p), r->rc ? NULL : room(r, line);
        return sb_take(r, line, &b);
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return select_items(r, line, v, a, true, name[0] == 's');
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return select_items(r, line, v, a, false, name[0] == 's');
    if (!strcmp(name, "map")) {
        jv *l = truthy(v) ? iter_list(r, line, v) : jv_list();
        if (!l) return NULL;
        jv *at = arg(a, 99, "attribute"), *def = arg(a, 99, "default");
        jv *fname = a->npos > 0 ? a->pos[0] : NULL;
        if (!at && (!fname || fname->kind != JV_STRING)) {
            jv_unref(l);
            return rfail(r, line, DP_EINVAL, "map needs a filter name or attribute=");
        }
        if (!at && !in_list(known_filters, fname->u.s.p)) {
            jv_unref(l);
            return rfail(r, line, DP_EUNSUPPORTED, "unknown filter '%s'", fname->u.s.p);
        }
        jv *o = jv_list();
        if (!o) return jv_unref(l), room(r, line);
        args fa = {.pos = a->pos + (a->npos ? 1 : 0),
                   .npos = a->npos ? a->npos - 1 : 0,
                   .kwn = a->kwn,
                   .kwv = a->kwv,
                   .nkw = a->nkw};
        for (size_t i = 0; i < l->u.l.n; i++) {
            jv *it;
            if (at) {
                it = at->kind == JV_STRING ? attr_of(r, line, l->u.l.v[i], at->u.s.p)
                                           : get_item(r, line, l->u.l.v[i], at);
                if (it && it->kind == JV_UNDEFINED && def) it = jv_ref(def);
            } else {
                it = apply_filter(r, line, fname->u.s.p, l->u.l.v[i], &fa);
            }
            if (!it || jv_list_push(o, it)) {
                jv_unref(l);
                jv_unref(o);
                return r->rc ? NULL : room(r, line);
            }
        }
        jv_unref(l);
        return o;
    }
    if (!strcmp(name, "unique")) {
        jv *l = iter_list(r, line, v);
        if (!l) return NULL;
        jv *cs = arg(a, 0, "case_sensitive"), *at = arg(a, 1, "attribute");
        bool fold = !(cs && truthy(cs));
        jv *o = jv_list(), *seen = jv_list();
        if (!o || !seen) goto uoom;
        for (size_t i = 0; i < l->u.l.n; i++) {
            jv *k0 =
                at && at->kind == JV_STRING ? attr_of(r, line, l->u.l.v[i], at->u.s.p) : jv_ref(l->u.l.v[i]);
            jv *k = k0 ? fold_key(r, line, k0, fold) : NULL;
            jv_unref(k0);
            if (!k) goto uoom;
            jv *in = contains(r, line, k, seen);
            if (!in) {
                jv_unref(k);
                goto uoom;
            }
            if (!truthy(in)) {
                if (jv_list_push(seen, k) || jv_list_push(o, jv_ref(l->u.l.v[i]))) goto uoom;
            } else {
                jv_unref(k);
            }
        }
        jv_unref(l);
        jv_unref(seen);
        return o;
    uoom:
        jv_unref(l);
        jv_unref(o);
        jv_unref(seen);
        return r->rc ? NULL : room(r, line);
    }
    if (!strcmp(name, "sort")) {
        jv *l = iter_list(r, line, v);
        if (!l) return NULL;
        jv *rv = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *at = arg(a, 2, "attribute");
        res = sorted(r, line, l, rv && truthy(rv), !(cs && truthy(cs)),
                     at && at->kind == JV_STRING ? at->u.s.p : NULL, -1);
        jv_unref(l);
        return res;
    }
    if (!strcmp(name, "dictsort")) {
        if (v->kind != JV_DICT && v->kind != JV_NAMESPACE)
            return rfail(r, line, DP_EINVAL, "dictsort needs a mapping");
        jv *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rv = arg(a, 2, "reverse");
        jv *l = apply_filter(r, line, "items", v, &(args){0});
        if (!l) return NULL;
        int byv = by && by->kind == JV_STRING && !strcmp(by->u.s.p, "value") ? 1 : 0;
        res = sorted(r, line, l, rv && truthy(rv), !(cs && truthy(cs)), NULL, byv);
        jv_unref(l);
        return res;
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        jv *l = iter_list(r, line, v);
        if (!l) return NULL;
        jv *cs = arg(a, 0, "case_sensitive"), *at = arg(a, 1, "attribute");
        res = sorted(r, line, l, false, !(cs && truthy(cs)), at && at->kind == JV_STRING ? at->u.s.p : NULL,
                     -1);
        jv_unref(l);
        if (!res) return NULL;
        jv *o = res->u.l.n ? jv_ref(res->u.l.v[name[1] == 'i' ? 0 : res->u.l.n - 1]) : &j_undef;
        jv_unref(res);
        return o;
    }
    if (!strcmp(name, "sum")) {
        jv *l = iter_list(r, line, v);
        if (!l) return NULL;
        jv *at = arg(a, 0, "attribute"), *st = arg(a, 1, "start");
        jv *acc = st ? jv_ref(st) : jv_int(0);
        for (size_t i = 0; acc && i < l->u.l.n; i++) {
            jv *it =
                at && at->kind == JV_STRING ? attr_of(r, line, l->u.l.v[i], at->u.s.p) : jv_ref(l->u.l.v[i]);
            jv *n = it ? binop(r, line, '+', acc, it) : NULL;
            jv_unref(it);
            jv_unref(acc);
            acc = n;
        }
        jv_unref(l);
        return acc ? acc : r->rc ? NULL : room(r, line);
    }
    if (!strcmp(name, "attr")) {
        jv *at = need_str(r, line, arg(a, 0, "name"), "attr");
        if (!at) return NULL;
        if (v->kind == JV_DICT || v->kind == JV_NAMESPACE) return &j_undef; /* attributes, not items */
        return &j_undef;
    }
    if (!strcmp(name, "abs")) {
        if (!is_num(v)) return rfail(r, line, DP_EINVAL, "bad operand type for abs(): '%s'", type_name(v));
        if (v->kind == JV_FLOAT) return (x = jv_float(fabs(v->u.f))) ? x : room(r, line);
        int64_t i = num_i(v);
        if (i == INT64_MIN) return rfail(r, line, DP_ERANGE, "integer overflow");
        return (x = jv_int(i < 0 ? -i : i)) ? x : room(r, line);
    }
    if (!strcmp(name, "round")) {
        jv *pr = arg(a, 0, "precision"), *me = arg(a, 1, "method");
        if (!is_num(v)) return rfail(r, line, DP_EINVAL, "round needs a number");
        int64_t p = pr ? num_i(pr) : 0;
        const char *m = me && me->kind == JV_STRING ? me->u.s.p : "common";
        double f = num_f(v), sc = pow(10.0, (double)p), y = f * sc;
        if (!strcmp(m, "ceil"))
            y = ceil(y);
        else if (!strcmp(m, "floor"))
            y = floor(y);
        else
            y = nearbyint(y);
        if (v->kind != JV_FLOAT && !strcmp(m, "common") && p >= 0) return jv_ref(v);
        return (x = jv_float(y / sc)) ? x : room(r, line);
    }
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        bool want_f = name[0] == 'f';
        jv *dv = arg(a, 0, "default");
        if (is_num(v))
            return want_f ? ((x = jv_float(num_f(v))) ? x : room(r, line))
                          : ((x = jv_int(num_i(v))) ? x : room(r, line));
        if (v->kind == JV_STRING) {
            char *e;
            errno = 0;
            if (!want_f) {
                long long i = strtoll(v->u.s.p, &e, 10);
                while (*e && isspace((unsigned char)*e)) e++;
                if (!errno && e != v->u.s.p && !*e) return (x = jv_int(i)) ? x : room(r, line);
            }
            double f = strtod(v->u.s.p, &e);
            while (*e && isspace((unsigned char)*e)) e++;
            if (e != v->u.s.p && !*e)
                return want_f ? ((x = jv_float(f)) ? x : room(r, line))
                              : ((x = jv_int(f_to_i(f))) ? x : room(r, line));
        }
        if (dv) return jv_ref(dv);
        return want_f ? ((x = jv_float(0)) ? x : room(r, line)) : ((x = jv_int(0)) ? x : room(r, line));
    }
    if (!strcmp(name, "wordcount")) {
        jv *s = str_of(r, line, v);
        if (!s) return NULL;
        int64_t c = 0;
        bool in = false;
        for (size_t i = 0; i < s->u.s.n; i++) {
            unsigned char ch = (unsigned char)s->u.s.p[i];
            bool w = isalnum(ch) || ch == '_' || ch >= 0x80;
            if (w && !in) c++;
            in = w;
        }
        jv_unref(s);
        return (x = jv_int(c)) ? x : room(r, line);
    }
    /* string filters: Jinja applies str() first */
    jv *s = str_of(r, line, v);
    if (!s) return NULL;
    res = NULL;
    if (!strcmp(name, "trim")) {
        jv *ch = arg(a, 0, "chars");
        if (ch && ch->kind != JV_STRING) ch = NULL;
        res = do_strip(r, line, s, ch, true, true);
    } else if (!strcmp(name, "lower"))
        res = case_map(r, line, s, 'l');
    else if (!strcmp(name, "upper"))
        res = case_map(r, line, s, 'u');
    else if (!strcmp(name, "capitalize"))
        res = case_map(r, line, s, 'c');
    else if (!strcmp(name, "title"))
        res = case_map(r, line, s, 't');
    else if (!strcmp(name, "replace")) {
        jv *o = arg(a, 0, "old"), *nw = arg(a, 1, "new"), *c = arg(a, 2, "count");
        jv *os = o ? str_of(r, line, o) : NULL, *ns = nw ? str_of(r, line, nw) : NULL;
        if (os && ns)
            res = do_replace(r, line, s, os, ns, c && c->kind != JV_NONE ? num_i(c) : -1);
        else if (!r->rc)
            rfail(r, line, DP_EINVAL, "replace needs two arguments");
        jv_unref(os);
        jv_unref(ns);
    } else if (!strcmp(name, "indent")) {
        jv *w = arg(a, 0, "width"), *f = arg(a, 1, "first"), *b = arg(a, 2, "blank");
        res = indent_filter(r, line, s, w, f && truthy(f), b && truthy(b));
    } else {
        rfail(r, line, DP_EUNSUPPORTED, "unknown filter '%s'", name);
    }
    jv_unref(s);
    return res;
}

/* ---- statements ---- */

static int emit(rs *r, int line, const char *s, size_t n)
{
    if (r->out->n + n > r->max_output) {
        rfail(r, line, DP_ERANGE, "the output exceeds the limit of %zu bytes", r->max_output);
        return -1;
    }
    if (sb_add(r->out, s, n)) {
        room(r, line);
        return -1;
    }
    return 0;
}

static int emit_value(rs *r, int line, const jv *v)
{
    if (v->kind == JV_STRING) return emit(r, line, v->u.s.p, v->u.s.n);
    sbuf b = {0};
    if (to_str(&b, v, 0)) {
        free(b.p);
        room(r, line);
        return -1;
    }
    int rc = emit(r, line, b.p ? b.p : "", b.n);
    free(b.p);
    return rc;
}

static bool bind_targets(rs *r, int line, char *const *names, size_t n, jv *v)
{
    if (n == 1) return set_var(r, line, names[0], jv_ref(v));
    jv *l = iter_list(r, line, v);
    if (!l) return false;
    if (l->u.l.n != n) {
        jv_unref(l);
        rfail(r, line, DP_EINVAL, "cannot unpack %zu values into %zu names", jv_len(v), n);
        return false;
    }
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) ok = set_var(r, line, names[i], jv_ref(l->u.l.v[i]));
    jv_unref(l);
    return ok;
}

static int exec_for(rs *r, const node *n)
{
    jv *seq = eval(r, n->a);
    if (!seq) return -1;
    jv *items = iter_list(r, n->line, seq);
    jv_unref(seq);
    if (!items) return -1;
    int rc = 0;
    jv *kept = items;
    if (n->b) { /* for x in xs if cond: loop.* count the kept items only */
        kept = jv_list();
        if (!kept) {
            jv_unref(items);
            room(r, n->line);
            return -1;
        }
        for (size_t i = 0; i < items->u.l.n && !rc; i++) {
            frame f = {jv_dict(), r->top};
            if (!f.vars) {
                room(r, n->line);
                rc = -1;
                break;
            }
            r->top = &f;
            jv *c = NULL;
            if (r->iters_left-- <= 0)
                rfail(r, n->line, DP_ERANGE, "more than the limit of loop iterations");
            else if (bind_targets(r, n->line, n->names, n->nnames, items->u.l.v[i]))
                c = eval(r, n->b);
            r->top = f.parent;
            jv_unref(f.vars);
            if (!c)
                rc = -1;
            else if (truthy(c) && jv_list_push(kept, jv_ref(items->u.l.v[i])))
                rc = -1, room(r, n->line);
            jv_unref(c);
        }
        jv_unref(items);
    }
    size_t len = kept->u.l.n;
    for (size_t i = 0; i < len && !rc; i++) {
        if (r->iters_left-- <= 0) {
            rfail(r, n->line, DP_ERANGE, "more than the limit of loop iterations");
            rc = -1;
            break;
        }
        if (!in_time(r)) {
            rfail(r, n->line, DP_ERANGE, "the rendering took longer than its limit of %ld ms", r->max_ms);
            rc = -1;
            break;
        }
        /* Jinja gives every iteration its own scope. */
        frame f = {jv_dict(), r->top};
        jv *loop = jv_dict();
        bool ok = f.vars && loop;
        int64_t li = (int64_t)i, ll = (int64_t)len;
        ok = ok && !jv_dict_set(loop, "index", jv_int(li + 1)) && !jv_dict_set(loop, "index0", jv_int(li)) &&
             !jv_dict_set(loop, "revindex", jv_int(ll - li)) &&
             !jv_dict_set(loop, "revindex0", jv_int(ll - li - 1)) &&
             !jv_dict_set(loop, "first", jv_bool(i == 0)) &&
             !jv_dict_set(loop, "last", jv_bool(i + 1 == len)) && !jv_dict_set(loop, "length", jv_int(ll)) &&
             !jv_dict_set(loop, "depth", jv_int(1)) && !jv_dict_set(loop, "depth0", jv_int(0)) &&
             !jv_dict_set(loop, "previtem", i > 0 ? jv_ref(kept->u.l.v[i - 1]) : &j_undef) &&
             !jv_dict_set(loop, "nextitem", i + 1 < len ? jv_ref(kept->u.l.v[i + 1]) : &j_undef);
        if (!ok) {
            jv_unref(f.vars);
            jv_unref(loop);
            room(r, n->line);
            rc = -1;
            break;
        }
        r->top = &f;
        if (!set_var(r, n->line, "loop", loop) ||
            !bind_targets(r, n->line, n->names, n->nnames, kept->u.l.v[i]))
            rc = -1;
        if (!rc) rc = exec_body(r, n->c);
        r->top = f.parent;
        jv_unref(f.vars);
        if (r->ctl == 1) {
            r->ctl = 0;
            break;
        }
        r->ctl = 0;
    }
    if (!rc && len == 0 && n->d) rc = exec_body(r, n->d);
    jv_unref(kept);
    return rc;
}

/* 1 if v is or holds a namespace, 2 if it is nested deeper than 64 or
 * takes more than *budget steps (a render's budget, so that setting a
 * big list in a loop cannot take quadratic time), else 0. */
static int holds_namespace(const jv *v, int depth, long *budget)
{
    if (--*budget < 0 || depth > 64) return 2;
    switch (v->kind) {
    case JV_NAMESPACE: return 1;
    case JV_LIST:
        for (size_t i = 0; i < v->u.l.n; i++) {
            int k = holds_namespace(v->u.l.v[i], depth + 1, budget);
            if (k) return k;
        }
        return 0;
    case JV_DICT:
        for (size_t i = 0; i < v->u.d.n; i++) {
            int k = holds_namespace(v->u.d.v[i], depth + 1, budget);
            if (!k) k = holds_namespace(v->u.d.k[i], depth + 1, budget);
            if (k) return k;
        }
        return 0;
    default: return 0;
    }
}

static int exec_stmt(rs *r, const node *n)
{
    switch (n->type) {
    case N_TEXT: return emit(r, n->line, n->lit->u.s.p, n->lit->u.s.n);
    case N_OUT: {
        jv *v = eval(r, n->a);
        if (!v) return -1;
        int rc = emit_value(r, n->line, v);
        jv_unref(v);
        return rc;
    }
    case N_IF: {
        jv *c = eval(r, n->a);
        if (!c) return -1;
        bool t = truthy(c);
        jv_unref(c);
        if (t) return exec_body(r, n->b);
        if (!n->c) return 0;
        return n->c->type == N_IF ? exec_stmt(r, n->c) : exec_body(r, n->c);
    }
    case N_FOR: return exec_for(r, n);
    case N_SET: {
        jv *v = eval(r, n->a);
        if (!v) return -1;
        if (n->attr) {
            jv *ns = lookup(r, n->name);
            if (ns->kind != JV_NAMESPACE) {
                jv_unref(v);
                rfail(r, n->line, DP_EINVAL, "cannot assign attribute on non-namespace object");
                return -1;
            }
            /* A namespace is the only value that changes after it is made,
             * so the only way to a cycle (never freed: reference counts) or
             * to values nested without bound (ns.a = [ns.a] in a loop). */
            int nsd = holds_namespace(v, 0, &r->scan_left);
            if (nsd) {
                jv_unref(v);
                rfail(r, n->line, nsd == 1 ? DP_EINVAL : DP_ERANGE,
                      nsd == 1 ? "cannot store a namespace in a namespace's attribute '%s'"
                               : "the value set to '%s' is nested too deeply, or the template set more than its "
                                 "limit of values into namespaces",
                      n->attr);
                return -1;
            }
            if (jv_dict_set(ns, n->attr, v)) return room(r, n->line), -1;
            return 0;
        }
        bool ok = bind_targets(r, n->line, n->names, n->nnames, v);
        jv_unref(v);
        return ok ? 0 : -1;
    }
    case N_SETBLOCK: {
        sbuf out = {0}, *saved = r->out;
        r->out = &out;
        int rc = exec_body(r, n->a);
        r->out = saved;
        if (rc) {
            free(out.p);
            return rc;
        }
        jv *v = sb_take(r, n->line, &out);
        return set_var(r, n->line, n->names[0], v) ? 0 : -1;
    }
    case N_MACRO: {
        jv *m = jv_new(JV_CALLABLE);
        if (!m) return room(r, n->line), -1;
        m->u.c.macro = n;
        return set_var(r, n->line, n->name, m) ? 0 : -1;
    }
    case N_BREAK: r->ctl = 1; return 0;
    case N_CONTINUE: r->ctl = 2; return 0;
    case N_BODY: return exec_body(r, n);
    default: rfail(r, n->line, DP_EINVAL, "bad statement"); return -1;
    }
}

static int exec_body(rs *r, const node *body)
{
    for (size_t i = 0; i < body->nkids; i++) {
        /* r->rc: a limit hit inside a comparison leaves a value behind */
        if (exec_stmt(r, body->kids[i]) || r->rc) return -1;
        if (r->ctl) return 0;
    }
    return 0;
}

int jinja_render_opts(const jinja_tmpl *t, const jv *ctx, const jinja_opts *o, char **out, size_t *out_len,
                      char *err, size_t errsz)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    if (err && errsz) err[0] = '\0';
    jinja_opts d = {0};
    if (o) d = *o;
    if (!d.max_output) d.max_output = 1u << 20;
    if (!d.max_iters) d.max_iters = 100000;
    if (!d.max_depth) d.max_depth = 64;
    static char dummy[1];
    sbuf b = {0};
    frame root = {jv_dict(), NULL};
    rs r = {.ctx = ctx,
            .top = &root,
            .root = &root,
            .out = &b,
            .max_output = d.max_output,
            /* at most 64 MiB of strings in all (or 4 outputs' worth if the
             * output limit is larger): a request's conversation raises
             * max_output, which must not raise the memory a template may use
             * 64-fold. */
            .budget = d.max_output > ((size_t)1 << 20) ? (d.max_output > ((size_t)16 << 20) ? d.max_output * 4
                                                                                               : (size_t)64 << 20)
                                                       : d.max_output * 64,
            .iters_left = d.max_iters,
            .scan_left = 4000000,
            .steps_left = d.max_iters * 100,
            .max_list = d.max_iters,
            .max_depth = d.max_depth,
            .max_ms = d.max_ms,
            .now = d.now,
            .err = err ? err : dummy,
            .errsz = err ? errsz : sizeof dummy};
    if (!t || !t->root) return dp_err(err, errsz, DP_EINVAL, "jinja: no template");
    if (!root.vars) return dp_err(err, errsz, DP_ENOMEM, "jinja: out of memory");
    if (r.max_ms) {
        clock_gettime(CLOCK_MONOTONIC, &r.t_end);
        r.t_end.tv_sec += r.max_ms / 1000;
        r.t_end.tv_nsec += (r.max_ms % 1000) * 1000000L;
        if (r.t_end.tv_nsec >= 1000000000L) {
            r.t_end.tv_sec++;
            r.t_end.tv_nsec -= 1000000000L;
        }
    }
    rs *saved = cur_render;
    cur_render = &r;
    int rc = exec_body(&r, t->root);
    cur_render = saved;
    if (!rc && sb_add(&b, "", 0)) rc = -1, room(&r, 0);
    jv_unref(root.vars);
    if (rc || r.rc) {
        free(b.p);
        return r.rc ? r.rc : DP_EINVAL;
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return 0;
}

int jinja_render(const jinja_tmpl *t, const jv *ctx, char **out, char *err, size_t errsz)
{
    return jinja_render_opts(t, ctx, NULL, out, NULL, err, errsz);
}
