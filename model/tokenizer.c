/* tokenizer.c: byte-level BPE and SentencePiece-style tokenization built from a
 * GGUF's tokenizer.ggml.* metadata and special-token splitting; turning ids
 * back into text is detok.c's. */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "pretok.h"
#include "tokenizer_private.h"
#include "unicode.h"

/* ---- small helpers ---------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

static int32_t vocab_lookup(const dp_tokenizer *t, const char *s, size_t n)
{
    size_t i = (size_t)hash_bytes(s, n) & t->hmask;
    for (;;) {
        int32_t id = t->hmap[i];
        if (id < 0) return -1;
        if (t->text_len[id] == n && memcmp(t->text + t->text_off[id], s, n) == 0) return id;
        i = (i + 1) & t->hmask;
    }
}

static const merge_ent *merge_lookup(const dp_tokenizer *t, int32_t l, int32_t r)
{
    if (!t->mtab || l < 0 || r < 0) return NULL;
    uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)r) + 1;
    size_t i = (size_t)hash_u64(key) & t->mmask;
    for (;;) {
        const merge_ent *e = &t->mtab[i];
        if (e->key == 0) return NULL;
        if (e->key == key) return e;
        i = (i + 1) & t->mmask;
    }
}

typedef struct ivec {
    int32_t *v;
    size_t n, cap;
} ivec;

/* p grown (doubling from first) to hold one more than n elements of size
 * sz; NULL when out of memory (p is then unchanged). */
static void *grow_one(void *p, size_t *cap, size_t n, size_t sz, size_t first)
{
    if (n < *cap)
        return p;
    size_t nc = *cap ? *cap * 2 : first;
    void *np = realloc(p, nc * sz);
    if (np)
        *cap = nc;
    return np;
}

static int ivec_push(ivec *a, int32_t x)
{
    int32_t *nv = grow_one(a->v, &a->cap, a->n, sizeof *nv, 64);
    if (!nv) return DP_ENOMEM;
    a->v = nv;
    a->v[a->n++] = x;
    return 0;
}

/* Grows *p to hold n elements of size sz. */
static int grow(void **p, size_t *cap, size_t n, size_t sz)
{
    if (n <= *cap) return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < n) nc *= 2;
    void *np = realloc(*p, nc * sz);
    if (!np) return DP_ENOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

/* ---- binary min-heap on a 64-bit key ---------------------------------- */

typedef struct hent {
    uint64_t key;  /* BPE: rank << 32 | left pos; SPM: ~score order << 32 | left pos */
    int32_t a, b;  /* BPE: left and right ids; SPM: a = merged byte size */
} hent;

typedef struct heap {
    hent *v;
    size_t n, cap;
} heap;

static int heap_push(heap *h, hent e)
{
    hent *nv = grow_one(h->v, &h->cap, h->n, sizeof *nv, 64);
    if (!nv) return DP_ENOMEM;
    h->v = nv;
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->v[p].key <= e.key) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = e;
    return 0;
}

static hent heap_pop(heap *h)
{
    hent top = h->v[0];
    hent last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->v[c + 1].key < h->v[c].key) c++;
        if (last.key <= h->v[c].key) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* ---- GPT-2 byte <-> unicode mapping ----------------------------------- */

/* bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68
 * bytes to U+0100.. in byte order, so every byte has a visible character. */
static bool byte_is_self(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

static void bytelevel_init(dp_tokenizer *t)
{
    unsigned next = 0x100;
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = byte_is_self(b) ? b : next++;
        char tmp[4];
        size_t n = unicode_utf8_encode(cp, tmp);
        memcpy(t->bl_enc[b], tmp, n);
        t->bl_len[b] = (uint8_t)n;
    }
}

/* Inverse mapping of one code point, or -1 when it is not a mapped char. */
static int bytelevel_byte(uint32_t cp)
{
    if (cp < 0x100) return byte_is_self(cp) ? (int)cp : -1;
    if (cp >= 0x100 && cp < 0x100 + 68) {
        unsigned k = cp - 0x100, b;
        for (b = 0; b < 256; b++) {
            if (!byte_is_self(b) && k-- == 0) return (int)b;
        }
    }
    return -1;
}

