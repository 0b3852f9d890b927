/* grammar.c: GBNF -> byte-level rules -> a pushdown automaton over parse
 * stacks, and token masks from a walk of the vocabulary's byte trie.
 *
 * Rules are lowered to alternatives of elements: a byte class (a 256-bit
 * set), a reference to a rule, or the end of the alternative. Repetition
 * becomes right-recursive helper rules (x* -> r ::= x r | ""), groups and
 * non-ASCII classes helper rules of their own. A parse stack holds element
 * positions, the top being the byte class to match next and the ones below
 * where to continue when a rule ends; a state is the set of such stacks
 * (several while the text is ambiguous), an empty stack meaning "a sentence
 * may end here". */
#include "grammar.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"

enum { EL_END = 0, EL_BYTES = 1, EL_REF = 2 };

#define MAX_STACKS 1024      /* a state with more is a grammar too ambiguous to serve */
#define MAX_DEPTH 4096       /* nesting a stack may reach */
/* What one request's grammar may cost, so that a short text (x{0,100000},
 * a schema's maxLength) cannot take the memory, or the C stack of the
 * recursive checks, of the daemon: a 400 instead. */
#define MAX_REPEAT 4096      /* m and n of x{m,n} */
#define MAX_RULES 20000      /* helper rules included */
#define MAX_ELEMENTS 400000
#define MAX_EXPAND 200000    /* stack configurations one expansion may visit */
#define CACHE_SLOTS 256      /* token masks kept per grammar */

typedef struct gel {
    uint8_t type;
    int32_t arg;             /* class index (BYTES) or rule index (REF) */
} gel;

typedef struct bclass {
    uint64_t w[4];
} bclass;

/* A token mask for one state, in the grammar's cache. */
typedef struct mslot {
    uint64_t hash;
    int32_t *key;            /* the state's stacks, serialised */
    int32_t n_key;
    uint64_t *bits;          /* allowed tokens */
    uint64_t used;           /* last use, for eviction */
} mslot;

struct dp_grammar {
    atomic_int refs;
    /* Token masks by state, shared by every state of this grammar (the
     * requests of one schema, n > 1): written and read by the engine
     * thread only, for the vocabulary it was filled for. */
    mslot *cache;
    int32_t n_cache;
    uint64_t clock;
    const dp_gvocab *cache_vocab;
    gel *el;                 /* every alternative, each ending in EL_END */
    int32_t n_el;
    int32_t *alt_start;      /* alternatives' first elements, by rule */
    int32_t *rule_alt0, *rule_nalt; /* rule r: alt_start[rule_alt0[r] .. + rule_nalt[r]) */
    int32_t n_rules;
    bclass *cls;
    int32_t n_cls;
    int32_t root;
};

/* ---- growable arrays ---------------------------------------------------- */

static int grow(void **p, int32_t *cap, int32_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    int32_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * sz);
    if (!q)
        return DP_ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* ---- the compiler ------------------------------------------------------- */

/* One alternative while it is built. */
typedef struct seq {
    gel *el;
    int32_t n, cap;
} seq;

typedef struct prule {
    char *name;              /* NULL for helper rules */
    seq *alts;
    int32_t n_alts, cap_alts;
    bool defined;
    int32_t line;            /* first reference or definition, for messages */
} prule;

typedef struct comp {
    const char *s, *end;
    int32_t line;
    prule *rules;
    int32_t n_rules, cap_rules;
    bclass *cls;
    int32_t n_cls, cap_cls;
    int depth;               /* open parentheses */
    int64_t n_elements;      /* pushed in all (the size budget) */
    int rc;
    char *err;
    size_t errsz;
} comp;

static int cfail(comp *c, const char *fmt, const char *what)
{
    if (c->rc == 0)
        c->rc = dp_err(c->err, c->errsz, DP_EINVAL, "grammar: line %d: %s%s", c->line, fmt,
                       what ? what : "");
    return c->rc;
}

static int seq_push(comp *c, seq *q, uint8_t type, int32_t arg)
{
    if (++c->n_elements > MAX_ELEMENTS) {
        cfail(c, "the grammar is too large (more than 400000 elements)", NULL);
        return -1;
    }
    if (grow((void **)&q->el, &q->cap, q->n + 1, sizeof *q->el)) {
        c->rc = DP_ENOMEM;
        return -1;
    }
    q->el[q->n++] = (gel){type, arg};
    return 0;
}

static int32_t rule_new(comp *c, const char *name, size_t nlen)
{
    if (c->n_rules >= MAX_RULES) {
        cfail(c, "the grammar is too large (more than 20000 rules, counting those that "
              "repetition makes)", NULL);
        return -1;
    }
    if (grow((void **)&c->rules, &c->cap_rules, c->n_rules + 1, sizeof *c->rules)) {
        c->rc = DP_ENOMEM;
        return -1;
    }
    prule *r = &c->rules[c->n_rules];
    memset(r, 0, sizeof *r);
    r->line = c->line;
    if (name) {
        r->name = strndup(name, nlen);
        if (!r->name) {
            c->rc = DP_ENOMEM;
            return -1;
        }
    }
    return c->n_rules++;
}

static int32_t rule_named(comp *c, const char *name, size_t nlen)
{
    for (int32_t i = 0; i < c->n_rules; i++)
        if (c->rules[i].name && strlen(c->rules[i].name) == nlen &&
            !memcmp(c->rules[i].name, name, nlen))
            return i;
    return rule_new(c, name, nlen);
}

static seq *rule_alt(comp *c, int32_t r)
{
    prule *p = &c->rules[r];
    if (grow((void **)&p->alts, &p->cap_alts, p->n_alts + 1, sizeof *p->alts)) {
        c->rc = DP_ENOMEM;
        return NULL;
    }
    seq *q = &p->alts[p->n_alts++];
    memset(q, 0, sizeof *q);
    return q;
}

static int32_t class_add(comp *c, const bclass *b)
{
    for (int32_t i = 0; i < c->n_cls; i++)
        if (!memcmp(&c->cls[i], b, sizeof *b))
            return i;
    if (grow((void **)&c->cls, &c->cap_cls, c->n_cls + 1, sizeof *c->cls)) {
        c->rc = DP_ENOMEM;
        return -1;
    }
    c->cls[c->n_cls] = *b;
    return c->n_cls++;
}

static void bc_range(bclass *b, unsigned lo, unsigned hi)
{
    for (unsigned x = lo; x <= hi && x < 256; x++)
        b->w[x >> 6] |= 1ULL << (x & 63);
}

