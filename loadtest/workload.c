/* workload.c: prompt and body generation for dp-loadgen. Random prompts use common
 * short English words, each one token in the usual BPE vocabularies, so N words ≈ N tokens. */
#include "workload.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* ---- rng ---- */

double lg_rng_uniform(dp_rng *r)
{
    return ((double)(rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

uint64_t lg_rng_below(dp_rng *r, uint64_t n)
{
    return n ? rng_next(r) % n : 0; /* the modulo bias is irrelevant at these sizes */
}

static double rng_normal(dp_rng *r)
{
    double u1 = lg_rng_uniform(r), u2 = lg_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double lg_rng_gamma(dp_rng *r, double shape, double scale)
{
    /* Marsaglia and Tsang; shape < 1 via the x * U^(1/shape) boost. */
    if (shape < 1.0) {
        double g = lg_rng_gamma(r, shape + 1.0, 1.0);
        return g * pow(lg_rng_uniform(r), 1.0 / shape) * scale;
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = rng_normal(r), v = 1.0 + c * x;
        if (v <= 0)
            continue;
        v = v * v * v;
        double u = lg_rng_uniform(r);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
            return d * v * scale;
    }
}

double lg_rng_interarrival(dp_rng *r, double rate, double burstiness)
{
    if (rate <= 0 || isinf(rate))
        return 0;
    if (burstiness == 1.0)
        return -log(lg_rng_uniform(r)) / rate;
    return lg_rng_gamma(r, burstiness, 1.0 / (rate * burstiness));
}

/* ---- length distributions ---- */

static char *read_file(const char *path, size_t *len, char *err, size_t errsz)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        dp_err(err, errsz, DP_EIO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf) {
        dp_err(err, errsz, DP_ENOMEM, "out of memory reading %s", path);
        return NULL;
    }
    if (bad) {
        free(buf);
        dp_err(err, errsz, DP_EIO, "cannot read %s", path);
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

static int parse_positive(const char *s, const char *end, int *out)
{
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (errno || e == s || e != end || v < 0 || v > 10000000)
        return DP_EINVAL;
    *out = (int)v;
    return 0;
}

int lg_len_dist_parse(lg_len_dist *d, const char *spec, char *err, size_t errsz)
{
    memset(d, 0, sizeof *d);
    if (!spec || !*spec)
        return dp_err(err, errsz, DP_EINVAL, "empty length spec");
    if (spec[0] == '@') {
        char *text = read_file(spec + 1, NULL, err, errsz);
        if (!text)
            return DP_EIO;
        size_t cap = 64;
        d->vals = malloc(cap * sizeof *d->vals);
        if (!d->vals) {
            free(text);
            return dp_err(err, errsz, DP_ENOMEM, "out of memory");
        }
        for (char *line = strtok(text, "\r\n"); line; line = strtok(NULL, "\r\n")) {
            char *s = line + strspn(line, " \t");
            if (*s == '\0' || *s == '#')
                continue;
            size_t l = strcspn(s, " \t,");
            int v;
            if (parse_positive(s, s + l, &v) || v == 0) {
                free(text);
                lg_len_dist_destroy(d);
                return dp_err(err, errsz, DP_EFORMAT, "%s: bad length '%s'", spec + 1, s);
            }
            if (d->n == cap) {
                int *nv = realloc(d->vals, cap * 2 * sizeof *nv);
                if (!nv) {
                    free(text);
                    lg_len_dist_destroy(d);
                    return dp_err(err, errsz, DP_ENOMEM, "out of memory");
                }
                d->vals = nv;
                cap *= 2;
            }
            d->vals[d->n++] = v;
        }
        free(text);
        if (d->n == 0) {
            lg_len_dist_destroy(d);
            return dp_err(err, errsz, DP_EFORMAT, "%s: no lengths", spec + 1);
        }
        d->kind = LG_LEN_LIST;
        return 0;
    }
    const char *colon = strchr(spec, ':');
    if (colon) {
        if (parse_positive(spec, colon, &d->lo) ||
            parse_positive(colon + 1, colon + strlen(colon), &d->hi) || d->lo > d->hi ||
            d->lo == 0)
            return dp_err(err, errsz, DP_EINVAL, "bad length range '%s' (want A:B, 0 < A <= B)",
                          spec);
        d->kind = LG_LEN_UNIFORM;
        return 0;
    }
    if (parse_positive(spec, spec + strlen(spec), &d->lo) || d->lo == 0)
        return dp_err(err, errsz, DP_EINVAL, "bad length '%s' (want N, A:B or @FILE)", spec);
    d->kind = LG_LEN_FIXED;
    d->hi = d->lo;
    return 0;
}

void lg_len_dist_destroy(lg_len_dist *d)
{
    free(d->vals);
    memset(d, 0, sizeof *d);
}

int lg_len_dist_sample(const lg_len_dist *d, dp_rng *r)
{
    switch (d->kind) {
    case LG_LEN_UNIFORM:
        return d->lo + (int)lg_rng_below(r, (uint64_t)(d->hi - d->lo + 1));
    case LG_LEN_LIST:
        return d->vals[lg_rng_below(r, d->n)];
    default:
        return d->lo;
    }
}

double lg_len_dist_mean(const lg_len_dist *d)
{
    if (d->kind == LG_LEN_LIST) {
        double s = 0;
        for (size_t i = 0; i < d->n; i++)
            s += d->vals[i];
        return d->n ? s / (double)d->n : 0;
    }
    return (d->lo + d->hi) / 2.0;
}

void lg_len_dist_describe(const lg_len_dist *d, char *out, size_t outsz)
{
    if (d->kind == LG_LEN_UNIFORM)
        snprintf(out, outsz, "%d:%d", d->lo, d->hi);
    else if (d->kind == LG_LEN_LIST)
        snprintf(out, outsz, "list of %zu (mean %.1f)", d->n, lg_len_dist_mean(d));
    else
        snprintf(out, outsz, "%d", d->lo);
}

/* ---- text ---- */

static const char *const k_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but",
    "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
    "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "she",
    "other", "its", "may", "these", "what", "them", "than", "some", "him", "time", "into",
    "only", "do", "new", "about", "two", "any", "my", "now", "such", "like", "our", "over",
    "man", "me", "even", "most", "made", "after", "also", "did", "many", "off", "before",
    "must", "well", "back", "through", "years", "much", "where", "your", "way", "down",
    "should", "because", "long", "each", "just", "state", "people", "good", "very", "make",
    "world", "still", "see", "own", "work", "men", "day", "get", "here", "between", "both",
    "life", "being", "under", "never", "same", "last", "might", "great", "year", "since",
    "against", "go", "came", "right", "used", "take", "three", "house", "use", "during",
    "without", "again", "place", "around", "however", "home", "small", "found", "thought",
    "went", "say", "part", "once", "general", "high", "upon", "school", "every", "don",
    "does", "got", "left", "number", "course", "war", "until", "always", "away", "something",
    "fact", "water", "though", "less", "public", "put", "think", "almost", "hand", "enough",
    "far", "took", "head", "yet", "government", "system", "better", "set", "told", "nothing",
    "night", "end", "why", "called", "didn", "eyes", "find", "going", "look", "asked",
    "later", "knew", "point", "next", "city", "give", "group", "young", "let", "room",
    "side", "social", "given", "present", "several", "order", "national", "second", "rather",
    "per", "face", "among", "form", "important", "often", "things", "early", "want", "big",
    "case", "become", "large", "need", "four", "within", "felt", "along", "children", "saw",
    "best", "church", "light", "power", "least", "family", "development", "interest", "open",
    "seemed", "thing", "began", "done", "area", "help", "door", "turned", "certain", "sense",
};
#define N_WORDS (sizeof k_words / sizeof k_words[0])

int lg_workload_random_text(dp_rng *r, int n, char **out)
{
    size_t cap = (size_t)(n > 0 ? n : 1) * 12 + 1, len = 0;
    char *s = malloc(cap);
    if (!s)
        return DP_ENOMEM;
    for (int i = 0; i < n; i++) {
        const char *w = k_words[lg_rng_below(r, N_WORDS)];
        size_t wl = strlen(w);
        if (len + wl + 2 > cap) { /* cannot happen with 12 bytes per word; kept as a guard */
            free(s);
            return DP_ENOMEM;
        }
        if (i)
            s[len++] = ' ';
        memcpy(s + len, w, wl);
        len += wl;
    }
    s[len] = '\0';
    *out = s;
    return 0;
}

static char *join3(const char *a, const char *sep, const char *b)
{
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *s = malloc(la + ls + lb + 1);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    memcpy(s + la, sep, ls);
    memcpy(s + la + ls, b, lb + 1);
    return s;
}

/* ---- sessions and bodies ---- */

struct lg_session {
    cJSON *messages;
    int turns_done;
    uint64_t id;
};

static int split_file(lg_workload *w, bool by_words, char *err, size_t errsz)
{
    size_t len;
    w->file_text = read_file(w->o.prompt_file, &len, err, errsz);
    if (!w->file_text)
        return DP_EIO;
    size_t cap = 1024;
    w->lines = malloc(cap * sizeof *w->lines);
    if (!w->lines)
        return dp_err(err, errsz, DP_ENOMEM, "out of memory");
    const char *delims = by_words ? " \t\r\n" : "\r\n";
    char *save = NULL;
    for (char *t = strtok_r(w->file_text, delims, &save); t; t = strtok_r(NULL, delims, &save)) {
        if (!by_words && t[strspn(t, " \t")] == '\0')
            continue;
        if (w->n_lines == cap) {
            char **nl = realloc(w->lines, cap * 2 * sizeof *nl);
            if (!nl)
                return dp_err(err, errsz, DP_ENOMEM, "out of memory");
            w->lines = nl;
            cap *= 2;
        }
        w->lines[w->n_lines++] = t;
    }
    if (w->n_lines == 0)
        return dp_err(err, errsz, DP_EFORMAT, "%s holds no %s", w->o.prompt_file,
                      by_words ? "words" : "prompts");
    return 0;
}

int lg_workload_init(lg_workload *w, const lg_workload_opts *o, char *err, size_t errsz)
{
    memset(w, 0, sizeof *w);
    w->o = *o;
    rng_seed(&w->rng, o->seed);
    int rc = 0;
    if (o->question && *o->question &&
        (o->kind == LG_WL_CHAT || (o->kind == LG_WL_PREFIX && o->chat_api))) {
        rc = dp_err(err, errsz, DP_EINVAL, "--question goes after a prompt of the random, file, "
                    "corpus or prefix (completions) workloads, not in chat messages");
        goto fail;
    }
    if (o->extra_body && *o->extra_body) {
        w->extra = cJSON_Parse(o->extra_body);
        if (!cJSON_IsObject(w->extra)) {
            rc = dp_err(err, errsz, DP_EINVAL, "--extra-body is not a JSON object");
            goto fail;
        }
    }
    if (o->kind == LG_WL_FILE || o->kind == LG_WL_CORPUS) {
        if (!o->prompt_file) {
            rc = dp_err(err, errsz, DP_EINVAL, "this workload needs --prompt-file");
            goto fail;
        }
        rc = split_file(w, o->kind == LG_WL_CORPUS, err, errsz);
        if (rc)
            goto fail;
    }
    if (o->kind == LG_WL_PREFIX) {
        if (o->num_prefixes <= 0 || o->prefix_len <= 0) {
            rc = dp_err(err, errsz, DP_EINVAL, "shared-prefix needs --prefix-len and --num-prefixes > 0");
            goto fail;
        }
        w->prefixes = calloc((size_t)o->num_prefixes, sizeof *w->prefixes);
        if (!w->prefixes) {
            rc = dp_err(err, errsz, DP_ENOMEM, "out of memory");
            goto fail;
        }
        for (int i = 0; i < o->num_prefixes; i++) {
            rc = lg_workload_random_text(&w->rng, o->prefix_len, &w->prefixes[i]);
            if (rc) {
                dp_err(err, errsz, rc, "out of memory");
                goto fail;
            }
        }
    }
    if (o->kind == LG_WL_CHAT && o->turns <= 0) {
        rc = dp_err(err, errsz, DP_EINVAL, "chat sessions need --turns > 0");
        goto fail;
    }
    return 0;
fail:
    lg_workload_destroy(w);
    return rc;
}

void lg_workload_destroy(lg_workload *w)
{
    free(w->file_text);
    free(w->lines);
    if (w->prefixes)
        for (int i = 0; i < w->o.num_prefixes; i++)
            free(w->prefixes[i]);
    free(w->prefixes);
    cJSON_Delete(w->extra);
    lg_len_dist_destroy(&w->o.input);
    lg_len_dist_destroy(&w->o.output);
    memset(w, 0, sizeof *w);
}

void lg_work_item_clear(lg_work_item *it)
{
    free(it->body);
    memset(it, 0, sizeof *it);
}

/* Renders chat messages as plain text for /v1/completions (chat workload on a
 * completions endpoint): the prompt still grows turn by turn. */
static char *render_messages(const cJSON *msgs)
{
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    s[0] = '\0';
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        const char *r = cJSON_IsString(role) ? role->valuestring : "user";
        const char *c = cJSON_IsString(content) ? content->valuestring : "";
        size_t need = len + strlen(r) + strlen(c) + 8;
        if (need > cap) {
            while (cap < need)
                cap *= 2;
            char *ns = realloc(s, cap);
            if (!ns) {
                free(s);
                return NULL;
            }
            s = ns;
        }
        len += (size_t)sprintf(s + len, "%s: %s\n", r, c);
    }
    if (len + 12 > cap) {
        char *ns = realloc(s, len + 12);
        if (!ns) {
            free(s);
            return NULL;
        }
        s = ns;
    }
    strcpy(s + len, "assistant:");
    return s;
}

/* Builds the JSON body; `prompt` (completions) or `messages` (chat, borrowed). */
static int build_body(lg_workload *w, const char *prompt, const cJSON *messages, int max_tokens,
                      lg_work_item *out)
{
    cJSON *b = cJSON_CreateObject();
    if (!b)
        return DP_ENOMEM;
    bool ok = true;
    if (w->o.model)
        ok &= cJSON_AddStringToObject(b, "model", w->o.model) != NULL;
    if (w->o.chat_api) {
        cJSON *copy = messages ? cJSON_Duplicate(messages, true) : cJSON_CreateArray();
        if (copy && !messages) {
            cJSON *m = cJSON_CreateObject();
            if (!m || !cJSON_AddStringToObject(m, "role", "user") ||
                !cJSON_AddStringToObject(m, "content", prompt)) {
                cJSON_Delete(m);
                ok = false;
            } else {
                cJSON_AddItemToArray(copy, m);
            }
        }
        if (copy)
            cJSON_AddItemToObject(b, "messages", copy);
        else
            ok = false;
    } else {
        char *rendered = messages ? render_messages(messages) : NULL;
        if (messages && !rendered)
            ok = false;
        else
            ok &= cJSON_AddStringToObject(b, "prompt", rendered ? rendered : prompt) != NULL;
        free(rendered);
    }
    if (w->o.no_max_tokens)
        max_tokens = 0; /* unknown: the server decides */
    else
        ok &= cJSON_AddNumberToObject(b, "max_tokens", max_tokens) != NULL;
    ok &= cJSON_AddBoolToObject(b, "stream", w->o.stream) != NULL;
    if (w->o.stream && w->o.include_usage) {
        cJSON *so = cJSON_AddObjectToObject(b, "stream_options");
        ok &= so && cJSON_AddBoolToObject(so, "include_usage", 1);
    }
    if (w->o.ignore_eos)
        ok &= cJSON_AddBoolToObject(b, "ignore_eos", 1) != NULL;
    if (w->o.min_tokens && max_tokens > 0)
        ok &= cJSON_AddNumberToObject(b, "min_tokens", max_tokens) != NULL;
    if (w->o.temperature >= 0)
        ok &= cJSON_AddNumberToObject(b, "temperature", w->o.temperature) != NULL;
    if (w->extra) {
        const cJSON *it;
        cJSON_ArrayForEach(it, w->extra)
        {
            cJSON *dup = cJSON_Duplicate(it, true);
            if (!dup) {
                ok = false;
                break;
            }
            if (cJSON_GetObjectItemCaseSensitive(b, it->string))
                cJSON_ReplaceItemInObjectCaseSensitive(b, it->string, dup);
            else
                cJSON_AddItemToObject(b, it->string, dup);
        }
    }
    char *text = ok ? cJSON_PrintUnformatted(b) : NULL;
    cJSON_Delete(b);
    if (!text)
        return DP_ENOMEM;
    out->body = text;
    out->body_len = strlen(text);
    out->max_tokens = max_tokens;
    return 0;
}

static int count_words(const char *s)
{
    int n = 0;
    bool in = false;
    for (; *s; s++) {
        bool sp = *s == ' ' || *s == '\n' || *s == '\t' || *s == '\r';
        if (!sp && !in)
            n++;
        in = !sp;
    }
    return n;
}

static int make_prompt(lg_workload *w, int in_len, char **out)
{
    switch (w->o.kind) {
    case LG_WL_FILE: {
        const char *line = w->lines[w->next_line++ % w->n_lines];
        *out = strdup(line);
        return *out ? 0 : DP_ENOMEM;
    }
    case LG_WL_CORPUS: {
        /* A contiguous window of in_len words from a random place (wrapping). */
        size_t start = lg_rng_below(&w->rng, w->n_lines), len = 0;
        for (int i = 0; i < in_len; i++)
            len += strlen(w->lines[(start + (size_t)i) % w->n_lines]) + 1;
        char *s = malloc(len + 1);
        if (!s)
            return DP_ENOMEM;
        size_t pos = 0;
        for (int i = 0; i < in_len; i++) {
            const char *word = w->lines[(start + (size_t)i) % w->n_lines];
            size_t l = strlen(word);
            if (i)
                s[pos++] = ' ';
            memcpy(s + pos, word, l);
            pos += l;
        }
        s[pos] = '\0';
        *out = s;
        return 0;
    }
    case LG_WL_PREFIX: {
        char *suffix;
        int rc = lg_workload_random_text(&w->rng, in_len, &suffix);
        if (rc)
            return rc;
        const char *pre = w->prefixes[lg_rng_below(&w->rng, (uint64_t)w->o.num_prefixes)];
        *out = join3(pre, " ", suffix);
        free(suffix);
        return *out ? 0 : DP_ENOMEM;
    }
    default:
        return lg_workload_random_text(&w->rng, in_len, out);
    }
}

static int add_message(cJSON *msgs, const char *role, const char *content, size_t len)
{
    cJSON *m = cJSON_CreateObject();
    if (!m)
        return DP_ENOMEM;
    char *copy = malloc(len + 1);
    if (!copy) {
        cJSON_Delete(m);
        return DP_ENOMEM;
    }
    memcpy(copy, content, len);
    copy[len] = '\0';
    bool ok = cJSON_AddStringToObject(m, "role", role) && cJSON_AddStringToObject(m, "content", copy);
    free(copy);
    if (!ok) {
        cJSON_Delete(m);
        return DP_ENOMEM;
    }
    cJSON_AddItemToArray(msgs, m);
    return 0;
}

static int session_turn(lg_workload *w, lg_session *s, lg_work_item *out)
{
    int in_len = lg_len_dist_sample(&w->o.input, &w->rng);
    int out_len = lg_len_dist_sample(&w->o.output, &w->rng);
    char *text;
    int rc = lg_workload_random_text(&w->rng, in_len, &text);
    if (rc)
        return rc;
    rc = add_message(s->messages, "user", text, strlen(text));
    free(text);
    if (rc)
        return rc;
    rc = build_body(w, NULL, s->messages, out_len, out);
    if (rc)
        return rc;
    int words = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, s->messages)
    {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(c))
            words += count_words(c->valuestring);
    }
    out->prompt_words = words;
    out->session = s;
    out->session_id = (int64_t)s->id;
    out->turn = s->turns_done;
    return 0;
}

/* The shared-prefix workload on the chat API: the prefix is the system
 * prompt and the rest the user's turn, as a deployment with one system
 * prompt sends them (a server can then tell the shared part). */
static int prefix_chat(lg_workload *w, int in_len, int out_len, lg_work_item *out)
{
    char *suffix;
    int rc = lg_workload_random_text(&w->rng, in_len, &suffix);
    if (rc)
        return rc;
    const char *pre = w->prefixes[lg_rng_below(&w->rng, (uint64_t)w->o.num_prefixes)];
    cJSON *msgs = cJSON_CreateArray();
    rc = msgs ? 0 : DP_ENOMEM;
    if (rc == 0)
        rc = add_message(msgs, "system", pre, strlen(pre));
    if (rc == 0)
        rc = add_message(msgs, "user", suffix, strlen(suffix));
    if (rc == 0)
        rc = build_body(w, NULL, msgs, out_len, out);
    if (rc == 0)
        out->prompt_words = count_words(pre) + count_words(suffix);
    cJSON_Delete(msgs);
    free(suffix);
    return rc;
}

int lg_workload_next(lg_workload *w, lg_work_item *out)
{
    memset(out, 0, sizeof *out);
    out->session_id = -1;
    if (w->o.kind == LG_WL_CHAT) {
        lg_session *s = calloc(1, sizeof *s);
        if (!s)
            return DP_ENOMEM;
        s->messages = cJSON_CreateArray();
        if (!s->messages) {
            free(s);
            return DP_ENOMEM;
        }
        s->id = w->sessions_started++;
        int rc = session_turn(w, s, out);
        if (rc) {
            lg_workload_session_end(w, s);
            lg_work_item_clear(out);
        }
        return rc;
    }
    int in_len = lg_len_dist_sample(&w->o.input, &w->rng);
    int out_len = lg_len_dist_sample(&w->o.output, &w->rng);
    if (w->o.kind == LG_WL_PREFIX && w->o.chat_api)
        return prefix_chat(w, in_len, out_len, out);
    char *prompt;
    int rc = make_prompt(w, in_len, &prompt);
    if (rc)
        return rc;
    if (w->o.question && *w->o.question) {
        char *q = join3(prompt, "\n\n", w->o.question);
        free(prompt);
        if (!q)
            return DP_ENOMEM;
        prompt = q;
    }
    rc = build_body(w, prompt, NULL, out_len, out);
    if (rc == 0)
        out->prompt_words = count_words(prompt);
    free(prompt);
    return rc;
}

int lg_workload_followup(lg_workload *w, lg_session *s, const char *reply, size_t len,
                         lg_work_item *out)
{
    memset(out, 0, sizeof *out);
    s->turns_done++;
    if (s->turns_done >= w->o.turns) {
        lg_workload_session_end(w, s);
        return 1;
    }
    int rc = add_message(s->messages, "assistant", reply ? reply : "", reply ? len : 0);
    if (rc == 0)
        rc = session_turn(w, s, out);
    if (rc) {
        lg_work_item_clear(out);
        lg_workload_session_end(w, s);
    }
    return rc;
}

void lg_workload_session_end(lg_workload *w, lg_session *s)
{
    if (!s)
        return;
    cJSON_Delete(s->messages);
    free(s);
}