/* ---- construction ----------------------------------------------------- */

static int32_t get_id(const dp_gguf *g, const char *key, int32_t n_vocab)
{
    int64_t v;
    if (gguf_get_i64(g, key, &v) != 0) return -1;
    return (v >= 0 && v < n_vocab) ? (int32_t)v : -1;
}

static const char *const eog_texts[] = {
    "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "<|end_of_text|>",
};

static int build_decoded(dp_tokenizer *t)
{
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) total += t->text_len[i];
    /* Decoded bytes are never longer than the text (byte-level chars are
     * 1-2 bytes for 1 byte; U+2581 is 3 bytes for 1; <0xNN> is 6 for 1). */
    t->dec = malloc(total + 1);
    t->dec_off = malloc((size_t)t->n_vocab * sizeof *t->dec_off);
    t->dec_len = malloc((size_t)t->n_vocab * sizeof *t->dec_len);
    if (!t->dec || !t->dec_off || !t->dec_len) return DP_ENOMEM;
    size_t pos = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const unsigned char *s = (const unsigned char *)t->text + t->text_off[i];
        size_t n = t->text_len[i];
        char *o = t->dec + pos;
        size_t m = 0;
        uint8_t ty = t->type[i];
        t->dec_off[i] = pos;
        if (ty == DP_TOKTYPE_CONTROL || (t->kind == DP_TOK_BPE && ty == DP_TOKTYPE_USER_DEFINED)) {
            memcpy(o, s, n);
            m = n;
        } else if (t->kind == DP_TOK_SPM && ty == DP_TOKTYPE_BYTE && n == 6 && s[0] == '<' &&
                   s[1] == '0' && s[2] == 'x' && s[5] == '>') {
            unsigned v = (unsigned)strtoul((const char *)s + 3, NULL, 16);
            o[m++] = (char)v;
        } else if (t->kind == DP_TOK_SPM) {
            for (size_t k = 0; k < n;) {
                if (k + 3 <= n && s[k] == 0xE2 && s[k + 1] == 0x96 && s[k + 2] == 0x81) {
                    o[m++] = ' ';
                    k += 3;
                } else {
                    o[m++] = (char)s[k++];
                }
            }
        } else {
            for (size_t k = 0; k < n;) {
                uint32_t cp;
                size_t l = unicode_utf8_decode(s + k, n - k, &cp);
                int b = DP_UNI_IS_INVALID(cp) ? -1 : bytelevel_byte(cp);
                if (b >= 0) {
                    o[m++] = (char)b;
                } else {
                    /* Not a byte-level char: keep the text as it is. */
                    memcpy(o + m, s + k, l);
                    m += l;
                }
                k += l;
            }
        }
        t->dec_len[i] = (uint32_t)m;
        if (m > t->max_dec_len) t->max_dec_len = m;
        pos += m;
    }
    return 0;
}

static int build_merges(dp_tokenizer *t, const dp_gguf_kv *kv, char *err, size_t errsz)
{
    t->mmask = pow2_at_least(kv->arr_n * 2 + 1) - 1;
    t->mtab = calloc(t->mmask + 1, sizeof *t->mtab);
    if (!t->mtab) return dp_err(err, errsz, DP_ENOMEM, "tokenizer: out of memory for merges");
    char *buf = NULL;
    size_t bufcap = 0;
    for (uint64_t r = 0; r < kv->arr_n; r++) {
        dp_gguf_str m = gguf_arr_str(kv, r);
        /* "left right": the split is the first space after the first byte,
         * since a left part may itself be a lone space in odd vocabularies. */
        size_t sp = 0;
        for (size_t k = 1; k < m.len; k++) {
            if (m.ptr[k] == ' ') {
                sp = k;
                break;
            }
        }
        if (sp == 0) continue;
        int32_t l = vocab_lookup(t, m.ptr, sp);
        int32_t rr = vocab_lookup(t, m.ptr + sp + 1, (size_t)m.len - sp - 1);
        if (l < 0 || rr < 0) continue;
        size_t cl = (size_t)m.len - 1;
        if (grow((void **)&buf, &bufcap, cl, 1) != 0) {
            free(buf);
            return dp_err(err, errsz, DP_ENOMEM, "tokenizer: out of memory for merges");
        }
        memcpy(buf, m.ptr, sp);
        memcpy(buf + sp, m.ptr + sp + 1, (size_t)m.len - sp - 1);
        int32_t id = vocab_lookup(t, buf, cl);
        if (id < 0) continue;
        uint64_t key = (((uint64_t)(uint32_t)l << 32) | (uint32_t)rr) + 1;
        size_t i = (size_t)hash_u64(key) & t->mmask;
        while (t->mtab[i].key != 0 && t->mtab[i].key != key) i = (i + 1) & t->mmask;
        if (t->mtab[i].key == key) continue;  /* a duplicate keeps its first rank */
        t->mtab[i].key = key;
        t->mtab[i].rank = (int32_t)r;
        t->mtab[i].id = id;
    }
    free(buf);
    return 0;
}