static bool bc_has(const bclass *b, unsigned x) { return (b->w[x >> 6] >> (x & 63)) & 1; }

static int push_byte(comp *c, seq *q, unsigned byte)
{
    bclass b = {{0}};
    bc_range(&b, byte, byte);
    int32_t k = class_add(c, &b);
    return k < 0 ? -1 : seq_push(c, q, EL_BYTES, k);
}

static int utf8_encode(uint32_t cp, unsigned char *o)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Code point ranges [lo, hi] as alternatives of byte-class sequences, the
 * UTF-8 encodings of exactly those code points (split where the encoded
 * length changes, then where a continuation byte's range is not whole). */
static int utf8_ranges(comp *c, int32_t rule, uint32_t lo, uint32_t hi)
{
    if (lo > hi || c->rc)
        return c->rc;
    static const uint32_t lens[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= lens[i] && hi > lens[i])
            return utf8_ranges(c, rule, lo, lens[i]) || utf8_ranges(c, rule, lens[i] + 1, hi);
    if (lo <= 0xDFFF && hi >= 0xD800) { /* surrogates are not characters */
        if (lo < 0xD800 && utf8_ranges(c, rule, lo, 0xD7FF))
            return c->rc;
        return hi > 0xDFFF ? utf8_ranges(c, rule, 0xE000, hi) : 0;
    }
    unsigned char a[4], b[4];
    int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0)
                return utf8_ranges(c, rule, lo, lo | m) || utf8_ranges(c, rule, (lo | m) + 1, hi);
            if ((hi & m) != m)
                return utf8_ranges(c, rule, lo, (hi & ~m) - 1) || utf8_ranges(c, rule, hi & ~m, hi);
        }
    }
    utf8_encode(hi, b);
    seq *q = rule_alt(c, rule);
    if (!q)
        return c->rc;
    for (int i = 0; i < n; i++) {
        bclass bc = {{0}};
        bc_range(&bc, a[i], b[i]);
        int32_t k = class_add(c, &bc);
        if (k < 0 || seq_push(c, q, EL_BYTES, k))
            return c->rc;
    }
    return seq_push(c, q, EL_END, 0);
}

/* ---- the lexer ---- */

static bool is_name(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-';
}

/* Spaces, tabs and comments; newlines too inside parentheses, or where the
 * next line continues the rule (it does not start `name ::=`). */
static void skip_space(comp *c, bool *ends_rule)
{
    *ends_rule = false;
    for (;;) {
        while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\r'))
            c->s++;
        if (c->s < c->end && *c->s == '#') {
            while (c->s < c->end && *c->s != '\n')
                c->s++;
            continue;
        }
        if (c->s < c->end && *c->s == '\n') {
            if (c->depth == 0) {
                /* A new rule starts on a later line? */
                const char *p = c->s;
                int32_t lines = 0;
                for (;;) {
                    while (p < c->end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) {
                        lines += *p == '\n';
                        p++;
                    }
                    if (p < c->end && *p == '#') {
                        while (p < c->end && *p != '\n')
                            p++;
                        continue;
                    }
                    break;
                }
                const char *q = p;
                while (q < c->end && is_name(*q))
                    q++;
                const char *r = q;
                while (r < c->end && (*r == ' ' || *r == '\t'))
                    r++;
                if (p == c->end || (q > p && c->end - r >= 3 && !memcmp(r, "::=", 3))) {
                    *ends_rule = true;
                    return;
                }
                c->line += lines;
                c->s = p;
                continue;
            }
            c->line++;
            c->s++;
            continue;
        }
        return;
    }
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* One character of a literal or class (after a backslash: an escape), as a
 * code point; raw bytes >= 0x80 are decoded as UTF-8. -1 on error. */
static int64_t read_char(comp *c)
{
    if (c->s >= c->end)
        return -1;
    unsigned char ch = (unsigned char)*c->s++;
    if (ch == '\\') {
        if (c->s >= c->end)
            return -1;
        char e = *c->s++;
        int nhex = 0;
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '0': return 0;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'':
        case '.': case '|': case '(': case ')': case '*': case '+': case '?': case '{':
        case '}': return e;
        default: cfail(c, "unknown escape \\", (char[]){e, 0}); return -1;
        }
        uint32_t v = 0;
        for (int i = 0; i < nhex; i++) {
            int h = c->s < c->end ? hexval(*c->s) : -1;
            if (h < 0) {
                cfail(c, "bad hex escape", NULL);
                return -1;
            }
            v = v * 16 + (uint32_t)h;
            c->s++;
        }
        if (v > 0x10FFFF) {
            cfail(c, "code point out of range", NULL);
            return -1;
        }
        return v;
    }
    if (ch < 0x80)
        return ch;
    int n = ch >= 0xF0 ? 3 : ch >= 0xE0 ? 2 : ch >= 0xC0 ? 1 : -1;
    if (n < 0 || c->end - c->s < n) {
        cfail(c, "invalid UTF-8 in the grammar", NULL);
        return -1;
    }
    uint32_t v = ch & (0x3F >> n);
    for (int i = 0; i < n; i++) {
        unsigned char b = (unsigned char)*c->s++;
        if ((b & 0xC0) != 0x80) {
            cfail(c, "invalid UTF-8 in the grammar", NULL);
            return -1;
        }
        v = (v << 6) | (b & 0x3F);
    }
    return v;
}

/* ---- the parser ---- */

typedef struct crange {
    uint32_t lo, hi;
} crange;

