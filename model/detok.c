/* detok.c: ids back to text: a token's bytes, a whole sequence, and the
 * streaming detokenizer that holds back incomplete UTF-8 (tokenizer.h). */
#include <stdlib.h>
#include <string.h>

#include "common/dp.h"
#include "tokenizer_private.h"
#include "unicode.h"

/* The token's bytes as they appear in running text (NULL, 0 for a control
 * token that is not rendered). */
static const char *token_piece(const dp_tokenizer *t, int32_t id, bool render_special, size_t *n)
{
    if (t->type[id] == DP_TOKTYPE_CONTROL && !render_special) {
        *n = 0;
        return NULL;
    }
    *n = t->dec_len[id];
    return t->dec + t->dec_off[id];
}

int tokenizer_token_bytes(const dp_tokenizer *t, int32_t id, bool render_special, char *buf, size_t cap)
{
    if (id < 0 || id >= t->n_vocab) return DP_EINVAL;
    size_t n;
    const char *p = token_piece(t, id, render_special, &n);
    if (n > INT32_MAX) return DP_ERANGE;
    if (buf && cap && n) memcpy(buf, p, n < cap ? n : cap);
    return (int)n;
}

int tokenizer_decode(const dp_tokenizer *t, const int32_t *ids, size_t n, bool render_special, char **out,
                     size_t *out_len)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) return DP_EINVAL;
        size_t l;
        token_piece(t, ids[i], render_special, &l);
        total += l;
    }
    char *s = malloc(total + 1);
    if (!s) return DP_ENOMEM;
    size_t m = 0;
    bool strip = t->kind == DP_TOK_SPM && t->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = token_piece(t, ids[i], render_special, &l);
        if (l == 0) continue;
        /* SPM: the space the encoder prefixed is not part of the text. */
        if (strip && p[0] == ' ') {
            p++;
            l--;
        }
        strip = false;
        memcpy(s + m, p, l);
        m += l;
    }
    s[m] = '\0';
    *out = s;
    if (out_len) *out_len = m;
    return 0;
}

void detok_init(dp_detok *d, bool render_special)
{
    memset(d, 0, sizeof *d);
    d->render_special = render_special;
    d->first = true;
}

/* Emits the complete UTF-8 of s[0..n) into out (U+FFFD per maximal invalid
 * subpart); an incomplete tail of up to 3 bytes is kept in d->pending when
 * hold is set. Returns bytes written, or DP_ENOSPC without writing past cap. */
static int detok_emit(dp_detok *d, const unsigned char *s, size_t n, bool hold, char *out, size_t cap)
{
    size_t m = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = unicode_utf8_decode(s + i, n - i, &cp);
        if (DP_UNI_IS_INVALID(cp)) {
            if (hold && i + l == n && unicode_utf8_is_incomplete(s + i, l)) break;
            if (m + 3 > cap) return DP_ENOSPC;
            memcpy(out + m, "\xEF\xBF\xBD", 3);
            m += 3;
        } else {
            if (m + l > cap) return DP_ENOSPC;
            memcpy(out + m, s + i, l);
            m += l;
        }
        i += l;
    }
    memcpy(d->pending, s + i, n - i);
    d->n_pending = n - i;
    return (int)m;
}

int detok_push(dp_detok *d, const dp_tokenizer *t, int32_t id, char *out, size_t cap)
{
    if (id < 0 || id >= t->n_vocab) return DP_EINVAL;
    size_t l;
    const char *p = token_piece(t, id, d->render_special, &l);
    if (l == 0) return 0;
    if (d->first) {
        d->first = false;
        if (t->kind == DP_TOK_SPM && t->add_space_prefix && p[0] == ' ') {
            p++;
            l--;
        }
    }
    unsigned char stackbuf[256];
    unsigned char *buf = stackbuf;
    size_t need = d->n_pending + l;
    if (need > sizeof stackbuf) {
        buf = malloc(need);
        if (!buf) return DP_ENOMEM;
    }
    memcpy(buf, d->pending, d->n_pending);
    memcpy(buf + d->n_pending, p, l);
    dp_detok save = *d;
    int rc = detok_emit(d, buf, need, true, out, cap);
    if (rc < 0) *d = save;  /* nothing consumed: the caller may retry with room */
    if (buf != stackbuf) free(buf);
    return rc;
}

int detok_flush(dp_detok *d, char *out, size_t cap)
{
    unsigned char buf[sizeof d->pending];
    size_t n = d->n_pending;
    memcpy(buf, d->pending, n);
    dp_detok save = *d;
    int rc = detok_emit(d, buf, n, false, out, cap);
    if (rc < 0) *d = save;
    return rc;
}