int tokenizer_init_gguf(dp_tokenizer **out, const dp_gguf *g, char *err, size_t errsz)
{
    *out = NULL;
    dp_gguf_str model;
    if (gguf_get_str(g, "tokenizer.ggml.model", &model) != 0)
        return dp_err(err, errsz, DP_ENOTFOUND, "tokenizer: tokenizer.ggml.model missing");
    dp_tok_kind kind;
    if (gguf_str_eq(model, "gpt2")) kind = DP_TOK_BPE;
    else if (gguf_str_eq(model, "llama")) kind = DP_TOK_SPM;
    else
        return dp_err(err, errsz, DP_EUNSUPPORTED, "tokenizer: model '%.*s' is not supported",
                      (int)(model.len > 64 ? 64 : model.len), model.ptr);

    const dp_gguf_kv *tk = gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!tk || tk->type != DP_GGUF_ARRAY || tk->arr_type != DP_GGUF_STRING || tk->arr_n == 0 ||
        tk->arr_n > INT32_MAX / 2)
        return dp_err(err, errsz, DP_EFORMAT, "tokenizer: tokenizer.ggml.tokens missing or not strings");
    int32_t n = (int32_t)tk->arr_n;

    const dp_gguf_kv *tt = gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (tt && (tt->type != DP_GGUF_ARRAY || tt->arr_n != (uint64_t)n || tt->arr_type == DP_GGUF_STRING ||
               tt->arr_type == DP_GGUF_ARRAY))
        return dp_err(err, errsz, DP_EFORMAT, "tokenizer: token_type is not %d integers", n);
    const dp_gguf_kv *sc = gguf_find_kv(g, "tokenizer.ggml.scores");
    if (sc && (sc->type != DP_GGUF_ARRAY || sc->arr_n != (uint64_t)n || sc->arr_type == DP_GGUF_STRING ||
               sc->arr_type == DP_GGUF_ARRAY))
        return dp_err(err, errsz, DP_EFORMAT, "tokenizer: scores is not %d numbers", n);
    const dp_gguf_kv *mg = gguf_find_kv(g, "tokenizer.ggml.merges");
    if (kind == DP_TOK_BPE && (!mg || mg->type != DP_GGUF_ARRAY || mg->arr_type != DP_GGUF_STRING))
        return dp_err(err, errsz, DP_EFORMAT, "tokenizer: BPE vocabulary without tokenizer.ggml.merges");

    dp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dp_err(err, errsz, DP_ENOMEM, "tokenizer: out of memory");
    t->kind = kind;
    t->n_vocab = n;
    int rc = DP_ENOMEM;

    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        dp_gguf_str s = gguf_arr_str(tk, (uint64_t)i);
        if (s.len > UINT32_MAX / 8) {
            rc = dp_err(err, errsz, DP_EFORMAT, "tokenizer: token %d is too long", i);
            goto fail;
        }
        total += (size_t)s.len + 1;
    }
    t->text = malloc(total);
    t->text_off = malloc((size_t)n * sizeof *t->text_off);
    t->text_len = malloc((size_t)n * sizeof *t->text_len);
    t->type = malloc((size_t)n);
    t->flags = calloc((size_t)n, 1);
    t->hmask = pow2_at_least((size_t)n * 2 + 1) - 1;
    t->hmap = malloc((t->hmask + 1) * sizeof *t->hmap);
    if (sc) t->scores = malloc((size_t)n * sizeof *t->scores);
    if (!t->text || !t->text_off || !t->text_len || !t->type || !t->flags || !t->hmap ||
        (sc && !t->scores))
        goto nomem;
    memset(t->hmap, 0xFF, (t->hmask + 1) * sizeof *t->hmap);

    size_t pos = 0;
    for (int32_t i = 0; i < n; i++) {
        dp_gguf_str s = gguf_arr_str(tk, (uint64_t)i);
        memcpy(t->text + pos, s.ptr, s.len);
        t->text[pos + s.len] = '\0';
        t->text_off[i] = pos;
        t->text_len[i] = (uint32_t)s.len;
        pos += (size_t)s.len + 1;
        int64_t ty = tt ? gguf_arr_i64(tt, (uint64_t)i) : DP_TOKTYPE_NORMAL;
        t->type[i] = (ty >= DP_TOKTYPE_NORMAL && ty <= DP_TOKTYPE_BYTE) ? (uint8_t)ty : DP_TOKTYPE_NORMAL;
        if (sc) t->scores[i] = (float)gguf_arr_f64(sc, (uint64_t)i);
        /* The first of duplicate texts wins, as in a dict built in order. */
        size_t h = (size_t)hash_bytes(s.ptr, s.len) & t->hmask;
        bool dup = false;
        while (t->hmap[h] >= 0) {
            int32_t o = t->hmap[h];
            if (t->text_len[o] == s.len && memcmp(t->text + t->text_off[o], s.ptr, s.len) == 0) {
                dup = true;
                break;
            }
            h = (h + 1) & t->hmask;
        }
        if (!dup) t->hmap[h] = i;
    }

    dp_gguf_str pre = {0};
    bool has_pre = gguf_get_str(g, "tokenizer.ggml.pre", &pre) == 0;
    const int pk = kind == DP_TOK_BPE ? pretok_from_name(pre, has_pre) : PRE_GPT2;
    if (pk < 0) {
        char names[256];
        pretok_names(names, sizeof names);
        rc = dp_err(err, errsz, DP_EUNSUPPORTED,
                    "tokenizer: pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported "
                    "(supported: %s)", (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, names);
        goto fail;
    }
    t->pre = pk;
    t->ignore_merges = t->pre == PRE_LLAMA3;

    t->bos = get_id(g, "tokenizer.ggml.bos_token_id", n);
    t->eos = get_id(g, "tokenizer.ggml.eos_token_id", n);
    t->unk = get_id(g, "tokenizer.ggml.unknown_token_id", n);
    if (kind == DP_TOK_SPM) {
        if (t->unk < 0) t->unk = vocab_lookup(t, "<unk>", 5);
        if (t->bos < 0) t->bos = vocab_lookup(t, "<s>", 3);
        if (t->eos < 0) t->eos = vocab_lookup(t, "</s>", 4);
    }
    bool b;
    t->add_bos = kind == DP_TOK_SPM;
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0) t->add_bos = b;
    t->add_space_prefix = kind == DP_TOK_SPM;
    if (gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == 0) t->add_space_prefix = b;

    t->eot = get_id(g, "tokenizer.ggml.eot_token_id", n);
    for (size_t k = 0; t->eot < 0 && k < 5; k++) {
        int32_t id = vocab_lookup(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0 && (k < 4 || id != t->eos)) t->eot = id;
    }
    for (size_t k = 0; k < sizeof eog_texts / sizeof eog_texts[0]; k++) {
        int32_t id = vocab_lookup(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0) t->flags[id] |= TF_EOG;
    }
    if (t->eos >= 0) t->flags[t->eos] |= TF_EOG;
    if (t->eot >= 0) t->flags[t->eot] |= TF_EOG;
    int32_t eom = get_id(g, "tokenizer.ggml.eom_token_id", n);
    if (eom >= 0) t->flags[eom] |= TF_EOG;

    if (kind == DP_TOK_BPE) {
        bytelevel_init(t);
        for (int bb = 0; bb < 256; bb++) t->byte_tok[bb] = vocab_lookup(t, t->bl_enc[bb], t->bl_len[bb]);
        rc = build_merges(t, mg, err, errsz);
        if (rc) goto fail;
    } else {
        for (int bb = 0; bb < 256; bb++) {
            char name[8];
            static const char hex[] = "0123456789ABCDEF";
            name[0] = '<', name[1] = '0', name[2] = 'x', name[3] = hex[bb >> 4], name[4] = hex[bb & 15],
            name[5] = '>';
            t->byte_tok[bb] = vocab_lookup(t, name, 6);
        }
    }
    if (build_decoded(t) != 0) goto nomem;

    for (int32_t i = 0; i < n; i++) {
        if ((t->type[i] == DP_TOKTYPE_CONTROL || t->type[i] == DP_TOKTYPE_USER_DEFINED) && t->text_len[i] > 0)
            t->n_specials++;
        if (t->type[i] == DP_TOKTYPE_USER_DEFINED && t->text_len[i] > 0)
            t->n_user_defined++;
    }
    if (t->n_specials) {
        t->specials = malloc(t->n_specials * sizeof *t->specials);
        if (!t->specials) goto nomem;
        size_t k = 0;
        for (int32_t i = 0; i < n; i++) {
            if ((t->type[i] == DP_TOKTYPE_CONTROL || t->type[i] == DP_TOKTYPE_USER_DEFINED) &&
                t->text_len[i] > 0) {
                t->specials[k++] = i;
                t->special_first[(unsigned char)t->text[t->text_off[i]]] = true;
            }
        }
    }
    *out = t;
    return 0;