static int cmp_range(const void *a, const void *b)
{
    const crange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* A class of code point ranges as one element: a byte class when every code
 * point is ASCII, else a helper rule of UTF-8 sequences. */
static int class_element(comp *c, seq *q, crange *rg, int32_t n, bool negate)
{
    qsort(rg, (size_t)n, sizeof *rg, cmp_range);
    crange *m = malloc(((size_t)n + 1) * sizeof *m);
    if (!m) {
        c->rc = DP_ENOMEM;
        return -1;
    }
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) { /* merge */
        if (k > 0 && rg[i].lo <= m[k - 1].hi + 1) {
            if (rg[i].hi > m[k - 1].hi)
                m[k - 1].hi = rg[i].hi;
        } else {
            m[k++] = rg[i];
        }
    }
    if (negate) {
        crange *inv = malloc(((size_t)k + 1) * sizeof *inv);
        if (!inv) {
            free(m);
            c->rc = DP_ENOMEM;
            return -1;
        }
        int32_t j = 0;
        uint32_t from = 0;
        for (int32_t i = 0; i < k; i++) {
            if (m[i].lo > from)
                inv[j++] = (crange){from, m[i].lo - 1};
            from = m[i].hi + 1;
        }
        if (from <= 0x10FFFF)
            inv[j++] = (crange){from, 0x10FFFF};
        free(m);
        m = inv;
        k = j;
    }
    int rc = 0;
    if (k > 0 && m[k - 1].hi < 0x80) {
        bclass b = {{0}};
        for (int32_t i = 0; i < k; i++)
            bc_range(&b, m[i].lo, m[i].hi);
        int32_t ci = class_add(c, &b);
        rc = ci < 0 ? -1 : seq_push(c, q, EL_BYTES, ci);
    } else if (k == 0) {
        rc = cfail(c, "a character class that matches nothing", NULL);
    } else {
        int32_t r = rule_new(c, NULL, 0);
        for (int32_t i = 0; r >= 0 && i < k && !c->rc; i++)
            utf8_ranges(c, r, m[i].lo, m[i].hi);
        rc = r < 0 || c->rc ? -1 : seq_push(c, q, EL_REF, r);
    }
    free(m);
    return rc ? -1 : 0;
}

static int parse_alternatives(comp *c, int32_t rule);

/* One primary into a fresh sequence: the element(s) it stands for. */
static int parse_primary(comp *c, seq *q)
{
    bool nl;
    char ch = *c->s;
    if (ch == '"') {
        c->s++;
        while (c->s < c->end && *c->s != '"') {
            if (*c->s == '\n')
                return cfail(c, "unterminated string literal", NULL);
            int64_t cp = read_char(c);
            if (cp < 0)
                return cfail(c, "bad string literal", NULL);
            unsigned char u[4];
            int n = utf8_encode((uint32_t)cp, u);
            for (int i = 0; i < n; i++)
                if (push_byte(c, q, u[i]))
                    return -1;
        }
        if (c->s >= c->end)
            return cfail(c, "unterminated string literal", NULL);
        c->s++;
        return 0;
    }
    if (ch == '[') {
        c->s++;
        bool negate = c->s < c->end && *c->s == '^';
        if (negate)
            c->s++;
        crange *rg = NULL;
        int32_t n = 0, cap = 0;
        while (c->s < c->end && *c->s != ']') {
            int64_t lo = read_char(c), hi = lo;
            if (lo >= 0 && c->end - c->s >= 2 && c->s[0] == '-' && c->s[1] != ']') {
                c->s++;
                hi = read_char(c);
            }
            if (lo < 0 || hi < lo) {
                free(rg);
                return cfail(c, "bad character class", NULL);
            }
            if (grow((void **)&rg, &cap, n + 1, sizeof *rg)) {
                free(rg);
                c->rc = DP_ENOMEM;
                return -1;
            }
            rg[n++] = (crange){(uint32_t)lo, (uint32_t)hi};
        }
        if (c->s >= c->end) {
            free(rg);
            return cfail(c, "unterminated character class", NULL);
        }
        c->s++;
        if (n == 0 && !negate) {
            free(rg);
            return cfail(c, "empty character class", NULL);
        }
        int rc = class_element(c, q, rg, n, negate);
        free(rg);
        return rc;
    }
    if (ch == '.') {
        c->s++;
        crange all = {0, 0x10FFFF};
        return class_element(c, q, &all, 1, false);
    }
    if (ch == '(') {
        c->s++;
        c->depth++;
        int32_t r = rule_new(c, NULL, 0);
        if (r < 0 || parse_alternatives(c, r))
            return -1;
        skip_space(c, &nl);
        if (c->s >= c->end || *c->s != ')')
            return cfail(c, "missing )", NULL);
        c->s++;
        c->depth--;
        return seq_push(c, q, EL_REF, r);
    }
    if (is_name(ch)) {
        const char *p = c->s;
        while (c->s < c->end && is_name(*c->s))
            c->s++;
        int32_t r = rule_named(c, p, (size_t)(c->s - p));
        return r < 0 ? -1 : seq_push(c, q, EL_REF, r);
    }
    char what[2] = {ch, 0};
    return cfail(c, "unexpected character ", what);
}

/* x{lo,hi} (hi < 0: unbounded) appended to q, x being the sequence xs. */
static int push_repeat(comp *c, seq *q, const seq *xs, int32_t lo, int32_t hi)
{
    /* x as one element: a single element stays, a longer one (a literal of
     * several bytes) becomes a helper rule. */
    gel x;
    if (xs->n == 1) {
        x = xs->el[0];
    } else {
        int32_t r = rule_new(c, NULL, 0);
        seq *a = r < 0 ? NULL : rule_alt(c, r);
        if (!a)
            return -1;
        for (int32_t i = 0; i < xs->n; i++)
            if (seq_push(c, a, xs->el[i].type, xs->el[i].arg))
                return -1;
        if (seq_push(c, a, EL_END, 0))
            return -1;
        x = (gel){EL_REF, r};
    }
    for (int32_t i = 0; i < lo; i++)
        if (seq_push(c, q, x.type, x.arg))
            return -1;
    if (hi < 0) { /* star ::= x star | "" */
        int32_t r = rule_new(c, NULL, 0);
        seq *a = r < 0 ? NULL : rule_alt(c, r);
        if (!a || seq_push(c, a, x.type, x.arg) || seq_push(c, a, EL_REF, r) ||
            seq_push(c, a, EL_END, 0))
            return -1;
        seq *b = rule_alt(c, r);
        if (!b || seq_push(c, b, EL_END, 0))
            return -1;
        return seq_push(c, q, EL_REF, r);
    }
    /* opt_k ::= x opt_{k-1} | "", nested hi - lo deep */
    int32_t inner = -1;
    for (int32_t k = 0; k < hi - lo; k++) {
        int32_t r = rule_new(c, NULL, 0);
        seq *a = r < 0 ? NULL : rule_alt(c, r);
        if (!a || seq_push(c, a, x.type, x.arg) || (inner >= 0 && seq_push(c, a, EL_REF, inner)) ||
            seq_push(c, a, EL_END, 0))
            return -1;
        seq *b = rule_alt(c, r);
        if (!b || seq_push(c, b, EL_END, 0))
            return -1;
        inner = r;
    }
    return inner >= 0 ? seq_push(c, q, EL_REF, inner) : 0;
}

static int parse_int(comp *c, int32_t *v)
{
    if (c->s >= c->end || *c->s < '0' || *c->s > '9')
        return -1;
    int64_t x = 0;
    while (c->s < c->end && *c->s >= '0' && *c->s <= '9') {
        x = x * 10 + (*c->s++ - '0');
        if (x > MAX_REPEAT)
            return -1;
    }
    *v = (int32_t)x;
    return 0;
}

static int parse_sequence(comp *c, seq *q, bool *ends_rule)
{
    for (;;) {
        skip_space(c, ends_rule);
        if (*ends_rule || c->s >= c->end || *c->s == '|' || *c->s == ')')
            return 0;
        seq item = {0};
        if (parse_primary(c, &item)) {
            free(item.el);
            return -1;
        }
        int32_t lo = 1, hi = 1;
        if (c->s < c->end && (*c->s == '*' || *c->s == '+' || *c->s == '?')) {
            lo = *c->s == '+';
            hi = *c->s == '?' ? 1 : -1;
            c->s++;
        } else if (c->s < c->end && *c->s == '{') {
            c->s++;
            if (parse_int(c, &lo)) {
                free(item.el);
                return cfail(c, "bad {m,n} repetition (counts of at most 4096)", NULL);
            }
            hi = lo;
            if (c->s < c->end && *c->s == ',') {
                c->s++;
                hi = -1;
                if (c->s < c->end && *c->s != '}' && (parse_int(c, &hi) || hi < lo)) {
                    free(item.el);
                    return cfail(c, "bad {m,n} repetition", NULL);
                }
            }
            if (c->s >= c->end || *c->s != '}') {
                free(item.el);
                return cfail(c, "bad {m,n} repetition", NULL);
            }
            c->s++;
        }
        int rc;
        if (lo == 1 && hi == 1) {
            rc = 0;
            for (int32_t i = 0; i < item.n && !rc; i++)
                rc = seq_push(c, q, item.el[i].type, item.el[i].arg);
        } else {
            rc = push_repeat(c, q, &item, lo, hi);
        }
        free(item.el);
        if (rc)
            return -1;
    }
}

static int parse_alternatives(comp *c, int32_t rule)
{
    for (;;) {
        bool ends_rule = false;
        seq *q = rule_alt(c, rule);
        if (!q)
            return -1;
        /* rule_alt may move the array: build in a local sequence. */
        seq local = {0};
        int rc = parse_sequence(c, &local, &ends_rule);
        if (!rc)
            rc = seq_push(c, &local, EL_END, 0);
        c->rules[rule].alts[c->rules[rule].n_alts - 1] = local;
        if (rc)
            return -1;
        if (ends_rule || c->s >= c->end || *c->s != '|')
            return 0;
        c->s++;
    }
}

static int parse_rules(comp *c)
{
    bool nl;
    for (;;) {
        /* Blank lines and comments between rules. */
        for (;;) {
            while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\r' || *c->s == '\n')) {
                c->line += *c->s == '\n';
                c->s++;
            }
            if (c->s < c->end && *c->s == '#') {
                while (c->s < c->end && *c->s != '\n')
                    c->s++;
                continue;
            }
            break;
        }
        if (c->s >= c->end)
            return 0;
        const char *p = c->s;
        while (c->s < c->end && is_name(*c->s))
            c->s++;
        if (c->s == p)
            return cfail(c, "expected a rule name", NULL);
        size_t nlen = (size_t)(c->s - p);
        while (c->s < c->end && (*c->s == ' ' || *c->s == '\t'))
            c->s++;
        if (c->end - c->s < 3 || memcmp(c->s, "::=", 3))
            return cfail(c, "expected ::= after the rule name", NULL);
        c->s += 3;
        int32_t r = rule_named(c, p, nlen);
        if (r < 0)
            return -1;
        if (c->rules[r].defined) {
            char nm[64];
            snprintf(nm, sizeof nm, "%.*s", (int)(nlen < 60 ? nlen : 60), p);
            return cfail(c, "rule defined twice: ", nm);
        }
        c->rules[r].defined = true;
        c->rules[r].line = c->line;
        if (parse_alternatives(c, r))
            return -1;
        skip_space(c, &nl);
        if (c->s < c->end && *c->s == ')')
            return cfail(c, "unbalanced )", NULL);
        (void)nl;
    }
}

/* Rules that can derive the empty string, by fixpoint. */
static void find_nullable(const comp *c, bool *nullable)
{
    bool changed = true;
    while (changed) {
        changed = false;
        for (int32_t r = 0; r < c->n_rules; r++) {
            if (nullable[r])
                continue;
            for (int32_t a = 0; a < c->rules[r].n_alts && !nullable[r]; a++) {
                const seq *q = &c->rules[r].alts[a];
                bool all = true;
                for (int32_t i = 0; i < q->n && all; i++)
                    if (q->el[i].type == EL_BYTES || (q->el[i].type == EL_REF && !nullable[q->el[i].arg]))
                        all = false;
                if (all) {
                    nullable[r] = true;
                    changed = true;
                }
            }
        }
    }
}

/* Left recursion: a rule reachable from itself through the references each
 * alternative may start with (past nullable rules). The automaton would
 * expand such a rule forever. */
static int left_dfs(const comp *c, const bool *nullable, int32_t r, uint8_t *mark)
{
    if (mark[r] == 1)
        return r;
    if (mark[r] == 2)
        return -1;
    mark[r] = 1;
    for (int32_t a = 0; a < c->rules[r].n_alts; a++) {
        const seq *q = &c->rules[r].alts[a];
        for (int32_t i = 0; i < q->n && q->el[i].type == EL_REF; i++) {
            int32_t hit = left_dfs(c, nullable, q->el[i].arg, mark);
            if (hit >= 0)
                return hit;
            if (!nullable[q->el[i].arg])
                break;
        }
    }
    mark[r] = 2;
    return -1;
}

static int check_rules(comp *c)
{
    for (int32_t r = 0; r < c->n_rules; r++)
        if (c->rules[r].name && !c->rules[r].defined) {
            c->line = c->rules[r].line;
            return cfail(c, "undefined rule: ", c->rules[r].name);
        }
    size_t nr = c->n_rules > 0 ? (size_t)c->n_rules : 1;
    bool *nullable = calloc(nr, sizeof *nullable);
    uint8_t *mark = calloc(nr, 1);
    if (!nullable || !mark) {
        free(nullable);
        free(mark);
        return c->rc = DP_ENOMEM;
    }
    find_nullable(c, nullable);
    for (int32_t r = 0; r < c->n_rules && !c->rc; r++) {
        int32_t hit = left_dfs(c, nullable, r, mark);
        if (hit >= 0) {
            /* Name the first named rule on the cycle's way (helper rules
             * come from a named one). */
            int32_t named = hit;
            while (named > 0 && !c->rules[named].name)
                named--;
            c->line = c->rules[named].line;
            cfail(c, "left recursion through rule ",
                  c->rules[named].name ? c->rules[named].name : "?");
        }
    }
    free(nullable);
    free(mark);
    return c->rc;
}