nomem:
    rc = dp_err(err, errsz, DP_ENOMEM, "tokenizer: out of memory");
fail:
    tokenizer_destroy(t);
    return rc;
}

void tokenizer_destroy(dp_tokenizer *t)
{
    if (!t) return;
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->type);
    free(t->flags);
    free(t->scores);
    free(t->dec);
    free(t->dec_off);
    free(t->dec_len);
    free(t->hmap);
    free(t->mtab);
    free(t->specials);
    free(t);
}

dp_tok_kind tokenizer_kind(const dp_tokenizer *t) { return t->kind; }
int32_t tokenizer_n_vocab(const dp_tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const dp_tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const dp_tokenizer *t) { return t->eos; }
int32_t tokenizer_eot(const dp_tokenizer *t) { return t->eot; }
bool tokenizer_add_bos(const dp_tokenizer *t) { return t->add_bos && t->bos >= 0; }

bool tokenizer_is_eog(const dp_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TF_EOG);
}

bool tokenizer_is_special(const dp_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->type[id] == DP_TOKTYPE_CONTROL;
}

int32_t tokenizer_find(const dp_tokenizer *t, const char *text)
{
    return text ? vocab_lookup(t, text, strlen(text)) : -1;
}

/* ---- encoding --------------------------------------------------------- */

typedef struct scratch {
    uint32_t *cp;     /* code points of the fragment */
    uint8_t *fl;      /* their CF_* flags */
    size_t *off;      /* byte offset of each, plus one past the end */
    size_t cap_cp;
    int32_t *sid;     /* BPE/SPM symbols: id (BPE) */
    int32_t *prev, *next;
    size_t *soff, *slen; /* SPM: byte span of each symbol */
    size_t cap_sym;
    char *buf;        /* byte-level word / SPM text */
    size_t cap_buf;
    heap h;
} scratch;

static void scratch_free(scratch *s)
{
    free(s->cp);
    free(s->fl);
    free(s->off);
    free(s->sid);
    free(s->prev);
    free(s->next);
    free(s->soff);
    free(s->slen);
    free(s->buf);
    free(s->h.v);
}

static int scratch_cps(scratch *s, size_t n)
{
    if (n <= s->cap_cp) return 0;
    size_t c = s->cap_cp, c2 = s->cap_cp, c3 = s->cap_cp;
    if (grow((void **)&s->cp, &c, n, sizeof *s->cp) || grow((void **)&s->fl, &c2, n, sizeof *s->fl) ||
        grow((void **)&s->off, &c3, n, sizeof *s->off))
        return DP_ENOMEM;
    s->cap_cp = c;
    return 0;
}