static void comp_free(comp *c)
{
    for (int32_t r = 0; r < c->n_rules; r++) {
        free(c->rules[r].name);
        for (int32_t a = 0; a < c->rules[r].n_alts; a++)
            free(c->rules[r].alts[a].el);
        free(c->rules[r].alts);
    }
    free(c->rules);
    free(c->cls);
}

static int check_start(const dp_grammar *g, char *err, size_t errsz);

int grammar_compile(dp_grammar **out, const char *gbnf, size_t len, char *err, size_t errsz)
{
    *out = NULL;
    comp c = {.s = gbnf, .end = gbnf + len, .line = 1, .err = err, .errsz = errsz};
    if (!gbnf || len == 0)
        return dp_err(err, errsz, DP_EINVAL, "grammar: empty");
    if (memchr(gbnf, 0, len))
        return dp_err(err, errsz, DP_EINVAL, "grammar: contains a NUL byte");
    int32_t root = rule_named(&c, "root", 4);
    if (root >= 0)
        c.rules[root].line = 0;
    if (root < 0 || parse_rules(&c) || (c.rc == 0 && !c.rules[root].defined &&
                                         cfail(&c, "no rule named root", NULL)) ||
        check_rules(&c)) {
        int rc = c.rc ? c.rc : DP_EINVAL;
        if (!c.rc)
            dp_err(err, errsz, rc, "grammar: invalid");
        comp_free(&c);
        return rc;
    }
    dp_grammar *g = calloc(1, sizeof *g);
    int32_t n_el = 0, n_alt = 0;
    for (int32_t r = 0; r < c.n_rules; r++) {
        n_alt += c.rules[r].n_alts;
        for (int32_t a = 0; a < c.rules[r].n_alts; a++)
            n_el += c.rules[r].alts[a].n;
    }
    if (g) {
        g->el = malloc((size_t)n_el * sizeof *g->el);
        g->alt_start = malloc((size_t)(n_alt ? n_alt : 1) * sizeof *g->alt_start);
        g->rule_alt0 = malloc((size_t)c.n_rules * sizeof *g->rule_alt0);
        g->rule_nalt = malloc((size_t)c.n_rules * sizeof *g->rule_nalt);
        g->cls = malloc((size_t)(c.n_cls ? c.n_cls : 1) * sizeof *g->cls);
    }
    if (!g || !g->el || !g->alt_start || !g->rule_alt0 || !g->rule_nalt || !g->cls) {
        comp_free(&c);
        grammar_unref(g);
        return dp_err(err, errsz, DP_ENOMEM, "grammar: out of memory");
    }
    atomic_init(&g->refs, 1);
    int32_t e = 0, k = 0;
    for (int32_t r = 0; r < c.n_rules; r++) {
        g->rule_alt0[r] = k;
        g->rule_nalt[r] = c.rules[r].n_alts;
        for (int32_t a = 0; a < c.rules[r].n_alts; a++) {
            g->alt_start[k++] = e;
            memcpy(g->el + e, c.rules[r].alts[a].el, (size_t)c.rules[r].alts[a].n * sizeof *g->el);
            e += c.rules[r].alts[a].n;
        }
    }
    if (c.n_cls > 0)
        memcpy(g->cls, c.cls, (size_t)c.n_cls * sizeof *g->cls);
    g->n_el = n_el;
    g->n_rules = c.n_rules;
    g->n_cls = c.n_cls;
    g->root = root;
    comp_free(&c);
    int rc = check_start(g, err, errsz);
    if (rc) {
        grammar_unref(g);
        return rc;
    }
    *out = g;
    return 0;
}

void grammar_ref(dp_grammar *g) { atomic_fetch_add(&g->refs, 1); }

void grammar_unref(dp_grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    for (int32_t i = 0; i < g->n_cache; i++) {
        free(g->cache[i].key);
        free(g->cache[i].bits);
    }
    free(g->cache);
    free(g->el);
    free(g->alt_start);
    free(g->rule_alt0);
    free(g->rule_nalt);
    free(g->cls);
    free(g);
}

/* ---- stack sets --------------------------------------------------------- */

/* Stacks stored back to back: stack i is data[off[i] .. off[i] + len[i]),
 * its top last. */
typedef struct gset {
    int32_t *data, *off, *len;
    int32_t n_data, cap_data, n, cap, cap_off, cap_len;
    bool overflow;           /* more than MAX_STACKS or MAX_DEPTH were needed */
} gset;

static void gset_clear(gset *s)
{
    s->n = s->n_data = 0;
    s->overflow = false;
}

static void gset_free(gset *s)
{
    free(s->data);
    free(s->off);
    free(s->len);
    memset(s, 0, sizeof *s);
}

/* Appends a stack (no check for one alike). */
static int gset_append(gset *s, const int32_t *st, int32_t n)
{
    if (grow((void **)&s->data, &s->cap_data, s->n_data + n, sizeof *s->data) ||
        grow((void **)&s->off, &s->cap_off, s->n + 1, sizeof *s->off) ||
        grow((void **)&s->len, &s->cap_len, s->n + 1, sizeof *s->len))
        return DP_ENOMEM;
    if (n > 0)
        memcpy(s->data + s->n_data, st, (size_t)n * sizeof *st);
    s->off[s->n] = s->n_data;
    s->len[s->n] = n;
    s->n_data += n;
    s->n++;
    return 0;
}

static int gset_add(gset *s, const int32_t *st, int32_t n)
{
    for (int32_t i = 0; i < s->n; i++)
        if (s->len[i] == n && !memcmp(s->data + s->off[i], st, (size_t)n * sizeof *st))
            return 0;
    if (s->n >= MAX_STACKS) {
        s->overflow = true;
        return 0;
    }
    return gset_append(s, st, n);
}

/* Scratch for expand: one stack being rewritten. */
/* The stack configurations one expansion has expanded already (a gset of
 * them, indexed by a hash table): a nullable rule reachable two ways, k
 * times in a row, would otherwise be expanded 2^k times. */
typedef struct seen_set {
    gset s;
    int32_t *tab;            /* index, open addressing; live where tgen[k] == gen */
    uint32_t *tgen;
    uint32_t gen;            /* bumped to clear the set (it is cleared very often) */
    int32_t cap_tab;
} seen_set;

typedef struct scratch {
    int32_t *buf;
    int32_t cap;
    seen_set seen;
    int64_t visits;          /* configurations expanded in this expansion */
} scratch;

static uint64_t hash_stack(const int32_t *st, int32_t n)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)st[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static void seen_clear(scratch *sc)
{
    seen_set *z = &sc->seen;
    gset_clear(&z->s);
    if (++z->gen == 0) { /* wrapped: no stale entry may look live */
        if (z->tgen)
            memset(z->tgen, 0, (size_t)z->cap_tab * sizeof *z->tgen);
        z->gen = 1;
    }
    sc->visits = 0;
}

static void scratch_free(scratch *sc)
{
    free(sc->buf);
    gset_free(&sc->seen.s);
    free(sc->seen.tab);
    free(sc->seen.tgen);
    memset(sc, 0, sizeof *sc);
}

/* 1 when st was seen, else records it and returns 0; DP_ENOMEM. */
static int seen_check(scratch *sc, const int32_t *st, int32_t n)
{
    seen_set *z = &sc->seen;
    gset *zs = &z->s;
    if (z->gen == 0)
        z->gen = 1;
    if (2 * (zs->n + 1) > z->cap_tab) { /* rehash at half full */
        int32_t nc = z->cap_tab ? z->cap_tab * 2 : 64;
        int32_t *t = malloc((size_t)nc * sizeof *t);
        uint32_t *tg = calloc((size_t)nc, sizeof *tg);
        if (!t || !tg) {
            free(t);
            free(tg);
            return DP_ENOMEM;
        }
        for (int32_t i = 0; i < zs->n; i++) {
            uint64_t h = hash_stack(zs->data + zs->off[i], zs->len[i]);
            int32_t k = (int32_t)(h & (uint64_t)(nc - 1));
            while (tg[k] == z->gen)
                k = (k + 1) & (nc - 1);
            t[k] = i;
            tg[k] = z->gen;
        }
        free(z->tab);
        free(z->tgen);
        z->tab = t;
        z->tgen = tg;
        z->cap_tab = nc;
    }
    uint64_t h = hash_stack(st, n);
    int32_t k = (int32_t)(h & (uint64_t)(z->cap_tab - 1));
    while (z->tgen[k] == z->gen) {
        int32_t i = z->tab[k];
        if (zs->len[i] == n && !memcmp(zs->data + zs->off[i], st, (size_t)n * sizeof *st))
            return 1;
        k = (k + 1) & (z->cap_tab - 1);
    }
    if (gset_append(zs, st, n))
        return DP_ENOMEM;
    z->tab[k] = zs->n - 1;
    z->tgen[k] = z->gen;
    return 0;
}

/* Adds to out every stack that st (len n, in sc->buf[base..]) leads to with
 * a byte class (or nothing: an empty stack) on top. */
static int expand(const dp_grammar *g, gset *out, scratch *sc, int32_t base, int32_t n)
{
    for (;;) {
        if (n == 0)
            return gset_add(out, sc->buf + base, 0);
        int32_t p = sc->buf[base + n - 1];
        const gel *x = &g->el[p];
        if (x->type == EL_BYTES)
            return gset_add(out, sc->buf + base, n);
        if (x->type == EL_END) {
            n--; /* the rule is done: continue below it */
            continue;
        }
        /* A reference: the continuation stays, each alternative goes on top
         * (in a copy of the stack above this one's end); once per
         * configuration, and within a bound on the work. */
        if (n + 1 > MAX_DEPTH || ++sc->visits > MAX_EXPAND) {
            out->overflow = true;
            return 0;
        }
        int seen = seen_check(sc, sc->buf + base, n);
        if (seen)
            return seen < 0 ? seen : 0;
        /* A reference last in its alternative is a tail call: nothing is
         * left to continue with, so the alternative replaces it (x* as
         * star ::= x star | "" then keeps one stack depth however long it
         * repeats, and a string's body stays one state). */
        const bool tail = g->el[p + 1].type == EL_END;
        if (tail)
            n--;
        else
            sc->buf[base + n - 1] = p + 1;
        const int32_t r = x->arg, a0 = g->rule_alt0[r];
        for (int32_t a = 0; a < g->rule_nalt[r]; a++) {
            int32_t nb = base + n;
            if (grow((void **)&sc->buf, &sc->cap, nb + n + 1, sizeof *sc->buf))
                return DP_ENOMEM;
            memcpy(sc->buf + nb, sc->buf + base, (size_t)n * sizeof *sc->buf);
            sc->buf[nb + n] = g->alt_start[a0 + a];
            int rc = expand(g, out, sc, nb, n + 1);
            if (rc)
                return rc;
        }
        return 0;
    }
}

static int set_start(const dp_grammar *g, gset *out, scratch *sc)
{
    gset_clear(out);
    seen_clear(sc);
    if (grow((void **)&sc->buf, &sc->cap, 2, sizeof *sc->buf))
        return DP_ENOMEM;
    /* A stack whose only element refers to root: its END ends the text. */
    const int32_t r = g->root, a0 = g->rule_alt0[r];
    for (int32_t a = 0; a < g->rule_nalt[r]; a++) {
        sc->buf[0] = g->alt_start[a0 + a];
        int rc = expand(g, out, sc, 0, 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* out = the stacks of in after byte b. */
static int set_advance(const dp_grammar *g, const gset *in, unsigned b, gset *out, scratch *sc)
{
    gset_clear(out);
    seen_clear(sc);
    for (int32_t i = 0; i < in->n; i++) {
        int32_t n = in->len[i];
        if (n == 0)
            continue;
        const int32_t *st = in->data + in->off[i];
        const gel *x = &g->el[st[n - 1]];
        if (!bc_has(&g->cls[x->arg], b))
            continue;
        if (grow((void **)&sc->buf, &sc->cap, n + 1, sizeof *sc->buf))
            return DP_ENOMEM;
        memcpy(sc->buf, st, (size_t)n * sizeof *st);
        sc->buf[n - 1]++;
        int rc = expand(g, out, sc, 0, n);
        if (rc)
            return rc;
    }
    return 0;
}

/* The start state: a grammar that matches nothing, or one too ambiguous to
 * parse within the limits, is refused when compiled rather than failing its
 * request token by token. */
static int check_start(const dp_grammar *g, char *err, size_t errsz)
{
    gset st;
    scratch sc;
    memset(&st, 0, sizeof st);
    memset(&sc, 0, sizeof sc);
    int rc = set_start(g, &st, &sc);
    bool empty = st.n == 0, over = st.overflow;
    gset_free(&st);
    scratch_free(&sc);
    if (rc)
        return dp_err(err, errsz, rc, "grammar: out of memory");
    if (empty || over)
        return dp_err(err, errsz, DP_EINVAL, empty ? "grammar: it matches nothing"
                      : "grammar: too ambiguous (its start needs more than %d parse stacks or "
                        "%d expansions)", MAX_STACKS, MAX_EXPAND);
    return 0;
}

static bool set_accepting(const gset *s)
{
    for (int32_t i = 0; i < s->n; i++)
        if (s->len[i] == 0)
            return true;
    return false;
}

bool grammar_matches(const dp_grammar *g, const char *s, size_t n)
{
    gset a = {0}, b = {0};
    scratch sc;
    memset(&sc, 0, sizeof sc);
    bool ok = set_start(g, &a, &sc) == 0;
    for (size_t i = 0; ok && i < n; i++) {
        ok = set_advance(g, &a, (unsigned char)s[i], &b, &sc) == 0 && b.n > 0;
        gset t = a;
        a = b;
        b = t;
    }
    ok = ok && set_accepting(&a);
    gset_free(&a);
    gset_free(&b);
    scratch_free(&sc);
    return ok;
}

/* ---- the vocabulary trie ------------------------------------------------ */

typedef struct tnode {
    int32_t child, sibling;  /* first child, next sibling (-1: none) */
    int32_t token;           /* the token ending here, or -1 */
    uint8_t byte;
} tnode;

struct dp_gvocab {
    tnode *nodes;
    int32_t n_nodes, cap;
    int32_t n_vocab;
    int32_t *eog;            /* end-of-generation tokens (no bytes) */
    int32_t n_eog;
    struct tdup {
        int32_t tok, of;     /* a token spelled like the node's token `of` */
    } *dup;
    int32_t n_dup, cap_dup;
    int32_t max_len;
};

static int32_t trie_child(dp_gvocab *v, int32_t at, uint8_t b)
{
    for (int32_t c = v->nodes[at].child; c >= 0; c = v->nodes[c].sibling)
        if (v->nodes[c].byte == b)
            return c;
    if (grow((void **)&v->nodes, &v->cap, v->n_nodes + 1, sizeof *v->nodes))
        return -1;
    int32_t c = v->n_nodes++;
    v->nodes[c] = (tnode){.child = -1, .sibling = v->nodes[at].child, .token = -1, .byte = b};
    v->nodes[at].child = c;
    return c;
}

dp_gvocab *gvocab_new(const dp_tokenizer *tok)
{
    dp_gvocab *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    v->n_vocab = tokenizer_n_vocab(tok);
    v->eog = malloc((size_t)(v->n_vocab > 0 ? v->n_vocab : 1) * sizeof *v->eog);
    if (!v->eog || grow((void **)&v->nodes, &v->cap, 1, sizeof *v->nodes)) {
        gvocab_free(v);
        return NULL;
    }
    v->nodes[0] = (tnode){.child = -1, .sibling = -1, .token = -1};
    v->n_nodes = 1;
    char buf[512];
    for (int32_t t = 0; t < v->n_vocab; t++) {
        /* End of generation is never text, whatever its token type says
         * (some vocabularies type <|end|> as user-defined, with bytes). */
        if (tokenizer_is_eog(tok, t)) {
            v->eog[v->n_eog++] = t;
            continue;
        }
        int n = tokenizer_token_bytes(tok, t, false, buf, sizeof buf);
        if (n <= 0)
            continue;
        if (n > (int)sizeof buf)
            continue; /* never allowed: longer than any text a step needs */
        int32_t at = 0;
        for (int i = 0; i < n && at >= 0; i++)
            at = trie_child(v, at, (uint8_t)buf[i]);
        if (at < 0) {
            gvocab_free(v);
            return NULL;
        }
        if (v->nodes[at].token < 0) {
            v->nodes[at].token = t;
        } else {
            if (grow((void **)&v->dup, &v->cap_dup, v->n_dup + 1, sizeof *v->dup)) {
                gvocab_free(v);
                return NULL;
            }
            v->dup[v->n_dup++] = (struct tdup){t, v->nodes[at].token};
        }
        if (n > v->max_len)
            v->max_len = n;
    }
    return v;
}

void gvocab_free(dp_gvocab *v)
{
    if (!v)
        return;
    free(v->nodes);
    free(v->eog);
    free(v->dup);
    free(v);
}

/* ---- states and masks --------------------------------------------------- */

struct dp_gstate {
    dp_grammar *g;
    gset cur, tmp;
    scratch sc;
    gset *levels;            /* per trie depth, for the mask walk */
    int32_t n_levels;
    int64_t computed, cached;
    int32_t *key;
    int32_t cap_key;
};

dp_gstate *gstate_new(dp_grammar *g)
{
    dp_gstate *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    grammar_ref(g);
    s->g = g;
    if (set_start(g, &s->cur, &s->sc)) {
        gstate_free(s);
        return NULL;
    }
    return s;
}

void gstate_free(dp_gstate *s)
{
    if (!s)
        return;
    gset_free(&s->cur);
    gset_free(&s->tmp);
    scratch_free(&s->sc);
    for (int32_t i = 0; i < s->n_levels; i++)
        gset_free(&s->levels[i]);
    free(s->levels);
    free(s->key);
    grammar_unref(s->g);
    free(s);
}

/* The state's stacks advanced over n bytes, into *a (a copy: the state is
 * unchanged; the caller frees *a, also on failure). */
static int advance_copy(dp_gstate *s, const char *bytes, size_t n, gset *a)
{
    gset_clear(&s->tmp);
    for (int32_t i = 0; i < s->cur.n; i++)
        if (gset_add(a, s->cur.data + s->cur.off[i], s->cur.len[i]))
            return DP_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = set_advance(s->g, a, (unsigned char)bytes[i], &s->tmp, &s->sc);
        if (!rc && s->tmp.overflow)
            rc = DP_ENOSPC; /* the parse outgrew its limits: nothing is dropped silently */
        if (rc || s->tmp.n == 0)
            return rc ? rc : DP_EINVAL;
        gset t = *a;
        *a = s->tmp;
        s->tmp = t;
    }
    return 0;
}

int gstate_advance(dp_gstate *s, const char *bytes, size_t n)
{
    /* Work on a copy so that a rejected text leaves the state as it was. */
    gset a = {0};
    int rc = advance_copy(s, bytes, n, &a);
    if (rc) {
        gset_free(&a);
        return rc;
    }
    gset_free(&s->cur);
    s->cur = a;
    return 0;
}

bool gstate_allows(dp_gstate *s, const char *bytes, size_t n)
{
    gset a = {0};
    int rc = advance_copy(s, bytes, n, &a);
    gset_free(&a);
    return rc == 0;
}

bool gstate_accepting(const dp_gstate *s) { return set_accepting(&s->cur); }

bool gstate_done(const dp_gstate *s)
{
    for (int32_t i = 0; i < s->cur.n; i++)
        if (s->cur.len[i] != 0)
            return false;
    return s->cur.n > 0;
}

static int levels_ensure(dp_gstate *s, int32_t need)
{
    if (need <= s->n_levels)
        return 0;
    int32_t old = s->n_levels;
    if (grow((void **)&s->levels, &s->n_levels, need, sizeof *s->levels))
        return DP_ENOMEM;
    memset(s->levels + old, 0, (size_t)(s->n_levels - old) * sizeof *s->levels);
    return 0;
}

/* Marks the tokens below trie node `at` that continue the stack set of
 * depth d of the walk (s->levels[d]). */
static int walk(dp_gstate *s, const dp_gvocab *v, int32_t at, int32_t d, uint64_t *bits)
{
    if (levels_ensure(s, d + 2))
        return DP_ENOMEM;
    for (int32_t c = v->nodes[at].child; c >= 0; c = v->nodes[c].sibling) {
        gset *next = &s->levels[d + 1];
        int rc = set_advance(s->g, &s->levels[d], v->nodes[c].byte, next, &s->sc);
        if (rc)
            return rc;
        if (next->n == 0)
            continue;
        int32_t t = v->nodes[c].token;
        if (t >= 0)
            bits[t >> 6] |= 1ULL << (t & 63);
        if (v->nodes[c].child >= 0 && (rc = walk(s, v, c, d + 1, bits)))
            return rc;
    }
    return 0;
}

/* The state as a key: each stack's length then its elements. */
static int state_key(dp_gstate *s, int32_t *n_key)
{
    int32_t n = s->cur.n_data + s->cur.n;
    if (grow((void **)&s->key, &s->cap_key, n > 0 ? n : 1, sizeof *s->key))
        return DP_ENOMEM;
    int32_t k = 0;
    for (int32_t i = 0; i < s->cur.n; i++) {
        s->key[k++] = s->cur.len[i];
        memcpy(s->key + k, s->cur.data + s->cur.off[i], (size_t)s->cur.len[i] * sizeof *s->key);
        k += s->cur.len[i];
    }
    *n_key = k;
    return 0;
}

int32_t gstate_mask_logits(dp_gstate *s, const dp_gvocab *v, float *row)
{
    const size_t words = ((size_t)v->n_vocab + 63) / 64;
    dp_grammar *g = s->g;
    int32_t n_key = 0;
    uint64_t *bits = NULL;
    mslot *hit = NULL;
    if (!g->cache && !(g->cache = calloc(CACHE_SLOTS, sizeof *g->cache)))
        n_key = -1;
    if (g->cache_vocab != v && g->cache) { /* masks are per vocabulary */
        for (int32_t i = 0; i < g->n_cache; i++) {
            free(g->cache[i].key);
            free(g->cache[i].bits);
        }
        memset(g->cache, 0, CACHE_SLOTS * sizeof *g->cache);
        g->n_cache = 0;
        g->cache_vocab = v;
    }
    if (n_key == 0 && state_key(s, &n_key) == 0) {
        uint64_t h = hash_stack(s->key, n_key);
        for (int32_t i = 0; i < g->n_cache && !hit; i++)
            if (g->cache[i].hash == h && g->cache[i].n_key == n_key &&
                !memcmp(g->cache[i].key, s->key, (size_t)n_key * sizeof *s->key))
                hit = &g->cache[i];
        if (hit) {
            s->cached++;
        } else {
            /* A free slot, else the least recently used one. */
            if (g->n_cache < CACHE_SLOTS) {
                hit = &g->cache[g->n_cache++];
            } else {
                hit = &g->cache[0];
                for (int i = 1; i < CACHE_SLOTS; i++)
                    if (g->cache[i].used < hit->used)
                        hit = &g->cache[i];
            }
            int32_t *key = malloc((size_t)(n_key > 0 ? n_key : 1) * sizeof *key);
            uint64_t *b = calloc(words, sizeof *b);
            bool ok = key && b;
            if (ok) {
                memcpy(key, s->key, (size_t)n_key * sizeof *key);
                /* Each stack on its own: the union of what each allows. */
                ok = levels_ensure(s, 2) == 0;
                for (int32_t i = 0; ok && i < s->cur.n; i++) {
                    if (s->cur.len[i] == 0)
                        continue;
                    gset *l0 = &s->levels[0];
                    gset_clear(l0);
                    ok = gset_add(l0, s->cur.data + s->cur.off[i], s->cur.len[i]) == 0 &&
                         walk(s, v, 0, 0, b) == 0;
                }
                if (ok && set_accepting(&s->cur))
                    for (int32_t i = 0; i < v->n_eog; i++)
                        b[v->eog[i] >> 6] |= 1ULL << (v->eog[i] & 63);
                /* Tokens spelled like another allowed one. */
                for (int32_t i = 0; ok && i < v->n_dup; i++)
                    if ((b[v->dup[i].of >> 6] >> (v->dup[i].of & 63)) & 1)
                        b[v->dup[i].tok >> 6] |= 1ULL << (v->dup[i].tok & 63);
            }
            if (ok) {
                free(hit->key);
                free(hit->bits);
                *hit = (mslot){.hash = h, .key = key, .n_key = n_key, .bits = b};
                s->computed++;
            } else {
                free(key);
                free(b);
                /* A slot taken but not filled stays matchable by nothing. */
                free(hit->key);
                free(hit->bits);
                *hit = (mslot){.n_key = -1};
                hit = NULL;
            }
        }
    }
    if (hit) {
        hit->used = ++g->clock;
        bits = hit->bits;
    }
    int32_t allowed = 0;
    for (int32_t t = 0; t < v->n_vocab; t++) {
        if (bits && ((bits[t >> 6] >> (t & 63)) & 1))
            allowed++;
        else
            row[t] = -INFINITY;
    }
    return allowed;
}

void gstate_mask_stats(const dp_gstate *s, int64_t *computed, int64_t *cached)
{
    *computed = s->computed;
    *cached = s->cached;
}