static int scratch_syms(scratch *s, size_t n)
{
    if (n <= s->cap_sym) return 0;
    size_t c = s->cap_sym, c2 = s->cap_sym, c3 = s->cap_sym, c4 = s->cap_sym, c5 = s->cap_sym;
    if (grow((void **)&s->sid, &c, n, sizeof *s->sid) || grow((void **)&s->prev, &c2, n, sizeof *s->prev) ||
        grow((void **)&s->next, &c3, n, sizeof *s->next) || grow((void **)&s->soff, &c4, n, sizeof *s->soff) ||
        grow((void **)&s->slen, &c5, n, sizeof *s->slen))
        return DP_ENOMEM;
    s->cap_sym = c;
    return 0;
}

/* BPE over one pre-tokenized word: lowest-rank adjacent pair first (leftmost
 * on ties), with a heap of candidate pairs that are checked when popped. */
static int bpe_word(const dp_tokenizer *t, scratch *s, const unsigned char *w, size_t n, ivec *out)
{
    int rc;
    if (t->ignore_merges) {
        size_t m = 0;
        if (grow((void **)&s->buf, &s->cap_buf, n * 2, 1)) return DP_ENOMEM;
        for (size_t i = 0; i < n; i++) {
            memcpy(s->buf + m, t->bl_enc[w[i]], t->bl_len[w[i]]);
            m += t->bl_len[w[i]];
        }
        int32_t id = vocab_lookup(t, s->buf, m);
        if (id >= 0) return ivec_push(out, id);
    }
    if (n == 1) {
        int32_t id = t->byte_tok[w[0]];
        return id >= 0 ? ivec_push(out, id) : 0;
    }
    if (scratch_syms(s, n)) return DP_ENOMEM;
    int32_t *id = s->sid, *prev = s->prev, *next = s->next;
    for (size_t i = 0; i < n; i++) {
        id[i] = t->byte_tok[w[i]];
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    s->h.n = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const merge_ent *e = merge_lookup(t, id[i], id[i + 1]);
        if (e && (rc = heap_push(&s->h, (hent){((uint64_t)e->rank << 32) | i, id[i], id[i + 1]})))
            return rc;
    }
    while (s->h.n) {
        hent e = heap_pop(&s->h);
        int32_t p = (int32_t)(uint32_t)e.key;
        /* Stale when either side has merged since: a symbol's text only
         * grows, so its id never returns to an earlier value. */
        if (id[p] != e.a || next[p] < 0 || id[next[p]] != e.b) continue;
        const merge_ent *m = merge_lookup(t, e.a, e.b);
        int32_t q = next[p];
        id[p] = m->id;
        id[q] = -2;  /* dead */
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) {
            const merge_ent *x = merge_lookup(t, id[prev[p]], id[p]);
            if (x && (rc = heap_push(&s->h, (hent){((uint64_t)x->rank << 32) | (uint32_t)prev[p],
                                                   id[prev[p]], id[p]})))
                return rc;
        }
        if (next[p] >= 0) {
            const merge_ent *x = merge_lookup(t, id[p], id[next[p]]);
            if (x && (rc = heap_push(&s->h, (hent){((uint64_t)x->rank << 32) | (uint32_t)p, id[p],
                                                   id[next[p]]})))
                return rc;
        }
    }
    /* A byte with no token of its own is dropped, as HF's BPE without an
     * unk token and llama.cpp do (a GGUF's unk id is often an end token). */
    for (int32_t i = 0; i >= 0; i = next[i]) {
        if (id[i] >= 0 && (rc = ivec_push(out, id[i]))) return rc;
    }
    return 0;
}

static int bpe_fragment(const dp_tokenizer *t, scratch *s, const unsigned char *txt, size_t len, ivec *out)
{
    if (len == 0) return 0;
    if (scratch_cps(s, len + 1)) return DP_ENOMEM;
    size_t n = 0;
    for (size_t p = 0; p < len;) {
        uint32_t c;
        size_t l = unicode_utf8_decode(txt + p, len - p, &c);
        /* Each invalid byte stands alone, so that it maps to its own byte. */
        if (DP_UNI_IS_INVALID(c)) l = 1;
        s->cp[n] = c;
        s->fl[n] = pretok_flags(c);
        s->off[n] = p;
        n++;
        p += l;
    }
    s->off[n] = len;
    s->fl[n] = CF_WS;  /* sentinel; matchers never read past end otherwise */
    s->cp[n] = 0;

    int rc;
    size_t seg = 0;
    while (seg < n) {
        size_t seg_end = n;
        if (t->pre == PRE_SMOLLM) {
            if (s->fl[seg] & CF_N) {
                if ((rc = bpe_word(t, s, txt + s->off[seg], s->off[seg + 1] - s->off[seg], out))) return rc;
                seg++;
                continue;
            }
            seg_end = seg;
            while (seg_end < n && !(s->fl[seg_end] & CF_N)) seg_end++;
        }
        for (size_t i = seg; i < seg_end;) {
            size_t e = pretok_match(t->pre, s->cp, s->fl, i, seg_end);
            if ((rc = bpe_word(t, s, txt + s->off[i], s->off[e] - s->off[i], out))) return rc;
            i = e;
        }
        seg = seg_end;
    }
    return 0;
}

/* Float -> unsigned with the same order, for heap keys. */
static uint32_t float_order(float f)
{
    if (f == 0.0f) f = 0.0f;  /* -0 ties with +0 */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static int spm_try_pair(const dp_tokenizer *t, scratch *s, const char *txt, int32_t l, int32_t r)
{
    if (l < 0 || r < 0) return 0;
    int32_t id = vocab_lookup(t, txt + s->soff[l], s->slen[l] + s->slen[r]);
    if (id < 0) return 0;
    float score = t->scores ? t->scores[id] : 0.0f;
    /* Highest score first, then leftmost. */
    uint64_t key = ((uint64_t)~float_order(score) << 32) | (uint32_t)l;
    return heap_push(&s->h, (hent){key, (int32_t)(s->slen[l] + s->slen[r]), 0});
}

/* SentencePiece-style BPE over one fragment: every char starts as a symbol;
 * the adjacent pair that forms the best-scoring token merges first. */
static int spm_fragment(const dp_tokenizer *t, scratch *s, const char *txt, size_t len, ivec *out)
{
    if (len == 0) return 0;
    if (scratch_syms(s, len)) return DP_ENOMEM;
    size_t n = 0;
    for (size_t p = 0; p < len;) {
        uint32_t c;
        size_t l = unicode_utf8_decode((const unsigned char *)txt + p, len - p, &c);
        if (DP_UNI_IS_INVALID(c)) l = 1;
        s->soff[n] = p;
        s->slen[n] = l;
        s->prev[n] = (int32_t)n - 1;
        s->next[n] = p + l < len ? (int32_t)n + 1 : -1;
        n++;
        p += l;
    }
    int rc;
    s->h.n = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if ((rc = spm_try_pair(t, s, txt, (int32_t)i, (int32_t)i + 1))) return rc;
    }
    while (s->h.n) {
        hent e = heap_pop(&s->h);
        int32_t l = (int32_t)(uint32_t)e.key;
        int32_t r = s->next[l];
        if (s->slen[l] == 0 || r < 0 || s->slen[r] == 0 || s->slen[l] + s->slen[r] != (size_t)e.a) continue;
        s->slen[l] += s->slen[r];
        s->slen[r] = 0;
        s->next[l] = s->next[r];
        if (s->next[r] >= 0) s->prev[s->next[r]] = l;
        if ((rc = spm_try_pair(t, s, txt, s->prev[l], l))) return rc;
        if ((rc = spm_try_pair(t, s, txt, l, s->next[l]))) return rc;
    }
    for (int32_t i = 0; i >= 0; i = s->next[i]) {
        int32_t id = vocab_lookup(t, txt + s->soff[i], s->slen[i]);
        if (id >= 0) {
            if ((rc = ivec_push(out, id))) return rc;
            continue;
        }
        /* Byte fallback, else unknown. */
        for (size_t k = 0; k < s->slen[i]; k++) {
            int32_t b = t->byte_tok[(unsigned char)txt[s->soff[i] + k]];
            if (b < 0) {
                if (t->unk >= 0 && (rc = ivec_push(out, t->unk))) return rc;
                break;
            }
            if ((rc = ivec_push(out, b))) return rc;
        }
    }
    return 0;
}

/* SPM text: spaces become U+2581, with one prepended when asked. */
static int spm_text(const dp_tokenizer *t, scratch *s, const char *txt, size_t len, bool prefix, ivec *out)
{
    if (grow((void **)&s->buf, &s->cap_buf, len * 3 + 3, 1)) return DP_ENOMEM;
    size_t m = 0;
    if (prefix) {
        memcpy(s->buf, "\xE2\x96\x81", 3);
        m = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (txt[i] == ' ') {
            memcpy(s->buf + m, "\xE2\x96\x81", 3);
            m += 3;
        } else {
            s->buf[m++] = txt[i];
        }
    }
    return spm_fragment(t, s, s->buf, m, out);
}

/* Longest special token starting at p, or -1: control tokens only with
 * parse_special, user-defined ones always (Gemma's runs of spaces and
 * newlines are such tokens; llama.cpp and HF's added tokens match them in
 * any text). */
static int32_t special_at(const dp_tokenizer *t, const char *p, size_t rem, bool parse_special)
{
    int32_t best = -1;
    size_t best_len = 0;
    for (size_t k = 0; k < t->n_specials; k++) {
        int32_t id = t->specials[k];
        if (!parse_special && t->type[id] != DP_TOKTYPE_USER_DEFINED)
            continue;
        size_t l = t->text_len[id];
        if (l > best_len && l <= rem && memcmp(p, t->text + t->text_off[id], l) == 0) {
            best = id;
            best_len = l;
        }
    }
    return best;
}

static int encode_raw(const dp_tokenizer *t, scratch *s, const char *txt, size_t len, bool after_special,
                      ivec *out)
{
    if (t->kind == DP_TOK_BPE) return bpe_fragment(t, s, (const unsigned char *)txt, len, out);
    if (len == 0) return 0;
    return spm_text(t, s, txt, len, t->add_space_prefix && after_special, out);
}

int tokenizer_encode(const dp_tokenizer *t, const char *text, size_t len, bool add_bos,
                     bool parse_special, int32_t **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    if (!text && len) return DP_EINVAL;
    ivec v = {0};
    scratch s = {0};
    int rc = 0;
    if (add_bos && t->bos >= 0 && (rc = ivec_push(&v, t->bos))) goto done;
    /* SPM adds its space prefix at the start and after each special token. */
    bool after_special = true;
    size_t start = 0;
    if (t->n_specials && (parse_special || t->n_user_defined)) {
        for (size_t i = 0; i < len; i++) {
            if (!t->special_first[(unsigned char)text[i]]) continue;
            int32_t sp = special_at(t, text + i, len - i, parse_special);
            if (sp < 0) continue;
            if (i > start) {
                if ((rc = encode_raw(t, &s, text + start, i - start, after_special, &v))) goto done;
                after_special = false;
            }
            if ((rc = ivec_push(&v, sp))) goto done;
            after_special = true;
            i += t->text_len[sp] - 1;
            start = i + 1;
        }
    }
    if (len > start) rc = encode_raw(t, &s, text + start, len - start, after_special, &v);
done:
    scratch_free(&s);
    if (rc) {
        free(v.v);
        return rc;
    }
    if (!v.v) {
        /* An empty result is still a valid allocation the caller frees. */
        v.v = malloc(sizeof *v.v);
        if (!v.v) return DP_ENOMEM;
    }
    *out = v.v;
    *n_out = v.n;
    return 0;
}
